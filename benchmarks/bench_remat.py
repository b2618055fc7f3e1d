#!/usr/bin/env python
"""Peak memory of a training step against the remat policy: GPT-2-small width, scanned and
unrolled layer stacks.

GPT-2 small's width (hidden 768, 12 heads, intermediate 3072, vocabulary 50257) at ``--layers``
layers, batch ``--batch`` x ``--seq``, the training step of ``bench_compile.py`` (cross-entropy,
gradients, AdamW). For every policy of ``jaxformer.config.REMAT_POLICIES`` and both stack modes
the step is compiled from abstract shapes (no weights) and XLA's own memory analysis of the
compiled program is read: ``temp_size_in_bytes`` is the scratch memory the step needs beyond its
arguments and outputs, which is where saved activations live; arguments (parameters, optimizer
state, batch) and outputs are reported too. Nothing is run: the figures are XLA's plan for this
backend (CPU here), not a measured peak, and depend on the backend's scheduler.

    python benchmarks/bench_remat.py                       # 12 layers, batch 8 x 512
    python benchmarks/bench_remat.py --layers 4 --no-save  # a quick look
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import harness
from bench_compile import compile_once, workloads

WIDTH = {"hidden_size": 768, "num_heads": 12, "intermediate_size": 3072, "vocab_size": 50257,
         "max_position_embeddings": 1024}


def _flops(compiled):
    """XLA's FLOP count of the program (a dict, or a list of one per device in some versions)."""
    cost = compiled.cost_analysis() or {}
    return (cost[0] if isinstance(cost, list) else cost).get("flops")


def plot(results: dict, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    policies = list(dict.fromkeys(c["remat"] for c in results.values()))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    x = np.arange(len(policies))
    for offset, scan in ((-0.2, False), (0.2, True)):
        values = [results[f"{p}/{'scanned' if scan else 'unrolled'}"]["temp_bytes"] / 2**30
                  for p in policies]
        bars = ax.bar(x + offset, values, 0.4, label="scanned" if scan else "unrolled")
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks(x, policies, fontsize=8)
    ax.set_ylabel("XLA temp memory of the step, GiB")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = harness.argument_parser(__doc__, repeats=1, warmup=0)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    args = parser.parse_args(argv)
    bench = harness.start(args, "remat", title="Training-step memory vs remat policy",
                          need_torch=False)
    import jax
    jax.config.update("jax_enable_compilation_cache", False)

    from jaxformer.config import REMAT_POLICIES, GPTConfig

    report = {"benchmark": "remat", "command": "python " + " ".join(sys.argv),
              "environment": bench.env, "model": dict(WIDTH, family="gpt", layers=args.layers),
              "batch": args.batch, "seq": args.seq, "results": {}}
    started = time.perf_counter()
    for scan in (True, False):
        for policy in REMAT_POLICIES:
            config = GPTConfig(num_layers=args.layers, scan_layers=scan, remat=policy, **WIDTH)
            fn, fn_args = workloads(config, args.batch, args.seq)["train_step"]
            times, compiled = compile_once(fn, fn_args)
            memory = compiled.memory_analysis()
            name = f"{policy}/{'scanned' if scan else 'unrolled'}"
            report["results"][name] = {
                "remat": policy, "scan_layers": scan, "compile": times,
                "temp_bytes": memory.temp_size_in_bytes,
                "argument_bytes": memory.argument_size_in_bytes,
                "output_bytes": memory.output_size_in_bytes,
                "alias_bytes": memory.alias_size_in_bytes,
                "flops": _flops(compiled),
                "loadavg": harness.loadavg()}
            print(f"{name}: temp {memory.temp_size_in_bytes / 2**30:.3f} GiB, arguments "
                  f"{memory.argument_size_in_bytes / 2**30:.3f} GiB, compiled in "
                  f"{times['total_cpu_s']:.1f} cpu s, {time.perf_counter() - started:.0f} s so far",
                  flush=True)
    report["total_runtime_s"] = time.perf_counter() - started
    if args.no_save:
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "bench_remat.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(out / "bench_remat.json")
    plot(report["results"], out / "bench_remat.png",
         f"GPT-2 small width, {args.layers} layers, batch {args.batch} x {args.seq}: "
         f"training-step temp memory (XLA {bench.env['jax_device_kind']})")
    print(f"wrote {out / 'bench_remat.json'} and {out / 'bench_remat.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
