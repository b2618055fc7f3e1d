"""The host-side data pipeline (framework-free): what each family makes of a text file, the
determinism resume relies on, and the refusals of bad files and bad batches."""

from __future__ import annotations

import numpy as np
import pytest

from jaxformer.training import data, tasks, vocab
from jaxformer.training.config import IGNORE_INDEX, TrainConfig
from jaxformer.training.tasks import model_config

CONFIG = TrainConfig(batch_size=4, seq_len=16, seed=3)
WORDS = ["the", "a", "cat", "dog", "bird", "sat", "ran", "over", "under", "near", "house", "tree",
         "river", "red", "green", "big"]


def text(lines=40, tabs=None, seed=0):
    rng = np.random.RandomState(seed)
    out = []
    for i in range(lines):
        sentence = " ".join(rng.choice(WORDS, rng.randint(3, 20)))
        out.append(f"{tabs(i, sentence)}" if tabs else sentence)
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def tokenizer():
    return vocab.wordpiece_tokenizer(text(60).splitlines(), 80)


def test_tokenizer_is_deterministic_with_the_special_tokens_first(tokenizer):
    assert [tokenizer.token_to_id(t) for t in vocab.SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tokenizer.get_vocab_size() <= 80
    # tokenizers' own WordPiece trainer breaks ties in hash-map order; this one must not
    again = [vocab.wordpiece_tokenizer(text(60).splitlines(), 80).to_str() for _ in range(3)]
    assert set(again) == {tokenizer.to_str()}
    encoded = tokenizer.encode("The big cat, quite unknown!", add_special_tokens=False)
    assert encoded.tokens[:3] == ["the", "big", "cat"]
    assert "[UNK]" in encoded.tokens
    # 5 specials + a, b, ##a, ##b: past the size asked for, and no room for words
    few = vocab.wordpiece_tokenizer(["ab", "ba ab"], 8)
    assert few.get_vocab_size() == 9
    assert few.encode("ab").tokens == ["a", "##b"]


def test_gpt_windows_are_the_token_stream(tokenizer):
    corpus = text(30)
    dataset, held = tasks.build_datasets("gpt", corpus, tokenizer, CONFIG, eval_fraction=0.1)
    stream = np.concatenate([np.append(tokenizer.encode(line, add_special_tokens=False).ids, 3)
                             for line in corpus.splitlines()])
    windows = stream[: len(stream) // 16 * 16].reshape(-1, 16)
    assert len(dataset) + len(held) == len(windows)
    assert len(held) == round(0.1 * len(windows))
    seen = dataset.micro_batch(0, size=len(dataset))["input_ids"]  # the whole first epoch
    # one epoch visits each training window exactly once, in a seeded order
    assert sorted(map(tuple, seen)) == sorted(map(tuple, windows[: len(dataset)]))
    assert not np.array_equal(seen, windows[: len(seen)])
    assert set(dataset.micro_batch(0)) == {"input_ids"}  # full windows: no padding, no mask


def test_batches_are_a_function_of_seed_and_position(tokenizer):
    corpus = text(40)
    a, _ = tasks.build_datasets("bert", corpus, tokenizer, CONFIG)
    b, _ = tasks.build_datasets("bert", corpus, tokenizer, CONFIG)
    c, _ = tasks.build_datasets("bert", corpus, tokenizer, TrainConfig(batch_size=4, seq_len=16))
    for position in (0, 7, 123):
        x, y = a.micro_batch(position), b.micro_batch(position)
        assert all(np.array_equal(x[k], y[k]) for k in x)
    assert not np.array_equal(a.micro_batch(5)["input_ids"], c.micro_batch(5)["input_ids"])
    accum = TrainConfig(batch_size=4, accumulation_steps=2, seq_len=16, seed=3)
    d, _ = tasks.build_datasets("bert", corpus, tokenizer, accum)
    update = d.update_batch(3)
    assert update["input_ids"].shape == (2, 2, 16)
    np.testing.assert_array_equal(update["mlm_labels"][1], d.micro_batch(7)["mlm_labels"])


def test_bert_pairs_and_masking(tokenizer):
    corpus = text(200, seed=1)
    dataset, _ = tasks.build_datasets("bert", corpus, tokenizer,
                                     TrainConfig(batch_size=64, seq_len=32, seed=0,
                                                 max_predictions=0))  # dense labels
    encoded = [tokenizer.encode(s, add_special_tokens=False).ids for s in corpus.splitlines()]
    batch = dataset.micro_batch(0)
    ids, types, mask, labels = (batch[k] for k in ("input_ids", "token_type_ids",
                                                   "attention_mask", "mlm_labels"))
    original = np.where(labels != IGNORE_INDEX, labels, ids)  # undo the masking
    assert (ids[:, 0] == 2).all()
    assert ((original == 3).sum(1) == 2).all()
    assert set(batch["nsp_labels"]) == {0, 1}
    for row, nsp in zip(range(len(ids)), batch["nsp_labels"]):
        tokens = original[row][mask[row] == 1]
        first_sep = list(tokens).index(3)
        a, b = tokens[1:first_sep], tokens[first_sep + 1:-1]
        assert (types[row][mask[row] == 1] == np.r_[np.zeros(first_sep + 1),
                                                    np.ones(len(b) + 1)]).all()
        i = next(k for k, e in enumerate(encoded) if list(e[: len(a)]) == list(a))
        if nsp == 0:  # B is the next sentence (possibly truncated)
            assert list(encoded[i + 1][: len(b)]) == list(b)
    chosen = labels != IGNORE_INDEX
    candidates = (mask == 1) & (original > 4)
    assert not (chosen & ~candidates).any()  # never a special token or padding
    assert abs(chosen.sum() / candidates.sum() - 0.15) < 0.04
    masked = (ids == 4) & chosen
    assert abs(masked.sum() / chosen.sum() - 0.8) < 0.1
    assert (ids[~chosen] == original[~chosen]).all()


def test_transformer_pairs(tokenizer):
    corpus = text(20, tabs=lambda i, s: f"{s}\t{' '.join(reversed(s.split()))}")
    dataset, _ = tasks.build_datasets("transformer", corpus, tokenizer, CONFIG)
    batch = dataset.micro_batch(0)
    keys = tasks.get("transformer").batch_keys
    for src, src_mask, tgt, tgt_mask, labels in zip(*(batch[k] for k in keys)):
        n, m = src_mask.sum(), tgt_mask.sum()
        assert src[n - 1] == 3
        assert (src[n:] == 0).all()
        assert tgt[0] == 2
        assert (labels[m:] == IGNORE_INDEX).all()
        assert labels[m - 1] == 3
        np.testing.assert_array_equal(tgt[1:m], labels[: m - 1])  # labels = input shifted left
    # without tabs: each line is the source of the next
    plain, _ = tasks.build_datasets("transformer", text(5), tokenizer, CONFIG)
    assert len(plain) == 4


def test_classifier_labels(tokenizer):
    corpus = text(12, tabs=lambda i, s: f"{['pos', 'neg', 'mixed'][i % 3]}\t{s}")
    dataset, _ = tasks.build_datasets("classifier", corpus, tokenizer, CONFIG)
    assert dataset.label_names == ["mixed", "neg", "pos"]
    assert dataset.num_labels == 3
    batch = dataset.micro_batch(0)
    assert set(batch["labels"]) <= {0, 1, 2}
    assert (batch["input_ids"][:, 0] == 2).all()
    with pytest.raises(data.DataError, match="line 2 has no tab"):
        tasks.build_datasets("classifier", "a\tgood\nno tab here\n", tokenizer, CONFIG)


@pytest.mark.parametrize(("content", "message"), [
    (b"", "is empty"),
    (b"  \n\n \t\n", "is empty"),
    (b"caf\xe9 au lait\n", r"not UTF-8 text: byte 0xe9 at offset 3"),
    (b"\xff\xfe" + "hi".encode("utf-16-le"), "not UTF-8 text: byte 0xff at offset 0"),
])
def test_bad_files_are_refused(tmp_path, content, message):
    path = tmp_path / "data.txt"
    path.write_bytes(content)
    with pytest.raises(data.DataError, match=message):
        data.read_text(path)


def test_missing_and_too_short_files(tmp_path, tokenizer):
    with pytest.raises(data.DataError, match="does not exist"):
        data.read_text(tmp_path / "nope.txt")
    with pytest.raises(data.DataError, match=r"yields \d+ tokens, fewer than one window of "
                                             r"seq_len=16"):
        tasks.build_datasets("gpt", "the cat sat\n", tokenizer, CONFIG)
    with pytest.raises(data.DataError, match="needs at least one"):
        tasks.build_datasets("transformer", "only one line\n", tokenizer, CONFIG)
    with pytest.raises(data.DataError, match="too few to hold some out"):
        tasks.build_datasets("classifier", "yes\tthe cat sat\n", tokenizer, CONFIG, 0.1)


def test_tokenizer_without_the_needed_specials(tmp_path):
    from tokenizers import Tokenizer, models

    bare = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    bare.save(str(tmp_path / "tokenizer.json"))
    loaded = vocab.load_tokenizer(tmp_path / "tokenizer.json")
    with pytest.raises(data.DataError, match=r"no \[PAD\], \[CLS\], \[SEP\], \[MASK\] token"):
        tasks.build_datasets("bert", "a b\n", loaded, CONFIG)


def test_check_batch_refuses_out_of_range_ids_and_labels(tokenizer):
    config = model_config("bert", "tiny", vocab_size=tokenizer.get_vocab_size())
    dataset, _ = tasks.build_datasets("bert", text(20), tokenizer, CONFIG)
    good = dataset.micro_batch(0)
    tasks.get("bert").check_batch(good, config)
    V = config.vocab_size
    cases = [("mlm_labels", V,
              rf"mlm_labels must lie in \[0, {V}\) or be -100 \(ignored\); found {V}"),
             ("mlm_labels", -5, "found -5"),
             ("nsp_labels", 2, r"nsp_labels must lie in \[0, 2\)"),
             ("input_ids", V + 3, rf"input_ids must lie in \[0, {V}\)"),
             ("token_type_ids", 3, r"token_type_ids must lie in \[0, 3\)")]
    for key, value, message in cases:
        bad = {k: v.copy() for k, v in good.items()}
        bad[key].flat[1] = value
        with pytest.raises(ValueError, match=message):
            tasks.get("bert").check_batch(bad, config)
    with pytest.raises(data.DataError, match=r"missing \['nsp_labels'\]"):
        tasks.get("bert").check_batch({k: v for k, v in good.items() if k != "nsp_labels"}, config)
