"""Runs the tolerance-bearing tests on several emulated CPUs and lists the smallest margins.

A bound that holds on one machine can fail on another: instruction sets and thread counts change
the kernels and the order of sums. Each configuration caps the instruction set of XLA:CPU and/or
PyTorch and pins the run to a number of cores; every bound the tests check is recorded
(``parity_tests/support/bounds.py``) and the smallest margin (bound / measured) of each is kept.

    python -m parity_tests.tools.margins             # default ISA and AVX2, 2 cores and all
    python -m parity_tests.tools.margins --isa default AVX --cpus 1 all --out margins.json
    python -m parity_tests.tools.margins --isa jax=AVX2 -- parity_tests/training/test_trajectory.py

``--isa``: ``default`` (the machine's own), ``NAME`` (both frameworks capped: AVX512, AVX2 or AVX),
``jax=NAME`` or ``torch=NAME`` (one side only). ``--cpus``: a count of cores or ``all``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The tests whose assertions carry numeric bounds (the rest check behaviour, files and messages).
TESTS = ["parity_tests/nn", "parity_tests/models", "parity_tests/generation",
         "parity_tests/checkpoints/test_convert.py", "parity_tests/checkpoints/test_hf.py",
         "parity_tests/training/test_trajectory.py", "parity_tests/training/test_optim.py",
         "parity_tests/training/test_losses.py", "parity_tests/training/test_bert_examples.py",
         "parity_tests/training/test_recipe.py", "parity_tests/test_sharding.py",
         "parity_tests/test_parity_job.py"]
# Instruction-set caps, per framework: XLA:CPU's code generator, and PyTorch's own kernels
# (ATen's dispatch), its BLAS (MKL) and oneDNN, which each choose their ISA at run time.
JAX_ISA = {"AVX512": "AVX512", "AVX2": "AVX2", "AVX": "AVX"}
TORCH_ISA = {"AVX512": ("avx512", "AVX512", "AVX512_CORE"), "AVX2": ("avx2", "AVX2", "AVX2"),
             "AVX": ("default", "AVX", "AVX")}
WARN_BELOW = 2.0  # margins under this are the next bounds to fail on some machine


def isa_env(spec: str) -> dict[str, str]:
    """Environment variables that cap the instruction sets ``spec`` names."""
    if spec == "default":
        return {}
    side, _, name = spec.rpartition("=")
    if name not in JAX_ISA or side not in ("", "jax", "torch"):
        raise SystemExit(f"margins: error: --isa {spec!r}: expected default, NAME, jax=NAME or "
                         f"torch=NAME with NAME one of {', '.join(JAX_ISA)}")
    env = {}
    if side in ("", "jax"):
        env["XLA_FLAGS"] = f"--xla_cpu_max_isa={JAX_ISA[name]}"
    if side in ("", "torch"):
        aten, mkl, onednn = TORCH_ISA[name]
        env.update(ATEN_CPU_CAPABILITY=aten, MKL_ENABLE_INSTRUCTIONS=mkl, ONEDNN_MAX_CPU_ISA=onednn)
    return env


def cores(spec: str) -> list[int]:
    available = sorted(os.sched_getaffinity(0))
    if spec == "all":
        return available
    if not spec.isdigit() or not 1 <= int(spec) <= len(available):
        raise SystemExit(f"margins: error: --cpus {spec!r}: expected 1..{len(available)} or all")
    return available[:int(spec)]


def run(isa: str, cpus: list[int], tests: list[str], workdir: Path) -> tuple[int, list[dict]]:
    """Runs ``tests`` under one configuration; (pytest's exit code, the recorded margins)."""
    record = workdir / f"isa-{isa.replace('=', '-')}-{len(cpus)}-cores.jsonl"
    record.unlink(missing_ok=True)
    env = {**os.environ, **isa_env(isa), "JAXFORMER_MARGINS": str(record),
           # The pass hook needs freshly rewritten test modules, not the ones cached without it.
           "PYTHONPYCACHEPREFIX": str(workdir / "pycache")}
    cmd = ["taskset", "-c", ",".join(map(str, cpus)), sys.executable, "-m", "pytest", "-q",
           "-p", "no:cacheprovider", "-o", "enable_assertion_pass_hook=true", *tests]
    print(f"== isa {isa}, {len(cpus)} core(s): {' '.join(cmd[3:])}", flush=True)
    start = time.time()
    code = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    print(f"== exit {code} in {time.time() - start:.0f} s", flush=True)
    rows = [json.loads(line) for line in record.read_text().splitlines()] \
        if record.exists() else []
    return code, rows


def smallest(results: dict[str, list[dict]]) -> list[dict]:
    """Per checked bound (test, place, expression): the smallest margin over configurations, and
    whether its worst measurement differed between configurations (``varies``: the CPU moves it;
    a measurement equal on all of them, such as a schedule or a count, is not at the CPU's mercy).
    """
    worst: dict[tuple, dict] = {}
    seen: dict[tuple, dict[str, float]] = {}
    for config, rows in results.items():
        for row in rows:
            margin = row["bound"] / row["measured"] if row["measured"] > 0 else float("inf")
            key = (row["test"], row["where"], row["what"])
            per_config = seen.setdefault(key, {})
            per_config[config] = max(per_config.get(config, 0.0), row["measured"])
            if key not in worst or margin < worst[key]["margin"]:
                worst[key] = {**row, "margin": margin, "config": config}
    for key, row in worst.items():
        values = list(seen[key].values())
        row["configs"] = len(values)
        row["varies"] = len(values) > 1 and max(values) != min(values)
    return sorted(worst.values(), key=lambda r: r["margin"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parity_tests.tools.margins",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--isa", nargs="+", default=["default", "AVX2"])
    parser.add_argument("--cpus", nargs="+", default=["2", "all"])
    parser.add_argument("--out", type=Path, help="write every margin below --below as JSON")
    parser.add_argument("--below", type=float, default=WARN_BELOW)
    parser.add_argument("--records", type=Path,
                        help="keep each configuration's records in this directory (default: a "
                             "temporary one); with --report-only, summarise the ones there")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: summarise the records already in --records")
    parser.add_argument("tests", nargs="*", default=TESTS)
    args = parser.parse_args(argv)
    if args.report_only and not args.records:
        parser.error("--report-only needs --records DIR")
    configs = [(isa, cores(c)) for isa in args.isa for c in dict.fromkeys(args.cpus)]
    configs = list({(isa, tuple(c)): (isa, c) for isa, c in configs}.values())  # 2 == all here
    results, codes = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.records or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.report_only:
            for path in sorted(workdir.glob("*.jsonl")):
                results[path.stem] = [json.loads(line) for line in path.read_text().splitlines()]
        for isa, cpus in [] if args.report_only else configs:
            name = f"isa {isa}, {len(cpus)} core(s)"
            codes[name], results[name] = run(isa, cpus, args.tests, workdir)
    low = [r for r in smallest(results) if r["margin"] < args.below]
    print(f"\n{sum(map(len, results.values()))} bounds checked over {len(results)} "
          f"configurations; {len(low)} with a margin below {args.below:g}:")
    for r in low:
        same = "" if r["varies"] or r["configs"] < 2 else "  (same on every configuration)"
        print(f"  {r['margin']:6.2f}x  {r['measured']:.3g} <= {r['bound']:.3g}  {r['test']}  "
              f"{r['where']}  {r['what']}  [{r['config']}]{same}")
    for name, code in codes.items():
        print(f"{name}: pytest exit {code}")
    if args.out:
        args.out.write_text(json.dumps({"configurations": codes, "below": args.below,
                                        "margins": low}, indent=1) + "\n")
    return max(codes.values(), default=0)  # pytest's exit codes: 0 passed, 1 failed, ...


if __name__ == "__main__":
    sys.exit(main())
