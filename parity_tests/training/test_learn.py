"""The learning checks of ``benchmarks/`` (``learn_bert.py``, ``learn_copy_reverse.py``) in
miniature: what they make of their data, and a few steps in which the loss goes down. Their real
runs (minutes) are scripts; their results are in ``benchmarks/results/learn_*.json``."""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys

import numpy as np
import pytest

from jaxformer.training import tasks, vocab
from jaxformer.training.config import TrainConfig

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "benchmarks"))
import learn_bert
import learn_copy_reverse as lcr

PLAY = """A TINY PLAY

by Nobody

PERSONS REPRESENTED.

Alpha, a lord.
Beta, his man.

ACT I.

Scene I. A room.

[Enter Alpha and Beta.]

ALPHA.
The cat sat on the mat,
and the dog [Aside] ran away.

Beta.
I saw it run.

FIRST LORD.
No.

[Exeunt.]
"""


def test_speeches_are_the_sentences_and_plays_the_documents():
    assert learn_bert.speeches(PLAY) == ["The cat sat on the mat, and the dog ran away.",
                                         "I saw it run.", "No."]
    text = learn_bert.bert_text({"one": PLAY, "two": PLAY.replace("cat", "owl"), "poem": "O."})
    documents = text.strip().split("\n\n")
    assert len(documents) == 2
    assert documents[1].splitlines()[0].startswith("The owl")
    first, second = learn_bert.TASK_PLAYS
    long = "\n\n".join(f"ALPHA.\nspeech number {i} of the first play" for i in range(9))
    other = "\n\n".join(f"Beta.\nanother speech, {i}, of the second" for i in range(4))
    train, held = learn_bert.play_task({first: long, second: other + "\n\n" + PLAY}, seed=0)
    rows = [line.split("\t") for line in train.splitlines() + held.splitlines()]
    assert all(len(text.split()) >= learn_bert.MIN_WORDS for _, text in rows)  # "No." dropped
    for split, n in ((train, 4), (held, 1)):  # the second play's 5 long speeches: 4 + 1
        labels = [line.split("\t")[0] for line in split.splitlines()]
        assert labels.count(first) == labels.count(second) == n
    assert not set(train.splitlines()) & set(held.splitlines())


def test_plays_are_cut_by_the_manifest(tmp_path):
    names, texts = ["a", "b"], ["first\n\nplay", "second"]
    (tmp_path / "train.txt").write_text("\n\n".join(texts) + "\n")
    manifest = {"documents": [{"name": n, "characters": len(t)} for n, t in zip(names, texts)],
                "train": {"file": "train.txt", "documents": names}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert learn_bert.read_plays(tmp_path, "train") == dict(zip(names, texts))
    manifest["documents"][0]["characters"] += 1
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match=r"does not match manifest.json"):
        learn_bert.read_plays(tmp_path, "train")


def test_copy_reverse_batches_and_held_out_sequences():
    first = lcr.VOCAB - lcr.SYMBOLS  # the first ordinary id
    x = np.arange(first, first + 4, dtype=np.int32)
    b = lcr.batch([(x, x[::-1].copy())])
    assert list(b["src_ids"][0, :6]) == [*x, lcr.EOS, lcr.PAD]
    assert list(b["tgt_ids"][0, :6]) == [lcr.BOS, *x[::-1], lcr.PAD]
    assert list(b["labels"][0, :6]) == [*x[::-1], lcr.EOS, -100]
    assert b["src_mask"][0].sum() == b["tgt_mask"][0].sum() == 5
    pred = np.where(b["labels"] == -100, 0, b["labels"])
    assert lcr.exact_match(pred, b["labels"]).all()
    pred[0, 4] = first  # a wrong end token is a wrong sequence
    assert not lcr.exact_match(pred, b["labels"]).any()
    # every length-4 sequence held out: the training stream redraws them all
    every = [(np.array(s, np.int32),) * 2
             for s in itertools.product(range(first, lcr.VOCAB), repeat=4)]
    stream = lcr.Stream("copy", 0, 64, every)
    batch = stream(0)
    assert stream.redrawn > 0
    assert (batch["src_mask"].sum(-1) > 5).all()
    np.testing.assert_array_equal(batch["src_ids"], lcr.Stream("copy", 0, 64, every)(0)["src_ids"])


def test_the_encoder_decoder_starts_learning_to_reverse():
    from jaxformer.training.step import TrainStep, build_model

    model_cfg = dataclasses.replace(lcr.model_config(), num_encoder_layers=1,
                                    num_decoder_layers=1, hidden_size=32, intermediate_size=64)
    config = dataclasses.replace(lcr.train_config(40, 0), warmup_steps=4)
    trainer = TrainStep("transformer", build_model("transformer", model_cfg, 0), config)
    stream = lcr.Stream("reverse", 0, config.batch_size, [])
    losses = [trainer(stream(step))["loss"] for step in range(config.steps)]
    # 40 steps reach the symbols' frequencies (2.53 -> 2.37 measured); reversing itself takes
    # a few hundred steps (benchmarks/results/learn_copy_reverse.json)
    assert np.mean(losses[-5:]) < 0.95 * np.mean(losses[:5])


def test_learn_bert_pretraining_examples_from_plays():
    text = learn_bert.bert_text({"one": PLAY * 3, "two": PLAY})
    tokenizer = vocab.wordpiece_tokenizer(text.splitlines(), 60)
    config = TrainConfig(batch_size=6, seq_len=16, max_predictions=3)
    dataset, _ = tasks.build_datasets("bert", text, tokenizer, config)
    batch = dataset.micro_batch(0)
    assert len(dataset) == 12
    assert batch["masked_positions"].shape == (6, 3)
