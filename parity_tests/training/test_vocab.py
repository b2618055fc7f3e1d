"""The tokenizers of ``jaxformer.training.vocab``: nanoGPT's character ids, exact round trips,
determinism (the same text gives the same ``tokenizer.json``), and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from jaxformer.training import vocab
from jaxformer.training.vocab import SPECIAL_TOKENS, DataError

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
        "  Tabs\there, a carriage return\r\n, accents: é, É, ñ; and “quotes” — 'tis done!\n")


def test_char_ids_are_nanogpts():
    tokenizer = vocab.char_tokenizer(TEXT)
    chars = sorted(list(set(TEXT)))  # nanoGPT's prepare.py
    stoi = {c: i for i, c in enumerate(chars)}
    assert tokenizer.get_vocab() == stoi
    ids = vocab.encode_chars(tokenizer, TEXT)
    assert ids.dtype == np.int32
    assert ids.tolist() == [stoi[c] for c in TEXT]
    assert tokenizer.encode(TEXT).ids == ids.tolist()  # the tokenizer itself gives these ids
    assert tokenizer.decode(ids.tolist()) == TEXT
    assert tokenizer.to_str().count('"added_tokens":[]') == 1  # no special token


@settings(max_examples=30, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_char_round_trip_of_any_text(text):
    tokenizer = vocab.char_tokenizer(text)
    ids = vocab.encode_chars(tokenizer, text)
    assert ids.tolist() == [sorted(set(text)).index(c) for c in text]
    assert tokenizer.encode(text).ids == ids.tolist()
    assert tokenizer.decode(ids.tolist()) == text


def test_char_tokenizer_saves_and_loads(tmp_path):
    tokenizer = vocab.char_tokenizer(TEXT)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    loaded = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert vocab.encode_chars(loaded, TEXT).tolist() == vocab.encode_chars(tokenizer, TEXT).tolist()
    assert loaded.decode(vocab.encode_chars(loaded, TEXT).tolist()) == TEXT


def test_a_character_outside_the_vocabulary_is_an_error():
    tokenizer = vocab.char_tokenizer("abc \n")
    with pytest.raises(DataError, match=r"'z' \(U\+007A\) at offset 3"):
        vocab.encode_chars(tokenizer, "abczaz")
    with pytest.raises(DataError, match="non-empty"):
        vocab.char_tokenizer("")
    with pytest.raises(DataError, match="needs a character tokenizer"):
        vocab.encode_chars(vocab.wordpiece_tokenizer(["ab ab", "b a"], 20), "ab")


def test_bpe_is_byte_level_deterministic_and_round_trips():
    lines = (TEXT * 3).splitlines()
    tokenizer = vocab.bpe_tokenizer(lines, 300)
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert 261 < tokenizer.get_vocab_size() <= 300  # some merges were learned
    assert {vocab.bpe_tokenizer(lines, 300).to_str() for _ in range(3)} == {tokenizer.to_str()}
    unseen = "Zebras 🦓 never seen — ¿qué?"
    for text in [*lines, unseen]:
        assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert tokenizer.token_to_id("[UNK]") not in tokenizer.encode(unseen).ids
    with pytest.raises(DataError, match="at least 261"):
        vocab.bpe_tokenizer(lines, 100)


def test_wordpiece_reserves_the_special_ids():
    lines = TEXT.splitlines()
    tokenizer = vocab.wordpiece_tokenizer(lines, 60)
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]


def test_build_tokenizer_dispatches(tmp_path):
    assert vocab.TOKENIZERS == ("char", "bpe", "wordpiece")
    expected = {"char": vocab.char_tokenizer(TEXT),
                "bpe": vocab.bpe_tokenizer(TEXT.splitlines(), 270),
                "wordpiece": vocab.wordpiece_tokenizer(TEXT.splitlines(), 270)}
    for kind in vocab.TOKENIZERS:
        built = vocab.build_tokenizer(kind, TEXT, 270)
        assert built.to_str() == expected[kind].to_str(), kind
    path = tmp_path / "tokenizer.json"
    expected["bpe"].save(str(path))
    assert vocab.build_tokenizer(str(path), TEXT).to_str() == expected["bpe"].to_str()
    with pytest.raises(DataError, match="neither one of char, bpe, wordpiece"):
        vocab.build_tokenizer("sentencepiece", TEXT, 100)
    with pytest.raises(DataError, match="positive vocab_size"):
        vocab.build_tokenizer("wordpiece", TEXT)
