"""Result files of the benchmark harness: the Markdown table, the PNG chart, writing and merging.

``harness.py`` imports this module (and its formatting helpers :func:`fmt` and :func:`slug`); it
imports nothing of the harness. ``python benchmarks/report.py RESULT.json`` renders a file again.
"""

# A report is the dict ``harness.Bench`` builds: ``benchmark``, ``title``, ``command``,
# ``repeats``, ``warmup``, ``environment``, ``footnote`` and ``results`` (case name -> the record
# of ``Bench.measure`` plus ``label``, ``shape``, ``notes``). Files written before the harness
# existed (``format`` absent: ``bench_forward.py`` of 2026-11-22) render too: their candidates are
# found by their statistics and their ratio sits in the case itself.

from __future__ import annotations

import json
from pathlib import Path


def fmt(x, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def slug(text: str) -> str:
    out = "".join(c.lower() if c.isalnum() else "-" for c in text)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")


def candidates(case: dict) -> list[str]:
    return case.get("candidates") or [k for k, v in case.items()
                                      if isinstance(v, dict) and "median_s" in v]


def ratios(case: dict, candidate: str):
    """(medians, paired, best) speed ratios of ``candidate`` over the baseline, or None."""
    stats = case[candidate]
    src = stats if "speed_ratio" in stats else case  # older files: in the case
    first = candidates(case)[0]
    if "speed_ratio" not in src or (src is case and candidate != first):
        return None
    return src["speed_ratio"], src["speed_ratio_paired_median"], src["speed_ratio_best"]


def baseline(case: dict) -> str:
    return case.get("baseline") or candidates(case)[-1]


def markdown(report: dict) -> str:
    env = report["environment"]
    results = report["results"]
    title = report.get("title", report.get("benchmark", "benchmark"))
    torch_precision = (f"; torch float32_matmul_precision={env['torch_float32_matmul_precision']}"
                       f", cuda.matmul.allow_tf32={env['torch_cuda_matmul_allow_tf32']}, "
                       f"cudnn.allow_tf32={env['torch_cudnn_allow_tf32']}"
                       if "torch_float32_matmul_precision" in env else "")
    torch_threads = (f"torch {env['torch_num_threads']} intra-op / "
                     f"{env['torch_num_interop_threads']} inter-op; "
                     if "torch_num_threads" in env else "")
    bases = sorted({baseline(c) for c in results.values()})
    clocks = sorted({c.get("clock", env.get("clock", "wall")) for c in results.values()})
    lines = [
        f"# {title}, {env['device']} {env['dtype']}", "",
        f"- device: {env.get('gpu') or env['cpu']} ("
        + (f"{env['cpu_details']}; " if env.get("cpu_details") else "")
        + f"{env['cpu_count']} logical CPUs, affinity {env['cpu_affinity']}); jax device "
        f"`{env['jax_device']}`" + (f", torch device `{env['torch_device']}`"
                                     if env.get("torch_device") else ""),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
        + f", python {env['python']}",
        f"- dtype {env['dtype']}; jax_default_matmul_precision="
        f"{env['jax_default_matmul_precision']}, jax_enable_x64={env['jax_enable_x64']}"
        + torch_precision,
        f"- threads: {torch_threads}jax: {env['jax_cpu_threads']}; XLA_FLAGS="
        f"`{env['XLA_FLAGS'] or '(unset)'}`",
        f"- timing: {' / '.join(clocks)} clock, {report['warmup']} warm-up calls after "
        f"compiling, {report['repeats']} interleaved rounds (ABBA); median [p25-p75]",
        f"- speed ratio = candidate speed / {', '.join(bases)} speed (> 1: faster): of the "
        "medians; the median of the per-round ratios; of the best times", "",
        "| case | shape | candidate | median ms [p25-p75] | min ms | tokens/s | model GFLOP/s "
        "| MFU | speed ratio (medians; paired; best) |",
        "|---|---|---|---|---|---|---|---|---|"]
    for name, case in results.items():
        for i, k in enumerate(candidates(case)):
            s, r = case[k], ratios(case, k)
            ratio = f"**{r[0]:.3f}**; {r[1]:.3f}; {r[2]:.3f}" if r else ""
            gflops = s.get("model_flops_per_s")
            mfu = s.get("mfu")
            lines.append(
                f"| {case.get('label', name) if i == 0 else ''} | "
                f"{case.get('shape', _shape(case)) if i == 0 else ''} | {k} | "
                f"{1e3 * s['median_s']:.2f} [{1e3 * s['p25_s']:.2f}-{1e3 * s['p75_s']:.2f}] | "
                f"{1e3 * s['min_s']:.2f} | {fmt(s.get('tokens_per_s'), ',.0f')} | "
                f"{fmt(gflops and gflops / 1e9, '.1f')} | "
                f"{fmt(mfu and 100 * mfu, '.1f')}{'%' if mfu else ''} | {ratio} |")
    notes = list(dict.fromkeys(k for c in results.values() for k in c.get("notes", {})))
    lines += ["", "| case | model GFLOP/call | " + "".join(f"{n} | " for n in notes)
              + "matmul peak jax / torch (GFLOP/s, best) | device peak | other processes' cores "
              "during timing | load avg before / after | measured at (UTC) |",
              "|---|---|" + "---|" * len(notes) + "---|---|---|---|---|"]
    for name, case in results.items():
        p = case.get("peak")
        peak = (f"{p['jax']['best_flops'] / 1e9:.1f} / "
                f"{fmt(p.get('torch', {}).get('best_flops', 0) / 1e9 or None, '.1f')} "
                f"({p['size']}^3 {p['dtype']})" if p else "n/a")
        flop = case.get("model_flop")
        lines.append(
            f"| {name} | {fmt(flop and flop / 1e9, '.4g')} | "
            + "".join(f"{case.get('notes', {}).get(n, '')} | " for n in notes)
            + f"{peak} | {fmt(p and p['device_peak_flops'] / 1e9, '.1f')} | "
            f"{fmt(case.get('foreign_cores_during_timing'))} | {case.get('loadavg_before')} / "
            f"{case.get('loadavg_after')} | {case.get('measured_at_utc')} |")
    commands = sorted({c.get("command", report["command"]) for c in results.values()})
    lines += ["", "Command" + ("s" if len(commands) > 1 else "") + ": "
              + "; ".join(f"`{c}`" for c in commands), ""]
    if any("peak" in c for c in results.values()):
        lines += ["MFU = model FLOPs per call / median time / device peak (the better "
                  "framework's best square-matmul rate, measured before and after each case in "
                  "the same run). Model FLOPs: 2 per multiply-add of every matrix product "
                  "(jaxformer/models/flops.py).", ""]
    if report.get("footnote"):
        lines += [report["footnote"], ""]
    return "\n".join(lines)


def _shape(case: dict) -> str:
    if "batch" not in case:
        return ""
    return f"{case['batch']} x {case['seq']}" + (f"+{case['tgt_seq']}" if "tgt_seq" in case
                                                  else "")


def plot(report: dict, path: Path) -> None:
    """One panel per case: each candidate's throughput (tokens/s, else model GFLOP/s, else
    calls/s) at the median time, whiskers from the p75 and p25 times, speed ratios in the
    labels."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    env = report["environment"]
    cols = min(3, len(results))
    rows = -(-len(results) // cols)
    height = 0.6 * max(len(candidates(c)) for c in results.values()) + 1.6
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, height * rows + 0.4), squeeze=False)
    for ax in axes.flat[len(results):]:
        ax.set_visible(False)
    for ax, (name, case) in zip(axes.flat, results.items()):
        names = candidates(case)
        if case.get("tokens_per_call"):
            work, unit = case["tokens_per_call"], "tokens/s"
        elif case.get("model_flop"):
            work, unit = case["model_flop"] / 1e9, "model GFLOP/s"
        else:
            work, unit = 1.0, "calls/s"
        med = [work / case[k]["median_s"] for k in names]
        low = [m - work / case[k]["p75_s"] for m, k in zip(med, names)]
        high = [work / case[k]["p25_s"] - m for m, k in zip(med, names)]
        colors = ["#bbbbbb" if k == baseline(case) else "#3b75af" for k in names]
        ax.barh(range(len(names)), med, xerr=[low, high], color=colors, capsize=4)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels([k + (f"\n{ratios(case, k)[0]:.3f}x" if ratios(case, k) else "")
                            for k in names])
        ax.invert_yaxis()
        ax.set_xlabel(unit + " (median, p25-p75)")
        ax.set_title(f"{case.get('label', name)}\n{case.get('shape', _shape(case))}", fontsize=9)
    fig.suptitle(f"{report.get('title', '')}: {env.get('gpu') or env['cpu']}, {env['dtype']}, "
                 f"{env['date_utc'][:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stem(report: dict) -> str:
    env = report["environment"]
    device = env.get("gpu") or f"{env['cpu']} {env['cpu_affinity']}c"
    out = (f"{report['benchmark']}_{env['device']}-{slug(device)}_{env['dtype']}_"
           f"{env['date_utc'][:10]}")
    return out + (f"_{slug(report['tag'])}" if report.get("tag") else "")


def write(report: dict, out_dir: Path, merge: bool = True):
    """Write ``<stem>.json``, ``.md`` and ``.png``; with ``merge`` the cases of an existing
    same-named file stay (a re-measured case replaces its old record). Returns (the report
    written, the paths)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem(report)}.json"
    if merge and path.exists():
        old = json.loads(path.read_text())
        if (old.get("benchmark"), old.get("format")) != (report["benchmark"], report["format"]):
            raise SystemExit(f"{path} exists and holds other results (not {report['benchmark']!r}"
                             f" format {report['format']}); keep it: choose --out or --tag")
        report = {**report, "results": {**old.get("results", {}), **report["results"]}}
    path.write_text(json.dumps(report, indent=1) + "\n")
    md, png = path.with_suffix(".md"), path.with_suffix(".png")
    md.write_text(markdown(report))
    plot(report, png)
    return report, [path, md, png]


def main(argv=None) -> int:
    """``python benchmarks/report.py RESULT.json [--out DIR]``: render a result file's Markdown
    table and PNG chart again (older files included), beside it or into ``--out``."""
    import argparse
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("json", type=Path)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    report = json.loads(args.json.read_text())
    out = (args.out or args.json.parent) / args.json.stem
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(markdown(report))
    plot(report, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
