#!/usr/bin/env python
"""Matmul rates in JAX and torch on one device: a large square matmul (the peak that MFU divides
by) and the GEMM shapes the benchmarked models run, timed interleaved in one process.

Every case runs through the shared harness (benchmarks/harness.py): warm-up, ``--repeats``
interleaved rounds (ABBA), medians with their spread; the ratio is jax speed / torch speed (> 1:
jax faster). Linear layers are timed the way each framework's model runs them
(``Bench.matmul``): jax ``x @ kernel + bias`` (kernel ``[in, out]``) in one jitted function,
torch ``F.linear(x, weight, bias)`` (weight ``[out, in]``, MKL/oneDNN ``addmm``); attention
products as batched matmuls. The square case uses the same code as the peak of every benchmark.

``--cases vector`` times the matrix-vector products of batch-1 decoding instead: one row times
each weight shape of GPT-2 small, BERT-large/GPT-2 medium and MarianMT base, as many distinct
weights per call as make about ``--vector-mb`` of them (so they stream from memory, not a cache),
three candidates: jax with the kernel as the models store it (``[in, out]``), jax with an
``[out, in]`` copy (``jaxformer.nn.params.vector_kernels``), torch ``F.linear``; the notes give
each one's read bandwidth (GB/s).

XLA:CPU flags must be set before jax starts: pass them with ``--xla-flags`` (appended to
``XLA_FLAGS``) to compare dot back ends, e.g. ``--xla-flags=--xla_cpu_use_xnnpack=false``.

    python benchmarks/matmul_peak.py                         # square 2048 and the model shapes
    python benchmarks/matmul_peak.py --cases square --sizes 1024,2048,4096 --repeats 9
    python benchmarks/matmul_peak.py --cases vector --repeats 15
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


VECTOR_SHAPES = [(768, 768), (768, 3072), (3072, 768), (768, 2304), (1024, 1024), (1024, 4096),
                 (4096, 1024), (512, 512), (512, 2048), (2048, 512)]


def vector_case(bench, k: int, n: int, megabytes: int):
    """``(bytes read, count, candidates)``: one row times ``count`` distinct ``[k, n]`` weights
    in one call, the weights about ``megabytes`` in all (see the module doc)."""
    import numpy as np
    jax, jnp, torch = bench.jax, bench.jax.numpy, bench.torch
    count = max(4, round(megabytes * 2**20 / (4 * k * n)))
    rng = np.random.RandomState(0)
    weights = [(rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32) for _ in range(count)]
    x = jax.device_put(jnp.asarray(rng.standard_normal((1, k)), jnp.float32), bench.jdev)
    stored = [jax.device_put(jnp.asarray(w), bench.jdev) for w in weights]
    copies = [jax.device_put(jnp.asarray(np.ascontiguousarray(w.T)), bench.jdev) for w in weights]
    as_stored = jax.jit(lambda x, ws: [x @ w for w in ws])
    as_copied = jax.jit(lambda x, ws: [jnp.einsum("oi,bi->bo", w, x) for w in ws])
    fns = {"jax": lambda: jax.block_until_ready(as_stored(x, stored)),
           "jax (out, in)": lambda: jax.block_until_ready(as_copied(x, copies))}
    if torch is not None:
        tx = torch.from_numpy(np.asarray(x)).to(bench.tdev)
        tws = [torch.from_numpy(np.ascontiguousarray(w.T)).to(bench.tdev) for w in weights]

        def run_torch():
            with torch.inference_mode():
                [torch.nn.functional.linear(tx, w) for w in tws]
            bench.sync()
        fns["torch"] = run_torch
    return 4 * k * n * count, count, fns


def vector_products(bench, args) -> None:
    for k, n in VECTOR_SHAPES:
        nbytes, count, fns = vector_case(bench, k, n, args.vector_mb)
        case = bench.measure(fns, baseline="jax", peak=False)
        rates = {fw: nbytes / case[fw]["median_s"] / 1e9 for fw in fns}
        notes = {"GB/s " + " / ".join(fns): " / ".join(f"{r:.1f}" for r in rates.values())}
        case.update(label=f"1x{k} @ {k}x{n}", shape=f"{count} weights, {nbytes / 2**20:.0f} MB",
                    notes=notes)
        bench.add(f"vector {k}x{n}", case)


def main(argv=None):
    p = harness.argument_parser(__doc__, repeats=7, warmup=2)
    p.add_argument("--cases", choices=("square", "model", "all", "vector"), default="all")
    p.add_argument("--vector-mb", type=int, default=200, help="weights per vector case (200)")
    p.add_argument("--sizes", default="2048", help="square sizes, comma-separated")
    p.add_argument("--json", default="", help="also write the rates here (the format of the "
                   "first matmul results: best and median GFLOP/s and times per case)")
    args = p.parse_args(argv)
    bench = harness.start(args, "matmul-peak", title="Matmul rates: jax (jit) vs torch")
    if bench is None:
        return 0
    if args.cases == "vector":
        vector_products(bench, args)
        return bench.finish()
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
