"""Training losses in JAX, with torch's semantics. Twin: ``torch_ref/training/losses.py``.

Everything is built on :func:`cross_entropy` (torch's ignore index and label smoothing, written
once here since optax knows no ignore index). Each Task (``training.tasks``) names its
``*_batch_loss`` function here, and the torch twin defines one of the same name.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxformer.training import data, tasks
from jaxformer.training.config import IGNORE_INDEX, TrainConfig


def cross_entropy(logits, labels, *, ignore_index: int = IGNORE_INDEX,
                  label_smoothing: float = 0.0):
    """``(..., C)`` logits and ``(...)`` integer labels -> scalar mean loss over real targets.

    What ``torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100,
    label_smoothing=eps)`` computes with its default mean reduction: the mean, over the targets
    whose label is not ``ignore_index``, of ``(1 - eps) * nll + eps * mean_c(-log p_c)``. One
    deliberate difference: when every target is ignored torch returns NaN (0 / 0), here the loss
    is 0 (and so are its gradients), so that a batch without a masked token cannot poison a run.
    Labels are checked on the host when concrete (a clear ``ValueError``); under ``jit`` an
    out-of-range label (other than the ignore index) makes the loss NaN instead of reading a
    wrong class, and the training loop stops on a NaN loss.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits have shape {tuple(logits.shape)} but labels have shape "
                         f"{tuple(labels.shape)}; expected labels of shape "
                         f"{tuple(logits.shape[:-1])}")
    num_classes = logits.shape[-1]
    data.check_labels("labels", labels, num_classes, ignore_index)
    valid = labels != ignore_index
    out_of_range = valid & ((labels < 0) | (labels >= num_classes))
    per_target = _target_losses(logits, jnp.where(valid & ~out_of_range, labels, 0),
                                label_smoothing)
    per_target = jnp.where(out_of_range, jnp.nan, per_target)
    total = jnp.sum(jnp.where(valid, per_target, 0.0))
    return total / jnp.maximum(jnp.sum(valid), 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _target_losses(logits, labels, label_smoothing: float):
    """``(..., C)`` logits, ``(...)`` labels in ``[0, C)`` -> the ``(...)`` float32 losses
    ``(1 - eps) (lse - x_label) + eps (lse - mean_c x_c)``.

    ``-log p_label = (max - x_label) + log(sum_c exp(x_c - max))``: the ``(..., C)``
    log-probabilities are never formed. The gradient is written out
    (:func:`_target_losses_bwd`) as one elementwise expression of the logits,
    ``g (softmax(x) - (1 - eps) onehot(label) - eps / C)``, where
    automatic differentiation made a zero array the size of the logits and scattered the
    picked logit's gradient into it, and added it to the softmax's: on GPT-2's vocabulary the
    logits are the largest arrays of a step, and every pass over them counts (docs/performance.md,
    "The loss over the vocabulary").
    """
    return _target_losses_fwd(logits, labels, label_smoothing)[0]


def _target_losses_fwd(logits, labels, label_smoothing: float):
    # log p_label = (x_label - max) - log(sum exp(x - max)), as torch's log_softmax rounds it:
    # x_label - max is exact when the label is the argmax, so a small loss keeps its relative
    # precision. (lse - x_label, lse = max + log(sum) rounded at the scale of max first, lost it:
    # 1e-5 relative on a loss of 0.04 with logits of magnitude 5.)
    x = logits.astype(jnp.float32)
    top = jnp.max(x, axis=-1)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    log_sum = jnp.log(jnp.sum(jnp.exp(x - top[..., None]), axis=-1))
    out = (top - jnp.take_along_axis(x, labels[..., None], axis=-1)[..., 0]) + log_sum
    if label_smoothing:  # cross-entropy against the uniform distribution: lse - mean_c(x_c)
        out = (1.0 - label_smoothing) * out + label_smoothing * (
            (top - jnp.mean(x, axis=-1)) + log_sum)
    return out, (logits, labels, top, log_sum)


def _target_losses_bwd(label_smoothing: float, residuals, g):
    logits, labels, top, log_sum = residuals
    num_classes = logits.shape[-1]
    x = logits.astype(jnp.float32)
    onehot = jnp.arange(num_classes, dtype=labels.dtype) == labels[..., None]
    softmax = jnp.exp((x - top[..., None]) - log_sum[..., None])
    grad = softmax - jnp.where(onehot, 1.0 - label_smoothing, 0.0)
    if label_smoothing:
        grad = grad - label_smoothing / num_classes
    return (g[..., None] * grad).astype(logits.dtype), None


_target_losses.defvjp(_target_losses_fwd, _target_losses_bwd)


def masked_lm_loss(logits, labels):
    """``(B, P, V)`` logits at the masked positions, ``(B, P)`` labels: the original ids, -100 at
    padded positions (with dense labels ``P = T`` and -100 at every unmasked position)."""
    return cross_entropy(logits, labels)


def next_sentence_loss(logits, labels):
    """``(B, 2)`` logits, ``(B,)`` labels: 0 = B follows A, 1 = B is a random sentence."""
    return cross_entropy(logits, labels)


def causal_lm_loss(logits, input_ids, attention_mask=None):
    """Position ``t`` predicts token ``t + 1``. With a ``[batch, seq]`` mask a prediction counts
    only when both the token it reads and the token it predicts are real, so neither right nor
    left padding ever enters the loss.

    The last position predicts nothing: its target is the ignore index, rather than its logits
    being cut off (``logits[:, :-1]``), whose gradient would be the ``(batch, seq - 1, vocab)``
    one padded back to the logits' shape, a copy of the largest array of the step."""
    input_ids = jnp.asarray(input_ids)
    targets = jnp.pad(input_ids[:, 1:], ((0, 0), (0, 1)), constant_values=IGNORE_INDEX)
    if attention_mask is not None:
        mask = jnp.asarray(attention_mask).astype(bool)
        real = jnp.pad(mask[:, :-1] & mask[:, 1:], ((0, 0), (0, 1)))
        targets = jnp.where(real, targets, IGNORE_INDEX)
    return cross_entropy(logits, targets)


def seq2seq_loss(logits, labels, label_smoothing: float = 0.0):
    """``(B, T, V)`` decoder logits, ``(B, T)`` next-token labels (-100 at padding)."""
    return cross_entropy(logits, labels, label_smoothing=label_smoothing)


def classification_loss(logits, labels):
    """``(B, num_labels)`` logits, ``(B,)`` class ids."""
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
    return jnp.mean((jnp.argmax(logits, axis=-1) == batch["labels"]).astype(jnp.float32))


def batch_loss(family: str, model, batch: dict, config: TrainConfig):
    """The objective of task ``family`` on one micro-batch (keys: its ``batch_keys``): the
    function of this module that the Task names."""
    return globals()[tasks.get(family).loss](model, batch, config)
