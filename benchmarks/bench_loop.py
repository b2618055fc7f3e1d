#!/usr/bin/env python
"""``jaxformer train``'s own loop, with and without dispatching ahead (``docs/training.md``).

``bench_train.py`` times the train step; this times the loop users run (``training.loop.train``:
the batch's preparation, the update, the metrics line and the progress report): ``--rounds``
rounds, each a run of ``--steps`` updates with ``RunOptions.dispatch_ahead`` False and one with
it True, the order reversed every other round; each run's per-update ``seconds`` from its
``metrics.jsonl`` (the first update, which compiles, left out), the median over the rounds'
updates per mode, and the ratio. The runs' losses are compared: identical on a CPU, and on a GPU
with ``XLA_FLAGS=--xla_gpu_deterministic_ops=true`` (without it XLA's atomics differ run to run
in the last bits). The JSON is written again after every run (a benchmark cut short keeps the
runs it finished), the PNG at the end. On a CPU the loop's default is not to dispatch ahead; on
a GPU it is. The corpus is random words written by the script (nothing downloaded); no
checkpoints but the run's last, no evaluations.

    python benchmarks/bench_loop.py --preset gpt2 --dtype bfloat16 --batch 16 --seq 1024
    python benchmarks/bench_loop.py --steps 20 --rounds 1 --no-save    # a quick look (tiny)
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import learn_common
import numpy as np


def corpus(path: Path, lines: int, seed: int = 0) -> str:
    rng = np.random.RandomState(seed)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.randint(2, 9)))
             for _ in range(400)]
    path.write_text("\n".join(" ".join(rng.choice(words, rng.randint(8, 20)))
                              for _ in range(lines)) + "\n")
    return str(path)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="gpt")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--dtype", default=None, help="compute dtype (default: the preset's)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(learn_common.RESULTS))
    p.add_argument("--tag", default="")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    if args.steps < 3 or args.rounds < 1:
        p.error("--steps must be at least 3 and --rounds at least 1")
    record = learn_common.Run(argv)

    import jax

    from jaxformer.training import loop
    from jaxformer.training.config import TrainConfig

    work = Path(tempfile.mkdtemp(prefix="bench_loop-"))
    try:
        data = corpus(work / "corpus.txt", lines=max(2000, args.batch * args.seq // 4))
        runs = []
        for r in range(args.rounds):
            for ahead in ((False, True) if r % 2 == 0 else (True, False)):
                run_dir = work / f"round{r}-{'ahead' if ahead else 'plain'}"
                options = loop.RunOptions(family=args.family, data=data, preset=args.preset,
                                          dtype=args.dtype, checkpoint_dir=str(run_dir),
                                          checkpoint_every=0, progress="none",
                                          dispatch_ahead=ahead)
                loop.train(TrainConfig(steps=args.steps, batch_size=args.batch, seq_len=args.seq),
                           options)
                records = [json.loads(line) for line in
                           (run_dir / "metrics.jsonl").read_text().splitlines()]
                times = [rec["seconds"] for rec in records[1:]]  # the first update compiles
                runs.append({"round": r, "dispatch_ahead": ahead, "seconds": times,
                             "losses": [rec["loss"] for rec in records]})
                print(f"round {r + 1}/{args.rounds} dispatch_ahead={ahead}: median "
                      f"{1e3 * statistics.median(times):.2f} ms per update", flush=True)
                result = {**record.finish(), "device": jax.devices()[0].device_kind,
                          **summary(args, runs)}
                if not args.no_save:  # after every run: a run cut short keeps the finished ones
                    stem = Path(args.out) / (
                        f"loop_{jax.devices()[0].platform}_{args.family}-{args.preset}_"
                        f"{datetime.date.today()}{'_' + args.tag if args.tag else ''}")
                    learn_common.write_json(stem.with_suffix(".json"), result)
    finally:  # the corpus and the runs' directories: only the JSON and the plot are kept
        shutil.rmtree(work, ignore_errors=True)
    median = result["median_ms"]
    print(f"{result['device']}: {median['plain']:.2f} ms plain, {median['ahead']:.2f} ms "
          f"dispatching ahead per update (medians over {args.rounds} rounds): "
          f"{result['ratio_ahead_over_plain']:.3f}x; losses identical: {result['same_losses']}")
    if not args.no_save:
        plot(args, result, stem.with_suffix(".png"))
        print(f"wrote {stem}.json, {stem}.png")
    return 0


def summary(args, runs: list[dict]) -> dict:
    """The result so far: per mode the median of its runs' per-update seconds, and the ratio
    once both modes have run."""
    median = {}
    for mode, ahead in (("plain", False), ("ahead", True)):
        times = [t for run in runs if run["dispatch_ahead"] == ahead for t in run["seconds"]]
        median[mode] = 1e3 * statistics.median(times) if times else None
    return {"benchmark": "bench_loop", "args": vars(args),
            "tokens_per_update": args.batch * args.seq, "median_ms": median,
            "ratio_ahead_over_plain": (median["plain"] / median["ahead"]
                                       if None not in median.values() else None),
            "same_losses": all(a["losses"] == b["losses"] for a in runs for b in runs),
            "runs": runs}


def plot(args, result: dict, path: Path) -> None:
    plt = learn_common.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    labelled = set()
    for run in result["runs"]:
        mode = "dispatching ahead" if run["dispatch_ahead"] else "plain"
        ax.plot(range(2, len(run["seconds"]) + 2), [1e3 * s for s in run["seconds"]],
                color="tab:orange" if run["dispatch_ahead"] else "tab:blue", alpha=0.7,
                label=None if mode in labelled else mode)
        labelled.add(mode)
    ax.set(xlabel="update", ylabel="ms per update (metrics.jsonl)",
           title=f"jaxformer train {args.family} {args.preset} {args.batch}x{args.seq} on "
                 f"{result['device']}: {result['ratio_ahead_over_plain']:.3f}x")
    ax.legend()
    fig.tight_layout()
    learn_common.save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
