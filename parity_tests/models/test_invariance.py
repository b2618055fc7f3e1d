"""What sits in a masked position must not change any real output (issue 12, item 7a).

A padding mask that is dropped, applied to the wrong axis, or forgotten on one attention (the
decoder's target padding, the cross-attention's source padding) goes unseen by twin parity when
both twins share the mistake, and unseen by most tests when padded positions hold the pad id
(whose embedding is a constant). Here the padded positions hold random tokens (never the pad id)
and random segment ids, under left and middle padding, and the outputs at real positions must
not move. Every family, both frameworks:

- BERT: sequence output, masked-LM logits at real positions; pooled output and NSP logits in the
  rows whose first token (``[CLS]``) is real;
- GPT: logits at real positions;
- the encoder-decoder: logits at real target positions, with the source padded, then the target.

Measured difference (``.venv/bin/python -m pytest parity_tests/models/test_invariance.py``, CPU):
exactly 0 in every case and framework, since a masked score becomes exp(MASK_VALUE - max) = 0
exactly. The bound is the jit tolerance (1e-6, scale-relative), room for a backend that sums in
another order. Each test also shows the change is large (> 1e-2) when the same positions are
*not* masked, so the random content is not a no-op.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxformer.config import BertConfig, GPTConfig, TransformerConfig
from jaxformer.models import bert as jb
from jaxformer.models import encoder_decoder as jed
from jaxformer.models import gpt as jg
from jaxformer.nn.jit import jitted
from parity_tests.support.helpers import JIT_TOL, max_rel_diff
from parity_tests.support.twins import call, compiled, random_twins
from torch_ref.models import bert as tb
from torch_ref.models import encoder_decoder as ted
from torch_ref.models import gpt as tg

B, T, S = 3, 7, 8  # the shapes of test_bert.py / test_encoder_decoder.py
VISIBLE = 1e-2  # unmasked, the random content must move the outputs by more than this


def padding(kind: str, seq: int) -> np.ndarray:
    """``[B, seq]`` mask: row 0 full; rows 1, 2 padded at the start (left) or in the middle."""
    mask = np.ones((B, seq), np.int64)
    if kind == "left":
        mask[1, :2], mask[2, :seq - 2] = 0, 0  # row 2 keeps two real tokens
    else:
        mask[1, 2:4], mask[2, 1:seq - 1] = 0, 0  # row 2: first and last real
    return mask


FAMILIES = {
    "bert": (tb.BertForPreTraining, jb.BertForPreTraining, BertConfig.tiny()),
    "gpt": (tg.GPT, jg.GPT, GPTConfig.tiny()),
    "encoder_decoder": (ted.Transformer, jed.Transformer, TransformerConfig.tiny()),
}


def run(family: str, framework: str, args: dict) -> list[np.ndarray]:
    """The family's outputs (a list, as numpy), torch eager or the jitted NNX model."""
    model = random_twins(*FAMILIES[family])[0] if framework == "torch" else \
        compiled(*FAMILIES[family])
    out = call(model, framework, args)
    out = out if isinstance(out, tuple) else (out,)
    return [np.asarray(o.detach() if isinstance(o, torch.Tensor) else o) for o in out]


def fill_padding(ids, mask, vocab: int, pad_id: int, rng) -> np.ndarray:
    """``ids`` with every padded position holding a random token other than ``pad_id``."""
    noise = rng.randint(0, vocab - 1, ids.shape)
    noise += noise >= pad_id  # skip the pad id
    return np.where(mask == 1, ids, noise)


def assert_invariant(family, framework, args, noisy, compared):
    """Outputs at ``compared`` (one boolean array per output, or None) equal for ``args`` and
    ``noisy``; and with every position unmasked the same noise moves them visibly."""
    clean, moved = run(family, framework, args), run(family, framework, noisy)
    for i, (c, m, where) in enumerate(zip(clean, moved, compared)):
        if where is not None:
            diff = max_rel_diff(c, m, where=where)
            assert diff <= JIT_TOL, f"output {i}: masked content changed it by {diff:.3g}"
    unmasked = {k: np.ones_like(v) if k.endswith("mask") else v for k, v in args.items()}
    noisy_unmasked = {k: unmasked[k] if k.endswith("mask") else v for k, v in noisy.items()}
    first = compared[0]
    diff = max_rel_diff(run(family, framework, unmasked)[0], run(family, framework,
                                                                 noisy_unmasked)[0], where=first)
    assert diff > VISIBLE, f"the noise is invisible even unmasked ({diff:.3g}): no teeth"


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("kind", ["left", "middle"])
def test_bert_ignores_masked_content(kind, framework):
    config = FAMILIES["bert"][2]
    rng = np.random.RandomState(0)
    mask = padding(kind, T)
    ids = np.where(mask == 1, rng.randint(1, config.vocab_size, (B, T)), config.pad_token_id)
    segments = (np.arange(T)[None] >= np.array([[4], [5], [6]])).astype(np.int64)
    args = {"input_ids": ids, "token_type_ids": segments, "attention_mask": mask}
    noisy = dict(args, input_ids=fill_padding(ids, mask, config.vocab_size,
                                              config.pad_token_id, rng),
                 token_type_ids=np.where(mask == 1, segments,
                                         rng.randint(0, config.type_vocab_size, (B, T))))
    real = mask.astype(bool)
    cls_real = real[:, 0]  # pooled output and NSP read [CLS]: only where it is a real token
    # (sequence_output, mlm_logits over all positions, nsp_logits)
    assert_invariant("bert", framework, args, noisy, [real, real, cls_real])


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("kind", ["left", "middle"])
def test_gpt_ignores_masked_content(kind, framework):
    config = FAMILIES["gpt"][2]
    rng = np.random.RandomState(1)
    mask = padding(kind, T)
    ids = np.where(mask == 1, rng.randint(1, config.vocab_size, (B, T)), config.pad_token_id)
    noisy = {"input_ids": fill_padding(ids, mask, config.vocab_size, config.pad_token_id, rng),
             "attention_mask": mask}
    assert_invariant("gpt", framework, {"input_ids": ids, "attention_mask": mask}, noisy,
                     [mask.astype(bool)])


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("kind", ["left", "middle"])
@pytest.mark.parametrize("side", ["source", "target"])
def test_encoder_decoder_ignores_masked_content(side, kind, framework):
    """Source padding reaches the output through the encoder self-attention and the decoder's
    cross-attention; target padding through the decoder self-attention (with the causal mask)."""
    config = FAMILIES["encoder_decoder"][2]
    rng = np.random.RandomState(2)
    src_mask = padding(kind, S) if side == "source" else np.ones((B, S), np.int64)
    tgt_mask = padding(kind, T) if side == "target" else np.ones((B, T), np.int64)
    src = np.where(src_mask == 1, rng.randint(1, config.src_vocab_size, (B, S)),
                   config.src_pad_id)
    tgt = np.where(tgt_mask == 1, rng.randint(1, config.tgt_vocab_size, (B, T)),
                   config.tgt_pad_id)
    args = {"src_ids": src, "tgt_ids": tgt, "src_mask": src_mask, "tgt_mask": tgt_mask}
    noisy = dict(args,
                 src_ids=fill_padding(src, src_mask, config.src_vocab_size, config.src_pad_id,
                                      rng),
                 tgt_ids=fill_padding(tgt, tgt_mask, config.tgt_vocab_size, config.tgt_pad_id,
                                      rng))
    assert_invariant("encoder_decoder", framework, args, noisy, [tgt_mask.astype(bool)])


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_encoder_decoder_memory_ignores_masked_source(framework):
    """``encode`` alone: the memory at real source positions ignores padded content too."""
    config = FAMILIES["encoder_decoder"][2]
    torch_model, jax_model = random_twins(*FAMILIES["encoder_decoder"])
    rng = np.random.RandomState(3)
    mask = padding("middle", S)
    src = np.where(mask == 1, rng.randint(1, config.src_vocab_size, (B, S)), config.src_pad_id)
    noisy = fill_padding(src, mask, config.src_vocab_size, config.src_pad_id, rng)
    if framework == "torch":
        with torch.no_grad():
            memories = [torch_model.encode(torch.from_numpy(s), torch.from_numpy(mask)).numpy()
                        for s in (src, noisy)]
    else:
        encode = jitted(jax_model, "encode")
        memories = [np.asarray(encode(jnp.asarray(s), jnp.asarray(mask))) for s in (src, noisy)]
    assert max_rel_diff(memories[0], memories[1], where=mask.astype(bool)) <= JIT_TOL


def test_padding_helper():
    """The masks this file relies on: left padding starts rows with pads, middle padding keeps
    real tokens on both sides of the gap, row 0 is full."""
    for seq in (T, S):
        left, middle = padding("left", seq), padding("middle", seq)
        assert left[0].all()
        assert middle[0].all()
        assert (left[1:, 0] == 0).all()
        assert (left[1:, -1] == 1).all()
        assert (middle[1:, 0] == 1).all()
        assert (middle[1:, -1] == 1).all()
        assert (middle[1:] == 0).any(axis=1).all()
