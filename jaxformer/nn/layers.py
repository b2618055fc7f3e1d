"""What every family shares: parameter factories, feed-forward, the Transformer block.

Every module takes a family config (``BertConfig``, ``TransformerConfig`` or ``GPTConfig``); the
fields read here have the same name and meaning in all three. Twin: ``torch_ref/nn/layers.py``.
Shapes: B batch, T query length, S key length, C hidden size, nh heads, hs head size.
"""

from __future__ import annotations

import jax
from flax import nnx

from jaxformer.nn.attention import MultiHeadAttention
from jaxformer.nn.dropout import Dropout
from jaxformer.nn.params import layer_norm, linear
from jaxformer.sharding import constrain

ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # erf form, torch's nn.GELU()
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2's "gelu_new"
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,  # x * sigmoid(x), Hugging Face's "swish" (MarianMT)
}


class FeedForward(nnx.Module):
    """Position-wise ``fc2(activation(fc1(x)))``."""

    def __init__(self, config, *, rngs: nnx.Rngs):
        # Megatron: fc1 column-parallel, fc2 row-parallel (one all-reduce per feed-forward).
        self.fc1 = linear(config.hidden_size, config.intermediate_size, config,
                          names=("embed", "mlp"), rngs=rngs)
        self.fc2 = linear(config.intermediate_size, config.hidden_size, config,
                          names=("mlp", "embed"), rngs=rngs)
        self.activation = config.activation

    def __call__(self, x):
        return self.fc2(ACTIVATIONS[self.activation](self.fc1(x)))


class TransformerBlock(nnx.Module):
    """Self-attention and feed-forward sub-layers, each with dropout, residual and LayerNorm.

    Post-LN (BERT, the 2017 encoder): ``x = norm(x + dropout(sublayer(x)))``.
    Pre-LN (GPT-2): ``x = x + dropout(sublayer(norm(x)))``.
    """

    def __init__(self, config, *, rngs: nnx.Rngs):
        self.attention = MultiHeadAttention(config, rngs=rngs)
        self.attention_norm = layer_norm(config, rngs=rngs)
        self.feed_forward = FeedForward(config, rngs=rngs)
        self.ffn_norm = layer_norm(config, rngs=rngs)
        self.dropout = Dropout(config.dropout_rate, rngs=rngs)
        self.pre_norm = config.pre_norm

    def __call__(self, x, mask=None, cache=None, cache_index=None):
        """``(B, T, C) -> (B, T, C)``; with a self-attention ``cache`` (a ``LayerCache``, see
        ``MultiHeadAttention``) returns ``(output, new cache)``."""

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
        x = constrain(x, ("batch", "seq", "hidden"))  # the residual stream: split by examples
        return x if cache is None else (x, new_cache)
