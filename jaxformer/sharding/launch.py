"""``python -m jaxformer.sharding launch``: several ``jaxformer train`` processes on this machine.

A thin launcher over ``jaxformer train`` (``docs/scale.md``): it starts ``--processes`` copies of
``python -m jaxformer.cli train ARGS``, each with ``--local-devices`` CPU devices, joined on a
free local port through ``--coordinator``, ``--num-processes`` and ``--process-id``, which is
what a cluster's launcher (``srun``, ``mpirun``, a JobSet) does across hosts. Process 0's output
comes through as it is printed; the others' is shown when one fails. It stops every process when
one fails or the time limit passes. Imports nothing of JAX or of the training code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_env(local_devices: int) -> dict[str, str]:
    """The environment of a CPU process with ``local_devices`` devices."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(local_devices)}
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_force_host_platform_device_count"))
    return env


def launch(processes: int, local_devices: int, train_args: list[str], timeout: float = 600.0,
           capture: bool = True) -> list[str]:
    """Run ``processes`` copies of ``jaxformer train TRAIN_ARGS`` joined on a free local port,
    each with ``local_devices`` CPU devices; return their outputs (stdout and stderr together;
    with ``capture`` False, process 0's goes to this process's stdout and comes back empty).
    Raises (after stopping every one of them) when one fails or ``timeout`` passes."""
    address = f"127.0.0.1:{free_port()}"
    env = local_env(local_devices)
    with contextlib.ExitStack() as files:
        logs = [files.enter_context(tempfile.TemporaryFile("w+")) for _ in range(processes)]
        return _run(processes, train_args, address, env, logs, timeout, capture)


def _run(processes: int, train_args: list[str], address: str, env: dict, logs: list,
         timeout: float, capture: bool) -> list[str]:
    children = [subprocess.Popen(
        [sys.executable, "-m", "jaxformer.cli", "train", *train_args, "--coordinator", address,
         "--num-processes", str(processes), "--process-id", str(i)],
        env=env, stdout=None if (i == 0 and not capture) else logs[i],
        stderr=None if (i == 0 and not capture) else subprocess.STDOUT, text=True)
        for i in range(processes)]

    def output(i: int) -> str:
        logs[i].seek(0)
        return logs[i].read()

    deadline = time.monotonic() + timeout
    try:
        while any(child.poll() is None for child in children):
            failed = [i for i, c in enumerate(children) if c.poll() not in (None, 0)]
            if failed:
                i = failed[0]
                raise RuntimeError(f"process {i} of {processes} exited with status "
                                   f"{children[i].returncode}; all were stopped:\n"
                                   f"{output(i)[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {processes} processes were still running after "
                                   f"{timeout:.0f} s; all were stopped:\n{output(0)[-2000:]}")
            time.sleep(0.2)
        failed = [i for i, c in enumerate(children) if c.returncode]
        if failed:
            i = failed[0]
            raise RuntimeError(f"process {i} of {processes} exited with status "
                               f"{children[i].returncode}:\n{output(i)[-3000:]}")
        return [output(i) for i in range(processes)]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxformer.sharding",
        usage="%(prog)s launch [-h] [--processes N] [--local-devices D] [--timeout S] -- "
              "TRAIN_ARGS",
        description="Run `jaxformer train TRAIN_ARGS` as several processes of this machine, "
                    "each with its own CPU devices, joined as the hosts of a cluster are: "
                    "a rehearsal of a multi-host run (docs/scale.md).",
        epilog="example: python -m jaxformer.sharding launch --processes 2 --local-devices 4 "
               "-- --family gpt --data input.txt --mesh data=2,fsdp=2,tensor=2 --steps 20")
    parser.add_argument("command", choices=("launch",))
    parser.add_argument("--processes", type=int, default=2, metavar="N",
                        help="how many processes (default 2)")
    parser.add_argument("--local-devices", type=int, default=4, metavar="D",
                        help="CPU devices per process (default 4)")
    parser.add_argument("--timeout", type=float, default=3600.0, metavar="S",
                        help="stop every process after S seconds (default 3600)")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, train_args = parser.parse_args(argv[:split]), argv[split + 1:]
    if args.processes < 1 or args.local_devices < 1:
        parser.error("--processes and --local-devices must be at least 1")
    if not train_args:
        parser.error("give the `jaxformer train` arguments after --")
    try:
        launch(args.processes, args.local_devices, train_args, args.timeout, capture=False)
    except (RuntimeError, TimeoutError) as error:
        print(f"python -m jaxformer.sharding launch: error: {error}", file=sys.stderr)
        return 1
    return 0
