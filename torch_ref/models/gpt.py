"""Twin of ``jaxformer/models/gpt.py``: GPT in PyTorch, same classes, attributes and arguments.

See jaxformer's ``GPT`` for the masks (``[batch, seq]`` only; the causal mask is built inside, a
4-D mask is refused), the position ids (``cumsum(mask) - 1`` at real tokens, 0 at padding) and
the KV cache, a ``GPTCache`` (``torch_ref/nn/cache.py``): keys and values are
``(B * nh, L, hs)`` as in jaxformer, written in place here; ``index`` is a Python int.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from jaxformer import validate
from jaxformer.config import GPTConfig
from torch_ref.nn.attention import cache_mask
from torch_ref.nn.cache import GPTCache, LayerCache
from torch_ref.nn.layers import TransformerBlock
from torch_ref.nn.masks import causal_mask, combine_masks, padding_mask
from torch_ref.nn.params import init_weights, layer_norm
from torch_ref.nn.stack import LayerStack


def position_ids_from_mask(attention_mask) -> torch.Tensor:
    mask = torch.as_tensor(attention_mask).bool()
    positions = torch.cumsum(mask.long(), dim=-1) - 1
    return torch.where(mask, positions, torch.zeros_like(positions))


def attention_mask_4d(attention_mask, seq_len: int, device=None) -> torch.Tensor:
    padding = None if attention_mask is None else padding_mask(attention_mask)  # (B, 1, 1, T)
    return combine_masks(causal_mask(seq_len, device=device), padding)


class GPTEmbeddings(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layer_norm = layer_norm(config) if config.embedding_layer_norm else None
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, input_ids, position_ids=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return self.dropout(x)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.embeddings = GPTEmbeddings(config)
        self.blocks = LayerStack(config, TransformerBlock, config.num_layers)
        self.final_layer_norm = layer_norm(config) if config.final_layer_norm else None
        self.lm_head = (None if config.tie_word_embeddings else
                        nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        self.apply(partial(init_weights, std=config.initializer_range))

    def init_cache(self, batch_size: int, max_length: int) -> GPTCache:
        weight = self.embeddings.word_embeddings.weight
        shape = (batch_size * self.config.num_heads, max_length, self.config.head_dim)
        zeros = partial(torch.zeros, dtype=weight.dtype, device=weight.device)
        return GPTCache(layers=self.blocks.map(lambda block: LayerCache(key=zeros(shape),
                                                                        value=zeros(shape))),
                        mask=torch.zeros(batch_size, max_length, dtype=torch.bool,
                                         device=weight.device),
                        index=0,
                        positions=torch.zeros(batch_size, dtype=torch.long,
                                              device=weight.device))

    def hidden_states(self, input_ids, attention_mask=None, cache=None):
        validate.check_gpt_inputs(self.config, input_ids, attention_mask)
        T = input_ids.shape[1]
        if cache is not None:
            return self._cached_hidden_states(input_ids, attention_mask, cache)
        if attention_mask is None:
            position_ids = torch.arange(T, device=input_ids.device)[None]  # (1, T)
        else:
            attention_mask = torch.as_tensor(attention_mask, device=input_ids.device)
            position_ids = position_ids_from_mask(attention_mask)  # (B, T)
        mask = attention_mask_4d(attention_mask, T, input_ids.device)  # (B or 1, 1, T, T)
        x = self.embeddings(input_ids, position_ids)
        return self._final_norm(self.blocks(x, mask))

    def _cached_hidden_states(self, input_ids, attention_mask, cache: GPTCache):
        (B, T), index = input_ids.shape, cache.index
        validate.check_cache_call("input_ids", input_ids, *cache.mask.shape, index)
        new = (torch.ones(B, T, dtype=torch.bool, device=input_ids.device)
               if attention_mask is None
               else torch.as_tensor(attention_mask, device=input_ids.device).bool())
        counts = torch.cumsum(new.long(), dim=-1)
        position_ids = torch.where(new, cache.positions[:, None] + counts - 1,
                                   torch.zeros_like(counts))  # (B, T)
        valid = cache.mask.clone()
        valid[:, index:index + T] = new  # (B, L)
        mask = cache_mask(valid, index, T)  # (B, 1, T, L)
        x = self.embeddings(input_ids, position_ids)
        x, layers = self.blocks(x, mask, cache=cache.layers, cache_index=index)
        cache = GPTCache(layers=layers, mask=valid, index=index + T,
                         positions=cache.positions + counts[:, -1])
        return self._final_norm(x), cache

    def _final_norm(self, x):
        return x if self.final_layer_norm is None else self.final_layer_norm(x)

    def logits(self, hidden_states):
        if self.lm_head is None:
            return F.linear(hidden_states, self.embeddings.word_embeddings.weight)
        return self.lm_head(hidden_states)

    def forward(self, input_ids, attention_mask=None, cache=None):
        if cache is None:
            return self.logits(self.hidden_states(input_ids, attention_mask))
        hidden, cache = self.hidden_states(input_ids, attention_mask, cache)
        return self.logits(hidden), cache
