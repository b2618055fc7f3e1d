"""How the ``jaxformer`` command reports a failure (CLI glue, standard library only, no twin).

One contract for every subcommand: a line ``jaxformer <command>: error: <what>`` on standard
error, and an exit status that says whose the failure is:

- 2 (:data:`USAGE`): the user's input: a flag, a value, a path, a file's content
  (:class:`UsageError`, argparse's own errors);
- 1 (:data:`FAILURE`): the run itself failed (:class:`RunFailure`: a diverged loss, a failing
  comparison, the system refusing a write);
- 130 (:data:`INTERRUPTED`): Ctrl-C or SIGTERM (128 + SIGINT's number, as shells report it).

A subcommand raises; :func:`report` (called by ``jaxformer.cli.main``) prints the line and
returns the status. No traceback is printed for either class: a traceback is for bugs, and
``--debug`` (or ``JAXFORMER_DEBUG=1`` in the environment) prints it too, above the line.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import TextIO

USAGE, FAILURE, INTERRUPTED = 2, 1, 130
DEBUG_ENV = "JAXFORMER_DEBUG"


class UserError(Exception):
    """A failure the user can fix and caused; the message names the flag (as typed), the path or
    the key, and the offending value. Exit status :attr:`exit_code`."""

    exit_code = USAGE


class UsageError(UserError):
    """Bad command-line or configuration input: a flag, a value, a config-file key (exit 2)."""


class RunFailure(UserError):
    """The work itself failed although the input was valid (exit 1): nothing the user typed is
    wrong, but the result is not what was asked (a diverged loss, a failed check)."""

    exit_code = FAILURE


def debug_enabled(flag: bool = False) -> bool:
    """``--debug`` given, or ``JAXFORMER_DEBUG`` set to anything but empty or ``0``."""
    return bool(flag) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def prefix(command: str | None) -> str:
    return f"jaxformer {command}" if command else "jaxformer"


def report(command: str | None, error: BaseException, debug: bool = False,
           stream: TextIO | None = None) -> int:
    """Print ``error`` as the one line of the contract (with the traceback above it when
    ``debug``) and return its exit status."""
    stream = sys.stderr if stream is None else stream
    if debug_enabled(debug):
        traceback.print_exception(error, file=stream)
    if isinstance(error, KeyboardInterrupt):
        print(f"{prefix(command)}: interrupted", file=stream, flush=True)
        return INTERRUPTED
    if isinstance(error, UserError):
        code = error.exit_code
    elif isinstance(error, OSError):  # the system refused: a disk full, a permission changed
        code = FAILURE
    else:
        raise TypeError(f"not a reportable error: {error!r}") from error
    print(f"{prefix(command)}: error: {message(error)}", file=stream, flush=True)
    return code


def message(error: BaseException) -> str:
    """The error's text; an ``OSError`` as ``PATH: reason`` rather than ``[Errno 13] ...``."""
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename is not None else ""
        return f"{where}{error.strerror}"
    return str(error)
