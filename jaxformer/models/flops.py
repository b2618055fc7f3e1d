"""FLOP and parameter counts of the three families, from a config and the shapes alone.

Standard library only, so ``torch_ref``, the benchmarks and a training loop import it without JAX
(as nanoGPT keeps ``estimate_mfu`` beside its model). What is counted and why is written above
the building blocks; `parity_tests/models/test_flops.py` measures it against XLA's own count.
"""

from __future__ import annotations

from jaxformer.config import BertConfig, GPTConfig, TransformerConfig

# BERT model classes (jaxformer.models.bert) -> (pooler, masked-LM head, NSP head, classifier).
BERT_MODELS = {
    "BertModel": (True, False, False, False),
    "BertForMaskedLM": (False, True, False, False),
    "BertForPreTraining": (True, True, True, False),
    "BertForSequenceClassification": (True, False, False, True),
}


# What is counted: every matrix product the forward pass runs, 2 FLOPs per multiply-add:
# - the linear projections: query, key, value and output of every attention layer, the two
#   feed-forward layers, the BERT pooler and heads, the LM head / output projection (tied or not:
#   a tied head is the same product with the embedding matrix);
# - the attention products, scores Q K^T and the weighted sum P V: 2 * 2 * B * Tq * Tk * C per
#   attention layer, all heads together (heads x head size = C).
# Every position is counted, padded ones included, and the whole Tq x Tk score matrix under a
# causal mask: that dense computation is what both frameworks execute (neither skips masked
# blocks). Cross-attention projects its keys and values from the memory in every decoder layer of
# every call, as jaxformer/models/encoder_decoder.py does.
#
# Not counted: element-wise work (bias and residual adds, LayerNorm, softmax, GELU / ReLU / tanh,
# masking, scaling, embedding scale, dropout) and embedding lookups (gathers, no arithmetic). On
# the presets that is a few percent of XLA's own count, more on tiny test configs
# (parity_tests/models/test_flops.py measures the gap).
#
# Training step: 3 x forward, the usual convention (Kaplan et al., 2020; the PaLM paper's MFU):
# the backward pass runs two products per forward product, one for the gradient of the input and
# one for the gradient of the weight. Optimizer updates and the loss are not counted.
#
# Shapes: B batch, T sequence length (S source, Tt target for the encoder-decoder), C hidden size,
# I feed-forward size, L layers, V vocabulary, P positions table, nh heads.

# ----------------------------------------------------------------------------- building blocks

def linear_flops(tokens: int, in_features: int, out_features: int) -> int:
    """``(tokens, in) @ (in, out)``."""
    return 2 * tokens * in_features * out_features


def self_attention_flops(hidden_size: int, batch: int, seq: int, key_len: int | None = None) -> int:
    """q, k, v and output projections of ``batch * seq`` new tokens, then scores and weighted
    values against ``key_len`` keys (default ``seq``; larger when earlier keys come from a
    cache)."""
    C, keys = hidden_size, seq if key_len is None else key_len
    return 4 * linear_flops(batch * seq, C, C) + 2 * (2 * batch * seq * keys * C)


def cross_attention_flops(hidden_size: int, batch: int, tgt_len: int, src_len: int) -> int:
    """q and output projections of the target tokens, k and v projections of the memory, then
    ``tgt_len x src_len`` scores and weighted values."""
    C = hidden_size
    return (2 * linear_flops(batch * tgt_len, C, C) + 2 * linear_flops(batch * src_len, C, C)
            + 2 * (2 * batch * tgt_len * src_len * C))


def feed_forward_flops(config, tokens: int) -> int:
    return (linear_flops(tokens, config.hidden_size, config.intermediate_size)
            + linear_flops(tokens, config.intermediate_size, config.hidden_size))


def block_flops(config, batch: int, seq: int, key_len: int | None = None) -> int:
    """One ``TransformerBlock`` (self-attention + feed-forward) on ``batch x seq`` tokens."""
    return (self_attention_flops(config.hidden_size, batch, seq, key_len)
            + feed_forward_flops(config, batch * seq))


def decoder_layer_flops(config: TransformerConfig, batch: int, tgt_len: int, src_len: int) -> int:
    """One ``DecoderLayer``: causal self-attention, cross-attention, feed-forward."""
    C = config.hidden_size
    return (self_attention_flops(C, batch, tgt_len) + cross_attention_flops(C, batch, tgt_len,
                                                                            src_len)
            + feed_forward_flops(config, batch * tgt_len))


# ----------------------------------------------------------------------------- forward FLOPs

def bert_forward_flops(config: BertConfig, batch: int, seq: int, *, model: str = "BertModel",
                       masked_positions: int | None = None) -> int:
    """``model`` is a class of ``jaxformer.models.bert`` (see ``BERT_MODELS``); its masked-LM
    head runs on ``masked_positions`` positions per row (default: all ``seq``)."""
    pooler, mlm, nsp, classifier = _bert_parts(model)
    C, B = config.hidden_size, batch
    flops = config.num_layers * block_flops(config, B, seq)
    if pooler:
        flops += linear_flops(B, C, C)  # the [CLS] vector only
    if mlm:
        tokens = B * (seq if masked_positions is None else masked_positions)
        flops += linear_flops(tokens, C, C) + linear_flops(tokens, C, config.vocab_size)
    if nsp:
        flops += linear_flops(B, C, 2)
    if classifier:
        flops += linear_flops(B, C, config.num_labels)
    return flops


def gpt_forward_flops(config: GPTConfig, batch: int, seq: int) -> int:
    """``GPT`` to logits on ``batch x seq`` tokens. (Cached decoding: compose
    ``self_attention_flops(..., key_len=cache length)`` with the feed-forward and the head.)"""
    return (config.num_layers * block_flops(config, batch, seq)
            + linear_flops(batch * seq, config.hidden_size, config.vocab_size))


def transformer_forward_flops(config: TransformerConfig, batch: int, src_len: int,
                              tgt_len: int) -> int:
    """``Transformer`` to logits: the encoder on ``src_len`` source tokens, the decoder and the
    output projection on ``tgt_len`` target tokens."""
    return (config.num_encoder_layers * block_flops(config, batch, src_len)
            + config.num_decoder_layers * decoder_layer_flops(config, batch, tgt_len, src_len)
            + linear_flops(batch * tgt_len, config.hidden_size, config.tgt_vocab_size))


def forward_flops(config, batch: int, seq: int, tgt_len: int | None = None, **options) -> int:
    """Forward FLOPs of one batch for any family. For the encoder-decoder ``seq`` is the source
    length and ``tgt_len`` the target length (required); ``options`` go to the family's function
    (``model=``, ``masked_positions=`` for BERT)."""
    if isinstance(config, TransformerConfig):
        if tgt_len is None:
            raise ValueError("the encoder-decoder needs tgt_len (the target length)")
        return transformer_forward_flops(config, batch, seq, tgt_len, **options)
    if tgt_len is not None:
        raise ValueError(f"tgt_len is for the encoder-decoder, not {type(config).__name__}")
    if isinstance(config, BertConfig):
        return bert_forward_flops(config, batch, seq, **options)
    if isinstance(config, GPTConfig):
        return gpt_forward_flops(config, batch, seq, **options)
    raise TypeError(f"no FLOP formula for {type(config).__name__}")


def train_step_flops(config, batch: int, seq: int, tgt_len: int | None = None,
                     **options) -> int:
    """Forward + backward of one batch: ``3 x forward_flops`` (see the module docstring)."""
    return 3 * forward_flops(config, batch, seq, tgt_len, **options)


def mfu(flops_per_second: float, peak: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the device's peak FLOP/s (both in
    FLOP/s; the benchmarks use the measured matmul peak, see benchmarks/harness.py)."""
    if not peak > 0:
        raise ValueError(f"peak must be a positive FLOP/s, got {peak!r}")
    return flops_per_second / peak


# ----------------------------------------------------------------------------- parameters

def _linear_params(in_features: int, out_features: int, bias: bool = True) -> int:
    return in_features * out_features + (out_features if bias else 0)


def _block_params(config) -> int:
    """Attention (four C x C projections with bias), feed-forward, two LayerNorms."""
    C, I = config.hidden_size, config.intermediate_size
    return 4 * _linear_params(C, C) + _linear_params(C, I) + _linear_params(I, C) + 2 * (2 * C)


def bert_parameter_count(config: BertConfig, *, model: str = "BertModel") -> int:
    pooler, mlm, nsp, classifier = _bert_parts(model)
    C, V = config.hidden_size, config.vocab_size
    count = (V + config.max_position_embeddings + config.type_vocab_size) * C
    count += 2 * C if config.embedding_layer_norm else 0
    count += config.num_layers * _block_params(config)
    if pooler:
        count += _linear_params(C, C)
    if mlm:  # dense, LayerNorm, the output bias, and a decoder matrix unless tied
        count += _linear_params(C, C) + 2 * C + V
        count += 0 if config.tie_word_embeddings else C * V
    if nsp:
        count += _linear_params(C, 2)
    if classifier:
        count += _linear_params(C, config.num_labels)
    return count


def gpt_parameter_count(config: GPTConfig) -> int:
    C = config.hidden_size
    count = (config.vocab_size + config.max_position_embeddings) * C
    count += 2 * C if config.embedding_layer_norm else 0
    count += config.num_layers * _block_params(config)
    count += 2 * C if config.final_layer_norm else 0
    return count + (0 if config.tie_word_embeddings else C * config.vocab_size)


def transformer_parameter_count(config: TransformerConfig) -> int:
    C = config.hidden_size
    tables = (config.src_vocab_size if config.share_embeddings
              else config.src_vocab_size + config.tgt_vocab_size)
    count = tables * C
    if config.position_embedding_type == "learned":  # one table per side
        count += 2 * (config.max_position_embeddings + config.position_offset) * C
    count += 2 * 2 * C if config.embedding_layer_norm else 0  # one LayerNorm per side
    final_norm = 2 * C if config.final_layer_norm else 0
    count += config.num_encoder_layers * _block_params(config) + final_norm
    decoder_layer = _block_params(config) + 4 * _linear_params(C, C) + 2 * C  # + cross-attention
    count += config.num_decoder_layers * decoder_layer + final_norm
    if not config.tie_word_embeddings:  # its bias is final_logits_bias when there is one
        count += C * config.tgt_vocab_size
    if not config.tie_word_embeddings or config.final_logits_bias:
        count += config.tgt_vocab_size
    return count


def parameter_count(config, **options) -> int:
    """Number of parameters (tied matrices counted once) of the family's model for ``config``;
    ``model=`` picks the BERT class (default ``BertModel``)."""
    if isinstance(config, BertConfig):
        return bert_parameter_count(config, **options)
    if isinstance(config, GPTConfig):
        return gpt_parameter_count(config, **options)
    if isinstance(config, TransformerConfig):
        return transformer_parameter_count(config, **options)
    raise TypeError(f"no parameter count for {type(config).__name__}")


def _bert_parts(model: str) -> tuple[bool, bool, bool, bool]:
    if model not in BERT_MODELS:
        raise ValueError(f"model {model!r} is not one of {tuple(BERT_MODELS)}")
    return BERT_MODELS[model]
