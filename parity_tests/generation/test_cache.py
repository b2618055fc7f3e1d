"""Cached decoding equals the full forward pass (DESIGN.md: 1e-5 at every step), in both twins:
a left-padded batch (6, 3 and 1 real tokens) is prefilled in one call, then continued one token
per call, and every call's logits are compared at the real positions with one full forward over
the whole sequence (the model is causal). GPT pre-LN (GPT-2) and post-LN (seed 004's layout);
encoder-decoder post-LN sinusoidal, and pre-LN learned with shared, tied embeddings.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxformer.models import encoder_decoder as jed
from jaxformer.models import gpt as jgpt
from parity_tests.support.generation import (
    GPT_POST_LN,
    GPT_PRE_LN,
    SEQ2SEQ_POST_LN,
    SEQ2SEQ_PRE_LN,
    jax_cached_decode,
    jax_cached_gpt,
    jax_seq2seq_cache,
    left_padded,
    model_pair,
)
from parity_tests.support.helpers import assert_close, to_numpy
from torch_ref.models import encoder_decoder as ted
from torch_ref.models import gpt as tgpt

P, N = 6, 5  # prompt width, tokens decoded one by one


@pytest.mark.usefixtures("scan_layers")
@pytest.mark.parametrize("config", [GPT_PRE_LN, GPT_POST_LN], ids=["pre_ln", "post_ln"])
def test_gpt_cached_logits_equal_full_forward(config):
    torch_model, jax_model = model_pair(tgpt.GPT, jgpt.GPT, config)
    rng = np.random.RandomState(0)
    prompt, prompt_mask = left_padded(rng, config.vocab_size, [6, 3, 1], P)
    ids = np.concatenate([prompt, rng.randint(0, config.vocab_size, (3, N))], axis=1)
    mask = np.concatenate([prompt_mask, np.ones((3, N), np.int64)], axis=1)
    real = mask.astype(bool)
    with torch.no_grad():
        full = to_numpy(torch_model(torch.tensor(ids), torch.tensor(mask)))

    def run_jax():
        cache = jax_model.init_cache(3, P + N)
        yield from _steps(lambda i, m, c: jax_cached_gpt(jax_model, i, m, c), ids, mask, cache)

    def run_torch():
        cache = torch_model.init_cache(3, P + N)
        with torch.no_grad():
            yield from _steps(lambda i, m, c: torch_model(torch.tensor(i), torch.tensor(m),
                                                          cache=c), ids, mask, cache)

    for framework, run in (("jax", run_jax), ("torch", run_torch)):
        outputs = list(run())
        assert len(outputs) == 1 + N
        cached = np.concatenate([to_numpy(o) for o in outputs], axis=1)
        assert_close(full, cached, where=real, what=f"{framework} cached vs full")
        if framework == "jax":
            jax_cached = cached
    assert_close(cached, jax_cached, where=real, what="cached logits jax vs torch")


def _steps(call, ids, mask, cache):
    """Prefill ``ids[:, :P]`` then one token per call; yields the logits of each call."""
    logits, cache = call(ids[:, :P], mask[:, :P], cache)
    yield logits
    for t in range(P, ids.shape[1]):
        logits, cache = call(ids[:, t:t + 1], mask[:, t:t + 1], cache)
        yield logits
    assert int(cache.index) == ids.shape[1]
    np.testing.assert_array_equal(to_numpy(cache.positions), mask.sum(axis=1))


def test_gpt_cache_rows_and_positions():
    """The cache's mask marks real tokens only, and a decoded token's position continues its own
    row's count of real tokens: left padding costs no position."""
    _, jax_model = model_pair(tgpt.GPT, jgpt.GPT, GPT_PRE_LN)
    ids, mask = left_padded(np.random.RandomState(1), 101, [4, 2], 4)
    cache = jax_model.init_cache(2, 6)
    _, cache = jax_cached_gpt(jax_model, ids, mask, cache)
    _, cache = jax_cached_gpt(jax_model, ids[:, :1], np.ones((2, 1), np.int64), cache)
    np.testing.assert_array_equal(np.asarray(cache.mask),
                                  [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 0]])
    np.testing.assert_array_equal(np.asarray(cache.positions), [5, 3])


@pytest.mark.usefixtures("scan_layers")
@pytest.mark.parametrize("config", [SEQ2SEQ_POST_LN, SEQ2SEQ_PRE_LN], ids=["post_ln", "pre_ln"])
def test_encoder_decoder_cached_logits_equal_full_forward(config):
    """Cross-attention keys and values are computed once, in ``init_cache``; the target is
    decoded as 3 tokens in one call, then one per call."""
    torch_model, jax_model = model_pair(ted.Transformer, jed.Transformer, config)
    rng = np.random.RandomState(2)
    S, T = 7, 6
    src = rng.randint(1, config.src_vocab_size, (3, S))
    src_mask = np.ones((3, S), np.int64)
    src_mask[1, 4:] = 0
    src_mask[2, 1:] = 0
    src[src_mask == 0] = config.src_pad_id
    tgt = rng.randint(0, config.tgt_vocab_size, (3, T))
    tgt_mask = np.ones((3, T), np.int64)  # generated tokens always count, pad id or not
    with torch.no_grad():
        full = to_numpy(torch_model(torch.tensor(src), torch.tensor(tgt), torch.tensor(src_mask),
                                    torch.tensor(tgt_mask)))
    splits = [(0, 3)] + [(t, t + 1) for t in range(3, T)]

    cache = jax_seq2seq_cache(jax_model, src, src_mask, T)
    outputs = []
    for a, b in splits:
        logits, cache = jax_cached_decode(jax_model, tgt[:, a:b], tgt_mask[:, a:b], cache)
        outputs.append(np.asarray(logits))
    jax_cached = np.concatenate(outputs, axis=1)
    assert_close(full, jax_cached, what="jax cached decode vs full forward")

    with torch.no_grad():
        memory = torch_model.encode(torch.tensor(src), torch.tensor(src_mask))
        cache = torch_model.init_cache(memory, T, torch.tensor(src_mask))
        outputs = []
        for a, b in splits:
            logits, cache = torch_model.decode(torch.tensor(tgt[:, a:b]), None,
                                               tgt_mask=torch.tensor(tgt_mask[:, a:b]),
                                               cache=cache)
            outputs.append(to_numpy(logits))
    torch_cached = np.concatenate(outputs, axis=1)
    assert_close(full, torch_cached, what="torch cached decode vs full forward")
    assert_close(torch_cached, jax_cached, what="cached decode jax vs torch")


def test_cache_calls_refuse_what_does_not_fit():
    torch_model, jax_model = model_pair(tgpt.GPT, jgpt.GPT, GPT_PRE_LN)
    """Checked before anything is computed, in both twins."""
    ids = np.ones((2, 3), np.int64)
    for model, wrap in ((jax_model, jnp.asarray), (torch_model, torch.tensor)):
        cache = dataclasses.replace(model.init_cache(2, 4), index=2)  # two slots used, two left
        with pytest.raises(ValueError, match="4 slots, 2 used: no room for 3 more tokens"):
            model(wrap(ids), None, cache=cache)
        with pytest.raises(ValueError, match="batch size 1 but the cache was made for 2"):
            model(wrap(ids[:1]), None, cache=model.init_cache(2, 4))
    for cls_pair in ((ted.Transformer, jed.Transformer),):
        for model, wrap in zip(model_pair(*cls_pair, SEQ2SEQ_POST_LN), (torch.tensor,
                                                                         jnp.asarray)):
            memory = wrap(np.zeros((2, 3, SEQ2SEQ_POST_LN.hidden_size), np.float32))
            cache = model.init_cache(memory, 4)
            with pytest.raises(ValueError, match="pass memory=None, src_mask=None"):
                model.decode(wrap(ids[:, :1]), memory, cache=cache)


@pytest.mark.parametrize(("family", "rows"), [("gpt", 1), ("gpt", 2), ("encoder_decoder", 1)])
def test_generation_loop_updates_the_cache_in_place(monkeypatch, family, rows):
    """The compiled generation program copies no key or value cache: each step writes its slot
    in place and attention's products read the cache as it lies. With the cache stored as
    ``(B, nh, L, hs)`` XLA put a reshape between the write and the products and copied every
    layer's values three times a step, and its keys once, transposed (docs/performance.md)."""
    from jaxformer.generation import decoding
    from jaxformer.generation import generate as jax_generate

    is_gpt = family == "gpt"
    classes = (tgpt.GPT, jgpt.GPT) if is_gpt else (ted.Transformer, jed.Transformer)
    config = GPT_PRE_LN if is_gpt else SEQ2SEQ_POST_LN
    model = model_pair(*classes, config)[1]
    program = "_generate_gpt" if is_gpt else "_generate_seq2seq"
    real, calls = getattr(decoding, program), []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(decoding, program, spy)
    ids = np.random.RandomState(0).randint(1, 20, (rows, 5))
    new = 7
    jax_generate(model, ids, max_new_tokens=new,
                 **({} if is_gpt else dict(decoder_start_token_id=1)))
    (args, kwargs), = calls
    hlo = real.lower(*args, **kwargs).compile().as_text()
    L = ids.shape[1] + new if is_gpt else 1 + new
    hs = config.head_dim
    cache_sized = [line.strip()[:160] for line in hlo.splitlines()
                   if line.strip().startswith("%copy") and (f",{L},{hs}]" in line
                                                            or f",{hs},{L}]" in line)]
    assert not cache_sized, cache_sized
