"""``jaxformer.load``: a run of every family (trained by either framework) or a Hugging Face
directory loads as the model training returned, in JAX and as the torch twin; bad paths are
one-line errors naming the path and the problem."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch

import jaxformer
from jaxformer.loading import LoadError, TextTokenizer, load, require_family
from jaxformer.training import loop
from jaxformer.training.config import TrainConfig
from parity_tests.support.helpers import assert_close
from parity_tests.support.training import write_corpus

FAMILIES = ("gpt", "bert", "transformer", "classifier")
STEPS = 4


def _run(root, family, framework="jax", tokenizer=None, **changes):
    data = write_corpus(root / "train.txt", lines=60, tabs=family == "classifier")
    val = write_corpus(root / "val.txt", lines=30, seed=1, tabs=family == "classifier")
    config = TrainConfig(**{"steps": STEPS, "batch_size": 4, "seq_len": 16, "warmup_steps": 1,
                            **({"label_smoothing": 0.1} if family == "transformer" else {}),
                            **changes})
    options = loop.RunOptions(family=family, data=data, val_data=val, framework=framework,
                              tokenizer=tokenizer, checkpoint_dir=str(root / "run"),
                              checkpoint_every=2, eval_every=2, eval_batches=2,
                              progress="none", vocab_size=120)
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
    assert len(loaded.label_names) == 2
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
