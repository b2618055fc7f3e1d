"""``jaxformer generate``: text from a trained run or a Hugging Face directory, streamed as it is
produced.

GPT (``--family gpt`` runs, GPT-2 directories) continues each ``--prompt``; an encoder-decoder
(``--family transformer`` runs, and the Hugging Face encoder-decoders jaxformer reads) takes each
``--prompt`` as a source text and writes its target. Greedy by default, ``--do-sample`` samples,
``--num-beams N`` searches; the chosen framework's ``generate`` runs (jax by default, or the
torch_ref twin). One prompt with ``--num-beams 1`` streams token by token. A summary on stderr
gives the new tokens, the time to the first one and tokens per second.

Every flag is checked before the model is loaded. A GPT prompt longer than the model's context
less ``--max-new-tokens`` is cropped to its last tokens (said once on stderr); the KV cache
holds the context and does not slide, so ``--max-new-tokens`` must leave room for at least one
prompt token (docs/generation.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from jaxformer.commands import UsageError, guarded, load_model

COMMAND = "generate"
FAMILIES = ("gpt", "transformer")
SAMPLING_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p"}
BEAM_FLAGS = {"length_penalty": "--length-penalty", "early_stopping": "--early-stopping"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, required=True, metavar="PATH",
                        help="a run directory of `jaxformer train` (family gpt or transformer) "
                             "or a Hugging Face directory (GPT-2 with tokenizer.json)")
    parser.add_argument("--step", type=int, default=None,
                        help="checkpoint step of a run (default: the latest)")
    parser.add_argument("--prompt", action="append", required=True, metavar="TEXT",
                        help="text to continue (GPT) or to translate (encoder-decoder); repeat "
                             "for a batch")
    parser.add_argument("--max-new-tokens", type=int, default=50, help="tokens to add (50)")
    parser.add_argument("--do-sample", action="store_true", help="sample instead of greedy")
    parser.add_argument("--temperature", type=float, default=None,
                        help="with --do-sample: divide the logits by this (1.0)")
    parser.add_argument("--top-k", type=int, default=None,
                        help="with --do-sample: keep the k most likely tokens (0: off, default)")
    parser.add_argument("--top-p", type=float, default=None,
                        help="with --do-sample: nucleus probability mass (1.0: off, default)")
    parser.add_argument("--num-beams", type=int, default=1, help="beam search width (1)")
    parser.add_argument("--length-penalty", type=float, default=None,
                        help="with --num-beams > 1: exponent of the length in beam scores (1.0)")
    parser.add_argument("--early-stopping", choices=("false", "true", "never"), default=None,
                        help="with --num-beams > 1: stopping rule, as in Hugging Face (false)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (0)")
    parser.add_argument("--framework", choices=("jax", "torch"), default="jax",
                        help="jaxformer (jax, default) or its torch_ref twin")
    parser.add_argument("--no-stream", action="store_true",
                        help="print the completion at the end, even for one prompt")


def check_flags(args: argparse.Namespace) -> None:
    """Every flag on its own, before anything is loaded; a :class:`UsageError` naming it."""
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.step is not None and args.step < 0:
        raise UsageError(f"--step must be a checkpoint step >= 0, got {args.step}")
    given = [flag for name, flag in SAMPLING_FLAGS.items() if getattr(args, name) is not None]
    if given and not args.do_sample:
        raise UsageError(f"{', '.join(given)} only applies when sampling: add --do-sample "
                         f"(without it the most likely tokens are chosen)")
    if args.temperature is not None and not (math.isfinite(args.temperature)
                                             and args.temperature > 0):
        raise UsageError(f"--temperature must be a finite number > 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 0:
        raise UsageError(f"--top-k must be >= 0 (0 turns it off), got {args.top_k}")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UsageError(f"--top-p must lie in (0, 1], got {args.top_p}")
    if args.num_beams < 1:
        raise UsageError(f"--num-beams must be at least 1, got {args.num_beams}")
    given = [flag for name, flag in BEAM_FLAGS.items() if getattr(args, name) is not None]
    if given and args.num_beams == 1:
        raise UsageError(f"{', '.join(given)} only applies to beam search: add --num-beams N "
                         f"with N > 1")
    if args.length_penalty is not None and not math.isfinite(args.length_penalty):
        raise UsageError(f"--length-penalty must be a finite number, got {args.length_penalty}")
    empty = [n for n, text in enumerate(args.prompt) if not text.strip()]
    if empty:
        raise UsageError(f"--prompt number {empty[0] + 1} is empty; give some text")


def generate_options(args: argparse.Namespace) -> dict:
    """``generate``'s keyword arguments from the (checked) flags, defaults filled in."""
    return dict(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                temperature=1.0 if args.temperature is None else args.temperature,
                top_k=args.top_k or 0, top_p=1.0 if args.top_p is None else args.top_p,
                num_beams=args.num_beams,
                length_penalty=1.0 if args.length_penalty is None else args.length_penalty,
                early_stopping={"false": False, "true": True, None: False}.get(
                    args.early_stopping, "never"),
                seed=args.seed)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token lists -> ``[batch, longest]`` ids and mask, padding on the left."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for b, row in enumerate(rows):
        ids[b, width - len(row):] = row
        mask[b, width - len(row):] = 1
    return ids, mask


def right_pad(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token lists -> ``[batch, longest]`` ids and mask, padding on the right (sources)."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for b, row in enumerate(rows):
        ids[b, :len(row)] = row
        mask[b, :len(row)] = 1
    return ids, mask


def note(message: str) -> None:
    print(f"jaxformer {COMMAND}: note: {message}", file=sys.stderr, flush=True)


def _encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Each text's ids; a text the tokenizer cannot encode (a character outside a character
    vocabulary) or that gives no token is an error naming the ``--prompt``."""
    rows = []
    for n, text in enumerate(texts, 1):
        try:
            ids = list(tokenizer.encode(text))
        except ValueError as error:
            raise UsageError(f"--prompt number {n}: {error}") from None
        if not ids:
            raise UsageError(f"--prompt number {n} ({text!r}) tokenizes to nothing")
        rows.append(ids)
    return rows


def _hf_generation_config(path: Path) -> dict:
    """``config.json`` updated by ``generation_config.json`` (when present) of a Hugging Face
    directory: where its eos, pad and decoder start tokens are."""
    merged: dict = {}
    for name in ("config.json", "generation_config.json"):
        if (path / name).is_file():
            data = json.loads((path / name).read_text())
            merged.update({k: v for k, v in data.items() if v is not None})
    return merged


# The generation settings of a Hugging Face encoder-decoder that constrain the search.
CONSTRAINTS = ("forced_bos_token_id", "forced_eos_token_id", "bad_words_ids")


def hf_constraints(path: Path) -> dict:
    """``forced_bos_token_id``, ``forced_eos_token_id`` and single-token ``bad_words_ids`` of a
    Hugging Face directory (``generation_config.json`` over ``config.json``), those it sets."""
    config = _hf_generation_config(path)
    return {k: config[k] for k in CONSTRAINTS if config.get(k) is not None}


def special_ids(loaded) -> dict:
    """``eos`` (an id, or None: never stops early), ``pad`` and, for an encoder-decoder,
    ``start`` (the decoder's first token).

    A run: GPT runs end each training line with ``[SEP]`` (none with a character tokenizer);
    encoder-decoder runs frame targets as ``[CLS] target [SEP]``. A Hugging Face directory: its
    ``config.json`` / ``generation_config.json`` (``eos_token_id``, ``pad_token_id``,
    ``decoder_start_token_id``), else the tokenizer's tokens. ``pad`` falls back to eos, then 0.
    """
    tokenizer = loaded.tokenizer
    if loaded.source == "run":
        eos = tokenizer.sep_id
        start = tokenizer.cls_id
        pad = tokenizer.pad_id
    else:
        config = _hf_generation_config(Path(loaded.path))
        eos = config.get("eos_token_id", tokenizer.eos_id)
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        pad = config.get("pad_token_id", tokenizer.pad_id)
        start = config.get("decoder_start_token_id",
                           tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.cls_id)
    pad = pad if pad is not None else (eos if eos is not None else 0)
    return {"eos": eos, "pad": pad, "start": start}


def crop_prompts(rows: list[list[int]], context: int, max_new_tokens: int) -> list[list[int]]:
    """GPT prompts cropped to the last ``context - max_new_tokens`` tokens, as nanoGPT crops its
    context (``idx[:, -block_size:]``); said once on stderr. ``max_new_tokens >= context``
    leaves no room for a prompt and is refused: the KV cache holds ``context`` positions and
    does not slide."""
    if max_new_tokens >= context:
        raise UsageError(f"--max-new-tokens {max_new_tokens} leaves no room for the prompt: the "
                         f"model's context holds {context} tokens (prompt and new tokens "
                         f"together); use --max-new-tokens {context - 1} or fewer")
    room = context - max_new_tokens
    cropped = [n for n, row in enumerate(rows, 1) if len(row) > room]
    if cropped:
        longest = max(len(rows[n - 1]) for n in cropped)
        note(f"prompt(s) {', '.join(map(str, cropped))} cropped to their last {room} tokens "
             f"(the longest had {longest}): the model's context is {context} tokens and "
             f"--max-new-tokens takes {max_new_tokens} of them")
    return [row[-room:] for row in rows]


def seq2seq_sources(rows: list[list[int]], end: list[int], context: int,
                    max_new_tokens: int) -> list[list[int]]:
    """Sources ``tokens + end`` cut to the model's context (the first tokens and ``end`` are
    kept, said once on stderr); the target's room is checked too."""
    if 1 + max_new_tokens > context:
        raise UsageError(f"--max-new-tokens {max_new_tokens} does not fit the decoder: its "
                         f"context holds {context} tokens, the start token included; use "
                         f"--max-new-tokens {context - 1} or fewer")
    keep = context - len(end)
    cut = [n for n, row in enumerate(rows, 1) if len(row) > keep]
    if cut:
        note(f"source(s) {', '.join(map(str, cut))} cut to their first {keep} tokens: the "
             f"encoder's context is {context} tokens")
    return [row[:keep] + end for row in rows]


def framed_source(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """A Hugging Face encoder-decoder's source as its tokenizer frames one sequence (the
    ``tokenizer.json`` post-processor: Marian appends ``</s>``, BART wraps in ``<s> ... </s>``),
    split into (the tokens that may be cut, the closing special tokens)."""
    encoding = tokenizer.backend.encode(text, add_special_tokens=True)
    ids, special = list(encoding.ids), list(encoding.special_tokens_mask)
    tail = len(ids)
    while tail and special[tail - 1]:
        tail -= 1
    return ids[:tail], ids[tail:]


def continuation(tokenizer, prompt: list[int], new) -> str:
    """The text ``new`` adds after ``prompt``: the decoded whole less the decoded prompt, so
    that a tokenizer that joins words with spaces (WordPiece) separates them from the prompt;
    ``new`` alone when the prompt's text is not a prefix of the whole."""
    new = [int(t) for t in new]
    if not prompt:
        return tokenizer.decode(new)
    head, whole = tokenizer.decode(prompt), tokenizer.decode(list(prompt) + new)
    return whole[len(head):] if whole.startswith(head) else tokenizer.decode(new)


def _until_eos(tokens: np.ndarray, eos: int | None) -> np.ndarray:
    """The new tokens of one row up to and including its first eos."""
    if eos is None or not (tokens == eos).any():
        return tokens
    return tokens[:int(np.argmax(tokens == eos)) + 1]


def run(args: argparse.Namespace) -> int:
    state = {"open_line": False}
    return guarded(COMMAND, lambda: _run(args, state), state, getattr(args, "debug", False))


def _run(args: argparse.Namespace, state: dict) -> int:
    from jaxformer import frameworks

    check_flags(args)
    generation = frameworks.module(args.framework, "generation")
    loaded = load_model(args.model, step=args.step, framework=args.framework,
                        families=FAMILIES, command=f"jaxformer {COMMAND}")
    model, tokenizer, config = loaded.model, loaded.tokenizer, loaded.model.config
    ids_of = special_ids(loaded)
    eos, pad = ids_of["eos"], ids_of["pad"]
    kwargs = generate_options(args) | dict(eos_token_id=eos, pad_token_id=pad)
    rows = _encode(tokenizer, args.prompt)
    seq2seq = loaded.family != "gpt"
    if seq2seq:
        if ids_of["start"] is None:
            raise UsageError(f"{loaded.path}: no decoder start token (no decoder_start_token_id "
                             f"in its config, no [CLS] or bos token in its tokenizer)")
        if loaded.source == "run":  # as the task trained it: tokens [SEP]
            end = [] if eos is None else [eos]
        else:
            framed = [framed_source(tokenizer, text) for text in args.prompt]
            ends = {tuple(f[1]) for f in framed}
            end = list(ends.pop()) if len(ends) == 1 else []
            rows = [f[0] if end else f[0] + f[1] for f in framed]
        rows = seq2seq_sources(rows, end, config.max_position_embeddings, args.max_new_tokens)
        ids, mask = right_pad(rows, config.src_pad_id)
        kwargs["decoder_start_token_id"] = int(ids_of["start"])
        if loaded.source == "huggingface":  # its forced and banned tokens, as transformers reads
            kwargs |= hf_constraints(Path(loaded.path))  # them (Marian bans its pad token)
        echoed, skip = [""] * len(rows), 1  # the target starts with the start token
        contexts: list[list[int]] = [[] for _ in rows]
    else:
        rows = crop_prompts(rows, config.max_position_embeddings, args.max_new_tokens)
        ids, mask = left_pad(rows, pad)
        echoed, skip, contexts = list(args.prompt), ids.shape[1], rows
    start = time.perf_counter()
    if len(rows) == 1 and args.num_beams == 1 and not args.no_stream:
        new, first = _stream_one(generation.stream(model, ids, mask, **kwargs), tokenizer,
                                 echoed[0], contexts[0], eos, start, state)
        counts = [len(new)]
    else:
        out = np.asarray(generation.generate(model, ids, mask, **kwargs))
        first = None
        found = [_until_eos(row[skip:], eos) for row in out]
        for n, (text, context, row) in enumerate(zip(echoed, contexts, found)):
            print(f"[{n}] {text}{continuation(tokenizer, context, [t for t in row if t != eos])}")
        counts = [len(row) for row in found]
    seconds = time.perf_counter() - start
    total = sum(counts)
    details = [args.framework]
    if first is not None:
        details.append(f"first token after {first:.2f} s")
    if args.framework == "jax":
        details.append("compilation included")
    print(f"{total} new tokens in {seconds:.2f} s: {total / seconds:.1f} tokens/s "
          f"({', '.join(details)})", file=sys.stderr)
    return 0


def _stream_one(steps, tokenizer, prompt: str, context: list[int], eos, start: float,
                state: dict):
    """Print the prompt, then the text as each token arrives; returns (new tokens, seconds to
    the first). A token that ends inside a multi-byte character waits for the next."""
    print(prompt, end="", flush=True)
    state["open_line"] = bool(prompt)
    new: list[int] = []
    shown = ""
    first = None
    for tokens in steps:
        if first is None:
            first = time.perf_counter() - start
        if new and new[-1] == eos:
            continue  # finished (a single row ends the stream here anyway)
        new.append(int(tokens[0]))
        text = continuation(tokenizer, context, [t for t in new if t != eos])
        if not text.endswith("\ufffd"):
            print(text[len(shown):], end="", flush=True)
            state["open_line"] = state["open_line"] or bool(text[len(shown):])
            shown = text
    print(flush=True)
    state["open_line"] = False
    return new, first
