"""What the learning checks (``learn_*.py``) share: the common flags, a driver of
``jaxformer.training.step.TrainStep`` that shows progress and evaluates on the way, the record of
the run (command, machine, date, load) and the atomic JSON + PNG writers.

These scripts answer "does it learn?", not "how fast?": they report accuracies on held-out data,
so the machine's load changes how long they take, never what they find (every draw is seeded).
The load is recorded anyway (load averages, the cores other processes kept busy), with the wall
time, so that a reader can tell a slow run from a slow machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import harness

RESULTS = harness.REPO / "benchmarks" / "results"


def argument_parser(doc: str, *, steps: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[-1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=steps,
                   help=f"optimizer updates of each training run ({steps}; 5 is a smoke test)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS), help="directory for the JSON and PNG")
    p.add_argument("--no-save", action="store_true", help="print only, write nothing")
    p.add_argument("--log-every", type=int, default=50, help="progress line every N steps")
    return p


class Run:
    """The record of one script run: ``Run(argv)`` at the start, ``finish()`` at the end."""

    def __init__(self, argv):
        self.command = " ".join(["python", *map(shlex.quote, [sys.argv[0], *argv])])
        self.started = time.perf_counter()
        self._load = harness.ForeignLoad().__enter__()
        self.loadavg_start = harness.loadavg()

    def finish(self) -> dict:
        import flax
        import jax
        import numpy as np

        self._load.__exit__(None, None, None)
        return {"command": self.command,
                "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "wall_s": round(time.perf_counter() - self.started, 1),
                "machine": {"host": platform.node(), "cpu": harness.cpu_description()[0],
                            "cpu_count": os.cpu_count(), "jax_device": str(jax.devices()[0]),
                            "python": platform.python_version()},
                "versions": {"jax": jax.__version__, "flax": flax.__version__,
                             "numpy": np.__version__},
                "load": {"loadavg_start": self.loadavg_start, "loadavg_end": harness.loadavg(),
                         "other_processes_cores": None if self._load.cores is None
                         else round(self._load.cores, 2)}}


def train(trainer, batch_fn, steps: int, *, evaluate=None, eval_every: int = 0,
          name: str = "", log_every: int = 50) -> dict:
    """``steps`` updates of ``trainer`` (a ``TrainStep``, either framework) on ``batch_fn(step)``;
    ``evaluate()`` (a dict of metrics) before the first step, every ``eval_every`` steps and at
    the end. Returns ``{"loss": [...], "evals": [{"step": s, **metrics}, ...], "seconds": t}``."""
    history = {"loss": [], "evals": []}
    began = time.perf_counter()

    def record_eval(step):
        metrics = {"step": step, **evaluate()}
        history["evals"].append(metrics)
        shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "step")
        print(f"  [{name}] eval at step {step}: {shown}", flush=True)

    if evaluate is not None:
        record_eval(0)
    for step in range(steps):
        result = trainer(batch_fn(step))
        history["loss"].append(result["loss"])
        done = step + 1
        if done % log_every == 0 or done == steps or done == 1:
            elapsed = time.perf_counter() - began
            print(f"  [{name}] step {done}/{steps}  loss {result['loss']:.4f}  "
                  f"{elapsed:.0f}s", flush=True)
        if (evaluate is not None and ((eval_every and done % eval_every == 0) or done == steps)
                and (not history["evals"] or history["evals"][-1]["step"] != done)):
            record_eval(done)
    history["seconds"] = round(time.perf_counter() - began, 1)
    return history


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def save_figure(fig, path: Path) -> None:
    from jaxformer.training.reporting import save_figure

    save_figure(fig, path)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
