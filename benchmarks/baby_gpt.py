"""nanoGPT's "baby GPT" on character-level Shakespeare, trained in both frameworks.

The recipe of nanoGPT's README for a CPU (its `config/train_shakespeare_char.py` with the README's
overrides): 4 layers, 4 heads, width 128, context 64, batch 12, 2000 updates, dropout 0, AdamW
lr 1e-3 with 100 warm-up updates and a cosine decay to 1e-4, beta2 0.99, weight decay 0.1, clipping
at 1.0, 20 validation batches every 250 updates. nanoGPT reports a validation loss of 1.88 after
about 3 minutes on a laptop CPU. Here it runs through `jaxformer train` (`loop.train`), JAX first
then the PyTorch twin, from the same initial weights on the same batches, back to back; each run
records its per-evaluation validation losses, its per-step training losses, its wall time (data,
compilation, evaluations and checkpoints included, as nanoGPT's figure; the evaluations' and the
checkpoints' shares apart) and the machine's load average before and after plus the cores other
processes kept busy meanwhile. Each trained model then continues a prompt greedily
(`training.sample.greedy_sample`, its last checkpoint loaded first): `sample_s`, and with the wall
time `end_to_end_s`, the recipe whole (`torch_over_jax_end_to_end`).

The corpus is `jaxformer data shakespeare` (the `shakespeare` 0.6 package's plays and poems, split
by document), written into --data-dir if it is not there; it is not nanoGPT's `input.txt` (1.1 M
characters, 65 distinct, a random tenth of one file held out): 4.5 M training characters, 84
distinct, whole plays held out. Results: benchmarks/results/baby_gpt.json and baby_gpt.png.

  python benchmarks/baby_gpt.py                                  # the recipe, both frameworks
  python benchmarks/baby_gpt.py --steps 20 --eval-every 10 --eval-iters 2 --no-save  # smoke
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import harness

DEFAULT_DATA = Path("~/.cache/jaxformer/data/shakespeare")
NANOGPT_VAL_LOSS = 1.88  # nanoGPT README, baby GPT on a CPU, after 2000 iterations


def recipe(args):
    from jaxformer.training.config import TrainConfig

    return TrainConfig(steps=args.steps, batch_size=12, seq_len=64, gpt_windows="random",
                       learning_rate=1e-3, min_learning_rate=1e-4, schedule="cosine",
                       warmup_steps=min(100, args.steps), beta1=0.9, beta2=0.99,
                       weight_decay=0.1, clip_norm=1.0, seed=args.seed)


def corpus_files(data_dir: Path) -> tuple[Path, Path]:
    """``train.txt`` and ``val.txt`` of ``jaxformer data shakespeare``, prepared when missing."""
    from jaxformer.training import corpus

    train, val = data_dir / "train.txt", data_dir / "val.txt"
    if not (train.is_file() and val.is_file()):
        print(f"preparing the corpus in {data_dir} (jaxformer data shakespeare)", flush=True)
        corpus.prepare(corpus.download(corpus.DEFAULT_CACHE.expanduser()), data_dir)
    return train, val


def train_one(framework: str, config, args, train: Path, val: Path, runs: Path) -> dict:
    from jaxformer.training import loop

    options = loop.RunOptions(
        family="gpt", data=str(train), val_data=str(val), preset="baby", framework=framework,
        tokenizer="char", checkpoint_dir=str(runs / framework), eval_every=args.eval_every,
        eval_batches=args.eval_iters, progress="plain", log_every=args.log_every,
        checkpoint_every=args.eval_every)  # nanoGPT saves at its evaluations
    load_before = harness.loadavg()
    with harness.ForeignLoad() as foreign:
        began = time.perf_counter()
        result = loop.train(config, options)
        wall = time.perf_counter() - began
    records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    evals = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    return {"wall_s": wall, "loadavg_before": load_before, "loadavg_after": harness.loadavg(),
            "foreign_cores": foreign.cores, "final_val_loss": evals[-1][1],
            "val_loss": [{"step": s, "loss": v} for s, v in evals],
            "train_loss": [r["loss"] for r in records],
            "step_seconds_median": sorted(r["seconds"] for r in records)[len(records) // 2],
            "first_step_s": records[0]["seconds"],
            # where the wall time goes: the steps (the first one compiles in JAX), the rest
            # (data and model set-up, evaluations, checkpoints, metrics), that rest's parts
            "steps_s": sum(r["seconds"] for r in records),
            "outside_steps_s": wall - sum(r["seconds"] for r in records),
            "evaluations_s": result.times.evaluations, "checkpoints_s": result.times.checkpoints,
            "run_dir": str(result.run_dir)}


def greedy_text(framework: str, config, run_dir: Path, prompt: str, length: int) -> str:
    """The trained model of ``run_dir`` (its last checkpoint) continues ``prompt``."""
    from jaxformer.config import GPTConfig
    from jaxformer.training import loop, vocab

    identity = json.loads((run_dir / "run.json").read_text())["identity"]
    model_cfg = GPTConfig(**{k: v for k, v in identity["model_config"].items() if k != "class"})
    options = loop.RunOptions(family="gpt", data="", framework=framework)
    trainer, checkpointer_cls = loop.build_trainer("gpt", framework, model_cfg, config, options)
    checkpointer = checkpointer_cls(run_dir / "checkpoints")
    checkpointer.restore(trainer)
    checkpointer.close()
    if framework == "jax":
        from jaxformer.training.sample import greedy_sample
    else:
        from torch_ref.training.sample import greedy_sample
    tokenizer = vocab.load_tokenizer(run_dir / "tokenizer.json")
    ids = greedy_sample(trainer.sync(), vocab.encode_chars(tokenizer, prompt), length)
    return tokenizer.decode(ids.tolist())


def shown(text: str, max_blank: int = 2) -> str:
    """``text`` for the terminal: a run of more than ``max_blank`` blank lines becomes one line
    that counts them. A barely trained character model (``--steps 20``) predicts the most common
    character, a newline, 300 times: printed as is, that was 300 blank lines per framework. The
    JSON report keeps the sample whole."""
    return re.sub(r"\n{" + str(max_blank + 2) + ",}",
                  lambda m: f"\n[{len(m.group(0)) - 1} blank lines]\n", text)


def summary(framework: str, run: dict, prompt: str) -> str:
    """What is printed after a framework's run: the final validation loss, the wall time and
    load, then the prompt and its greedy continuation (:func:`shown`)."""
    return (f"== {framework}: final val loss {run['final_val_loss']:.4f}, wall "
            f"{run['wall_s']:.1f} s (evaluations {run['evaluations_s']:.1f} s, checkpoints "
            f"{run['checkpoints_s']:.1f} s), sample {run['sample_s']:.1f} s, load "
            f"{run['loadavg_before']} -> {run['loadavg_after']}, "
            f"other processes {run['foreign_cores']:.2f} cores\n"
            + shown(prompt + run["sample"]))


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxformer.training.reporting import save_figure

    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"jax": ("tab:blue", "o-"), "torch": ("tab:orange", "x--")}  # equal curves overlap
    for framework, run in report["runs"].items():
        color, style = styles[framework]
        steps = range(1, len(run["train_loss"]) + 1)
        ax.plot(steps, run["train_loss"], color=color, alpha=0.3, lw=0.8,
                label=f"{framework} train loss (per batch)")
        ax.plot([e["step"] for e in run["val_loss"]], [e["loss"] for e in run["val_loss"]], style,
                color=color, label=f"{framework} val loss (final {run['final_val_loss']:.3f}; "
                f"{run['wall_s']:.0f} s, load average {run['loadavg_before'][0]})")
    ax.axhline(NANOGPT_VAL_LOSS, color="gray", ls="--", lw=1,
               label=f"nanoGPT README: val {NANOGPT_VAL_LOSS} (its corpus)")
    ax.set_xlabel("update")
    ax.set_ylabel("cross-entropy (nats per character)")
    ax.set_ylim(top=min(4.5, ax.get_ylim()[1]))
    env = report["environment"]
    ax.set_title(f"baby GPT, character-level Shakespeare: {env['cpu']} ({env['cpu_count']} "
                 f"cores), {env['date_utc'][:10]}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> int:
    parser = harness.argument_parser(__doc__, repeats=1, warmup=0)
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA),
                        help=f"train.txt / val.txt of `jaxformer data shakespeare` (written there "
                             f"when missing; default {DEFAULT_DATA})")
    parser.add_argument("--steps", type=int, default=2000, help="updates (2000)")
    parser.add_argument("--eval-every", type=int, default=250, help="updates between evaluations")
    parser.add_argument("--eval-iters", type=int, default=20, help="validation batches (20)")
    parser.add_argument("--frameworks", default="jax,torch", help="comma-separated, in order")
    parser.add_argument("--prompt", default="\n", help="greedy sample prompt (a newline)")
    parser.add_argument("--sample-chars", type=int, default=300)
    parser.add_argument("--log-every", type=int, default=50, help="progress line period")
    parser.add_argument("--no-compilation-cache", dest="compilation_cache",
                        action="store_false",
                        help="compile from scratch (default: jaxformer.runtime's persistent "
                             "cache, as `jaxformer train` uses it; JAXFORMER_COMPILATION_CACHE)")
    parser.add_argument("--runs-dir", help="keep the run directories here (default: a temporary "
                                           "directory, removed)")
    args = parser.parse_args(argv)
    frameworks = args.frameworks.split(",")
    if not set(frameworks) <= {"jax", "torch"} or not frameworks:
        parser.error(f"--frameworks must name jax and/or torch, got {args.frameworks!r}")
    if args.device != "cpu" or args.dtype != "float32":
        parser.error("the recipe runs on the CPU in float32 (nanoGPT's CPU figure)")
    bench = harness.start(args, "baby_gpt", title="nanoGPT's baby GPT, char Shakespeare")
    from jaxformer import runtime

    # as `jaxformer train` does: a second run skips compiling
    cache = runtime.enable_compilation_cache() if args.compilation_cache else None
    cache_entries = len(list(cache.glob("*"))) if cache and cache.is_dir() else 0
    train, val = corpus_files(Path(args.data_dir).expanduser())
    config = recipe(args)
    report = {"benchmark": "baby_gpt", "command": bench.report["command"],
              "environment": bench.env, "train_config": config.to_dict(),
              "data": {"train": str(train), "val": str(val),
                       "train_characters": len(train.read_text()),
                       "val_characters": len(val.read_text())},
              "nanogpt_readme_val_loss": NANOGPT_VAL_LOSS, "prompt": args.prompt,
              "compilation_cache": {"directory": str(cache) if cache else None,
                                    "entries_before": cache_entries},
              "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(args.runs_dir) if args.runs_dir else Path(tmp)
        for framework in frameworks:
            print(f"== {framework}: {config.steps} updates", flush=True)
            run = train_one(framework, config, args, train, val, runs)
            began = time.perf_counter()
            run["sample"] = greedy_text(framework, config, Path(run["run_dir"]), args.prompt,
                                        args.sample_chars)
            run["sample_s"] = time.perf_counter() - began  # loading the last checkpoint too
            run["end_to_end_s"] = run["wall_s"] + run["sample_s"]
            report["runs"][framework] = run
            print(summary(framework, run, args.prompt), flush=True)
    if len(report["runs"]) == 2:
        jax_run, torch_run = report["runs"]["jax"], report["runs"]["torch"]
        report["comparison"] = {
            "val_loss_max_rel_diff": max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in
                                         zip(jax_run["val_loss"], torch_run["val_loss"])),
            "torch_over_jax_wall": torch_run["wall_s"] / jax_run["wall_s"],
            "torch_over_jax_end_to_end": torch_run["end_to_end_s"] / jax_run["end_to_end_s"],
            "samples_equal": jax_run["sample"] == torch_run["sample"]}
        print(json.dumps(report["comparison"]))
    if args.no_save:
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "baby_gpt" + (f"_{args.tag}" if args.tag else "")  # --tag: baby_gpt_<tag>.json
    tmp = out / f".{stem}.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, out / f"{stem}.json")
    plot(report, out / f"{stem}.png")
    print(f"wrote {out / (stem + '.json')} and {out / (stem + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
