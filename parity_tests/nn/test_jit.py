"""``jaxformer.nn.jit.jitted``: the one split-once / ``jax.jit`` idiom of the package."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer.config import GPTConfig
from jaxformer.models.gpt import GPT
from jaxformer.nn.jit import jitted
from parity_tests.support.helpers import JIT_TOL, max_rel_diff

CONFIG = dataclasses.replace(GPTConfig.tiny(), dropout_rate=0.3, attention_dropout_rate=0.3)
IDS = jnp.array([[5, 6, 7, 8, 9], [1, 2, 3, 4, 0]])
MASK = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])


def test_eval_equals_eager_and_methods_and_fn():
    model = GPT(CONFIG, rngs=nnx.Rngs(0))
    model.eval()
    assert max_rel_diff(model(IDS, MASK), jitted(model)(IDS, MASK)) <= JIT_TOL
    hidden = jitted(model, "hidden_states")(IDS, MASK)
    assert max_rel_diff(model.hidden_states(IDS, MASK), hidden) <= JIT_TOL
    total = jitted(model, fn=lambda m, ids: m(ids).sum())(IDS)
    assert abs(float(total) - float(model(IDS).sum())) <= JIT_TOL * abs(float(total))
    with pytest.raises(ValueError, match="method or fn"):
        jitted(model, "hidden_states", fn=lambda m: m)


def test_train_mode_draws_a_fresh_dropout_mask_each_call():
    """The trap of a pure function that drops the returned state: the same RNG counters every
    call, hence the same dropout mask. ``jitted`` carries them, as eager calls do."""
    model = GPT(CONFIG, rngs=nnx.Rngs(0))
    model.train()
    forward = jitted(model)
    first, second = np.asarray(forward(IDS)), np.asarray(forward(IDS))
    assert not np.allclose(first, second)
    # The same draws as eager calls of an identically seeded module.
    eager = GPT(CONFIG, rngs=nnx.Rngs(0))
    eager.train()
    assert max_rel_diff(eager(IDS), first) <= JIT_TOL
    assert max_rel_diff(eager(IDS), second) <= JIT_TOL


def test_sync_writes_the_rng_state_back():
    model = GPT(CONFIG, rngs=nnx.Rngs(0))
    model.train()
    forward = jitted(model)
    forward(IDS)
    after_one = np.asarray(forward.sync()(IDS))  # eager call continues from the carried state
    assert not np.allclose(after_one, np.asarray(jitted(model)(IDS)))
    twin = GPT(CONFIG, rngs=nnx.Rngs(0))
    twin.train()
    twin(IDS)
    assert max_rel_diff(twin(IDS), after_one) <= JIT_TOL


def test_lower_compiles_and_reports_cost():
    model = GPT(CONFIG, rngs=nnx.Rngs(0))
    model.eval()
    compiled = jitted(model).lower(IDS).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    assert cost["flops"] > 0


def test_checked_mode_raises_on_an_out_of_range_id_inside_jit():
    model = GPT(CONFIG, rngs=nnx.Rngs(0))
    model.eval()
    checked = jitted(model, checked=True)
    assert checked(IDS).shape == (2, 5, CONFIG.vocab_size)
    for bad in (-1, CONFIG.vocab_size):
        with pytest.raises(Exception, match="out-of-bounds indexing"):
            checked(IDS.at[0, 2].set(bad))
