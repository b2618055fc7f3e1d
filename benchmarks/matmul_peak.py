#!/usr/bin/env python
"""Matmul rates in JAX and torch on one device: a large square matmul (the peak that MFU divides
by) and the GEMM shapes the benchmarked models run, timed interleaved in one process.

Every case runs through the shared harness (benchmarks/harness.py): warm-up, ``--repeats``
interleaved rounds (ABBA), medians with their spread; the ratio is jax speed / torch speed (> 1:
jax faster). Linear layers are timed the way each framework's model runs them
(``Bench.matmul``): jax ``x @ kernel + bias`` (kernel ``[in, out]``) in one jitted function,
torch ``F.linear(x, weight, bias)`` (weight ``[out, in]``, MKL/oneDNN ``addmm``); attention
products as batched matmuls. The square case uses the same code as the peak of every benchmark.

XLA:CPU flags must be set before jax starts: pass them with ``--xla-flags`` (appended to
``XLA_FLAGS``) to compare dot back ends, e.g. ``--xla-flags=--xla_cpu_use_xnnpack=false``.

    python benchmarks/matmul_peak.py                         # square 2048 and the model shapes
    python benchmarks/matmul_peak.py --cases square --sizes 1024,2048,4096 --repeats 9
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import harness


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
            # the tied head's input gradient at GPT-2 6 layers' 4 x 128: dY @ table, contracting
            # over the vocabulary
            "gpt2 lm-head dX 512x50257 @ 50257x768": (512, 50257, 768, None, False),
        })
    return out


def main(argv=None):
    p = harness.argument_parser(__doc__, repeats=7, warmup=2)
    p.add_argument("--cases", choices=("square", "model", "all"), default="all")
    p.add_argument("--sizes", default="2048", help="square sizes, comma-separated")
    p.add_argument("--json", default="", help="also write the rates here (the format of the "
                   "first matmul results: best and median GFLOP/s and times per case)")
    args = p.parse_args(argv)
    bench = harness.start(args, "matmul-peak", title="Matmul rates: jax (jit) vs torch")
    if bench is None:
        return 0
    rates = {}
    for name, (m, k, n, batch, bias) in cases(args.cases, [int(s) for s in
                                                           args.sizes.split(",")]).items():
        flop, fns = bench.matmul(m, k, n, batch, bias)
        case = bench.measure(fns, baseline="torch" if "torch" in fns else None, flop=flop,
                             peak=False)
        best = {fw: flop / case[fw]["min_s"] / 1e9 for fw in fns}
        case.update(label=name, shape=f"{batch} x" if batch else "",
                    notes={"best GFLOP/s " + " / ".join(fns):
                           " / ".join(f"{best[fw]:.1f}" for fw in fns)})
        bench.add(name, case)
        rates[name] = {"flop": flop, "best_gflops": best,
                       "median_gflops": {fw: flop / case[fw]["median_s"] / 1e9 for fw in fns},
                       "times_s": {fw: case[fw]["times_s"] for fw in fns}}
    status = bench.finish()
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"xla_flags": os.environ.get("XLA_FLAGS", ""),
                                    "dtype": args.dtype, "results": rates}, indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
