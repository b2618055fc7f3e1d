"""jaxformer: BERT, the encoder-decoder Transformer and GPT in Flax NNX, each with a PyTorch twin.

Submodules load on first use, so ``torch_ref`` can share ``jaxformer.config`` and
``jaxformer.validate`` without importing JAX.
"""

import importlib

__version__ = "0.1.0"

from jaxformer.config import BertConfig, GPTConfig, TransformerConfig  # noqa: E402  (stdlib only)

_SUBMODULES = ("bert", "cli", "convert", "embed", "encoder_decoder", "gpt", "hf", "layers",
               "masks", "parity", "validate")

__all__ = ["BertConfig", "GPTConfig", "TransformerConfig", *_SUBMODULES]


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"jaxformer.{name}")
    raise AttributeError(f"module 'jaxformer' has no attribute {name!r}")
