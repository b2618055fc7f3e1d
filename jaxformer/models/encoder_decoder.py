"""The encoder-decoder Transformer (Vaswani et al., 2017) in Flax NNX, as specified by seed 002
(the project's encoder-decoder seed document, preset ``TransformerConfig.simple_transformer``)
with its bugs fixed (see ``Transformer``). Each side embeds its tokens and adds positions
(sinusoidal or learned) -> the encoder blocks -> the decoder layers (causal self-attention,
cross-attention over the memory, feed-forward) -> the target vocabulary. Twin:
``torch_ref/models/encoder_decoder.py``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import validate
from jaxformer.config import TransformerConfig
from jaxformer.nn.attention import MultiHeadAttention, cache_mask
from jaxformer.nn.cache import DecoderLayerCache, LayerCache, Seq2SeqCache
from jaxformer.nn.dropout import Dropout
from jaxformer.nn.layers import FeedForward, TransformerBlock
from jaxformer.nn.masks import causal_mask, combine_masks, padding_mask
from jaxformer.nn.params import embedding, layer_norm, linear
from jaxformer.nn.stack import LayerStack
from jaxformer.numerics import sinusoidal_positions
from jaxformer.sharding import constrain

# The fixed table of positions, computed once per size on the host.
sinusoidal_table = functools.lru_cache(maxsize=None)(sinusoidal_positions)


class TransformerEmbeddings(nnx.Module):
    """One side's embeddings: token (times sqrt(hidden) if ``scale_embeddings``) + position,
    then a LayerNorm if ``embedding_layer_norm`` (BART). Learned positions read row
    ``position + position_offset``; the sinusoidal table is laid out as ``sinusoidal_layout``.

    With ``config.share_embeddings`` the side owns no token table (``token_embeddings`` is None)
    and the owning ``Transformer`` passes its ``shared_embeddings`` at call time. Sinusoidal
    positions are not a parameter and not state either: a numpy constant that ``jit`` folds into
    the compiled program, so the module holds no array that could leak from a traced
    ``__init__`` or travel host-to-device on every call. (torch_ref keeps the table as a
    non-persistent buffer, so that it follows ``.to(device)``.)
    """

    def __init__(self, config: TransformerConfig, vocab_size: int, *, rngs: nnx.Rngs):
        learned = config.position_embedding_type == "learned"
        self.token_embeddings = (None if config.share_embeddings else
                                 embedding(vocab_size, config, names=("vocab", "embed"),
                                           rngs=rngs))
        self.position_embeddings = (embedding(config.max_position_embeddings
                                              + config.position_offset, config,
                                              names=("positions", "embed"), rngs=rngs)
                                    if learned else None)
        self.layer_norm = layer_norm(config, rngs=rngs) if config.embedding_layer_norm else None
        self.max_position_embeddings = config.max_position_embeddings
        self.position_offset = config.position_offset
        self.sinusoidal_layout = config.sinusoidal_layout
        self.scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0
        self.dropout = Dropout(config.dropout_rate, rngs=rngs)

    def __call__(self, input_ids, shared_embeddings=None, position_ids=None):
        """``(B, T)`` ids -> ``(B, T, C)``; positions ``0 .. T-1`` unless ``position_ids``
        (``(T,)``, a cached decoding step's) are given."""
        tokens = self.token_embeddings if self.token_embeddings is not None else shared_embeddings
        if tokens is None:
            raise ValueError("TransformerEmbeddings shares its token table: pass shared_embeddings")
        T = input_ids.shape[1]
        x = tokens(input_ids) * self.scale  # (B, T, C)
        if self.position_embeddings is not None:
            positions = jnp.arange(T) if position_ids is None else position_ids
            x = x + self.position_embeddings(positions + self.position_offset)[None]
        else:
            table = sinusoidal_table(self.max_position_embeddings, x.shape[-1],
                                     self.sinusoidal_layout)
            if position_ids is None:
                x = x + jnp.asarray(table[:T], x.dtype)[None]  # positions 0 .. T-1
            else:  # a position past the table reads NaN, never a plausible row, as Embed does
                x = x + jnp.take(jnp.asarray(table, x.dtype), position_ids, axis=0, mode="fill",
                                 fill_value=jnp.nan)[None]
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return self.dropout(x)


class LogitsBias(nnx.Module):
    """``config.final_logits_bias``: one bias vector added to the logits (MarianMT and BART's
    ``final_logits_bias``), whether the output projection is tied or not."""

    def __init__(self, vocab_size: int, config: TransformerConfig):
        self.bias = nnx.Param(jnp.zeros((vocab_size,), jnp.dtype(config.param_dtype)),
                              out_sharding=("vocab",), eager_sharding=False)

    def __call__(self, logits):
        # In the compute dtype, as nnx.Linear adds its bias (the losses upcast to float32).
        return logits + self.bias[...].astype(logits.dtype)


EncoderLayer = TransformerBlock  # self-attention + feed-forward, post- or pre-LN (layers.py)


class DecoderLayer(nnx.Module):
    """Causal self-attention, cross-attention over ``memory``, feed-forward.

    Each sub-layer: post-LN ``x = norm(x + dropout(sublayer(x)))`` or
    pre-LN ``x = x + dropout(sublayer(norm(x)))`` (``config.pre_norm``), as in
    ``torch.nn.TransformerDecoderLayer``. The memory itself is not normalised here.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.self_attention = MultiHeadAttention(config, rngs=rngs)
        self.self_attention_norm = layer_norm(config, rngs=rngs)
        self.cross_attention = MultiHeadAttention(config, rngs=rngs)
        self.cross_attention._reads_cached_context = True  # no joined copy (params.vector_kernels)
        self.cross_attention_norm = layer_norm(config, rngs=rngs)
        self.feed_forward = FeedForward(config, rngs=rngs)
        self.ffn_norm = layer_norm(config, rngs=rngs)
        self.dropout = Dropout(config.dropout_rate, rngs=rngs)
        self.pre_norm = config.pre_norm

    def __call__(self, x, memory, self_mask=None, cross_mask=None, cache=None,
                 cache_index=None):
        """With ``cache`` (a ``DecoderLayerCache``) ``memory`` is None and the call returns
        ``(x, new cache)``: the self-attention's slots written, the cross-attention's as given."""

        def self_attend(h):
            if cache is None:
                return self.self_attention(h, mask=self_mask), None
            return self.self_attention(h, mask=self_mask, cache=cache.self_attention,
                                       cache_index=cache_index)

        def cross_attend(h):
            if cache is None:
                return self.cross_attention(h, memory, cross_mask), None
            return self.cross_attention(h, None, cross_mask, cache.cross_attention)

        if self.pre_norm:
            h, self_cache = self_attend(self.self_attention_norm(x))
            x = x + self.dropout(h)
            h, cross_cache = cross_attend(self.cross_attention_norm(x))
            x = x + self.dropout(h)
            x = x + self.dropout(self.feed_forward(self.ffn_norm(x)))
        else:
            h, self_cache = self_attend(x)
            x = self.self_attention_norm(x + self.dropout(h))
            h, cross_cache = cross_attend(x)
            x = self.cross_attention_norm(x + self.dropout(h))
            x = self.ffn_norm(x + self.dropout(self.feed_forward(x)))
        x = constrain(x, ("batch", "seq", "hidden"))  # the residual stream: split by examples
        if cache is None:
            return x
        return x, DecoderLayerCache(self_attention=self_cache, cross_attention=cross_cache)


class Encoder(nnx.Module):
    """Embedded source ``(B, S, C)`` -> memory ``(B, S, C)``; ``final_norm`` if configured."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.layers = LayerStack(config, EncoderLayer, config.num_encoder_layers, rngs=rngs)
        self.final_norm = layer_norm(config, rngs=rngs) if config.final_layer_norm else None

    def __call__(self, hidden_states, mask=None):
        hidden_states = self.layers(hidden_states, mask)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        return hidden_states


class Decoder(nnx.Module):
    """Embedded target ``(B, T, C)`` and memory ``(B, S, C)`` -> hidden states ``(B, T, C)``."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.layers = LayerStack(config, DecoderLayer, config.num_decoder_layers, rngs=rngs)
        self.final_norm = layer_norm(config, rngs=rngs) if config.final_layer_norm else None

    def __call__(self, hidden_states, memory, self_mask=None, cross_mask=None, cache=None,
                 cache_index=None):
        """With ``cache`` (a ``DecoderLayerCache`` per layer, see ``nn/stack.py``) returns
        ``(hidden_states, new cache)``."""
        out = self.layers(hidden_states, memory, self_mask, cross_mask, cache=cache,
                          cache_index=cache_index)
        hidden_states, new_cache = (out, None) if cache is None else out
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        return hidden_states if cache is None else (hidden_states, new_cache)


class Transformer(nnx.Module):
    """``(src_ids, tgt_ids, src_mask, tgt_mask) -> logits (B, T, tgt_vocab_size)``.

    ``encode`` and ``decode`` run the two halves on their own (generation builds on them).
    With ``share_embeddings`` both sides read ``shared_embeddings``; with ``tie_word_embeddings``
    the logits use the target token table, else ``output_projection``.

    Bugs of the seed-002 implementation fixed here: full ``C -> C`` query/key/value projections
    instead of a shared per-head ``Linear(head_dim, head_dim)``; softmax over keys and scaling by
    sqrt(head_dim) (``nn/attention.py``); positions index the table instead of being added to it;
    dropout on the decoder's sub-layer output, not its residual input; the target self-attention
    mask is causal AND target padding (the seed ignored padding).

    Masks: the public ``src_mask`` / ``tgt_mask`` are ``[batch, seq]`` 1/0 (1 = real token), built
    from ``config.src_pad_id`` / ``config.tgt_pad_id`` when not given. Inside they become boolean
    ``[B, 1, T, S]`` masks, True = may attend: the encoder self-attention masks source padding, the
    decoder self-attention is causal AND target padding, the cross-attention masks source padding.

    Decoding with a KV cache (``jaxformer.generation``): ``init_cache(memory, max_length,
    src_mask)`` returns a ``Seq2SeqCache`` (``nn/cache.py``): every decoder layer's cross-attention
    keys and values, computed from the memory once, and its preallocated self-attention cache;
    ``decode(tgt_ids, None, cache=cache)`` then runs only the new target tokens (positions continue
    from the cache's index) and returns ``(logits, new cache)``.
    """

    _no_vector_steps = ("encoder",)  # it runs once per generate call, before the steps

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.shared_embeddings = (embedding(config.src_vocab_size, config,
                                            names=("vocab", "embed"), rngs=rngs)
                                  if config.share_embeddings else None)
        self.src_embeddings = TransformerEmbeddings(config, config.src_vocab_size, rngs=rngs)
        self.tgt_embeddings = TransformerEmbeddings(config, config.tgt_vocab_size, rngs=rngs)
        self.encoder = Encoder(config, rngs=rngs)
        self.decoder = Decoder(config, rngs=rngs)
        self.output_projection = (None if config.tie_word_embeddings else
                                  linear(config.hidden_size, config.tgt_vocab_size, config,
                                         names=("embed", "vocab"), rngs=rngs,
                                         use_bias=not config.final_logits_bias))
        self.final_logits_bias = (LogitsBias(config.tgt_vocab_size, config)
                                  if config.final_logits_bias else None)

    def encode(self, src_ids, src_mask=None):
        """``(B, S)`` source ids -> memory ``(B, S, C)``."""
        cfg = self.config
        validate.check_source(cfg, src_ids, src_mask)
        if src_mask is None:
            src_mask = src_ids != cfg.src_pad_id
        x = self.src_embeddings(src_ids, self.shared_embeddings)
        return self.encoder(x, padding_mask(src_mask))  # mask (B, 1, 1, S)

    def init_cache(self, memory, max_length: int, src_mask=None) -> Seq2SeqCache:
        """A cache for decoding ``max_length`` target tokens against ``memory`` ``(B, S, C)``:
        cross-attention keys and values computed here, once (see the module doc)."""
        B, S, _ = memory.shape
        shape = (B * self.config.num_heads, max_length, self.config.head_dim)
        dtype = jnp.dtype(self.config.dtype)
        layers = self.decoder.layers.map(lambda layer: DecoderLayerCache(
            self_attention=LayerCache(key=jnp.zeros(shape, dtype), value=jnp.zeros(shape, dtype)),
            cross_attention=layer.cross_attention.key_value(memory)))
        source_mask = jnp.ones((B, S), bool) if src_mask is None else jnp.asarray(src_mask) > 0
        return Seq2SeqCache(layers=layers, mask=jnp.zeros((B, max_length), bool),
                            index=jnp.zeros((), jnp.int32), source_mask=source_mask)

    def decode(self, tgt_ids, memory, src_mask=None, tgt_mask=None, cache=None):
        """``(B, T)`` target ids and memory ``(B, S, C)`` -> logits ``(B, T, tgt_vocab_size)``.

        ``src_mask=None`` lets the target attend to every memory position (``decode`` never sees
        the source ids); ``tgt_mask=None`` is built from ``config.tgt_pad_id``. With ``cache``
        (from :meth:`init_cache`, which holds the memory's keys and the source mask) ``memory``
        and ``src_mask`` are None, ``tgt_ids`` are the next tokens only, and the result is
        ``(logits, new cache)``.
        """
        cfg = self.config
        validate.check_target(cfg, tgt_ids, tgt_mask)
        if tgt_mask is None:
            tgt_mask = tgt_ids != cfg.tgt_pad_id
        if cache is not None:
            return self._cached_decode(tgt_ids, memory, src_mask, tgt_mask, cache)
        validate.check_memory(memory, tgt_ids, src_mask, cfg.hidden_size)
        T = tgt_ids.shape[1]
        self_mask = combine_masks(causal_mask(T), padding_mask(tgt_mask))  # (B, 1, T, T)
        cross_mask = None if src_mask is None else padding_mask(src_mask)  # (B, 1, 1, S)
        y = self.tgt_embeddings(tgt_ids, self.shared_embeddings)
        return self._logits(self.decoder(y, memory, self_mask, cross_mask))  # (B, T, V)

    def _cached_decode(self, tgt_ids, memory, src_mask, tgt_mask, cache: Seq2SeqCache):
        if memory is not None or src_mask is not None:
            raise ValueError("decode with a cache reads the memory's keys and values and the "
                             "source mask from the cache: pass memory=None, src_mask=None")
        T, index = tgt_ids.shape[1], cache.index
        cache_batch, cache_length = cache.mask.shape
        validate.check_cache_call("tgt_ids", tgt_ids, cache_batch, cache_length, index)
        valid = jax.lax.dynamic_update_slice(cache.mask, jnp.asarray(tgt_mask).astype(bool),
                                             (0, index))  # (B, L)
        self_mask = cache_mask(valid, index, T)  # (B, 1, T, L)
        cross_mask = padding_mask(cache.source_mask)  # (B, 1, 1, S)
        y = self.tgt_embeddings(tgt_ids, self.shared_embeddings, index + jnp.arange(T))
        hidden_states, layers = self.decoder(y, None, self_mask, cross_mask, cache.layers, index)
        cache = Seq2SeqCache(layers=layers, mask=valid, index=index + T,
                             source_mask=cache.source_mask)
        return self._logits(hidden_states), cache

    def _logits(self, hidden_states):
        if self.output_projection is not None:
            logits = self.output_projection(hidden_states)
        else:
            tokens = (self.shared_embeddings if self.shared_embeddings is not None
                      else self.tgt_embeddings.token_embeddings)
            logits = tokens.attend(hidden_states)
        if self.final_logits_bias is not None:
            logits = self.final_logits_bias(logits)
        return logits

    def __call__(self, src_ids, tgt_ids, src_mask=None, tgt_mask=None):
        # all checks before any computation
        validate.check_source_target(self.config, src_ids, tgt_ids, src_mask, tgt_mask)
        if src_mask is None:
            src_mask = src_ids != self.config.src_pad_id
        memory = self.encode(src_ids, src_mask)
        return self.decode(tgt_ids, memory, src_mask, tgt_mask)
