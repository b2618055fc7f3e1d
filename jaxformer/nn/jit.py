"""Compiling a model call: split once, jit a pure function, carry the state (:class:`Jitted`,
:func:`jitted`). ``nnx.jit`` walks the module graph in Python on every call; this is the fast
idiom, used by the parity job, embeddings, sampling and the benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax.experimental import checkify

from jaxformer import runtime


class Jitted:
    """``Jitted(model)(*args)`` equals ``model(*args)``, compiled once per input shape.

    ``method`` names another method to call (``"hidden_states"``, ``"encode"``...); ``fn`` takes
    ``(model, *args)`` and returns any pytree, for a computation around the model (pooling, a
    loss). Parameters go in and are not returned (returning them would make XLA write a copy of
    every weight on every call); the rest of the state (RNG counters in train mode) is returned
    and kept in ``self.rest``. :meth:`sync` writes it back into the module.

    Why the state is returned: in train mode the dropout RNG counters live in the state, and a
    pure function that does not return them is fed the same counters on every call, so every call
    would draw the *same* dropout mask. Keeping the returned state makes each call draw fresh
    masks, exactly as eager calls of the module would.

    ``checked=True`` runs the call under ``jax.experimental.checkify`` with index checks: a token,
    segment or position id outside its table (which the models turn into NaN rows under ``jit``,
    see ``jaxformer.nn.params.Embed``) then raises ``checkify.JaxRuntimeError`` naming the lookup,
    inside the compiled program.
    """

    def __init__(self, model: nnx.Module, method: str | None = None, *,
                 fn: Callable[..., Any] | None = None, checked: bool = False):
        if method is not None and fn is not None:
            raise ValueError("give method or fn, not both")
        self.model = model
        runtime.tune_allocator()  # CPU backend: keep XLA's freed scratch memory (glibc)
        # Two filters give exactly (graphdef, params, rest); flax types the tail as variadic.
        graphdef, params, *others = nnx.split(model, nnx.Param, ...)
        (rest,) = others
        self.graphdef, self.params, self.rest = graphdef, params, rest

        def pure(params, rest, *args, **kwargs):
            module = nnx.merge(graphdef, params, rest)
            if fn is not None:
                out = fn(module, *args, **kwargs)
            else:
                out = (module if method is None else getattr(module, method))(*args, **kwargs)
            return out, nnx.split(module, nnx.Param, ...)[2]

        if checked:
            pure = checkify.checkify(pure, errors=checkify.index_checks | checkify.nan_checks)
        self.checked = checked
        self._apply = jax.jit(pure)

    def __call__(self, *args, **kwargs):
        if self.checked:
            error, (out, rest) = self._apply(self.params, self.rest, *args, **kwargs)
            error.throw()
        else:
            out, rest = self._apply(self.params, self.rest, *args, **kwargs)
        self.rest = rest
        return out

    def lower(self, *args, **kwargs):
        """``jax.jit(...).lower`` for these arguments: ``.compile()`` it for the compile time or
        XLA's cost analysis."""
        return self._apply.lower(self.params, self.rest, *args, **kwargs)

    def sync(self) -> nnx.Module:
        """Write the carried state (RNG counters) back into the module and return it."""
        nnx.update(self.model, self.rest)
        return self.model


def jitted(model: nnx.Module, method: str | None = None, *, fn=None,
           checked: bool = False) -> Jitted:
    """Shorthand for :class:`Jitted`."""
    return Jitted(model, method, fn=fn, checked=checked)
