"""Text file -> tokens -> batches, on the host in numpy (framework-free, shared by both twins).

Both frameworks train on the very batches built here, and every id is range-checked here
(:func:`check_batch`) before it reaches a jitted step, where an out-of-range id cannot raise.

What each family makes of the data file (UTF-8 text, blank lines ignored except for ``bert``):

- ``gpt``: every line's tokens followed by ``[SEP]`` (end of line), concatenated into one stream;
  with a character tokenizer (``vocab.char_tokenizer``) the stream is the raw text, newlines
  included, as nanoGPT's ``shakespeare_char``. ``gpt_windows="packed"`` cuts the stream into
  windows of ``seq_len`` tokens and the loss predicts each next token of a window (``seq_len - 1``
  predictions); ``"random"`` is nanoGPT's ``get_batch``: ``seq_len + 1`` tokens at random offsets,
  ``input_ids`` the first ``seq_len``, ``labels`` the last ``seq_len`` (``seq_len`` predictions).
- ``bert``: each line is a sentence, blank lines separate documents. Example ``i`` is sentence
  ``i`` as sentence A; half the time B is the next sentence of its document (NSP label 0), else a
  random sentence (label 1). ``[CLS] A [SEP] B [SEP]``, longest first truncated. As BERT's
  ``create_pretraining_data.py``: ``min(max_predictions, max(1, round(0.15 * length)))`` positions
  (``length`` counts ``[CLS]`` and ``[SEP]``, ``0.15`` is ``mlm_probability``, ``round`` halves to
  even as Python 3's) are drawn uniformly among the real non-special tokens; 80% of those become
  ``[MASK]``, 10% a random non-special token, 10% stay. ``masked_positions (B, P)`` lists them in
  ascending order, ``P = min(max_predictions, seq_len)``, padded with index 0 and label -100, and
  ``mlm_labels (B, P)`` holds their original ids, so the MLM head runs at ``P`` positions only.
  ``max_predictions = 0`` keeps dense labels instead: each real non-special token is chosen with
  probability 0.15, ``mlm_labels (B, T)`` and ``masked_positions`` is every position.
- ``transformer``: lines ``SOURCE<TAB>TARGET``; in a file without tabs each line is the source
  of the next line. Source ``tokens [SEP]``; decoder input ``[CLS] target`` (``[CLS]`` serves as
  beginning of sequence) and labels ``target [SEP]``.
- ``classifier``: lines ``LABEL<TAB>TEXT``; the labels are the distinct strings, sorted.

Batches are a pure function of ``(seed, position)``: the examples are read through an endless
sequence of per-epoch permutations, and the random choices of ``bert`` (pairs, masks) and the
offsets of random ``gpt`` windows come from a generator seeded by the position. So a
checkpoint need only record the position to resume the exact same stream.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from pathlib import Path

import numpy as np

from jaxformer import validate
from jaxformer.training.config import IGNORE_INDEX, TrainConfig

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BATCH_KEYS = {
    "bert": ("input_ids", "token_type_ids", "attention_mask", "masked_positions", "mlm_labels",
             "nsp_labels"),
    "gpt": ("input_ids", "attention_mask"),
    "transformer": ("src_ids", "src_mask", "tgt_ids", "tgt_mask", "labels"),
    "classifier": ("input_ids", "token_type_ids", "attention_mask", "labels"),
}
_NEEDED_SPECIALS = {"bert": ("[PAD]", "[CLS]", "[SEP]", "[MASK]"), "gpt": ("[SEP]",),
                    "transformer": ("[PAD]", "[CLS]", "[SEP]"),
                    "classifier": ("[PAD]", "[CLS]", "[SEP]")}


class DataError(ValueError):
    """The data file (or a batch) cannot be used: says which and why."""


# ------------------------------------------------------------------------------------ the file

def read_text(path) -> str:
    """The file's text; refuses a missing, non-UTF-8 or empty file with a clear message."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"data file {path} is not UTF-8 text: byte 0x{raw[error.start]:02x} at "
                        f"offset {error.start} cannot be decoded ({error.reason})") from None
    if not text.strip():
        raise DataError(f"data file {path} is empty (no text to train on)")
    return text


def file_sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------- tokenizers

def load_tokenizer(path):
    from tokenizers import Tokenizer

    if not Path(path).is_file():
        raise DataError(f"tokenizer file {path} does not exist")
    return Tokenizer.from_file(str(path))


def special_ids(tokenizer, family: str) -> dict[str, int]:
    """The ids of the special tokens ``family`` needs; a clear error if the tokenizer lacks any.
    gpt needs none with a character tokenizer (its stream is the raw text, with no ``[SEP]``)."""
    from jaxformer.training.vocab import is_char_tokenizer  # vocab imports this module

    if family == "gpt" and is_char_tokenizer(tokenizer):
        return {}
    ids = {name: tokenizer.token_to_id(name) for name in SPECIAL_TOKENS}
    missing = [name for name in _NEEDED_SPECIALS[family] if ids[name] is None]
    if missing:
        raise DataError(f"the tokenizer has no {', '.join(missing)} token, which the {family} "
                        f"family needs (a tokenizer trained by jaxformer has {SPECIAL_TOKENS})")
    return {name: i for name, i in ids.items() if i is not None}


def _encode(tokenizer, texts) -> list[np.ndarray]:
    return [np.asarray(e.ids, np.int32)
            for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


# --------------------------------------------------------------------------------- datasets

class Dataset:
    """A family's examples and how to batch them. ``micro_batch(position)`` is the
    ``position``-th micro-batch of the stream; ``update_batch(step)`` stacks the
    ``accumulation_steps`` micro-batches of one optimizer update on a leading axis."""

    def __init__(self, family: str, num_examples: int, make, config: TrainConfig, *,
                 tokens_per_example: int, num_labels: int | None = None, stream: int = 0):
        if num_examples == 0:
            raise DataError(f"the data yields no {family} example")
        self.family, self.num_examples, self.config = family, num_examples, config
        self._make = make  # (example indices, numpy Generator) -> batch dict
        self.tokens_per_example = tokens_per_example
        self.num_labels = num_labels
        self._stream = stream  # 0: training, 1: evaluation

    def __len__(self) -> int:
        return self.num_examples

    @functools.lru_cache(maxsize=4)
    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.config.seed, self._stream, 0, epoch]).permutation(
            self.num_examples)

    def micro_batch(self, position: int, size: int | None = None) -> dict[str, np.ndarray]:
        size = self.config.micro_batch_size if size is None else size
        flat = position * size + np.arange(size)
        epochs, within = np.divmod(flat, self.num_examples)
        indices = np.array([self._permutation(int(e))[i] for e, i in zip(epochs, within)])
        rng = np.random.default_rng([self.config.seed, self._stream, 1, position])
        return self._make(indices, rng)

    def update_batch(self, step: int) -> dict[str, np.ndarray]:
        accum = self.config.accumulation_steps
        micro = [self.micro_batch(step * accum + a) for a in range(accum)]
        return {key: np.stack([m[key] for m in micro]) for key in micro[0]}

    def eval_batches(self, max_batches: int) -> list[dict[str, np.ndarray]]:
        """Fixed evaluation batches: the same ones at every evaluation."""
        size = min(self.config.micro_batch_size, self.num_examples)
        count = max(1, min(max_batches, self.num_examples // size))
        return [self.micro_batch(k, size) for k in range(count)]


class RandomWindows(Dataset):
    """nanoGPT's ``get_batch``: each example is ``seq_len + 1`` consecutive tokens of ``tokens``
    at an offset drawn uniformly from ``[0, len(tokens) - seq_len)`` by a generator seeded by
    ``(seed, stream, position)``; ``input_ids`` are its first ``seq_len`` tokens, ``labels`` its
    last ``seq_len``. The offsets are drawn with replacement, so there are no epochs."""

    def __init__(self, tokens: np.ndarray, config: TrainConfig, *, stream: int = 0):
        T = config.seq_len
        if len(tokens) < T + 1:
            raise DataError(f"the data yields {len(tokens)} tokens, fewer than one random window "
                            f"of seq_len + 1 = {T + 1}")
        super().__init__("gpt", len(tokens) - T, None, config, tokens_per_example=T,
                         stream=stream)
        self.tokens = tokens

    def micro_batch(self, position: int, size: int | None = None) -> dict[str, np.ndarray]:
        size = self.config.micro_batch_size if size is None else size
        rng = np.random.default_rng([self.config.seed, self._stream, 2, position])
        offsets = rng.integers(0, self.num_examples, size)
        windows = self.tokens[offsets[:, None] + np.arange(self.config.seq_len + 1)]
        return {"input_ids": windows[:, :-1], "attention_mask": np.ones_like(windows[:, :-1]),
                "labels": windows[:, 1:]}

    def eval_batches(self, max_batches: int) -> list[dict[str, np.ndarray]]:
        """``max_batches`` random batches of the stream, the same ones at every evaluation
        (nanoGPT's ``estimate_loss`` draws fresh ones each time)."""
        return [self.micro_batch(k) for k in range(max_batches)]


def _pad(rows: list[np.ndarray], length: int, value: int) -> np.ndarray:
    out = np.full((len(rows), length), value, np.int32)
    for r, row in enumerate(rows):
        out[r, : len(row)] = row
    return out


def _split(n: int, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the training and held-out examples (the file's tail is held out)."""
    n_eval = 0 if eval_fraction <= 0 else max(1, round(n * eval_fraction))
    if n_eval and n - n_eval < 1:
        raise DataError(f"the data yields {n} example(s): too few to hold some out for "
                        f"evaluation (--eval-every); give a longer file or no evaluation")
    return np.arange(n - n_eval), np.arange(n - n_eval, n)


def build_datasets(family: str, text: str, tokenizer, config: TrainConfig,
                   eval_fraction: float = 0.0, eval_text: str | None = None
                   ) -> tuple[Dataset, Dataset | None]:
    """The training dataset and, when ``eval_fraction`` > 0, a held-out one. With ``eval_text``
    (a validation file) the whole ``text`` trains and the evaluation set is ``eval_text``."""
    builder = {"gpt": _gpt, "bert": _bert, "transformer": _transformer,
               "classifier": _classifier}.get(family)
    if builder is None:
        raise ValueError(f"unknown family {family!r}; choose one of {sorted(BATCH_KEYS)}")
    specials = special_ids(tokenizer, family)
    if eval_text is None:
        return builder(text, tokenizer, config, specials, eval_fraction)
    train, _ = builder(text, tokenizer, config, specials, 0.0)
    held, _ = builder(eval_text, tokenizer, config, specials, 0.0)
    held._stream = 1  # the evaluation stream: its own permutations and random draws
    if getattr(held, "label_names", None) != getattr(train, "label_names", None):
        raise DataError(f"the validation file's labels {held.label_names} differ from the "
                        f"training file's {train.label_names}")
    return train, held


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _gpt(text, tokenizer, config, specials, eval_fraction):
    from jaxformer.training.vocab import encode_chars, is_char_tokenizer  # vocab imports data

    T = config.seq_len
    if is_char_tokenizer(tokenizer):
        stream = encode_chars(tokenizer, text)
    else:
        stream = np.concatenate([np.append(ids, specials["[SEP]"])
                                 for ids in _encode(tokenizer, _lines(text))])
    if config.gpt_windows == "random":
        cut = len(stream) - (0 if eval_fraction <= 0 else round(len(stream) * eval_fraction))
        if eval_fraction > 0 and len(stream) - cut < T + 1:
            raise DataError(f"the held-out tail ({len(stream) - cut} tokens) is shorter than one "
                            f"random window of seq_len + 1 = {T + 1}; give a longer file, "
                            f"--val-data or no evaluation")
        return (RandomWindows(stream[:cut], config),
                RandomWindows(stream[cut:], config, stream=1) if cut < len(stream) else None)
    if len(stream) < T:
        raise DataError(f"the data file is too short: it yields {len(stream)} tokens, fewer than "
                        f"one window of seq_len={T}")
    windows = stream[: len(stream) // T * T].reshape(-1, T)
    train, held = _split(len(windows), eval_fraction)

    def dataset(rows, stream_id):
        def make(indices, rng):
            ids = windows[rows[indices]]
            return {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        return Dataset("gpt", len(rows), make, config, tokens_per_example=T, stream=stream_id)

    return dataset(train, 0), (dataset(held, 1) if len(held) else None)


def _classifier(text, tokenizer, config, specials, eval_fraction):
    T, rows = config.seq_len, []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise DataError(f"classifier data needs LABEL<TAB>TEXT lines; line {number} has no "
                            f"tab: {line[:60]!r}")
        label, sentence = line.split("\t", 1)
        rows.append((label.strip(), sentence))
    names = sorted({label for label, _ in rows})
    ids = [np.concatenate([[specials["[CLS]"]], s[: T - 2], [specials["[SEP]"]]])
           for s in _encode(tokenizer, [sentence for _, sentence in rows])]
    input_ids = _pad(ids, T, specials["[PAD]"])
    labels = np.array([names.index(label) for label, _ in rows], np.int32)
    mask = (np.arange(T)[None] < np.array([len(i) for i in ids])[:, None]).astype(np.int32)
    train, held = _split(len(rows), eval_fraction)

    def dataset(subset, stream_id):
        def make(indices, rng):
            pick = subset[indices]
            return {"input_ids": input_ids[pick], "token_type_ids": np.zeros_like(input_ids[pick]),
                    "attention_mask": mask[pick], "labels": labels[pick]}
        out = Dataset("classifier", len(subset), make, config, tokens_per_example=T,
                      num_labels=len(names), stream=stream_id)
        out.label_names = names
        return out

    return dataset(train, 0), (dataset(held, 1) if len(held) else None)


def seq2seq_arrays(src, tgt, seq_len: int, specials: dict[str, int]) -> dict[str, np.ndarray]:
    """The ``transformer`` arrays of (source ids, target ids) pairs, each cut to ``seq_len - 1``
    tokens: source ``s [SEP]``, decoder input ``[CLS] t``, labels ``t [SEP]`` (-100 at padding),
    masks 1 on real tokens."""
    T = seq_len
    pad, bos, eos = specials["[PAD]"], specials["[CLS]"], specials["[SEP]"]
    src_ids = _pad([np.append(s[: T - 1], eos) for s in src], T, pad)
    tgt_ids = _pad([np.concatenate([[bos], t[: T - 1]]) for t in tgt], T, pad)
    labels = _pad([np.append(t[: T - 1], eos) for t in tgt], T, IGNORE_INDEX)
    src_len = np.array([min(len(s), T - 1) + 1 for s in src])
    tgt_len = np.array([min(len(t), T - 1) + 1 for t in tgt])
    src_mask = (np.arange(T)[None] < src_len[:, None]).astype(np.int32)
    tgt_mask = (np.arange(T)[None] < tgt_len[:, None]).astype(np.int32)
    return {"src_ids": src_ids, "src_mask": src_mask, "tgt_ids": tgt_ids, "tgt_mask": tgt_mask,
            "labels": labels}


def _transformer(text, tokenizer, config, specials, eval_fraction):
    T, lines = config.seq_len, [line for line in text.splitlines() if line.strip()]
    if any("\t" in line for line in lines):
        bad = [n for n, line in enumerate(lines, 1) if "\t" not in line]
        if bad:
            raise DataError(f"transformer data with tabs needs SOURCE<TAB>TARGET on every line; "
                            f"non-empty line {bad[0]} has no tab")
        pairs = [line.split("\t", 1) for line in lines]
    else:
        pairs = list(itertools.pairwise(lines))
    if not pairs:
        raise DataError("the data file is too short: transformer training needs at least one "
                        "SOURCE<TAB>TARGET line or two lines")
    arrays = seq2seq_arrays(_encode(tokenizer, [s for s, _ in pairs]),
                            _encode(tokenizer, [t for _, t in pairs]), T, specials)
    train, held = _split(len(pairs), eval_fraction)

    def dataset(subset, stream_id):
        def make(indices, rng):
            pick = subset[indices]
            return {key: value[pick] for key, value in arrays.items()}
        return Dataset("transformer", len(subset), make, config, tokens_per_example=2 * T,
                       stream=stream_id)

    return dataset(train, 0), (dataset(held, 1) if len(held) else None)


def _bert(text, tokenizer, config, specials, eval_fraction):
    T = config.seq_len
    if T < 5:
        raise DataError(f"bert needs seq_len >= 5 ([CLS] A [SEP] B [SEP]), got {T}")
    sentences, documents, doc = [], [], 0
    for line in text.splitlines():
        if line.strip():
            sentences.append(line.strip())
            documents.append(doc)
        else:
            doc += 1
    ids = _encode(tokenizer, sentences)
    documents = np.array(documents)
    cls, sep, mask_id, pad = (specials[k] for k in ("[CLS]", "[SEP]", "[MASK]", "[PAD]"))
    special = np.array(sorted(specials.values()))
    vocab = tokenizer.get_vocab_size()
    ordinary = np.setdiff1d(np.arange(vocab), special)  # what a random replacement draws from
    train, held = _split(len(sentences), eval_fraction)

    def pack(a, b):
        a, b = list(a), list(b)
        while len(a) + len(b) > T - 3:  # longest first
            (a if len(a) >= len(b) else b).pop()
        tokens = [cls, *a, sep, *b, sep]
        types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        return tokens, types

    def choose(input_ids, attention_mask, candidates, rng):
        """-> ``chosen (B, T)`` (the tokens to predict), ``masked_positions``, ``mlm_labels``."""
        if not config.max_predictions:  # dense: every position carries a label or -100
            chosen = candidates & (rng.random(input_ids.shape) < config.mlm_probability)
            positions = np.broadcast_to(np.arange(T, dtype=np.int32), input_ids.shape).copy()
            return chosen, positions, np.where(chosen, input_ids, IGNORE_INDEX).astype(np.int32)
        P = min(config.max_predictions, T)
        counts = np.round(attention_mask.sum(1) * config.mlm_probability).astype(int)
        counts = np.minimum(np.minimum(P, np.maximum(1, counts)), candidates.sum(1))
        chosen = np.zeros_like(candidates)
        positions = np.zeros((len(input_ids), P), np.int32)
        mlm_labels = np.full((len(input_ids), P), IGNORE_INDEX, np.int32)
        for r, n in enumerate(counts):
            picked = np.sort(rng.choice(np.flatnonzero(candidates[r]), n, replace=False))
            chosen[r, picked] = True
            positions[r, :n] = picked
            mlm_labels[r, :n] = input_ids[r, picked]
        return chosen, positions, mlm_labels

    def dataset(subset, stream_id):
        def make(indices, rng):
            rows, type_rows, nsp = [], [], []
            for k in indices:
                i = subset[k]
                follows = k + 1 < len(subset) and documents[subset[k + 1]] == documents[i]
                if follows and rng.random() < 0.5:
                    j, label = subset[k + 1], 0
                else:
                    j, label = subset[rng.integers(len(subset))], 1
                tokens, types = pack(ids[i], ids[j])
                rows.append(np.array(tokens))
                type_rows.append(np.array(types))
                nsp.append(label)
            input_ids = _pad(rows, T, pad)
            attention_mask = (input_ids != pad).astype(np.int32)
            candidates = attention_mask.astype(bool) & ~np.isin(input_ids, special)
            chosen, positions, mlm_labels = choose(input_ids, attention_mask, candidates, rng)
            roll = rng.random(input_ids.shape)
            replaced = np.where(chosen & (roll < 0.8), mask_id, input_ids)
            random_tokens = rng.choice(ordinary, size=input_ids.shape) if len(ordinary) else pad
            replaced = np.where(chosen & (roll >= 0.8) & (roll < 0.9), random_tokens, replaced)
            return {"input_ids": replaced.astype(np.int32),
                    "token_type_ids": _pad(type_rows, T, 0), "attention_mask": attention_mask,
                    "masked_positions": positions, "mlm_labels": mlm_labels,
                    "nsp_labels": np.array(nsp, np.int32)}
        return Dataset("bert", len(subset), make, config, tokens_per_example=T, stream=stream_id)

    return dataset(train, 0), (dataset(held, 1) if len(held) else None)


# ------------------------------------------------------------------------- greedy samples

def sample_context(ids, length: int, context: int) -> tuple[np.ndarray, np.ndarray, int]:
    """For ``sample.greedy_sample`` in both frameworks: the last ``context`` of ``ids``
    right-padded to ``(1, context)``, its ``[batch, seq]`` mask and the index of its last real
    token. Refuses an empty prompt or a negative ``length`` (ids are checked by the model)."""
    if len(ids) == 0:
        raise ValueError("the prompt is empty: give at least one token to continue")
    if not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be a non-negative int, got {length!r}")
    tail = np.asarray(ids[-context:], np.int32)
    window = np.zeros((1, context), np.int32)
    window[0, : len(tail)] = tail
    return window, (np.arange(context) < len(tail))[None].astype(np.int32), len(tail) - 1


# ----------------------------------------------------------------------------- host checks

def check_labels(name: str, labels, num_classes: int, ignore_index: int = IGNORE_INDEX) -> None:
    """Integer labels, each ``ignore_index`` or in ``[0, num_classes)`` (when concrete)."""
    dtype = str(labels.dtype).removeprefix("torch.")
    if not dtype.startswith(("int", "uint")):
        raise TypeError(f"{name} must hold integer class ids, got dtype {dtype}")
    values = validate.host_values(labels)
    if values is None or values.size == 0:
        return
    real = values[values != ignore_index]
    if real.size and (real.min() < 0 or real.max() >= num_classes):
        bad = int(real.min()) if real.min() < 0 else int(real.max())
        raise ValueError(f"{name} must lie in [0, {num_classes}) or be {ignore_index} (ignored); "
                         f"found {bad}")


def check_batch(family: str, batch: dict, model_config) -> None:
    """Every key the family needs, every id in its table, every label in range: on the host,
    before the batch reaches a jitted step."""
    missing = sorted(set(BATCH_KEYS[family]) - set(batch))
    if missing:
        raise DataError(f"a {family} batch needs {BATCH_KEYS[family]}; missing {missing}")
    c = model_config
    if family == "transformer":
        validate.check_ids("src_ids", batch["src_ids"], c.src_vocab_size)
        validate.check_ids("tgt_ids", batch["tgt_ids"], c.tgt_vocab_size)
        check_labels("labels", batch["labels"], c.tgt_vocab_size)
        return
    validate.check_ids("input_ids", batch["input_ids"], c.vocab_size)
    if family == "gpt" and "labels" in batch:  # random windows carry their targets
        check_labels("labels", batch["labels"], c.vocab_size)
    if family in ("bert", "classifier"):
        validate.check_ids("token_type_ids", batch["token_type_ids"], c.type_vocab_size)
    if family == "bert":
        positions, labels = batch["masked_positions"], batch["mlm_labels"]
        if tuple(positions.shape[:-1]) != tuple(batch["input_ids"].shape[:-1]):
            raise DataError(f"masked_positions has shape {tuple(positions.shape)} but input_ids "
                            f"{tuple(batch['input_ids'].shape)}: one row of positions per row")
        if tuple(labels.shape) != tuple(positions.shape):
            raise DataError(f"mlm_labels has shape {tuple(labels.shape)} but masked_positions "
                            f"{tuple(positions.shape)}: one label per masked position")
        validate.check_ids("masked_positions", positions, batch["input_ids"].shape[-1])
        check_labels("mlm_labels", labels, c.vocab_size)
        check_labels("nsp_labels", batch["nsp_labels"], 2)
    if family == "classifier":
        check_labels("labels", batch["labels"], c.num_labels)
