"""MarianMT (``model_type: marian``) for the Hugging Face engine: ``MarianMTModel`` is the
encoder-decoder :class:`jaxformer.models.encoder_decoder.Transformer` of seed 002 with
MarianMT's sinusoidal layout (``sinusoidal_layout="split"``: sines first, cosines second),
``final_logits_bias``, its activation (``swish`` = our ``silu`` in the Helsinki-NLP models) and
either one shared vocabulary or one per side. The layer table is BART's (``bart.py``). Decisions
and reasons: `docs/huggingface.md`.
"""

from __future__ import annotations

from typing import ClassVar

from jaxformer.checkpoints.hf.bart import (
    LAYERS,
    common_config,
    common_export,
    head,
    refuse_options,
    token_embeddings,
    untied_tables,
)
from jaxformer.checkpoints.hf.engine import (
    Architecture,
    CheckpointError,
    Family,
    Options,
    Rule,
    refuse_export,
    require,
    required_int,
)
from jaxformer.config import TransformerConfig

_MARIAN_ONLY = {"normalize_before": (False, "MarianMT is post-LN"),
                "add_final_layer_norm": (False, "MarianMT has no LayerNorm after each stack"),
                "normalize_embedding": (False, "MarianMT does not normalise its embeddings"),
                "add_bias_logits": (False, "MarianMT's logits have final_logits_bias only"),
                "static_position_embeddings": (True, "MarianMT's positions are sinusoidal")}


class MarianFamily(Family):
    model_type = "marian"
    module = "encoder_decoder"
    base_prefix = "model."
    # The sinusoidal tables: constants (ours are computed, bit-identical to transformers'), which
    # older checkpoints store and transformers no longer saves.
    # ``shared``, when the model does not read it (see bart.untied_tables).
    buffers = (r"(en|de)coder\.embed_positions\.weight", r"shared\.weight")
    exports: ClassVar[dict[str, str]] = {"Transformer": "MarianMTModel"}

    def exports_config(self, config) -> bool:
        return config.position_embedding_type == "sinusoidal"

    def architectures(self) -> tuple[Architecture, ...]:
        return (Architecture("MarianMTModel", self, "Transformer", "model.", ""),)

    def key_table(self, arch: Architecture, config: TransformerConfig,
                  options: Options) -> list[tuple[Rule, bool]]:
        base = [*token_embeddings(config), *LAYERS]
        return [(r, True) for r in base] + [(r, False) for r in head(config)]

    def config_from_hf(self, hf: dict, arch: Architecture, source: str) -> TransformerConfig:
        refuse_options(hf, source, _MARIAN_ONLY)
        require(hf, "is_decoder", (False, None), False, "MarianMTModel is an encoder-decoder",
                source)
        vocab = required_int(hf, "vocab_size", source)
        decoder_vocab = hf.get("decoder_vocab_size") or vocab
        shared = hf.get("share_encoder_decoder_embeddings", True)
        if shared and decoder_vocab != vocab:
            raise CheckpointError(f"{source}: share_encoder_decoder_embeddings is true but "
                                  f"decoder_vocab_size ({decoder_vocab}) != vocab_size ({vocab})")
        return common_config(hf, source, src_vocab_size=vocab, tgt_vocab_size=decoder_vocab,
                             share_embeddings=bool(shared and hf.get("tie_word_embeddings", True)),
                             position_embedding_type="sinusoidal",
                             sinusoidal_layout="split", embedding_layer_norm=False)

    def config_to_hf(self, config: TransformerConfig, arch: Architecture) -> dict:
        what = "MarianMT"
        # The seed's interleaved table is the same features in another order; MarianMT's layout
        # is fixed, so an interleaved model is refused rather than exported permuted.
        for field, want in (("position_embedding_type", "sinusoidal"),
                            ("sinusoidal_layout", "split"), ("embedding_layer_norm", False)):
            refuse_export(config, field, want, what)
        untied_tables(config, what)
        return {**common_export(config, what), "vocab_size": config.src_vocab_size,
                "decoder_vocab_size": config.tgt_vocab_size,
                "share_encoder_decoder_embeddings": config.share_embeddings}


FAMILY = MarianFamily()
