"""nanoGPT's "baby GPT" recipe: character-level text, random windows with shifted targets, a
validation file, and the greedy sample, in both frameworks."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from jaxformer import cli
from jaxformer.config import GPTConfig
from jaxformer.training import tasks, vocab
from jaxformer.training.config import TrainConfig, TrainConfigError

WORDS = ["thou", "art", "my", "lord", "and", "i", "shall", "not", "speak", "of", "love", "to",
         "thee", "the", "king", "is", "dead", "good", "night", "sweet", "prince", "what", "light",
         "through", "yonder", "window", "breaks"]


def play(lines=120, seed=0) -> str:
    """A few KB of Shakespeare-shaped text: speakers, colons, newlines, blank lines."""
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(lines // 3):
        out.append(rng.choice(["ROMEO:", "JULIET:", "KING HENRY:"]))
        for _ in range(2):
            words = rng.choice(WORDS, rng.randint(3, 9))
            out.append(" ".join(words).capitalize() + rng.choice([",", ".", "!", "?"]))
        out.append("")
    return "\n".join(out) + "\n"


CONFIG = TrainConfig(batch_size=4, seq_len=16, gpt_windows="random", seed=5)
SMALL = GPTConfig(vocab_size=11, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=24,
                  max_position_embeddings=6, dropout_rate=0.0, attention_dropout_rate=0.0)


def test_random_windows_are_shifted_slices_of_the_raw_text():
    text = play()
    tokenizer = vocab.char_tokenizer(text)
    train, held = tasks.build_datasets("gpt", text, tokenizer, CONFIG, eval_fraction=0.1)
    stream = vocab.encode_chars(tokenizer, text)
    assert "\n" in tokenizer.get_vocab()
    assert len(stream) == len(text)
    cut = len(stream) - round(0.1 * len(stream))  # the tail tenth is held out
    np.testing.assert_array_equal(train.tokens, stream[:cut])
    np.testing.assert_array_equal(held.tokens, stream[cut:])
    batch = train.micro_batch(3)
    assert batch["input_ids"].shape == batch["labels"].shape == (4, 16)
    np.testing.assert_array_equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    for x, y in zip(batch["input_ids"], batch["labels"]):  # each row: T + 1 consecutive chars
        row = np.append(x, y[-1])
        starts = [i for i in range(cut - 16) if np.array_equal(stream[i: i + 17], row)]
        assert starts, "a window that is not a slice of the training stream"
    # a pure function of (seed, position): rebuilt, it gives the same batches; positions and
    # seeds differ, the train and held-out streams differ
    again, _ = tasks.build_datasets("gpt", text, tokenizer, CONFIG, eval_fraction=0.1)
    for position in (0, 3, 1000):
        np.testing.assert_array_equal(again.micro_batch(position)["labels"],
                                      train.micro_batch(position)["labels"])
    other_seed, _ = tasks.build_datasets("gpt", text, tokenizer, TrainConfig(
        batch_size=4, seq_len=16, gpt_windows="random", seed=6))
    assert not np.array_equal(train.micro_batch(0)["input_ids"],
                              train.micro_batch(1)["input_ids"])
    assert not np.array_equal(train.micro_batch(0)["input_ids"],
                              other_seed.micro_batch(0)["input_ids"])
    evals = held.eval_batches(3)  # fixed: the same batches at every evaluation
    assert len(evals) == 3
    assert all(np.array_equal(a["input_ids"], b["input_ids"])
                                   for a, b in zip(evals, held.eval_batches(3)))
    # packed windows of a char stream: the raw text cut into seq_len pieces, no [SEP]
    packed, _ = tasks.build_datasets("gpt", text, tokenizer, TrainConfig(batch_size=4, seq_len=16))
    seen = packed.micro_batch(0, size=len(packed))["input_ids"]
    assert sorted(map(tuple, seen)) == sorted(map(tuple, stream[: len(stream) // 16 * 16]
                                                  .reshape(-1, 16)))


def test_the_loss_counts_every_position_of_a_random_window():
    """With labels the loss is the mean over all T positions (nanoGPT's), computed here in numpy
    from the logits; without them, the packed loss over the T - 1 shifted positions. The torch
    twin is checked here (eager, cheap); the JAX loss equals it on random windows (next test)."""
    import torch

    from torch_ref.training import losses as torch_losses
    from torch_ref.training.step import build_model

    model = build_model("gpt", SMALL, seed=0)
    rng = np.random.RandomState(0)
    ids = torch.as_tensor(rng.randint(0, 11, (2, 7)))
    batch = {"input_ids": ids[:, :-1], "attention_mask": torch.ones(2, 6, dtype=torch.long),
             "labels": ids[:, 1:]}
    with torch.no_grad():
        logits = model(batch["input_ids"], batch["attention_mask"]).double()
        nll = -torch.log_softmax(logits, -1).gather(-1, batch["labels"][..., None])[..., 0]
        loss = float(torch_losses.batch_loss("gpt", model, batch, CONFIG))
        packed = float(torch_losses.batch_loss(
            "gpt", model, {k: batch[k] for k in tasks.get("gpt").batch_keys}, CONFIG))
    assert loss == pytest.approx(float(nll.mean()), rel=1e-6)
    assert packed == pytest.approx(float(nll[:, :-1].mean()), rel=1e-6)  # no last target
    assert abs(loss - packed) > 1e-3
    bad = {k: v.numpy() for k, v in batch.items()}
    bad["labels"] = np.full((2, 6), 11)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 11\) or be -100"):
        tasks.get("gpt").check_batch(bad, SMALL)


def train(*args):
    return cli.main(["train", *map(str, args)])


def test_char_recipe_trains_alike_in_both_frameworks(tmp_path, capsys):
    """The baby recipe's flags on a tiny model: equal losses and val losses (1e-5 relative over
    10 steps), val_loss on the evaluation lines only, nanoGPT's character ids."""
    (tmp_path / "train.txt").write_text(play(150, seed=1))
    (tmp_path / "val.txt").write_text(play(30, seed=2))
    common = ["--family", "gpt", "--preset", "tiny", "--dropout", 0, "--tokenizer", "char",
              "--data", tmp_path / "train.txt", "--val-data", tmp_path / "val.txt", "--gpt-windows",
              "random", "--steps", 10, "--batch-size", 4, "--seq-len", 32, "--lr", 1e-2,
              "--min-lr", 1e-3, "--schedule", "cosine", "--warmup", 2, "--beta2", 0.99,
              "--weight-decay", 0.1, "--clip", 1, "--eval-every", 5, "--eval-iters", 2,
              "--progress", "plain", "--log-every", 1]
    records = {}
    for framework in ("jax", "torch"):
        run_dir = tmp_path / framework
        assert train(*common, "--framework", framework, "--checkpoint-dir", run_dir) == 0
        out = capsys.readouterr().out
        assert len(re.findall(r"^step \d+/10 .* val_loss \d+\.\d+$", out, re.M)) == 2
        records[framework] = [json.loads(line) for line in
                              (run_dir / "metrics.jsonl").read_text().splitlines()]
    tokenizer = vocab.load_tokenizer(tmp_path / "jax" / "tokenizer.json")
    both = (tmp_path / "train.txt").read_text() + (tmp_path / "val.txt").read_text()
    assert tokenizer.get_vocab() == {c: i for i, c in enumerate(sorted(set(both)))}
    jax_records, torch_records = records["jax"], records["torch"]
    assert [r["step"] for r in jax_records if "val_loss" in r] == [5, 10]
    assert not any("eval_loss" in r for r in jax_records + torch_records)
    np.testing.assert_allclose([r["loss"] for r in jax_records],
                               [r["loss"] for r in torch_records], rtol=1e-5)
    np.testing.assert_allclose([r["val_loss"] for r in jax_records if "val_loss" in r],
                               [r["val_loss"] for r in torch_records if "val_loss" in r],
                               rtol=1e-5)
    assert jax_records[-1]["loss"] < jax_records[0]["loss"] - 0.5  # it learns


def test_greedy_sample_is_the_same_in_both_frameworks():
    """On randomized weights, past the context length: identical ids in both frameworks, and
    what an unpadded forward of the cropped context picks (the loop feeds right-padded windows)."""
    import torch

    from jaxformer.models.gpt import GPT as JaxGPT
    from jaxformer.training.sample import greedy_sample
    from parity_tests.support.helpers import twin_pair
    from torch_ref.models.gpt import GPT
    from torch_ref.training import sample as torch_sample

    twin, model = twin_pair(GPT, JaxGPT, SMALL, seed=1, randomized=True)
    prompt = [1, 2, 3]
    ids = greedy_sample(model, prompt, 12)
    np.testing.assert_array_equal(ids, torch_sample.greedy_sample(twin, prompt, 12))
    assert ids.dtype == np.int32
    assert ids.shape == (12,)
    assert len(set(ids.tolist())) > 2
    full = prompt + ids.tolist()
    with torch.no_grad():
        for n in range(len(prompt), len(full)):
            context = torch.tensor([full[max(0, n - 6): n]])
            assert int(torch.argmax(twin(context)[0, -1])) == full[n]
    with pytest.raises(ValueError, match="the prompt is empty"):
        greedy_sample(model, [], 3)
    with pytest.raises(ValueError, match=r"prompt_ids must lie in \[0, 11\); found 11"):
        torch_sample.greedy_sample(twin, [11], 3)


@pytest.mark.parametrize(("flags", "message"), [
    (["--family", "bert", "--gpt-windows", "random"], "--gpt-windows 'random' is for the gpt "
                                                       "family only"),
    (["--val-data", "VAL"], "--val-data must be given only with --eval-every > 0"),
    (["--val-data", "missing.txt", "--eval-every", "5"], r"data file \S*missing.txt does not "
                                                         "exist"),
    (["--tokenizer", "chars"], "--tokenizer 'chars' is neither one of char, bpe, wordpiece nor "
                               "an existing tokenizer.json file"),
    (["--tokenizer", "char", "--gpt-windows", "random", "--seq-len", "64", "--eval-every", "5"],
     r"held-out tail \(\d+ tokens\) is shorter than one random window of seq_len \+ 1 = 65"),
])
def test_bad_recipe_flags_are_refused(tmp_path, capsys, flags, message):
    text = tmp_path / "train.txt"
    text.write_text(play(12))
    (tmp_path / "val.txt").write_text(play(6, seed=1))
    flags = [str(tmp_path / "val.txt") if f == "VAL" else f for f in flags]
    run_dir = tmp_path / "run"
    args = ["--data", text, "--checkpoint-dir", run_dir, "--steps", 5, *flags]
    if "--family" not in flags:
        args = ["--family", "gpt", *args]
    assert train(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxformer train: error: "), err
    assert re.search(message, err), err
    assert not run_dir.exists()
    with pytest.raises(TrainConfigError, match="gpt_windows must be one of"):
        TrainConfig(gpt_windows="sliding")
