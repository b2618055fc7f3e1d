"""``jaxformer fill-mask``: the most likely tokens for each ``[MASK]`` of a text, with their
probabilities, from a BERT run (``jaxformer train --family bert``) or a Hugging Face BERT
directory with a masked-LM head (``BertForMaskedLM``, ``BertForPreTraining``), in JAX or with
the torch twin.

Each text is framed ``[CLS] text [SEP]``; the tokenizer reads its mask token (``[MASK]``) as one
token. Every mask is predicted in the same forward pass (the others stay masked), and the
probabilities are the softmax of the masked-LM logits over the whole vocabulary. A directory
without a masked-LM head (a plain ``BertModel`` such as all-MiniLM-L6-v2) is refused.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from jaxformer import commands
from jaxformer.commands import UsageError

COMMAND = "fill-mask"
DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="*", metavar="TEXT",
                        help="texts holding one or more [MASK] tokens")
    parser.add_argument("--model", type=Path, required=True, metavar="PATH",
                        help="a bert run directory or a Hugging Face BERT directory with a "
                             "masked-LM head")
    parser.add_argument("--step", type=int, default=None,
                        help="checkpoint step of a run (default: the latest)")
    parser.add_argument("--file", type=Path, default=None, metavar="FILE",
                        help="also each non-empty line of FILE ('-': stdin)")
    parser.add_argument("--top-k", type=int, default=5, help="tokens shown per mask (5)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per text: each mask's position and top tokens")
    parser.add_argument("--framework", choices=("jax", "torch"), default="jax",
                        help="jaxformer (jax, default) or its torch_ref twin")


def check_flags(args: argparse.Namespace) -> list[str]:
    if args.top_k < 1:
        raise UsageError(f"--top-k must be at least 1, got {args.top_k}")
    if args.step is not None and args.step < 0:
        raise UsageError(f"--step must be a checkpoint step >= 0, got {args.step}")
    return commands.read_texts(args.texts, args.file)


def fill_mask(loaded, texts: list[str], top_k: int = 5) -> list[list[dict]]:
    """For each text, for each mask in order: ``{"position", "ids", "tokens",
    "probabilities"}`` of the ``top_k`` most likely tokens (ties: the lower id first)."""
    from jaxformer import frameworks

    inference_module = frameworks.module(loaded.framework, "inference")
    if not inference_module.has_mlm_head(loaded.model):
        raise UsageError(f"{loaded.path}: {type(loaded.model).__name__} has no masked-LM head; "
                         f"fill-mask needs a bert run or a Hugging Face BertForMaskedLM or "
                         f"BertForPreTraining directory")
    tokenizer, config = loaded.tokenizer, loaded.model.config
    cls, sep, mask_id = (commands.special_token(tokenizer, name, loaded.path)
                         for name in ("cls", "sep", "mask"))
    mask_token = tokenizer.decode([mask_id]) or "[MASK]"
    rows = []
    for n, text in enumerate(texts, 1):
        try:
            row = list(tokenizer.encode(text))
        except ValueError as error:
            raise UsageError(f"text number {n}: {error}") from None
        if mask_id not in row:
            raise UsageError(f"text number {n} ({text!r}) holds no {mask_token} token")
        if len(row) + 2 > config.max_position_embeddings:
            raise UsageError(f"text number {n} has {len(row)} tokens; with [CLS] and [SEP] it "
                             f"exceeds the model's context of {config.max_position_embeddings}")
        rows.append(row)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    ids, types, mask, _ = commands.bert_inputs(rows, cls_id=cls, sep_id=sep, pad_id=pad,
                                      context=config.max_position_embeddings)
    where = [np.flatnonzero(row == mask_id) for row in ids]
    positions = np.zeros((len(ids), max(len(w) for w in where)), np.int32)
    for r, w in enumerate(where):
        positions[r, :len(w)] = w  # padded with the first mask's position: ignored below
        positions[r, len(w):] = w[0]
    probabilities = inference_module.BertInference(loaded.model).masked_token_probabilities(
        ids, types, mask, positions)
    k = min(top_k, probabilities.shape[-1])
    out = []
    for r, w in enumerate(where):
        masks = []
        for m, position in enumerate(w):
            p = probabilities[r, m]
            best = np.argsort(-p, kind="stable")[:k]
            masks.append({"position": int(position), "ids": best.tolist(),
                          "tokens": [tokenizer.decode([int(i)]) for i in best],
                          "probabilities": p[best].tolist()})
        out.append(masks)
    return out


def run(args: argparse.Namespace) -> int:
    return commands.guarded(COMMAND, lambda: _run(args), debug=getattr(args, "debug", False))


def _run(args: argparse.Namespace) -> int:
    texts = check_flags(args)
    loaded = commands.load_model(args.model, step=args.step, framework=args.framework,
                        families=("bert",), command=f"jaxformer {COMMAND}")
    results = fill_mask(loaded, texts, args.top_k)
    for n, (text, masks) in enumerate(zip(texts, results)):
        if args.json:
            print(json.dumps({"text": text, "masks": masks}))
            continue
        print(f"[{n}] {text}")
        for m, found in enumerate(masks, 1):
            cells = "  ".join(f"{token!r} {p:.4f}" for token, p in
                              zip(found["tokens"], found["probabilities"]))
            print(f"  mask {m}: {cells}")
    return 0
