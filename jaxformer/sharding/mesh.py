"""Meshes and placement: building the ``("data", "fsdp", "tensor")`` mesh, placing model and
optimizer state and host batches on it (joining JAX's distributed runtime is
``sharding.distributed``'s).

Part of the library (``training.step`` and ``training.loop`` use it through
``jaxformer.sharding``); the logical-axis rules it applies are in ``sharding.rules``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxformer.sharding.rules import MESH_AXES, RULES, logical_spec


class MeshError(ValueError):
    """A mesh that cannot be built: names the bad part of the spec or the device count."""


def parse_mesh(spec: str | Mapping[str, int]) -> dict[str, int]:
    """``"data=2,fsdp=2,tensor=2"`` (or a mapping) -> ``{"data": 2, "fsdp": 2, "tensor": 2}``.

    Axes left out have size 1; one axis may be ``-1`` (the devices left over)."""
    if isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    else:
        items = []
        for part in str(spec).split(","):
            match = re.fullmatch(r"\s*(\w+)\s*=\s*(-?\d+)\s*", part)
            if match is None:
                raise MeshError(f"mesh {spec!r}: cannot read {part!r}; write AXIS=SIZE pairs "
                                f"separated by commas, e.g. data=2,fsdp=2,tensor=2")
            items.append((match[1], int(match[2])))
    sizes = dict.fromkeys(MESH_AXES, 1)
    seen = set()
    for axis, size in items:
        if axis not in MESH_AXES:
            raise MeshError(f"mesh {spec!r}: unknown axis {axis!r}; the axes are {MESH_AXES}")
        if axis in seen:
            raise MeshError(f"mesh {spec!r}: axis {axis!r} is given twice")
        if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
            raise MeshError(f"mesh {spec!r}: axis {axis!r} has size {size!r}; sizes are "
                            f"positive integers (or -1 for the devices left over)")
        seen.add(axis)
        sizes[axis] = size
    if list(sizes.values()).count(-1) > 1:
        raise MeshError(f"mesh {spec!r}: only one axis may be -1")
    return sizes


def make_mesh(spec: str | Mapping[str, int], devices=None) -> jax.sharding.Mesh:
    """A ``("data", "fsdp", "tensor")`` mesh over ``devices`` (default: all, every process's).
    The product of the sizes must equal the number of devices."""
    sizes = parse_mesh(spec)
    devices = list(jax.devices() if devices is None else devices)
    if -1 in sizes.values():
        known = math.prod(s for s in sizes.values() if s != -1)
        if len(devices) % known:
            raise MeshError(f"mesh {spec!r}: the other axes' product {known} does not divide "
                            f"the {len(devices)} devices")
        sizes = {a: len(devices) // known if s == -1 else s for a, s in sizes.items()}
    product = math.prod(sizes.values())
    if product != len(devices):
        shape = ",".join(f"{a}={s}" for a, s in sizes.items())
        raise MeshError(f"mesh {shape} needs {product} devices (the product of its sizes), but "
                        f"{len(devices)} are available ({devices[0].platform})")
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return jax.make_mesh(tuple(sizes.values()), MESH_AXES, axis_types=auto, devices=devices)


def _is_variable(x) -> bool:
    from flax import nnx

    return isinstance(x, nnx.Variable)


def shardings(tree, mesh: jax.sharding.Mesh):
    """A tree of ``NamedSharding`` for ``tree`` (a model state, an optimizer state or plain
    arrays): a Variable with logical names (``out_sharding`` metadata) by :data:`RULES`,
    everything else replicated. The optimizer state mirrors the parameters' Variables, so its
    moments follow the parameters."""

    def leaf(x):
        if _is_variable(x):
            names = x.get_metadata().get("out_sharding")
            value = x.get_value()
            spec = (logical_spec(names, value.shape, mesh.shape) if names
                    else PartitionSpec())
            return x.replace(NamedSharding(mesh, spec))
        return replicated(mesh)

    return jax.tree.map(leaf, tree, is_leaf=_is_variable)


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Whole on every device of ``mesh``."""
    return NamedSharding(mesh, PartitionSpec())


def _put(x, sharding: NamedSharding):
    if sharding.is_fully_addressable or (isinstance(x, jax.Array)
                                         and not x.is_fully_addressable):
        return jax.device_put(x, sharding, may_alias=False)
    # Another process holds part of the mesh: every process has the same value (the same seed)
    # and supplies the pieces of its own devices.
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        data = _put(jax.random.key_data(x), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place(tree, mesh: jax.sharding.Mesh):
    """``tree`` on ``mesh`` as :func:`shardings` says (new buffers, even where nothing moves)."""
    return jax.tree.map(_put, tree, shardings(tree, mesh))


def shard_model(model, mesh: jax.sharding.Mesh):
    """Place ``model``'s whole state on ``mesh`` in place (for ``generate``, evaluation) and
    return it."""
    from flax import nnx

    nnx.update(model, place(nnx.state(model), mesh))
    return model


def batch_sharding(mesh: jax.sharding.Mesh, shape: tuple[int, ...],
                   batch_axis: int = 0) -> NamedSharding:
    names: list[str | None] = [None] * len(shape)
    names[batch_axis] = "batch"
    return NamedSharding(mesh, logical_spec(names, shape, mesh.shape))


def batch_divisor(mesh: jax.sharding.Mesh) -> int:
    """How many ways the batch is split: ``data * fsdp``."""
    return math.prod(mesh.shape[a] for a in RULES["batch"] or ())


def check_batch_size(micro_batch_size: int, mesh: jax.sharding.Mesh) -> None:
    """Refuse a micro-batch that does not split evenly over ``data x fsdp``."""
    if micro_batch_size % batch_divisor(mesh):
        raise ValueError(f"the micro-batch of {micro_batch_size} examples does not split over "
                         f"data x fsdp = {batch_divisor(mesh)} devices of mesh "
                         f"{','.join(f'{a}={n}' for a, n in mesh.shape.items())}")


def process_rows(mesh: jax.sharding.Mesh, size: int) -> tuple[int, int]:
    """The rows ``(lo, hi)`` of a batch of ``size`` rows that this process's devices hold when
    the batch is split over ``("data", "fsdp")``: what it builds (``data.Dataset(rows=)``). All
    of them when the split stays within the process (or the batch is whole everywhere)."""
    sharding = batch_sharding(mesh, (size,))
    index = [i for i in sharding.addressable_devices_indices_map((size,)).values()
             if i is not None]  # None: a device holding none of the array
    rows = sorted({(s.start or 0, size if s.stop is None else s.stop) for (s,) in index})
    lo, hi = rows[0][0], rows[-1][1]
    if sum(b - a for a, b in rows) != hi - lo:
        raise ValueError(f"this process's rows {rows} of the batch are not one block; order "
                         f"the devices so that each process holds whole rows")
    return lo, hi


def shard_batch(batch: Mapping, mesh: jax.sharding.Mesh, batch_axis: int = 0) -> dict:
    """Host (numpy) arrays -> global arrays split over ``("data", "fsdp")`` along
    ``batch_axis``. ``batch`` is either the whole batch (each process hands over only the rows of
    its own devices) or, a ``training.data.Rows`` (``start``, ``total``), exactly the rows
    :func:`process_rows` gives this process: what a process of a run over several builds."""
    start, total = getattr(batch, "start", None), getattr(batch, "total", None)
    out = {}
    for name, host in batch.items():
        host = np.asarray(host)
        shape = host.shape if total is None else (
            *host.shape[:batch_axis], total, *host.shape[batch_axis + 1:])
        lo, hi = process_rows(mesh, shape[batch_axis])
        if total is None:
            local = np.take(host, np.arange(lo, hi), axis=batch_axis)
        elif (start, start + host.shape[batch_axis]) != (lo, hi):
            raise ValueError(f"batch {name!r} holds rows {start}:{start + host.shape[batch_axis]}"
                             f" of {total}, but this process feeds rows {lo}:{hi}")
        else:
            local = host
        sharding = batch_sharding(mesh, shape, batch_axis)
        out[name] = jax.make_array_from_process_local_data(sharding, local, shape)
    return out
