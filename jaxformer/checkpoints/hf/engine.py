"""The key-map engine of Hugging Face import and export; it knows no model family.

A family (`jaxformer/checkpoints/hf/bert.py`, `jaxformer/checkpoints/hf/gpt2.py`) is a
:class:`Family`: a key table of :class:`Rule`, its architectures, its ``config.json`` mapping.
:func:`map_checkpoint` maps checkpoint tensors onto our torch-style state_dict strictly;
:func:`to_hf_state_dict` is the inverse, for export. Files are read and written by ``files.py``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

import numpy as np

from jaxformer.checkpoints.checks import (
    NON_FINITE,
    NON_FLOATING,
    VALUE_HINT,
    weight_problems,
)


class CheckpointError(ValueError):
    """The checkpoint (weights or ``config.json``) cannot be read or does not fit the model;
    nothing was loaded."""


class UnsupportedConfigError(ValueError):
    """``config.json`` asks for something jaxformer does not implement."""


# ---------------------------------------------------------------------------------------------
# Rules and transforms: Hugging Face layout -> ours, and back. Ours is torch's (Linear weight
# [out, in]); GPT-2 stores its projections as Conv1D, weight [in, out], with q, k, v fused.
# ---------------------------------------------------------------------------------------------

def _split3(x):
    return tuple(np.split(x, 3, axis=-1))


TRANSFORMS = {  # name -> (hf -> ours (tuple of arrays), ours -> hf (one array))
    "copy": (lambda x: (x,), lambda x: x),
    "conv1d": (lambda x: (x.T,), lambda x: x.T),
    "split_qkv": (_split3, lambda *xs: np.concatenate(xs, axis=-1)),
    "conv1d_split_qkv": (lambda x: tuple(p.T for p in _split3(x)),
                         lambda *xs: np.concatenate([p.T for p in xs], axis=-1)),
    # Marian's and BART's final_logits_bias is a (1, vocab) buffer; ours a (vocab,) bias
    "row": (lambda x: (x.reshape(x.shape[1:]),), lambda x: x[None]),
}


@dataclasses.dataclass(frozen=True)
class Rule:
    """One line of a key table.

    ``hf``: the checkpoint key, relative to the base model for base-model rules; ``{i}`` stands
    for a layer index, counted by the config field ``layers`` (the encoder-decoder's two stacks:
    ``num_encoder_layers``, ``num_decoder_layers``). ``aliases``: other spellings accepted on
    import. ``ours``: our torch-style key(s), same ``{i}``. ``role``:

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
    layers: str = "num_layers"

    @property
    def tied(self) -> bool:
        return self.role == "tied"

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.ours,) if isinstance(self.ours, str) else self.ours


def linear(hf: str, ours: str, transform: str = "copy") -> list[Rule]:
    return [Rule(f"{hf}.weight", f"{ours}.weight", transform), Rule(f"{hf}.bias", f"{ours}.bias")]


def layer_norm(hf: str, ours: str) -> list[Rule]:
    """A LayerNorm, also under the old spellings ``gamma`` / ``beta`` (bert-base-uncased)."""
    return [Rule(f"{hf}.weight", f"{ours}.weight", aliases=(f"{hf}.gamma",)),
            Rule(f"{hf}.bias", f"{ours}.bias", aliases=(f"{hf}.beta",))]


# ---------------------------------------------------------------------------------------------
# Families and architectures: what a family file declares
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Architecture:
    """A Hugging Face class and the jaxformer class that reproduces it."""

    name: str  # Hugging Face class name, as in config.json's "architectures"
    family: Family
    cls: str  # our class in jaxformer.models.<family.module> and torch_ref.models.<...>
    hf_prefix: str  # where this Hugging Face class keeps its base model's keys
    our_prefix: str  # where our class keeps its base model
    ignored: tuple[str, ...] = ()  # regexes for unused head weights: dropped with a warning


Options = dict  # keyword arguments of our model class beyond the config (e.g. add_pooler)


class Family:
    """One Hugging Face ``model_type``: subclass it in one file and register it in
    ``__init__.FAMILIES``. The engine calls only these hooks."""

    model_type: str  # config.json's "model_type"
    module: str  # jaxformer.models.<module> / torch_ref.models.<module>
    base_prefix: str  # where task models keep the base model; optional on import
    buffers: tuple[str, ...] = ()  # regexes (after base_prefix) of non-weights to ignore
    # our class name -> the Hugging Face architecture it is exported as
    exports: ClassVar[dict[str, str]] = {}

    def exports_config(self, config) -> bool:
        """Whether this family is the one to export a model of ``config`` (two families can
        export one class: the encoder-decoder goes to MarianMT or BART by its positions)."""
        return True

    def architectures(self) -> tuple[Architecture, ...]:
        raise NotImplementedError

    def config_from_hf(self, hf: dict, arch: Architecture, source: str):
        """Our config for ``config.json`` (``hf``, read from ``source``)."""
        raise NotImplementedError

    def config_to_hf(self, config, arch: Architecture) -> dict:
        raise NotImplementedError

    def key_table(self, arch: Architecture, config, options: Options) -> list[tuple[Rule, bool]]:
        """``(rule, is_base_model_rule)`` pairs; base-model rules are placed by the
        architecture's prefixes, head rules are absolute."""
        raise NotImplementedError

    def options_from_checkpoint(self, arch: Architecture, keys: set[str]) -> Options:
        """How to build our class for a checkpoint with these keys."""
        return {}

    def options_of(self, model) -> Options:
        """How ``model`` (ours, to export) was built."""
        return {}


# ---------------------------------------------------------------------------------------------
# config.json helpers a family uses
# ---------------------------------------------------------------------------------------------

HF_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh",
                  "gelu_pytorch_tanh": "gelu_tanh", "gelu_python_tanh": "gelu_tanh",
                  "relu": "relu", "swish": "silu", "silu": "silu"}
OUR_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "swish"}


def required_int(hf: dict, field: str, source: str) -> int:
    """A field that sets a weight shape: never guessed, so a missing one is named."""
    if field not in hf:
        raise CheckpointError(f"{source}: required field {field!r} is missing")
    value = hf[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{source}: {field} must be an integer, got "
                              f"{type(value).__name__} {value!r}")
    return value


def activation(hf: dict, field: str, default: str, source: str) -> str:
    name = hf.get(field, default)
    if name not in HF_ACTIVATIONS:
        raise UnsupportedConfigError(f"{source}: {field}={name!r} is not supported; jaxformer "
                                     f"implements {', '.join(sorted(HF_ACTIVATIONS))}")
    return HF_ACTIVATIONS[name]


def require(hf: dict, field: str, allowed, default, why: str, source: str) -> None:
    value = hf.get(field, default)
    if value not in allowed:
        raise UnsupportedConfigError(f"{source}: {field}={value!r} is not supported ({why})")


def build_config(cls, source: str, **fields):
    """``cls(**fields)``, its validation errors named after ``source``."""
    try:
        return cls(**fields)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: {e}") from e


def refuse_export(config, field: str, want, what: str) -> None:
    if getattr(config, field) != want:
        raise UnsupportedConfigError(f"cannot export as {what}: it needs {field}={want!r}, the "
                                     f"model has {getattr(config, field)!r}")


# ---------------------------------------------------------------------------------------------
# The key table at work
# ---------------------------------------------------------------------------------------------

def _template_regex(template: str) -> str:
    return re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)")


def _shown(items: list[str], limit: int = 20) -> str:
    return ", ".join(items if len(items) <= limit else
                     items[:limit] + [f"... {len(items) - limit} more"])


def map_checkpoint(state: dict[str, np.ndarray], arch: Architecture, config,
                   expected: dict[str, tuple[int, ...]],
                   options: Options) -> tuple[dict[str, np.ndarray], list[str]]:
    """Checkpoint -> our torch-style state_dict, and the head keys ``arch`` drops (to warn of).

    ``expected``: our key -> shape for the model to fill. Raises :class:`CheckpointError` listing
    every missing, unexpected, mis-shaped, non-floating, non-finite, duplicated or disagreeing
    key.
    """
    family = arch.family
    base = re.escape(family.base_prefix)
    table = []  # (compiled regex, rule, our prefix)
    for rule, is_base in family.key_table(arch, config, options):
        for spelling in (rule.hf, *rule.aliases):
            pattern = (f"(?:{base})?" if is_base else "") + _template_regex(spelling)
            table.append((re.compile(pattern), rule, arch.our_prefix if is_base else ""))
    buffers = [re.compile(f"(?:{base})?{b}") for b in family.buffers]
    unused = [re.compile(p) for p in arch.ignored]

    sources: dict[str, list[tuple[str, bool, np.ndarray]]] = {}  # our key -> (ckpt key, tied, v)
    unexpected: list[str] = []
    misshaped: list[str] = []
    dropped: list[str] = []
    non_floating: list[str] = []
    non_finite: list[str] = []
    claimed = set()  # model keys some checkpoint key maps to, whatever its shape or values
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
            else:
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
        dtype_problem, finite_problem = weight_problems(key, state[key])
        if dtype_problem or finite_problem:
            if dtype_problem:
                non_floating.append(dtype_problem)
            elif finite_problem:
                non_finite.append(finite_problem)
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
                ("mis-shaped keys", misshaped),
                (NON_FLOATING, non_floating), (NON_FINITE, non_finite),
                ("keys filled more than once", duplicated), ("tied weights that differ", differing)]
    if any(items for _, items in problems):
        head = f"checkpoint does not match {arch.name} built from its config.json; nothing was"
        lines = [head + " loaded."]
        lines += [f"  {title} ({len(items)}): {_shown(items)}" for title, items in problems
                  if items]
        if non_floating or non_finite:
            lines.append(VALUE_HINT)
        if differing:
            lines.append("  (a tied weight that differs means tie_word_embeddings should be "
                         "false in config.json)")
        raise CheckpointError("\n".join(lines))
    return out, dropped


def to_hf_state_dict(ours: dict[str, np.ndarray], arch: Architecture, config,
                     options: Options) -> dict[str, np.ndarray]:
    """Our torch-style state_dict -> the Hugging Face one ``arch`` loads (float32)."""
    out, used = {}, set()
    for rule, is_base in arch.family.key_table(arch, config, options):
        if rule.tied:
            continue
        hf_prefix, our_prefix = (arch.hf_prefix, arch.our_prefix) if is_base else ("", "")
        _, inverse = TRANSFORMS[rule.transform]
        for i in range(getattr(config, rule.layers)) if "{i}" in rule.hf else [None]:
            targets = [our_prefix + t.format(i=i) for t in rule.targets]
            out[hf_prefix + rule.hf.format(i=i)] = np.ascontiguousarray(
                inverse(*(ours[t] for t in targets)), dtype=np.float32)
            used.update(targets)
    if used != set(ours):  # the table must cover the model: a bug here, not the user's
        raise AssertionError(f"key table for {arch.name} leaves {sorted(set(ours) - used)}")
    return out
