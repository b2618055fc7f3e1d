"""What the generation tests share: tiny model pairs with weights at a decisive scale, a random
GPT-2 checkpoint made with transformers, left-padded prompts, and jitted cached calls."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

from jaxformer.config import GPTConfig, TransformerConfig
from parity_tests.support.helpers import scanning, twin_pair

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

GPT_PRE_LN = GPTConfig.tiny()  # GPT-2 layout: pre-LN, final LN, tied head
GPT_POST_LN = dataclasses.replace(  # seed 004 layout: post-LN, embedding LN, untied head
    GPTConfig.simple_gpt(), vocab_size=101, hidden_size=32, num_layers=2, num_heads=4,
    intermediate_size=37, max_position_embeddings=64)
SEQ2SEQ_POST_LN = TransformerConfig.tiny()  # sinusoidal positions, untied, post-LN
SEQ2SEQ_PRE_LN = dataclasses.replace(  # learned positions, shared and tied, pre-LN + final LN
    TransformerConfig.tiny(), tgt_vocab_size=23, position_embedding_type="learned",
    share_embeddings=True, tie_word_embeddings=True, pre_norm=True, final_layer_norm=True,
    scale_embeddings=False)
MIN_GAP = 1e-3  # near-tie guard: smallest top-2 logit gap at a compared decision


def model_pair(torch_cls, jax_cls, config, seed: int = 0):
    """(torch_ref model, jaxformer model) with the same randomized weights, both in eval; cached
    (per layer-stack mode, see the ``scan_layers`` fixture), so tests only read them."""
    return _model_pair(torch_cls, jax_cls, config, seed, scanning())


@functools.cache
def _model_pair(torch_cls, jax_cls, config, seed, scanned):
    return twin_pair(torch_cls, jax_cls, config, seed, randomized=True)


def hf_gpt2(seed: int = 0, **overrides) -> transformers.GPT2LMHeadModel:
    """A random GPT-2 (the tiny sizes) with perturbed weights, in eval mode."""
    config = transformers.GPT2Config(**{
        "vocab_size": 101, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
        "n_inner": 37, "bos_token_id": None, "eos_token_id": None, **overrides})
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def left_padded(rng, vocab: int, lengths, width: int, pad: int = 0):
    """``[batch, width]`` ids and mask, row b holding ``lengths[b]`` real tokens at the end."""
    ids = rng.randint(0, vocab, size=(len(lengths), width))
    mask = np.zeros((len(lengths), width), np.int64)
    for b, n in enumerate(lengths):
        mask[b, width - n:] = 1
    ids[mask == 0] = pad
    return ids, mask


@functools.partial(jax.jit, static_argnums=0)
def _gpt_call(graphdef, state, ids, mask, cache):
    return nnx.merge(graphdef, state)(ids, mask, cache=cache)


def jax_cached_gpt(model, ids, mask, cache):
    """``model(ids, mask, cache=cache)`` through split + jit (one program per shape)."""
    graphdef, state = nnx.split(model)
    return _gpt_call(graphdef, state, jnp.asarray(ids), jnp.asarray(mask), cache)


@functools.partial(jax.jit, static_argnums=0)
def _decode_call(graphdef, state, tgt, tgt_mask, cache):
    return nnx.merge(graphdef, state).decode(tgt, None, tgt_mask=tgt_mask, cache=cache)


def jax_cached_decode(model, tgt, tgt_mask, cache):
    graphdef, state = nnx.split(model)
    return _decode_call(graphdef, state, jnp.asarray(tgt), jnp.asarray(tgt_mask), cache)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _seq2seq_cache(graphdef, state, src, src_mask, max_length):
    model = nnx.merge(graphdef, state)
    return model.init_cache(model.encode(src, src_mask), max_length, src_mask)


def jax_seq2seq_cache(model, src, src_mask, max_length: int):
    """``init_cache(encode(src, src_mask), max_length, src_mask)``, jitted."""
    graphdef, state = nnx.split(model)
    return _seq2seq_cache(graphdef, state, jnp.asarray(src), jnp.asarray(src_mask), max_length)


def top2_gap(logits) -> np.ndarray:
    """``top1 - top2`` along the last axis."""
    part = np.sort(np.asarray(logits, np.float64), axis=-1)
    return part[..., -1] - part[..., -2]
