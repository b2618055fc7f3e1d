"""Training hyper-parameters: one frozen ``TrainConfig`` that both frameworks read (stdlib only).

``torch_ref.training`` imports this module, as it imports ``jaxformer.config``, so a JAX run and
its torch twin can never be configured differently. Also here: the run identity that ``--resume``
compares (:func:`run_identity`). What depends on the objective belongs to its Task
(``jaxformer.training.tasks``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

IGNORE_INDEX = -100  # label value that contributes nothing to a loss, as in torch
SCHEDULES = ("linear", "cosine", "inverse_sqrt", "constant")
GPT_WINDOWS = ("packed", "random")  # how gpt examples are cut from the token stream


class TrainConfigError(ValueError):
    """A hyper-parameter that cannot train: names the field, its value and what is allowed."""


_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one run. ``batch_size`` counts the examples of one optimizer update;
    with ``accumulation_steps`` > 1 it is split into that many micro-batches of
    :attr:`micro_batch_size` whose gradients are averaged before the update.

    The schedule (``docs/training.md`` has the formulas): update ``n`` (0-based) uses
    ``learning_rate * (n + 1) / warmup_steps`` while ``n < warmup_steps``, then decays from
    ``learning_rate`` to ``min_learning_rate`` at the last update (``linear``, ``cosine``) or stays
    (``constant``); ``inverse_sqrt`` is the paper's ``min((n+1)/warmup, sqrt(warmup/(n+1)))``
    scaled to peak at ``learning_rate``. ``clip_norm`` 0 turns clipping off.

    Every default on which optax and torch differ is a field here and is passed explicitly to
    both (AdamW's betas, eps and weight decay; the clipping threshold; label smoothing); the
    losses' ignore index is :data:`IGNORE_INDEX`.
    """

    steps: int = 1000
    batch_size: int = 8
    accumulation_steps: int = 1
    seq_len: int = 64
    # gpt: "packed" cuts the stream into consecutive seq_len windows read in a seeded order;
    # "random" draws seq_len + 1 tokens at random offsets (nanoGPT's get_batch), labels = shift.
    gpt_windows: str = "packed"
    learning_rate: float = 1e-3
    min_learning_rate: float = 0.0
    warmup_steps: int = 0
    schedule: str = "linear"
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01  # torch.optim.AdamW's default; optax.adamw's is 1e-4
    decay_embeddings: bool = True  # False: embedding tables join biases and LayerNorm (no decay)
    clip_norm: float = 1.0
    label_smoothing: float = 0.0  # seq2seq loss; the paper uses 0.1
    mlm_probability: float = 0.15
    # BERT's max_predictions_per_seq: masked positions per sequence (at most seq_len used),
    # the MLM head runs only there. 20 is BERT's value for its 128-token phase; it caps
    # round(0.15 * length) only past 136 tokens (BERT used 80 at 512). 0: dense labels.
    max_predictions: int = 20
    seed: int = 0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            allowed = _TYPES[str(field.type)]
            if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
                raise TrainConfigError(f"TrainConfig: {field.name} must be {field.type}, got "
                                       f"{type(value).__name__} {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise TrainConfigError(f"TrainConfig: {field.name} must be finite, got {value}")
        checks = [
            (self.steps >= 1, "steps", "must be at least 1"),
            (self.batch_size >= 1, "batch_size", "must be at least 1"),
            (self.accumulation_steps >= 1, "accumulation_steps", "must be at least 1"),
            (self.batch_size % self.accumulation_steps == 0, "batch_size",
             f"must be divisible by accumulation_steps ({self.accumulation_steps})"),
            (self.seq_len >= 2, "seq_len", "must be at least 2"),
            (self.gpt_windows in GPT_WINDOWS, "gpt_windows", f"must be one of {GPT_WINDOWS}"),
            (self.learning_rate > 0, "learning_rate", "must be positive"),
            (0 <= self.min_learning_rate <= self.learning_rate, "min_learning_rate",
             f"must lie in [0, learning_rate={self.learning_rate}]"),
            (self.warmup_steps >= 0, "warmup_steps", "must not be negative"),
            (self.warmup_steps <= self.steps, "warmup_steps",
             f"is longer than the run (steps={self.steps})"),
            (self.schedule in SCHEDULES, "schedule", f"must be one of {SCHEDULES}"),
            (self.schedule != "inverse_sqrt" or self.warmup_steps >= 1, "warmup_steps",
             "must be at least 1 for the inverse_sqrt schedule"),
            (0 <= self.beta1 < 1, "beta1", "must lie in [0, 1)"),
            (0 <= self.beta2 < 1, "beta2", "must lie in [0, 1)"),
            (self.eps > 0, "eps", "must be positive"),
            (self.weight_decay >= 0, "weight_decay", "must not be negative"),
            (self.clip_norm >= 0, "clip_norm", "must not be negative (0 turns clipping off)"),
            (0 <= self.label_smoothing < 1, "label_smoothing", "must lie in [0, 1)"),
            (0 < self.mlm_probability < 1, "mlm_probability", "must lie in (0, 1)"),
            (self.max_predictions >= 0, "max_predictions",
             "must not be negative (0: labels at every position)"),
        ]
        for ok, field, rule in checks:
            if not ok:
                raise TrainConfigError(f"TrainConfig: {field} {rule}, got {getattr(self, field)!r}")

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.accumulation_steps

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def run_identity(family: str, framework: str, model_cfg, train_cfg: TrainConfig,
                 data_sha256: str) -> dict:
    """What a checkpoint must agree with to be resumed: plain JSON data."""
    return {"family": family, "framework": framework, "data_sha256": data_sha256,
            "model_config": {"class": type(model_cfg).__name__, **dataclasses.asdict(model_cfg)},
            "train_config": train_cfg.to_dict()}


def identity_differences(saved: dict, current: dict) -> list[str]:
    """Every field on which two run identities differ, as ``"name: saved X, now Y"``."""
    out = []

    def walk(a, b, prefix):
        for key in sorted(set(a) | set(b)):
            x, y = a.get(key, "<absent>"), b.get(key, "<absent>")
            if isinstance(x, dict) and isinstance(y, dict):
                walk(x, y, f"{prefix}{key}.")
            elif x != y:
                out.append(f"{prefix}{key}: saved {x!r}, now {y!r}")

    walk(saved, current, "")
    return out
