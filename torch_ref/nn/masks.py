"""Twin of ``jaxformer/nn/masks.py``: boolean ``[batch, 1, q_len, k_len]`` masks, True = attend."""

from __future__ import annotations

import torch

from jaxformer.numerics import MASK_VALUE  # noqa: F401  (re-exported: the masks' fill value)


def lengths_to_attention_mask(lengths, max_len: int) -> torch.Tensor:
    lengths = torch.as_tensor(lengths)
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def padding_mask(attention_mask) -> torch.Tensor:
    return torch.as_tensor(attention_mask).bool()[:, None, None, :]


def causal_mask(q_len: int, k_len: int | None = None, device=None) -> torch.Tensor:
    k_len = q_len if k_len is None else k_len
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=k_len - q_len)[None, None]


def combine_masks(*masks) -> torch.Tensor | None:
    masks = [m for m in masks if m is not None]
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = torch.logical_and(out, m)
    return out
