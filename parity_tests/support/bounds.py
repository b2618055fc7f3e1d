"""Tolerance checks that report their margin, and the parameters that carry no parity signal.

With ``JAXFORMER_MARGINS=FILE`` set, every bound the suite checks (``check`` here, and through
``conftest.py`` every ``np.testing.assert_allclose`` and every passing ``assert a <= b`` between
numbers) appends its measured value and bound to FILE; ``parity_tests/tools/margins.py`` runs the
suite that way on several instruction sets and thread counts and lists the smallest margins.
"""

from __future__ import annotations

import ast
import json
import math
import os
import warnings

import numpy as np

MARGINS_ENV = "JAXFORMER_MARGINS"


def record(measured: float, bound: float, what: str, where: str = "") -> None:
    """Appends one measurement to the margins file, when there is one."""
    path = os.environ.get(MARGINS_ENV)
    if not path or not (math.isfinite(measured) and math.isfinite(bound)) or bound <= 0:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    row = {"test": test, "where": where, "what": what, "measured": float(measured),
           "bound": float(bound)}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def check(measured: float, bound: float, what: str) -> None:
    """``assert measured <= bound``, recorded as a margin, with a message naming ``what``."""
    record(measured, bound, what)
    assert measured <= bound, f"{what}: {measured:.3g} > bound {bound:.3g}"


def allclose_margin(actual, desired, rtol: float, atol: float) -> tuple[float, float]:
    """``np.testing.assert_allclose`` as (measured, bound) = (max over elements of
    ``|a - d| / (atol + rtol |d|)``, 1); (0, 1) for exact or non-numeric arrays."""
    try:
        a = np.asarray(actual, dtype=np.float64)
        d = np.asarray(desired, dtype=np.float64)
        a, d = np.broadcast_arrays(a, d)
    except (TypeError, ValueError):
        return 0.0, 1.0
    finite = np.isfinite(a) & np.isfinite(d)
    diff = np.abs(a - d)[finite]
    if not diff.size or not diff.max():
        return 0.0, 1.0
    tol = atol + rtol * np.abs(d[finite])
    if (tol <= 0).any():
        return 0.0, 1.0
    return float((diff / tol).max()), 1.0


def _number(node: ast.AST) -> float:
    """The value of a literal arithmetic expression (numbers, + - * /, unary minus,
    ``np.float32(x)``-style wrappers); ValueError for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) \
            and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _number(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
        left, right = _number(node.left), _number(node.right)
        ops = {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}
        return ops[type(node.op)] if type(node.op) in ops else left / right
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
        return _number(node.args[0])  # np.float64(3e-06), float(...)
    raise ValueError("not a number")


def comparison(explanation: str) -> tuple[float, float] | None:
    """(measured, bound) of a passing ``assert measured <= bound`` (or ``<``) from pytest's
    explanation of it (its first line holds the evaluated operands), or None when the assertion
    is not a comparison of two numbers."""
    line = explanation.split("\n", 1)[0]
    try:
        with warnings.catch_warnings():  # a string operand's escapes ('\\.' in a pattern) warn
            warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
            node = ast.parse(line, mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1
            and isinstance(node.ops[0], ast.LtE | ast.Lt)):
        return None
    try:
        measured, bound = _number(node.left), _number(node.comparators[0])
    except (ValueError, ZeroDivisionError):
        return None
    return (measured, bound) if measured >= 0 and bound > 0 else None


# Attention's key-projection biases have an exact gradient of zero: softmax over the keys is
# invariant to adding the same q . b_k to every score of a query (masked scores are replaced, not
# shifted, so masks keep it so). In float32 their gradient is rounding noise (measured 1e-11 to
# 3e-9 of the gradient's norm, against 1e-17 or less in float64), and Adam, which divides by the
# gradient's own running scale, turns that noise into steps as large as any other parameter's:
# after 100 steps the two frameworks' key biases differ by 150-225% of their size. Their values are
# therefore no parity signal; the trajectory tests prove the zero gradient against a float64 run
# and compare every other parameter.
def zero_gradient(name: str) -> bool:
    """Whether the parameter ``name`` (torch state_dict key) has an exact gradient of zero."""
    return name.endswith("key.bias")
