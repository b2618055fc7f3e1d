"""Numeric conventions both frameworks compute from (numpy and the standard library only).

``torch_ref`` imports this module, like ``config`` and ``validate``, so that the two twins read one
definition of each constant instead of two copies that could drift.
"""

from __future__ import annotations

import math

import numpy as np

# The value jax.nn.dot_product_attention fills masked float32 logits with: finite, and small
# enough that exp(MASK_VALUE - max) is exactly 0 next to any real score. A query row whose keys are
# all masked has every score equal to it, so its softmax is uniform: finite, the same in both
# frameworks, and meaningless (nothing real attends to such a row).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def sinusoidal_positions(num_positions: int, hidden_size: int,
                         layout: str = "interleaved") -> np.ndarray:
    """``[num_positions, hidden_size]`` float32 table of Vaswani et al. 3.5, computed in float64.

    ``layout="interleaved"``: sin on even dims, cos on odd dims (the paper, seed 002).
    ``layout="split"``: MarianMT's table, the same frequencies with the sines in the first
    ``ceil(hidden/2)`` features and the cosines after them, computed as transformers computes it
    (``pos / 10000 ** (2 * (j // 2) / hidden)``), so the float32 table is bit-identical to its.
    """
    if layout == "split":
        j = np.arange(hidden_size)
        angles = (np.arange(num_positions, dtype=np.float64)[:, None]
                  / np.power(10000, 2 * (j // 2) / hidden_size)[None])
        half = (hidden_size + 1) // 2
        table = np.empty((num_positions, hidden_size), dtype=np.float64)
        table[:, :half] = np.sin(angles[:, 0::2])
        table[:, half:] = np.cos(angles[:, 1::2])
        return table.astype(np.float32)
    if layout != "interleaved":
        raise ValueError(f"sinusoidal layout {layout!r} is not 'interleaved' or 'split'")
    position = np.arange(num_positions, dtype=np.float64)[:, None]
    div_term = np.exp(np.arange(0, hidden_size, 2, dtype=np.float64)
                      * (-math.log(10000.0) / hidden_size))
    table = np.zeros((num_positions, hidden_size), dtype=np.float64)
    table[:, 0::2] = np.sin(position * div_term)
    table[:, 1::2] = np.cos(position * div_term)[:, : hidden_size // 2]
    return table.astype(np.float32)
