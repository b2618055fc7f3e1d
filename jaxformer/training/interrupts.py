"""How a training run answers SIGINT and SIGTERM (shared glue, no twin): finish the step, save,
stop; a second signal stops at once without leaving a half-written checkpoint. Used by ``loop``;
``command`` turns the two outcomes into exit code 130 and the resume command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn


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
    main thread (where Python runs handlers); the previous handlers come back on exit.

    Python runs a handler between any two bytecodes of the main thread, and where the bytecode is
    a garbage-collector callback (JAX registers one), a ``__del__`` or a weakref callback, an
    exception raised there is reported as unraisable and dropped: the run would go on and print
    a traceback. So while the signals are ours, :class:`RunAborted` reaching
    ``sys.unraisablehook`` is not printed: the same signal is sent to the main thread again, from
    another thread, and raised as soon as ordinary code runs, or on leaving the block if that
    comes first."""

    def __init__(self, stream, checkpointer):
        self.received: str | None = None
        self._stream, self._checkpointer = stream, checkpointer
        self._count, self._in_save, self._abort = 0, False, None
        self._previous = {}
        self._aborting = ""  # the abort raised (its signal's name), while it may be dropped
        self._redelivery: threading.Timer | None = None  # a dropped abort's, until raised
        self._in_hook = False
        self._previous_hook = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
            self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
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
            self._raise_abort(name)

    def _raise_abort(self, name: str) -> NoReturn:
        for sig in self._previous:  # the abort's clean-up runs to its end
            signal.signal(sig, signal.SIG_IGN)
        self._aborting, self._redelivery = name, None
        raise RunAborted(name)

    def _unraisable(self, unraisable) -> None:
        """``sys.unraisablehook`` while the signals are ours: an abort raised where Python drops
        exceptions is raised again from ordinary code (the class docstring)."""
        if not isinstance(unraisable.exc_value, RunAborted):
            (self._previous_hook or sys.__unraisablehook__)(unraisable)
            return
        self._in_hook = True
        try:
            self._redeliver()
        finally:
            self._in_hook = False

    def _redeliver(self) -> None:
        for sig in self._previous:
            signal.signal(sig, self._again)
        sig = signal.Signals[self._aborting]
        # from another thread: a handler asked for here would run inside the hook, and be dropped
        # again; to the main thread itself, so that a blocking call there returns (EINTR)
        timer = threading.Timer(0.001, signal.pthread_kill, (threading.main_thread().ident, sig))
        timer.daemon = True
        self._redelivery = timer
        timer.start()

    def _again(self, signum, frame):
        name = self._aborting  # set before anything could drop it
        if self._in_hook:  # not yet out of the hook: once more, a little later
            self._redeliver()
        elif self._in_save:  # a save began meanwhile: raised when it is complete
            self._abort = name
        else:
            self._raise_abort(name)

    @contextlib.contextmanager
    def saving(self):
        self._in_save = True
        try:
            yield
        finally:
            self._in_save = False
        if self._abort:
            self._raise_abort(self._abort)

    def __exit__(self, exc_type, exc, tb):
        pending, self._redelivery = self._redelivery, None
        if pending is not None:  # dropped, and the block ended before it came back
            pending.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._previous:
            sys.unraisablehook = self._previous_hook
        if pending is not None and exc_type is None:
            raise RunAborted(self._aborting)
        return False
