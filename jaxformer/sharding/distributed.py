"""``jaxformer train`` over several processes: its options, joining JAX's distributed runtime,
and what the training loop asks of the other processes (JAX only, no twin; ``docs/scale.md``).

Every process runs the same command over one global mesh. Each builds only its own rows of every
global batch (:func:`batch_rows`, ``data.Dataset(rows=)``), so no example is built twice and the
global batch is the one-process run's: the losses are the same. Checkpoints are written and read
by every process together (orbax: each process writes the pieces of the arrays its devices hold,
process 0 the metadata and the commit); process 0 alone writes the run's other files (run.json,
tokenizer.json, the metrics, the plot, an export) and prints the progress. The processes agree,
before the first step, that they train the same run with the same tokenizer
(:func:`check_same`), and at every step whether one of them was told to stop
(:func:`any_process`), so that they stop, and save, together.

This module reads the options without JAX (``jaxformer train --help`` builds the parser); JAX is
imported by the functions that need it.
"""

from __future__ import annotations

import argparse
import hashlib
import re

# The cluster environments jax.distributed.initialize() reads by itself (named in the help).
CLUSTERS = "SLURM, Open MPI, Kubernetes (JobSet, indexed Job), Cloud TPU pods"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``several processes`` group of ``jaxformer train``."""
    group = parser.add_argument_group(
        "several processes (docs/scale.md)",
        "Run the same command in every process (one per host): they train one model over a\n"
        "--mesh of all their devices (default data=-1) and write one run directory, which must\n"
        "be on storage every process sees.")
    group.add_argument("--coordinator", metavar="HOST:PORT",
                       help="process 0's address, where the others join it")
    group.add_argument("--num-processes", type=int, metavar="N",
                       help="how many processes train together (with --coordinator and "
                            "--process-id)")
    group.add_argument("--process-id", type=int, metavar="I",
                       help="this process's index, 0 to N-1 (0 writes the run's files)")
    group.add_argument("--distributed", action="store_true",
                       help=f"join the processes the cluster environment describes ({CLUSTERS}: "
                            f"jax.distributed.initialize() reads the coordinator, the count and "
                            f"the index from it); the three options above override it")


def options(args) -> dict | None:
    """The keywords of ``jax.distributed.initialize`` the options ask for, None for one process;
    a ``ValueError`` naming the flag for options that cannot work."""
    coordinator, count, index = args.coordinator, args.num_processes, args.process_id
    distributed = args.distributed or any(x is not None for x in (coordinator, count, index))
    if not distributed:
        return None
    given = ("--distributed" if args.distributed else "--coordinator" if coordinator is not None
             else "--num-processes" if count is not None else "--process-id")
    if getattr(args, "framework", "jax") != "jax":
        raise ValueError(f"{given} trains over several processes in JAX; --framework "
                         f"{args.framework} trains in one process (drop {given})")
    if index is not None and count is None:
        raise ValueError(f"--process-id {index} needs --num-processes (how many processes train "
                         f"together)")
    if count is not None and count < 1:
        raise ValueError(f"--num-processes must be at least 1, got {count}")
    if index is not None and count is not None and not 0 <= index < count:
        raise ValueError(f"--process-id {index} is out of range for --num-processes {count} "
                         f"(0 to {count - 1})")
    if not args.distributed:
        if count is None or index is None:
            raise ValueError(f"{given} needs --coordinator HOST:PORT, --num-processes N and "
                             f"--process-id I together, or --distributed on a cluster JAX reads "
                             f"({CLUSTERS})")
        if coordinator is None:
            raise ValueError("--num-processes needs --coordinator HOST:PORT (process 0's "
                             "address), or --distributed on a cluster JAX reads")
    if coordinator is not None:
        match = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^\s:]+):(\d+)", coordinator)
        if match is None or not 0 < int(match[2]) < 65536:
            raise ValueError(f"--coordinator {coordinator!r} is not HOST:PORT (e.g. "
                             f"node0:8476; the port 1 to 65535)")
    return {"coordinator": coordinator, "num_processes": count, "process_id": index}


def initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> None:
    """Join JAX's distributed runtime, before anything touches a device. With no arguments JAX
    reads the cluster (SLURM, Kubernetes, Open MPI, Cloud TPU); on CPU, collectives go through
    gloo."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)


def start(args) -> None:
    """What ``jaxformer train`` does before anything else: check the options and, for several
    processes, join the runtime and default ``args.mesh`` to ``data=-1`` (every device of every
    process data-parallel)."""
    keywords = options(args)
    if keywords is None:
        return
    try:
        initialize_distributed(**keywords)
    except (RuntimeError, ValueError) as error:  # no cluster found, an unreachable coordinator
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if args.distributed:
            raise ValueError(f"--distributed: cannot join the other processes ({first[:300]}); "
                             f"outside a cluster JAX reads ({CLUSTERS}) give --coordinator "
                             f"HOST:PORT, --num-processes N and --process-id I") from None
        raise ValueError(f"--coordinator {args.coordinator}: cannot join the other processes "
                         f"({first[:300]})") from None
    if args.mesh is None and multiprocess():
        args.mesh = "data=-1"


# ------------------------------------------------------------------ what the loop asks of it

def multiprocess() -> bool:
    """True when this process trains with others (JAX's distributed runtime, several
    processes)."""
    import jax

    return jax.distributed.is_initialized() and jax.process_count() > 1


def is_primary() -> bool:
    """Process 0 of a run over several, or the only one: the one that writes the run's files."""
    import jax

    return not multiprocess() or jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait here until every process arrives (nothing with one process)."""
    if multiprocess():
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def check_same(what: str, text: str) -> None:
    """Refuse to go on unless ``text`` is the same in every process (compared by its SHA-256):
    the processes were given different flags or files, or built different tokenizers."""
    if not multiprocess():
        return
    import numpy as np
    from jax.experimental import multihost_utils

    digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)
    gathered = np.asarray(multihost_utils.process_allgather(digest))
    differ = [i for i, row in enumerate(gathered) if not np.array_equal(row, gathered[0])]
    if differ:
        raise ValueError(f"the processes do not agree on {what}: process(es) {differ} differ "
                         f"from process 0 (give every process the same flags and files)")


def any_process(flag: bool) -> bool:
    """``flag`` of any process (every process must ask, at the same point)."""
    if not multiprocess():
        return flag
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.int32(flag))).any())


def batch_rows(trainer, size: int) -> tuple[int, int] | None:
    """The rows ``(lo, hi)`` of a batch of ``size`` this process builds, or None (all of them):
    one process, or a trainer without a mesh."""
    mesh = getattr(trainer, "mesh", None)
    if mesh is None or not multiprocess():
        return None
    from jaxformer.sharding.mesh import process_rows

    return process_rows(mesh, size)


def check_mesh(spec: str, micro_batch_size: int) -> None:
    """``--mesh`` fits the devices of every process and splits the micro-batch, or a
    ``ValueError`` naming the flag."""
    import jax

    from jaxformer.sharding.mesh import MeshError, check_batch_size, make_mesh

    try:
        mesh = make_mesh(spec)
    except MeshError as error:
        where = (f" ({jax.process_count()} processes of {jax.local_device_count()} devices)"
                 if multiprocess() else "")
        raise ValueError(f"--mesh {spec}: {error}{where}") from None
    try:
        check_batch_size(micro_batch_size, mesh)
    except ValueError as error:
        raise ValueError(f"--mesh {spec} with --batch-size: {error}") from None


def whole_model(trainer):
    """The trained model of ``trainer`` (a ``training.step.TrainStep``), for an export that
    process 0 writes: ``trainer.sync()`` with one process; over several, every parameter gathered
    whole, as numpy, into every process (each process must call it)."""
    if not multiprocess():
        return trainer.sync()
    from flax import nnx
    from jax.experimental import multihost_utils

    params = trainer.state_dict()["params"]
    nnx.update(trainer.model, multihost_utils.process_allgather(params, tiled=True))
    return trainer.model
