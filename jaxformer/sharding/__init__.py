"""Sharding over a device mesh, and training over several processes (JAX only, no twin).

``rules`` maps logical axis names to the mesh axes ``data``, ``fsdp``, ``tensor`` (and holds the
``constrain`` that ``nn`` and ``models`` import); ``mesh`` builds meshes and places state and
batches; ``distributed`` holds ``jaxformer train``'s multi-process options and joins JAX's
distributed runtime; ``launch`` (``python -m jaxformer.sharding launch``) starts several
``jaxformer train`` processes on one machine. Nothing here imports the training code. The names
below load on first use, so that ``jaxformer train --help`` (which reads ``distributed``'s
options) does not import JAX. Method: ``docs/scale.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxformer.sharding.distributed import initialize_distributed
    from jaxformer.sharding.mesh import (
        MeshError,
        batch_divisor,
        batch_sharding,
        check_batch_size,
        make_mesh,
        parse_mesh,
        place,
        process_rows,
        replicated,
        shard_batch,
        shard_model,
        shardings,
    )
    from jaxformer.sharding.rules import MESH_AXES, RULES, constrain, logical_spec

_WHERE = {"MESH_AXES": "rules", "RULES": "rules", "constrain": "rules", "logical_spec": "rules",
          "initialize_distributed": "distributed",
          **{name: "mesh" for name in (
              "MeshError", "batch_divisor", "batch_sharding", "check_batch_size", "make_mesh",
              "parse_mesh", "place", "process_rows", "replicated", "shard_batch", "shard_model",
              "shardings")}}

__all__ = ["MESH_AXES", "RULES", "MeshError", "batch_divisor", "batch_sharding",
           "check_batch_size", "constrain", "initialize_distributed", "logical_spec", "make_mesh",
           "parse_mesh", "place", "process_rows", "replicated", "shard_batch", "shard_model",
           "shardings"]


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"jaxformer.sharding.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'jaxformer.sharding' has no attribute {name!r}")
