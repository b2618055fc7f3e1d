"""The run directory of ``jaxformer train`` (shared glue, no twin): where a run lives on disk.

One run lives in one directory (``--checkpoint-dir``, default ``runs/FAMILY-PRESET``):
``run.json`` (the run identity and the classifier's label names), ``tokenizer.json``,
``checkpoints/``, by default ``metrics.jsonl`` and its plot. Used by ``loop.prepare`` to refuse a
directory or a resume that does not fit, naming each difference, before anything is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from jaxformer.training.config import identity_differences


class ResumeError(ValueError):
    """The run directory cannot be (re)used as asked: names the reason or every difference."""


def run_directory(checkpoint_dir: str | None, family: str, preset: str) -> Path:
    """``--checkpoint-dir``, or ``runs/FAMILY-PRESET``."""
    return Path(checkpoint_dir or f"runs/{family}-{preset}")


def check_usable(run_dir: Path, resume: bool) -> None:
    """A fresh run needs a directory without a run; ``--resume`` needs one with a run."""
    run_json = run_dir / "run.json"
    if resume and not run_json.is_file():
        raise ResumeError(f"--resume: {run_dir} holds no run to resume (no run.json)")
    if not resume and (run_json.is_file() or (run_dir / "checkpoints").exists()):
        raise ResumeError(f"{run_dir} already holds a run; pass --resume to continue it or "
                          f"choose another --checkpoint-dir (nothing was overwritten)")


def check_identity(run_dir: Path, identity: dict) -> None:
    """Refuse to resume ``run_dir`` when its recorded identity differs from ``identity``."""
    saved = json.loads((run_dir / "run.json").read_text())["identity"]
    differences = identity_differences(saved, identity)
    if differences:
        raise ResumeError(f"cannot resume {run_dir}: its run differs from this one "
                          f"(nothing was written):\n  " + "\n  ".join(differences))


def write_run(run_dir: Path, identity: dict, tokenizer, label_names: list[str] | None) -> None:
    """A new run: the directory, its ``tokenizer.json`` and its ``run.json``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(run_dir / "tokenizer.json"))
    write_atomic(run_dir / "run.json", json.dumps(
        {"identity": identity, "label_names": label_names}, indent=1))


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
