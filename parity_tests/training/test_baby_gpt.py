"""``benchmarks/baby_gpt.py`` prints a readable summary: a greedy sample of a barely trained
model (``--steps 20``: 300 newlines, the most likely character after a newline) used to print 300
blank lines per framework. The summary is checked on a made-up run, without training."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import baby_gpt

RUN = {"final_val_loss": 3.3, "wall_s": 12.0, "evaluations_s": 1.3, "checkpoints_s": 0.5,
       "sample_s": 2.0, "loadavg_before": [0.5, 0.5, 0.5], "loadavg_after": [1.0, 0.6, 0.5],
       "foreign_cores": 0.1}


def test_a_sample_of_newlines_prints_a_few_lines():
    text = baby_gpt.summary("jax", {**RUN, "sample": "\n" * 300}, "\n")
    assert text.count("\n") <= 3, text
    assert "[300 blank lines]" in text


def test_a_real_sample_prints_as_it_is():
    sample = "ROMEO:\nWhat light?\n\nJULIET:\nAy me."
    text = baby_gpt.summary("torch", {**RUN, "sample": sample}, "\n")
    assert text.endswith("\n" + sample)
    assert text.startswith("== torch: final val loss 3.3000, wall 12.0 s (evaluations 1.3 s, "
                           "checkpoints 0.5 s), sample 2.0 s")
    assert baby_gpt.shown("a\n\n\nb") == "a\n\n\nb"  # two blank lines stay
    assert baby_gpt.shown("a\n\n\n\nb") == "a\n[3 blank lines]\nb"
