"""Input checks at the public boundary, shared by ``jaxformer`` and ``torch_ref`` (numpy only).

Every model calls its family's check before computing, in both frameworks, so the twins refuse the
same inputs with the same message. Shapes and dtypes are always checked, values whenever they are
concrete; why and what happens under ``jit`` is in `docs/design.md` ("Inputs, masks, numerics").
"""

from __future__ import annotations

import math
import sys

import numpy as np


# Values that are tracers (arguments of a jitted function) cannot be read: there the models make
# every out-of-range lookup NaN (``jaxformer.nn.params.Embed``), and :func:`check_ids` on the
# host-side batch before the step gives the clear error. A concrete JAX array captured by closure
# inside ``jax.jit`` is not a tracer, and is read on the host with numpy.
def is_traced(x) -> bool:
    """True for a JAX tracer (inside ``jit``/``grad``), whose values cannot be read."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.core.Tracer)


def host_values(x) -> np.ndarray | None:
    """The values of ``x`` as a numpy array, or None when they are not known (a tracer)."""
    if is_traced(x):
        return None
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _dtype_name(x) -> str:
    return str(x.dtype).removeprefix("torch.")


def check_rank(name: str, x, rank: int) -> None:
    if len(x.shape) != rank:
        raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(x.shape)}")


def check_same_shape(name: str, x, ref_name: str, ref) -> None:
    """``x`` (may be None) must have exactly the shape of ``ref``."""
    if x is not None and tuple(x.shape) != tuple(ref.shape):
        raise ValueError(f"{name} has shape {tuple(x.shape)} but {ref_name} has shape "
                         f"{tuple(ref.shape)}; they must match")


def check_length(name: str, length: int, limit: int) -> None:
    if length == 0:
        raise ValueError(f"{name} has sequence length 0; at least one token is needed")
    if length > limit:
        raise ValueError(f"{name} has length {length}, longer than the position table "
                         f"(max_position_embeddings={limit})")


def check_ids(name: str, ids, upper: int) -> None:
    """Raise unless ``ids`` has an integer dtype (``TypeError``) and, when its values are
    concrete, every value lies in ``[0, upper)`` (``ValueError``)."""
    dtype = _dtype_name(ids)
    if not dtype.startswith(("int", "uint")):
        raise TypeError(f"{name} must hold integer ids, got dtype {dtype}")
    values = host_values(ids)
    if values is None or math.prod(values.shape) == 0:
        return
    lo, hi = int(values.min()), int(values.max())
    if lo < 0 or hi >= upper:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name} must lie in [0, {upper}); found {bad} "
                         f"(values span [{lo}, {hi}])")


def check_attention_mask(name: str, mask, ids_name: str, ids) -> None:
    """A ``[batch, seq]`` mask of exactly ``ids``' shape holding only 0/1 (or booleans)."""
    if mask is None:
        return
    if len(mask.shape) != 2:
        raise ValueError(f"{name} must have shape [batch, seq] = {tuple(ids.shape)} with 1 for a "
                         f"real token and 0 for padding, got shape {tuple(mask.shape)}")
    check_same_shape(name, mask, ids_name, ids)
    values = host_values(mask)
    if values is not None and not np.isin(values, (0, 1)).all():
        bad = values[~np.isin(values, (0, 1))].ravel()[0].item()
        raise ValueError(f"{name} must hold only 0/1 (or booleans), 1 for a real token; "
                         f"found {bad!r}")


def check_token_inputs(input_ids, vocab_size: int, max_len: int, attention_mask=None,
                       name: str = "input_ids", mask_name: str = "attention_mask") -> None:
    """The checks every family needs on ``[batch, seq]`` token ids and their mask."""
    check_rank(name, input_ids, 2)
    check_length(name, input_ids.shape[1], max_len)
    check_ids(name, input_ids, vocab_size)
    check_attention_mask(mask_name, attention_mask, name, input_ids)


def check_bert_inputs(config, input_ids, token_type_ids=None, attention_mask=None) -> None:
    check_token_inputs(input_ids, config.vocab_size, config.max_position_embeddings,
                       attention_mask)
    if token_type_ids is not None:
        check_same_shape("token_type_ids", token_type_ids, "input_ids", input_ids)
        check_ids("token_type_ids", token_type_ids, config.type_vocab_size)


def check_masked_positions(positions, hidden_shape) -> None:
    """``(B, P)`` positions into a ``(B, T, C)`` sequence."""
    check_rank("masked_positions", positions, 2)
    if positions.shape[0] != hidden_shape[0]:
        raise ValueError(f"masked_positions has batch size {positions.shape[0]} but the "
                         f"sequence has batch size {hidden_shape[0]}")
    check_ids("masked_positions", positions, hidden_shape[1])


def check_gpt_inputs(config, input_ids, attention_mask=None) -> None:
    """GPT builds its causal mask itself: a 4-D ``[batch, 1, seq, seq]`` mask (seed 004's form)
    is refused, because a malformed one could let a token attend to later tokens."""
    check_rank("input_ids", input_ids, 2)
    if attention_mask is not None and len(attention_mask.shape) != 2:
        raise ValueError(
            f"attention_mask must have shape [batch, seq] = {tuple(input_ids.shape)} with 1 for "
            f"a real token and 0 for padding, got shape {tuple(attention_mask.shape)}. GPT builds "
            f"its causal mask itself; a 4-D [batch, 1, seq, seq] mask (seed 004's form) is not "
            f"accepted because it could let a token attend to later tokens.")
    check_token_inputs(input_ids, config.vocab_size, config.max_position_embeddings,
                       attention_mask)


def check_source(config, src_ids, src_mask=None) -> None:
    check_token_inputs(src_ids, config.src_vocab_size, config.max_position_embeddings,
                       src_mask, name="src_ids", mask_name="src_mask")


def check_target(config, tgt_ids, tgt_mask=None) -> None:
    check_token_inputs(tgt_ids, config.tgt_vocab_size, config.max_position_embeddings,
                       tgt_mask, name="tgt_ids", mask_name="tgt_mask")


def check_memory(memory, tgt_ids, src_mask, hidden_size: int) -> None:
    """``decode``'s extra checks: memory ``(B, S, C)`` fits the target batch and the source mask."""
    check_rank("memory", memory, 3)
    if memory.shape[0] != tgt_ids.shape[0] or memory.shape[2] != hidden_size:
        raise ValueError(f"memory has shape {tuple(memory.shape)}; expected (batch="
                         f"{tgt_ids.shape[0]} as in tgt_ids, source length, "
                         f"hidden_size={hidden_size})")
    if memory.shape[1] == 0:
        raise ValueError("memory has source length 0; at least one source token is needed")
    if src_mask is not None and tuple(src_mask.shape) != tuple(memory.shape[:2]):
        raise ValueError(f"src_mask has shape {tuple(src_mask.shape)} but memory covers "
                         f"{tuple(memory.shape[:2])} (batch, source length); they must match")


def check_source_target(config, src_ids, tgt_ids, src_mask=None, tgt_mask=None) -> None:
    """Everything ``Transformer.__call__`` needs, before any computation."""
    check_source(config, src_ids, src_mask)
    check_target(config, tgt_ids, tgt_mask)
    if src_ids.shape[0] != tgt_ids.shape[0]:
        raise ValueError(f"src_ids has batch size {src_ids.shape[0]} but tgt_ids has batch "
                         f"size {tgt_ids.shape[0]}; they must match")


def check_cache_call(name: str, input_ids, cache_batch: int, cache_length: int,
                     cache_index) -> None:
    """A model call with a KV cache (``GPT``, ``Transformer.decode``): the batch fits the cache,
    and (when the index is concrete) the new tokens fit in the slots left."""
    if input_ids.shape[0] != cache_batch:
        raise ValueError(f"{name} has batch size {input_ids.shape[0]} but the cache was made "
                         f"for {cache_batch}")
    index = host_values(cache_index)
    if index is not None and int(index) + input_ids.shape[1] > cache_length:
        raise ValueError(f"the cache holds {cache_length} slots, {int(index)} used: no room "
                         f"for {input_ids.shape[1]} more tokens")
