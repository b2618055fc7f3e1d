"""What the inference commands compute with a BERT-family model, in float32: class
probabilities (``jaxformer classify``), masked-token probabilities (``jaxformer fill-mask``) and
pooled sentence embeddings (``jaxformer embed``). Twin: ``torch_ref/inference.py``.

:class:`BertInference` wraps a model in eval mode (``BertModel``, ``BertForPreTraining``,
``BertForMaskedLM`` or ``BertForSequenceClassification``) and compiles each computation once per
input shape. Inputs are ``[batch, seq]`` numpy arrays, ``attention_mask`` 1 on real tokens; the
results are numpy float32. Softmax runs in float32 whatever the compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer import validate
from jaxformer.nn.jit import jitted

POOLING_MODES = ("mean", "cls", "max")


def encoder_of(model):
    """The ``BertModel`` inside ``model`` (``model.bert``), or ``model`` itself."""
    return getattr(model, "bert", model)


def has_mlm_head(model) -> bool:
    """Whether ``model`` predicts masked tokens (``BertForPreTraining``, ``BertForMaskedLM``)."""
    return getattr(model, "mlm", None) is not None


def pool(hidden_states, attention_mask, pooling: str = "mean", normalize: bool = False):
    """``(B, T, C)`` hidden states -> ``(B, C)`` as sentence-transformers pools them: the mean of
    the real tokens, the first token (``cls``) or the maximum over real tokens (padding counts as
    -1e9); ``normalize`` divides by ``max(||x||, 1e-12)`` as ``torch.nn.functional.normalize``."""
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {POOLING_MODES}, got {pooling!r}")
    hidden_states = hidden_states.astype(jnp.float32)
    mask = attention_mask[..., None].astype(jnp.float32)  # (B, T, 1)
    if pooling == "mean":
        pooled = (hidden_states * mask).sum(1) / jnp.maximum(mask.sum(1), 1e-9)
    elif pooling == "cls":
        pooled = hidden_states[:, 0]
    else:
        pooled = jnp.where(mask > 0, hidden_states, -1e9).max(1)
    if normalize:
        norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
        pooled = pooled / jnp.maximum(norm, 1e-12)
    return pooled


class BertInference:
    """``BertInference(model).class_probabilities(ids, types, mask)`` and the others below; the
    model is put in eval mode (no dropout)."""

    def __init__(self, model):
        model.eval()
        self.model = model
        self._compiled: dict = {}

    def _compile(self, name: str, fn):
        if name not in self._compiled:
            self._compiled[name] = jitted(self.model, fn=fn)
        return self._compiled[name]

    def class_probabilities(self, input_ids, token_type_ids, attention_mask) -> np.ndarray:
        """``(B, num_labels)``: the softmax of a classifier's logits."""
        def fn(model, input_ids, token_type_ids, attention_mask):
            logits = model(input_ids, token_type_ids, attention_mask)
            return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)

        validate.check_bert_inputs(self.model.config, input_ids, token_type_ids, attention_mask)
        return np.asarray(self._compile("classify", fn)(input_ids, token_type_ids,
                                                        attention_mask))

    def masked_token_probabilities(self, input_ids, token_type_ids, attention_mask,
                                   masked_positions) -> np.ndarray:
        """``(B, P, vocab)``: the softmax of the masked-LM logits at ``masked_positions``
        (``(B, P)`` indices into the sequence)."""
        if not has_mlm_head(self.model):
            raise ValueError(f"{type(self.model).__name__} has no masked-LM head")

        def fn(model, input_ids, token_type_ids, attention_mask, masked_positions):
            sequence_output, _ = model.bert(input_ids, token_type_ids, attention_mask)
            logits = model.mlm(sequence_output, masked_positions,
                               model.bert.embeddings.word_embeddings)
            return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)

        validate.check_bert_inputs(self.model.config, input_ids, token_type_ids, attention_mask)
        validate.check_masked_positions(masked_positions, np.shape(input_ids) + (1,))
        return np.asarray(self._compile("fill_mask", fn)(input_ids, token_type_ids,
                                                         attention_mask, masked_positions))

    def sentence_embeddings(self, input_ids, token_type_ids, attention_mask,
                            pooling: str = "mean", normalize: bool = False) -> np.ndarray:
        """``(B, hidden)``: the encoder's last hidden states pooled by :func:`pool`, with full
        float32 matmuls (no TF32 on GPUs), as sentence-transformers computes them."""
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {POOLING_MODES}, got {pooling!r}")

        def fn(model, input_ids, token_type_ids, attention_mask):
            with jax.default_matmul_precision("highest"):
                hidden, _ = encoder_of(model)(input_ids, token_type_ids, attention_mask)
            return pool(hidden, attention_mask, pooling, normalize)

        validate.check_bert_inputs(self.model.config, input_ids, token_type_ids, attention_mask)
        return np.asarray(self._compile(f"embed-{pooling}-{normalize}", fn)(
            input_ids, token_type_ids, attention_mask))
