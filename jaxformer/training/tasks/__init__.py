"""The training objectives, one :class:`~jaxformer.training.tasks.base.Task` each (framework-free).

``TASKS`` maps a key (``--family`` on the command line, ``family`` in ``run.json``) to its Task;
both frameworks select by that key: the JAX step and its torch twin build ``task.model`` from their
own ``models`` package and score it with ``task.loss`` from their own ``training.losses``. Adding
an objective is one file here and one loss function on each side.
"""

from __future__ import annotations

from jaxformer.training.tasks.base import PRESET_ALIASES, Task
from jaxformer.training.tasks.bert_pretraining import BERT_PRETRAINING
from jaxformer.training.tasks.causal_lm import CAUSAL_LM
from jaxformer.training.tasks.classification import CLASSIFICATION
from jaxformer.training.tasks.seq2seq import SEQ2SEQ

TASKS: dict[str, Task] = {task.name: task for task in (
    BERT_PRETRAINING, CAUSAL_LM, SEQ2SEQ, CLASSIFICATION)}

__all__ = ["BERT_PRETRAINING", "CAUSAL_LM", "CLASSIFICATION", "PRESET_ALIASES", "SEQ2SEQ", "TASKS",
           "Task", "build_datasets", "get", "model_config", "preset_names"]


def get(name: str) -> Task:
    """The Task of key ``name``; a clear error naming the keys otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown family {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name]


def preset_names(name: str) -> list[str]:
    """The model presets of task ``name``."""
    return get(name).preset_names()


def model_config(name: str, preset: str, **changes):
    """Task ``name``'s model config from ``preset`` (see :meth:`Task.model_config`)."""
    return get(name).model_config(preset, **changes)


def build_datasets(name: str, text: str, tokenizer, config, eval_fraction: float = 0.0,
                   eval_text: str | None = None):
    """Task ``name``'s (training, held-out or None) datasets (see :meth:`Task.build_datasets`)."""
    return get(name).build_datasets(text, tokenizer, config, eval_fraction, eval_text)
