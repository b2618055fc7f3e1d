"""Twin of ``jaxformer/generation/processors.py``: Hugging Face's logits processors (temperature,
top-k keeping ties, top-p keeping the best token) and the Gumbel sampler on given uniforms."""

from __future__ import annotations

import torch

from jaxformer.generation import checks


def apply_temperature(scores, temperature):
    return scores / temperature


def apply_top_k(scores, top_k: int):
    kth = torch.topk(scores, top_k)[0][..., -1:]
    return scores.masked_fill(scores < kth, -float("inf"))


def apply_top_p(scores, threshold, min_tokens_to_keep: int = 1):
    sorted_scores, order = torch.sort(scores, dim=-1, stable=True)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= threshold
    remove[..., -min_tokens_to_keep:] = False
    remove = remove.scatter(-1, order, remove)
    return scores.masked_fill(remove, -float("inf"))


def constrain(scores, step, prompt_length: int, options: checks.Options, values):
    if options.num_bad_words:
        scores = scores.index_fill(-1, values["bad_words"], -float("inf"))
    if options.forced_bos and prompt_length + step == 1:
        scores = torch.full_like(scores, -float("inf"))
        scores[:, values["forced_bos_token_id"]] = 0.0
    if options.num_forced_eos and step == options.max_new_tokens - 1:
        scores = torch.full_like(scores, -float("inf"))
        scores[:, values["forced_eos_token_ids"]] = 0.0
    return scores


def process(scores, options: checks.Options, values):
    if options.use_temperature:
        scores = apply_temperature(scores, values["temperature"])
    if options.top_k:
        scores = apply_top_k(scores, options.top_k)
    if options.use_top_p:
        scores = apply_top_p(scores, values["top_p_threshold"], options.min_tokens_to_keep)
    return scores


def _fmix32(h):
    """murmur3's finaliser on int64 tensors holding uint32 values (torch's uint32 lacks ops):
    products are reduced modulo 2^32 by masking, which keeps the low bits exact even when the
    int64 product wraps."""
    h = h ^ (h >> 16)
    h = (h * checks.MIX1) & checks.MASK32
    h = h ^ (h >> 13)
    h = (h * checks.MIX2) & checks.MASK32
    return h ^ (h >> 16)


def uniforms(seed, step, rows: int, cols: int, device=None):
    """Bit-identical to jaxformer's ``uniforms`` and to ``checks.uniforms``."""
    def const(x):
        return torch.tensor(int(x) & checks.MASK32, dtype=torch.int64, device=device)

    state = _fmix32(_fmix32(_fmix32(const(seed) ^ checks.GOLDEN) ^ const(step))
                    ^ torch.arange(rows, dtype=torch.int64, device=device))
    cols_hash = (torch.arange(cols, dtype=torch.int64, device=device) * checks.GOLDEN) \
        & checks.MASK32
    bits = _fmix32(state[:, None] ^ cols_hash)
    return ((bits >> 8).to(torch.float32) + 0.5) * 2.0**-24


def gumbel(u):
    return -torch.log(-torch.log(u))


def greedy(scores):
    return torch.argmax(scores, dim=-1)


def sample(scores, u):
    return greedy(scores + gumbel(u))


def sample_without_replacement(scores, u, k: int):
    return torch.topk(scores + gumbel(u), k)[1]
