"""What a training objective is: one frozen :class:`Task` per objective (framework-free).

A Task owns what depends on the objective: model config and presets, the model and loss (by
name: each framework finds its own in ``models/`` and ``training/losses.py``), the dataset builder
and batch check, defaults, and the FLOPs behind MFU. One file per objective sits beside this one;
``tasks/__init__.py`` holds the registry both frameworks select from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from jaxformer import validate
from jaxformer.training.config import TrainConfig
from jaxformer.training.data import Dataset
from jaxformer.training.vocab import SPECIAL_TOKENS, DataError

PRESET_ALIASES = {"base": {"gpt": "gpt2"}}  # `--preset base` reads GPT-2 small for gpt


@dataclass(frozen=True)
class Task:
    """One objective. ``name`` is its key everywhere (``--family``, ``run.json``'s ``family``)."""

    name: str
    config_class: type  # the model config (jaxformer.config), with its presets
    model_module: str  # "models.gpt": the module of the model in jaxformer and in torch_ref
    model: str  # the model's class name there
    loss: str  # (model, batch, config) -> loss, a function of each framework's training.losses
    batch_keys: tuple[str, ...]  # what every batch of this task holds
    needed_specials: tuple[str, ...]  # the special tokens the batches use
    # (model, batch, config) -> the fraction classified right, reported at evaluations; or None
    accuracy: str | None = None
    # config fields sized to the tokenizer; the first is the vocabulary the model predicts
    vocab_fields: tuple[str, ...] = ("vocab_size",)
    pad_fields: tuple[str, ...] = ("pad_token_id",)  # config fields set to the [PAD] id
    flops_model: str | None = None  # models.flops.train_step_flops' model (None: its default)
    hf_export: bool = False  # checkpoints.hf.save_pretrained writes this task's model
    default_schedule: str = "linear"  # --schedule when not given
    default_label_smoothing: float = 0.0  # --label-smoothing when not given

    # ------------------------------------------------------------------------------ the model

    def preset_names(self) -> list[str]:
        """The presets (classmethods) of the model config, and their aliases."""
        names = [name for name, attr in vars(self.config_class).items()
                 if isinstance(attr, classmethod)]
        return sorted(names + [alias for alias, table in PRESET_ALIASES.items()
                               if self.name in table])

    def model_config(self, preset: str, *, vocab_size: int | None = None,
                     pad_id: int | None = None, num_labels: int | None = None,
                     dropout: float | None = None, dtype: str | None = None,
                     param_dtype: str | None = None, scan_layers: bool | None = None,
                     remat: str | None = None):
        """The model config from ``preset``, sized to the tokenizer's vocabulary and pad id,
        with ``dropout`` (when given) replacing every dropout rate of the preset, and ``dtype``,
        ``param_dtype``, ``scan_layers`` and ``remat`` (when given) replacing the preset's (the
        config checks them)."""
        name = PRESET_ALIASES.get(preset, {}).get(self.name, preset)
        if name not in self.preset_names():
            raise ValueError(f"family {self.name!r} has no preset {preset!r}; choose one of "
                             f"{self.preset_names()}")
        return self.configure(getattr(self.config_class, name)(), vocab_size=vocab_size,
                              pad_id=pad_id, num_labels=num_labels, dropout=dropout, dtype=dtype,
                              param_dtype=param_dtype, scan_layers=scan_layers, remat=remat)

    def configure(self, config, *, vocab_size: int | None = None, pad_id: int | None = None,
                  num_labels: int | None = None, dropout: float | None = None,
                  dtype: str | None = None, param_dtype: str | None = None,
                  scan_layers: bool | None = None, remat: str | None = None):
        """``config`` (a preset's, or a checkpoint's for ``--init-from``) with the changes
        :meth:`model_config` describes."""
        changes: dict[str, Any] = {}
        if dropout is not None:
            changes.update(dropout_rate=dropout, attention_dropout_rate=dropout)
        if vocab_size is not None:
            changes.update(dict.fromkeys(self.vocab_fields, vocab_size))
        if pad_id is not None:
            changes.update(dict.fromkeys(self.pad_fields, pad_id))
        if num_labels is not None:
            changes.update(num_labels=num_labels)
        for field, value in (("dtype", dtype), ("param_dtype", param_dtype),
                             ("scan_layers", scan_layers), ("remat", remat)):
            if value is not None:
                changes[field] = value
        return dataclasses.replace(config, **changes)

    def vocab_size(self, model_config) -> int:
        """The size of the vocabulary the model predicts (its first ``vocab_fields`` field):
        the default size of a vocabulary trained for it."""
        return getattr(model_config, self.vocab_fields[0])

    def step_flops(self, model_config, config: TrainConfig) -> int | None:
        """Model FLOPs of one update (for model TFLOP/s and MFU); None without the counter."""
        try:
            from jaxformer.models import flops
        except ImportError:
            return None
        B, T = config.batch_size, config.seq_len
        if self.flops_model is None:
            return flops.train_step_flops(model_config, B, T)
        return flops.train_step_flops(model_config, B, T, model=self.flops_model)

    # -------------------------------------------------------------------------------- the data

    def special_ids(self, tokenizer) -> dict[str, int]:
        """The ids of the special tokens in ``tokenizer``; a clear error if it lacks one this
        task needs."""
        ids = {name: tokenizer.token_to_id(name) for name in SPECIAL_TOKENS}
        missing = [name for name in self.needed_specials if ids[name] is None]
        if missing:
            raise DataError(f"the tokenizer has no {', '.join(missing)} token, which the "
                            f"{self.name} family needs (a tokenizer trained by jaxformer has "
                            f"{SPECIAL_TOKENS})")
        return {name: i for name, i in ids.items() if i is not None}

    def build_datasets(self, text: str, tokenizer, config: TrainConfig,
                       eval_fraction: float = 0.0, eval_text: str | None = None
                       ) -> tuple[Dataset, Dataset | None]:
        """The training dataset and, when ``eval_fraction`` > 0, a held-out one. With
        ``eval_text`` (a validation file) the whole ``text`` trains and the evaluation set is
        ``eval_text``."""
        specials = self.special_ids(tokenizer)
        if eval_text is None:
            return self.make_datasets(text, tokenizer, config, specials, eval_fraction)
        train, _ = self.make_datasets(text, tokenizer, config, specials, 0.0)
        held = self.eval_dataset(eval_text, tokenizer, config)
        held_labels = getattr(held, "label_names", None)
        train_labels = getattr(train, "label_names", None)
        if held_labels != train_labels:
            raise DataError(f"the validation file's labels {held_labels} differ from the "
                            f"training file's {train_labels}")
        return train, held

    def eval_dataset(self, text: str, tokenizer, config: TrainConfig) -> Dataset:
        """The evaluation set of a validation text (``--val-data``; ``jaxformer eval``): all of
        ``text``, on the evaluation stream (its own permutations and random draws)."""
        held, _ = self.make_datasets(text, tokenizer, config, self.special_ids(tokenizer), 0.0)
        held._stream = 1
        return held

    def make_datasets(self, text: str, tokenizer, config: TrainConfig, specials: dict,
                      eval_fraction: float) -> tuple[Dataset, Dataset | None]:
        """The task's examples of ``text``: (training set, held-out tail or None)."""
        raise NotImplementedError

    def check_batch(self, batch: dict, model_config) -> None:
        """Every key the task needs, every id in its table, every label in range: on the host,
        before the batch reaches a jitted step."""
        missing = sorted(set(self.batch_keys) - set(batch))
        if missing:
            raise DataError(f"a {self.name} batch needs {self.batch_keys}; missing {missing}")
        self.check_values(batch, model_config)

    def check_values(self, batch: dict, model_config) -> None:
        """The ids and labels of a batch holding every key (see :meth:`check_batch`)."""
        validate.check_ids("input_ids", batch["input_ids"], model_config.vocab_size)
        if "token_type_ids" in self.batch_keys:
            validate.check_ids("token_type_ids", batch["token_type_ids"],
                               model_config.type_vocab_size)

