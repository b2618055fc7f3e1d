"""Kill and resume: ``jaxformer train`` SIGKILLed at a random moment (twice: one kill lands
anywhere, the other right after a checkpoint was announced, i.e. while one is being written),
then resumed, gives exactly (bit for bit, on CPU) the per-step losses of an uninterrupted run.

A checkpoint is written after every step, so most of a step's time is spent saving and a kill
usually lands inside a save. Dropout is on, so the RNG state must survive too. The three processes
share a JAX compilation cache, so only the first one compiles the step.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np

from jaxformer.training.checkpoint import Checkpointer

STEPS = 14
WORDS = "the a cat dog bird sat ran over under near house tree river red green big".split()


def _command(data, run_dir, *extra):
    return [sys.executable, "-m", "jaxformer.cli", "train", "--family", "gpt", "--data",
            str(data), "--steps", str(STEPS), "--seq-len", "16", "--batch-size", "4",
            "--checkpoint-dir", str(run_dir), "--checkpoint-every", "1", "--keep", "2",
            "--progress", "plain", "--log-every", "1", *extra]


def _losses(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


def _run_until_killed(command, env, run_dir, kill_after_step, during_save):
    """Start ``command``, SIGKILL it once ``kill_after_step`` steps are recorded (after a
    random pause, or at once when ``during_save``: the step's checkpoint is being written)."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and process.poll() is None:
            done = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
            if done >= kill_after_step:
                if not during_save:
                    time.sleep(random.uniform(0.0, 0.3))
                break
            time.sleep(0.005)
        assert process.poll() is None, "the run ended before it could be killed"
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    assert process.returncode == -signal.SIGKILL


def test_killed_and_resumed_run_matches_an_uninterrupted_one(tmp_path):
    rng = np.random.RandomState(0)
    data = tmp_path / "corpus.txt"
    data.write_text("\n".join(" ".join(rng.choice(WORDS, rng.randint(4, 12)))
                              for _ in range(80)) + "\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    reference = tmp_path / "reference"
    subprocess.run(_command(data, reference), env=env, check=True, capture_output=True)
    expected = _losses(reference)
    assert [s for s, _ in expected] == list(range(1, STEPS + 1))

    run_dir = tmp_path / "killed"
    first_kill = random.randint(2, STEPS // 2)
    _run_until_killed(_command(data, run_dir), env, run_dir, first_kill, during_save=False)
    second_kill = random.randint(first_kill + 2, STEPS - 2)
    resumed = _command(data, run_dir, "--resume")
    _run_until_killed(resumed, env, run_dir, second_kill, during_save=True)
    kept = Checkpointer(run_dir / "checkpoints").latest_step()
    assert kept is not None and kept >= first_kill - 1
    result = subprocess.run(resumed, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    got = _losses(run_dir)
    print(f"\nkilled after step {first_kill} and after step {second_kill}; resumed from "
          f"step {kept}")
    assert got == expected  # every step once, every loss bit-identical
