"""Checks that need a CUDA GPU (marked ``gpu``; skipped, with the reason, on a machine without
one). Everything else in the suite runs on a GPU unchanged: ``make test TORCH=torch
JAX='jax[cuda12]'`` on a GPU machine runs the whole suite there, these tests included.

- cuDNN flash attention (``attention_implementation="cudnn"``, bfloat16), under GPT's causal
  and BERT's padding mask: the same outputs as the explicit einsum path within the bfloat16
  bound of ``models/test_bf16.py`` (measured on CPU: bfloat16 against float32 is at most 2.9e-2
  there, the bound is 5e-2), and as the float32 model within that bound too. cuDNN is another
  kernel over the same bfloat16 inputs, so a result outside the bound is a wrong mask or layout,
  not rounding.
- float32 parity on the GPU: jaxformer on the GPU against the torch twin on CUDA with the same
  weights, at DESIGN's 1e-5 (``conftest.py`` turns TF32 off in both frameworks).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import torch

from jaxformer.config import BertConfig, GPTConfig
from jaxformer.models import bert as jb
from jaxformer.models import gpt as jg
from parity_tests.support.bf16 import BF16_BOUND
from parity_tests.support.helpers import FORWARD_RTOL, max_rel_diff, twin_pair
from torch_ref.models import bert as tb
from torch_ref.models import gpt as tg

pytestmark = pytest.mark.gpu

B, T = 2, 16
LENGTHS = (T, 11)  # the second row right-padded


def inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 90, (B, T)).astype(np.int32)
    mask = (np.arange(T)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    return ids, mask


def logits(family, config):
    """Float32 logits (GPT) or sequence output (BERT) of the jitted model, and the padding mask.
    GPT's mask reaches attention as (B, 1, T, T), BERT's padding mask as (B, 1, 1, T)."""
    ids, mask = inputs()
    if family == "gpt":
        _, model = twin_pair(tg.GPT, jg.GPT, config, randomized=True)
        forward = jax.jit(lambda i, m: model(i, m).astype("float32"))
    else:
        _, model = twin_pair(tb.BertModel, jb.BertModel, config, randomized=True)
        forward = jax.jit(lambda i, m: model(i, np.zeros_like(ids), m)[0].astype("float32"))
    return np.asarray(forward(ids, mask)), mask


@pytest.mark.parametrize("family", ["gpt", "bert"])
def test_cudnn_flash_attention_in_bfloat16(family):
    cls = GPTConfig if family == "gpt" else BertConfig
    base = dataclasses.replace(cls.tiny(), dtype="bfloat16", dropout_rate=0.0,
                               attention_dropout_rate=0.0)
    cudnn, mask = logits(family, dataclasses.replace(base, attention_implementation="cudnn"))
    einsum, _ = logits(family, dataclasses.replace(base, attention_implementation="einsum"))
    exact, _ = logits(family, dataclasses.replace(base, dtype="float32"))
    real = mask.astype(bool)
    assert np.isfinite(cudnn[real]).all()
    assert max_rel_diff(einsum, cudnn, real) <= BF16_BOUND
    assert max_rel_diff(exact, cudnn, real) <= BF16_BOUND


@pytest.mark.parametrize("family", ["gpt", "bert"])
def test_float32_parity_with_the_torch_twin_on_cuda(family):
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device (install the CUDA build of torch)")
    ids, mask = inputs()
    if family == "gpt":
        torch_model, model = twin_pair(tg.GPT, jg.GPT, GPTConfig.tiny(), randomized=True)
        expected = torch_model.cuda()(torch.from_numpy(ids).long().cuda(),
                                      torch.from_numpy(mask).cuda())
        actual = model(ids, mask)
    else:
        torch_model, model = twin_pair(tb.BertModel, jb.BertModel, BertConfig.tiny(),
                                       randomized=True)
        types = np.zeros_like(ids)
        expected = torch_model.cuda()(torch.from_numpy(ids).long().cuda(),
                                      torch.from_numpy(types).long().cuda(),
                                      torch.from_numpy(mask).cuda())[0]
        actual = model(ids, types, mask)[0]
    assert jax.devices()[0].platform == "gpu"
    assert max_rel_diff(expected, actual, mask.astype(bool)) <= FORWARD_RTOL
