"""Twin models with randomised weights, shared by the model tests.

``SPREAD`` (the spread of randomised biases and LayerNorm offsets), ``random_twins`` (a cached
torch / NNX pair with the same randomised weights), ``compiled`` (its NNX model, jitted once) and
``call`` (a model on numpy inputs, either framework) serve ``models/test_invariance.py`` and
``models/test_references.py``; ``SPREAD`` also ``models/test_bf16.py`` and ``support/autocast.py``.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import torch

from jaxformer.checkpoints import convert
from jaxformer.nn.jit import jitted
from parity_tests.support.helpers import randomize, twin_pair

# Biases and LayerNorm offsets 0.1 N(0, 1) (helpers.randomize's spread): test_bf16's bound was
# measured on these weights.
SPREAD = 0.1


@functools.cache
def random_twins(torch_cls, jax_cls, config, seed: int = 0):
    """(torch model, NNX model) with the same :func:`randomize`-d weights, in eval mode. Cached
    (here and in ``test_references.py``/``test_bf16.py``): tests only read them."""
    torch_model, jax_model = twin_pair(torch_cls, jax_cls, config, seed)
    convert.torch_to_nnx(randomize(torch_model, seed, SPREAD).state_dict(), jax_model)
    return torch_model, jax_model


@functools.cache
def compiled(torch_cls, jax_cls, config):
    """The NNX model of :func:`random_twins`, jitted once."""
    return jitted(random_twins(torch_cls, jax_cls, config)[1])


def call(fn, framework: str, args: dict):
    """``fn(**args)`` with the numpy ``args`` as torch tensors (no grad) or JAX arrays."""
    if framework == "torch":
        with torch.no_grad():
            return fn(**{k: torch.from_numpy(v) for k, v in args.items()})
    return fn(**{k: jnp.asarray(v) for k, v in args.items()})
