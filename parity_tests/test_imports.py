"""The import arrows of ``jaxformer``, ``torch_ref`` and ``benchmarks``: no cycle, none into torch.

Read from source with ``ast`` (nothing imported): (a) the module graph has no cycle, counting
imports inside functions and through a package ``__init__``; (b) no ``jaxformer`` module imports
``torch_ref`` or ``torch`` by name, except the parity job and the exceptions listed below with
their reasons (twins are chosen through ``jaxformer.frameworks``); (c) in a fresh interpreter,
``import jaxformer`` and the commands that do not select torch (to ``--help``) leave torch out.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jaxformer", "torch_ref")  # imported as packages: `jaxformer.nn.attention`
SCRIPTS = "benchmarks"  # a folder of scripts: `import harness` there names benchmarks/harness.py

# (module, what it imports) -> why a jaxformer module may import torch by name.
ALLOWED = {
    ("jaxformer.frameworks", "torch"):
        "the registry itself: it checks that torch is installed before it imports a twin, so the "
        "error names the extra to install",
    ("jaxformer.checkpoints.hf", "torch"):
        "from_pretrained(framework='torch') fills the torch twin (taken through "
        "frameworks.module) with torch tensors; only on that path",
    ("jaxformer.loading", "torch"):
        "load(framework='torch') fills the torch twin with torch tensors and puts back torch's "
        "global RNG state, which building the twin and restoring a torch checkpoint reset; only "
        "on that path",
    ("jaxformer.checkpoints.hf.files", "torch"):
        "pytorch_model.bin is a torch pickle that only torch.load reads; only for such a file "
        "(safetensors needs no torch)",
}
PARITY_JOB = "jaxformer.parity"  # compares against torch by nature: may import torch itself
TORCH = ("torch", "torch_ref")


@dataclasses.dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported: one of the tree's when internal, else as written
    line: int
    internal: bool


def find_modules(root: Path, packages=PACKAGES, scripts=SCRIPTS) -> dict[str, Path]:
    """Dotted module name -> file: a package is its ``__init__.py``."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    if scripts:
        for path in sorted((root / scripts).glob("*.py")):
            modules[f"{scripts}.{path.stem}"] = path
    return modules


def _known(name: str, modules) -> str | None:
    """The longest prefix of ``name`` that is a module of the tree."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def read_imports(module: str, path: Path, modules, scripts=SCRIPTS) -> list[Import]:
    """Every import of ``path``, at module level or in a function: ``import a.b``, ``from a
    import b`` (``a.b`` when ``b`` is a module, else ``a``), relative forms, and
    ``importlib.import_module`` / ``__import__`` of a literal name."""
    in_scripts = scripts is not None and module.startswith(f"{scripts}.")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def named(name: str) -> str:  # a script's `import harness` names the script beside it
        if in_scripts and f"{scripts}.{name.split('.')[0]}" in modules:
            return f"{scripts}.{name}"
        return name

    found = []

    def add(name: str, line: int, base: str | None = None):
        target = _known(name, modules) if base is None else (
            name if name in modules else _known(base, modules))
        found.append(Import(module, target or base or name, line, target is not None))

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(named(alias.name), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = named(node.module)
            for alias in node.names:
                add(f"{base}.{alias.name}", node.lineno, base)
        elif (isinstance(node, ast.Call) and node.args
              and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                             "__import__")
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(named(node.args[0].value), node.lineno)
    return found


def build_graph(root: Path = ROOT, packages=PACKAGES, scripts=SCRIPTS):
    """``(edges, imports)``: module -> {imported module of the tree: first line}, and every
    module's imports (internal and external)."""
    modules = find_modules(root, packages, scripts)
    imports = {m: read_imports(m, p, modules, scripts) for m, p in modules.items()}
    edges: dict[str, dict[str, int]] = {m: {} for m in modules}
    for module, found in imports.items():
        for imp in found:
            if imp.internal and imp.target != module:
                edges[module].setdefault(imp.target, imp.line)
    return edges, imports


def find_cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component that has one (Tarjan)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:  # the shortest cycle through its first module, by BFS
        start = min(component)
        paths = {start: [start]}
        queue = [start]
        while queue:
            v = queue.pop(0)
            for w in sorted(edges[v]):
                if w == start:
                    cycles.append([*paths[v], start])
                    queue = []
                    break
                if w in component and w not in paths:
                    paths[w] = [*paths[v], w]
                    queue.append(w)
    return sorted(cycles)


def describe(cycle: list[str], edges, modules) -> str:
    steps = [f"    {modules[a].relative_to(ROOT) if modules[a].is_relative_to(ROOT) else a}:"
             f"{edges[a][b]} imports {b}" for a, b in itertools.pairwise(cycle)]
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


# ---------------------------------------------------------------------------------------------
# (a) no cycle
# ---------------------------------------------------------------------------------------------

def test_no_import_cycle():
    edges, _ = build_graph()
    modules = find_modules(ROOT)
    cycles = find_cycles(edges)
    assert not cycles, "import cycles (break each arrow that goes the wrong way):\n" + "\n".join(
        describe(c, edges, modules) for c in cycles)


def test_graph_sees_every_form():
    edges, _ = build_graph()
    assert edges["jaxformer.nn.params"]["jaxformer.sharding"]  # from jaxformer.sharding import x
    assert edges["jaxformer.training.step"]["jaxformer.sharding"]  # from jaxformer import sharding
    assert edges["jaxformer.sharding.demo"]["jaxformer.training.step"]  # inside a function
    assert edges["benchmarks.harness"]["benchmarks.report"]  # a script's `import report`
    assert "jaxformer.sharding.demo" not in edges["jaxformer.sharding"]


def test_cycle_finder_names_cycles(tmp_path):
    files = {
        "pkg/__init__.py": "from pkg import sub\n",  # `sub` is a module: pkg -> pkg.sub
        "pkg/sub.py": "def f():\n    from pkg import VALUE\n",  # a name of pkg/__init__.py
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "import importlib\nimportlib.import_module('pkg.a')\n",
        "pkg/c.py": "from .a import x\n",
        "scripts/one.py": "import two\n",
        "scripts/two.py": "from one import x\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    edges, _ = build_graph(tmp_path, ("pkg",), "scripts")
    assert edges["pkg.c"] == {"pkg.a": 1}
    assert find_cycles(edges) == [["pkg", "pkg.sub", "pkg"], ["pkg.a", "pkg.b", "pkg.a"],
                                  ["scripts.one", "scripts.two", "scripts.one"]]


# ---------------------------------------------------------------------------------------------
# (b) jaxformer imports neither torch_ref nor torch
# ---------------------------------------------------------------------------------------------

def _torch_findings() -> dict[tuple[str, str], int]:
    _, imports = build_graph()
    findings = {}
    for module, found in imports.items():
        if module.split(".")[0] != "jaxformer":
            continue
        for imp in found:
            top = imp.target.split(".")[0]
            parity = module == PARITY_JOB or module.startswith(PARITY_JOB + ".")
            if top in TORCH and not (parity and top == "torch"):
                findings.setdefault((module, imp.target), imp.line)
    return findings


def test_jaxformer_imports_no_torch_ref_nor_torch():
    findings = _torch_findings()
    modules = find_modules(ROOT)
    wrong = [f"{modules[m].relative_to(ROOT)}:{line} imports {target}"
             for (m, target), line in sorted(findings.items())
             if (m, target) not in ALLOWED]
    assert not wrong, ("jaxformer must not import torch_ref or torch: take a twin through "
                       "jaxformer.frameworks.module('torch', ...), or list the exception in "
                       "ALLOWED with its reason:\n  " + "\n  ".join(wrong))
    stale = sorted(set(ALLOWED) - set(findings))
    assert not stale, f"listed but no longer imported (remove from ALLOWED): {stale}"


def test_torch_scan_sees_the_parity_job_and_the_registry():
    _, imports = build_graph()
    assert any(i.target == "torch" for i in imports["jaxformer.parity"])  # allowed, not a finding
    assert ("jaxformer.frameworks", "torch") in _torch_findings()


# ---------------------------------------------------------------------------------------------
# (c) commands that do not select torch do not load it
# ---------------------------------------------------------------------------------------------

# The modules behind the commands (their --help builds the parser, which imports some of them;
# the rest run after parsing).
COMMAND_MODULES = ("jaxformer.cli", "jaxformer.embed", "jaxformer.training.command",
                   "jaxformer.training.loop", "jaxformer.training.corpus",
                   "jaxformer.generation.cli", "jaxformer.checkpoints.hf", "jaxformer.sharding")
COMMANDS = (["train"], ["generate"], ["embed"], ["data"])


def test_commands_without_torch_do_not_load_it():
    code = textwrap.dedent(f"""
        import contextlib, importlib, io, json, sys
        import jaxformer
        from jaxformer import cli
        helps = []
        for argv in {COMMANDS!r}:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    cli.main([*argv, "--help"])
                except SystemExit as exit:
                    helps.append([argv[0], exit.code, out.getvalue().startswith("usage:")])
        for name in {COMMAND_MODULES!r}:
            importlib.import_module(name)
        print(json.dumps({{"helps": helps, "loaded": sorted(
            m for m in sys.modules if m.split(".")[0] in ("torch", "torch_ref"))}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "PYTHONWARNINGS": "ignore"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["helps"] == [[argv[0], 0, True] for argv in COMMANDS]  # each --help ran
    assert not result["loaded"], (f"torch loaded by a command that does not select it: "
                                  f"{result['loaded'][:10]}")
