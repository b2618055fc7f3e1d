"""Greedy/sampling and beam search as compiled loops. Twin: ``torch_ref/generation/search.py``.

``generate`` (``decoding.py``) calls them inside its ``jit`` with the prefill's logits and cache
and a ``step_fn(tokens, cache) -> (logits, cache)``; a ``jax.lax.while_loop`` runs one token per
step and stops when Hugging Face's loop would. Beam search carries one ``BeamState``. Output: a
``(batch, prompt + max_new_tokens)`` buffer and the length to keep (the caller slices).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import io_callback

from jaxformer.generation import checks, processors
from jaxformer.nn.cache import GPTCache, Seq2SeqCache, map_rows

NEG = -1.0e9  # Hugging Face's "very large negative" in the beam bookkeeping

# Host callbacks the compiled loop calls, by id: the id is a traced argument, so one compiled
# program serves every stream (a callable cannot be traced, and a static one would recompile).
_STREAMERS: dict[int, Callable[[np.ndarray], object]] = {}
_stream_ids = itertools.count(1)


def _register(callback: Callable[[np.ndarray], object]) -> int:
    stream_id = next(_stream_ids)
    _STREAMERS[stream_id] = callback
    return stream_id


def _emit(stream_id, step, tokens) -> None:
    _STREAMERS[int(stream_id)](np.asarray(tokens))


def _column(x, index):
    """``x[..., index]`` for a traced index."""
    return jax.lax.dynamic_index_in_dim(x, index, axis=x.ndim - 1, keepdims=False)


def _set_column(x, index, values):
    """``x[..., index] = values`` for a traced index, functionally."""
    return jax.lax.dynamic_update_index_in_dim(x, values.astype(x.dtype), index, x.ndim - 1)


def _gather(x, indices):
    """``x[b, indices[b, k], ...]``: pick along axis 1 (beams), the shape of ``indices`` first."""
    return jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), axis=1)


@struct.dataclass
class BeamState:
    """Beam search's loop state, ``B`` rows of ``nb`` beams (Hugging Face's names): the
    ``running_*`` beams still growing, the best finished hypotheses (``sequences``, ``scores``,
    ``finished``, ``lengths``), whether each row can still improve (``unsatisfied``), and the
    running beams' KV cache, ``B * nb`` rows (a ``GPTCache`` or ``Seq2SeqCache``)."""

    step: jax.Array  # () int32: tokens generated
    done: jax.Array  # () bool: the stopping rule fired
    running_sequences: jax.Array  # (B, nb, width) int32
    running_scores: jax.Array  # (B, nb) float32: sum of log-probabilities
    sequences: jax.Array  # (B, nb, width) int32: finished hypotheses
    scores: jax.Array  # (B, nb) float32: their length-penalised scores (NEG: empty slot)
    finished: jax.Array  # (B, nb) bool
    lengths: jax.Array  # (B, nb) int32: their generated lengths
    unsatisfied: jax.Array  # (B, 1) bool
    cache: GPTCache | Seq2SeqCache


def greedy(step_fn, logits, cache, prompt, options: checks.Options, values, streamer=None):
    """Greedy (``do_sample=False``) or sampling, ``num_beams=1``, Hugging Face's ``_sample``:
    finished rows get ``pad_token_id``; the loop ends when every row has produced an eos token.
    With ``options.stream`` each step's tokens go, as soon as they are chosen, to the host
    callback registered under the id ``streamer`` (an ordered ``io_callback``)."""
    B, P = prompt.shape
    V = logits.shape[-1]
    eos, pad = values["eos_token_ids"] if options.num_eos else None, values["pad_token_id"]
    width = P + options.max_new_tokens
    sequences = jnp.full((B, width), pad, jnp.int32).at[:, :P].set(prompt)

    def select(carry, logits):
        step, sequences, unfinished, cache = carry
        scores = processors.constrain(logits.astype(jnp.float32), step, P, options, values)
        if options.do_sample:
            scores = processors.process(scores, options, values)
            tokens = processors.sample(scores, processors.uniforms(values["seed"], step, B, V))
        else:
            tokens = processors.greedy(scores)
        if eos is not None:
            tokens = jnp.where(unfinished, tokens, pad)
            unfinished = unfinished & ~jnp.isin(tokens, eos)
        if options.stream:
            io_callback(_emit, None, streamer, step, tokens, ordered=True)
        return step + 1, _set_column(sequences, P + step, tokens), unfinished, cache

    def cond(carry):
        step, _, unfinished, _ = carry
        return (step < options.max_new_tokens) & jnp.any(unfinished)

    def body(carry):
        step, sequences, unfinished, cache = carry
        logits, cache = step_fn(_column(sequences, P + step - 1), cache)
        return select((step, sequences, unfinished, cache), logits)

    carry = select((jnp.int32(0), sequences, jnp.ones((B,), bool), cache), logits)
    step, sequences, _, _ = jax.lax.while_loop(cond, body, carry)
    return sequences, P + step


def beam(step_fn, logits, cache, prompt, options: checks.Options, values):
    """Beam search (and beam sampling), Hugging Face's vectorised ``_beam_search`` step by step:
    the ``beams_to_keep`` best continuations of all beams; the ``num_beams`` best unfinished ones
    run on; those that hit eos (or the length limit) among the top ``num_beams`` compete for the
    finished slots with score ``sum of log-probs / generated_length ** length_penalty``; the loop
    stops when no running beam can beat the worst finished one (the ``early_stopping``
    heuristic), when ``early_stopping=True`` and every slot is finished, or at the length limit.
    Returns the best finished hypothesis of each row."""
    B, P = prompt.shape
    nb, K, N = options.num_beams, options.beams_to_keep, options.max_new_tokens
    V = logits.shape[-1]
    width = P + N
    eos = values["eos_token_ids"] if options.num_eos else None
    first_nb = (jnp.arange(K) < nb)[None]  # (1, K)
    batch_offset = (jnp.arange(B) * nb)[:, None]  # (B, 1)

    def select(state: BeamState, logits) -> BeamState:
        step = state.step
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # (B * nb, V)
        log_probs = processors.constrain(log_probs, step, P, options, values)
        if options.do_sample:
            log_probs = processors.process(log_probs, options, values)
        log_probs = log_probs.reshape(B, nb, V) + state.running_scores[:, :, None]
        flat = log_probs.reshape(B, nb * V)
        if options.do_sample:
            u = processors.uniforms(values["seed"], step, B, nb * V)
            index = processors.sample_without_replacement(flat, u, K)
            top_log_probs = jnp.take_along_axis(flat, index, axis=-1)
        else:
            top_log_probs, index = jax.lax.top_k(flat, K)  # (B, K)
        source, tokens = index // V, index % V
        top_sequences = _set_column(_gather(state.running_sequences, source), P + step,
                                    tokens)  # (B, K, width)
        hits = jnp.broadcast_to(P + step + 1 >= width, tokens.shape)
        if eos is not None:
            hits = hits | jnp.isin(tokens, eos)

        # the num_beams best continuations that did not finish run on
        running_log_probs = top_log_probs + hits.astype(jnp.float32) * NEG
        keep = jax.lax.top_k(running_log_probs, nb)[1]  # (B, nb)
        running_sequences = _gather(top_sequences, keep)
        running_scores = _gather(running_log_probs, keep)
        source = _gather(source, keep)

        # finished ones among the top num_beams compete for the finished slots
        just_finished = hits & first_nb
        scores = top_log_probs / values["length_penalty"][step + 1]
        if options.early_stopping is True:
            full = jnp.all(state.finished, axis=-1, keepdims=True)
            scores = scores + full.astype(jnp.float32) * NEG
        scores = scores + (~state.unsatisfied).astype(jnp.float32) * NEG
        scores = scores + (~just_finished).astype(jnp.float32) * NEG
        merged_scores = jnp.concatenate([state.scores, scores], axis=1)
        best = jax.lax.top_k(merged_scores, nb)[1]
        sequences = _gather(jnp.concatenate([state.sequences, top_sequences], axis=1), best)
        finished = _gather(jnp.concatenate([state.finished, just_finished], axis=1), best)
        lengths = _gather(jnp.concatenate(
            [state.lengths, jnp.full((B, K), step + 1, jnp.int32)], axis=1), best)
        scores = _gather(merged_scores, best)

        rows = (batch_offset + source).reshape(-1)  # each running beam's parent row
        cache = map_rows(state.cache, lambda x, axis: jnp.take(x, rows, axis=axis))
        step = step + 1
        best_running = running_scores[:, :1] / values["best_length_penalty"][step]
        worst_finished = jnp.where(finished, jnp.min(scores, axis=1, keepdims=True), NEG)
        unsatisfied = state.unsatisfied & jnp.any(best_running > worst_finished, axis=-1,
                                                  keepdims=True)
        open_beam = ~(jnp.all(finished) & (options.early_stopping is True))
        done = ~(jnp.any(unsatisfied) & open_beam & ~jnp.all(hits))
        return BeamState(step=step, done=done, running_sequences=running_sequences,
                         running_scores=running_scores, sequences=sequences, scores=scores,
                         finished=finished, lengths=lengths, unsatisfied=unsatisfied,
                         cache=cache)

    def body(state: BeamState) -> BeamState:
        last = _column(state.running_sequences, P + state.step - 1).reshape(B * nb)
        logits, cache = step_fn(last, state.cache)
        return select(dataclasses.replace(state, cache=cache), logits)

    start = jnp.full((B, nb, width), values["pad_token_id"], jnp.int32)
    start = start.at[:, :, :P].set(prompt[:, None, :])
    state = BeamState(
        step=jnp.int32(0), done=jnp.bool_(False),
        running_sequences=start,
        running_scores=jnp.zeros((B, nb), jnp.float32).at[:, 1:].set(NEG),
        sequences=start, scores=jnp.full((B, nb), NEG, jnp.float32),
        finished=jnp.zeros((B, nb), bool), lengths=jnp.zeros((B, nb), jnp.int32),
        unsatisfied=jnp.ones((B, 1), bool),
        # the prompt ran once per row; every beam of a row starts from its cache
        cache=map_rows(cache, lambda x, axis: jnp.repeat(x, nb, axis=axis)))
    state = select(state, jnp.repeat(logits, nb, axis=0))
    state = jax.lax.while_loop(lambda s: ~s.done & (s.step < N), body, state)
    return state.sequences[:, 0], P + jnp.max(state.lengths[:, 0])
