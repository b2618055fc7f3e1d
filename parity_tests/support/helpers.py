"""Helpers every parity test shares: tolerances, comparisons, model pairs, masks, weights."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os

import numpy as np
import torch
from flax import nnx

from jaxformer.checkpoints import convert
from jaxformer.nn.stack import LayerStack

# DESIGN.md: max abs diff <= 1e-5 relative to the output's scale.
FORWARD_RTOL = 1e-5
GRAD_RTOL = 1e-5
JIT_TOL = 1e-6

# XLA options for the processes a test starts whose claims compare programs compiled alike (a
# resumed run against an uninterrupted one, sharded against one device) or only that something
# runs (the benchmark scripts): LLVM without its expensive optimisations. A tiny model's time
# there goes to compiling, which this cuts by a third to a half. The XLA program is the same, but
# its float32 results may differ from the default's in the last bits (a tiny GPT's first loss:
# 4.0474520 against 4.0474524, docs/testing.md), so never for a claim against a program compiled
# by default.
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")


def fast_compile_flags() -> str:
    """``XLA_FLAGS`` for such a process: the suite's own (a margins run's instruction-set cap
    kept) with ``FAST_COMPILE`` added."""
    ours = {option.split("=")[0] for option in FAST_COMPILE}
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if f.split("=")[0] not in ours]
    return " ".join([*kept, *FAST_COMPILE])


def fast_compile_env(**changes: str) -> dict[str, str]:
    """The environment for such a process: the suite's own (its compilation cache included) with
    :func:`fast_compile_flags`, and ``changes``."""
    return {**os.environ, "XLA_FLAGS": fast_compile_flags(), **changes}


def to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=np.float32)


def max_rel_diff(expected, actual, where=None) -> float:
    """max |expected - actual| / max(1, max |expected|), over ``where`` (bool, broadcast) if given.

    Scale-relative, as DESIGN.md specifies: outputs of order 1 are held to an absolute 1e-5,
    large logits to 1e-5 of their magnitude.
    """
    expected, actual = to_numpy(expected), to_numpy(actual)
    assert expected.shape == actual.shape, f"shapes differ: {expected.shape} vs {actual.shape}"
    if where is not None:
        where = np.broadcast_to(np.asarray(where, dtype=bool)[..., None]
                                if np.ndim(where) < expected.ndim else np.asarray(where, bool),
                                expected.shape)
        expected, actual = expected[where], actual[where]
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    return float(np.abs(expected - actual).max(initial=0.0)) / scale


def assert_close(expected, actual, where=None, tol: float = FORWARD_RTOL, what: str = "output"):
    diff = max_rel_diff(expected, actual, where)
    assert diff <= tol, f"{what}: scale-relative max abs diff {diff:.3g} > {tol:g}"


def randomize(module: torch.nn.Module, seed: int, spread: float = 0.2) -> torch.nn.Module:
    """Re-draw every parameter far from the N(0, 0.02) initialisation, so that attention is sharp,
    masks matter and no scale or bias is trivially 1 or 0: Linear weights N(0, 1/fan_in),
    embeddings 0.5 N(0, 1), LayerNorm scales 1 + spread N(0, 1), biases spread N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            owner = module.get_submodule(name.rpartition(".")[0])
            noise = torch.randn(p.shape, generator=gen)
            if isinstance(owner, torch.nn.LayerNorm) and name.endswith("weight"):
                p.copy_(1.0 + spread * noise)
            elif p.ndim == 1:
                p.copy_(spread * noise)
            elif isinstance(owner, torch.nn.Linear):
                p.copy_(noise / math.sqrt(p.shape[1]))
            else:  # nn.Embedding
                p.copy_(0.5 * noise)
    return module


def twin_pair(torch_cls, jax_cls, config, seed: int = 0, randomized: bool = False):
    """The torch twin built from ``seed`` (its weights :func:`randomize`-d if ``randomized``) and
    the NNX model loaded with its weights, both in eval."""
    torch.manual_seed(seed)
    torch_model = torch_cls(config)
    if randomized:
        randomize(torch_model, seed)
    torch_model.eval()
    jax_model = convert.abstract_model(lambda: jax_cls(config, rngs=nnx.Rngs(seed + 1)))
    convert.torch_to_nnx(torch_model.state_dict(), jax_model)
    jax_model.eval()
    return torch_model, jax_model


_UNROLLED_INIT = LayerStack.__init__


@contextlib.contextmanager
def scanned_stacks():
    """Every jaxformer ``LayerStack`` built inside is scanned, whatever its config says: how the
    ``scan_layers`` fixture (conftest.py) runs a test written for one mode in both. The torch
    twin has no scan; its state dict, and so the comparison, is the same."""
    def scanned(self, config, *args, **kwargs):
        _UNROLLED_INIT(self, dataclasses.replace(config, scan_layers=True), *args, **kwargs)

    LayerStack.__init__ = scanned
    try:
        yield
    finally:
        LayerStack.__init__ = _UNROLLED_INIT


def scanning() -> bool:
    """Whether :func:`scanned_stacks` is active (for caches of built models)."""
    return LayerStack.__init__ is not _UNROLLED_INIT


MASK_KINDS = ("none", "right_padding", "left_padding", "fully_padded_row")


def make_attention_mask(kind: str, batch: int, seq: int) -> np.ndarray | None:
    """``[batch, seq]`` int mask of the named kind (row 0 always full; None for "none")."""
    if kind == "none":
        return None
    mask = np.ones((batch, seq), dtype=np.int64)
    lengths = np.maximum(1, seq - 1 - np.arange(batch) * max(1, seq // (2 * batch)))
    for b in range(1, batch):
        if kind == "left_padding":
            mask[b, : seq - lengths[b]] = 0
        else:
            mask[b, lengths[b]:] = 0
    if kind == "fully_padded_row":
        mask[-1] = 0
    return mask
