"""GPT-2 (``model_type: gpt2``) for the Hugging Face engine: ``GPT2Model`` and
``GPT2LMHeadModel`` both give :class:`jaxformer.models.gpt.GPT`, export writes
``GPT2LMHeadModel``. GPT-2's ``Conv1D`` weights are ``[in, out]`` (transposed here) and its fused
``c_attn`` is split into our query, key and value. Decisions and reasons: `docs/huggingface.md`.
"""

from __future__ import annotations

import warnings
from typing import ClassVar

from jaxformer.checkpoints.hf.engine import (
    OUR_ACTIVATIONS,
    Architecture,
    Family,
    Options,
    Rule,
    activation,
    build_config,
    layer_norm,
    linear,
    refuse_export,
    require,
    required_int,
)
from jaxformer.config import GPTConfig

_H, _B = "h.{i}", "blocks.{i}"
_QKV = tuple(f"{_B}.attention.{p}" for p in ("query", "key", "value"))
_BASE = [
    Rule("wte.weight", "embeddings.word_embeddings.weight"),
    Rule("wpe.weight", "embeddings.position_embeddings.weight"),
    *layer_norm(f"{_H}.ln_1", f"{_B}.attention_norm"),
    Rule(f"{_H}.attn.c_attn.weight", tuple(f"{a}.weight" for a in _QKV), "conv1d_split_qkv"),
    Rule(f"{_H}.attn.c_attn.bias", tuple(f"{a}.bias" for a in _QKV), "split_qkv"),
    *linear(f"{_H}.attn.c_proj", f"{_B}.attention.output", "conv1d"),
    *layer_norm(f"{_H}.ln_2", f"{_B}.ffn_norm"),
    *linear(f"{_H}.mlp.c_fc", f"{_B}.feed_forward.fc1", "conv1d"),
    *linear(f"{_H}.mlp.c_proj", f"{_B}.feed_forward.fc2", "conv1d"),
    *layer_norm("ln_f", "final_layer_norm"),
]
# GPT2Model has no LM head: our GPT's head is tied to the token embedding, GPT.hidden_states is
# GPT2Model's output and GPT(...) the LM logits.
_ALWAYS_TIED = ("GPT2Model",)  # no LM head of its own: ours reuses the token embedding


class GPT2Family(Family):
    model_type = "gpt2"
    module = "gpt"
    base_prefix = "transformer."
    buffers = (r"h\.\d+\.attn\.bias", r"h\.\d+\.attn\.masked_bias")
    exports: ClassVar[dict[str, str]] = {"GPT": "GPT2LMHeadModel"}

    def architectures(self) -> tuple[Architecture, ...]:
        return (Architecture("GPT2Model", self, "GPT", "", ""),
                Architecture("GPT2LMHeadModel", self, "GPT", "transformer.", ""))

    def key_table(self, arch: Architecture, config: GPTConfig,
                  options: Options) -> list[tuple[Rule, bool]]:
        if config.tie_word_embeddings or arch.name in _ALWAYS_TIED:
            head = Rule("lm_head.weight", "embeddings.word_embeddings.weight", role="tied")
        else:
            head = Rule("lm_head.weight", "lm_head.weight")
        return [(r, True) for r in _BASE] + [(head, False)]

    def config_from_hf(self, hf: dict, arch: Architecture, source: str) -> GPTConfig:
        require(hf, "scale_attn_weights", (True,), True,
                "jaxformer always scales attention scores by 1/sqrt(head_dim)", source)
        require(hf, "scale_attn_by_inverse_layer_idx", (False,), False,
                "jaxformer does not scale attention by 1/layer_idx", source)
        dropout = hf.get("resid_pdrop", 0.1)
        if hf.get("embd_pdrop", dropout) != dropout:
            warnings.warn(f"{source}: embd_pdrop={hf['embd_pdrop']} differs from resid_pdrop="
                          f"{dropout}; jaxformer uses {dropout} for both (training only)",
                          stacklevel=3)
        n_embd = required_int(hf, "n_embd", source)
        return build_config(
            GPTConfig, source, vocab_size=required_int(hf, "vocab_size", source),
            hidden_size=n_embd, num_layers=required_int(hf, "n_layer", source),
            num_heads=required_int(hf, "n_head", source),
            intermediate_size=hf.get("n_inner") or 4 * n_embd,
            max_position_embeddings=required_int(hf, "n_positions", source),
            activation=activation(hf, "activation_function", "gelu_new", source),
            layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5), dropout_rate=dropout,
            attention_dropout_rate=hf.get("attn_pdrop", 0.1),
            pre_norm=True, embedding_layer_norm=False, final_layer_norm=True,
            tie_word_embeddings=hf.get("tie_word_embeddings", True) or arch.name in _ALWAYS_TIED,
            initializer_range=hf.get("initializer_range", 0.02))

    def config_to_hf(self, config: GPTConfig, arch: Architecture) -> dict:
        for field, want in (("pre_norm", True), ("embedding_layer_norm", False),
                            ("final_layer_norm", True)):
            refuse_export(config, field, want, "GPT-2")
        return {"n_embd": config.hidden_size, "n_layer": config.num_layers,
                "n_head": config.num_heads, "n_inner": config.intermediate_size,
                "n_positions": config.max_position_embeddings,
                "activation_function": OUR_ACTIVATIONS[config.activation],
                "resid_pdrop": config.dropout_rate, "embd_pdrop": config.dropout_rate,
                "attn_pdrop": config.attention_dropout_rate,
                "layer_norm_epsilon": config.layer_norm_eps, "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
                "bos_token_id": None, "eos_token_id": None}


FAMILY = GPT2Family()
