"""Hugging Face checkpoints in and out: BERT (four architectures), GPT-2 (two), MarianMT and
BART (``MarianMTModel``, ``BartForConditionalGeneration``: the encoder-decoder ``Transformer``).

``from_pretrained(directory)`` reads a local Hugging Face model directory into a jaxformer model
(or, with ``framework="torch"``, its twin, named through ``jaxformer.frameworks``);
``save_pretrained(model, directory)`` writes one that ``transformers`` loads with the same outputs.
"""

# A directory holds ``config.json`` plus ``model.safetensors``, a sharded
# ``model.safetensors.index.json`` or ``pytorch_model.bin``.
#
# The package: ``engine`` applies key tables (tunix-style: checkpoint key pattern -> our
# torch-style key(s) plus a named transform; ``jaxformer.checkpoints.convert`` then applies its four
# leaf rules), ``files`` reads and writes the directory, and one file per family (``bert``,
# ``gpt2``, ``marian``, ``bart``) holds its table, architectures, ``config.json`` mapping and
# buffers. A new family is one new file whose ``FAMILY`` is added to :data:`FAMILIES` below.
#
# Loading is strict (see ``engine.map_checkpoint``): every checkpoint key matched once or explicitly
# ignored (buffers; heads an architecture does not use, dropped with a warning), every model key
# filled once (a tied duplicate must equal its weight), every shape checked, and only finite
# floating-point weights accepted. Anything else raises :class:`CheckpointError` listing every
# problem, and nothing is loaded. ``config.json`` fields that set a weight shape are required (a
# missing or non-integer one is a :class:`CheckpointError` naming field and file); fields asking for
# a computation jaxformer does not implement raise :class:`UnsupportedConfigError`. Weights load as
# float32 whatever the checkpoint dtype; export writes float32.

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from jaxformer import frameworks
from jaxformer.checkpoints.hf import bart, bert, gpt2, marian
from jaxformer.checkpoints.hf.engine import (
    Architecture,
    CheckpointError,
    Family,
    Rule,
    UnsupportedConfigError,
    map_checkpoint,
    require,
    to_hf_state_dict,
)
from jaxformer.checkpoints.hf.files import (
    CONFIG,
    SAFETENSORS,
    float_numpy,
    read_checkpoint,
    read_config,
    write_directory,
)

__all__ = ["ARCHITECTURES", "FAMILIES", "Architecture", "CheckpointError", "Family", "Rule",
           "UnsupportedConfigError", "config_from_hf", "config_to_hf", "export_architecture",
           "from_pretrained",
           "key_table", "read_checkpoint", "save_pretrained"]

# the one place a family is registered
FAMILIES: tuple[Family, ...] = (bert.FAMILY, gpt2.FAMILY, marian.FAMILY, bart.FAMILY)
ARCHITECTURES: dict[str, Architecture] = {a.name: a for f in FAMILIES for a in f.architectures()}


def _architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise UnsupportedConfigError(f"architecture {name!r} is not supported; jaxformer loads "
                                     f"{', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def key_table(architecture: str, config, *, pooler: bool = True) -> list[tuple[Rule, bool]]:
    """The rules of ``architecture`` for ``config``: ``(rule, is_base_model_rule)`` pairs.

    Base-model rules have ``hf`` relative to the base model and ``ours`` relative to our base
    model; the architecture's prefixes place them. Head rules are absolute. ``pooler=False``:
    the table of a ``BertModel`` built without a pooler.
    """
    arch = _architecture(architecture)
    return arch.family.key_table(arch, config, {} if pooler else {"add_pooler": False})


def config_from_hf(hf: dict, architecture: str, *, source: str = CONFIG):
    """Our config for a Hugging Face ``config.json`` (as a dict) and architecture.

    Raises :class:`CheckpointError` for a missing or malformed field and
    :class:`UnsupportedConfigError` for any field that would change the computation in a way
    jaxformer does not implement; errors start with ``source`` (the file's path when loading).
    Dropout rates jaxformer cannot set separately only warn: they matter in training, not for the
    outputs.
    """
    arch = _architecture(architecture)
    family = arch.family
    model_type = hf.get("model_type", family.model_type)
    if model_type != family.model_type:
        raise UnsupportedConfigError(f"{source}: model_type={model_type!r}, but {arch.name} "
                                     f"needs model_type={family.model_type!r}")
    require(hf, "add_cross_attention", (False, None), False, "no cross-attention layers", source)
    return family.config_from_hf(hf, arch, source)


def config_to_hf(config, architecture: str) -> dict:
    """The Hugging Face ``config.json`` dict for our config; refuses what Hugging Face lacks."""
    arch = _architecture(architecture)
    common = {"architectures": [arch.name], "model_type": arch.family.model_type,
              "initializer_range": config.initializer_range,
              "tie_word_embeddings": config.tie_word_embeddings, "dtype": "float32"}
    if hasattr(config, "vocab_size"):  # BERT and GPT-2 (the encoder-decoder has two sizes)
        common.update(vocab_size=config.vocab_size, add_cross_attention=False)
    return {**common, **arch.family.config_to_hf(config, arch)}


def _pick_architecture(hf: dict, architecture: str | None, source: Path) -> Architecture:
    if architecture is not None:
        return _architecture(architecture)
    names = hf.get("architectures") or []
    names = names if isinstance(names, list) else [names]
    if len(names) != 1:
        raise UnsupportedConfigError(f"{source} names {len(names)} architectures {names}; pass "
                                     f"architecture= (one of {', '.join(ARCHITECTURES)})")
    return _architecture(names[0])


def _our_class(arch: Architecture, framework: str):
    if framework not in ("jax", "torch"):
        raise ValueError(f"framework must be 'jax' or 'torch', got {framework!r}")
    return getattr(frameworks.module(framework, f"models.{arch.family.module}"), arch.cls)


def _build(cls, config, framework: str, options: dict):
    if framework == "torch":
        return cls(config, **options)
    from flax import nnx

    from jaxformer.checkpoints.convert import abstract_model

    return abstract_model(lambda: cls(config, **options, rngs=nnx.Rngs(0)))


def _expected_shapes(model) -> dict[str, tuple[int, ...]]:
    """Our torch-style key -> shape, for a jaxformer or torch_ref model."""
    if hasattr(model, "state_dict"):
        return {k: tuple(v.shape) for k, v in model.state_dict().items()}
    from jaxformer.checkpoints.convert import torch_shapes

    return torch_shapes(model)


def from_pretrained(path: str | os.PathLike, framework: str = "jax", *,
                    architecture: str | None = None):
    """Load a local Hugging Face model directory into jaxformer (``framework="jax"``) or its
    ``torch_ref`` twin (``framework="torch"``), in eval mode.

    ``architecture`` overrides ``config.json``'s ``architectures`` (e.g. ``"BertModel"`` to load
    only the encoder of a ``BertForPreTraining`` checkpoint: the heads are dropped with a
    warning). Raises ``FileNotFoundError`` (no config or weights), :class:`CheckpointError`
    (unreadable file, missing config field, keys, shapes or values that do not fit) or
    :class:`UnsupportedConfigError`.
    """
    directory = Path(path)
    hf_config = read_config(directory)
    source = directory / CONFIG
    arch = _pick_architecture(hf_config, architecture, source)
    config = config_from_hf(hf_config, arch.name, source=str(source))
    cls = _our_class(arch, framework)
    state = read_checkpoint(directory)
    options = arch.family.options_from_checkpoint(arch, set(state))
    model = _build(cls, config, framework, options)
    ours, dropped = map_checkpoint(state, arch, config, _expected_shapes(model), options)
    if dropped:
        warnings.warn(f"{arch.name} does not use {len(dropped)} checkpoint tensor(s), dropped: "
                      f"{', '.join(dropped)}", stacklevel=2)
    if framework == "jax":
        from jaxformer.checkpoints import convert
        convert.torch_to_nnx(ours, model)
    else:
        import torch
        model.load_state_dict({k: torch.from_numpy(v) for k, v in ours.items()}, strict=True)
    model.eval()
    return model


def _export_architecture(model) -> Architecture:
    cls = type(model)
    for family in FAMILIES:
        modules = tuple(f"{package}.models.{family.module}"
                        for package in frameworks.PACKAGES.values())
        if (cls.__module__ in modules and cls.__name__ in family.exports
                and family.exports_config(model.config)):
            return ARCHITECTURES[family.exports[cls.__name__]]
    exportable = sorted({name for family in FAMILIES for name in family.exports})
    raise UnsupportedConfigError(f"cannot export {cls.__module__}.{cls.__name__}; "
                                 f"save_pretrained exports {', '.join(exportable)}")


def export_architecture(module: str, class_name: str, config) -> str:
    """The Hugging Face architecture ``save_pretrained`` would write for our class
    ``jaxformer.models.<module>.<class_name>`` built from ``config``; raises
    :class:`UnsupportedConfigError` (the reason) when it would refuse. ``train --export-hf``
    asks before training."""
    for family in FAMILIES:
        if (family.module == module and class_name in family.exports
                and family.exports_config(config)):
            name = family.exports[class_name]
            config_to_hf(config, name)  # raises what the export would
            return name
    raise UnsupportedConfigError(f"cannot export jaxformer.models.{module}.{class_name}")


# Token ids a model's config.json may carry (transformers reads them as defaults of generate);
# a jaxformer config holds none of them, so an export writes only those it is given.
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
                 "forced_bos_token_id", "forced_eos_token_id")


def _our_state_dict(model) -> dict[str, np.ndarray]:
    if hasattr(model, "state_dict"):  # torch_ref
        return {k: float_numpy(v) for k, v in model.state_dict().items()}
    from jaxformer.checkpoints import convert
    return convert.nnx_to_torch(model)


def save_pretrained(model, path: str | os.PathLike, *, overwrite: bool = False,
                    extra_files: Mapping[str, bytes] | None = None,
                    token_ids: Mapping[str, int | None] | None = None,
                    label_names: list[str] | None = None) -> Path:
    """Write ``model`` (jaxformer or torch_ref) as a Hugging Face directory: ``config.json``
    (with ``architectures``) and ``model.safetensors`` (float32, tied weights stored once).

    ``token_ids`` sets :data:`TOKEN_ID_KEYS` of ``config.json`` (the tokenizer's;
    ``tokenizer.export_token_ids`` derives them; an encoder-decoder's ``decoder_start_token_id``
    too): without an ``eos_token_id`` Hugging Face's ``generate`` never stops before
    ``max_new_tokens``. A None
    value leaves the config's own. ``label_names``: a classifier's class names in id order
    (``id2label`` and ``label2id``; default ``LABEL_i``).

    Written into a temporary directory beside ``path`` and renamed into place, so an error leaves
    nothing half-written. A non-empty existing ``path`` is refused unless ``overwrite=True``, which
    replaces the directory as a whole (files such as a tokenizer are not kept); an existing
    directory's permission bits are kept. ``extra_files`` (name -> bytes, e.g. a tokenizer)
    are written into the same directory, in the same atomic step. Returns the path.
    """
    import json

    from safetensors.numpy import save_file

    arch = _export_architecture(model)
    config = model.config
    options = arch.family.options_of(model)
    hf_config = config_to_hf(config, arch.name)
    for key, value in (token_ids or {}).items():
        if key not in TOKEN_ID_KEYS:
            raise ValueError(f"token_ids: unknown key {key!r}; one of {TOKEN_ID_KEYS}")
        if value is not None:
            vocab = getattr(config, "tgt_vocab_size", getattr(config, "vocab_size", None))
            if not isinstance(value, int) or (vocab is not None and not 0 <= value < vocab):
                raise ValueError(f"token_ids: {key}={value!r} is not an id of the model's "
                                 f"vocabulary of {vocab}")
            hf_config[key] = value
    if label_names is not None:
        if "id2label" not in hf_config or len(label_names) != len(hf_config["id2label"]) or \
                len(set(label_names)) != len(label_names):
            raise ValueError(f"label_names: {len(label_names)} distinct names are for a "
                             f"classifier of as many labels; this {arch.name} has "
                             f"{len(hf_config.get('id2label', {}))}")
        hf_config["id2label"] = {str(i): name for i, name in enumerate(label_names)}
        hf_config["label2id"] = {name: i for i, name in enumerate(label_names)}
    state = to_hf_state_dict(_our_state_dict(model), arch, config, options)

    def write(directory: Path) -> None:
        (directory / CONFIG).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        save_file(state, directory / SAFETENSORS, metadata={"format": "pt"})
        for name, data in (extra_files or {}).items():
            (directory / name).write_bytes(data)

    return write_directory(Path(path), write, overwrite=overwrite)
