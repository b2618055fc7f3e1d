"""Attention inputs the attention tests share: random queries, keys and values, the mask kinds,
and the kinds ``jaxformer.nn.attention.cudnn_attention`` sorts into its branches
(``nn/test_attention.py`` runs them through XLA's kernel on a CPU, ``test_gpu.py`` through
cuDNN)."""

from __future__ import annotations

import jax
import numpy as np

from jaxformer.nn.masks import causal_mask, combine_masks, padding_mask
from parity_tests.support.helpers import make_attention_mask


def qkv(rng, B, T, S, nh, hs, scale=2.0):
    """Random queries/keys/values; ``scale`` makes the softmax peaked enough to expose mask bugs."""
    q = (rng.randn(B, T, nh, hs) * scale).astype(np.float32)
    k = (rng.randn(B, S, nh, hs) * scale).astype(np.float32)
    v = rng.randn(B, S, nh, hs).astype(np.float32)
    return q, k, v


def build_mask(kind, B, T, S, nh, rng):
    """``(B, 1 or nh, T, S)`` boolean mask of the named kind, or None."""
    if kind == "none":
        return None
    if kind in ("right_padding", "left_padding", "fully_padded_row"):
        return np.asarray(padding_mask(make_attention_mask(kind, B, S)))
    if kind == "causal":
        return np.asarray(causal_mask(T, S))
    if kind == "causal_right_padding":  # key 0 is always real, so no row is fully masked
        return np.asarray(combine_masks(padding_mask(make_attention_mask("right_padding", B, S)),
                                        causal_mask(T, S)))
    if kind == "causal_left_padding":  # the leading padded queries see no real key
        return np.asarray(combine_masks(padding_mask(make_attention_mask("left_padding", B, S)),
                                        causal_mask(T, S)))
    if kind == "random_per_head":  # every row keeps its diagonal-ish key
        mask = rng.rand(B, nh, T, S) < 0.5
        mask[..., np.arange(T), np.arange(T) % S] = True
        return mask
    raise ValueError(kind)


# mask kind -> the branch of ``mask_pattern`` at T == S and at T != S: 0 the bias, 1 key lengths,
# 2 causal with key lengths, 3 causal ("all_keys": a mask that masks nothing, as a padding mask)
BRANCHES = {"right_padding": (1, 1), "all_keys": (1, 1), "left_padding": (0, 0),
            "fully_padded_row": (0, 0), "causal": (3, 0), "causal_right_padding": (2, 0),
            "causal_left_padding": (0, 0)}


def branch_mask(kind, B, T, S, rng):
    """The boolean mask of a ``BRANCHES`` kind, ``(B or 1, 1, T or 1, S)``."""
    return np.ones((B, 1, 1, S), bool) if kind == "all_keys" else build_mask(kind, B, T, S, 1,
                                                                             rng)


def xla_kernel(*args, **kwargs):
    """``jax.nn.dot_product_attention`` with XLA: it takes cuDNN's mask arguments
    (``is_causal``, ``key_value_seq_lengths``) too."""
    return jax.nn.dot_product_attention(*args, **kwargs, implementation="xla")
