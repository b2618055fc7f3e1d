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
- Adam's bias corrections ``1 - b^t`` are exact to float32 rounding, as torch's (``scale_by_adam``).
- The learning rate of each update is the twin's function of the step, on the host in float64,
  rounded once to float32 where the update applies it (torch applies it as a float32 scalar too).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxformer.training.config import TrainConfig

CLIP_EPS = 1e-6  # added to the norm before dividing, as torch.nn.utils.clip_grad_norm_ does


def learning_rate(config: TrainConfig, step) -> float:
    """The learning rate of update ``step`` (0-based), computed on the host in float64 and given
    to the compiled update as an argument (:func:`scale_by_given_rate`): the schedule's numbers
    (its length, warm-up, peak and floor) are no constants of the program, so runs that differ
    only in them share one compiled step (and its compilation-cache entry)."""
    n = float(step)
    peak, warmup = config.learning_rate, config.warmup_steps
    if config.schedule == "inverse_sqrt":
        return peak * min((n + 1) / warmup, math.sqrt(warmup / (n + 1)))
    if n < warmup:
        return peak * (n + 1) / warmup
    # The fraction of the decay still ahead (cosine's (1 + cos(pi p)) / 2 written as
    # sin^2(pi r / 2), which keeps its digits near the end).
    remaining = min(max((config.steps - n) / max(1, config.steps - warmup), 0.0), 1.0)
    low = config.min_learning_rate
    if config.schedule == "linear":
        return low + (peak - low) * remaining
    if config.schedule == "cosine":
        return low + (peak - low) * math.sin(0.5 * math.pi * remaining) ** 2
    return peak  # constant


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


def scale_by_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
    """Adam's ``m_hat / (sqrt(v_hat) + eps)``: ``optax.scale_by_adam`` (``eps_root=0``) with exact
    bias corrections.

    optax raises ``b`` to the power ``t`` in float32, where 0.999 is 0.99900001: its ``1 - b2^t``
    is 1.29e-5 too small at every step before ~10^4, so every update is 6.4e-6 larger than the one
    torch.optim.AdamW computes (its corrections are float64), a bias that 100 steps accumulate
    (2e-5 relative in the parameters of the classifier trajectory, 15 times torch's own distance
    from float64). Here ``1 - b^t = -expm1(t log b)``, ``log b`` taken in float64: float32
    rounding only. The state is optax's, so checkpoints of either read the same.
    """
    log_b1, log_b2 = math.log(b1), math.log(b2)

    def init(params):
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                      mu=jax.tree.map(jnp.zeros_like, params),
                                      nu=jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params=None):
        del params
        mu = jax.tree.map(lambda g, m: (1 - b1) * g + b1 * m, updates, state.mu)
        nu = jax.tree.map(lambda g, v: (1 - b2) * jnp.square(g) + b2 * v, updates, state.nu)
        count = optax.safe_int32_increment(state.count)
        t = count.astype(jnp.float32)
        correction1, correction2 = -jnp.expm1(t * log_b1), -jnp.expm1(t * log_b2)
        updates = jax.tree.map(
            lambda m, v: (m / correction1.astype(m.dtype))
            / (jnp.sqrt(v / correction2.astype(v.dtype)) + eps), mu, nu)
        return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


def make_optimizer(config: TrainConfig, model: nnx.Module | nnx.State
                   ) -> optax.GradientTransformation:
    """AdamW with ``config``'s hyper-parameters, decay mask and schedule, for the parameters of
    ``model`` (clipping is applied by the step before this, so that it can report the norm)."""
    return optax.chain(
        scale_by_adam(config.beta1, config.beta2, config.eps),
        optax.add_decayed_weights(config.weight_decay, mask=weight_decay_mask(model, config)),
        scale_by_given_rate(),
    )


def scale_by_given_rate() -> optax.GradientTransformationExtraArgs:
    """``-learning_rate * updates``, the rate an argument of each update
    (``tx.update(..., learning_rate=lr)``, a float32 scalar that may be traced) instead of a
    schedule compiled into the program. Its state is ``optax.scale_by_learning_rate``'s (the
    update count), so checkpoints are the same."""

    def init(params):
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params=None, *, learning_rate, **extra_args):
        del params, extra_args
        rate = -jnp.asarray(learning_rate, jnp.float32)
        updates = jax.tree.map(lambda g: rate.astype(g.dtype) * g, updates)
        return updates, optax.ScaleByScheduleState(count=optax.safe_int32_increment(state.count))

    return optax.GradientTransformationExtraArgs(init, update)


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
