"""``jaxformer train``: its flags and what runs them (CLI glue, no twin).

Every hyper-parameter flag fills one field of ``TrainConfig``; the rest fill ``loop.RunOptions``.
Bad input ends with ``jaxformer train: error: ...`` naming the problem and exit status 2; a run
whose loss stops being finite ends with exit status 1 and keeps its last good checkpoint.
"""

from __future__ import annotations

import argparse
import sys

from jaxformer.config import DTYPES, PARAM_DTYPES, REMAT_POLICIES
from jaxformer.training.config import (
    FAMILIES,
    GPT_WINDOWS,
    SCHEDULES,
    TrainConfig,
    TrainConfigError,
)

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

A WordPiece vocabulary is trained on the file unless --tokenizer says otherwise.

nanoGPT's "baby GPT" on character-level Shakespeare (docs/training.md):
  jaxformer train --family gpt --preset baby --tokenizer char --data train.txt
    --val-data val.txt --gpt-windows random --steps 2000 --batch-size 12 --seq-len 64
    --lr 1e-3 --min-lr 1e-4 --schedule cosine --warmup 100 --beta2 0.99 --weight-decay 0.1
    --clip 1 --eval-every 250 --eval-iters 20"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("what to train")
    run.add_argument("--family", required=True, choices=sorted(FAMILIES),
                     help="model family and objective (see above)")
    run.add_argument("--preset", default="tiny",
                     help="model size: a preset of the family's config (tiny, base, gpt2, "
                          "simple_bert, ...; default tiny)")
    run.add_argument("--data", required=True, metavar="PATH", help="the UTF-8 text file")
    run.add_argument("--tokenizer", metavar="KIND|JSON",
                     help="char (one token per character, nanoGPT's shakespeare_char), bpe "
                          "(byte-level, GPT-2 style), wordpiece (the default), or the path of a "
                          "tokenizers tokenizer.json")
    run.add_argument("--vocab-size", type=int, metavar="N",
                     help="size of the vocabulary trained on the file (default: the preset's)")
    run.add_argument("--dropout", type=float, metavar="RATE",
                     help="replace every dropout rate of the preset (0 for parity runs)")
    run.add_argument("--framework", choices=("jax", "torch"), default="jax",
                     help="train the JAX model (default) or its PyTorch twin, from the same "
                          "initial weights and batches")
    run.add_argument("--dtype", choices=DTYPES,
                     help="compute dtype (default: the preset's, float32); bfloat16 is mixed "
                          "precision: float32 parameters, bfloat16 matmuls and activations, "
                          "float32 softmax, LayerNorm statistics and loss; torch trains under "
                          "torch.autocast (docs/scale.md)")
    run.add_argument("--param-dtype", choices=PARAM_DTYPES,
                     help="parameter storage dtype (default float32); bfloat16 with --dtype "
                          "bfloat16 is pure bfloat16, optimizer moments included")
    run.add_argument("--scan-layers", action=argparse.BooleanOptionalAction, default=None,
                     help="stack the layers' parameters and run them with one scan: compile "
                          "time flat in depth, same results (default: unrolled)")
    run.add_argument("--remat", choices=REMAT_POLICIES,
                     help="recompute each block's activations in the backward pass with this "
                          "policy (default none; docs/scale.md)")
    run.add_argument("--compile", action="store_true",
                     help="with --framework torch: run the model through torch.compile")
    run.add_argument("--mesh", metavar="AXIS=N,...",
                     help="train sharded over a device mesh of the axes data, fsdp, tensor, "
                          "e.g. data=2,fsdp=2,tensor=2 (the product = the device count; one "
                          "axis may be -1); default one device")

    hyper = parser.add_argument_group("hyper-parameters (TrainConfig)")
    hyper.add_argument("--steps", type=int, default=1000, help="optimizer updates (default 1000)")
    hyper.add_argument("--batch-size", type=int, default=8,
                       help="examples per update (default 8)")
    hyper.add_argument("--accumulation-steps", type=int, default=1, metavar="K",
                       help="split each update's batch into K micro-batches and average their "
                            "gradients (default 1)")
    hyper.add_argument("--seq-len", type=int, default=64, help="tokens per example (default 64)")
    hyper.add_argument("--gpt-windows", choices=GPT_WINDOWS, default="packed",
                       help="gpt: packed (consecutive --seq-len windows in a seeded order, the "
                            "default) or random (seq-len + 1 tokens at seeded random offsets, "
                            "the targets shifted by one: nanoGPT's get_batch)")
    hyper.add_argument("--lr", type=float, default=1e-3,
                       help="peak learning rate of AdamW (default 1e-3)")
    hyper.add_argument("--min-lr", type=float, default=0.0,
                       help="learning rate reached at the end of a linear or cosine decay")
    hyper.add_argument("--warmup", type=int, metavar="STEPS",
                       help="linear warm-up updates (default: a tenth of --steps)")
    hyper.add_argument("--schedule", choices=SCHEDULES,
                       help="after warm-up: linear or cosine decay to --min-lr, constant, or the "
                            "paper's inverse square root (default: inverse_sqrt for transformer, "
                            "linear otherwise)")
    hyper.add_argument("--weight-decay", type=float, default=0.01,
                       help="AdamW decoupled weight decay on weight matrices (default 0.01; "
                            "never on biases and LayerNorm)")
    hyper.add_argument("--decay-embeddings", action=argparse.BooleanOptionalAction,
                       default=True, help="also decay embedding tables (default yes)")
    hyper.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1 (default 0.9)")
    hyper.add_argument("--beta2", type=float, default=0.999, help="AdamW beta2 (default 0.999)")
    hyper.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon (default 1e-8)")
    hyper.add_argument("--clip", type=float, default=1.0,
                       help="clip the gradients' global norm to this (torch's formula; 0 = off; "
                            "default 1)")
    hyper.add_argument("--label-smoothing", type=float,
                       help="seq2seq label smoothing (default 0.1 for transformer, as the paper)")
    hyper.add_argument("--mlm-probability", type=float, default=0.15,
                       help="bert: fraction of tokens chosen for masked LM (default 0.15)")
    hyper.add_argument("--seed", type=int, default=0,
                       help="weights, dropout and data order (default 0)")

    out = parser.add_argument_group("output, evaluation, checkpoints")
    out.add_argument("--checkpoint-dir", metavar="DIR",
                     help="the run directory: run.json, tokenizer.json, checkpoints/, and by "
                          "default metrics.jsonl and metrics.png (default runs/FAMILY-PRESET)")
    out.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                     help="save a checkpoint every K updates (default 0: only at the end)")
    out.add_argument("--keep", type=int, default=3, help="checkpoints kept (default 3)")
    out.add_argument("--resume", action="store_true",
                     help="continue the run in --checkpoint-dir from its latest checkpoint "
                          "(the flags must describe the same run)")
    out.add_argument("--metrics", metavar="FILE",
                     help="JSON lines, one per update: step, loss, learning_rate, grad_norm, "
                          "seconds, tokens_per_s, model_tflops_per_s, mfu (with --peak-tflops), "
                          "eval_loss (default DIR/metrics.jsonl)")
    out.add_argument("--plot", metavar="PNG", help="loss curve (default: the metrics path, .png)")
    out.add_argument("--eval-every", type=int, default=0, metavar="K",
                     help="every K updates, the loss on the held-out tenth of the data or on "
                          "--val-data (default 0: no evaluation, nothing held out)")
    out.add_argument("--eval-batches", "--eval-iters", type=int, default=4, metavar="N",
                     help="batches per evaluation, the same ones each time (default 4)")
    out.add_argument("--val-data", metavar="PATH",
                     help="a validation text file: evaluate on it (metrics key val_loss) "
                          "instead of holding out the data file's last tenth")
    out.add_argument("--progress", choices=("auto", "bar", "plain", "none"), default="auto",
                     help="a progress bar on a terminal, plain lines otherwise (default auto)")
    out.add_argument("--log-every", type=int, default=10, metavar="K",
                     help="plain progress: one line every K updates (default 10)")
    out.add_argument("--peak-tflops", type=float,
                     help="the device's peak TFLOP/s, to report MFU")
    out.add_argument("--export-hf", metavar="DIR",
                     help="at the end, write the trained bert, classifier or gpt model as a "
                          "Hugging Face directory (transformers loads it) with tokenizer.json")


def config_from_args(args) -> TrainConfig:
    schedule = args.schedule or ("inverse_sqrt" if args.family == "transformer" else "linear")
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 10)
    smoothing = args.label_smoothing
    if smoothing is None:
        smoothing = 0.1 if args.family == "transformer" else 0.0
    return TrainConfig(
        steps=args.steps, batch_size=args.batch_size, accumulation_steps=args.accumulation_steps,
        seq_len=args.seq_len, gpt_windows=args.gpt_windows, learning_rate=args.lr,
        min_learning_rate=args.min_lr,
        warmup_steps=warmup, schedule=schedule, beta1=args.beta1, beta2=args.beta2,
        eps=args.eps, weight_decay=args.weight_decay, decay_embeddings=args.decay_embeddings,
        clip_norm=args.clip, label_smoothing=smoothing, mlm_probability=args.mlm_probability,
        seed=args.seed)


def run(args) -> int:
    from jaxformer.training import loop
    from jaxformer.training.data import DataError

    try:
        config = config_from_args(args)
        options = loop.RunOptions(
            family=args.family, data=args.data, preset=args.preset, framework=args.framework,
            tokenizer=args.tokenizer, vocab_size=args.vocab_size, dropout=args.dropout,
            dtype=args.dtype, param_dtype=args.param_dtype, scan_layers=args.scan_layers,
            remat=args.remat,
            checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
            keep=args.keep, resume=args.resume, metrics=args.metrics, plot=args.plot,
            eval_every=args.eval_every, eval_batches=args.eval_batches,
            val_data=args.val_data, progress=args.progress,
            log_every=args.log_every, peak_tflops=args.peak_tflops, compile=args.compile,
            export_hf=args.export_hf, mesh=args.mesh)
        result = loop.train(config, options)
    except (TrainConfigError, DataError, loop.ResumeError, ValueError) as error:
        print(f"jaxformer train: error: {error}", file=sys.stderr)
        return 2
    except ImportError as error:
        if args.framework != "torch" or "torch" not in str(error):
            raise
        print("jaxformer train: error: --framework torch needs torch: pip install "
              "'jaxformer[torch]'", file=sys.stderr)
        return 2
    except loop.TrainingDiverged as error:
        print(f"jaxformer train: {error}", file=sys.stderr)
        return 1
    print(f"trained {args.family} ({args.framework}) to step {result.final_step}; metrics "
          f"{result.metrics_path}, plot {result.plot_path}, checkpoints "
          f"{result.run_dir / 'checkpoints'}")
    return 0
