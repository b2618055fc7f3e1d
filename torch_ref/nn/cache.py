"""Twin of ``jaxformer/nn/cache.py``: the KV cache of cached decoding, as plain dataclasses.

The same classes, fields and shapes as jaxformer's; the tensors are written in place (torch's
idiom; jaxformer returns new arrays), ``index`` is a Python int, and a stack's ``layers`` is
always a tuple of per-layer caches (torch has no scanned stack). ``torch_ref.generation`` carries
a cache through its decoding loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch


@dataclasses.dataclass
class LayerCache:
    """One attention's keys and values, ``(B * nh, L, hs)`` (row ``b``'s heads at ``b * nh ...
    b * nh + nh - 1``)."""

    key: torch.Tensor
    value: torch.Tensor


@dataclasses.dataclass
class DecoderLayerCache:
    """An encoder-decoder decoder layer's self-attention and cross-attention caches."""

    self_attention: LayerCache
    cross_attention: LayerCache


@dataclasses.dataclass
class GPTCache:
    """``layers`` (a LayerCache per block), ``mask`` ``(B, L)`` bool, ``index`` (slots filled),
    ``positions`` ``(B,)`` (each row's next real token's position)."""

    layers: tuple[LayerCache, ...]
    mask: torch.Tensor
    index: int
    positions: torch.Tensor


@dataclasses.dataclass
class Seq2SeqCache:
    """``layers`` (a DecoderLayerCache per decoder layer), ``mask`` ``(B, L)`` bool, ``index``
    (target slots filled), ``source_mask`` ``(B, S)`` bool."""

    layers: tuple[DecoderLayerCache, ...]
    mask: torch.Tensor
    index: int
    source_mask: torch.Tensor


def map_rows(cache: GPTCache | Seq2SeqCache, fn: Callable) -> GPTCache | Seq2SeqCache:
    """``fn(tensor, axis)`` on every per-row tensor of ``cache``, ``axis`` being its batch axis
    (always 0 here; keys and values are seen as ``(B, nh, L, hs)``, their rows and heads split
    apart, joined again after); the int ``index`` is kept."""
    B = cache.mask.shape[0]

    def rows(x):
        if isinstance(x, LayerCache):
            return LayerCache(*(fn(t.view(B, -1, *t.shape[1:]), 0).flatten(0, 1)
                                for t in (x.key, x.value)))
        if isinstance(x, torch.Tensor):
            return fn(x, 0)
        if isinstance(x, tuple):
            return tuple(rows(item) for item in x)
        if dataclasses.is_dataclass(x):
            return dataclasses.replace(x, **{field.name: rows(getattr(x, field.name))
                                             for field in dataclasses.fields(x)})
        return x

    return rows(cache)
