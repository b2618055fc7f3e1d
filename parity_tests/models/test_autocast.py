"""bfloat16 parity: jaxformer with ``dtype="bfloat16"`` against torch_ref under
``torch.autocast("cpu", dtype=torch.bfloat16)``: each family's outputs, loss and gradients.

The two do not round the same values. A bfloat16 compute dtype (flax's ``dtype``) rounds what
every module returns: the embeddings, every matmul output, the residual stream, each LayerNorm's
output (its statistics and normalisation run in float32, see ``test_bf16.py``). CPU autocast
rounds only around its lower-precision ops (linear, matmul, bmm, SDPA): their inputs are cast
to bfloat16 and they return bfloat16; every other op runs in the dtype it is given. The
embeddings (``nn.Embedding`` is not autocast) and so the whole residual stream stay float32
(``x + bf16`` is float32), hence LayerNorm and the loss see float32 inputs; attention's softmax
runs inside SDPA's kernel, which accumulates in float32. (CPU autocast has no float32 list for
layer_norm and softmax: handed bfloat16, they return bfloat16.) torch_ref under autocast is
therefore up to twice as accurate as jaxformer in bfloat16 (table), and the two are not one
rounding apart: their difference is bounded by the sum of their own errors, each measured against
float64, and measures in fact between the larger of the two and that sum.

Measurement (``benchmarks/bf16_error.py``; writes ``benchmarks/results/bf16_error.json``): the
models and inputs of this file, weights randomised as in ``test_bf16.py``, seeds 0-7;
scale-relative max abs error (helpers.max_rel_diff) against the torch twin run in float64, real
positions only; gradients of the family's training loss, per parameter, max abs error over the
parameter's largest float64 gradient, the worst parameter (attention key biases, exactly 0 in
exact arithmetic, over the query bias gradient's scale, as in test_gpt.py); the loss over
max(1, |float64 loss|):

    =================  ======  ======  ==============  ==============  ==============  ======
    output             JAX     torch   JAX             torch           JAX bf16 -      bound
                       f32     f32     bf16            autocast        torch autocast
    =================  ======  ======  ==============  ==============  ==============  ======
    BERT sequence      3.5e-7  3.3e-7  6.5e-3..1.5e-2  3.6e-3..7.0e-3  7.7e-3..1.5e-2  2.3e-2
    BERT MLM logits    5.5e-7  5.3e-7  6.7e-3..2.6e-2  5.9e-3..1.1e-2  8.0e-3..2.2e-2  3.8e-2
    BERT NSP logits    3.5e-7  4.6e-7  4.8e-3..1.2e-2  2.8e-3..1.0e-2  2.3e-3..1.4e-2  2.3e-2
    BERT gradients     7.5e-6  1.0e-5  2.0e-2..1.1e-1  1.3e-2..3.3e-2  2.3e-2..8.9e-2  1.4e-1
    BERT loss          2.0e-7  2.2e-7  2.7e-4..3.4e-3  1.3e-4..1.8e-3  2.7e-4..2.1e-3  5.3e-3
    GPT logits         4.1e-7  4.1e-7  6.2e-3..1.1e-2  5.0e-3..8.6e-3  7.7e-3..1.3e-2  2.0e-2
    GPT gradients      2.3e-6  1.9e-6  1.9e-2..4.5e-2  1.4e-2..3.4e-2  2.2e-2..5.1e-2  8.0e-2
    GPT loss           1.2e-7  1.2e-7  5.7e-5..1.7e-3  5.4e-5..1.0e-3  1.1e-4..2.3e-3  2.9e-3
    enc-dec logits     6.1e-7  4.7e-7  1.0e-2..1.9e-2  7.9e-3..1.4e-2  1.2e-2..1.8e-2  3.4e-2
    enc-dec gradients  2.8e-6  4.0e-6  1.6e-1..3.4e-1  3.2e-2..3.4e-1  1.5e-1..3.9e-1  6.8e-1
    enc-dec loss       1.4e-7  2.7e-7  1.9e-5..1.0e-3  1.9e-5..5.7e-4  3.4e-4..1.0e-3  1.7e-3
    =================  ======  ======  ==============  ==============  ==============  ======

The bound of the JAX-vs-torch difference is the sum of the two bfloat16 columns' maxima (each
rounded up to two digits, ``MEASURED``): by the triangle inequality it holds for every measured
seed, and it is below what either side's error would reach if it doubled. Each side's own error
is also held to 1.5x its measured maximum (``OWN``), so a regression shows on the side that has
it. The encoder-decoder's gradients are the worst case in both frameworks alike (its ReLU
feed-forward: a pre-activation near 0 that rounding moves across 0 switches a whole gradient
row; the encoder's ``fc1`` gradients, 0.15 relative in L2, are the worst parameters). jaxformer in
pure bfloat16 (``param_dtype="bfloat16"``, in the JSON) gives exactly the mixed-precision
numbers: flax rounds every parameter to the compute dtype before using it.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from parity_tests.support.autocast import (
    OUTPUTS,
    grad_error,
    output_errors,
    run_jax,
    run_torch,
    torch_model,
)
from parity_tests.support.bf16 import FAMILIES, inputs

# Measured maxima over seeds 0-7 (see the table): output -> (JAX bf16, torch autocast).
MEASURED = {
    "bert/sequence": (0.016, 0.0071),
    "bert/mlm_logits": (0.026, 0.012),
    "bert/nsp_logits": (0.012, 0.011),
    "bert/grads": (0.11, 0.033),
    "bert/loss": (0.0035, 0.0018),
    "gpt/logits": (0.011, 0.0087),
    "gpt/grads": (0.045, 0.035),
    "gpt/loss": (0.0018, 0.0011),
    "encoder_decoder/logits": (0.019, 0.015),
    "encoder_decoder/grads": (0.34, 0.34),
    "encoder_decoder/loss": (0.0011, 0.00057),
}
OWN = 1.5  # each side's own error against float64, as a multiple of its measured maximum
SEEDS = (0, 1)
# The families whose gradients are compared here: compiling a bfloat16 backward pass costs 5-8 s
# of CPU per family, and GPT's exercises every piece the others have but cross-attention and the
# BERT heads. benchmarks/bf16_error.py measures all three.
GRADIENTS = ("gpt",)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("seed", SEEDS)
def test_bfloat16_matches_autocast(family, seed):
    model = torch_model(family, seed)
    ref_out, ref_loss, ref_grads = run_torch(family, model, "float64")
    torch_out, torch_loss, torch_grads = run_torch(family, model, "autocast")
    jax_out, jax_loss, jax_grads = run_jax(family, model.state_dict(), "bfloat16",
                                           grads=family in GRADIENTS)
    errors = {"jax": output_errors(family, ref_out, jax_out),
              "torch": output_errors(family, ref_out, torch_out),
              "between": output_errors(family, torch_out, jax_out, ref_out)}
    if family in GRADIENTS:
        for side, grads in (("jax", jax_grads), ("torch", torch_grads)):
            errors[side]["grads"] = grad_error(ref_grads, grads, ref_grads)
        errors["between"]["grads"] = grad_error(torch_grads, jax_grads, ref_grads)
    for side, value in (("jax", jax_loss), ("torch", torch_loss)):
        errors[side]["loss"] = abs(value - ref_loss) / max(1.0, abs(ref_loss))
    errors["between"]["loss"] = abs(jax_loss - torch_loss) / max(1.0, abs(ref_loss))
    for name in (*OUTPUTS[family], "loss", *(("grads",) if family in GRADIENTS else ())):
        jax_max, torch_max = MEASURED[f"{family}/{name}"]
        assert errors["jax"][name] <= OWN * jax_max, f"{name}: JAX bf16 vs float64 {errors}"
        assert errors["torch"][name] <= OWN * torch_max, f"{name}: autocast vs float64 {errors}"
        assert errors["between"][name] <= jax_max + torch_max, (
            f"{family} {name}: JAX bf16 vs torch autocast {errors['between'][name]:.3g} > "
            f"{jax_max + torch_max:.3g}")


def _attention_inputs(seed: int):
    """bfloat16 ``(B, nh, T, hs)`` q, k, v with scores of a few units (sharp attention) and a
    mask with padded keys."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = ((2 * torch.randn(2, 4, 16, 8, generator=gen)).bfloat16() for _ in range(3))
    mask = torch.ones(2, 1, 16, 16, dtype=torch.bool)
    mask[1, ..., 12:] = False
    return q, k, v, mask


@pytest.mark.parametrize("seed", SEEDS)
def test_attention_under_autocast(seed):
    """On the same bfloat16 q, k, v: torch_ref's einsum path under autocast is bit-identical to
    jaxformer's (scores and softmax in float32 on both sides; autocast alone would have rounded
    the scores to bfloat16, 3-6x the error against float64 when measured), and so is jaxformer's
    ``"xla"`` path. torch's SDPA kernel accumulates in its own order: its outputs are within
    one bfloat16 rounding of the output (2^-7 of the largest magnitude)."""
    from jaxformer.nn import attention as jax_attention
    from torch_ref.nn import attention as torch_attention

    q, k, v, mask = _attention_inputs(seed)

    def heads_last(x):  # (B, nh, T, hs) torch -> (B, T, nh, hs) jax, bfloat16
        return jnp.asarray(x.float().numpy().transpose(0, 2, 1, 3), jnp.bfloat16)

    jax_args = (*map(heads_last, (q, k, v)), jnp.asarray(mask.numpy()), None)
    expected = {name: np.asarray(fn(*jax_args), np.float32).transpose(0, 2, 1, 3)
                for name, fn in jax_attention.IMPLEMENTATIONS.items() if name != "cudnn"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        einsum = torch_attention.einsum_attention(q, k, v, mask, None)
        sdpa = torch_attention.fused_attention(q, k, v, mask, None, implementation="xla")
    assert einsum.dtype == sdpa.dtype == torch.bfloat16
    np.testing.assert_array_equal(expected["xla"], expected["einsum"])
    np.testing.assert_array_equal(einsum.float().numpy(), expected["einsum"])
    scale = np.abs(expected["einsum"]).max()
    assert np.abs(sdpa.float().numpy() - expected["einsum"]).max() <= 2 ** -7 * scale


def test_torch_train_step_autocasts():
    """``dtype="bfloat16"`` makes torch_ref's train step run the forward and the loss under
    autocast (its linear layers return bfloat16) and ``param_dtype="bfloat16"`` store the
    parameters in bfloat16; the loss stays float32 and finite."""
    from jaxformer.config import GPTConfig
    from jaxformer.training.config import TrainConfig
    from torch_ref.training import step as torch_step

    seen = []
    for param_dtype in ("float32", "bfloat16"):
        config = dataclasses.replace(GPTConfig.tiny(), dtype="bfloat16", param_dtype=param_dtype)
        model = torch_step.build_model("gpt", config, 0)
        model.embeddings.word_embeddings.register_forward_hook(
            lambda module, args, out: seen.append(("embedding", out.dtype)))
        model.blocks[0].feed_forward.fc1.register_forward_hook(
            lambda module, args, out: seen.append(("linear", out.dtype)))
        trainer = torch_step.TrainStep("gpt", model, TrainConfig(steps=2, batch_size=3,
                                                                 seq_len=7))
        batch = {k: v[None] for k, v in inputs("gpt").items()}
        result = trainer(batch)
        assert np.isfinite(result["loss"])
        assert np.isfinite(trainer.evaluate(inputs("gpt")))
        dtypes = {p.dtype for p in model.parameters()}
        assert dtypes == {getattr(torch, param_dtype)}, f"{param_dtype}: {dtypes}"
        assert ("linear", torch.bfloat16) in seen, seen
        assert ("embedding", getattr(torch, param_dtype)) in seen, seen
        seen.clear()


def test_train_dtype_flags(tmp_path, monkeypatch, capsys):
    """``jaxformer train --dtype/--param-dtype`` reach the model config of the run (and so its
    identity, which ``--resume`` compares); a dtype outside the config's choices is refused."""
    from jaxformer import cli
    from jaxformer.training import loop
    from parity_tests.support.training import write_corpus

    prepared = []

    def prepare_only(config, options, flags=None):  # everything before the first step
        prepared.append(loop.prepare(config, options))
        raise ValueError("stopped before training")

    monkeypatch.setattr(loop, "train", prepare_only)
    data = write_corpus(tmp_path / "corpus.txt", lines=40)
    flags = ["train", "--family", "gpt", "--data", data, "--steps", "1", "--checkpoint-dir",
             str(tmp_path / "run"), "--dtype", "bfloat16", "--param-dtype", "bfloat16"]
    assert cli.main(flags) == 2
    assert "stopped before training" in capsys.readouterr().err
    _, identity, model_cfg, *_ = prepared[0]
    assert (model_cfg.dtype, model_cfg.param_dtype) == ("bfloat16", "bfloat16")
    assert identity["model_config"]["dtype"] == "bfloat16"
    with pytest.raises(SystemExit):
        cli.main(flags[:-4] + ["--dtype", "float64"])
    assert "--dtype: invalid choice: 'float64'" in capsys.readouterr().err
