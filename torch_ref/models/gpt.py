"""Twin of ``jaxformer/models/gpt.py``: GPT in PyTorch, same classes, attributes and arguments.

See ``jaxformer/models/gpt.py`` for the masks (``[batch, seq]`` only; the causal mask is built inside,
a 4-D mask is refused) and the position ids (``cumsum(mask) - 1`` at real tokens, 0 at padding).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from jaxformer import validate
from jaxformer.config import GPTConfig
from torch_ref.nn.layers import TransformerBlock
from torch_ref.nn.params import init_weights, layer_norm
from torch_ref.nn.masks import causal_mask, combine_masks, padding_mask


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
        self.blocks = nn.ModuleList([TransformerBlock(config) for _ in range(config.num_layers)])
        self.final_layer_norm = layer_norm(config) if config.final_layer_norm else None
        self.lm_head = (None if config.tie_word_embeddings else
                        nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        self.apply(partial(init_weights, std=config.initializer_range))

    def hidden_states(self, input_ids, attention_mask=None):
        validate.check_gpt_inputs(self.config, input_ids, attention_mask)
        T = input_ids.shape[1]
        if attention_mask is None:
            position_ids = torch.arange(T, device=input_ids.device)[None]  # (1, T)
        else:
            attention_mask = torch.as_tensor(attention_mask, device=input_ids.device)
            position_ids = position_ids_from_mask(attention_mask)  # (B, T)
        mask = attention_mask_4d(attention_mask, T, input_ids.device)  # (B or 1, 1, T, T)
        x = self.embeddings(input_ids, position_ids)
        for block in self.blocks:
            x = block(x, mask)
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        return x

    def logits(self, hidden_states):
        if self.lm_head is None:
            return F.linear(hidden_states, self.embeddings.word_embeddings.weight)
        return self.lm_head(hidden_states)

    def forward(self, input_ids, attention_mask=None):
        return self.logits(self.hidden_states(input_ids, attention_mask))
