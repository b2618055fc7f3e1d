"""References written here from the raw weights in float64 numpy, independent of both twins
(issue 12, item 7a): a bug written the same way on both sides passes twin parity, not these.

No ``jaxformer.nn`` / ``torch_ref.nn`` code computes an expected value: weights come out of the
torch ``state_dict``, masks are built in numpy from the ``[batch, seq]`` inputs, and LayerNorm,
GELU, attention, the sinusoidal table and positions under padding are written out again. Tested:
each family's embeddings, read *inside* the model call (BERT; GPT with positions that follow
real tokens under left and middle padding; the encoder-decoder, sinusoidal or learned, shared
tables); a whole BERT; whole encoder-decoders with a padded source and a left-padded target
(numpy attention, and torch SDPA in float64 with the numpy masks); ``MultiHeadAttention``
against SDPA with numpy masks.

Bound: DESIGN.md's 1e-5 scale-relative. Measured float32-vs-float64 (each test, both frameworks,
CPU): embeddings 0 .. 1.5e-7, BERT 1.8e-7 .. 6.5e-7, encoder-decoders 1.0e-7 .. 3.9e-7 (numpy
or SDPA kernel alike), attention 2.4e-7 .. 3.3e-7: float32 rounding, 15x under the bound.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.special import erf
from torch.nn.attention import SDPBackend, sdpa_kernel

from jaxformer.config import BertConfig, GPTConfig, TransformerConfig
from jaxformer.models import bert as jb
from jaxformer.models import encoder_decoder as jed
from jaxformer.models import gpt as jg
from jaxformer.nn import attention as jattn
from parity_tests.support.helpers import FORWARD_RTOL, max_rel_diff
from parity_tests.support.twins import call, compiled, random_twins
from torch_ref.models import bert as tb
from torch_ref.models import encoder_decoder as ted
from torch_ref.models import gpt as tg
from torch_ref.nn import attention as tattn

B, T, S = 3, 7, 8
FRAMEWORKS = ["jax", "torch"]

# ------------------------------------------------------------------------------------------------
# the formulas


def layer_norm(x, w, prefix, eps):
    centred = x - x.mean(-1, keepdims=True)
    var = (centred**2).mean(-1, keepdims=True)
    return centred / np.sqrt(var + eps) * w[prefix + ".weight"] + w[prefix + ".bias"]


def dense(x, w, prefix):
    out = x @ w[prefix + ".weight"].T
    return out + w[prefix + ".bias"] if prefix + ".bias" in w else out


ACTIVATION = {
    "gelu": lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                  * (x + 0.044715 * x**3))),
    "relu": lambda x: np.maximum(x, 0),
}


def numpy_softmax_attention(q, k, v, allowed):
    """``(B, nh, T, hs)``; ``allowed`` ``(B, 1, T, S)`` bool. A row with no allowed key gets a
    uniform softmax (the documented convention; such rows are never compared)."""
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    scores = np.where(allowed, scores, -np.inf)
    scores = np.where(allowed.any(-1, keepdims=True), scores, 0.0)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


def sdpa_attention(q, k, v, allowed):
    """torch's SDPA (math backend, float64) with the numpy boolean mask, True = may attend."""
    allowed = allowed | ~allowed.any(-1, keepdims=True)  # no key at all: attend to every key
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(
            *(torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v)),
            attn_mask=torch.from_numpy(np.ascontiguousarray(allowed))).numpy()


def multi_head(x, context, w, prefix, allowed, heads, kernel=numpy_softmax_attention):
    def split(h):  # (B, L, C) -> (B, nh, L, hs)
        return h.reshape(h.shape[0], h.shape[1], heads, -1).transpose(0, 2, 1, 3)

    def key(name):
        return f"{prefix}.{name}" if prefix else name

    q, k, v = (split(dense(h, w, key(name)))
               for h, name in ((x, "query"), (context, "key"), (context, "value")))
    y = kernel(q, k, v, allowed).transpose(0, 2, 1, 3).reshape(x.shape)
    return dense(y, w, key("output"))


def residual(x, sublayer, w, norm, config):
    """One sub-layer with its residual: post-LN ``norm(x + f(x))``, pre-LN ``x + f(norm(x))``."""
    if config.pre_norm:
        return x + sublayer(layer_norm(x, w, norm, config.layer_norm_eps))
    return layer_norm(x + sublayer(x), w, norm, config.layer_norm_eps)


def feed_forward(x, w, prefix, config):
    return dense(ACTIVATION[config.activation](dense(x, w, prefix + ".fc1")), w, prefix + ".fc2")


def encoder_block(x, w, prefix, allowed, config, kernel):
    x = residual(x, lambda h: multi_head(h, h, w, prefix + ".attention", allowed,
                                         config.num_heads, kernel),
                 w, prefix + ".attention_norm", config)
    return residual(x, lambda h: feed_forward(h, w, prefix + ".feed_forward", config), w,
                    prefix + ".ffn_norm", config)


def key_padding(mask):
    """``[B, S]`` 1/0 -> ``(B, 1, 1, S)`` bool: every query may see the real keys."""
    return np.asarray(mask).astype(bool)[:, None, None, :]


def sinusoid(length: int, d: int) -> np.ndarray:
    """Vaswani et al. 3.5: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(same); d even."""
    angle = np.arange(length)[:, None] / 10000 ** (np.arange(0, d, 2)[None, :] / d)
    return np.stack([np.sin(angle), np.cos(angle)], axis=-1).reshape(length, d)


def positions_of_real_tokens(mask) -> np.ndarray:
    """Position of each real token = the number of real tokens before it (padding: unused)."""
    return np.array([[int(row[:t].sum()) for t in range(len(row))] for row in mask])


def weights_of(torch_model) -> dict[str, np.ndarray]:
    return {k: v.detach().double().numpy() for k, v in torch_model.state_dict().items()}


# ------------------------------------------------------------------------------------------------
# recording a sub-module's output inside a model call


def run_recording(model, framework: str, names: list[str], args: dict, method=None) -> dict:
    """Call ``model`` (or ``model.<method>``) eagerly on ``args``; -> {name: the output of
    ``model.<name>`` during that call}."""
    recorded, restore = {}, {}
    for name in names:
        inner = getattr(model, name)
        if framework == "torch":
            restore[name] = inner.register_forward_hook(
                lambda _, __, out, name=name: recorded.__setitem__(name, out.detach().numpy()))
        else:
            def recording(*a, inner=inner, name=name, **kw):
                recorded[name] = out = inner(*a, **kw)
                return out
            restore[name] = inner
            setattr(model, name, recording)
    try:
        call(model if method is None else getattr(model, method), framework, args)
    finally:
        for name, handle in restore.items():
            handle.remove() if framework == "torch" else setattr(model, name, handle)
    return recorded


def assert_matches(expected, got, where=None, what="output"):
    diff = max_rel_diff(expected, np.asarray(got.detach() if isinstance(got, torch.Tensor)
                                             else got, np.float64), where)
    assert diff <= FORWARD_RTOL, f"{what}: {diff:.3g} from the float64 reference"


# ------------------------------------------------------------------------------------------------
# embeddings


BERT_CONFIGS = {
    "tiny": BertConfig.tiny(),  # embedding LayerNorm, eps 1e-12, GELU, tied MLM head
    "d2l": dataclasses.replace(BertConfig.d2l_bert(), vocab_size=99, hidden_size=32,
                               num_heads=4, intermediate_size=37, max_position_embeddings=64),
}


def bert_embeddings(w, config, ids, segments):
    e = "bert.embeddings."
    x = (w[e + "word_embeddings.weight"][ids] + w[e + "position_embeddings.weight"][:ids.shape[1]]
         + w[e + "token_type_embeddings.weight"][segments])
    return layer_norm(x, w, e + "layer_norm", config.layer_norm_eps) \
        if config.embedding_layer_norm else x


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("name", list(BERT_CONFIGS))
def test_bert_embeddings_formula(name, framework):
    config = BERT_CONFIGS[name]
    twins = random_twins(tb.BertForPreTraining, jb.BertForPreTraining, config)
    w = weights_of(twins[0])
    rng = np.random.RandomState(0)
    ids = rng.randint(0, config.vocab_size, (B, T))
    segments = rng.randint(0, config.type_vocab_size, (B, T))
    got = run_recording(twins[0 if framework == "torch" else 1].bert, framework, ["embeddings"],
                        {"input_ids": ids, "token_type_ids": segments})
    assert_matches(bert_embeddings(w, config, ids, segments), got["embeddings"],
                   what="BERT embeddings")


GPT_CONFIGS = {
    "gpt2": GPTConfig.tiny(),
    "embedding_ln": dataclasses.replace(GPTConfig.tiny(), embedding_layer_norm=True,
                                        layer_norm_eps=1e-12),
}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("padding", ["none", "left", "middle"])
@pytest.mark.parametrize("name", list(GPT_CONFIGS))
def test_gpt_embeddings_formula(name, padding, framework):
    """Inside ``GPT.hidden_states``: a real token's position counts the real tokens before it."""
    config = GPT_CONFIGS[name]
    twins = random_twins(tg.GPT, jg.GPT, config)
    w = weights_of(twins[0])
    ids = np.random.RandomState(1).randint(0, config.vocab_size, (B, T))
    mask = np.ones((B, T), np.int64)
    if padding == "left":
        mask[1, :3], mask[2, :5] = 0, 0
    elif padding == "middle":
        mask[1, 2:4], mask[2, 1:6] = 0, 0
    positions = positions_of_real_tokens(mask)
    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][positions])
    if config.embedding_layer_norm:
        x = layer_norm(x, w, "embeddings.layer_norm", config.layer_norm_eps)
    args = {"input_ids": ids} if padding == "none" else {"input_ids": ids, "attention_mask": mask}
    got = run_recording(twins[0 if framework == "torch" else 1], framework, ["embeddings"], args,
                        method="hidden_states")
    assert_matches(x, got["embeddings"], where=mask.astype(bool), what="GPT embeddings")


ED_CONFIGS = {
    "post_ln": TransformerConfig.tiny(),  # sinusoidal, scaled, separate tables, untied
    # every other switch at once: pre-LN, final norms, learned positions, one shared table, tied
    "pre_ln_shared_learned": dataclasses.replace(
        TransformerConfig.tiny(), src_vocab_size=29, pre_norm=True, final_layer_norm=True,
        position_embedding_type="learned", share_embeddings=True, tie_word_embeddings=True,
        activation="gelu"),
}


def ed_embeddings(w, config, ids, side):
    table = w["shared_embeddings.weight" if config.share_embeddings
              else f"{side}_embeddings.token_embeddings.weight"]
    scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0
    length = ids.shape[1]
    if config.position_embedding_type == "learned":
        positions = w[f"{side}_embeddings.position_embeddings.weight"][:length]
    else:
        positions = sinusoid(length, config.hidden_size)
    return table[ids] * scale + positions[None]


def ed_inputs(config, seed: int = 2):
    """Source padded at the end and in the middle, target left-padded (row 2 has no real target
    token before position 4): the masks the twins' mask code builds for the decoder."""
    rng = np.random.RandomState(seed)
    src_mask = np.ones((B, S), np.int64)
    src_mask[1, 6:], src_mask[2, 2:5] = 0, 0
    tgt_mask = np.ones((B, T), np.int64)
    tgt_mask[1, :2], tgt_mask[2, :4] = 0, 0
    src = np.where(src_mask == 1, rng.randint(1, config.src_vocab_size, (B, S)), config.src_pad_id)
    tgt = np.where(tgt_mask == 1, rng.randint(1, config.tgt_vocab_size, (B, T)), config.tgt_pad_id)
    return {"src_ids": src, "tgt_ids": tgt, "src_mask": src_mask, "tgt_mask": tgt_mask}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("name", list(ED_CONFIGS))
def test_encoder_decoder_embeddings_formula(name, framework):
    """Both sides' embeddings as the full model call computes them."""
    config = ED_CONFIGS[name]
    twins = random_twins(ted.Transformer, jed.Transformer, config)
    w = weights_of(twins[0])
    args = ed_inputs(config)
    got = run_recording(twins[0 if framework == "torch" else 1], framework,
                        ["src_embeddings", "tgt_embeddings"], args)
    assert_matches(ed_embeddings(w, config, args["src_ids"], "src"), got["src_embeddings"],
                   what="source embeddings")
    assert_matches(ed_embeddings(w, config, args["tgt_ids"], "tgt"), got["tgt_embeddings"],
                   what="target embeddings")


def test_sinusoid_formula_is_the_paper_s():
    """The table above, spot-checked against hand values: PE(0) = [0, 1, 0, 1...],
    PE(1, 0) = sin 1, PE(1, 1) = cos 1, PE(p, d-2) = sin(p / 10000^((d-2)/d))."""
    table = sinusoid(5, 8)
    np.testing.assert_array_equal(table[0], [0, 1] * 4)
    np.testing.assert_allclose([table[1, 0], table[1, 1], table[3, 6]],
                               [math.sin(1), math.cos(1), math.sin(3 / 10000 ** (6 / 8))],
                               rtol=1e-14)


# ------------------------------------------------------------------------------------------------
# whole models


def bert_reference(w, config, ids, segments, mask):
    x = bert_embeddings(w, config, ids, segments)
    for i in range(config.num_layers):
        x = encoder_block(x, w, f"bert.encoder.layers.{i}", key_padding(mask), config,
                          numpy_softmax_attention)
    pooled = np.tanh(dense(x[:, 0], w, "bert.pooler.dense"))
    h = layer_norm(ACTIVATION[config.activation](dense(x, w, "mlm.dense")), w, "mlm.layer_norm",
                   config.layer_norm_eps)
    decoder = w["bert.embeddings.word_embeddings.weight"] if config.tie_word_embeddings \
        else w["mlm.decoder.weight"]
    return x, h @ decoder.T + w["mlm.bias"], dense(pooled, w, "nsp.classifier")


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("name", list(BERT_CONFIGS))
def test_bert_for_pretraining_against_float64_reference(name, framework):
    config = BERT_CONFIGS[name]
    torch_model, _ = random_twins(tb.BertForPreTraining, jb.BertForPreTraining, config)
    rng = np.random.RandomState(3)
    mask = np.ones((B, T), np.int64)
    mask[1, 5:], mask[2, 2:] = 0, 0  # right padding ([CLS] stays real for the pooler)
    ids = np.where(mask == 1, rng.randint(1, config.vocab_size, (B, T)), config.pad_token_id)
    segments = (np.arange(T)[None] >= np.array([[3], [2], [1]])).astype(np.int64)
    expected = bert_reference(weights_of(torch_model), config, ids, segments, mask)
    args = {"input_ids": ids, "token_type_ids": segments, "attention_mask": mask}
    got = call(torch_model if framework == "torch" else
               compiled(tb.BertForPreTraining, jb.BertForPreTraining, config), framework, args)
    real = mask.astype(bool)
    for what, e, g, where in zip(("sequence output", "MLM logits", "NSP logits"), expected, got,
                                 (real, real, None)):
        assert_matches(e, g, where, what)


def encoder_decoder_reference(w, config, src, tgt, src_mask, tgt_mask, kernel):
    """The whole encoder-decoder from the raw weights; ``kernel`` computes softmax attention."""
    eps, heads = config.layer_norm_eps, config.num_heads
    x = ed_embeddings(w, config, src, "src")
    for i in range(config.num_encoder_layers):
        x = encoder_block(x, w, f"encoder.layers.{i}", key_padding(src_mask), config, kernel)
    memory = layer_norm(x, w, "encoder.final_norm", eps) if config.final_layer_norm else x
    length = tgt.shape[1]
    causal = np.arange(length)[None, :] <= np.arange(length)[:, None]  # key j <= query i
    self_allowed = causal[None, None] & key_padding(tgt_mask)  # (B, 1, T, T)
    y = ed_embeddings(w, config, tgt, "tgt")
    for i in range(config.num_decoder_layers):
        p = f"decoder.layers.{i}"
        y = residual(y, lambda h, p=p: multi_head(h, h, w, p + ".self_attention", self_allowed,
                                                  heads, kernel),
                     w, p + ".self_attention_norm", config)
        y = residual(y, lambda h, p=p: multi_head(h, memory, w, p + ".cross_attention",
                                                  key_padding(src_mask), heads, kernel),
                     w, p + ".cross_attention_norm", config)
        y = residual(y, lambda h, p=p: feed_forward(h, w, p + ".feed_forward", config), w,
                     p + ".ffn_norm", config)
    if config.final_layer_norm:
        y = layer_norm(y, w, "decoder.final_norm", eps)
    if not config.tie_word_embeddings:
        return dense(y, w, "output_projection")
    table = "shared_embeddings" if config.share_embeddings else "tgt_embeddings.token_embeddings"
    return y @ w[table + ".weight"].T


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("kernel", ["numpy", "sdpa"])
@pytest.mark.parametrize("name", list(ED_CONFIGS))
def test_encoder_decoder_against_float64_reference(name, kernel, framework):
    """Padded source, left-padded target: the decoder's self-attention mask (causal AND target
    padding) and the cross-attention's source padding mask are built here in numpy."""
    config = ED_CONFIGS[name]
    torch_model, _ = random_twins(ted.Transformer, jed.Transformer, config)
    args = ed_inputs(config, seed=4)
    expected = encoder_decoder_reference(
        weights_of(torch_model), config, *args.values(),
        kernel={"numpy": numpy_softmax_attention, "sdpa": sdpa_attention}[kernel])
    got = call(torch_model if framework == "torch" else
               compiled(ted.Transformer, jed.Transformer, config), framework, args)
    assert_matches(expected, got, where=args["tgt_mask"].astype(bool), what="logits")


# ------------------------------------------------------------------------------------------------
# attention against SDPA, masks in numpy

CAUSAL = (np.arange(T)[None, :] <= np.arange(T)[:, None])[None, None]
MASKS = {  # name: (query length, key length, (B, 1, T, S) bool mask built in numpy)
    "left_padding": (T, T, key_padding([[1] * 7, [0, 0] + [1] * 5, [0] * 6 + [1]])),
    "middle_padding_causal": (T, T, CAUSAL & key_padding([[1] * 7, [1, 0, 0, 1, 1, 1, 1],
                                                          [1, 1, 1, 0, 0, 0, 1]])),
    "cross_padding": (T, S, key_padding([[1] * 8, [1] * 5 + [0] * 3, [0] * 4 + [1] * 4])),
}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("kind", list(MASKS))
def test_multi_head_attention_against_sdpa(kind, framework):
    q_len, k_len, allowed = MASKS[kind]
    config = BertConfig.tiny()
    torch_mha, jax_mha = random_twins(tattn.MultiHeadAttention, jattn.MultiHeadAttention, config)
    w = weights_of(torch_mha)
    rng = np.random.RandomState(5)
    args = {"hidden_states": rng.randn(B, q_len, 32).astype(np.float32), "mask": allowed}
    if kind == "cross_padding":
        args["context"] = rng.randn(B, k_len, 32).astype(np.float32)
    x = args["hidden_states"].astype(np.float64)
    context = args["context"].astype(np.float64) if "context" in args else x
    expected = multi_head(x, context, w, "", allowed, config.num_heads, sdpa_attention)
    got = call(torch_mha if framework == "torch" else jax_mha, framework, args)
    assert_matches(expected, got, where=allowed.any(-1)[:, 0], what=f"attention ({kind})")
