"""BERT: every layer and every model of ``jaxformer.bert`` against its ``torch_ref`` twin.

The torch twin is built from a seed, every parameter is made random (so no bias is trivially zero
and no LayerNorm scale trivially one), the weights go through ``jaxformer.convert.torch_to_nnx``,
and both frameworks run identical inputs in eval mode. Bounds are DESIGN.md's: forward outputs
to 1e-5 of their scale on the query rows that carry meaning (all rows in tests about padded
rows), jit vs eager to 1e-6, gradients of every parameter to 1e-5 of their scale, and the losses
of optax vs torch.optim AdamW to 1e-5 relative at every step. Dropout is tested on its own.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.flatten_util import ravel_pytree

from jaxformer.checkpoints import convert
from jaxformer.config import BertConfig
from jaxformer.models import bert as jb
from jaxformer.nn import layers as jl
from jaxformer.nn.masks import padding_mask
from jaxformer.training.optim import scale_by_adam
from parity_tests.support.helpers import (
    GRAD_RTOL,
    JIT_TOL,
    MASK_KINDS,
    assert_close,
    make_attention_mask,
    max_rel_diff,
    randomize,
    to_numpy,
)
from torch_ref.models import bert as tb
from torch_ref.nn import layers as tl

TINY = BertConfig.tiny()  # post-LN, GELU, embedding LayerNorm, tied MLM decoder
PRE_LN = dataclasses.replace(TINY, pre_norm=True)
# Seed 003's switches (ReLU, no embedding LayerNorm, untied MLM decoder, eps 1e-5) at tiny sizes.
D2L_SMALL = dataclasses.replace(BertConfig.d2l_bert(), vocab_size=99, hidden_size=32,
                                num_heads=4, intermediate_size=37, max_position_embeddings=64)
CONFIGS = {"tiny": TINY, "pre_ln": PRE_LN, "d2l_small": D2L_SMALL}
B, T = 3, 7  # one shape for most tests: fewer compilations on a 2-core CPU


# ------------------------------------------------------------------------------------------------
# helpers


def load_nnx(jax_cls, config, state_dict, seed: int = 0):
    """The NNX model holding ``state_dict``, built without running its random initialisers
    (``convert.abstract_model``); the ordinary construction path is exercised by the dropout
    tests and ``test_convert.py``."""
    model = convert.abstract_model(lambda: jax_cls(config, rngs=nnx.Rngs(seed)))
    convert.torch_to_nnx(state_dict, model)
    model.eval()
    return model


def twins(torch_cls, jax_cls, config, seed: int = 0, randomized: bool = True):
    """(torch twin, NNX model with its weights), both in eval mode."""
    torch.manual_seed(seed)
    torch_model = torch_cls(config)
    if randomized:
        randomize(torch_model, seed)
    torch_model.eval()
    return torch_model, load_nnx(jax_cls, config, torch_model.state_dict(), seed)


def inputs(config, batch=B, seq=T, kind="right_padding", seed=0):
    """input_ids, token_type_ids (two segments, as in seed 003) and an attention_mask or None."""
    rng = np.random.RandomState(seed)
    input_ids = rng.randint(0, config.vocab_size, (batch, seq))
    split = rng.randint(1, seq + 1, (batch, 1))
    token_type_ids = (np.arange(seq)[None, :] >= split).astype(np.int64)
    attention_mask = make_attention_mask(kind, batch, seq)
    if attention_mask is not None:
        input_ids = np.where(attention_mask == 1, input_ids, config.pad_token_id)
    return input_ids, token_type_ids, attention_mask


def t(x):
    return None if x is None else torch.from_numpy(np.array(x))


def j(x):
    return None if x is None else jnp.asarray(x)


def meaningful_rows(attention_mask, kind):
    """Query rows to compare: all of them in tests about padded rows, else the real tokens."""
    if attention_mask is None or kind == "fully_padded_row":
        return None
    return attention_mask.astype(bool)


def check_padded_row(expected, got, kind):
    """In tests about the fully padded row, that row must be finite and equal in both."""
    if kind == "fully_padded_row":
        assert np.isfinite(to_numpy(got)).all()
        assert np.isfinite(to_numpy(expected)).all()
        assert_close(expected[-1], got[-1], what="fully padded row")


def jax_call(model, *args):
    """``model(*args)`` through a ``jax.jit``-ed pure function (one compilation per graph).

    Used where shapes are new (property test, seed examples): one XLA compilation instead of
    one per primitive. Elsewhere models run eagerly at the shared shape ``(B, T)``, whose
    primitives compile once for the whole suite. ``test_jit_equals_eager`` ties the two.
    """
    graphdef, state = nnx.split(model)
    return _pure_call(graphdef, state, *args)


_pure_call = jax.jit(lambda graphdef, state, *args: nnx.merge(graphdef, state)(*args),
                     static_argnums=0)


def torch_grads_by_key(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: p.grad.detach().numpy().copy() for k, p in model.named_parameters()}


# ------------------------------------------------------------------------------------------------
# layers


@pytest.mark.parametrize("name", ["tiny", "d2l_small"])
def test_embeddings(name):
    config = CONFIGS[name]
    torch_emb, jax_emb = twins(tb.BertEmbeddings, jb.BertEmbeddings, config)
    input_ids, token_type_ids, _ = inputs(config, kind="none")
    with torch.no_grad():
        expected = torch_emb(t(input_ids), t(token_type_ids))
    got = jax_emb(j(input_ids), j(token_type_ids))
    assert got.shape == (B, T, config.hidden_size)
    assert_close(expected, got)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_feed_forward(activation):
    config = dataclasses.replace(TINY, activation=activation)
    torch_ffn, jax_ffn = twins(tl.FeedForward, jl.FeedForward, config)
    x = np.random.RandomState(1).randn(B, T, config.hidden_size).astype(np.float32)
    with torch.no_grad():
        expected = torch_ffn(t(x))
    assert_close(expected, jax_ffn(j(x)))


def test_activations_are_explicit():
    """GELU exact vs tanh differ by ~1e-3 at x~2: a mix-up would fail the feed-forward test."""
    x = np.linspace(-4, 4, 101).astype(np.float32)
    for name in ("gelu", "gelu_tanh", "relu"):
        assert_close(tl.ACTIVATIONS[name](t(x)), jl.ACTIVATIONS[name](j(x)), what=name)
    assert np.abs(np.asarray(jl.ACTIVATIONS["gelu"](j(x)) - jl.ACTIVATIONS["gelu_tanh"](j(x)))
                  ).max() > 1e-4


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("name", ["tiny", "pre_ln"])
def test_transformer_block(name, kind):
    config = CONFIGS[name]
    torch_block, jax_block = twins(tl.TransformerBlock, jl.TransformerBlock, config)
    x = np.random.RandomState(2).randn(B, T, config.hidden_size).astype(np.float32)
    attention_mask = make_attention_mask(kind, B, T)
    mask = None if attention_mask is None else padding_mask(attention_mask)
    with torch.no_grad():
        expected = torch_block(t(x), t(mask))
    got = jax_block(j(x), mask)
    assert_close(expected, got, where=meaningful_rows(attention_mask, kind))
    check_padded_row(expected, got, kind)


@pytest.mark.usefixtures("scan_layers")
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_encoder(kind):
    torch_enc, jax_enc = twins(tb.BertEncoder, jb.BertEncoder, TINY)
    x = np.random.RandomState(3).randn(B, T, TINY.hidden_size).astype(np.float32)
    attention_mask = make_attention_mask(kind, B, T)
    mask = None if attention_mask is None else padding_mask(attention_mask)
    with torch.no_grad():
        expected = torch_enc(t(x), t(mask))
    got = jax_enc(j(x), mask)
    assert_close(expected, got, where=meaningful_rows(attention_mask, kind))
    check_padded_row(expected, got, kind)


def test_pooler_reads_cls():
    torch_pool, jax_pool = twins(tb.BertPooler, jb.BertPooler, TINY)
    x = np.random.RandomState(4).randn(B, T, TINY.hidden_size).astype(np.float32)
    with torch.no_grad():
        expected = torch_pool(t(x))
    got = jax_pool(j(x))
    assert got.shape == (B, TINY.hidden_size)
    assert_close(expected, got)
    # Only position 0 matters.
    y = x.copy()
    y[:, 1:] = 0
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax_pool(j(y))))


@pytest.mark.parametrize("with_positions", [False, True], ids=["all_positions", "masked_positions"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_mlm_head(tied, with_positions):
    config = dataclasses.replace(TINY, tie_word_embeddings=tied)
    torch_head, jax_head = twins(tb.BertMLMHead, jb.BertMLMHead, config, seed=5)
    torch_embs, jax_embs = twins(tb.BertEmbeddings, jb.BertEmbeddings, config, seed=6)
    torch_emb, jax_emb = torch_embs.word_embeddings, jax_embs.word_embeddings
    rng = np.random.RandomState(7)
    x = rng.randn(B, T, config.hidden_size).astype(np.float32)
    positions = rng.randint(0, T, (B, 3)) if with_positions else None
    with torch.no_grad():
        expected = torch_head(t(x), t(positions), torch_emb if tied else None)
    got = jax_head(j(x), j(positions), jax_emb if tied else None)
    assert got.shape == (B, 3 if with_positions else T, config.vocab_size)
    assert_close(expected, got)
    if with_positions:  # gathering first equals slicing the all-positions logits
        full = jax_head(j(x), None, jax_emb if tied else None)
        assert_close(np.take_along_axis(np.asarray(full), positions[:, :, None], 1), got)
    if not tied:  # an untied head ignores the embeddings
        np.testing.assert_array_equal(np.asarray(got),
                                      np.asarray(jax_head(j(x), j(positions), jax_emb)))


def test_nsp_head():
    torch_head, jax_head = twins(tb.BertNSPHead, jb.BertNSPHead, TINY)
    x = np.random.RandomState(8).randn(B, TINY.hidden_size).astype(np.float32)
    with torch.no_grad():
        expected = torch_head(t(x))
    got = jax_head(j(x))
    assert got.shape == (B, 2)
    assert_close(expected, got)


# ------------------------------------------------------------------------------------------------
# full models


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("name", ["tiny", "pre_ln", "d2l_small"])
def test_bert_model(name, kind):
    config = CONFIGS[name]
    torch_model, jax_model = twins(tb.BertModel, jb.BertModel, config)
    input_ids, token_type_ids, attention_mask = inputs(config, kind=kind)
    with torch.no_grad():
        seq_t, pooled_t = torch_model(t(input_ids), t(token_type_ids), t(attention_mask))
    seq_j, pooled_j = jax_model(j(input_ids), j(token_type_ids), j(attention_mask))
    assert seq_j.shape == (B, T, config.hidden_size)
    assert pooled_j.shape == (B, config.hidden_size)
    assert_close(seq_t, seq_j, where=meaningful_rows(attention_mask, kind), what="sequence")
    check_padded_row(seq_t, seq_j, kind)
    # The pooler reads position 0, padded for left padding: still defined and equal in both.
    assert_close(pooled_t, pooled_j, what="pooled")


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("name", ["tiny", "d2l_small"])
def test_bert_for_pretraining(name, kind):
    config = CONFIGS[name]
    torch_model, jax_model = twins(tb.BertForPreTraining, jb.BertForPreTraining, config)
    input_ids, token_type_ids, attention_mask = inputs(config, kind=kind)
    positions = np.random.RandomState(9).randint(0, 4, (B, 3))  # real tokens in every row
    where = meaningful_rows(attention_mask, kind)
    for masked_positions in (None, positions):
        with torch.no_grad():
            out_t = torch_model(t(input_ids), t(token_type_ids), t(attention_mask),
                                t(masked_positions))
        out_j = jax_model(j(input_ids), j(token_type_ids), j(attention_mask),
                          j(masked_positions))
        P = T if masked_positions is None else 3
        assert out_j[1].shape == (B, P, config.vocab_size)
        assert out_j[2].shape == (B, 2)
        assert_close(out_t[0], out_j[0], where=where, what="sequence")
        mlm_where = where
        if masked_positions is not None and where is not None:
            mlm_where = np.take_along_axis(where, masked_positions, 1)
        assert_close(out_t[1], out_j[1], where=mlm_where, what="mlm logits")
        assert_close(out_t[2], out_j[2], what="nsp logits")
        check_padded_row(out_t[0], out_j[0], kind)


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_bert_for_sequence_classification(kind):
    config = TINY
    torch_model, jax_model = twins(tb.BertForSequenceClassification,
                                   jb.BertForSequenceClassification, config)
    input_ids, token_type_ids, attention_mask = inputs(config, kind=kind)
    with torch.no_grad():
        expected = torch_model(t(input_ids), t(token_type_ids), t(attention_mask))
    got = jax_model(j(input_ids), j(token_type_ids), j(attention_mask))
    assert got.shape == (B, config.num_labels)
    assert_close(expected, got)


@pytest.mark.parametrize("kind", ["right_padding", "fully_padded_row"])
@pytest.mark.parametrize("name", ["tiny", "d2l_small"])
def test_bert_for_masked_lm(name, kind):
    config = CONFIGS[name]
    torch_model, jax_model = twins(tb.BertForMaskedLM, jb.BertForMaskedLM, config)
    assert jax_model.bert.pooler is None
    assert torch_model.bert.pooler is None
    input_ids, token_type_ids, attention_mask = inputs(config, kind=kind)
    positions = np.random.RandomState(10).randint(0, 4, (B, 3))
    with torch.no_grad():
        expected = torch_model(t(input_ids), t(token_type_ids), t(attention_mask), t(positions))
    got = jax_model(j(input_ids), j(token_type_ids), j(attention_mask), j(positions))
    assert got.shape == (B, 3, config.vocab_size)
    where = None
    if kind != "fully_padded_row":
        where = np.take_along_axis(attention_mask.astype(bool), positions, 1)
    assert_close(expected, got, where=where)


def test_einsum_attention_path_in_full_model():
    """The explicit einsum path (used with attention dropout) gives the same model output."""
    config = dataclasses.replace(TINY, attention_implementation="einsum")
    torch_model, jax_model = twins(tb.BertForPreTraining, jb.BertForPreTraining, config)
    input_ids, token_type_ids, attention_mask = inputs(TINY, kind="left_padding")
    with torch.no_grad():
        out_t = torch_model(t(input_ids), t(token_type_ids), t(attention_mask))
    out_j = jax_model(j(input_ids), j(token_type_ids), j(attention_mask))
    where = attention_mask.astype(bool)
    for a, b_, w, what in zip(out_t, out_j, (where, where, None), ("seq", "mlm", "nsp")):
        assert_close(a, b_, where=w, what=what)


def test_inputs_default_to_segment_zero_and_no_mask():
    torch_model, jax_model = twins(tb.BertModel, jb.BertModel, TINY)
    input_ids, _, _ = inputs(TINY, kind="none")
    zeros = np.zeros_like(input_ids)
    ones = np.ones_like(input_ids)
    with torch.no_grad():
        default_t = torch_model(t(input_ids))
        explicit_t = torch_model(t(input_ids), t(zeros), t(ones))
    default_j = jax_model(j(input_ids))
    explicit_j = jax_model(j(input_ids), j(zeros), j(ones))
    for a, b_ in zip(default_t + explicit_t, default_j + explicit_j):
        assert_close(a, b_)
    assert_close(default_j[0], explicit_j[0], tol=JIT_TOL)


def test_jit_equals_eager():
    """Eager, ``jax.jit`` of a pure function over ``nnx.split`` state, and ``nnx.jit``: to 1e-6.

    At the model's own initialisation (N(0, 0.02)), where activations are of order one. With the
    std-0.3 weights of the parity tests the pooler's pre-tanh values reach ~5, a float32 ulp
    there is ~5e-7, and the few ulps by which XLA's fused and unfused roundings differ (each as
    far from a float64 run as the other) exceed 1e-6 of the tanh output's unit scale.
    """
    _, model = twins(tb.BertModel, jb.BertModel, TINY, randomized=False)
    input_ids, token_type_ids, attention_mask = inputs(TINY, kind="right_padding")
    args = (j(input_ids), j(token_type_ids), j(attention_mask))
    eager = model(*args)
    graphdef, state = nnx.split(model)

    @jax.jit
    def pure(state, *args):
        return nnx.merge(graphdef, state)(*args)

    @nnx.jit
    def with_nnx_jit(model, *args):
        return model(*args)

    for name, out in (("jax.jit", pure(state, *args)), ("nnx.jit", with_nnx_jit(model, *args))):
        for a, b_, what in zip(eager, out, ("sequence", "pooled")):
            assert max_rel_diff(a, b_) <= JIT_TOL, f"{name} {what}"


# ------------------------------------------------------------------------------------------------
# property-based: batch, length, heads and padding vary

_HYPOTHESIS_TWINS: dict[int, tuple] = {}


def _model_twins_for_heads(num_heads):
    if num_heads not in _HYPOTHESIS_TWINS:
        config = dataclasses.replace(TINY, num_heads=num_heads, num_layers=1)
        _HYPOTHESIS_TWINS[num_heads] = (config, *twins(tb.BertModel, jb.BertModel, config, 11))
    return _HYPOTHESIS_TWINS[num_heads]


@st.composite
def bert_case(draw):
    batch = draw(st.integers(1, 3))
    seq = draw(st.integers(1, 9))
    num_heads = draw(st.sampled_from([1, 2, 4, 8]))
    lengths = draw(st.lists(st.integers(0, seq), min_size=batch, max_size=batch))
    left = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return batch, seq, num_heads, lengths, left, seed


@settings(max_examples=4)
@given(bert_case())
def test_bert_model_property(case):
    batch, seq, num_heads, lengths, left, seed = case
    config, torch_model, jax_model = _model_twins_for_heads(num_heads)
    rng = np.random.RandomState(seed)
    input_ids = rng.randint(0, config.vocab_size, (batch, seq))
    token_type_ids = rng.randint(0, config.type_vocab_size, (batch, seq))
    attention_mask = (np.arange(seq)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    if left:
        attention_mask = np.ascontiguousarray(attention_mask[:, ::-1])
    with torch.no_grad():
        seq_t, pooled_t = torch_model(t(input_ids), t(token_type_ids), t(attention_mask))
    seq_j, pooled_j = jax_call(jax_model, j(input_ids), j(token_type_ids), j(attention_mask))
    assert np.isfinite(np.asarray(seq_j)).all()
    assert_close(seq_t, seq_j, where=attention_mask.astype(bool), what="sequence")
    # Fully padded rows (length 0) and padded [CLS] positions are finite and equal too.
    assert_close(seq_t, seq_j, what="sequence, all rows")
    assert_close(pooled_t, pooled_j, what="pooled")


# ------------------------------------------------------------------------------------------------
# the seeds' own example runs


def test_seed_000_simple_bert_example():
    """Seed 000 section 8: vocab 1000, hidden 128, 4 heads, 2 layers, ffn 256, batch 2, len 6."""
    config = dataclasses.replace(BertConfig.simple_bert(), vocab_size=1000, num_layers=2)
    assert (config.hidden_size, config.num_heads, config.intermediate_size,
            config.max_position_embeddings, config.type_vocab_size) == (128, 4, 256, 512, 2)
    torch_model, jax_model = twins(tb.BertModel, jb.BertModel, config, randomized=False)
    torch.manual_seed(0)
    input_ids = torch.randint(0, 1000, (2, 6))
    token_type_ids = torch.zeros(2, 6, dtype=torch.long)
    attention_mask = torch.ones(2, 6, dtype=torch.long)
    with torch.no_grad():
        output_t, _ = torch_model(input_ids, token_type_ids, attention_mask)
    output_j, _ = jax_call(jax_model, j(input_ids), j(token_type_ids), j(attention_mask))
    assert tuple(output_t.shape) == output_j.shape == (2, 6, 128)
    assert_close(output_t, output_j)


def test_seed_003_d2l_bert_example():
    """Seed 003: d2l BERTModel sizes; encoded (2,8,768), MLM (2,3,10000), NSP (2,2)."""
    config = BertConfig.d2l_bert()
    assert (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_heads,
            config.num_layers) == (10000, 768, 1024, 4, 2)
    torch_model, jax_model = twins(tb.BertForPreTraining, jb.BertForPreTraining, config,
                                   randomized=False)
    torch.manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (2, 8))
    segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]])
    mlm_positions = torch.tensor([[1, 5, 2], [6, 1, 5]])
    with torch.no_grad():
        encoded_t, mlm_t, nsp_t = torch_model(tokens, segments, None, mlm_positions)
    encoded_j, mlm_j, nsp_j = jax_call(jax_model, j(tokens), j(segments), None, j(mlm_positions))
    assert tuple(encoded_t.shape) == encoded_j.shape == (2, 8, 768)
    assert tuple(mlm_t.shape) == mlm_j.shape == (2, 3, 10000)
    assert tuple(nsp_t.shape) == nsp_j.shape == (2, 2)
    assert_close(encoded_t, encoded_j, what="encoded")
    assert_close(mlm_t, mlm_j, what="mlm")
    assert_close(nsp_t, nsp_j, what="nsp")


# ------------------------------------------------------------------------------------------------
# gradients and optimizer steps


def _pretraining_loss_inputs(config):
    input_ids, token_type_ids, attention_mask = inputs(config, batch=B, seq=T,
                                                       kind="right_padding", seed=12)
    rng = np.random.RandomState(13)
    positions = rng.randint(0, 4, (B, 3))
    mlm_labels = rng.randint(0, config.vocab_size, (B, 3))
    nsp_labels = rng.randint(0, 2, (B,))
    seq_weights = rng.randn(B, T, config.hidden_size).astype(np.float32) \
        * attention_mask[:, :, None]  # a loss term on every real token's hidden state
    return input_ids, token_type_ids, attention_mask, positions, mlm_labels, nsp_labels, \
        seq_weights


def test_gradients_of_every_parameter():
    """BertForPreTraining tiny, eval mode, right padding; the loss is MLM cross-entropy at masked
    positions + NSP cross-entropy + a weighted sum of the real tokens' hidden states."""
    config = TINY
    torch_model, jax_model = twins(tb.BertForPreTraining, jb.BertForPreTraining, config, 14)
    ids, types, mask, positions, mlm_labels, nsp_labels, seq_w = _pretraining_loss_inputs(config)

    _, mlm_t, nsp_t = out_t = torch_model(t(ids), t(types), t(mask), t(positions))
    loss_t = (F.cross_entropy(mlm_t.reshape(-1, config.vocab_size), t(mlm_labels).reshape(-1))
              + F.cross_entropy(nsp_t, t(nsp_labels)) + (out_t[0] * t(seq_w)).sum())
    loss_t.backward()
    grads_t = torch_grads_by_key(torch_model)

    graphdef, params, rest = nnx.split(jax_model, nnx.Param, ...)

    def loss_fn(params):
        seq, mlm, nsp = nnx.merge(graphdef, params, rest)(j(ids), j(types), j(mask),
                                                          j(positions))
        return (optax.softmax_cross_entropy_with_integer_labels(
                    mlm.reshape(-1, config.vocab_size), j(mlm_labels).reshape(-1)).mean()
                + optax.softmax_cross_entropy_with_integer_labels(nsp, j(nsp_labels)).mean()
                + (seq * j(seq_w)).sum())

    loss_j, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    assert_close(loss_t, loss_j, what="loss")
    # Through convert's key layout: the grads in a model's place, read out as a torch state_dict.
    grads_j = convert.nnx_to_torch(nnx.merge(graphdef, grads, rest))
    assert grads_j.keys() == grads_t.keys()
    grad_scale = max(np.abs(g).max() for g in grads_t.values())
    for key, g_t in grads_t.items():
        assert_close(g_t, grads_j[key], tol=GRAD_RTOL, what=f"grad {key}")
        if key.endswith("attention.key.bias"):
            # Exactly zero in exact arithmetic: q.b_k shifts every score of a row equally and
            # softmax ignores it. Both sides hold float32 noise, far below the loss's scale.
            assert max(np.abs(g_t).max(), np.abs(grads_j[key]).max()) <= GRAD_RTOL * grad_scale
            continue
        # Also relative to this parameter's own gradient scale (stricter for small grads).
        scale = np.abs(g_t).max()
        if scale > 0:
            diff = np.abs(g_t - grads_j[key]).max() / scale
            assert diff <= GRAD_RTOL, f"grad {key}: {diff:.3g} of its own scale"
        else:  # a parameter the loss does not reach
            np.testing.assert_array_equal(grads_j[key], 0.0)
    # Tied decoder: the word embedding gradient holds the embedding and MLM contributions.
    if config.tie_word_embeddings:
        assert "mlm.decoder.weight" not in grads_t


def test_adamw_steps_match_torch():
    """5 AdamW steps, optax vs torch.optim, same hyper-parameters: losses equal at every step.
    The Adam part is jaxformer's (``training.optim.scale_by_adam``: optax's, with the bias
    corrections exact as torch's; optax.adamw's own are float32 powers of 0.999, which moved
    every update by 6.4e-6 and left a margin of 1.2x here on an AVX-capped CPU).

    Both decouple weight decay and multiply it by the learning rate (torch: ``p *= 1 - lr*wd``
    before the Adam update; optax.adamw: ``-lr * (adam + wd * p)``), and both add eps outside the
    square root of the bias-corrected second moment (``m_hat / (sqrt(v_hat) + eps)``); every
    parameter, biases and LayerNorm included, is decayed on both sides.
    """
    config = TINY
    torch_model, jax_model = twins(tb.BertForSequenceClassification,
                                   jb.BertForSequenceClassification, config, 15)
    ids, types, mask = inputs(config, kind="left_padding", seed=16)
    labels = np.random.RandomState(17).randint(0, config.num_labels, (B,))
    lr, betas, eps, wd = 1e-3, (0.9, 0.999), 1e-8, 0.01

    optimizer_t = torch.optim.AdamW(torch_model.parameters(), lr=lr, betas=betas, eps=eps,
                                    weight_decay=wd)
    graphdef, params, rest = nnx.split(jax_model, nnx.Param, ...)
    # AdamW is elementwise and decays every parameter, so optax may run on the raveled vector:
    # the same update, and one fused update compiles much faster than one per parameter.
    flat, unravel = ravel_pytree(params)
    tx = optax.chain(scale_by_adam(*betas, eps), optax.add_decayed_weights(wd), optax.scale(-lr))
    opt_state = tx.init(flat)

    @jax.jit
    def step(flat, opt_state):
        def loss_fn(flat):
            logits = nnx.merge(graphdef, unravel(flat), rest)(j(ids), j(types), j(mask))
            return optax.softmax_cross_entropy_with_integer_labels(logits, j(labels)).mean()

        loss, grads = jax.value_and_grad(loss_fn)(flat)
        updates, opt_state = tx.update(grads, opt_state, flat)
        return optax.apply_updates(flat, updates), opt_state, loss

    losses_t, losses_j = [], []
    for _ in range(5):
        optimizer_t.zero_grad()
        loss_t = F.cross_entropy(torch_model(t(ids), t(types), t(mask)), t(labels))
        loss_t.backward()
        optimizer_t.step()
        losses_t.append(loss_t.item())
        flat, opt_state, loss_j = step(flat, opt_state)
        losses_j.append(float(loss_j))
    assert losses_t[-1] < losses_t[0]  # it is training
    for i, (a, b_) in enumerate(zip(losses_t, losses_j)):
        assert abs(a - b_) <= 1e-5 * abs(a), f"step {i}: torch {a} vs optax {b_}"


# ------------------------------------------------------------------------------------------------
# dropout


def test_embedding_dropout_rate_and_scaling():
    """Train mode zeroes a fraction ~rate of the embedding activations and scales the rest.

    Twelve calls at the suite's shared shape, each with a fresh mask: 8064 activations, so the
    observed fraction lies within 4 sigma (~0.019) of the rate.
    """
    rate, calls = 0.25, 12
    config = dataclasses.replace(TINY, dropout_rate=rate)
    torch_emb, jax_emb = twins(tb.BertEmbeddings, jb.BertEmbeddings, config)
    input_ids, token_type_ids, _ = inputs(config, kind="none")
    eval_j = np.asarray(jax_emb(j(input_ids), j(token_type_ids)))
    with torch.no_grad():
        eval_t = torch_emb(t(input_ids), t(token_type_ids)).numpy()
    assert (eval_j != 0).all()
    jax_emb.train()
    torch_emb.train()
    train_j = np.stack([np.asarray(jax_emb(j(input_ids), j(token_type_ids)))
                        for _ in range(calls)])
    with torch.no_grad():
        train_t = np.stack([torch_emb(t(input_ids), t(token_type_ids)).numpy()
                            for _ in range(calls)])
    sigma = np.sqrt(rate * (1 - rate) / train_j.size)
    for name, train, ev in (("jax", train_j, eval_j), ("torch", train_t, eval_t)):
        ev = np.broadcast_to(ev, train.shape)
        dropped = train == 0
        assert abs(dropped.mean() - rate) <= 4 * sigma, f"{name}: {dropped.mean()} vs {rate}"
        np.testing.assert_allclose(train[~dropped], ev[~dropped] / (1 - rate), rtol=1e-6,
                                   atol=1e-7)
        assert not np.array_equal(dropped[0], dropped[1])  # a fresh mask every call


def test_dropout_determinism_and_train_eval():
    config = dataclasses.replace(TINY, dropout_rate=0.3, attention_dropout_rate=0.3)
    torch.manual_seed(3)
    torch_model = randomize(tb.BertModel(config), 3).eval()
    # The ordinary construction path: dropout streams forked from nnx.Rngs(seed).
    models = [jb.BertModel(config, rngs=nnx.Rngs(seed)) for seed in (3, 3, 4)]
    for m in models:  # same weights everywhere; a and b share the rng seed, c has another
        convert.torch_to_nnx(torch_model.state_dict(), m)
        m.eval()
    model_a, model_b, model_c = models
    input_ids, token_type_ids, attention_mask = inputs(config, kind="right_padding")
    args = (j(input_ids), j(token_type_ids), j(attention_mask))

    # Eval is exactly deterministic in both frameworks.
    eval_j = np.asarray(model_a(*args)[0])
    np.testing.assert_array_equal(eval_j, np.asarray(model_a(*args)[0]))
    with torch.no_grad():
        eval_t = torch_model(t(input_ids), t(token_type_ids), t(attention_mask))[0].numpy()
        np.testing.assert_array_equal(
            eval_t, torch_model(t(input_ids), t(token_type_ids), t(attention_mask))[0].numpy())

    for m in (model_a, model_b, model_c):
        m.train()
    a1, a2 = np.asarray(model_a(*args)[0]), np.asarray(model_a(*args)[0])
    b1, b2 = np.asarray(model_b(*args)[0]), np.asarray(model_b(*args)[0])
    c1 = np.asarray(model_c(*args)[0])
    assert np.isfinite(a1).all()
    assert not np.allclose(a1, eval_j)  # train differs from eval
    assert not np.allclose(a1, a2)  # a fresh mask every call
    np.testing.assert_array_equal(a1, b1)  # same seed, same sequence of masks
    np.testing.assert_array_equal(a2, b2)
    assert not np.allclose(a1, c1)  # another seed, other masks

    # nnx.jit carries the rng count out of the call: jitted calls draw fresh masks too, and the
    # same ones as eager calls from the same state.
    forward = nnx.jit(lambda m, ids, types: m(ids, types))
    e1 = np.asarray(forward(model_a.embeddings, *args[:2]))
    e2 = np.asarray(forward(model_a.embeddings, *args[:2]))
    assert not np.allclose(e1, e2)
    model_b.embeddings(*args[:2])  # bring b's embedding stream to where a's was
    assert_close(e2, model_b.embeddings(*args[:2]), tol=JIT_TOL)

    torch_model.train()
    with torch.no_grad():
        t1 = torch_model(t(input_ids), t(token_type_ids), t(attention_mask))[0].numpy()
        t2 = torch_model(t(input_ids), t(token_type_ids), t(attention_mask))[0].numpy()
    assert not np.allclose(t1, eval_t)
    assert not np.allclose(t1, t2)

    # Back to eval: parity again.
    model_a.eval()
    torch_model.eval()
    assert_close(eval_t, model_a(*args)[0], where=attention_mask.astype(bool))
