"""No command deletes or overwrites what it did not write (``jaxformer.outputs``): every refusal
of ``jaxformer train`` and ``jaxformer data`` about an output, table-driven. Each refused command
exits 2 with ``jaxformer <command>: error: FLAG PATH: ...``, no traceback, and leaves every file
under the test's directory as it was (snapshot before and after)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from jaxformer import cli, outputs
from jaxformer.training.rundir import EXPORT_KIND
from parity_tests.support.training import write_corpus

TINY = ["--family", "gpt", "--preset", "tiny", "--steps", "2", "--seq-len", "16",
        "--batch-size", "2", "--warmup", "1", "--progress", "none"]


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under ``root``: its kind and, for files, its content hash."""
    return {str(p.relative_to(root)): "dir" if p.is_dir()
            else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A corpus, a finished tiny run ``run`` and its export ``export`` (a previous export)."""
    root = tmp_path_factory.mktemp("outputs")
    write_corpus(root / "corpus.txt")
    assert cli.main(["train", *TINY, "--data", str(root / "corpus.txt"), "--checkpoint-dir",
                     str(root / "run"), "--export-hf", str(root / "export")]) == 0
    return root


def test_an_export_carries_its_marker(root):
    names = sorted(p.name for p in (root / "export").iterdir())
    assert names == sorted([outputs.MARKER, "config.json", "model.safetensors", "tokenizer.json"])
    marker = json.loads((root / "export" / outputs.MARKER).read_text())
    assert marker["kind"] == EXPORT_KIND
    assert outputs.has_marker(EXPORT_KIND)(root / "export")


def _mine(root):  # a directory of the user's own files
    (root / "mine").mkdir(exist_ok=True)
    (root / "mine" / "notes.txt").write_text("my notes")


def _blocker(root):  # a regular file: nothing can be created under it, even by root
    (root / "blocker.txt").write_text("a file")


def _foreign(root):
    (root / "mine.txt").write_text("my file")


def _tampered_export(root):  # a previous export the user has since added a file to
    if not (root / "tampered").exists():
        (root / "tampered").mkdir()
        for p in (root / "export").iterdir():
            (root / "tampered" / p.name).write_bytes(p.read_bytes())
        (root / "tampered" / "README.md").write_text("my model card")


def _nothing(root):
    pass


# (id, command line with {r} = the root, setup, flag named, path named, why)
TRAIN = ["train", *TINY, "--data", "{r}/corpus.txt"]
REFUSALS = [
    ("export is the run dir", [*TRAIN, "--checkpoint-dir", "{r}/new", "--export-hf", "{r}/new"],
     _nothing, "--export-hf", "{r}/new", r"is the run directory"),
    ("export contains the run dir", [*TRAIN, "--checkpoint-dir", "{r}/up/new", "--export-hf",
                                     "{r}/up"],
     _nothing, "--export-hf", "{r}/up", r"contains the run directory"),
    ("export inside the run dir", [*TRAIN, "--checkpoint-dir", "{r}/new", "--export-hf",
                                   "{r}/new/hf"],
     _nothing, "--export-hf", "{r}/new/hf", r"lies inside the run directory"),
    ("export contains the metrics", [*TRAIN, "--checkpoint-dir", "{r}/new", "--metrics",
                                     "{r}/m/metrics.jsonl", "--export-hf", "{r}/m"],
     _nothing, "--export-hf", "{r}/m", r"contains the metrics file"),
    ("export into a foreign dir", [*TRAIN, "--checkpoint-dir", "{r}/new", "--export-hf",
                                   "{r}/mine"],
     _mine, "--export-hf", "{r}/mine", r"is not empty and is not a previous --export-hf "
                                       r"export \(it holds notes.txt\)"),
    ("export into a foreign dir, --overwrite", [*TRAIN, "--checkpoint-dir", "{r}/new",
                                                "--export-hf", "{r}/mine", "--overwrite"],
     _mine, "--export-hf", "{r}/mine", r"is not empty and is not a previous"),
    ("export onto a file", [*TRAIN, "--checkpoint-dir", "{r}/new", "--export-hf",
                            "{r}/mine.txt"],
     _foreign, "--export-hf", "{r}/mine.txt", r"exists and is not a directory"),
    ("re-export without --overwrite", [*TRAIN, "--checkpoint-dir", "{r}/new", "--export-hf",
                                       "{r}/export"],
     _nothing, "--export-hf", "{r}/export", r"holds a previous --export-hf export already; "
                                            r"pass --overwrite to replace it"),
    ("re-export into an export with a user file", [*TRAIN, "--checkpoint-dir", "{r}/new",
                                                   "--export-hf", "{r}/tampered", "--overwrite"],
     _tampered_export, "--export-hf", "{r}/tampered", r"is not empty and is not a previous"),
    ("export under a file", [*TRAIN, "--checkpoint-dir", "{r}/new", "--export-hf",
                             "{r}/blocker.txt/hf"],
     _blocker, "--export-hf", "{r}/blocker.txt/hf", r"cannot be created: .*blocker.txt is a "
                                                    r"file, not a directory"),
    ("run dir of foreign files", [*TRAIN, "--checkpoint-dir", "{r}/mine"],
     _mine, "--checkpoint-dir", "{r}/mine", r"is not empty and is not a jaxformer run"),
    ("run dir under a file", [*TRAIN, "--checkpoint-dir", "{r}/blocker.txt/run"],
     _blocker, "--checkpoint-dir", "{r}/blocker.txt/run", r"cannot be created"),
    ("metrics onto a foreign file", [*TRAIN, "--checkpoint-dir", "{r}/new", "--metrics",
                                     "{r}/mine.txt"],
     _foreign, "--metrics", "{r}/mine.txt", r"exists and jaxformer did not write it"),
    ("metrics onto the data", [*TRAIN, "--checkpoint-dir", "{r}/new", "--metrics",
                               "{r}/corpus.txt"],
     _nothing, "--metrics", "{r}/corpus.txt", r"is the data file \(--data"),
    ("metrics onto run.json", [*TRAIN, "--checkpoint-dir", "{r}/new", "--metrics",
                               "{r}/new/run.json"],
     _nothing, "--metrics", "{r}/new/run.json", r"is the run's run.json"),
    ("metrics is the plot", [*TRAIN, "--checkpoint-dir", "{r}/new", "--metrics", "{r}/x.png",
                             "--plot", "{r}/x.png"],
     _nothing, "--metrics", "{r}/x.png", r"is the plot \(--plot"),
    ("metrics under a file", [*TRAIN, "--checkpoint-dir", "{r}/new", "--metrics",
                              "{r}/blocker.txt/m.jsonl"],
     _blocker, "--metrics", "{r}/blocker.txt/m.jsonl", r"cannot be created"),
    ("plot onto a foreign file", [*TRAIN, "--checkpoint-dir", "{r}/new", "--plot",
                                  "{r}/mine.txt"],
     _foreign, "--plot", "{r}/mine.txt", r"exists and jaxformer did not write it"),
    ("plot onto a directory", [*TRAIN, "--checkpoint-dir", "{r}/new", "--plot", "{r}/mine"],
     _mine, "--plot", "{r}/mine", r"is a directory"),
    ("resume: metrics onto a foreign file", [*TRAIN, "--checkpoint-dir", "{r}/run", "--resume",
                                             "--metrics", "{r}/mine.txt"],
     _foreign, "--metrics", "{r}/mine.txt", r"exists and jaxformer did not write it"),
    ("resume: plot onto a foreign file", [*TRAIN, "--checkpoint-dir", "{r}/run", "--resume",
                                          "--plot", "{r}/mine.txt"],
     _foreign, "--plot", "{r}/mine.txt", r"exists and jaxformer did not write it"),
    ("data --out of foreign files", ["data", "shakespeare", "--out", "{r}/mine", "--cache",
                                     "{r}/cache"],
     _mine, "--out", "{r}/mine", r"is not empty and is not a previous `jaxformer data` output"),
    ("data --out of foreign files, --overwrite", ["data", "shakespeare", "--out", "{r}/mine",
                                                  "--cache", "{r}/cache", "--overwrite"],
     _mine, "--out", "{r}/mine", r"is not empty and is not a previous"),
    ("data --out under a file", ["data", "shakespeare", "--out", "{r}/blocker.txt/out",
                                 "--cache", "{r}/cache"],
     _blocker, "--out", "{r}/blocker.txt/out", r"cannot be created"),
    ("data --cache under a file", ["data", "shakespeare", "--out", "{r}/out", "--cache",
                                   "{r}/blocker.txt/cache"],
     _blocker, "--cache", "{r}/blocker.txt/cache", r"cannot be created"),
]


@pytest.mark.parametrize(("argv", "setup", "flag", "path", "why"),
                         [pytest.param(*row[1:], id=row[0]) for row in REFUSALS])
def test_refused_before_anything_is_written(root, capsys, monkeypatch, argv, setup, flag, path,
                                            why):
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip was run"))
    setup(root)
    before = snapshot(root)
    argv = [a.format(r=root) for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxformer {argv[0]}: error: {flag} "), err
    assert f"{flag} {path.format(r=root)}: " in err, err
    assert re.search(why, err), err
    assert "nothing was written" in err
    assert "Traceback" not in err
    assert snapshot(root) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories; the "
                                              "rows under a regular file cover unwritable paths")
def test_a_read_only_directory_is_refused_up_front(root, capsys):
    locked = root / "locked"
    locked.mkdir(exist_ok=True)
    locked.chmod(0o555)
    try:
        before = snapshot(root)
        assert cli.main([a.format(r=root) for a in TRAIN] + [
            "--checkpoint-dir", str(root / "new"), "--export-hf", str(locked / "hf")]) == 2
        err = capsys.readouterr().err
        assert re.search(rf"--export-hf {re.escape(str(locked / 'hf'))}: cannot be written: "
                         rf"the directory {re.escape(str(locked))} is not writable", err), err
        assert snapshot(root) == before
    finally:
        locked.chmod(0o755)


def test_overwrite_replaces_a_previous_export_only(root, capsys):
    before = snapshot(root / "export")
    unrelated = {k: v for k, v in snapshot(root).items()
                 if not k.startswith(("export", "again"))}
    assert cli.main([a.format(r=root) for a in TRAIN] + [
        "--checkpoint-dir", str(root / "again"), "--seed", "1", "--export-hf",
        str(root / "export"), "--overwrite"]) == 0
    after = snapshot(root / "export")
    assert after.keys() == before.keys()
    assert after["model.safetensors"] != before["model.safetensors"]  # the new weights
    assert {k: v for k, v in snapshot(root).items()
            if not k.startswith(("export", "again"))} == unrelated


def test_a_resumed_run_rewrites_its_own_metrics_and_plot(root, capsys):
    """The metrics and plot of a run belong to it: ``--resume`` may rewrite them."""
    metrics = (root / "run" / "metrics.jsonl").read_text()
    assert cli.main([a.format(r=root) for a in TRAIN] + [
        "--checkpoint-dir", str(root / "run"), "--resume"]) == 0
    assert (root / "run" / "metrics.jsonl").read_text() == metrics


def test_a_directory_as_data_says_it_is_a_directory(tmp_path, capsys):
    assert cli.main(["train", *TINY, "--data", str(tmp_path), "--checkpoint-dir",
                     str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxformer train: error: "), err
    assert f"data file {tmp_path} is a directory" in err
    assert not (tmp_path / "run").exists()
