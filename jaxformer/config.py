"""Model configurations: one frozen dataclass per family, with its presets (standard library only).

``torch_ref`` builds its twins from these same classes, so the two frameworks cannot drift apart
in a hyper-parameter. A frozen config is hashable, hence a static argument to ``jax.jit``. Presets
are classmethods (`docs/glossary.md`); variants use ``dataclasses.replace(config, field=value)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Architecture switches on which the seeds and their real-world descendants differ are fields,
# not forks of the model code: `activation` ("gelu" exact/erf, "gelu_tanh" GPT-2's approximation,
# "relu"); `pre_norm` (LayerNorm before each sub-layer as in GPT-2, or after the residual add as in
# BERT and the 2017 Transformer); `embedding_layer_norm` / `final_layer_norm` (after the
# embeddings / after the stack); `tie_word_embeddings` (the output projection reuses the token
# embedding matrix); `position_embedding_type` ("learned" table or fixed "sinusoidal" encoding).
# "silu" (x * sigmoid(x), Hugging Face's "swish") is MarianMT's activation.
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")
POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal")
# Where the sinusoidal table keeps its sines and cosines (the frequencies are the same):
# "interleaved" (Vaswani et al. 3.5, seed 002: sin on even features, cos on odd ones) or "split"
# (MarianMT: the sines in the first half of the features, the cosines in the second).
SINUSOIDAL_LAYOUTS = ("interleaved", "split")
DTYPES = ("float32", "bfloat16", "float16")
PARAM_DTYPES = ("float32", "bfloat16")
# Rematerialisation (activation checkpointing) of each Transformer block in the backward pass:
# "none" keeps every activation; "full" keeps only each block's input and recomputes the rest;
# "dots_saveable" keeps the matmul outputs and recomputes the cheap elementwise work;
# "dots_with_no_batch_dims_saveable" keeps only matmuls without batch dimensions (the projections,
# not the attention scores). Same values, less memory, more compute.
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
# How attention is computed (the weights are the same): "xla" and "cudnn" call
# jax.nn.dot_product_attention with that implementation (cuDNN is flash attention on NVIDIA GPUs),
# "einsum" is the explicit path, the only one that can drop attention probabilities, and "auto"
# takes "einsum" when attention dropout is active or on the CPU (bfloat16 excepted), "cudnn" in
# bfloat16/float16 on a CUDA GPU that accepts the call, "xla" otherwise
# (jaxformer.nn.attention.attention). torch_ref: "einsum" is its explicit matmul path, every other
# value is torch's scaled_dot_product_attention.
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn", "einsum")

_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _check_types(config) -> None:
    """Each field holds its annotated type (``hidden_size=32.0`` or ``num_heads="4"`` is refused
    here, not deep inside a layer); bools are not accepted as numbers."""
    name = type(config).__name__
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        allowed = _TYPES.get(str(field.type))
        if allowed is None:
            continue
        if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
            raise TypeError(f"{name}: {field.name} must be {field.type}, got "
                            f"{type(value).__name__} {value!r}")


class _ModelConfig:
    """What every family's config shares: the derived ``head_dim``."""

    # Declared for the type checker only (no value, so no attribute and no dataclass field here):
    # each family's dataclass defines them.
    hidden_size: int
    num_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def _check_common(config, num_layer_fields: tuple[str, ...]) -> None:
    """Validation shared by every family; raises ``ValueError`` naming the bad field."""
    _check_types(config)
    name = type(config).__name__
    # Positivity first: num_heads=0 must be a ValueError, not a ZeroDivisionError below.
    positive = ("hidden_size", "num_heads", "intermediate_size", "max_position_embeddings")
    for field in positive + num_layer_fields:
        if getattr(config, field) <= 0:
            raise ValueError(f"{name}: {field} must be positive, got {getattr(config, field)}")
    if config.hidden_size % config.num_heads != 0:
        raise ValueError(
            f"{name}: hidden_size ({config.hidden_size}) is not divisible by "
            f"num_heads ({config.num_heads})"
        )
    if config.activation not in ACTIVATIONS:
        raise ValueError(f"{name}: activation {config.activation!r} is not one of {ACTIVATIONS}")
    if config.attention_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"{name}: attention_implementation {config.attention_implementation!r} "
                         f"is not one of {ATTENTION_IMPLEMENTATIONS}")
    if config.dtype not in DTYPES:
        raise ValueError(f"{name}: dtype {config.dtype!r} is not one of {DTYPES}")
    if config.param_dtype not in PARAM_DTYPES:
        raise ValueError(f"{name}: param_dtype {config.param_dtype!r} is not one of "
                         f"{PARAM_DTYPES}")
    if config.remat not in REMAT_POLICIES:
        raise ValueError(f"{name}: remat {config.remat!r} is not one of {REMAT_POLICIES}")
    for field in ("dropout_rate", "attention_dropout_rate"):
        if not 0.0 <= getattr(config, field) < 1.0:
            raise ValueError(f"{name}: {field} must be in [0, 1), got {getattr(config, field)}")
    if config.layer_norm_eps <= 0:
        raise ValueError(f"{name}: layer_norm_eps must be positive, got {config.layer_norm_eps}")
    pad = getattr(config, "pad_token_id", None)
    if pad is not None and not 0 <= pad < config.vocab_size:
        raise ValueError(f"{name}: pad_token_id ({pad}) is outside the vocabulary "
                         f"[0, {config.vocab_size})")


@dataclass(frozen=True)
class BertConfig(_ModelConfig):
    """BERT (encoder-only). Defaults are BERT-base, uncased (Devlin et al., 2018)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    activation: str = "gelu"
    layer_norm_eps: float = 1e-12
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    pre_norm: bool = False
    embedding_layer_norm: bool = True
    tie_word_embeddings: bool = True  # masked-LM decoder shares the word embedding matrix
    num_labels: int = 2  # BertForSequenceClassification
    pad_token_id: int = 0
    initializer_range: float = 0.02
    dtype: str = "float32"  # compute dtype (activations, matmuls)
    param_dtype: str = "float32"  # storage dtype of the parameters
    attention_implementation: str = "auto"
    scan_layers: bool = False  # stack the layers' parameters and run them with one scan
    remat: str = "none"  # rematerialisation policy of each block (REMAT_POLICIES)

    def __post_init__(self):
        _check_common(self, ("num_layers", "vocab_size", "type_vocab_size", "num_labels"))

    @classmethod
    def base(cls) -> BertConfig:
        """BERT-base: 12 layers, hidden 768, 12 heads, 110M parameters."""
        return cls()

    @classmethod
    def tiny(cls) -> BertConfig:
        """A few thousand parameters, for tests and the default ``jaxformer parity`` run."""
        return cls(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=37,
                   max_position_embeddings=64, type_vocab_size=3)

    @classmethod
    def minilm(cls) -> BertConfig:
        """MiniLM-L6-H384 (uncased), the architecture of all-MiniLM-L6-v2: 6 layers, hidden 384,
        12 heads, 22.7M parameters; the fine-tuning benchmark trains it from scratch."""
        return cls(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536)

    @classmethod
    def simple_bert(cls) -> BertConfig:
        """Seed 000's ``SimpleBertModel`` defaults (no attention-probability dropout)."""
        return cls(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=256,
                   attention_dropout_rate=0.0)

    @classmethod
    def bert_explained(cls) -> BertConfig:
        """Seed 001's ``BertConfig``: BERT-base sizes, torch's default LayerNorm eps (1e-5)."""
        return cls(layer_norm_eps=1e-5)

    @classmethod
    def d2l_bert(cls) -> BertConfig:
        """Seed 003's d2l ``BERTModel``: ReLU, no embedding LayerNorm, untied masked-LM decoder."""
        return cls(vocab_size=10000, hidden_size=768, num_layers=2, num_heads=4,
                   intermediate_size=1024, max_position_embeddings=1000, activation="relu",
                   layer_norm_eps=1e-5, dropout_rate=0.2, attention_dropout_rate=0.2,
                   embedding_layer_norm=False, tie_word_embeddings=False)


@dataclass(frozen=True)
class TransformerConfig(_ModelConfig):
    """The encoder-decoder Transformer. Defaults are the base model of Vaswani et al. (2017)."""

    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000
    hidden_size: int = 512
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    num_heads: int = 8
    intermediate_size: int = 2048
    max_position_embeddings: int = 512
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    position_embedding_type: str = "sinusoidal"
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(hidden_size) (paper 3.4)
    share_embeddings: bool = True  # one embedding matrix for source and target (needs one vocab)
    tie_word_embeddings: bool = True  # output projection reuses the target embedding matrix
    pre_norm: bool = False
    final_layer_norm: bool = False  # LayerNorm after each stack, as torch.nn.Transformer adds
    # The fields below are the ways MarianMT and BART (jaxformer.checkpoints.hf.encoder_decoder)
    # depart from seed 002; each default is the seed's behaviour.
    sinusoidal_layout: str = "interleaved"  # SINUSOIDAL_LAYOUTS; "split" is MarianMT's table
    # Learned positions: position p reads row p + position_offset of a table of
    # max_position_embeddings + position_offset rows (BART: 2, a fairseq legacy).
    position_offset: int = 0
    embedding_layer_norm: bool = False  # LayerNorm on each side's embeddings sum (BART)
    # A bias vector added to the logits (MarianMT and BART's final_logits_bias); an untied
    # output_projection then has no bias of its own: the bias is this one vector either way.
    final_logits_bias: bool = False
    src_pad_id: int = 0
    tgt_pad_id: int = 0
    initializer_range: float = 0.02
    dtype: str = "float32"  # compute dtype (activations, matmuls)
    param_dtype: str = "float32"  # storage dtype of the parameters
    attention_implementation: str = "auto"
    scan_layers: bool = False  # stack the layers' parameters and run them with one scan
    remat: str = "none"  # rematerialisation policy of each block (REMAT_POLICIES)

    def __post_init__(self):
        _check_common(self, ("num_encoder_layers", "num_decoder_layers", "src_vocab_size",
                             "tgt_vocab_size"))
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(f"TransformerConfig: position_embedding_type "
                             f"{self.position_embedding_type!r} is not one of "
                             f"{POSITION_EMBEDDING_TYPES}")
        if self.sinusoidal_layout not in SINUSOIDAL_LAYOUTS:
            raise ValueError(f"TransformerConfig: sinusoidal_layout {self.sinusoidal_layout!r} "
                             f"is not one of {SINUSOIDAL_LAYOUTS}")
        if self.position_offset < 0:
            raise ValueError(f"TransformerConfig: position_offset must be >= 0, got "
                             f"{self.position_offset}")
        if self.position_offset and self.position_embedding_type != "learned":
            raise ValueError(f"TransformerConfig: position_offset ({self.position_offset}) needs "
                             f"position_embedding_type='learned' (a sinusoidal table has no rows "
                             f"to skip)")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(f"TransformerConfig: share_embeddings needs src_vocab_size "
                             f"({self.src_vocab_size}) == tgt_vocab_size ({self.tgt_vocab_size})")
        for field, vocab in (("src_pad_id", self.src_vocab_size),
                             ("tgt_pad_id", self.tgt_vocab_size)):
            if not 0 <= getattr(self, field) < vocab:
                raise ValueError(f"TransformerConfig: {field} ({getattr(self, field)}) is "
                                 f"outside the vocabulary [0, {vocab})")

    @classmethod
    def base(cls) -> TransformerConfig:
        """The paper's base model: 6+6 layers, d_model 512, 8 heads, d_ff 2048, shared vocab."""
        return cls()

    @classmethod
    def tiny(cls) -> TransformerConfig:
        return cls(src_vocab_size=23, tgt_vocab_size=29, hidden_size=32, num_encoder_layers=2,
                   num_decoder_layers=2, num_heads=4, intermediate_size=37,
                   max_position_embeddings=64, share_embeddings=False, tie_word_embeddings=False)

    @classmethod
    def marian(cls) -> TransformerConfig:
        """MarianMT base, the size of the Helsinki-NLP opus-mt models (6+6 layers, d_model 512, 8
        heads, d_ff 2048, swish, MarianMT's sinusoidal layout, scaled shared embeddings, logits
        bias, vocabulary 58101): exports as ``MarianMTModel``."""
        return cls(src_vocab_size=58101, tgt_vocab_size=58101, max_position_embeddings=512,
                   activation="silu", attention_dropout_rate=0.0, sinusoidal_layout="split",
                   final_logits_bias=True)

    @classmethod
    def marian_tiny(cls) -> TransformerConfig:
        """``tiny``'s sizes with MarianMT's choices (``marian``): a test-sized exportable model."""
        return dataclasses.replace(cls.marian(), src_vocab_size=29, tgt_vocab_size=29,
                                   hidden_size=32, num_encoder_layers=2, num_decoder_layers=2,
                                   num_heads=4, intermediate_size=37, max_position_embeddings=64)

    @classmethod
    def simple_transformer(cls) -> TransformerConfig:
        """Seed 002's ``Transformer`` defaults (vocabularies of 10 from its example)."""
        return cls(src_vocab_size=10, tgt_vocab_size=10, hidden_size=256, num_heads=8,
                   intermediate_size=1024, max_position_embeddings=100, dropout_rate=0.0,
                   scale_embeddings=False, share_embeddings=False, tie_word_embeddings=False)


@dataclass(frozen=True)
class GPTConfig(_ModelConfig):
    """GPT (decoder-only). Defaults are GPT-2 small (Radford et al., 2019)."""

    vocab_size: int = 50257
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 1024
    activation: str = "gelu_tanh"
    layer_norm_eps: float = 1e-5
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    pre_norm: bool = True
    embedding_layer_norm: bool = False
    final_layer_norm: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int = 0  # only used to fill padded positions in examples; GPT-2 has none
    initializer_range: float = 0.02
    dtype: str = "float32"  # compute dtype (activations, matmuls)
    param_dtype: str = "float32"  # storage dtype of the parameters
    attention_implementation: str = "auto"
    scan_layers: bool = False  # stack the layers' parameters and run them with one scan
    remat: str = "none"  # rematerialisation policy of each block (REMAT_POLICIES)

    def __post_init__(self):
        _check_common(self, ("num_layers", "vocab_size"))

    @classmethod
    def gpt2(cls) -> GPTConfig:
        """GPT-2 small: 12 layers, 768, 12 heads, 1024 positions, 124M parameters."""
        return cls()

    @classmethod
    def tiny(cls) -> GPTConfig:
        return cls(vocab_size=101, hidden_size=32, num_layers=2, num_heads=4,
                   intermediate_size=37, max_position_embeddings=64)

    @classmethod
    def simple_gpt(cls) -> GPTConfig:
        """Seed 004's ``SimpleGPTModel``: post-LN, embedding LayerNorm, exact GELU, untied head."""
        return cls(vocab_size=30522, hidden_size=128, num_layers=4, num_heads=4,
                   intermediate_size=256, max_position_embeddings=512, activation="gelu",
                   attention_dropout_rate=0.0, pre_norm=False, embedding_layer_norm=True,
                   final_layer_norm=False, tie_word_embeddings=False)

    @classmethod
    def baby(cls) -> GPTConfig:
        """nanoGPT's CPU "baby GPT" for character-level Shakespeare: 4 layers, 4 heads, width
        128, context 64, no dropout, exact GELU (the vocabulary is the tokenizer's)."""
        return cls(vocab_size=65, hidden_size=128, num_layers=4, num_heads=4,
                   intermediate_size=512, max_position_embeddings=64, activation="gelu",
                   dropout_rate=0.0, attention_dropout_rate=0.0)

