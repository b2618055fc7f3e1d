"""What every family shares: attention, feed-forward, the Transformer block, embedding pieces.

Every module takes a family config (``BertConfig``, ``TransformerConfig`` or ``GPTConfig``); the
fields read here have the same name and meaning in all three. ``torch_ref/layers.py`` is the twin.
Shapes: B batch, T query length, S key length, C hidden size, nh heads, hs head size.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.masks import MASK_VALUE

ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # erf form, torch's nn.GELU()
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2's "gelu_new"
    "relu": jax.nn.relu,
}


def linear(in_features: int, out_features: int, config, *, rngs: nnx.Rngs,
           use_bias: bool = True) -> nnx.Linear:
    return nnx.Linear(in_features, out_features, use_bias=use_bias, dtype=jnp.dtype(config.dtype),
                      kernel_init=nnx.initializers.normal(config.initializer_range), rngs=rngs)


def embedding(num_embeddings: int, config, *, rngs: nnx.Rngs) -> nnx.Embed:
    return nnx.Embed(num_embeddings, config.hidden_size, dtype=jnp.dtype(config.dtype),
                     embedding_init=nnx.initializers.normal(config.initializer_range), rngs=rngs)


def layer_norm(config, *, rngs: nnx.Rngs) -> nnx.LayerNorm:
    # Two-pass variance, as torch computes it; flax's default E[x^2] - E[x]^2 drifts from it.
    return nnx.LayerNorm(config.hidden_size, epsilon=config.layer_norm_eps,
                         use_fast_variance=False, dtype=jnp.dtype(config.dtype), rngs=rngs)


def sinusoidal_positions(num_positions: int, hidden_size: int) -> np.ndarray:
    """``[num_positions, hidden_size]`` table of Vaswani et al. 3.5: sin on even, cos on odd dims."""
    position = np.arange(num_positions, dtype=np.float64)[:, None]
    div_term = np.exp(np.arange(0, hidden_size, 2, dtype=np.float64)
                      * (-math.log(10000.0) / hidden_size))
    table = np.zeros((num_positions, hidden_size), dtype=np.float64)
    table[:, 0::2] = np.sin(position * div_term)
    table[:, 1::2] = np.cos(position * div_term)[:, : hidden_size // 2]
    return table.astype(np.float32)


def attention(q, k, v, mask=None, dropout: nnx.Dropout | None = None,
              implementation: str = "auto"):
    """Scaled dot-product attention on ``(B, T, nh, hs)`` queries and ``(B, S, nh, hs)`` keys/values.

    ``mask`` is boolean, broadcastable to ``(B, nh, T, S)``, True = may attend. Softmax runs in
    float32. ``implementation``: ``"xla"``/``"cudnn"`` call ``jax.nn.dot_product_attention``
    (fused, flash attention with cuDNN); ``"einsum"`` is the explicit path, the only one that can
    drop attention probabilities; ``"auto"`` takes ``"xla"`` unless dropout is active.
    """
    dropping = dropout is not None and not dropout.deterministic and dropout.rate > 0
    if implementation == "auto":
        implementation = "einsum" if dropping else "xla"
    if implementation != "einsum":
        if dropping:
            raise ValueError(f"attention implementation {implementation!r} cannot apply dropout")
        return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)
    scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(q.shape[-1])  # (B, nh, T, S)
    if mask is not None:
        scores = jnp.where(mask, scores, MASK_VALUE)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    if dropping:
        weights = dropout(weights)
    return jnp.einsum("bhts,bshd->bthd", weights, v)  # (B, T, nh, hs)


class MultiHeadAttention(nnx.Module):
    """Self-attention (``context=None``) or cross-attention over ``context``."""

    def __init__(self, config, *, rngs: nnx.Rngs):
        C = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.query = linear(C, C, config, rngs=rngs)
        self.key = linear(C, C, config, rngs=rngs)
        self.value = linear(C, C, config, rngs=rngs)
        self.output = linear(C, C, config, rngs=rngs)
        self.attention_dropout = nnx.Dropout(config.attention_dropout_rate, rngs=rngs)
        self.implementation = "auto"

    def __call__(self, hidden_states, context=None, mask=None):
        context = hidden_states if context is None else context
        B, T, C = hidden_states.shape
        S = context.shape[1]
        q = self.query(hidden_states).reshape(B, T, self.num_heads, self.head_dim)
        k = self.key(context).reshape(B, S, self.num_heads, self.head_dim)
        v = self.value(context).reshape(B, S, self.num_heads, self.head_dim)
        y = attention(q, k, v, mask, self.attention_dropout, self.implementation)
        return self.output(y.reshape(B, T, C))


class FeedForward(nnx.Module):
    """Position-wise ``fc2(activation(fc1(x)))``."""

    def __init__(self, config, *, rngs: nnx.Rngs):
        self.fc1 = linear(config.hidden_size, config.intermediate_size, config, rngs=rngs)
        self.fc2 = linear(config.intermediate_size, config.hidden_size, config, rngs=rngs)
        self.activation = config.activation

    def __call__(self, x):
        return self.fc2(ACTIVATIONS[self.activation](self.fc1(x)))


class TransformerBlock(nnx.Module):
    """Self-attention and feed-forward sub-layers, each with dropout, residual and LayerNorm.

    Post-LN (BERT, the 2017 encoder): ``x = norm(x + dropout(sublayer(x)))``.
    Pre-LN (GPT-2): ``x = x + dropout(sublayer(norm(x)))``.
    """

    def __init__(self, config, *, rngs: nnx.Rngs):
        self.attention = MultiHeadAttention(config, rngs=rngs)
        self.attention_norm = layer_norm(config, rngs=rngs)
        self.feed_forward = FeedForward(config, rngs=rngs)
        self.ffn_norm = layer_norm(config, rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)
        self.pre_norm = config.pre_norm

    def __call__(self, x, mask=None):
        if self.pre_norm:
            x = x + self.dropout(self.attention(self.attention_norm(x), mask=mask))
            return x + self.dropout(self.feed_forward(self.ffn_norm(x)))
        x = self.attention_norm(x + self.dropout(self.attention(x, mask=mask)))
        return self.ffn_norm(x + self.dropout(self.feed_forward(x)))
