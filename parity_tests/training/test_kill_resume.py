"""Kill and resume: ``jaxformer train`` SIGKILLed at a random moment, then resumed, gives
exactly (bit for bit, on CPU) the per-step losses of an uninterrupted run.

A checkpoint is written after every step, and a step of this tiny model takes milliseconds while
a save takes a few hundred, so the kill (a random pause after a random step's metrics line, which
is written just before that step's save) lands inside a save most of the time; the checkpoint it
interrupts must then be invisible and the one before it whole. Dropout is on, so the RNG state
must survive too. The processes use the suite's JAX compilation cache (conftest.py), and train
``test_interrupt.py``'s run (its corpus, sizes and step count): the same compiled programs, so a
run of both compiles them once.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

from jaxformer.training.checkpoint import Checkpointer
from parity_tests.support.helpers import fast_compile_env
from parity_tests.support.training import write_corpus

STEPS = 8  # test_interrupt.py's


def _command(data, run_dir, *extra):
    return [sys.executable, "-m", "jaxformer.cli", "train", "--family", "gpt", "--data",
            str(data), "--steps", str(STEPS), "--seq-len", "16", "--batch-size", "4",
            "--checkpoint-dir", str(run_dir), "--checkpoint-every", "1", "--keep", "2",
            "--progress", "plain", "--log-every", "1", *extra]


def _losses(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


def _run_until_killed(command, env, run_dir, kill_after_step):
    """Start ``command``; SIGKILL it at a random moment after ``kill_after_step`` steps."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= kill_after_step:
                time.sleep(random.uniform(0.0, 0.2))
                break
            time.sleep(0.005)
        assert process.poll() is None, "the run ended before it could be killed"
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    assert process.returncode == -signal.SIGKILL


def test_killed_and_resumed_run_matches_an_uninterrupted_one(tmp_path):
    data = write_corpus(tmp_path / "corpus.txt")  # test_interrupt.py's corpus
    env = fast_compile_env(JAX_PLATFORMS="cpu")  # test_interrupt.py's, and its compilations
    reference = tmp_path / "reference"
    subprocess.run(_command(data, reference), env=env, check=True, capture_output=True)
    expected = _losses(reference)
    assert [s for s, _ in expected] == list(range(1, STEPS + 1))

    run_dir = tmp_path / "killed"
    kill_after = random.randint(2, STEPS - 2)
    _run_until_killed(_command(data, run_dir), env, run_dir, kill_after)
    kept = Checkpointer(run_dir / "checkpoints").latest_step()
    assert kept is not None
    assert kept >= kill_after - 1
    assert len(_losses(run_dir)) >= kept  # the killed run's own metrics reach its checkpoint
    result = subprocess.run(_command(data, run_dir, "--resume"), env=env, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    print(f"\nkilled after step {kill_after}'s metrics; resumed from step {kept}")
    assert _losses(run_dir) == expected  # every step once, every loss bit-identical
