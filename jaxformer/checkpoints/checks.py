"""What makes an array a weight, shared by ``convert`` and ``hf`` (numpy only, no framework).

A weight is a finite floating-point array. Integer and boolean tensors in a state_dict are buffers
or mistakes (loaded as weights they would silently become zeros and ones), and a NaN or infinite
weight poisons every output it reaches: both are refused at load time, by key.
"""

from __future__ import annotations

import numpy as np


def is_floating(dtype) -> bool:
    """Real floating point, the ml_dtypes ones numpy lacks (bfloat16, float8) included."""
    dtype = np.dtype(dtype)
    if dtype.kind != "V":
        return dtype.kind == "f"
    try:
        import ml_dtypes

        ml_dtypes.finfo(dtype)
        return True
    except (ImportError, ValueError):
        return False


def weight_problems(key: str, value: np.ndarray) -> tuple[str | None, str | None]:
    """``(dtype problem, non-finite problem)`` of the weight ``key``, each None when fine."""
    if not is_floating(value.dtype):
        return f"{key} ({value.dtype})", None
    value = value.astype(np.float32, copy=False)  # isfinite on float32 whatever the width
    finite = np.isfinite(value)
    if finite.all():
        return None, None
    nan = int(np.isnan(value).sum())
    return None, f"{key} ({nan} NaN, {int(finite.size - finite.sum()) - nan} infinite)"


NON_FLOATING = "non-floating keys"
NON_FINITE = "non-finite keys"
VALUE_HINT = ("  (a weight must be a finite floating-point array: integer and boolean tensors, NaN "
              "and infinities are refused)")
