"""Rows of the parity table and their bounds, including the float64 reference for jit vs eager.

Forward outputs: max abs diff <= 1e-5 x max(1, max |expected|) (the project's tolerance table,
docs/design.md), over the rows that carry meaning. The jit-vs-eager bound is below, with the
measurements it rests on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import jax
import numpy as np
import torch

FORWARD_RTOL = 1e-5
JIT_TOL = 1e-6
# Two float32 evaluations that are each within d of the exact value are within 2d of each other.
JIT_NOISE_FACTOR = 2.0

# Why jit and eager differ, and the bound for it.
#
# Eager NNX runs each jnp operation as its own small compiled program; under `jax.jit` XLA
# fuses the whole model. Matmuls give bit-identical results both ways (the same kernels, the
# same summation order; the tied LM head on the same hidden states too), but reductions and
# elementwise code inside fusions round differently: on one GPT-2 block (width 768, 3 x 16
# tokens), LayerNorm differs by 1 ulp (2.4e-7) in 7.5% of its outputs, tanh-GELU in 0.3%, and
# the block output in 66%. Those ulps spread through the following layers exactly as any
# float32 rounding does. So jit and eager are two float32 evaluations of the same function, and
# the question is only whether jit is as accurate as eager, which a float64 run answers.
#
# Measured against the same model run in float64 (the torch twin, `.double()`, whose own
# rounding is ~5e8 times finer), scale-relative, GPT-2 small (3 x 16 tokens, logits):
#   seed 0/1/2: eager 1.30/1.33/1.21e-6, jit 1.26/1.22/1.33e-6, torch_ref 0.84/0.81/0.77e-6,
#               jit vs eager 1.20/1.34/1.64e-6
#   BERT-base MLM logits, seeds 0/1: eager 0.86/0.95e-6, jit 1.07/0.99e-6, jit vs eager
#               0.95/1.06e-6; Transformer base logits: all below 0.5e-6.
# jit is as close to float64 as eager is, and they differ from each other by as much as each
# differs from the exact value: the tolerance table's 1e-6 is below float32's own error at full
# size, so no two correct float32 evaluations that round differently can meet it there. The gap
# hardly grows with depth (GPT-2 width 768, 1/3/6/12/24 layers: 1.2/1.3/1.2/1.3/1.4e-6; most
# of it is there after one block) and slowly with width (12 layers, widths 192/384/768/1536:
# 0.7/0.9/1.3/1.3e-6). It is proportional to the logits' scale: multiplying the final
# LayerNorm's weight by 4 or 16 (max |logit| 2.7 -> 10.8 -> 43) leaves the scale-relative gap
# unchanged to three digits, so the bound scales with the output. At the tiny presets the gap
# is ~1e-7.
#
# The bound: max(1e-6 x scale, 2 x d), where d is the larger max abs error against float64 of
# the two evaluations that do not involve jit (torch_ref float32 and eager jaxformer). Since
# |jit - eager| <= |jit - exact| + |eager - exact|, the row can fail only if jit is further from
# the exact result than both of them: a precision loss under jit (TF32 matmuls keep 10
# mantissa bits, ~1e-3 relative; test_parity_job checks that bfloat16 rounding fails it) or
# a semantic difference (mask, mode, state) fails it, while two roundings of equal quality
# pass. At tiny sizes d is ~1e-7 and the tolerance table's 1e-6 applies. At base size, seeds 0 to 5,
# every family's |jit - eager| stayed between 0.29 and 0.68 of this bound (the 0.68: GPT-2
# logits, seed 2): correct roundings pass with a margin of at least 1.47x.


# What a row compares: the component (or full model) of jaxformer against its torch_ref twin, a
# float32 evaluation against the float64 run of the torch twin, or jitted against eager jaxformer.
TWINS = "jaxformer vs torch_ref"
JIT_VS_EAGER = "jit vs eager"


def against_float64(who: str) -> str:
    return f"{who} vs float64"


@dataclasses.dataclass
class Row:
    family: str
    component: str
    max_abs_diff: float
    bound: float
    compared: str = TWINS  # the two things whose difference max_abs_diff is

    @property
    def passed(self) -> bool:
        return bool(self.max_abs_diff <= self.bound)  # NaN fails


def to_numpy(x) -> np.ndarray:
    """float64 numpy, so that float64 references keep their digits."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def scale(x) -> float:
    return max(1.0, float(np.abs(x).max(initial=0.0)))


def max_abs_diff(expected, actual) -> float:
    return float(np.abs(expected - actual).max(initial=0.0))


def compare(family, component, expected, actual, rows=None, tol=FORWARD_RTOL) -> Row:
    """Row for ``component``; ``rows`` (bool over leading axes) selects the meaningful rows."""
    expected, actual = to_numpy(expected), to_numpy(actual)
    if expected.shape != actual.shape:
        return Row(family, f"{component} (shape {expected.shape} vs {actual.shape})",
                   float("inf"), 0.0)
    if rows is not None:
        expected, actual = expected[rows], actual[rows]
    return Row(family, component, max_abs_diff(expected, actual), tol * scale(expected))


def leaves(outputs) -> list:
    """A model's outputs (an array or a tuple of them; None entries dropped) as a list."""
    return [x for x in jax.tree.leaves(outputs, is_leaf=lambda x: isinstance(x, torch.Tensor))
            if x is not None]


def full_model_rows(family: str, model: str, names, torch32, eager, jitted, float64,
                    rows) -> Iterator[Row]:
    """For each output of the full model: torch_ref vs jaxformer, then each float32 evaluation
    (torch_ref, eager and jitted jaxformer) against the float64 run, then jit vs eager with the
    bound derived above. ``rows[i]`` selects output ``i``'s meaningful rows (None: all)."""
    outputs = zip(names, leaves(torch32), leaves(eager), leaves(jitted), leaves(float64), rows)
    for name, t32, eag, jit, f64, where in outputs:
        t32, eag, jit, f64 = (to_numpy(x) if where is None else to_numpy(x)[where]
                              for x in (t32, eag, jit, f64))
        label = f"{model}: {name}"
        yield compare(family, label, t32, eag)
        errors = {}
        for who, value in (("torch_ref", t32), ("jaxformer", eag), ("jaxformer jit", jit)):
            errors[who] = max_abs_diff(f64, value)
            yield Row(family, label, errors[who], FORWARD_RTOL * scale(f64),
                      against_float64(who))
        noise = max(errors["torch_ref"], errors["jaxformer"])
        yield Row(family, label, max_abs_diff(eag, jit),
                  max(JIT_TOL * scale(eag), JIT_NOISE_FACTOR * noise), JIT_VS_EAGER)
