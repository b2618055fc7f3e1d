#!/usr/bin/env python
"""The same train step in a process that compiled it and in one that loaded it from the cache.

Each round runs two child processes, in turn (the order reversed every other round), that build
the same GPT ``TrainStep`` (``--preset``, ``--batch`` x ``--seq``, seed 0) and time
``--steps`` updates on the same random batches: *compiled*, whose persistent compilation cache
is a new empty directory (XLA compiles the step in that process), and *loaded*, whose cache
holds the programs a compiled child wrote (the step is read back, nothing big is compiled). The
program is the same; the losses must be identical (the script says whether they are). Per
child: the median update (the first, which compiles or loads, left out), the first update, the
process's CPU time and minor page faults per update. ``--cpus N`` pins the children to the
first N cores of this process's affinity mask (XLA:CPU then runs that many threads).

Why: the whole baby-GPT recipe with an empty cache ran its updates 7-16% slower than the same
recipe again with the cache filled (docs/performance.md, "Whole recipe"); this separates the
updates' speed from the compile time.

    python benchmarks/bench_process.py                         # baby GPT 12 x 64, 6 rounds
    python benchmarks/bench_process.py --rounds 1 --steps 30 --no-save   # a quick look
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import learn_common

MODES = ("compiled", "loaded")


def child(args) -> None:
    """One timed run in this process; prints its result as one JSON line."""
    import resource
    import time

    import numpy as np

    from jaxformer import runtime  # first: its allocator settings, before JAX starts
    from jaxformer.training import step, tasks
    from jaxformer.training.config import TrainConfig

    cache = runtime.enable_compilation_cache()
    if cache != Path(os.environ["JAXFORMER_COMPILATION_CACHE"]):
        raise SystemExit(f"the child uses the compilation cache {cache}, not the one it was given")
    entries = len(list(cache.iterdir())) if cache.is_dir() else 0
    task = tasks.get("gpt")
    model_config = task.model_config(args.preset, vocab_size=args.vocab)
    config = TrainConfig(steps=args.steps + 1, batch_size=args.batch, seq_len=args.seq,
                         learning_rate=1e-3)
    trainer = step.TrainStep("gpt", step.build_model("gpt", model_config, 0), config)
    rng = np.random.default_rng(0)
    batches = [{"input_ids": rng.integers(0, args.vocab, (1, args.batch, args.seq),
                                          dtype=np.int32)} for _ in range(args.steps + 1)]
    seconds, losses = [], []
    for i, batch in enumerate(batches):
        if i == 1:
            before = resource.getrusage(resource.RUSAGE_SELF)
        began = time.perf_counter()
        losses.append(trainer(batch)["loss"])
        seconds.append(time.perf_counter() - began)
    after = resource.getrusage(resource.RUSAGE_SELF)
    n = args.steps
    print(json.dumps({
        "first_update_s": seconds[0], "seconds": seconds[1:],
        "median_ms": 1e3 * statistics.median(seconds[1:]),
        "cpu_ms_per_update": 1e3 * (after.ru_utime + after.ru_stime - before.ru_utime
                                    - before.ru_stime) / n,
        "minor_faults_per_update": (after.ru_minflt - before.ru_minflt) / n,
        "cache_entries_written": len(list(cache.iterdir())) - entries,
        "losses": losses}))


def run_child(args, mode: str, cache: Path, cpus: list[int] | None) -> dict:
    env = {key: value for key, value in os.environ.items()
           if key != "JAX_COMPILATION_CACHE_DIR"}  # a user's own cache would be shared
    env["JAXFORMER_COMPILATION_CACHE"] = str(cache)
    command = [sys.executable, __file__, "--child", "--preset", args.preset, "--batch",
               str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps), "--vocab",
               str(args.vocab)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False,
                          preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    if done.returncode:
        raise RuntimeError(f"the {mode} child failed:\n{done.stderr[-3000:]}")
    return {"mode": mode, **json.loads(done.stdout.strip().splitlines()[-1])}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="baby")
    p.add_argument("--vocab", type=int, default=84, help="vocabulary size (the recipe's 84)")
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=200, help="timed updates per child")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--cpus", type=int, default=None, help="pin the children to this many cores")
    p.add_argument("--out", default=str(learn_common.RESULTS))
    p.add_argument("--tag", default="")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.steps < 3 or args.rounds < 1:
        p.error("--steps must be at least 3 and --rounds at least 1")
    cpus = None
    if args.cpus is not None:
        mask = sorted(os.sched_getaffinity(0))
        if not 1 <= args.cpus <= len(mask):
            p.error(f"--cpus must be between 1 and {len(mask)} (this process's cores)")
        cpus = mask[:args.cpus]
    record = learn_common.Run(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_process-"))
    # One cache path for every child: a program's cache key includes the cache directory's
    # path (JAX hashes the compile options, which name it), so a copy elsewhere is never hit.
    cache, kept, runs = work / "cache", work / "kept", []
    try:
        for r in range(args.rounds):  # round 1 compiles first: its cache is the loaded ones'
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                if mode == "compiled" and cache.exists():  # the filled cache set aside
                    cache.rename(kept)
                    run = run_child(args, mode, cache, cpus)
                    shutil.rmtree(cache)
                    kept.rename(cache)
                else:
                    run = run_child(args, mode, cache, cpus)
                runs.append({"round": r, **run})
                print(f"round {r + 1}/{args.rounds} {mode:8s}: median {run['median_ms']:.2f} ms,"
                      f" first update {run['first_update_s']:.2f} s, "
                      f"{run['cpu_ms_per_update']:.1f} ms CPU and "
                      f"{run['minor_faults_per_update']:.0f} page faults per update", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {**record.finish(), **summary(args, runs)}
    print(f"compiled / loaded per round: {', '.join(f'{x:.3f}' for x in result['ratios'])}; "
          f"median {result['median_ratio']:.3f} (above 1: the compiling process is slower); "
          f"losses identical: {result['same_losses']}; the compiled children filled the cache "
          f"and the loaded ones compiled nothing: {result['cache_as_intended']}")
    if not args.no_save:
        stem = Path(args.out) / (f"process_cpu_gpt-{args.preset}_{args.batch}x"
                                 f"{args.seq}_{datetime.date.today()}"
                                 f"{'_' + args.tag if args.tag else ''}")
        learn_common.write_json(stem.with_suffix(".json"), result)
        plot(args, result, stem.with_suffix(".png"))
        print(f"wrote {stem}.json, {stem}.png")
    return 0


def summary(args, runs: list[dict]) -> dict:
    by_round = {(run["round"], run["mode"]): run for run in runs}
    ratios = [by_round[r, "compiled"]["median_ms"] / by_round[r, "loaded"]["median_ms"]
              for r in range(args.rounds)]
    return {"benchmark": "bench_process", "args": vars(args),
            "median_ms": {mode: statistics.median(run["median_ms"] for run in runs
                                                  if run["mode"] == mode) for mode in MODES},
            "ratios": ratios, "median_ratio": statistics.median(ratios),
            "rounds_compiled_slower": sum(x > 1 for x in ratios),
            "same_losses": all(run["losses"] == runs[0]["losses"] for run in runs),
            # the premise: every compiled child wrote its programs, no loaded one compiled any
            "cache_as_intended": all(
                (run["cache_entries_written"] > 0) == (run["mode"] == "compiled")
                for run in runs),
            "runs": [{k: v for k, v in run.items() if k != "losses"} for run in runs]}


def plot(args, result: dict, path: Path) -> None:
    plt = learn_common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    rounds = range(1, args.rounds + 1)
    for mode, color in zip(MODES, ("tab:red", "tab:blue"), strict=True):
        ax.plot(rounds, [run["median_ms"] for run in result["runs"] if run["mode"] == mode],
                "o-", color=color, label=f"{mode} in the process")
    ax.set(xlabel="round", ylabel="median ms per update",
           title=f"GPT {args.preset} {args.batch}x{args.seq}: compiled / loaded "
                 f"{result['median_ratio']:.3f} (median of {args.rounds} rounds)")
    ax.legend()
    fig.tight_layout()
    learn_common.save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
