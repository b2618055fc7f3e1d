"""GPT (decoder-only) in Flax NNX: GPT-2 and seed 004's ``SimpleGPTModel`` (the project's
GPT seed document, preset ``GPTConfig.simple_gpt``). Twin: ``torch_ref/models/gpt.py``.

Token + learned position embeddings (optional LayerNorm, dropout) -> a stack of causal
Transformer blocks (pre-LN for GPT-2, post-LN for seed 004) -> optional final LayerNorm -> the LM
head, tied to the token embedding (GPT-2) or its own ``lm_head`` (seed 004).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import validate
from jaxformer.config import GPTConfig
from jaxformer.nn.attention import cache_mask
from jaxformer.nn.cache import GPTCache, LayerCache
from jaxformer.nn.dropout import Dropout
from jaxformer.nn.layers import TransformerBlock
from jaxformer.nn.masks import causal_mask, padding_mask
from jaxformer.nn.params import embedding, layer_norm, linear
from jaxformer.nn.stack import LayerStack
from jaxformer.sharding import constrain


def position_ids_from_mask(attention_mask) -> jnp.ndarray:
    """``[batch, seq]`` 1/0 mask -> positions counting real tokens only; 0 at padding."""
    mask = jnp.asarray(attention_mask).astype(bool)
    return jnp.where(mask, jnp.cumsum(mask, axis=-1, dtype=jnp.int32) - 1, 0)


def attention_mask_4d(attention_mask: jax.typing.ArrayLike | None,
                      seq_len: int) -> jax.Array | np.ndarray:
    """Causal AND padding: boolean ``(B or 1, 1, T, T)``, True = may attend."""
    causal = causal_mask(seq_len)
    if attention_mask is None:
        return causal
    return jnp.logical_and(causal, padding_mask(attention_mask))  # padding: (B, 1, 1, T)


class GPTEmbeddings(nnx.Module):
    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
        self.word_embeddings = embedding(config.vocab_size, config, names=("vocab", "embed"),
                                         rngs=rngs)
        self.position_embeddings = embedding(config.max_position_embeddings, config,
                                             names=("positions", "embed"), rngs=rngs)
        self.layer_norm = layer_norm(config, rngs=rngs) if config.embedding_layer_norm else None
        self.dropout = Dropout(config.dropout_rate, rngs=rngs)

    def __call__(self, input_ids, position_ids=None):
        """``(B, T)`` ids and positions (broadcastable; default ``arange(T)``) -> ``(B, T, C)``."""
        if position_ids is None:
            position_ids = jnp.arange(input_ids.shape[1])[None]
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return self.dropout(x)


class GPT(nnx.Module):
    """``(input_ids, attention_mask) -> logits (B, T, vocab)``; ``hidden_states`` stops before
    the head. ``attention_mask`` is ``[batch, seq]`` (1 = real token) or None (no padding).

    Masks. The public ``attention_mask`` is ``[batch, seq]``, 1 for a real token; the causal mask is
    built here and combined with it by logical AND, so no caller-supplied mask can open the future
    to a query. Seed 004 passes a 4-D ``[B, 1, T, T]`` multiplicative mask instead; that form is
    refused with a ``ValueError`` because a mask of ones there would, in a model that trusted it,
    make the decoder bidirectional. Give the ``[batch, seq]`` padding mask (all ones = seed 004's
    example).

    Positions follow the real tokens: with a mask, ``position_ids = cumsum(mask) - 1`` at real
    tokens and 0 at padding, so a left-padded prompt (how batches are fed for generation) gets at
    its real positions exactly the logits of the same prompt unpadded. Without a mask,
    ``arange(seq)``.

    A padded query row (left padding puts them first) has every key masked: as masks.py documents,
    its softmax is then uniform over all keys. Such rows are finite, equal in both frameworks, and
    meaningless; nothing real attends to them.

    Decoding with a KV cache (``jaxformer.generation``): ``init_cache`` preallocates a ``GPTCache``
    (``nn/cache.py``: a ``LayerCache`` of ``(B * nh, L, hs)`` keys and values per block, the filled
    slots' ``mask``, the ``index`` of slots filled, each row's next ``positions``), and
    ``hidden_states`` / ``__call__`` given ``cache=`` run only the new tokens and return ``(output,
    new cache)``. The new tokens' positions continue each row's count of real tokens, so a
    left-padded prompt and its continuation get exactly the positions and the mask of a full forward
    over the whole sequence.
    """

    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embeddings = GPTEmbeddings(config, rngs=rngs)
        self.blocks = LayerStack(config, TransformerBlock, config.num_layers, rngs=rngs)
        self.final_layer_norm = layer_norm(config, rngs=rngs) if config.final_layer_norm else None
        self.lm_head = (None if config.tie_word_embeddings else
                        linear(config.hidden_size, config.vocab_size, config,
                               names=("embed", "vocab"), rngs=rngs, use_bias=False))

    def init_cache(self, batch_size: int, max_length: int) -> GPTCache:
        """An empty cache of ``max_length`` slots for ``batch_size`` rows (see the module doc)."""
        shape = (batch_size * self.config.num_heads, max_length, self.config.head_dim)
        dtype = jnp.dtype(self.config.dtype)
        return GPTCache(layers=self.blocks.map(lambda block: LayerCache(
                            key=jnp.zeros(shape, dtype), value=jnp.zeros(shape, dtype))),
                        mask=jnp.zeros((batch_size, max_length), bool),
                        index=jnp.zeros((), jnp.int32),
                        positions=jnp.zeros((batch_size,), jnp.int32))

    def hidden_states(self, input_ids, attention_mask=None, cache=None):
        """``(B, T, C)`` after the last block and the final LayerNorm (when the config has one).
        With ``cache``: ``input_ids`` are the next tokens only; returns ``(hidden, cache)``."""
        validate.check_gpt_inputs(self.config, input_ids, attention_mask)
        T = input_ids.shape[1]
        if cache is not None:
            return self._cached_hidden_states(input_ids, attention_mask, cache)
        if attention_mask is None:
            position_ids = jnp.arange(T)[None]  # (1, T)
        else:
            position_ids = position_ids_from_mask(attention_mask)  # (B, T)
        mask = attention_mask_4d(attention_mask, T)  # (B or 1, 1, T, T)
        x = self.embeddings(input_ids, position_ids)
        return self._final_norm(self.blocks(x, mask))

    def _cached_hidden_states(self, input_ids, attention_mask, cache: GPTCache):
        (B, T), index = input_ids.shape, cache.index
        cache_batch, cache_length = cache.mask.shape
        validate.check_cache_call("input_ids", input_ids, cache_batch, cache_length, index)
        new = (jnp.ones((B, T), bool) if attention_mask is None
               else jnp.asarray(attention_mask).astype(bool))
        counts = jnp.cumsum(new, axis=-1, dtype=jnp.int32)
        position_ids = jnp.where(new, cache.positions[:, None] + counts - 1, 0)  # (B, T)
        valid = jax.lax.dynamic_update_slice(cache.mask, new, (0, index))  # (B, L)
        mask = cache_mask(valid, index, T)  # (B, 1, T, L)
        x = self.embeddings(input_ids, position_ids)
        x, layers = self.blocks(x, mask, cache=cache.layers, cache_index=index)
        cache = GPTCache(layers=layers, mask=valid, index=index + T,
                         positions=cache.positions + counts[:, -1])
        return self._final_norm(x), cache

    def _final_norm(self, x):
        return x if self.final_layer_norm is None else self.final_layer_norm(x)

    def logits(self, hidden_states):
        """The LM head: ``(..., C) -> (..., vocab)``, through the token embedding when tied."""
        if self.lm_head is None:
            return self.embeddings.word_embeddings.attend(hidden_states)
        return self.lm_head(hidden_states)

    def __call__(self, input_ids, attention_mask=None, cache=None):
        if cache is None:  # logits split by examples and, over "tensor", by vocabulary
            return constrain(self.logits(self.hidden_states(input_ids, attention_mask)),
                             ("batch", "seq", "vocab"))
        hidden, cache = self.hidden_states(input_ids, attention_mask, cache)
        return self.logits(hidden), cache
