"""Twin of ``jaxformer/training/checkpoint.py``: the same interface and guarantees for the torch
step, with ``torch.save``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch

from jaxformer.training.rundir import CheckpointDamaged, read_json

_STEP_DIR = re.compile(r"^step_(\d+)$")


def _write(path: Path, payload: bytes) -> None:
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


class Checkpointer:
    """A checkpoint is ``DIR/step_<n>/`` holding ``state.pt`` (model, optimizer, torch RNG state,
    step) and ``meta.json``. Both are written and flushed to disk in a hidden temporary directory
    that is renamed into place when complete (a rename is atomic), so a kill at any moment leaves
    the previous checkpoints intact; unfinished temporary directories are never read and are
    removed by the next ``Checkpointer`` on the directory (and by :meth:`close`). The last
    ``keep`` checkpoints are kept.

    Only a ``step_<n>`` directory is a checkpoint, and it is validated when it is restored: a
    missing file, a ``meta.json`` that is not a JSON object, a ``state.pt`` that ``torch.load``
    cannot read (truncated, corrupt) or whose tensors do not fit the trainer (wrong shapes) is a
    :class:`~jaxformer.training.rundir.CheckpointDamaged` naming the file and the problem;
    ``set_aside(step)`` moves such a checkpoint into ``DIR-damaged/``.
    """

    def __init__(self, directory, keep: int = 3, read_only: bool = False):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory).absolute()
        self._keep = keep
        self.read_only = read_only  # loading (jaxformer.loading): nothing created or removed
        if not read_only:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.remove_unfinished()

    def remove_unfinished(self) -> None:
        """Delete the temporary directories of saves that never completed (a kill, an abort);
        never with ``read_only`` (the run may be saving one right now)."""
        if self.read_only:
            return
        for stale in self.directory.glob(".tmp-step_*"):
            shutil.rmtree(stale, ignore_errors=True)

    def path(self, step: int) -> Path:
        return self.directory / f"step_{step}"

    def meta_path(self, step: int) -> Path:
        return self.path(step) / "meta.json"

    def steps(self) -> list[int]:
        """Every ``step_<n>`` directory (complete or not: :meth:`restore` tells)."""
        if not self.directory.is_dir():
            return []
        return sorted(int(m.group(1)) for m in map(_STEP_DIR.match, (
            p.name for p in self.directory.iterdir() if p.is_dir())) if m)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, trainer, meta: dict) -> None:
        step = trainer.step
        tmp = self.directory / f".tmp-step_{step}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        state_path = tmp / "state.pt"
        torch.save(trainer.state_dict(), state_path)
        with open(state_path, "rb+") as f:
            os.fsync(f.fileno())
        _write(tmp / "meta.json", json.dumps(meta).encode())
        final = self.directory / f"step_{step}"
        if final.exists():  # the same step saved again: move the old one aside first
            old = self.directory / f".tmp-step_{step}-old"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        for old_step in self.steps()[: -self._keep]:
            shutil.rmtree(self.directory / f"step_{old_step}", ignore_errors=True)

    def _step(self, step: int | None) -> int:
        steps = self.steps()
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if step is None:
            return steps[-1]
        if step not in steps:
            raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory} "
                                    f"(it holds {steps})")
        return step

    def read_meta(self, step: int | None = None) -> dict:
        step = self._step(step)
        try:
            return read_json(self.meta_path(step), "the checkpoint's meta (a JSON object)")
        except CheckpointDamaged:
            raise
        except ValueError as error:  # DamagedFile: the same message, with the step
            raise CheckpointDamaged(step, error.path, error.problem) from None

    def restore(self, trainer, step: int | None = None) -> dict:
        step = self._step(step)
        meta = self.read_meta(step)
        path = self.path(step) / "state.pt"
        if not path.is_file():
            raise CheckpointDamaged(step, path, "missing")
        try:
            state = torch.load(path, weights_only=False)
        except Exception as error:  # truncated or corrupt: torch raises several kinds
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise CheckpointDamaged(step, path, f"cannot be read ({type(error).__name__}: "
                                    f"{first[:200]})") from None
        try:
            trainer.load_state_dict(state)
        except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as error:
            lines = [x.strip() for x in str(error).strip().splitlines() if x.strip()]
            detail = "; ".join(lines[1:3] if len(lines) > 1 else lines)
            raise CheckpointDamaged(step, path, f"does not fit the model ({detail[:300]}): a "
                                    f"checkpoint of another model?") from None
        return meta

    def set_aside(self, step: int) -> Path:
        """Move a damaged checkpoint to ``DIR-damaged/step_<n>`` (kept for inspection) and
        return where it went."""
        target_dir = self.directory.with_name(f"{self.directory.name}-damaged")
        target_dir.mkdir(parents=True, exist_ok=True)
        target, n = target_dir / self.path(step).name, 1
        while target.exists():
            target, n = target_dir / f"{self.path(step).name}.{n}", n + 1
        shutil.move(str(self.path(step)), str(target))
        return target

    def close(self) -> None:
        self.remove_unfinished()
