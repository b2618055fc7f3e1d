"""Starting a run from trained weights: ``jaxformer train --init-from PATH`` (glue, no twin).

PATH is a Hugging Face model directory (``config.json``, weights, ``tokenizer.json``) or a
jaxformer run directory (``run.json``, ``tokenizer.json``, ``checkpoints/``). :func:`read` gives
what the run takes from it: the architecture (the model config; the task still sets what is its
own: the number of labels, dropout, dtypes, layer scanning) and the tokenizer. Its weights
initialise the task's model through :func:`match`, which works on numpy state dicts in torch's
key layout (``checkpoints.convert``), framework-free: the JAX run and the torch twin start from
the very same matched state dict (``loop.build_trainer``).

The matching, parameter by parameter. A task's model keeps its base model under a prefix
(``bert.`` in ``BertForSequenceClassification``, none in ``GPT``) and its heads beside it; a
checkpoint does the same with its own prefix (none in a Hugging Face ``BertModel``). A base
parameter is looked up under the checkpoint's prefix, a head parameter under its own key. Found
with the same shape, it is loaded; otherwise it keeps the task's fresh initialisation (from
``--seed``, as without ``--init-from``) and is reported as fresh, grouped by module
(classifier, bert.pooler, mlm, ...). A checkpoint parameter no task parameter takes is
reported as dropped (the MLM and NSP heads of a pre-training checkpoint under a classifier). A
checkpoint of another family (GPT weights for the classifier) or one that fills none of the base
model is refused, as is a tokenizer that does not fit the checkpoint's vocabulary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SOURCES = ("run", "huggingface")
# What a preset must agree on with the checkpoint to be given beside --init-from: every model
# config field except those the run sets itself (sized to the data or chosen per run).
RUN_FIELDS = ("vocab_size", "num_labels", "pad_token_id", "dropout_rate",
              "attention_dropout_rate", "dtype", "param_dtype", "attention_implementation",
              "scan_layers", "remat", "initializer_range")


class InitError(ValueError):
    """``--init-from`` cannot be used as asked: ``"PATH: problem"`` on one line."""


@dataclass
class Source:
    """A checkpoint to start from: its architecture, tokenizer and (read on demand) weights."""

    path: Path
    source: str  # "huggingface" or "run" (SOURCES)
    model_class: str  # our class of the checkpoint's model (BertModel, GPT, ...)
    config: Any  # its model config (jaxformer.config)
    tokenizer: Any  # a tokenizers.Tokenizer, padding and truncation off
    step: int | None  # the run's checkpoint step (None: a Hugging Face directory)
    label_names: list[str] | None  # a classifier run's classes
    read_weights: Callable[[], dict[str, np.ndarray]] = dataclasses.field(repr=False)

    @property
    def kind(self) -> str:
        return "Hugging Face" if self.source == "huggingface" else "run"

    def record(self) -> dict:
        """What ``run.json`` records (and ``--resume`` compares): plain JSON data."""
        return {"path": str(self.path.resolve()), "source": self.source,
                "model_class": self.model_class, "step": self.step}

    def describe(self) -> str:
        step = f", step {self.step}" if self.step is not None else ""
        return f"{self.path} ({self.kind} {self.model_class}{step})"


# ------------------------------------------------------------------------------------ reading

def read(path, step: int | None = None) -> Source:
    """The checkpoint at ``path``: a run directory (``step`` None: its latest checkpoint) or a
    Hugging Face directory. Weights are read only by ``Source.read_weights()``."""
    path = Path(path)
    if not path.exists():
        raise InitError(f"{path}: does not exist")
    if not path.is_dir():
        raise InitError(f"{path}: not a directory; --init-from takes a jaxformer run directory "
                        f"(run.json) or a Hugging Face model directory (config.json)")
    if (path / "run.json").is_file():
        return _read_run(path, step)
    if (path / "config.json").is_file():
        if step is not None:
            raise InitError(f"{path}: a Hugging Face directory has no checkpoint steps")
        return _read_hf(path)
    raise InitError(f"{path}: neither a jaxformer run directory (no run.json) nor a Hugging "
                    f"Face model directory (no config.json)")


def _tokenizer(path: Path, vocab_size: int | None):
    from tokenizers import Tokenizer

    file = path / "tokenizer.json"
    if not file.is_file():
        raise InitError(f"{path}: no tokenizer.json; the run takes the checkpoint's tokenizer "
                        f"(save it beside the weights)")
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as error:  # tokenizers raises a bare Exception
        raise InitError(f"{file}: not a tokenizers tokenizer ({str(error)[:200]})") from None
    # A Hugging Face tokenizer.json may pad or cut every text to a fixed length; the tasks pad
    # and cut themselves (to --seq-len), and add [CLS]/[SEP] where they need them.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if vocab_size is not None and tokenizer.get_vocab_size() != vocab_size:
        raise InitError(f"{file}: holds {tokenizer.get_vocab_size()} tokens, but the "
                        f"checkpoint's model has a vocabulary of {vocab_size}: not the "
                        f"checkpoint's tokenizer")
    return tokenizer


def _read_hf(path: Path) -> Source:
    from jaxformer.checkpoints import hf
    from jaxformer.checkpoints.hf.files import read_config

    try:
        hf_config = read_config(path)
        names = hf_config.get("architectures") or []
        names = names if isinstance(names, list) else [names]
        if len(names) != 1 or names[0] not in hf.ARCHITECTURES:
            raise InitError(f"{path / 'config.json'}: architectures {names}; --init-from loads "
                            f"one of {', '.join(hf.ARCHITECTURES)}")
        arch = hf.ARCHITECTURES[names[0]]
        config = hf.config_from_hf(hf_config, arch.name, source=str(path / "config.json"))
    except (FileNotFoundError, hf.CheckpointError, hf.UnsupportedConfigError) as error:
        raise InitError(f"{path}: {error}" if str(path) not in str(error) else str(error)) \
            from None
    tokenizer = _tokenizer(path, config.vocab_size)

    def weights() -> dict[str, np.ndarray]:
        from jaxformer.checkpoints import convert

        try:
            return convert.nnx_to_torch(hf.from_pretrained(path, "jax"))
        except (FileNotFoundError, hf.CheckpointError, hf.UnsupportedConfigError) as error:
            raise InitError(f"{path}: {error}".splitlines()[0]) from None

    return Source(path, "huggingface", arch.cls, config, tokenizer, None, None, weights)


def _read_run(path: Path, step: int | None) -> Source:
    import jaxformer

    try:
        loaded = jaxformer.load(path, step=step)
    except jaxformer.LoadError as error:
        raise InitError(str(error)) from None

    def weights() -> dict[str, np.ndarray]:
        from jaxformer.checkpoints import convert

        return convert.nnx_to_torch(loaded.model)

    tokenizer = _tokenizer(path, None)  # jaxformer.load checked it against the run's model
    return Source(path, "run", type(loaded.model).__name__, loaded.config, tokenizer, loaded.step,
                  loaded.label_names, weights)


# -------------------------------------------------------------------------------- the task

def base_prefix(model_class: str) -> str:
    """Where our class ``model_class`` keeps its base model (``bert.``; ``""`` for GPT, BertModel
    and the encoder-decoder), as the Hugging Face tables declare it."""
    from jaxformer.checkpoints import hf

    prefixes = {arch.cls: arch.our_prefix for arch in hf.ARCHITECTURES.values()}
    return prefixes.get(model_class, "")


def check_family(source: Source, task) -> None:
    """The checkpoint's model can serve ``task``: the same model config class."""
    if not isinstance(source.config, task.config_class):
        raise InitError(f"{source.path}: a {source.model_class} checkpoint "
                        f"({type(source.config).__name__}) cannot start a {task.name} run, which "
                        f"trains a {task.model} ({task.config_class.__name__})")


def check_flags(source: Source, task, options) -> None:
    """``--preset``, ``--tokenizer`` and ``--vocab-size`` beside ``--init-from``: the architecture
    and the tokenizer are the checkpoint's, so each is an error unless it agrees with it."""
    where = f"--init-from {source.path}"
    if options.preset is not None:
        preset = task.model_config(options.preset)
        differ = [f"{f.name} {getattr(preset, f.name)!r} vs {getattr(source.config, f.name)!r}"
                  for f in dataclasses.fields(preset)
                  if f.name not in RUN_FIELDS and f.name not in task.vocab_fields
                  and f.name not in task.pad_fields
                  and getattr(preset, f.name) != getattr(source.config, f.name, None)]
        if differ:
            raise InitError(f"--preset {options.preset} conflicts with {where}, whose "
                            f"architecture the run takes ({', '.join(differ[:4])}"
                            f"{', ...' if len(differ) > 4 else ''}); drop --preset")
    vocab = source.tokenizer.get_vocab_size()
    if options.vocab_size is not None and options.vocab_size != vocab:
        raise InitError(f"--vocab-size {options.vocab_size} conflicts with {where}, whose "
                        f"tokenizer holds {vocab} tokens; drop --vocab-size")
    if options.tokenizer is not None:
        same = False
        if Path(options.tokenizer).is_file():
            from jaxformer.training.vocab import load_tokenizer

            same = load_tokenizer(options.tokenizer).get_vocab() == source.tokenizer.get_vocab()
        if not same:
            raise InitError(f"--tokenizer {options.tokenizer} conflicts with {where}, whose "
                            f"tokenizer ({vocab} tokens) the run takes; drop --tokenizer")


# ----------------------------------------------------------------------------- the matching

@dataclass
class Match:
    """The task's initial weights and where each came from. ``fresh`` and ``dropped`` map a
    module (classifier, bert.pooler, mlm) to its parameters' keys; ``reasons`` says
    why a module is fresh when the checkpoint has it."""

    weights: dict[str, np.ndarray]
    loaded: list[str]
    fresh: dict[str, list[str]]
    dropped: dict[str, list[str]]
    reasons: dict[str, str]

    def report(self, source: Source, family: str) -> list[str]:
        """The lines ``jaxformer train`` prints."""
        def modules(groups: dict[str, list[str]]) -> str:
            def one(name: str, keys: list[str]) -> str:
                why = f", {self.reasons[name]}" if name in self.reasons else ""
                return f"{name} ({len(keys)} tensor{'s' * (len(keys) != 1)}{why})"

            return ", ".join(one(name, keys) for name, keys in groups.items()) or "none"

        return [f"init: {len(self.loaded)} tensors from {source.describe()}",
                f"init: fresh (created from --seed): {modules(self.fresh)}",
                f"init: dropped (the {family} model has no use for them): {modules(self.dropped)}"]

    def to_json(self) -> dict:
        return {"loaded": len(self.loaded), "fresh": self.fresh, "dropped": self.dropped,
                "reasons": self.reasons}


def _module(key: str, prefix: str) -> str:
    """The module a parameter is reported under: a head's first name, or the base model's
    prefix and first name (classifier, bert.pooler)."""
    if prefix and key.startswith(prefix):
        return prefix + key[len(prefix):].split(".")[0]
    return key.split(".")[0]


def match(checkpoint: dict[str, np.ndarray], checkpoint_prefix: str,
          fresh: dict[str, np.ndarray], task_prefix: str, *,
          renew: dict[str, str] | None = None, where: str = "checkpoint") -> Match:
    """The task's initial state dict: ``fresh`` (its own initialisation, torch key layout) with
    every parameter the ``checkpoint`` has, at the same place and shape, replaced by the
    checkpoint's. ``renew`` names modules to keep fresh anyway, with the reason (a classifier
    whose labels changed). Raises :class:`InitError` when nothing of the base model loads."""
    renew = dict(renew or {})
    weights: dict[str, np.ndarray] = {}
    loaded: list[str] = []
    fresh_groups: dict[str, list[str]] = {}
    reasons: dict[str, str] = {}
    used: set[str] = set()
    for key, value in fresh.items():
        in_base = key.startswith(task_prefix)
        theirs = checkpoint_prefix + key[len(task_prefix):] if in_base else key
        module = _module(key, task_prefix)
        found = checkpoint.get(theirs)
        if found is not None:
            used.add(theirs)
        if found is not None and tuple(found.shape) == tuple(value.shape) and module not in renew:
            weights[key] = np.array(found, dtype=value.dtype, order="C", copy=True)
            loaded.append(key)
            continue
        weights[key] = value
        fresh_groups.setdefault(module, []).append(key)
        if module in renew:
            reasons[module] = renew[module]
        elif found is not None:
            reasons.setdefault(module, f"shape {tuple(found.shape)} in the {where}, "
                                       f"{tuple(value.shape)} here")
    if not any(key.startswith(task_prefix) for key in loaded):
        raise InitError(f"{where}: none of its {len(checkpoint)} tensors fits the model's base "
                        f"(looked up under {checkpoint_prefix or 'no prefix'!r}); nothing to "
                        f"start from")
    dropped: dict[str, list[str]] = {}
    for key in checkpoint:
        if key not in used:
            dropped.setdefault(_module(key, checkpoint_prefix), []).append(key)
    return Match(weights, loaded, fresh_groups, dropped, reasons)


def initial_weights(source: Source, family: str, fresh: dict[str, np.ndarray],
                    renew: dict[str, str] | None = None) -> Match:
    """:func:`match` of ``source``'s weights to task ``family``'s fresh state dict."""
    from jaxformer.training import tasks

    task = tasks.get(family)
    return match(source.read_weights(), base_prefix(source.model_class), fresh,
                 base_prefix(task.model), renew=renew, where=str(source.path))

