"""The tree in docs/design.md stays true: every folder it draws exists, and every folder of the
repository's code trees (a Python package or the benchmark results) is drawn, one line each."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("jaxformer", "torch_ref", "parity_tests", "benchmarks")


def drawn_folders() -> list[str]:
    """The folders of the first code block under "## The tree", as repository paths."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"## The tree\n.*?```\n(.*?)```", text, re.S)
    assert block, "docs/design.md has no tree under '## The tree'"
    folders, stack = [], []
    for line in block.group(1).splitlines():
        match = re.match(r"( *)(\S+/)\s", line + " ")
        assert match, f"docs/design.md tree: not one folder per line: {line!r}"
        depth = len(match.group(1)) // 2
        stack[depth:] = [match.group(2).rstrip("/")]
        folders.append("/".join(stack))
    return folders


def code_folders() -> set[str]:
    found = set()
    for tree in TREES:
        for path in (ROOT / tree).rglob("*"):
            if path.is_dir() and "__pycache__" not in path.parts and (
                    (path / "__init__.py").exists() or path.name == "results"):
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_every_drawn_folder_exists():
    missing = [f for f in drawn_folders() if not (ROOT / f).is_dir()]
    assert not missing, f"docs/design.md draws folders that do not exist: {missing}"


def test_every_code_folder_is_drawn():
    absent = sorted(code_folders() - set(drawn_folders()))
    assert not absent, f"folders missing from the tree in docs/design.md: {absent}"


def test_the_tree_is_read_as_drawn():
    folders = drawn_folders()
    assert "jaxformer/training/tasks" in folders
    assert "torch_ref/nn" in folders
    assert len(folders) == len(set(folders))


def test_the_suite_orders_files_that_exist(request):
    """``conftest.LONGEST_FIRST`` names test files that exist (a renamed file would silently lose
    its place at the front of the run), and this run's collection starts with the ones it
    collected, in that order."""
    from parity_tests.conftest import LONGEST_FIRST

    missing = [name for name in LONGEST_FIRST if not (ROOT / "parity_tests" / name).is_file()]
    assert not missing, f"conftest.LONGEST_FIRST names files that do not exist: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    files = []
    for item in request.session.items:
        name = Path(str(item.path)).relative_to(ROOT / "parity_tests").as_posix()
        if not files or files[-1] != name:
            files.append(name)
    listed = [name for name in LONGEST_FIRST if name in files]
    assert files[:len(listed)] == listed
