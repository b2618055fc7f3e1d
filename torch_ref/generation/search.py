"""Twin of ``jaxformer/generation/search.py``: the same greedy/sampling and beam search, step for
step, as a Python loop (torch's idiom: each step dispatches eagerly).

``generate`` (``decoding.py``) calls them with a ``step_fn`` over the model's cache; beam search
keeps its state in a ``BeamState`` and moves the cache rows with ``nn.cache.map_rows``.
"""

from __future__ import annotations

import dataclasses

import torch

from jaxformer.generation import checks
from torch_ref.generation import processors
from torch_ref.nn.cache import GPTCache, Seq2SeqCache, map_rows

NEG = -1.0e9


def _gather(x, indices):
    """``x[b, indices[b, k], ...]`` along axis 1."""
    index = indices.reshape(indices.shape + (1,) * (x.dim() - 2)).expand(
        indices.shape + x.shape[2:])
    return torch.gather(x, 1, index)


@dataclasses.dataclass
class BeamState:
    """Twin of jaxformer's: beam search's loop state, ``B`` rows of ``nb`` beams, and the running
    beams' KV cache (``B * nb`` rows)."""

    step: int
    done: bool
    running_sequences: torch.Tensor  # (B, nb, width)
    running_scores: torch.Tensor  # (B, nb)
    sequences: torch.Tensor  # (B, nb, width): finished hypotheses
    scores: torch.Tensor  # (B, nb)
    finished: torch.Tensor  # (B, nb) bool
    lengths: torch.Tensor  # (B, nb)
    unsatisfied: torch.Tensor  # (B, 1) bool
    cache: GPTCache | Seq2SeqCache


def greedy(step_fn, logits, cache, prompt, options: checks.Options, values, streamer=None):
    B, P = prompt.shape
    V = logits.shape[-1]
    eos, pad = values["eos_token_ids"] if options.num_eos else None, values["pad_token_id"]
    sequences = torch.full((B, P + options.max_new_tokens), int(pad), dtype=torch.long,
                           device=prompt.device)
    sequences[:, :P] = prompt
    unfinished = torch.ones(B, dtype=torch.bool, device=prompt.device)
    step = 0
    while True:
        scores = processors.constrain(logits.float(), step, P, options, values)
        if options.do_sample:
            scores = processors.process(scores, options, values)
            u = processors.uniforms(values["seed"], step, B, V, device=scores.device)
            tokens = processors.sample(scores, u)
        else:
            tokens = processors.greedy(scores)
        if eos is not None:
            tokens = torch.where(unfinished, tokens, pad)
            unfinished = unfinished & ~torch.isin(tokens, eos)
        if streamer is not None:
            streamer(tokens.cpu().numpy())
        sequences[:, P + step] = tokens
        step += 1
        if step >= options.max_new_tokens or not unfinished.any():
            return sequences[:, :P + step]
        logits, cache = step_fn(tokens, cache)


def beam(step_fn, logits, cache, prompt, options: checks.Options, values):
    B, P = prompt.shape
    nb, K, N = options.num_beams, options.beams_to_keep, options.max_new_tokens
    V = logits.shape[-1]
    width = P + N
    device = prompt.device
    eos = values["eos_token_ids"] if options.num_eos else None
    first_nb = (torch.arange(K, device=device) < nb)[None]
    batch_offset = (torch.arange(B, device=device) * nb)[:, None]

    start = torch.full((B, nb, width), int(values["pad_token_id"]), dtype=torch.long,
                       device=device)
    start[:, :, :P] = prompt[:, None, :]
    running_scores = torch.zeros(B, nb, device=device)
    running_scores[:, 1:] = NEG
    state = BeamState(
        step=0, done=False, running_sequences=start, running_scores=running_scores,
        sequences=start.clone(), scores=torch.full((B, nb), NEG, device=device),
        finished=torch.zeros(B, nb, dtype=torch.bool, device=device),
        lengths=torch.zeros(B, nb, dtype=torch.long, device=device),
        unsatisfied=torch.ones(B, 1, dtype=torch.bool, device=device),
        cache=map_rows(cache, lambda x, axis: x.repeat_interleave(nb, dim=axis)))
    logits = logits.repeat_interleave(nb, dim=0)
    while True:
        step = state.step
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        log_probs = processors.constrain(log_probs, step, P, options, values)
        if options.do_sample:
            log_probs = processors.process(log_probs, options, values)
        log_probs = log_probs.reshape(B, nb, V) + state.running_scores[:, :, None]
        flat = log_probs.reshape(B, nb * V)
        if options.do_sample:
            u = processors.uniforms(values["seed"], step, B, nb * V, device=device)
            index = processors.sample_without_replacement(flat, u, K)
            top_log_probs = torch.gather(flat, 1, index)
        else:
            top_log_probs, index = torch.topk(flat, K)
        source, tokens = index // V, index % V
        top_sequences = _gather(state.running_sequences, source)  # a copy: safe to write
        top_sequences[:, :, P + step] = tokens
        hits = torch.full(tokens.shape, P + step + 1 >= width, device=device)
        if eos is not None:
            hits = hits | torch.isin(tokens, eos)

        running_log_probs = top_log_probs + hits.float() * NEG
        keep = torch.topk(running_log_probs, nb)[1]
        state.running_sequences = _gather(top_sequences, keep)
        state.running_scores = _gather(running_log_probs, keep)
        source = _gather(source, keep)

        just_finished = hits & first_nb
        new_scores = top_log_probs / values["length_penalty"][step + 1]
        if options.early_stopping is True:
            new_scores = new_scores + state.finished.all(dim=-1, keepdim=True).float() * NEG
        new_scores = new_scores + (~state.unsatisfied).float() * NEG
        new_scores = new_scores + (~just_finished).float() * NEG
        merged_scores = torch.cat([state.scores, new_scores], dim=1)
        best = torch.topk(merged_scores, nb)[1]
        state.sequences = _gather(torch.cat([state.sequences, top_sequences], dim=1), best)
        state.finished = _gather(torch.cat([state.finished, just_finished], dim=1), best)
        state.lengths = _gather(torch.cat([state.lengths, torch.full((B, K), step + 1,
                                                                     device=device)], dim=1),
                                best)
        state.scores = _gather(merged_scores, best)

        rows = (batch_offset + source).reshape(-1)
        state.cache = map_rows(state.cache, lambda x, axis, rows=rows: x.index_select(axis, rows))
        state.step = step = step + 1
        best_running = state.running_scores[:, :1] / values["best_length_penalty"][step]
        worst_finished = torch.where(state.finished, state.scores.min(dim=1, keepdim=True)[0],
                                     torch.tensor(NEG, device=device))
        state.unsatisfied = state.unsatisfied & (best_running > worst_finished).any(
            dim=-1, keepdim=True)
        open_beam = not (bool(state.finished.all()) and options.early_stopping is True)
        state.done = not (bool(state.unsatisfied.any()) and open_beam and not bool(hits.all()))
        if state.done or step >= N:
            break
        last = state.running_sequences[:, :, P + step - 1].reshape(B * nb)
        logits, state.cache = step_fn(last, state.cache)
    return state.sequences[:, 0, :P + int(state.lengths[:, 0].max())]
