"""Encoder-decoder generation: jaxformer, torch_ref and Hugging Face's ``generate`` give the same
tokens on random MarianMT and BART checkpoints.

Each checkpoint is made with transformers (perturbed weights, ``final_logits_bias`` included),
saved, and loaded into both twins by ``hf.from_pretrained``. The sources are one batch, right-
padded as the tokenizers pad (9, 6 and 3 real tokens). Every call passes Hugging Face's
semantics explicitly, the same to all three: ``decoder_start_token_id`` (Marian: the pad id;
BART: eos), ``eos_token_id`` (chosen among the tokens the search produces, so that rows and
hypotheses finish early), ``forced_eos_token_id`` (the last token the length allows),
``bad_words_ids`` (Marian's checkpoints ban the pad token), ``max_length`` or
``max_new_tokens``, length penalties and ``early_stopping``. Every token of every returned row is
compared, padding of finished rows included, and the shapes must agree.

Near ties, as in ``test_hf_parity.py``: every compared decision is first asserted clear of
``MIN_GAP`` (greedy: the top-2 gap of the processed scores at each step of each running row; beam:
the top-2 gap along the returned hypotheses, teacher-forced, and the gap between the two best
final scores). A single source (batch-1 decoding) too, and cached decoding equals the full
forward on the imported models.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxformer.checkpoints import hf
from jaxformer.generation import generate as jax_generate
from parity_tests.support.generation import MIN_GAP, jax_cached_decode, jax_seq2seq_cache, top2_gap
from parity_tests.support.helpers import assert_close, to_numpy
from parity_tests.support.hf_models import hf_bart_config, hf_marian_config, hf_model
from torch_ref.generation import generate as torch_generate

MAX_NEW = 10
LENGTHS = (9, 6, 3)
MODELS = {"marian": ("MarianMTModel", hf_marian_config()),
          "bart": ("BartForConditionalGeneration", hf_bart_config())}


@pytest.fixture(scope="module", params=list(MODELS))
def models(request, tmp_path_factory):
    arch, config = MODELS[request.param]
    reference = hf_model(arch, config, seed=3)
    directory = tmp_path_factory.mktemp(request.param)
    reference.save_pretrained(directory)
    rng = np.random.RandomState(5)
    src = rng.randint(3, config.vocab_size - 2, size=(len(LENGTHS), max(LENGTHS)))
    mask = (np.arange(src.shape[1])[None] < np.array(LENGTHS)[:, None]).astype(np.int64)
    src[mask == 0] = config.pad_token_id
    base = {"decoder_start_token_id": config.decoder_start_token_id,
            "pad_token_id": config.pad_token_id}
    return (request.param, reference, hf.from_pretrained(directory, "jax"),
            hf.from_pretrained(directory, "torch"), src, mask, base)


def hf_generate(models, src, mask, **kwargs):
    _, reference, *_, base = models
    kwargs = {"max_new_tokens": MAX_NEW, **kwargs} if "max_length" not in kwargs else kwargs
    with torch.no_grad():
        return reference.generate(torch.tensor(src), attention_mask=torch.tensor(mask),
                                  do_sample=False, top_k=None, **{
                                      "eos_token_id": None, "forced_eos_token_id": None,
                                      **base, **kwargs})


def compare(models, **kwargs) -> int:
    """All three; identical tokens and shapes; returns how many tokens were compared."""
    name, _, jax_model, torch_model, src, mask, base = models
    expected = hf_generate(models, src, mask, **kwargs).numpy()
    kwargs = {"max_new_tokens": MAX_NEW, **kwargs} if "max_length" not in kwargs else kwargs
    ours = {"jax": np.asarray(jax_generate(jax_model, src, mask, **base, **kwargs)),
            "torch": torch_generate(torch_model, src, mask, **base, **kwargs).numpy()}
    for framework, tokens in ours.items():
        assert tokens.shape == expected.shape, f"{name} {framework} {kwargs}: shape " \
                                               f"{tokens.shape} vs Hugging Face {expected.shape}"
        np.testing.assert_array_equal(tokens, expected, err_msg=f"{name} {framework} {kwargs}")
    return expected.size - expected.shape[0]


def generated_lengths(new: np.ndarray, eos) -> np.ndarray:
    if eos is None:
        return np.full(len(new), new.shape[1])
    hit = np.isin(new, eos)
    return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, new.shape[1])


def greedy_gap(models, **kwargs) -> float:
    """Smallest top-2 gap of the processed scores over the steps where a row was running."""
    _, _, _, _, src, mask, _ = models
    out = hf_generate(models, src, mask, output_scores=True, return_dict_in_generate=True,
                      **kwargs)
    scores = np.stack([step.numpy() for step in out.scores], axis=1)  # (B, steps, V)
    lengths = generated_lengths(out.sequences.numpy()[:, 1:], kwargs.get("eos_token_id"))
    running = np.arange(scores.shape[1])[None] < lengths[:, None]
    return float(top2_gap(scores)[running].min())


def beam_margins(models, **kwargs) -> tuple[float, float]:
    """(smallest top-2 logit gap along the returned hypotheses / MIN_GAP, smallest gap between
    the two best final scores / their noise), each > 1 when clear. A step whose token was
    forced (forced eos at the length limit) is no decision."""
    _, reference, _, _, src, mask, _ = models
    best = hf_generate(models, src, mask, **kwargs).numpy()
    eos = kwargs.get("eos_token_id")
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask),
                           decoder_input_ids=torch.tensor(best)).logits.numpy()
    decisions = logits[:, :-1]
    lengths = generated_lengths(best[:, 1:], eos)
    live = np.arange(best.shape[1] - 1)[None] < lengths[:, None]
    if kwargs.get("forced_eos_token_id") is not None:
        live[:, MAX_NEW - 1:] = False
    scored = hf_generate(models, src, mask, num_return_sequences=kwargs["num_beams"],
                         output_scores=True, return_dict_in_generate=True, **kwargs)
    final = scored.sequences_scores.numpy().reshape(len(src), -1)
    ends = generated_lengths(scored.sequences.numpy()[:, 1:], eos).reshape(len(src), -1)
    penalty = kwargs.get("length_penalty", 1.0)
    noise = MIN_GAP / ends[:, 0] ** penalty + MIN_GAP / ends[:, 1] ** penalty
    return (float(top2_gap(decisions)[live].min()) / MIN_GAP,
            float(((final[:, 0] - final[:, 1]) / noise).min()))


def eos_from(models, **kwargs) -> int:
    """A token the search without eos produces in row 1 early: as eos it ends that row."""
    _, _, _, _, src, mask, _ = models
    return int(hf_generate(models, src, mask, **kwargs).numpy()[1, 3])


def test_greedy_matches_hugging_face(models):
    *_, src, mask, base = models
    eos = eos_from(models)
    count = 0
    for kwargs in ({"eos_token_id": eos},
                   {"eos_token_id": eos, "forced_eos_token_id": eos, "max_length": 8},
                   {"bad_words_ids": [[base["pad_token_id"]]], "forced_eos_token_id": eos}):
        assert greedy_gap(models, **kwargs) > MIN_GAP, kwargs
        count += compare(models, **kwargs)
    tokens = hf_generate(models, src, mask, eos_token_id=eos).numpy()
    assert (tokens[:, 1:] == base["pad_token_id"]).any(), "eos should finish a row early"
    forced = hf_generate(models, src, mask, forced_eos_token_id=eos).numpy()
    assert (forced[:, -1] == eos).all()
    assert count >= 3 * 20


def test_one_source_greedy_matches_hugging_face(models):
    """Batch 1: each step's LM head sees one query vector, which on the CPU multiplies the
    table as it lies (``Embed.attend``); the tokens are Hugging Face's."""
    name, reference, jax_model, torch_model, src, mask, base = models
    one = (name, reference, jax_model, torch_model, src[:1], mask[:1], base)
    assert greedy_gap(one) > MIN_GAP
    assert compare(one) == MAX_NEW


# (num_beams, length_penalty, forced eos, early_stopping): each a compiled program per model
BEAM_CASES = [(2, 1.0, False, False), (4, 0.5, True, False), (4, 2.0, False, True),
              (4, 2.0, False, "never")]


@pytest.mark.parametrize(("num_beams", "length_penalty", "forced", "early_stopping"), BEAM_CASES)
def test_beam_search_matches_hugging_face(models, num_beams, length_penalty, forced,
                                          early_stopping):
    eos = eos_from(models, num_beams=num_beams)
    kwargs = {"num_beams": num_beams, "eos_token_id": eos, "length_penalty": length_penalty,
              "early_stopping": early_stopping, "forced_eos_token_id": eos if forced else None}
    margins = beam_margins(models, **kwargs)
    assert min(margins) > 1, (kwargs, margins)
    assert compare(models, **kwargs) >= 3 * 3


def test_cached_decoding_equals_the_full_forward(models):
    """The imported model, decoded one token at a time with the cache (the encoder run once, the
    cross-attention keys and values computed once in ``init_cache``), gives the full forward's
    logits at every step, in both frameworks."""
    _, _, jax_model, torch_model, src, mask, base = models
    tgt = np.concatenate([np.full((len(src), 1), base["decoder_start_token_id"]),
                          np.random.RandomState(1).randint(3, 20, (len(src), 6))], axis=1)
    ones = np.ones_like(tgt)  # Marian's start token is its pad id: the mask must say it counts
    full = to_numpy(jax_model(jnp.asarray(src), jnp.asarray(tgt), jnp.asarray(mask),
                              jnp.asarray(ones)))
    cache = jax_seq2seq_cache(jax_model, src, mask, tgt.shape[1])
    with torch.no_grad():
        full_t = torch_model(torch.tensor(src), torch.tensor(tgt), torch.tensor(mask),
                             torch.tensor(ones))
        memory = torch_model.encode(torch.tensor(src), torch.tensor(mask))
        cache_t = torch_model.init_cache(memory, tgt.shape[1], torch.tensor(mask))
    for t in range(tgt.shape[1]):
        step, cache = jax_cached_decode(jax_model, tgt[:, t:t + 1], ones[:, :1], cache)
        with torch.no_grad():
            step_t, cache_t = torch_model.decode(torch.tensor(tgt[:, t:t + 1]), None,
                                                 tgt_mask=torch.ones(len(src), 1, dtype=bool),
                                                 cache=cache_t)
        assert_close(full[:, t], step[:, 0], what=f"jax step {t}")
        assert_close(full_t[:, t], step_t[:, 0], what=f"torch step {t}")
