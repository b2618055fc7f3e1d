"""Help that cannot rot: every ``jaxformer ...`` example in every ``--help`` text and in the
fenced blocks of README.md and docs/*.md parses with the command's own parser, and the cheap ones
run. ``jaxformer parity --help`` states the bounds ``jaxformer.parity.compare`` uses, and every
parity row says which two things it compares.

An example is a line whose text (after ``$ ``, environment assignments and a ``.venv/bin/``
path) starts with ``jaxformer``; it continues on the next line when the line ends with ``\\`` or,
in a help text, when the next line is indented further and starts with ``-`` (argparse help
style). ``#`` starts a comment. A line of prose in a help text must therefore not start with the
word ``jaxformer``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import re
import shlex
from importlib import metadata
from pathlib import Path

import pytest

from jaxformer import cli

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
PROGRAM = re.compile(r"^(?:\$\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\S*/)?jaxformer(?:\s|$)")


@dataclasses.dataclass(frozen=True)
class Example:
    where: str  # "README.md:171" or "jaxformer train --help"
    text: str  # the command, continuation lines joined

    @property
    def argv(self) -> list[str]:
        words = shlex.split(self.text, comments=True)
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # VAR=value
            words.pop(0)
        if words and words[0] == "$":
            words.pop(0)
        assert words, self
        assert Path(words[0]).name == "jaxformer", self
        return words[1:]


def examples_in(lines: list[str], where, help_style: bool, prompt: bool = False) -> list[Example]:
    """The examples in ``lines``; ``where(i)`` names line ``i`` (0-based). With ``prompt`` (a
    console block) only lines after a ``$`` prompt are commands, the rest is their output."""
    found, i = [], 0
    while i < len(lines):
        line = lines[i]
        if not PROGRAM.match(line.strip()) or (prompt and not line.strip().startswith("$")):
            i += 1
            continue
        start, parts = i, [line.strip()]
        indent = len(line) - len(line.lstrip())
        while i + 1 < len(lines):
            following = lines[i + 1]
            if parts[-1].endswith("\\"):
                parts[-1] = parts[-1][:-1]
            elif not (help_style and following.strip().startswith("-")
                      and len(following) - len(following.lstrip()) > indent):
                break
            i += 1
            parts.append(following.strip())
        found.append(Example(where(start), " ".join(parts)))
        i += 1
    return found


def markdown_examples(path: Path) -> list[Example]:
    """Examples in the fenced blocks of a markdown file (prose mentions such as
    `jaxformer train --mesh` name a flag; they are not commands)."""
    lines, inside, block = path.read_text(encoding="utf-8").splitlines(), None, []
    found: list[Example] = []
    for number, line in enumerate(lines):
        opening = FENCE.match(line)
        if inside is None and opening:
            inside, block = opening.group(1), []
            console = line.strip()[len(inside):].strip() == "console"
        elif inside is not None and line.strip().startswith(inside):
            first = number - len(block)
            found += examples_in(block, lambda i, first=first: f"{path.relative_to(ROOT)}:"
                                                               f"{first + i + 1}", False, console)
            inside = None
        elif inside is not None:
            block.append(line)
    return found


def help_texts() -> dict[str, str]:
    parser = cli.build_parser()
    texts = {"jaxformer --help": parser.format_help()}
    for name, sub in parser.subcommands.items():
        texts[f"jaxformer {name} --help"] = sub.format_help()
    return texts


def help_examples() -> list[Example]:
    """Examples in the description and epilog of each parser (the flags' own help lines are
    prose: `--framework` of generate says "jaxformer (jax, default) or its torch_ref twin")."""
    parser = cli.build_parser()
    parsers = {"jaxformer --help": parser, **{f"jaxformer {name} --help": sub
                                              for name, sub in parser.subcommands.items()}}
    return [example for name, each in parsers.items()
            for text in (each.description or "", each.epilog or "")
            for example in examples_in(text.splitlines(), lambda i, name=name: name, True)]


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = help_examples() + [e for path in DOCS for e in markdown_examples(path)]


class ParseError(Exception):
    pass


def parse(argv: list[str]) -> argparse.Namespace | None:
    """``argv`` parsed by the command's parser exactly as ``cli.main`` does, argparse's errors
    raised as ParseError; None for ``--help`` and ``--version`` (printed, exit 0). A train
    command without --config must also give the flags it needs."""
    parser = cli.build_parser()

    def error(message, parser=parser):
        raise ParseError(message)

    for each in (parser, *parser.subcommands.values()):
        each.error = error  # type: ignore[method-assign]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            args, unknown = parser.parse_known_args(argv)
    except SystemExit as exit_info:
        if exit_info.code == 0:
            return None
        raise
    if unknown:
        raise ParseError(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        raise ParseError("no command")
    if args.command == "train" and args.config is None:
        missing = [flag for flag in ("family", "data") if getattr(args, flag) is None]
        if missing:
            raise ParseError(f"missing --{', --'.join(missing)}")
    return args


def test_examples_are_found():
    """The extraction finds what it must (a broken regex would pass everything)."""
    wheres = {e.where.split(":")[0] for e in EXAMPLES}
    assert {"README.md", "docs/training.md", "jaxformer train --help",
            "jaxformer parity --help", "jaxformer --help"} <= wheres, wheres
    baby = [e for e in EXAMPLES
            if e.where == "jaxformer train --help" and "--preset baby" in e.text]
    assert len(baby) == 1, baby
    assert baby[0].text.endswith("--eval-batches 20"), baby  # continuation lines joined
    readme = [e for e in EXAMPLES if e.where.startswith("README.md")]
    assert len(readme) >= 5, readme
    assert any("--warmup 100" in e.text and "--family gpt" in e.text for e in readme)


def test_extraction_joins_and_strips():
    lines = ["text", "  $ .venv/bin/jaxformer train --family gpt \\", "      --data x.txt  # c",
             "  jaxformer parity --json", "    --seed 3", "jaxformer is a library"]
    bash = examples_in(lines, str, help_style=False)
    assert [e.argv for e in bash][:2] == [["train", "--family", "gpt", "--data", "x.txt"],
                                          ["parity", "--json"]]
    help_ = examples_in(lines, str, help_style=True)
    assert help_[1].argv == ["parity", "--json", "--seed", "3"]
    console = examples_in(lines, str, help_style=False, prompt=True)  # output is not a command
    assert [e.argv[0] for e in console] == ["train"]
    assert Example("x", "JAX_NUM_CPU_DEVICES=8 jaxformer parity").argv == ["parity"]


@pytest.mark.parametrize("argv", [["train", "--family", "gpt", "--data", "x", "--eval-iterations",
                                   "2"],
                                  ["train", "--data", "x"],
                                  ["train", "--family", "gpt", "--data", "x", "--steps", "ten"],
                                  ["parity", "--preset", "huge"], ["nonsense"]])
def test_parse_fails_a_broken_example(argv):
    with pytest.raises(ParseError):
        parse(argv)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e.where} {e.text[:60]}")
def test_every_example_parses(example):
    try:
        parse(example.argv)
    except ParseError as error:
        pytest.fail(f"{example.where}: `{example.text}` does not parse: {error}", pytrace=False)


# --- Run where cheap: these finish in seconds and need no files -------------------------------

def test_version_is_the_installed_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"jaxformer {metadata.version('jaxformer')}"


@pytest.mark.parametrize("name", list(help_texts()))
def test_every_help_prints(name, capsys):
    argv = name.split()[1:]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == help_texts()[name]


def test_the_parity_example_runs_and_every_row_says_what_it_compares(capsys):
    """``jaxformer parity --family gpt --json``, as the help shows it: every row names its pair,
    from the legend of ``parity --help``, and the table prints the same pairs."""
    pytest.importorskip("torch")
    from jaxformer.parity.compare import JIT_VS_EAGER, TWINS, against_float64

    example = next(e for e in help_examples() if e.text.startswith("jaxformer parity --family"))
    assert cli.main(example.argv) == 0
    import json

    rows = json.loads(capsys.readouterr().out)["rows"]
    pairs = {TWINS, JIT_VS_EAGER, *(against_float64(who) for who in
                                    ("torch_ref", "jaxformer", "jaxformer jit"))}
    assert {r["compared"] for r in rows} == pairs
    legend = help_texts()["jaxformer parity --help"]
    for pair in (TWINS, JIT_VS_EAGER, against_float64("X")):
        assert f'"{pair}"' in legend
    assert cli.main(["parity", "--family", "gpt"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["family", "component", "compared"]
    for r in rows:
        assert re.search(rf"^gpt\s+{re.escape(r['component'])}\s+{re.escape(r['compared'])}\s",
                         table, re.M), r


def _short(x: float) -> str:
    """1e-05 -> '1e-5', as the help writes a bound."""
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def test_parity_help_states_the_bounds_it_uses():
    """The numbers in ``parity --help`` are compare's: the forward bound, the jit floor and the
    factor on the float64 error (a change to one of them fails here until the help says it)."""
    pytest.importorskip("torch")
    from jaxformer.parity.compare import FORWARD_RTOL, JIT_NOISE_FACTOR, JIT_TOL

    text = " ".join(help_texts()["jaxformer parity --help"].split())
    assert f"{_short(FORWARD_RTOL)} x scale every" in text
    assert f"max({_short(JIT_TOL)} x scale, {JIT_NOISE_FACTOR:g} x d)" in text
    assert "scale = max(1, max |reference output|)" in text
    assert not re.search(r"\b1e-0\d", text)  # one way of writing numbers
