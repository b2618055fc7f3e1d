"""Sampling: the processed distributions equal Hugging Face's logits processors on the same
logits; the sampler, fed the same uniforms, draws the same tokens in both frameworks and follows
the processed distribution; a seeded run is reproducible and identical in both twins."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from scipy import stats
from transformers.generation import logits_process as hf_processors

from jaxformer.generation import checks
from jaxformer.generation import generate as jax_generate
from jaxformer.generation import processors as jproc
from jaxformer.models import gpt as jgpt
from parity_tests.support.generation import GPT_PRE_LN, left_padded, model_pair
from torch_ref.generation import generate as torch_generate
from torch_ref.generation import processors as tproc
from torch_ref.models import gpt as tgpt

V = 50
SETTINGS = [  # generate's sampling arguments
    dict(temperature=0.7),
    dict(top_k=5),
    dict(top_p=0.8),
    dict(top_p=1e-6),  # only the best token survives
    dict(temperature=1.3, top_k=12, top_p=0.9),
    dict(temperature=0.5, top_k=1, top_p=0.5),
    dict(temperature=2.0, top_k=3, top_p=0.6, num_beams=3),  # beam sampling keeps >= 2 tokens
    dict(temperature=2.0, top_k=1, top_p=1e-6, num_beams=2, eos_token_id=[4, 5]),  # keeps 3
]


def hf_process(scores: np.ndarray, temperature=1.0, top_k=0, top_p=1.0, num_beams=1,
               eos_token_id=None) -> np.ndarray:
    """Hugging Face's processors, built as ``generate`` builds them for sampling."""
    n_eos = 0 if eos_token_id is None else len(eos_token_id)
    keep = (n_eos + 1 if n_eos else 2) if num_beams > 1 else 1
    chain = []
    if temperature != 1.0:
        chain.append(hf_processors.TemperatureLogitsWarper(temperature))
    if top_k:
        chain.append(hf_processors.TopKLogitsWarper(top_k, min_tokens_to_keep=keep))
    if top_p < 1.0:
        chain.append(hf_processors.TopPLogitsWarper(top_p, min_tokens_to_keep=keep))
    out = torch.tensor(scores)
    for processor in chain:
        out = processor(None, out)
    return out.numpy()


def ours(scores: np.ndarray, framework: str, **setting) -> np.ndarray:
    options, values = checks.check_generate(vocab_size=scores.shape[-1], max_new_tokens=1,
                                            do_sample=True, **setting)
    if framework == "jax":
        values = {k: jnp.asarray(v) for k, v in values.as_dict().items()}
        return np.asarray(jproc.process(jnp.asarray(scores), options, values))
    values = {k: torch.as_tensor(v) for k, v in values.as_dict().items() if k != "seed"}
    return tproc.process(torch.tensor(scores), options, values).numpy()


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_processed_distributions_equal_hugging_face(setting):
    scores = (3 * np.random.RandomState(0).randn(16, V)).astype(np.float32)
    expected = hf_process(scores, **setting)
    expected_probs = torch.softmax(torch.tensor(expected), -1).numpy()
    for framework in ("jax", "torch"):
        processed = ours(scores, framework, **setting)
        np.testing.assert_array_equal(np.isinf(processed), np.isinf(expected),
                                      err_msg=f"{framework}: kept tokens differ from HF")
        kept = ~np.isinf(expected)
        np.testing.assert_allclose(processed[kept], expected[kept], rtol=1e-6)
        probs = torch.softmax(torch.tensor(processed), -1).numpy()
        np.testing.assert_allclose(probs, expected_probs, rtol=1e-5, atol=1e-7)
    if set(setting) != {"temperature"}:  # a filter ran: it removed something, kept something
        assert 0 < kept.sum() < kept.size


def test_top_k_keeps_ties_and_top_p_keeps_the_best():
    scores = np.array([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0]], np.float32)
    for framework in ("jax", "torch"):
        top_k = ours(scores, framework, top_k=2)
        assert np.isfinite(top_k).sum() == 4, f"{framework}: ties with the 2nd are kept"
        np.testing.assert_array_equal(np.isfinite(top_k),
                                      np.isfinite(hf_process(scores, top_k=2)))
        top_p = ours(scores, framework, top_p=1e-6)
        np.testing.assert_array_equal(np.isfinite(top_p), [[1, 0, 0, 0, 0, 0]])


def test_uniforms_are_bit_identical_and_uniform():
    reference = checks.uniforms(seed=7, step=3, rows=4, cols=1000)
    np.testing.assert_array_equal(np.asarray(jproc.uniforms(np.uint32(7), 3, 4, 1000)),
                                  reference)
    np.testing.assert_array_equal(tproc.uniforms(7, 3, 4, 1000).numpy(), reference)
    assert reference.min() > 0
    assert reference.max() < 1
    assert stats.kstest(reference.ravel(), "uniform").pvalue > 1e-3
    other_step = checks.uniforms(seed=7, step=4, rows=4, cols=1000)
    assert np.abs(np.corrcoef(reference.ravel(), other_step.ravel())[0, 1]) < 0.05


def test_sampler_on_external_uniforms_draws_identical_tokens():
    rng = np.random.RandomState(1)
    scores = (2 * rng.randn(64, V)).astype(np.float32)
    scores[:, :10] = -np.inf  # filtered tokens are never drawn
    u = rng.uniform(1e-7, 1 - 1e-7, size=scores.shape).astype(np.float32)
    jax_tokens = np.asarray(jproc.sample(jnp.asarray(scores), jnp.asarray(u)))
    torch_tokens = tproc.sample(torch.tensor(scores), torch.tensor(u)).numpy()
    np.testing.assert_array_equal(jax_tokens, torch_tokens)
    assert (jax_tokens >= 10).all()
    jax_k = np.asarray(jproc.sample_without_replacement(jnp.asarray(scores), jnp.asarray(u), 5))
    torch_k = tproc.sample_without_replacement(torch.tensor(scores), torch.tensor(u), 5).numpy()
    np.testing.assert_array_equal(jax_k, torch_k)
    assert all(len(set(row)) == 5 for row in jax_k)


def test_greedy_picks_argmax_first_index_in_both_twins():
    """``processors.greedy`` (two plain reductions in jaxformer) is ``argmax``: the first index of
    the largest score on ties, of the first NaN when a row has one, index 0 of an all ``-inf``
    row; jitted too, and for any leading shape. The same tokens as torch's ``argmax``."""
    import jax

    rng = np.random.RandomState(2)
    scores = rng.randn(3, 8, V).astype(np.float32)
    scores[0, 1, [5, 17, 40]] = 9.0  # a tie: the first index
    scores[0, 2, [3, 30]] = np.nan  # NaN wins, the first one
    scores[0, 3] = -np.inf
    scores[0, 4, -1] = np.inf
    scores[0, 5] = 1.0  # all equal
    expected = np.argmax(scores, axis=-1)
    assert list(expected[0, 1:6]) == [5, 3, 0, V - 1, 0]
    for fn in (jproc.greedy, jax.jit(jproc.greedy)):
        out = np.asarray(fn(jnp.asarray(scores)))
        assert out.dtype == np.int32
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(np.asarray(fn(jnp.asarray(scores[0, 1]))), expected[0, 1])
    np.testing.assert_array_equal(tproc.greedy(torch.tensor(scores)).numpy(), expected)


def test_sampler_follows_the_processed_distribution():
    """20000 draws from one processed row: a chi-square test against softmax(processed)."""
    scores = np.array([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5]], np.float32)
    processed = ours(scores, "jax", temperature=0.8, top_p=0.9)
    probs = torch.softmax(torch.tensor(processed, dtype=torch.float64), -1).numpy()[0]
    rows = np.repeat(processed, 20000, axis=0)
    u = checks.uniforms(seed=11, step=0, rows=20000, cols=scores.shape[1])
    tokens = np.asarray(jproc.sample(jnp.asarray(rows), jnp.asarray(u)))
    counts = np.bincount(tokens, minlength=scores.shape[1])
    kept = probs > 0
    assert counts[~kept].sum() == 0
    expected = 20000 * probs[kept] / probs[kept].sum()
    assert stats.chisquare(counts[kept], expected).pvalue > 1e-3


@pytest.mark.usefixtures("scan_layers")
@pytest.mark.parametrize("num_beams", [1, 2])
def test_seeded_sampling_is_reproducible_and_identical_in_both_twins(num_beams):
    torch_model, jax_model = model_pair(tgpt.GPT, jgpt.GPT, GPT_PRE_LN)
    ids, mask = left_padded(np.random.RandomState(4), 101, [5, 3], 5)
    kwargs = dict(max_new_tokens=10, do_sample=True, temperature=4.0, top_k=20, top_p=0.95,
                  num_beams=num_beams, eos_token_id=3, pad_token_id=2)
    first = np.asarray(jax_generate(jax_model, ids, mask, seed=123, **kwargs))
    again = np.asarray(jax_generate(jax_model, ids, mask, seed=123, **kwargs))
    other = np.asarray(jax_generate(jax_model, ids, mask, seed=124, **kwargs))
    twin = torch_generate(torch_model, ids, mask, seed=123, **kwargs).numpy()
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, twin)
    assert first.shape != other.shape or (first != other).any()
    greedy = torch_generate(torch_model, ids, mask, max_new_tokens=10,
                            num_beams=num_beams).numpy()  # the twin: no compilation
    assert first.shape != greedy.shape or (first != greedy).any()
