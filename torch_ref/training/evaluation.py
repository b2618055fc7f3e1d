"""Twin of ``jaxformer/training/evaluation.py``: one evaluation batch in PyTorch, the task's
loss (``torch_ref.training.losses``) and the model's arg-max predictions.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from jaxformer.training import tasks
from jaxformer.training.config import TrainConfig
from torch_ref.training import losses


def predictions(family: str, model, batch: dict) -> dict:
    """The arg-max class of every output the family's accuracies count (see the JAX side)."""
    tasks.get(family)
    if family == "gpt":
        return {"token_predictions": torch.argmax(
            model(batch["input_ids"], batch.get("attention_mask")), dim=-1)}
    if family == "transformer":
        return {"token_predictions": torch.argmax(model(
            batch["src_ids"], batch["tgt_ids"], batch["src_mask"], batch["tgt_mask"]), dim=-1)}
    if family == "bert":
        _, mlm_logits, nsp_logits = model(batch["input_ids"], batch["token_type_ids"],
                                          batch["attention_mask"], batch["masked_positions"])
        return {"mlm_predictions": torch.argmax(mlm_logits, dim=-1),
                "nsp_predictions": torch.argmax(nsp_logits, dim=-1)}
    return {"predictions": torch.argmax(model(batch["input_ids"], batch["token_type_ids"],
                                              batch["attention_mask"]), dim=-1)}


@torch.no_grad()
def evaluate_batch(family: str, model, batch: dict, config: TrainConfig) -> dict:
    """``loss``, ``nll`` (without label smoothing, when the config smooths) and the
    :func:`predictions` of one batch (numpy arrays, as the JAX side takes them), as numpy."""
    task = tasks.get(family)
    batch_loss = getattr(losses, task.loss)
    device = next(model.parameters()).device
    batch = {key: torch.as_tensor(np.asarray(value), device=device).long()
             for key, value in batch.items()}
    out = {"loss": batch_loss(model, batch, config), **predictions(family, model, batch)}
    if config.label_smoothing:
        out["nll"] = batch_loss(model, batch, dataclasses.replace(config, label_smoothing=0.0))
    return {key: value.detach().cpu().numpy() for key, value in out.items()}
