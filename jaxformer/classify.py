"""``jaxformer classify``: the label and its probability for each text, from a classifier run
(``jaxformer train --family classifier``) or a Hugging Face ``BertForSequenceClassification``
directory, in JAX or with the torch twin.

Each text is framed ``[CLS] text [SEP]`` as the classifier task trains it (cut to the model's
context, said once on stderr) and scored by ``inference.BertInference.class_probabilities``.
Output: one line per text, ``LABEL<TAB>PROBABILITY<TAB>TEXT``, or with ``--json`` one JSON object
per line holding every label's probability.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxformer import commands
from jaxformer.commands import UsageError

COMMAND = "classify"
DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to classify")
    parser.add_argument("--model", type=Path, required=True, metavar="PATH",
                        help="a classifier run directory or a Hugging Face "
                             "BertForSequenceClassification directory")
    parser.add_argument("--step", type=int, default=None,
                        help="checkpoint step of a run (default: the latest)")
    parser.add_argument("--file", type=Path, default=None, metavar="FILE",
                        help="also classify each non-empty line of FILE ('-': stdin)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per batch (32)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per line: text, label, probability, and every "
                             "label's probability")
    parser.add_argument("--framework", choices=("jax", "torch"), default="jax",
                        help="jaxformer (jax, default) or its torch_ref twin")


def check_flags(args: argparse.Namespace) -> list[str]:
    """The flags, then the texts (read from ``--file``): all before a model is loaded."""
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.step is not None and args.step < 0:
        raise UsageError(f"--step must be a checkpoint step >= 0, got {args.step}")
    return commands.read_texts(args.texts, args.file)


def classify(loaded, texts: list[str], batch_size: int = 32):
    """``(probabilities [N, labels], label names, numbers of the texts that were cut)``."""
    import numpy as np

    from jaxformer import frameworks

    tokenizer, config = loaded.tokenizer, loaded.model.config
    inference = frameworks.module(loaded.framework, "inference").BertInference(loaded.model)
    specials = {name: commands.special_token(tokenizer, name, loaded.path)
                for name in ("cls", "sep")}
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    rows = []
    for n, text in enumerate(texts, 1):
        try:
            rows.append(tokenizer.encode(text))
        except ValueError as error:
            raise UsageError(f"text number {n}: {error}") from None
    out = np.zeros((len(texts), config.num_labels), np.float32)
    cut: list[int] = []
    for start in range(0, len(rows), batch_size):
        ids, types, mask, batch_cut = commands.bert_inputs(
            rows[start:start + batch_size], cls_id=specials["cls"], sep_id=specials["sep"],
            pad_id=pad, context=config.max_position_embeddings)
        out[start:start + len(ids)] = inference.class_probabilities(ids, types, mask)
        cut += [start + n + 1 for n in batch_cut]
    names = list(loaded.label_names or [f"LABEL_{i}" for i in range(config.num_labels)])
    return out, names, cut


def run(args: argparse.Namespace) -> int:
    return commands.guarded(COMMAND, lambda: _run(args), debug=getattr(args, "debug", False))


def _run(args: argparse.Namespace) -> int:
    texts = check_flags(args)
    loaded = commands.load_model(args.model, step=args.step, framework=args.framework,
                        families=("classifier",), command=f"jaxformer {COMMAND}")
    probabilities, names, cut = classify(loaded, texts, args.batch_size)
    if cut:
        print(f"jaxformer {COMMAND}: note: text(s) {', '.join(map(str, cut))} cut to the "
              f"model's context of {loaded.model.config.max_position_embeddings} tokens",
              file=sys.stderr)
    for text, row in zip(texts, probabilities):
        best = int(row.argmax())
        if args.json:
            print(json.dumps({"text": text, "label": names[best],
                              "probability": float(row[best]),
                              "probabilities": {name: float(p) for name, p in zip(names, row)}}))
        else:
            print(f"{names[best]}\t{row[best]:.4f}\t{text}")
    return 0
