"""The KV cache of cached decoding: typed pytrees (``flax.struct``) that jit, scan and
while_loop carry. Attention reads and writes a :class:`LayerCache`; ``GPT.init_cache`` and
``Transformer.init_cache`` build a :class:`GPTCache` / :class:`Seq2SeqCache`, and every cached
call returns ``(output, new cache)``. Shapes: B batch, nh heads, L slots, S source, hs head size;
a stack's ``layers`` is a tuple (unrolled) or one cache with a leading layer axis (scanned, see
``nn/stack.py``). Twin: ``torch_ref/nn/cache.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
from flax import struct


@struct.dataclass
class LayerCache:
    """One attention's keys and values, ``(B * nh, L, hs)``: one entry per row and head, row
    ``b``'s heads at ``b * nh ... b * nh + nh - 1``, the layout the batched products of attention
    read as it is (``attention.cached_attention``); ``(layers, B * nh, L, hs)`` in a scanned
    stack. Self-attention writes its slots into it; cross-attention's holds the source's
    ``(B * nh, S, hs)``, computed once."""

    key: jax.Array
    value: jax.Array


@struct.dataclass
class DecoderLayerCache:
    """An encoder-decoder decoder layer's cache: its self-attention's keys and values (L slots)
    and its cross-attention's, projected from the encoder memory once (S positions)."""

    self_attention: LayerCache
    cross_attention: LayerCache


@struct.dataclass
class GPTCache:
    """A decoder-only model's cache (``GPT.init_cache``).

    - ``layers``: a :class:`LayerCache` per block (see the module doc for scanned stacks);
    - ``mask``: ``(B, L)`` bool, True at the filled slots that hold real tokens;
    - ``index``: ``()`` int32, the slots filled (the next call writes from there);
    - ``positions``: ``(B,)`` int32, each row's next real token's position (its count of real
      tokens, so left padding costs no position).
    """

    layers: tuple[LayerCache, ...] | LayerCache
    mask: jax.Array
    index: jax.Array
    positions: jax.Array


@struct.dataclass
class Seq2SeqCache:
    """The encoder-decoder's cache (``Transformer.init_cache``).

    - ``layers``: a :class:`DecoderLayerCache` per decoder layer (self- and cross-attention);
    - ``mask``: ``(B, L)`` bool, True at the filled target slots that hold real tokens;
    - ``index``: ``()`` int32, the target slots filled; the next token's position;
    - ``source_mask``: ``(B, S)`` bool, the real source tokens the cross-attention reads.
    """

    layers: tuple[DecoderLayerCache, ...] | DecoderLayerCache
    mask: jax.Array
    index: jax.Array
    source_mask: jax.Array


def map_rows(cache: GPTCache | Seq2SeqCache, fn: Callable) -> GPTCache | Seq2SeqCache:
    """``fn(array, axis)`` on every per-row array of ``cache``, ``axis`` being its batch axis: 0,
    or 1 in the layers of a scanned stack, whose keys and values ``fn`` sees as ``(..., B, nh,
    L, hs)`` (their rows and heads split apart, joined again after). The scalar ``index`` is
    kept. Beam search repeats and reorders the rows with it."""
    layer_axis = 0 if isinstance(cache.layers, tuple) else 1
    rows = {field.name: fn(getattr(cache, field.name), 0) for field in dataclasses.fields(cache)
            if field.name not in ("layers", "index")}
    B = cache.mask.shape[0]

    def heads_apart(x):
        before, after = x.shape[:layer_axis], x.shape[layer_axis + 1:]
        y = fn(x.reshape(*before, B, x.shape[layer_axis] // B, *after), layer_axis)
        return y.reshape(*before, -1, *after)

    layers = jax.tree.map(heads_apart, cache.layers)
    return dataclasses.replace(cache, layers=layers, **rows)
