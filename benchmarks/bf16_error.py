"""bfloat16 error, measured: each family's outputs and gradients in float32 and bfloat16, in
jaxformer and in torch_ref, against the torch twin run in float64 with the same weights.

    PYTHONPATH=. .venv/bin/python benchmarks/bf16_error.py [--seeds 8]

The models, inputs, weights and error measures are those of
``parity_tests/models/test_autocast.py`` (shared through ``parity_tests/support/autocast.py``),
whose bounds are set from this script's output
(``benchmarks/results/bf16_error.json``): jaxformer in float32, with ``dtype="bfloat16"``
(float32 parameters) and in pure bfloat16 (``param_dtype="bfloat16"`` too); torch_ref in float32
and under ``torch.autocast("cpu", dtype=torch.bfloat16)``; and the difference between jaxformer
bfloat16 and torch_ref autocast, over the float64 output's scale. Errors are scale-relative max
abs differences (outputs: over max(1, max |float64 output|), real positions only; gradients: the
worst parameter, over its largest float64 gradient).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

COLUMNS = ("jax_float32", "torch_float32", "jax_bfloat16", "jax_pure_bfloat16", "torch_autocast",
           "jax_bfloat16_vs_torch_autocast")


def measure(family: str, seed: int) -> dict[str, dict[str, float]]:
    """{output or "grads" or "loss": {column: error}} for one family and seed."""
    from parity_tests.support import autocast as t

    model = t.torch_model(family, seed)
    state = model.state_dict()
    ref_out, ref_loss, ref_grads = t.run_torch(family, model, "float64")
    runs = {"jax_float32": t.run_jax(family, state, "float32"),
            "torch_float32": t.run_torch(family, model, "float32"),
            "jax_bfloat16": t.run_jax(family, state, "bfloat16"),
            "jax_pure_bfloat16": t.run_jax(family, state, "bfloat16", "bfloat16"),
            "torch_autocast": t.run_torch(family, model, "autocast")}
    rows: dict[str, dict[str, float]] = {}
    for column, (outputs, loss, grads) in runs.items():
        for name, err in t.output_errors(family, ref_out, outputs).items():
            rows.setdefault(name, {})[column] = err
        rows.setdefault("grads", {})[column] = t.grad_error(ref_grads, grads, ref_grads)
        rows.setdefault("loss", {})[column] = abs(loss - ref_loss) / max(1.0, abs(ref_loss))
    jax_out, jax_loss, jax_grads = runs["jax_bfloat16"]
    torch_out, torch_loss, torch_grads = runs["torch_autocast"]
    between = "jax_bfloat16_vs_torch_autocast"
    for name, err in t.output_errors(family, torch_out, jax_out, ref_out).items():
        rows[name][between] = err
    rows["grads"][between] = t.grad_error(torch_grads, jax_grads, ref_grads)
    rows["loss"][between] = abs(jax_loss - torch_loss) / max(1.0, abs(ref_loss))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8, help="weight seeds 0 .. N-1 (8)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "bf16_error.json"))
    args = parser.parse_args(argv)
    import jax
    import torch

    jax.config.update("jax_default_matmul_precision", "highest")  # as the parity suite
    torch.set_num_threads(1)
    from parity_tests.support.autocast import OUTPUTS

    began, load_before = time.time(), os.getloadavg()
    per_seed: dict[str, list] = {}
    for family in OUTPUTS:
        for seed in range(args.seeds):
            rows = measure(family, seed)
            for name, row in rows.items():
                per_seed.setdefault(f"{family}/{name}", []).append(row)
            print(f"{family} seed {seed}: " + "  ".join(
                f"{name} bf16 {row['jax_bfloat16']:.2e}/{row['torch_autocast']:.2e} "
                f"between {row['jax_bfloat16_vs_torch_autocast']:.2e}"
                for name, row in rows.items()), flush=True)
    summary = {key: {column: {"min": min(r[column] for r in rows),
                              "max": max(r[column] for r in rows)} for column in COLUMNS}
               for key, rows in per_seed.items()}
    print(f"\n{'output':24s}" + "".join(f"{c:>34s}" for c in COLUMNS))
    for key, row in summary.items():
        print(f"{key:24s}" + "".join(f"{row[c]['min']:15.2e} .. {row[c]['max']:.2e}"
                                     for c in COLUMNS))
    result = {"command": " ".join([sys.executable, *sys.argv]),
              "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "cpus": os.cpu_count(), "loadavg_before": load_before,
                          "loadavg_after": os.getloadavg()},
              "versions": {"jax": jax.__version__, "torch": torch.__version__},
              "seconds": round(time.time() - began, 1), "seeds": args.seeds,
              "summary": summary, "per_seed": per_seed}
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
