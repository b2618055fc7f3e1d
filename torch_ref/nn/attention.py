"""Twin of ``jaxformer/nn/attention.py``: scaled dot-product attention and multi-head attention.

torch works heads-first, ``(B, nh, T, hs)``, the layout ``F.scaled_dot_product_attention`` takes.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from jaxformer.numerics import MASK_VALUE
from torch_ref.nn.cache import LayerCache


def fused_attention(q, k, v, mask, dropout, *, implementation: str):
    """``F.scaled_dot_product_attention`` with an additive float mask holding MASK_VALUE: a row
    with every key masked then has all scores equal and a uniform softmax, exactly as in
    jaxformer (SDPA's boolean mask gives zeros there in torch 2.13, NaN in older releases)."""
    if mask is not None:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask,
                                                                                   MASK_VALUE)
    p = 0.0 if dropout is None else dropout.p
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


def einsum_attention(q, k, v, mask, dropout):
    """Scores and softmax in float32, under ``torch.autocast`` too: autocast would run the
    scores' matmul in bfloat16 and round them (and a bfloat16 softmax its output) before the
    probabilities. A product of two bfloat16 numbers is exact in float32, so this is jaxformer's
    bfloat16 x bfloat16 -> float32 einsum; the probabilities then take ``v``'s dtype."""
    with torch.autocast(q.device.type, enabled=False):
        scores = torch.einsum("bhtd,bhsd->bhts", q.float(), k.float()) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, MASK_VALUE)
        weights = torch.softmax(scores, dim=-1).to(v.dtype)
    if dropout is not None:
        weights = dropout(weights)
    return torch.einsum("bhts,bhsd->bhtd", weights, v)  # (B, nh, T, hs)


# Every implementation but "einsum" is SDPA here: torch picks its own kernel.
IMPLEMENTATIONS = {
    "xla": functools.partial(fused_attention, implementation="xla"),
    "cudnn": functools.partial(fused_attention, implementation="cudnn"),
    "einsum": einsum_attention,
}


def attention(q, k, v, mask=None, dropout: nn.Dropout | None = None,
              implementation: str = "auto"):
    """``(B, nh, T, hs)`` attention with a boolean mask (True = may attend), softmax in float32."""
    active = dropout if dropout is not None and dropout.training and dropout.p > 0 else None
    if implementation == "auto":
        implementation = "xla"  # SDPA applies dropout itself
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r} is not one of "
                         f"{('auto', *IMPLEMENTATIONS)}")
    return IMPLEMENTATIONS[implementation](q, k, v, mask, active)


def cache_mask(valid, cache_index, q_len: int) -> torch.Tensor:
    """Twin of jaxformer's: boolean ``(B, 1, T, L)``, causal over cache slots AND ``valid``."""
    slots = torch.arange(valid.shape[1], device=valid.device)
    queries = cache_index + torch.arange(q_len, device=valid.device)
    causal = slots[None, :] <= queries[:, None]  # (T, L)
    return torch.logical_and(causal[None, None], valid[:, None, None, :])


class MultiHeadAttention(nn.Module):
    """Twin of jaxformer's, cache included: a ``LayerCache`` of ``(B * nh, L, hs)`` keys and
    values (viewed as ``(B, nh, L, hs)`` for attention), which a self-attention call writes its
    slots into in place (torch's idiom; jaxformer returns new arrays) before returning it."""

    def __init__(self, config):
        super().__init__()
        C = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(C, C)
        self.key = nn.Linear(C, C)
        self.value = nn.Linear(C, C)
        self.output = nn.Linear(C, C)
        self.attention_dropout = nn.Dropout(config.attention_dropout_rate)
        self.implementation = config.attention_implementation

    def _heads(self, x):
        """``(B, T, C)`` -> ``(B, nh, T, hs)``."""
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def key_value(self, context) -> LayerCache:
        """``(B, S, C)`` -> a ``LayerCache`` of keys and values, each ``(B * nh, S, hs)``."""
        def cached(projection):
            return self._heads(projection(context)).reshape(-1, context.shape[1], self.head_dim)

        return LayerCache(key=cached(self.key), value=cached(self.value))

    def forward(self, hidden_states, context=None, mask=None, cache=None, cache_index=None):
        B, T, C = hidden_states.shape
        q = self._heads(self.query(hidden_states))
        if cache is None:
            context = hidden_states if context is None else context
            k, v = self._heads(self.key(context)), self._heads(self.value(context))
        else:
            if context is not None:
                raise ValueError("attention with a cache takes no context: cross-attention "
                                 "reads the context's keys and values from the cache")
            if cache_index is not None:  # self-attention: write this call's slots, read them all
                new = self.key_value(hidden_states)
                cache.key[:, cache_index:cache_index + T] = new.key
                cache.value[:, cache_index:cache_index + T] = new.value
            # (B * nh, L, hs) -> (B, nh, L, hs): a view
            k, v = (x.view(B, self.num_heads, -1, self.head_dim) for x in (cache.key, cache.value))
        y = attention(q, k, v, mask, self.attention_dropout, self.implementation)  # (B, nh, T, hs)
        out = self.output(y.transpose(1, 2).reshape(B, T, C))
        return out if cache is None else (out, cache)
