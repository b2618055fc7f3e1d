"""Twin of ``jaxformer/inference.py``: class probabilities, masked-token probabilities and pooled
sentence embeddings of a BERT-family model, in float32, as numpy arrays."""

from __future__ import annotations

import numpy as np
import torch

from jaxformer import validate

POOLING_MODES = ("mean", "cls", "max")


def encoder_of(model):
    return getattr(model, "bert", model)


def has_mlm_head(model) -> bool:
    return getattr(model, "mlm", None) is not None


def pool(hidden_states, attention_mask, pooling: str = "mean", normalize: bool = False):
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {POOLING_MODES}, got {pooling!r}")
    hidden_states = hidden_states.float()
    mask = attention_mask[..., None].float()  # (B, T, 1)
    if pooling == "mean":
        pooled = (hidden_states * mask).sum(1) / torch.clamp(mask.sum(1), min=1e-9)
    elif pooling == "cls":
        pooled = hidden_states[:, 0]
    else:
        pooled = torch.where(mask > 0, hidden_states, torch.tensor(-1e9)).amax(1)
    if normalize:
        norm = torch.linalg.vector_norm(pooled, dim=-1, keepdim=True)
        pooled = pooled / torch.clamp(norm, min=1e-12)
    return pooled


def _tensor(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=torch.long)


class BertInference:
    def __init__(self, model):
        model.eval()
        self.model = model

    @torch.no_grad()
    def class_probabilities(self, input_ids, token_type_ids, attention_mask) -> np.ndarray:
        validate.check_bert_inputs(self.model.config, input_ids, token_type_ids, attention_mask)
        logits = self.model(_tensor(input_ids), _tensor(token_type_ids), _tensor(attention_mask))
        return torch.softmax(logits.float(), dim=-1).numpy()

    @torch.no_grad()
    def masked_token_probabilities(self, input_ids, token_type_ids, attention_mask,
                                   masked_positions) -> np.ndarray:
        if not has_mlm_head(self.model):
            raise ValueError(f"{type(self.model).__name__} has no masked-LM head")
        validate.check_bert_inputs(self.model.config, input_ids, token_type_ids, attention_mask)
        validate.check_masked_positions(masked_positions, np.shape(input_ids) + (1,))
        model = self.model
        sequence_output, _ = model.bert(_tensor(input_ids), _tensor(token_type_ids),
                                        _tensor(attention_mask))
        logits = model.mlm(sequence_output, _tensor(masked_positions),
                           model.bert.embeddings.word_embeddings)
        return torch.softmax(logits.float(), dim=-1).numpy()

    @torch.no_grad()
    def sentence_embeddings(self, input_ids, token_type_ids, attention_mask,
                            pooling: str = "mean", normalize: bool = False) -> np.ndarray:
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {POOLING_MODES}, got {pooling!r}")
        validate.check_bert_inputs(self.model.config, input_ids, token_type_ids, attention_mask)
        mask = _tensor(attention_mask)
        hidden, _ = encoder_of(self.model)(_tensor(input_ids), _tensor(token_type_ids), mask)
        return pool(hidden, mask, pooling, normalize).numpy()
