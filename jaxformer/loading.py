"""One loader for every command and library user: a run directory of ``jaxformer train`` or a
Hugging Face model directory becomes a model in eval mode, its tokenizer and its config.

``load(path)`` (also ``jaxformer.load``) tells the two kinds of directory apart by their files
(``run.json``: a run; ``config.json``: Hugging Face), restores a run's latest good checkpoint (or
``step=N``) in whichever framework trained it, and hands back the JAX model or, with
``framework="torch"``, the torch twin with the same weights (``checkpoints.convert``: a run
trained in one framework loads in either). Every problem is a :class:`LoadError` of one line,
``"PATH: the problem"``. Glue without computation, so it has no twin in ``torch_ref``: the torch
side is reached through ``jaxformer.frameworks`` (docs/workflow.md).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jaxformer import frameworks
from jaxformer.tokenizer import TextTokenizer

__all__ = ["FAMILIES", "LoadError", "Loaded", "load", "require_family"]

FAMILIES = ("gpt", "bert", "transformer", "classifier")  # the keys of training.tasks.TASKS

# A Hugging Face architecture -> the family (task key) of the model it loads into: by our class
# first (a classifier is a BERT with a head), then by the family's module, so a family added to
# ``checkpoints.hf.FAMILIES`` (the encoder-decoder one) needs no change here.
_HF_FAMILY_OF_CLASS = {"BertForSequenceClassification": "classifier"}
_HF_FAMILY_OF_MODULE = {"bert": "bert", "gpt": "gpt", "encoder_decoder": "transformer"}

_RUN_FILES = "run.json, tokenizer.json and checkpoints/ (a run directory of `jaxformer train`)"
_HF_FILES = "config.json and model.safetensors or pytorch_model.bin (a Hugging Face directory)"


class LoadError(ValueError):
    """A path that cannot be loaded: one line, ``"PATH: the problem"``."""

    def __init__(self, path, problem: str, *, sep: str = ": "):
        self.path, self.problem = Path(path), " ".join(str(problem).split())
        super().__init__(f"{path}{sep}{self.problem}")


@dataclass
class Loaded:
    """What :func:`load` returns. ``model`` is in eval mode (dropout off): an NNX module for
    ``framework="jax"``, a ``torch.nn.Module`` for ``"torch"``."""

    model: Any
    tokenizer: TextTokenizer
    config: Any  # the model config (jaxformer.config)
    family: str  # "gpt" | "bert" | "transformer" | "classifier"
    label_names: list[str] | None  # the classifier's classes, in id order
    path: Path
    step: int | None  # the checkpoint step loaded; None for a Hugging Face directory
    source: str  # "run" | "huggingface"
    framework: str  # "jax" | "torch"
    train_config: Any = None  # the run's TrainConfig (None for a Hugging Face directory)
    run: dict | None = None  # the run's run.json (identity, label_names, evaluation)


# ---------------------------------------------------------------------------------------- load

def load(path, *, step: int | None = None, framework: str = "jax") -> Loaded:
    """The model at ``path`` in eval mode, with its tokenizer and config.

    ``path``: a run directory of ``jaxformer train`` (its latest good checkpoint, or ``step``;
    a damaged newer checkpoint is skipped with a warning when no step is asked for) or a Hugging
    Face model directory (``step`` must be None). ``framework``: "jax" (an NNX model) or "torch"
    (the torch_ref twin), whichever framework trained the run. Raises :class:`LoadError`.
    """
    path = Path(path)
    if framework not in frameworks.FRAMEWORKS:
        raise LoadError(path, f"unknown framework {framework!r}; choose one of "
                              f"{', '.join(frameworks.FRAMEWORKS)}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise LoadError(path, f"step must be a non-negative int or None, got {step!r}")
    kind = _kind(path)
    if kind == "run":
        return _load_run(path, step, framework)
    if step is not None:
        raise LoadError(path, f"is a Hugging Face directory, which holds one set of weights: "
                              f"step={step} applies to run directories only")
    return _load_hf(path, framework)


def require_family(loaded: Loaded, families: tuple[str, ...], command: str) -> None:
    """Refuse a model of another family than ``command`` needs: ``"PATH is a bert run;
    `jaxformer generate` needs a gpt or transformer model"``."""
    if loaded.family in families:
        return
    what = "run" if loaded.source == "run" else "Hugging Face model"
    needed = " or ".join(families) if len(families) < 3 else \
        ", ".join(families[:-1]) + f" or {families[-1]}"
    raise LoadError(loaded.path, f"is a {loaded.family} {what}; `{command}` needs a {needed} "
                                 f"model", sep=" ")


def _kind(path: Path) -> str:
    """"run" or "huggingface", or a LoadError saying what was looked for."""
    if not path.exists():
        raise LoadError(path, "does not exist")
    if not path.is_dir():
        raise LoadError(path, f"is a file; give a directory: {_RUN_FILES}, or {_HF_FILES}")
    if (path / "run.json").is_file():
        return "run"
    if (path / "config.json").is_file():
        return "huggingface"
    for parent in (path.parent, path.parent.parent):  # runs/x/checkpoints or .../checkpoints/50
        if (parent / "run.json").is_file() and path != parent:
            raise LoadError(path, f"lies inside the run directory {parent}: give that directory "
                                  f"(and step=N, --step N, for a given checkpoint)")
    raise LoadError(path, f"is neither a run directory (no run.json; a run holds {_RUN_FILES}) "
                          f"nor a Hugging Face directory (no config.json; it holds {_HF_FILES})")


# ------------------------------------------------------------------------------------ run dirs

def _run_parts(path: Path):
    """(run.json, model config, TrainConfig, tokenizer) of a run, each checked."""
    from jaxformer import config as configs
    from jaxformer.training import rundir, tasks
    from jaxformer.training.config import TrainConfig

    try:
        run = rundir.read_run(path)
        identity = run["identity"]
        family = identity["family"]
        if family not in tasks.TASKS:
            raise rundir.DamagedFile(path / "run.json", f"identity.family {family!r} is not one "
                                                        f"of {sorted(tasks.TASKS)}")
        fields = dict(identity["model_config"])
        name = fields.pop("class", None)
        cls = tasks.TASKS[family].config_class
        if name is not None and name != cls.__name__:
            raise rundir.DamagedFile(path / "run.json", f"identity.model_config.class is "
                                                        f"{name!r}; a {family} run has a "
                                                        f"{cls.__name__}")
        try:
            model_cfg = getattr(configs, cls.__name__)(**fields)
            train_cfg = TrainConfig(**identity["train_config"])
        except (TypeError, ValueError) as error:
            raise rundir.DamagedFile(path / "run.json", f"its configuration does not load "
                                                        f"({error})") from None
        tokenizer = rundir.run_tokenizer(path, run)
    except rundir.DamagedFile as error:
        raise LoadError(error.path, error.problem) from None
    return run, model_cfg, train_cfg, tokenizer


def _load_run(path: Path, step: int | None, framework: str) -> Loaded:
    from jaxformer.training import rundir

    run, model_cfg, train_cfg, backend = _run_parts(path)
    identity = run["identity"]
    family, trained_in = identity["family"], identity["framework"]
    if trained_in not in frameworks.FRAMEWORKS:
        raise LoadError(path / "run.json", f"identity.framework {trained_in!r} is not one of "
                                           f"{', '.join(frameworks.FRAMEWORKS)}")
    directory = path / "checkpoints"
    if not directory.is_dir():
        raise LoadError(path, "holds no checkpoints/ directory: the run saved no checkpoint")
    checkpointer = frameworks.module(trained_in, "training.checkpoint").Checkpointer(
        directory, read_only=True)
    steps = checkpointer.steps()
    if not steps:
        raise LoadError(path, f"holds no checkpoint in {directory}")
    if step is not None and step not in steps:
        raise LoadError(path, f"has no checkpoint of step {step}; its checkpoints are steps "
                              f"{', '.join(map(str, steps))}")
    trainer = _trainer(trained_in, family, model_cfg, train_cfg)
    damaged: list[rundir.CheckpointDamaged] = []
    for candidate in [step] if step is not None else list(reversed(steps)):
        try:
            _restore(trained_in, checkpointer, trainer, candidate)
        except rundir.CheckpointDamaged as error:
            if step is not None:
                raise LoadError(path, f"checkpoint step {step} is damaged: {error}") from None
            damaged.append(error)
            continue
        loaded_step = candidate
        break
    else:
        raise LoadError(path, f"every checkpoint is damaged (steps "
                              f"{', '.join(str(d.step) for d in damaged)}); the newest: "
                              f"{damaged[0]}")
    for bad in damaged:
        warnings.warn(f"{path}: checkpoint step {bad.step} is damaged ({bad}); loaded step "
                      f"{loaded_step}, the newest good one", stacklevel=3)
    model = _in_framework(trainer.sync(), trained_in, framework, family, model_cfg)
    model.eval()
    return Loaded(model=model, tokenizer=TextTokenizer(backend), config=model_cfg, family=family,
                  label_names=run.get("label_names"), path=path, step=loaded_step, source="run",
                  framework=framework, train_config=train_cfg, run=run)


def _trainer(framework: str, family: str, model_cfg, train_cfg):
    """A train step of ``framework`` to restore a checkpoint into (its template: the model and
    optimizer state the checkpoint holds)."""
    options = SimpleNamespace(mesh=None, compile=False)
    if framework == "torch":
        import torch

        rng = torch.get_rng_state()  # building the model draws from torch's global generator
        try:
            return frameworks.module("torch", "training.step").build_trainer(
                family, model_cfg, train_cfg, options)
        finally:
            torch.set_rng_state(rng)
    return frameworks.module("jax", "training.step").build_trainer(
        family, model_cfg, train_cfg, options)


def _restore(framework: str, checkpointer, trainer, step: int) -> None:
    """Restore ``step`` into ``trainer``; the torch restore sets torch's global RNG state, which
    loading puts back."""
    if framework != "torch":
        checkpointer.restore(trainer, step)
        return
    import torch

    rng = torch.get_rng_state()
    try:
        checkpointer.restore(trainer, step)
    finally:
        torch.set_rng_state(rng)


def _in_framework(model, trained_in: str, framework: str, family: str, model_cfg):
    """``model`` (of ``trained_in``) as a model of ``framework`` with the same weights."""
    if trained_in == framework:
        return model
    if framework == "torch":  # NNX -> torch_ref
        import torch

        from jaxformer.checkpoints import convert

        weights = convert.nnx_to_torch(model)
        rng = torch.get_rng_state()
        try:
            twin = frameworks.module("torch", "training.step").build_model(family, model_cfg, 0)
        finally:
            torch.set_rng_state(rng)
        twin.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
        return twin
    from flax import nnx  # torch_ref -> NNX

    from jaxformer.checkpoints import convert
    from jaxformer.checkpoints.hf.files import float_numpy
    from jaxformer.training.step import MODELS

    weights = {k: float_numpy(v) for k, v in model.state_dict().items()}
    ours = convert.abstract_model(lambda: MODELS[family](model_cfg, rngs=nnx.Rngs(0)))
    convert.torch_to_nnx(weights, ours)
    return ours


# ---------------------------------------------------------------------- Hugging Face directories

def _load_hf(path: Path, framework: str) -> Loaded:
    from jaxformer.checkpoints import hf
    from jaxformer.checkpoints.hf.files import read_config

    try:
        hf_config = read_config(path)
        names = hf_config.get("architectures") or []
        names = names if isinstance(names, list) else [names]
        if len(names) != 1 or names[0] not in hf.ARCHITECTURES:
            raise LoadError(path / "config.json", f"names the architectures {names}; jaxformer "
                                                  f"loads one of {', '.join(hf.ARCHITECTURES)}")
        arch = hf.ARCHITECTURES[names[0]]
        family = _HF_FAMILY_OF_CLASS.get(arch.cls) or _HF_FAMILY_OF_MODULE.get(arch.family.module)
        if family is None:
            raise LoadError(path / "config.json", f"architecture {arch.name} maps to no "
                                                  f"jaxformer family ({', '.join(FAMILIES)})")
        model = hf.from_pretrained(path, framework)
    except LoadError:
        raise
    except (OSError, ValueError) as error:  # CheckpointError, UnsupportedConfigError: ValueErrors
        message = str(error)
        prefix = f"{path}/"
        raise LoadError(path, message[len(prefix):] if message.startswith(prefix) else message
                        ) from None
    config = model.config
    backend = _hf_tokenizer(path)
    expected = getattr(config, "vocab_size", None) or getattr(config, "tgt_vocab_size", None)
    if expected is not None and backend.get_vocab_size() > expected:
        raise LoadError(path, f"its tokenizer holds {backend.get_vocab_size()} tokens, more than "
                              f"the model's vocabulary of {expected} (config.json vocab_size): "
                              f"not the model's tokenizer")
    specials = {}
    for key, name in (("eos_token_id", "eos_id"), ("bos_token_id", "bos_id"),
                      ("pad_token_id", "pad_id")):
        value = hf_config.get(key)
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int) and not isinstance(value, bool):
            specials[name] = value
    labels = None
    if family == "classifier":
        id2label = hf_config.get("id2label") or {}
        try:
            labels = [str(id2label[k]) for k in sorted(id2label, key=int)]
        except (TypeError, ValueError):
            labels = None
        if not labels or len(labels) != getattr(config, "num_labels", len(labels)):
            labels = [f"LABEL_{i}" for i in range(config.num_labels)]
    return Loaded(model=model, tokenizer=TextTokenizer(backend, specials), config=config,
                  family=family, label_names=labels, path=path, step=None,
                  source="huggingface", framework=framework)


def _hf_tokenizer(path: Path):
    """The directory's ``tokenizer.json``, or a BERT ``vocab.txt`` (WordPiece, lower-cased as
    ``tokenizer_config.json``'s ``do_lower_case`` says, default yes)."""
    from tokenizers import Tokenizer

    file = path / "tokenizer.json"
    if file.is_file():
        try:
            return Tokenizer.from_file(str(file))
        except Exception as error:  # tokenizers raises a bare Exception
            raise LoadError(file, f"not a tokenizers tokenizer ({str(error)[:200]})") from None
    if (path / "vocab.txt").is_file():
        from tokenizers.implementations import BertWordPieceTokenizer

        lower = True
        config_file = path / "tokenizer_config.json"
        if config_file.is_file():
            with contextlib.suppress(OSError, ValueError, AttributeError):
                lower = bool(json.loads(config_file.read_text()).get("do_lower_case", True))
        return BertWordPieceTokenizer(str(path / "vocab.txt"), lowercase=lower)._tokenizer
    raise LoadError(path, "has no tokenizer.json (nor a BERT vocab.txt): jaxformer needs the "
                          "model's tokenizer")
