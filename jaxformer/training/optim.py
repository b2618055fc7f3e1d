"""AdamW, its weight-decay mask, the learning-rate schedules and clipping, in optax.

Twin: ``torch_ref/training/optim.py``. One semantics on both sides (``docs/training.md``):

- AdamW (Loshchilov & Hutter): ``m, v`` moments with bias correction, the update
  ``m_hat / (sqrt(v_hat) + eps)`` plus ``weight_decay * p`` on the decayed parameters, the sum
  scaled by the scheduled learning rate. ``optax.adamw`` and ``torch.optim.AdamW`` both compute
  this; their defaults differ (weight decay 1e-4 vs 1e-2), so every value comes from
  ``TrainConfig``.
- Weight decay applies to matrices (``kernel``) and, when ``decay_embeddings``, to embedding
  tables; never to biases or LayerNorm parameters.
- Clipping by global norm, torch's formula: ``g * min(1, clip_norm / (norm + 1e-6))`` (optax's
  ``clip_by_global_norm`` divides by the norm itself and only when it exceeds the threshold; the
  two differ by about 1e-6 relative, which 100 steps could amplify, so one formula is used).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxformer.training.config import TrainConfig

CLIP_EPS = 1e-6  # added to the norm before dividing, as torch.nn.utils.clip_grad_norm_ does


def learning_rate(config: TrainConfig, step):
    """The learning rate of update ``step`` (0-based; may be traced)."""
    n = jnp.asarray(step, jnp.float32)
    peak, warmup = config.learning_rate, config.warmup_steps
    if config.schedule == "inverse_sqrt":
        return peak * jnp.minimum((n + 1) / warmup, jnp.sqrt(warmup / (n + 1)))
    # The fraction of the decay still ahead, computed directly rather than as 1 - progress (and
    # cosine's (1 + cos(pi p)) / 2 as sin^2(pi r / 2)), so float32 loses nothing near the end.
    remaining = jnp.clip((config.steps - n) / max(1, config.steps - warmup), 0.0, 1.0)
    low = config.min_learning_rate
    if config.schedule == "linear":
        decayed = low + (peak - low) * remaining
    elif config.schedule == "cosine":
        decayed = low + (peak - low) * jnp.square(jnp.sin(0.5 * math.pi * remaining))
    else:  # constant
        decayed = jnp.asarray(peak, jnp.float32)
    if warmup == 0:
        return decayed
    return jnp.where(n < warmup, peak * (n + 1) / warmup, decayed)


def decays(leaf: str, config: TrainConfig) -> bool:
    """Whether a parameter named ``leaf`` (NNX leaf name) takes weight decay."""
    if leaf == "kernel":
        return True
    if leaf == "embedding":
        return config.decay_embeddings
    if leaf in ("bias", "scale"):  # biases, LayerNorm scale and bias
        return False
    raise ValueError(f"no weight-decay rule for a parameter named {leaf!r}")


def weight_decay_mask(model: nnx.Module | nnx.State, config: TrainConfig) -> nnx.State:
    """A tree like the model's parameters (``nnx.state(model, nnx.Param)``, or that state
    itself) holding True where the parameter is decayed."""
    params = model if isinstance(model, nnx.State) else nnx.state(model, nnx.Param)
    return nnx.from_flat_state([(path, variable.replace(decays(str(path[-1]), config)))
                                for path, variable in nnx.to_flat_state(params)])


def make_optimizer(config: TrainConfig, model: nnx.Module | nnx.State
                   ) -> optax.GradientTransformation:
    """AdamW with ``config``'s hyper-parameters, decay mask and schedule, for the parameters of
    ``model`` (clipping is applied by the step before this, so that it can report the norm)."""
    return optax.chain(
        optax.scale_by_adam(b1=config.beta1, b2=config.beta2, eps=config.eps, eps_root=0.0),
        optax.add_decayed_weights(config.weight_decay, mask=weight_decay_mask(model, config)),
        optax.scale_by_learning_rate(lambda count: learning_rate(config, count)),
    )


def global_norm(grads) -> jax.Array:
    """``sqrt`` of the sum of every gradient entry squared, in float32."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32)))
                        for g in jax.tree.leaves(grads)))


def clip_by_global_norm(grads, clip_norm: float):
    """``(grads * min(1, clip_norm / (norm + 1e-6)), norm)``; ``clip_norm`` 0: unchanged."""
    norm = global_norm(grads)
    if clip_norm <= 0:
        return grads, norm
    scale = jnp.minimum(1.0, clip_norm / (norm + CLIP_EPS))
    return jax.tree.map(lambda g: g * scale.astype(g.dtype), grads), norm
