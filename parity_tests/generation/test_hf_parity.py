"""Greedy and beam search give the same tokens in jaxformer, torch_ref and Hugging Face.

One random GPT-2 checkpoint is made with transformers (perturbed weights, so logits are
decisive), saved, and loaded into both twins through ``hf.from_pretrained``. The prompts are a
left-padded batch with 7, 4 and 2 real tokens. Cases: greedy (num_beams=1) and beam search with
num_beams 2 and 4, each without and with an eos token (chosen among the tokens the search
produces without one, so that hypotheses do finish early), length penalties 0.5, 1 and 2, and
``early_stopping`` True and "never". Every token of every returned row is compared (padding of
finished rows included), and the shapes must agree: the search stops where HF's stops.

Near ties: a token decided by a logit gap below ``MIN_GAP`` could flip on float noise, so the
test first asserts that every compared decision is clear of it: greedy, the top-2 gap of HF's
logits at every step of every unfinished row; beam search, the top-2 gap along the returned
hypotheses (teacher-forced) and the gap between the two best final beam scores.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jaxformer.checkpoints import hf
from jaxformer.generation import generate as jax_generate
from parity_tests.support.generation import MIN_GAP, hf_gpt2, left_padded, top2_gap
from torch_ref.generation import generate as torch_generate

MAX_NEW = 12
PAD = 100  # not 0: HF's beam search fills with eos when pad_token_id is 0 (see decoding.py)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    reference = hf_gpt2(seed=3)
    directory = tmp_path_factory.mktemp("gpt2")
    reference.save_pretrained(directory)
    ids, mask = left_padded(np.random.RandomState(5), 101, [7, 4, 2], 7)
    jax_model = hf.from_pretrained(directory, "jax")
    return reference, jax_model, hf.from_pretrained(directory, "torch"), ids, mask


def hf_generate(reference, ids, mask, **kwargs):
    with torch.no_grad():
        return reference.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                                  max_new_tokens=MAX_NEW, do_sample=False, top_k=None,
                                  pad_token_id=PAD, **kwargs)


def eos_from(tokens: np.ndarray, prompt_width: int) -> int:
    """A token the search without eos produces in row 1 early on: with it as eos, that row
    finishes early (and others may)."""
    return int(tokens[1, prompt_width + 2])


def compare(models, **kwargs) -> int:
    """Run all three; assert identical tokens; return how many tokens were compared."""
    reference, jax_model, torch_model, ids, mask = models
    expected = hf_generate(reference, ids, mask, **kwargs).numpy()
    ours = {"jax": np.asarray(jax_generate(jax_model, ids, mask, max_new_tokens=MAX_NEW,
                                           pad_token_id=PAD, **kwargs)),
            "torch": torch_generate(torch_model, ids, mask, max_new_tokens=MAX_NEW,
                                    pad_token_id=PAD, **kwargs).numpy()}
    for framework, tokens in ours.items():
        assert tokens.shape == expected.shape, f"{framework} {kwargs}: shape {tokens.shape} " \
                                               f"vs Hugging Face {expected.shape}"
        np.testing.assert_array_equal(tokens, expected, err_msg=f"{framework} {kwargs}")
    generated = expected.shape[1] - ids.shape[1]
    print(f"{kwargs}: {expected.shape[0]} rows x {generated} new tokens compared "
          f"(x2 frameworks)")
    return expected.shape[0] * generated


def greedy_gap(models, **kwargs) -> float:
    """Smallest top-2 logit gap over the steps where a row was still running."""
    reference, _, _, ids, mask = models
    out = hf_generate(reference, ids, mask, output_logits=True, return_dict_in_generate=True,
                      **kwargs)
    logits = np.stack([step.numpy() for step in out.logits], axis=1)  # (B, steps, V)
    running = np.ones(logits.shape[:2], bool)
    eos = kwargs.get("eos_token_id")
    if eos is not None:
        new = out.sequences.numpy()[:, ids.shape[1]:]
        done_before = np.cumsum(new == eos, axis=1) - (new == eos)
        running = done_before == 0
    return float(top2_gap(logits)[running].min())


def generated_lengths(new: np.ndarray, eos) -> np.ndarray:
    """Generated length of each row: up to and including its first eos, else all of it."""
    if eos is None:
        return np.full(len(new), new.shape[1])
    hit = new == eos
    return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, new.shape[1])


def beam_gaps(models, num_beams, **kwargs) -> tuple[float, float]:
    """Margins of the beam decisions over float noise, each > 1 when clear: (smallest top-2
    logit gap along the returned hypotheses / MIN_GAP, smallest gap between the two best final
    scores / the noise those scores can carry). A final score is a sum of log-probabilities
    (trusted to MIN_GAP) divided by ``length ** length_penalty``, so its noise is MIN_GAP /
    length ** length_penalty."""
    reference, _, _, ids, mask = models
    P, eos = ids.shape[1], kwargs.get("eos_token_id")
    best = hf_generate(reference, ids, mask, num_beams=num_beams, **kwargs).numpy()
    full_mask = np.concatenate([mask, np.ones((len(ids), best.shape[1] - P), np.int64)], axis=1)
    positions = np.where(full_mask > 0, np.cumsum(full_mask, axis=1) - 1, 0)
    with torch.no_grad():
        logits = reference(torch.tensor(best), attention_mask=torch.tensor(full_mask),
                           position_ids=torch.tensor(positions)).logits.numpy()
    decisions = logits[:, P - 1:-1]  # the logits that chose each generated token
    live = np.arange(best.shape[1] - P)[None] < generated_lengths(best[:, P:], eos)[:, None]
    scored = hf_generate(reference, ids, mask, num_beams=num_beams,
                         num_return_sequences=num_beams, output_scores=True,
                         return_dict_in_generate=True, **kwargs)
    final = scored.sequences_scores.numpy().reshape(len(ids), num_beams)
    lengths = generated_lengths(scored.sequences.numpy()[:, P:], eos).reshape(len(ids),
                                                                            num_beams)
    penalty = kwargs.get("length_penalty", 1.0)
    noise = MIN_GAP / lengths[:, 0] ** penalty + MIN_GAP / lengths[:, 1] ** penalty
    return (float(top2_gap(decisions)[live].min()) / MIN_GAP,
            float(((final[:, 0] - final[:, 1]) / noise).min()))


def test_greedy_matches_hugging_face(models):
    reference, _, _, ids, mask = models
    assert greedy_gap(models) > MIN_GAP
    count = compare(models)
    eos = eos_from(hf_generate(reference, ids, mask).numpy(), ids.shape[1])
    assert greedy_gap(models, eos_token_id=eos) > MIN_GAP
    count += compare(models, eos_token_id=eos)
    tokens = np.asarray(jax_generate(models[1], ids, mask, max_new_tokens=MAX_NEW,
                                     eos_token_id=eos, pad_token_id=PAD))
    assert (tokens == PAD).any(), "eos should have finished a row early"
    assert count >= 60


@pytest.mark.parametrize("num_beams", [2, 4])
def test_beam_search_matches_hugging_face(models, num_beams):
    reference, _, _, ids, mask = models
    eos = eos_from(hf_generate(reference, ids, mask, num_beams=num_beams).numpy(), ids.shape[1])
    count, finished_early = 0, False
    for eos_token_id in (None, eos):
        for length_penalty in (0.5, 1.0, 2.0):
            kwargs = dict(num_beams=num_beams, length_penalty=length_penalty,
                          eos_token_id=eos_token_id)
            margins = beam_gaps(models, **kwargs)
            assert min(margins) > 1, (kwargs, margins)
            count += compare(models, **kwargs)
            if eos_token_id is not None:
                best = hf_generate(reference, ids, mask, **kwargs).numpy()
                finished_early |= bool((best[:, ids.shape[1]:] == eos).any())
    assert finished_early, "eos should end some hypotheses"
    assert count >= 6 * 3 * 8


@pytest.mark.parametrize("early_stopping", [True, "never"])
def test_beam_early_stopping_matches_hugging_face(models, early_stopping):
    reference, _, _, ids, mask = models
    eos = eos_from(hf_generate(reference, ids, mask, num_beams=4).numpy(), ids.shape[1])
    kwargs = dict(num_beams=4, eos_token_id=eos, early_stopping=early_stopping,
                  length_penalty=2.0)
    margins = beam_gaps(models, **kwargs)
    assert min(margins) > 1, margins
    assert compare(models, **kwargs) >= 3


@pytest.mark.parametrize("num_beams", [1, 2])
def test_search_stops_where_hugging_face_stops(models, num_beams):
    """Every row finished before max_new_tokens: the result is shorter, as HF's is."""
    reference, jax_model, torch_model, ids, mask = models
    row = (ids[1:2], mask[1:2])
    free = hf_generate(reference, *row, num_beams=num_beams).numpy()
    eos = int(free[0, ids.shape[1] + 3])
    sub = (reference, jax_model, torch_model, *row)
    if num_beams == 1:
        assert greedy_gap(sub, eos_token_id=eos) > MIN_GAP
    else:
        assert min(beam_gaps(sub, num_beams, eos_token_id=eos, length_penalty=0.5)) > 1
    kwargs = dict(num_beams=num_beams, eos_token_id=eos, length_penalty=0.5)
    compare(sub, **kwargs)
    tokens = hf_generate(reference, *row, **kwargs).numpy()
    assert tokens.shape[1] < ids.shape[1] + MAX_NEW
