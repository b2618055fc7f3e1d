"""How a training run answers SIGINT and SIGTERM (shared glue, no twin): finish the step, save,
stop; a second signal stops at once without leaving a half-written checkpoint. Used by ``loop``;
``command`` turns the two outcomes into exit code 130 and the resume command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path


class RunInterrupted(Exception):
    """SIGINT or SIGTERM: the step under way finished, a checkpoint of ``step`` was saved, the
    metrics and the plot were written."""

    def __init__(self, signal_name: str, step: int, checkpoint_dir: Path):
        self.signal_name, self.step, self.checkpoint_dir = signal_name, step, checkpoint_dir
        super().__init__(f"{signal_name}: saved step {step} in {checkpoint_dir}")


class RunAborted(KeyboardInterrupt):
    """A second SIGINT or SIGTERM: stopped at once, the checkpoints already written kept, the
    unfinished one removed."""


class Signals:
    """SIGINT and SIGTERM while training. The first sets :attr:`received`: the loop saves after
    the step under way and stops. The second raises :class:`RunAborted` at once, unless a
    checkpoint is being written (:meth:`saving`): then as soon as it is complete, so that no
    half-written one is left (orbax's writer threads cannot be stopped midway); a third during a
    save ends the process there (exit 130) after removing the unfinished checkpoint. Only in the
    main thread (where Python runs handlers); the previous handlers come back on exit."""

    def __init__(self, stream, checkpointer):
        self.received: str | None = None
        self._stream, self._checkpointer = stream, checkpointer
        self._count, self._in_save, self._abort = 0, False, None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _say(self, text: str) -> None:
        print(f"\n{text}", file=self._stream, flush=True)

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        self._count += 1
        if self._count == 1:
            self.received = name
            self._say(f"{name}: finishing the current step, then saving a checkpoint (again to "
                      f"stop at once)")
        elif self._in_save and self._count == 2:
            self._abort = name
            self._say(f"{name}: stopping as soon as the checkpoint being written is complete "
                      f"(again to stop even so)")
        elif self._in_save:
            self._checkpointer.remove_unfinished()
            self._say(f"jaxformer train: {name}: stopped during a save; the unfinished "
                      f"checkpoint was removed, the earlier ones are whole")
            os._exit(130)
        else:
            for sig in self._previous:  # the abort's clean-up runs to its end
                signal.signal(sig, signal.SIG_IGN)
            raise RunAborted(name)

    @contextlib.contextmanager
    def saving(self):
        self._in_save = True
        try:
            yield
        finally:
            self._in_save = False
        if self._abort:
            for sig in self._previous:
                signal.signal(sig, signal.SIG_IGN)
            raise RunAborted(self._abort)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False
