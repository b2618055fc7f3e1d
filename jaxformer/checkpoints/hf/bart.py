"""BART (``model_type: bart``) for the Hugging Face engine: ``BartForConditionalGeneration`` is
the encoder-decoder :class:`jaxformer.models.encoder_decoder.Transformer` with learned positions
read two rows on (``position_offset=2``), a LayerNorm on each side's embeddings, GELU, one
shared vocabulary and ``final_logits_bias``. The key table of the layers is shared with MarianMT
(``marian.py``), whose modelling code transformers copies from BART's. What loads, what is
refused and why: `docs/huggingface.md`.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import ClassVar

from jaxformer.checkpoints.hf.engine import (
    OUR_ACTIVATIONS,
    Architecture,
    Family,
    Options,
    Rule,
    UnsupportedConfigError,
    activation,
    build_config,
    layer_norm,
    linear,
    refuse_export,
    require,
    required_int,
)
from jaxformer.config import TransformerConfig

# torch.nn.LayerNorm's default, which transformers' BART and Marian layers use (not configurable)
HF_LAYER_NORM_EPS = 1e-5


def _attention(hf: str, ours: str) -> list[Rule]:
    return [*linear(f"{hf}.q_proj", f"{ours}.query"), *linear(f"{hf}.k_proj", f"{ours}.key"),
            *linear(f"{hf}.v_proj", f"{ours}.value"), *linear(f"{hf}.out_proj", f"{ours}.output")]


def _in_stack(rules: list[Rule], layers: str) -> list[Rule]:
    return [dataclasses.replace(r, layers=layers) for r in rules]


_E, _OE = "encoder.layers.{i}", "encoder.layers.{i}"
_D, _OD = "decoder.layers.{i}", "decoder.layers.{i}"
LAYERS = [  # BART's and Marian's encoder and decoder layers (post-LN, biases everywhere)
    *_in_stack([
        *_attention(f"{_E}.self_attn", f"{_OE}.attention"),
        *layer_norm(f"{_E}.self_attn_layer_norm", f"{_OE}.attention_norm"),
        *linear(f"{_E}.fc1", f"{_OE}.feed_forward.fc1"),
        *linear(f"{_E}.fc2", f"{_OE}.feed_forward.fc2"),
        *layer_norm(f"{_E}.final_layer_norm", f"{_OE}.ffn_norm"),
    ], "num_encoder_layers"),
    *_in_stack([
        *_attention(f"{_D}.self_attn", f"{_OD}.self_attention"),
        *layer_norm(f"{_D}.self_attn_layer_norm", f"{_OD}.self_attention_norm"),
        *_attention(f"{_D}.encoder_attn", f"{_OD}.cross_attention"),
        *layer_norm(f"{_D}.encoder_attn_layer_norm", f"{_OD}.cross_attention_norm"),
        *linear(f"{_D}.fc1", f"{_OD}.feed_forward.fc1"),
        *linear(f"{_D}.fc2", f"{_OD}.feed_forward.fc2"),
        *layer_norm(f"{_D}.final_layer_norm", f"{_OD}.ffn_norm"),
    ], "num_decoder_layers"),
]


def token_embeddings(config: TransformerConfig, unused_shared: bool = False) -> list[Rule]:
    """``shared`` (one table, read by both sides) or one table per side; ``unused_shared``: the
    model keeps a ``shared`` table its forward never reads (BART untied, see ``untied_tables``).
    """
    if config.share_embeddings:
        return [Rule("shared.weight", "shared_embeddings.weight"),
                Rule("encoder.embed_tokens.weight", "shared_embeddings.weight", role="tied"),
                Rule("decoder.embed_tokens.weight", "shared_embeddings.weight", role="tied")]
    return [Rule("encoder.embed_tokens.weight", "src_embeddings.token_embeddings.weight"),
            Rule("decoder.embed_tokens.weight", "tgt_embeddings.token_embeddings.weight"),
            *([Rule("shared.weight", "src_embeddings.token_embeddings.weight", role="unused")]
              if unused_shared else [])]


# transformers 5 ties weights only when tie_word_embeddings is true, and then all of them: the
# head to the target table *and* the two sides' tables to ``shared``. With it false, a "shared"
# BART or Marian model computes with three independent tables (``shared`` itself unread). So
# jaxformer imports tie_word_embeddings=false as share_embeddings=False (one table per side, as
# transformers computes), and exports only share_embeddings == tie_word_embeddings (Marian with
# separate vocabularies excepted, which ties nothing but the head).
def untied_tables(config: TransformerConfig, what: str) -> None:
    if config.share_embeddings and not config.tie_word_embeddings:
        raise UnsupportedConfigError(
            f"cannot export as {what}: transformers shares the source and target tables only "
            f"together with the head (tie_word_embeddings); the model has share_embeddings=True, "
            f"tie_word_embeddings=False")


def head(config: TransformerConfig) -> list[Rule]:
    """``lm_head`` (tied to the target table or our ``output_projection``) and
    ``final_logits_bias``: ours, or the untied projection's bias when the model has no
    ``final_logits_bias`` (both add one vector to the logits)."""
    table = ("shared_embeddings.weight" if config.share_embeddings
             else "tgt_embeddings.token_embeddings.weight")
    rules = [Rule("lm_head.weight", table, role="tied") if config.tie_word_embeddings
             else Rule("lm_head.weight", "output_projection.weight")]
    if config.final_logits_bias:
        rules.append(Rule("final_logits_bias", "final_logits_bias.bias", "row"))
    elif not config.tie_word_embeddings:
        rules.append(Rule("final_logits_bias", "output_projection.bias", "row"))
    return rules


def same_both_sides(hf: dict, field: str, ours: str, source: str) -> int:
    """``encoder_<field>`` and ``decoder_<field>``: jaxformer has one value for both stacks."""
    enc = required_int(hf, f"encoder_{field}", source)
    dec = required_int(hf, f"decoder_{field}", source)
    if enc != dec:
        raise UnsupportedConfigError(f"{source}: encoder_{field}={enc} differs from decoder_"
                                     f"{field}={dec}; jaxformer's {ours} is one value for both")
    return enc


def refuse_options(hf: dict, source: str, allowed: dict) -> None:
    """Options of older (fairseq-era) configs that transformers' model ignores but that say the
    weights were trained for another computation: each must hold the value this family
    computes, or be absent."""
    for field, (want, why) in allowed.items():
        require(hf, field, (want, None), want, why, source)


def training_only(hf: dict, source: str) -> None:
    for field in ("activation_dropout", "encoder_layerdrop", "decoder_layerdrop"):
        if hf.get(field, 0.0):
            warnings.warn(f"{source}: {field}={hf[field]} is not implemented (training only: "
                          f"outputs in eval mode are unaffected)", stacklevel=4)


def common_config(hf: dict, source: str, **fields) -> TransformerConfig:
    """The fields BART and MarianMT map the same way, plus the family's ``fields``."""
    pad = hf.get("pad_token_id")
    if pad is None:
        raise UnsupportedConfigError(f"{source}: pad_token_id is missing; jaxformer needs it "
                                     f"to mask padding")
    training_only(hf, source)
    return build_config(
        TransformerConfig, source, hidden_size=required_int(hf, "d_model", source),
        num_encoder_layers=required_int(hf, "encoder_layers", source),
        num_decoder_layers=required_int(hf, "decoder_layers", source),
        num_heads=same_both_sides(hf, "attention_heads", "num_heads", source),
        intermediate_size=same_both_sides(hf, "ffn_dim", "intermediate_size", source),
        max_position_embeddings=required_int(hf, "max_position_embeddings", source),
        activation=activation(hf, "activation_function", "gelu", source),
        layer_norm_eps=HF_LAYER_NORM_EPS, dropout_rate=hf.get("dropout", 0.1),
        attention_dropout_rate=hf.get("attention_dropout", 0.0),
        scale_embeddings=bool(hf.get("scale_embedding", False)),
        tie_word_embeddings=hf.get("tie_word_embeddings", True), pre_norm=False,
        final_layer_norm=False, final_logits_bias=True, src_pad_id=pad, tgt_pad_id=pad,
        initializer_range=hf.get("init_std", 0.02), **fields)


def common_export(config: TransformerConfig, what: str) -> dict:
    """``config.json`` fields BART and MarianMT share; refuses what neither computes."""
    for field, want in (("pre_norm", False), ("final_layer_norm", False),
                        ("layer_norm_eps", HF_LAYER_NORM_EPS)):
        refuse_export(config, field, want, what)
    if config.src_pad_id != config.tgt_pad_id:
        raise UnsupportedConfigError(f"cannot export as {what}: it has one pad_token_id, the "
                                     f"model has src_pad_id={config.src_pad_id} and tgt_pad_id="
                                     f"{config.tgt_pad_id}")
    # Generation settings (eos, forced eos, beams) are not part of a jaxformer model: the export
    # does not invent them. decoder_start_token_id = pad is Marian's convention.
    return {"d_model": config.hidden_size, "encoder_layers": config.num_encoder_layers,
            "decoder_layers": config.num_decoder_layers,
            "encoder_attention_heads": config.num_heads,
            "decoder_attention_heads": config.num_heads,
            "encoder_ffn_dim": config.intermediate_size,
            "decoder_ffn_dim": config.intermediate_size,
            "max_position_embeddings": config.max_position_embeddings,
            "activation_function": OUR_ACTIVATIONS[config.activation],
            "dropout": config.dropout_rate, "attention_dropout": config.attention_dropout_rate,
            "activation_dropout": 0.0, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
            "init_std": config.initializer_range, "scale_embedding": config.scale_embeddings,
            "pad_token_id": config.tgt_pad_id, "decoder_start_token_id": config.tgt_pad_id,
            "bos_token_id": None, "eos_token_id": None, "forced_eos_token_id": None,
            "is_encoder_decoder": True}


_BART_ONLY = {"normalize_before": (False, "BART is post-LN"),
              "add_final_layer_norm": (False, "BART has no LayerNorm after each stack"),
              "normalize_embedding": (True, "BART normalises its embeddings"),
              "add_bias_logits": (False, "BART's logits have final_logits_bias only"),
              "static_position_embeddings": (False, "BART's positions are learned"),
              "extra_pos_embeddings": (2, "BART's position table is offset by 2")}


class BartFamily(Family):
    model_type = "bart"
    module = "encoder_decoder"
    base_prefix = "model."
    buffers = (r"(en|de)coder\.version",)  # fairseq's version stamps
    exports: ClassVar[dict[str, str]] = {"Transformer": "BartForConditionalGeneration"}

    def exports_config(self, config) -> bool:
        return config.position_embedding_type == "learned"

    def architectures(self) -> tuple[Architecture, ...]:
        return (Architecture("BartForConditionalGeneration", self, "Transformer", "model.", ""),)

    def key_table(self, arch: Architecture, config: TransformerConfig,
                  options: Options) -> list[tuple[Rule, bool]]:
        base = [*token_embeddings(config, unused_shared=True), *LAYERS]
        for side, ours in (("encoder", "src_embeddings"), ("decoder", "tgt_embeddings")):
            base += [Rule(f"{side}.embed_positions.weight", f"{ours}.position_embeddings.weight"),
                     *layer_norm(f"{side}.layernorm_embedding", f"{ours}.layer_norm")]
        return [(r, True) for r in base] + [(r, False) for r in head(config)]

    def config_from_hf(self, hf: dict, arch: Architecture, source: str) -> TransformerConfig:
        refuse_options(hf, source, _BART_ONLY)
        require(hf, "is_decoder", (False, None), False, "BartForConditionalGeneration is an "
                "encoder-decoder", source)
        vocab = required_int(hf, "vocab_size", source)
        return common_config(hf, source, src_vocab_size=vocab, tgt_vocab_size=vocab,
                             share_embeddings=bool(hf.get("tie_word_embeddings", True)),
                             position_embedding_type="learned",
                             position_offset=2, embedding_layer_norm=True)

    def config_to_hf(self, config: TransformerConfig, arch: Architecture) -> dict:
        what = "BART"
        for field, want in (("position_embedding_type", "learned"), ("position_offset", 2),
                            ("embedding_layer_norm", True),
                            ("src_vocab_size", config.tgt_vocab_size)):
            refuse_export(config, field, want, what)
        untied_tables(config, what)
        if config.tie_word_embeddings and not config.share_embeddings:
            raise UnsupportedConfigError(f"cannot export as {what}: a tied head ties the source "
                                         f"and target tables too; the model has "
                                         f"share_embeddings=False, tie_word_embeddings=True")
        return {**common_export(config, what), "vocab_size": config.tgt_vocab_size,
                "forced_bos_token_id": None}


FAMILY = BartFamily()
