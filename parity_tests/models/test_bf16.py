"""Mixed precision: every family built with ``dtype="bfloat16"`` (issue 12, item 7c).

DESIGN.md: "Mixed precision is ``param_dtype`` float32 with a compute ``dtype``". For each family,
with the same (randomised) weights as a float32 model:

- every parameter is float32, after construction and after loading weights;
- the computation runs in bfloat16: every matmul of the traced program takes bfloat16 operands,
  the hidden states come out as bfloat16, and they differ from float32 by far more than float32
  rounding (a model that ignored ``dtype`` would pass the bound below, not these);
- outputs are finite and within a measured bound of the float32 model's; the float32 model is
  itself within DESIGN.md's 1e-5 of a float64 run of the torch twin, so the bound is a bound on
  bfloat16's own error.

Measurement (``PYTHONPATH=. .venv/bin/python`` on a script building these models; CPU; the
same input shapes and masks as here; weights randomised as in ``test_invariance.py``, torch seeds
0-3; scale-relative max abs error against the torch twin run in float64, real positions only):

    =================  ==================  ==============================
    output             float32 vs float64  bfloat16 vs float64
    =================  ==================  ==============================
    BERT sequence      1.8e-7 .. 3.0e-7    6.8e-3 .. 1.4e-2
    BERT MLM logits    3.2e-7 .. 3.6e-7    1.1e-2 .. 1.7e-2
    BERT NSP logits    7.5e-8 .. 2.7e-7    5.9e-3 .. 2.9e-2
    GPT logits         2.3e-7 .. 3.6e-7    7.1e-3 .. 1.0e-2
    encoder-decoder    3.0e-7 .. 4.2e-7    1.2e-2 .. 1.6e-2
    =================  ==================  ==============================

bfloat16 keeps 8 significant bits (half an ulp is 2^-9 = 2.0e-3 relative); errors of 3 to 15
such roundings after two layers are what rounding every matmul input and activation gives. The
bound is 5e-2, 1.7x the largest measurement (BERT's NSP logits, a tanh pooler and a classifier
on one token, the noisiest output); at N(0, 0.02) initial weights every error was below 9e-3.
The lower check (bfloat16 differs from float32 by more than 1e-4, 250x float32's error) shows
the computation really ran in bfloat16.

Also here: every reduction (LayerNorm statistics, softmax, log-softmax) and every exp, log and
rsqrt of a bfloat16 model's traced forward and loss runs in float32; pure bfloat16
(``param_dtype="bfloat16"``) stores every parameter in bfloat16, computes exactly the
mixed-precision forward and trains; float16 on CPU runs under ``jit``. The comparison with
torch_ref under ``torch.autocast`` is ``test_autocast.py``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer.checkpoints import convert
from jaxformer.config import GPTConfig
from jaxformer.models import gpt as jg
from jaxformer.nn.jit import jitted
from jaxformer.training import losses
from parity_tests.support.bf16 import (
    BF16_BOUND,
    FAMILIES,
    INNER,
    T,
    as_tuple,
    inputs,
    loss,
    loss_labels,
)
from parity_tests.support.helpers import FORWARD_RTOL, max_rel_diff, randomize
from parity_tests.support.jaxprs import equations
from parity_tests.support.twins import SPREAD

BF16_VISIBLE = 1e-4  # bfloat16 must differ from float32 by at least this much


def param_dtypes(model: nnx.Module) -> dict[str, str]:
    return {".".join(map(str, path)): str(v.get_value().dtype)
            for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def matmul_operand_dtypes(jaxpr) -> list[tuple[str, ...]]:
    """The operand dtypes of every ``dot_general`` in ``jaxpr`` and the jaxprs nested in it."""
    return [tuple(str(v.aval.dtype) for v in eqn.invars) for eqn in equations(jaxpr)
            if eqn.primitive.name == "dot_general"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bfloat16_model(family):
    torch_cls, jax_cls, config = FAMILIES[family]
    torch.manual_seed(0)
    torch_model = randomize(torch_cls(config), 0, SPREAD).eval()
    state = torch_model.state_dict()
    args = inputs(family)
    real = args.get("attention_mask", args.get("tgt_mask")).astype(bool)
    with torch.no_grad():
        reference = as_tuple(torch_model.double()(**{k: torch.from_numpy(v)
                                                      for k, v in args.items()}))

    outputs = {}
    for dtype in ("float32", "bfloat16"):
        model = convert.abstract_model(
            lambda dtype=dtype: jax_cls(dataclasses.replace(config, dtype=dtype),
                                        rngs=nnx.Rngs(0)))
        built = param_dtypes(model)  # as constructed, before any weight is loaded
        convert.torch_to_nnx(state, model)
        model.eval()
        for when, dtypes in (("built", built), ("loaded", param_dtypes(model))):
            wrong = {k: d for k, d in dtypes.items() if d != "float32"}
            assert dtypes, f"{dtype} model, {when}: no parameters"
            assert not wrong, f"{dtype} model, {when}: non-float32 parameters {wrong}"
        run = jitted(model, fn=lambda m, a: (as_tuple(m(**a)), INNER[family](m, a)))
        arrays = {k: jnp.asarray(v) for k, v in args.items()}
        outputs[dtype], inner = run(arrays)
        # Every matmul (projections, attention, output heads) takes compute-dtype operands.
        graphdef, variables = nnx.split(model)
        jaxpr = jax.make_jaxpr(lambda st, a, g=graphdef: nnx.merge(g, st)(**a))(variables, arrays)
        matmuls = matmul_operand_dtypes(jaxpr.jaxpr)
        off = [d for d in matmuls if set(d) != {dtype}]
        assert matmuls, f"{dtype} model: no matmuls traced"
        assert not off, f"{dtype} model: {len(off)}/{len(matmuls)} matmuls on {off}"
        assert inner.dtype == jnp.dtype(dtype), f"{dtype} model: hidden states are {inner.dtype}"
        assert outputs[dtype][0].dtype == jnp.dtype(dtype), f"{dtype} model: first output"
    for i, (ref, f32, bf16) in enumerate(zip(reference, outputs["float32"],
                                             outputs["bfloat16"])):
        where = real if ref.ndim == 3 else None  # (B, T, ...) outputs: real positions only
        ref = ref.numpy()
        f32, bf16 = np.asarray(f32, np.float64), np.asarray(bf16, np.float64)
        assert np.isfinite(bf16).all(), f"output {i}: bfloat16 gives non-finite values"
        assert max_rel_diff(ref, f32, where) <= FORWARD_RTOL, f"output {i}: float32 vs float64"
        diff = max_rel_diff(f32, bf16, where)
        assert diff <= BF16_BOUND, f"output {i}: bfloat16 vs float32 {diff:.3g} > {BF16_BOUND}"
        assert diff >= BF16_VISIBLE, f"output {i}: bfloat16 equals float32 ({diff:.3g})"


def primitive_dtypes(jaxpr, names: set[str]) -> list[tuple[str, str]]:
    """``(primitive, operand dtype)`` of every equation named in ``names``, nested jaxprs too."""
    return [(eqn.primitive.name, str(v.aval.dtype)) for eqn in equations(jaxpr)
            if eqn.primitive.name in names for v in eqn.invars]


# Where bfloat16 would lose the result: the sums and maxima of LayerNorm statistics, softmax and
# log-softmax, and the exp, log and rsqrt applied to them.
FLOAT32_ONLY = {"reduce_sum", "reduce_max", "exp", "log", "rsqrt"}


@pytest.mark.parametrize("implementation", ["xla", "einsum"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_statistics_run_in_float32(family, implementation):
    """In the traced forward and training loss of a bfloat16 model, every reduction and every
    exp/log/rsqrt runs in float32: LayerNorm's mean and variance (flax promotes its statistics
    to float32 and normalises in float32 before rounding the output), the attention softmax on
    both attention paths, the losses' log-softmax. The matmuls run in bfloat16
    (``test_bfloat16_model``)."""
    _, jax_cls, config = FAMILIES[family]
    config = dataclasses.replace(config, dtype="bfloat16", attention_implementation=implementation)
    model = jax_cls(config, rngs=nnx.Rngs(0))
    model.eval()
    graphdef, variables = nnx.split(model)
    args = {k: jnp.asarray(v) for k, v in inputs(family).items()}
    labels = {k: jnp.asarray(v) for k, v in loss_labels(family, args).items()}

    def objective(variables):
        return loss(family, losses, as_tuple(nnx.merge(graphdef, variables)(**args)), args,
                    labels)

    found = primitive_dtypes(jax.make_jaxpr(objective)(variables).jaxpr, FLOAT32_ONLY)
    floating = [(name, d) for name, d in found if d in ("float32", "bfloat16", "float16")]
    assert {name for name, _ in floating} == FLOAT32_ONLY, f"not all traced: {floating}"
    low = sorted({(name, d) for name, d in floating if d != "float32"})
    assert not low, f"{family}/{implementation}: reductions in low precision: {low}"


@pytest.mark.parametrize("family", ["bert"])  # its MLM head's bias is a hand-made parameter;
def test_pure_bfloat16(family):  # GPT's parameters: test_pure_bfloat16_trains
    """``param_dtype="bfloat16"``: every parameter is stored in bfloat16, as built and as
    loaded, and the forward equals the mixed-precision one exactly: flax rounds every parameter
    (LayerNorm scales and biases too) to the compute dtype before using it, so storing them
    rounded changes nothing until an optimizer updates them (``test_pure_bfloat16_trains``)."""
    torch_cls, jax_cls, config = FAMILIES[family]
    torch.manual_seed(0)
    state = randomize(torch_cls(config), 0, SPREAD).state_dict()
    args = {k: jnp.asarray(v) for k, v in inputs(family).items()}
    outputs = {}
    for param_dtype in ("float32", "bfloat16"):
        cfg = dataclasses.replace(config, dtype="bfloat16", param_dtype=param_dtype)
        model = convert.abstract_model(lambda cfg=cfg: jax_cls(cfg, rngs=nnx.Rngs(0)))
        built = param_dtypes(model)
        convert.torch_to_nnx(state, model)
        model.eval()
        for when, dtypes in (("built", built), ("loaded", param_dtypes(model))):
            wrong = {k: d for k, d in dtypes.items() if d != param_dtype}
            assert not wrong, f"param_dtype {param_dtype}, {when}: {wrong}"
        outputs[param_dtype] = as_tuple(jitted(model)(**args))
    for mixed, pure in zip(outputs["float32"], outputs["bfloat16"]):
        assert pure.dtype == mixed.dtype
        assert np.isfinite(np.asarray(pure, np.float32)).all()
        np.testing.assert_array_equal(np.asarray(pure, np.float32), np.asarray(mixed, np.float32))


def test_pure_bfloat16_trains():
    """A pure-bfloat16 GPT takes optimizer steps: the loss falls on a repeated batch and the
    parameters stay bfloat16 (optax keeps AdamW's moments in the parameters' dtype)."""
    from jaxformer.training.config import TrainConfig
    from jaxformer.training.step import TrainStep

    config = dataclasses.replace(GPTConfig.tiny(), dtype="bfloat16", param_dtype="bfloat16",
                                 dropout_rate=0.0, attention_dropout_rate=0.0)
    model = jg.GPT(config, rngs=nnx.Rngs(0))
    wrong = {k: d for k, d in param_dtypes(model).items() if d != "bfloat16"}
    assert not wrong, f"parameters built in another dtype: {wrong}"
    step = TrainStep("gpt", model, TrainConfig(steps=8, batch_size=3, seq_len=T,
                                               learning_rate=1e-2, warmup_steps=1))
    batch = {k: v[None] for k, v in inputs("gpt").items()}  # one micro-batch
    first = [step(batch)["loss"] for _ in range(8)]
    assert all(np.isfinite(first)), first
    assert first[-1] < 0.8 * first[0], first
    wrong = {k: d for k, d in param_dtypes(step.sync()).items() if d != "bfloat16"}
    assert not wrong, f"parameters left bfloat16 after training: {wrong}"


def test_float16_on_cpu():
    """float16 on CPU: ``"auto"`` takes the einsum path (XLA:CPU cannot compile the
    float16 x float16 -> float32 matmuls of ``jax.nn.dot_product_attention`` under ``jit``) and
    ``"xla"`` is refused by name, instead of failing inside XLA's compiler."""
    if jax.default_backend() != "cpu":
        pytest.skip("about XLA:CPU")
    args = {k: jnp.asarray(v) for k, v in inputs("gpt").items()}
    results = {}
    for implementation in ("auto", "einsum", "xla"):
        config = dataclasses.replace(GPTConfig.tiny(), dtype="float16",
                                     attention_implementation=implementation)
        model = jg.GPT(config, rngs=nnx.Rngs(0))
        model.eval()
        if implementation == "xla":
            with pytest.raises(ValueError, match=r"float16 on CPU.*'einsum'"):
                jitted(model)(**args)
            continue
        results[implementation] = jitted(model)(**args)
        assert results[implementation].dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(results["auto"]), np.asarray(results["einsum"]))
    assert np.isfinite(np.asarray(results["auto"], np.float32)).all()
