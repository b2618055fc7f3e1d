"""LayerNorm where epsilon matters, in both frameworks, against a float64 numpy formula.

At ordinary activations (variance ~1) an epsilon of 1e-12, 1e-6 or 1e-5 changes the output by
at most ~1e-5 relative: a wrong epsilon then hides inside a 1e-5 parity bound (issue 12 found one
passing at 1.01x the bound). Here the inputs have variance ~1e-12, the size of BERT's epsilon, so
``(x - mean) / sqrt(var + eps)`` depends on eps at first order and the wrong value fails by five
orders of magnitude. Every LayerNorm of every family is run this way, with its config's eps.

Measured (``.venv/bin/python`` on this file's inputs, seeds 0-4, CPU, float32 vs float64), as
max |got - ref| / max |ref|, zero-mean rows, std 1e-6, bias 0:

    eps 1e-12: jax 0.75e-7 .. 1.22e-7, torch 0.85e-7 .. 1.27e-7
    eps 1e-5:  jax 0.54e-7 .. 1.35e-7, torch 0.51e-7 .. 0.92e-7

i.e. a few float32 roundings (2^-23 = 1.2e-7). The bound is 1e-6 (about 8x the largest). The
nearest wrong eps (2x, 1/2x, or another framework's default among 1e-12, 1e-6, 1e-5) moves the
float64 formula itself by >= 1.4e-1 (eps 1e-12) and >= 2.9e-1 (eps 1e-5): margins of 1.4e5 and
2.9e5 over the bound. Each test re-checks that margin for its own inputs (a test with no teeth
fails too).

A second case puts the rows at mean 1e-3 (std 1e-6, eps 1e-12): the one-pass variance
E[x^2] - E[x]^2 (flax's ``use_fast_variance=True``) cancels catastrophically there, error ~6e-2,
while the two-pass variance both twins use errs by 5e-5 .. 9.5e-5 (float32 rounding of the
mean, ulp(3e-2)/32 against deviations of 1e-6). Bound 5e-4 (about 5x the largest), so the
one-pass form fails by ~100x.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer.config import BertConfig, GPTConfig, TransformerConfig
from jaxformer.models import bert as jb
from jaxformer.models import encoder_decoder as jed
from jaxformer.models import gpt as jg
from jaxformer.nn.params import layer_norm as jax_layer_norm
from parity_tests.support.helpers import twin_pair
from torch_ref.models import bert as tb
from torch_ref.models import encoder_decoder as ted
from torch_ref.models import gpt as tg
from torch_ref.nn.params import layer_norm as torch_layer_norm

C = 32
ROWS = 64
EPS_BOUND = 1e-6  # relative to max |ref|, zero-mean rows (see the module docstring)
OFFSET_BOUND = 5e-4  # relative to max(1, max |ref|), rows at mean 1e-3
MARGIN = 1e4  # a wrong eps must miss the bound by at least this factor (measured: >= 1.4e5)
DEFAULT_EPS = (1e-12, 1e-6, 1e-5)  # BERT; NNX's default; torch's and GPT-2's


def reference(x, eps, scale, bias) -> np.ndarray:
    """LayerNorm in float64: biased variance, two passes, as the papers and both twins define."""
    x = np.asarray(x, np.float64)
    centred = x - x.mean(-1, keepdims=True)
    var = (centred**2).mean(-1, keepdims=True)
    return centred / np.sqrt(var + eps) * np.asarray(scale, np.float64) + bias


def low_variance_rows(seed: int, offset: float = 0.0) -> np.ndarray:
    """``(ROWS, C)`` float32 rows of std 1e-6 around ``offset``; the last row is constant
    (variance 0: only eps keeps the division finite, and the output is the bias)."""
    rng = np.random.RandomState(seed)
    x = offset + 1e-6 * rng.randn(ROWS, C)
    x[-1] = offset + 1e-6
    return x.astype(np.float32)


def run(norm, x) -> np.ndarray:
    if isinstance(norm, torch.nn.Module):
        with torch.no_grad():
            return norm(torch.from_numpy(x)).numpy()
    return np.asarray(norm(jnp.asarray(x)))


def params(norm):
    """(eps, scale, bias) of either framework's LayerNorm, as numpy."""
    if isinstance(norm, torch.nn.Module):
        return norm.eps, norm.weight.detach().numpy(), norm.bias.detach().numpy()
    return norm.epsilon, np.asarray(norm.scale[...]), np.asarray(norm.bias[...])


def rel_err(ref, got, scale) -> float:
    return float(np.abs(np.asarray(got, np.float64) - ref).max()) / scale


def check_eps_dominated(norm, eps: float, seed: int) -> None:
    """``norm`` (either framework) against the formula at variance ~eps, with teeth."""
    x = low_variance_rows(seed)
    _, scale, bias = params(norm)
    assert not bias.any(), "give a zero bias: float32 cannot add it to ~1e-4 without rounding"
    ref = reference(x, eps, scale, 0.0)
    got = run(norm, x)
    denominator = float(np.abs(ref).max())
    err = rel_err(ref, got, denominator)
    assert err <= EPS_BOUND, f"eps={eps}: relative error {err:.3g} > {EPS_BOUND:g}"
    for wrong in {eps * 2, eps / 2, *DEFAULT_EPS} - {eps}:
        wrong_err = rel_err(ref, reference(x, wrong, scale, 0.0), denominator)
        assert wrong_err >= MARGIN * EPS_BOUND, (
            f"the test has no teeth: eps={wrong:g} instead of {eps:g} moves the output by only "
            f"{wrong_err:.3g}")


def set_params(norm, scale, bias):
    if isinstance(norm, torch.nn.Module):
        with torch.no_grad():
            norm.weight.copy_(torch.from_numpy(scale))
            norm.bias.copy_(torch.from_numpy(bias))
    else:
        norm.scale[...] = jnp.asarray(scale)
        norm.bias[...] = jnp.asarray(bias)
    return norm


def make_norm(framework: str, eps: float):
    config = dataclasses.replace(BertConfig.tiny(), layer_norm_eps=eps)
    if framework == "torch":
        return torch_layer_norm(config)
    return jax_layer_norm(config, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("eps", [1e-12, 1e-5])
@pytest.mark.parametrize("seed", [0, 1])
def test_factory_layer_norm_where_eps_dominates(framework, eps, seed):
    # Bias 0: at eps 1e-5 the normalised part is ~3e-4, and float32 cannot hold 0.3 + 3e-4 z
    # to better than 1.5e-5 of it. The bias is exercised by the offset test below.
    scale = (1 + 0.3 * np.random.RandomState(100 + seed).randn(C)).astype(np.float32)
    norm = set_params(make_norm(framework, eps), scale, np.zeros(C, np.float32))
    assert params(norm)[0] == eps
    check_eps_dominated(norm, eps, seed)


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_two_pass_variance_at_an_offset(framework):
    """Rows at mean 1e-3, std 1e-6, eps 1e-12: the one-pass variance fails here by ~100x."""
    rng = np.random.RandomState(7)
    scale = (1 + 0.3 * rng.randn(C)).astype(np.float32)
    bias = (0.3 * rng.randn(C)).astype(np.float32)
    norm = set_params(make_norm(framework, 1e-12), scale, bias)
    x = low_variance_rows(3, offset=1e-3)
    ref = reference(x, 1e-12, scale, bias)
    err = rel_err(ref, run(norm, x), max(1.0, float(np.abs(ref).max())))
    assert err <= OFFSET_BOUND, f"relative error {err:.3g} > {OFFSET_BOUND:g}"


FAMILIES = {
    "bert": (tb.BertForPreTraining, jb.BertForPreTraining, BertConfig.tiny()),  # eps 1e-12
    "bert_eps_1e-5": (tb.BertForPreTraining, jb.BertForPreTraining,
                      dataclasses.replace(BertConfig.tiny(), layer_norm_eps=1e-5)),
    "gpt": (tg.GPT, jg.GPT, GPTConfig.tiny()),  # eps 1e-5, final LayerNorm
    "simple_gpt": (tg.GPT, jg.GPT, dataclasses.replace(  # embedding LayerNorm, post-LN
        GPTConfig.simple_gpt(), vocab_size=101, hidden_size=C, num_layers=1, num_heads=4,
        intermediate_size=37, max_position_embeddings=64, layer_norm_eps=1e-12)),
    "encoder_decoder": (ted.Transformer, jed.Transformer, dataclasses.replace(
        TransformerConfig.tiny(), final_layer_norm=True, layer_norm_eps=1e-12)),
}


def layer_norms(model) -> dict[str, object]:
    """Every LayerNorm in ``model``, by path."""
    if isinstance(model, torch.nn.Module):
        return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)}
    return {".".join(map(str, path)): m for path, m in nnx.iter_graph(model)
            if isinstance(m, nnx.LayerNorm)}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_layer_norm_of_every_model_uses_its_config_eps(family):
    """Each LayerNorm a model builds (embedding, blocks, final, MLM head...) normalises with the
    config's eps, in both frameworks: a hard-coded or default eps anywhere fails here."""
    torch_cls, jax_cls, config = FAMILIES[family]
    torch_model, jax_model = twin_pair(torch_cls, jax_cls, config)
    norms = {"torch": layer_norms(torch_model), "jax": layer_norms(jax_model)}
    assert norms["torch"].keys() == norms["jax"].keys()
    assert norms["jax"]
    for framework, by_path in norms.items():
        for seed, (path, norm) in enumerate(sorted(by_path.items())):
            try:
                check_eps_dominated(norm, config.layer_norm_eps, seed)
            except AssertionError as error:
                raise AssertionError(f"{framework} {path}: {error}") from None
