"""Twin of ``jaxformer/models/encoder_decoder.py``: the encoder-decoder Transformer in PyTorch."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from jaxformer import validate
from jaxformer.config import TransformerConfig
from jaxformer.numerics import sinusoidal_positions
from torch_ref.nn.attention import MultiHeadAttention
from torch_ref.nn.layers import FeedForward, TransformerBlock
from torch_ref.nn.params import init_weights, layer_norm
from torch_ref.nn.masks import causal_mask, combine_masks, padding_mask


class TransformerEmbeddings(nn.Module):
    def __init__(self, config: TransformerConfig, vocab_size: int):
        super().__init__()
        learned = config.position_embedding_type == "learned"
        self.token_embeddings = (None if config.share_embeddings else
                                 nn.Embedding(vocab_size, config.hidden_size))
        self.position_embeddings = (nn.Embedding(config.max_position_embeddings,
                                                 config.hidden_size) if learned else None)
        # A constant, not a weight: absent from the state_dict (jaxformer: a jit-time constant).
        self.register_buffer("position_table", None if learned else torch.from_numpy(
            sinusoidal_positions(config.max_position_embeddings, config.hidden_size)),
            persistent=False)
        self.scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, input_ids, shared_embeddings=None):
        tokens = self.token_embeddings if self.token_embeddings is not None else shared_embeddings
        if tokens is None:
            raise ValueError("TransformerEmbeddings shares its token table: pass shared_embeddings")
        T = input_ids.shape[1]
        x = tokens(input_ids) * self.scale  # (B, T, C)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(torch.arange(T, device=input_ids.device))[None]
        else:
            x = x + self.position_table[:T].to(x.dtype)[None]  # positions 0 .. T-1
        return self.dropout(x)


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

    def forward(self, x, memory, self_mask=None, cross_mask=None):
        if self.pre_norm:
            x = x + self.dropout(self.self_attention(self.self_attention_norm(x), mask=self_mask))
            x = x + self.dropout(self.cross_attention(self.cross_attention_norm(x), memory,
                                                      cross_mask))
            return x + self.dropout(self.feed_forward(self.ffn_norm(x)))
        x = self.self_attention_norm(x + self.dropout(self.self_attention(x, mask=self_mask)))
        x = self.cross_attention_norm(x + self.dropout(self.cross_attention(x, memory,
                                                                            cross_mask)))
        return self.ffn_norm(x + self.dropout(self.feed_forward(x)))


class Encoder(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(config)
                                     for _ in range(config.num_encoder_layers)])
        self.final_norm = layer_norm(config) if config.final_layer_norm else None

    def forward(self, hidden_states, mask=None):
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        return hidden_states


class Decoder(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(config)
                                     for _ in range(config.num_decoder_layers)])
        self.final_norm = layer_norm(config) if config.final_layer_norm else None

    def forward(self, hidden_states, memory, self_mask=None, cross_mask=None):
        for layer in self.layers:
            hidden_states = layer(hidden_states, memory, self_mask, cross_mask)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        return hidden_states


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
                                  nn.Linear(config.hidden_size, config.tgt_vocab_size))
        self.apply(partial(init_weights, std=config.initializer_range))

    def encode(self, src_ids, src_mask=None):
        cfg = self.config
        validate.check_source(cfg, src_ids, src_mask)
        if src_mask is None:
            src_mask = src_ids != cfg.src_pad_id
        x = self.src_embeddings(src_ids, self.shared_embeddings)
        return self.encoder(x, padding_mask(src_mask))  # mask (B, 1, 1, S)

    def decode(self, tgt_ids, memory, src_mask=None, tgt_mask=None):
        cfg = self.config
        validate.check_target(cfg, tgt_ids, tgt_mask)
        validate.check_memory(memory, tgt_ids, src_mask, cfg.hidden_size)
        if tgt_mask is None:
            tgt_mask = tgt_ids != cfg.tgt_pad_id
        T = tgt_ids.shape[1]
        self_mask = combine_masks(causal_mask(T, device=tgt_ids.device),
                                  padding_mask(tgt_mask))  # (B, 1, T, T)
        cross_mask = None if src_mask is None else padding_mask(src_mask)  # (B, 1, 1, S)
        y = self.tgt_embeddings(tgt_ids, self.shared_embeddings)
        hidden_states = self.decoder(y, memory, self_mask, cross_mask)  # (B, T, C)
        if self.output_projection is not None:
            return self.output_projection(hidden_states)
        tokens = (self.shared_embeddings if self.shared_embeddings is not None
                  else self.tgt_embeddings.token_embeddings)
        return F.linear(hidden_states, tokens.weight)

    def forward(self, src_ids, tgt_ids, src_mask=None, tgt_mask=None):
        # all checks before any computation
        validate.check_source_target(self.config, src_ids, tgt_ids, src_mask, tgt_mask)
        if src_mask is None:
            src_mask = src_ids != self.config.src_pad_id
        memory = self.encode(src_ids, src_mask)
        return self.decode(tgt_ids, memory, src_mask, tgt_mask)
