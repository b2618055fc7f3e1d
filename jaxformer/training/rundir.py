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


class DamagedFile(ValueError):
    """A file of a run cannot be read or does not fit the run: ``"PATH: what is wrong"``."""

    def __init__(self, path, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{path}: {problem}")


class CheckpointDamaged(DamagedFile):
    """A checkpoint that cannot be restored (``step``): the file and what is wrong with it."""

    def __init__(self, step: int, path, problem: str):
        self.step = step
        super().__init__(path, problem)


# What run.json's identity must hold (``config.run_identity``), with each value's JSON type.
_IDENTITY_FIELDS = {"family": str, "framework": str, "data_sha256": str, "model_config": dict,
                    "train_config": dict}


def read_json(path: Path, what: str = "a JSON object"):
    """The JSON object in ``path``, or a :class:`DamagedFile` naming it and the problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DamagedFile(path, "missing") from None
    except (OSError, UnicodeDecodeError) as error:
        raise DamagedFile(path, f"cannot be read ({error})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        problem = "empty" if not text.strip() else f"not valid JSON ({error})"
        raise DamagedFile(path, f"{problem}; expected {what}") from None
    if not isinstance(value, dict):
        raise DamagedFile(path, f"holds a JSON {type(value).__name__}, expected {what}")
    return value


def read_run(run_dir: Path) -> dict:
    """``run.json``, validated: an object whose ``identity`` holds every field of a run."""
    path = run_dir / "run.json"
    run = read_json(path, "the run's identity (run.json)")
    identity = run.get("identity")
    if not isinstance(identity, dict):
        raise DamagedFile(path, "has no 'identity' object")
    for name, kind in _IDENTITY_FIELDS.items():
        if not isinstance(identity.get(name), kind):
            raise DamagedFile(path, f"identity.{name} is missing or not a JSON "
                                    f"{'string' if kind is str else 'object'}")
    vocab_size = identity["model_config"].get("vocab_size")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise DamagedFile(path, "identity.model_config.vocab_size is missing or not an integer")
    labels = run.get("label_names")
    if labels is not None and not (isinstance(labels, list)
                                   and all(isinstance(x, str) for x in labels)):
        raise DamagedFile(path, "label_names must be a list of strings")
    return run


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


def check_identity(run_dir: Path, identity: dict, saved: dict | None = None) -> None:
    """Refuse to resume ``run_dir`` when its recorded identity (or ``saved``, that identity as
    an extension changes it) differs from ``identity``."""
    saved = read_run(run_dir)["identity"] if saved is None else saved
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
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:  # an exception (an interrupt included) leaves no temporary file behind
        tmp.unlink(missing_ok=True)
