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
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

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


def batch_sharding(mesh: jax.sharding.Mesh, shape, batch_axis: int = 0) -> NamedSharding:
    names = [None] * len(shape)
    names[batch_axis] = "batch"
    return NamedSharding(mesh, logical_spec(names, shape, mesh.shape))


def batch_divisor(mesh: jax.sharding.Mesh) -> int:
    """How many ways the batch is split: ``data * fsdp``."""
    return math.prod(mesh.shape[a] for a in RULES["batch"])


def check_batch_size(micro_batch_size: int, mesh: jax.sharding.Mesh) -> None:
    """Refuse a micro-batch that does not split evenly over ``data x fsdp``."""
    if micro_batch_size % batch_divisor(mesh):
        raise ValueError(f"the micro-batch of {micro_batch_size} examples does not split over "
                         f"data x fsdp = {batch_divisor(mesh)} devices of mesh "
                         f"{','.join(f'{a}={n}' for a, n in mesh.shape.items())}")


def shard_batch(batch: Mapping, mesh: jax.sharding.Mesh, batch_axis: int = 0) -> dict:
    """Host (numpy) arrays -> global arrays split over ``("data", "fsdp")`` along
    ``batch_axis``. Every process holds the same host batch (``training.data`` builds it from the
    step) and hands over only the rows of its own devices."""
    out = {}
    for name, host in batch.items():
        host = np.asarray(host)
        sharding = batch_sharding(mesh, host.shape, batch_axis)
        index = sharding.addressable_devices_indices_map(host.shape).values()
        rows = sorted({(s.start or 0, host.shape[batch_axis] if s.stop is None else s.stop)
                       for s in (i[batch_axis] for i in index)})
        lo, hi = rows[0][0], rows[-1][1]
        if sum(b - a for a, b in rows) != hi - lo:
            raise ValueError(f"batch {name!r}: this process's rows {rows} are not one block; "
                             f"order the devices so that each process holds whole rows")
        local = np.take(host, np.arange(lo, hi), axis=batch_axis)
        out[name] = jax.make_array_from_process_local_data(sharding, local, host.shape)
    return out


def constrain(x, names):
    """``x`` constrained to the sharding its logical ``names`` give under the current mesh
    (``jax.set_mesh``); ``x`` itself when no mesh is set, so models run unchanged without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(names, x.shape, mesh.shape))


# ---------------------------------------------------------------------------------------------
# Several processes
# ---------------------------------------------------------------------------------------------

def initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> None:
    """Join JAX's distributed runtime, before anything touches a device. With no arguments JAX
    reads the cluster (SLURM, Kubernetes, Open MPI, Cloud TPU); on CPU, collectives go through
    gloo."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)


def demo_config():
    """GPT tiny with one block, 128 tokens and 128 intermediate units: every size divides 8, so
    each weight is split on every mesh of 8 devices (4 heads: ``tensor`` up to 4)."""
    import dataclasses

    from jaxformer.config import GPTConfig

    return dataclasses.replace(GPTConfig.tiny(), num_layers=1, vocab_size=128,
                               intermediate_size=128)


def demo_trainer(mesh_spec: str, steps: int, seed: int = 0, batch_size: int = 8,
                 seq_len: int = 16):
    """``(trainer, dataset)``: the :func:`demo_config` GPT on ``mesh_spec`` (``"none"``: one
    device) and random-token windows (``training.data``)."""
    from jaxformer.training import data, step
    from jaxformer.training.config import TrainConfig

    model_config = demo_config()
    config = TrainConfig(steps=steps, batch_size=batch_size, seq_len=seq_len, warmup_steps=2,
                         seed=seed, learning_rate=3e-3)
    # A random phrase of 64 tokens repeated: learnable, so the losses fall and the runs compared
    # really move their weights.
    phrase = np.random.default_rng(seed).integers(0, model_config.vocab_size, 64)
    tokens = np.tile(phrase, 64)
    mesh = None if mesh_spec == "none" else make_mesh(mesh_spec)
    trainer = step.TrainStep("gpt", step.build_model("gpt", model_config, seed), config,
                             mesh=mesh)
    return trainer, data.RandomWindows(tokens, config)


def train_demo(mesh_spec: str, steps: int, seed: int = 0, batch_size: int = 8) -> list[float]:
    """The losses of ``steps`` updates of :func:`demo_trainer`: the run the launcher and the
    tests compare across layouts and processes."""
    trainer, dataset = demo_trainer(mesh_spec, steps, seed, batch_size)
    return [trainer(dataset.update_batch(i))["loss"] for i in range(steps)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(processes: int, local_devices: int, worker_args: list[str],
           timeout: float = 300.0) -> list[str]:
    """Run ``processes`` copies of ``python -m jaxformer.sharding train WORKER_ARGS`` on this
    machine, each with ``local_devices`` CPU devices, joined on a free local port. Returns their
    outputs; raises (after killing every one of them) when one fails or ``timeout`` passes."""
    address = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(local_devices)}
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_force_host_platform_device_count"))
    children = [subprocess.Popen(
        [sys.executable, "-m", "jaxformer.sharding", "train", "--coordinator", address,
         "--num-processes", str(processes), "--process-id", str(i), *worker_args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(processes)]
    deadline = time.monotonic() + timeout
    try:
        outputs = []
        for i, child in enumerate(children):
            try:
                out, _ = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"process {i} of {processes} still running after "
                                   f"{timeout:.0f} s; all were stopped") from None
            if child.returncode:
                raise RuntimeError(f"process {i} of {processes} exited with status "
                                   f"{child.returncode}:\n{out[-3000:]}")
            outputs.append(out)
        return outputs
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def result(output: str) -> dict:
    """The JSON line a ``train`` process prints, from its output (logs around it ignored)."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no result line in the process's output:\n{output[-2000:]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxformer.sharding", description=(
        "Train the demo GPT over a mesh, in one process or several. `launch` starts several "
        "processes on this machine; `train` is one process (run one per host on a cluster)."))
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="one process of a run")
    launcher = commands.add_parser("launch", help="several processes on this machine")
    for sub in (train, launcher):
        sub.add_argument("--mesh", default="data=-1",
                         help="AXIS=SIZE,... over data, fsdp, tensor; 'none' = one device "
                              "(default data=-1: all devices data-parallel)")
        sub.add_argument("--steps", type=int, default=20)
        sub.add_argument("--batch-size", type=int, default=8)
        sub.add_argument("--seed", type=int, default=0)
    train.add_argument("--coordinator", metavar="HOST:PORT",
                       help="process 0's address; leave out on a cluster JAX detects")
    train.add_argument("--num-processes", type=int)
    train.add_argument("--process-id", type=int)
    train.add_argument("--single", action="store_true",
                       help="one process alone, no distributed runtime")
    launcher.add_argument("--processes", type=int, default=2)
    launcher.add_argument("--local-devices", type=int, default=4,
                          help="CPU devices per process")
    launcher.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    common = ["--mesh", args.mesh, "--steps", str(args.steps), "--batch-size",
              str(args.batch_size), "--seed", str(args.seed)]
    if args.command == "launch":
        outputs = launch(args.processes, args.local_devices, common, args.timeout)
        print(json.dumps(result(outputs[0])))
        return 0
    if not args.single:
        initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    losses = train_demo(args.mesh, args.steps, args.seed, args.batch_size)
    print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                      "devices": jax.device_count(), "mesh": args.mesh, "losses": losses}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
