"""The partitioning rules: logical axis names -> mesh axes, and the constraint the models apply.

The one table :data:`RULES` maps the logical names that ``jaxformer.nn.params`` gives every weight
and activation axis to the mesh axes ``("data", "fsdp", "tensor")``; :func:`logical_spec` turns
names and a shape into a ``PartitionSpec``. ``nn`` and ``models`` import :func:`constrain` from
here (through ``jaxformer.sharding``); the mesh itself and placement live in ``sharding.mesh``.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
from jax.sharding import PartitionSpec

# The mesh has three axes, always in this order:
# - data: data parallelism. Each slice of the batch on its own group of devices, the weights whole
#   on every one; the gradients are averaged across the groups.
# - fsdp: fully sharded data parallelism (ZeRO-3). The batch is split here too, and so are the
#   weights and the optimizer state (along their "embed" axis); each layer's weights are gathered
#   just before use.
# - tensor: Megatron-style tensor parallelism. The attention heads, the feed-forward's
#   intermediate units and the vocabulary are split: query/key/value and fc1 are column-parallel
#   (their output axis split), the attention output projection and fc2 row-parallel (their input
#   axis split), so each sub-layer needs one all-reduce.
# XLA's SPMD partitioner inserts the collectives: the model code is the same with or without a
# mesh, and numerically the same up to the order of float32 sums. A dimension that the mesh axes
# of its rule do not divide (a vocabulary of 101 over tensor=2) is kept whole on every device for
# that weight: correct, only less memory saved.
MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> the mesh axes that split it (None: never split). The one table.
RULES: dict[str, tuple[str, ...] | None] = {
    # Weights.
    "embed": ("fsdp",),  # the model width of every weight: FSDP's split
    "heads": ("tensor",),  # attention heads (query/key/value outputs, output projection input)
    "mlp": ("tensor",),  # feed-forward intermediate units (fc1 output, fc2 input)
    "vocab": ("tensor",),  # vocabulary rows of the token embedding, LM-head columns, logits
    "positions": None,  # position-table rows: small, read by every token
    "types": None,  # token-type rows (BERT)
    "classes": None,  # classifier outputs
    "norm": None,  # LayerNorm scales and biases: vectors, whole on every device
    "layers": None,  # the leading axis of scanned (stacked) layers
    # Activations.
    "batch": ("data", "fsdp"),  # examples: data parallelism and FSDP both split the batch
    "seq": None,
    "hidden": None,  # the residual stream's features: whole, weights are gathered instead
    "kv": None,  # head size
}


def logical_spec(names, shape, mesh_shape: Mapping[str, int]) -> PartitionSpec:
    """The ``PartitionSpec`` of an array of ``shape`` whose axes have logical ``names``.

    Mesh axes of size 1 are left out; a mesh axis is used once per array; a dimension keeps the
    longest prefix of its rule's mesh axes whose product divides it (none: kept whole)."""
    if len(names) != len(shape):
        raise ValueError(f"{len(names)} logical names {tuple(names)} for an array of "
                         f"{len(shape)} axes {tuple(shape)}")
    used: set[str] = set()
    spec = []
    for name, size in zip(names, shape):
        if name is not None and name not in RULES:
            raise ValueError(f"unknown logical axis {name!r}; the rule table knows "
                             f"{sorted(RULES)}")
        kept, product = [], 1
        for axis in (RULES[name] or ()) if name is not None else ():
            n = mesh_shape.get(axis, 1)
            if n == 1 or axis in used:
                continue
            if size % (product * n):
                break
            kept.append(axis)
            product *= n
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def constrain(x, names):
    """``x`` constrained to the sharding its logical ``names`` give under the current mesh
    (``jax.set_mesh``); ``x`` itself when no mesh is set, so models run unchanged without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(names, x.shape, mesh.shape))

