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
    """Scaled dot-product attention, ``(B, T, nh, hs)`` queries, ``(B, S, nh, hs)`` keys/values.

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


def cache_mask(valid, cache_index, q_len: int) -> jnp.ndarray:
    """The mask of a cached call: ``T = q_len`` queries at slots ``cache_index + t`` over ``L``
    cache slots. ``valid`` ``(B, L)`` marks the slots holding real tokens (this call's included).
    A query may attend to a valid slot at or before its own: causal over slots AND padding, the
    full forward's mask over the same tokens. Returns boolean ``(B, 1, T, L)``."""
    slots = jnp.arange(valid.shape[1])
    causal = slots[None, :] <= cache_index + jnp.arange(q_len)[:, None]  # (T, L)
    return jnp.logical_and(causal[None, None], valid[:, None, None, :])


class MultiHeadAttention(nnx.Module):
    """Self-attention (``context=None``) or cross-attention over ``context``.

    Decoding with a KV cache (``jaxformer.generation``): ``cache`` is plain data,
    ``{"key": (B, L, nh, hs), "value": (B, L, nh, hs)}``, preallocated to L slots.

    - Self-attention, ``cache_index`` given (a scalar, traced or not): this call's keys and values
      are written at slots ``[cache_index, cache_index + T)`` and the queries attend over all L
      slots; ``mask`` (``(B, 1, T, L)``) says which slots count. Returns ``(output, new cache)``.
    - Cross-attention, ``cache_index=None``: the cache holds the context's keys and values,
      computed once by :meth:`key_value`; ``context`` must be None. Returns ``(output, cache)``.

    Without a cache the call returns the output alone, as before.
    """

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

    def key_value(self, context) -> dict:
        """``(B, S, C)`` -> ``{"key", "value"}``, each ``(B, S, nh, hs)``."""
        B, S, _ = context.shape
        return {"key": self.key(context).reshape(B, S, self.num_heads, self.head_dim),
                "value": self.value(context).reshape(B, S, self.num_heads, self.head_dim)}

    def __call__(self, hidden_states, context=None, mask=None, cache=None, cache_index=None):
        B, T, C = hidden_states.shape
        q = self.query(hidden_states).reshape(B, T, self.num_heads, self.head_dim)
        if cache is not None and cache_index is None:  # cross-attention, keys/values cached
            if context is not None:
                raise ValueError("cross-attention with a cache reads the context's keys and "
                                 "values from it: pass context=None")
            kv = cache
        else:
            kv = self.key_value(hidden_states if context is None else context)
            if cache is not None:  # self-attention: write this call's slots, read all of them
                kv = {name: jax.lax.dynamic_update_slice(
                    cache[name], kv[name].astype(cache[name].dtype), (0, cache_index, 0, 0))
                    for name in ("key", "value")}
        y = attention(q, kv["key"], kv["value"], mask, self.attention_dropout,
                      self.implementation)  # (B, T, nh, hs)
        out = self.output(y.reshape(B, T, C))
        return out if cache is None else (out, kv)
