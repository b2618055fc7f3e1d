"""BERT (``model_type: bert``) for the Hugging Face engine: four architectures, one key table,
the ``config.json`` mapping. What loads and what is refused, and why: `docs/huggingface.md`.
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
from jaxformer.config import BertConfig

_L, _O = "encoder.layer.{i}", "encoder.layers.{i}"
_BASE = [
    Rule("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    Rule("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    Rule("embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"),
    *layer_norm("embeddings.LayerNorm", "embeddings.layer_norm"),
    *linear(f"{_L}.attention.self.query", f"{_O}.attention.query"),
    *linear(f"{_L}.attention.self.key", f"{_O}.attention.key"),
    *linear(f"{_L}.attention.self.value", f"{_O}.attention.value"),
    *linear(f"{_L}.attention.output.dense", f"{_O}.attention.output"),
    *layer_norm(f"{_L}.attention.output.LayerNorm", f"{_O}.attention_norm"),
    *linear(f"{_L}.intermediate.dense", f"{_O}.feed_forward.fc1"),
    *linear(f"{_L}.output.dense", f"{_O}.feed_forward.fc2"),
    *layer_norm(f"{_L}.output.LayerNorm", f"{_O}.ffn_norm"),
]
_POOLER = linear("pooler.dense", "pooler.dense")


def _mlm_head(config: BertConfig) -> list[Rule]:
    head = [*linear("cls.predictions.transform.dense", "mlm.dense"),
            *layer_norm("cls.predictions.transform.LayerNorm", "mlm.layer_norm")]
    if config.tie_word_embeddings:  # decoder.weight is the word embedding, decoder.bias the bias
        return head + [
            Rule("cls.predictions.bias", "mlm.bias"),
            Rule("cls.predictions.decoder.bias", "mlm.bias", role="tied"),
            Rule("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight",
                 role="tied")]
    # Untied, transformers 5 unties the bias too: its forward adds decoder.bias and never reads
    # cls.predictions.bias (transformers 4 kept them one tensor, so either reading is right).
    return head + [Rule("cls.predictions.decoder.weight", "mlm.decoder.weight"),
                   Rule("cls.predictions.decoder.bias", "mlm.bias"),
                   Rule("cls.predictions.bias", "mlm.bias", role="unused")]


# Per architecture: its head rules, and whether our class has a pooler at all.
_HEADS = {
    "BertModel": (lambda config: [], True),
    "BertForPreTraining": (lambda config: [*_mlm_head(config),
                                           *linear("cls.seq_relationship", "nsp.classifier")],
                           True),
    "BertForMaskedLM": (_mlm_head, False),
    "BertForSequenceClassification": (lambda config: linear("classifier", "classifier"), True),
}
# A BertModel checkpoint saved without pooler.* weights (all or nothing) gives a BertModel with
# add_pooler=False: the sequence output is all such a checkpoint defines, and inventing a random
# pooler would be silent nonsense.
_OPTIONAL_POOLER = ("BertModel",)  # the classes built with add_pooler=False when it is absent


def _num_labels(hf: dict) -> int:
    if hf.get("id2label"):
        return len(hf["id2label"])
    return hf.get("num_labels", 2)


class BertFamily(Family):
    model_type = "bert"
    module = "bert"
    base_prefix = "bert."
    buffers = (r"embeddings\.position_ids", r"embeddings\.token_type_ids")
    exports: ClassVar[dict[str, str]] = {name: name for name in _HEADS}

    def architectures(self) -> tuple[Architecture, ...]:
        heads = (r"cls\..*", r"classifier\..*")
        return (
            Architecture("BertModel", self, "BertModel", "", "", heads),
            Architecture("BertForPreTraining", self, "BertForPreTraining", "bert.", "bert."),
            Architecture("BertForMaskedLM", self, "BertForMaskedLM", "bert.", "bert.",
                         (r"(bert\.)?pooler\..*", r"cls\.seq_relationship\..*")),
            Architecture("BertForSequenceClassification", self, "BertForSequenceClassification",
                         "bert.", "bert."),
        )

    def key_table(self, arch: Architecture, config: BertConfig,
                  options: Options) -> list[tuple[Rule, bool]]:
        heads, has_pooler = _HEADS[arch.name]
        base = _BASE + (_POOLER if has_pooler and options.get("add_pooler", True) else [])
        return [(r, True) for r in base] + [(r, False) for r in heads(config)]

    def options_from_checkpoint(self, arch: Architecture, keys: set[str]) -> Options:
        if arch.name in _OPTIONAL_POOLER and not any(k.removeprefix("bert.").startswith(
                "pooler.") for k in keys):
            return {"add_pooler": False}
        return {}

    def options_of(self, model) -> Options:
        return {"add_pooler": False} if getattr(model, "pooler", True) is None else {}

    def config_from_hf(self, hf: dict, arch: Architecture, source: str) -> BertConfig:
        require(hf, "position_embedding_type", ("absolute",), "absolute",
                "jaxformer's BERT has learned absolute positions only", source)
        require(hf, "is_decoder", (False, None), False, "jaxformer's BERT is an encoder", source)
        dropout = hf.get("hidden_dropout_prob", 0.1)
        if hf.get("classifier_dropout") not in (None, dropout):
            warnings.warn(f"{source}: classifier_dropout={hf['classifier_dropout']} is not "
                          f"implemented; the classifier uses hidden_dropout_prob={dropout} "
                          f"(training only: outputs in eval mode are unaffected)", stacklevel=3)
        size = {ours: required_int(hf, theirs, source) for ours, theirs in (
            ("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"),
            ("num_layers", "num_hidden_layers"), ("num_heads", "num_attention_heads"),
            ("intermediate_size", "intermediate_size"),
            ("max_position_embeddings", "max_position_embeddings"))}
        return build_config(
            BertConfig, source, **size, type_vocab_size=hf.get("type_vocab_size", 2),
            activation=activation(hf, "hidden_act", "gelu", source),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12), dropout_rate=dropout,
            attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
            tie_word_embeddings=hf.get("tie_word_embeddings", True),
            num_labels=_num_labels(hf), pad_token_id=hf.get("pad_token_id") or 0,
            initializer_range=hf.get("initializer_range", 0.02))

    def config_to_hf(self, config: BertConfig, arch: Architecture) -> dict:
        refuse_export(config, "pre_norm", False, "Hugging Face BERT")
        refuse_export(config, "embedding_layer_norm", True, "Hugging Face BERT")
        hf = {"hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
              "num_attention_heads": config.num_heads,
              "intermediate_size": config.intermediate_size,
              "hidden_act": OUR_ACTIVATIONS[config.activation],
              "hidden_dropout_prob": config.dropout_rate,
              "attention_probs_dropout_prob": config.attention_dropout_rate,
              "max_position_embeddings": config.max_position_embeddings,
              "type_vocab_size": config.type_vocab_size, "layer_norm_eps": config.layer_norm_eps,
              "pad_token_id": config.pad_token_id, "position_embedding_type": "absolute",
              "is_decoder": False, "classifier_dropout": None}
        if arch.name == "BertForSequenceClassification":
            hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(config.num_labels)}
            hf["label2id"] = {f"LABEL_{i}": i for i in range(config.num_labels)}
        return hf


FAMILY = BertFamily()
