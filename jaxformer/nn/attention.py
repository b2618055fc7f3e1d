"""Scaled dot-product attention and the multi-head attention module. Twin:
``torch_ref/nn/attention.py``.

Shapes: B batch, T query length, S key length, C hidden size, nh heads, hs head size.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import runtime
from jaxformer.nn.cache import LayerCache
from jaxformer.nn.dropout import Dropout
from jaxformer.nn.params import linear, vector_product
from jaxformer.numerics import MASK_VALUE


def fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None,
                    dropout: nnx.Dropout | None, *,
                    implementation: Literal["xla", "cudnn"]) -> jax.Array:
    """``jax.nn.dot_product_attention`` (``"xla"``, or ``"cudnn"`` flash attention on GPU)."""
    if dropout is not None:
        raise ValueError(f"attention implementation {implementation!r} cannot apply dropout; "
                         f"use 'einsum' or 'auto'")
    if implementation == "cudnn":
        return cudnn_attention(q, k, v, mask)
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")


def cudnn_attention(q, k, v, mask, kernel=None):
    """cuDNN's fused attention under a boolean ``mask`` (broadcastable to ``(B, nh, T, S)``).

    cuDNN takes an arbitrary mask as an additive bias of shape ``(B, 1, T, S)`` exactly (a
    padding mask ``(B, 1, 1, S)`` is refused: "Bias must have same seq length as QKV"), reads it
    for every head and, under ``grad``, computes and writes its gradient too (jax asks for it
    whatever the bias is). cuDNN's own mask types cost nothing of that: ``is_causal`` (which also
    skips the key blocks above the diagonal) and key lengths (right padding). The masks this
    library builds are mostly such: GPT's and the decoder's causal mask AND right padding, BERT's
    and the encoder's right padding. Which one a mask is, is data (the padding comes with the
    batch), so it is checked on the device, one comparison of the mask with each pattern (cheap
    next to attention), and ``lax.switch`` runs the branch it selects; a numpy mask is no data (a
    constant when the model is traced: GPT's causal mask when there is no padding mask) and has
    its branch chosen then, without a conditional. The branches: causal (no padding),
    causal with key lengths, key lengths, or the bias for anything else (left padding, holes,
    per-head masks). Each branch computes the attention the mask defines, so the choice never
    changes what is computed, only how. A query row whose keys are all masked takes the bias:
    its output is the mean of the values, as on every path (``numerics.MASK_VALUE``), but cuDNN
    passes a gradient through that row's uniform softmax where the einsum path stops it at the
    mask (such a row's output carries no meaning, and no loss that ignores padding sends it a
    gradient).

    ``kernel``: the attention function (``jax.nn.dot_product_attention`` with cuDNN); the tests
    pass XLA's, which takes the same mask types, to check the branches on a CPU.
    ``JAXFORMER_CUDNN_MASK_TYPES=0`` (``runtime.cudnn_mask_types``) always takes the bias.
    """
    if kernel is None:
        kernel = functools.partial(jax.nn.dot_product_attention, implementation="cudnn")
    call = functools.partial(kernel, q, k, v)
    if mask is None:
        return call()
    B, T, S = q.shape[0], q.shape[1], k.shape[1]
    # A mask known when the model is traced (a numpy array: GPT's causal mask without padding,
    # masks.causal_mask) has its branch chosen then: no conditional on the device.
    known = isinstance(mask, np.ndarray)
    with jax.ensure_compile_time_eval() if known else contextlib.nullcontext():
        mask = jnp.asarray(mask)
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        typed = mask.shape[1] == 1 and runtime.cudnn_mask_types()
        index, lengths = mask_pattern(mask, B, T, S) if typed else (0, None)

    def bias():
        return call(mask=jnp.broadcast_to(mask, mask.shape[:2] + (T, S)))

    branches = [bias, lambda: call(key_value_seq_lengths=lengths)]
    if T == S:
        branches += [lambda: call(is_causal=True, key_value_seq_lengths=lengths),
                     lambda: call(is_causal=True)]
    if known or not typed:
        return branches[int(index)]()
    return jax.lax.switch(index, branches)


def mask_pattern(mask, B: int, T: int, S: int) -> tuple[jax.Array, jax.Array]:
    """Which of ``cudnn_attention``'s branches computes boolean ``mask`` ``(B or 1, 1, T or 1,
    S)``: ``(index, lengths)``, ``lengths`` ``(B,)`` int32 the real keys of each row (those the
    last query sees), ``index`` 0 anything else (the bias), 1 right padding of the keys, the
    same for every query, and, only when ``T == S``, 2 causal AND right padding, 3 causal alone.
    Every row must keep at least one key for 1-3."""
    full = jnp.broadcast_to(mask, (B, 1, T, S))
    lengths = full[:, 0, -1].sum(-1, dtype=jnp.int32)
    padding = jnp.arange(S) < lengths[:, None, None, None]  # (B, 1, 1, S)
    some = jnp.all(lengths > 0)
    index = jnp.where(some & jnp.all(full == padding), 1, 0)
    if T == S:
        causal = padding & jnp.tril(jnp.ones((T, S), bool))
        index = jnp.where(some & jnp.all(full == causal),
                          jnp.where(jnp.all(lengths == S), 3, 2), index)
    return index, lengths


def einsum_attention(q, k, v, mask, dropout):
    """The explicit path: scores in float32, masked scores set to MASK_VALUE, softmax over keys,
    dropout on the probabilities (the only path that can drop them)."""
    scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32)
    weights = _probabilities(scores / math.sqrt(q.shape[-1]), mask, dropout, v.dtype)
    return jnp.einsum("bhts,bshd->bthd", weights, v)  # (B, T, nh, hs)


def _probabilities(scores, mask, dropout, dtype):
    """``(B, nh, T, S)`` float32 scores -> attention probabilities in ``dtype``: masked scores
    set to MASK_VALUE, softmax over keys, dropout."""
    if mask is not None:
        scores = jnp.where(mask, scores, MASK_VALUE)
    weights = jax.nn.softmax(scores, axis=-1).astype(dtype)
    return dropout(weights) if dropout is not None else weights


def cached_attention(q, k, v, mask, dropout):
    """:func:`einsum_attention` over keys and values as the KV cache holds them, ``(B * nh, S,
    hs)`` (``nn/cache.py``): the products take the cache's arrays as they are, one batch entry
    per row and head, with no reshape between a step's write into the cache and them (XLA then
    updates the cache in place; a reshape there made it copy every layer's values three times a
    step, docs/performance.md). The same products and sums as :func:`einsum_attention`."""
    B, T, nh, hs = q.shape
    q = q.transpose(0, 2, 1, 3).reshape(B * nh, T, hs)
    scores = jnp.einsum("xtd,xsd->xts", q, k, preferred_element_type=jnp.float32)
    scores = (scores / math.sqrt(hs)).reshape(B, nh, T, -1)
    weights = _probabilities(scores, mask, dropout, v.dtype).reshape(B * nh, T, -1)
    y = jnp.einsum("xts,xsd->xtd", weights, v)  # (B * nh, T, hs)
    return y.reshape(B, nh, T, hs).transpose(0, 2, 1, 3)  # (B, T, nh, hs)


# config.attention_implementation -> function; "auto" is resolved in `attention`.
IMPLEMENTATIONS: dict[str, Callable[..., jax.Array]] = {
    "xla": functools.partial(fused_attention, implementation="xla"),
    "cudnn": functools.partial(fused_attention, implementation="cudnn"),
    "einsum": einsum_attention,
}


def attention(q, k, v, mask=None, dropout: nnx.Dropout | None = None,
              implementation: str = "auto"):
    """Scaled dot-product attention, ``(B, T, nh, hs)`` queries, ``(B, S, nh, hs)`` keys/values.

    ``mask`` is boolean, broadcastable to ``(B, nh, T, S)``, True = may attend. Softmax runs in
    float32. ``implementation`` is one of ``config.ATTENTION_IMPLEMENTATIONS``; ``"auto"`` takes
    ``"einsum"`` when dropout is active or on the CPU backend (bfloat16 excepted), ``"cudnn"``
    for bfloat16 and float16 on a CUDA GPU that has it (``runtime.auto_cudnn_attention``; shapes
    cuDNN refuses, say a head size over its limit, fall back), and ``"xla"`` otherwise.

    The CPU: XLA:CPU runs the einsum path's two batched products faster than
    ``jax.nn.dot_product_attention``'s (a baby GPT's training step 5-20% faster on an AVX-512
    Xeon, natively and capped to AVX2; GPT-2 and BERT-base steps, whose time is in their linear
    layers, unchanged: docs/performance.md). bfloat16 keeps ``"xla"``, where it was measured.

    float16 on CPU: ``jax.nn.dot_product_attention`` asks for float16 x float16 -> float32
    matmuls (``DotAlgorithmPreset.F16_F16_F32``), an algorithm XLA:CPU does not have. Called
    eagerly it catches the failure and falls back to the default precision, but under ``jit`` the
    failure comes at compile time, past its ``try``, so ``"xla"`` is refused there by name.
    """
    active = _active(dropout)
    cpu = jax.default_backend() == "cpu"
    cpu_float16 = cpu and q.dtype == jnp.float16
    if implementation == "auto":
        if active is not None or (cpu and q.dtype != jnp.bfloat16):
            implementation = "einsum"
        elif q.dtype in (jnp.bfloat16, jnp.float16) and runtime.auto_cudnn_attention():
            try:  # cuDNN names what it cannot do when the call is traced
                return fused_attention(q, k, v, mask, None, implementation="cudnn")
            except (NotImplementedError, ValueError, RuntimeError):
                implementation = "xla"
        else:
            implementation = "xla"
    if implementation == "xla" and cpu_float16:
        raise ValueError("attention implementation 'xla' cannot compute float16 on CPU: "
                         "jax.nn.dot_product_attention needs float16 matmuls with float32 "
                         "accumulation, which XLA:CPU lacks (jit fails to compile them); use "
                         "'einsum' or 'auto'")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r} is not one of "
                         f"{('auto', *IMPLEMENTATIONS)}")
    return IMPLEMENTATIONS[implementation](q, k, v, mask, active)


def _active(dropout: nnx.Dropout | None) -> nnx.Dropout | None:
    """The dropout module when it would drop something, else None."""
    return dropout if dropout is not None and not dropout.deterministic and dropout.rate > 0 \
        else None


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

    Decoding with a KV cache (``jaxformer.generation``): ``cache`` is a
    :class:`~jaxformer.nn.cache.LayerCache`, keys and values ``(B * nh, L, hs)`` as in torch_ref,
    preallocated to L slots; ``context`` is then None.

    - Self-attention, ``cache_index`` given (a scalar, traced or not): this call's keys and values
      are written at slots ``[cache_index, cache_index + T)`` and the queries attend over all L
      slots; ``mask`` (``(B, 1, T, L)``) says which slots count. Returns ``(output, new cache)``.
    - Cross-attention, ``cache_index=None``: the cache holds the context's keys and values,
      computed once by :meth:`key_value`. Returns ``(output, cache)``.

    Without a cache the call returns the output alone, as before.
    """

    def __init__(self, config, *, rngs: nnx.Rngs):
        C = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        # Megatron: query/key/value split by heads (column-parallel), output row-parallel.
        self.query = linear(C, C, config, names=("embed", "heads"), rngs=rngs)
        self.key = linear(C, C, config, names=("embed", "heads"), rngs=rngs)
        self.value = linear(C, C, config, names=("embed", "heads"), rngs=rngs)
        self.output = linear(C, C, config, names=("heads", "embed"), rngs=rngs)
        self.attention_dropout = Dropout(config.attention_dropout_rate, rngs=rngs)
        self.implementation = config.attention_implementation

    # set by params.use_vector_kernels
    _qkv_kernel: jax.Array | None = None
    _qkv_bias: jax.Array | None = None
    # True for a cross-attention (set by its decoder layer): in generation steps it reads its
    # context's keys and values from the cache, so it has no joined copy to make, and its query
    # and output layers get copies of their own (params.vector_kernels)
    _reads_cached_context = False

    @property
    def _no_vector_steps(self) -> tuple[str, ...]:
        # vector_copies joins query, key and value into one matrix; a cross-attention's steps
        # run no key or value product
        return ("key", "value") if self._reads_cached_context else ("query", "key", "value")

    def vector_copies(self, widening: bool = False) -> dict[str, jax.Array | None]:
        """The query, key and value kernels as one ``(3C, C)`` matrix (and their biases as one
        vector) for cached self-attention over one row or a few (``params.vector_kernels``;
        ``widening`` changes nothing here): XLA:CPU streams that product faster than three
        ``(C, C)`` ones as stored. 2-D kernels only; none for a cross-attention."""
        projections = (self.query, self.key, self.value)
        kernels = [p.kernel[...] for p in projections]
        if self._reads_cached_context or any(k.ndim != 2 for k in kernels):
            return {}
        biases = [p.bias[...] for p in projections if p.bias is not None]
        return {"_qkv_kernel": jnp.concatenate([k.T for k in kernels]),
                "_qkv_bias": jnp.concatenate(biases) if len(biases) == 3 else None}

    def _vector_projections(self, x):
        """``(queries (B, T, nh, hs), LayerCache of keys and values (B * nh, T, hs))`` by the one
        ``(3C, C)`` copy of ``vector_copies``."""
        qkv = vector_product(*self.query.promote_dtype((x, self._qkv_kernel, self._qkv_bias),
                                                       dtype=self.query.dtype))
        q, k, v = jnp.split(qkv, 3, axis=-1)
        return self._heads(q), LayerCache(key=self._cached(k), value=self._cached(v))

    def _heads(self, x):
        """``(B, T, C)`` -> ``(B, T, nh, hs)``."""
        return x.reshape(*x.shape[:2], self.num_heads, self.head_dim)

    def _cached(self, x):
        """``(B, T, C)`` keys or values -> the cache's layout, ``(B * nh, T, hs)``."""
        B, T, _ = x.shape
        return self._heads(x).transpose(0, 2, 1, 3).reshape(B * self.num_heads, T, self.head_dim)

    def key_value(self, context) -> LayerCache:
        """``(B, S, C)`` -> a ``LayerCache`` of keys and values, each ``(B * nh, S, hs)``."""
        return LayerCache(key=self._cached(self.key(context)),
                          value=self._cached(self.value(context)))

    def __call__(self, hidden_states, context=None, mask=None, cache=None, cache_index=None):
        B, T, C = hidden_states.shape
        one_product = (self._qkv_kernel is not None and cache is not None and context is None
                       and cache_index is not None)
        if one_product:
            q, new = self._vector_projections(hidden_states)
        else:
            q = self._heads(self.query(hidden_states))
        if cache is None:
            context = hidden_states if context is None else context
            k, v = self._heads(self.key(context)), self._heads(self.value(context))
            y = attention(q, k, v, mask, self.attention_dropout, self.implementation)
            return self.output(y.reshape(B, T, C))  # y: (B, T, nh, hs)
        if context is not None:
            raise ValueError("attention with a cache takes no context: cross-attention reads "
                             "the context's keys and values from the cache")
        if cache_index is not None:  # self-attention: write this call's slots, read them all
            if not one_product:
                new = self.key_value(hidden_states)

            def write(slots, x):
                return jax.lax.dynamic_update_slice(slots, x.astype(slots.dtype),
                                                    (0, cache_index, 0))

            cache = LayerCache(key=write(cache.key, new.key),
                               value=write(cache.value, new.value))
        # The cache is (B * nh, L, hs), the layout batched matmuls read directly
        # (jax.nn.dot_product_attention takes (B, L, nh, hs) keys and had XLA transpose the whole
        # cache at every step); flash attention brings nothing to a few queries, so the config's
        # implementation applies to uncached calls only.
        y = cached_attention(q, cache.key, cache.value, mask, _active(self.attention_dropout))
        return self.output(y.reshape(B, T, C)), cache
