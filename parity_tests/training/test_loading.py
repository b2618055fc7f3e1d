"""``jaxformer.load``: a run of every family (trained by either framework) or a Hugging Face
directory loads as the model training returned, in JAX and as the torch twin; bad paths are
one-line errors naming the path and the problem."""

from __future__ import annotations

import json
import re
import shutil
import warnings

import numpy as np
import pytest
import torch

import jaxformer
from jaxformer.loading import LoadError, load, require_family
from jaxformer.tokenizer import TextTokenizer
from jaxformer.training import loop, rundir
from jaxformer.training.config import TrainConfig
from parity_tests.support.helpers import assert_close
from parity_tests.support.training import write_corpus

FAMILIES = ("gpt", "bert", "transformer", "classifier")
STEPS = 4


def _run(root, family, framework="jax", tokenizer=None, with_val=True, **changes):
    """A tiny run of ``family``. Dropout 0: loading and scoring have no dropout, and its RNG
    sites would double the train step's compilation (dropout's RNG state on resume is
    ``test_interrupt.py``'s and ``test_kill_resume.py``'s)."""
    data = write_corpus(root / "train.txt", lines=60, tabs=family == "classifier")
    val = write_corpus(root / "val.txt", lines=30, seed=1, tabs=family == "classifier")
    config = TrainConfig(**{"steps": STEPS, "batch_size": 4, "seq_len": 16, "warmup_steps": 1,
                            **({"label_smoothing": 0.1} if family == "transformer" else {}),
                            **changes})
    options = loop.RunOptions(family=family, data=data, val_data=val if with_val else None,
                              framework=framework,
                              tokenizer=tokenizer, checkpoint_dir=str(root / "run"),
                              checkpoint_every=2, eval_every=2, eval_batches=2,
                              progress="none", vocab_size=120, dropout=0.0)
    return loop.train(config, options)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny jax run per family, and one torch-trained gpt run."""
    out = {}
    for family in FAMILIES:
        out[family] = _run(tmp_path_factory.mktemp(family), family)
    out["gpt-torch"] = _run(tmp_path_factory.mktemp("gpt_torch"), "gpt", framework="torch")
    return out


def inputs(family, config, seed=0):
    """A batch of the family's model inputs, numpy."""
    rng = np.random.RandomState(seed)
    B, T = 2, 10
    mask = np.ones((B, T), np.int32)
    mask[1, 7:] = 0
    if family == "transformer":
        return (rng.randint(0, config.src_vocab_size, (B, T)),
                rng.randint(0, config.tgt_vocab_size, (B, T)), mask, mask)
    ids = rng.randint(0, config.vocab_size, (B, T))
    if family == "gpt":
        return ids, mask
    return ids, np.zeros_like(ids), mask


def logits(model, family, batch):
    """The model's logits (every head's, concatenated flat) as numpy."""
    if isinstance(model, torch.nn.Module):
        with torch.no_grad():
            out = model(*[torch.as_tensor(x).long() for x in batch])
    else:
        out = model(*batch)
    outs = out if isinstance(out, tuple) else (out,)
    if family == "bert":
        outs = outs[1:]  # the MLM and NSP logits
    return np.concatenate([np.asarray(o.detach().numpy() if hasattr(o, "detach") else o
                                      ).reshape(-1) for o in outs])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_run_loads_as_the_model_training_returned(runs, family):
    result = runs[family]
    loaded = load(result.run_dir)
    assert (loaded.family, loaded.source, loaded.framework, loaded.step) == (
        family, "run", "jax", STEPS)
    assert loaded.config == result.model.config
    assert isinstance(loaded.tokenizer, TextTokenizer)
    assert loaded.tokenizer.vocab_size == loaded.tokenizer.backend.get_vocab_size()
    batch = inputs(family, loaded.config)
    expected = logits(result.model, family, batch)
    np.testing.assert_array_equal(logits(loaded.model, family, batch), expected)
    twin = load(result.run_dir, framework="torch")
    assert isinstance(twin.model, torch.nn.Module)
    assert not twin.model.training
    assert_close(expected, logits(twin.model, family, batch), what=f"{family} torch twin")
    if family == "classifier":
        assert loaded.label_names == ["no", "yes"]
    else:
        assert loaded.label_names is None


def test_a_torch_trained_run_loads_in_both_frameworks(runs):
    result = runs["gpt-torch"]
    assert isinstance(result.model, torch.nn.Module)
    assert not result.model.training
    batch = inputs("gpt", result.model.config)
    expected = logits(result.model, "gpt", batch)
    twin = load(result.run_dir, framework="torch")
    np.testing.assert_array_equal(logits(twin.model, "gpt", batch), expected)
    ours = load(result.run_dir)
    assert_close(expected, logits(ours.model, "gpt", batch), what="torch run loaded in jax")


def test_a_given_step_loads_that_checkpoint(runs):
    result = runs["gpt"]
    early = load(result.run_dir, step=2)
    assert early.step == 2
    batch = inputs("gpt", early.config)
    final = logits(result.model, "gpt", batch)
    got = logits(early.model, "gpt", batch)
    assert np.abs(got - final).max() > 1e-4  # two updates of lr 1e-3 later, another model
    assert_close(got, logits(load(result.run_dir, step=2, framework="torch").model, "gpt", batch))


def test_load_is_the_top_level_name():
    assert jaxformer.load is load
    assert jaxformer.LoadError is LoadError


def test_a_classifier_run_is_refused_by_a_command_for_another_family(runs):
    loaded = load(runs["classifier"].run_dir)
    require_family(loaded, ("classifier",), "jaxformer classify")
    with pytest.raises(LoadError) as info:
        require_family(loaded, ("gpt", "transformer"), "jaxformer generate")
    assert str(info.value) == (f"{runs['classifier'].run_dir} is a classifier run; `jaxformer "
                               f"generate` needs a gpt or transformer model")


# ------------------------------------------------------------------------------- bad input

def _one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_missing_path(tmp_path):
    with pytest.raises(LoadError) as info:
        load(tmp_path / "nowhere")
    assert _one_line(info) == f"{tmp_path / 'nowhere'}: does not exist"


def test_neither_a_run_nor_a_hugging_face_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(LoadError) as info:
        load(tmp_path)
    message = _one_line(info)
    assert message.startswith(f"{tmp_path}: is neither a run directory (no run.json")
    assert "no config.json" in message
    with pytest.raises(LoadError, match="is a file; give a directory"):
        load(tmp_path / "notes.txt")


def test_a_checkpoint_step_that_does_not_exist(runs):
    run_dir = runs["gpt"].run_dir
    with pytest.raises(LoadError) as info:
        load(run_dir, step=3)
    assert _one_line(info) == (f"{run_dir}: has no checkpoint of step 3; its checkpoints are "
                               f"steps 2, 4")
    with pytest.raises(LoadError, match="lies inside the run directory"):
        load(run_dir / "checkpoints")


def _copy(run_dir, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(run_dir, target)
    return target


@pytest.mark.parametrize("framework_run", ["gpt", "gpt-torch"])
def test_a_damaged_checkpoint(runs, tmp_path, framework_run):
    run_dir = _copy(runs[framework_run].run_dir, tmp_path)
    torch_run = framework_run == "gpt-torch"
    step_dir = run_dir / "checkpoints" / (f"step_{STEPS}" if torch_run else str(STEPS))
    victim = step_dir / "state.pt" if torch_run else next(
        p for p in sorted((step_dir / "state").rglob("*")) if p.is_file() and p.stat().st_size
        > 1000 and "manifest" not in p.name and p.suffix != ".json")
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.raises(LoadError) as info:
        load(run_dir, step=STEPS)
    message = _one_line(info)
    assert message.startswith(f"{run_dir}: checkpoint step {STEPS} is damaged: ")
    # Without a step, the newest good checkpoint loads, with a warning naming the damaged one.
    with pytest.warns(UserWarning, match=f"checkpoint step {STEPS} is damaged"):
        loaded = load(run_dir)
    assert loaded.step == 2
    assert (run_dir / "checkpoints").is_dir()
    assert step_dir.is_dir()


def test_a_tokenizer_that_does_not_match_the_vocabulary(runs, tmp_path):
    run_dir = _copy(runs["gpt"].run_dir, tmp_path)
    from jaxformer.training import vocab

    vocab.char_tokenizer("abc").save(str(run_dir / "tokenizer.json"))
    with pytest.raises(LoadError) as info:
        load(run_dir)
    message = _one_line(info)
    assert message.startswith(f"{run_dir / 'tokenizer.json'}: holds 3 tokens, but the run's "
                              f"model (run.json) has a vocabulary of ")


def test_a_damaged_run_json(runs, tmp_path):
    run_dir = _copy(runs["gpt"].run_dir, tmp_path)
    (run_dir / "run.json").write_text("{")
    with pytest.raises(LoadError) as info:
        load(run_dir)
    assert _one_line(info).startswith(f"{run_dir / 'run.json'}: not valid JSON")


def test_a_step_for_a_hugging_face_directory_and_an_unknown_framework(runs, tmp_path):
    from jaxformer.checkpoints.hf import save_pretrained

    save_pretrained(runs["gpt"].model, tmp_path / "hf",
                    extra_files={"tokenizer.json": (runs["gpt"].run_dir / "tokenizer.json")
                                 .read_bytes()})
    with pytest.raises(LoadError, match="step=2 applies to run directories only"):
        load(tmp_path / "hf", step=2)
    with pytest.raises(LoadError, match="unknown framework 'tf'"):
        load(tmp_path / "hf", framework="tf")


# ------------------------------------------------------------------ Hugging Face directories

@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_a_hugging_face_export_loads_with_its_tokenizer(runs, tmp_path, framework):
    from jaxformer.checkpoints.hf import save_pretrained

    result = runs["classifier"]
    save_pretrained(result.model, tmp_path / "hf",
                    extra_files={"tokenizer.json": (result.run_dir / "tokenizer.json")
                                 .read_bytes()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load(tmp_path / "hf", framework=framework)
    assert (loaded.family, loaded.source, loaded.step) == ("classifier", "huggingface", None)
    assert loaded.label_names == ["LABEL_0", "LABEL_1"]  # save_pretrained without label_names
    batch = inputs("classifier", loaded.config)
    assert_close(logits(result.model, "classifier", batch),
                 logits(loaded.model, "classifier", batch))
    assert loaded.tokenizer.cls_id == load(result.run_dir).tokenizer.cls_id


def test_a_hugging_face_tokenizer_larger_than_the_model(runs, tmp_path):
    from jaxformer.checkpoints.hf import save_pretrained
    from jaxformer.training import vocab

    big = vocab.wordpiece_tokenizer([" ".join(f"w{i}" for i in range(400))], 400)
    save_pretrained(runs["gpt"].model, tmp_path / "hf",
                    extra_files={"tokenizer.json": big.to_str().encode()})
    with pytest.raises(LoadError) as info:
        load(tmp_path / "hf")
    assert _one_line(info).startswith(f"{tmp_path / 'hf'}: its tokenizer holds ")


# ------------------------------------------------------------------------------- tokenizer

def test_a_char_tokenizer_refuses_unknown_characters():
    from jaxformer.training import vocab

    tokenizer = TextTokenizer(vocab.char_tokenizer("abc\n"))
    assert tokenizer.is_char
    assert tokenizer.eos_id is None
    assert tokenizer.decode(tokenizer.encode("cab\n")) == "cab\n"
    with pytest.raises(ValueError, match="outside the 4-character vocabulary") as info:
        tokenizer.encode("abXcY!")
    message = str(info.value)
    assert "'!' (U+0021), 'X' (U+0058), 'Y' (U+0059)" in message
    assert "position(s) 2, 4, 5" in message


def test_a_run_tokenizer_names_its_special_tokens(runs):
    tokenizer = load(runs["bert"].run_dir).tokenizer
    ids = {name: tokenizer.token_to_id(name) for name in
           ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id,
            tokenizer.mask_id) == tuple(ids.values())
    assert tokenizer.eos_id == ids["[SEP]"]
    assert tokenizer.bos_id == ids["[CLS]"]
    assert not tokenizer.is_char


def test_run_json_records_what_loading_reads(runs):
    run = json.loads((runs["gpt"].run_dir / "run.json").read_text())
    assert run["identity"]["family"] == "gpt"


# ---------------------------------------------------------------------------- jaxformer eval

def _eval(capsys, *args):
    from jaxformer import cli

    code = cli.main(["eval", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _last_val_loss(result) -> float:
    records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    return [r["val_loss"] for r in records if "val_loss" in r][-1]


def _val_file(result):
    return result.run_dir.parent / "val.txt"


@pytest.mark.parametrize("family", [*FAMILIES, "gpt-torch"])
def test_eval_on_the_validation_file_equals_the_last_logged_validation_loss(runs, capsys,
                                                                           family):
    """Training evaluated its first ``--eval-batches 2`` batches of the validation file;
    ``eval --max-batches 2`` scores the same batches with the same loss, in either framework."""
    result = runs[family]
    logged = _last_val_loss(result)
    figures = {}
    for framework in ("jax", "torch"):
        code, out, err = _eval(capsys, "--model", result.run_dir, "--data", _val_file(result),
                               "--max-batches", 2, "--json", "--framework", framework)
        assert code == 0, err
        figures[framework] = json.loads(out)
        assert figures[framework]["batches"] == 2
    trained_in = "torch" if family == "gpt-torch" else "jax"
    # The same batches through the same loss: equal up to the order of float32 sums (the
    # evaluation is compiled with the accuracies beside it, which may reorder them).
    check_close(figures[trained_in]["loss"], logged, 1e-6, f"{family}: eval vs logged val_loss")
    other = figures["jax" if trained_in == "torch" else "torch"]["loss"]
    check_close(other, logged, 1e-5, f"{family}: the twin's eval vs logged val_loss")


def check_close(measured: float, expected: float, rtol: float, what: str) -> None:
    from parity_tests.support.bounds import check

    check(abs(measured - expected), rtol * abs(expected), what)


def test_eval_reports_each_familys_figures(runs, capsys):
    figures = {}
    for family in FAMILIES:
        code, out, err = _eval(capsys, "--model", runs[family].run_dir, "--data",
                               _val_file(runs[family]), "--json")
        assert code == 0, err
        figures[family] = json.loads(out)
    gpt = figures["gpt"]
    assert gpt["perplexity"] == pytest.approx(np.exp(gpt["nats_per_token"]))
    assert gpt["nats_per_token"] == pytest.approx(gpt["loss"])  # packed windows: no padding
    assert 0 <= gpt["token_accuracy"] <= 1
    assert "nats_per_char" not in gpt
    seq2seq = figures["transformer"]
    # label smoothing 0.1: the loss is training's (smoothed); the perplexity is the plain NLL's
    assert seq2seq["nats_per_token"] < seq2seq["loss"]
    assert 0 <= seq2seq["token_accuracy"] <= 1
    bert = figures["bert"]
    assert 0 <= bert["mlm_accuracy"] <= 1
    assert 0 <= bert["nsp_accuracy"] <= 1
    assert "perplexity" not in bert
    classifier = figures["classifier"]
    matrix = np.array(classifier["confusion"]["matrix"])
    assert classifier["confusion"]["labels"] == ["no", "yes"]
    assert matrix.sum() == classifier["examples"]
    assert classifier["accuracy"] == pytest.approx(np.trace(matrix) / matrix.sum())
    # every full batch of the file, once: 30 lines in batches of 4
    assert classifier["batches"] == 30 // 4
    assert classifier["examples"] == 28


def test_eval_of_a_char_model_on_the_held_out_tenth(tmp_path, capsys):
    """A run without --val-data evaluates on the data file's last tenth (eval_loss); eval
    --held-out scores the same batches. A character model reports nats per character. Trained
    and scored by the torch twin (no compilation): which batches are held out and scored is the
    command's, the same for either framework (both frameworks' eval: the test above)."""
    result = _run(tmp_path, "gpt", framework="torch", tokenizer="char", gpt_windows="random",
                  with_val=False)
    records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    logged = [r["eval_loss"] for r in records if "eval_loss" in r][-1]
    data = result.run_dir.parent / "train.txt"
    code, out, err = _eval(capsys, "--model", result.run_dir, "--data", data, "--held-out",
                           "--max-batches", 2, "--framework", "torch")
    assert code == 0, err
    loss = float(re.search(r"^  loss +(\S+)", out, re.M).group(1))
    check_close(loss, logged, 1e-5, "char gpt: eval --held-out vs logged eval_loss (6 digits)")
    assert re.search(r"^  nats_per_char +\S+", out, re.M)
    assert re.search(r"^  bits_per_char +\S+", out, re.M)
    assert not err  # the batches training scored: no note
    code, out, err = _eval(capsys, "--model", result.run_dir, "--data", data, "--held-out",
                           "--framework", "torch")
    assert code == 0
    assert "pass --max-batches 2 (and no --batch-size) to score exactly those" in err
    # a character the vocabulary lacks is an error naming it
    (tmp_path / "odd.txt").write_text("the cat sat \u2603 on the tree " * 20)
    code, _, err = _eval(capsys, "--model", result.run_dir, "--data", tmp_path / "odd.txt",
                         "--framework", "torch")
    assert code == 2
    assert err.startswith("jaxformer eval: error: ")
    assert "U+2603" in err


def test_eval_validates_flags_before_loading(runs, tmp_path, capsys, monkeypatch):
    from jaxformer import loading

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(loading, "load", refuse)
    run_dir, val = runs["gpt"].run_dir, _val_file(runs["gpt"])
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    for args, message in [
            (["--max-batches", 0], "--max-batches must be at least 1, got 0"),
            (["--batch-size", -1], "--batch-size must be at least 1, got -1"),
            (["--step", -2], "--step must be at least 0, got -2"),
            (["--out", taken], "exists and jaxformer did not write it"),
            (["--out", val], "--out"),
    ]:
        code, out, err = _eval(capsys, "--model", run_dir, "--data", val, *args)
        assert code == 2
        assert not out
        assert err.startswith("jaxformer eval: error: ")
        assert message in err
        assert err.count("\n") == 1
    code, _, err = _eval(capsys, "--model", tmp_path / "nowhere", "--data", val)
    assert code == 2
    assert f"--model {tmp_path / 'nowhere'}: does not exist" in err
    code, _, err = _eval(capsys, "--model", run_dir, "--data", tmp_path / "none.txt")
    assert code == 2
    assert "does not exist" in err


def test_eval_errors_are_one_line_with_status_2(runs, tmp_path, capsys):
    run_dir = runs["classifier"].run_dir
    (tmp_path / "other.txt").write_text("maybe\tthe cat sat\nno\tthe dog ran\n")
    code, _, err = _eval(capsys, "--model", run_dir, "--data", tmp_path / "other.txt")
    assert code == 2
    assert "label(s) ['maybe']" in err
    assert err.count("\n") == 1
    code, _, err = _eval(capsys, "--model", run_dir, "--data", _val_file(runs["classifier"]),
                         "--step", 3)
    assert code == 2
    assert err == (f"jaxformer eval: error: {run_dir}: has no checkpoint of step 3; its "
                   f"checkpoints are steps 2, 4\n")
    code, _, err = _eval(capsys, "--model", tmp_path, "--data", _val_file(runs["classifier"]))
    assert code == 2
    assert "is neither a run directory" in err


def test_eval_writes_its_json_to_out(runs, tmp_path, capsys):
    out_file = tmp_path / "eval.json"
    code, out, err = _eval(capsys, "--model", runs["classifier"].run_dir, "--data",
                           _val_file(runs["classifier"]), "--step", 2, "--out", out_file)
    assert code == 0, err
    written = json.loads(out_file.read_text())
    assert written["step"] == 2
    assert written["family"] == "classifier"
    assert "confusion (rows: true label, columns: predicted)" in out


# -------------------------------------------------------------------- eos_token_id in exports

def test_an_exported_gpt_stops_hugging_face_generation_at_its_end_token(runs, tmp_path):
    """``--export-hf`` writes the tokenizer's end token ([SEP]: it ends every line of the GPT
    stream) as ``eos_token_id``; transformers' ``generate`` stops there, where it ran to
    ``max_new_tokens`` without it."""
    from transformers import GPT2LMHeadModel

    from jaxformer.checkpoints.hf import save_pretrained
    from jaxformer.tokenizer import export_token_ids

    result = runs["gpt"]
    tokenizer = load(result.run_dir).tokenizer
    rundir.export_hf(result.model, result.run_dir, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["eos_token_id"] == tokenizer.eos_id == tokenizer.token_to_id("[SEP]")
    assert config["bos_token_id"] == tokenizer.eos_id
    assert config["pad_token_id"] == tokenizer.pad_id == tokenizer.token_to_id("[PAD]")
    assert export_token_ids(result.model, tokenizer) == {
        key: config[key] for key in ("eos_token_id", "bos_token_id", "pad_token_id")}
    save_pretrained(result.model, tmp_path / "bare")  # the old export: no end token
    assert json.loads((tmp_path / "bare" / "config.json").read_text())["eos_token_id"] is None

    def generate(directory):
        model = GPT2LMHeadModel.from_pretrained(directory).eval()
        with torch.no_grad():  # make the end token the greedy choice after the first step
            model.transformer.ln_f.weight.zero_()
            model.transformer.ln_f.bias.copy_(model.transformer.wte.weight[tokenizer.eos_id])
            logits = model(torch.tensor([[5, 6, 7]])).logits[0, -1]
            assert int(logits.argmax()) == tokenizer.eos_id
            out = model.generate(torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 3,
                                 dtype=torch.long), max_new_tokens=10, do_sample=False)
        return out[0, 3:].tolist()

    assert generate(tmp_path / "hf") == [tokenizer.eos_id]
    assert len(generate(tmp_path / "bare")) == 10


def test_an_exported_bert_names_its_end_and_start_tokens(runs, tmp_path):
    result = runs["bert"]
    tokenizer = load(result.run_dir).tokenizer
    rundir.export_hf(result.model, result.run_dir, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["eos_token_id"], config["bos_token_id"], config["pad_token_id"]) == (
        tokenizer.sep_id, tokenizer.cls_id, tokenizer.pad_id)


def test_an_exported_classifier_keeps_its_label_names(runs, tmp_path):
    from transformers import BertForSequenceClassification

    result = runs["classifier"]
    rundir.export_hf(result.model, result.run_dir, tmp_path / "hf")
    assert BertForSequenceClassification.from_pretrained(tmp_path / "hf").config.id2label == {
        0: "no", 1: "yes"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert load(tmp_path / "hf").label_names == ["no", "yes"]
