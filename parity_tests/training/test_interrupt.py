"""Interrupts (``docs/training.md``, "Interrupts, damage and resuming"), both frameworks, as a
user meets them: ``jaxformer train`` in a subprocess gets SIGINT after a random step's progress
line (seeded), finishes that step, saves, prints the step saved and the exact command that
resumes, exits 130 without a traceback and leaves nothing temporary; the printed command, run as
printed, resumes from that step and every per-step loss equals an uninterrupted run's bit for
bit (dropout on). A second signal stops at once, still without a traceback, also where Python
drops the exception its handler raises (a garbage-collector callback, a ``__del__``). The SIGKILL
guarantee is ``test_kill_resume.py``'s.

Sentences of the doc section and their tests: "SIGINT or SIGTERM finishes the step ..., saves,
writes the metrics and the plot, prints ... exits 130" and "resume ... prints the step":
``test_sigint_saves_and_the_printed_command_resumes_exactly``; "a second signal stops at once":
``test_a_second_signal_stops_at_once``.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time

import pytest

from jaxformer.training.interrupts import RunAborted, Signals
from parity_tests.support.helpers import fast_compile_env
from parity_tests.support.training import write_corpus

STEPS = 8


def _command(data, run_dir, framework, *extra):
    return [sys.executable, "-m", "jaxformer.cli", "train", "--family", "gpt", "--data",
            str(data), "--steps", str(STEPS), "--seq-len", "16", "--batch-size", "4",
            "--framework", framework, "--checkpoint-dir", str(run_dir), "--progress", "plain",
            "--log-every", "1", *extra]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The corpus and the environment every run of this module shares. The processes inherit
    the suite's JAX compilation cache (conftest.py), so that only the first JAX process compiles
    the step; ``test_kill_resume.py`` trains the same run (corpus, sizes, steps, XLA options) and
    shares it. Every run here is compared with runs compiled alike (``helpers.FAST_COMPILE``)."""
    root = tmp_path_factory.mktemp("interrupt")
    env = fast_compile_env(JAX_PLATFORMS="cpu")
    return write_corpus(root / "corpus.txt"), env


def _losses(run_dir):
    return [(r["step"], r["loss"]) for r in map(
        json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def _signal_after(command, env, step, signals):
    """Start ``command``; after its progress line of ``step``, send ``signals`` (a pause between
    them); return (exit code, stdout, stderr)."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    out = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            out.append(line)
            if line.startswith(f"step {step}/"):
                for i, sig in enumerate(signals):
                    if i:
                        time.sleep(0.05)
                    process.send_signal(sig)
                break
        rest, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, "".join(out) + rest, err


def _leftovers(run_dir):
    return [p for p in run_dir.rglob("*") if "tmp" in p.name]


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_sigint_saves_and_the_printed_command_resumes_exactly(shared, tmp_path, framework):
    data, env = shared
    reference = tmp_path / "reference"
    subprocess.run(_command(data, reference, framework), env=env, check=True,
                   capture_output=True, cwd=os.getcwd())
    expected = _losses(reference)
    assert [s for s, _ in expected] == list(range(1, STEPS + 1))

    run_dir = tmp_path / "interrupted"
    command = _command(data, run_dir, framework)
    at = random.Random(f"interrupt-{framework}").randint(1, STEPS - 2)
    code, _, err = _signal_after(command, env, at, [signal.SIGINT])
    assert code == 130, err
    assert "Traceback" not in err
    saved = int(err.split("saved step ")[1].split()[0])
    assert at <= saved < STEPS  # the step under way finished, then the run saved and stopped
    printed = err.split("Resume with:\n")[1].strip().splitlines()[0]
    assert shlex.split(printed) == command + ["--resume"]  # the user's own command, resumed
    assert [s for s, _ in _losses(run_dir)] == list(range(1, saved + 1))  # metrics flushed
    assert (run_dir / "metrics.png").is_file()
    assert not _leftovers(run_dir)

    result = subprocess.run(shlex.split(printed), env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"resuming {run_dir} from step {saved}" in result.stdout
    assert _losses(run_dir) == expected  # every step once, every loss bit-identical
    assert not _leftovers(run_dir)


def test_a_second_signal_stops_at_once(shared, tmp_path):
    """Two signals 50 ms apart, a checkpoint after every step (a save is usually under way):
    exit 130, no traceback, no temporary directory."""
    data, env = shared
    run_dir = tmp_path / "run"
    command = _command(data, run_dir, "jax", "--checkpoint-every", "1")
    code, _, err = _signal_after(command, env, 2, [signal.SIGINT, signal.SIGTERM])
    assert code == 130, err
    assert "Traceback" not in err
    assert "stopped at once" in err or "saved step" in err
    assert not _leftovers(run_dir)


def _handlers():
    return [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.unraisablehook]


class _SignalsOnDelete:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)


@pytest.mark.parametrize("where", ["gc callback", "__del__"])
def test_an_abort_python_drops_is_raised_again(where):
    """The second signal's handler runs inside a garbage-collector callback (as it once did in
    JAX's, in ``test_a_second_signal_stops_at_once``) or a ``__del__``, where Python reports the
    exception raised as unraisable and goes on: the abort is raised again from the code that runs
    next, and nothing is printed."""
    fired = []

    def callback(phase, info):
        if phase == "start" and not fired:
            fired.append(phase)
            signal.raise_signal(signal.SIGTERM)  # runs the handler here, inside the callback

    def drop_then_wait():
        if where == "gc callback":
            gc.collect()
        else:
            _SignalsOnDelete()  # deleted at once
            fired.append(where)
        assert fired  # the abort was raised where Python dropped it, and not here
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # raised again from here
            time.sleep(0.01)

    errors = io.StringIO()
    before = _handlers()
    with Signals(io.StringIO(), checkpointer=None) as signals:
        signal.raise_signal(signal.SIGINT)
        assert signals.received == "SIGINT"
        if where == "gc callback":
            gc.callbacks.append(callback)
        try:
            with contextlib.redirect_stderr(errors), pytest.raises(RunAborted, match="SIGTERM"):
                drop_then_wait()
        finally:
            if callback in gc.callbacks:
                gc.callbacks.remove(callback)
    assert errors.getvalue() == ""
    time.sleep(0.05)  # a redelivery would have come by now
    assert _handlers() == before  # the handlers and the hook given back


def test_an_abort_dropped_as_the_run_ends_is_raised_on_leaving():
    """Dropped in a garbage-collector callback just before the signals' block ends: the abort is
    raised as the block is left (not later, by a handler no longer ours: SIGTERM's default
    would kill the process), and the handlers and hook are given back."""
    def callback(phase, info):
        if phase == "start":
            gc.callbacks.remove(callback)
            signal.raise_signal(signal.SIGTERM)

    before = _handlers()
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), pytest.raises(RunAborted, match="SIGTERM"):
        _collect_then_leave(callback)
    assert errors.getvalue() == ""
    time.sleep(0.05)  # a redelivery, had it not been cancelled, would have come by now
    assert _handlers() == before


def _collect_then_leave(callback):
    with Signals(io.StringIO(), checkpointer=None):
        signal.raise_signal(signal.SIGINT)
        gc.callbacks.append(callback)
        gc.collect()
