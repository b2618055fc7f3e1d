"""jaxformer: BERT, the encoder-decoder Transformer and GPT in Flax NNX, each with a PyTorch twin.

The tree reads as the architecture (docs/design.md): ``config``, ``validate`` and ``numerics`` are
framework-free (standard library and numpy) and shared with ``torch_ref``; ``nn`` holds what every
family shares, ``models`` one file per family, ``checkpoints`` weight I/O, ``parity`` the main job.
Submodules load on first use, so ``torch_ref`` can import the framework-free ones without JAX.
"""

from __future__ import annotations

import importlib

from jaxformer.config import BertConfig, GPTConfig, TransformerConfig

__version__ = "0.1.0"

_SUBMODULES = ("checkpoints", "cli", "config", "embed", "generation", "loading", "models", "nn",
               "numerics", "parity", "tokenizer", "training", "validate")
# names of submodules offered at the top (``jaxformer.load(path)``), imported on first use
_LAZY = {"load": "loading", "Loaded": "loading", "LoadError": "loading"}

__all__ = ["BertConfig", "GPTConfig", "TransformerConfig", *_LAZY, *_SUBMODULES]


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"jaxformer.{name}")
    if name in _LAZY:
        return getattr(importlib.import_module(f"jaxformer.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'jaxformer' has no attribute {name!r}")
