"""A model's initialiser, traced so that XLA compiles it in a fraction of the time: the same
parameters and RNG keys, bit for bit.

``training.step.build_model`` compiles one initialiser per model (``jax.jit`` of the model's
construction from a traced seed). Built as nnx builds it, every weight is its own normal draw
(``nnx.initializers.normal``: a threefry loop and an inverse error function) from its own key
(``fold_in(root, count)``, one per draw, RNG streams included), and XLA:CPU compiles each of
those apart: a baby GPT's initialiser (26 draws, 77 keys) took 2.0 s to compile, GPT-2 small's
(74 draws, 221 keys) 5.2 s, most of a cold start-up. :func:`build` constructs the model with

- every normal draw of :func:`normal` deferred: the construction gets a zero placeholder, and the
  draws of one shape, dtype and deviation are then made together, one compiled loop body for
  all of them (``lax.map`` over their keys, each iteration the very draw nnx makes), and put in
  the placeholders' places in the model's state;
- the root stream's keys derived in blocks (:class:`_KeyTable`): key ``i`` is ``fold_in(root,
  i)``, what nnx's stream gives its ``i``-th draw, computed for 256 counts at once.

Both change only how the work is laid out for the compiler: each key and each draw is the same
function of the seed, and ``parity_tests/test_runtime.py`` checks every family's parameters and
keys against the initialiser built as nnx builds it. Used where ``runtime.fast_initializer()``
says (the CPU backend; ``JAXFORMER_FAST_INITIALIZER=0`` off) and for an unscanned stack of
layers only: a scanned stack builds its layers inside ``nnx.vmap``, whose draws are its own.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

KEY_BLOCK = 256  # keys derived per block (one vmapped fold_in: its cost does not grow with it)


@dataclass(frozen=True)
class _Draw:
    placeholder: jax.Array  # what the model holds until the draw is made
    key: jax.Array
    shape: tuple[int, ...]
    dtype: np.dtype
    stddev: float


# The deferred draws of the model :func:`build` is constructing (None: draw at once).
_PENDING: contextvars.ContextVar[list[_Draw] | None] = contextvars.ContextVar(
    "jaxformer_pending_draws", default=None)


def normal(stddev: float):
    """``nnx.initializers.normal(stddev)``; while :func:`build` constructs a model, a zero
    placeholder of the shape, its draw made later with the others of its shape."""
    draw = nnx.initializers.normal(stddev)

    def init(key, shape, dtype=jnp.float32):
        pending = _PENDING.get()
        if pending is None:
            return draw(key, shape, dtype)
        placeholder = jnp.zeros(shape, dtype)
        pending.append(_Draw(placeholder, key, tuple(shape), np.dtype(dtype), stddev))
        return placeholder

    return init


class _KeyTable(nnx.RngStream):
    """The root RNG stream while :func:`build` constructs a model: draw ``i`` is ``fold_in(root,
    i)``, as nnx's stream makes it, taken from blocks of :data:`KEY_BLOCK` keys derived at once.
    Its count is a concrete number (it is never part of the model), so the index is known while
    tracing; while its key is not the root (``nnx.split_rngs`` swaps it for the duration of a
    vmapped construction) it draws as nnx's stream does. What it forks or splits off is a plain
    ``nnx.RngStream``: the model never holds this class."""

    def __init__(self, key: jax.Array, *, tag: str):
        super().__init__(key, tag=tag)
        zero: Any = np.zeros((), np.uint32)  # concrete, where nnx's is a traced array
        self.count.set_value(zero)
        self._root = self.key[...]
        self._blocks: list[jax.Array] = []
        self._handed: dict[int, tuple[int, jax.Array]] = {}  # id(key) -> (its count, the key)

    def __call__(self) -> jax.Array:
        count = self.count[...]
        if self.key[...] is not self._root or not isinstance(count, np.ndarray):
            return super().__call__()
        i = int(count)
        while len(self._blocks) * KEY_BLOCK <= i:
            self._blocks.append(_key_block(self._root, len(self._blocks) * KEY_BLOCK))
        self.count.set_value(count + np.uint32(1))
        key = self._blocks[i // KEY_BLOCK][i % KEY_BLOCK]
        self._handed[id(key)] = (i, key)
        return key

    def stacked(self, keys: list[jax.Array]) -> jax.Array:
        """``jnp.stack(keys)``; keys this stream handed out are taken from its blocks at once
        (one gather, where stacking makes XLA a kernel per key)."""
        counts = [self._handed.get(id(k), (None,))[0] for k in keys]
        if None in counts:
            return jnp.stack(keys)
        table = self._blocks[0] if len(self._blocks) == 1 else jnp.concatenate(self._blocks)
        return table[np.array(counts)]

    def fork(self, *, split=None) -> nnx.RngStream:
        return _plain(super().fork(split=split))

    def split(self, k) -> nnx.RngStream:
        return _plain(super().split(k))

    def broadcast(self, k) -> nnx.RngStream:
        return _plain(super().broadcast(k))


def _key_block(root: jax.Array, first: int) -> jax.Array:
    """``fold_in(root, n)`` for the :data:`KEY_BLOCK` counts from ``first``, derived at once."""
    counts = jnp.arange(first, first + KEY_BLOCK, dtype=jnp.uint32)
    return jax.vmap(lambda n: jax.random.fold_in(root, n))(counts)


def _plain(stream: nnx.RngStream) -> nnx.RngStream:
    """A new stream (count zero) of ``stream``'s key and tag, of nnx's own class."""
    return nnx.RngStream(stream.key[...], tag=stream.tag)


def build(construct: Callable[[nnx.Rngs], nnx.Module], key: jax.Array, *, grouped: bool = True):
    """``nnx.split(construct(nnx.Rngs(key)))``, traced inside a jitted initialiser; with
    ``grouped``, built as the module docstring says (the same parameters and keys)."""
    if not grouped:
        return nnx.split(construct(nnx.Rngs(key)))
    rngs = nnx.Rngs(key)
    setattr(rngs, "default", _KeyTable(key, tag="default"))  # noqa: B010 (nnx.Rngs sets its
    # streams so; mypy does not know the attribute)
    pending: list[_Draw] = []
    token = _PENDING.set(pending)
    try:
        graphdef, state = nnx.split(construct(rngs))
    finally:
        _PENDING.reset(token)
    return graphdef, _drawn(state, pending, rngs.default)


def _one_draw(draw, shape, dtype, key):
    return draw(key, shape, dtype)


def _drawn(state, pending: list[_Draw], stream: _KeyTable):
    """``state`` with each placeholder replaced by its draw, the draws of one shape, dtype and
    deviation made by one loop."""
    groups: dict[tuple, list[_Draw]] = {}
    for d in pending:
        groups.setdefault((d.shape, d.dtype, d.stddev), []).append(d)
    values = {}
    for (shape, dtype, stddev), draws in groups.items():
        draw = nnx.initializers.normal(stddev)
        if len(draws) == 1:
            values[id(draws[0].placeholder)] = draw(draws[0].key, shape, dtype)
            continue
        made = jax.lax.map(functools.partial(_one_draw, draw, shape, dtype),
                           stream.stacked([d.key for d in draws]))
        values.update((id(d.placeholder), made[i]) for i, d in enumerate(draws))
    found = set()

    def place(x):
        if id(x) in values:
            found.add(id(x))
            return values[id(x)]
        return x

    state = jax.tree.map(place, state)
    if len(found) != len(values):
        raise RuntimeError(f"{len(values) - len(found)} of the model's {len(values)} deferred "
                           f"normal draws are not in its state as drawn: a module changed its "
                           f"initial value while it was built")
    return state
