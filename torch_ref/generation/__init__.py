"""Twin of ``jaxformer.generation``: cached greedy, sampling and beam search in PyTorch."""

from __future__ import annotations

import importlib

__all__ = ["generate", "stream"]


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module("torch_ref.generation.decoding"), name)
    raise AttributeError(f"module 'torch_ref.generation' has no attribute {name!r}")
