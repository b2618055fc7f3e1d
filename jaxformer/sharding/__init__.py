"""Sharding over a device mesh, and training over several processes (JAX only, no twin).

``rules`` maps logical axis names to the mesh axes ``data``, ``fsdp``, ``tensor`` (and holds the
``constrain`` that ``nn`` and ``models`` import); ``mesh`` builds meshes, places state and batches
and joins JAX's distributed runtime. ``demo`` (``python -m jaxformer.sharding train|launch``)
imports ``training.step``, so this package never imports it. Method: ``docs/scale.md``.
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
