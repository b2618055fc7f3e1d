"""The framework-free part of generation (numpy and the standard library only), read by both
``jaxformer.generation`` and ``torch_ref.generation`` so they refuse the same arguments with the
same messages: :func:`check_arguments` (``generate``'s keywords, split into the static
:class:`Options` and the traced :class:`Values`, then the prompt or source) and :func:`uniforms`,
the reference of the counter-based random numbers both twins sample with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jaxformer import validate

EARLY_STOPPING = (False, True, "never")


@dataclass(frozen=True)
class Options:
    """What shapes the decoding program; hashable, a static argument of the compiled loop."""

    max_new_tokens: int
    do_sample: bool
    num_beams: int
    top_k: int  # 0: off; else already max(top_k, min_tokens_to_keep)
    use_temperature: bool  # HF applies the temperature only when it is not 1.0
    use_top_p: bool  # ... and top-p only below 1.0
    min_tokens_to_keep: int
    early_stopping: bool | str
    num_eos: int  # how many eos ids (their values are in Values: changing them does not recompile)
    stream: bool = False
    # Hugging Face's processors that constrain rather than reshape the scores, applied first
    # (its order): bad words (single tokens) never chosen; the forced bos token as the first
    # token of the whole sequence; the forced eos token(s) as the last token max_length allows.
    num_bad_words: int = 0
    forced_bos: bool = False
    num_forced_eos: int = 0

    @property
    def beams_to_keep(self) -> int:
        """Candidates kept per step (Hugging Face): enough that ``num_beams`` of them are not
        finished even when every eos token is among the best."""
        return max(2, 1 + self.num_eos) * self.num_beams


@dataclass(frozen=True)
class Values:
    """The numbers that do not change the program (traced: no recompilation)."""

    temperature: np.float32
    top_p_threshold: np.float32  # 1 - top_p, computed in float64 then rounded, as torch does
    length_penalty: np.ndarray  # [max_new_tokens + 1] float32: n ** length_penalty
    best_length_penalty: np.ndarray  # the early-stopping heuristic's divisor per step
    seed: np.uint32
    eos_token_ids: np.ndarray  # [num_eos] int32
    pad_token_id: np.int32  # fills finished rows: pad_token_id, else the first eos, else 0
    bad_words: np.ndarray  # [num_bad_words] int32
    forced_bos_token_id: np.int32  # (0 when there is none: then unread)
    forced_eos_token_ids: np.ndarray  # [num_forced_eos] int32

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _token_ids(name: str, ids, vocab_size: int) -> tuple[int, ...]:
    if ids is None:
        return ()
    ids = (ids,) if _is_int(ids) else tuple(ids)
    if not ids or not all(_is_int(i) for i in ids):
        raise ValueError(f"{name} must be a token id or a non-empty list of them, got {ids!r}")
    for i in ids:
        if not 0 <= i < vocab_size:
            raise ValueError(f"{name} ({i}) is outside the vocabulary [0, {vocab_size})")
    return tuple(int(i) for i in ids)


def _bad_words(bad_words_ids, vocab_size: int) -> tuple[int, ...]:
    """Hugging Face's ``bad_words_ids`` (a list of token-id lists); single tokens only."""
    if bad_words_ids is None:
        return ()
    if isinstance(bad_words_ids, (str, bytes)) or not all(
            isinstance(word, (list, tuple)) for word in bad_words_ids):
        raise ValueError(f"bad_words_ids must be a list of token-id lists, got {bad_words_ids!r}")
    if any(len(word) != 1 for word in bad_words_ids):
        raise ValueError(f"bad_words_ids: only single-token bad words are implemented, got "
                         f"{[list(w) for w in bad_words_ids if len(w) != 1]}")
    return _token_ids("bad_words_ids", [word[0] for word in bad_words_ids], vocab_size) \
        if bad_words_ids else ()


def check_generate(*, vocab_size: int, max_new_tokens, do_sample=False, temperature=1.0,
                   top_k=0, top_p=1.0, num_beams=1, length_penalty=1.0, early_stopping=False,
                   eos_token_id=None, pad_token_id=None, seed=0, forced_bos_token_id=None,
                   forced_eos_token_id=None, bad_words_ids=None,
                   stream: bool = False) -> tuple[Options, Values]:
    """Validate ``generate``'s keyword arguments; raise ``ValueError`` naming the bad one."""
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not isinstance(do_sample, bool):
        raise ValueError(f"do_sample must be True or False, got {do_sample!r}")
    if not _is_int(num_beams) or num_beams < 1:
        raise ValueError(f"num_beams must be an integer >= 1, got {num_beams!r}")
    if not _is_int(top_k) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 turns it off), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number, got {temperature!r}")
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature!r}; "
                         f"for the most likely tokens use do_sample=False (greedy)")
    if not isinstance(length_penalty, (int, float)) or not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty!r}")
    if not (isinstance(early_stopping, bool) or early_stopping == "never"):
        raise ValueError(f"early_stopping must be False, True or 'never', got "
                         f"{early_stopping!r}")
    if not _is_int(seed):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    eos = _token_ids("eos_token_id", eos_token_id, vocab_size)
    forced_eos = _token_ids("forced_eos_token_id", forced_eos_token_id, vocab_size)
    bad_words = _bad_words(bad_words_ids, vocab_size)
    if forced_bos_token_id is not None:
        if not _is_int(forced_bos_token_id):
            raise ValueError(f"forced_bos_token_id must be one token id, got "
                             f"{forced_bos_token_id!r}")
        _token_ids("forced_bos_token_id", forced_bos_token_id, vocab_size)
    if pad_token_id is not None:
        _token_ids("pad_token_id", pad_token_id, vocab_size)
        if not _is_int(pad_token_id):
            raise ValueError(f"pad_token_id must be one token id, got {pad_token_id!r}")
    if stream and num_beams > 1:
        raise ValueError("streaming needs num_beams=1: beam search reorders its hypotheses, so "
                         "no token is final before the end")
    # Hugging Face pads finished rows with eos when no pad token is given.
    pad = int(pad_token_id) if pad_token_id is not None else (eos[0] if eos else 0)
    # Beam methods keep one more token than there are eos tokens, and at least 2 (Hugging Face).
    min_keep = max(2, len(eos) + 1) if num_beams > 1 else 1
    options = Options(
        max_new_tokens=int(max_new_tokens), do_sample=do_sample, num_beams=int(num_beams),
        top_k=min(max(int(top_k), min_keep), vocab_size) if do_sample and top_k else 0,
        use_temperature=do_sample and temperature != 1.0,
        use_top_p=do_sample and top_p < 1.0, min_tokens_to_keep=min_keep,
        early_stopping=early_stopping, num_eos=len(eos), stream=stream,
        num_bad_words=len(bad_words), forced_bos=forced_bos_token_id is not None,
        num_forced_eos=len(forced_eos))
    n = np.arange(max_new_tokens + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):  # n = 0 is never used
        table = n ** float(length_penalty)
    best = table.copy()
    if early_stopping == "never" and length_penalty > 0:
        best[:] = float(max_new_tokens) ** float(length_penalty)
    values = Values(temperature=np.float32(temperature),
                    top_p_threshold=np.float32(1.0 - float(top_p)),
                    length_penalty=table.astype(np.float32),
                    best_length_penalty=best.astype(np.float32),
                    seed=np.uint32(int(seed) % 2**32),
                    eos_token_ids=np.asarray(eos, np.int32).reshape(len(eos)),
                    pad_token_id=np.int32(pad),
                    bad_words=np.asarray(bad_words, np.int32).reshape(len(bad_words)),
                    forced_bos_token_id=np.int32(forced_bos_token_id or 0),
                    forced_eos_token_ids=np.asarray(forced_eos, np.int32).reshape(
                        len(forced_eos)))
    return options, values


def check_prompt(input_ids, attention_mask, *, vocab_size: int, max_positions: int,
                 max_new_tokens: int, name: str = "input_ids", mask_name: str = "attention_mask",
                 prefix: int = 0) -> None:
    """The prompt ``[batch, seq]``: not empty, ids in the vocabulary, a 0/1 mask with at least
    one real token per row, and room in the position table for ``prefix + seq +
    max_new_tokens`` positions (``prefix`` = 0 for GPT; the encoder-decoder checks its
    target, 1 start token, separately)."""
    validate.check_rank(name, input_ids, 2)
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(input_ids.shape)}): generation needs "
                         f"at least one prompt token per row")
    validate.check_ids(name, input_ids, vocab_size)
    validate.check_attention_mask(mask_name, attention_mask, name, input_ids)
    if attention_mask is not None:
        values = validate.host_values(attention_mask)
        real = None if values is None else values.astype(bool).sum(axis=1)
        if real is not None and (real == 0).any():
            rows = np.flatnonzero(real == 0).tolist()
            raise ValueError(f"{mask_name} row(s) {rows} hold only padding: each prompt needs at "
                             f"least one real token")
    total = prefix + input_ids.shape[1] + max_new_tokens
    if total > max_positions:
        raise ValueError(f"{name} has length {input_ids.shape[1]}; with max_new_tokens="
                         f"{max_new_tokens} the sequence would reach {total} tokens, more than "
                         f"the position table holds (max_position_embeddings={max_positions})")


def check_target_room(max_new_tokens: int, max_positions: int) -> None:
    """The encoder-decoder's target: the start token and ``max_new_tokens`` more."""
    if 1 + max_new_tokens > max_positions:
        raise ValueError(f"max_new_tokens={max_new_tokens} plus the decoder start token needs "
                         f"{1 + max_new_tokens} target positions, more than the position table "
                         f"holds (max_position_embeddings={max_positions})")


GENERATE_ARGUMENTS = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p",
                      "num_beams", "length_penalty", "early_stopping", "eos_token_id",
                      "pad_token_id", "seed", "forced_bos_token_id", "forced_eos_token_id",
                      "bad_words_ids")


def check_arguments(config, decoder_only: bool, input_ids, attention_mask,
                    args: dict) -> tuple[Options, Values]:
    """Everything ``generate`` checks before running, in both twins: the keyword arguments
    (``args`` holds ``GENERATE_ARGUMENTS``, ``decoder_start_token_id`` and ``streamer``), then
    the prompt (GPT) or the source and the target's room (encoder-decoder). ``max_length``
    (Hugging Face's: the whole returned sequence, the prompt or the decoder start token
    included) may stand for ``max_new_tokens``."""
    vocab = config.vocab_size if decoder_only else config.tgt_vocab_size
    args = dict(args)
    max_length = args.get("max_length")
    if max_length is not None:
        if args["max_new_tokens"] is not None:
            raise ValueError("give max_new_tokens or max_length, not both")
        validate.check_rank("input_ids", input_ids, 2)
        prefix = input_ids.shape[1] if decoder_only else 1
        if not _is_int(max_length) or max_length <= prefix:
            raise ValueError(f"max_length must be an integer above the "
                             f"{'prompt length' if decoder_only else 'decoder start token'} "
                             f"({prefix}), got {max_length!r}")
        args["max_new_tokens"] = int(max_length) - prefix
    elif args["max_new_tokens"] is None:
        raise ValueError("generate needs max_new_tokens (or max_length)")
    options, values = check_generate(vocab_size=vocab, stream=args["streamer"] is not None,
                                     **{name: args[name] for name in GENERATE_ARGUMENTS})
    start = args["decoder_start_token_id"]
    if decoder_only:
        if start is not None:
            raise ValueError("decoder_start_token_id is for encoder-decoder models; a GPT "
                             "continues its prompt")
        check_prompt(input_ids, attention_mask, vocab_size=vocab,
                     max_positions=config.max_position_embeddings,
                     max_new_tokens=options.max_new_tokens)
        return options, values
    if start is None:
        raise ValueError("an encoder-decoder model needs decoder_start_token_id, the first "
                         "target token (the model has no default)")
    if not _is_int(start):
        raise ValueError(f"decoder_start_token_id must be one token id, got {start!r}")
    _token_ids("decoder_start_token_id", start, vocab)
    check_prompt(input_ids, attention_mask, vocab_size=config.src_vocab_size,
                 max_positions=config.max_position_embeddings, max_new_tokens=0)
    if attention_mask is None:  # the models build the source mask from src_pad_id
        real = validate.host_values(input_ids) != config.src_pad_id
        if not real.any(axis=1).all():
            rows = np.flatnonzero(~real.any(axis=1)).tolist()
            raise ValueError(f"input_ids row(s) {rows} hold only src_pad_id "
                             f"({config.src_pad_id}): each source needs a real token")
    check_target_room(options.max_new_tokens, config.max_position_embeddings)
    return options, values


# --------------------------------------------------------------------------- random numbers
# Counter-based uniforms: u[row, col] at decoding step `step` is a hash of (seed, step, row, col),
# murmur3's 32-bit finaliser applied in a chain. Both twins compute it with integer arithmetic, so
# a seeded run draws bit-identical uniforms in JAX and in torch; the sampler turns them into
# Gumbel noise. Float32 keeps 24 bits: u = (bits >> 8 + 0.5) / 2^24 lies strictly in (0, 1).

GOLDEN = 0x9E3779B9
MIX1 = 0x85EBCA6B
MIX2 = 0xC2B2AE35
MASK32 = 0xFFFFFFFF


def fmix32(h: np.ndarray | np.unsignedinteger) -> np.ndarray:
    h = np.asarray(h, dtype=np.uint64) & MASK32
    h ^= h >> 16
    h = (h * MIX1) & MASK32
    h ^= h >> 13
    h = (h * MIX2) & MASK32
    h ^= h >> 16
    return h


def uniforms(seed: int, step: int, rows: int, cols: int) -> np.ndarray:
    """The reference: ``[rows, cols]`` float32 uniforms in (0, 1) for one decoding step."""
    state = fmix32(fmix32(fmix32(np.uint64(seed % 2**32) ^ GOLDEN) ^ np.uint64(step))
                   ^ np.arange(rows, dtype=np.uint64))
    bits = fmix32(state[:, None] ^ ((np.arange(cols, dtype=np.uint64) * GOLDEN) & MASK32))
    return (((bits >> 8).astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-24))
