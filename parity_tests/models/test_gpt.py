"""GPT parity: jaxformer/gpt.py against its twin torch_ref/gpt.py, and against references nobody
here wrote (torch SDPA with ``is_causal=True``).

Weights are drawn by ``randomize`` at a scale where every sub-layer matters (LayerNorm scales and
biases off their 1/0 init, logits of order 10), so a 1e-5 scale-relative bound has teeth.
Mask kinds: ``none`` (attention_mask=None), ``causal_only`` (an all-ones [batch, seq] mask: only
the causal mask is in effect), right and left padding, and a fully padded row. Outputs are
compared at real query rows, except in the test dedicated to the fully padded row.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

from jaxformer.checkpoints import convert
from jaxformer.config import GPTConfig
from jaxformer.models import gpt as jgpt
from jaxformer.nn import layers as jlayers
from parity_tests.support.helpers import (
    GRAD_RTOL,
    JIT_TOL,
    assert_close,
    make_attention_mask,
    max_rel_diff,
    to_numpy,
    twin_pair,
)
from torch_ref.models import gpt as tgpt
from torch_ref.nn import layers as tlayers

TINY = GPTConfig.tiny()  # GPT-2 layout: pre-LN, final LN, tied head, tanh GELU
SIMPLE_TINY = dataclasses.replace(  # seed 004 layout: post-LN, embedding LN, exact GELU, untied
    GPTConfig.simple_gpt(), vocab_size=101, hidden_size=32, num_layers=2, num_heads=4,
    intermediate_size=37, max_position_embeddings=64)
RELU_TINY = dataclasses.replace(  # the remaining switches: ReLU, pre-LN + embedding LN, untied
    TINY, activation="relu", embedding_layer_norm=True, final_layer_norm=False,
    tie_word_embeddings=False)
CONFIGS = {"gpt2_tiny": TINY, "simple_gpt_tiny": SIMPLE_TINY, "relu_untied_tiny": RELU_TINY}
GPT_MASK_KINDS = ("none", "causal_only", "right_padding", "left_padding", "fully_padded_row")
B, T = 3, 8  # one shape nearly everywhere: each new shape costs a compilation


# ----------------------------------------------------------------------------- helpers

def make_pair(torch_cls, jax_cls, config, seed: int = 0):
    """Torch module with randomized weights and its NNX twin loaded from them, both in eval."""
    return twin_pair(torch_cls, jax_cls, config, seed, randomized=True)


@functools.cache
def gpt_pair(config_name: str):
    """Cached (read-only) model pair; tests that change a model build their own."""
    return make_pair(tgpt.GPT, jgpt.GPT, CONFIGS[config_name])


@functools.partial(jax.jit, static_argnums=(0, 1))
def _jit_apply(graphdef, method, state, *args):
    return getattr(nnx.merge(graphdef, state), method)(*args)


def jax_apply(module, *args, method: str = "__call__"):
    """``getattr(module, method)(*args)`` through ``nnx.split`` + ``jax.jit``.

    Eager NNX compiles every primitive separately for each new shape (seconds per forward on
    CPU); one jitted program per (structure, method, shapes) keeps the suite fast. Jit vs eager
    is checked by ``test_jit_matches_eager``; value checks of the inputs (ids in range) need
    concrete arrays, so the bad-input tests call the models eagerly.
    """
    graphdef, state = nnx.split(module)
    return _jit_apply(graphdef, method, state, *args)


@functools.partial(jax.jit, static_argnums=0)
def _gpt_outputs(graphdef, state, ids, mask):
    model = nnx.merge(graphdef, state)
    hidden = model.hidden_states(ids, mask)
    return hidden, model.logits(hidden), model(ids, mask)


def gpt_outputs(jax_model, ids, mask=None):
    """``(hidden_states, logits(hidden_states), __call__)`` of a jaxformer GPT, one program."""
    graphdef, state = nnx.split(jax_model)
    return _gpt_outputs(graphdef, state, jnp.asarray(ids),
                        None if mask is None else jnp.asarray(mask))


def jax_gpt(jax_model, ids, mask=None) -> np.ndarray:
    return np.asarray(gpt_outputs(jax_model, ids, mask)[2])


def random_ids(rng, config, batch, seq):
    return rng.randint(0, config.vocab_size, size=(batch, seq)).astype(np.int64)


def gpt_mask(kind: str, batch: int, seq: int):
    if kind == "causal_only":
        return np.ones((batch, seq), dtype=np.int64)
    return make_attention_mask(kind, batch, seq)


def real_rows(mask, batch: int, seq: int) -> np.ndarray:
    return np.ones((batch, seq), bool) if mask is None else np.asarray(mask).astype(bool)


def run_both(torch_model, jax_model, ids, mask):
    """Logits of both models."""
    with torch.no_grad():
        t_logits = torch_model(torch.tensor(ids), None if mask is None else torch.tensor(mask))
    return t_logits, jax_gpt(jax_model, ids, mask)


# ----------------------------------------------------------------------------- masks, positions

def test_position_ids_follow_real_tokens():
    mask = np.array([[1, 1, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    expected = np.array([[0, 1, 2, 3], [0, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(np.asarray(jgpt.position_ids_from_mask(jnp.asarray(mask))),
                                  expected)
    np.testing.assert_array_equal(tgpt.position_ids_from_mask(torch.tensor(mask)).numpy(),
                                  expected)


@pytest.mark.parametrize("kind", GPT_MASK_KINDS)
def test_attention_mask_4d_is_causal_and_padding(kind):
    mask = gpt_mask(kind, B, T)
    j = np.asarray(jgpt.attention_mask_4d(None if mask is None else jnp.asarray(mask), T))
    t = tgpt.attention_mask_4d(None if mask is None else torch.tensor(mask), T).numpy()
    np.testing.assert_array_equal(j, t)
    expected = np.tril(np.ones((T, T), bool))[None, None]
    if mask is not None:
        expected = expected & mask.astype(bool)[:, None, None, :]
    np.testing.assert_array_equal(np.broadcast_to(j, expected.shape), expected)


# ----------------------------------------------------------------------------- layer parity

@pytest.mark.parametrize("config_name", ["gpt2_tiny", "simple_gpt_tiny"])
@pytest.mark.parametrize("kind", ["none", "left_padding", "right_padding"])
def test_embeddings_parity(config_name, kind, rng):
    config = CONFIGS[config_name]
    t_emb, j_emb = make_pair(tgpt.GPTEmbeddings, jgpt.GPTEmbeddings, config, seed=3)
    ids = random_ids(rng, config, B, T)
    mask = gpt_mask(kind, B, T)
    if mask is None:
        t_pos, j_pos = None, None
    else:
        t_pos = tgpt.position_ids_from_mask(torch.tensor(mask))
        j_pos = jgpt.position_ids_from_mask(jnp.asarray(mask))
    with torch.no_grad():
        expected = t_emb(torch.tensor(ids), t_pos)
    assert_close(expected, jax_apply(j_emb, jnp.asarray(ids), j_pos), what="embeddings")


@pytest.mark.parametrize("pre_norm", [True, False], ids=["pre_ln", "post_ln"])
@pytest.mark.parametrize("kind", GPT_MASK_KINDS)
def test_block_parity(pre_norm, kind, rng):
    config = dataclasses.replace(TINY, pre_norm=pre_norm)
    t_block, j_block = make_pair(tlayers.TransformerBlock, jlayers.TransformerBlock, config, 5)
    x = rng.randn(B, T, config.hidden_size).astype(np.float32)
    mask = gpt_mask(kind, B, T)
    t_mask = tgpt.attention_mask_4d(None if mask is None else torch.tensor(mask), T)
    j_mask = jgpt.attention_mask_4d(None if mask is None else jnp.asarray(mask), T)
    with torch.no_grad():
        expected = t_block(torch.tensor(x), t_mask)
    assert_close(expected, jax_apply(j_block, jnp.asarray(x), j_mask),
                 where=real_rows(mask, B, T), what=f"block (pre_norm={pre_norm}, {kind})")


# ----------------------------------------------------------------------------- model parity

@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("kind", GPT_MASK_KINDS)
def test_model_parity(config_name, kind, rng):
    torch_model, jax_model = gpt_pair(config_name)
    ids = random_ids(rng, CONFIGS[config_name], B, T)
    mask = gpt_mask(kind, B, T)
    where = real_rows(mask, B, T)
    t_mask = None if mask is None else torch.tensor(mask)
    with torch.no_grad():
        t_hidden = torch_model.hidden_states(torch.tensor(ids), t_mask)
        t_logits = torch_model(torch.tensor(ids), t_mask)
    j_hidden, _, j_logits = gpt_outputs(jax_model, ids, mask)
    assert_close(t_hidden, j_hidden, where=where, what="hidden_states")
    assert j_logits.shape == (B, T, CONFIGS[config_name].vocab_size)
    assert float(np.abs(to_numpy(t_logits)).max()) > 1.0  # the bound is not trivially met
    assert_close(t_logits, j_logits, where=where, what=f"logits ({config_name}, {kind})")


@pytest.mark.usefixtures("scan_layers")
@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (4, 16)])
def test_model_parity_shapes(batch, seq, rng):
    """Other batch and sequence sizes, down to a single token, with left padding."""
    torch_model, jax_model = gpt_pair("gpt2_tiny")
    ids = random_ids(rng, TINY, batch, seq)
    mask = gpt_mask("left_padding", batch, seq)
    t_logits, j_logits = run_both(torch_model, jax_model, ids, mask)
    assert j_logits.shape == (batch, seq, TINY.vocab_size)
    assert_close(t_logits, j_logits, where=real_rows(mask, batch, seq), what="logits")


@pytest.mark.parametrize("config_name", ["gpt2_tiny", "simple_gpt_tiny"])
def test_fully_padded_row_is_finite_and_equal(config_name, rng):
    """A row with no real token: every query sees no key, so attention is uniform over all keys
    (masks.py). Meaningless, but finite and identical in both frameworks, on every row."""
    torch_model, jax_model = gpt_pair(config_name)
    ids = random_ids(rng, CONFIGS[config_name], B, T)
    mask = gpt_mask("fully_padded_row", B, T)
    t_logits, j_logits = run_both(torch_model, jax_model, ids, mask)
    assert np.isfinite(to_numpy(t_logits)).all()
    assert np.isfinite(to_numpy(j_logits)).all()
    assert_close(t_logits, j_logits, what="logits, every row including the fully padded one")


@pytest.mark.parametrize("config_name", ["gpt2_tiny", "simple_gpt_tiny"])
def test_call_is_head_of_hidden_states(config_name, rng):
    torch_model, jax_model = gpt_pair(config_name)
    ids = random_ids(rng, CONFIGS[config_name], B, T)
    with torch.no_grad():
        torch.testing.assert_close(torch_model(torch.tensor(ids)),
                                   torch_model.logits(torch_model.hidden_states(torch.tensor(ids))),
                                   rtol=0, atol=0)
    hidden, head_of_hidden, logits = gpt_outputs(jax_model, ids)
    assert hidden.shape == (B, T, CONFIGS[config_name].hidden_size)
    assert_close(logits, head_of_hidden, tol=JIT_TOL, what="__call__ vs logits(hidden_states)")


def test_jit_matches_eager(rng):
    """One eager forward (slow on CPU: every primitive compiles alone) against the jitted one."""
    _, jax_model = gpt_pair("gpt2_tiny")
    ids = jnp.asarray(random_ids(rng, TINY, B, T))
    mask = jnp.asarray(gpt_mask("left_padding", B, T))
    graphdef, state = nnx.split(jax_model)

    @jax.jit
    def forward(state, ids, mask):
        return nnx.merge(graphdef, state)(ids, mask)

    assert_close(jax_model(ids, mask), forward(state, ids, mask), tol=JIT_TOL, what="jit")
    assert_close(jax_model(ids), forward(state, ids, None), tol=JIT_TOL, what="jit, no mask")


# ----------------------------------------------------------------------------- properties

@given(data=st.data())
def test_parity_property(data):
    """Any tokens and any per-row left/right padding (down to empty rows): parity at real rows.

    The shape is fixed at (B, T) so that hypothesis explores masks, not compilations; shapes
    vary in the parametrised tests."""
    batch, seq = B, T
    torch_model, jax_model = gpt_pair("gpt2_tiny")
    ids = np.array(data.draw(st.lists(st.lists(st.integers(0, TINY.vocab_size - 1),
                                               min_size=seq, max_size=seq),
                                      min_size=batch, max_size=batch)), dtype=np.int64)
    mask = np.ones((batch, seq), np.int64)
    for b in range(batch):
        length = data.draw(st.integers(0, seq))
        if data.draw(st.booleans()):
            mask[b, : seq - length] = 0
        else:
            mask[b, length:] = 0
    t_logits, j_logits = run_both(torch_model, jax_model, ids, mask)
    assert np.isfinite(np.asarray(j_logits)).all()
    assert_close(t_logits, j_logits, where=mask.astype(bool), what="logits")


@given(lengths=st.lists(st.integers(1, T), min_size=B, max_size=B), seed=st.integers(0, 2**16))
def test_left_padding_invariance_property(lengths, seed):
    """Left-padded prompts of any lengths give, at their real positions, the logits of the same
    prompts unpadded. To keep one shape, an unpadded prompt is run at length T followed by junk
    and no mask; by causality (tested below, exactly) its first positions are the prompt's own
    logits. ``test_left_padding_invariance`` runs a prompt truly alone."""
    _, jax_model = gpt_pair("simple_gpt_tiny")
    rng = np.random.RandomState(seed)
    prompts = random_ids(rng, SIMPLE_TINY, B, T)  # row b: prompt = prompts[b, :lengths[b]]
    padded = random_ids(rng, SIMPLE_TINY, B, T)  # junk where padded
    mask = np.zeros((B, T), np.int64)
    for b, length in enumerate(lengths):
        padded[b, T - length:] = prompts[b, :length]
        mask[b, T - length:] = 1
    unpadded = jax_gpt(jax_model, prompts)
    batched = jax_gpt(jax_model, padded, mask)
    for b, length in enumerate(lengths):
        assert_close(unpadded[b, :length], batched[b, T - length:],
                     what=f"row {b}: left-padded vs unpadded logits")


# ----------------------------------------------------------------------------- behaviour

@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("config_name", ["gpt2_tiny", "simple_gpt_tiny"])
def test_left_padding_invariance(framework, config_name, rng):
    """Batched prompts for generation: row 1 is a shorter prompt, left-padded with junk tokens."""
    config = CONFIGS[config_name]
    torch_model, jax_model = gpt_pair(config_name)
    L = 5
    ids = random_ids(rng, config, B, T)
    mask = np.ones((B, T), np.int64)
    mask[1, : T - L] = 0
    prompt = ids[1:2, T - L:]
    if framework == "jax":
        batched, alone = jax_gpt(jax_model, ids, mask), jax_gpt(jax_model, prompt)
        full = jax_gpt(jax_model, ids)
    else:
        with torch.no_grad():
            batched = torch_model(torch.tensor(ids), torch.tensor(mask)).numpy()
            alone = torch_model(torch.tensor(prompt)).numpy()
            full = torch_model(torch.tensor(ids)).numpy()
    assert_close(alone, batched[1:2, T - L:], what="left-padded row vs the prompt alone")
    assert_close(full[[0, 2]], batched[[0, 2]], what="unpadded rows, mask of ones vs no mask")


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("config_name", ["gpt2_tiny", "simple_gpt_tiny"])
def test_causality(framework, config_name, rng):
    """Changing the tokens after position t leaves the logits up to t unchanged (and only those)."""
    config = CONFIGS[config_name]
    torch_model, jax_model = gpt_pair(config_name)
    t = 4
    ids = random_ids(rng, config, B, T)
    changed = ids.copy()
    shift = rng.randint(1, config.vocab_size, size=(B, T - t - 1))  # never 0 mod vocab_size
    changed[:, t + 1:] = (ids[:, t + 1:] + shift) % config.vocab_size
    if framework == "jax":
        a, b = jax_gpt(jax_model, ids), jax_gpt(jax_model, changed)
    else:
        with torch.no_grad():
            a = torch_model(torch.tensor(ids)).numpy()
            b = torch_model(torch.tensor(changed)).numpy()
    np.testing.assert_allclose(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)
    assert np.abs(a[:, t + 1:] - b[:, t + 1:]).max() > 1e-2  # the test can see a change


def sdpa_reference_logits(state_dict, config: GPTConfig, ids: torch.Tensor) -> torch.Tensor:
    """A GPT forward from torch primitives, attention by SDPA(is_causal=True), math backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sd, nh = state_dict, config.num_heads
    batch, seq = ids.shape
    act = {"gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
           "relu": F.relu}[config.activation]

    def ln(x, prefix):
        return F.layer_norm(x, (config.hidden_size,), sd[prefix + ".weight"],
                            sd[prefix + ".bias"], config.layer_norm_eps)

    def lin(x, prefix):
        return F.linear(x, sd[prefix + ".weight"], sd.get(prefix + ".bias"))

    def attn(x, p):
        q, k, v = (lin(x, f"{p}.attention.{n}").view(batch, seq, nh, -1).transpose(1, 2)
                   for n in ("query", "key", "value"))
        with sdpa_kernel(SDPBackend.MATH):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return lin(y.transpose(1, 2).reshape(batch, seq, -1), f"{p}.attention.output")

    def ffn(x, p):
        return lin(act(lin(x, f"{p}.feed_forward.fc1")), f"{p}.feed_forward.fc2")

    x = (sd["embeddings.word_embeddings.weight"][ids]
         + sd["embeddings.position_embeddings.weight"][:seq])
    if config.embedding_layer_norm:
        x = ln(x, "embeddings.layer_norm")
    for i in range(config.num_layers):
        p = f"blocks.{i}"
        if config.pre_norm:
            x = x + attn(ln(x, f"{p}.attention_norm"), p)
            x = x + ffn(ln(x, f"{p}.ffn_norm"), p)
        else:
            x = ln(x + attn(x, p), f"{p}.attention_norm")
            x = ln(x + ffn(x, p), f"{p}.ffn_norm")
    if config.final_layer_norm:
        x = ln(x, "final_layer_norm")
    head = sd["embeddings.word_embeddings.weight" if config.tie_word_embeddings else
              "lm_head.weight"]
    return F.linear(x, head)


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_against_sdpa_causal_reference(config_name, rng):
    torch_model, jax_model = gpt_pair(config_name)
    config = CONFIGS[config_name]
    ids = random_ids(rng, config, B, T)
    with torch.no_grad():
        expected = sdpa_reference_logits(torch_model.state_dict(), config, torch.tensor(ids))
    t_logits, j_logits = run_both(torch_model, jax_model, ids, None)
    assert_close(expected, j_logits, what="jaxformer vs SDPA(is_causal) reference")
    assert_close(expected, t_logits, what="torch_ref vs SDPA(is_causal) reference")


def test_causal_attention_against_sdpa(rng):
    """The attention sub-layer alone, under the mask GPT builds, vs SDPA(is_causal=True)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    t_attn, j_attn = make_pair(tlayers.MultiHeadAttention, jlayers.MultiHeadAttention, TINY, 7)
    nh = TINY.num_heads
    x = rng.randn(B, T, TINY.hidden_size).astype(np.float32)
    xt = torch.tensor(x)
    with torch.no_grad():
        q, k, v = (getattr(t_attn, n)(xt).view(B, T, nh, -1).transpose(1, 2)
                   for n in ("query", "key", "value"))
        with sdpa_kernel(SDPBackend.MATH):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        expected = t_attn.output(y.transpose(1, 2).reshape(B, T, -1))
    for implementation in ("xla", "einsum"):
        j_attn.implementation = implementation
        actual = jax_apply(j_attn, jnp.asarray(x), None, jgpt.attention_mask_4d(None, T))
        assert_close(expected, actual, what=f"causal attention ({implementation})")


# ----------------------------------------------------------------------------- gradients

def next_token_loss_np_weights(ids, mask):
    """Targets ids[:, 1:], weighted by whether both the input and the target are real."""
    w = np.ones_like(ids[:, 1:], dtype=np.float32) if mask is None else \
        (mask[:, :-1] * mask[:, 1:]).astype(np.float32)
    return ids[:, 1:], w


@pytest.mark.usefixtures("scan_layers")
@pytest.mark.parametrize(("config_name", "kind"), [("gpt2_tiny", "none"),
                                              ("simple_gpt_tiny", "left_padding")])
def test_gradients_match(config_name, kind, rng):
    """jax.grad vs torch backward of a next-token cross-entropy, every parameter. (Each case
    compiles a backward pass; left padding keeps full rows, so it covers the unpadded case.)"""
    config = CONFIGS[config_name]
    torch_model, jax_model = make_pair(tgpt.GPT, jgpt.GPT, config, seed=11)
    ids = random_ids(rng, config, B, T)
    mask = gpt_mask(kind, B, T)
    targets, weights = next_token_loss_np_weights(ids, mask)

    logits = torch_model(torch.tensor(ids), None if mask is None else torch.tensor(mask))
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, config.vocab_size),
                          torch.tensor(targets).reshape(-1), reduction="none")
    w = torch.tensor(weights).reshape(-1)
    t_loss = (nll * w).sum() / w.sum()
    t_loss.backward()

    graphdef, params, rest = nnx.split(jax_model, nnx.Param, ...)

    def loss_fn(params):
        model = nnx.merge(graphdef, params, rest)
        out = model(jnp.asarray(ids), None if mask is None else jnp.asarray(mask))
        logp = jax.nn.log_softmax(out[:, :-1], axis=-1)
        nll = -jnp.take_along_axis(logp, jnp.asarray(targets)[..., None], axis=-1)[..., 0]
        return (nll * weights).sum() / weights.sum()

    j_loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    assert_close(t_loss, j_loss, what="loss")
    j_grads = convert.nnx_to_torch(nnx.merge(graphdef, grads, rest))
    t_grads = {k: p.grad for k, p in torch_model.named_parameters()}
    assert j_grads.keys() == t_grads.keys()
    for key, t_grad in t_grads.items():
        expected, actual = to_numpy(t_grad), np.asarray(j_grads[key])
        if key.endswith("attention.key.bias"):
            # Softmax is shift-invariant along the keys and q.b_k is the same shift for every
            # key: this gradient is exactly 0 in exact arithmetic, round-off in both frameworks.
            # Held to 1e-5 of the query bias gradient, the scale it would otherwise have.
            scale = float(np.abs(to_numpy(t_grads[key.replace("key", "query")])).max())
            assert max(np.abs(expected).max(), np.abs(actual).max()) <= GRAD_RTOL * scale, key
            continue
        scale = float(np.abs(expected).max())
        assert scale > 0, f"{key}: zero gradient"
        diff = float(np.abs(expected - actual).max()) / scale
        assert diff <= GRAD_RTOL, f"grad {key}: max abs diff {diff:.3g} of its scale > {GRAD_RTOL}"


# ----------------------------------------------------------------------------- conversion

@pytest.mark.usefixtures("scan_layers")
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_conversion_round_trip_bit_identical(config_name):
    config = CONFIGS[config_name]
    torch_model, jax_model = gpt_pair(config_name)
    state_dict = torch_model.state_dict()
    back = convert.nnx_to_torch(jax_model)
    assert back.keys() == state_dict.keys()
    for key, value in state_dict.items():
        assert back[key].dtype == np.float32
        np.testing.assert_array_equal(back[key], value.numpy(), err_msg=key)
    fresh = tgpt.GPT(config)
    fresh.load_state_dict({k: torch.tensor(v) for k, v in back.items()}, strict=True)
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, state_dict[key]), key


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_state_dict_layout(config_name):
    """The names the Hugging Face import relies on; optional parts exist iff the config says."""
    config = CONFIGS[config_name]
    keys = set(tgpt.GPT(config).state_dict())
    assert {"embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
            "blocks.0.attention.query.weight", "blocks.0.attention.output.bias",
            "blocks.0.attention_norm.weight", "blocks.0.ffn_norm.bias",
            "blocks.0.feed_forward.fc1.weight", "blocks.0.feed_forward.fc2.bias"} <= keys
    assert ("lm_head.weight" in keys) == (not config.tie_word_embeddings)
    assert "lm_head.bias" not in keys
    assert ("final_layer_norm.weight" in keys) == config.final_layer_norm
    assert ("embeddings.layer_norm.weight" in keys) == config.embedding_layer_norm
    assert f"blocks.{config.num_layers - 1}.ffn_norm.weight" in keys
    jax_keys = set(convert.nnx_to_torch(jgpt.GPT(config, rngs=nnx.Rngs(0))))
    assert jax_keys == keys


def test_tied_and_untied_do_not_load_into_each_other():
    untied = tgpt.GPT(dataclasses.replace(TINY, tie_word_embeddings=False))
    with pytest.raises(convert.StateDictMismatchError, match=r"unexpected keys.*lm_head\.weight"):
        convert.torch_to_nnx(untied.state_dict(), jgpt.GPT(TINY, rngs=nnx.Rngs(0)))


# ----------------------------------------------------------------------------- seed 004

def test_seed_004_example():
    """Seed 004's usage: SimpleGPTModel(vocab 1000, hidden 128, 4 heads, 2 layers, d_ff 256),
    batch 2, length 6 -> logits (2, 6, 1000). The seed passes a 4-D all-ones [2, 1, 6, 6] mask;
    ours takes the equivalent [2, 6] ones mask (and refuses the 4-D one)."""
    config = dataclasses.replace(GPTConfig.simple_gpt(), vocab_size=1000, hidden_size=128,
                                 num_heads=4, num_layers=2, intermediate_size=256)
    assert config.max_position_embeddings == 512
    assert not config.pre_norm
    torch_model, jax_model = twin_pair(tgpt.GPT, jgpt.GPT, config)  # the models' own init
    torch.manual_seed(0)
    input_ids = torch.randint(0, 1000, (2, 6))
    attention_mask = torch.ones(2, 6, dtype=torch.long)
    with torch.no_grad():
        t_logits = torch_model(input_ids, attention_mask)
        t_no_mask = torch_model(input_ids)
    j_logits = jax_gpt(jax_model, input_ids.numpy(), attention_mask.numpy())
    assert tuple(t_logits.shape) == (2, 6, 1000)
    assert j_logits.shape == (2, 6, 1000)
    assert_close(t_logits, j_logits, what="seed 004 logits")
    torch.testing.assert_close(t_logits, t_no_mask, rtol=0, atol=1e-6)
    seed_mask = attention_mask.unsqueeze(1).unsqueeze(2).expand(-1, -1, 6, -1)  # [2, 1, 6, 6]
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        torch_model(input_ids, seed_mask)
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        jax_model(jnp.asarray(input_ids.numpy()), jnp.asarray(seed_mask.numpy()))


# ----------------------------------------------------------------------------- bad inputs

BAD_INPUTS = {  # name -> (ids, mask, message); TINY: vocab 101, 64 positions
    "id_too_large": (np.array([[1, 2, 101]]), None, r"input_ids must lie in \[0, 101\).*101"),
    "id_negative": (np.array([[1, -1, 3]]), None, r"input_ids must lie in \[0, 101\).*-1"),
    "too_long": (np.zeros((1, 65), np.int64), None, r"length 65.*max_position_embeddings=64"),
    "ids_1d": (np.array([1, 2, 3]), None, r"input_ids must have 2 dimensions"),
    "mask_wrong_length": (np.ones((2, 4), np.int64), np.ones((2, 3), np.int64),
                          r"attention_mask has shape \(2, 3\) but input_ids has shape \(2, 4\)"),
    "mask_4d": (np.ones((2, 4), np.int64), np.ones((2, 1, 4, 4), np.int64),
                r"attention_mask must have shape \[batch, seq\].*got shape \(2, 1, 4, 4\)"),
    "mask_1d": (np.ones((1, 4), np.int64), np.ones((4,), np.int64),
                r"attention_mask must have shape \[batch, seq\]"),
    "mask_not_binary": (np.ones((1, 4), np.int64), np.array([[1, 1, 2, 1]]),
                        r"attention_mask must hold only 0/1"),
}


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_raise(framework, case):
    ids, mask, message = BAD_INPUTS[case]
    torch_model, jax_model = gpt_pair("gpt2_tiny")
    if framework == "jax":
        ids_in, mask_in = jnp.asarray(ids), None if mask is None else jnp.asarray(mask)
        model = jax_model
    else:
        ids_in, mask_in = torch.tensor(ids), None if mask is None else torch.tensor(mask)
        model = torch_model
    with pytest.raises(ValueError, match=message):
        model(ids_in, mask_in)


def test_4d_mask_refused_under_jit():
    _, jax_model = gpt_pair("gpt2_tiny")
    graphdef, state = nnx.split(jax_model)
    forward = jax.jit(lambda state, ids, mask: nnx.merge(graphdef, state)(ids, mask))
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        forward(state, jnp.ones((2, 4), jnp.int32), jnp.ones((2, 1, 4, 4), jnp.int32))


# ----------------------------------------------------------------------------- dropout

def test_dropout_train_mode_is_active_and_reproducible(rng):
    """Parity runs in eval mode; here train mode must drop (outputs move) and be reproducible."""
    config = dataclasses.replace(TINY, num_layers=1, dropout_rate=0.3, attention_dropout_rate=0.3)
    ids = random_ids(rng, config, B, T)
    # rbg keys: same semantics, a fraction of threefry's compile time on CPU.
    a, b, c = (jgpt.GPT(config, rngs=nnx.Rngs(params=0, dropout=jax.random.key(d, impl="rbg")))
               for d in (1, 1, 2))
    np.testing.assert_array_equal(convert.nnx_to_torch(a)["blocks.0.feed_forward.fc1.weight"],
                                  convert.nnx_to_torch(c)["blocks.0.feed_forward.fc1.weight"])
    train_a = jax_gpt(a, ids)
    assert np.isfinite(train_a).all()
    np.testing.assert_array_equal(train_a, jax_gpt(b, ids))  # same dropout key: same output
    assert max_rel_diff(jax_gpt(c, ids), train_a) > 1e-4  # same weights, other dropout key
    torch_model = tgpt.GPT(config).train()
    with torch.no_grad():
        t_train = torch_model(torch.tensor(ids))
        t_eval = torch_model.eval()(torch.tensor(ids))
    assert max_rel_diff(t_eval, t_train) > 1e-4
