"""Reading traced programs: every equation of a jaxpr, nested ones included, and a state's arrays
with PRNG keys as their raw data (a key array has no NumPy value of its own)."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.extend
import numpy as np


def equations(jaxpr: jax.extend.core.Jaxpr) -> Iterator[jax.extend.core.JaxprEqn]:
    """Every equation of ``jaxpr`` and of the jaxprs its equations hold (a nested ``jit``, a
    custom gradient's forward, a loop's body, a conditional's branches), depth first, each
    equation before those nested in it."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from equations(sub)


def raw(array) -> np.ndarray:
    """``array`` as NumPy; a PRNG key array as its raw key data."""
    if jax.dtypes.issubdtype(array.dtype, jax.dtypes.prng_key):
        array = jax.random.key_data(array)
    return np.asarray(array)


def raw_leaves(tree) -> list[np.ndarray]:
    """Every array of ``tree`` (a model's or a train step's state), through :func:`raw`."""
    return [raw(leaf) for leaf in jax.tree.leaves(tree)]
