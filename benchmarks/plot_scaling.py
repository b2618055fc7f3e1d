#!/usr/bin/env python
"""Training-step cost against model size and batch size, both frameworks, from the result files
of ``bench_train.py`` (nothing is timed here).

Every case of every file given is one point per framework: jaxformer's default step and torch_ref
eager (the medians of the file's interleaved rounds). Left: median step time against the
model's parameter count (``jaxformer.models.flops.parameter_count``), per model the case
nearest 512 tokens per step, at its own shape (labelled). Right: milliseconds per token against
the batch size, one line per model and framework, for the models measured at several batch
sizes. Writes a PNG and a JSON of the points.

    python benchmarks/plot_scaling.py results/train_cpu-...issue24-*.json \\
        --out results/train-scaling_cpu-amd-epyc-1c_float32_2026-11-25.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import harness  # noqa: F401  (puts the repository on sys.path)

FRAMEWORKS = {"jaxformer": ("tab:blue", "o-"), "torch_ref eager": ("tab:orange", "s--")}


def points(paths: list[Path]) -> list[dict]:
    from jaxformer import config as jconfig
    from jaxformer.models import flops

    out = []
    for path in paths:
        report = json.loads(path.read_text())
        for case in report["results"].values():
            cls = jconfig.BertConfig if case["family"] == "bert" else jconfig.GPTConfig
            cfg = cls(**{k: v for k, v in case["model_config"].items() if k != "class"})
            options = {"model": "BertForPreTraining"} if case["family"] == "bert" else {}
            for name in FRAMEWORKS:
                if name in case:
                    out.append({"model": case["model"], "label": case["label"],
                                "parameters": flops.parameter_count(cfg, **options),
                                "batch": case["batch"], "seq": case["seq"],
                                "framework": name, "median_s": case[name]["median_s"],
                                "speed_ratio": case[name].get("speed_ratio"),
                                "clock": case["clock"], "file": path.name,
                                "measured_at_utc": case["measured_at_utc"]})
    return out


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxformer.training.reporting import save_figure

    fig, (size_ax, batch_ax) = plt.subplots(1, 2, figsize=(12, 5))
    for name, (color, style) in FRAMEWORKS.items():
        mine = [r for r in rows if r["framework"] == name]
        # model size: one point per model, the case nearest 512 tokens per step (4 x 128)
        best = {}
        for r in sorted(mine, key=lambda r: (abs(r["batch"] * r["seq"] - 512),
                                             -r["batch"] * r["seq"])):
            best.setdefault(r["model"], r)
        by_size = sorted(best.values(), key=lambda r: r["parameters"])
        size_ax.plot([r["parameters"] / 1e6 for r in by_size],
                     [r["median_s"] * 1e3 for r in by_size], style, color=color, label=name)
        for r in by_size:
            if name == "jaxformer":
                size_ax.annotate(f"{r['model']} {r['batch']}x{r['seq']}",
                                 (r["parameters"] / 1e6, r["median_s"] * 1e3), fontsize=7,
                                 textcoords="offset points", xytext=(4, -10))
        for model in sorted({r["model"] for r in mine}):
            line = sorted((r for r in mine if r["model"] == model), key=lambda r: r["batch"])
            if len(line) > 1:
                batch_ax.plot([r["batch"] for r in line],
                              [r["median_s"] * 1e3 / (r["batch"] * r["seq"]) for r in line],
                              style, color=color, label=f"{model} ({line[0]['seq']} tokens), "
                                                       f"{name}")
    clocks = {r["clock"] for r in rows}
    clock = {"cpu": "CPU time", "wall": "wall clock"}[clocks.pop()] if len(clocks) == 1 else \
        "mixed clocks"
    size_ax.set(xscale="log", yscale="log", xlabel="parameters (millions)",
                ylabel=f"median train step (ms, {clock})", title="step time vs model size")
    batch_ax.set(xscale="log", xlabel="batch size (sequences)", ylabel="ms per token",
                 title="cost per token vs batch size")
    for ax in (size_ax, batch_ax):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="bench_train.py result JSON files")
    parser.add_argument("--out", type=Path, required=True, help="the PNG (a .json beside it)")
    parser.add_argument("--title", default="Training step (fwd + bwd + AdamW), jaxformer vs "
                                            "torch_ref eager")
    args = parser.parse_args(argv)
    for path in args.files:
        if not path.is_file():
            parser.error(f"no such result file: {path}")
    rows = points(args.files)
    if not rows:
        parser.error("the files hold no jaxformer or torch_ref eager candidate")
    plot(rows, args.out, args.title)
    args.out.with_suffix(".json").write_text(json.dumps({"points": rows}, indent=1) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
