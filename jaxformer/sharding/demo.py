"""The demo trainer and the local launcher: ``python -m jaxformer.sharding train|launch``.

Trains a one-block GPT over a mesh, in one process or several joined through JAX's distributed
runtime (``docs/scale.md``); ``parity_tests/test_sharding.py`` compares its losses across layouts
and processes. An application of the library: nothing in ``jaxformer`` imports this module.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np

from jaxformer.sharding.mesh import initialize_distributed, make_mesh


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
