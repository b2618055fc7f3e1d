"""``jaxformer eval``: a trained run (or a Hugging Face directory) measured on a text file.

The file is read exactly as ``jaxformer train`` reads its validation file (``--val-data``): the
Task's evaluation set (``Task.eval_dataset``: the run's seed, sequence length, windows, masking),
served in the batches training's evaluation draws (``Dataset.eval_batch``), each scored by the
Task's own training loss (``training.evaluation.evaluate_batch``, in either framework). Training
logs the mean over its ``--eval-batches`` first batches of the per-batch losses; ``eval`` reports
that same mean over the batches it scores, so ``--max-batches`` equal to the run's
``--eval-batches`` (and the run's batch size, the default) reproduces the last ``val_loss`` of
``metrics.jsonl``. Without ``--max-batches`` it scores every full batch of the file once (random
windows: as many batches as cover the file's tokens once on average). Glue: no twin
(docs/workflow.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np

from jaxformer.frameworks import FRAMEWORKS

PROG = "jaxformer eval"
DESCRIPTION = """\
Measure a trained model on a text file: the loss training reports, perplexity (per token; per
character for a character model, nanoGPT's figure), and the family's accuracies (classifier:
accuracy and a confusion table; bert: masked-LM and next-sentence accuracy; gpt and
transformer: next-token accuracy). The file is read as `jaxformer train --val-data` reads it, in
the same batches: on the run's validation file, with --max-batches equal to the run's
--eval-batches, the loss equals the last val_loss the run logged (docs/workflow.md)."""


class UsageError(ValueError):
    """A flag or input a user can fix (exit status 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="PATH",
                        help="a run directory of `jaxformer train` or a Hugging Face directory")
    parser.add_argument("--data", required=True, metavar="FILE",
                        help="the UTF-8 text file, in the format the family trains on")
    parser.add_argument("--step", type=int, metavar="N",
                        help="a run's checkpoint step (default: the latest good one)")
    parser.add_argument("--batch-size", type=int, metavar="B",
                        help="examples per batch (default: the run's micro-batch size, as "
                             "training evaluates)")
    parser.add_argument("--max-batches", type=int, metavar="N",
                        help="score at most N batches, the first N that training's evaluation "
                             "draws (default: every full batch of the file)")
    parser.add_argument("--held-out", action="store_true",
                        help="evaluate the last tenth of FILE, held out as training holds it "
                             "out without --val-data (its eval_loss)")
    parser.add_argument("--seq-len", type=int, metavar="T",
                        help="tokens per example (default: the run's; a Hugging Face directory "
                             "needs it or takes min(128, its context))")
    parser.add_argument("--framework", choices=FRAMEWORKS, default="jax",
                        help="evaluate the JAX model (default) or its PyTorch twin")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--out", metavar="FILE", help="also write the JSON results to FILE (new)")
    parser.add_argument("--progress", choices=("auto", "bar", "none"), default="auto",
                        help="a progress bar on stderr (auto: when stderr is a terminal)")


def check_arguments(args) -> None:
    """Every flag, before any model is loaded (UsageError names the flag)."""
    from jaxformer import outputs
    from jaxformer.training import data

    for flag, value, least in (("--step", args.step, 0), ("--batch-size", args.batch_size, 1),
                               ("--max-batches", args.max_batches, 1),
                               ("--seq-len", args.seq_len, 2)):
        if value is not None and value < least:
            raise UsageError(f"{flag} must be at least {least}, got {value}")
    model = Path(args.model)
    if not model.exists():
        raise UsageError(f"--model {model}: does not exist")
    if not model.is_dir():
        raise UsageError(f"--model {model}: is a file; give a run directory or a Hugging Face "
                         f"directory")
    try:
        data.read_text(args.data)
    except ValueError as error:
        raise UsageError(f"--data: {error}") from None
    if args.out:
        try:
            outputs.check_new_file("--out", args.out, keep={
                f"the data file (--data {args.data})": args.data,
                f"the model (--model {args.model})": args.model})
        except outputs.OutputError as error:
            raise UsageError(str(error)) from None


def _config(loaded, args):
    """The TrainConfig the batches and the loss read: the run's (or the defaults, for a Hugging
    Face directory), with one micro-batch per batch."""
    from jaxformer.training.config import TrainConfig

    config = loaded.train_config
    if config is None:
        context = getattr(loaded.config, "max_position_embeddings", 128)
        config = TrainConfig(seq_len=args.seq_len or min(128, context), warmup_steps=1)
    changes = {"batch_size": args.batch_size or config.micro_batch_size,
               "accumulation_steps": 1}
    if args.seq_len:
        changes["seq_len"] = args.seq_len
    try:
        return dataclasses.replace(config, **changes)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _label_map(loaded, dataset) -> np.ndarray | None:
    """Classifier: the model's class id of each of the file's labels (the file's ids are its
    own sorted labels), refusing a label the model does not know."""
    names = getattr(dataset, "label_names", None)
    if names is None or loaded.label_names is None:
        return None
    unknown = [n for n in names if n not in loaded.label_names]
    if unknown:
        raise UsageError(f"--data holds label(s) {unknown} that the model does not know; its "
                         f"labels are {loaded.label_names}")
    return np.array([loaded.label_names.index(n) for n in names], np.int64)


class _Scorer:
    """``score(batch) -> dict of numpy`` in the loaded model's framework
    (``training.evaluation.evaluate_batch``, jitted once for JAX)."""

    def __init__(self, loaded, config):
        from jaxformer import frameworks

        family = loaded.family
        evaluation = frameworks.module(loaded.framework, "training.evaluation")
        if loaded.framework == "torch":
            model = loaded.model
            self._score = lambda batch: evaluation.evaluate_batch(family, model, batch, config)
            return
        import jax
        from flax import nnx

        graphdef, state = nnx.split(loaded.model)
        jitted = jax.jit(lambda state, batch: evaluation.evaluate_batch(
            family, nnx.merge(graphdef, state), batch, config))
        self._score = lambda batch: jitted(state, batch)

    def __call__(self, batch: dict) -> dict[str, np.ndarray]:
        return {key: np.asarray(value) for key, value in self._score(batch).items()}


def _targets(family: str, batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """(targets, which count) of the token predictions of gpt and transformer, as the losses
    count them."""
    if family == "transformer" or "labels" in batch:
        labels = np.asarray(batch["labels"])
        return labels, labels != -100
    ids = np.asarray(batch["input_ids"])
    mask = np.asarray(batch.get("attention_mask", np.ones_like(ids))).astype(bool)
    pad = np.zeros_like(ids[:, :1])
    targets = np.concatenate([ids[:, 1:], pad], axis=1)
    valid = np.concatenate([mask[:, :-1] & mask[:, 1:], pad.astype(bool)], axis=1)
    return targets, valid


def evaluate(loaded, text: str, config, *, max_batches: int | None = None,
             progress: bool = False, held_out: bool = False) -> dict:
    """The figures of ``loaded`` (``jaxformer.loading.Loaded``) on ``text`` read with
    ``config`` (a TrainConfig whose micro-batch is the evaluation batch): all of it, as
    training reads ``--val-data``, or with ``held_out`` its last tenth, as training holds it out
    of the data file when evaluating without ``--val-data``."""
    from jaxformer.training import tasks

    task = tasks.get(loaded.family)
    if held_out:
        _, held = task.build_datasets(text, loaded.tokenizer.backend, config, 0.1)
        assert held is not None  # a positive fraction always holds some out (or refuses)
        dataset = held
    else:
        dataset = task.eval_dataset(text, loaded.tokenizer.backend, config)
    label_map = _label_map(loaded, dataset)
    count = dataset.eval_count(max_batches)
    scorer = _Scorer(loaded, config)
    family = loaded.family
    losses, nats, tokens, examples = [], 0.0, 0, 0
    hits: dict[str, list[int]] = {}
    classes = len(loaded.label_names) if loaded.label_names else getattr(
        loaded.config, "num_labels", 2)
    confusion = np.zeros((classes, classes), np.int64) if family == "classifier" else None
    batches = range(count)
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, desc=f"eval {family}", unit="batch", file=sys.stderr)
    for k in batches:
        batch = dataset.eval_batch(k)
        if label_map is not None:
            batch = {**batch, "labels": label_map[batch["labels"]].astype(np.int32)}
        task.check_batch(batch, loaded.config)
        out = scorer(batch)
        losses.append(float(out["loss"]))
        examples += len(next(iter(batch.values())))

        def count_hits(name, predicted, target, valid):
            right, total = hits.setdefault(name, [0, 0]), int(valid.sum())
            right[0] += int(((predicted == target) & valid).sum())
            right[1] += total
            return total

        if family in ("gpt", "transformer"):
            targets, valid = _targets(family, batch)
            n = count_hits("token_accuracy", out["token_predictions"], targets, valid)
            nats += float(out.get("nll", out["loss"])) * n
            tokens += n
        elif family == "bert":
            labels = np.asarray(batch["mlm_labels"])
            count_hits("mlm_accuracy", out["mlm_predictions"], labels, labels != -100)
            nsp = np.asarray(batch["nsp_labels"])
            count_hits("nsp_accuracy", out["nsp_predictions"], nsp, np.ones_like(nsp, bool))
        else:
            assert confusion is not None
            labels = np.asarray(batch["labels"])
            count_hits("accuracy", out["predictions"], labels, np.ones_like(labels, bool))
            np.add.at(confusion, (labels, np.asarray(out["predictions"])), 1)
    result: dict = {"family": family, "batches": count, "batch_size": config.micro_batch_size,
                    "examples": examples, "loss": sum(losses) / len(losses)}
    if tokens:
        result.update(tokens=tokens, nats_per_token=nats / tokens,
                      perplexity=math.exp(min(nats / tokens, 700.0)))
        if loaded.tokenizer.is_char:  # one token per character: nanoGPT's figures
            result.update(characters=tokens, nats_per_char=nats / tokens,
                          bits_per_char=nats / tokens / math.log(2))
    for name, (right, total) in hits.items():
        result[name] = right / total if total else None
    if confusion is not None:
        names = loaded.label_names or [str(i) for i in range(classes)]
        result["confusion"] = {"labels": names, "rows_are": "true label",
                               "matrix": confusion.tolist()}
    return result


def format_result(result: dict, header: dict) -> str:
    """The human-readable table of ``result``."""
    lines = [f"{header['model']}" + (f" (step {header['step']})" if header["step"] is not None
                                     else "") + f", {result['family']}, {header['framework']}",
             f"data {header['data']}: {result['batches']} batches of {result['batch_size']}, "
             f"{result['examples']} examples"]
    for key in ("loss", "nats_per_token", "perplexity", "nats_per_char", "bits_per_char",
                "token_accuracy", "mlm_accuracy", "nsp_accuracy", "accuracy"):
        if result.get(key) is not None:
            lines.append(f"  {key:<15} {result[key]:.6g}")
    if "tokens" in result:
        lines.append(f"  {'tokens':<15} {result['tokens']}")
    if "confusion" in result:
        names = result["confusion"]["labels"]
        width = max(8, *(len(n) for n in names)) + 1
        lines.append("  confusion (rows: true label, columns: predicted)")
        lines.append("  " + " " * width + "".join(f"{n:>{width}}" for n in names))
        for name, row in zip(names, result["confusion"]["matrix"]):
            lines.append(f"  {name:<{width}}" + "".join(f"{v:>{width}}" for v in row))
    return "\n".join(lines)


def run(args) -> int:
    from jaxformer.loading import LoadError, load
    from jaxformer.training import data
    from jaxformer.training.vocab import DataError

    def fail(message) -> int:
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2

    try:
        check_arguments(args)
        loaded = load(args.model, step=args.step, framework=args.framework)
        config = _config(loaded, args)
        progress = args.progress == "bar" or (args.progress == "auto" and sys.stderr.isatty())
        result = evaluate(loaded, data.read_text(args.data), config,
                          max_batches=args.max_batches, progress=progress,
                          held_out=args.held_out)
    except (UsageError, LoadError, DataError) as error:
        return fail(error)
    except ValueError as error:  # a batch the model refuses (ids, lengths): the input's fault
        return fail(error)
    except ImportError as error:
        if args.framework != "torch":
            raise
        return fail(f"--framework torch needs torch: pip install 'jaxformer[torch]' ({error})")
    header = {"model": str(args.model), "step": loaded.step, "framework": args.framework,
              "data": str(args.data)}
    full = {**header, "source": loaded.source, **result}
    if args.out:
        Path(args.out).write_text(json.dumps(full, indent=1) + "\n")
    print(json.dumps(full, indent=1) if args.json else format_result(result, header))
    note = _reproduction_note(loaded, args, result)
    if note:
        sys.stdout.flush()  # the results first, then the note on its own line
        print(f"{PROG}: note: {note}", file=sys.stderr)
    return 0


def _reproduction_note(loaded, args, result) -> str | None:
    """When FILE is the run's validation file (or its data file, with ``--held-out``) and the
    batches differ from those training scored: how to score exactly those."""
    from jaxformer.training import data

    run = loaded.run or {}
    evaluation, identity = run.get("evaluation") or {}, run.get("identity") or {}
    count = evaluation.get("eval_batches")
    if not evaluation.get("eval_every") or not isinstance(count, int):
        return None
    own = identity.get("data_sha256" if args.held_out else "val_data_sha256")
    if own != data.file_sha256(args.data) or (result["batches"] == count and not (
            args.batch_size and loaded.train_config
            and args.batch_size != loaded.train_config.micro_batch_size)):
        return None
    key = "eval_loss" if args.held_out else "val_loss"
    return (f"{args.data} is the run's {'data' if args.held_out else 'validation'} file; its "
            f"{key} in metrics.jsonl is the mean over the first {count} batches of the run's "
            f"batch size (--eval-batches {count}): pass --max-batches {count} (and no "
            f"--batch-size) to score exactly those; this scored {result['batches']}")
