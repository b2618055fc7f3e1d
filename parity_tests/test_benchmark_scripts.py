"""The benchmark scripts still run against the library: ``bench_forward.py`` and
``bench_train.py`` on tiny models, one timed round, nothing saved. No time is asserted (speed is
the scripts' business, never a test's); what is checked is that each script gets through its
equal-work checks and prints its table, and that ``profile_summary.py`` reads the trace
``bench_train.py --profile`` writes. ``bench_forward.py`` once broke silently when
``jaxformer.nn.jit.Jitted`` renamed its parameters (``state`` -> ``params``) and was found broken
only on a lent GPU."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from parity_tests.support.helpers import fast_compile_env

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TINY_TIMING = ["--repeats", "1", "--warmup", "0", "--peak-size", "64", "--peak-repeats", "1",
               "--no-save"]


def run(script: str, *args: str, **env_changes: str) -> str:
    # A process of its own: the harness sets process-wide matmul precision and torch threads.
    # Nothing here compares against a program compiled by default (helpers.FAST_COMPILE).
    env = fast_compile_env(PYTHONUNBUFFERED="1", **env_changes)
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args, *TINY_TIMING],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_bench_forward_runs():
    out = run("bench_forward.py", "--models", "bert,gpt2,transformer", "--preset", "tiny",
              "--batch", "2", "--seq", "8", "--dtype", "bfloat16")
    for label in ("BertModel (tiny)", "GPT (tiny)", "Transformer (tiny)"):
        assert f"| {label} | 2 x " in out, out[-2000:]


def test_matmul_peak_times_the_vector_products():
    """``matmul_peak.py --cases vector``: every decoding shape with its three candidates (the
    stored kernel, the ``(out, in)`` copy, torch) and their bandwidths."""
    out = run("matmul_peak.py", "--cases", "vector", "--vector-mb", "1")
    for k, n in ((768, 3072), (3072, 768), (512, 2048)):
        assert f"| 1x{k} @ {k}x{n} | 4 weights" in out, out[-2000:]
    assert "GB/s jax / jax (out, in) / torch" in out


def test_bench_train_runs_and_its_profile_is_summarised(tmp_path):
    """``bench_train.py`` with the late-fetch variant (two updates a call) and ``--profile``,
    which writes a trace per jaxformer candidate; ``profile_summary.py`` sums it by thread: the
    step's own call appears on the host."""
    out = run("bench_train.py", "--quick", "--no-compile", "--models", "gpt2", "--profile",
              str(tmp_path), "--jax-variants", "late-fetch", "--updates-per-call", "2")
    assert "| gpt2 (tiny) | 4 x 32 | jaxformer |" in out, out[-2000:]
    assert "|  |  | jaxformer late-fetch |" in out, out[-2000:]
    summary = tmp_path / "summary.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "profile_summary.py"),
                           str(tmp_path / "gpt2" / "jaxformer"), "--json", str(summary)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    threads = json.loads(summary.read_text())["threads"]
    assert threads, done.stdout
    host = " ".join(json.dumps(t) for t in threads)
    assert "step.py" in host, host[:2000]
    assert "PjitFunction" in host, host[:2000]
    # XLA:CPU's operations, with the program text bench_train.py wrote: all of a step's wall time
    # is accounted for, and YNNPACK's fusions are named by what they compute
    cpu = json.loads(summary.read_text())["cpu_calls"]
    assert cpu["program"].endswith("program.hlo.txt"), cpu
    # every instant of a call goes to some kind or to idle: equal but for the order of Python's
    # float64 sums of some thousands of microsecond intervals (this test's own run, measured on
    # an AVX-512 EPYC: 7.7e-16 relative with 2 threads, 3.4e-16 capped to AVX2, 0.0 on one core
    # natively and capped; Python's arithmetic on the trace's times, no XLA arithmetic, so no CPU
    # or thread count moves it past a few ulps); rel=1e-6 is pytest's default, made explicit
    assert sum(k["ms"] for k in cpu["kinds"].values()) == pytest.approx(cpu["wall_ms"], rel=1e-6)
    assert cpu["kinds"]["products"]["ms"] > 0, cpu
    assert cpu["kinds"]["products"]["gflop_per_s"] > 0, cpu  # the products' sizes were read
    assert summary.with_suffix(".png").stat().st_size > 0
    assert all(row["kind"] != "library fusions" and row["shape"] for row in cpu["top"]), cpu


def test_bench_train_loads_steps_a_helper_compiled():
    """``--compile-helper``: each jaxformer candidate (a variant that changes the model's config
    too) is compiled by a helper process and loaded; the script ends with an error if this
    process had to compile a step itself, so getting through its table is the check. The suite
    runs without the allocator settings (conftest.py), under which ``jaxformer train`` starts no
    helper unless told to: ``JAXFORMER_COMPILE_HELPER=1``."""
    out = run("bench_train.py", "--quick", "--no-compile", "--models", "baby",
              "--compile-helper", "--jax-variants", "einsum", JAXFORMER_COMPILE_HELPER="1")
    assert out.count("compiling the step in a helper process") == 2, out[-3000:]
    assert out.count("(loading the helper's program)") == 2, out[-3000:]
    assert "|  |  | jaxformer einsum |" in out, out[-2000:]


def test_profile_summary_splits_cpu_wall_time(tmp_path):
    """The wall time of a call is shared among the operations running at each instant (two
    overlapping ones half each), the rest of the call is idle; a fusion's kind comes from its
    fused computation in the program text, an operation not in it is guessed by name, an event
    holding others on its thread (a loop) is not counted, and XLA's own dot (handed to Eigen's
    pool) runs until its "end:" marker, which other operations' markers do not extend."""
    meta = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": t, "args": {"name": n}}
            for t, n in ((1, "tf_XLAPjRtCpuClient/1"), (2, "tf_XLAEigen/2"))]
    ops = [("ThunkExecutor::Execute", 1, 0, 100), ("ynn_fusion.7", 1, 0, 60),
           ("while.1", 1, 0, 61), ("multiply_add_fusion", 2, 40, 40), ("dot.3", 1, 80, 2),
           ("end: dot.3", 2, 95, 0), ("end: multiply_add_fusion", 1, 99, 0)]
    events = meta + [{"ph": "X", "name": n, "pid": 1, "tid": t, "ts": ts, "dur": d}
                     for n, t, ts, d in ops]
    with gzip.open(tmp_path / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    (tmp_path / "program.hlo.txt").write_text(
        "%fused_computation.7 (p0: f32[4,8], p1: f32[8,2]) -> f32[4,2] {\n"
        "  %p0 = f32[4,8]{1,0} parameter(0)\n  %p1 = f32[8,2]{1,0} parameter(1)\n"
        "  ROOT %dot.1 = f32[4,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, "
        "rhs_contracting_dims={0}\n}\n"
        "ENTRY %main (a: f32[4,8], b: f32[8,2]) -> f32[4,2] {\n"
        "  ROOT %ynn_fusion.7 = f32[4,2]{1,0} fusion(%a, %b), kind=kCustom, "
        'calls=%fused_computation.7, metadata={op_name="jit(f)/dot_general"}\n}\n')
    summary = tmp_path / "summary.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "profile_summary.py"), str(tmp_path),
                           "--json", str(summary)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    cpu = json.loads(summary.read_text())["cpu_calls"]
    assert cpu["calls"] == 1
    # exact values up to float64 rounding of the microsecond arithmetic (pytest's default 1e-6)
    assert cpu["wall_ms"] == pytest.approx(0.1)
    assert {k: round(v["ms"] * 1e3, 6) for k, v in cpu["kinds"].items()} == {
        "products": 65.0, "elementwise": 30.0, "idle": 5.0}
    assert [(r["name"], r["kind"], r["shape"], r["source"]) for r in cpu["top"]] == [
        ("ynn_fusion.7", "products", "f32[4,2]", "jit(f)/dot_general"),
        ("multiply_add_fusion", "elementwise", "", ""), ("dot.3", "products", "", "")]
    # the fusion's one product: 2 x (4 x 2 outputs) x 8 terms over 50 us of wall time
    assert cpu["top"][0]["flop"] == 128
    assert cpu["top"][0]["gflop_per_s"] == pytest.approx(128 / 50e-6 / 1e9)


def test_bench_train_refuses_what_it_cannot_compare():
    """``--dropout`` draws masks in both frameworks from different generators, so it needs
    ``--jax-only`` (the equal-work check would fail later, after the models were built); a helper
    compiles no variant whose step differs by more than its model's config."""
    for args, message in ((["--dropout", "0.1"], "needs --jax-only"),
                          (["--dropout", "1", "--jax-only"], "must lie in [0, 1)"),
                          (["--compile-helper", "--jax-variants", "xla-weight-grads"],
                           "not variant 'xla-weight-grads'")):
        done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_train.py"), *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr[-2000:]
        assert message in done.stderr, done.stderr[-2000:]


def test_bench_loop_runs(tmp_path):
    """``bench_loop.py``: a tiny ``jaxformer train`` run with and without dispatching ahead; the
    two runs' losses are the same, and its scratch directory (corpus, runs) is gone after it."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_loop.py"), "--steps", "4",
                           "--rounds", "1", "--batch", "2", "--seq", "16", "--no-save"],
                          capture_output=True, text=True, timeout=600,
                          env=fast_compile_env(TMPDIR=str(tmp_path)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "losses identical: True" in done.stdout, done.stdout[-2000:]
    assert not list(tmp_path.glob("bench_loop-*")), list(tmp_path.iterdir())


def test_bench_process_runs():
    """``bench_process.py``: one round, a child that compiles the tiny step and one that loads
    it; the same losses, the compiling child wrote the cache and the loaded child found every
    program in it (one at another path would have missed: the path is part of each key)."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_process.py"), "--preset",
                           "tiny", "--vocab", "64", "--batch", "2", "--seq", "16", "--steps",
                           "3", "--rounds", "1", "--no-save"],
                          capture_output=True, text=True, env=fast_compile_env(), timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "losses identical: True" in done.stdout, done.stdout[-2000:]
    assert "and the loaded ones compiled nothing: True" in done.stdout, done.stdout[-2000:]
