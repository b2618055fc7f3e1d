"""Tests never import each other: what they share lives in ``parity_tests/support/``.

A test module that imports another runs the other's module-level code, ties their edits together
and makes a benchmark depend on a test. Every ``.py`` file under ``parity_tests/`` and
``benchmarks/`` is read with ``ast`` (nothing is imported; milliseconds), and every import in it,
at module level or inside a function, absolute or relative, must name no ``test_*`` module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "parity_tests" / "support"


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def is_test_module(dotted: str) -> bool:
    return any(part.startswith("test_") for part in dotted.split(".") if part)


def imports_of_test_modules(path: Path) -> list[str]:
    """``line: statement`` for every import in ``path`` that names a ``test_*`` module: in the
    module path (``from parity_tests.models.test_bf16 import X``, ``from .test_bf16 import X``,
    ``import parity_tests.models.test_bf16``) or as the imported name
    (``from parity_tests.models import test_autocast``, ``from . import test_bf16``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [module] if is_test_module(module) else [
                alias.name for alias in node.names if is_test_module(alias.name)]
        else:
            continue
        if names:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", python_files("parity_tests", "benchmarks"), ids=relative)
def test_no_module_imports_a_test_module(path):
    found = imports_of_test_modules(path)
    assert not found, (f"{relative(path)} imports a test module; move what it needs into "
                       f"parity_tests/support/: {found}")


def test_support_modules_import_no_test_module():
    modules = python_files("parity_tests/support")
    assert SUPPORT / "helpers.py" in modules  # the folder this test guards is where it looks
    found = {relative(p): imports_of_test_modules(p) for p in modules}
    assert not any(found.values()), {k: v for k, v in found.items() if v}


@pytest.mark.parametrize(("source", "caught"), [
    ("from parity_tests.models.test_bf16 import FAMILIES", True),
    ("from parity_tests.models import test_autocast as t", True),
    ("import parity_tests.training.test_cli", True),
    ("from .test_invariance import SPREAD", True),
    ("from . import test_bf16", True),
    ("def f():\n    from parity_tests.training.test_cli import write_corpus", True),
    ("from parity_tests.support.bf16 import FAMILIES", False),
    ("from parity_tests.support import autocast as t", False),
    ("import learn_bert", False),
])
def test_the_check_sees_every_form(source, caught, tmp_path):
    path = tmp_path / "module.py"
    path.write_text(source + "\n")
    assert bool(imports_of_test_modules(path)) is caught


def test_the_jaxpr_walk_and_the_raw_leaves_see_everything():
    """``support.jaxprs``: the walk reaches a nested ``jit`` and both branches of a conditional,
    each equation before those nested in it; a PRNG key array comes back as its raw data."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from parity_tests.support.jaxprs import equations, raw_leaves

    inner = jax.jit(lambda x: jax.lax.cond(x.sum() > 0, lambda y: jnp.sin(y) @ y,
                                           lambda y: jnp.cos(y), x))
    jaxpr = jax.make_jaxpr(lambda x: inner(x) * 2)(jnp.ones((3, 3))).jaxpr
    names = [eqn.primitive.name for eqn in equations(jaxpr)]
    assert names.index("jit") < names.index("cond") < min(names.index("sin"), names.index("cos"))
    assert names.count("dot_general") == 1
    assert names[-1] == "mul"
    leaves = raw_leaves({"a": jnp.ones(2), "key": jax.random.key(7)})
    assert [leaf.dtype for leaf in leaves] == [np.float32, np.uint32]
    np.testing.assert_array_equal(leaves[1], jax.random.key_data(jax.random.key(7)))
