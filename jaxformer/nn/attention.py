"""Scaled dot-product attention and the multi-head attention module. Twin:
``torch_ref/nn/attention.py``.

Shapes: B batch, T query length, S key length, C hidden size, nh heads, hs head size.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.nn.params import linear
from jaxformer.numerics import MASK_VALUE


def fused_attention(q, k, v, mask, dropout, *, implementation: str):
    """``jax.nn.dot_product_attention`` (``"xla"``, or ``"cudnn"`` flash attention on GPU)."""
    if dropout is not None:
        raise ValueError(f"attention implementation {implementation!r} cannot apply dropout; "
                         f"use 'einsum' or 'auto'")
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)


def einsum_attention(q, k, v, mask, dropout):
    """The explicit path: scores in float32, masked scores set to MASK_VALUE, softmax over keys,
    dropout on the probabilities (the only path that can drop them)."""
    scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(q.shape[-1])  # (B, nh, T, S)
    if mask is not None:
        scores = jnp.where(mask, scores, MASK_VALUE)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    if dropout is not None:
        weights = dropout(weights)
    return jnp.einsum("bhts,bshd->bthd", weights, v)  # (B, T, nh, hs)


# config.attention_implementation -> function; "auto" is resolved in `attention`.
IMPLEMENTATIONS = {
    "xla": functools.partial(fused_attention, implementation="xla"),
    "cudnn": functools.partial(fused_attention, implementation="cudnn"),
    "einsum": einsum_attention,
}


def attention(q, k, v, mask=None, dropout: nnx.Dropout | None = None,
              implementation: str = "auto"):
    """Scaled dot-product attention on ``(B, T, nh, hs)`` queries and ``(B, S, nh, hs)`` keys/values.

    ``mask`` is boolean, broadcastable to ``(B, nh, T, S)``, True = may attend. Softmax runs in
    float32. ``implementation`` is one of ``config.ATTENTION_IMPLEMENTATIONS``; ``"auto"`` takes
    ``"xla"`` unless dropout is active, then ``"einsum"``.
    """
    active = dropout if dropout is not None and not dropout.deterministic and dropout.rate > 0 \
        else None
    if implementation == "auto":
        implementation = "einsum" if active is not None else "xla"
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r} is not one of "
                         f"{('auto', *IMPLEMENTATIONS)}")
    return IMPLEMENTATIONS[implementation](q, k, v, mask, active)


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
        self.implementation = config.attention_implementation

    def __call__(self, hidden_states, context=None, mask=None):
        context = hidden_states if context is None else context
        B, T, C = hidden_states.shape
        S = context.shape[1]
        q = self.query(hidden_states).reshape(B, T, self.num_heads, self.head_dim)
        k = self.key(context).reshape(B, S, self.num_heads, self.head_dim)
        v = self.value(context).reshape(B, S, self.num_heads, self.head_dim)
        y = attention(q, k, v, mask, self.attention_dropout, self.implementation)
        return self.output(y.reshape(B, T, C))
