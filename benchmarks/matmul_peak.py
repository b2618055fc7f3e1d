#!/usr/bin/env python
"""Matmul rates in JAX and torch on one device: a large square matmul (the peak that MFU divides
by) and the GEMM shapes the benchmarked models actually run, timed interleaved in one process.

Each case is timed as ``--repeats`` rounds, every round running the jax and the torch version once
in alternating order; the report gives the best and the median GFLOP/s of each and their ratio
(jax / torch, > 1: jax faster). Linear layers are timed the way each framework's model runs them:
jax ``x @ kernel + bias`` (kernel ``[in, out]``) in one jitted function, torch ``F.linear(x, weight,
bias)`` (weight ``[out, in]``, MKL/oneDNN ``addmm``).

XLA:CPU flags must be set before jax starts: pass them with ``--xla-flags`` (appended to
``XLA_FLAGS``) to compare dot back ends, e.g. ``--xla-flags=--xla_cpu_use_xnnpack=false``.

    python benchmarks/matmul_peak.py                         # square 2048 and the model shapes
    python benchmarks/matmul_peak.py --cases square --sizes 1024,2048,4096 --repeats 9
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def cases(kind: str, sizes):
    """name -> (M, K, N, batch, has_bias): x (batch?, M, K) @ w (K, N)."""
    out = {}
    if kind in ("square", "all"):
        for n in sizes:
            out[f"square {n}^3"] = (n, n, n, None, False)
    if kind in ("model", "all"):
        out.update({
            "bert/gpt qkv-out 1024x768 @ 768x768 +b": (1024, 768, 768, None, True),
            "bert fc1 1024x768 @ 768x3072 +b": (1024, 768, 3072, None, True),
            "bert fc2 1024x3072 @ 3072x768 +b": (1024, 3072, 768, None, True),
            "fused qkv 1024x768 @ 768x2304 +b": (1024, 768, 2304, None, True),
            "attn scores 96 x (128x64 @ 64x128)": (128, 64, 128, 96, False),
            "attn AV 96 x (128x128 @ 128x64)": (128, 128, 64, 96, False),
            "gpt2 fc1 2048x768 @ 768x3072 +b": (2048, 768, 3072, None, True),
            "gpt2 lm-head 2048x768 @ 768x50257": (2048, 768, 50257, None, False),
        })
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", choices=("square", "model", "all"), default="all")
    p.add_argument("--sizes", default="2048", help="square sizes, comma-separated")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--xla-flags", default="")
    p.add_argument("--json", default="", help="also write the results here")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: process CPU time (all threads) instead of wall time; on a shared "
                        "machine, single-threaded runs (taskset -c N) timed this way are immune "
                        "to time-slicing by other processes")
    args = p.parse_args(argv)
    if args.xla_flags:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    jax.config.update("jax_default_matmul_precision", "highest")
    torch.set_float32_matmul_precision("highest")
    if args.threads:
        torch.set_num_threads(args.threads)
    tdt = getattr(torch, args.dtype)
    rng = np.random.RandomState(0)
    results = {}
    print(f"jax {jax.__version__} torch {torch.__version__} dtype {args.dtype} torch threads "
          f"{torch.get_num_threads()} clock {args.clock} XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} "
          f"loadavg {os.getloadavg()}")
    print(f"{'case':42s} {'jax best':>9s} {'torch best':>10s} {'jax med':>8s} {'torch med':>9s}"
          f" {'ratio best':>10s} {'ratio med':>9s}   (GFLOP/s)")
    sizes = [int(s) for s in args.sizes.split(",")]
    for name, (M, K, N, batch, bias) in cases(args.cases, sizes).items():
        lead = (batch,) if batch else ()
        x = rng.standard_normal(lead + (M, K)).astype(np.float32)
        w = (rng.standard_normal(lead + (K, N)) / np.sqrt(K)).astype(np.float32)
        b = rng.standard_normal((N,)).astype(np.float32)
        jx, jw, jb = (jnp.asarray(a, args.dtype) for a in (x, w, b))
        if bias:
            jf = jax.jit(lambda x, w, b: x @ w + b)
        else:
            jf = jax.jit(lambda x, w, b: x @ w)
        tx = torch.from_numpy(x).to(tdt)
        if batch:
            tw = torch.from_numpy(w).to(tdt)
            tf = lambda: torch.bmm(tx, tw)  # noqa: E731
        else:
            tw = torch.from_numpy(np.ascontiguousarray(w.T)).to(tdt)  # nn.Linear layout
            tb = torch.from_numpy(b).to(tdt) if bias else None
            tf = lambda: torch.nn.functional.linear(tx, tw, tb)  # noqa: E731
        fns = {"jax": lambda: jf(jx, jw, jb).block_until_ready(), "torch": tf}
        with torch.inference_mode():
            for _ in range(2):
                fns["jax"]()
                fns["torch"]()
            times = {k: [] for k in fns}
            cpu = {k: [] for k in fns}
            for r in range(args.repeats):
                for k in (("jax", "torch") if r % 2 == 0 else ("torch", "jax")):
                    c0, t0 = time.process_time(), time.perf_counter()
                    fns[k]()
                    times[k].append(time.perf_counter() - t0)
                    cpu[k].append(time.process_time() - c0)
        if args.clock == "cpu":
            times, wall = cpu, times
        flop = 2.0 * M * K * N * (batch or 1)
        best = {k: flop / min(v) / 1e9 for k, v in times.items()}
        med = {k: flop / float(np.median(v)) / 1e9 for k, v in times.items()}
        results[name] = {"flop": flop, "best_gflops": best, "median_gflops": med,
                         "times_s": times}
        print(f"{name:42s} {best['jax']:9.1f} {best['torch']:10.1f} {med['jax']:8.1f} "
              f"{med['torch']:9.1f} {best['jax'] / best['torch']:10.3f} "
              f"{med['jax'] / med['torch']:9.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"xla_flags": os.environ.get("XLA_FLAGS", ""), "dtype": args.dtype,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
