#!/usr/bin/env python
"""Training-step benchmark: one optimizer update (forward, backward, clipping, AdamW) of GPT-2
small and BERT-base, jaxformer's jitted step against its torch_ref twin, eager and compiled.

The three candidates are the steps the training loop runs, built the way the loop builds them
(``jaxformer.training.loop.build_trainer``): the model is initialised by jaxformer from the seed
and its weights copied into each torch model through ``jaxformer.checkpoints.convert``; the
compiled torch model is ``torch_model.compile()`` (inductor), the loop's ``--compile``.

- ``jaxformer``: ``jaxformer.training.step.TrainStep``, the whole update in one jitted call with
  the parameter, optimizer and RNG buffers donated;
- ``torch_ref eager``: ``torch_ref.training.step.TrainStep`` (the baseline);
- ``torch_ref compile``: the same step on the compiled model (the optimizer stays eager, as in
  the loop).

Workloads: GPT-2 small (``GPTConfig.gpt2()``), batch 4 x 256, causal LM loss, no padding (the loop
packs text into full windows); BERT-base (``BertConfig.base()``), batch 8 x 128, masked LM + next
sentence, right padding as in ``bench_forward.py``, the masked positions drawn as
``jaxformer.training.tasks.bert_pretraining`` draws them (15% of the real tokens, at most
``TrainConfig.max_predictions`` per row, where the MLM head runs). Dropout is 0 on both sides so
that the work is the same; every candidate trains on the very same numpy batch at every step. Before
anything is timed each candidate makes one step from the same weights and their losses must agree to
1e-5 (relative; in ``--dtype bfloat16``, where torch_ref trains under autocast, to the measured
bfloat16 bound of ``LOSS_RTOL``), or the script stops: the timings then compare equal work. After
the timed rounds every candidate has made the same number of steps, and the largest relative
difference of their losses at each step is recorded (the project's tolerance table, docs/design.md,
allows 1e-5 over 10 steps, 1e-4 over 100).

Reported per case (on top of the harness's medians, tokens/s, model FLOP/s, MFU over the measured
matmul peak): compile time (jaxformer: ``lower`` + ``compile`` of the step, timed before its
first call, which then only traces; torch.compile: its first call minus its median step), XLA's
own FLOP and byte counts of the compiled step, and jaxformer's speed over torch.compile. Model
FLOPs: ``jaxformer.models.flops.train_step_flops`` (3 x forward, the MLM head at the positions
it runs at).

``--jax-variants`` adds jaxformer steps built with other computation switches (attention
implementation, remat, scanned layers, matmul precision, XLA compiler options such as
``no-triton-gemm``; several joined by ``+``) to the same interleaved rounds, for the experiments
recorded in results/ (``--jax-only`` leaves torch out); XLA flags that are not compiler options
need a process each (``--xla-flags ... --tag ...``). ``--profile DIR`` writes a ``jax.profiler``
trace of two steps of each jaxformer candidate after the timed rounds, and the compiled
program's text beside it, which ``profile_summary.py`` sums by kernel (on the CPU, where XLA is
then asked to record its operations, also the steps' wall time by kind of operation).
``--updates-per-call K`` times K updates per call (every candidate), and the ``late-fetch``
variant dispatches each of them before reading the previous one's metrics
(``TrainStep.dispatch``/``fetch``), so the host's work between updates overlaps the device's.
Memory: GPT-2 with its three candidates holds about 10 GB; each extra variant ~3 GB. On a shared
machine time one thread in process CPU time (``taskset -c 1 ... --threads 1 --clock cpu``,
benchmarks/README.md); a GPT-2 step then takes 13-19 s of CPU.

    python benchmarks/bench_train.py                      # both models, 5 rounds (minutes)
    python benchmarks/bench_train.py --quick --no-save    # tiny models: a smoke run (minutes:
                                                          # torch.compile compiles ~2 min)
    python benchmarks/bench_train.py --models gpt2 --jax-only --jax-variants scan --tag scan
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import harness
from profile_summary import CPU_OP_EVENTS, PROGRAM_TEXT

WORKLOADS = {
    "gpt2": dict(family="gpt", preset="gpt2", label="GPT-2 small, causal LM", batch=4, seq=256),
    "bert": dict(family="bert", preset="base", label="BERT-base, MLM + NSP", batch=8, seq=128),
    # issue 24's targets: the two small models users train on a CPU, and BERT-base at 4 x 128
    "gpt2-6l": dict(family="gpt", preset="gpt2", label="GPT-2 6 layers, causal LM", batch=4,
                    seq=128, fields=dict(num_layers=6)),
    # GPT-2 with one layer: timed beside gpt2-6l, the difference is five layers' cost and what
    # the 1-layer step keeps besides its layer is the rest (embeddings, the tied head and its loss
    # over the vocabulary, the optimizer)
    "gpt2-1l": dict(family="gpt", preset="gpt2", label="GPT-2 1 layer, causal LM", batch=4,
                    seq=128, fields=dict(num_layers=1)),
    "baby": dict(family="gpt", preset="baby", label="baby GPT (nanoGPT), causal LM", batch=12,
                 seq=64),
    "bert4": dict(family="bert", preset="base", label="BERT-base, MLM + NSP", batch=4, seq=128),
}
QUICK = dict(preset="tiny", batch=4, seq=32)  # --quick: the same code on tiny configs

# jaxformer variants for --jax-variants: config fields that change the computation, not the
# weights, or (precision) the matmul precision the step is traced under.
VARIANTS = {
    "xla": dict(attention_implementation="xla"),
    "einsum": dict(attention_implementation="einsum"),
    "cudnn": dict(attention_implementation="cudnn"),  # GPU only: cuDNN flash attention
    # cuDNN attention with every mask as an additive bias (before its own mask types were used)
    "cudnn-bias": dict(attention_implementation="cudnn",
                       env={"JAXFORMER_CUDNN_MASK_TYPES": "0"}),
    "scan": dict(scan_layers=True),
    "remat-full": dict(remat="full"),
    "remat-dots": dict(remat="dots_saveable"),
    "precision-default": dict(precision="default"),
    # runtime switches (jaxformer.runtime), set around each of the variant's calls
    "xla-weight-grads": dict(env={"JAXFORMER_CPU_WEIGHT_GRADIENTS": "0"}),
    # dropout masks from JAX's own CPU lowering of Threefry (the same masks, drawn in passes)
    "jax-dropout-masks": dict(env={"JAXFORMER_CPU_DROPOUT_MASKS": "0"}),
    # XLA options the step is compiled with (TrainStep's compiler_options; the runtime's own
    # choice is the base step's): XLA's Triton GEMM kernels on, or off (products to cuBLAS)
    "triton-gemm": dict(compiler_options={"xla_gpu_enable_triton_gemm": True}),
    "no-triton-gemm": dict(compiler_options={"xla_gpu_enable_triton_gemm": False}),
    # XLA:CPU's LLVM optimisation level for the step's generated code (XLA's default is 3)
    "llvm-o1": dict(compiler_options={"xla_backend_optimization_level": 1}),
    "llvm-o2": dict(compiler_options={"xla_backend_optimization_level": 2}),
    # XLA:CPU's YNNPACK fusions for products only, reductions left to XLA's own emitter (its
    # default list without LIBRARY_FUSION_TYPE_REDUCE; slower: docs/performance.md)
    "ynn-no-reduce": dict(compiler_options={"xla_cpu_experimental_ynn_fusion_type":
                                            "LIBRARY_FUSION_TYPE_DOT,"
                                            "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}),
    # the same step, each update dispatched before the previous one's metrics are read
    # (TrainStep.dispatch / fetch): with --updates-per-call K > 1, the host's share of a step
    # overlaps the device's work
    "late-fetch": dict(late_fetch=True),
}
SWITCHES = ("precision", "env", "late_fetch")  # a variant's keys that are not config fields


def variant(name: str) -> dict:
    """``--jax-variants`` entry ``name``: one of VARIANTS, or several joined by ``+``
    (``cudnn+no-triton-gemm``), their fields merged."""
    merged: dict = {}
    for part in name.split("+"):
        for key, value in VARIANTS[part].items():
            merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    return merged
# One step from the same weights: the tolerance table's 1e-5 (docs/design.md) in float32; in
# bfloat16 (torch_ref under autocast) the JAX-vs-autocast loss bound of
# parity_tests/models/test_autocast.py, the sum of the two frameworks' own measured bfloat16 errors
# (BERT's, the larger family's).
LOSS_RTOL = {"float32": 1e-5, "bfloat16": 5.3e-3}


def make_batch(family: str, cfg, tc, seed: int) -> tuple[dict, int | None]:
    """One update's batch (a single micro-batch on the leading axis), numpy int32, the keys of
    ``jaxformer.training.tasks.get(family).batch_keys``, and for BERT the number of positions per
    row its MLM head runs at. BERT's masked positions follow ``data``'s recipe: ``round(0.15 x
    length)`` real tokens per row (at least one, at most ``tc.max_predictions``), listed in
    ``P = min(max_predictions, seq_len)`` slots padded with position 0 and label -100 (dense
    labels when ``max_predictions`` is 0)."""
    import numpy as np
    from bench_forward import make_inputs

    from jaxformer.training import tasks
    from jaxformer.training.config import IGNORE_INDEX
    B, T = tc.batch_size, tc.seq_len
    rng = np.random.RandomState(seed)
    if family == "gpt":
        ids = rng.randint(0, cfg.vocab_size, (B, T))
        out, head_positions = {"input_ids": ids}, None  # full windows: no mask (the task's)
    else:
        ids, segments, mask = make_inputs("bert", cfg, B, T, None, seed)
        P = min(getattr(tc, "max_predictions", 0), T)
        candidates = mask.astype(bool)
        candidates[:, 0] = False  # [CLS]
        if P == 0:  # dense: a label or -100 at every position
            chosen = candidates & (rng.random_sample(ids.shape) < tc.mlm_probability)
            chosen[:, 1] = True
            positions = np.broadcast_to(np.arange(T), (B, T))
            labels = np.where(chosen, ids, IGNORE_INDEX)
            head_positions = T
        else:
            positions, labels = np.zeros((B, P), int), np.full((B, P), IGNORE_INDEX)
            for r in range(B):
                n = min(P, max(1, round(mask[r].sum() * tc.mlm_probability)))
                picked = np.sort(rng.choice(np.flatnonzero(candidates[r]), n, replace=False))
                positions[r, :n], labels[r, :n] = picked, ids[r, picked]
            head_positions = P
        out = {"input_ids": ids, "token_type_ids": segments, "attention_mask": mask,
               "masked_positions": positions, "mlm_labels": labels,
               "nsp_labels": rng.randint(0, 2, (B,))}
        if "masked_positions" not in tasks.get("bert").batch_keys:  # labels at every position
            dense = np.full((B, T), IGNORE_INDEX)
            np.put_along_axis(dense, positions, labels, axis=1)
            out["mlm_labels"], head_positions = dense, T
            del out["masked_positions"]
    return {k: np.asarray(v).astype(np.int32)[None] for k, v in out.items()}, head_positions


def compile_jax(trainer, batch):
    """``lower`` + ``compile`` of the step's jitted update (its executable is cached, so the
    first call only traces): seconds, XLA's cost analysis of the compiled program, and the
    compiled program (``--profile`` writes its text beside the trace)."""
    t0 = time.perf_counter()
    compiled = trainer._lower(batch).compile()
    seconds = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    return (seconds, {k: float(cost[k]) for k in ("flops", "bytes accessed") if k in cost},
            compiled)


def compile_in_helper(what: str, trainer, batch) -> None:
    """``--compile-helper``: ``trainer``'s update compiled into the compilation cache by a helper
    process (``jaxformer.training.precompile``, as ``jaxformer train`` has it compiled on the
    CPU), for this process to load. On the CPU a step compiled in the process that runs it
    runs slower than the same program loaded (docs/performance.md, "Compiling in a helper
    process"); a helper that fails ends the benchmark rather than time the other kind."""
    from jaxformer.training import precompile

    if not precompile.wanted():
        raise SystemExit("--compile-helper: this process would not compile in a helper (that "
                         "takes the CPU backend, one process, the compilation cache and "
                         "jaxformer's allocator settings: jaxformer/training/precompile.py)")
    print(f"{what}: compiling the step in a helper process", flush=True)
    helper = precompile.start(trainer.family, trainer.model_config, trainer.config, batch, [],
                              sys.stdout)
    if helper is not None and not helper.wait(trainer):  # None: compiled by an earlier one
        raise SystemExit(f"{what}: the helper process did not compile the step")


@contextlib.contextmanager
def switches(variant: dict | None):
    """A variant's matmul precision and environment variables (``jaxformer.runtime``'s switches,
    read at trace time), set for the duration of one of its calls."""
    import jax
    variant = variant or {}
    saved = {k: os.environ.get(k) for k in variant.get("env", {})}
    os.environ.update(variant.get("env", {}))
    try:
        if "precision" in variant:
            with jax.default_matmul_precision(variant["precision"]):
                yield
        else:
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bench_workload(name, args, bench):
    import jax
    import numpy as np

    from jaxformer import config as jconfig
    from jaxformer import runtime
    from jaxformer.checkpoints import convert
    from jaxformer.models import flops
    from jaxformer.training import step as jax_step
    from jaxformer.training.config import TrainConfig
    from jaxformer.training.loop import RunOptions, build_trainer

    spec = {**WORKLOADS[name], **(QUICK if args.quick else {})}
    family, B, T = spec["family"], args.batch or spec["batch"], args.seq or spec["seq"]
    cls = jconfig.BertConfig if family == "bert" else jconfig.GPTConfig
    cfg = dataclasses.replace(getattr(cls, spec["preset"])(), **spec.get("fields", {}),
                              dropout_rate=args.dropout,
                              attention_dropout_rate=args.dropout,
                              attention_implementation=args.attention_implementation,
                              dtype=args.dtype)
    # A constant, small learning rate: the weights move every step, but not towards NaN or
    # denormals (which would change the work).
    tc = TrainConfig(steps=100_000, batch_size=B, seq_len=T, learning_rate=1e-5,
                     schedule="constant", seed=args.seed)
    batch, head_positions = make_batch(family, cfg, tc, args.seed)

    def build(framework, model_cfg=cfg, compile=False):
        print(f"{name}: building the {framework} step" + (" (compiled model)" if compile else ""),
              flush=True)
        options = RunOptions(family=family, data="", framework=framework, compile=compile)
        trainer = build_trainer(family, framework, model_cfg, tc, options)[0]
        if framework == "torch":
            # the loop's torch twin trains where its model was built, the CPU; the benchmark
            # times it on its own device (in place: the optimizer keeps the same parameters,
            # whose state it creates at the first step, on that device)
            trainer.model.to(bench.tdev)
        return trainer

    jax_steps = {"jaxformer": (build("jax"), None)}
    for v in args.jax_variants:
        # The base step's weights, through the torch layout: a scanned stack initialises its
        # stacked parameters from other random draws than the unrolled one.
        spec_v = variant(v)
        fields = {k: x for k, x in spec_v.items() if k not in (*SWITCHES, "compiler_options")}
        model = jax_step.build_model(family, dataclasses.replace(cfg, **fields), tc.seed)
        convert.torch_to_nnx(convert.nnx_to_torch(jax_steps["jaxformer"][0].model), model)
        step = jax_step.TrainStep(family, model, tc,
                                  compiler_options=spec_v.get("compiler_options"))
        jax_steps[f"jaxformer {v}"] = (step, {k: x for k, x in spec_v.items()
                                              if k in SWITCHES} or None)
    trainers = {k: t for k, (t, _) in jax_steps.items()}
    if not args.jax_only:
        trainers["torch_ref eager"] = build("torch")
    if not (args.no_compile or args.jax_only):
        trainers["torch_ref compile"] = build("torch", compile=True)

    compile_s, xla_cost, programs, first_s = {}, {}, {}, {}
    losses: dict = {k: [] for k in trainers}

    def call(key):
        trainer, precision = jax_steps.get(key, (trainers[key], None))
        late = bool((precision or {}).get("late_fetch"))

        def run():  # --updates-per-call updates; late-fetch: each read after the next is sent
            with switches(precision):
                if late:
                    outs, pending = [], trainer.dispatch(batch)
                    for _ in range(args.updates_per_call - 1):
                        sent = trainer.dispatch(batch)
                        outs.append(trainer.fetch(pending))
                        pending = sent
                    outs.append(trainer.fetch(pending))
                else:
                    outs = [trainer(batch) for _ in range(args.updates_per_call)]
            for out in outs:
                losses[key].append(out["loss"])
                print(f"  {name} {key}: step {len(losses[key])}, loss {out['loss']:.6f}",
                      flush=True)
            return outs[-1]
        return run

    fns = {key: call(key) for key in trainers}
    for key, (trainer, precision) in jax_steps.items():
        if args.compile_helper:
            compile_in_helper(f"{name}: {key}", trainer, batch)
        print(f"{name}: compiling {key}" + (" (loading the helper's program)"
                                           if args.compile_helper else ""), flush=True)
        with switches(precision), runtime.cache_lookups() as lookups:
            compile_s[key], xla_cost[key], programs[key] = compile_jax(trainer, batch)
        if args.compile_helper and (lookups["misses"] or not lookups["hits"]):
            raise SystemExit(f"{name}: {key}'s step was not in the compilation cache the "
                             f"helper wrote ({lookups}): this process compiled it")
    for key, fn in fns.items():  # the first step of each: the equal-work check
        print(f"{name}: first step of {key}", flush=True)
        t0 = time.perf_counter()
        fn()
        first_s[key] = time.perf_counter() - t0
    first = {k: v[0] for k, v in losses.items()}
    baseline = "jaxformer" if args.jax_only else "torch_ref eager"
    ref = first[baseline]
    diffs = {k: abs(v - ref) / abs(ref) for k, v in first.items()}
    print(f"{name}: first-step losses " + ", ".join(f"{k} {v:.7f}" for k, v in first.items()))
    rtol = LOSS_RTOL[args.dtype]
    if max(diffs.values()) > rtol:
        raise SystemExit(f"{name}: the first-step losses differ by more than {rtol} "
                         f"(relative): {first}; the candidates do not compute the same update")

    tokens = B * T * args.updates_per_call
    options = ({"model": "BertForPreTraining", "masked_positions": head_positions}
               if family == "bert" else {})
    step_flop = flops.train_step_flops(cfg, B, T, **options) * args.updates_per_call
    case = bench.measure(fns, baseline=baseline, tokens=tokens, flop=step_flop,
                         frameworks={k: "jax" if k in jax_steps else "torch" for k in fns})

    steps = {len(v) for v in losses.values()}
    if len(steps) != 1:
        raise SystemExit(f"{name}: candidates made different numbers of steps: "
                         f"{ {k: len(v) for k, v in losses.items()} }")
    trajectory = np.array([losses[k] for k in trainers])
    if not np.isfinite(trajectory).all():
        raise SystemExit(f"{name}: a loss stopped being finite during the timed steps")
    ref_row = trajectory[list(trainers).index(baseline)]
    drift = float((np.abs(trajectory - ref_row) / np.abs(ref_row)).max())
    if args.profile:  # after the timed rounds: two more steps of each jaxformer candidate
        for key, (trainer, precision) in jax_steps.items():
            where = f"{args.profile}/{name}/{key.replace(' ', '-')}"
            with jax.profiler.trace(where, create_perfetto_trace=True), switches(precision):
                for _ in range(2):
                    jax.block_until_ready(trainer(batch))
            (Path(where) / PROGRAM_TEXT).write_text(programs[key].as_text())  # for its kinds
            print(f"{name}: profile of {key} written under {where} "
                  f"(benchmarks/profile_summary.py {where})", flush=True)
    notes = {}
    for key in trainers:
        stats = case[key]
        stats["first_step_loss"] = first[key]
        stats["first_step_loss_rel_diff"] = diffs[key]
        stats["first_call_s"] = first_s[key]
        if key in jax_steps:
            stats["compile_s"] = compile_s[key]
            stats["xla_cost_analysis"] = xla_cost[key]
        elif key == "torch_ref compile":
            stats["compile_s"] = first_s[key] - stats["median_s"]
    notes["compile s"] = "; ".join(f"{k} {case[k]['compile_s']:.1f}" for k in trainers
                                   if "compile_s" in case[k])
    if "torch_ref compile" in case:
        for key in jax_steps:
            ratio = case["torch_ref compile"]["median_s"] / case[key]["median_s"]
            case[key]["speed_ratio_vs_torch_compile"] = ratio
            notes[f"{key} / torch.compile"] = f"{ratio:.3f}"
    xla = xla_cost["jaxformer"]
    notes["XLA GFLOP"] = harness.fmt(xla.get("flops") and xla["flops"] / 1e9, ".4g")
    notes["max rel. loss diff (step 1; all steps)"] = (f"{max(diffs.values()):.1e}; "
                                                      f"{drift:.1e} over {steps.pop()}")
    case.update(model=name, family=family, label=spec["label"] if not args.quick else
                f"{name} ({spec['preset']})",
                config=f"{cls.__name__}.{spec['preset']}() {spec.get('fields', '')}".strip(),
                batch=B, seq=T, shape=f"{B} x {T}", mlm_head_positions=head_positions,
                train_config=tc.to_dict(), model_config=dataclasses.asdict(cfg),
                jax_variants=args.jax_variants,
                jax_step_compiled_by="a helper process" if args.compile_helper else "this process",
                loss_trajectories={k: losses[k] for k in trainers},
                max_rel_loss_diff_first_step=max(diffs.values()),
                max_rel_loss_diff_all_steps=drift, notes=notes)
    return case


def parse_args(argv=None):
    p = harness.argument_parser(__doc__, repeats=5, warmup=1)
    p.add_argument("--models", default="gpt2,bert",
                   help="comma-separated subset of: " + ", ".join(WORKLOADS))
    p.add_argument("--quick", action="store_true",
                   help=f"tiny configs ({QUICK}), 2 rounds, a small matmul peak: a smoke run")
    p.add_argument("--batch", type=int, default=None, help="override every model's batch size")
    p.add_argument("--seq", type=int, default=None, help="override every model's length")
    p.add_argument("--attention-implementation", default="auto",
                   choices=("auto", "xla", "cudnn", "einsum"),
                   help="config.attention_implementation of every candidate (torch_ref: einsum "
                        "is its explicit path, every other value SDPA)")
    p.add_argument("--jax-variants", default="",
                   help="extra jaxformer candidates, comma-separated, each one of these or "
                        "several joined by '+' (cudnn+no-triton-gemm): " + ", ".join(VARIANTS))
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile candidate")
    p.add_argument("--jax-only", action="store_true",
                   help="no torch candidate: jaxformer and its --jax-variants, jaxformer the "
                        "baseline")
    p.add_argument("--dropout", type=float, default=0.0, metavar="RATE",
                   help="dropout and attention-dropout rate of every model (default 0: the two "
                        "frameworks draw different masks, so their losses match only at 0); a "
                        "rate needs --jax-only, whose candidates draw the same masks")
    p.add_argument("--updates-per-call", type=int, default=1, metavar="K",
                   help="updates in each timed call (times and tokens per call cover K); the "
                        "late-fetch variant needs K > 1 to overlap anything")
    p.add_argument("--compile-helper", action="store_true",
                   help="CPU: compile each jaxformer step in a helper process and load it from "
                        "a new compilation cache, as `jaxformer train` does (a step compiled "
                        "in the process that runs it runs slower there); variants that change "
                        "the environment, the precision, the compiler options or how the step "
                        "is called (late-fetch) are refused")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="write a jax.profiler trace (with a Perfetto trace.json.gz) of two steps "
                        "of each jaxformer candidate under DIR/MODEL/CANDIDATE")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.jax_variants = [v.strip() for v in args.jax_variants.split(",") if v.strip()]
    for m in args.models:
        if m not in WORKLOADS:
            p.error(f"unknown model {m!r}; choose from {', '.join(WORKLOADS)}")
    for v in args.jax_variants:
        for part in v.split("+"):
            if part not in VARIANTS:
                p.error(f"unknown jax variant {part!r} in {v!r}; choose from "
                        f"{', '.join(VARIANTS)}")
    if not 0.0 <= args.dropout < 1.0:
        p.error(f"--dropout must lie in [0, 1), got {args.dropout}")
    if args.dropout and not args.jax_only:
        p.error("--dropout above 0 needs --jax-only: torch draws other masks than JAX, so the "
                "first-step losses would not match")
    if args.updates_per_call < 1:
        p.error(f"--updates-per-call must be at least 1, got {args.updates_per_call}")
    if args.compile_helper:
        if args.device != "cpu":
            p.error("--compile-helper is for the CPU backend")
        for v in args.jax_variants:
            if set(variant(v)) & {*SWITCHES, "compiler_options"}:
                p.error(f"--compile-helper: the helper compiles the model's own step, not "
                        f"variant {v!r}'s (it changes the environment, the precision, the "
                        f"compiler options or how the step is called)")
    if args.profile and args.device == "cpu":  # XLA:CPU records its operations in the trace
        args.xla_flags = f"{args.xla_flags} {CPU_OP_EVENTS}".strip()  # only when asked to
    if args.quick:
        args.repeats, args.warmup = min(args.repeats, 2), min(args.warmup, 1)
        args.peak_size, args.peak_repeats = args.peak_size or 256, min(args.peak_repeats, 2)
        args.tag = args.tag or "quick"
    return args


def main(argv=None):
    args = parse_args(argv)
    bench = harness.start(args, "train", title="Training step (fwd + bwd + AdamW): jaxformer "
                                               "(jit) vs torch_ref (eager, torch.compile)")
    if bench is None:
        return 0
    bench.footnote = ("Candidates: jaxformer.training.step.TrainStep (one jitted update, buffers "
                      "donated); torch_ref.training.step.TrainStep on the eager and on the "
                      f"compiled model. Dropout {args.dropout:g}, the same weights and batch; "
                      "first-step losses "
                      f"equal to {LOSS_RTOL[args.dtype]} (checked). jaxformer attention: "
                      f"`{args.attention_implementation}`.")
    if args.compile_helper:
        bench.footnote += (" jaxformer's steps compiled by a helper process and loaded from "
                           "the compilation cache (`--compile-helper`), as `jaxformer train` "
                           "has them on the CPU.")
    rc = 1
    with contextlib.ExitStack() as stack:
        if args.compile_helper:  # a new cache: every step is compiled by a helper
            os.environ["JAXFORMER_COMPILATION_CACHE"] = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="bench-train-cache-"))
            from jaxformer import runtime

            print(f"compilation cache: {runtime.enable_compilation_cache()}", flush=True)
        for name in args.models:
            bench.add(name, bench_workload(name, args, bench))
            rc = bench.finish()  # after every case: a run stopped later keeps the finished cases
    return rc


if __name__ == "__main__":
    sys.exit(main())
