"""The synthetic copy / reverse tasks: the pairs they draw and the ``transformer`` batches they make
(the keys, the begin / end tokens, -100 at padding), checked token by token."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from jaxformer.training import synthetic, tasks
from jaxformer.training.config import IGNORE_INDEX
from jaxformer.training.vocab import SPECIAL_TOKENS, DataError

PAD, BOS, EOS = (SPECIAL_TOKENS.index(t) for t in ("[PAD]", "[CLS]", "[SEP]"))


@pytest.mark.parametrize("task", synthetic.SYNTHETIC_TASKS)
def test_pairs_are_random_ordinary_tokens_copied_or_reversed(task):
    pairs = synthetic.copy_reverse_pairs(200, task=task, vocab_size=12, min_len=3, max_len=9,
                                         seed=1)
    assert len(pairs) == 200
    lengths = [len(s) for s, _ in pairs]
    assert min(lengths) == 3
    assert max(lengths) == 9
    tokens = np.concatenate([s for s, _ in pairs])
    assert tokens.dtype == np.int32
    assert set(tokens.tolist()) == set(range(5, 12))
    for s, t in pairs:
        assert t.tolist() == (s.tolist() if task == "copy" else s.tolist()[::-1])
    again = synthetic.copy_reverse_pairs(200, task=task, vocab_size=12, min_len=3, max_len=9,
                                         seed=1)
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(pairs, again))
    other = synthetic.copy_reverse_pairs(200, task=task, vocab_size=12, min_len=3, max_len=9,
                                         seed=2)
    assert not all(np.array_equal(a, b) for (a, _), (b, _) in zip(pairs, other))


def test_batches_follow_the_transformer_family():
    pairs = synthetic.copy_reverse_pairs(6, task="reverse", vocab_size=20, min_len=1, max_len=7,
                                         seed=0)
    batch = synthetic.encoder_decoder_batch(pairs, seq_len=10)
    assert tuple(batch) == tasks.SEQ2SEQ.batch_keys
    assert all(v.shape == (6, 10) and v.dtype == np.int32 for v in batch.values())
    for r, (s, t) in enumerate(pairs):
        n, rest = len(s), 10 - len(s) - 1
        assert batch["src_ids"][r].tolist() == [*s, EOS] + [PAD] * rest
        assert batch["tgt_ids"][r].tolist() == [BOS, *t] + [PAD] * rest
        assert batch["labels"][r].tolist() == [*t, EOS] + [IGNORE_INDEX] * rest
        for mask in ("src_mask", "tgt_mask"):
            assert batch[mask][r].tolist() == [1] * (n + 1) + [0] * rest
    model = SimpleNamespace(src_vocab_size=20, tgt_vocab_size=20)
    tasks.SEQ2SEQ.check_batch(batch, model)  # every id and label in range
    tight = synthetic.encoder_decoder_batch(pairs)  # default: the longest sequence + [SEP]
    assert tight["src_ids"].shape == (6, max(len(s) for s, _ in pairs) + 1)


def test_bad_arguments_are_refused():
    with pytest.raises(DataError, match="unknown task 'sort'"):
        synthetic.copy_reverse_pairs(2, task="sort", vocab_size=10, min_len=1, max_len=2, seed=0)
    with pytest.raises(DataError, match="exceed the 5 special tokens"):
        synthetic.copy_reverse_pairs(2, vocab_size=5, min_len=1, max_len=2, seed=0)
    with pytest.raises(DataError, match="min_len <= max_len"):
        synthetic.copy_reverse_pairs(2, vocab_size=10, min_len=3, max_len=2, seed=0)
    with pytest.raises(DataError, match="min_len <= max_len"):
        synthetic.copy_reverse_pairs(2, vocab_size=10, min_len=0, max_len=2, seed=0)
    with pytest.raises(DataError, match="num_pairs"):
        synthetic.copy_reverse_pairs(0, vocab_size=10, min_len=1, max_len=2, seed=0)
    pairs = synthetic.copy_reverse_pairs(4, vocab_size=10, min_len=8, max_len=8, seed=0)
    with pytest.raises(DataError, match="8 tokens and its end token do not fit in seq_len=8"):
        synthetic.encoder_decoder_batch(pairs, seq_len=8)
    with pytest.raises(DataError, match="no pairs"):
        synthetic.encoder_decoder_batch([])
