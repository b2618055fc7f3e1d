#!/usr/bin/env python
"""Where a profiled step's time goes: sums the events of a ``jax.profiler`` Perfetto trace
(``perfetto_trace.json.gz``, which ``bench_train.py --profile DIR`` writes per candidate) by
thread and by name, and sorts a GPU's kernels into kinds (matrix products, attention, fused
elementwise and reductions, copies).

    python benchmarks/profile_summary.py DIR [--top 25] [--json OUT.json]

DIR is searched for the newest ``perfetto_trace.json.gz`` under it. Busy time is the sum of the
events' durations on one thread (a GPU stream runs one kernel at a time; on the host, nested
Python frames count more than once, so read the host threads' names, not their totals).

On the CPU, XLA records each operation it runs (a fusion, a library product, a loop) when the
process starts with ``--xla_cpu_enable_xprof_traceme=true`` in ``XLA_FLAGS`` (``bench_train.py
--profile`` adds it). Its operations run on two or more threads at once, so per-thread sums do
not say where a step's time goes; the summary then also splits the wall time of the longest
program calls (the steps) among the operations running at each instant, an operation's product
or reduction running on both threads counting once, and sorts them into kinds: products,
reductions, elementwise loops, copies, indexing (gathers, scatters, slices), and idle time.
The program's compiled text (``program.hlo.txt`` beside the trace, which ``bench_train.py``
writes; or ``--program FILE``, ``jax.jit(f).lower(...).compile().as_text()``) gives each
operation's kind, shape, source and, for products, floating-point operations, hence a rate:
that of the products together is the one to read, an operation's own counts the time it ran
beside another as half its (XLA runs independent products at once, say a layer's weight and
input gradients). Without the program text the kind is guessed from the name.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import math
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


# XLA:CPU's operations as trace events (see the module docstring), and where bench_train.py
# writes the program they belong to.
CPU_OP_EVENTS = "--xla_cpu_enable_xprof_traceme=true"
PROGRAM_TEXT = "program.hlo.txt"
# a program's execution, on each thread that takes part (nested: a loop's body executes
# inside); merged where they overlap, one call of a program
CPU_EXECUTE = "ThunkExecutor::Execute"
_CPU_RUNTIME = ("ThunkExecutor", "SlinkyThreadPool", "ThreadpoolListener")
# XLA's own products (an unfused dot or convolution) run on Eigen's thread pool: the event
# returns when the work is handed over, the "end: NAME" marker comes where it finished (other
# operations' markers can come late: the thread that notes them may be busy elsewhere)
_CPU_DONE = "end: "
_CPU_HANDED_OVER = re.compile(r"^(dot|dot_general|convolution)(\.\d+)?$")
# kinds of operation by the opcodes inside them (a fusion's: its fused computation's), the first
# that matches: a fusion that multiplies and transposes is a copy, one that also reduces a
# reduction
_KIND_OPCODES = (("products", {"dot", "convolution"}), ("reductions", {"reduce", "reduce-window"}),
                 ("indexing", {"gather", "scatter", "dynamic-slice", "dynamic-update-slice"}),
                 ("copies", {"copy", "transpose"}))
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.+?) ([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$")


def _kind_of(opcodes) -> str:
    return next((k for k, some in _KIND_OPCODES if some & set(opcodes)), "elementwise")


def _dims(shape: str) -> list[int]:
    return [int(d) for d in re.findall(r"\d+", shape.partition("[")[2].partition("]")[0])]


def program_operations(text: str) -> dict[str, dict]:
    """A compiled XLA program's text -> ``{instruction: {kind, shape, source, flop}}``; a
    fusion's kind is that of the opcodes of its fused computation (a YNNPACK fusion of a dot is a
    product), its ``flop`` the multiply-adds of the dots in it, times 2 (instruction names are
    unique in a module, so an operand's shape is found by its name)."""
    inside, flop = collections.defaultdict(set), collections.Counter()
    found, shapes, computation = {}, {}, None
    for line in text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            computation = header.group(1)
            continue
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        name, shape, opcode, rest = m.groups()
        shapes[name] = shape = re.sub(r"\{[^}]*\}", "", shape)
        inside[computation].add(opcode)
        if opcode == "dot":
            axes = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
            lhs = _dims(shapes.get(re.match(r"%?([\w.\-]*)", rest).group(1), ""))
            if axes and lhs:  # an operand not found: no count
                contracted = math.prod(lhs[int(a)] for a in axes.group(1).split(",") if a)
                flop[name] = 2 * math.prod(_dims(shape)) * contracted
                flop[computation] += flop[name]
        calls = re.search(r"calls=%?([\w.\-]+)", rest)
        source = re.search(r'op_name="([^"]*)"', rest)
        found[name] = {"calls": calls.group(1) if opcode == "fusion" and calls else None,
                       "opcode": opcode, "shape": shape,
                       "source": source.group(1) if source else ""}
    for name, op in found.items():
        calls, opcode = op.pop("calls"), op.pop("opcode")
        op["kind"] = _kind_of(inside[calls] if calls else {opcode})
        op["flop"] = flop[calls] if calls else flop[name]
    return found


def _guessed_kind(name: str) -> str:
    """An operation's kind from its name alone (XLA names a fusion by the ops it fuses)."""
    words = set(re.split(r"[_.]", re.sub(r"\.\d+$", "", name)))
    if "ynn" in words:
        return "library fusions"  # YNNPACK's: a product or a reduction
    return _kind_of(words)


def cpu_calls(events: list, thread_names: dict, program: dict | None, top: int) -> dict | None:
    """The wall time of the longest calls of XLA:CPU programs (those at least half as long as
    the longest: the profiled steps), split among the operations running at each instant: an
    interval with k operations running gives each 1/k of it; none running is idle. An operation
    handed to Eigen's pool runs to its "end:" marker. None when the trace has no operation
    events (a GPU trace, or no ``CPU_OP_EVENTS``)."""
    lanes, finished = collections.defaultdict(list), collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or "XLA" not in thread_names.get((e["pid"], e.get("tid")), ""):
            continue
        if e["name"].startswith(_CPU_DONE):
            finished[e["name"][len(_CPU_DONE):]].append(e["ts"] + e["dur"])
        elif not e["name"].startswith(_CPU_RUNTIME):
            lanes[(e["pid"], e.get("tid"))].append(e)
    for times in finished.values():
        times.sort()
    leaves = []
    for lane in lanes.values():  # an event holding others on its thread (a loop) is not counted
        lane.sort(key=lambda e: (e["ts"], -e["dur"]))  # a loop before its first operation
        for e, after in zip(lane, [*lane[1:], None]):
            if after is None or after["ts"] >= e["ts"] + e["dur"]:
                times = finished.get(e["name"], []) if _CPU_HANDED_OVER.match(e["name"]) else []
                done = times[bisect.bisect_left(times, e["ts"])] \
                    if times and times[-1] >= e["ts"] else e["ts"] + e["dur"]
                leaves.append({"name": e["name"], "ts": e["ts"],
                               "dur": max(done, e["ts"] + e["dur"]) - e["ts"]})
    calls: list[list[float]] = []
    for e in sorted((e for e in events if e.get("ph") == "X"
                     and e["name"].startswith(CPU_EXECUTE)), key=lambda e: e["ts"]):
        if calls and e["ts"] <= calls[-1][1]:
            calls[-1][1] = max(calls[-1][1], e["ts"] + e["dur"])
        else:
            calls.append([e["ts"], e["ts"] + e["dur"]])
    calls = sorted((c for c in calls if any(c[0] <= e["ts"] < c[1] for e in leaves)),
                   key=lambda c: c[0] - c[1])
    if not calls:
        return None
    calls = [c for c in calls if c[1] - c[0] >= (calls[0][1] - calls[0][0]) / 2]
    per_op, per_kind = collections.Counter(), collections.Counter()
    for start, end in calls:
        inside = [e for e in leaves if start <= e["ts"] < end]
        points = sorted([(e["ts"], 1, i) for i, e in enumerate(inside)]
                        + [(min(e["ts"] + e["dur"], end), -1, i) for i, e in enumerate(inside)])
        running, last = set(), start
        for t, step, i in points:
            for j in running:
                per_op[inside[j]["name"]] += (t - last) / len(running)
            if not running:
                per_kind["idle"] += t - last
            (running.add if step > 0 else running.discard)(i)
            last = t
        per_kind["idle"] += end - last
    n = len(calls)
    rows = []
    flop = collections.Counter()
    for name, us in per_op.most_common():
        op = (program or {}).get(name) or {"kind": _guessed_kind(name), "shape": "", "source": "",
                                           "flop": 0}
        per_kind[op["kind"]] += us
        flop[op["kind"]] += op["flop"]
        rows.append({"name": name, "ms": us / n / 1e3, **op,
                     "gflop_per_s": op["flop"] * n / us / 1e3 if op["flop"] and us else None})
    wall = sum(end - start for start, end in calls) / n
    return {"calls": n, "wall_ms": wall / 1e3,
            "kinds": {k: {"ms": us / n / 1e3, "share": us / n / wall,
                          "gflop_per_s": flop[k] * n / us / 1e3 if flop[k] and us else None}
                      for k, us in per_kind.most_common()},
            "top": rows[:top]}


def find_trace(path: Path) -> Path:
    if path.is_file():
        return path
    traces = sorted(path.rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        raise SystemExit(f"no perfetto_trace.json.gz under {path}: profile with "
                         "jax.profiler.trace(..., create_perfetto_trace=True)")
    return traces[-1]


def summarize(trace: Path, top: int, program: Path | None = None) -> dict:
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
    program = program or next((p / PROGRAM_TEXT for p in trace.parents
                               if (p / PROGRAM_TEXT).is_file()), None)
    operations = program_operations(program.read_text()) if program else None
    cpu = cpu_calls(events, threads, operations, top)
    if cpu is not None:
        out["cpu_calls"] = {"program": str(program) if program else None, **cpu}
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
    cpu = s.get("cpu_calls")
    if cpu:
        print(f"\nXLA:CPU, wall time by operation over the {cpu['calls']} longest program "
              f"call(s), {cpu['wall_ms']:.2f} ms a call; kinds from "
              f"{cpu['program'] or 'the names (no program text)'}")
        def rate(v):
            return f"{v['gflop_per_s']:6.1f} GFLOP/s" if v["gflop_per_s"] else " " * 14
        for k, v in cpu["kinds"].items():
            print(f"  kind {k:<16} {v['ms']:9.2f} ms  {100 * v['share']:5.1f}%  {rate(v)}")
        for row in cpu["top"]:
            print(f"  {row['ms']:9.3f} ms  {row['kind']:<16} {rate(row)}  {row['name']:<28} "
                  f"{row['shape'][:32]:<32} {row['source'][-50:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path, help="a perfetto_trace.json.gz or a directory above one")
    p.add_argument("--top", type=int, default=25, help="names listed per thread")
    p.add_argument("--json", type=Path, default=None,
                   help="also write the summary here (and, for a CPU trace, its kinds as a PNG "
                        "beside it)")
    p.add_argument("--program", type=Path, default=None,
                   help=f"the compiled program's text (default: {PROGRAM_TEXT} in the trace's "
                        "directory or one above it)")
    args = p.parse_args(argv)
    if args.program is not None and not args.program.is_file():
        p.error(f"--program {args.program}: no such file")
    summary = summarize(find_trace(args.path), args.top, args.program)
    print_summary(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
        if "cpu_calls" in summary:
            plot_cpu_calls(summary["cpu_calls"], args.json.with_suffix(".png"))
    return 0


def plot_cpu_calls(cpu: dict, path: Path) -> None:
    """The CPU wall time by kind of operation, as bars (next to the ``--json`` file)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(cpu["kinds"].items())[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(kinds) + 1.2))
    ax.barh([k for k, _ in kinds], [v["ms"] for _, v in kinds], color="tab:blue")
    for i, (_, v) in enumerate(kinds):
        rate = f", {v['gflop_per_s']:.0f} GFLOP/s" if v["gflop_per_s"] else ""
        ax.text(v["ms"], i, f" {v['ms']:.1f} ms ({100 * v['share']:.1f}%{rate})", va="center")
    ax.set_xlim(0, 1.45 * max(v["ms"] for _, v in kinds))
    ax.set_xlabel("ms of wall time per call")
    ax.set_title(f"XLA:CPU, {cpu['wall_ms']:.1f} ms a call ({cpu['calls']} calls)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
