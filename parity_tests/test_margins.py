"""The margin recorder and the margins run: what they read, record and report."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from parity_tests.support import bounds
from parity_tests.tools import margins


@pytest.mark.parametrize(("explanation", "expected"), [
    ("1.5e-06 <= 1e-05", (1.5e-6, 1e-5)),
    ("np.float64(3e-06) <= 0.0001\n +  where np.float64(3e-06) = ...", (3e-6, 1e-4)),
    ("1e-07 <= (1e-06 * 2.0)\n +  where ...", (1e-7, 2e-6)),
    ("0.5 < (0.9 * 2)", (0.5, 1.8)),
    ("2 == 2", None),  # not a bound
    ("1e-5 >= 1e-6", None),  # a floor, not a bound
    ("'a' <= 'b'", None),
    ("'manifest\\.json' <= 'x'", None),  # an escape Python warns about: read silently
    ("-1.0 <= 1.0", None),  # a negative measurement is no distance
    ("x <= 1e-05", None),  # an operand pytest could not show as a number
])
def test_comparison_reads_pytests_explanation(explanation, expected):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert bounds.comparison(explanation) == expected
    assert not caught, [str(w.message) for w in caught]


def test_allclose_margin_is_the_worst_element_over_its_tolerance():
    measured, bound = bounds.allclose_margin([1.0, 2.0 + 1e-6], [1.0, 2.0], rtol=1e-6, atol=0)
    assert bound == 1.0
    assert measured == pytest.approx(0.5, rel=1e-6)
    assert bounds.allclose_margin([1.0], [1.0], rtol=1e-6, atol=0) == (0.0, 1.0)


def test_check_records_only_in_a_margins_run(tmp_path, monkeypatch):
    record = tmp_path / "margins.jsonl"
    monkeypatch.delenv(bounds.MARGINS_ENV, raising=False)
    bounds.check(1e-6, 1e-5, "quiet")
    assert not record.exists()
    monkeypatch.setenv(bounds.MARGINS_ENV, str(record))
    bounds.check(2e-6, 1e-5, "recorded")
    with pytest.raises(AssertionError, match=r"too far: 2e-05 > bound 1e-05"):
        bounds.check(2e-5, 1e-5, "too far")
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(r["what"], r["measured"], r["bound"]) for r in rows] == [
        ("recorded", 2e-6, 1e-5), ("too far", 2e-5, 1e-5)]
    assert rows[0]["test"].endswith("test_check_records_only_in_a_margins_run")


def test_isa_caps_name_both_frameworks_or_one():
    assert margins.isa_env("default") == {}
    both = margins.isa_env("AVX2")
    assert both["XLA_FLAGS"] == "--xla_cpu_max_isa=AVX2"
    assert both["ATEN_CPU_CAPABILITY"] == "avx2"
    assert both["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert set(margins.isa_env("jax=AVX")) == {"XLA_FLAGS"}
    assert "XLA_FLAGS" not in margins.isa_env("torch=AVX512")
    with pytest.raises(SystemExit, match="--isa 'SSE9'"):
        margins.isa_env("SSE9")


def test_report_keeps_each_bounds_smallest_margin(tmp_path, capsys):
    rows = {"isa-default-2-cores": [("t::a", 1e-6, 1e-5), ("t::b", 6e-6, 1e-5)],
            "isa-AVX-2-cores": [("t::a", 2e-6, 1e-5), ("t::b", 1e-6, 1e-5)]}
    for name, checks in rows.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(
            json.dumps({"test": t, "where": "f.py:1", "what": "x", "measured": m, "bound": b})
            + "\n" for t, m, b in checks))
    out = tmp_path / "low.json"
    assert margins.main(["--records", str(tmp_path), "--report-only", "--out", str(out)]) == 0
    low = json.loads(out.read_text())["margins"]
    assert [(r["test"], r["config"]) for r in low] == [("t::b", "isa-default-2-cores")]
    assert np.isclose(low[0]["margin"], 1e-5 / 6e-6)
    assert "1 with a margin below 2" in capsys.readouterr().out
