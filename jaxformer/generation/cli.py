"""``jaxformer generate``: text from a Hugging Face GPT-2 directory, streamed as it is produced
(a MarianMT or BART directory translates its prompts instead: ``translate.py``).

Prompts are tokenized with the directory's ``tokenizer.json``, left-padded into one batch and
continued by the chosen framework's ``generate`` (``jaxformer.frameworks``: jax by default, or
the torch_ref twin); one prompt with ``--num-beams 1`` streams token by token. A summary on
stderr gives the new tokens, the time to the first one and tokens per second.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, required=True, metavar="DIR",
                        help="Hugging Face GPT-2 directory with config.json, weights and "
                             "tokenizer.json")
    parser.add_argument("--prompt", action="append", required=True, metavar="TEXT",
                        help="text to continue; repeat for a batch")
    parser.add_argument("--max-new-tokens", type=int, default=50, help="tokens to add (50)")
    parser.add_argument("--do-sample", action="store_true", help="sample instead of greedy")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling (1.0)")
    parser.add_argument("--top-k", type=int, default=0, help="sampling: keep the k best (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="sampling: nucleus mass (1.0)")
    parser.add_argument("--num-beams", type=int, default=1, help="beam search width (1)")
    parser.add_argument("--length-penalty", type=float, default=1.0, help="beam search (1.0)")
    parser.add_argument("--early-stopping", choices=("false", "true", "never"), default="false",
                        help="beam search stopping rule, as in Hugging Face (false)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (0)")
    parser.add_argument("--framework", choices=("jax", "torch"), default="jax",
                        help="jaxformer (jax, default) or its torch_ref twin")
    parser.add_argument("--no-stream", action="store_true",
                        help="print the completion at the end, even for one prompt")


class Tokenizer:
    """``tokenizer.json`` of a model directory, without its own padding or truncation."""

    def __init__(self, directory: Path):
        from tokenizers import Tokenizer as FastTokenizer

        path = directory / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {directory}: jaxformer generate "
                                    f"needs the fast tokenizer file")
        self.tokenizer = FastTokenizer.from_file(str(path))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token lists -> ``[batch, longest]`` ids and mask, padding on the left."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for b, row in enumerate(rows):
        ids[b, width - len(row):] = row
        mask[b, width - len(row):] = 1
    return ids, mask


def _special_ids(directory: Path) -> tuple[int | None, int]:
    """(eos, pad) from ``config.json`` and ``generation_config.json``; pad falls back to eos
    (GPT-2 has no pad token), then 0."""
    eos = pad = None
    for name in ("config.json", "generation_config.json"):
        path = directory / name
        if path.is_file():
            data = json.loads(path.read_text())
            eos = data.get("eos_token_id", eos)
            pad = data.get("pad_token_id", pad)
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos, pad if pad is not None else (eos if eos is not None else 0)


def _until_eos(tokens: np.ndarray, eos: int | None) -> np.ndarray:
    """The new tokens of one row up to and including its first eos."""
    if eos is None or not (tokens == eos).any():
        return tokens
    return tokens[:int(np.argmax(tokens == eos)) + 1]


def run(args: argparse.Namespace) -> int:
    from jaxformer import frameworks
    from jaxformer.checkpoints import hf

    generation = frameworks.module(args.framework, "generation")
    generate, stream = generation.generate, generation.stream
    try:
        model = hf.from_pretrained(args.model, args.framework)
        if type(model).__name__ == "Transformer":  # MarianMT, BART: translate.py
            from jaxformer.generation.translate import run_seq2seq
            return run_seq2seq(args, model, generate)
        tokenizer = Tokenizer(args.model)
        eos, pad = _special_ids(args.model)
        prompts = [tokenizer.encode(text) for text in args.prompt]
        if any(not p for p in prompts):
            raise ValueError("a prompt tokenizes to nothing; give some text")
        ids, mask = left_pad(prompts, pad)
        kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                      num_beams=args.num_beams, length_penalty=args.length_penalty,
                      early_stopping={"false": False, "true": True}.get(args.early_stopping,
                                                                       "never"),
                      eos_token_id=eos, pad_token_id=pad, seed=args.seed)
        start = time.perf_counter()
        if len(prompts) == 1 and args.num_beams == 1 and not args.no_stream:
            new, first = _stream_one(stream(model, ids, mask, **kwargs), tokenizer,
                                     args.prompt[0], eos, start)
            counts = [len(new)]
        else:
            out = np.asarray(generate(model, ids, mask, **kwargs))
            first = None
            rows = [_until_eos(row[ids.shape[1]:], eos) for row in out]
            for n, (text, row) in enumerate(zip(args.prompt, rows)):
                print(f"[{n}] {text}{tokenizer.decode(row)}")
            counts = [len(row) for row in rows]
        seconds = time.perf_counter() - start
    except (OSError, ValueError, TypeError) as e:  # CheckpointError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 1
    total = sum(counts)
    details = [args.framework]
    if first is not None:
        details.append(f"first token after {first:.2f} s")
    if args.framework == "jax":
        details.append("compilation included")
    print(f"{total} new tokens in {seconds:.2f} s: {total / seconds:.1f} tokens/s "
          f"({', '.join(details)})", file=sys.stderr)
    return 0


def _stream_one(steps, tokenizer: Tokenizer, prompt: str, eos, start: float):
    """Print the prompt, then the text as each token arrives; returns (new tokens, seconds to
    the first). A token that ends inside a multi-byte character waits for the next."""
    print(prompt, end="", flush=True)
    new: list[int] = []
    shown = ""
    first = None
    for tokens in steps:
        if first is None:
            first = time.perf_counter() - start
        if new and new[-1] == eos:
            continue  # finished (a single row ends the stream here anyway)
        new.append(int(tokens[0]))
        text = tokenizer.decode([t for t in new if t != eos])
        if not text.endswith("\ufffd"):
            print(text[len(shown):], end="", flush=True)
            shown = text
    print(flush=True)
    return new, first
