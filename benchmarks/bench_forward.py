#!/usr/bin/env python
"""Forward-pass benchmark: jaxformer (jitted) against its torch_ref twin (eager), same weights.

For each model the torch_ref twin is built from a seed, its ``state_dict`` is loaded into the
jaxformer model with ``convert.torch_to_nnx`` and both run in eval mode on the same inputs (token
ids and an attention mask with right padding in all rows but the first). Both outputs are compared
once, so the two timed programs are known to compute the same thing.

jaxformer is jitted the fast way (DESIGN.md, "Speed idioms"): ``nnx.split`` once, then a
``jax.jit``-ed pure function that calls ``nnx.merge`` inside; the parameter state is an argument,
not a baked-in constant. torch_ref runs eagerly under ``torch.inference_mode()``.

Timing: warm-up calls first (the first jax call compiles; its time is reported apart), then
``--repeats`` rounds; each round times one jax call and one torch call, in alternating order
(ABBA), so machine noise hits both alike. Every jax call ends in ``jax.block_until_ready``, every
CUDA torch call in ``torch.cuda.synchronize()``. Reported: median, min, interquartile range, the
speed ratio jaxformer/torch (= torch median time / jax median time; > 1 means jaxformer is faster)
and the median of the per-round ratios, tokens/s and MFU.

MFU = model FLOPs per second / the device's measured matmul peak. The peak is the best rate of a
large square matmul (``--peak-size``, in the benchmark dtype) measured in each framework in the
same run; the device peak is the larger of the two. Model FLOPs are counted analytically (see
``flops_*`` below and benchmarks/README.md): 2 FLOPs per multiply-add of every matmul that runs,
padded positions included (the dense computation is what both frameworks execute); the causal
mask does not halve the attention FLOPs, because neither implementation skips masked blocks here.

Examples::

    python benchmarks/bench_forward.py --models bert --repeats 20
    python benchmarks/bench_forward.py --models bert,gpt2,transformer --device cpu --dtype float32
    python benchmarks/bench_forward.py --device gpu --dtype bfloat16      # skips without CUDA

Results go to ``--out`` (default benchmarks/results) as ``<device>_<dtype>_<date>.json`` and
``.md``; models measured in separate runs on the same day are merged into one file.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# ----------------------------------------------------------------------------- model specs

# Shapes fixed by the issue. The encoder-decoder uses source and target length 128 (a typical
# WMT sentence-pair bucket); its "tokens" are source + target tokens.
MODELS = {
    "bert": dict(module="bert", cls="BertModel", config="BertConfig", preset="base",
                 label="BERT-base (BertModel)", batch=8, seq=128),
    "gpt2": dict(module="gpt", cls="GPT", config="GPTConfig", preset="gpt2",
                 label="GPT-2 small (GPT, LM logits)", batch=8, seq=256),
    "transformer": dict(module="encoder_decoder", cls="Transformer", config="TransformerConfig",
                        preset="base", label="Transformer base (enc-dec, logits)", batch=8,
                        seq=128, tgt_seq=128),
}


def flops_bert(cfg, B, T, **_):
    """BertModel: per layer 4 C^2 (q, k, v, out) + 2 C I (FFN) weights per token, attention
    QK^T and AV 2 * 2 B T^2 C, plus the pooler dense on the B [CLS] vectors."""
    C, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    per_layer = 2 * B * T * (4 * C * C + 2 * C * I) + 4 * B * T * T * C
    return L * per_layer + 2 * B * C * C


def flops_gpt(cfg, B, T, **_):
    """GPT: L blocks as in BERT (full T x T attention, causal mask applied densely) + LM head
    2 B T C V."""
    C, I, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.vocab_size
    per_layer = 2 * B * T * (4 * C * C + 2 * C * I) + 4 * B * T * T * C
    return L * per_layer + 2 * B * T * C * V


def flops_transformer(cfg, B, T, T_tgt, **_):
    """Encoder: Le layers on S = T source tokens (as BERT). Decoder: Ld layers on T_tgt tokens:
    self-attention 4 C^2 + cross-attention q/out 2 C^2 per target token, cross k/v 2 C^2 per
    source token, FFN 2 C I, attention 4 B Tt^2 C (self) + 4 B Tt S C (cross); LM head 2 B Tt C V."""
    C, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.tgt_vocab_size
    S, Tt = T, T_tgt
    enc = 2 * B * S * (4 * C * C + 2 * C * I) + 4 * B * S * S * C
    dec = (2 * B * Tt * (4 * C * C + 2 * C * C + 2 * C * I) + 2 * B * S * (2 * C * C)
           + 4 * B * Tt * Tt * C + 4 * B * Tt * S * C)
    return cfg.num_encoder_layers * enc + cfg.num_decoder_layers * dec + 2 * B * Tt * C * V


FLOPS = {"bert": flops_bert, "gpt2": flops_gpt, "transformer": flops_transformer}


def padding_attention_mask(batch: int, seq: int, rng):
    """``[batch, seq]`` int32, 1 = real token: row 0 full, the others right-padded to lengths
    spread between seq and seq/2 (about 3/4 of all positions real)."""
    import numpy as np
    lengths = np.linspace(seq, seq // 2, batch).round().astype(int)
    lengths[1:] = np.minimum(lengths[1:], seq - 1)
    rng.shuffle(lengths[1:])
    return (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)


def make_inputs(name, cfg, B, T, T_tgt, seed=0):
    """The positional call arguments (numpy, same for both frameworks) for model ``name``."""
    import numpy as np
    rng = np.random.RandomState(seed)
    if name == "bert":
        mask = padding_attention_mask(B, T, rng)
        ids = np.where(mask, rng.randint(1, cfg.vocab_size, (B, T)), cfg.pad_token_id)
        lengths = mask.sum(1)
        token_type = (np.arange(T)[None, :] >= (lengths[:, None] // 2)) & mask.astype(bool)
        return (ids.astype(np.int32), token_type.astype(np.int32), mask)
    if name == "gpt2":
        mask = padding_attention_mask(B, T, rng)
        ids = np.where(mask, rng.randint(0, cfg.vocab_size, (B, T)), cfg.pad_token_id)
        return (ids.astype(np.int32), mask)
    if name == "transformer":
        src_mask = padding_attention_mask(B, T, rng)
        tgt_mask = padding_attention_mask(B, T_tgt, rng)
        src = np.where(src_mask, rng.randint(1, cfg.src_vocab_size, (B, T)), cfg.src_pad_id)
        tgt = np.where(tgt_mask, rng.randint(1, cfg.tgt_vocab_size, (B, T_tgt)), cfg.tgt_pad_id)
        return (src.astype(np.int32), tgt.astype(np.int32), src_mask, tgt_mask)
    raise ValueError(name)


def real_positions(name, inputs):
    """Boolean ``(B, T_out)``: output positions that carry meaning (for the parity check)."""
    return inputs[-1].astype(bool)


# ----------------------------------------------------------------------------- candidate

def attention_bhtd_bias(q, k, v, mask=None, dropout=None, implementation="auto"):
    """A candidate for ``jaxformer.layers.attention`` (``--jax-attention bhtd_bias``), measured in
    benchmarks/README.md: heads moved in front (``(B, nh, T, hs)``, the layout torch_ref gives
    SDPA) so both products are plain batched matmuls, and the boolean mask applied as an additive
    ``MASK_VALUE`` bias, as torch_ref does. Same result as the ``where`` form: a real score plus 0
    is unchanged, and a masked score plus MASK_VALUE rounds to MASK_VALUE. On XLA:CPU the additive
    form lets YNNPACK fuse the whole attention (both products and the softmax) into one kernel."""
    import math

    import jax
    import jax.numpy as jnp

    from jaxformer.masks import MASK_VALUE
    dropping = dropout is not None and not dropout.deterministic and dropout.rate > 0
    qh, kh, vh = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # (B, nh, T|S, hs)
    scores = jnp.einsum("bhtd,bhsd->bhts", qh, kh, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + jnp.where(mask, 0.0, MASK_VALUE).astype(jnp.float32)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    if dropping:
        weights = dropout(weights)
    return jnp.swapaxes(jnp.einsum("bhts,bhsd->bhtd", weights, vh), 1, 2)  # (B, T, nh, hs)


def fused_qkv_call(self, hidden_states, context=None, mask=None):
    """A candidate ``MultiHeadAttention.__call__`` (``--jax-fused-qkv``): the q, k and v kernels
    (still three ``nnx.Linear`` parameters, so conversion is unchanged) are concatenated inside
    the jitted function and applied as one ``[C, 3C]`` matmul (``[C, 2C]`` for k, v in
    cross-attention)."""
    import jax.numpy as jnp

    from jaxformer import layers as jlayers

    def fused(x, linears):
        kernel = jnp.concatenate([lin.kernel[...] for lin in linears], axis=1)
        bias = jnp.concatenate([lin.bias[...] for lin in linears])
        dtype = linears[0].dtype or x.dtype
        y = jnp.dot(x.astype(dtype), kernel.astype(dtype)) + bias.astype(dtype)
        return jnp.split(y, len(linears), axis=-1)

    B, T, C = hidden_states.shape
    if context is None:
        S = T
        q, k, v = fused(hidden_states, (self.query, self.key, self.value))
    else:
        S = context.shape[1]
        q = self.query(hidden_states)
        k, v = fused(context, (self.key, self.value))
    q = q.reshape(B, T, self.num_heads, self.head_dim)
    k = k.reshape(B, S, self.num_heads, self.head_dim)
    v = v.reshape(B, S, self.num_heads, self.head_dim)
    y = jlayers.attention(q, k, v, mask, self.attention_dropout, self.implementation)
    return self.output(y.reshape(B, T, C))


# ----------------------------------------------------------------------------- statistics

def summarize(times):
    import numpy as np
    t = np.asarray(times)
    q25, q50, q75 = np.percentile(t, [25, 50, 75])
    return {"median_s": float(q50), "min_s": float(t.min()), "max_s": float(t.max()),
            "p25_s": float(q25), "p75_s": float(q75),
            "iqr_pct": float(100 * (q75 - q25) / q50), "n": int(t.size),
            "times_s": [float(x) for x in t]}


def time_interleaved(fns, repeats, clock="wall"):
    """``fns``: {label: zero-arg callable that returns when its work is done}. Each round runs
    every callable once, the order alternating round by round (ABBA); returns
    ({label: [seconds on ``clock``]}, {label: [seconds on the other clock]}). ``clock="cpu"`` is
    process CPU time (all threads): on a shared machine, single-threaded runs timed this way do
    not see time-slicing by other processes."""
    labels = list(fns)
    wall = {k: [] for k in labels}
    cpu = {k: [] for k in labels}
    for r in range(repeats):
        order = labels if r % 2 == 0 else labels[::-1]
        for k in order:
            c0, t0 = time.process_time(), time.perf_counter()
            fns[k]()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return (cpu, wall) if clock == "cpu" else (wall, cpu)


# ----------------------------------------------------------------------------- environment

def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_details() -> str:
    """Family/model and the vector ISA that matters for matmuls (from /proc/cpuinfo)."""
    try:
        info = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if ":" in line:
                k, v = (x.strip() for x in line.split(":", 1))
                info.setdefault(k, v)
        flags = set(info.get("flags", "").split())
        isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
        return f"family {info.get('cpu family')} model {info.get('model')}, {' '.join(isa)}"
    except OSError:
        return ""


def slug(text: str) -> str:
    out = "".join(c.lower() if c.isalnum() else "-" for c in text)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")


def environment(args, jax, torch, jdev, tdev):
    import flax
    import jaxlib
    import numpy as np
    env = {
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
                     "flax": flax.__version__, "torch": torch.__version__,
                     "numpy": np.__version__},
        "device": args.device,
        "dtype": args.dtype,
        "jax_device": str(jdev),
        "jax_device_kind": jdev.device_kind,
        "torch_device": str(tdev),
        "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
        "jax_enable_x64": bool(jax.config.jax_enable_x64),
        "torch_float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch_cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "torch_cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""),
        "jax_attention": args.jax_attention,
        "jax_fused_qkv": args.jax_fused_qkv,
        "clock": args.clock,
        "cpu": cpu_name(),
        "cpu_details": cpu_details(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "jax_cpu_threads": "XLA:CPU's intra-op pool: one thread per core in the affinity mask",
        "torch_mkldnn": bool(torch.backends.mkldnn.is_available()),
        "torch_mkl": bool(torch.backends.mkl.is_available()),
    }
    if args.device == "gpu":
        env["gpu"] = torch.cuda.get_device_name(tdev)
    return env


def cpu_busy_s():
    """Seconds of CPU time used by the whole machine since boot (all cores; /proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class ForeignLoad:
    """Average number of cores that *other* processes kept busy while the block ran: machine
    CPU time (/proc/stat) minus this process's own CPU time, over the wall time."""

    def __enter__(self):
        self.m0, self.p0, self.t0 = cpu_busy_s(), time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        m1, p1, t1 = cpu_busy_s(), time.process_time(), time.perf_counter()
        self.cores = (None if self.m0 is None or m1 is None else
                      max(0.0, ((m1 - self.m0) - (p1 - self.p0)) / (t1 - self.t0)))


def wait_for_quiet(max_wait_s: float, max_foreign_cores: float = 0.25, sample_s: float = 3.0):
    """Wait (at most ``max_wait_s``) until other processes use under ``max_foreign_cores``
    cores over a ``sample_s`` window; returns the last measured foreign load."""
    deadline = time.perf_counter() + max_wait_s
    while True:
        with ForeignLoad() as fl:
            time.sleep(sample_s)
        if fl.cores is None or fl.cores < max_foreign_cores or time.perf_counter() > deadline:
            return fl.cores
        print(f"  waiting for a quiet machine (other processes use {fl.cores:.2f} cores)",
              flush=True)


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ----------------------------------------------------------------------------- matmul peak

def measure_peak(jax, jnp, torch, jdev, tdev, n, dtype_name, repeats, sync, clock="wall"):
    """Best FLOP/s of an ``n x n @ n x n`` matmul in each framework (interleaved rounds)."""
    import numpy as np
    rng = np.random.RandomState(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    ja = jax.device_put(jnp.asarray(a, dtype_name), jdev)
    jb = jax.device_put(jnp.asarray(b, dtype_name), jdev)
    tdt = getattr(torch, dtype_name)
    ta, tb = (torch.from_numpy(x).to(device=tdev, dtype=tdt) for x in (a, b))
    jmm = jax.jit(jnp.matmul)

    def run_jax():
        jmm(ja, jb).block_until_ready()

    def run_torch():
        torch.mm(ta, tb)
        sync()

    with torch.inference_mode():
        for _ in range(2):
            run_jax()
            run_torch()
        times, _ = time_interleaved({"jax": run_jax, "torch": run_torch}, repeats, clock)
    flop = 2.0 * n ** 3
    out = {"size": n, "dtype": dtype_name, "flop": flop, "repeats": repeats}
    for k, v in times.items():
        s = summarize(v)
        del s["times_s"]
        out[k] = {"best_flops": flop / s["min_s"], "median_flops": flop / s["median_s"], **s}
    out["device_peak_flops"] = max(out["jax"]["best_flops"], out["torch"]["best_flops"])
    return out


# ----------------------------------------------------------------------------- one model

def build_pair(name, args, jax, jnp, torch, nnx, jdev, tdev):
    spec = MODELS[name]
    from jaxformer import config as jconfig
    from jaxformer import convert
    cfg = getattr(getattr(jconfig, spec["config"]), spec["preset"])()
    jmod = importlib.import_module(f"jaxformer.{spec['module']}")
    tmod = importlib.import_module(f"torch_ref.{spec['module']}")

    torch.manual_seed(args.seed)
    tmodel = getattr(tmod, spec["cls"])(cfg).eval()  # float32 weights, torch_ref's init
    jcfg = dataclasses.replace(cfg, dtype=args.dtype)  # compute dtype; parameters float32
    jmodel = getattr(jmod, spec["cls"])(jcfg, rngs=nnx.Rngs(args.seed))
    convert.torch_to_nnx(tmodel.state_dict(), jmodel)
    jmodel.eval()
    if args.jax_attention == "bhtd_bias":
        from jaxformer import layers as jlayers
        jlayers.attention = attention_bhtd_bias  # experiment only: see the function's docstring
    if args.jax_fused_qkv:
        from jaxformer import layers as jlayers
        jlayers.MultiHeadAttention.__call__ = fused_qkv_call  # experiment only
    if args.jax_attention not in ("auto", "bhtd_bias"):
        n = 0
        for _, m in nnx.iter_modules(jmodel):
            if hasattr(m, "implementation"):
                m.implementation = args.jax_attention
                n += 1
        assert n > 0, "no attention module found"

    # Both sides hold the weights in the benchmark dtype (torch: .to(dtype); jax: the state is
    # cast once here, outside the timed function, so no per-call parameter casts are timed).
    tdt = getattr(torch, args.dtype)
    tmodel = tmodel.to(device=tdev, dtype=tdt)
    graphdef, state = nnx.split(jmodel)
    state = jax.tree.map(
        lambda x: x.astype(args.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    state = jax.device_put(state, jdev)

    @jax.jit
    def jforward(state, *inputs):
        return nnx.merge(graphdef, state)(*inputs)

    return cfg, tmodel, jforward, state


def first_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def bench_model(name, args, jax, jnp, torch, nnx, jdev, tdev, sync, peak):
    import numpy as np
    spec = MODELS[name]
    B = args.batch or spec["batch"]
    T = args.seq or spec["seq"]
    T_tgt = args.seq or spec.get("tgt_seq", T)
    cfg, tmodel, jforward, state = build_pair(name, args, jax, jnp, torch, nnx, jdev, tdev)
    inputs = make_inputs(name, cfg, B, T, T_tgt, seed=args.seed)
    jin = tuple(jax.device_put(x, jdev) for x in inputs)
    tin = tuple(torch.from_numpy(x.astype(np.int64)).to(tdev) for x in inputs)

    def run_jax():
        return jax.block_until_ready(jforward(state, *jin))

    def run_torch():
        out = tmodel(*tin)
        sync()
        return out

    t0 = time.perf_counter()
    compiled = jforward.lower(state, *jin).compile()
    compile_s = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    xla_flops = float(cost.get("flops", float("nan"))) if cost else float("nan")

    with torch.inference_mode():
        jout = first_output(run_jax())
        tout = first_output(run_torch())
        where = real_positions(name, inputs)
        je = np.asarray(jout, dtype=np.float32)[where]
        te = tout.float().cpu().numpy()[where]
        max_diff = float(np.abs(je - te).max() / max(1.0, np.abs(te).max()))
        for _ in range(args.warmup):
            run_jax()
            run_torch()
        best = None
        for attempt in range(1 + max(0, args.retries)):
            quiet = (wait_for_quiet(args.wait_quiet, args.max_foreign) if args.wait_quiet > 0
                     else None)
            load_before = loadavg()
            with ForeignLoad() as foreign:
                timed = time_interleaved({"jaxformer": run_jax, "torch_ref": run_torch},
                                         args.repeats, args.clock)
            load_after = loadavg()
            if best is None or (foreign.cores or 0.0) < (best[3].cores or 0.0):
                best = (timed, quiet, load_before, foreign, load_after, attempt)
            if foreign.cores is None or foreign.cores <= args.max_foreign:
                break
            print(f"  {name}: other processes used {foreign.cores:.2f} cores during timing "
                  f"(> {args.max_foreign}); timing again", flush=True)
        (times, other), quiet, load_before, foreign, load_after, attempt = best

    # The peak again after the model: on a shared machine one measurement can land in a busy
    # moment; the device peak is the best rate seen in either.
    peak = dict(peak)
    peak["after"] = measure_peak(jax, jnp, torch, jdev, tdev, peak["size"], peak["dtype"],
                                 peak["repeats"], sync, args.clock)
    for fw in ("jax", "torch"):
        peak[fw] = dict(peak[fw])
        peak[fw]["best_flops"] = max(peak[fw]["best_flops"], peak["after"][fw]["best_flops"])
    peak["device_peak_flops"] = max(peak["jax"]["best_flops"], peak["torch"]["best_flops"])
    flop = FLOPS[name](cfg, B=B, T=T, T_tgt=T_tgt)
    masks = inputs[-2:] if name == "transformer" else inputs[-1:]
    tokens = B * T + (B * T_tgt if name == "transformer" else 0)
    res = {"model": name, "label": spec["label"], "config": f"{spec['config']}.{spec['preset']}()",
           "batch": B, "seq": T, **({"tgt_seq": T_tgt} if name == "transformer" else {}),
           "tokens_per_call": tokens, "real_tokens_per_call": int(sum(m.sum() for m in masks)),
           "model_flop": flop, "xla_cost_analysis_flop": xla_flops,
           "jax_compile_s": compile_s, "max_rel_output_diff": max_diff,
           "loadavg_before": load_before, "loadavg_after": load_after,
           "foreign_cores_during_timing": foreign.cores, "foreign_cores_before": quiet,
           "timing_attempts": attempt + 1,
           "measured_at_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "peak": peak}
    for k, v in times.items():
        s = summarize(v)
        s["tokens_per_s"] = tokens / s["median_s"]
        s["model_flops_per_s"] = flop / s["median_s"]
        s["mfu"] = s["model_flops_per_s"] / peak["device_peak_flops"]
        fw_peak = peak["jax" if k == "jaxformer" else "torch"]["best_flops"]
        s["mfu_own_framework_peak"] = s["model_flops_per_s"] / fw_peak
        o = summarize(other[k])
        s[f"{'wall' if args.clock == 'cpu' else 'cpu'}_time"] = {
            key: o[key] for key in ("median_s", "min_s", "p25_s", "p75_s")}
        res[k] = s
    tj, tt = np.asarray(times["jaxformer"]), np.asarray(times["torch_ref"])
    res["speed_ratio"] = float(np.median(tt) / np.median(tj))
    res["speed_ratio_paired_median"] = float(np.median(tt / tj))
    res["speed_ratio_best"] = float(tt.min() / tj.min())
    return res


# ----------------------------------------------------------------------------- report

def _fmt(x, spec=".2f"):
    return "n/a" if x is None else format(x, spec)


def markdown(report) -> str:
    env = report["environment"]
    lines = [f"# Forward pass: jaxformer (jit) vs torch_ref (eager), {env['device']} {env['dtype']}",
             "",
             f"- device: {env.get('gpu') or env['cpu']} ({env.get('cpu_details', '')}; "
             f"{env['cpu_count']} logical CPUs, "
             f"affinity {env['cpu_affinity']}); jax device `{env['jax_device']}`, torch device "
             f"`{env['torch_device']}`",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
             + f", python {env['python']}",
             f"- dtype {env['dtype']} (weights and compute, both frameworks); "
             f"jax_default_matmul_precision={env['jax_default_matmul_precision']}, "
             f"jax_enable_x64={env['jax_enable_x64']}; torch float32_matmul_precision="
             f"{env['torch_float32_matmul_precision']}, cuda.matmul.allow_tf32="
             f"{env['torch_cuda_matmul_allow_tf32']}, cudnn.allow_tf32={env['torch_cudnn_allow_tf32']}",
             f"- threads: torch {env['torch_num_threads']} intra-op / "
             f"{env['torch_num_interop_threads']} inter-op; jax: {env['jax_cpu_threads']}; "
             f"XLA_FLAGS=`{env['XLA_FLAGS'] or '(unset)'}`; jaxformer attention: "
             f"{env['jax_attention']}{' + fused qkv (experiment)' if env.get('jax_fused_qkv') else ''}",
             f"- timing: {env.get('clock', 'wall')} clock, {report['warmup']} warm-up calls after "
             f"compiling, {report['repeats']} interleaved rounds (ABBA); median [p25-p75]",
             "- ratio = jaxformer speed / torch_ref speed (> 1: jaxformer faster): of the medians; "
             "the median of the per-round ratios; of the best times",
             "",
             "| model | batch x len | framework | median ms [p25-p75] | min ms | tokens/s | "
             "model GFLOP/s | MFU | ratio jax/torch (medians; paired; best) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in report["results"].items():
        shape = f"{r['batch']} x {r['seq']}" + (f"+{r['tgt_seq']}" if "tgt_seq" in r else "")
        for k in ("jaxformer", "torch_ref"):
            s = r[k]
            first = k == "jaxformer"
            ratio = (f"**{r['speed_ratio']:.3f}**; {r['speed_ratio_paired_median']:.3f}; "
                     f"{r['speed_ratio_best']:.3f}" if first else "")
            lines.append(
                f"| {r['label'] if first else ''} | {shape if first else ''} | {k} | "
                f"{1e3 * s['median_s']:.1f} [{1e3 * s['p25_s']:.1f}-{1e3 * s['p75_s']:.1f}] | "
                f"{1e3 * s['min_s']:.1f} | {s['tokens_per_s']:,.0f} | "
                f"{s['model_flops_per_s'] / 1e9:.1f} | {100 * s['mfu']:.1f}% | {ratio} |")
    lines += ["", "| model | model GFLOP/call | XLA cost-analysis GFLOP | matmul peak jax / torch "
              "(GFLOP/s, best) | device peak | jax compile s | max rel. output diff | "
              "other processes' cores during timing | load avg before / after | measured at (UTC) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in report["results"].items():
        p = r["peak"]
        lines.append(
            f"| {name} | {r['model_flop'] / 1e9:.1f} | {r['xla_cost_analysis_flop'] / 1e9:.1f} | "
            f"{p['jax']['best_flops'] / 1e9:.1f} / {p['torch']['best_flops'] / 1e9:.1f} "
            f"({p['size']}^3 {p['dtype']}) | {p['device_peak_flops'] / 1e9:.1f} | "
            f"{r['jax_compile_s']:.1f} | {r['max_rel_output_diff']:.1e} | "
            f"{_fmt(r.get('foreign_cores_during_timing'))} | "
            f"{r['loadavg_before']} / {r['loadavg_after']} | {r['measured_at_utc']} |")
    commands = sorted({r.get("command", report["command"]) for r in report["results"].values()})
    lines += ["", "Command" + ("s" if len(commands) > 1 else "") + ": "
              + "; ".join(f"`{c}`" for c in commands), "",
              "MFU = model FLOPs per call / median time / device peak (the better framework's "
              "best square-matmul rate, measured before and after each model in the same run). "
              "Model FLOPs: 2 per multiply-add of every executed matmul (padding included, full "
              "T x T attention under the causal mask); formulas in benchmarks/README.md. "
              "Tokens/s counts every position of the batch (source + target for the "
              "encoder-decoder).", ""]
    return "\n".join(lines)


def write_report(report, out_dir: Path, merge: bool):
    out_dir.mkdir(parents=True, exist_ok=True)
    env = report["environment"]
    dev = env.get("gpu") or f"{env['cpu']} {env['cpu_affinity']}c"
    stem = f"{env['device']}-{slug(dev)}_{env['dtype']}_{env['date_utc'][:10]}"
    if report.get("tag"):
        stem += f"_{slug(report['tag'])}"
    path = out_dir / f"{stem}.json"
    if merge and path.exists():
        old = json.loads(path.read_text())
        old_results = old.get("results", {})
        old_results.update(report["results"])
        report = {**report, "results": {k: old_results[k] for k in MODELS if k in old_results}}
    path.write_text(json.dumps(report, indent=1) + "\n")
    (out_dir / f"{stem}.md").write_text(markdown(report))
    return path


# ----------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="bert,gpt2,transformer",
                   help="comma-separated subset of: " + ", ".join(MODELS))
    p.add_argument("--repeats", type=int, default=15, help="timed rounds (default 15)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls after compiling")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    p.add_argument("--batch", type=int, default=None, help="override every model's batch size")
    p.add_argument("--seq", type=int, default=None, help="override every model's length(s)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: torch's own, one per core)")
    p.add_argument("--matmul-precision", choices=("highest", "default"), default="highest",
                   help="highest: jax_default_matmul_precision=highest and TF32 off in torch "
                        "(exact float32, as in the parity suite); default: both frameworks' "
                        "defaults (TF32 on GPU in jax; torch then allows TF32 too)")
    p.add_argument("--jax-attention", choices=("auto", "xla", "einsum", "bhtd_bias"),
                   default="auto",
                   help="MultiHeadAttention.implementation for jaxformer (auto = the model's); "
                        "bhtd_bias swaps in the candidate attention_bhtd_bias (an experiment)")
    p.add_argument("--jax-fused-qkv", action="store_true",
                   help="experiment: swap in the candidate fused_qkv_call for jaxformer")
    p.add_argument("--xla-flags", default="", help="appended to XLA_FLAGS before jax starts")
    p.add_argument("--peak-size", type=int, default=None,
                   help="square matmul size for the peak (default 2048 on CPU, 8192 on GPU)")
    p.add_argument("--peak-repeats", type=int, default=7,
                   help="rounds of the peak matmul, measured before and after each model")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="what the statistics are computed on: wall time (default) or process "
                        "CPU time; cpu only makes sense for single-threaded runs, e.g. "
                        "`taskset -c 1 ... --threads 1 --clock cpu` on a shared machine")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="before timing each model, wait up to this long for other processes "
                        "to use under --max-foreign cores (shared machines)")
    p.add_argument("--retries", type=int, default=0,
                   help="time a model again (at most this many more times) when other "
                        "processes used more than --max-foreign cores during its rounds; the "
                        "quietest attempt is kept")
    p.add_argument("--max-foreign", type=float, default=0.25, metavar="CORES")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag", default="", help="suffix for the result file names (experiments)")
    p.add_argument("--no-merge", action="store_true",
                   help="overwrite the day's result file instead of merging models into it")
    p.add_argument("--no-save", action="store_true", help="print only")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in args.models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.xla_flags:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    import jax
    import jax.numpy as jnp
    import torch
    from flax import nnx

    if args.device == "gpu":
        try:
            jgpus = jax.devices("gpu")
        except RuntimeError:
            jgpus = []
        if not jgpus or not torch.cuda.is_available():
            print(f"--device gpu: skipped (jax GPUs: {len(jgpus)}, torch.cuda.is_available(): "
                  f"{torch.cuda.is_available()}); nothing written.")
            return 0
        jdev, tdev = jgpus[0], torch.device("cuda", 0)

        def sync():
            torch.cuda.synchronize(tdev)
    else:
        jdev, tdev = jax.devices("cpu")[0], torch.device("cpu")

        def sync():
            pass

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.matmul_precision == "highest":
        jax.config.update("jax_default_matmul_precision", "highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")

    env = environment(args, jax, torch, jdev, tdev)
    report = {"command": "python " + " ".join([os.path.relpath(__file__, REPO)]
                                              + (sys.argv[1:] if argv is None else argv)),
              "repeats": args.repeats, "warmup": args.warmup, "tag": args.tag,
              "environment": env, "results": {}}
    print(json.dumps(env, indent=1))
    peak_size = args.peak_size or (8192 if args.device == "gpu" else 2048)
    for name in args.models:
        try:
            importlib.import_module(f"jaxformer.{MODELS[name]['module']}")
            importlib.import_module(f"torch_ref.{MODELS[name]['module']}")
        except ImportError as e:
            print(f"{name}: skipped, cannot import its modules ({e})")
            continue
        peak = measure_peak(jax, jnp, torch, jdev, tdev, peak_size, args.dtype,
                            args.peak_repeats, sync, args.clock)
        print(f"{name}: matmul peak {peak_size}^3 {args.dtype}: jax "
              f"{peak['jax']['best_flops'] / 1e9:.1f}, torch {peak['torch']['best_flops'] / 1e9:.1f}"
              f" GFLOP/s (best)")
        r = bench_model(name, args, jax, jnp, torch, nnx, jdev, tdev, sync, peak)
        r["command"] = report["command"]
        r["environment"] = env
        report["results"][name] = r
        print(f"{name}: jaxformer {1e3 * r['jaxformer']['median_s']:.1f} ms "
              f"[{1e3 * r['jaxformer']['p25_s']:.1f}-{1e3 * r['jaxformer']['p75_s']:.1f}], "
              f"torch_ref {1e3 * r['torch_ref']['median_s']:.1f} ms "
              f"[{1e3 * r['torch_ref']['p25_s']:.1f}-{1e3 * r['torch_ref']['p75_s']:.1f}]; "
              f"ratio jax/torch {r['speed_ratio']:.3f} (paired {r['speed_ratio_paired_median']:.3f},"
              f" best {r['speed_ratio_best']:.3f}); MFU jax {100 * r['jaxformer']['mfu']:.1f}% "
              f"torch {100 * r['torch_ref']['mfu']:.1f}%; output diff {r['max_rel_output_diff']:.1e};"
              f" other processes used {_fmt(r['foreign_cores_during_timing'])} cores",
              flush=True)
    if not report["results"]:
        print("no model measured; nothing written.")
        return 1
    if not args.no_save:
        path = write_report(report, Path(args.out), merge=not args.no_merge)
        print(f"wrote {path} and {path.with_suffix('.md')}")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
