"""What the inference commands (``generate``, ``classify``, ``fill-mask``, ``embed``) share, and
nothing else (framework-free glue, no model): the error contract, reading texts, loading a model
of the right family, and writing an output file.

The contract (DESIGN.md, "Runs and the command line"): every flag is checked before a model is
loaded; a problem the user can fix is one line ``jaxformer COMMAND: error: ...`` on stderr, on a
line of its own, and exit status 2; a failure of the machine (a file that cannot be written
after the checks) is exit status 1; no traceback for either.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from jaxformer import errors, outputs

# One error contract for every command (jaxformer/errors.py): these commands raise its
# UsageError and report through errors.report.
UsageError = errors.UsageError


def guarded(command: str, work: Callable[[], int], state: dict | None = None,
            debug: bool = False) -> int:
    """Run ``work`` and turn what a user can cause into the contract's one line and exit
    status (``errors.report``): ``ValueError`` (a :class:`UsageError`, a ``LoadError``, a
    tokenizer's unknown characters, a checkpoint that does not fit) -> 2; ``OSError`` (a file
    that cannot be read or written) -> 1. ``state["open_line"]`` tells whether stdout holds a
    partial line (a streamed prompt), ended first so that the error stands on its own line."""
    state = {} if state is None else state
    try:
        return work()
    except (ValueError, ImportError, OSError) as error:  # ImportError: torch missing
        if state.get("open_line", False):
            print(flush=True)
        if not isinstance(error, errors.UserError | OSError):
            reportable = errors.UsageError(str(error))
            reportable.__cause__ = error
            error = reportable
        return errors.report(command, error, debug)


def read_texts(texts: Sequence[str], file: Path | None, *, flag: str = "--file") -> list[str]:
    """The TEXT arguments, then the non-empty lines of ``file`` (``-`` reads stdin)."""
    out = list(texts)
    if file is not None:
        if str(file) == "-":
            content = sys.stdin.read()
        else:
            try:
                content = Path(file).read_text(encoding="utf-8")
            except FileNotFoundError:
                raise UsageError(f"{flag} {file}: no such file") from None
            except IsADirectoryError:
                raise UsageError(f"{flag} {file}: is a directory; give a text file") from None
            except UnicodeDecodeError as error:
                raise UsageError(f"{flag} {file}: not UTF-8 text ({error.reason} at byte "
                                 f"{error.start})") from None
        out += [line for line in content.splitlines() if line.strip()]
    if not out:
        raise UsageError(f"no text given: pass TEXT arguments or {flag} FILE")
    return out


def load_model(path: Path, *, step: int | None, framework: str, families: Sequence[str],
               command: str):
    """``jaxformer.load`` of a run or Hugging Face directory, refused in one line unless its
    family is one of ``families``."""
    from jaxformer.loading import load, require_family

    loaded = load(path, step=step, framework=framework)
    require_family(loaded, tuple(families), command)
    return loaded


def check_out_file(flag: str, path: Path, extensions: Sequence[str], *,
                   overwrite: bool) -> str:
    """``path``'s extension (one of ``extensions``), after checking that the file may be
    written: absent, or present and ``overwrite`` given; its directory writable. Raises
    :class:`UsageError` naming the flag and the path."""
    suffix = Path(path).suffix.lower()
    if suffix not in extensions:
        shown = f"extension {suffix!r}" if suffix else "no extension"
        raise UsageError(f"{flag} {path}: {shown}; the format is chosen by the extension: "
                         f"{' or '.join(extensions)}")
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir() and not overwrite:
        raise UsageError(f"{flag} {path}: exists; pass --overwrite to replace it (nothing was "
                         f"written)")
    try:
        outputs.check_new_file(flag, path, ours=lambda _: overwrite)
    except outputs.OutputError as error:
        raise UsageError(str(error)) from None
    return suffix


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """``write(temporary)`` beside ``path``, then rename: ``path`` is whole or untouched."""
    target = Path(path).expanduser()
    handle, name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


LENGTH_BUCKET = 16  # batches are padded to a multiple of this: jit compiles a few shapes only


def bert_inputs(rows: Sequence[Sequence[int]], *, cls_id: int, sep_id: int, pad_id: int,
                context: int) -> tuple:
    """``[CLS] tokens [SEP]`` for each row of token ids, as BERT and the classifier task frame
    one text: ``(input_ids, token_type_ids, attention_mask)``, int32 ``[batch, width]``, right
    padded to a multiple of :data:`LENGTH_BUCKET` (at most ``context``), and the rows whose
    tokens were cut to fit ``context``."""
    import numpy as np

    keep = context - 2
    framed = [[cls_id, *list(row)[:keep], sep_id] for row in rows]
    cut = [n for n, row in enumerate(rows) if len(row) > keep]
    longest = max(len(row) for row in framed)
    width = min(-(-longest // LENGTH_BUCKET) * LENGTH_BUCKET, context)
    ids = np.full((len(framed), width), pad_id, np.int32)
    mask = np.zeros((len(framed), width), np.int32)
    for r, row in enumerate(framed):
        ids[r, :len(row)] = row
        mask[r, :len(row)] = 1
    return ids, np.zeros_like(ids), mask, cut


def special_token(tokenizer, name: str, flag_or_path) -> int:
    """``tokenizer.<name>_id`` (``"cls"``, ``"sep"``, ``"mask"``...), or a :class:`UsageError`
    saying the model's tokenizer lacks it."""
    value = getattr(tokenizer, f"{name}_id", None)
    if value is None:
        raise UsageError(f"{flag_or_path}: the tokenizer has no {name.upper()} token, which this "
                         f"command needs")
    return int(value)
