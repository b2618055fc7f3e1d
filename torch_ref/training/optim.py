"""Twin of ``jaxformer/training/optim.py``: ``torch.optim.AdamW`` with the same decay mask, the
same schedules (set on the parameter groups before each update) and the same clipping formula.

torch's AdamW decays ``p *= 1 - lr * wd`` before the Adam update, optax adds ``wd * p`` to the
update before scaling by ``-lr``: the same ``p - lr * (adam + wd * p)``. Parameters that take no
decay sit in a group with ``weight_decay=0``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from jaxformer.training.config import TrainConfig

CLIP_EPS = 1e-6


def learning_rate(config: TrainConfig, step) -> float:
    """The learning rate of update ``step`` (0-based)."""
    n = float(step)
    peak, warmup = config.learning_rate, config.warmup_steps
    if config.schedule == "inverse_sqrt":
        return peak * min((n + 1) / warmup, math.sqrt(warmup / (n + 1)))
    if n < warmup:
        return peak * (n + 1) / warmup
    remaining = min(max((config.steps - n) / max(1, config.steps - warmup), 0.0), 1.0)
    low = config.min_learning_rate
    if config.schedule == "linear":
        return low + (peak - low) * remaining
    if config.schedule == "cosine":
        return low + (peak - low) * math.sin(0.5 * math.pi * remaining) ** 2
    return peak  # constant


def decays(leaf: str, config: TrainConfig) -> bool:
    """Whether a parameter of kind ``leaf`` (its NNX leaf name, see :func:`_leaf_kind`) decays."""
    if leaf == "kernel":
        return True
    if leaf == "embedding":
        return config.decay_embeddings
    if leaf in ("bias", "scale"):
        return False
    raise ValueError(f"no weight-decay rule for a parameter named {leaf!r}")


def _leaf_kind(module: nn.Module, name: str) -> str:
    """The NNX leaf name of ``module``'s parameter ``name``: convert's four rules, reversed."""
    if name == "bias":
        return "bias"
    kinds = {nn.Linear: "kernel", nn.Embedding: "embedding", nn.LayerNorm: "scale"}
    for cls, kind in kinds.items():
        if isinstance(module, cls) and name == "weight":
            return kind
    raise ValueError(f"no weight-decay rule for parameter {name!r} of {type(module).__name__}")


def weight_decay_mask(model: nn.Module, config: TrainConfig) -> dict[str, bool]:
    """``state_dict`` key -> whether that parameter is decayed."""
    mask = {}
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            key = f"{module_name}.{name}" if module_name else name
            mask[key] = decays(_leaf_kind(module, name), config)
    return mask


def make_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.AdamW:
    mask = weight_decay_mask(model, config)
    named = dict(model.named_parameters())
    groups = [{"params": [named[k] for k in named if mask[k]], "weight_decay": config.weight_decay},
              {"params": [named[k] for k in named if not mask[k]], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.learning_rate,
                             betas=(config.beta1, config.beta2), eps=config.eps, amsgrad=False)


def global_norm(grads) -> torch.Tensor:
    return torch.sqrt(sum(
        torch.sum(torch.square(g.to(torch.promote_types(g.dtype, torch.float32)))) for g in grads))


@torch.no_grad()
def clip_by_global_norm(grads, clip_norm: float):
    """Scales ``grads`` in place by ``min(1, clip_norm / (norm + 1e-6))``; returns
    ``(grads, norm)``. ``clip_norm`` 0: unchanged."""
    grads = list(grads)
    norm = global_norm(grads)
    if clip_norm > 0:
        scale = torch.clamp(clip_norm / (norm + CLIP_EPS), max=1.0)
        for g in grads:
            g.mul_(scale.to(g.dtype))
    return grads, norm
