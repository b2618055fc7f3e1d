"""Twin of ``jaxformer/nn/layers.py``: the feed-forward and the Transformer block in PyTorch.

Every model family builds its blocks from these; with a self-attention cache (a ``LayerCache``,
``torch_ref/nn/cache.py``) a block returns ``(output, new cache)``, as jaxformer's does.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from torch_ref.nn.attention import MultiHeadAttention
from torch_ref.nn.params import layer_norm

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x, approximate="none"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


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

    def forward(self, x, mask=None, cache=None, cache_index=None):
        def attend(h):
            if cache is None:
                return self.attention(h, mask=mask), None
            return self.attention(h, mask=mask, cache=cache, cache_index=cache_index)

        if self.pre_norm:
            h, new_cache = attend(self.attention_norm(x))
            x = x + self.dropout(h)
            x = x + self.dropout(self.feed_forward(self.ffn_norm(x)))
        else:
            h, new_cache = attend(x)
            x = self.attention_norm(x + self.dropout(h))
            x = self.ffn_norm(x + self.dropout(self.feed_forward(x)))
        return x if cache is None else (x, new_cache)
