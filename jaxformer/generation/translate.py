"""``jaxformer generate --model DIR`` with an encoder-decoder directory (MarianMT, BART): each
``--prompt`` is a source text, tokenized with the directory's ``tokenizer.json`` (special tokens
added as the tokenizer defines them, e.g. Marian's ``</s>``), right-padded into one batch and
translated by the chosen framework's ``generate``; the outputs are printed without their
special tokens.

The token ids of Hugging Face's generation settings come from the directory, as
transformers reads them (``generation_config.json`` over ``config.json``):
``decoder_start_token_id``, ``eos_token_id``, ``pad_token_id``, ``forced_bos_token_id``,
``forced_eos_token_id`` and single-token ``bad_words_ids`` (Marian bans its pad token). The
search itself (``--num-beams``, ``--length-penalty``, ...) is the command line's. Marian's
SentencePiece files (``source.spm``) are not read: a directory needs ``tokenizer.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

SETTINGS = ("decoder_start_token_id", "eos_token_id", "pad_token_id", "forced_bos_token_id",
            "forced_eos_token_id", "bad_words_ids")


def generation_settings(directory: Path) -> dict:
    """The token settings of ``SETTINGS`` found in ``config.json`` then
    ``generation_config.json`` (the latter wins, as in transformers), None where absent."""
    found: dict = dict.fromkeys(SETTINGS)
    for name in ("config.json", "generation_config.json"):
        path = directory / name
        if path.is_file():
            data = json.loads(path.read_text())
            found.update({k: data[k] for k in SETTINGS if data.get(k) is not None})
    if found["decoder_start_token_id"] is None:
        raise ValueError(f"{directory}: no decoder_start_token_id in config.json or "
                         f"generation_config.json; the decoder has no first token")
    return found


def source_tokenizer(directory: Path, vocab_size: int):
    """``tokenizer.json``, refused when its ids can fall outside the model's vocabulary."""
    from tokenizers import Tokenizer

    path = directory / "tokenizer.json"
    if not path.is_file():
        hint = (" (this directory has SentencePiece models, which jaxformer does not read)"
                if (directory / "source.spm").is_file() else "")
        raise FileNotFoundError(f"no tokenizer.json in {directory}{hint}: jaxformer generate "
                                f"needs the fast tokenizer file")
    tokenizer = Tokenizer.from_file(str(path))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise ValueError(f"{path} has {size} tokens, but the model's vocabulary (vocab_size in "
                         f"config.json) holds {vocab_size}: they do not belong together")
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def right_pad(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for b, row in enumerate(rows):
        ids[b, :len(row)] = row
        mask[b, :len(row)] = 1
    return ids, mask


def run_seq2seq(args, model, generate) -> int:
    """The ``generate`` command for an encoder-decoder ``model`` loaded from ``args.model``;
    ``generate`` is the chosen framework's. Prints one ``[n] source -> output`` line per prompt
    and a summary on stderr."""
    try:
        settings = generation_settings(args.model)
        tokenizer = source_tokenizer(args.model, model.config.src_vocab_size)
        sources = [tokenizer.encode(text).ids for text in args.prompt]
        if any(not s for s in sources):
            raise ValueError("a prompt tokenizes to nothing; give some text")
        pad = settings["pad_token_id"]
        ids, mask = right_pad(sources, model.config.src_pad_id if pad is None else pad)
        start = time.perf_counter()
        out = np.asarray(generate(
            model, ids, mask, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            num_beams=args.num_beams, length_penalty=args.length_penalty,
            early_stopping={"false": False, "true": True}.get(args.early_stopping, "never"),
            seed=args.seed, **settings))
        seconds = time.perf_counter() - start
    except (OSError, ValueError, TypeError) as e:  # CheckpointError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 1
    eos = settings["eos_token_id"]
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    total = 0
    for n, (text, row) in enumerate(zip(args.prompt, out)):
        new = [int(t) for t in row[1:]]
        ends = [i for i, t in enumerate(new) if t in eos]
        new = new[:ends[0] + 1] if ends else new
        total += len(new)
        print(f"[{n}] {text} -> {tokenizer.decode(new, skip_special_tokens=True)}")
    print(f"{total} new tokens in {seconds:.2f} s: {total / seconds:.1f} tokens/s "
          f"({args.framework}{', compilation included' if args.framework == 'jax' else ''})",
          file=sys.stderr)
    return 0
