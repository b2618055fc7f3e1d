"""The main job, `jaxformer parity`: the base preset of every family passes, and its bounds mean
something (the jit-vs-eager bound fails a jit that loses precision or changes the result).

The base run (BERT-base, GPT-2 small, Transformer base, the float64 reference included) costs
about 70 s of CPU on the 2-core CI machine, so it runs once, through the command line as a user
runs it; the tiny preset's code path is the same and is not run again here.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxformer import cli, parity
from jaxformer.parity.compare import FORWARD_RTOL, JIT_TOL, full_model_rows


def test_base_preset_every_family_passes(capsys):
    code = cli.main(["parity", "--preset", "base", "--json"])
    report = json.loads(capsys.readouterr().out)
    failed = [f"{r['family']}: {r['component']} {r['max_abs_diff']:.3e} > {r['bound']:.1e}"
              for r in report["rows"] if not r["pass"]]
    assert not failed, "\n".join(failed)
    assert report["passed"], "\n".join(failed)
    assert code == 0, "\n".join(failed)
    assert {r["family"] for r in report["rows"]} == set(parity.available_families())
    for family in parity.available_families():
        compared = [r["compared"] for r in report["rows"] if r["family"] == family]
        assert "jit vs eager" in compared, family
        assert "jaxformer jit vs float64" in compared, family
    print(f"\nbase preset, every family: {len(report['rows'])} rows, {report['seconds']} s")


def _outputs(seed: int = 0, shape=(3, 16, 200)):
    """A float64 'exact' output and three float32 evaluations of it that round differently:
    each is the exact value rounded to float32 after a relative perturbation of a few ulps,
    as a longer float32 computation would leave it."""
    rng = np.random.default_rng(seed)
    exact = 3.0 * rng.standard_normal(shape)
    eps = np.finfo(np.float32).eps

    def float32_eval():
        return (exact * (1 + 4 * eps * rng.standard_normal(shape))).astype(np.float32)

    return exact, float32_eval(), float32_eval(), float32_eval()


REAL = np.ones((3, 16), dtype=bool)
REAL[1:, 12:] = False  # padded query rows are not compared


def _rows(torch32, eager, jit, exact):
    return {r.compared: r
            for r in full_model_rows("f", "M", ("out",), torch32, eager, jit, exact, (REAL,))}


def test_jit_bound_passes_three_roundings_of_equal_quality():
    exact, torch32, eager, jit = _outputs()
    rows = _rows(torch32, eager, jit, exact)
    assert set(rows) == {"jaxformer vs torch_ref", "torch_ref vs float64", "jaxformer vs float64",
                         "jaxformer jit vs float64", "jit vs eager"}
    assert all(row.passed for row in rows.values()), rows
    noise = max(rows[who].max_abs_diff for who in ("torch_ref vs float64", "jaxformer vs float64"))
    assert rows["jit vs eager"].bound == pytest.approx(2 * noise)


@pytest.mark.parametrize("damage", ["bfloat16", "one_row_changed", "real_position_wrong"])
def test_jit_bound_fails_a_worse_jit(damage):
    exact, torch32, eager, jit = _outputs()
    if damage == "bfloat16":  # a compiled path that rounds to 8 mantissa bits
        bits = jit.view(np.uint32) & np.uint32(0xFFFF0000)
        jit = bits.view(np.float32)
    elif damage == "one_row_changed":
        jit = jit.copy()
        jit[2, 3] += 1e-4 * np.abs(exact).max()
    else:  # a real position whose value comes out of a different (wrong) computation
        jit = jit.copy()
        jit[0, 15] = jit[0, 14]
    rows = _rows(torch32, eager, jit, exact)
    assert not rows["jit vs eager"].passed, rows["jit vs eager"]
    assert rows["jaxformer vs float64"].passed
    assert rows["torch_ref vs float64"].passed


def test_jit_bound_at_small_noise_is_design_md():
    """Where float32 noise is tiny (the tiny presets), the bound is DESIGN.md's 1e-6 x scale."""
    exact, *_ = _outputs()
    exact32 = exact.astype(np.float32)
    rows = _rows(exact32, exact32, exact32, exact32.astype(np.float64))
    scale = max(1.0, float(np.abs(exact32[REAL]).max()))
    assert rows["jit vs eager"].bound == pytest.approx(JIT_TOL * scale)
    assert rows["jaxformer vs float64"].bound == pytest.approx(FORWARD_RTOL * scale)
