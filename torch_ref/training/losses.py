"""Twin of ``jaxformer/training/losses.py``: the training losses through torch's own
``F.cross_entropy`` (its ignore index and label smoothing), summed and divided by the number of
real targets, so that a batch whose targets are all ignored gives 0 instead of torch's NaN."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from jaxformer.training import data, tasks
from jaxformer.training.config import IGNORE_INDEX, TrainConfig


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """bfloat16 and float16 logits in float32, float32 and float64 as they are (a float64 twin
    is the exact reference of the trajectory tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def cross_entropy(logits, labels, *, ignore_index: int = IGNORE_INDEX,
                  label_smoothing: float = 0.0):
    if tuple(logits.shape[:-1]) != tuple(labels.shape):
        raise ValueError(f"logits have shape {tuple(logits.shape)} but labels have shape "
                         f"{tuple(labels.shape)}; expected labels of shape "
                         f"{tuple(logits.shape[:-1])}")
    num_classes = logits.shape[-1]
    data.check_labels("labels", labels, num_classes, ignore_index)
    labels = torch.as_tensor(labels, device=logits.device).long()
    total = F.cross_entropy(_at_least_float32(logits).reshape(-1, num_classes), labels.reshape(-1),
                            ignore_index=ignore_index, label_smoothing=label_smoothing,
                            reduction="sum")
    return total / (labels != ignore_index).sum().clamp(min=1)


def masked_lm_loss(logits, labels):
    return cross_entropy(logits, labels)


def next_sentence_loss(logits, labels):
    return cross_entropy(logits, labels)


def causal_lm_loss(logits, input_ids, attention_mask=None):
    """The last position's target is the ignore index (its logits are not cut off: a slice of
    them would be copied before ``F.cross_entropy`` reads it)."""
    input_ids = torch.as_tensor(input_ids)
    targets = F.pad(input_ids[:, 1:], (0, 1), value=IGNORE_INDEX)
    if attention_mask is not None:
        mask = torch.as_tensor(attention_mask).bool()
        real = F.pad(mask[:, :-1] & mask[:, 1:], (0, 1), value=False)
        targets = torch.where(real, targets, torch.full_like(targets, IGNORE_INDEX))
    return cross_entropy(logits, targets)


def seq2seq_loss(logits, labels, label_smoothing: float = 0.0):
    return cross_entropy(logits, labels, label_smoothing=label_smoothing)


def classification_loss(logits, labels):
    return cross_entropy(logits, labels)


def pretraining_batch_loss(model, batch: dict, config: TrainConfig):
    """BERT pre-training (``tasks.BERT_PRETRAINING``): masked LM plus next sentence."""
    _, mlm_logits, nsp_logits = model(batch["input_ids"], batch["token_type_ids"],
                                      batch["attention_mask"], batch["masked_positions"])
    return (masked_lm_loss(mlm_logits, batch["mlm_labels"])
            + next_sentence_loss(nsp_logits, batch["nsp_labels"]))


def causal_lm_batch_loss(model, batch: dict, config: TrainConfig):
    """The causal LM (``tasks.CAUSAL_LM``); a batch with ``labels``, from random windows, is
    scored against them at every position."""
    mask = batch.get("attention_mask")  # none: full windows (tasks.CAUSAL_LM)
    logits = model(batch["input_ids"], mask)
    if "labels" in batch:  # random windows (nanoGPT): a target for each of the T positions
        return cross_entropy(logits, batch["labels"])
    return causal_lm_loss(logits, batch["input_ids"], mask)


def seq2seq_batch_loss(model, batch: dict, config: TrainConfig):
    """Sequence to sequence (``tasks.SEQ2SEQ``), with the config's label smoothing."""
    logits = model(batch["src_ids"], batch["tgt_ids"], batch["src_mask"], batch["tgt_mask"])
    return seq2seq_loss(logits, batch["labels"], config.label_smoothing)


def classification_batch_loss(model, batch: dict, config: TrainConfig):
    """Sequence classification (``tasks.CLASSIFICATION``)."""
    logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    return classification_loss(logits, batch["labels"])


def classification_batch_accuracy(model, batch: dict, config: TrainConfig):
    """The fraction of the batch whose highest logit is its label (``tasks.CLASSIFICATION``'s
    ``accuracy``, reported at evaluations)."""
    logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    return (logits.argmax(dim=-1) == batch["labels"]).float().mean()


def batch_loss(family: str, model, batch: dict, config: TrainConfig):
    """The objective of task ``family`` on one micro-batch (keys: its ``batch_keys``; torch
    tensors): the function of this module that the Task names."""
    return globals()[tasks.get(family).loss](model, batch, config)
