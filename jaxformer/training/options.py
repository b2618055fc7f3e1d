"""What a ``jaxformer train`` run is told besides its hyper-parameters (:class:`RunOptions`,
checked before anything starts) and what it hands back (:class:`RunResult`). Re-exported by
``training.loop``, which runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from jaxformer import frameworks
from jaxformer.training import tasks
from jaxformer.training.reporting import RunTimes

FRAMEWORKS = frameworks.FRAMEWORKS
PROGRESS = ("auto", "bar", "plain", "none")


CHECKPOINT_EVERY = 100  # the default --checkpoint-every: a crash costs at most 100 updates


@dataclass
class RunOptions:
    """Everything about a run that is not a hyper-parameter (see ``jaxformer train --help``)."""

    family: str
    data: str
    preset: str | None = None  # None: "tiny", or with init_from the checkpoint's architecture
    init_from: str | None = None  # a run or Hugging Face directory to start from (training.init)
    framework: str = "jax"
    tokenizer: str | None = None
    vocab_size: int | None = None
    dropout: float | None = None
    dtype: str | None = None  # compute dtype (default: the preset's, float32)
    param_dtype: str | None = None  # parameter storage dtype (default: the preset's)
    scan_layers: bool | None = None  # scanned layer stacks (default: the preset's, unrolled)
    remat: str | None = None  # rematerialisation policy of each block (default: none)
    checkpoint_dir: str | None = None
    checkpoint_every: int = CHECKPOINT_EVERY
    keep: int = 3
    resume: bool = False
    resume_strict: bool = False  # a damaged latest checkpoint is an error, not a fallback
    metrics: str | None = None
    plot: str | None = None
    eval_every: int = 0
    eval_batches: int = 4
    val_data: str | None = None  # a validation text file instead of the held-out tenth
    progress: str = "auto"
    log_every: int = 10
    peak_tflops: float | None = None
    compile: bool = False
    export_hf: str | None = None
    overwrite: bool = False  # --export-hf may replace a previous export (never anything else)
    mesh: str | None = None  # "data=2,fsdp=2,tensor=2": train sharded (jaxformer.sharding)
    # dispatch each update before reading the previous one's metrics (None: the train step
    # decides, TrainStep.dispatch_ahead: on an accelerator); the results are the same either way
    dispatch_ahead: bool | None = None
    stream: TextIO | None = field(default=None, repr=False)  # plain progress lines (default stdout)
    # False when the warm-up was derived from --steps rather than given: on --resume the run's
    # own warm-up is kept (extending a run does not move it)
    warmup_given: bool = True

    @property
    def preset_label(self) -> str:
        """The preset's name, or ``finetune`` for a run whose architecture is its checkpoint's
        (the default run directory is ``runs/FAMILY-LABEL``)."""
        return self.preset or ("finetune" if self.init_from else "tiny")

    def check(self) -> None:
        rules = [(self.framework in FRAMEWORKS, "framework", f"one of {FRAMEWORKS}"),
                 (self.progress in PROGRESS, "progress", f"one of {PROGRESS}"),
                 (self.checkpoint_every >= 0, "checkpoint_every", "0 (only at the end) or more"),
                 (self.keep >= 1, "keep", "at least 1"),
                 (self.resume or not self.resume_strict, "resume_strict",
                  "given only with resume"),
                 (self.eval_every >= 0, "eval_every", "0 (never) or more"),
                 (self.eval_batches >= 1, "eval_batches", "at least 1"),
                 (self.val_data is None or self.eval_every > 0, "val_data",
                  "given only with eval_every > 0 (it is read by the evaluations)"),
                 (self.log_every >= 1, "log_every", "at least 1"),
                 (self.vocab_size is None or self.vocab_size >= 8, "vocab_size", "at least 8"),
                 (self.peak_tflops is None or self.peak_tflops > 0, "peak_tflops", "positive"),
                 (self.export_hf is None or _hf_export(self.family), "export_hf",
                  f"only given for {sorted(n for n, t in tasks.TASKS.items() if t.hf_export)} "
                  f"(Hugging Face has no {self.family} model jaxformer exports)"),
                 (self.mesh is None or self.framework == "jax", "mesh",
                  "given only with framework jax (the torch twin runs on one device)")]
        for ok, name, rule in rules:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")


@dataclass
class RunResult:
    run_dir: Path
    metrics_path: Path
    plot_path: Path
    start_step: int
    final_step: int
    losses: list[float]  # of this session's steps
    times: RunTimes  # where this session's wall time went
    model: Any = None  # the trained model in eval mode (NNX, or torch_ref with --framework torch)


def _hf_export(family: str) -> bool:
    return family in tasks.TASKS and tasks.TASKS[family].hf_export
