"""Scaled dot-product attention and ``MultiHeadAttention``.

Three layers of evidence:

1. ``jaxformer.layers.attention`` (``"xla"`` and ``"einsum"``) and ``torch_ref.layers.attention``
   against torch SDPA's math backend, an implementation nobody here wrote, with boolean masks that
   leave every query at least one key;
2. all three against a float64 numpy reference that also covers fully masked query rows, whose
   documented result (``jaxformer/masks.py``) is a uniform softmax, i.e. the mean of *all* values;
3. ``MultiHeadAttention`` against its torch twin with the same weights, for every mask kind.
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
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

from jaxformer.checkpoints import convert
from jaxformer.config import BertConfig
from jaxformer.nn import attention as jl
from jaxformer.nn.masks import MASK_VALUE, causal_mask, padding_mask
from parity_tests.support.attention import BRANCHES, branch_mask, build_mask, qkv, xla_kernel
from parity_tests.support.helpers import (
    JIT_TOL,
    MASK_KINDS,
    assert_close,
    make_attention_mask,
    max_rel_diff,
    randomize,
    to_numpy,
)
from torch_ref.nn import attention as tl

IMPLEMENTATIONS = ("xla", "einsum")


# ------------------------------------------------------------------------------------------------
# references


def numpy_attention(q, k, v, mask=None):
    """float64 reference on ``(B, T, nh, hs)`` arrays; masked scores become MASK_VALUE.

    A row whose keys are all masked has every score equal to MASK_VALUE, so its softmax is
    uniform and its output is the mean of all S value vectors (masked ones included).
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(np.broadcast_to(mask, scores.shape), scores, MASK_VALUE)
    scores = scores - scores.max(-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", weights, v)


def sdpa_math(q, k, v, mask=None):
    """torch SDPA, math backend, boolean mask (True = may attend); ``(B, T, nh, hs)`` in and out."""
    tq, tk, tv = (torch.from_numpy(np.asarray(a)).transpose(1, 2) for a in (q, k, v))
    tmask = None if mask is None else torch.from_numpy(np.array(mask))
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask)
    return out.transpose(1, 2).numpy()


# One XLA compilation per shape for both implementations, instead of one per primitive per shape
# (eager): the suite must stay fast on 2 CPU cores. test_attention_jit_equals_eager shows that
# jit and eager agree to 1e-6.
@jax.jit
def _both_implementations(q, k, v, mask):
    return {impl: jl.attention(q, k, v, mask, implementation=impl) for impl in IMPLEMENTATIONS}


def jax_attention(q, k, v, mask, implementation):
    """Through ``_both_implementations``; the mask is materialised at ``(B, nh, T, S)`` so that
    every mask kind of one shape shares a compilation (broadcast masks, ``(B, 1, 1, S)`` and
    ``(1, 1, T, S)``, are exercised by the MultiHeadAttention and model tests)."""
    if mask is not None:
        B, T, nh, _ = q.shape
        mask = np.broadcast_to(mask, (B, nh, T, k.shape[1]))
    outputs = _both_implementations(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                    None if mask is None else jnp.asarray(mask))
    return np.asarray(outputs[implementation])


def torch_ref_attention(q, k, v, mask):
    tq, tk, tv = (torch.from_numpy(np.asarray(a)).transpose(1, 2) for a in (q, k, v))
    tmask = None if mask is None else torch.from_numpy(np.array(mask))
    return tl.attention(tq, tk, tv, tmask).transpose(1, 2).numpy()


def fully_masked_rows(mask, B, nh, T, S):
    if mask is None:
        return np.zeros((B, nh, T), bool)
    return ~np.broadcast_to(mask, (B, nh, T, S)).any(-1)


# ------------------------------------------------------------------------------------------------
# 1. against torch SDPA (math backend)

SDPA_KINDS = ("none", "right_padding", "left_padding", "causal", "causal_right_padding",
              "random_per_head")


@pytest.mark.parametrize("kind", SDPA_KINDS)
@pytest.mark.parametrize(("B", "T", "S"), [(3, 6, 6), (2, 4, 7)])
def test_attention_matches_torch_sdpa_math(kind, B, T, S):
    rng = np.random.RandomState(0)
    nh, hs = 4, 8
    if kind.startswith("causal") and S < T:
        pytest.skip("causal with fewer keys than queries masks whole rows")
    q, k, v = qkv(rng, B, T, S, nh, hs)
    mask = build_mask(kind, B, T, S, nh, rng)
    assert not fully_masked_rows(mask, B, nh, T, S).any()
    expected = sdpa_math(q, k, v, mask)
    # SDPA math itself agrees with the float64 reference: the reference is sound.
    assert_close(numpy_attention(q, k, v, mask), expected, what="sdpa vs numpy")
    for impl in IMPLEMENTATIONS:
        assert_close(expected, jax_attention(q, k, v, mask, impl), what=f"jax {impl}")
    assert_close(expected, torch_ref_attention(q, k, v, mask), what="torch_ref")


def test_xla_and_einsum_agree_and_auto_is_the_backends_choice(monkeypatch):
    """Both paths agree; ``"auto"`` (no dropout) takes the einsum path on the CPU and XLA's
    elsewhere, in float32; bfloat16 keeps XLA's (cuDNN aside: the GPU's own tests)."""
    rng = np.random.RandomState(1)
    q, k, v = qkv(rng, 3, 7, 7, 4, 8)  # the shapes inside the MultiHeadAttention tests
    mask = jnp.asarray(build_mask("left_padding", 3, 7, 7, 4, rng))
    xla = np.asarray(jl.attention(q, k, v, mask, implementation="xla"))
    assert_close(xla, np.asarray(jl.attention(q, k, v, mask, implementation="einsum")),
                 what="xla vs einsum")
    taken = []
    monkeypatch.setattr(jl, "IMPLEMENTATIONS", {
        name: (lambda *a, _name=name, _fn=fn: taken.append(_name) or _fn(*a))
        for name, fn in jl.IMPLEMENTATIONS.items()})
    jl.attention(q, k, v, mask)
    if jax.default_backend() != "cpu":  # bfloat16 there may go to cuDNN: test_gpu.py's
        assert taken == ["xla"]
        return
    jl.attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)), mask)
    assert taken == ["einsum", "xla"]


# ------------------------------------------------------------------------------------------------
# 2. fully masked rows: the documented finite result


@pytest.mark.parametrize("kind", ["fully_padded_row", "causal_left_padding"])
def test_fully_masked_rows_give_mean_of_all_values(kind):
    rng = np.random.RandomState(2)
    B, T, S, nh, hs = 3, 6, 6, 4, 8
    q, k, v = qkv(rng, B, T, S, nh, hs)
    mask = build_mask(kind, B, T, S, nh, rng)
    dead = fully_masked_rows(mask, B, nh, T, S)  # (B, nh, T)
    assert dead.any()
    assert not dead.all()
    reference = numpy_attention(q, k, v, mask)
    mean_v = v.astype(np.float64).mean(axis=1)  # (B, nh, hs): uniform weights over all S keys
    b, h, t = np.nonzero(dead)
    np.testing.assert_allclose(reference[b, t, h], mean_v[b, h], rtol=1e-12)
    outputs = {f"jax {impl}": jax_attention(q, k, v, mask, impl) for impl in IMPLEMENTATIONS}
    outputs["torch_ref"] = torch_ref_attention(q, k, v, mask)
    for name, out in outputs.items():
        assert np.isfinite(out).all(), name
        assert_close(reference, out, what=name)  # every row, the dead ones included
        assert_close(mean_v[b, h], out[b, t, h], what=f"{name} dead rows = mean(v)")
    # Both frameworks give the same value for the dead rows.
    assert_close(outputs["torch_ref"][b, t, h], outputs["jax xla"][b, t, h], what="dead rows")


# ------------------------------------------------------------------------------------------------
# 3. property-based: shapes, heads and masks vary


@st.composite
def attention_case(draw):
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, 6))
    S = draw(st.integers(1, 6))
    nh = draw(st.sampled_from([1, 2, 3]))
    hs = draw(st.sampled_from([1, 4, 8]))
    lengths = draw(st.lists(st.integers(0, S), min_size=B, max_size=B))
    left = draw(st.booleans())
    causal = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return B, T, S, nh, hs, lengths, left, causal, seed


@settings(max_examples=6)
@given(attention_case())
def test_attention_property(case):
    B, T, S, nh, hs, lengths, left, causal, seed = case
    rng = np.random.RandomState(seed)
    q, k, v = qkv(rng, B, T, S, nh, hs)
    key_mask = np.arange(S)[None, :] < np.asarray(lengths)[:, None]
    if left:
        key_mask = key_mask[:, ::-1]
    mask = key_mask[:, None, None, :]
    if causal:
        mask = mask & np.asarray(causal_mask(T, S))
    reference = numpy_attention(q, k, v, mask)
    outputs = {f"jax {impl}": jax_attention(q, k, v, mask, impl) for impl in IMPLEMENTATIONS}
    outputs["torch_ref"] = torch_ref_attention(q, k, v, mask)
    for name, out in outputs.items():
        assert np.isfinite(out).all(), name
        assert_close(reference, out, what=name)
    if not fully_masked_rows(mask, B, nh, T, S).any():
        expected = sdpa_math(q, k, v, mask)
        for name, out in outputs.items():
            assert_close(expected, out, what=f"{name} vs sdpa")


# ------------------------------------------------------------------------------------------------
# cuDNN's mask types: which branch a mask takes, and that every branch computes that mask. XLA's
# kernel takes the same arguments as cuDNN's (is_causal, key lengths, a mask), so the branches
# run on a CPU; parity_tests/test_gpu.py runs them through cuDNN.

@functools.partial(jax.jit, static_argnums=0)
def _loss_gradients(attend, q, k, v, mask, cotangent):
    """Gradients of ``sum(attend(q, k, v, mask) * cotangent)`` and the output; one compilation
    per shape serves every mask (masks are arguments, broadcast to ``(B, 1, T, S)``)."""
    def loss(q, k, v):
        out = attend(q, k, v, mask)
        return (out * cotangent).sum(), out

    return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)


def _dense(q, k, v, mask):
    return xla_kernel(q, k, v, mask=mask)


def _branched(q, k, v, mask):
    return jl.cudnn_attention(q, k, v, mask, kernel=xla_kernel)


@pytest.mark.parametrize(("B", "T", "S"), [(3, 6, 6), (2, 4, 7)])
def test_cudnn_mask_branches(B, T, S):
    """For each mask kind: the branch ``mask_pattern`` picks, the key lengths, and the branched
    attention's output and gradients against XLA's on the dense mask."""
    rng = np.random.RandomState(7)
    q, k, v = (jnp.asarray(a) for a in qkv(rng, B, T, S, 2, 8))
    cotangent = jnp.asarray(rng.randn(B, T, 2, 8).astype(np.float32))
    for kind, branches in BRANCHES.items():
        mask = np.broadcast_to(branch_mask(kind, B, T, S, rng), (B, 1, T, S))
        index, lengths = jl.mask_pattern(jnp.asarray(mask), B, T, S)
        assert int(index) == branches[T != S], kind
        np.testing.assert_array_equal(lengths, mask[:, 0, -1].sum(-1))
        expected = _loss_gradients(_dense, q, k, v, jnp.asarray(mask), cotangent)
        actual = _loss_gradients(_branched, q, k, v, jnp.asarray(mask), cotangent)
        # The forward bound, FORWARD_RTOL (1e-5): the same float32 kernel with the mask given
        # another way. Measured at most 1.6e-7 over outputs and gradients (61x margin), the same
        # on the default ISA and AVX2-capped, 1 core and 2 (parity_tests.tools.margins,
        # 2026-11-26; this CPU has no AVX-512).
        assert_close(expected[1], actual[1], what=f"{kind} output")
        for name, e, a in zip("qkv", expected[0], actual[0], strict=True):
            assert_close(e, a, what=f"{kind} gradient of {name}")


def test_cudnn_mask_types_switch(monkeypatch):
    """``JAXFORMER_CUDNN_MASK_TYPES=0`` passes every mask as the bias: no switch in the program."""
    rng = np.random.RandomState(8)
    q, k, v = (jnp.asarray(a) for a in qkv(rng, 2, 6, 6, 2, 8))
    mask = jnp.asarray(build_mask("causal_right_padding", 2, 6, 6, 2, rng))

    def program():  # the mask is data: an argument of the traced function
        return str(jax.make_jaxpr(lambda q, mask: jl.cudnn_attention(q, k, v, mask,
                                                                     kernel=xla_kernel))(q, mask))

    assert "cond[" in program()
    monkeypatch.setenv("JAXFORMER_CUDNN_MASK_TYPES", "0")
    assert "cond[" not in program()


@pytest.mark.parametrize(("B", "T", "S"), [(3, 6, 6), (2, 4, 7)])
def test_cudnn_known_mask_has_its_branch_chosen_when_traced(B, T, S):
    """A mask that is a constant of the trace (GPT's causal mask without padding is a numpy
    array, ``masks.causal_mask``) takes its branch at trace time: no conditional in the program,
    and the output and gradients of XLA's attention on the dense mask. Not bit for bit those of
    the same mask given as data: XLA folds the constant mask or key lengths into its fusions
    (up to 6.5e-7 apart here), which cuDNN's kernel, taking them as arguments, does not."""
    rng = np.random.RandomState(9)
    q, k, v = (jnp.asarray(a) for a in qkv(rng, B, T, S, 2, 8))
    cotangent = jnp.asarray(rng.randn(B, T, 2, 8).astype(np.float32))
    for kind in BRANCHES:
        mask = np.broadcast_to(branch_mask(kind, B, T, S, rng), (B, 1, T, S))

        def known(q, k, v, _, mask=mask):  # the mask closed over: a constant when traced
            return jl.cudnn_attention(q, k, v, mask, kernel=xla_kernel)

        program = str(jax.make_jaxpr(known)(q, k, v, None))
        assert "cond[" not in program, kind
        expected = _loss_gradients(_dense, q, k, v, jnp.asarray(mask), cotangent)
        actual = _loss_gradients(known, q, k, v, None, cotangent)
        # test_cudnn_mask_branches' bound, FORWARD_RTOL (1e-5), for the same reason: measured
        # here at most 6.5e-7 over outputs and gradients (15x margin), the same on the default
        # ISA and AVX2-capped, 1 core and 2 (parity_tests.tools.margins, 2026-11-27).
        assert_close(expected[1], actual[1], what=f"{kind} output")
        for name, e, a in zip("qkv", expected[0], actual[0], strict=True):
            assert_close(e, a, what=f"{kind} gradient of {name}")
    causal = jax.make_jaxpr(lambda q: jl.cudnn_attention(q, q, q, causal_mask(T),
                                                         kernel=xla_kernel))(q)
    assert "cond[" not in str(causal)


def test_gpt_training_loss_has_no_conditional_under_cudnn(monkeypatch):
    """GPT's training batches carry no mask (``tasks.CAUSAL_LM``: full windows), so under cuDNN's
    attention its loss has no conditional: the causal type is chosen when it is traced. Given a
    padding mask (data), each layer keeps its switch. cuDNN stood in by XLA's kernel, which
    takes the same arguments."""
    from jaxformer.config import GPTConfig
    from jaxformer.models.gpt import GPT
    from jaxformer.training import losses
    from jaxformer.training.config import TrainConfig

    fused = jax.nn.dot_product_attention
    monkeypatch.setattr(jax.nn, "dot_product_attention",
                        lambda *a, implementation=None, **kw: fused(*a, implementation="xla", **kw))
    config = dataclasses.replace(GPTConfig.tiny(), attention_implementation="cudnn",
                                 dropout_rate=0.0, attention_dropout_rate=0.0)
    model = GPT(config, rngs=nnx.Rngs(0))
    ids = jnp.asarray(np.random.RandomState(0).randint(0, config.vocab_size, (2, 8)))

    def program(batch):
        return str(jax.make_jaxpr(lambda b: losses.causal_lm_batch_loss(model, b, TrainConfig()))(
            batch))

    assert "cond[" not in program({"input_ids": ids})
    assert program({"input_ids": ids, "attention_mask": jnp.ones_like(ids)}).count(
        "cond[") == config.num_layers


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="needs a backend without cuDNN")
def test_auto_falls_back_where_cudnn_is_missing(monkeypatch):
    """``"auto"`` told to try cuDNN where there is none falls back to XLA's attention, bit for
    bit; ``"cudnn"`` asked by name fails with cuDNN's own error."""
    monkeypatch.setenv("JAXFORMER_CUDNN_ATTENTION", "1")
    rng = np.random.RandomState(8)
    q, k, v = (jnp.asarray(a, jnp.bfloat16) for a in qkv(rng, 2, 6, 6, 2, 8))
    mask = jnp.asarray(build_mask("causal_right_padding", 2, 6, 6, 2, rng))
    auto = jax.jit(lambda q, k, v: jl.attention(q, k, v, mask))(q, k, v)
    xla = jax.jit(lambda q, k, v: jl.attention(q, k, v, mask, implementation="xla"))(q, k, v)
    np.testing.assert_array_equal(np.asarray(auto, np.float32), np.asarray(xla, np.float32))
    with pytest.raises(RuntimeError, match="cuDNN"):
        jl.attention(q, k, v, mask, implementation="cudnn")


# ------------------------------------------------------------------------------------------------
# jit and dropout


def test_attention_jit_equals_eager():
    rng = np.random.RandomState(3)
    q, k, v = qkv(rng, 3, 7, 7, 4, 8)
    mask = jnp.asarray(build_mask("right_padding", 3, 7, 7, 4, rng))  # (B, 1, 1, S)
    jitted = _both_implementations(q, k, v, mask)
    for impl in IMPLEMENTATIONS:
        eager = jl.attention(q, k, v, mask, implementation=impl)
        assert max_rel_diff(eager, jitted[impl]) <= JIT_TOL, impl


def test_attention_dropout_needs_einsum():
    rng = np.random.RandomState(4)
    q, k, v = qkv(rng, 3, 7, 7, 4, 8)  # weights (3, 4, 7, 7), as in the MHA dropout test
    dropout = nnx.Dropout(0.5, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="cannot apply dropout"):
        jl.attention(q, k, v, dropout=dropout, implementation="xla")
    dropped = np.asarray(jl.attention(q, k, v, dropout=dropout))  # auto -> einsum
    clean = jax_attention(q, k, v, None, "einsum")
    assert not np.allclose(dropped, clean)
    dropout.eval()  # deterministic dropout is a no-op: any implementation may run, auto as without
    for impl in ("xla", "auto"):
        without = np.asarray(jl.attention(q, k, v, implementation=impl))
        np.testing.assert_array_equal(
            np.asarray(jl.attention(q, k, v, dropout=dropout, implementation=impl)), without)


# ------------------------------------------------------------------------------------------------
# MultiHeadAttention against its torch twin


CONFIG = BertConfig.tiny()  # hidden 32, 4 heads of 8


def mha_twins(seed=0, config=CONFIG):
    torch_mha = randomize(tl.MultiHeadAttention(config), seed).eval()
    jax_mha = jl.MultiHeadAttention(config, rngs=nnx.Rngs(seed))
    convert.torch_to_nnx(torch_mha.state_dict(), jax_mha)
    jax_mha.eval()
    return torch_mha, jax_mha


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_multi_head_attention_matches_torch(kind, impl):
    torch_mha, jax_mha = mha_twins(config=dataclasses.replace(CONFIG,
                                                              attention_implementation=impl))
    B, T = 3, 7
    x = np.random.RandomState(5).randn(B, T, CONFIG.hidden_size).astype(np.float32)
    attention_mask = make_attention_mask(kind, B, T)
    jax_mask = None if attention_mask is None else padding_mask(attention_mask)
    torch_mask = None if attention_mask is None else torch.from_numpy(np.array(jax_mask))
    with torch.no_grad():
        expected = torch_mha(torch.from_numpy(x), mask=torch_mask)
    got = jax_mha(jnp.asarray(x), mask=jax_mask)
    assert got.shape == (B, T, CONFIG.hidden_size)
    if kind == "fully_padded_row":
        # A test about padded rows: every row is compared, the dead one included, and the dead
        # row is output(mean over all keys of value(x)), the documented uniform-softmax result.
        assert np.isfinite(np.asarray(got)).all()
        assert_close(expected, got)
        W = {k: to_numpy(v) for k, v in torch_mha.state_dict().items()}
        mean_value = (x[-1] @ W["value.weight"].T + W["value.bias"]).mean(0)
        dead = mean_value @ W["output.weight"].T + W["output.bias"]
        assert_close(np.broadcast_to(dead, (T, CONFIG.hidden_size)), got[-1], what="dead row")
        assert_close(np.broadcast_to(dead, (T, CONFIG.hidden_size)), expected[-1],
                     what="torch dead row")
    else:
        where = None if attention_mask is None else attention_mask.astype(bool)
        assert_close(expected, got, where=where)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_cross_attention_matches_torch(impl):
    torch_mha, jax_mha = mha_twins(seed=1, config=dataclasses.replace(
        CONFIG, attention_implementation=impl))
    rng = np.random.RandomState(6)
    x = rng.randn(3, 4, CONFIG.hidden_size).astype(np.float32)
    context = rng.randn(3, 7, CONFIG.hidden_size).astype(np.float32)
    context_mask = make_attention_mask("left_padding", 3, 7)
    mask = padding_mask(context_mask)  # (B, 1, 1, S): queries are all real
    with torch.no_grad():
        expected = torch_mha(torch.from_numpy(x), torch.from_numpy(context),
                             torch.from_numpy(np.array(mask)))
    got = jax_mha(jnp.asarray(x), jnp.asarray(context), mask)
    assert got.shape == (3, 4, CONFIG.hidden_size)
    assert_close(expected, got)


def test_multi_head_attention_per_head_and_causal_masks():
    """A ``(B, nh, T, S)`` mask reaches each head separately in both frameworks."""
    torch_mha, _jax_mha = mha_twins(seed=2)
    rng = np.random.RandomState(7)
    B, T = 3, 7
    x = rng.randn(B, T, CONFIG.hidden_size).astype(np.float32)
    for mask in (build_mask("random_per_head", B, T, T, CONFIG.num_heads, rng),
                 build_mask("causal_right_padding", B, T, T, CONFIG.num_heads, rng)):
        with torch.no_grad():
            expected = torch_mha(torch.from_numpy(x), mask=torch.from_numpy(np.array(mask)))
        for impl in IMPLEMENTATIONS:
            config = dataclasses.replace(CONFIG, attention_implementation=impl)
            torch_impl, jax_impl = mha_twins(seed=2, config=config)
            with torch.no_grad():
                got_torch = torch_impl(torch.from_numpy(x), mask=torch.from_numpy(np.array(mask)))
            assert_close(expected, got_torch, what=f"torch {impl}")
            assert_close(expected, jax_impl(jnp.asarray(x), mask=jnp.asarray(mask)), what=impl)


def test_multi_head_attention_jit_equals_eager():
    _, jax_mha = mha_twins(seed=3)
    x = jnp.asarray(np.random.RandomState(8).randn(3, 7, CONFIG.hidden_size), jnp.float32)
    mask = padding_mask(make_attention_mask("right_padding", 3, 7))
    eager = jax_mha(x, mask=mask)
    graphdef, state = nnx.split(jax_mha)

    @jax.jit
    def pure(state, x, mask):
        return nnx.merge(graphdef, state)(x, mask=mask)

    assert max_rel_diff(eager, pure(state, x, mask)) <= JIT_TOL
    assert max_rel_diff(eager, nnx.jit(lambda m, x, mask: m(x, mask=mask))(jax_mha, x, mask)) \
        <= JIT_TOL


def test_multi_head_attention_dropout_train_mode():
    """Attention-probability dropout: active in train mode in both frameworks, off in eval."""
    config = dataclasses.replace(CONFIG, attention_dropout_rate=0.5)
    torch_mha, jax_mha = mha_twins(seed=4, config=config)
    x = np.random.RandomState(9).randn(3, 7, config.hidden_size).astype(np.float32)
    eval_jax = np.asarray(jax_mha(jnp.asarray(x)))
    with torch.no_grad():
        eval_torch = torch_mha(torch.from_numpy(x)).numpy()
    assert_close(eval_torch, eval_jax)
    jax_mha.train()
    torch_mha.train()
    train_jax = [np.asarray(jax_mha(jnp.asarray(x))) for _ in range(2)]
    with torch.no_grad():
        train_torch = [torch_mha(torch.from_numpy(x)).numpy() for _ in range(2)]
    for a, b in (train_jax, train_torch):
        assert not np.allclose(a, b)  # a fresh dropout mask each call
    assert not np.allclose(train_jax[0], eval_jax)
    assert not np.allclose(train_torch[0], eval_torch)
