"""Dispatching ahead (``docs/training.md``, "Dispatching ahead"): on an accelerator the training
loop dispatches the next update before reading the previous one's metrics, except after an
update whose state it reads (an evaluation, a checkpoint, the first and the last update). Forced
on here on the CPU (``RunOptions.dispatch_ahead``), both frameworks: the order of dispatches and
reads is the one documented, and the run is the same as without: every metric bit for bit, the
same checkpoints with the same weights; a signal, a divergence and a resume behave as they do
without it. The sizes are ``test_interrupt.py``'s (dropout on), so the suite's compilation cache
serves the train step.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

import torch_ref.training.step
from jaxformer.training import loop, step
from jaxformer.training.config import TrainConfig
from jaxformer.training.interrupts import RunInterrupted
from parity_tests.support.training import write_corpus

STEPS = 8


@pytest.fixture(autouse=True)
def _deterministic():
    """Bit-for-bit comparisons of two runs need deterministic kernels: on a GPU, XLA's
    scatter-adds and reductions with atomics differ run to run in the last bits (an H100: the
    gradient norm of update 3 1.8363266 against 1.8363264) unless XLA is told not to use them."""
    import jax

    flags = os.environ.get("XLA_FLAGS", "")
    if jax.devices()[0].platform == "gpu" and "--xla_gpu_deterministic_ops=true" not in flags:
        pytest.skip("on a GPU: run with XLA_FLAGS=--xla_gpu_deterministic_ops=true")
TIMING = {"seconds", "tokens_per_s", "model_tflops_per_s"}  # the only fields allowed to differ
STEP_CLASSES = {"jax": step.TrainStep, "torch": torch_ref.training.step.TrainStep}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("ahead") / "corpus.txt")


def _train(corpus, run_dir, framework, ahead, **changes):
    """``jaxformer train --family gpt --steps 8 --seq-len 16 --batch-size 4`` with an evaluation
    every 3 updates and a checkpoint every 4: updates 1, 3, 4, 6 and 8 settle the state, 2, 5 and
    7 may be left running."""
    options = dict(family="gpt", data=corpus, framework=framework, checkpoint_dir=str(run_dir),
                   checkpoint_every=4, eval_every=3, eval_batches=1, progress="none",
                   dispatch_ahead=ahead)
    return loop.train(TrainConfig(steps=STEPS, batch_size=4, seq_len=16),
                      loop.RunOptions(**{**options, **changes}))


def _records(run_dir):
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def _checkpoints(run_dir):  # the steps saved ("4" for orbax, "step_4" for the torch twin)
    return sorted(int(p.name.removeprefix("step_")) for p in (run_dir / "checkpoints").iterdir())


def _weights(result, framework):
    if framework == "torch":
        return {k: v.detach().numpy() for k, v in result.model.state_dict().items()}
    from flax import nnx

    return {str(path): np.asarray(leaf) for path, leaf in
            nnx.to_flat_state(nnx.state(result.model, nnx.Param))}


def _watch(monkeypatch, cls, on_dispatch, on_fetch):
    """Wrap ``cls``'s ``dispatch`` and ``fetch``: ``on_dispatch(update)`` after each dispatch,
    ``on_fetch(update, result) -> result`` on each fetch, updates counted from 1."""
    origin, dispatch, fetch = {}, cls.dispatch, cls.fetch

    def watched_dispatch(self, batch):
        metrics = dispatch(self, batch)
        origin[id(metrics)] = self.step
        on_dispatch(self.step)
        return metrics

    def watched_fetch(metrics):
        return on_fetch(origin[id(metrics)], fetch(metrics))

    monkeypatch.setattr(cls, "dispatch", watched_dispatch)
    monkeypatch.setattr(cls, "fetch", staticmethod(watched_fetch))


@pytest.fixture
def order(monkeypatch):
    """Every ``dispatch`` and ``fetch`` of both twins' train steps as ("dispatch", update) and
    ("fetch", update), updates counted from 1 (a repeated fetch recorded once)."""
    events = []

    def fetched(update, result):
        if not events or events[-1] != ("fetch", update):
            events.append(("fetch", update))
        return result

    for cls in STEP_CLASSES.values():
        _watch(monkeypatch, cls, lambda update: events.append(("dispatch", update)), fetched)
    return events


def _expected_order():
    """Updates 2, 5 and 7 are read after the next one is dispatched; the others at once."""
    events = []
    for update in range(1, STEPS + 1):
        events.append(("dispatch", update))
        if update - 1 in (2, 5, 7):
            events.append(("fetch", update - 1))
        if update not in (2, 5, 7):
            events.append(("fetch", update))
    return events


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_the_same_run_with_and_without(corpus, tmp_path, framework, order):
    """The default (dispatching ahead where the update runs on an accelerator: jax's device,
    the torch twin's CPU), then forced on."""
    import jax

    plain = _train(corpus, tmp_path / "plain", framework, ahead=None)
    if framework == "jax" and jax.devices()[0].platform != "cpu":
        assert order == _expected_order()
    else:
        assert order == [e for u in range(1, STEPS + 1) for e in (("dispatch", u), ("fetch", u))]
    order.clear()
    ahead = _train(corpus, tmp_path / "ahead", framework, ahead=True)
    assert order == _expected_order()

    records = _records(tmp_path / "plain")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert [r["step"] for r in records if "eval_loss" in r] == [3, 6, 8]
    assert _records(tmp_path / "ahead") == records  # every loss, rate, norm, evaluation
    assert ahead.losses == plain.losses
    assert _checkpoints(tmp_path / "plain") == [4, 8]
    assert _checkpoints(tmp_path / "ahead") == [4, 8]
    expected = _weights(plain, framework)
    got = _weights(ahead, framework)
    assert got.keys() == expected.keys()
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


class _SignalOnLine:
    """A progress stream that sends this process SIGINT when it prints update ``at``'s line."""

    def __init__(self, at):
        self.at, self.lines = at, []

    def write(self, text):
        self.lines.append(text)
        if text.startswith(f"step {self.at}/"):
            os.kill(os.getpid(), signal.SIGINT)

    def flush(self):
        pass


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_a_signal_finishes_the_update_under_way_and_resumes_exactly(corpus, tmp_path,
                                                                    framework):
    """SIGINT while update 2's line is printed: update 2 was read after update 3 was dispatched,
    so update 3 finishes, is recorded and saved; ``--resume`` then gives the uninterrupted run's
    metrics exactly."""
    _train(corpus, tmp_path / "plain", framework, ahead=False)
    run_dir = tmp_path / "ahead"
    stream = _SignalOnLine(at=2)
    with pytest.raises(RunInterrupted) as caught:
        _train(corpus, run_dir, framework, ahead=True, progress="plain", log_every=1,
               stream=stream)
    assert caught.value.step == 3
    assert [r["step"] for r in _records(run_dir)] == [1, 2, 3]
    assert _checkpoints(run_dir) == [3]
    resumed = _train(corpus, run_dir, framework, ahead=True, resume=True)
    assert resumed.start_step == 3
    assert _records(run_dir) == _records(tmp_path / "plain")


def test_a_divergence_in_an_update_read_late_is_named(corpus, tmp_path, monkeypatch):
    """Update 5 (read after update 6 was dispatched) reports a NaN loss: the run stops naming
    update 5, its metrics end at update 4, and the last checkpoint is update 4's (update 6's
    state is not saved)."""
    def poisoned(update, result):
        return {**result, "loss": float("nan")} if update == 5 else result

    _watch(monkeypatch, STEP_CLASSES["jax"], lambda update: None, poisoned)
    with pytest.raises(loop.TrainingDiverged, match=r"^step 5: the loss is nan; .* step 4 in"):
        _train(corpus, tmp_path / "run", "jax", ahead=True)
    assert [r["step"] for r in _records(tmp_path / "run")] == [1, 2, 3, 4]
    assert _checkpoints(tmp_path / "run") == [4]
