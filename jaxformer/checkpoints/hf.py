"""Hugging Face checkpoints in and out: BERT (four architectures) and GPT-2 (two).

``from_pretrained(directory)`` reads a local Hugging Face model directory (``config.json`` plus
``model.safetensors``, a sharded ``model.safetensors.index.json`` or ``pytorch_model.bin``),
builds the matching jaxformer model (or its ``torch_ref`` twin) and loads the weights.
``save_pretrained(model, directory)`` writes a directory that ``transformers`` loads into the
matching class with the same outputs.

The mapping is a key table per architecture, tunix-style: each :class:`Rule` maps a checkpoint
key pattern to our torch-style key(s) (``jaxformer.checkpoints.convert`` then applies its four leaf rules)
plus a named transform. Loading is strict:

- every checkpoint key is matched by exactly one rule or explicitly ignored (buffers such as
  ``embeddings.position_ids`` and GPT-2's ``attn.bias`` / ``attn.masked_bias`` causal masks;
  heads an architecture does not use, which are reported with a warning);
- every model key is filled exactly once; a second source is allowed only for a tied weight
  (``cls.predictions.decoder.weight`` and ``.decoder.bias`` of a tied MLM head, GPT-2's
  ``lm_head.weight``), and must then be equal to the first;
- every shape is checked against the model built from ``config.json``.

Anything else raises :class:`CheckpointError` listing every missing, unexpected, mis-shaped or
disagreeing key, and nothing is loaded. Config fields that change the computation in a way
jaxformer does not implement raise :class:`UnsupportedConfigError`.

Decisions:

- A ``BertModel`` checkpoint saved without ``pooler.*`` weights (all or nothing) gives a
  ``BertModel`` built with ``add_pooler=False``, whose pooled output is None: the sequence output
  is all such a checkpoint defines, and inventing a random pooler would be silent nonsense.
- ``GPT2Model`` and ``GPT2LMHeadModel`` both give ``jaxformer.models.gpt.GPT`` (tied head for
  ``GPT2Model``): ``GPT.hidden_states`` is ``GPT2Model``'s output, ``GPT(...)`` the LM logits.
  Export always writes ``GPT2LMHeadModel``.
- Base-model keys are accepted with or without the ``bert.`` / ``transformer.`` prefix (the
  original ``gpt2`` checkpoint has none), but never both for the same weight.
- Old spellings ``LayerNorm.gamma`` / ``LayerNorm.beta`` (``bert-base-uncased``) are accepted.
- Weights are loaded as float32 whatever the checkpoint dtype; export writes float32.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import uuid
import warnings
from pathlib import Path

import numpy as np

from jaxformer.config import BertConfig, GPTConfig

__all__ = ["ARCHITECTURES", "CheckpointError", "Rule", "UnsupportedConfigError",
           "config_from_hf", "config_to_hf", "from_pretrained", "key_table", "read_checkpoint",
           "save_pretrained"]

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
CONFIG = "config.json"


class CheckpointError(ValueError):
    """The checkpoint cannot be read or does not fit the model; nothing was loaded."""


class UnsupportedConfigError(ValueError):
    """``config.json`` asks for something jaxformer does not implement."""


# ---------------------------------------------------------------------------------------------
# Transforms: Hugging Face layout -> ours, and back. Ours is torch's (Linear weight [out, in]).
# GPT-2 stores its projections as Conv1D, weight [in, out], and fuses q, k, v into c_attn.
# ---------------------------------------------------------------------------------------------

def _split3(x):
    return tuple(np.split(x, 3, axis=-1))


TRANSFORMS = {  # name -> (hf -> ours (tuple of arrays), ours -> hf (one array))
    "copy": (lambda x: (x,), lambda x: x),
    "conv1d": (lambda x: (x.T,), lambda x: x.T),
    "split_qkv": (_split3, lambda *xs: np.concatenate(xs, axis=-1)),
    "conv1d_split_qkv": (lambda x: tuple(p.T for p in _split3(x)),
                         lambda *xs: np.concatenate([p.T for p in xs], axis=-1)),
}


@dataclasses.dataclass(frozen=True)
class Rule:
    """One line of a key table.

    ``hf``: the checkpoint key, relative to the base model for base-model rules; ``{i}`` stands
    for a layer index. ``aliases``: other spellings accepted on import. ``ours``: our torch-style
    key(s), same ``{i}``. ``role``:

    - ``"weight"``: loaded, and written on export;
    - ``"tied"``: a duplicate of a weight another rule fills (tied weights): it must equal that
      weight when both are present, and is not written on export (transformers re-ties it);
    - ``"unused"``: a parameter transformers keeps but its forward never reads (the untied MLM
      head's ``cls.predictions.bias``): ignored on import, written on export (a copy of ``ours``)
      so that transformers finds every key it expects.
    """

    hf: str
    ours: str | tuple[str, ...]
    transform: str = "copy"
    aliases: tuple[str, ...] = ()
    role: str = "weight"

    @property
    def tied(self) -> bool:
        return self.role == "tied"

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.ours,) if isinstance(self.ours, str) else self.ours


def _linear(hf: str, ours: str, transform: str = "copy") -> list[Rule]:
    return [Rule(f"{hf}.weight", f"{ours}.weight", transform), Rule(f"{hf}.bias", f"{ours}.bias")]


def _layer_norm(hf: str, ours: str) -> list[Rule]:
    return [Rule(f"{hf}.weight", f"{ours}.weight", aliases=(f"{hf}.gamma",)),
            Rule(f"{hf}.bias", f"{ours}.bias", aliases=(f"{hf}.beta",))]


def _bert_base_rules(pooler: bool) -> list[Rule]:
    L, O = "encoder.layer.{i}", "encoder.layers.{i}"  # noqa: E741
    rules = [
        Rule("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
        Rule("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
        Rule("embeddings.token_type_embeddings.weight",
             "embeddings.token_type_embeddings.weight"),
        *_layer_norm("embeddings.LayerNorm", "embeddings.layer_norm"),
        *_linear(f"{L}.attention.self.query", f"{O}.attention.query"),
        *_linear(f"{L}.attention.self.key", f"{O}.attention.key"),
        *_linear(f"{L}.attention.self.value", f"{O}.attention.value"),
        *_linear(f"{L}.attention.output.dense", f"{O}.attention.output"),
        *_layer_norm(f"{L}.attention.output.LayerNorm", f"{O}.attention_norm"),
        *_linear(f"{L}.intermediate.dense", f"{O}.feed_forward.fc1"),
        *_linear(f"{L}.output.dense", f"{O}.feed_forward.fc2"),
        *_layer_norm(f"{L}.output.LayerNorm", f"{O}.ffn_norm"),
    ]
    return rules + (_linear("pooler.dense", "pooler.dense") if pooler else [])


def _bert_mlm_rules(config: BertConfig) -> list[Rule]:
    head = [*_linear("cls.predictions.transform.dense", "mlm.dense"),
            *_layer_norm("cls.predictions.transform.LayerNorm", "mlm.layer_norm")]
    if config.tie_word_embeddings:  # decoder.weight is the word embedding, decoder.bias the bias
        return head + [
            Rule("cls.predictions.bias", "mlm.bias"),
            Rule("cls.predictions.decoder.bias", "mlm.bias", role="tied"),
            Rule("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight",
                 role="tied")]
    # Untied, transformers 5 unties the bias too: its forward adds decoder.bias and never reads
    # cls.predictions.bias (transformers 4 kept them one tensor, so either reading is right).
    return head + [Rule("cls.predictions.decoder.weight", "mlm.decoder.weight"),
                   Rule("cls.predictions.decoder.bias", "mlm.bias"),
                   Rule("cls.predictions.bias", "mlm.bias", role="unused")]


def _gpt2_base_rules() -> list[Rule]:
    H, B = "h.{i}", "blocks.{i}"
    attn = tuple(f"{B}.attention.{p}" for p in ("query", "key", "value"))
    return [
        Rule("wte.weight", "embeddings.word_embeddings.weight"),
        Rule("wpe.weight", "embeddings.position_embeddings.weight"),
        *_layer_norm(f"{H}.ln_1", f"{B}.attention_norm"),
        Rule(f"{H}.attn.c_attn.weight", tuple(f"{a}.weight" for a in attn), "conv1d_split_qkv"),
        Rule(f"{H}.attn.c_attn.bias", tuple(f"{a}.bias" for a in attn), "split_qkv"),
        *_linear(f"{H}.attn.c_proj", f"{B}.attention.output", "conv1d"),
        *_layer_norm(f"{H}.ln_2", f"{B}.ffn_norm"),
        *_linear(f"{H}.mlp.c_fc", f"{B}.feed_forward.fc1", "conv1d"),
        *_linear(f"{H}.mlp.c_proj", f"{B}.feed_forward.fc2", "conv1d"),
        *_layer_norm("ln_f", "final_layer_norm"),
    ]


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A Hugging Face class and the jaxformer class that reproduces it."""

    name: str  # Hugging Face class name, as in config.json's "architectures"
    family: str  # "bert" or "gpt2": the model_type
    module: str  # jaxformer.<module> / torch_ref.<module>
    cls: str  # our class name there
    hf_prefix: str  # where this Hugging Face class keeps its base model's keys
    our_prefix: str  # where our class keeps its base model
    ignored: tuple[str, ...] = ()  # regexes for unused head weights: dropped with a warning


_BERT_BASE_HEADS = (r"cls\..*", r"classifier\..*")
ARCHITECTURES = {a.name: a for a in (
    Architecture("BertModel", "bert", "bert", "BertModel", "", "", _BERT_BASE_HEADS),
    Architecture("BertForPreTraining", "bert", "bert", "BertForPreTraining", "bert.", "bert."),
    Architecture("BertForMaskedLM", "bert", "bert", "BertForMaskedLM", "bert.", "bert.",
                 (r"(bert\.)?pooler\..*", r"cls\.seq_relationship\..*")),
    Architecture("BertForSequenceClassification", "bert", "bert",
                 "BertForSequenceClassification", "bert.", "bert."),
    Architecture("GPT2Model", "gpt2", "gpt", "GPT", "", ""),
    Architecture("GPT2LMHeadModel", "gpt2", "gpt", "GPT", "transformer.", ""),
)}
BASE_PREFIX = {"bert": "bert.", "gpt2": "transformer."}  # accepted, optional, on import
# Buffers that real checkpoints carry and that are not weights (matched after the base prefix).
BUFFERS = {"bert": (r"embeddings\.position_ids", r"embeddings\.token_type_ids"),
           "gpt2": (r"h\.\d+\.attn\.bias", r"h\.\d+\.attn\.masked_bias")}


def key_table(architecture: str, config, *, pooler: bool = True) -> list[tuple[Rule, bool]]:
    """The rules of ``architecture`` for ``config``: ``(rule, is_base_model_rule)`` pairs.

    Base-model rules have ``hf`` relative to the base model and ``ours`` relative to our base
    model; the architecture's prefixes place them. Head rules are absolute.
    """
    arch = _architecture(architecture)
    if arch.family == "bert":
        base = _bert_base_rules(pooler and arch.name != "BertForMaskedLM")
        heads = {"BertModel": [],
                 "BertForPreTraining": [*_bert_mlm_rules(config),
                                        *_linear("cls.seq_relationship", "nsp.classifier")],
                 "BertForMaskedLM": _bert_mlm_rules(config),
                 "BertForSequenceClassification": _linear("classifier", "classifier")}[arch.name]
    else:
        base = _gpt2_base_rules()
        tied = config.tie_word_embeddings or arch.name == "GPT2Model"
        heads = [Rule("lm_head.weight", "embeddings.word_embeddings.weight", role="tied") if tied
                 else Rule("lm_head.weight", "lm_head.weight")]
    return [(r, True) for r in base] + [(r, False) for r in heads]


def _architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise UnsupportedConfigError(f"architecture {name!r} is not supported; jaxformer loads "
                                     f"{', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def _template_regex(template: str) -> str:
    return re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)")


# ---------------------------------------------------------------------------------------------
# config.json <-> our configs
# ---------------------------------------------------------------------------------------------

HF_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh",
                  "gelu_pytorch_tanh": "gelu_tanh", "gelu_python_tanh": "gelu_tanh",
                  "relu": "relu"}
OUR_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


def _activation(hf: dict, field: str, default: str) -> str:
    name = hf.get(field, default)
    if name not in HF_ACTIVATIONS:
        raise UnsupportedConfigError(f"config.json: {field}={name!r} is not supported; jaxformer "
                                     f"implements {', '.join(sorted(HF_ACTIVATIONS))}")
    return HF_ACTIVATIONS[name]


def _require(hf: dict, field: str, allowed, default, why: str) -> None:
    value = hf.get(field, default)
    if value not in allowed:
        raise UnsupportedConfigError(f"config.json: {field}={value!r} is not supported ({why})")


def _num_labels(hf: dict) -> int:
    if hf.get("id2label"):
        return len(hf["id2label"])
    return int(hf.get("num_labels", 2))


def config_from_hf(hf: dict, architecture: str) -> BertConfig | GPTConfig:
    """Our config for a Hugging Face ``config.json`` (as a dict) and architecture.

    Raises :class:`UnsupportedConfigError` for any field that would change the computation in a
    way jaxformer does not implement. Dropout rates jaxformer cannot set separately only warn:
    they matter in training, not for the outputs.
    """
    arch = _architecture(architecture)
    model_type = hf.get("model_type", arch.family)
    if model_type != arch.family:
        raise UnsupportedConfigError(f"config.json: model_type={model_type!r}, but {arch.name} "
                                     f"needs model_type={arch.family!r}")
    _require(hf, "add_cross_attention", (False, None), False, "no cross-attention layers")
    if arch.family == "bert":
        _require(hf, "position_embedding_type", ("absolute",), "absolute",
                 "jaxformer's BERT has learned absolute positions only")
        _require(hf, "is_decoder", (False, None), False, "jaxformer's BERT is an encoder")
        dropout = hf.get("hidden_dropout_prob", 0.1)
        if hf.get("classifier_dropout") not in (None, dropout):
            warnings.warn(f"config.json: classifier_dropout={hf['classifier_dropout']} is not "
                          f"implemented; the classifier uses hidden_dropout_prob={dropout} "
                          f"(training only: outputs in eval mode are unaffected)", stacklevel=3)
        return BertConfig(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
            intermediate_size=hf["intermediate_size"],
            max_position_embeddings=hf["max_position_embeddings"],
            type_vocab_size=hf.get("type_vocab_size", 2),
            activation=_activation(hf, "hidden_act", "gelu"),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12), dropout_rate=dropout,
            attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
            tie_word_embeddings=hf.get("tie_word_embeddings", True),
            num_labels=_num_labels(hf), pad_token_id=hf.get("pad_token_id") or 0,
            initializer_range=hf.get("initializer_range", 0.02))
    _require(hf, "scale_attn_weights", (True,), True,
             "jaxformer always scales attention scores by 1/sqrt(head_dim)")
    _require(hf, "scale_attn_by_inverse_layer_idx", (False,), False,
             "jaxformer does not scale attention by 1/layer_idx")
    dropout = hf.get("resid_pdrop", 0.1)
    if hf.get("embd_pdrop", dropout) != dropout:
        warnings.warn(f"config.json: embd_pdrop={hf['embd_pdrop']} differs from resid_pdrop="
                      f"{dropout}; jaxformer uses {dropout} for both (training only)",
                      stacklevel=3)
    n_embd = hf.get("n_embd", 768)
    return GPTConfig(
        vocab_size=hf.get("vocab_size", 50257), hidden_size=n_embd,
        num_layers=hf.get("n_layer", 12), num_heads=hf.get("n_head", 12),
        intermediate_size=hf.get("n_inner") or 4 * n_embd,
        max_position_embeddings=hf.get("n_positions", 1024),
        activation=_activation(hf, "activation_function", "gelu_new"),
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5), dropout_rate=dropout,
        attention_dropout_rate=hf.get("attn_pdrop", 0.1),
        pre_norm=True, embedding_layer_norm=False, final_layer_norm=True,
        tie_word_embeddings=(hf.get("tie_word_embeddings", True)
                             or arch.name == "GPT2Model"),
        initializer_range=hf.get("initializer_range", 0.02))


def _refuse_export(config, field: str, want, what: str) -> None:
    if getattr(config, field) != want:
        raise UnsupportedConfigError(f"cannot export as {what}: it needs {field}={want!r}, the "
                                     f"model has {getattr(config, field)!r}")


def config_to_hf(config: BertConfig | GPTConfig, architecture: str) -> dict:
    """The Hugging Face ``config.json`` dict for our config; refuses what Hugging Face lacks."""
    arch = _architecture(architecture)
    common = {"architectures": [arch.name], "model_type": arch.family,
              "vocab_size": config.vocab_size, "initializer_range": config.initializer_range,
              "tie_word_embeddings": config.tie_word_embeddings, "add_cross_attention": False,
              "dtype": "float32"}
    if arch.family == "bert":
        _refuse_export(config, "pre_norm", False, "Hugging Face BERT")
        _refuse_export(config, "embedding_layer_norm", True, "Hugging Face BERT")
        hf = {**common, "hidden_size": config.hidden_size,
              "num_hidden_layers": config.num_layers,
              "num_attention_heads": config.num_heads,
              "intermediate_size": config.intermediate_size,
              "hidden_act": OUR_ACTIVATIONS[config.activation],
              "hidden_dropout_prob": config.dropout_rate,
              "attention_probs_dropout_prob": config.attention_dropout_rate,
              "max_position_embeddings": config.max_position_embeddings,
              "type_vocab_size": config.type_vocab_size, "layer_norm_eps": config.layer_norm_eps,
              "pad_token_id": config.pad_token_id, "position_embedding_type": "absolute",
              "is_decoder": False, "classifier_dropout": None}
        if arch.name == "BertForSequenceClassification":
            hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(config.num_labels)}
            hf["label2id"] = {f"LABEL_{i}": i for i in range(config.num_labels)}
        return hf
    for field, want in (("pre_norm", True), ("embedding_layer_norm", False),
                        ("final_layer_norm", True)):
        _refuse_export(config, field, want, "GPT-2")
    return {**common, "n_embd": config.hidden_size, "n_layer": config.num_layers,
            "n_head": config.num_heads, "n_inner": config.intermediate_size,
            "n_positions": config.max_position_embeddings,
            "activation_function": OUR_ACTIVATIONS[config.activation],
            "resid_pdrop": config.dropout_rate, "embd_pdrop": config.dropout_rate,
            "attn_pdrop": config.attention_dropout_rate,
            "layer_norm_epsilon": config.layer_norm_eps, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "bos_token_id": None, "eos_token_id": None}


# ---------------------------------------------------------------------------------------------
# Reading checkpoint files
# ---------------------------------------------------------------------------------------------

def _float_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # torch.Tensor
        value = value.detach().cpu()
        if value.is_floating_point():
            value = value.float()
        value = value.numpy()
    value = np.asarray(value)
    return value.astype(np.float32) if np.issubdtype(value.dtype, np.floating) else value


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError

    try:
        try:
            from safetensors.numpy import load_file
            tensors = load_file(path)
        except TypeError:  # bfloat16, which numpy lacks: read through torch
            from safetensors.torch import load_file
            tensors = load_file(path)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"cannot read {path}: {e} (is the file truncated or "
                              f"corrupted?)") from e
    return {k: _float_numpy(v) for k, v in tensors.items()}


def _read_pytorch_bin(path: Path) -> dict[str, np.ndarray]:
    import pickle
    import zipfile

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"cannot read {path}: {e} (is the file truncated or corrupted? "
                              f"only plain tensors are accepted: weights_only=True)") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state_dict")
    return {k: _float_numpy(v) for k, v in state.items()}


def read_checkpoint(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint in ``directory`` as numpy (floats as float32).

    Looks for ``model.safetensors``, then ``model.safetensors.index.json`` (shards), then
    ``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``).
    """
    directory = Path(directory)
    if (directory / SAFETENSORS).is_file():
        return _read_safetensors(directory / SAFETENSORS)
    if (directory / SAFETENSORS_INDEX).is_file():
        try:
            weight_map = json.loads((directory / SAFETENSORS_INDEX).read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{directory / SAFETENSORS_INDEX} is not a valid shard index: "
                                  f"{e}") from e
        state = {}
        for shard in sorted(set(weight_map.values())):
            if not (directory / shard).is_file():
                raise CheckpointError(f"shard {shard} listed in {SAFETENSORS_INDEX} is missing")
            state.update(_read_safetensors(directory / shard))
        if set(state) != set(weight_map):
            raise CheckpointError(f"the shards in {directory} do not hold exactly the keys "
                                  f"their index lists")
        return state
    if (directory / PYTORCH_BIN).is_file():
        return _read_pytorch_bin(directory / PYTORCH_BIN)
    raise FileNotFoundError(f"no weights in {directory}: expected {SAFETENSORS}, "
                            f"{SAFETENSORS_INDEX} or {PYTORCH_BIN}")


def _read_config(directory: Path) -> dict:
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory")
    path = directory / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG} in {directory}: not a Hugging Face model "
                                f"directory")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e


def _pick_architecture(hf: dict, architecture: str | None) -> str:
    if architecture is not None:
        return _architecture(architecture).name
    names = hf.get("architectures") or []
    if len(names) != 1:
        raise UnsupportedConfigError(f"config.json names {len(names)} architectures {names}; "
                                     f"pass architecture= (one of {', '.join(ARCHITECTURES)})")
    return _architecture(names[0]).name


# ---------------------------------------------------------------------------------------------
# The key table at work
# ---------------------------------------------------------------------------------------------

def _map_checkpoint(state: dict[str, np.ndarray], arch: Architecture, config,
                    expected: dict[str, tuple[int, ...]], pooler: bool) -> dict[str, np.ndarray]:
    """Checkpoint -> our torch-style state_dict, checking every key and shape (see module doc)."""
    base = re.escape(BASE_PREFIX[arch.family])
    table = []  # (compiled regex, rule, our prefix)
    for rule, is_base in key_table(arch.name, config, pooler=pooler):
        for spelling in (rule.hf, *rule.aliases):
            pattern = (f"(?:{base})?" if is_base else "") + _template_regex(spelling)
            table.append((re.compile(pattern), rule, arch.our_prefix if is_base else ""))
    buffers = [re.compile(f"(?:{base})?{b}") for b in BUFFERS[arch.family]]
    unused = [re.compile(p) for p in arch.ignored]

    sources: dict[str, list[tuple[str, bool, np.ndarray]]] = {}  # our key -> (ckpt key, tied, v)
    unexpected, misshaped, dropped = [], [], []
    claimed = set()  # model keys some checkpoint key maps to, well shaped or not
    for key in sorted(state):
        hits = [(m, rule, prefix) for regex, rule, prefix in table
                if (m := regex.fullmatch(key))]
        if len(hits) > 1:  # a bug in the table, never in the checkpoint
            raise AssertionError(f"key table for {arch.name} matches {key!r} more than once")
        if not hits:
            if any(b.fullmatch(key) for b in buffers):
                continue
            if any(u.fullmatch(key) for u in unused):
                dropped.append(key)
                continue
            unexpected.append(key)
            continue
        match, rule, prefix = hits[0]
        if rule.role == "unused":
            continue
        i = match.groupdict().get("i")
        targets = [prefix + t.format(i=i) for t in rule.targets]
        if any(t not in expected for t in targets):  # e.g. a layer beyond num_layers
            unexpected.append(key)
            continue
        claimed.update(targets)
        forward, inverse = TRANSFORMS[rule.transform]
        want = inverse(*(np.broadcast_to(np.float32(0), expected[t]) for t in targets)).shape
        if state[key].shape != want:
            misshaped.append(f"{key}: {tuple(state[key].shape)} in the checkpoint, the model "
                             f"expects {tuple(want)}")
            continue
        for target, value in zip(targets, forward(state[key])):
            sources.setdefault(target, []).append((key, rule.tied, value))

    duplicated, differing = [], []
    out = {}
    for target, given in sources.items():
        if sum(not tied for _, tied, _ in given) > 1:
            duplicated.append(f"{target} <- " + " and ".join(k for k, _, _ in given))
            continue
        first_key, _, first = given[0]
        for key, _, value in given[1:]:
            if not np.array_equal(first, value):
                differing.append(f"{key} differs from {first_key}, but they are tied")
        out[target] = np.ascontiguousarray(first)
    missing = sorted(expected.keys() - claimed)
    problems = [("missing model keys", missing), ("unexpected checkpoint keys", unexpected),
                ("mis-shaped keys", misshaped), ("keys filled more than once", duplicated),
                ("tied weights that differ", differing)]
    if any(items for _, items in problems):
        lines = [f"checkpoint does not match {arch.name} built from its config.json; nothing was "
                 f"loaded."]
        for title, items in problems:
            if items:
                shown = items if len(items) <= 20 else items[:20] + [f"... {len(items) - 20} more"]
                lines.append(f"  {title} ({len(items)}): " + ", ".join(shown))
        if differing:
            lines.append("  (a tied weight that differs means tie_word_embeddings should be "
                         "false in config.json)")
        raise CheckpointError("\n".join(lines))
    if dropped:
        warnings.warn(f"{arch.name} does not use {len(dropped)} checkpoint tensor(s), dropped: "
                      f"{', '.join(dropped)}", stacklevel=3)
    return out


def _build(arch: Architecture, config, framework: str, pooler: bool):
    import importlib

    if framework not in ("jax", "torch"):
        raise ValueError(f"framework must be 'jax' or 'torch', got {framework!r}")
    package = "jaxformer" if framework == "jax" else "torch_ref"
    cls = getattr(importlib.import_module(f"{package}.models.{arch.module}"), arch.cls)
    kwargs = {} if pooler else {"add_pooler": False}
    if framework == "torch":
        return cls(config, **kwargs)
    from flax import nnx

    from jaxformer.checkpoints.convert import abstract_model

    return abstract_model(lambda: cls(config, **kwargs, rngs=nnx.Rngs(0)))


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
    (unreadable file, keys or shapes that do not fit) or :class:`UnsupportedConfigError`.
    """
    directory = Path(path)
    hf_config = _read_config(directory)
    arch = ARCHITECTURES[_pick_architecture(hf_config, architecture)]
    config = config_from_hf(hf_config, arch.name)
    state = read_checkpoint(directory)
    pooler = True
    if arch.name == "BertModel":  # saved without a pooler -> built without one (module doc)
        pooler = any(re.fullmatch(r"(bert\.)?pooler\..*", k) for k in state)
    model = _build(arch, config, framework, pooler)
    ours = _map_checkpoint(state, arch, config, _expected_shapes(model), pooler)
    if framework == "jax":
        from jaxformer.checkpoints import convert
        convert.torch_to_nnx(ours, model)
    else:
        import torch
        model.load_state_dict({k: torch.from_numpy(v) for k, v in ours.items()}, strict=True)
    model.eval()
    return model


# ---------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------

_EXPORT_NAMES = {"BertModel": "BertModel", "BertForPreTraining": "BertForPreTraining",
                 "BertForMaskedLM": "BertForMaskedLM",
                 "BertForSequenceClassification": "BertForSequenceClassification",
                 "GPT": "GPT2LMHeadModel"}


def _our_state_dict(model) -> dict[str, np.ndarray]:
    if hasattr(model, "state_dict"):  # torch_ref
        return {k: _float_numpy(v) for k, v in model.state_dict().items()}
    from jaxformer.checkpoints import convert
    return convert.nnx_to_torch(model)


def _to_hf_state_dict(ours: dict[str, np.ndarray], arch: Architecture, config,
                      pooler: bool) -> dict[str, np.ndarray]:
    out, used = {}, set()
    for rule, is_base in key_table(arch.name, config, pooler=pooler):
        if rule.role == "tied":
            continue
        hf_prefix, our_prefix = (arch.hf_prefix, arch.our_prefix) if is_base else ("", "")
        _, inverse = TRANSFORMS[rule.transform]
        for i in range(config.num_layers) if "{i}" in rule.hf else [None]:
            hf_key = hf_prefix + rule.hf.format(i=i)
            targets = [our_prefix + t.format(i=i) for t in rule.targets]
            out[hf_key] = np.ascontiguousarray(inverse(*(ours[t] for t in targets)),
                                               dtype=np.float32)
            used.update(targets)
    if used != set(ours):  # the table must cover the model: a bug here, not the user's
        raise AssertionError(f"key table for {arch.name} leaves {sorted(set(ours) - used)}")
    return out


def save_pretrained(model, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write ``model`` (jaxformer or torch_ref) as a Hugging Face directory: ``config.json``
    (with ``architectures``) and ``model.safetensors`` (float32, tied weights stored once).

    Written into a temporary directory beside ``path`` and renamed into place, so an error leaves
    nothing half-written. A non-empty existing ``path`` is refused unless ``overwrite=True``, which
    replaces the directory as a whole (files such as a tokenizer are not kept). Returns the path.
    """
    from safetensors.numpy import save_file

    name = type(model).__name__
    if name not in _EXPORT_NAMES or not type(model).__module__.startswith(("jaxformer.",
                                                                           "torch_ref.")):
        raise UnsupportedConfigError(f"cannot export {type(model).__module__}.{name}; "
                                     f"save_pretrained exports {', '.join(_EXPORT_NAMES)}")
    arch = ARCHITECTURES[_EXPORT_NAMES[name]]
    config = model.config
    pooler = getattr(model, "pooler", True) is not None
    hf_config = config_to_hf(config, arch.name)
    state = _to_hf_state_dict(_our_state_dict(model), arch, config, pooler)

    target = Path(path)
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty; pass overwrite=True to "
                              f"replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:12]
    tmp = target.parent / f".{target.name}.tmp-{tag}"  # mkdir, not mkdtemp: keep the umask
    old = target.parent / f".{target.name}.old-{tag}"
    tmp.mkdir()
    moved = False
    try:
        (tmp / CONFIG).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        save_file(state, tmp / SAFETENSORS, metadata={"format": "pt"})
        if target.exists():
            os.replace(target, old)
            moved = True
        os.replace(tmp, target)
    except BaseException:
        if moved and not target.exists():
            os.replace(old, target)  # put the previous directory back
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if moved:
        shutil.rmtree(old, ignore_errors=True)
    return target
