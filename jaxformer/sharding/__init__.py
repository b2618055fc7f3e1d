"""Sharding over a device mesh, and training over several processes (JAX only, no twin).

The mesh has three axes, always in this order:

- ``data``: data parallelism. Each slice of the batch on its own group of devices, the weights
  whole on every one; the gradients are averaged across the groups.
- ``fsdp``: fully sharded data parallelism (ZeRO-3). The batch is split here too, and so are the
  weights and the optimizer state (along their ``embed`` axis); each layer's weights are gathered
  just before use.
- ``tensor``: Megatron-style tensor parallelism. The attention heads, the feed-forward's
  intermediate units and the vocabulary are split: query/key/value and ``fc1`` are
  column-parallel (their output axis split), the attention output projection and ``fc2``
  row-parallel (their input axis split), so each sub-layer needs one all-reduce.

Every weight carries logical axis names from the factory that creates it
(``jaxformer.nn.params``); :data:`RULES`, the one table below, maps them to mesh axes. XLA's SPMD
partitioner inserts the collectives: the model code is the same with or without a mesh, and
numerically the same up to the order of float32 sums. A dimension that the mesh axes of its rule
do not divide (a vocabulary of 101 over ``tensor=2``) is kept whole on every device for that
weight: correct, only less memory saved.

Several processes (one per host, or several on one host for a test) join through JAX's own
distributed runtime (:func:`initialize_distributed`): every process runs the same program over the
global mesh and feeds its own rows of each batch (:func:`shard_batch`). ``python -m
jaxformer.sharding launch`` starts such a run on this machine; on a cluster, one ``python -m
jaxformer.sharding train`` per host (``docs/scale.md``).

The package: ``rules`` (the table, :func:`logical_spec`, :func:`constrain`: what ``nn`` and
``models`` import), ``mesh`` (mesh construction, placement, the distributed runtime) and ``demo``
(the demo trainer and launcher behind ``python -m jaxformer.sharding``; it imports
``training.step``, so this package never imports it).
"""

from jaxformer.sharding.mesh import (
    MeshError,
    batch_divisor,
    batch_sharding,
    check_batch_size,
    initialize_distributed,
    make_mesh,
    parse_mesh,
    place,
    replicated,
    shard_batch,
    shard_model,
    shardings,
)
from jaxformer.sharding.rules import MESH_AXES, RULES, constrain, logical_spec

__all__ = ["MESH_AXES", "RULES", "MeshError", "batch_divisor", "batch_sharding",
           "check_batch_size", "constrain", "initialize_distributed", "logical_spec", "make_mesh",
           "parse_mesh", "place", "replicated", "shard_batch", "shard_model", "shardings"]
