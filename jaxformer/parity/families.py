"""One builder per family: the torch_ref twin and the NNX model with the same seeded weights, the
same padded inputs, every component compared, then the full model against a float64 run.

Each builder yields :class:`jaxformer.parity.compare.Row`; padded query rows are left out
wherever a component's output has them. The twins come through ``jaxformer.frameworks`` (never a
``torch_ref`` import): the only arrows between the packages go from ``torch_ref`` to ``jaxformer``.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from jaxformer import frameworks
from jaxformer.checkpoints import convert
from jaxformer.config import BertConfig, GPTConfig, TransformerConfig
from jaxformer.nn.jit import jitted
from jaxformer.parity.compare import Row, compare, full_model_rows


def twin(torch_cls, jax_cls, config, seed: int):
    """The torch twin built from ``seed`` and the NNX model loaded with its weights, in eval."""
    torch.manual_seed(seed)
    torch_model = torch_cls(config).eval()
    jax_model = convert.abstract_model(lambda: jax_cls(config, rngs=nnx.Rngs(seed)))
    convert.torch_to_nnx(torch_model.state_dict(), jax_model)
    jax_model.eval()
    return torch_model, jax_model


def padded_batch(rng, batch: int, seq: int, vocab: int):
    """Token ids and a right-padded ``[batch, seq]`` mask (row 0 full, others shorter)."""
    ids = rng.randint(1, vocab, size=(batch, seq))
    lengths = np.maximum(1, seq - np.arange(batch) * max(1, seq // (batch + 1)))
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    return ids, mask


def full_model(family: str, model: str, names, torch_model, jax_model, inputs,
               rows) -> Iterator[Row]:
    """The full model in torch_ref float32, eager and jitted jaxformer, and torch_ref float64
    (the twin cast in place, so call this last). See ``compare.full_model_rows``."""
    torch_inputs = [torch.from_numpy(x) for x in inputs]
    jax_inputs = [jnp.asarray(x) for x in inputs]
    with torch.inference_mode():
        torch32 = torch_model(*torch_inputs)
    eager = jax_model(*jax_inputs)
    jit = jitted(jax_model)(*jax_inputs)  # the house idiom: split once, jax.jit, state carried
    torch_model.double()
    with torch.inference_mode():
        float64 = torch_model(*torch_inputs)
    yield from full_model_rows(family, model, names, torch32, eager, jit, float64, rows)


def bert_rows(preset: str, seed: int) -> Iterator[Row]:
    from jaxformer.models import bert as jb
    from jaxformer.nn import masks as jmasks

    tb = frameworks.module("torch", "models.bert")
    tmasks = frameworks.module("torch", "nn.masks")

    cfg = BertConfig.tiny() if preset == "tiny" else BertConfig.base()
    rng = np.random.RandomState(seed)
    B, T, C = 3, min(16, cfg.max_position_embeddings), cfg.hidden_size
    tm, jm = twin(tb.BertForPreTraining, jb.BertForPreTraining, cfg, seed)
    ids, am = padded_batch(rng, B, T, cfg.vocab_size)
    tt = (np.arange(T)[None, :] >= T // 2).astype(np.int64).repeat(B, 0)
    pos = rng.randint(0, T // 2, size=(B, 3))
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    real = am.astype(bool)
    t, j = torch.from_numpy, jnp.asarray
    tmask, jmask = tmasks.padding_mask(t(am)), jmasks.padding_mask(j(am))
    tl, jl = tm.bert.encoder.layers[0], jm.bert.encoder.layers[0]
    with torch.inference_mode():
        cases = [
            ("embeddings", tm.bert.embeddings(t(ids), t(tt)), jm.bert.embeddings(j(ids), j(tt)),
             real),
            ("attention", tl.attention(t(x), mask=tmask), jl.attention(j(x), mask=jmask), real),
            ("feed-forward", tl.feed_forward(t(x)), jl.feed_forward(j(x)), None),
            ("encoder layer", tl(t(x), tmask), jl(j(x), jmask), real),
            ("encoder", tm.bert.encoder(t(x), tmask), jm.bert.encoder(j(x), jmask), real),
            ("pooler", tm.bert.pooler(t(x)), jm.bert.pooler(j(x)), None),
            ("MLM head (all positions)",
             tm.mlm(t(x), None, tm.bert.embeddings.word_embeddings),
             jm.mlm(j(x), None, jm.bert.embeddings.word_embeddings), real),
            ("MLM head (masked positions)",
             tm.mlm(t(x), t(pos), tm.bert.embeddings.word_embeddings),
             jm.mlm(j(x), j(pos), jm.bert.embeddings.word_embeddings), None),
            ("NSP head", tm.nsp(t(x[:, 0])), jm.nsp(j(x[:, 0])), None),
        ]
    for name, expected, actual, rows in cases:
        yield compare("bert", name, expected, actual, rows)
    yield from full_model("bert", "BertForPreTraining",
                          ("sequence output", "MLM logits", "NSP logits"), tm, jm,
                          (ids, tt, am, pos), (real, None, None))


def gpt_rows(preset: str, seed: int) -> Iterator[Row]:
    from jaxformer.models import gpt as jg
    from jaxformer.nn import masks as jmasks

    tg = frameworks.module("torch", "models.gpt")
    tmasks = frameworks.module("torch", "nn.masks")

    cfg = GPTConfig.tiny() if preset == "tiny" else GPTConfig.gpt2()
    rng = np.random.RandomState(seed)
    B, T, C = 3, 16, cfg.hidden_size
    tm, jm = twin(tg.GPT, jg.GPT, cfg, seed)
    ids, am = padded_batch(rng, B, T, cfg.vocab_size)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    real = am.astype(bool)
    t, j = torch.from_numpy, jnp.asarray
    tmask = tmasks.combine_masks(tmasks.causal_mask(T), tmasks.padding_mask(t(am)))
    jmask = jmasks.combine_masks(jmasks.causal_mask(T), jmasks.padding_mask(j(am)))
    positions = np.broadcast_to(np.arange(T), (B, T))
    tblock, jblock = tm.blocks[0], jm.blocks[0]
    with torch.inference_mode():
        cases = [
            ("embeddings", tm.embeddings(t(ids), t(positions.copy())),
             jm.embeddings(j(ids), j(positions)), real),
            ("causal attention", tblock.attention(t(x), mask=tmask),
             jblock.attention(j(x), mask=jmask), real),
            ("feed-forward", tblock.feed_forward(t(x)), jblock.feed_forward(j(x)), None),
            ("block", tblock(t(x), tmask), jblock(j(x), jmask), real),
            ("hidden states", tm.hidden_states(t(ids), t(am)), jm.hidden_states(j(ids), j(am)),
             real),
        ]
    for name, expected, actual, rows in cases:
        yield compare("gpt", name, expected, actual, rows)
    yield from full_model("gpt", "GPT", ("logits",), tm, jm, (ids, am), (real,))


def transformer_rows(preset: str, seed: int) -> Iterator[Row]:
    from jaxformer.models import encoder_decoder as je
    from jaxformer.nn import masks as jmasks

    te = frameworks.module("torch", "models.encoder_decoder")
    tmasks = frameworks.module("torch", "nn.masks")

    cfg = TransformerConfig.tiny() if preset == "tiny" else TransformerConfig.base()
    rng = np.random.RandomState(seed)
    B, S, T, C = 3, 12, 10, cfg.hidden_size
    tm, jm = twin(te.Transformer, je.Transformer, cfg, seed)
    src, src_mask = padded_batch(rng, B, S, cfg.src_vocab_size)
    tgt, tgt_mask = padded_batch(rng, B, T, cfg.tgt_vocab_size)
    src, tgt = np.where(src_mask, src, cfg.src_pad_id), np.where(tgt_mask, tgt, cfg.tgt_pad_id)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    memory = rng.standard_normal((B, S, C)).astype(np.float32)
    real_src, real_tgt = src_mask.astype(bool), tgt_mask.astype(bool)
    t, j = torch.from_numpy, jnp.asarray
    t_self = tmasks.combine_masks(tmasks.causal_mask(T), tmasks.padding_mask(t(tgt_mask)))
    j_self = jmasks.combine_masks(jmasks.causal_mask(T), jmasks.padding_mask(j(tgt_mask)))
    t_cross, j_cross = tmasks.padding_mask(t(src_mask)), jmasks.padding_mask(j(src_mask))
    tl, jl = tm.decoder.layers[0], jm.decoder.layers[0]
    with torch.inference_mode():
        cases = [
            ("source embeddings", tm.src_embeddings(t(src), tm.shared_embeddings),
             jm.src_embeddings(j(src), jm.shared_embeddings), real_src),
            ("encoder", tm.encoder(t(memory), t_cross), jm.encoder(j(memory), j_cross),
             real_src),
            ("cross-attention", tl.cross_attention(t(x), t(memory), t_cross),
             jl.cross_attention(j(x), j(memory), j_cross), real_tgt),
            ("decoder layer", tl(t(x), t(memory), t_self, t_cross),
             jl(j(x), j(memory), j_self, j_cross), real_tgt),
            ("decoder", tm.decoder(t(x), t(memory), t_self, t_cross),
             jm.decoder(j(x), j(memory), j_self, j_cross), real_tgt),
            ("Transformer: logits (masks from pad ids)", tm(t(src), t(tgt)),
             jm(j(src), j(tgt)), real_tgt),
        ]
    for name, expected, actual, rows in cases:
        yield compare("transformer", name, expected, actual, rows)
    yield from full_model("transformer", "Transformer", ("logits",), tm, jm,
                          (src, tgt, src_mask, tgt_mask), (real_tgt,))
