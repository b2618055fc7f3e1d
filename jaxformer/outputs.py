"""What a command may write (framework-free, standard library only).

No command deletes or overwrites anything it did not write. Every command that writes checks its
outputs with these functions before any work, and each refusal is an :class:`OutputError` (a
``ValueError``, so the commands print ``jaxformer <command>: error: ...`` and exit 2) naming the
flag as typed and the path:

- a target directory must be absent or empty, unless it holds a previous output of the same kind
  (recognised by what that output wrote: a :data:`MARKER` file listing the files, and exactly
  those files) and the user passed ``--overwrite``; a directory holding anything else is never
  replaced;
- a target file must not exist, unless it is the command's own (the metrics and plot of a
  resumed run belong to that run: it rewrites and appends them);
- a target is never, never contains, and never lies inside a directory or file the command must
  keep (the run directory, its metrics and plot, the input data);
- the directory a target is created in must be writable (checked up front, not after the work).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["MARKER", "OutputError", "check_apart", "check_directory", "check_new_file",
           "check_writable", "has_marker", "marker_text"]

MARKER = ".jaxformer-output.json"


class OutputError(ValueError):
    """An output the command may not write: names the flag, the path and the rule."""


def refuse(flag: str, path, why: str) -> OutputError:
    return OutputError(f"{flag} {path}: {why} (nothing was written)")


def _resolved(path) -> Path:
    return Path(path).expanduser().resolve()


def check_apart(flag: str, path, keep: Mapping[str, object]) -> None:
    """``path`` is not, does not contain and does not lie inside any of ``keep`` (a description
    such as ``"the run directory (--checkpoint-dir runs/a)"`` -> its path)."""
    target = _resolved(path)
    for what, other in keep.items():
        if other is None:
            continue
        kept = _resolved(other)
        if target == kept:
            raise refuse(flag, path, f"is {what}; choose another path")
        if kept in target.parents:
            raise refuse(flag, path, f"lies inside {what}; choose a path outside it")
        if target in kept.parents:
            raise refuse(flag, path, f"contains {what}, which it must not replace; choose "
                                     f"another path")


def check_writable(flag: str, path, start=None) -> None:
    """The nearest existing directory at or above ``start`` (default ``path``) is a writable
    directory, so that ``path`` (and the temporary siblings the atomic writes use) can be
    created there. Errors name ``path``."""
    probe = Path(path if start is None else start).expanduser().absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise refuse(flag, path, f"cannot be created: {probe} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise refuse(flag, path, f"cannot be written: the directory {probe} is not writable")


def _listing(directory: Path, limit: int = 5) -> str:
    names = sorted(p.name for p in directory.iterdir())
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit
                                       else "")


def check_directory(flag: str, path, what: str, *, overwrite: bool,
                    previous: Callable[[Path], bool], keep: Mapping[str, object] = {},
                    replaced: bool = True) -> None:
    """``path`` may receive ``what`` (e.g. "a Hugging Face export"): absent or empty, or a
    previous ``what`` (``previous(path)``) with ``overwrite``. ``replaced``: the directory is
    replaced as a whole (its parent must be writable) rather than written into."""
    check_apart(flag, path, keep)
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise refuse(flag, path, "exists and is not a directory")
    if target.is_dir() and any(target.iterdir()):
        if not previous(target):
            raise refuse(flag, path, f"is not empty and is not {what} (it holds "
                                     f"{_listing(target)}); jaxformer never replaces files it "
                                     f"did not write: choose a new or empty directory")
        if not overwrite:
            raise refuse(flag, path, f"holds {what} already; pass --overwrite to replace it")
    check_writable(flag, path, target.parent if replaced and target.is_dir() else target)


def check_new_file(flag: str, path, *, ours: Callable[[Path], bool] | None = None,
                   keep: Mapping[str, object] = {}) -> None:
    """``path`` may be written: it does not exist, or ``ours(path)`` says it is the command's
    own; it is apart from ``keep``; its directory is writable."""
    check_apart(flag, path, keep)
    target = Path(path).expanduser()
    if target.is_dir():
        raise refuse(flag, path, "is a directory; give a file path")
    if target.exists() and (ours is None or not ours(target)):
        raise refuse(flag, path, "exists and jaxformer did not write it here; jaxformer never "
                                 "overwrites a file it did not write: choose another path")
    if target.exists() and not os.access(target, os.W_OK):
        raise refuse(flag, path, "cannot be written: the file is read-only")
    check_writable(flag, path, target.parent)


def marker_text(kind: str, files: list[str]) -> str:
    """The :data:`MARKER` of an output directory of ``kind`` holding ``files``."""
    return json.dumps({"written_by": "jaxformer", "kind": kind, "files": sorted(files)},
                      indent=1) + "\n"


def has_marker(kind: str) -> Callable[[Path], bool]:
    """Whether a directory is a previous output of ``kind``: its :data:`MARKER` says so and it
    holds exactly the files the marker lists (a file added since makes it the user's)."""
    def previous(directory: Path) -> bool:
        try:
            marker = json.loads((directory / MARKER).read_text())
            names = {p.name for p in directory.iterdir()}
            return (isinstance(marker, dict) and marker.get("kind") == kind
                    and names == set(marker.get("files", [])) | {MARKER})
        except (OSError, ValueError, TypeError):
            return False
    return previous
