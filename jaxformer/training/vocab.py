"""Tokenizers built from a text, each a ``tokenizers.Tokenizer`` that saves as ``tokenizer.json``
(framework-free: both twins train on the ids these produce). The bottom of the data layer: the
special tokens, :class:`DataError` and tokenizer loading live here; ``data`` and the tasks import
them, and nothing here imports either. :func:`build_tokenizer` says what each kind is.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

TOKENIZERS = ("char", "bpe", "wordpiece")
# The first ids of a bpe or wordpiece vocabulary; the tasks' batches use them by name.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class DataError(ValueError):
    """The data (a text file, a tokenizer, a batch) cannot be used: says which and why."""


def load_tokenizer(path):
    """A ``tokenizers`` tokenizer from a ``tokenizer.json``; a clear error if it is missing."""
    from tokenizers import Tokenizer

    if not Path(path).is_file():
        raise DataError(f"tokenizer file {path} does not exist")
    tokenizer = Tokenizer.from_file(str(path))
    # A Hugging Face tokenizer.json may pad or cut every text to a fixed length (all-MiniLM-L6-v2
    # pads to 128); the tasks pad and cut to --seq-len themselves.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def char_tokenizer(text: str):
    """One token per character of ``text``, ids in sorted character order (nanoGPT's
    ``chars = sorted(list(set(data)))``)."""
    from tokenizers import Tokenizer, decoders, models

    if not text:
        raise DataError("a character vocabulary needs a non-empty text")
    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    tokenizer = Tokenizer(models.BPE(vocab, merges=[]))
    tokenizer.decoder = decoders.Fuse()
    return tokenizer


def is_char_tokenizer(tokenizer) -> bool:
    """Whether ``tokenizer`` is one :func:`char_tokenizer` makes: single-character tokens, BPE
    with no merges, nothing added, no normalizer or pre-tokenizer."""
    spec = json.loads(tokenizer.to_str())
    model = spec["model"]
    return (model["type"] == "BPE" and not model["merges"] and spec["normalizer"] is None
            and spec["pre_tokenizer"] is None and not spec["added_tokens"]
            and all(len(token) == 1 for token in model["vocab"]))


def encode_chars(tokenizer, text: str) -> np.ndarray:
    """``text`` as the int32 ids of a :func:`char_tokenizer`; a character outside its vocabulary
    is an error naming it and where it first occurs (the tokenizer alone would drop it).

    The ids are what the tokenizer's own ``encode(text).ids`` gives (the tests hold them
    equal), looked up in numpy: one BPE "word" of a whole corpus is slow to encode (19 s for
    Shakespeare's 4.5M characters on a busy 2-core machine, against 0.1 s here)."""
    if not is_char_tokenizer(tokenizer):
        raise DataError("encode_chars needs a character tokenizer (char_tokenizer); this one "
                        "has merges, added tokens, a normalizer or multi-character tokens")
    chars, ids = zip(*sorted(tokenizer.get_vocab().items()))
    keys = np.array([ord(c) for c in chars], np.uint32)  # sorted: chars are sorted
    codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    where = np.minimum(np.searchsorted(keys, codes), len(keys) - 1)
    unknown = keys[where] != codes
    if unknown.any():
        first = int(np.argmax(unknown))
        count = len(set(codes[unknown].tolist()))
        raise DataError(f"{count} character(s) outside the tokenizer's vocabulary of "
                        f"{len(keys)}, e.g. {text[first]!r} (U+{ord(text[first]):04X}) at "
                        f"offset {first}")
    return np.asarray(ids, np.int32)[where]


def bpe_tokenizer(lines, vocab_size: int):
    """Byte-level BPE (GPT-2 style) with :data:`SPECIAL_TOKENS` first, trained on ``lines``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(SPECIAL_TOKENS) + len(alphabet):
        raise DataError(f"a byte-level BPE vocabulary holds the {len(SPECIAL_TOKENS)} special "
                        f"tokens and {len(alphabet)} bytes: vocab_size must be at least "
                        f"{len(SPECIAL_TOKENS) + len(alphabet)}, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=alphabet, show_progress=False)
    tokenizer.train_from_iterator(list(lines), trainer=trainer)
    return tokenizer


def wordpiece_tokenizer(lines, vocab_size: int):
    """A lower-cased WordPiece tokenizer whose vocabulary is learned from ``lines``: the
    :data:`SPECIAL_TOKENS` (ids 0-4), every character of the text (word-initial and ``##``
    continuation), then the most frequent words (ties in alphabetical order) up to ``vocab_size``
    entries (more only if the characters need it). Unknown words split into characters.

    Built here rather than by ``tokenizers``' ``WordPieceTrainer``, whose result changes from run
    to run on ties (hash-map order, huggingface/tokenizers#1794): a run must reproduce from its
    seed, and the JAX and torch runs of one file must see the same ids.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words = Counter(word for line in lines
                    for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)))
    initial = sorted({word[0] for word in words})
    continuation = sorted({f"##{c}" for word in words for c in word[1:]})
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *initial, *continuation])}
    for word, _ in sorted(words.items(), key=lambda item: (-item[1], item[0])):
        if len(vocab) >= vocab_size:
            break
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def build_tokenizer(kind: str, text: str, vocab_size: int | None = None):
    """The tokenizer ``--tokenizer KIND`` names: one of :data:`TOKENIZERS` built from ``text``
    (``vocab_size`` is ignored by ``char``, whose vocabulary is the text's characters), or else
    the path of a ``tokenizer.json``.

    - ``char``: nanoGPT's ``shakespeare_char``. The vocabulary is ``sorted(set(text))`` (id
      ``i`` is the ``i``-th character in code-point order), no special token, no normalizer, no
      pre-tokenizer, and decoding is plain concatenation. It is a BPE model with no merges: BPE
      splits its input into characters and, with nothing to merge, each character is a token;
      the ``Fuse`` decoder joins them without the spaces ``tokenizers`` would otherwise put
      between tokens. Such a tokenizer silently drops a character it does not know, so
      :func:`encode_chars` checks the text first.
    - ``bpe``: byte-level BPE as GPT-2 (``ByteLevel`` pre-tokenizer and decoder, all 256 bytes in
      the initial alphabet, so no text is ever unknown), trained by ``tokenizers``'
      ``BpeTrainer``.
    - ``wordpiece``: a lower-cased WordPiece vocabulary of the characters and most frequent
      words, built here rather than by ``WordPieceTrainer`` (see :func:`wordpiece_tokenizer`).

    ``bpe`` and ``wordpiece`` start with :data:`SPECIAL_TOKENS` (ids 0-4), which the tasks'
    batches need. All three are deterministic: the same text gives the same ``tokenizer.json``,
    so a run reproduces from its seed and the JAX and torch runs of one file see the same ids.
    """
    if kind == "char":
        return char_tokenizer(text)
    if kind in ("bpe", "wordpiece"):
        if vocab_size is None or vocab_size < 1:
            raise DataError(f"a {kind} tokenizer needs a positive vocab_size, got {vocab_size}")
        build = bpe_tokenizer if kind == "bpe" else wordpiece_tokenizer
        return build(text.splitlines(), vocab_size)
    if not Path(kind).is_file():
        raise DataError(f"--tokenizer {kind!r} is neither one of {', '.join(TOKENIZERS)} nor an "
                        f"existing tokenizer.json file")
    return load_tokenizer(kind)
