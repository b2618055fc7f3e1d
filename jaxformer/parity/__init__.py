"""The main job (``jaxformer parity``): every family, built in both frameworks with the same
seeded weights, compared component by component and as a whole, jitted and against float64.

The families are built in ``families``; the rows and their bounds are in ``compare``.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Iterator, Sequence

import jax

try:
    import torch
except ImportError as error:  # the library runs without torch; this job compares against it
    raise ImportError("jaxformer parity compares jaxformer with its PyTorch twin and needs torch: "
                      "pip install 'jaxformer[torch]'") from error

from jaxformer.parity.compare import FORWARD_RTOL, JIT_TOL, Row, compare
from jaxformer.parity.families import bert_rows, gpt_rows, padded_batch, transformer_rows, twin

__all__ = ["FAMILIES", "FORWARD_RTOL", "JIT_TOL", "PRESETS", "Row", "available_families",
           "compare", "padded_batch", "run", "twin"]

PRESETS = ("tiny", "base")

FAMILIES: dict[str, tuple[str, Callable[[str, int], Iterator[Row]]]] = {
    "bert": ("jaxformer.models.bert", bert_rows),
    "transformer": ("jaxformer.models.encoder_decoder", transformer_rows),
    "gpt": ("jaxformer.models.gpt", gpt_rows),
}


def available_families() -> list[str]:
    """The families whose module is present in this installation."""
    return [name for name, (module, _) in FAMILIES.items()
            if importlib.util.find_spec(module) is not None]


def run(families: Sequence[str] | None = None, preset: str = "tiny",
        seed: int = 0) -> tuple[list[Row], float]:
    """All rows for ``families`` (default: every available one) and the seconds it took.

    Each family builds its torch_ref twin from a seed, moves the weights into the NNX model with
    ``jaxformer.checkpoints.convert``, feeds both the same inputs (with padding), and compares
    every component and the full model. Only rows that carry meaning are compared (padded query
    rows are not). The full model is also run jitted (``jaxformer.nn.jit.jitted``) and, as the
    exact reference, in float64 (the torch twin cast to float64), so each float32 evaluation's
    own rounding error is measured.

    Bounds (``compare``), relative to the output's scale ``max(1, max |output|)``: 1e-5 for every
    component and every float32 evaluation against float64 (the project's tolerance table,
    docs/design.md); for jit against eager, the table's 1e-6, or twice the float32 error that
    torch_ref and eager jaxformer show against float64 where that is larger (at full size it is;
    the reasoning and the measurements are in ``compare``).
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {PRESETS}, got {preset!r}")
    jax.config.update("jax_default_matmul_precision", "highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    start = time.perf_counter()
    rows: list[Row] = []
    for name in families or available_families():
        rows.extend(FAMILIES[name][1](preset, seed))
    return rows, time.perf_counter() - start
