"""``jaxformer.training.precompile``: on a cold compilation cache ``jaxformer train`` has a helper
process compile the train step and its evaluation, and loads them instead of compiling; a second
run finds the helper's marker and starts none; a helper that fails or is stopped leaves the run
to compile in its own process and nothing behind."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from jaxformer.training import precompile
from jaxformer.training.config import TrainConfig
from parity_tests.support.training import write_corpus

HELPER_LINE = "the train step, in a helper process"
LOADED = "loaded from the compilation cache"


def _train(data, run_dir, cache, *extra, **env):
    """A tiny ``jaxformer train`` in a process of its own, with its own compilation cache (not
    the suite's: the test is about what that cache holds)."""
    environment = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    environment.update(JAX_PLATFORMS="cpu", JAXFORMER_COMPILATION_CACHE=str(cache), **env)
    command = [sys.executable, "-m", "jaxformer.cli", "train", "--family", "gpt", "--data",
               str(data), "--steps", "3", "--seq-len", "16", "--batch-size", "4",
               "--eval-every", "2", "--checkpoint-dir", str(run_dir), "--progress", "plain", *extra]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text()
              .splitlines()]
    return done.stdout, losses


def _first_update(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("compile    the first"))


def test_a_cold_run_loads_the_step_a_helper_compiled(tmp_path):
    data = write_corpus(tmp_path / "corpus.txt")
    cache = tmp_path / "cache"
    # the suite runs without the allocator settings (conftest.py), which a helper needs unless
    # it is asked for
    out, losses = _train(data, tmp_path / "a", cache, JAXFORMER_COMPILE_HELPER="1")
    assert HELPER_LINE in out, out
    assert LOADED in _first_update(out), out  # the update and its evaluation: nothing missed
    (marker,) = (cache / precompile.MARKERS).iterdir()
    entries = json.loads(marker.read_text())["entries"]
    assert any(name.startswith("jit_wrapped-") for name in entries), entries
    assert all((cache / name).is_file() for name in entries)

    # another schedule, the same programs: the marker says they are in the cache
    again, losses_again = _train(data, tmp_path / "b", cache, "--lr", "3e-3",
                                 JAXFORMER_COMPILE_HELPER="1")
    assert HELPER_LINE not in again, again
    assert LOADED in _first_update(again), again
    assert losses_again[0] == losses[0]
    assert losses_again[1:] != losses[1:]

    off, losses_off = _train(data, tmp_path / "c", tmp_path / "cache_off",
                             JAXFORMER_COMPILE_HELPER="0")
    assert HELPER_LINE not in off, off
    assert LOADED not in _first_update(off), off
    assert losses == losses_off  # the same program, bit for bit


def _spec(family: str) -> dict:
    return {"family": family, "model_config": None, "config": TrainConfig(steps=1),
            "batch": {}, "eval_batches": [], "jax_config": {}}


def test_a_failed_helper_is_reported_and_leaves_no_marker(tmp_path):
    stream = io.StringIO()
    helper = precompile.Helper(_spec("no-such-family"), tmp_path, "key", stream)
    assert helper.wait() is False
    said = stream.getvalue()
    assert "helper process compiling the train step failed (exit 1)" in said, said
    assert "no-such-family" in said, said
    assert "compiling it in this process" in said, said
    assert not (tmp_path / precompile.MARKERS).exists()
    assert not os.path.exists(helper._dir.name)


def test_a_stopped_helper_ends_at_once(tmp_path):
    helper = precompile.Helper(_spec("gpt"), tmp_path, "key", io.StringIO())
    helper.stop()  # an interrupted start-up
    assert helper._process.poll() is not None
    assert not os.path.exists(helper._dir.name)
    assert not (tmp_path / precompile.MARKERS).exists()


@pytest.mark.parametrize(("switch", "tuned", "expected"), [
    (None, True, True),    # the default: wanted where the allocator settings are applied
    (None, False, False),  # not without them (the suite's own processes)
    ("0", True, False), ("off", True, False),
    ("1", False, True),    # forced
])
def test_the_switch_decides_whether_a_helper_is_wanted(monkeypatch, tmp_path, switch, tuned,
                                                       expected):
    monkeypatch.setattr(precompile, "_cache_dir", lambda: tmp_path)  # a cache is in use
    monkeypatch.setattr(precompile.runtime, "tune_allocator", lambda: tuned)
    if switch is None:
        monkeypatch.delenv("JAXFORMER_COMPILE_HELPER", raising=False)
    else:
        monkeypatch.setenv("JAXFORMER_COMPILE_HELPER", switch)
    assert precompile.wanted() is expected
    assert precompile.wanted(mesh="data=1") is False  # never under a device mesh
