"""jaxformer: BERT, the encoder-decoder Transformer and GPT in Flax NNX, each with a PyTorch twin.

The tree reads as the architecture (docs/design.md): ``config``, ``validate`` and ``numerics`` are
framework-free (standard library and numpy) and shared with ``torch_ref``; ``nn`` holds what every
family shares, ``models`` one file per family, ``checkpoints`` weight I/O, ``parity`` the main job.
Submodules load on first use, so ``torch_ref`` can import the framework-free ones without JAX.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

from jaxformer.config import BertConfig, GPTConfig, TransformerConfig

__version__ = "0.1.0"

_SUBMODULES = ("checkpoints", "cli", "config", "embed", "generation", "models", "nn", "numerics",
               "parity", "training", "validate")

# Modules of the first release, now in their folders: `from jaxformer.bert import BertModel`,
# `from jaxformer import bert` and `import torch_ref.bert` keep working (with a DeprecationWarning
# naming the new path). torch_ref imports this package, so its aliases are registered too.
MOVED = {
    "torch_ref.bert": "torch_ref.models.bert",
    "torch_ref.gpt": "torch_ref.models.gpt",
    "torch_ref.encoder_decoder": "torch_ref.models.encoder_decoder",
    "torch_ref.layers": "torch_ref.nn.layers",
    "torch_ref.masks": "torch_ref.nn.masks",
    "jaxformer.bert": "jaxformer.models.bert",
    "jaxformer.gpt": "jaxformer.models.gpt",
    "jaxformer.encoder_decoder": "jaxformer.models.encoder_decoder",
    "jaxformer.layers": "jaxformer.nn.layers",
    "jaxformer.masks": "jaxformer.nn.masks",
    "jaxformer.convert": "jaxformer.checkpoints.convert",
    "jaxformer.hf": "jaxformer.checkpoints.hf",
}

__all__ = ["BertConfig", "GPTConfig", "TransformerConfig", *_SUBMODULES]


def _moved(old: str):
    new = MOVED[old]
    warnings.warn(f"{old} moved to {new}; the old path will be removed", DeprecationWarning,
                  stacklevel=3)
    return importlib.import_module(new)


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import jaxformer.bert`` give the module ``jaxformer.models.bert`` itself."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec):
        return _moved(spec.name)

    def exec_module(self, module):
        pass


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"jaxformer.{name}")
    if f"jaxformer.{name}" in MOVED:
        return _moved(f"jaxformer.{name}")
    raise AttributeError(f"module 'jaxformer' has no attribute {name!r}")
