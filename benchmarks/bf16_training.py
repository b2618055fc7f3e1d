"""Does bfloat16 training track float32? nanoGPT's baby GPT on character-level Shakespeare, in
jaxformer, once per precision, from the same initial weights on the same batches.

The recipe is ``baby_gpt.py``'s (nanoGPT's CPU recipe: preset ``baby``, batch 12, context 64,
AdamW lr 1e-3 with 100 warm-up updates and a cosine decay to 1e-4, beta2 0.99, weight decay 0.1,
clipping at 1), shortened to ``--steps`` updates, run through ``jaxformer train``'s loop with
``--dtype`` / ``--param-dtype``:

- ``float32``: the reference;
- ``bfloat16``: mixed precision, float32 parameters and optimizer state, bfloat16 compute;
- ``bfloat16-pure``: parameters and AdamW moments in bfloat16 too.

The batches are a function of the step, so the curves are paired step by step: the gap of the
training loss is measured on a moving average (``--window`` updates) of the per-step difference,
the validation gap at every evaluation (``--eval-iters`` fixed held-out batches). Step times:
the runs' wall-clock medians, and after the runs ``--time-rounds`` rounds of one update per
precision, interleaved (ABC CBA ...), on the process-CPU clock, which a process is not charged
while other processes hold the cores. Results: ``benchmarks/results/bf16_training.json``, ``.png``.

  python benchmarks/bf16_training.py                         # 500 updates, the three precisions
  python benchmarks/bf16_training.py --steps 20 --eval-every 10 --no-save   # smoke
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import baby_gpt
import harness
import numpy as np

VARIANTS = {"float32": ("float32", "float32"), "bfloat16": ("bfloat16", "float32"),
            "bfloat16-pure": ("bfloat16", "bfloat16")}  # name -> (dtype, param_dtype)


def train_one(name: str, config, args, train: Path, val: Path, runs: Path) -> dict:
    from jaxformer.training import loop

    dtype, param_dtype = VARIANTS[name]
    options = loop.RunOptions(
        family="gpt", data=str(train), val_data=str(val), preset="baby", tokenizer="char",
        dtype=dtype, param_dtype=param_dtype, checkpoint_dir=str(runs / name),
        eval_every=args.eval_every, eval_batches=args.eval_iters, progress="plain",
        log_every=args.log_every)
    load_before = harness.loadavg()
    with harness.ForeignLoad() as foreign:
        began = time.perf_counter()
        result = loop.train(config, options)
        wall = time.perf_counter() - began
    records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    seconds = [r["seconds"] for r in records[1:]]  # the first step compiles
    return {"dtype": dtype, "param_dtype": param_dtype, "wall_s": wall,
            "loadavg_before": load_before, "loadavg_after": harness.loadavg(),
            "foreign_cores": foreign.cores, "first_step_s": records[0]["seconds"],
            "step_seconds_median": float(np.median(seconds)),
            "step_seconds_p25_p75": [float(np.percentile(seconds, q)) for q in (25, 75)],
            "train_loss": [r["loss"] for r in records],
            "val_loss": [{"step": r["step"], "loss": r["val_loss"]} for r in records
                         if "val_loss" in r]}


def time_steps(config, variants: list[str], rounds: int, train: Path) -> dict:
    """Median seconds of one jitted update per precision, interleaved, process-CPU and wall."""
    from jaxformer.training import config as train_config
    from jaxformer.training import vocab
    from jaxformer.training.step import TrainStep, build_model

    tokenizer = vocab.char_tokenizer(train.read_text())
    ids = vocab.encode_chars(tokenizer, train.read_text()[:100_000])
    B, T = config.batch_size, config.seq_len
    starts = np.random.RandomState(0).randint(0, len(ids) - T - 1, B)
    batch = {"input_ids": np.stack([ids[s:s + T] for s in starts])[None],
             "labels": np.stack([ids[s + 1:s + T + 1] for s in starts])[None],
             "attention_mask": np.ones((1, B, T), np.int64)}
    steps = {}
    for name in variants:
        dtype, param_dtype = VARIANTS[name]
        model_cfg = train_config.model_config("gpt", "baby", vocab_size=tokenizer.get_vocab_size(),
                                              dtype=dtype, param_dtype=param_dtype)
        trainer = TrainStep("gpt", build_model("gpt", model_cfg, config.seed), config)
        for _ in range(3):  # compile, warm up
            trainer(batch)
        steps[name] = lambda trainer=trainer: trainer(batch)  # returns floats: work is done
    cpu, wall = harness.time_interleaved(steps, rounds, clock="cpu")
    return {name: {"cpu_s": harness.summarize(cpu[name]), "wall_s": harness.summarize(wall[name])}
            for name in variants}


def moving_average(x: np.ndarray, window: int) -> np.ndarray:
    return np.convolve(x, np.ones(window) / window, mode="valid")


def gaps(run: dict, reference: dict, window: int) -> dict:
    """``run`` minus ``reference``: the training loss's moving average and the validation loss."""
    diff = np.asarray(run["train_loss"]) - np.asarray(reference["train_loss"])
    smooth = moving_average(diff, window)
    val = [a["loss"] - b["loss"] for a, b in zip(run["val_loss"], reference["val_loss"])]
    return {f"train_loss_moving_{window}_max_abs": float(np.abs(smooth).max()),
            f"train_loss_last_{window}_mean": float(smooth[-1]),
            "train_loss_per_step_max_abs": float(np.abs(diff).max()),
            "val_loss_max_abs": float(np.abs(val).max()), "val_loss_final": float(val[-1]),
            "val_loss_final_relative": float(val[-1] / reference["val_loss"][-1]["loss"]),
            "val_loss_by_eval": val,
            "step_time_over_float32": run["step_seconds_median"]
            / reference["step_seconds_median"]}


def plot(report: dict, path: Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxformer.training.reporting import save_figure

    fig, (ax, dax) = plt.subplots(2, 1, figsize=(8, 7), sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})
    colors = {"float32": "tab:blue", "bfloat16": "tab:orange", "bfloat16-pure": "tab:green"}
    reference = report["runs"]["float32"]
    for name, run in report["runs"].items():
        c = colors[name]
        loss = np.asarray(run["train_loss"])
        steps = np.arange(window, len(loss) + 1)
        ax.plot(steps, moving_average(loss, window), color=c, lw=1,
                label=f"{name} train ({window}-step mean); {run['step_seconds_median'] * 1e3:.0f}"
                      f" ms/step")
        ax.plot([e["step"] for e in run["val_loss"]], [e["loss"] for e in run["val_loss"]], "o--",
                color=c, ms=4, label=f"{name} val (final {run['val_loss'][-1]['loss']:.3f})")
        if name != "float32":
            diff = loss - np.asarray(reference["train_loss"])
            dax.plot(steps, moving_average(diff, window), color=c, lw=1, label=f"{name} train")
            dax.plot([e["step"] for e in run["val_loss"]], report["gaps"][name]["val_loss_by_eval"],
                     "o--", color=c, ms=4, label=f"{name} val")
    dax.axhline(0, color="gray", lw=0.8)
    ax.set_ylabel("cross-entropy (nats per character)")
    ax.set_ylim(top=min(4.5, ax.get_ylim()[1]))
    dax.set_ylabel("minus float32")
    dax.set_xlabel("update")
    env = report["environment"]
    ax.set_title(f"baby GPT, char Shakespeare, jaxformer: bfloat16 vs float32. {env['cpu']} "
                 f"({env['cpu_count']} cores), {env['date_utc'][:10]}", fontsize=9)
    for a in (ax, dax):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    save_figure(fig, path)


def main(argv=None) -> int:
    parser = harness.argument_parser(__doc__, repeats=1, warmup=0)
    parser.add_argument("--data-dir", default=str(baby_gpt.DEFAULT_DATA),
                        help="train.txt / val.txt of `jaxformer data shakespeare` (written there "
                             "when missing)")
    parser.add_argument("--steps", type=int, default=500, help="updates (500)")
    parser.add_argument("--eval-every", type=int, default=50, help="updates between evaluations")
    parser.add_argument("--eval-iters", type=int, default=20, help="validation batches (20)")
    parser.add_argument("--window", type=int, default=50, help="moving average of the gap (50)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, float32 first (default {','.join(VARIANTS)})")
    parser.add_argument("--log-every", type=int, default=50, help="progress line period")
    parser.add_argument("--time-rounds", type=int, default=30,
                        help="interleaved timing rounds after the runs (0: none)")
    parser.add_argument("--time-only", action="store_true",
                        help="no training: time the updates and add the timing to the existing "
                             "bf16_training.json in --out")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    if variants[0] != "float32" or not set(variants) <= set(VARIANTS):
        parser.error(f"--variants: float32 first, then any of {list(VARIANTS)[1:]}")
    if args.window > args.steps:
        parser.error(f"--window ({args.window}) exceeds --steps ({args.steps})")
    bench = harness.start(args, "bf16_training", title="baby GPT: bfloat16 vs float32")
    train, val = baby_gpt.corpus_files(Path(args.data_dir).expanduser())
    config = baby_gpt.recipe(args)
    out = Path(args.out)
    if args.time_only:
        report = json.loads((out / "bf16_training.json").read_text())
        load_before = harness.loadavg()
        report["step_time"] = time_steps(config, variants, args.time_rounds or 30, train)
        report["step_time_load"] = [load_before, harness.loadavg()]
        report["step_time_command"] = bench.report["command"]
        print(json.dumps({k: {c: round(v[c]["median_s"] * 1e3, 1) for c in v}
                          for k, v in report["step_time"].items()}), "ms", flush=True)
        if not args.no_save:
            tmp = out / f".bf16_training.json.tmp-{os.getpid()}"
            tmp.write_text(json.dumps(report, indent=1) + "\n")
            os.replace(tmp, out / "bf16_training.json")
        return 0
    report = {"benchmark": "bf16_training", "command": bench.report["command"],
              "environment": bench.env, "train_config": config.to_dict(),
              "data": {"train": str(train), "val": str(val)}, "runs": {}, "gaps": {}}
    with tempfile.TemporaryDirectory() as runs:
        for name in variants:
            print(f"== {name}: {config.steps} updates", flush=True)
            run = report["runs"][name] = train_one(name, config, args, train, val, Path(runs))
            print(f"== {name}: final val loss {run['val_loss'][-1]['loss']:.4f}, "
                  f"{run['step_seconds_median'] * 1e3:.1f} ms/step, wall {run['wall_s']:.0f} s, "
                  f"load {run['loadavg_before']} -> {run['loadavg_after']}", flush=True)
    if args.time_rounds:
        print(f"== timing: {args.time_rounds} interleaved rounds", flush=True)
        load_before = harness.loadavg()
        report["step_time"] = time_steps(config, variants, args.time_rounds, train)
        report["step_time_load"] = [load_before, harness.loadavg()]
        print(json.dumps({k: {c: round(v[c]["median_s"] * 1e3, 1) for c in v}
                          for k, v in report["step_time"].items()}), "ms", flush=True)
    for name in variants[1:]:
        report["gaps"][name] = gaps(report["runs"][name], report["runs"]["float32"], args.window)
        print(name, json.dumps({k: v for k, v in report["gaps"][name].items()
                                if k != "val_loss_by_eval"}))
    if args.no_save:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".bf16_training.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, out / "bf16_training.json")
    plot(report, out / "bf16_training.png", args.window)
    print(f"wrote {out / 'bf16_training.json'} and {out / 'bf16_training.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
