"""Generation with a KV cache: greedy, sampling and beam search. Twin: ``torch_ref.generation``.

``generate`` and ``stream`` are loaded on first use: ``torch_ref.generation`` imports
``checks``, the framework-free part, and should not pull in ``decoding``, which imports the
JAX models.
"""

from __future__ import annotations

import importlib

__all__ = ["generate", "stream"]


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module("jaxformer.generation.decoding"), name)
    raise AttributeError(f"module 'jaxformer.generation' has no attribute {name!r}")
