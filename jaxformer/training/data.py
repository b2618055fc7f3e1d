"""The dataset machinery every task shares, on the host in numpy (framework-free).

Both frameworks train on the very batches built here. A task (``jaxformer.training.tasks``) turns
a text into examples; this module reads the file, encodes and pads, holds examples out for
evaluation, and serves them as a :class:`Dataset`: batches are a pure function of ``(seed,
position)``, so a checkpoint need only record the position to resume the exact same stream.
Each row is a function of ``(seed, position, row)`` too, so a process of a run over several
builds only its own rows of the global batch (``rows=``, a :class:`Rows`), and they are the rows
the one-process run would have built.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from jaxformer import validate
from jaxformer.training.config import IGNORE_INDEX, TrainConfig
from jaxformer.training.vocab import DataError

# ------------------------------------------------------------------------------------ the file

def read_text(path) -> str:
    """The file's text; refuses a missing, non-UTF-8 or empty file with a clear message."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"data file {path} is a directory; give the path of a text file")
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


# ------------------------------------------------------------------------------ examples

def encode(tokenizer, texts) -> list[np.ndarray]:
    return [np.asarray(e.ids, np.int32)
            for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def pad(rows: list[np.ndarray], length: int, value: int) -> np.ndarray:
    out = np.full((len(rows), length), value, np.int32)
    for r, row in enumerate(rows):
        out[r, : len(row)] = row
    return out


def split(n: int, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the training and held-out examples (the file's tail is held out)."""
    n_eval = 0 if eval_fraction <= 0 else max(1, round(n * eval_fraction))
    if n_eval and n - n_eval < 1:
        raise DataError(f"the data yields {n} example(s): too few to hold some out for "
                        f"evaluation (--eval-every); give a longer file or no evaluation")
    return np.arange(n - n_eval), np.arange(n - n_eval, n)


# --------------------------------------------------------------------------------- datasets

class Rows(dict):
    """Rows ``start`` to ``start + n`` (along the batch axis) of a batch of ``total`` rows: what
    one process of a run over several builds (``Dataset.micro_batch(..., rows=)``). A plain
    dict of arrays otherwise; ``jaxformer.sharding.shard_batch`` assembles the global batch."""

    def __init__(self, arrays: dict, start: int, total: int):
        super().__init__(arrays)
        self.start, self.total = start, total


class RowGenerators:
    """The random generators of rows ``start, start + 1, ...`` of micro-batch ``position``, one
    per row, made when first asked for: ``rngs[r]`` is seeded by ``(seed, stream, position,
    start + r)``, so a row draws the same numbers whichever process builds it."""

    def __init__(self, seed: int, stream: int, position: int, start: int):
        self._key, self._start = (seed, stream, 1, position), start

    def __getitem__(self, r: int) -> np.random.Generator:
        return np.random.default_rng([*self._key, self._start + r])


def _row_range(rows, size: int) -> tuple[int, int]:
    lo, hi = (0, size) if rows is None else (int(rows[0]), int(rows[1]))
    if not 0 <= lo < hi <= size:
        raise ValueError(f"rows {lo}:{hi} are not a non-empty part of a batch of {size}")
    return lo, hi


class Dataset:
    """A task's examples (``task``: its key, e.g. ``"gpt"``) and how to batch them.
    ``micro_batch(position)`` is the ``position``-th micro-batch of the stream;
    ``update_batch(step)`` stacks the ``accumulation_steps`` micro-batches of one optimizer update
    on a leading axis. Given ``rows=(lo, hi)``, both build only those rows of each micro-batch
    (a :class:`Rows`). ``make(indices, rngs)`` builds the examples ``indices``, row ``r`` drawing
    its random numbers from ``rngs[r]`` alone (:class:`RowGenerators`)."""

    def __init__(self, task: str, num_examples: int, make, config: TrainConfig, *,
                 tokens_per_example: int, num_labels: int | None = None, stream: int = 0):
        if num_examples == 0:
            raise DataError(f"the data yields no {task} example")
        self.task, self.num_examples, self.config = task, num_examples, config
        self._make = make  # (example indices, numpy Generator) -> batch dict
        self.tokens_per_example = tokens_per_example
        self.num_labels = num_labels
        self._stream = stream  # 0: training, 1: evaluation
        self._permutations: dict[int, np.ndarray] = {}  # the last few epochs' orders

    def __len__(self) -> int:
        return self.num_examples

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._permutations:
            if len(self._permutations) >= 4:
                del self._permutations[next(iter(self._permutations))]
            self._permutations[epoch] = np.random.default_rng(
                [self.config.seed, self._stream, 0, epoch]).permutation(self.num_examples)
        return self._permutations[epoch]

    def micro_batch(self, position: int, size: int | None = None,
                    rows: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
        size = self.config.micro_batch_size if size is None else size
        lo, hi = _row_range(rows, size)
        flat = position * size + np.arange(lo, hi)
        epochs, within = np.divmod(flat, self.num_examples)
        indices = np.array([self._permutation(int(e))[i] for e, i in zip(epochs, within)])
        batch = self._make(indices, RowGenerators(self.config.seed, self._stream, position, lo))
        return batch if rows is None else Rows(batch, lo, size)

    def update_batch(self, step: int, rows: tuple[int, int] | None = None
                     ) -> dict[str, np.ndarray]:
        accum = self.config.accumulation_steps
        micro = [self.micro_batch(step * accum + a, rows=rows) for a in range(accum)]
        stacked = {key: np.stack([m[key] for m in micro]) for key in micro[0]}
        return stacked if rows is None else Rows(stacked, rows[0], self.config.micro_batch_size)

    def eval_batches(self, max_batches: int, rows: tuple[int, int] | None = None
                     ) -> list[dict[str, np.ndarray]]:
        """Fixed evaluation batches: the same ones at every evaluation. They are the first
        :meth:`eval_count` batches of :meth:`eval_batch`: micro-batches of the stream (the
        seeded permutation of the examples, without repeating one), so a longer evaluation
        (``jaxformer eval``) begins with the very batches a shorter one (training's) scores.
        ``rows``: only those rows of each (of :meth:`eval_batch_size`)."""
        return [self.eval_batch(k, rows) for k in range(self.eval_count(max_batches))]

    def eval_count(self, max_batches: int | None = None) -> int:
        """How many evaluation batches ``max_batches`` gives: as many as asked, at most those
        the examples fill without repeating (every full batch when None), at least one."""
        most = self.num_examples // self._eval_size()
        return max(1, most if max_batches is None else min(max_batches, most))

    def eval_batch(self, k: int, rows: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
        """The ``k``-th evaluation batch: ``micro_batch(k)`` of ``micro_batch_size`` examples
        (all of them when there are fewer)."""
        return self.micro_batch(k, self._eval_size(), rows)

    def eval_batch_size(self) -> int:
        """The rows of each evaluation batch: a micro-batch, or every example if fewer."""
        return self._eval_size()

    def _eval_size(self) -> int:
        return min(self.config.micro_batch_size, self.num_examples)


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

    def micro_batch(self, position: int, size: int | None = None,
                    rows: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
        size = self.config.micro_batch_size if size is None else size
        lo, hi = _row_range(rows, size)
        rng = np.random.default_rng([self.config.seed, self._stream, 2, position])
        offsets = rng.integers(0, self.num_examples, size)[lo:hi]  # cheap: draw all, keep ours
        windows = self.tokens[offsets[:, None] + np.arange(self.config.seq_len + 1)]
        batch = {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}  # full: no mask
        return batch if rows is None else Rows(batch, lo, size)

    def eval_batch_size(self) -> int:
        return self.config.micro_batch_size

    def eval_batches(self, max_batches: int, rows: tuple[int, int] | None = None
                     ) -> list[dict[str, np.ndarray]]:
        """``max_batches`` random batches of the stream, the same ones at every evaluation
        (nanoGPT's ``estimate_loss`` draws fresh ones each time)."""
        return [self.eval_batch(k, rows) for k in range(self.eval_count(max_batches))]

    def eval_count(self, max_batches: int | None = None) -> int:
        """``max_batches``; None: as many batches as cover the tokens once on average
        (random windows have no end to reach)."""
        if max_batches is not None:
            return max_batches
        per_batch = self.config.micro_batch_size * self.config.seq_len
        return max(1, -(-len(self.tokens) // per_batch))

    def eval_batch(self, k: int, rows: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
        return self.micro_batch(k, rows=rows)


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
