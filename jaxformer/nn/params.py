"""Parameter factories: every weight of every family is created here, with the initialiser the
torch twin uses (N(0, initializer_range) kernels and embeddings, zero biases, unit LayerNorm
scales), the compute ``dtype`` and the storage ``param_dtype`` of the config, and its logical axis
names. Twin: ``torch_ref/nn/params.py``.
"""

from __future__ import annotations

import functools
import math
import weakref

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import runtime
from jaxformer.nn import initializer
from jaxformer.sharding import constrain


def _names(names: tuple) -> dict:
    """Variable metadata holding logical axis names.

    Each weight gets its names at creation (``names``: one per axis, e.g. ``("embed", "mlp")`` for
    a kernel ``(hidden, intermediate)``), stored as flax's ``out_sharding`` metadata.
    ``jaxformer.sharding`` maps them to mesh axes through one rule table when a model is placed on
    a mesh; without a mesh they change nothing. ``eager_sharding`` is off so that a model can be
    built with no mesh at all: placement is a separate, explicit step.
    """
    return {"out_sharding": tuple(names), "eager_sharding": False}


@jax.custom_vjp
def _matmul_cpu(x, kernel):
    """``x @ kernel`` (``(..., I) @ (I, O)``) whose kernel gradient ``X^T dY`` is computed, when
    the layer widens (``I <= O``), with ``X^T`` copied first: XLA:CPU runs that product,
    contracting over the rows of both operands, on a slow generic kernel, the copied layout on
    its fast one (docs/performance.md). The same products and sums; only the memory layout of
    one operand changes."""
    return x @ kernel


def _matmul_cpu_fwd(x, kernel):
    return x @ kernel, (x, kernel)


def _matmul_cpu_bwd(saved, dy):
    x, kernel = saved
    rows, d_rows = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    if rows.shape[1] <= d_rows.shape[1]:  # I <= O: X^T copied first (the barrier keeps XLA
        d_kernel = jax.lax.optimization_barrier(rows.T) @ d_rows  # from folding it back)
    else:  # I > O: XLA's own product was as fast as any copy (measured, docs/performance.md)
        d_kernel = jax.lax.dot_general(rows, d_rows, (((0,), (0,)), ((), ())))
    return (dy @ kernel.T).astype(x.dtype), d_kernel.astype(kernel.dtype)


_matmul_cpu.defvjp(_matmul_cpu_fwd, _matmul_cpu_bwd)


class _Linear(nnx.Linear):
    """``nnx.Linear`` (the same parameters, paths and forward) whose weight gradient takes
    XLA:CPU's fast matmul layout when ``runtime.cpu_weight_gradients()`` says so at trace
    time: on the CPU backend, without a device mesh. A layer given an ``(out, in)`` copy of
    its kernel (``vector_kernels``, ``use_vector_kernels``) multiplies by that copy instead."""

    _vector_kernel: jax.Array | None = None  # set by use_vector_kernels

    def vector_copies(self, widening: bool = False) -> dict[str, jax.Array]:
        """A narrowing layer's (more inputs than outputs: the second feed-forward matrix) kernel
        copied as ``(out, in)`` (``vector_kernels``), every layer's with ``widening`` (for a few
        rows: there XLA:CPU's product by the stored layout is slower for any shape); 2-D kernels
        only, a scanned stack's are left as they are."""
        kernel = self.kernel[...]
        if kernel.ndim == 2 and (widening or kernel.shape[0] > kernel.shape[1]):
            return {"_vector_kernel": kernel.T}
        return {}

    def __call__(self, inputs, out_sharding=None):
        explicit = (out_sharding is not None or self.preferred_element_type is not None
                    or self.precision is not None)
        copied = self._vector_kernel is not None
        if explicit or not (copied or runtime.cpu_weight_gradients()):
            return super().__call__(inputs, out_sharding=out_sharding)
        kernel = self._vector_kernel if copied else self.kernel[...]
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
        if copied:
            return vector_product(inputs, kernel, bias)
        y = _matmul_cpu(inputs, kernel)
        if bias is not None:
            y += jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
        return y


def vector_product(x, kernel, bias=None):
    """``x @ kernel.T + bias`` for an ``(out, in)`` kernel copy (``vector_kernels``), the copy
    read as it lies: one row as ``kernel . x``, a few as ``(kernel . x^T)^T``, the product's
    transpose kept apart (a barrier: XLA would fold it back into the slower layout)."""
    rows = math.prod(x.shape[:-1])
    if rows == 1:
        y = jnp.dot(kernel, x.reshape(-1))
    else:
        y = jax.lax.optimization_barrier(jnp.einsum("oi,ni->on", kernel, x.reshape(rows, -1))).T
    y = y.reshape(x.shape[:-1] + kernel.shape[:1])
    return y + bias if bias is not None else y


def vector_kernels(model: nnx.Module, *,
                   widening: bool = False) -> dict[str, dict[str, jax.Array | None]]:
    """Copies of weights for products of one row or a few (decoding on the CPU,
    ``runtime.cpu_vector_kernels``), ``{module path: {attribute: copy}}``: every module of
    ``model`` with a ``vector_copies`` method makes its own, a narrowing linear layer its kernel as
    ``(out, in)`` (``_Linear.vector_copies``; with ``widening``, every linear layer), self-attention
    its query, key and value kernels as one ``(3C, C)`` matrix
    (``attention.MultiHeadAttention.vector_copies``). XLA:CPU streams those products faster
    (docs/performance.md). The same products, once :func:`use_vector_kernels` hands the copies to
    the modules. A module that lists children in ``_no_vector_steps`` (an encoder run once per
    call; the query, key and value layers that the joined copy replaces; a cross-attention's key
    and value layers, its context's keys and values being cached) leaves their modules without
    copies."""
    graph = list(nnx.iter_graph(model))
    skipped = [path + (name,) for path, module in graph
               for name in getattr(module, "_no_vector_steps", ())]
    copies = {}
    for path, module in graph:
        make = getattr(module, "vector_copies", None)
        if (callable(make) and not any(path[:len(p)] == p for p in skipped)
                and (made := make(widening))):
            copies["/".join(map(str, path))] = made
    return copies


def use_vector_kernels(model: nnx.Module, copies: dict[str, dict[str, jax.Array | None]]) -> None:
    """Give each module of ``model`` (merged inside a traced function: generation does it after
    its prefill) the copies :func:`vector_kernels` made for it; its calls multiply by them."""
    for path, module in nnx.iter_graph(model):
        for name, value in copies.get("/".join(map(str, path)), {}).items():
            setattr(module, name, value)


def use_vector_head(model: nnx.Module) -> None:
    """Let each tied LM head of ``model`` (merged inside a traced generation program) take up to
    ``runtime.VECTOR_ROWS`` query vectors as ``(table . query^T)^T`` (``Embed.attend``):
    XLA:CPU's product of a few rows by the table as stored streams it at about half the speed of
    the table as it lies (docs/performance.md). Generation only: training and scoring keep the
    plain product, whatever their batch."""
    for _, module in nnx.iter_graph(model):
        if isinstance(module, Embed):
            module._vector_rows = runtime.VECTOR_ROWS


@functools.partial(jax.jit, static_argnames=("graphdef", "widening"))
def _make_vector_kernels(graphdef, state, widening):
    return vector_kernels(nnx.merge(graphdef, state), widening=widening)


# model -> (weak references to the state's arrays the copies were made from, the copies,
# whether they include the widening layers')
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def kept_vector_kernels(model: nnx.Module, graphdef, state, *, make: bool = True,
                        widening: bool = False) -> dict[str, dict[str, jax.Array | None]]:
    """:func:`vector_kernels` of ``model`` (split as ``graphdef, state``), made once and kept with
    the model for as long as it lives, until its state holds other arrays (new weights: trained,
    loaded or replaced, which makes new arrays), when they are made again; asked for
    ``widening`` ones, copies kept without them are made again with them (and serve later calls
    of one row too). GPT-2 small's: 198 MB, 340 MB with the widening layers'. Decoding takes its
    copies here, so only the ``generate`` call that makes them pays for them. ``make=False``: the
    kept copies if they are current, else ``{}`` (nothing is made)."""
    leaves = jax.tree.leaves(state)
    kept = _KEPT.get(model)
    if kept is not None and len(kept[0]) == len(leaves) and all(
            ref() is leaf for ref, leaf in zip(kept[0], leaves)) and (
            kept[2] or not widening or not make):  # current, and wide enough or not to be made
        return kept[1]
    if not make:
        return {}
    copies = _make_vector_kernels(graphdef, state, widening)
    _KEPT[model] = ([weakref.ref(leaf) for leaf in leaves], copies, widening)
    return copies


def linear(in_features: int, out_features: int, config, *, names: tuple[str, str],
           rngs: nnx.Rngs, use_bias: bool = True) -> nnx.Linear:
    """``names`` = the kernel's ``(input axis, output axis)``; the bias takes the output's.
    An ``nnx.Linear`` (see ``_Linear`` for its gradient on CPU)."""
    if len(names) != 2:
        raise ValueError(f"a linear kernel has 2 axes, got names {names!r}")
    return _Linear(in_features, out_features, use_bias=use_bias, dtype=jnp.dtype(config.dtype),
                      param_dtype=jnp.dtype(config.param_dtype),
                      kernel_init=initializer.normal(config.initializer_range),
                      kernel_metadata=_names(names), bias_metadata=_names(names[1:]), rngs=rngs)


class Embed(nnx.Embed):
    """``nnx.Embed`` whose out-of-range ids give NaN rows instead of plausible ones.

    Under ``jit`` ids are tracers and cannot be checked. ``jnp.take`` would wrap a negative id to
    a row counted from the end (-1 reads the last row, a valid-looking vector); here every id
    outside ``[0, num_embeddings)``, negative included, reads as a row of NaN, which spreads to
    everything that depends on it. Outside ``jit`` the models refuse such ids before computing
    (``jaxformer.validate``), as torch's ``nn.Embedding`` does;
    :func:`jaxformer.nn.jit.jitted` with ``checked=True`` turns the NaN into an error inside
    ``jit``. Off the CPU, the gradient of a table of a few rows is a masked sum per row instead of
    a scatter-add (``jaxformer.runtime.select_small_tables``).
    """

    def __call__(self, inputs):
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise TypeError(f"embedding ids must be integers, got dtype {inputs.dtype}")
        (table,) = self.promote_dtype((self.embedding[...],), dtype=self.dtype, inexact=False)
        ids = jnp.where(inputs < 0, self.num_embeddings, inputs)  # negatives -> out of range
        # Under a mesh, FSDP gathers the table's feature shards before the lookup (XLA cannot
        # turn a lookup split by features into one split by examples without a full copy).
        rows = (self.embedding.get_metadata().get("out_sharding") or (None,))[0]
        table = constrain(table, (rows, None))
        if self.num_embeddings <= runtime.SMALL_TABLE_ROWS and runtime.select_small_tables():
            out = _small_table_take(self.num_embeddings, table, ids)
        else:
            out = _take(table, ids)
        return constrain(out, ("batch",) + (None,) * (ids.ndim - 1) + ("hidden",))

    _vector_rows: int = 1  # set by use_vector_head

    def attend(self, query, out_sharding=None):
        """The tied LM head, ``(..., features) -> (..., num_embeddings)``: ``query . table^T``.
        On the CPU (``runtime.cpu_vector_head``) a single query vector (batch-1 decoding) is
        ``table . query`` instead, the table read as it lies: the same products and sums. Inside
        generation (:func:`use_vector_head`) a few query vectors, up to
        ``runtime.VECTOR_ROWS`` (a step's rows and beams), are ``(table . query^T)^T``, the
        product's transpose kept apart (a barrier: XLA would fold it back into the slower
        layout); float32 rounding apart, the same logits. An explicit ``out_sharding`` keeps the
        plain product, which takes it."""
        query, table = self.promote_dtype((query, self.embedding[...]), dtype=self.dtype)
        if (out_sharding is None and math.prod(query.shape[:-1]) <= self._vector_rows
                and runtime.cpu_vector_head()):
            return vector_product(query, table)  # the (vocab, hidden) table is an (out, in) kernel
        return jnp.dot(query, table.T, out_sharding=out_sharding)


def _take(table, ids):
    return jnp.take(table, ids, axis=0, mode="fill", fill_value=jnp.nan)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _small_table_take(rows: int, table, ids):
    """``_take`` of a table of ``rows`` rows, whose gradient is one masked sum per row instead
    of a scatter-add (see ``jaxformer.runtime.select_small_tables``), accumulated in float32."""
    return _take(table, ids)


def _small_table_take_fwd(rows, table, ids):
    return _take(table, ids), ids


def _small_table_take_bwd(rows, ids, g):
    axes = tuple(range(ids.ndim))
    sums = [jnp.where((ids == k)[..., None], g, 0).sum(axes, dtype=jnp.float32)
            for k in range(rows)]
    return jnp.stack(sums).astype(g.dtype), None


_small_table_take.defvjp(_small_table_take_fwd, _small_table_take_bwd)


def embedding(num_embeddings: int, config, *, names: tuple[str, str],
              rngs: nnx.Rngs) -> Embed:
    """``names`` = the table's ``(rows, features)``: ``("vocab", "embed")`` for tokens."""
    if len(names) != 2:
        raise ValueError(f"an embedding table has 2 axes, got names {names!r}")
    return Embed(num_embeddings, config.hidden_size, dtype=jnp.dtype(config.dtype),
                 param_dtype=jnp.dtype(config.param_dtype),
                 embedding_init=initializer.normal(config.initializer_range),
                 embedding_metadata=_names(names), rngs=rngs)


def layer_norm(config, *, rngs: nnx.Rngs) -> nnx.LayerNorm:
    """Scale and bias named ``("norm",)``: vectors of the width, kept whole on every device."""
    # Two-pass variance, as torch computes it; flax's default E[x^2] - E[x]^2 drifts from it.
    return nnx.LayerNorm(config.hidden_size, epsilon=config.layer_norm_eps,
                         use_fast_variance=False, dtype=jnp.dtype(config.dtype),
                         param_dtype=jnp.dtype(config.param_dtype),
                         scale_metadata=_names(("norm",)), bias_metadata=_names(("norm",)),
                         rngs=rngs)
