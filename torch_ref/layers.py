"""Twin of ``jaxformer/layers.py``: attention, feed-forward, the Transformer block, embeddings."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from torch_ref.masks import MASK_VALUE

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x, approximate="none"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


def init_weights(module: nn.Module, std: float) -> None:
    """The initialisation jaxformer uses: N(0, std) kernels and embeddings, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def layer_norm(config) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


def sinusoidal_positions(num_positions: int, hidden_size: int) -> torch.Tensor:
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]
    div_term = torch.exp(torch.arange(0, hidden_size, 2, dtype=torch.float64)
                         * (-math.log(10000.0) / hidden_size))
    table = torch.zeros(num_positions, hidden_size, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term)[:, : hidden_size // 2]
    return table.float()


def attention(q, k, v, mask=None, dropout_p: float = 0.0):
    """``(B, nh, T, hs)`` attention with a boolean mask (True = may attend), softmax in float32.

    The mask becomes an additive float mask holding MASK_VALUE: a row with every key masked
    then has all scores equal and a uniform softmax, exactly as in jaxformer (SDPA's boolean
    mask gives zeros there in torch 2.13, NaN in older releases).
    """
    if mask is not None:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask,
                                                                                   MASK_VALUE)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


class MultiHeadAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        C = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(C, C)
        self.key = nn.Linear(C, C)
        self.value = nn.Linear(C, C)
        self.output = nn.Linear(C, C)
        self.attention_dropout_rate = config.attention_dropout_rate

    def forward(self, hidden_states, context=None, mask=None):
        context = hidden_states if context is None else context
        B, T, C = hidden_states.shape
        S = context.shape[1]
        q = self.query(hidden_states).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.key(context).view(B, S, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.value(context).view(B, S, self.num_heads, self.head_dim).transpose(1, 2)
        p = self.attention_dropout_rate if self.training else 0.0
        y = attention(q, k, v, mask, p)  # (B, nh, T, hs)
        return self.output(y.transpose(1, 2).reshape(B, T, C))


class FeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.activation = config.activation

    def forward(self, x):
        return self.fc2(ACTIVATIONS[self.activation](self.fc1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = MultiHeadAttention(config)
        self.attention_norm = layer_norm(config)
        self.feed_forward = FeedForward(config)
        self.ffn_norm = layer_norm(config)
        self.dropout = nn.Dropout(config.dropout_rate)
        self.pre_norm = config.pre_norm

    def forward(self, x, mask=None):
        if self.pre_norm:
            x = x + self.dropout(self.attention(self.attention_norm(x), mask=mask))
            return x + self.dropout(self.feed_forward(self.ffn_norm(x)))
        x = self.attention_norm(x + self.dropout(self.attention(x, mask=mask)))
        return self.ffn_norm(x + self.dropout(self.feed_forward(x)))
