#!/usr/bin/env python
"""Forward-pass benchmark: jaxformer (jitted) against its torch_ref twin (eager), same weights.

For each model the torch_ref twin is built from a seed and its ``state_dict`` loaded into the
jaxformer model (``jaxformer.parity.twin``); both run in eval mode on the same inputs (token ids
and an attention mask with right padding in all rows but the first) and their outputs are compared
once, so the two timed programs are known to compute the same thing. jaxformer runs through
``jaxformer.nn.jit.jitted`` (split once, a jitted pure function of the state), torch_ref eagerly
under ``torch.inference_mode()``. Timing, environment, matmul peak and result files: the shared
harness (benchmarks/harness.py); FLOPs: ``jaxformer.models.flops``; method in benchmarks/README.md.

    python benchmarks/bench_forward.py --models bert --repeats 20
    python benchmarks/bench_forward.py --attention-implementation einsum --tag einsum
    python benchmarks/bench_forward.py --device gpu --dtype bfloat16      # skips without CUDA
"""

from __future__ import annotations

import dataclasses
import sys
import time

import harness

# Shapes fixed by the first benchmark issue; the encoder-decoder uses source and target length
# 128 (a typical WMT sentence-pair bucket) and its tokens are source + target tokens.
MODELS = {
    "bert": dict(module="bert", cls="BertModel", config="BertConfig", preset="base",
                 label="BERT-base (BertModel)", batch=8, seq=128),
    "gpt2": dict(module="gpt", cls="GPT", config="GPTConfig", preset="gpt2",
                 label="GPT-2 small (GPT, LM logits)", batch=8, seq=256),
    "transformer": dict(module="encoder_decoder", cls="Transformer", config="TransformerConfig",
                        preset="base", label="Transformer base (enc-dec, logits)", batch=8,
                        seq=128, tgt_seq=128),
}


def padding_attention_mask(batch: int, seq: int, rng):
    """``[batch, seq]`` int32, 1 = real token: row 0 full, the others right-padded to lengths
    spread between seq and seq/2 (about 3/4 of all positions real)."""
    import numpy as np
    lengths = np.linspace(seq, seq // 2, batch).round().astype(int)
    lengths[1:] = np.minimum(lengths[1:], seq - 1)
    rng.shuffle(lengths[1:])
    return (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)


def make_inputs(name, cfg, B, T, T_tgt, seed=0):
    """The positional call arguments (numpy, the same for both frameworks); the last one or
    two are the attention masks."""
    import numpy as np
    rng = np.random.RandomState(seed)
    if name == "transformer":
        src_mask = padding_attention_mask(B, T, rng)
        tgt_mask = padding_attention_mask(B, T_tgt, rng)
        src = np.where(src_mask, rng.randint(1, cfg.src_vocab_size, (B, T)), cfg.src_pad_id)
        tgt = np.where(tgt_mask, rng.randint(1, cfg.tgt_vocab_size, (B, T_tgt)), cfg.tgt_pad_id)
        return (src.astype(np.int32), tgt.astype(np.int32), src_mask, tgt_mask)
    mask = padding_attention_mask(B, T, rng)
    ids = np.where(mask, rng.randint(1, cfg.vocab_size, (B, T)), cfg.pad_token_id)
    if name == "gpt2":
        return (ids.astype(np.int32), mask)
    segment = (np.arange(T)[None, :] >= mask.sum(1)[:, None] // 2) & mask.astype(bool)
    return (ids.astype(np.int32), segment.astype(np.int32), mask)  # bert: two segments


def first_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out  # BERT: (sequence, pooled)


def bench_model(name, args, bench):
    import importlib

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from jaxformer import config as jconfig
    from jaxformer.models import flops
    from jaxformer.nn.jit import jitted
    from jaxformer.parity import twin

    spec = MODELS[name]
    B, T = args.batch or spec["batch"], args.seq or spec["seq"]
    T_tgt = (args.seq or spec["tgt_seq"]) if "tgt_seq" in spec else None
    preset = args.preset or spec["preset"]
    cfg = getattr(getattr(jconfig, spec["config"]), preset)()
    # The shared config: compute dtype (read by jaxformer; torch_ref casts below) and attention.
    cfg = dataclasses.replace(cfg, dtype=args.dtype,
                              attention_implementation=args.attention_implementation)
    tcls = getattr(importlib.import_module(f"torch_ref.models.{spec['module']}"), spec["cls"])
    jcls = getattr(importlib.import_module(f"jaxformer.models.{spec['module']}"), spec["cls"])
    tmodel, jmodel = twin(tcls, jcls, cfg, args.seed)
    tmodel = tmodel.to(device=bench.tdev, dtype=getattr(torch, args.dtype))
    forward = jitted(jmodel)
    # Parameters held in the benchmark dtype, cast once here: no per-call casts are timed.
    forward.params = jax.device_put(jax.tree.map(
        lambda x: x.astype(args.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
        forward.params), bench.jdev)

    inputs = make_inputs(name, cfg, B, T, T_tgt, seed=args.seed)
    jin = tuple(jax.device_put(x, bench.jdev) for x in inputs)
    tin = tuple(torch.from_numpy(x.astype(np.int64)).to(bench.tdev) for x in inputs)

    def run_jax():
        return jax.block_until_ready(forward(*jin))

    def run_torch():
        with torch.inference_mode():
            out = tmodel(*tin)
        bench.sync()
        return out

    # Compile once ahead of the calls, for its time and XLA's own FLOP count.
    t0 = time.perf_counter()
    compiled = forward.lower(*jin).compile()
    compile_s = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    xla_flop = float(cost["flops"]) if cost and "flops" in cost else None

    real = inputs[-1].astype(bool)  # compare the output at real (target) positions only
    jout = np.asarray(first_output(run_jax()), dtype=np.float32)[real]
    tout = first_output(run_torch()).float().cpu().numpy()[real]
    max_diff = float(np.abs(jout - tout).max() / max(1.0, np.abs(tout).max()))

    tokens = B * T + (B * T_tgt if T_tgt else 0)
    case = bench.measure({"jaxformer": run_jax, "torch_ref": run_torch}, baseline="torch_ref",
                         tokens=tokens, flop=flops.forward_flops(cfg, B, T, T_tgt),
                         frameworks={"jaxformer": "jax", "torch_ref": "torch"})
    label = spec["label"] if preset == spec["preset"] else f"{spec['cls']} ({preset})"
    case.update(
        model=name, label=label, config=f"{spec['config']}.{preset}()",
        batch=B, seq=T, **({"tgt_seq": T_tgt} if T_tgt else {}),
        shape=f"{B} x {T}" + (f"+{T_tgt}" if T_tgt else ""),
        real_tokens_per_call=int(sum(m.sum() for m in inputs[-2 if T_tgt else -1:])),
        xla_cost_analysis_flop=xla_flop, jax_compile_s=compile_s, max_rel_output_diff=max_diff,
        attention_implementation=cfg.attention_implementation,
        notes={"XLA cost-analysis GFLOP": harness.fmt(xla_flop and xla_flop / 1e9, ".4g"),
               "jax compile s": f"{compile_s:.1f}", "max rel. output diff": f"{max_diff:.1e}"})
    return case


def parse_args(argv=None):
    p = harness.argument_parser(__doc__)
    p.add_argument("--models", default="bert,gpt2,transformer",
                   help="comma-separated subset of: " + ", ".join(MODELS))
    p.add_argument("--batch", type=int, default=None, help="override every model's batch size")
    p.add_argument("--seq", type=int, default=None, help="override every model's length(s)")
    p.add_argument("--preset", default=None,
                   help="config preset for every model instead of its own (e.g. tiny, for a "
                        "quick check of the script)")
    p.add_argument("--attention-implementation", "--jax-attention", default="auto",
                   choices=("auto", "xla", "cudnn", "einsum"),
                   help="config.attention_implementation, read by both twins (torch_ref: "
                        "einsum is its explicit path, every other value SDPA)")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in args.models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    bench = harness.start(args, "forward",
                          title="Forward pass: jaxformer (jit) vs torch_ref (eager)")
    if bench is None:
        return 0
    bench.footnote = (f"jaxformer attention: `{args.attention_implementation}`. Tokens/s counts "
                      "every position of the batch, padding included (source + target for the "
                      "encoder-decoder).")
    for name in args.models:
        bench.add(name, bench_model(name, args, bench))
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
