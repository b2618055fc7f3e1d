"""The shared benchmark harness: timing, environment, matmul peak, results. One piece of code for
what every script in ``benchmarks/`` needs, so that a script holds only its workload.

It sits under the scripts and over ``report.py`` (the result files), which it imports; the comment
below is the guide to writing a script with it.
"""

# A script in five steps (``bench_forward.py`` is the worked example)::
#
#     import harness                                   # benchmarks/ is on sys.path for a script
#
#     parser = harness.argument_parser(__doc__)        # the common flags (see below)
#     parser.add_argument("--models", ...)             # the script's own
#     args = parser.parse_args(argv)
#     bench = harness.start(args, "train", title="Training step: ...")  # None: skipped (no GPU)
#     import jax                                       # frameworks after start(): it sets XLA_FLAGS
#     for name in cases:
#         fns = {"jaxformer": run_jax, "torch_ref": run_torch}  # zero-argument callables that
#         #                                   return when the work is done (block_until_ready/sync)
#         case = bench.measure(fns, baseline="torch_ref", tokens=..., flop=...)
#         case.update(label="GPT-2 small", shape="8 x 256", notes={"jax compile s": "12.3"})
#         bench.add(name, case)                        # prints a one-line summary
#     return bench.finish()                            # JSON + Markdown + PNG, printed table
#
# ``bench.measure`` does, per case: the matmul peak (``bench.peak()``) before and after;
# ``--warmup`` untimed calls of every candidate; optionally waits for a quiet machine
# (``--wait-quiet``); then ``--repeats`` interleaved rounds (each round calls every candidate once,
# the order reversed every other round: ABBA), on the wall or the process-CPU clock (``--clock``),
# while measuring how many cores *other* processes kept busy; if they used more than
# ``--max-foreign`` it times again (at most ``--retries`` times) and keeps the quietest attempt.
# Each candidate gets median, p25/p75 (IQR), min, max and all times; with ``tokens`` tokens/s, with
# ``flop`` model FLOP/s and MFU (over the measured device peak and over the candidate's own
# framework peak, ``frameworks`` naming it); each non-baseline candidate gets its speed over the
# baseline's (> 1: faster), of the medians, the median of per-round ratios and of the best times.
# Model FLOPs come from ``jaxformer.models.flops``.
#
# Results go to ``--out`` as ``<benchmark>_<device>-<cpu or gpu>[-<n>c]_<dtype>_<date>[_<tag>]``
# ``.json/.md/.png`` (written by ``report.py``, which also re-renders a JSON file); a later run on
# the same day merges its cases into the same files unless ``--no-merge``; ``--no-save`` only
# prints. The environment (machine, CPU, device, versions, thread counts, matmul precision, flags,
# date) is captured by :func:`start` into ``bench.env``. Also on ``bench``: ``jdev``/``tdev`` (the
# jax and torch devices), ``sync()`` (waits for CUDA work), ``matmul(m, k, n, batch, bias)``
# (matched jax/torch matmul callables, as ``matmul_peak.py`` times them), ``footnote`` (a line under
# the table for the script's fixed conditions). The common flags are :func:`argument_parser`'s
# (``--help`` of any script lists them).

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (REPO, HERE):  # the scripts run from a checkout; report.py sits beside this file
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import report as report_io  # noqa: E402  (benchmarks/report.py, found through HERE above)
from report import fmt, slug  # noqa: E402, F401  (harness.fmt / harness.slug for the scripts)


def argument_parser(doc: str, *, repeats: int = 15, warmup: int = 3) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[-1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=repeats, help=f"timed rounds ({repeats})")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed calls after compiling")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"),
                   help="directory for the result files")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: torch's own, one per core)")
    p.add_argument("--matmul-precision", choices=("highest", "default"), default="highest",
                   help="highest: jax_default_matmul_precision=highest and TF32 off in torch "
                        "(exact float32, as in the parity suite); default: both frameworks' "
                        "defaults (TF32 on GPU)")
    p.add_argument("--xla-flags", default="", help="appended to XLA_FLAGS before jax starts")
    p.add_argument("--peak-size", type=int, default=None,
                   help="square matmul size for the peak (default 2048 on CPU, 8192 on GPU)")
    p.add_argument("--peak-repeats", type=int, default=7,
                   help="rounds of the peak matmul before and after each case (0: no peak)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="statistics on wall time or on process CPU time (all threads); cpu "
                        "suits single-threaded runs on a shared machine: `taskset -c 1 ... "
                        "--threads 1 --clock cpu`")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="before timing each case, wait up to this long for other processes "
                        "to use under --max-foreign cores")
    p.add_argument("--retries", type=int, default=0,
                   help="time a case again (at most this many more times) when other processes "
                        "used over --max-foreign cores meanwhile; the quietest attempt is kept")
    p.add_argument("--max-foreign", type=float, default=0.25, metavar="CORES")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag", default="", help="suffix for the result file names (experiments)")
    p.add_argument("--no-merge", action="store_true",
                   help="overwrite the day's result files instead of merging cases into them")
    p.add_argument("--no-save", action="store_true", help="print only")
    return p


# ----------------------------------------------------------------------------- switches

def add_jax_switch(parser: argparse.ArgumentParser) -> None:
    """``--jax-switch NAME`` for the generation benchmarks (``switched_off``)."""
    def switch(name: str) -> str:
        if not name.startswith("JAXFORMER_"):
            raise argparse.ArgumentTypeError(f"takes a JAXFORMER_* variable, got {name!r}")
        return name
    parser.add_argument("--jax-switch", type=switch, default=None, metavar="NAME",
                        help="also time jaxformer's generation compiled with the switch NAME=0")


def switched_off(name: str | None, program: str):
    """``(context manager, candidate name)`` for ``--jax-switch NAME``, ``(None, None)`` without
    it. Under the context manager ``jaxformer.generation.decoding``'s ``program``
    (``_generate_gpt`` or ``_generate_seq2seq``) is a second compiled program, traced with the
    environment variable ``name`` set to ``0``: jaxformer reads most of its ``JAXFORMER_*``
    switches when a program is traced and jax keeps one trace per function, so the variant needs
    a function of its own (``JAXFORMER_CPU_VECTOR_KERNELS`` is read by each ``generate`` call,
    which the variable set during the call covers too). The default program stays compiled as it
    is; both are timed in one process."""
    if name is None:
        return None, None
    import jax

    from jaxformer.generation import decoding

    default = getattr(decoding, program)
    traced = default.__wrapped__

    def variant(graphdef, *args, **kwargs):
        return traced(graphdef, *args, **kwargs)

    compiled = jax.jit(variant, static_argnums=0, static_argnames="options")

    @contextlib.contextmanager
    def off():
        setattr(decoding, program, compiled)
        try:
            with environment_variable(name, "0"):
                yield
        finally:
            setattr(decoding, program, default)
    return off, f"jaxformer {name}=0"


@contextlib.contextmanager
def environment_variable(name: str, value: str):
    """The environment variable ``name`` set to ``value`` for the duration, then as it was."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


# ----------------------------------------------------------------------------- statistics

def summarize(times) -> dict:
    import numpy as np
    t = np.asarray(times, dtype=float)
    q25, q50, q75 = np.percentile(t, [25, 50, 75])
    return {"median_s": float(q50), "min_s": float(t.min()), "max_s": float(t.max()),
            "p25_s": float(q25), "p75_s": float(q75), "iqr_pct": float(100 * (q75 - q25) / q50),
            "n": int(t.size), "times_s": [float(x) for x in t]}


def time_interleaved(fns: dict, repeats: int, clock: str = "wall"):
    """Every callable once per round, the order reversed every other round (ABBA). Returns
    ``({label: seconds on clock}, {label: seconds on the other clock})``; ``"cpu"`` is process
    CPU time, which a single-threaded process is not charged while descheduled."""
    wall, cpu = {k: [] for k in fns}, {k: [] for k in fns}
    for r in range(repeats):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            c0, t0 = time.process_time(), time.perf_counter()
            fns[k]()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return (cpu, wall) if clock == "cpu" else (wall, cpu)


# ----------------------------------------------------------------------------- machine load

def cpu_busy_s():
    """CPU seconds the whole machine has used since boot (all cores, /proc/stat), or None."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of the child processes it has waited for (a compile
    helper, a script it ran): the work a benchmark does itself."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


class ForeignLoad:
    """``with ForeignLoad() as f: ...`` -> ``f.cores``: the average number of cores *other*
    processes kept busy meanwhile (machine CPU time minus ours, :func:`own_cpu_s`, over the
    wall time)."""

    def __enter__(self):
        self.m0, self.p0, self.t0 = cpu_busy_s(), own_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        m1, p1, t1 = cpu_busy_s(), own_cpu_s(), time.perf_counter()
        self.cores = (None if self.m0 is None or m1 is None else
                      max(0.0, ((m1 - self.m0) - (p1 - self.p0)) / (t1 - self.t0)))


def wait_for_quiet(max_wait_s: float, max_foreign_cores: float = 0.25, sample_s: float = 3.0):
    """Wait (at most ``max_wait_s``) until other processes use under ``max_foreign_cores`` over
    a ``sample_s`` window; returns the last foreign load measured."""
    deadline = time.perf_counter() + max_wait_s
    while True:
        with ForeignLoad() as fl:
            time.sleep(sample_s)
        if fl.cores is None or fl.cores < max_foreign_cores or time.perf_counter() > deadline:
            return fl.cores
        print(f"  waiting for a quiet machine (others use {fl.cores:.2f} cores)", flush=True)


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ----------------------------------------------------------------------------- environment

def _cpuinfo() -> dict:
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if ":" in line:
                k, v = (x.strip() for x in line.split(":", 1))
                info.setdefault(k, v)
    except OSError:
        pass
    return info


def cpu_description() -> tuple[str, str]:
    """(model name, family/model and the vector extensions that matter for matmuls)."""
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    name = info.get("model name") or platform.processor() or platform.machine()
    return name, f"family {info.get('cpu family')} model {info.get('model')}, {' '.join(isa)}"


def environment(args, jax, torch, jdev, tdev) -> dict:
    import flax
    import jaxlib
    import numpy as np
    versions = {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
                "torch": torch.__version__ if torch else None, "numpy": np.__version__}
    env = {"date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
           "host": platform.node(), "machine": platform.machine(), "os": platform.platform(),
           "python": platform.python_version(), "versions": versions,
           "device": args.device, "dtype": args.dtype, "jax_device": str(jdev),
           "jax_device_kind": jdev.device_kind,
           "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
           "jax_enable_x64": bool(jax.config.jax_enable_x64),
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""),
           "clock": args.clock, "cpu": cpu_description()[0], "cpu_details": cpu_description()[1],
           "cpu_count": os.cpu_count(),
           "cpu_affinity": (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                            else None),
           "jax_cpu_threads": "XLA:CPU's intra-op pool: one thread per core in the affinity mask"}
    if torch:
        env.update({"torch_device": str(tdev),
                    "torch_float32_matmul_precision": torch.get_float32_matmul_precision(),
                    "torch_cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
                    "torch_cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
                    "torch_num_threads": torch.get_num_threads(),
                    "torch_num_interop_threads": torch.get_num_interop_threads(),
                    "torch_mkldnn": bool(torch.backends.mkldnn.is_available())})
    if args.device == "gpu":
        env["gpu"] = jdev.device_kind
    return env


def start(args, benchmark: str, *, title: str, need_torch: bool = True):
    """Set XLA flags, import the frameworks, pick the devices, pin the matmul precision, set
    torch's threads and capture the environment. None when ``--device gpu`` finds no GPU."""
    if args.xla_flags:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    # jaxformer's allocator settings, as `jaxformer train` gets them: before JAX starts its
    # threads and torch its pools (jaxformer.runtime, docs/performance.md)
    import jaxformer.runtime  # noqa: F401
    try:
        import torch
    except ImportError:
        if need_torch:
            raise
        torch = None
    try:
        jdevs = jax.devices(args.device)
    except RuntimeError:
        jdevs = []
    if args.device == "gpu" and (not jdevs or (torch and not torch.cuda.is_available())):
        print(f"--device gpu: skipped (jax GPUs: {len(jdevs)}, torch CUDA: "
              f"{bool(torch and torch.cuda.is_available())}); nothing written.")
        return None
    if torch and args.threads:
        torch.set_num_threads(args.threads)
    highest = args.matmul_precision == "highest"
    if highest:
        jax.config.update("jax_default_matmul_precision", "highest")
    if torch:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not highest
        torch.set_float32_matmul_precision("highest" if highest else "high")
    tdev = None
    if torch is not None:
        tdev = torch.device("cuda", 0) if args.device == "gpu" else torch.device("cpu")
    return Bench(args, benchmark, title, jax, torch, jdevs[0], tdev)


# ----------------------------------------------------------------------------- the session

class Bench:
    """What :func:`start` returns: the devices, ``sync()``, ``peak()``, ``measure()``, the
    report being built (``add``, ``finish``)."""

    def __init__(self, args, benchmark, title, jax, torch, jdev, tdev):
        self.args, self.benchmark, self.title = args, benchmark, title
        self.jax, self.torch, self.jdev, self.tdev = jax, torch, jdev, tdev
        self.env = environment(args, jax, torch, jdev, tdev)
        self.footnote = ""
        command = [os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]
        self.report = {"benchmark": benchmark, "format": 2, "title": title,
                       "command": "python " + " ".join(command), "repeats": args.repeats,
                       "warmup": args.warmup, "tag": args.tag, "environment": self.env,
                       "results": {}}
        print(json.dumps(self.env, indent=1))

    def sync(self):
        """Wait for queued torch CUDA work (a no-op on CPU)."""
        if self.torch is not None and self.tdev.type == "cuda":
            self.torch.cuda.synchronize(self.tdev)

    def matmul(self, m: int, k: int, n: int, batch: int | None = None, bias: bool = False):
        """``(flop, {"jax": fn, "torch": fn})`` for ``x (batch?, m, k) @ w (k, n) (+ b)``, each
        framework the way its models run it: jax ``x @ kernel + bias`` jitted, torch
        ``F.linear`` (weight ``[n, k]``) or ``bmm``; inputs in the benchmark dtype."""
        import numpy as np
        jax, jnp, torch, dtype = self.jax, self.jax.numpy, self.torch, self.args.dtype
        rng = np.random.RandomState(0)
        lead = (batch,) if batch else ()
        x = rng.standard_normal(lead + (m, k)).astype(np.float32)
        w = (rng.standard_normal(lead + (k, n)) / np.sqrt(k)).astype(np.float32)
        b = rng.standard_normal((n,)).astype(np.float32)
        jx, jw, jb = (jax.device_put(jnp.asarray(a, dtype), self.jdev) for a in (x, w, b))
        jf = jax.jit((lambda x, w, b: x @ w + b) if bias else (lambda x, w, b: x @ w))
        fns = {"jax": lambda: jf(jx, jw, jb).block_until_ready()}
        if torch is not None:
            def to(a):
                a = torch.from_numpy(np.ascontiguousarray(a))
                return a.to(self.tdev, getattr(torch, dtype))
            tx, tb = to(x), (to(b) if bias else None)
            tw = to(w) if batch else to(w.T)  # nn.Linear keeps [out, in]

            def run_torch():
                with torch.inference_mode():
                    (torch.bmm(tx, tw) if batch else torch.nn.functional.linear(tx, tw, tb))
                self.sync()
            fns["torch"] = run_torch
        return 2.0 * m * k * n * (batch or 1), fns

    def peak(self) -> dict:
        """Best FLOP/s of a square matmul (``--peak-size``) per framework, interleaved; the
        device peak (MFU's denominator) is the larger of the two."""
        n = self.args.peak_size or (8192 if self.args.device == "gpu" else 2048)
        flop, fns = self.matmul(n, n, n)
        for fn in list(fns.values()) * 2:  # compile, warm up
            fn()
        times, _ = time_interleaved(fns, self.args.peak_repeats, self.args.clock)
        out = {"size": n, "dtype": self.args.dtype, "flop": flop, "repeats": self.args.peak_repeats}
        for k, v in times.items():
            s = summarize(v)
            del s["times_s"]
            out[k] = {"best_flops": flop / s["min_s"], "median_flops": flop / s["median_s"], **s}
        out["device_peak_flops"] = max(out[k]["best_flops"] for k in fns)
        return out

    def measure(self, fns: dict, *, baseline: str | None = None, tokens: int | None = None,
                flop: float | None = None, frameworks: dict | None = None,
                peak: bool = True) -> dict:
        """Time the candidates ``fns`` (see the module docstring); returns the case's record."""
        import numpy as np

        from jaxformer.models.flops import mfu
        args = self.args
        peaks = [self.peak()] if peak and args.peak_repeats > 0 else []
        for _ in range(args.warmup):
            for fn in fns.values():
                fn()
        best = None
        for attempt in range(1 + max(0, args.retries)):
            quiet = wait_for_quiet(args.wait_quiet, args.max_foreign) if args.wait_quiet else None
            before = loadavg()
            with ForeignLoad() as foreign:
                timed = time_interleaved(fns, args.repeats, args.clock)
            run = (timed, quiet, before, loadavg(), foreign.cores, attempt + 1)
            if best is None or (foreign.cores or 0.0) < (best[4] or 0.0):
                best = run
            calm = foreign.cores is None or foreign.cores <= args.max_foreign
            if calm or attempt == max(0, args.retries):
                break
            print(f"  other processes used {foreign.cores:.2f} cores (> {args.max_foreign}); "
                  f"timing again", flush=True)
        (times, other), quiet, before, after, cores, kept = best
        case = {"candidates": list(fns), "baseline": baseline, "clock": args.clock,
                "tokens_per_call": tokens, "model_flop": flop, "loadavg_before": before,
                "loadavg_after": after, "foreign_cores_during_timing": cores,
                "foreign_cores_before": quiet, "timing_attempts": attempt + 1,
                "timing_attempt_kept": kept,
                "measured_at_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        if peaks:  # again after: on a shared machine one measurement can land in a busy moment
            peaks.append(self.peak())
            p = {**peaks[0], "after": peaks[1]}
            for fw in ("jax", "torch"):
                if fw in p:
                    p[fw] = {**p[fw], "best_flops": max(q[fw]["best_flops"] for q in peaks)}
            p["device_peak_flops"] = max(q["device_peak_flops"] for q in peaks)
            case["peak"] = p
        other_name = "wall_time" if args.clock == "cpu" else "cpu_time"
        for k in fns:
            s = summarize(times[k])
            o = summarize(other[k])
            s[other_name] = {x: o[x] for x in ("median_s", "min_s", "p25_s", "p75_s")}
            if tokens:
                s["tokens_per_s"] = tokens / s["median_s"]
            if flop:
                s["model_flops_per_s"] = flop / s["median_s"]
                if peaks:
                    s["mfu"] = mfu(s["model_flops_per_s"], case["peak"]["device_peak_flops"])
                    fw = (frameworks or {}).get(k)
                    if fw in case["peak"]:
                        s["mfu_own_framework_peak"] = mfu(s["model_flops_per_s"],
                                                          case["peak"][fw]["best_flops"])
            if baseline is not None and k != baseline:
                tk, tb = np.asarray(times[k]), np.asarray(times[baseline])
                s["speed_ratio"] = float(np.median(tb) / np.median(tk))
                s["speed_ratio_paired_median"] = float(np.median(tb / tk))
                s["speed_ratio_best"] = float(tb.min() / tk.min())
            case[k] = s
        return case

    def add(self, name: str, case: dict) -> None:
        """Record a measured case (after adding its ``label``, ``shape``, ``notes``)."""
        case.setdefault("label", name)
        case["command"] = self.report["command"]
        case["environment"] = self.env  # merged files keep each case's own
        self.report["results"][name] = case
        parts = [f"{k} {1e3 * case[k]['median_s']:.2f} ms [{1e3 * case[k]['p25_s']:.2f}-"
                 f"{1e3 * case[k]['p75_s']:.2f}]" for k in case["candidates"]]
        parts += [f"{k}/{case['baseline']} {case[k]['speed_ratio']:.3f}"
                  for k in case["candidates"] if "speed_ratio" in case[k]]
        parts += [f"MFU {k} {100 * case[k]['mfu']:.1f}%" for k in case["candidates"]
                  if "mfu" in case[k]]
        cores = case.get("foreign_cores_during_timing")
        parts.append(f"other processes {'n/a' if cores is None else f'{cores:.2f}'} cores")
        print(f"{name}: " + "; ".join(parts), flush=True)

    def finish(self) -> int:
        """Write (unless ``--no-save``) and print the report; 1 if no case was measured."""
        if not self.report["results"]:
            print("no case measured; nothing written.")
            return 1
        self.report["footnote"] = self.footnote
        merged = self.report
        if not self.args.no_save:
            merged, paths = report_io.write(self.report, Path(self.args.out),
                                            merge=not self.args.no_merge)
            print("wrote " + ", ".join(str(p) for p in paths))
        print(report_io.markdown(merged))
        return 0
