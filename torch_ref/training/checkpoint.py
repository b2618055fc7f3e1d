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
    removed by the next ``Checkpointer`` on the directory. The last ``keep`` checkpoints are kept.
    """

    def __init__(self, directory, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory).absolute()
        self._keep = keep
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(".tmp-step_*"):
            shutil.rmtree(stale, ignore_errors=True)

    def steps(self) -> list[int]:
        steps = []
        for path in self.directory.iterdir():
            match = _STEP_DIR.match(path.name)
            if match and (path / "state.pt").is_file() and (path / "meta.json").is_file():
                steps.append(int(match.group(1)))
        return sorted(steps)

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
        return json.loads((self.directory / f"step_{step}" / "meta.json").read_text())

    def restore(self, trainer, step: int | None = None) -> dict:
        step = self._step(step)
        state = torch.load(self.directory / f"step_{step}" / "state.pt", weights_only=False)
        trainer.load_state_dict(state)
        return self.read_meta(step)

    def close(self) -> None:
        pass
