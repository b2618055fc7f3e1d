"""Synthetic sequence-to-sequence data, the Annotated Transformer's first check that the model
learns: copy a random token sequence, or reverse it (framework-free: both twins train on these
batches). The pairs are generated, then batched by the function that batches a file of the
``transformer`` task (:func:`jaxformer.training.tasks.seq2seq.seq2seq_arrays`).
"""

from __future__ import annotations

import numpy as np

from jaxformer.training.tasks.seq2seq import seq2seq_arrays
from jaxformer.training.vocab import SPECIAL_TOKENS, DataError

SYNTHETIC_TASKS = ("copy", "reverse")
SPECIAL_IDS = {name: i for i, name in enumerate(SPECIAL_TOKENS)}
FIRST_ORDINARY_ID = len(SPECIAL_TOKENS)


def copy_reverse_pairs(num_pairs: int, *, task: str = "copy", vocab_size: int, min_len: int,
                       max_len: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``num_pairs`` (source, target) int32 arrays: a source of ``min_len`` to ``max_len`` tokens
    drawn from ``[FIRST_ORDINARY_ID, vocab_size)`` and, as target, itself (``copy``) or its
    reverse (``reverse``). A pure function of its arguments.

    The first ids of a jaxformer vocabulary are the :data:`~jaxformer.training.vocab.SPECIAL_TOKENS`
    (``[PAD]`` 0, ``[UNK]`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4); the sequences draw
    uniformly from the ids after them, so a special token never appears inside a sequence."""
    if task not in SYNTHETIC_TASKS:
        raise DataError(f"unknown task {task!r}; choose one of {', '.join(SYNTHETIC_TASKS)}")
    if vocab_size <= FIRST_ORDINARY_ID:
        raise DataError(f"vocab_size must exceed the {FIRST_ORDINARY_ID} special tokens, got "
                        f"{vocab_size}")
    if not 1 <= min_len <= max_len:
        raise DataError(f"need 1 <= min_len <= max_len, got min_len={min_len}, "
                        f"max_len={max_len}")
    if num_pairs < 1:
        raise DataError(f"num_pairs must be positive, got {num_pairs}")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, num_pairs)
    sources = [rng.integers(FIRST_ORDINARY_ID, vocab_size, n).astype(np.int32) for n in lengths]
    return [(s, s.copy() if task == "copy" else s[::-1].copy()) for s in sources]


def encoder_decoder_batch(pairs, seq_len: int | None = None) -> dict[str, np.ndarray]:
    """The ``transformer`` batch (``tasks.SEQ2SEQ.batch_keys``) of ``pairs``, padded to
    ``seq_len`` (default: the longest sequence plus its end token): source ``x [SEP]``, decoder
    input ``[CLS] y`` (``[CLS]`` begins the target), labels ``y [SEP]`` with -100 at padding.
    Unlike a text file, a pair is never truncated: a sequence longer than ``seq_len - 1`` is an
    error."""
    if not pairs:
        raise DataError("no pairs to batch")
    longest = max(max(len(s), len(t)) for s, t in pairs)
    seq_len = longest + 1 if seq_len is None else seq_len
    if longest + 1 > seq_len:
        raise DataError(f"a sequence of {longest} tokens and its end token do not fit in "
                        f"seq_len={seq_len}")
    return seq2seq_arrays([s for s, _ in pairs], [t for _, t in pairs], seq_len, SPECIAL_IDS)
