"""Logits processors and the sampler, as Hugging Face defines them. Twin:
``torch_ref/generation/processors.py``.

Scores are float32 ``(rows, vocab)``. A removed token's score becomes ``-inf`` (Hugging Face's
``filter_value``), so its probability is exactly 0. The order is Hugging Face's: temperature, then
top-k, then top-p (:func:`process`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxformer.generation import checks


def apply_temperature(scores, temperature):
    """``scores / temperature`` (Hugging Face's ``TemperatureLogitsWarper``)."""
    return scores / temperature


def apply_top_k(scores, top_k: int):
    """Keep the tokens scoring at least the ``top_k``-th best score: ties with it are kept, so
    more than ``top_k`` tokens may survive (``TopKLogitsWarper``)."""
    kth = jax.lax.top_k(scores, top_k)[0][..., -1:]
    return jnp.where(scores < kth, -jnp.inf, scores)


def apply_top_p(scores, threshold, min_tokens_to_keep: int = 1):
    """Nucleus filtering (``TopPLogitsWarper``): sort ascending, drop the tokens whose cumulative
    probability is ``<= threshold`` (= 1 - top_p), and never the ``min_tokens_to_keep`` best, so
    the most likely token always survives. The sort is stable (torch's default is not; ties
    between distinct tokens at the cut are the only case where that matters)."""
    order = jnp.argsort(scores, axis=-1, stable=True)
    cumulative = jnp.cumsum(jax.nn.softmax(jnp.take_along_axis(scores, order, -1), axis=-1),
                            axis=-1)
    remove = cumulative <= threshold
    remove = remove.at[..., -min_tokens_to_keep:].set(False)
    remove = jnp.put_along_axis(jnp.zeros_like(remove), order, remove, axis=-1, inplace=False)
    return jnp.where(remove, -jnp.inf, scores)


def constrain(scores, step, prompt_length: int, options: checks.Options, values):
    """Hugging Face's constraining processors, in its order, before the warpers of
    :func:`process`: ``bad_words_ids`` (single tokens: ``NoBadWordsLogitsProcessor``) get
    ``-inf``; at the sequence's first token (``prompt_length + step == 1``: the encoder-decoder's
    first generated token) every score but ``forced_bos_token_id``'s is ``-inf`` and its is 0
    (``ForcedBOSTokenLogitsProcessor``); at the last token ``max_new_tokens`` allows, the same
    for the ``forced_eos_token_id`` ids (``ForcedEOSTokenLogitsProcessor``). ``step`` is the
    number of tokens generated before this one (traced)."""
    if options.num_bad_words:
        scores = scores.at[:, values["bad_words"]].set(-jnp.inf)
    if options.forced_bos:
        forced = jnp.full_like(scores, -jnp.inf).at[:, values["forced_bos_token_id"]].set(0.0)
        scores = jnp.where(prompt_length + step == 1, forced, scores)
    if options.num_forced_eos:
        forced = jnp.full_like(scores, -jnp.inf).at[:, values["forced_eos_token_ids"]].set(0.0)
        scores = jnp.where(step == options.max_new_tokens - 1, forced, scores)
    return scores


def process(scores, options: checks.Options, values):
    """The processors ``options`` switch on, in Hugging Face's order. ``values`` is a mapping
    with ``temperature`` and ``top_p_threshold`` (see ``checks.Values``)."""
    if options.use_temperature:
        scores = apply_temperature(scores, values["temperature"])
    if options.top_k:
        scores = apply_top_k(scores, options.top_k)
    if options.use_top_p:
        scores = apply_top_p(scores, values["top_p_threshold"], options.min_tokens_to_keep)
    return scores


def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * jnp.uint32(checks.MIX1)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(checks.MIX2)
    return h ^ (h >> 16)


def uniforms(seed, step, rows: int, cols: int):
    """``[rows, cols]`` float32 uniforms in (0, 1) for one decoding step; bit-identical to
    ``checks.uniforms`` and to torch_ref's (uint32 arithmetic wraps modulo 2^32 here)."""
    golden = jnp.uint32(checks.GOLDEN)
    state = _fmix32(_fmix32(_fmix32(jnp.asarray(seed, jnp.uint32) ^ golden)
                            ^ jnp.asarray(step).astype(jnp.uint32))
                    ^ jnp.arange(rows, dtype=jnp.uint32))
    bits = _fmix32(state[:, None] ^ (jnp.arange(cols, dtype=jnp.uint32) * golden))
    return ((bits >> 8).astype(jnp.float32) + 0.5) * jnp.float32(2.0**-24)


def gumbel(u):
    """Standard Gumbel noise from uniforms in (0, 1)."""
    return -jnp.log(-jnp.log(u))


def greedy(scores):
    """The best token per row, ``argmax`` over the last axis: the first index of the largest
    score (of the first NaN, if any, as ``jnp.argmax``), int32. Written as two plain reductions
    (the maximum, then the first index holding it): XLA:CPU runs ``argmax``'s one reduction of
    (value, index) pairs element by element, 0.24 ms of a GPT-2 small decoding step against
    0.02 for these two (docs/performance.md)."""
    best = jnp.max(scores, axis=-1, keepdims=True)
    hits = (scores == best) | jnp.isnan(scores)
    index = jnp.arange(scores.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(hits, index, scores.shape[-1]), axis=-1)


def sample(scores, u):
    """One token per row drawn from ``softmax(scores)`` with the uniforms ``u`` (same shape): the
    Gumbel-max trick, ``greedy(scores + gumbel(u))``. A ``-inf`` score is never drawn."""
    return greedy(scores + gumbel(u))


def sample_without_replacement(scores, u, k: int):
    """``k`` distinct indices per row, drawn one after another from ``softmax(scores)`` without
    replacement (as ``torch.multinomial(..., replacement=False)``): Gumbel-top-k."""
    return jax.lax.top_k(scores + gumbel(u), k)[1]
