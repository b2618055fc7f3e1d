"""Checks at the public boundary, shared by ``jaxformer`` and ``torch_ref`` (numpy only).

JAX clamps out-of-range gather indices where torch raises, so an unchecked bad token id would
give a silently wrong answer. Every model checks its inputs here before computing. Shapes are
static and always checked; values can only be checked when they are concrete, i.e. outside
``jax.jit``. Under ``jit`` call :func:`check_ids` on the host-side batch before the step.
"""

from __future__ import annotations

import math
import sys


def is_traced(x) -> bool:
    """True for a JAX tracer (inside ``jit``/``grad``), whose values cannot be read."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.core.Tracer)


def check_ids(name: str, ids, upper: int) -> None:
    """Raise ``ValueError`` unless every value of ``ids`` lies in ``[0, upper)``."""
    if is_traced(ids) or math.prod(ids.shape) == 0:  # .size is a method on torch
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= upper:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name} must lie in [0, {upper}); found {bad} "
                         f"(values span [{lo}, {hi}])")


def check_rank(name: str, x, rank: int) -> None:
    if len(x.shape) != rank:
        raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(x.shape)}")


def check_same_shape(name: str, x, ref_name: str, ref) -> None:
    """``x`` (may be None) must have exactly the shape of ``ref``."""
    if x is not None and tuple(x.shape) != tuple(ref.shape):
        raise ValueError(f"{name} has shape {tuple(x.shape)} but {ref_name} has shape "
                         f"{tuple(ref.shape)}; they must match")


def check_length(name: str, length: int, limit: int) -> None:
    if length > limit:
        raise ValueError(f"{name} has length {length}, longer than the position table "
                         f"(max_position_embeddings={limit})")


def check_token_inputs(input_ids, vocab_size: int, max_len: int, attention_mask=None,
                       name: str = "input_ids", mask_name: str = "attention_mask") -> None:
    """The checks every family needs on ``[batch, seq]`` token ids and their mask."""
    check_rank(name, input_ids, 2)
    check_length(name, input_ids.shape[1], max_len)
    check_ids(name, input_ids, vocab_size)
    check_same_shape(mask_name, attention_mask, name, input_ids)
