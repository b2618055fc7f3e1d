"""bfloat16 error against a float64 run of the torch twin, for jaxformer and torch autocast.

``OUTPUTS`` (each family's output names), ``torch_model``, ``run_torch`` (float64, float32 or
autocast), ``run_jax`` (a compute and parameter dtype), ``output_errors`` and ``grad_error``
serve ``models/test_autocast.py`` (the bounds) and ``benchmarks/bf16_error.py`` (the
measurements the bounds are set from).
"""

from __future__ import annotations

import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from jaxformer.checkpoints import convert
from jaxformer.training import losses as jax_losses
from parity_tests.support.bf16 import FAMILIES, as_tuple, inputs, loss, loss_labels
from parity_tests.support.helpers import max_rel_diff, randomize
from parity_tests.support.twins import SPREAD
from torch_ref.training import losses as torch_losses

OUTPUTS = {"bert": ("sequence", "mlm_logits", "nsp_logits"), "gpt": ("logits",),
           "encoder_decoder": ("logits",)}


def torch_model(family: str, seed: int) -> torch.nn.Module:
    torch_cls, _, config = FAMILIES[family]
    torch.manual_seed(seed)
    return randomize(torch_cls(config), seed, SPREAD).eval()


def run_torch(family: str, model: torch.nn.Module, mode: str):
    """``mode``: "float64", "float32" or "autocast" (float32 weights, bfloat16 autocast) ->
    (outputs, loss, {state_dict key: gradient}), numpy float64."""
    model = copy.deepcopy(model)
    if mode == "float64":
        model = model.double()
    args = inputs(family)
    tensors = {k: torch.from_numpy(v) for k, v in args.items()}
    labels = {k: torch.from_numpy(v) for k, v in loss_labels(family, args).items()}
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
        outputs = as_tuple(model(**tensors))
        value = loss(family, torch_losses, outputs, tensors, labels)
    value.backward()
    grads = {k: p.grad.double().numpy() for k, p in model.named_parameters()}
    return [o.detach().double().numpy() for o in outputs], float(value.detach()), grads


_COMPILED = {}


def run_jax(family: str, state: dict, dtype: str, param_dtype: str = "float32",
            grads: bool = True):
    """jaxformer loaded with ``state`` (a torch state_dict) in ``dtype`` / ``param_dtype`` ->
    (outputs, loss, {state_dict key: gradient} or None), numpy float64. One compilation per
    case (for these tiny models 1-2 s for the forward, 5-8 s with the gradients)."""
    _, jax_cls, config = FAMILIES[family]
    config = dataclasses.replace(config, dtype=dtype, param_dtype=param_dtype)
    model = convert.abstract_model(lambda: jax_cls(config, rngs=nnx.Rngs(0)))
    convert.torch_to_nnx(state, model)
    model.eval()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    key = (family, dtype, param_dtype, grads)
    if key not in _COMPILED:
        def objective(params, rest, args, labels):
            outputs = as_tuple(nnx.merge(graphdef, params, rest)(**args))
            return loss(family, jax_losses, outputs, args, labels), outputs

        _COMPILED[key] = jax.jit(jax.value_and_grad(objective, has_aux=True) if grads
                                 else lambda *a: (objective(*a), None))
    args = inputs(family)
    (value, outputs), gradients = _COMPILED[key](
        params, rest, {k: jnp.asarray(v) for k, v in args.items()},
        {k: jnp.asarray(v) for k, v in loss_labels(family, args).items()})
    if grads:
        gradients = {k: np.asarray(g, np.float64) for k, g in
                     convert.nnx_to_torch(nnx.merge(graphdef, gradients, rest)).items()}
    return [np.asarray(o, np.float64) for o in outputs], float(value), gradients


def output_errors(family: str, expected, actual, reference=None) -> dict[str, float]:
    """Max abs difference of each output over ``reference``'s scale (default ``expected``'s;
    helpers.max_rel_diff), real positions of (B, T, ...) outputs. With the float64 run as
    ``reference`` for every pair, the triangle inequality holds between the errors."""
    args = inputs(family)
    real = args.get("attention_mask", args.get("tgt_mask")).astype(bool)
    errors = {}
    for name, exp, act, ref in zip(OUTPUTS[family], expected, actual, reference or expected):
        where = real if ref.ndim == 3 else None
        errors[name] = max_rel_diff(exp, act, where) * _scale(exp, where) / _scale(ref, where)
    return errors


def _scale(x, where) -> float:
    """max_rel_diff's scale: max(1, max |x|) over ``where``."""
    return max(1.0, max_rel_diff(np.zeros_like(x), x, where))


def grad_error(expected: dict, actual: dict, reference: dict) -> float:
    """The worst parameter's max abs gradient difference over its ``reference`` gradient's
    largest value; an attention key bias (0 in exact arithmetic: softmax is shift-invariant
    along the keys) over its query bias gradient's."""
    worst = 0.0
    for key, exp in expected.items():
        scale_key = key.replace("key.bias", "query.bias") if key.endswith("key.bias") else key
        scale = float(np.abs(reference[scale_key]).max())
        assert scale > 0, f"{key}: zero reference gradient"
        worst = max(worst, float(np.abs(exp - actual[key]).max()) / scale)
    return worst
