"""Twin of ``jaxformer/models/encoder_decoder.py``: the encoder-decoder Transformer in PyTorch.

The KV cache is a ``Seq2SeqCache`` (``torch_ref/nn/cache.py``), the same classes and shapes as
jaxformer's (``(B * nh, L, hs)`` keys and values), its self-attention tensors written in place;
``index`` is a Python int.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from jaxformer import validate
from jaxformer.config import TransformerConfig
from jaxformer.numerics import sinusoidal_positions
from torch_ref.nn.attention import MultiHeadAttention, cache_mask
from torch_ref.nn.cache import DecoderLayerCache, LayerCache, Seq2SeqCache
from torch_ref.nn.layers import FeedForward, TransformerBlock
from torch_ref.nn.masks import causal_mask, combine_masks, padding_mask
from torch_ref.nn.params import init_weights, layer_norm
from torch_ref.nn.stack import LayerStack


class TransformerEmbeddings(nn.Module):
    def __init__(self, config: TransformerConfig, vocab_size: int):
        super().__init__()
        learned = config.position_embedding_type == "learned"
        self.token_embeddings = (None if config.share_embeddings else
                                 nn.Embedding(vocab_size, config.hidden_size))
        self.position_embeddings = (nn.Embedding(config.max_position_embeddings
                                                 + config.position_offset,
                                                 config.hidden_size) if learned else None)
        # A constant, not a weight: absent from the state_dict (jaxformer: a jit-time constant).
        self.register_buffer("position_table", None if learned else torch.from_numpy(
            sinusoidal_positions(config.max_position_embeddings, config.hidden_size,
                                 config.sinusoidal_layout)), persistent=False)
        self.layer_norm = layer_norm(config) if config.embedding_layer_norm else None
        self.position_offset = config.position_offset
        self.scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, input_ids, shared_embeddings=None, position_ids=None):
        tokens = self.token_embeddings if self.token_embeddings is not None else shared_embeddings
        if tokens is None:
            raise ValueError("TransformerEmbeddings shares its token table: pass shared_embeddings")
        T = input_ids.shape[1]
        x = tokens(input_ids) * self.scale  # (B, T, C)
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)  # positions 0 .. T-1
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(position_ids + self.position_offset)[None]
        else:
            x = x + self.position_table[position_ids].to(x.dtype)[None]
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return self.dropout(x)


class LogitsBias(nn.Module):
    def __init__(self, vocab_size: int, config: TransformerConfig):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, logits):
        return logits + self.bias


EncoderLayer = TransformerBlock


class DecoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.self_attention = MultiHeadAttention(config)
        self.self_attention_norm = layer_norm(config)
        self.cross_attention = MultiHeadAttention(config)
        self.cross_attention_norm = layer_norm(config)
        self.feed_forward = FeedForward(config)
        self.ffn_norm = layer_norm(config)
        self.dropout = nn.Dropout(config.dropout_rate)
        self.pre_norm = config.pre_norm

    def forward(self, x, memory, self_mask=None, cross_mask=None, cache=None,
                cache_index=None):
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
        if cache is None:
            return x
        return x, DecoderLayerCache(self_attention=self_cache, cross_attention=cross_cache)


class Encoder(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.layers = LayerStack(config, EncoderLayer, config.num_encoder_layers)
        self.final_norm = layer_norm(config) if config.final_layer_norm else None

    def forward(self, hidden_states, mask=None):
        hidden_states = self.layers(hidden_states, mask)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        return hidden_states


class Decoder(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.layers = LayerStack(config, DecoderLayer, config.num_decoder_layers)
        self.final_norm = layer_norm(config) if config.final_layer_norm else None

    def forward(self, hidden_states, memory, self_mask=None, cross_mask=None, cache=None,
                cache_index=None):
        out = self.layers(hidden_states, memory, self_mask, cross_mask, cache=cache,
                          cache_index=cache_index)
        hidden_states, new_cache = (out, None) if cache is None else out
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        return hidden_states if cache is None else (hidden_states, new_cache)


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.shared_embeddings = (nn.Embedding(config.src_vocab_size, config.hidden_size)
                                  if config.share_embeddings else None)
        self.src_embeddings = TransformerEmbeddings(config, config.src_vocab_size)
        self.tgt_embeddings = TransformerEmbeddings(config, config.tgt_vocab_size)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.output_projection = (None if config.tie_word_embeddings else
                                  nn.Linear(config.hidden_size, config.tgt_vocab_size,
                                            bias=not config.final_logits_bias))
        self.final_logits_bias = (LogitsBias(config.tgt_vocab_size, config)
                                  if config.final_logits_bias else None)
        self.apply(partial(init_weights, std=config.initializer_range))

    def encode(self, src_ids, src_mask=None):
        cfg = self.config
        validate.check_source(cfg, src_ids, src_mask)
        if src_mask is None:
            src_mask = src_ids != cfg.src_pad_id
        x = self.src_embeddings(src_ids, self.shared_embeddings)
        return self.encoder(x, padding_mask(src_mask))  # mask (B, 1, 1, S)

    def init_cache(self, memory, max_length: int, src_mask=None) -> Seq2SeqCache:
        B, S, _ = memory.shape
        shape = (B * self.config.num_heads, max_length, self.config.head_dim)
        layers = self.decoder.layers.map(lambda layer: DecoderLayerCache(
            self_attention=LayerCache(key=memory.new_zeros(shape), value=memory.new_zeros(shape)),
            cross_attention=layer.cross_attention.key_value(memory)))
        source_mask = (torch.ones(B, S, dtype=torch.bool, device=memory.device)
                       if src_mask is None else torch.as_tensor(src_mask, device=memory.device) > 0)
        return Seq2SeqCache(layers=layers,
                            mask=torch.zeros(B, max_length, dtype=torch.bool,
                                             device=memory.device),
                            index=0, source_mask=source_mask)

    def decode(self, tgt_ids, memory, src_mask=None, tgt_mask=None, cache=None):
        cfg = self.config
        validate.check_target(cfg, tgt_ids, tgt_mask)
        if tgt_mask is None:
            tgt_mask = tgt_ids != cfg.tgt_pad_id
        if cache is not None:
            return self._cached_decode(tgt_ids, memory, src_mask, tgt_mask, cache)
        validate.check_memory(memory, tgt_ids, src_mask, cfg.hidden_size)
        T = tgt_ids.shape[1]
        self_mask = combine_masks(causal_mask(T, device=tgt_ids.device),
                                  padding_mask(tgt_mask))  # (B, 1, T, T)
        cross_mask = None if src_mask is None else padding_mask(src_mask)  # (B, 1, 1, S)
        y = self.tgt_embeddings(tgt_ids, self.shared_embeddings)
        return self._logits(self.decoder(y, memory, self_mask, cross_mask))  # (B, T, V)

    def _cached_decode(self, tgt_ids, memory, src_mask, tgt_mask, cache: Seq2SeqCache):
        if memory is not None or src_mask is not None:
            raise ValueError("decode with a cache reads the memory's keys and values and the "
                             "source mask from the cache: pass memory=None, src_mask=None")
        T, index = tgt_ids.shape[1], cache.index
        validate.check_cache_call("tgt_ids", tgt_ids, *cache.mask.shape, index)
        valid = cache.mask.clone()
        valid[:, index:index + T] = torch.as_tensor(tgt_mask, device=tgt_ids.device).bool()
        self_mask = cache_mask(valid, index, T)  # (B, 1, T, L)
        cross_mask = padding_mask(cache.source_mask)  # (B, 1, 1, S)
        positions = index + torch.arange(T, device=tgt_ids.device)
        y = self.tgt_embeddings(tgt_ids, self.shared_embeddings, positions)
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
            logits = F.linear(hidden_states, tokens.weight)
        if self.final_logits_bias is not None:
            logits = self.final_logits_bias(logits)
        return logits

    def forward(self, src_ids, tgt_ids, src_mask=None, tgt_mask=None):
        # all checks before any computation
        validate.check_source_target(self.config, src_ids, tgt_ids, src_mask, tgt_mask)
        if src_mask is None:
            src_mask = src_ids != self.config.src_pad_id
        memory = self.encode(src_ids, src_mask)
        return self.decode(tgt_ids, memory, src_mask, tgt_mask)
