"""Dropout as a property: where it acts and how, in both frameworks (issue 12, item 7b).

Parity runs in eval mode, so a dropout applied to the wrong tensor, with the wrong scale or at
the wrong rate is invisible to it, and the two twins cannot be compared in train mode (their
random streams differ). These tests check each framework against the definition instead:

- attention dropout (the einsum path of both twins, and torch's SDPA, the twin's default path),
  read out through one-hot values: every attention weight is either 0 or exactly its eval value
  / (1 - rate); masked keys stay 0; the dropped fraction is the rate; averaged over many
  independent draws the weights tend to the eval weights, within a bound set from the binomial
  standard error;
- hidden dropout: in a block the output equals a manual recomputation that applies the recorded
  dropout masks to each sub-layer's output before the residual add (DESIGN.md, layers.py:
  ``norm(x + dropout(sublayer(x)))`` post-LN, ``x + dropout(sublayer(norm(x)))`` pre-LN), for the
  encoder block and the decoder layer (whose seed applied dropout to the residual input);
- embedding dropout acts on the embeddings' final output (after the LayerNorm when there is one).

The rate is 0.5 for hidden dropout, so that 1 / (1 - rate) = 2 is exact in float32 and the
recomputation matches to rounding of the same operations.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from torch.nn.attention import SDPBackend, sdpa_kernel

from jaxformer.config import BertConfig, GPTConfig, TransformerConfig
from jaxformer.models import bert as jb
from jaxformer.models import encoder_decoder as jed
from jaxformer.models import gpt as jg
from jaxformer.nn import attention as jattn
from jaxformer.nn import layers as jl
from parity_tests.support.helpers import JIT_TOL, max_rel_diff, twin_pair
from torch_ref.models import bert as tb
from torch_ref.models import encoder_decoder as ted
from torch_ref.models import gpt as tg
from torch_ref.nn import attention as tattn
from torch_ref.nn import layers as tl

SIGMAS = 5.0  # statistical bounds: 5 standard errors (false alarm < 6e-7 per checked value;
# the draws are seeded, so each run sees the same numbers)


def kept_fraction_ok(kept: np.ndarray, rate: float) -> bool:
    """The fraction of kept entries is 1 - rate within SIGMAS binomial standard errors."""
    n = kept.size
    return abs(kept.mean() - (1 - rate)) <= SIGMAS * np.sqrt(rate * (1 - rate) / n)


# ------------------------------------------------------------------------------------------------
# attention dropout: weights read out through one-hot values

B, T, S, NH = 2, 5, 6, 2
RATE = 0.25
DRAWS = 2000  # independent draws, stacked along the batch axis: one call per framework


def attention_inputs():
    """(q, k, v, mask) with v one-hot over keys, so that the attention output *is* the weights:
    ``out[b, t, h, s] = weights[b, h, t, s]``. Keys masked per row (padding) and causally."""
    rng = np.random.RandomState(0)
    q = (2 * rng.randn(B, T, NH, S)).astype(np.float32)
    k = (2 * rng.randn(B, S, NH, S)).astype(np.float32)
    v = np.broadcast_to(np.eye(S, dtype=np.float32)[None, :, None, :], (B, S, NH, S)).copy()
    keys_real = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)
    causal = np.arange(S)[None, :] <= np.arange(T)[:, None] + 1  # query t sees keys <= t + 1
    mask = keys_real[:, None, None, :] & causal[None, None]  # (B, 1, T, S)
    return q, k, v, mask


def tile(x, n=DRAWS):
    return np.concatenate([x] * n, axis=0)


def jax_weights(dropout, n: int):
    q, k, v, mask = (jnp.asarray(tile(a, n)) for a in attention_inputs())
    return np.asarray(jattn.attention(q, k, v, jnp.asarray(mask), dropout, "einsum" if dropout
                                      is None else "auto"))  # (N*B, T, nh, S)


def torch_weights(dropout, n: int, implementation: str = "einsum"):
    q, k, v, mask = (torch.from_numpy(tile(a, n)) for a in attention_inputs())
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # heads first, (N*B, nh, T, hs)
    with torch.no_grad():
        out = tattn.attention(q, k, v, mask, dropout, implementation)
    return out.transpose(1, 2).numpy()  # (N*B, T, nh, S)


# jax: the einsum path ("auto" picks it when dropout is active); torch: its explicit einsum path
# and its default, SDPA (which drops the weights inside the kernel).
PATHS = ["jax", "torch_einsum", "torch_sdpa"]


def weights_in_train_and_eval(path: str):
    """``(DRAWS * B, T, nh, S)`` weights with dropout, ``(B, T, nh, S)`` without."""
    if path == "jax":
        drop = nnx.Dropout(RATE, rngs=nnx.Rngs(dropout=0))
        return jax_weights(drop, DRAWS), jax_weights(None, 1)
    torch.manual_seed(0)
    if path == "torch_einsum":
        return (torch_weights(torch.nn.Dropout(RATE).train(), DRAWS, "einsum"),
                torch_weights(None, 1, "einsum"))
    # SDPA picks its CPU kernel per call: with and without dropout they differ, and the kept
    # weights then match eval / (1 - rate) only to 3e-6 (measured). Pinned to the math kernel,
    # both calls compute the same softmax and the property holds to float32 rounding (1.1e-7).
    with sdpa_kernel(SDPBackend.MATH):
        return (torch_weights(torch.nn.Dropout(RATE).train(), DRAWS, "auto"),
                torch_weights(None, 1, "auto"))


@pytest.mark.parametrize("path", PATHS)
def test_attention_dropout_keeps_weights_exactly_rescaled(path):
    train, eval_ = weights_in_train_and_eval(path)
    np.testing.assert_allclose(eval_.sum(-1), 1.0, rtol=1e-6)  # the one-hot read-out works
    assert (eval_ > 0.02).sum() > eval_.size // 3  # and the weights are not one-hot
    mask = np.moveaxis(attention_inputs()[3], 1, 2)  # (B, T, 1, S), as the output is laid out
    assert (eval_[~np.broadcast_to(mask, eval_.shape)] == 0).all()
    expected_kept = tile(eval_) / (1 - RATE)
    kept = train != 0
    # Each kept weight is its eval weight / (1 - rate), to a few ulp (jax divides by 1 - rate,
    # torch multiplies by its reciprocal); each dropped one is exactly 0.
    np.testing.assert_allclose(train[kept], expected_kept[kept], rtol=1e-6, atol=0)
    real = tile(eval_) > 0
    assert not (kept & ~real).any()  # masked keys stay masked
    assert kept_fraction_ok(kept[real], RATE), f"kept {kept[real].mean():.4f}, rate {RATE}"


@pytest.mark.parametrize("path", PATHS)
def test_attention_dropout_averages_to_eval_weights(path):
    """Mean over DRAWS draws of each weight -> eval weight w. Per draw the weight is
    w / (1 - rate) with probability 1 - rate, else 0: standard deviation w sqrt(rate / (1 -
    rate)), so the mean of DRAWS draws has standard error w sqrt(rate / ((1 - rate) DRAWS)) =
    0.013 w here. A missing 1 / (1 - rate) rescale would be off by 0.25 w, ~19 standard errors."""
    train, eval_ = weights_in_train_and_eval(path)
    mean = train.reshape(DRAWS, *eval_.shape).mean(0)
    se = eval_ * np.sqrt(RATE / ((1 - RATE) * DRAWS))
    assert (np.abs(mean - eval_) <= SIGMAS * se + 1e-7).all(), (
        f"max deviation {np.max(np.abs(mean - eval_) / np.maximum(se, 1e-12)):.1f} standard "
        f"errors")


def test_jax_attention_auto_takes_the_einsum_path_when_dropout_is_active():
    """``"auto"`` must not silently skip the dropout (the fused path cannot drop weights)."""
    q, k, v, mask = (jnp.asarray(a) for a in attention_inputs())
    drop = nnx.Dropout(RATE, rngs=nnx.Rngs(dropout=1))
    train = np.asarray(jattn.attention(q, k, v, jnp.asarray(mask), drop, "auto"))
    eval_ = np.asarray(jattn.attention(q, k, v, jnp.asarray(mask), None, "auto"))
    assert (train == 0).any()
    assert not (eval_[train == 0] == 0).all()
    drop.eval()  # deterministic: "auto" is the fused path and nothing is dropped
    assert max_rel_diff(eval_, jattn.attention(q, k, v, jnp.asarray(mask), drop, "auto")) <= 1e-6


# ------------------------------------------------------------------------------------------------
# hidden dropout: record the masks, recompute by hand

HIDDEN_RATE = 0.5
BERT = dataclasses.replace(BertConfig.tiny(), num_layers=1, dropout_rate=HIDDEN_RATE,
                           attention_dropout_rate=0.0)
ED = dataclasses.replace(TransformerConfig.tiny(), num_encoder_layers=1, num_decoder_layers=1,
                         dropout_rate=HIDDEN_RATE, attention_dropout_rate=0.0)


def record(module, name: str, framework: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Wrap ``module.<name>`` (a dropout) so that each call appends (input, output) as numpy."""
    records = []
    inner = getattr(module, name)
    if framework == "torch":
        inner.register_forward_hook(lambda _, args, out: records.append(
            (args[0].detach().numpy().copy(), out.detach().numpy().copy())))
        return records

    def recording(x):
        y = inner(x)
        records.append((np.asarray(x), np.asarray(y)))
        return y

    setattr(module, name, recording)
    return records


def check_dropout_records(records, count: int) -> list[np.ndarray]:
    """``count`` calls, each zeroing entries at the rate and doubling the rest; -> the masks."""
    assert len(records) == count, f"{len(records)} dropout calls, expected {count}"
    masks = []
    for x, y in records:
        kept = y != 0
        np.testing.assert_array_equal(y[kept], x[kept] / (1 - HIDDEN_RATE))
        assert kept_fraction_ok(kept, HIDDEN_RATE)
        masks.append(kept)
    return masks


def ops(framework):
    """(to framework array, to numpy) for the manual recomputation."""
    if framework == "torch":
        return torch.from_numpy, lambda a: a.detach().numpy()
    return jnp.asarray, np.asarray


def train_pair(torch_cls, jax_cls, config):
    torch_model, jax_model = twin_pair(torch_cls, jax_cls, config)
    torch_model.train()
    jax_model.train()  # in place (returns None in NNX)
    return {"torch": torch_model, "jax": jax_model}


def keep(mask, arr, framework):
    return ops(framework)[0](mask.astype(np.float32) / (1 - HIDDEN_RATE)) * arr


def no_grad(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)
    return wrapper


@no_grad
def block_manual(block, x, mask, masks, framework):
    """TransformerBlock with the dropout masks applied by hand where the design puts them."""
    m1, m2 = (functools.partial(keep, m, framework=framework) for m in masks)
    if block.pre_norm:
        x = x + m1(block.attention(block.attention_norm(x), mask=mask))
        return x + m2(block.feed_forward(block.ffn_norm(x)))
    x = block.attention_norm(x + m1(block.attention(x, mask=mask)))
    return block.ffn_norm(x + m2(block.feed_forward(x)))


@no_grad
def decoder_manual(layer, x, memory, self_mask, cross_mask, masks, framework):
    m1, m2, m3 = (functools.partial(keep, m, framework=framework) for m in masks)
    if layer.pre_norm:
        x = x + m1(layer.self_attention(layer.self_attention_norm(x), mask=self_mask))
        x = x + m2(layer.cross_attention(layer.cross_attention_norm(x), memory, cross_mask))
        return x + m3(layer.feed_forward(layer.ffn_norm(x)))
    x = layer.self_attention_norm(x + m1(layer.self_attention(x, mask=self_mask)))
    x = layer.cross_attention_norm(x + m2(layer.cross_attention(x, memory, cross_mask)))
    return layer.ffn_norm(x + m3(layer.feed_forward(x)))


def hidden_inputs():
    rng = np.random.RandomState(1)
    x = rng.randn(2, 7, 32).astype(np.float32)
    memory = rng.randn(2, 8, 32).astype(np.float32)
    real = np.array([[1] * 7, [1] * 5 + [0] * 2], bool)
    self_mask = real[:, None, None, :] & np.tril(np.ones((7, 7), bool))[None, None]
    cross_mask = np.array([[1] * 8, [0] * 2 + [1] * 6], bool)[:, None, None, :]
    return x, memory, self_mask, cross_mask


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("pre_norm", [False, True], ids=["post_ln", "pre_ln"])
def test_block_dropout_acts_on_sublayer_outputs(pre_norm, framework):
    config = dataclasses.replace(BERT, pre_norm=pre_norm)
    block = train_pair(tl.TransformerBlock, jl.TransformerBlock, config)[framework]
    to, back = ops(framework)
    x, _, mask, _ = hidden_inputs()
    records = record(block, "dropout", framework)
    with torch.no_grad():
        y = back(block(to(x), to(mask)))
    masks = check_dropout_records(records, 2)
    expected = back(block_manual(block, to(x), to(mask), masks, framework))
    assert max_rel_diff(expected, y) <= JIT_TOL


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("pre_norm", [False, True], ids=["post_ln", "pre_ln"])
def test_decoder_layer_dropout_acts_on_sublayer_outputs(pre_norm, framework):
    """Seed 002 applied the decoder's dropout to the residual input; the fix puts it on each of
    the three sub-layer outputs."""
    config = dataclasses.replace(ED, pre_norm=pre_norm)
    layer = train_pair(ted.DecoderLayer, jed.DecoderLayer, config)[framework]
    to, back = ops(framework)
    x, memory, self_mask, cross_mask = hidden_inputs()
    records = record(layer, "dropout", framework)
    with torch.no_grad():
        y = back(layer(to(x), to(memory), to(self_mask), to(cross_mask)))
    masks = check_dropout_records(records, 3)
    expected = back(decoder_manual(layer, to(x), to(memory), to(self_mask), to(cross_mask),
                                   masks, framework))
    assert max_rel_diff(expected, y) <= JIT_TOL


def small_gpt(**changes):
    return dataclasses.replace(GPTConfig.tiny(), num_layers=1, dropout_rate=HIDDEN_RATE,
                               attention_dropout_rate=0.0, **changes)


EMBEDDINGS = {  # name: (torch class, jax class, config, extra argument builder)
    "bert": (tb.BertEmbeddings, jb.BertEmbeddings, BERT,
             lambda ids: (np.arange(ids.shape[1])[None].repeat(2, 0) % 2,)),
    "gpt2": (tg.GPTEmbeddings, jg.GPTEmbeddings, small_gpt(), lambda ids: ()),
    "gpt_embedding_ln": (tg.GPTEmbeddings, jg.GPTEmbeddings,
                         small_gpt(embedding_layer_norm=True), lambda ids: ()),
    "encoder_decoder": (functools.partial(ted.TransformerEmbeddings, vocab_size=23),
                        functools.partial(jed.TransformerEmbeddings, vocab_size=23), ED,
                        lambda ids: ()),
}


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("name", list(EMBEDDINGS))
def test_embedding_dropout_acts_on_the_final_embeddings(name, framework):
    """train output = eval output * mask / (1 - rate): dropout is the last operation (after the
    LayerNorm where there is one), on the sum of all embeddings."""
    torch_cls, jax_cls, config, extra = EMBEDDINGS[name]
    module = train_pair(torch_cls, jax_cls, config)[framework]
    to, back = ops(framework)
    ids = np.random.RandomState(2).randint(0, 23, (2, 7))
    args = [to(a) for a in (ids, *extra(ids))]
    with torch.no_grad():
        train = back(module(*args))
        module.eval()
        eval_ = back(module(*args))
    kept = train != 0
    assert kept_fraction_ok(kept, HIDDEN_RATE)
    np.testing.assert_allclose(train[kept], eval_[kept] / (1 - HIDDEN_RATE), rtol=1e-6, atol=0)
