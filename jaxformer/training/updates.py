"""The updates of a ``jaxformer train`` run; ``loop.train`` prepares everything around them and
handles their end. Each update is dispatched, then its metrics are read, checked for
divergence, written as a metrics line with the evaluation due after it, reported, and followed by
the checkpoint due after it; every process stops after the same update when a signal comes. On
an accelerator an update whose state nothing reads is left running while the next one is
dispatched (docs/training.md, "Dispatching ahead"). Shared glue, no twin: the step is either
framework's ``TrainStep``.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable

from jaxformer.training import data, reporting, tasks
from jaxformer.training.config import TrainConfig
from jaxformer.training.options import RunOptions


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm stopped being finite; the last good checkpoint is kept."""


def data_tokens(dataset: data.Dataset, config: TrainConfig) -> int:
    """Token positions of one update: examples times tokens per example (padding included)."""
    return config.batch_size * dataset.tokens_per_example


class Updates:
    """Updates ``start`` to ``config.steps`` of ``trainer`` on ``train_set`` (:meth:`run`),
    evaluated on ``eval_set``'s batches every ``options.eval_every`` updates and at the last.
    ``save()`` (the caller's checkpoint of the trainer's state into ``checkpointer``) runs after
    every ``options.checkpoint_every``-th update; ``signals`` (``interrupts.Signals``) says
    whether to stop. ``losses`` collects the losses; ``bar`` is the progress bar (tqdm) once the
    first update is done, for the caller to close; ``status`` shows the first update's
    compilation, and the plain progress lines go to ``stream`` (``progress``:
    ``RunOptions.progress``)."""

    def __init__(self, trainer, config: TrainConfig, options: RunOptions, train_set, eval_set,
                 start: int, *, save: Callable[[], None], checkpointer, signals, status, stream,
                 progress: str):
        from jaxformer.sharding import distributed  # several processes (nothing with one)

        self.trainer, self.config, self.options, self.start = trainer, config, options, start
        self._train_set, self._save, self._checkpointer = train_set, save, checkpointer
        self._signals = signals
        self._status, self._stream, self._progress = status, stream, progress
        self._any_process = distributed.any_process
        self._rows = distributed.batch_rows(trainer, config.micro_batch_size)  # this process's
        self._eval_sets = (eval_set.eval_batches(options.eval_batches, distributed.batch_rows(
            trainer, eval_set.eval_batch_size())) if eval_set is not None else [])
        self._eval_key = "val_loss" if options.val_data else "eval_loss"  # the file's, or not
        self._task = tasks.get(options.family)
        self._step_flops = self._task.step_flops(trainer.model_config, config)
        self._ahead = (trainer.dispatch_ahead if options.dispatch_ahead is None
                       else options.dispatch_ahead)
        self.losses: list[float] = []
        self.update_seconds: list[float] = []  # each update's ``seconds`` (its metrics line's)
        self.eval_seconds = 0.0  # the evaluations' wall time
        self.bar = None
        self._clock = time.perf_counter()  # when the previous update's bookkeeping ended

    def run(self, metrics_file) -> str | None:
        """Every update, each one's metrics line appended to ``metrics_file``; the name of the
        signal that stopped the run before its last update, or None. With ``ahead`` (an
        accelerator: ``TrainStep.dispatch_ahead``), an update whose state nothing reads is left
        running while the next one is dispatched, and its metrics are read after that: the
        device never waits for the host between updates. The metrics, checkpoints and losses
        are the same either way (test_dispatch_ahead.py)."""
        trainer, steps = self.trainer, self.config.steps
        self._metrics_file = metrics_file
        pending = None  # (step, metrics on the device) of an update dispatched ahead
        for step in range(self.start, steps):
            batch = self._train_set.update_batch(step, self._rows)
            if step == self.start:  # the first update of a process compiles the step
                framework = self.options.framework
                with (self._status.phase("compile", _compile_phase(framework)) as phase,
                      _cache_lookups(framework) as lookups):
                    metrics = trainer.dispatch(batch)
                    trainer.fetch(metrics)  # compiled (or loaded) and run
                    if lookups["hits"] and not lookups["misses"]:
                        phase.note = "loaded from the compilation cache"
                self.bar = self._progress_bar()
            else:
                metrics = trainer.dispatch(batch)
            stopping = False
            if pending is not None:  # the previous update, read now that this one runs
                self._finish(*pending)
                stopping = self._stop_requested(pending[0])  # this one then finishes too
                pending = None
            if self._ahead and not self._settles(step) and not stopping:
                pending = (step, metrics)
                continue
            self._finish(step, metrics)
            if stopping or self._stop_requested(step):
                if step + 1 < steps:
                    return self._signals.received or "a signal to another process"
                break
        return None

    def _progress_bar(self):  # after the compile phase's line, so that the two do not mix
        progress = self._progress
        if not (progress == "bar" or (progress == "auto" and sys.stderr.isatty())):
            return None
        from tqdm import tqdm

        return tqdm(total=self.config.steps, initial=self.start, unit="step",
                    desc=f"{self.options.family} ({self.options.framework})")

    def _due(self, step: int, every: int) -> bool:
        return bool(every) and (step + 1) % every == 0

    def _settles(self, step: int) -> bool:
        """Whether the loop reads the state ``step`` leaves (an evaluation, a save, the end)
        before the next update may be dispatched."""
        return (step == self.start or step + 1 == self.config.steps
                or self._due(step, self.options.eval_every if self._eval_sets else 0)
                or self._due(step, self.options.checkpoint_every))

    def _stop_requested(self, step: int) -> bool:
        """After ``step`` (not the last): every process stops after the same step (a signal may
        reach only one of them)."""
        return (step + 1 < self.config.steps
                and self._any_process(self._signals.received is not None))

    def _finish(self, step: int, metrics: dict) -> None:
        """Update ``step``'s bookkeeping: its metrics read (waiting for the update), the
        divergence check, its metrics line, its evaluation and its checkpoint when due (the
        state is then this update's: ``_settles``), its progress line. Its ``seconds`` run from
        the end of the previous update's bookkeeping to its metrics being read: the batch's
        preparation counts, evaluations and saves do not."""
        trainer, options = self.trainer, self.options
        result = trainer.fetch(metrics)
        seconds = time.perf_counter() - self._clock
        for name in ("loss", "grad_norm"):
            if not math.isfinite(result[name]):
                raise TrainingDiverged(
                    f"step {step + 1}: the {name.replace('_', ' ')} is {result[name]}; "
                    f"training stopped. The last good checkpoint is step "
                    f"{self._checkpointer.latest_step()} in {self._checkpointer.directory}")
        record = {"step": step + 1, "loss": result["loss"],
                  "learning_rate": result["learning_rate"],
                  "grad_norm": result["grad_norm"], "seconds": seconds,
                  "tokens_per_s": data_tokens(self._train_set, self.config) / seconds}
        if self._step_flops is not None:
            record["model_tflops_per_s"] = self._step_flops / seconds / 1e12
            if options.peak_tflops:
                record["mfu"] = record["model_tflops_per_s"] / options.peak_tflops
        last = step + 1 == self.config.steps
        if self._eval_sets and (self._due(step, options.eval_every) or last):
            began, evals = time.perf_counter(), self._eval_sets
            record[self._eval_key] = sum(map(trainer.evaluate, evals)) / len(evals)
            if self._task.accuracy:  # equal batches: the mean of their means
                record[self._eval_key.replace("loss", "accuracy")] = sum(
                    map(trainer.accuracy, evals)) / len(evals)
            self.eval_seconds += time.perf_counter() - began
        self._metrics_file.write(json.dumps(record) + "\n")
        self._metrics_file.flush()
        self.losses.append(result["loss"])
        self.update_seconds.append(seconds)
        reporting.report(record, self.config.steps, self.bar, self._progress, options.log_every,
                         self._stream, last)
        if self._due(step, options.checkpoint_every):
            self._save()
        self._clock = time.perf_counter()


def _cache_lookups(framework: str):
    """A context counting the compilation cache's hits and misses (torch: none)."""
    if framework != "jax":
        return contextlib.nullcontext({"hits": 0, "misses": 0})
    from jaxformer import runtime

    return runtime.cache_lookups()


def _compile_phase(framework: str) -> str:
    if framework == "jax":
        return "the first update (XLA compiles the train step)"
    return "the first update (eager torch: no compilation, unless --compile)"
