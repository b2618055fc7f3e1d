"""BERT (Devlin et al., 2018) in Flax NNX: seeds 000, 001 and 003.
Twin: ``torch_ref/models/bert.py``.

Embeddings (token + segment + learned position, LayerNorm, dropout) -> a stack of post-LN
Transformer blocks -> the pooler (``[CLS]`` -> dense -> tanh), with the masked-LM and
next-sentence heads on top for pre-training and a classifier for fine-tuning.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from jaxformer import validate
from jaxformer.config import BertConfig
from jaxformer.nn.dropout import Dropout
from jaxformer.nn.layers import ACTIVATIONS, TransformerBlock
from jaxformer.nn.masks import padding_mask
from jaxformer.nn.params import embedding, layer_norm, linear
from jaxformer.nn.stack import LayerStack


class BertEmbeddings(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.word_embeddings = embedding(config.vocab_size, config, names=("vocab", "embed"),
                                         rngs=rngs)
        self.position_embeddings = embedding(config.max_position_embeddings, config,
                                             names=("positions", "embed"), rngs=rngs)
        self.token_type_embeddings = embedding(config.type_vocab_size, config,
                                               names=("types", "embed"), rngs=rngs)
        self.layer_norm = layer_norm(config, rngs=rngs) if config.embedding_layer_norm else None
        self.dropout = Dropout(config.dropout_rate, rngs=rngs)

    def __call__(self, input_ids, token_type_ids):
        T = input_ids.shape[1]
        x = (self.word_embeddings(input_ids)  # (B, T, C)
             + self.position_embeddings(jnp.arange(T))[None]
             + self.token_type_embeddings(token_type_ids))
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return self.dropout(x)


class BertEncoder(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.layers = LayerStack(config, TransformerBlock, config.num_layers, rngs=rngs)

    def __call__(self, hidden_states, mask=None):
        return self.layers(hidden_states, mask)


class BertPooler(nnx.Module):
    """The ``[CLS]`` vector through dense + tanh: the sequence summary the NSP head reads."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.dense = linear(config.hidden_size, config.hidden_size, config,
                            names=("embed", "mlp"), rngs=rngs)

    def __call__(self, hidden_states):
        return jnp.tanh(self.dense(hidden_states[:, 0]))


class BertModel(nnx.Module):
    """``(input_ids, token_type_ids, attention_mask) -> (sequence_output, pooled_output)``.

    ``add_pooler=False`` builds no pooler (``pooled_output`` is then None), as in Hugging Face's
    ``BertForMaskedLM`` and in checkpoints saved without one.
    """

    def __init__(self, config: BertConfig, *, add_pooler: bool = True, rngs: nnx.Rngs):
        self.config = config
        self.embeddings = BertEmbeddings(config, rngs=rngs)
        self.encoder = BertEncoder(config, rngs=rngs)
        self.pooler = BertPooler(config, rngs=rngs) if add_pooler else None

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
        validate.check_bert_inputs(self.config, input_ids, token_type_ids, attention_mask)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        mask = None if attention_mask is None else padding_mask(attention_mask)  # (B, 1, 1, T)
        sequence_output = self.encoder(self.embeddings(input_ids, token_type_ids), mask)
        pooled_output = None if self.pooler is None else self.pooler(sequence_output)
        return sequence_output, pooled_output


def gather_positions(hidden_states, positions):
    """``(B, T, C)`` and ``(B, P)`` positions -> ``(B, P, C)``, as seed 003's ``MaskLM`` does.

    A position outside ``[0, T)`` (negative included) that reaches here under ``jit`` reads a row
    of NaN, never a real position (see ``jaxformer.nn.params.Embed``)."""
    validate.check_masked_positions(positions, hidden_states.shape)
    positions = jnp.where(positions < 0, hidden_states.shape[1], positions)
    return jnp.take_along_axis(hidden_states, positions[:, :, None], axis=1, mode="fill",
                               fill_value=jnp.nan)


class BertMLMHead(nnx.Module):
    """Masked-LM head: dense -> activation -> LayerNorm -> vocabulary projection + bias.

    With ``tie_word_embeddings`` the projection is the word embedding matrix, passed in by the
    owning model at call time; otherwise the head has its own ``decoder``.
    """

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.dense = linear(config.hidden_size, config.hidden_size, config,
                            names=("embed", "mlp"), rngs=rngs)
        self.activation = config.activation
        self.layer_norm = layer_norm(config, rngs=rngs)
        self.decoder = (None if config.tie_word_embeddings else
                        linear(config.hidden_size, config.vocab_size, config,
                               names=("embed", "vocab"), rngs=rngs, use_bias=False))
        self.bias = nnx.Param(jnp.zeros((config.vocab_size,), jnp.dtype(config.param_dtype)),
                              out_sharding=("vocab",), eager_sharding=False)

    def __call__(self, hidden_states, masked_positions=None, word_embeddings=None):
        if masked_positions is not None:
            hidden_states = gather_positions(hidden_states, masked_positions)
        x = self.layer_norm(ACTIVATIONS[self.activation](self.dense(hidden_states)))
        if self.decoder is None:
            if word_embeddings is None:
                raise ValueError("BertMLMHead has tied weights: pass word_embeddings")
            logits = word_embeddings.attend(x)
        else:
            logits = self.decoder(x)
        # In the compute dtype, as nnx.Linear adds its bias (the losses upcast to float32).
        return logits + self.bias[...].astype(logits.dtype)


class BertNSPHead(nnx.Module):
    """Next-sentence prediction: a two-way linear classifier on the pooled output."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.classifier = linear(config.hidden_size, 2, config, names=("embed", "classes"),
                                 rngs=rngs)

    def __call__(self, pooled_output):
        return self.classifier(pooled_output)


class BertForPreTraining(nnx.Module):
    """``-> (sequence_output, mlm_logits, nsp_logits)``; ``mlm_logits`` at ``masked_positions``
    (``(B, P, vocab)``) when given, else at every position (``(B, T, vocab)``)."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.bert = BertModel(config, rngs=rngs)
        self.mlm = BertMLMHead(config, rngs=rngs)
        self.nsp = BertNSPHead(config, rngs=rngs)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None,
                 masked_positions=None):
        sequence_output, pooled_output = self.bert(input_ids, token_type_ids, attention_mask)
        mlm_logits = self.mlm(sequence_output, masked_positions,
                              self.bert.embeddings.word_embeddings)
        return sequence_output, mlm_logits, self.nsp(pooled_output)


class BertForSequenceClassification(nnx.Module):
    """Seed 001's classifier: dropout and a linear layer on the pooled output -> ``(B, labels)``."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.bert = BertModel(config, rngs=rngs)
        self.dropout = Dropout(config.dropout_rate, rngs=rngs)
        self.classifier = linear(config.hidden_size, config.num_labels, config,
                                 names=("embed", "classes"), rngs=rngs)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
        _, pooled_output = self.bert(input_ids, token_type_ids, attention_mask)
        return self.classifier(self.dropout(pooled_output))


class BertForMaskedLM(nnx.Module):
    """Hugging Face's masked-LM model: BERT without pooler, the masked-LM head -> ``mlm_logits``
    (``(B, P, vocab)`` at ``masked_positions`` when given, else ``(B, T, vocab)``)."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.bert = BertModel(config, add_pooler=False, rngs=rngs)
        self.mlm = BertMLMHead(config, rngs=rngs)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None,
                 masked_positions=None):
        sequence_output, _ = self.bert(input_ids, token_type_ids, attention_mask)
        return self.mlm(sequence_output, masked_positions, self.bert.embeddings.word_embeddings)
