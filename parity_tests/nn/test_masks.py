"""Mask helpers: ``jaxformer.masks`` against ``torch_ref.masks`` and against plain numpy.

Convention (DESIGN.md): boolean ``[batch, 1, q_len, k_len]``, True = may attend, combined with AND.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxformer.nn import masks as jm
from parity_tests.support.helpers import MASK_KINDS, make_attention_mask
from torch_ref.nn import masks as tm


def test_mask_value_is_shared_finite_and_annihilating():
    assert jm.MASK_VALUE == tm.MASK_VALUE
    assert np.isfinite(np.float32(jm.MASK_VALUE))
    # jax.nn.dot_product_attention fills masked float32 logits with the same constant.
    assert -0.7 * float(np.finfo(np.float32).max) == jm.MASK_VALUE
    # exp(MASK_VALUE - real score) is exactly 0 in float32, whatever the real score.
    for score in (-1e4, 0.0, 1e4):
        row = jnp.array([score, jm.MASK_VALUE], jnp.float32)
        np.testing.assert_array_equal(np.asarray(jax.nn.softmax(row)), [1.0, 0.0])
        trow = torch.tensor([score, tm.MASK_VALUE], dtype=torch.float32)
        np.testing.assert_array_equal(torch.softmax(trow, -1).numpy(), [1.0, 0.0])


def test_all_masked_row_softmax_is_uniform_in_both_frameworks():
    """The documented fully-masked-row result: every score becomes MASK_VALUE -> uniform."""
    scores = np.random.RandomState(0).randn(5).astype(np.float32) * 10
    jax_row = jax.nn.softmax(jnp.where(jnp.zeros(5, bool), scores, jm.MASK_VALUE))
    # torch_ref adds MASK_VALUE to the scores; in float32 the sum is MASK_VALUE exactly.
    torch_row = torch.softmax(torch.from_numpy(scores) + tm.MASK_VALUE, -1)
    np.testing.assert_array_equal(np.asarray(jax_row), np.full(5, 0.2, np.float32))
    np.testing.assert_array_equal(torch_row.numpy(), np.full(5, 0.2, np.float32))


@pytest.mark.parametrize(("lengths", "max_len"), [([3, 1, 5], 5), ([0, 2], 4), ([7], 7)])
def test_lengths_to_attention_mask(lengths, max_len):
    expected = np.arange(max_len)[None, :] < np.asarray(lengths)[:, None]
    got_jax = np.asarray(jm.lengths_to_attention_mask(np.asarray(lengths), max_len))
    got_torch = tm.lengths_to_attention_mask(torch.tensor(lengths), max_len).numpy()
    assert got_jax.dtype == bool
    assert got_torch.dtype == bool
    np.testing.assert_array_equal(got_jax, expected)
    np.testing.assert_array_equal(got_torch, expected)


@pytest.mark.parametrize("kind", [k for k in MASK_KINDS if k != "none"])
def test_padding_mask(kind):
    attention_mask = make_attention_mask(kind, 3, 7)
    expected = attention_mask.astype(bool)[:, None, None, :]
    got_jax = np.asarray(jm.padding_mask(attention_mask))
    got_torch = tm.padding_mask(torch.from_numpy(attention_mask)).numpy()
    assert got_jax.shape == got_torch.shape == (3, 1, 1, 7)
    np.testing.assert_array_equal(got_jax, expected)
    np.testing.assert_array_equal(got_torch, expected)
    # Boolean input gives the same mask.
    np.testing.assert_array_equal(np.asarray(jm.padding_mask(attention_mask.astype(bool))),
                                  expected)


@pytest.mark.parametrize(("q_len", "k_len"), [(4, None), (1, 1), (3, 5), (1, 6)])
def test_causal_mask(q_len, k_len):
    k = q_len if k_len is None else k_len
    # Query i (counted from the end of the keys) sees keys j <= i + (k - q).
    expected = (np.arange(k)[None, :] <= np.arange(q_len)[:, None] + (k - q_len))[None, None]
    got_jax = np.asarray(jm.causal_mask(q_len, k_len))
    got_torch = tm.causal_mask(q_len, k_len).numpy()
    np.testing.assert_array_equal(got_jax, expected)
    np.testing.assert_array_equal(got_torch, expected)
    # The last query always sees every key (cached decoding needs this).
    assert got_jax[0, 0, -1].all()


def test_combine_masks():
    assert jm.combine_masks() is None
    assert tm.combine_masks() is None
    assert jm.combine_masks(None, None) is None
    assert tm.combine_masks(None) is None
    attention_mask = make_attention_mask("right_padding", 2, 5)
    pad = attention_mask.astype(bool)[:, None, None, :]
    causal = np.tril(np.ones((5, 5), bool))[None, None]
    expected = pad & causal  # broadcasts to (2, 1, 5, 5)
    got_jax = np.asarray(jm.combine_masks(jm.padding_mask(attention_mask), None,
                                          jm.causal_mask(5)))
    got_torch = tm.combine_masks(tm.padding_mask(torch.from_numpy(attention_mask)), None,
                                 tm.causal_mask(5)).numpy()
    assert got_jax.shape == got_torch.shape == (2, 1, 5, 5)
    np.testing.assert_array_equal(got_jax, expected)
    np.testing.assert_array_equal(got_torch, expected)
    # A single mask passes through unchanged.
    np.testing.assert_array_equal(np.asarray(jm.combine_masks(None, jnp.asarray(pad))), pad)


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_make_attention_mask_helper(kind):
    """The conftest helper builds what its name says (row 0 always full)."""
    mask = make_attention_mask(kind, 3, 8)
    if kind == "none":
        assert mask is None
        return
    assert mask.shape == (3, 8)
    assert mask[0].all()
    if kind == "right_padding":
        assert all((np.diff(row) <= 0).all() for row in mask)
        assert not mask.all()
    if kind == "left_padding":
        assert all((np.diff(row) >= 0).all() for row in mask)
        assert not mask.all()
    if kind == "fully_padded_row":
        assert not mask[-1].any()
