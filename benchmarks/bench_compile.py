#!/usr/bin/env python
"""Compile time against depth: BERT-base-width models, scanned and unrolled layer stacks.

BERT (hidden 768, 12 heads, intermediate 3072, vocabulary 30522) at ``--depths`` layers, with
``scan_layers`` False and True. Two workloads per model by default: the forward pass
(``BertForPreTraining``, batch ``--batch`` x ``--seq``) and a training step (masked-LM
cross-entropy over every position, its gradients and an AdamW update, as ``jaxformer.training``
runs one). The model is abstract (``nnx.eval_shape``: shapes and dtypes, no weights), so 48 layers
cost no memory. Two more on request (``--workloads initializer initializer_plain``): the model's
initialiser, a jitted function of the seed that ``jaxformer train`` compiles before anything else,
as the library builds it on the CPU (``jaxformer.nn.initializer``: draws grouped by shape, LLVM
at level 1) and as everything else is built (``JAXFORMER_FAST_INITIALIZER=0``). Each case is
``jax.jit(fn).lower(abstract inputs)`` (tracing + lowering to StableHLO) then ``.compile()`` (XLA),
timed on the wall clock and on this process's CPU clock, ``--repeats`` fresh compilations each
(``jax.clear_caches()`` before each; the persistent compilation cache is off), medians kept.

An unrolled stack hands XLA one copy of the block per layer: compile time grows with depth. A
scanned stack hands it one block inside a loop: it should stay about flat. A case whose first
compilation takes over ``--slow-s`` CPU seconds is not repeated, and a deeper unrolled case of
the same workload is skipped when its predicted CPU time (linear in depth) would exceed
``--skip-s``: the JSON says which. The machine's load average is recorded before and after every
case (compile is mostly one thread: a busy machine slows the wall clock far more than the CPU
clock, so the thresholds and the plot use CPU seconds).

    python benchmarks/bench_compile.py                      # 2, 12, 24, 48 layers, ~10 minutes
    python benchmarks/bench_compile.py --depths 2 12 --repeats 1 --no-save   # a quick look
    python benchmarks/bench_compile.py --workloads initializer initializer_plain --depths 2 12 24
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import harness

BASE = {"hidden_size": 768, "num_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
        "max_position_embeddings": 512}


def workloads(family_config, batch: int, seq: int):
    """``{"forward": (fn, args), "train_step": (fn, args)}``: pure functions of abstract inputs
    (``jax.ShapeDtypeStruct``) for a model built from ``family_config``; ``family_config`` is a
    ``GPTConfig`` (causal LM) or a ``BertConfig`` (masked LM over every position)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jaxformer.config import GPTConfig
    from jaxformer.models import bert, gpt

    is_gpt = isinstance(family_config, GPTConfig)
    build = ((lambda: gpt.GPT(family_config, rngs=nnx.Rngs(0))) if is_gpt else
             (lambda: bert.BertForPreTraining(family_config, rngs=nnx.Rngs(0))))
    model = nnx.eval_shape(build)
    model.train()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(1e-4, weight_decay=0.01)
    opt_state = jax.eval_shape(tx.init, params)
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)

    def logits_of(params, rest, ids):
        module = nnx.merge(graphdef, params, rest, copy=True)
        out = module(ids) if is_gpt else module(ids)[1]
        return out, nnx.split(module, nnx.Param, ...)[2]

    def forward(params, rest, ids):
        return logits_of(params, rest, ids)[0]

    def train_step(params, opt_state, rest, ids):
        def loss_fn(params):
            logits, new_rest = logits_of(params, rest, ids)
            targets = jnp.roll(ids, -1, axis=1) if is_gpt else ids
            loss = optax.softmax_cross_entropy_with_integer_labels(
                logits.astype(jnp.float32), targets).mean()
            return loss, new_rest

        (loss, new_rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, new_rest, loss

    return {"forward": (forward, (params, rest, ids)),
            "train_step": (train_step, (params, opt_state, rest, ids)),
            "initializer": initializer(family_config, fast=True),
            "initializer_plain": initializer(family_config, fast=False)}


def initializer(family_config, fast: bool):
    """The model's initialiser as ``jaxformer train`` compiles it (``training.step``: a jitted
    function of the seed), built for a short compile (``fast``: ``runtime.fast_initializer``, on
    the CPU) or as everything else (``JAXFORMER_FAST_INITIALIZER=0``); ``(jitted, (seed,))``."""
    import numpy as np

    from jaxformer.config import GPTConfig
    from jaxformer.training import step

    family = "gpt" if isinstance(family_config, GPTConfig) else "bert"
    # the switch is read when the initialiser is made, not when it is compiled
    with harness.environment_variable("JAXFORMER_FAST_INITIALIZER", "1" if fast else "0"):
        _, jitted = step._initializer.__wrapped__(family, family_config)
    return jitted, (np.uint32(0),)


def compile_once(fn, args):
    """``(lower s, compile s) x (wall, cpu)`` and the compiled executable, from cold caches."""
    import jax
    jax.clear_caches()
    w0, c0 = time.perf_counter(), time.process_time()
    lowered = (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*args)  # (the initialisers
    # are jitted with their own compiler options)
    w1, c1 = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    w2, c2 = time.perf_counter(), time.process_time()
    return {"lower_wall_s": w1 - w0, "compile_wall_s": w2 - w1, "total_wall_s": w2 - w0,
            "lower_cpu_s": c1 - c0, "compile_cpu_s": c2 - c1, "total_cpu_s": c2 - c0}, compiled


def median_case(times: list[dict]) -> dict:
    return {key: statistics.median(t[key] for t in times) for key in times[0]}


def plot(results: dict, path: Path, title: str, clock: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {("forward", False): "C0--", ("forward", True): "C0-",
              ("train_step", False): "C1--", ("train_step", True): "C1-",
              ("initializer", False): "C2--", ("initializer", True): "C2-",
              ("initializer_plain", False): "C3--", ("initializer_plain", True): "C3-"}
    for (workload, scan), style in styles.items():
        points = sorted((c["num_layers"], c["median"][f"total_{clock}_s"])
                        for c in results.values()
                        if c["workload"] == workload and c["scan_layers"] == scan and "median" in c)
        if points:
            ax.plot(*zip(*points), style, marker="o",
                    label=f"{workload}, {'scanned' if scan else 'unrolled'}")
    ax.set_xlabel("layers")
    ax.set_ylabel(f"lower + compile, {clock} seconds (median)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = harness.argument_parser(__doc__, repeats=3, warmup=0)
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 12, 24, 48])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--workloads", nargs="+", default=["forward", "train_step"])
    parser.add_argument("--slow-s", type=float, default=30.0,
                        help="a case whose first compilation takes longer (CPU seconds) is not "
                             "repeated")
    parser.add_argument("--skip-s", type=float, default=90.0,
                        help="skip an unrolled case predicted (linearly in depth, CPU seconds) "
                             "to take longer")
    args = parser.parse_args(argv)
    bench = harness.start(args, "compile", title="Compile time vs depth", need_torch=False)
    import jax
    jax.config.update("jax_enable_compilation_cache", False)  # fresh compilations only

    from jaxformer.config import BertConfig

    report = {"benchmark": "compile", "command": "python " + " ".join(sys.argv),
              "environment": bench.env, "model": dict(BASE, family="bert"),
              "batch": args.batch, "seq": args.seq, "repeats": args.repeats, "results": {},
              "skipped": {}, "complete": False}
    started = time.perf_counter()
    per_layer = {}  # (workload, scan) -> CPU seconds per layer of the last case measured
    for workload in args.workloads:
        for depth in args.depths:
            for scan in (True, False):
                name = f"{workload}/{'scanned' if scan else 'unrolled'}/{depth}"
                predicted = per_layer.get((workload, scan), 0.0) * depth
                if not scan and predicted > args.skip_s:
                    report["skipped"][name] = (f"predicted {predicted:.0f} cpu s "
                                               f"> --skip-s {args.skip_s:.0f} s")
                    print(f"{name}: skipped ({report['skipped'][name]})", flush=True)
                    continue
                config = BertConfig(num_layers=depth, scan_layers=scan, **BASE)
                fn, fn_args = workloads(config, args.batch, args.seq)[workload]
                load_before = harness.loadavg()
                times = []
                for _ in range(args.repeats):
                    t, compiled = compile_once(fn, fn_args)
                    times.append(t)
                    if t["total_cpu_s"] > args.slow_s:
                        break
                case = {"workload": workload, "scan_layers": scan, "num_layers": depth,
                        "times": times, "median": median_case(times),
                        "temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
                        "loadavg_before": load_before, "loadavg_after": harness.loadavg()}
                report["results"][name] = case
                per_layer[workload, scan] = case["median"]["total_cpu_s"] / depth
                m = case["median"]
                print(f"{name}: {m['total_wall_s']:.2f} s wall ({m['lower_wall_s']:.2f} lower + "
                      f"{m['compile_wall_s']:.2f} compile), {m['total_cpu_s']:.2f} s cpu, "
                      f"{len(times)} run(s), load {case['loadavg_after']}, "
                      f"{time.perf_counter() - started:.0f} s so far", flush=True)
                report["total_runtime_s"] = time.perf_counter() - started
                if not args.no_save:  # after every case: a stopped run keeps what it measured
                    save(report, Path(args.out), args)
    report["complete"] = True
    if not args.no_save:
        save(report, Path(args.out), args)
        print(f"wrote {Path(args.out) / result_stem(args)}.json and .png")
    return 0


def result_stem(args) -> str:
    """``bench_compile``, or ``bench_compile_<tag>`` with ``--tag`` (an experiment's own files)."""
    return "bench_compile" + (f"_{args.tag}" if args.tag else "")


def save(report: dict, out: Path, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(args)
    tmp = out / f"{stem}.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(out / f"{stem}.json")
    plot(report["results"], out / f"{stem}.png",
         f"BERT-base width, batch {args.batch} x {args.seq}: lower + compile, CPU seconds\n"
         f"({report['environment'].get('cpu_count')} cores shared, load average up to "
         f"{max(c['loadavg_after'][0] for c in report['results'].values()):.0f})", "cpu")


if __name__ == "__main__":
    sys.exit(main())
