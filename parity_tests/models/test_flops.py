"""FLOP and parameter counts (jaxformer/models/flops.py) against the programs themselves.

Three views of the forward FLOPs:

- the formula (matrix products only, 2 FLOPs per multiply-add);
- every ``dot_general`` in the jaxpr of the jitted forward, counted the same way: must equal the
  formula exactly, for every family and the switches that change the products (heads, tying,
  sharing, masked positions). This is the test with teeth: a missing pooler (0.05% of BERT's
  FLOPs) fails it;
- XLA's own count of the compiled forward (``cost_analysis()["flops"]``): at least the formula
  (XLA runs every product) and at most a margin more, the element-wise work the formula leaves
  out, measured below.

Parameter counts must equal the real number of parameters of the jaxformer model and of its
torch_ref twin (tied matrices once).
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import torch_ref.models.bert as tbert
import torch_ref.models.encoder_decoder as ted
import torch_ref.models.gpt as tgpt
from jaxformer.config import BertConfig, GPTConfig, TransformerConfig
from jaxformer.models import bert as jbert
from jaxformer.models import encoder_decoder as jed
from jaxformer.models import flops
from jaxformer.models import gpt as jgpt
from parity_tests.support.jaxprs import equations

B, T, TT, P = 2, 16, 12, 5  # batch, (source) length, target length, masked positions

BERT_TINY = BertConfig.tiny()
GPT_TINY = GPTConfig.tiny()
TRANSFORMER_TINY = TransformerConfig.tiny()


def _abstract(cls, config):
    """The model with shapes only: counting needs no weights, and skips their initialisation."""
    return nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))


def _forward(family: str, config, model_name: str | None = None, seq: int = T,
             tgt: int | None = TT):
    """(abstract jaxformer model in eval mode, positional inputs, formula FLOPs)."""
    ids = jnp.ones((B, seq), jnp.int32)
    if family == "bert":
        name = model_name or "BertModel"
        model = _abstract(getattr(jbert, name), config)
        args = (ids, jnp.zeros_like(ids), ids)
        masked = None
        if name in ("BertForMaskedLM", "BertForPreTraining"):
            masked = P
            args += (jnp.tile(jnp.arange(P, dtype=jnp.int32), (B, 1)),)
        expected = flops.forward_flops(config, B, seq, model=name, masked_positions=masked)
    elif family == "gpt":
        model = _abstract(jgpt.GPT, config)
        args, expected = (ids, ids), flops.forward_flops(config, B, seq)
    else:
        model = _abstract(jed.Transformer, config)
        tgt_ids = jnp.ones((B, tgt), jnp.int32)
        args = (ids, tgt_ids, ids, tgt_ids)
        expected = flops.forward_flops(config, B, seq, tgt)
    model.eval()
    return model, args, expected


def _pure(model):
    graphdef, state = nnx.split(model)
    return (lambda state, *args: nnx.merge(graphdef, state)(*args)), state


def _dot_flops(jaxpr) -> int:
    """2 x (output elements) x (contracted size), summed over every dot_general, nested
    jaxprs (jit, custom_jvp, ...) included."""
    total = 0
    for eqn in equations(jaxpr):
        if eqn.primitive.name == "dot_general":
            (lhs_contracting, _), _ = eqn.params["dimension_numbers"]
            lhs_shape = eqn.invars[0].aval.shape
            total += (2 * math.prod(eqn.outvars[0].aval.shape)
                      * math.prod(lhs_shape[d] for d in lhs_contracting))
    return total


R = dataclasses.replace
FORWARD_CASES = {
    "bert": ("bert", BERT_TINY, None),
    "bert-masked-lm": ("bert", BERT_TINY, "BertForMaskedLM"),
    "bert-pretraining-untied": ("bert", R(BERT_TINY, tie_word_embeddings=False),
                                "BertForPreTraining"),
    "bert-classifier": ("bert", BERT_TINY, "BertForSequenceClassification"),
    "gpt": ("gpt", GPT_TINY, None),
    "gpt-untied": ("gpt", R(GPT_TINY, tie_word_embeddings=False), None),
    "transformer": ("transformer", TRANSFORMER_TINY, None),
    "transformer-shared-tied": ("transformer", R(TRANSFORMER_TINY, tgt_vocab_size=23,
                                                 share_embeddings=True,
                                                 tie_word_embeddings=True), None),
}


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_formula_equals_the_products_in_the_program(case):
    family, config, model_name = FORWARD_CASES[case]
    model, args, expected = _forward(family, config, model_name)
    fn, state = _pure(model)
    counted = _dot_flops(jax.make_jaxpr(fn)(state, *args).jaxpr)
    assert counted == expected, f"{case}: jaxpr products {counted:,} != formula {expected:,}"


# XLA's count beyond the matrix products, as a fraction of the formula, measured with jax 0.10.2
# on CPU. Tiny presets (B=2, T=16, target 12): BERT +55.1%, GPT +10.4%, Transformer +28.2%. At
# hidden size 32 the element-wise work is of the order of the products: per token and layer two
# LayerNorms (~8 FLOPs per element each), softmax over every score (~5 each, 4 heads of size 8),
# and the activation on the 37 feed-forward units; exact GELU (BERT) is an erf polynomial that
# XLA counts at ~70 FLOPs per element, GPT-2's tanh GELU a transcendental (counted apart) plus a
# few FLOPs, ReLU one. Widened (C=256, I=1024, two heads, T=128, target 64: products dominate, as
# on the real presets, and the attention products are 7% of the total) the remainder falls to
# +4.6%, +1.0% and +0.7%. Bounds: the measurement plus 5 points (tiny) or 1.5 points (wide), so
# that dropping the attention products (or doubling a term of that size) fails the wide cases.
WIDE = dict(hidden_size=256, intermediate_size=1024, num_heads=2, max_position_embeddings=128)
XLA_CASES = {  # family, config, (source) length, target length, margin
    "bert-tiny": ("bert", BERT_TINY, T, None, 0.60),
    "gpt-tiny": ("gpt", GPT_TINY, T, None, 0.15),
    "transformer-tiny": ("transformer", TRANSFORMER_TINY, T, TT, 0.33),
    "bert-wide": ("bert", R(BERT_TINY, vocab_size=512, **WIDE), 128, None, 0.061),
    "gpt-wide": ("gpt", R(GPT_TINY, vocab_size=512, **WIDE), 128, None, 0.025),
    "transformer-wide": ("transformer", R(TRANSFORMER_TINY, src_vocab_size=512,
                                          tgt_vocab_size=384, **WIDE), 128, 64, 0.022),
}


@pytest.mark.parametrize("case", XLA_CASES)
def test_formula_against_xla_cost_analysis(case):
    family, config, seq, tgt, margin = XLA_CASES[case]
    model, args, expected = _forward(family, config, seq=seq, tgt=tgt)
    fn, state = _pure(model)
    cost = jax.jit(fn).lower(state, *args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # older jax: a list
    xla = float(cost["flops"])
    assert expected <= xla <= (1 + margin) * expected, (
        f"{case}: XLA counts {xla:,.0f} FLOPs, formula {expected:,} "
        f"(XLA/formula - 1 = {xla / expected - 1:+.3f}, allowed [0, {margin}])")


def test_formulas_reproduce_the_recorded_benchmark_counts():
    """The formulas moved here from benchmarks/bench_forward.py: same counts as its results."""
    path = (Path(__file__).resolve().parents[2] / "benchmarks" / "results"
            / "cpu-amd-epyc-2c_float32_2026-11-22.json")
    recorded = json.loads(path.read_text())["results"]
    presets = {"bert": BertConfig.base(), "gpt2": GPTConfig.gpt2(),
               "transformer": TransformerConfig.base()}
    for name, config in presets.items():
        r = recorded[name]
        assert flops.forward_flops(config, r["batch"], r["seq"], r.get("tgt_seq")) == \
            r["model_flop"], name


PARAMETER_CASES = {
    "bert": (jbert.BertModel, tbert.BertModel, BERT_TINY),
    "bert-masked-lm": (jbert.BertForMaskedLM, tbert.BertForMaskedLM, BERT_TINY),
    "bert-pretraining": (jbert.BertForPreTraining, tbert.BertForPreTraining, BERT_TINY),
    "bert-pretraining-d2l": (jbert.BertForPreTraining, tbert.BertForPreTraining,
                             R(BERT_TINY, embedding_layer_norm=False, tie_word_embeddings=False)),
    "bert-classifier": (jbert.BertForSequenceClassification,
                        tbert.BertForSequenceClassification, R(BERT_TINY, num_labels=3)),
    "gpt2": (jgpt.GPT, tgpt.GPT, GPT_TINY),
    "gpt-seed-004": (jgpt.GPT, tgpt.GPT, R(GPT_TINY, pre_norm=False, embedding_layer_norm=True,
                                           final_layer_norm=False, tie_word_embeddings=False)),
    "transformer": (jed.Transformer, ted.Transformer, TRANSFORMER_TINY),
    "transformer-shared-tied": (jed.Transformer, ted.Transformer,
                                R(TRANSFORMER_TINY, tgt_vocab_size=23, share_embeddings=True,
                                  tie_word_embeddings=True)),
    "transformer-learned-final-norm": (jed.Transformer, ted.Transformer,
                                       R(TRANSFORMER_TINY, position_embedding_type="learned",
                                         final_layer_norm=True)),
}


@pytest.mark.parametrize("case", PARAMETER_CASES)
def test_parameter_count_equals_both_models(case):
    jax_cls, torch_cls, config = PARAMETER_CASES[case]
    options = {"model": jax_cls.__name__} if isinstance(config, BertConfig) else {}
    expected = flops.parameter_count(config, **options)
    abstract = _abstract(jax_cls, config)
    in_jax = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    in_torch = sum(p.numel() for p in torch_cls(config).parameters())  # shared ones once
    assert (in_jax, in_torch) == (expected, expected), case


def test_train_step_and_mfu():
    config = GPTConfig.gpt2()
    forward = flops.forward_flops(config, 8, 256)
    assert flops.train_step_flops(config, 8, 256) == 3 * forward
    # nanoGPT's estimate (6 N per token + 12 L C T for attention, N without the position table)
    # agrees: it differs only by counting biases and LayerNorm parameters as matmul weights.
    n = flops.parameter_count(config) - config.max_position_embeddings * config.hidden_size
    rule = 8 * 256 * (6 * n + 6 * 2 * config.num_layers * config.hidden_size * 256)
    assert flops.train_step_flops(config, 8, 256) == pytest.approx(rule, rel=0.02)
    assert flops.mfu(5e12, 1e13) == 0.5
    with pytest.raises(ValueError, match="peak must be a positive FLOP/s"):
        flops.mfu(1.0, 0.0)


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="tgt_len"):
        flops.forward_flops(TRANSFORMER_TINY, B, T)
    with pytest.raises(ValueError, match="tgt_len"):
        flops.forward_flops(GPT_TINY, B, T, TT)
    with pytest.raises(ValueError, match="BertForNothing"):
        flops.forward_flops(BERT_TINY, B, T, model="BertForNothing")
    with pytest.raises(TypeError):
        flops.parameter_count(object())


def test_no_framework_import():
    """flops.py imports neither JAX nor torch (torch_ref and a training loop use it)."""
    code = ("import sys, jaxformer.models.flops; "
            "print(sorted(m for m in ('jax', 'flax', 'torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
