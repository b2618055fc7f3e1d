"""Attention masks for every family: boolean ``[batch, 1, q_len, k_len]``, True = may attend.

That is the convention of ``jax.nn.dot_product_attention`` and of torch SDPA's boolean mask; the
public input is a Hugging Face style ``attention_mask`` ``[batch, seq]``, 1/True for a real token.
Masks are combined with logical AND; ``None`` means "attend everywhere". Twin:
``torch_ref/nn/masks.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# A query row whose keys are all masked gets every score replaced by the same MASK_VALUE, so its
# softmax is uniform and its output is the mean of all value vectors: finite, and identical in
# both frameworks. Such rows carry no meaning; compare them only in tests about padded rows.
from jaxformer.numerics import MASK_VALUE  # noqa: F401  (re-exported: the masks' fill value)


def lengths_to_attention_mask(lengths, max_len: int) -> jnp.ndarray:
    """``[batch]`` valid lengths (seed 003's ``valid_lens``) -> ``[batch, max_len]`` bool mask."""
    lengths = jnp.asarray(lengths)
    return jnp.arange(max_len)[None, :] < lengths[:, None]


def padding_mask(attention_mask) -> jnp.ndarray:
    """``[batch, k_len]`` 1/0 mask -> ``[batch, 1, 1, k_len]``: every query may see real keys."""
    return jnp.asarray(attention_mask).astype(bool)[:, None, None, :]


def causal_mask(q_len: int, k_len: int | None = None) -> np.ndarray:
    """``[1, 1, q_len, k_len]``: query i sees keys j <= i (+ k_len - q_len when they differ).
    A numpy array: inside a traced model it stays a constant known at trace time, so attention
    can choose its kernel for it then (``attention.cudnn_attention``); combined with a traced
    padding mask it becomes part of the traced mask."""
    k_len = q_len if k_len is None else k_len
    return np.tril(np.ones((q_len, k_len), dtype=bool), k=k_len - q_len)[None, None]


def combine_masks(*masks: jax.Array | np.ndarray | None) -> jax.Array | np.ndarray | None:
    """Logical AND of the masks that are not None (broadcasting); None if all are None."""
    given = [m for m in masks if m is not None]
    if not given:
        return None
    out = given[0]
    for m in given[1:]:
        out = jnp.logical_and(out, m)
    return out
