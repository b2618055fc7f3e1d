"""``jaxformer.nn.dropout``: the masks drawn in one pass are JAX's own, bit for bit.

The CPU path writes Threefry-2x32 out as elementwise operations instead of JAX's lowering (a loop
over the rounds); a run must draw exactly the masks ``nnx.Dropout`` draws, or a checkpointed run
resumed by another version would train differently. Checked against ``jax.random.bits``,
``jax.random.bernoulli`` and ``nnx.Dropout`` itself (same seeds, successive calls, every rate a
model uses), with the path on and off; the fallbacks (another key implementation, a broadcast
mask, call-time arguments) are ``nnx.Dropout``'s behaviour; and the compiled mask is one pass
(no loop), which is what the module is for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer import runtime
from jaxformer.nn import dropout as jd
from jaxformer.training.step import build_model
from parity_tests.support.helpers import JIT_TOL, max_rel_diff

SHAPES = [(1,), (7,), (2, 3), (4, 5, 6), (2, 3, 16, 16), (1000, 3)]


def keys():
    base = jax.random.key(0)
    return [base, jax.random.fold_in(base, 1), jax.random.split(jax.random.key(2**31 - 1))[1],
            jax.random.key(123456789)]


@pytest.mark.parametrize("shape", SHAPES)
def test_random_bits_are_jax_random_bits(shape):
    draw = jax.jit(jd.random_bits, static_argnums=1)
    for key in keys():
        np.testing.assert_array_equal(np.asarray(draw(key, shape)),
                                      np.asarray(jax.random.bits(key, shape)))


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.8, 0.9, 1.0 - 1e-7, 1.0])
def test_bernoulli_is_jax_random_bernoulli(p):
    draw = jax.jit(jd.bernoulli, static_argnums=(1, 2))
    for key in keys():
        got = np.asarray(draw(key, p, (64, 33)))
        np.testing.assert_array_equal(got, np.asarray(jax.random.bernoulli(key, p, (64, 33))))


def test_threefry_matches_the_published_known_answer():
    """Threefry-2x32 with 20 rounds against the hash's published known-answer vectors: key and
    counter all zeros, and all ones (0xFFFFFFFF)."""
    zero, ones = np.uint32(0), np.uint32(0xFFFFFFFF)
    for word, expected in ((zero, (0x6B200159, 0x99BA4EFE)), (ones, (0x1CB996FC, 0xBB002BE7))):
        x = jnp.full((1,), word, jnp.uint32)
        got = jd.threefry2x32((word, word), x, x)
        assert (int(got[0][0]), int(got[1][0])) == expected


def test_reproducible_only_for_partitionable_threefry_keys():
    assert jd.reproducible(jax.random.key(0))
    assert not jd.reproducible(jax.random.key(0, impl="rbg"))
    assert not jd.reproducible(jax.random.split(jax.random.key(0)))  # a batch of keys
    with jax.threefry_partitionable(False):
        assert not jd.reproducible(jax.random.key(0))


def test_random_bits_refuses_2_to_the_32_values():
    with pytest.raises(ValueError, match="fewer than 2\\*\\*32"):
        jax.eval_shape(lambda k: jd.random_bits(k, (2**16, 2**16)), jax.random.key(0))


def masks(module, x, calls: int = 3):
    """The outputs of ``calls`` successive training-mode calls (each draws a new mask)."""
    return [np.asarray(module(x)) for _ in range(calls)]


@pytest.mark.parametrize("switch", ["1", "0"])
@pytest.mark.parametrize("rate", [0.1, 0.2, 0.5, 0.9])
def test_dropout_draws_nnx_dropouts_masks(monkeypatch, switch, rate):
    monkeypatch.setenv("JAXFORMER_CPU_DROPOUT_MASKS", switch)
    assert runtime.cpu_dropout_masks() is (switch == "1")
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 17, 24)), jnp.float32)
    ours, theirs = jd.Dropout(rate, rngs=nnx.Rngs(7)), nnx.Dropout(rate, rngs=nnx.Rngs(7))
    for got, want in zip(masks(ours, x), masks(theirs, x), strict=True):
        np.testing.assert_array_equal(got, want)
    # and under jit, as a training step calls it: the stream advances the same way
    ours, theirs = jd.Dropout(rate, rngs=nnx.Rngs(8)), nnx.Dropout(rate, rngs=nnx.Rngs(8))
    call = nnx.jit(lambda module, x: module(x))
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(call(ours, x)), np.asarray(call(theirs, x)))


@pytest.mark.parametrize("case", ["rbg key", "broadcast dims", "call-time key",
                                  "call-time deterministic", "deterministic", "rate 0", "rate 1"])
def test_dropout_falls_back_to_nnx_dropout(monkeypatch, case):
    monkeypatch.setenv("JAXFORMER_CPU_DROPOUT_MASKS", "1")
    x = jnp.asarray(np.random.default_rng(1).standard_normal((4, 9)), jnp.float32)
    kwargs: dict = {}
    rngs = (lambda: nnx.Rngs(jax.random.key(3, impl="rbg"))) if case == "rbg key" \
        else (lambda: nnx.Rngs(3))
    rate = {"rate 0": 0.0, "rate 1": 1.0}.get(case, 0.3)
    build = {"broadcast dims": {"broadcast_dims": (0,)},
             "deterministic": {"deterministic": True}}.get(case, {})
    if case == "call-time key":
        kwargs = {"rngs": jax.random.key(11)}
    if case == "call-time deterministic":
        kwargs = {"deterministic": True}
    ours = jd.Dropout(rate, rngs=rngs(), **build)
    theirs = nnx.Dropout(rate, rngs=rngs(), **build)
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(ours(x, **kwargs)),
                                      np.asarray(theirs(x, **kwargs)))


def test_a_models_training_outputs_are_the_same_either_way(monkeypatch):
    """A tiny GPT with dropout 0.1, three training-mode forward passes: the same outputs with the
    one-pass masks and with JAX's own draw. The masks are the same bit for bit (above); the two
    programs are compiled apart, so XLA may fuse the scaling into other loops and round a last
    bit differently (seen: 1 ulp in 5% of the logits), hence JIT_TOL; another mask would move
    the outputs by about 0.1."""
    from jaxformer.config import GPTConfig

    config = GPTConfig.tiny()
    ids = np.random.default_rng(2).integers(0, config.vocab_size, (2, 16))
    outputs = {}
    for switch in ("1", "0"):
        monkeypatch.setenv("JAXFORMER_CPU_DROPOUT_MASKS", switch)
        model = build_model("gpt", config, 0)
        model.train()
        step = nnx.jit(lambda m, ids: m(ids))
        outputs[switch] = [np.asarray(step(model, ids)) for _ in range(3)]
    # measured (2026-11-29, AVX-512 EPYC; default, capped to AVX2 and to AVX, 2 threads and one
    # core): at most 8.9e-8 (0.09 of JIT_TOL) between the two draws of the same masks, at least
    # 0.26 (260 times the floor below) between two calls' different masks
    for got, want in zip(outputs["1"], outputs["0"], strict=True):
        assert max_rel_diff(want, got) <= JIT_TOL
    assert max_rel_diff(outputs["1"][0], outputs["1"][1]) > 1e-3  # each call drew a new mask


def test_the_mask_is_drawn_in_one_pass(monkeypatch):
    """What the module is for: the compiled dropout has no loop (JAX's CPU lowering of Threefry
    is a while loop over its rounds, each trip a pass over the array)."""
    monkeypatch.setenv("JAXFORMER_CPU_DROPOUT_MASKS", "1")
    module = jd.Dropout(0.1, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(module)

    def call(state, x):
        return nnx.merge(graphdef, state)(x)

    x = jnp.ones((8, 128), jnp.float32)
    text = jax.jit(call).lower(state, x).compile().as_text()
    loops = [line for line in text.splitlines() if " while(" in line]
    # the key's own derivation (RngStream: a fold-in of one counter) may loop over four words;
    # no loop may carry mask-sized arrays (JAX's lowering carries the two counter words, 1024
    # each here)
    assert loops == [] or all("1024]" not in line and "8,128]" not in line for line in loops)
    monkeypatch.setenv("JAXFORMER_CPU_DROPOUT_MASKS", "0")  # the check can see such a loop
    text = jax.jit(lambda state, x: call(state, x)).lower(state, x).compile().as_text()
    assert any("1024]" in line or "8,128]" in line
               for line in text.splitlines() if " while(" in line)
