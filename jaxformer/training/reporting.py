"""What ``jaxformer train`` reports while it runs (shared glue, no twin): the metrics file, the
progress lines or bar, and the loss plot.

Each update appends one JSON line to ``metrics.jsonl`` (step, loss, learning rate, gradient norm,
time, tokens/s, model TFLOP/s and MFU, and at evaluations ``eval_loss`` or ``val_loss``, and for
the classifier ``eval_accuracy`` or ``val_accuracy``); the loop
in ``training/loop.py`` builds the records, this module writes, prints and draws them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# evaluation keys of a metrics line: on the held-out tenth of the data file, or on --val-data
EVAL_KEYS = ("eval_loss", "val_loss")
ACCURACY_KEYS = ("eval_accuracy", "val_accuracy")  # the same, for a task with an accuracy


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics file (none when it does not exist). A last line without its
    newline (a write cut short by a kill) is dropped; any other line that is not a JSON record
    with a ``step`` is a :class:`~jaxformer.training.rundir.DamagedFile` naming the line."""
    from jaxformer.training.rundir import DamagedFile

    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DamagedFile(path, f"line {number} is not valid JSON ({error})") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise DamagedFile(path, f"line {number} is not a metrics record with a step")
        records.append(record)
    return records


def report(record: dict, total: int, bar, progress: str, log_every: int, stream,
           last: bool) -> None:
    """One update on the progress ``bar`` (tqdm) or, with ``progress`` not ``none``, a plain line
    on ``stream`` every ``log_every`` updates, at the first and last, and at every evaluation."""
    if bar is not None:
        postfix = {"loss": f"{record['loss']:.4f}", "lr": f"{record['learning_rate']:.2e}"}
        for key in EVAL_KEYS:
            if key in record:
                postfix[key.removesuffix("_loss")] = f"{record[key]:.4f}"
        bar.set_postfix(postfix, refresh=False)
        bar.update(1)
    elif progress != "none" and (record["step"] % log_every == 0 or last
                                 or record["step"] == 1
                                 or any(key in record for key in EVAL_KEYS)):
        line = (f"step {record['step']}/{total}  loss {record['loss']:.6f}  "
                f"lr {record['learning_rate']:.3e}  grad_norm {record['grad_norm']:.4f}  "
                f"tokens/s {record['tokens_per_s']:.0f}")
        for key in (*EVAL_KEYS, *ACCURACY_KEYS):
            if key in record:
                line += f"  {key} {record[key]:.6f}"
        print(line, file=stream, flush=True)


@dataclass(frozen=True)
class RunTimes:
    """Where a run's wall time went, in seconds: ``total`` (the whole of ``loop.train``), the
    ``updates`` (their metrics lines' ``seconds``: each batch's preparation and the update, the
    first one's compilation included, which is also ``first_update``), the ``evaluations`` and
    the ``checkpoints`` (every save, the last one included); :attr:`rest` is everything else:
    reading the data, building the model and its step, restoring a checkpoint, an export, the
    loss plot. ``jaxformer train`` prints :meth:`line` last."""

    total: float
    updates: float
    first_update: float
    evaluations: float
    checkpoints: float

    @property
    def rest(self) -> float:
        return self.total - self.updates - self.evaluations - self.checkpoints

    def line(self) -> str:
        first = f" (the first {self.first_update:.1f} s)" if self.updates else ""
        return (f"{self.total:.1f} s: updates {self.updates:.1f} s{first}, evaluations "
                f"{self.evaluations:.1f} s, checkpoints {self.checkpoints:.1f} s, the rest "
                f"{self.rest:.1f} s")


def plot_losses(records: list[dict], path: Path, title: str) -> None:
    """The loss curve (and the learning rate below it) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    top.plot(steps, [r["loss"] for r in records], label="train loss")
    for key in EVAL_KEYS:
        evals = [(r["step"], r[key]) for r in records if key in r]
        if evals:
            top.plot(*zip(*evals), "o-", label=key.replace("_", " "))
    top.set_ylabel("loss")
    top.set_title(title)
    top.legend()
    top.grid(alpha=0.3)
    bottom.plot(steps, [r["learning_rate"] for r in records], color="tab:green")
    bottom.set_ylabel("learning rate")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    save_figure(fig, path)


def save_figure(fig, path: Path) -> None:
    """A matplotlib figure as a PNG, atomically (a temporary file renamed into place), closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.png")
    try:
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, path)
    finally:  # an exception (an interrupt included) leaves no temporary file behind
        plt.close(fig)
        tmp.unlink(missing_ok=True)
