"""``jaxformer train``: its flags and what runs them (CLI glue, no twin).

:data:`FLAGS` lists each flag once, in ``--help`` order, with the ``TrainConfig`` or
``loop.RunOptions`` field it fills: the parser and both dataclasses are built from it. Bad input
ends with ``jaxformer train: error: ...`` and exit status 2 (a damaged file of the run included:
the message names the file); a diverged run with exit status 1; SIGINT or SIGTERM saves, prints
the step saved and the command that resumes, and exits with status 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from jaxformer.config import DTYPES, PARAM_DTYPES, REMAT_POLICIES
from jaxformer.frameworks import FRAMEWORKS
from jaxformer.sharding import distributed
from jaxformer.training import tasks
from jaxformer.training.config import GPT_WINDOWS, SCHEDULES, TrainConfig, TrainConfigError
from jaxformer.training.loop import CHECKPOINT_EVERY, PROGRESS, RunOptions

DESCRIPTION = """\
Train a model on a text file, in JAX (default) or with the PyTorch twin, and write per-step
metrics (JSON lines), a loss-curve PNG and orbax checkpoints into the run directory.

What each family makes of the file (UTF-8 text; docs/training.md has the details):
  gpt          the lines' tokens as one stream (with --tokenizer char: the raw text) cut into
               --seq-len windows, or windows at random offsets (--gpt-windows random, nanoGPT's
               batches); next-token loss
  bert         one sentence per line, blank lines between documents; masked LM + next sentence
  transformer  SOURCE<TAB>TARGET lines (or each line followed by the next); label smoothing
  classifier   LABEL<TAB>TEXT lines; BERT with a classifier on the pooled [CLS] vector

A WordPiece vocabulary is trained on the file unless --tokenizer says otherwise, or --init-from
gives the tokenizer (and the architecture and weights) of a trained model to fine-tune.

Fine-tuning a Hugging Face checkpoint (or a run directory) as a classifier (docs/training.md):
  jaxformer train --family classifier --init-from all-MiniLM-L6-v2/ --data train.tsv
    --val-data val.tsv --steps 80 --batch-size 16 --lr 1e-4 --eval-every 20

nanoGPT's "baby GPT" on character-level Shakespeare (docs/training.md):
  jaxformer train --family gpt --preset baby --tokenizer char --data train.txt
    --val-data val.txt --gpt-windows random --steps 2000 --batch-size 12 --seq-len 64
    --lr 1e-3 --min-lr 1e-4 --schedule cosine --warmup 100 --beta2 0.99 --weight-decay 0.1
    --clip 1 --eval-every 250 --eval-batches 20

A TOML file of flags (keys: the flags' names without the leading dashes; the command line wins);
every run writes its own, resolved, as DIR/config.toml, which runs it again bit for bit:
  jaxformer train --config baby.toml --steps 100
  jaxformer train --config runs/baby/config.toml --checkpoint-dir runs/baby-again"""

GROUPS = {"run": "what to train", "hyper": "hyper-parameters (TrainConfig)",
          "output": "output, evaluation, checkpoints"}
# (group, flags, field, argparse keywords), in --help order. ``field`` is the TrainConfig field
# (group "hyper") or the RunOptions field the flag fills; the flag's default is that field's
# unless the keywords give one (None: the task's default or one derived from --steps, see
# config_from_args).
FLAGS: list[tuple[str, tuple[str, ...], str, dict[str, Any]]] = [
    ("run", ("--family",), "family",
     dict(required=True, choices=sorted(tasks.TASKS),
          help="model family and objective (see above)")),
    ("run", ("--preset",), "preset",
     dict(help="model size: a preset of the family's config (tiny, base, gpt2, simple_bert, ...; "
               "default tiny, or with --init-from the checkpoint's architecture)")),
    ("run", ("--init-from",), "init_from",
     dict(metavar="DIR",
          help="start from the weights of a jaxformer run directory (its latest checkpoint) or a "
               "Hugging Face model directory: the architecture and the tokenizer are the "
               "checkpoint's (a --preset, --tokenizer or --vocab-size that disagrees is an "
               "error), heads the checkpoint lacks are created fresh and those the task does not "
               "use are dropped, each reported by name (docs/training.md, fine-tuning)")),
    ("run", ("--data",), "data", dict(required=True, metavar="PATH", help="the UTF-8 text file")),
    ("run", ("--tokenizer",), "tokenizer",
     dict(metavar="KIND|JSON",
          help="char (one token per character, nanoGPT's shakespeare_char), bpe (byte-level, "
               "GPT-2 style), wordpiece (the default), or the path of a tokenizers "
               "tokenizer.json")),
    ("run", ("--vocab-size",), "vocab_size",
     dict(type=int, metavar="N",
          help="size of the vocabulary trained on the file (default: the preset's)")),
    ("run", ("--dropout",), "dropout",
     dict(type=float, metavar="RATE",
          help="replace every dropout rate of the preset (0 for parity runs)")),
    ("run", ("--framework",), "framework",
     dict(choices=FRAMEWORKS,
          help="train the JAX model (default) or its PyTorch twin, from the same initial "
               "weights and batches")),
    ("run", ("--dtype",), "dtype",
     dict(choices=DTYPES,
          help="compute dtype (default: the preset's, float32); bfloat16 is mixed precision: "
               "float32 parameters, bfloat16 matmuls and activations, float32 softmax, "
               "LayerNorm statistics and loss; torch trains under torch.autocast "
               "(docs/scale.md)")),
    ("run", ("--param-dtype",), "param_dtype",
     dict(choices=PARAM_DTYPES,
          help="parameter storage dtype (default float32); bfloat16 with --dtype bfloat16 is "
               "pure bfloat16, optimizer moments included")),
    ("run", ("--scan-layers",), "scan_layers",
     dict(action=argparse.BooleanOptionalAction,
          help="stack the layers' parameters and run them with one scan: compile time flat in "
               "depth, same results (default: unrolled)")),
    ("run", ("--remat",), "remat",
     dict(choices=REMAT_POLICIES,
          help="recompute each block's activations in the backward pass with this policy "
               "(default none; docs/scale.md)")),
    ("run", ("--compile",), "compile",
     dict(action="store_true", help="with --framework torch: run the model through torch.compile")),
    ("run", ("--mesh",), "mesh",
     dict(metavar="AXIS=N,...",
          help="train sharded over a device mesh of the axes data, fsdp, tensor, e.g. "
               "data=2,fsdp=2,tensor=2 (the product = the device count; one axis may be -1); "
               "default one device")),

    ("hyper", ("--steps",), "steps", dict(type=int, help="optimizer updates (default 1000)")),
    ("hyper", ("--batch-size",), "batch_size",
     dict(type=int, help="examples per update (default 8)")),
    ("hyper", ("--accumulation-steps",), "accumulation_steps",
     dict(type=int, metavar="K",
          help="split each update's batch into K micro-batches and average their gradients "
               "(default 1)")),
    ("hyper", ("--seq-len",), "seq_len", dict(type=int, help="tokens per example (default 64)")),
    ("hyper", ("--gpt-windows",), "gpt_windows",
     dict(choices=GPT_WINDOWS,
          help="gpt: packed (consecutive --seq-len windows in a seeded order, the default) or "
               "random (seq-len + 1 tokens at seeded random offsets, the targets shifted by one: "
               "nanoGPT's get_batch)")),
    ("hyper", ("--lr",), "learning_rate",
     dict(type=float, help="peak learning rate of AdamW (default 1e-3)")),
    ("hyper", ("--min-lr",), "min_learning_rate",
     dict(type=float, help="learning rate reached at the end of a linear or cosine decay")),
    ("hyper", ("--warmup",), "warmup_steps",
     dict(type=int, metavar="STEPS", default=None,
          help="linear warm-up updates (default: a tenth of --steps)")),
    ("hyper", ("--schedule",), "schedule",
     dict(choices=SCHEDULES, default=None,
          help="after warm-up: linear or cosine decay to --min-lr, constant, or the paper's "
               "inverse square root (default: inverse_sqrt for transformer, linear otherwise)")),
    ("hyper", ("--weight-decay",), "weight_decay",
     dict(type=float,
          help="AdamW decoupled weight decay on weight matrices (default 0.01; never on biases "
               "and LayerNorm)")),
    ("hyper", ("--decay-embeddings",), "decay_embeddings",
     dict(action=argparse.BooleanOptionalAction,
          help="also decay embedding tables (default yes)")),
    ("hyper", ("--beta1",), "beta1", dict(type=float, help="AdamW beta1 (default 0.9)")),
    ("hyper", ("--beta2",), "beta2", dict(type=float, help="AdamW beta2 (default 0.999)")),
    ("hyper", ("--eps",), "eps", dict(type=float, help="AdamW epsilon (default 1e-8)")),
    ("hyper", ("--clip",), "clip_norm",
     dict(type=float,
          help="clip the gradients' global norm to this (torch's formula; 0 = off; default 1)")),
    ("hyper", ("--label-smoothing",), "label_smoothing",
     dict(type=float, default=None,
          help="seq2seq label smoothing (default 0.1 for transformer, as the paper)")),
    ("hyper", ("--mlm-probability",), "mlm_probability",
     dict(type=float, help="bert: fraction of tokens chosen for masked LM (default 0.15)")),
    ("hyper", ("--seed",), "seed",
     dict(type=int, help="weights, dropout and data order (default 0)")),

    ("output", ("--checkpoint-dir",), "checkpoint_dir",
     dict(metavar="DIR",
          help="the run directory: run.json, tokenizer.json, checkpoints/, and by default "
               "metrics.jsonl and metrics.png (default runs/FAMILY-PRESET)")),
    ("output", ("--checkpoint-every",), "checkpoint_every",
     dict(type=int, metavar="K",
          help=f"save a checkpoint every K updates (default {CHECKPOINT_EVERY}; 0: only at the "
               f"end); the end of the run and an interrupt (Ctrl-C, SIGTERM) always save")),
    ("output", ("--keep",), "keep", dict(type=int, help="checkpoints kept (default 3)")),
    ("output", ("--resume",), "resume",
     dict(action="store_true",
          help="continue the run in --checkpoint-dir from its newest good checkpoint (the flags "
               "must describe the same run; a damaged newer checkpoint is reported and set "
               "aside); with --schedule constant, a larger --steps extends a run")),
    ("output", ("--resume-strict",), "resume_strict",
     dict(action="store_true",
          help="with --resume: refuse (exit 2) when the latest checkpoint is damaged instead of "
               "resuming from an earlier one")),
    ("output", ("--metrics",), "metrics",
     dict(metavar="FILE",
          help="JSON lines, one per update: step, loss, learning_rate, grad_norm, seconds, "
               "tokens_per_s, model_tflops_per_s, mfu (with --peak-tflops), eval_loss (and "
               "eval_accuracy for the classifier; val_ with --val-data) (default "
               "DIR/metrics.jsonl); a new file, or on --resume the run's own (rewritten)")),
    ("output", ("--plot",), "plot",
     dict(metavar="PNG", help="loss curve (default: the metrics path, .png); a new file, or on "
                              "--resume the run's own (redrawn)")),
    ("output", ("--eval-every",), "eval_every",
     dict(type=int, metavar="K",
          help="every K updates, the loss on the held-out tenth of the data or on --val-data "
               "(default 0: no evaluation, nothing held out)")),
    ("output", ("--eval-batches", "--eval-iters"), "eval_batches",
     dict(type=int, metavar="N",
          help="batches per evaluation, the same ones each time (default 4)")),
    ("output", ("--val-data",), "val_data",
     dict(metavar="PATH",
          help="a validation text file: evaluate on it (metrics key val_loss) instead of "
               "holding out the data file's last tenth")),
    ("output", ("--progress",), "progress",
     dict(choices=PROGRESS,
          help="a progress bar on a terminal, plain lines otherwise (default auto)")),
    ("output", ("--log-every",), "log_every",
     dict(type=int, metavar="K", help="plain progress: one line every K updates (default 10)")),
    ("output", ("--peak-tflops",), "peak_tflops",
     dict(type=float, help="the device's peak TFLOP/s, to report MFU")),
    ("output", ("--export-hf",), "export_hf",
     dict(metavar="DIR",
          help="at the end, write the trained bert, classifier or gpt model as a Hugging Face "
               "directory (transformers loads it) with tokenizer.json; DIR must be new or empty "
               "and apart from the run directory")),
    ("output", ("--overwrite",), "overwrite",
     dict(action="store_true",
          help="let --export-hf replace a previous --export-hf export (recognised by its "
               "marker file and exact file set); a directory holding anything else is never "
               "replaced")),
]


def _fields(group: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(TrainConfig if group == "hyper" else RunOptions)}


def _dest(flags: tuple[str, ...]) -> str:
    """The attribute argparse stores a flag under (its first long name)."""
    return flags[0].removeprefix("--").replace("-", "_")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    groups["run"].add_argument(
        "--config", metavar="TOML",
        help="read flags from this TOML file (keys: the flags' names without the leading "
             "dashes, e.g. seq-len = 64); flags on the command line win (docs/training.md)")
    for group, flags, field, keywords in FLAGS:
        default = _fields(group)[field].default
        if "default" not in keywords and default is not dataclasses.MISSING:
            keywords = {"default": default, **keywords}
        if keywords.get("required"):  # or given by --config: config_file.apply checks
            keywords = {**keywords, "required": False,
                        "help": f"{keywords['help']} (required, here or in --config)"}
        groups[group].add_argument(*flags, **keywords)
    distributed.add_arguments(parser)  # --coordinator, --num-processes, --process-id, ...


def _values(args, group: str) -> dict:
    """The fields of ``group``'s dataclass that flags fill, from the parsed ``args``."""
    return {field: getattr(args, _dest(flags)) for g, flags, field, _ in FLAGS if g == group}


def config_from_args(args) -> TrainConfig:
    task = tasks.get(args.family)
    values = _values(args, "hyper")
    values["schedule"] = args.schedule or task.default_schedule
    values["warmup_steps"] = args.warmup if args.warmup is not None else max(1, args.steps // 10)
    if args.label_smoothing is None:
        values["label_smoothing"] = task.default_label_smoothing
    return TrainConfig(**values)


def _program() -> list[str]:
    """How this process was started: ``jaxformer`` when that is the script on the PATH, else
    ``python -m jaxformer.cli``."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is not None and script.name == "jaxformer":
        found = shutil.which("jaxformer")
        same = found and os.path.realpath(found) == os.path.realpath(script)
        return ["jaxformer"] if same else [str(script)]
    return [sys.executable, "-m", "jaxformer.cli"]


def resume_command(argv: list[str] | None) -> str:
    """The command line that resumes this run: the user's own arguments plus ``--resume``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--resume" not in argv:
        argv.append("--resume")
    return shlex.join(_program() + argv)


def as_flags(message: str) -> str:
    """A library error (``TrainConfig``, ``RunOptions``: named by field) in the flags' words:
    ``TrainConfig: learning_rate must be positive`` -> ``--lr must be positive``."""
    flag_of = {field: flags[0] for _, flags, field, _ in FLAGS}
    message = message.removeprefix("TrainConfig: ")
    field, _, rest = message.partition(" ")
    if field in flag_of:
        message = f"{flag_of[field]} {rest}"
    return re.sub(r"given only with (\w+)",
                  lambda m: f"given only with {flag_of.get(m.group(1), m.group(1))}", message)


def run(args) -> int:
    from jaxformer.training import config_file, loop
    from jaxformer.training.vocab import DataError

    config_file.apply(args, FLAGS)  # --config FILE; a UsageError: jaxformer.cli.main reports
    try:
        distributed.start(args)  # several processes: join them (before any device is used)
        config = config_from_args(args)
        options = RunOptions(**_values(args, "run"), **_values(args, "output"),
                             warmup_given=args.warmup is not None)
        result = loop.train(config, options, flags=FLAGS)  # FLAGS: to write DIR/config.toml
    except loop.RunInterrupted as error:
        command = resume_command(getattr(args, "argv", None))
        print(f"jaxformer train: interrupted ({error.signal_name}): saved step {error.step} in "
              f"{error.checkpoint_dir}; metrics and plot written. Resume with:\n  {command}",
              file=sys.stderr, flush=True)
        return 130
    except KeyboardInterrupt as error:  # RunAborted (a second signal), or one before training
        # orbax's save threads, cut short, would print their tracebacks at exit
        import threading

        threading.excepthook = lambda hook_args: None
        label = args.preset or ("finetune" if args.init_from else "tiny")
        run_dir = Path(args.checkpoint_dir or f"runs/{args.family}-{label}")
        what = ("a second signal: stopped at once" if isinstance(error, loop.RunAborted)
                else "interrupted before the first update")
        line = f"jaxformer train: {what}; nothing unfinished was left behind"
        if (run_dir / "run.json").is_file():
            line += (f"; the run in {run_dir} resumes from its last checkpoint with:\n  "
                     f"{resume_command(getattr(args, 'argv', None))}")
        print(line, file=sys.stderr, flush=True)
        return 130
    except (TrainConfigError, DataError, loop.ResumeError, ValueError) as error:
        print(f"jaxformer train: error: {as_flags(str(error))}", file=sys.stderr)
        return 2
    except ImportError as error:
        if args.framework != "torch" or "torch" not in str(error):
            raise
        print("jaxformer train: error: --framework torch needs torch: pip install "
              "'jaxformer[torch]'", file=sys.stderr)
        return 2
    except loop.TrainingDiverged as error:
        print(f"jaxformer train: error: {error}", file=sys.stderr)
        return 1
    if not distributed.is_primary():
        return 0
    print(f"trained {args.family} ({args.framework}) to step {result.final_step}; metrics "
          f"{result.metrics_path}, plot {result.plot_path}, checkpoints "
          f"{result.run_dir / 'checkpoints'}")
    if args.progress != "none":  # which prints the result line alone
        print(f"time {result.times.line()}")
    return 0
