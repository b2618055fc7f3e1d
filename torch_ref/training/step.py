"""Twin of ``jaxformer/training/step.py``: the same update in eager PyTorch, of the model its
Task (``jaxformer.training.tasks``) names, scored by the Task's loss from ``training.losses``.
For ``torch.compile``, call ``model.compile()`` first, or :func:`build_trainer` with
``options.compile`` (the module and its state_dict keys stay).
"""

from __future__ import annotations

import importlib

import numpy as np
import torch
from torch import nn

from jaxformer.training import tasks
from jaxformer.training.config import TrainConfig
from torch_ref.training import losses
from torch_ref.training.optim import clip_by_global_norm, learning_rate, make_optimizer

# task key -> the model class it trains (``task.model`` of ``torch_ref.<task.model_module>``)
MODELS = {name: getattr(importlib.import_module(f"torch_ref.{task.model_module}"), task.model)
          for name, task in tasks.TASKS.items()}


def build_model(family: str, model_config, seed: int) -> nn.Module:
    tasks.get(family)  # a clear error for an unknown key
    torch.manual_seed(seed)
    model = MODELS[family](model_config)
    if model_config.param_dtype != "float32":  # the compute dtype is autocast's (_autocast)
        model = model.to(getattr(torch, model_config.param_dtype))
    return model


def build_trainer(family: str, model_config, config: TrainConfig, options, weights=None):
    """The :class:`TrainStep` of ``jaxformer train --framework torch``: the model of task
    ``family`` from ``config.seed`` (which seeds dropout too), with ``weights`` (a numpy state
    dict, e.g. the JAX run's initial weights) loaded strictly when given, and run through
    ``torch.compile`` when ``options.compile``."""
    model = build_model(family, model_config, config.seed)
    if weights is not None:
        model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    if options.compile:
        model.compile()  # in place: the module and its state_dict keys stay
    return TrainStep(family, model, config)


def _autocast(model_config, device: torch.device):
    """The forward and the loss under ``torch.autocast`` when the config's compute ``dtype`` is
    bfloat16 or float16: torch's mixed precision, jaxformer's compute dtype (the two round
    different values: docs/scale.md)."""
    return torch.autocast(device.type, dtype=getattr(torch, model_config.dtype),
                          enabled=model_config.dtype != "float32")


def _to_tensors(batch: dict, device=None) -> dict[str, torch.Tensor]:
    return {key: torch.as_tensor(np.asarray(value), device=device).long()
            for key, value in batch.items()}


class TrainStep:
    """``step(batch) -> {"loss", "grad_norm", "learning_rate"}`` for one optimizer update.

    Each micro-batch's loss is divided by ``accumulation_steps`` before ``backward``, so the
    gradients accumulated in ``.grad`` are the mean of the micro-batch gradients, as the JAX step
    computes them. A parameter that no loss reaches gets a zero gradient rather than none, so that
    AdamW still decays it and advances its moments exactly as optax does. Dropout draws from
    torch's global generator, seeded by ``build_model``; its state is part of :meth:`state_dict`.
    """

    def __init__(self, family: str, model: nn.Module, config: TrainConfig):
        self.family, self.config, self.model = family, config, model
        self.task = tasks.get(family)
        self.model_config = model.config
        self._optimizer = make_optimizer(config, model)
        self.step = 0

    def __call__(self, batch: dict) -> dict[str, float]:
        return self.fetch(self.dispatch(batch))

    @property
    def dispatch_ahead(self) -> bool:
        """Whether a loop should dispatch the next update before fetching this one's metrics:
        on CUDA, whose kernels run while the host goes on; not on a CPU."""
        return next(self.model.parameters()).device.type != "cpu"

    def dispatch(self, batch: dict) -> dict:
        """The update; its loss and gradient norm stay tensors on the model's device (on CUDA,
        not waited for) until :meth:`fetch` reads them."""
        self.task.check_batch(batch, self.model_config)
        device = next(self.model.parameters()).device
        accum = self.config.accumulation_steps
        self.model.train()
        self._optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for a in range(accum):
            micro = _to_tensors({key: value[a] for key, value in batch.items()}, device)
            with _autocast(self.model_config, device):
                loss = getattr(losses, self.task.loss)(self.model, micro, self.config) / accum
            loss.backward()
            total += loss.detach()
        params = list(self.model.parameters())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        _, norm = clip_by_global_norm([p.grad for p in params], self.config.clip_norm)
        lr = learning_rate(self.config, self.step)
        for group in self._optimizer.param_groups:
            group["lr"] = lr
        self._optimizer.step()
        self.step += 1
        return {"loss": total, "grad_norm": norm, "learning_rate": lr}

    @staticmethod
    def fetch(metrics: dict) -> dict[str, float]:
        """The metrics :meth:`dispatch` returned, as floats (waits for their update)."""
        return {key: float(value) for key, value in metrics.items()}

    def evaluate(self, batch: dict) -> float:
        return self._metric(self.task.loss, batch)

    def accuracy(self, batch: dict) -> float:
        """The task's accuracy on ``batch`` in eval mode (a ValueError if it has none)."""
        if self.task.accuracy is None:
            raise ValueError(f"the {self.family} task reports no accuracy")
        return self._metric(self.task.accuracy, batch)

    @torch.no_grad()
    def _metric(self, name: str, batch: dict) -> float:
        """The function ``name`` of ``training.losses`` on ``batch``, in eval mode."""
        self.task.check_batch(batch, self.model_config)
        device = next(self.model.parameters()).device
        self.model.eval()
        try:
            with _autocast(self.model_config, device):
                return float(getattr(losses, name)(
                    self.model, _to_tensors(batch, device), self.config))
        finally:
            self.model.train()

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self._optimizer.state_dict(),
                "rng": torch.get_rng_state(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self._optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        self.step = int(state["step"])

    def sync(self) -> nn.Module:
        return self.model
