"""The one place where a framework name ("jax" or "torch") becomes code.

The PyTorch twins mirror this package module for module (``jaxformer.training.step`` and
``torch_ref.training.step``), so a twin is named by its path under the package root and imported
only when the torch framework is chosen: importing jaxformer never imports torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType

PACKAGES = {"jax": "jaxformer", "torch": "torch_ref"}
FRAMEWORKS = tuple(PACKAGES)


def module(framework: str, name: str) -> ModuleType:
    """The module ``name`` (dotted, relative to the package root, e.g. ``"training.step"``) of
    ``framework``: ``jaxformer.<name>`` for "jax", ``torch_ref.<name>`` for "torch"."""
    if framework not in PACKAGES:
        raise ValueError(f"unknown framework {framework!r}; choose one of {', '.join(FRAMEWORKS)}")
    if framework == "torch":
        try:
            import torch  # noqa: F401
        except ImportError as error:
            raise ImportError("the torch framework needs PyTorch: pip install 'jaxformer[torch]'"
                              ) from error
    return importlib.import_module(f"{PACKAGES[framework]}.{name}")
