"""BERT pre-training examples as the original ``create_pretraining_data.py`` builds them: 50%
next sentence / 50% random sentence, ``min(max_predictions, max(1, round(0.15 * length)))``
masked positions per sequence drawn among the real non-special tokens, 80% ``[MASK]`` / 10% random
/ 10% kept, a pure function of ``(seed, position)``; the loss at those positions only, equal in
both frameworks and equal to the dense loss it replaces.

The statistical bounds are 5 standard deviations of the binomial count they bound (a false alarm
about once in 3.5 million runs); the draws are seeded, so a run either always passes or never.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from jaxformer.training import data, tasks, vocab
from jaxformer.training.config import IGNORE_INDEX, TrainConfig, TrainConfigError
from parity_tests.support.training import twin_steps

WORDS = ["the", "a", "cat", "dog", "bird", "sat", "ran", "flew", "over", "under", "near", "house",
         "tree", "river", "quickly", "slowly", "red", "green", "big", "small"]
CLS, SEP, MASK = 2, 3, 4


def corpus(sentences=300, per_document=10, seed=0) -> str:
    rng = np.random.RandomState(seed)
    out = []
    for i in range(sentences):
        out.append(" ".join(rng.choice(WORDS, rng.randint(2, 30))))
        if i % per_document == per_document - 1:
            out.append("")  # a document ends
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def setup():
    text = corpus()
    tokenizer = vocab.wordpiece_tokenizer(text.splitlines(), 60)
    config = TrainConfig(batch_size=500, seq_len=40, max_predictions=5, seed=7)
    dataset, _ = tasks.build_datasets("bert", text, tokenizer, config)
    batches = [dataset.micro_batch(p) for p in range(4)]  # 2000 examples
    batch = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    encoded = [tuple(tokenizer.encode(s, add_special_tokens=False).ids)
               for s in text.splitlines() if s.strip()]
    return text, tokenizer, config, dataset, batch, encoded


def within(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p))


def test_masked_positions_follow_the_counting_rule(setup):
    _, _tokenizer, config, _, batch, encoded = setup
    ids, mask, positions, labels = (batch[k] for k in ("input_ids", "attention_mask",
                                                       "masked_positions", "mlm_labels"))
    assert positions.shape == labels.shape == (len(ids), config.max_predictions)
    original = ids.copy()
    rows = np.arange(len(ids))[:, None]
    real = labels != IGNORE_INDEX
    original[np.broadcast_to(rows, positions.shape)[real], positions[real]] = labels[real]
    capped = 0
    for r in range(len(ids)):
        length = int(mask[r].sum())  # [CLS] A [SEP] B [SEP], the length BERT's rule reads
        candidates = np.flatnonzero((mask[r] == 1) & (original[r] > MASK))
        expected = min(config.max_predictions, max(1, round(length * 0.15)), len(candidates))
        capped += expected == config.max_predictions < round(length * 0.15)
        n = int(real[r].sum())
        assert n == expected, (r, length, n, expected)
        assert real[r, :n].all()
        assert not real[r, n:].any()
        picked = positions[r, :n]
        assert (np.diff(picked) > 0).all()  # ascending, no position twice
        assert set(picked) <= set(candidates)  # never [CLS], [SEP] or padding
        assert (positions[r, n:] == 0).all()  # padding: index 0, label -100
        # everything but the picked positions is the untouched text
        others = np.setdiff1d(np.arange(len(ids[r])), picked)
        np.testing.assert_array_equal(ids[r, others], original[r, others])
    assert capped > 50  # the cap (max_predictions) acted on long pairs, the rule on short ones
    # the restored rows are real text: A and B are (truncated) sentences of the corpus
    prefixes = {s[:k] for s in encoded for k in range(len(s) + 1)}
    for row, m in zip(original, mask):
        tokens = list(row[m == 1])
        first = tokens.index(SEP)
        assert tokens[0] == CLS
        assert tokens[-1] == SEP
        assert tuple(tokens[1:first]) in prefixes
        assert tuple(tokens[first + 1:-1]) in prefixes


def test_80_10_10_and_half_next_sentences(setup):
    text, tokenizer, _, _dataset, batch, _encoded = setup
    ids, positions, labels = batch["input_ids"], batch["masked_positions"], batch["mlm_labels"]
    real = labels != IGNORE_INDEX
    rows = np.broadcast_to(np.arange(len(ids))[:, None], positions.shape)
    now = ids[rows[real], positions[real]]
    before = labels[real]
    n = len(before)
    ordinary = tokenizer.get_vocab_size() - len(vocab.SPECIAL_TOKENS)
    # a random replacement draws uniformly among the ordinary tokens, the original included
    p_kept = 0.1 + 0.1 / ordinary
    assert within(int((now == MASK).sum()), n, 0.8)
    assert within(int((now == before).sum()), n, p_kept)
    assert within(int(((now != MASK) & (now != before)).sum()), n, 0.1 - 0.1 / ordinary)
    assert (now > MASK).sum() + (now == MASK).sum() == n  # a random token is never special
    # NSP: B follows A with probability 1/2 where A has a next sentence in its document
    nsp = batch["nsp_labels"]
    documents = [len(d.strip().splitlines()) for d in text.split("\n\n")]
    has_next = sum(d - 1 for d in documents) / sum(documents)
    assert within(int((nsp == 0).sum()), len(nsp), 0.5 * has_next)
    assert 0.4 < (nsp == 0).mean() < 0.5  # 45% here: 9 of every 10 sentences have a next one


def test_examples_are_a_function_of_seed_and_position(setup):
    text, tokenizer, config, dataset, _, _ = setup
    again, _ = tasks.build_datasets("bert", text, tokenizer, config)
    order = [again.micro_batch(p) for p in (9, 3, 0)]  # another order of reading
    for batch, position in zip(order, (9, 3, 0)):
        first = dataset.micro_batch(position)
        assert all(np.array_equal(first[k], batch[k]) for k in first)
    other, _ = tasks.build_datasets("bert", text, tokenizer,
                                   TrainConfig(batch_size=500, seq_len=40, max_predictions=5))
    assert not np.array_equal(other.micro_batch(0)["masked_positions"],
                              dataset.micro_batch(0)["masked_positions"])


def test_max_predictions_bounds_and_refusals(setup):
    text, tokenizer, _, _, _, _ = setup
    short, _ = tasks.build_datasets("bert", text, tokenizer,
                                   TrainConfig(batch_size=8, seq_len=16, max_predictions=99))
    assert short.micro_batch(0)["masked_positions"].shape == (8, 16)  # never more than seq_len
    with pytest.raises(TrainConfigError, match="max_predictions must not be negative"):
        TrainConfig(max_predictions=-1)
    from jaxformer.training.tasks import model_config

    model_cfg = model_config("bert", "tiny", vocab_size=tokenizer.get_vocab_size())
    good = short.micro_batch(0)
    tasks.get("bert").check_batch(good, model_cfg)
    for key, change, message in [
            ("masked_positions", lambda v: v[:, :3], r"mlm_labels has shape \(8, 16\) but "
                                                     r"masked_positions \(8, 3\)"),
            ("masked_positions", lambda v: v + 16, r"masked_positions must lie in \[0, 16\)"),
            ("masked_positions", lambda v: v[:4], r"masked_positions has shape \(4, 16\) but "
                                                  r"input_ids \(8, 16\)")]:
        bad = dict(good, **{key: change(good[key])})
        with pytest.raises(ValueError, match=message):
            tasks.get("bert").check_batch(bad, model_cfg)
    with pytest.raises(data.DataError, match=r"missing \['masked_positions'\]"):
        tasks.get("bert").check_batch({k: v for k, v in good.items() if k != "masked_positions"},
                         model_cfg)


def test_loss_at_the_positions_equals_the_dense_loss_and_torch():
    """The MLM loss on ``P`` gathered positions is the dense ``(B, T)`` loss with the same labels
    scattered back (shown on the torch twin, eager and quick); the JAX and torch steps give the
    same losses on these batches, so the JAX loss is that dense loss too. And it learns."""
    import torch

    from torch_ref.training import losses as torch_losses

    config = TrainConfig(steps=4, batch_size=4, seq_len=24, max_predictions=4, learning_rate=3e-3)
    jax_step, torch_step, dataset = twin_steps("bert", config)
    batch = dataset.micro_batch(0)
    model = torch_step.model.eval()
    tensors = {k: torch.as_tensor(v).long() for k, v in batch.items()}
    dense = np.full(batch["input_ids"].shape, IGNORE_INDEX, np.int64)
    real = batch["mlm_labels"] != IGNORE_INDEX
    rows = np.broadcast_to(np.arange(4)[:, None], real.shape)
    dense[rows[real], batch["masked_positions"][real]] = batch["mlm_labels"][real]
    with torch.no_grad():
        sparse = torch_losses.batch_loss("bert", model, tensors, config)
        _, logits, nsp_logits = model(tensors["input_ids"], tensors["token_type_ids"],
                                      tensors["attention_mask"])
        expected = (torch_losses.masked_lm_loss(logits, torch.as_tensor(dense))
                    + torch_losses.next_sentence_loss(nsp_logits, tensors["nsp_labels"]))
    assert logits.shape[1] == 24
    assert real.sum() < real.size
    np.testing.assert_allclose(float(sparse), float(expected), rtol=1e-6)
    steps = [(jax_step(dataset.update_batch(s)), torch_step(dataset.update_batch(s)))
             for s in range(config.steps)]
    loss_j = np.array([j["loss"] for j, _ in steps])
    loss_t = np.array([t["loss"] for _, t in steps])
    np.testing.assert_allclose(loss_j, loss_t, rtol=1e-5)
    assert loss_j[-1] < loss_j[0]
