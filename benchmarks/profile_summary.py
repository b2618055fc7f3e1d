#!/usr/bin/env python
"""Where a profiled step's time goes: sums the events of a ``jax.profiler`` Perfetto trace
(``perfetto_trace.json.gz``, which ``bench_train.py --profile DIR`` writes per candidate) by
thread and by name, and sorts a GPU's kernels into kinds (matrix products, attention, fused
elementwise and reductions, copies).

    python benchmarks/profile_summary.py DIR [--top 25] [--json OUT.json]

DIR is searched for the newest ``perfetto_trace.json.gz`` under it. Busy time is the sum of the
events' durations on one thread (a GPU stream runs one kernel at a time; on the host, nested
Python frames count more than once, so read the host threads' names, not their totals).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys
from pathlib import Path

# GPU kernel names -> kind, first match wins (cuBLAS/cuBLASLt/CUTLASS/Triton products, cuDNN's
# fused attention, XLA's generated fusions, copies)
KINDS = [
    ("attention", re.compile(r"fmha|flash|cudnn.*(attn|sdpa)|sdpa|attention", re.I)),
    ("matmul", re.compile(r"gemm|xmma|cutlass|cublas|sm\d+_.*(tn|nt|nn|tt)|triton_gemm|dot", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|transpose", re.I)),
    ("fusion", re.compile(r"fusion|reduce|loop_|input_|convert|broadcast|select", re.I)),
]


def kind(name: str) -> str:
    return next((k for k, pattern in KINDS if pattern.search(name)), "other")


def find_trace(path: Path) -> Path:
    if path.is_file():
        return path
    traces = sorted(path.rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        raise SystemExit(f"no perfetto_trace.json.gz under {path}: profile with "
                         "jax.profiler.trace(..., create_perfetto_trace=True)")
    return traces[-1]


def summarize(trace: Path, top: int) -> dict:
    with gzip.open(trace, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    lanes = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            lanes[(e["pid"], e.get("tid"))].append(e)
    out = {"trace": str(trace), "threads": []}
    for (pid, tid), evs in sorted(lanes.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
        process, thread = processes.get(pid, str(pid)), threads.get((pid, tid), str(tid))
        by_name = collections.Counter()
        for e in evs:
            by_name[e["name"]] += e["dur"]
        busy = sum(by_name.values())
        span = max(e["ts"] + e["dur"] for e in evs) - min(e["ts"] for e in evs)
        lane = {"process": process, "thread": thread, "events": len(evs), "busy_us": busy,
                "span_us": span,
                "top": [{"name": n, "us": t, "share": t / busy}
                        for n, t in by_name.most_common(top)]}
        if "gpu" in process.lower() or "device" in process.lower():
            kinds = collections.Counter()
            for n, t in by_name.items():
                kinds[kind(n)] += t
            lane["kinds"] = {k: {"us": t, "share": t / busy} for k, t in kinds.most_common()}
        out["threads"].append(lane)
    return out


def print_summary(s: dict) -> None:
    print(f"trace: {s['trace']}")
    for lane in s["threads"]:
        print(f"\n{lane['process']} / {lane['thread']}: {lane['events']} events, "
              f"busy {lane['busy_us'] / 1e3:.2f} ms over a span of {lane['span_us'] / 1e3:.2f} ms")
        for k, v in lane.get("kinds", {}).items():
            print(f"  kind {k:<10} {v['us'] / 1e3:9.2f} ms  {100 * v['share']:5.1f}%")
        for row in lane["top"]:
            print(f"  {row['us'] / 1e3:9.3f} ms {100 * row['share']:5.1f}%  {row['name'][:110]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path, help="a perfetto_trace.json.gz or a directory above one")
    p.add_argument("--top", type=int, default=25, help="names listed per thread")
    p.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = p.parse_args(argv)
    summary = summarize(find_trace(args.path), args.top)
    print_summary(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
