"""The encoder-decoder generates the same target ids in both twins, and greedy decoding with the
cache equals greedy decoding by full forward passes (no Hugging Face twin exists for this model:
the independent reference is the uncached model itself)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jaxformer.generation import generate as jax_generate
from jaxformer.models import encoder_decoder as jed
from parity_tests.support.generation import MIN_GAP, SEQ2SEQ_PRE_LN, model_pair, top2_gap
from torch_ref.generation import generate as torch_generate
from torch_ref.models import encoder_decoder as ted

START, PAD, MAX_NEW = 1, 2, 8


def source():
    rng = np.random.RandomState(9)
    src = rng.randint(1, 23, (3, 6))
    src_mask = np.ones((3, 6), np.int64)
    src_mask[1, 4:] = 0
    src_mask[2, 2:] = 0
    return src, src_mask


def naive_greedy(model, src, src_mask, eos):
    """Greedy by full forward passes over the whole target so far; returns ids and the
    smallest top-2 logit gap of the decisions."""
    tgt = np.full((len(src), 1), START)
    running = np.ones(len(src), bool)
    gaps = []
    with torch.no_grad():
        for _ in range(MAX_NEW):
            logits = model(torch.tensor(src), torch.tensor(tgt), torch.tensor(src_mask),
                           torch.ones(tgt.shape, dtype=torch.long)).numpy()[:, -1]
            gaps.append(top2_gap(logits)[running])
            token = np.where(running, logits.argmax(-1), PAD)
            tgt = np.concatenate([tgt, token[:, None]], axis=1)
            running &= token != eos
            if not running.any():
                break
    return tgt, float(np.concatenate(gaps).min())


@pytest.mark.usefixtures("scan_layers")
def test_greedy_equals_full_forward_greedy_in_both_twins():
    torch_model, jax_model = model_pair(ted.Transformer, jed.Transformer, SEQ2SEQ_PRE_LN)
    src, src_mask = source()
    free, _ = naive_greedy(torch_model, src, src_mask, eos=None)
    eos = int(free[0, 3])  # row 0 stops after three tokens
    expected, gap = naive_greedy(torch_model, src, src_mask, eos)
    assert gap > MIN_GAP
    kwargs = dict(max_new_tokens=MAX_NEW, decoder_start_token_id=START, eos_token_id=eos,
                  pad_token_id=PAD)
    np.testing.assert_array_equal(np.asarray(jax_generate(jax_model, src, src_mask, **kwargs)),
                                  expected)
    np.testing.assert_array_equal(torch_generate(torch_model, src, src_mask, **kwargs).numpy(),
                                  expected)
    assert (expected[0, 4:] == PAD).all()


@pytest.mark.usefixtures("scan_layers")
@pytest.mark.parametrize("num_beams", [3])
def test_beam_search_and_sampling_identical_in_both_twins(num_beams):
    torch_model, jax_model = model_pair(ted.Transformer, jed.Transformer, SEQ2SEQ_PRE_LN)
    src, src_mask = source()
    for kwargs in (dict(num_beams=num_beams, length_penalty=0.5, eos_token_id=5),
                   dict(do_sample=True, temperature=2.0, top_k=10, seed=3)):
        kwargs |= dict(max_new_tokens=MAX_NEW, decoder_start_token_id=START, pad_token_id=PAD)
        ours = np.asarray(jax_generate(jax_model, src, src_mask, **kwargs))
        twin = torch_generate(torch_model, src, src_mask, **kwargs).numpy()
        np.testing.assert_array_equal(ours, twin, err_msg=str(kwargs))
        assert (ours[:, 0] == START).all()
        assert ours.shape[1] > 1
