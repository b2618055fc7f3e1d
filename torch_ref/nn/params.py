"""Twin of ``jaxformer/nn/params.py``: the initialisation and LayerNorm jaxformer uses."""

from __future__ import annotations

from torch import nn


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
