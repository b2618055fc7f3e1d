"""TrainConfig, schedules, weight-decay mask and clipping: the JAX side against the torch twin and
against values worked out by hand (and torch's own ``clip_grad_norm_``)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer.checkpoints import convert
from jaxformer.training import optim as jo
from jaxformer.training.config import (
    TrainConfig,
    TrainConfigError,
    identity_differences,
    run_identity,
)
from jaxformer.training.step import MODELS
from jaxformer.training.tasks import model_config
from torch_ref.training import optim as to
from torch_ref.training.step import build_model as torch_build

# ------------------------------------------------------------------------------- TrainConfig


@pytest.mark.parametrize(("changes", "message"), [
    ({"learning_rate": -1e-3}, "learning_rate must be positive"),
    ({"learning_rate": 0.0}, "learning_rate must be positive"),
    ({"learning_rate": float("nan")}, "learning_rate must be finite"),
    ({"warmup_steps": 20, "steps": 10}, r"warmup_steps is longer than the run \(steps=10\)"),
    ({"batch_size": 0}, "batch_size must be at least 1"),
    ({"batch_size": 6, "accumulation_steps": 4}, "divisible by accumulation_steps"),
    ({"steps": 0}, "steps must be at least 1"),
    ({"schedule": "step"}, "schedule must be one of"),
    ({"schedule": "inverse_sqrt", "warmup_steps": 0}, "at least 1 for the inverse_sqrt"),
    ({"min_learning_rate": 1.0}, "min_learning_rate must lie in"),
    ({"beta2": 1.0}, r"beta2 must lie in \[0, 1\)"),
    ({"eps": 0.0}, "eps must be positive"),
    ({"weight_decay": -0.1}, "weight_decay must not be negative"),
    ({"clip_norm": -1.0}, "clip_norm must not be negative"),
    ({"label_smoothing": 1.0}, "label_smoothing must lie in"),
    ({"seq_len": 1}, "seq_len must be at least 2"),
    ({"batch_size": 8.0}, "batch_size must be int, got float"),
    ({"decay_embeddings": 1}, "decay_embeddings must be bool"),
])
def test_invalid_hyper_parameters_are_refused(changes, message):
    with pytest.raises(TrainConfigError, match=message):
        TrainConfig(**changes)


def test_train_config_is_frozen_and_hashable():
    config = TrainConfig(accumulation_steps=2)
    assert config.micro_batch_size == 4
    assert hash(config) == hash(TrainConfig(accumulation_steps=2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.steps = 3


def test_model_config_presets_and_run_identity():
    config = model_config("transformer", "tiny", vocab_size=50, pad_id=0, dropout=0.0)
    assert (config.src_vocab_size, config.tgt_vocab_size, config.dropout_rate) == (50, 50, 0.0)
    assert model_config("gpt", "base").num_layers == 12  # `base` reads GPT-2 small
    assert model_config("classifier", "tiny", num_labels=3).num_labels == 3
    with pytest.raises(ValueError, match="has no preset 'huge'"):
        model_config("bert", "huge")
    with pytest.raises(ValueError, match="unknown family"):
        model_config("t5", "tiny")
    a = run_identity("gpt", "jax", model_config("gpt", "tiny"), TrainConfig(), "abc")
    b = run_identity("bert", "jax", model_config("gpt", "tiny", dropout=0.0),
                     TrainConfig(learning_rate=2e-3), "abc")
    assert identity_differences(a, a) == []
    assert identity_differences(a, b) == [
        "family: saved 'gpt', now 'bert'",
        "model_config.attention_dropout_rate: saved 0.1, now 0.0",
        "model_config.dropout_rate: saved 0.1, now 0.0",
        "train_config.learning_rate: saved 0.001, now 0.002"]


# ------------------------------------------------------------------------------- schedules

SCHEDULE_CASES = [
    TrainConfig(steps=50, warmup_steps=10, schedule="linear", learning_rate=1e-3),
    TrainConfig(steps=50, warmup_steps=10, schedule="cosine", learning_rate=1e-3,
                min_learning_rate=1e-4),
    TrainConfig(steps=50, warmup_steps=0, schedule="linear", learning_rate=2e-3),
    TrainConfig(steps=50, warmup_steps=8, schedule="constant", learning_rate=5e-4),
    TrainConfig(steps=50, warmup_steps=16, schedule="inverse_sqrt", learning_rate=7e-4),
    TrainConfig(steps=10, warmup_steps=10, schedule="cosine", learning_rate=1e-3),
]


@pytest.mark.parametrize("config", SCHEDULE_CASES, ids=lambda c: f"{c.schedule}-w{c.warmup_steps}")
def test_schedules_agree_between_frameworks(config):
    steps = range(config.steps + 5)
    lr_j = np.array([jo.learning_rate(config, s) for s in steps])
    lr_t = np.array([to.learning_rate(config, s) for s in steps])
    np.testing.assert_array_equal(lr_j, lr_t)  # the same float64 function on the host
    assert lr_t.max() == pytest.approx(config.learning_rate, rel=1e-12)
    # every update of the run moves the weights; none goes below the floor
    assert np.all(lr_t >= config.min_learning_rate)
    assert np.all(lr_t[: config.steps] > 0)


def test_the_schedule_is_an_argument_of_the_compiled_update():
    """Runs that differ only in the schedule's numbers (length, warm-up, peak, floor, kind) lower
    to one program, so the compilation cache serves them all; the update applies the rate it is
    given: from the same weights, the first update of a run with twice the peak moves every
    parameter twice as far (AdamW's first update is linear in the rate), and the metrics
    report the schedule's float64 value."""
    from jaxformer.training.step import TrainStep, build_model

    mc = model_config("gpt", "tiny", vocab_size=32)
    base = TrainConfig(steps=4, batch_size=2, seq_len=8, learning_rate=1e-3)
    other = dataclasses.replace(base, steps=40, warmup_steps=3, learning_rate=2e-3,
                                min_learning_rate=1e-4, schedule="cosine")
    batch = {"input_ids": np.random.RandomState(0).randint(0, 32, (1, 2, 8)).astype(np.int32)}
    steps = [TrainStep("gpt", build_model("gpt", mc, 0), c) for c in (base, other)]
    texts = [s._lower(batch).as_text() for s in steps]
    assert texts[0] == texts[1], "the schedule's numbers changed the compiled update"
    before = np.concatenate([np.ravel(x) for x in jax.tree.leaves(steps[0]._params)])
    warm = dataclasses.replace(other, warmup_steps=0)  # the peak at the first update
    runs = {}
    for config in (base, warm):
        trainer = TrainStep("gpt", build_model("gpt", mc, 0), config)
        metrics = trainer(batch)
        assert metrics["learning_rate"] == jo.learning_rate(config, 0)
        after = np.concatenate([np.ravel(x) for x in jax.tree.leaves(trainer._params)])
        runs[config.learning_rate] = after - before
    one, two = runs[1e-3], runs[2e-3]
    # The update u = -rate * (adam + decay) is scaled last, and float32(2e-3) = 2 float32(1e-3)
    # exactly, so u2 = 2 u1 bit for bit; what differs is p + u rounded to float32, half an ulp of
    # |p + u| each. So |d2 - 2 d1| <= 1.5 eps (|p| + |d2|) per parameter, which 3 eps (|p| +
    # 3 |d1|) holds with room: measured 1.00 eps (...) with XLA's default ISA and AVX2-capped,
    # 1.30 AVX-capped (its kernels round u separately), 1 and 2 cores (2026-11-27; AVX-512 not
    # available here, and the bound is rounding arithmetic, not a kernel's).
    eps = np.finfo(np.float32).eps
    assert np.all(np.abs(two - 2 * one) <= 3 * eps * (np.abs(before) + 3 * np.abs(one)))
    # ... and the check discriminates: most parameters moved far beyond that rounding (0.89 of
    # them; the rest are embedding rows the batch does not use, moved by weight decay alone).
    assert (np.abs(one) > 100 * eps * np.abs(before)).mean() > 0.5


def test_schedule_values_by_hand():
    linear, cosine, _, constant, inv_sqrt, _ = SCHEDULE_CASES
    lr = to.learning_rate
    assert lr(linear, 0) == pytest.approx(1e-4)  # (0 + 1) / 10 of the peak: no wasted step
    assert lr(linear, 9) == pytest.approx(1e-3)  # end of warm-up = peak
    assert lr(linear, 30) == pytest.approx(1e-3 * 20 / 40)  # halfway through the decay
    assert lr(linear, 50) == pytest.approx(0.0, abs=1e-18)  # after the last update
    assert lr(cosine, 30) == pytest.approx(1e-4 + 0.9e-3 * 0.5)  # cosine midpoint
    assert lr(cosine, 49) > lr(cosine, 50) == pytest.approx(1e-4)
    assert lr(constant, 3) == pytest.approx(5e-4 * 4 / 8)
    assert lr(constant, 40) == 5e-4
    assert lr(inv_sqrt, 15) == pytest.approx(7e-4)  # peak at update 16 (1-based)
    assert lr(inv_sqrt, 63) == pytest.approx(7e-4 * math.sqrt(16 / 64))  # 1/sqrt(step) decay
    assert lr(inv_sqrt, 3) == pytest.approx(7e-4 * 4 / 16)


# --------------------------------------------------------------------------- weight decay mask

@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("decay_embeddings", [True, False])
def test_weight_decay_mask_is_the_same_on_both_sides(family, decay_embeddings):
    config = TrainConfig(decay_embeddings=decay_embeddings)
    model_cfg = model_config(family, "tiny")
    torch_mask = to.weight_decay_mask(torch_build(family, model_cfg, 0), config)
    jax_model = convert.abstract_model(lambda: MODELS[family](model_cfg, rngs=nnx.Rngs(0)))
    graphdef, params, rest = nnx.split(jax_model, nnx.Param, ...)
    # The JAX mask, read out under the torch keys through convert's own layout.
    flags = jax.tree.map(lambda v: np.asarray(v, np.float32),
                         jo.weight_decay_mask(params, config))
    jax_mask = {k: bool(v.all()) for k, v in convert.nnx_to_torch(
        nnx.merge(graphdef, flags, rest)).items()}
    assert jax_mask == torch_mask
    for key, decayed in torch_mask.items():
        if key.endswith("bias") or "norm" in key:
            assert not decayed, key  # biases and LayerNorm never
        elif "embedding" in key:
            assert decayed == decay_embeddings, key
        else:
            assert decayed, key


# ------------------------------------------------------------------------------------ clipping

@pytest.mark.parametrize("clip", [0.0, 0.5, 100.0])
def test_clipping_matches_torch_clip_grad_norm(clip):
    rng = np.random.RandomState(8)
    grads = [rng.randn(*shape).astype(np.float32) for shape in [(4, 5), (5,), (3, 2, 2)]]
    norm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
    clipped_j, norm_j = jo.clip_by_global_norm([jnp.asarray(g) for g in grads], clip)
    tensors = [torch.tensor(g) for g in grads]
    clipped_t, norm_t = to.clip_by_global_norm(tensors, clip)
    # torch's own function, on parameters carrying the same gradients
    params = [torch.nn.Parameter(torch.zeros_like(t)) for t in tensors]
    for p, g in zip(params, grads):
        p.grad = torch.tensor(g)
    if clip:
        torch.nn.utils.clip_grad_norm_(params, clip)
    for g, a, b, p in zip(grads, clipped_j, clipped_t, params):
        np.testing.assert_allclose(np.asarray(a), b.numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(b.numpy(), p.grad.numpy(), rtol=1e-6, atol=1e-7)
        if clip == 0.5:
            np.testing.assert_allclose(b.numpy(), g * 0.5 / (norm + 1e-6), rtol=1e-6)
        elif clip == 100.0:  # below the threshold: multiplied by exactly 1
            np.testing.assert_array_equal(b.numpy(), g)
    assert float(norm_j) == pytest.approx(norm, rel=1e-6)
    assert float(norm_t) == pytest.approx(norm, rel=1e-6)
