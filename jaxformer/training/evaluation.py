"""One evaluation batch in JAX: the task's loss and the model's predictions. Twin:
``torch_ref/training/evaluation.py``.

:func:`evaluate_batch` scores a batch with the very loss training uses (``training.losses``, by the
name the Task gives) and adds the arg-max predictions the accuracies of ``jaxformer eval`` count
(``jaxformer/evaluate.py`` compares them with the batch's targets on the host, in numpy).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxformer.training import losses, tasks
from jaxformer.training.config import TrainConfig


def predictions(family: str, model, batch: dict) -> dict:
    """The arg-max class of every output the family's accuracies count: ``token_predictions``
    (gpt, transformer: ``(B, T)``), ``mlm_predictions`` ``(B, P)`` and ``nsp_predictions``
    ``(B,)`` (bert), ``predictions`` ``(B,)`` (classifier)."""
    tasks.get(family)
    if family == "gpt":
        return {"token_predictions": jnp.argmax(
            model(batch["input_ids"], batch.get("attention_mask")), axis=-1)}
    if family == "transformer":
        return {"token_predictions": jnp.argmax(model(
            batch["src_ids"], batch["tgt_ids"], batch["src_mask"], batch["tgt_mask"]), axis=-1)}
    if family == "bert":
        _, mlm_logits, nsp_logits = model(batch["input_ids"], batch["token_type_ids"],
                                          batch["attention_mask"], batch["masked_positions"])
        return {"mlm_predictions": jnp.argmax(mlm_logits, axis=-1),
                "nsp_predictions": jnp.argmax(nsp_logits, axis=-1)}
    return {"predictions": jnp.argmax(model(batch["input_ids"], batch["token_type_ids"],
                                            batch["attention_mask"]), axis=-1)}


def evaluate_batch(family: str, model, batch: dict, config: TrainConfig) -> dict:
    """``loss``: the task's training loss of the batch (``config``'s label smoothing included);
    ``nll``: the same loss without label smoothing (the perplexity's), when the config smooths;
    and the :func:`predictions`."""
    task = tasks.get(family)
    batch_loss = getattr(losses, task.loss)
    out = {"loss": batch_loss(model, batch, config), **predictions(family, model, batch)}
    if config.label_smoothing:
        out["nll"] = batch_loss(model, batch, dataclasses.replace(config, label_smoothing=0.0))
    return out
