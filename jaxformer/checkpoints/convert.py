"""Weights between a ``torch_ref`` ``state_dict`` and a jaxformer NNX model (numpy in, numpy out).

The dotted NNX path equals the torch key up to the leaf, so four rules (``LEAF_RULES``) do it all;
key sets, shapes and values are checked exactly and nothing is loaded partially (see
`docs/design.md`, "The mirror"). ``nnx_to_torch`` returns writable arrays, as
``torch.from_numpy`` needs.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.checkpoints.checks import (
    NON_FINITE,
    NON_FLOATING,
    VALUE_HINT,
    weight_problems,
)
from jaxformer.nn.stack import LayerStack

LEAF_RULES = {  # NNX leaf -> (torch leaf, transpose?)
    "kernel": ("weight", True),
    "scale": ("weight", False),
    "embedding": ("weight", False),
    "bias": ("bias", False),
}


class StateDictMismatchError(ValueError):
    """The state_dict does not fit the model: lists missing, unexpected and mis-shaped keys."""


# A scanned layer stack (``scan_layers=True``, `jaxformer/nn/stack.py`) holds each weight once
# for all layers, stacked on a leading axis at ``<stack>.stacked.<rest>``; it maps to the
# per-layer torch keys ``<stack>.{i}.<rest>`` (layer i is slice i), so the state dict, its checks
# and its errors are the same in both modes. Every problem (missing, unexpected, mis-shaped,
# non-floating, non-finite key) is collected and raised at once: an integer tensor is not a weight,
# and a NaN weight would poison every output without a word.
def _per_layer(path: tuple, stacks: dict[tuple, int]) -> list[tuple[tuple, int | None]]:
    """A parameter's torch-side paths: ``[(path, None)]``, or one ``(path, layer)`` per layer
    when it lies in a scanned stack (``<stack>.stacked.<rest>`` -> ``<stack>.{i}.<rest>``)."""
    for n in range(len(path)):
        if path[:n] in stacks and path[n] == "stacked":
            return [((*path[:n], i, *path[n + 1:]), i) for i in range(stacks[path[:n]])]
    return [(path, None)]


def _torch_layout(model: nnx.Module) -> dict[str, tuple[nnx.Variable, bool, int | None]]:
    """torch key -> (the NNX parameter it maps to, whether it is transposed, the layer it is a
    slice of in a scanned stack or None)."""
    stacks = {tuple(path): len(node) for path, node in nnx.iter_graph(model)
              if isinstance(node, LayerStack) and node.scan_layers}
    layout = {}
    for stacked_path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        for path, layer in _per_layer(tuple(stacked_path), stacks):
            leaf = str(path[-1])
            if leaf not in LEAF_RULES:
                raise ValueError(f"parameter {'.'.join(map(str, path))} has leaf {leaf!r}, which "
                                 f"has no torch counterpart (known: {sorted(LEAF_RULES)})")
            torch_leaf, transpose = LEAF_RULES[leaf]
            layout[".".join([*map(str, path[:-1]), torch_leaf])] = (variable, transpose, layer)
    return layout


def torch_shapes(model: nnx.Module) -> dict[str, tuple[int, ...]]:
    """torch key -> shape, as the torch twin's ``state_dict`` would have them."""
    return {key: tuple(variable.get_value().shape)[layer is not None:][::-1 if transpose else 1]
            for key, (variable, transpose, layer) in _torch_layout(model).items()}


def abstract_model(build: Callable[[], nnx.Module]) -> nnx.Module:
    """``build()``'s model with abstract parameters (shape and dtype only), to be loaded.

    ``build`` runs under ``jax.jit`` with only the non-parameter state (dropout RNG keys and
    counts) as output, so XLA drops the random initialisation that loading will overwrite.
    Eagerly, each new parameter shape would compile its own initialiser, about a second each on
    a CPU. The RNG state is exactly that of an ordinary construction. A parameter left unloaded
    stays abstract and fails loudly at the first forward pass.
    """
    skeleton = {}

    def make():
        graphdef, params, rest = nnx.split(build(), nnx.Param, ...)
        skeleton["graphdef"] = graphdef
        skeleton["params"] = [  # plain data: the Variables themselves belong to this trace
            (path, type(v), v.get_metadata(),
             jax.ShapeDtypeStruct(v.get_value().shape, v.get_value().dtype))
            for path, v in nnx.to_flat_state(params)]
        return rest

    rest = jax.jit(make)()
    params = nnx.from_flat_state([(path, kind(value, **metadata))
                                  for path, kind, metadata, value in skeleton["params"]])
    return nnx.merge(skeleton["graphdef"], params, rest)


def _to_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    return np.asarray(value)


def nnx_to_torch(model: nnx.Module) -> dict[str, np.ndarray]:
    """The model's parameters as a torch-keyed ``state_dict`` of numpy arrays: C-contiguous,
    writable copies (``np.asarray`` of a JAX array is a read-only view, which
    ``torch.from_numpy`` would take with a warning and the model then share)."""
    out = {}
    for key, (variable, transpose, layer) in _torch_layout(model).items():
        value = np.asarray(variable.get_value())
        value = value if layer is None else value[layer]
        out[key] = np.array(value.T if transpose else value, order="C", copy=True)
    return out


def torch_to_nnx(state_dict, model: nnx.Module) -> nnx.Module:
    """Load a torch ``state_dict`` (tensors or arrays) into ``model`` in place; returns ``model``.

    ``model`` may be concrete or from :func:`abstract_model` (the fast way to build one only to
    load it)."""
    layout = _torch_layout(model)
    given = {key: _to_numpy(value) for key, value in state_dict.items()}
    missing = sorted(layout.keys() - given.keys())
    unexpected = sorted(given.keys() - layout.keys())
    misshaped, non_floating, non_finite = [], [], []
    shapes = torch_shapes(model)
    for key in sorted(layout.keys() & given.keys()):
        want = shapes[key]
        if tuple(given[key].shape) != want:
            misshaped.append(f"{key}: got {tuple(given[key].shape)}, expected {want}")
            continue
        dtype_problem, finite_problem = weight_problems(key, given[key])
        if dtype_problem:
            non_floating.append(dtype_problem)
        if finite_problem:
            non_finite.append(finite_problem)
    problems = (("missing keys", missing), ("unexpected keys", unexpected),
                ("mis-shaped keys", misshaped),
                (NON_FLOATING, non_floating), (NON_FINITE, non_finite))
    if any(items for _, items in problems):
        lines = [f"state_dict does not match {type(model).__name__}; nothing was loaded."]
        lines += [f"  {title} ({len(items)}): " + ", ".join(items) for title, items in problems
                  if items]
        if non_floating or non_finite:
            lines.append(VALUE_HINT)
        raise StateDictMismatchError("\n".join(lines))
    values = {}  # id(variable) -> (variable, its new value as numpy)
    for key, (variable, transpose, layer) in layout.items():
        value = given[key].T if transpose else given[key]
        current = variable.get_value()
        if layer is None:
            values[id(variable)] = (variable, value)
            continue
        if id(variable) not in values:
            values[id(variable)] = (variable, np.empty(current.shape, current.dtype))
        values[id(variable)][1][layer] = value
    for variable, value in values.values():
        # Copy into a JAX array: ``tensor.numpy()`` shares the tensor's memory, so a numpy view
        # kept here would silently follow later in-place updates of the torch model.
        variable.set_value(jnp.asarray(np.array(value, dtype=variable.get_value().dtype)))
    return model
