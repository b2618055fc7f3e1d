"""Every table lookup with a bad index, in each of the ways a model can be called (issue 12,
items 2 to 4).

Under ``jax.jit`` the ids are tracers and cannot be checked; JAX's own gathers would then wrap a
negative id to a row counted from the end (a plausible vector) or clamp/fill the rest. The
design (DESIGN.md, "Masks and numerics") asks that every lookup that still sees a bad index
under ``jit`` give NaN in the rows it affects, never a valid-looking value. So, per lookup:

- under ``jit`` (ids as arguments): the affected rows are NaN, every other batch row equals the
  clean run (the bad id is contained, the rest is not disturbed);
- eagerly: both frameworks raise a ``ValueError`` naming the argument before computing;
- ``jitted(model, checked=True)``: raises inside the compiled call, naming the table (its shape);
- a concrete array captured by closure inside ``jit``: valid ids work (this used to raise
  ``ConcretizationTypeError``), invalid ones raise the eager ``ValueError``;
- attention masks holding anything but 0/1 or booleans are refused with one message for every
  family and both frameworks.
"""

from __future__ import annotations

import dataclasses
import re

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.experimental import checkify

from jaxformer.config import BertConfig, GPTConfig, TransformerConfig
from jaxformer.models import bert as jb
from jaxformer.models import encoder_decoder as jed
from jaxformer.models import gpt as jg
from jaxformer.nn.jit import jitted
from parity_tests.support.helpers import JIT_TOL, max_rel_diff, twin_pair
from torch_ref.models import bert as tb
from torch_ref.models import encoder_decoder as ted
from torch_ref.models import gpt as tg

# One layer each: what is tested here is the lookups and the checks at the boundary, and XLA
# compile time grows with depth (this file compiles 3 models, 3 checkified models, 3 closures).
BERT = dataclasses.replace(BertConfig.tiny(), num_layers=1)  # vocab 99, 3 segment types
GPT = dataclasses.replace(GPTConfig.tiny(), num_layers=1)  # vocab 101, 64 positions
ED = dataclasses.replace(TransformerConfig.tiny(), num_encoder_layers=1,
                         num_decoder_layers=1)  # source vocab 23, target vocab 29
# The shapes test_bert.py (B, T) and test_encoder_decoder.py (B, S, T) use, so that eager calls
# reuse their compiled primitives when the whole suite runs. GPT runs at (B, T) too.
B, T, S = 3, 7, 8
ROW = 1  # the bad id always sits in batch row 1; rows 0 and 2 must stay clean


def ids(vocab: int, shape, seed: int = 0) -> np.ndarray:
    """Random ids in [1, vocab): never the pad id, so no default mask hides a position."""
    return np.random.RandomState(seed).randint(1, vocab, shape).astype(np.int64)


# Built once: every test here only reads the models. torch init + conversion, no random NNX
# initialisers to compile.
@pytest.fixture(scope="module")
def models():
    pairs = {"bert": twin_pair(tb.BertForPreTraining, jb.BertForPreTraining, BERT),
             "gpt": twin_pair(tg.GPT, jg.GPT, GPT),
             "ed": twin_pair(ted.Transformer, jed.Transformer, ED)}
    return {name: {"torch": t, "jax": j, "jit": jitted(j)} for name, (t, j) in pairs.items()}


def clean_inputs():
    """One valid call per family: (family, {argument: array})."""
    return {
        "bert": {"input_ids": ids(BERT.vocab_size, (B, T)),
                 "token_type_ids": (np.arange(T)[None] >= np.array([[3], [4], [2]])).astype(int),
                 "attention_mask": np.ones((B, T), np.int64),
                 "masked_positions": np.array([[0, 2], [1, 5], [6, 3]])},
        "gpt": {"input_ids": ids(GPT.vocab_size, (B, T)),
                "attention_mask": np.ones((B, T), np.int64)},
        "ed": {"src_ids": ids(ED.src_vocab_size, (B, S), seed=1),
               "tgt_ids": ids(ED.tgt_vocab_size, (B, T), seed=2),
               "src_mask": np.ones((B, S), np.int64), "tgt_mask": np.ones((B, T), np.int64)},
    }


def call(model, framework: str, args: dict):
    if framework == "torch":
        with torch.no_grad():
            return model(**{k: torch.as_tensor(v) for k, v in args.items()})
    return model(**{k: jnp.asarray(v) for k, v in args.items()})


def outputs(out) -> list[np.ndarray]:
    """The model's outputs as float numpy arrays (BERT returns a tuple)."""
    out = out if isinstance(out, tuple) else (out,)
    return [np.asarray(o.detach() if isinstance(o, torch.Tensor) else o, np.float64)
            for o in out]


# (family, argument, bad index within that argument, limit, which outputs the bad index reaches)
# "row": every output position of batch row ROW; "from": positions >= the bad position of row
# ROW (causal decoders); "mlm": BERT's MLM logits at that masked position only.
LOOKUPS = [
    ("bert", "input_ids", (ROW, 2), BERT.vocab_size, "row"),
    ("bert", "token_type_ids", (ROW, 4), BERT.type_vocab_size, "row"),
    ("bert", "masked_positions", (ROW, 1), T, "mlm"),
    ("gpt", "input_ids", (ROW, 3), GPT.vocab_size, "from"),
    ("ed", "src_ids", (ROW, 2), ED.src_vocab_size, "row"),
    ("ed", "tgt_ids", (ROW, 3), ED.tgt_vocab_size, "from"),
]
LOOKUP_IDS = [f"{family}-{arg}" for family, arg, *_ in LOOKUPS]


def affected(reach: str, where, shapes) -> list[np.ndarray]:
    """Boolean masks (one per output) of the entries the bad index must turn into NaN."""
    masks = [np.zeros(shape, bool) for shape in shapes]
    for m in masks:
        if reach == "row":  # BERT: sequence output, every MLM logit and the NSP logits
            m[ROW] = True
        elif reach == "from":
            m[ROW, where[1]:] = True
    if reach == "mlm":
        masks[1][ROW, where[1]] = True  # (sequence, mlm, nsp): only that MLM row
    return masks


@pytest.mark.parametrize("bad_kind", ["negative", "-limit", "limit", "large"])
@pytest.mark.parametrize("lookup", LOOKUPS, ids=LOOKUP_IDS)
def test_out_of_range_lookup_under_jit_is_nan(models, lookup, bad_kind):
    family, arg, where, limit, reach = lookup
    bad_value = {"negative": -1, "-limit": -limit, "limit": limit, "large": 10 * limit}[bad_kind]
    args = clean_inputs()[family]
    bad_args = {k: v.copy() for k, v in args.items()}
    bad_args[arg][where] = bad_value
    jit = models[family]["jit"]
    clean, bad = outputs(call(jit, "jax", args)), outputs(call(jit, "jax", bad_args))
    assert all(np.isfinite(c).all() for c in clean)
    for c, b, hit in zip(clean, bad, affected(reach, where, [c.shape for c in clean])):
        # -1 used to read the last row of the table: a finite, valid-looking vector.
        assert np.isnan(b[hit]).all(), f"{arg}={bad_value}: an affected entry is not NaN"
        # Outside the affected entries nothing changes, except that NaN may spread through
        # attention to earlier positions of the same row; other batch rows must be untouched.
        spread = np.zeros_like(hit)
        if reach != "mlm":
            spread[ROW] = True
        untouched = ~(hit | spread)
        assert np.isfinite(b[untouched]).all()
        assert max_rel_diff(c[untouched], b[untouched]) <= JIT_TOL


def test_position_lookup_under_jit_is_nan(models):
    """GPT's position table: the model derives positions itself (always in range), but the
    embedding module takes them as an argument; a bad one must read NaN there too."""
    embeddings = models["gpt"]["jax"].embeddings
    positions = np.tile(np.arange(T), (B, 1))
    positions[ROW, 2], positions[2, 5] = -1, GPT.max_position_embeddings
    run = jitted(embeddings)
    out = np.asarray(run(jnp.asarray(clean_inputs()["gpt"]["input_ids"]), jnp.asarray(positions)))
    bad = (positions < 0) | (positions >= GPT.max_position_embeddings)
    assert np.isnan(out[bad]).all()
    assert np.isfinite(out[~bad]).all()


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("bad_kind", ["negative", "limit"])
@pytest.mark.parametrize("lookup", LOOKUPS, ids=LOOKUP_IDS)
def test_out_of_range_lookup_raises_eagerly(models, lookup, bad_kind, framework):
    family, arg, where, limit, _ = lookup
    bad_value = -1 if bad_kind == "negative" else limit
    args = clean_inputs()[family]
    args[arg][where] = bad_value
    message = rf"{arg} must lie in \[0, {limit}\); found {bad_value}"
    with pytest.raises(ValueError, match=message):
        call(models[family][framework], framework, args)


@pytest.fixture(scope="module")
def checked_models(models):
    return {family: jitted(m["jax"], checked=True) for family, m in models.items()}


@pytest.mark.parametrize("lookup", LOOKUPS, ids=LOOKUP_IDS)
def test_checked_mode_raises_inside_jit(models, checked_models, lookup):
    """``checked=True`` raises from the compiled call; the message names the table by shape
    (the table a negative id would have wrapped around in plain JAX)."""
    family, arg, where, limit, _ = lookup
    args = clean_inputs()[family]
    clean = outputs(call(checked_models[family], "jax", args))  # valid input: no error
    expected = outputs(call(models[family]["jit"], "jax", args))
    assert all(max_rel_diff(e, c) <= JIT_TOL for e, c in zip(expected, clean))
    table = {"masked_positions": (B, T, BERT.hidden_size)}.get(arg, (limit, 32))
    shape = re.escape(str(table))
    for bad_value in (-1, limit):
        args[arg][where] = bad_value
        with pytest.raises(checkify.JaxRuntimeError,
                           match=rf"out-of-bounds indexing for array of shape {shape}"):
            call(checked_models[family], "jax", args)


@pytest.mark.parametrize("family", ["bert", "gpt", "ed"])
def test_ids_captured_by_closure_inside_jit(models, family):
    """A concrete array closed over inside ``jit`` is read on the host: valid ids give the same
    result as passing them as arguments, invalid ones raise the eager ``ValueError``."""
    args = clean_inputs()[family]
    expected = outputs(call(models[family]["jit"], "jax", args))
    captured = {k: jnp.asarray(v) for k, v in args.items()}
    got = outputs(jitted(models[family]["jax"], fn=lambda m: m(**captured))())
    assert all(max_rel_diff(e, g) <= JIT_TOL for e, g in zip(expected, got))
    arg = next(a for f, a, *_ in LOOKUPS if f == family)
    bad = dict(captured)
    bad[arg] = captured[arg].at[ROW, 0].set(-1)
    with pytest.raises(ValueError, match=rf"{arg} must lie in \[0, \d+\); found -1"):
        jitted(models[family]["jax"], fn=lambda m: m(**bad))()


MASK_ARGS = [("bert", "attention_mask"), ("gpt", "attention_mask"), ("ed", "src_mask"),
             ("ed", "tgt_mask")]


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("value", [2, -1, 0.5])
@pytest.mark.parametrize(("family", "mask_arg"), MASK_ARGS)
def test_attention_mask_values_other_than_0_1_are_refused(models, family, mask_arg, value,
                                                          framework):
    args = clean_inputs()[family]
    mask = args[mask_arg].astype(type(value))
    mask[ROW, -1] = value
    args[mask_arg] = mask
    with pytest.raises(ValueError, match=re.escape(f"{mask_arg} must hold only 0/1")) as error:
        call(models[family][framework], framework, args)
    # One message for every family and both frameworks, up to the argument's name.
    assert str(error.value) == (f"{mask_arg} must hold only 0/1 (or booleans), 1 for a real "
                                f"token; found {value!r}")


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize(("family", "mask_arg"), MASK_ARGS)
def test_boolean_and_float_0_1_masks_are_accepted(models, family, mask_arg, framework):
    """The other side of the rule: booleans and 0.0/1.0 floats mean the same as the int mask."""
    args = clean_inputs()[family]
    args[mask_arg][ROW, -1] = 0
    expected = outputs(call(models[family][framework], framework, args))
    for dtype in (bool, np.float32):
        got = outputs(call(models[family][framework], framework,
                           {**args, mask_arg: args[mask_arg].astype(dtype)}))
        assert all(max_rel_diff(e, g) <= JIT_TOL for e, g in zip(expected, got))
