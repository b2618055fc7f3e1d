"""``benchmarks/baby_gpt.py`` prints a readable summary: a greedy sample of a barely trained
model (``--steps 20``: 300 newlines, the most likely character after a newline) used to print 300
blank lines per framework. The summary is checked on a made-up run, without training. nanoGPT's
own code (``--frameworks ...,nanogpt --nanogpt-dir``) is run as a stand-in checkout: the corpus in
its layout, its command lines, its log and sample read back, its failure shown."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import baby_gpt

RUN = {"final_val_loss": 3.3, "wall_s": 12.0, "evaluations_s": 1.3, "checkpoints_s": 0.5,
       "sample_s": 2.0, "loadavg_before": [0.5, 0.5, 0.5], "loadavg_after": [1.0, 0.6, 0.5],
       "foreign_cores": 0.1}


def test_a_sample_of_newlines_prints_a_few_lines():
    text = baby_gpt.summary("jax", {**RUN, "sample": "\n" * 300}, "\n")
    assert text.count("\n") <= 3, text
    assert "[300 blank lines]" in text


def test_a_real_sample_prints_as_it_is():
    sample = "ROMEO:\nWhat light?\n\nJULIET:\nAy me."
    text = baby_gpt.summary("torch", {**RUN, "sample": sample}, "\n")
    assert text.endswith("\n" + sample)
    assert text.startswith("== torch: final val loss 3.3000, wall 12.0 s (evaluations 1.3 s, "
                           "checkpoints 0.5 s), sample 2.0 s")
    assert baby_gpt.shown("a\n\n\nb") == "a\n\n\nb"  # two blank lines stay
    assert baby_gpt.shown("a\n\n\n\nb") == "a\n[3 blank lines]\nb"


# ----------------------------------------------------------------------------- nanoGPT's own code

# A stand-in for a checkout of nanoGPT's repository: its train.py refuses to run unless it finds
# what the real one reads (configurator.py in the working directory, the corpus in
# data/shakespeare_char as its prepare.py writes it, the recipe's flags) and then prints lines in
# the real one's format: an evaluation every --eval_interval updates from update 0, one line per
# update from 0 to --max_iters; it leaves a checkpoint where the real one does. Its sample.py
# refuses to run without that checkpoint, greedy sampling and the prompt's file, and prints the
# prompt and a continuation as the real one does.
FAKE_TRAIN = '''
import os, pickle, sys
import numpy as np
flags = dict(a[2:].split("=", 1) for a in sys.argv[2:])
assert sys.argv[1].endswith(os.path.join("config", "train_shakespeare_char.py")), sys.argv
assert os.path.isfile("configurator.py"), os.listdir(".")
for key, want in (("device", "cpu"), ("compile", "False"), ("block_size", "64"),
                  ("batch_size", "12"), ("n_layer", "4"), ("n_embd", "128"), ("dropout", "0.0")):
    assert flags[key] == want, (key, flags[key])
meta = pickle.load(open("data/shakespeare_char/meta.pkl", "rb"))
for split in ("train", "val"):  # the whole corpus, in ids the vocabulary knows
    ids = np.fromfile(f"data/shakespeare_char/{split}.bin", dtype=np.uint16)
    assert ids.size > 0 and ids.max() < meta["vocab_size"], (split, ids.size)
steps, every = int(flags["max_iters"]), int(flags["eval_interval"])
for it in range(steps + 1):
    if it % every == 0:
        print(f"step {it}: train loss {4 - it / 100:.4f}, val loss {4.1 - it / 100:.4f}")
    print(f"iter {it}: loss {4 - it / 200:.4f}, time {10 + it % 3:.2f}ms, mfu 0.01%")
os.makedirs("out-shakespeare-char")
open("out-shakespeare-char/ckpt.pt", "w").write("weights")
'''
FAKE_SAMPLE = '''
import os, sys
flags = dict(a[2:].split("=", 1) for a in sys.argv[1:])
assert os.path.isfile(os.path.join(flags["out_dir"], "ckpt.pt")), flags
assert flags["top_k"] == "1" and flags["num_samples"] == "1", flags
prompt = open(flags["start"].removeprefix("FILE:")).read()
print("number of parameters: 0.80M")
print("Loading meta from data/shakespeare_char/meta.pkl...")
print(prompt + "x" * int(flags["max_new_tokens"]))
print("---------------")
'''


def fake_nanogpt(root: Path, train_py: str = FAKE_TRAIN) -> Path:
    (root / "config").mkdir(parents=True)
    (root / "train.py").write_text(train_py)
    (root / "sample.py").write_text(FAKE_SAMPLE)
    for name in ("model.py", "configurator.py", "config/train_shakespeare_char.py"):
        (root / name).write_text("# stand-in\n")
    return root


def corpus(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "data").mkdir()
    train, val = tmp_path / "data" / "train.txt", tmp_path / "data" / "val.txt"
    train.write_text("ROMEO:\nBut soft, what light\n" * 20, encoding="utf-8")
    val.write_text("JULIET:\nAy me!\n", encoding="utf-8")
    return train, val


def test_the_corpus_in_nanogpts_layout_reads_back(tmp_path):
    train, val = corpus(tmp_path)
    size = baby_gpt.nanogpt_data(train, val, tmp_path / "out")
    meta = pickle.loads((tmp_path / "out" / "meta.pkl").read_bytes())
    chars = sorted(set(train.read_text() + val.read_text()))  # "J", "Y" and "!" only in val
    assert size == meta["vocab_size"] == len(chars)
    assert [meta["itos"][i] for i in range(size)] == chars
    for split, text in (("train", train), ("val", val)):
        ids = np.fromfile(tmp_path / "out" / f"{split}.bin", dtype=np.uint16)
        assert "".join(meta["itos"][int(i)] for i in ids) == text.read_text()


def test_a_checkout_without_the_recipes_files_is_named_missing(tmp_path):
    root = fake_nanogpt(tmp_path / "nanoGPT")
    (root / "config" / "train_shakespeare_char.py").unlink()
    (root / "model.py").unlink()
    with pytest.raises(ValueError, match=r"not a checkout of nanoGPT: no model\.py, "
                                         r"config/train_shakespeare_char\.py"):
        baby_gpt.nanogpt_checkout(str(root))


@pytest.mark.parametrize("argv", [["--frameworks", "jax,nanogpt"],
                                  ["--nanogpt-dir", "somewhere"],
                                  ["--frameworks", "jax,jax"]])
def test_nanogpt_needs_its_checkout_and_frameworks_are_named_once(argv, capsys):
    with pytest.raises(SystemExit):
        baby_gpt.main([*argv, "--no-save"])
    assert "--frameworks" in capsys.readouterr().err


def test_what_nanogpts_code_imports_is_checked_before_anything_runs(tmp_path, monkeypatch, capsys):
    root = fake_nanogpt(tmp_path / "nanoGPT")
    monkeypatch.setattr(baby_gpt, "NANOGPT_IMPORTS", ("numpy", "no_module_of_this_name"))
    with pytest.raises(SystemExit):
        baby_gpt.main(["--frameworks", "nanogpt", "--nanogpt-dir", str(root), "--no-save"])
    err = capsys.readouterr().err
    assert "import no_module_of_this_name, which this Python cannot import" in err
    assert "numpy" not in err


def test_an_earlier_runs_nanogpt_directory_is_refused_before_anything_runs(tmp_path, monkeypatch,
                                                                          capsys):
    monkeypatch.setattr(baby_gpt, "NANOGPT_IMPORTS", ())
    root = fake_nanogpt(tmp_path / "nanoGPT")
    (tmp_path / "runs" / "nanogpt").mkdir(parents=True)
    with pytest.raises(SystemExit):
        baby_gpt.main(["--frameworks", "nanogpt", "--nanogpt-dir", str(root), "--no-save",
                       "--runs-dir", str(tmp_path / "runs")])
    assert "nanogpt exists (an earlier run's nanoGPT directory)" in capsys.readouterr().err


def test_nanogpts_run_is_timed_and_its_log_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(baby_gpt, "NANOGPT_IMPORTS", ())  # tiktoken is not installed here
    data = corpus(tmp_path)[0].parent
    root = fake_nanogpt(tmp_path / "nanoGPT")
    out = tmp_path / "results"
    code = baby_gpt.main(["--frameworks", "nanogpt", "--nanogpt-dir", str(root), "--steps", "20",
                          "--eval-every", "10", "--eval-iters", "2", "--log-every", "5",
                          "--data-dir", str(data), "--out", str(out), "--tag", "t",
                          "--peak-repeats", "0", "--no-compilation-cache"])
    assert code == 0
    report = json.loads((out / "baby_gpt_t.json").read_text())
    run = report["runs"]["nanogpt"]
    assert [e["step"] for e in run["val_loss"]] == [0, 10, 20]
    assert run["final_val_loss"] == pytest.approx(3.9)
    assert len(run["train_loss"]) == 21  # its updates 0 to 20
    assert run["train_loss"][-1] == pytest.approx(3.9)
    assert run["step_seconds_median"] == pytest.approx(0.011)
    assert "--max_iters=20" in run["command"]
    assert "--eval_iters=2" in run["command"]
    assert run["wall_s"] >= run["prepare_s"] > 0
    assert run["sample"] == "x" * 300  # --sample-chars, after the prompt (a newline)
    assert run["end_to_end_s"] == pytest.approx(run["wall_s"] + run["sample_s"])
    assert (out / "baby_gpt_t.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "nanoGPT: step 20: train loss 3.8000, val loss 3.9000" in printed
    assert "nanoGPT: iter 15:" in printed  # every --log-every updates
    assert "nanoGPT: iter 16:" not in printed
    assert "== nanogpt: final val loss 3.9000" in printed


def test_a_failing_nanogpt_run_shows_its_last_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(baby_gpt, "NANOGPT_IMPORTS", ())
    data = corpus(tmp_path)[0].parent
    root = fake_nanogpt(tmp_path / "nanoGPT", "print('loading'); raise SystemExit('no torch')")
    with pytest.raises(RuntimeError, match=r"train\.py exited with 1:\nloading\nno torch"):
        baby_gpt.main(["--frameworks", "nanogpt", "--nanogpt-dir", str(root), "--steps", "2",
                       "--data-dir", str(data), "--no-save", "--peak-repeats", "0",
                       "--no-compilation-cache"])


def test_a_child_process_counts_as_the_benchmarks_own_load():
    """nanoGPT's process (and jaxformer's compile helper) is the benchmark's own work:
    ``harness.own_cpu_s``, which ``ForeignLoad`` subtracts from the machine's CPU time, grows by
    a finished child's CPU time (a child that burns 0.6 s of its own CPU time adds at least that;
    this process's own share of the call is on top). Not measured as ``ForeignLoad.cores``: the
    suite's other worker is another process's load, rightly counted."""
    import subprocess

    harness = baby_gpt.harness
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    before = harness.own_cpu_s()
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert harness.own_cpu_s() - before >= 0.6
