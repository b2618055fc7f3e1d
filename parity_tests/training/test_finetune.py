"""``jaxformer train --init-from``: fine-tuning from a Hugging Face directory or a run.

A tiny randomised ``BertForPreTraining`` (transformers' own classes, ``support.hf_models``) is
fine-tuned as a classifier in both frameworks: the trajectory parity of the other training runs
(``test_trajectory.py``'s bounds), its encoder loaded exactly, its MLM and NSP heads dropped and a
fresh classifier, each reported. A tiny ``GPT2LMHeadModel`` with a GPT-2-style tokenizer
(``<|endoftext|>`` its one special token) continues language modelling: the first step's loss is
the Hugging Face model's own loss on the same batch. Then the refusals, and ``--resume``.
"""

from __future__ import annotations

import io
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported (support.hf_models)
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import pytest
import torch

from jaxformer import cli
from jaxformer.checkpoints import convert
from jaxformer.training import loop, tasks, vocab
from jaxformer.training.config import TrainConfig
from parity_tests.support.bounds import check, zero_gradient
from parity_tests.support.hf_models import hf_bert_config, hf_gpt2_config, hf_model
from parity_tests.support.training import corpus, write_corpus

STEPS = 60


def train(*args):
    return cli.main(["train", *map(str, args)])


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A Hugging Face BertForPreTraining directory (the tiny preset's sizes) with a WordPiece
    tokenizer.json of the same vocabulary."""
    root = tmp_path_factory.mktemp("hf_bert")
    tokenizer = vocab.wordpiece_tokenizer(corpus("classifier").splitlines(), 120)
    model = hf_model("BertForPreTraining", hf_bert_config(vocab_size=tokenizer.get_vocab_size()))
    model.save_pretrained(root)
    tokenizer.save(str(root / "tokenizer.json"))
    return root, model


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory):
    """A Hugging Face GPT2LMHeadModel directory with a byte-level BPE tokenizer whose only
    special token is ``<|endoftext|>``, as GPT-2's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("hf_gpt2")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus("gpt").splitlines(), trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = hf_model("GPT2LMHeadModel", hf_gpt2_config(vocab_size=tokenizer.get_vocab_size()))
    model.save_pretrained(root)
    tokenizer.save(str(root / "tokenizer.json"))
    return root, model, tokenizer


def state(model) -> dict[str, np.ndarray]:
    if isinstance(model, torch.nn.Module):
        return {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    return {k: np.asarray(v, np.float64) for k, v in convert.nnx_to_torch(model).items()}


def test_finetune_trajectory_matches_torch(bert_dir, tmp_path):
    """Both frameworks fine-tune the checkpoint from the same matched weights: per-step losses
    and the final parameters within the trajectory bounds (DESIGN.md)."""
    hf_dir, hf = bert_dir
    data = tmp_path / "labelled.txt"
    data.write_text(corpus("classifier"))
    config = TrainConfig(steps=STEPS, batch_size=4, seq_len=16, learning_rate=3e-3,
                         warmup_steps=5, schedule="cosine", weight_decay=0.1,
                         decay_embeddings=False, clip_norm=0.5)
    options = loop.RunOptions(family="classifier", data=str(data), init_from=str(hf_dir),
                              dropout=0.0, checkpoint_dir=str(tmp_path / "run"))
    run_dir, identity, model_cfg, train_set, _, source = loop.prepare(config, options)
    printed = io.StringIO()
    init = loop.initializer(source, options, train_set, run_dir, printed)
    steps = {framework: loop.build_trainer("classifier", framework, model_cfg, config, options,
                                           init)[0] for framework in ("jax", "torch")}
    report = printed.getvalue()
    assert "fresh (created from --seed): classifier (2 tensors)" in report
    assert "dropped (the classifier model has no use for them): mlm" in report
    assert "nsp (" in report
    recorded = json.loads((run_dir / "run.json").read_text())
    assert sorted(recorded["init"]["fresh"]) == ["classifier"]
    assert sorted(recorded["init"]["dropped"]) == ["mlm", "nsp"]
    assert identity["init_from"]["source"] == "huggingface"
    # The encoder and pooler are the checkpoint's, exactly, in both frameworks.
    theirs = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    for framework, step in steps.items():
        ours = state(step.sync() if framework == "jax" else step.model)
        for key, hf_key in (("bert.embeddings.word_embeddings.weight",
                             "bert.embeddings.word_embeddings.weight"),
                            ("bert.encoder.layers.1.feed_forward.fc2.weight",
                             "bert.encoder.layer.1.output.dense.weight"),
                            ("bert.pooler.dense.bias", "bert.pooler.dense.bias")):
            np.testing.assert_array_equal(ours[key], theirs[hf_key], err_msg=framework)
    start = state(steps["torch"].model)
    np.testing.assert_array_equal(state(steps["jax"].sync())["classifier.weight"],
                                  start["classifier.weight"])
    losses = {f: [] for f in steps}
    for step in range(STEPS):
        batch = train_set.update_batch(step)
        for framework, trainer in steps.items():
            losses[framework].append(trainer(batch)["loss"])
    jax_loss, torch_loss = (np.array(losses[f]) for f in ("jax", "torch"))
    rel = np.abs(jax_loss - torch_loss) / np.abs(torch_loss)
    ours, theirs = state(steps["jax"].sync()), state(steps["torch"].model)
    keys = [k for k in theirs if not zero_gradient(k)]
    params = float(np.sqrt(sum(((ours[k] - theirs[k]) ** 2).sum() for k in keys)
                           / sum((theirs[k] ** 2).sum() for k in keys)))
    print(f"\nfine-tune: loss {torch_loss[0]:.3f} -> {torch_loss[-1]:.3f}; max rel loss diff "
          f"{rel.max():.1e}; params rel L2 after {STEPS}: {params:.1e}")
    assert torch_loss[-10:].mean() < 0.9 * torch_loss[:10].mean()  # it learns
    assert max(np.abs(theirs[k] - start[k]).max() for k in keys) > 1e-3  # the weights moved
    check(rel[:10].max(), 1e-5, f"loss, first 10 steps (worst step {rel[:10].argmax() + 1})")
    check(rel.max(), 1e-4, f"loss, {STEPS} steps (worst step {rel.argmax() + 1})")
    check(params, 1e-4, f"parameters after {STEPS} steps, relative L2")
    accuracy = {f: s.accuracy(train_set.micro_batch(0)) for f, s in steps.items()}
    assert accuracy["jax"] == accuracy["torch"]


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_gpt2_first_loss_is_the_hugging_face_models(gpt_dir, tmp_path, framework):
    """``--init-from`` a GPT-2 directory continues language modelling: the first step's loss is
    the Hugging Face model's loss on that batch; lines end with ``<|endoftext|>``."""
    hf_dir, hf, tokenizer = gpt_dir
    data = tmp_path / "new.txt"
    data.write_text("the river ran under the green tree\nthe red bird flew over the house\n" * 20)
    run = tmp_path / "run"
    assert train("--family", "gpt", "--init-from", hf_dir, "--data", data, "--steps", 3,
                 "--batch-size", 2, "--seq-len", 16, "--dropout", 0, "--framework", framework,
                 "--checkpoint-dir", run, "--progress", "none") == 0
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    config = TrainConfig(**json.loads((run / "run.json").read_text())["identity"]["train_config"])
    train_set, _ = tasks.build_datasets("gpt", data.read_text(), tokenizer, config)
    ids = train_set.update_batch(0)["input_ids"][0]
    assert (ids == tokenizer.token_to_id("<|endoftext|>")).any()
    with torch.no_grad():
        expected = float(hf(input_ids=torch.from_numpy(ids).long(),
                            labels=torch.from_numpy(ids).long()).loss)
    check(abs(first["loss"] - expected) / expected, 1e-5,
          f"{framework} first-step loss vs GPT2LMHeadModel's")


def test_resume_of_a_finetune_run_continues_it_exactly(bert_dir, tmp_path, capsys):
    """A fine-tuning run stopped after 2 of 4 updates and resumed (the same flags plus
    ``--resume``, as the interrupt message prints them) logs the losses of the run that was not
    stopped; ``--resume`` without the run's ``--init-from`` is refused."""
    hf_dir, _ = bert_dir
    data = write_corpus(tmp_path / "labelled.txt", lines=60, tabs=True)
    flags = ["--family", "classifier", "--init-from", hf_dir, "--data", data, "--batch-size", 4,
             "--seq-len", 16, "--schedule", "constant", "--progress", "none"]
    assert train(*flags, "--steps", 4, "--checkpoint-dir", tmp_path / "whole") == 0
    assert train(*flags, "--steps", 2, "--checkpoint-dir", tmp_path / "parts") == 0
    capsys.readouterr()
    without = flags[:2] + flags[4:]  # no --init-from
    assert train(*without, "--steps", 4, "--checkpoint-dir", tmp_path / "parts", "--resume") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "the run started from --init-from" in err
    assert train(*flags, "--steps", 4, "--checkpoint-dir", tmp_path / "parts", "--resume") == 0
    assert "fresh (created from --seed): classifier" in capsys.readouterr().out
    whole, parts = ([json.loads(line)["loss"] for line in (tmp_path / d / "metrics.jsonl")
                     .read_text().splitlines()] for d in ("whole", "parts"))
    assert whole == parts


def _flags(tmp_path, data, *extra):
    """One update of the sizes and the constant schedule of the resume test above: the same
    compiled train step (the suite's compilation cache), the learning rate being no function of
    ``--steps`` under a constant schedule."""
    return ["--data", data, "--steps", 1, "--batch-size", 4, "--seq-len", 16, "--schedule",
            "constant", "--checkpoint-dir", tmp_path / "run", "--progress", "none", *extra]


@pytest.mark.parametrize(("case", "message"), [
    ("empty_dir", "neither a jaxformer run directory (no run.json) nor a Hugging Face model "
                  "directory (no config.json)"),
    ("missing", "does not exist"),
    ("gpt_for_classifier", "a GPT checkpoint (GPTConfig) cannot start a classifier run, which "
                           "trains a BertForSequenceClassification (BertConfig)"),
    ("preset", "--preset simple_bert conflicts with --init-from"),
    ("tokenizer", "--tokenizer wordpiece conflicts with --init-from"),
    ("vocab_size", "--vocab-size 50 conflicts with --init-from"),
    ("no_tokenizer", "no tokenizer.json; the run takes the checkpoint's tokenizer"),
    ("other_tokenizer", "not the checkpoint's tokenizer"),
    ("resume_a_fresh_run", "the run did not start from a checkpoint"),
])
def test_bad_init_from_is_a_one_line_error_naming_it(bert_dir, gpt_dir, tmp_path, capsys, case,
                                                     message):
    hf_dir, _ = bert_dir
    data = write_corpus(tmp_path / "labelled.txt", lines=30, tabs=True)
    path, extra = hf_dir, []
    if case == "empty_dir":
        path = tmp_path / "empty"
        path.mkdir()
    elif case == "missing":
        path = tmp_path / "nowhere"
    elif case == "gpt_for_classifier":
        path = gpt_dir[0]
    elif case in ("preset", "tokenizer", "vocab_size"):
        extra = {"preset": ["--preset", "simple_bert"], "tokenizer": ["--tokenizer", "wordpiece"],
                 "vocab_size": ["--vocab-size", 50]}[case]
    elif case in ("no_tokenizer", "other_tokenizer"):
        path = tmp_path / "hf"
        path.mkdir()
        for name in ("config.json", "model.safetensors"):
            (path / name).write_bytes((hf_dir / name).read_bytes())
        if case == "other_tokenizer":
            vocab.wordpiece_tokenizer(["just a few words"], 20).save(str(path / "tokenizer.json"))
    elif case == "resume_a_fresh_run":  # the torch twin (no compilation): the refusal reads
        # the run's identity, the same for either framework
        extra = ["--framework", "torch"]
        assert train("--family", "classifier", *_flags(tmp_path, data), *extra) == 0
        extra = [*extra, "--resume"]
    capsys.readouterr()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert train("--family", "classifier", "--init-from", path, *_flags(tmp_path, data),
                 *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxformer train: error: "), err
    assert err.count("\n") == 1, err
    assert message in err, err
    assert str(path) in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_an_agreeing_preset_is_accepted(bert_dir, tmp_path, capsys):
    """``--preset tiny`` has the tiny checkpoint's architecture (all but the vocabulary): no
    conflict, and the run is the checkpoint's."""
    hf_dir, _ = bert_dir
    data = write_corpus(tmp_path / "labelled.txt", lines=30, tabs=True)
    assert train("--family", "classifier", "--init-from", hf_dir, "--preset", "tiny",
                 *_flags(tmp_path, data)) == 0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    hf_config = json.loads((hf_dir / "config.json").read_text())
    assert run["identity"]["model_config"]["vocab_size"] == hf_config["vocab_size"]
    assert run["identity"]["init_from"]["path"] == str(hf_dir.resolve())


def test_init_from_a_run_directory(tmp_path, capsys):
    """``--init-from`` a run (through ``jaxformer.load``): a classifier from a BERT pre-training
    run drops the MLM and NSP heads; from a classifier run with the same labels it takes every
    tensor, with other labels it makes its classifier fresh and says why. The runs train the
    torch twin (no compilation): ``--init-from`` loads a run in JAX whichever framework trained
    it, and what is asserted (the report, run.json) is the same for either."""
    pre_data = tmp_path / "pre.txt"
    pre_data.write_text(corpus("bert"))
    labelled = write_corpus(tmp_path / "labelled.txt", lines=40, tabs=True)
    relabelled = tmp_path / "relabelled.txt"
    relabelled.write_text(corpus("classifier", 40).replace("yes\t", "cat\t").replace("no\t", "x\t"))
    common = ["--steps", 1, "--batch-size", 2, "--seq-len", 16, "--progress", "none",
              "--framework", "torch"]
    assert train("--family", "bert", "--data", pre_data, "--checkpoint-dir", tmp_path / "pre",
                 *common) == 0
    capsys.readouterr()
    assert train("--family", "classifier", "--init-from", tmp_path / "pre", "--data", labelled,
                 "--checkpoint-dir", tmp_path / "cls", *common) == 0
    out = capsys.readouterr().out
    assert f"from {tmp_path / 'pre'} (run BertForPreTraining, step 1)" in out
    assert "fresh (created from --seed): classifier (2 tensors)" in out
    assert "dropped (the classifier model has no use for them): mlm" in out
    identity = json.loads((tmp_path / "cls" / "run.json").read_text())["identity"]
    assert identity["init_from"]["source"] == "run"
    assert identity["init_from"]["step"] == 1
    for data, fresh in ((labelled, "none"), (relabelled, "classifier (2 tensors, the checkpoint's "
                                                          "labels ['no', 'yes'] are not the "
                                                          "data's ['cat', 'x'])")):
        run = tmp_path / f"again-{fresh[:4]}"
        assert train("--family", "classifier", "--init-from", tmp_path / "cls", "--data", data,
                     "--checkpoint-dir", run, *common) == 0
        out = capsys.readouterr().out
        assert f"fresh (created from --seed): {fresh}\n" in out, out
        assert "dropped (the classifier model has no use for them): none" in out
