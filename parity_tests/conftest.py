"""Pins precision and seeds for the parity suite; shared helpers are in ``support/helpers.py``.

float32 matmuls default to TF32 on GPU in both frameworks; parity needs full precision, so both
are pinned here, before any test builds a model.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import numpy as np
import pytest
import torch
from hypothesis import settings

jax.config.update("jax_default_matmul_precision", "highest")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")

settings.register_profile("parity", max_examples=15, deadline=None, derandomize=True)
settings.load_profile("parity")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run only where JAX sees a GPU; elsewhere they are skipped, saying
    what the machine has."""
    platforms = sorted({device.platform for device in jax.devices()})
    if "gpu" in platforms:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU; JAX sees only {', '.join(platforms)}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from torch's intra-op threads, and on a 2-vCPU machine each op
    then waits ~8 ms for the pool to wake (a tiny BERT's forward takes 0.2 s instead of 2 ms).
    Restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def rng() -> np.random.RandomState:
    return np.random.RandomState(1234)


@pytest.fixture(params=[False, True], ids=["unrolled", "scanned"])
def scan_layers(request):
    """Runs a test twice: as written, then with every jaxformer layer stack scanned
    (``helpers.scanned_stacks``). Opt in with ``@pytest.mark.usefixtures("scan_layers")``."""
    if not request.param:
        yield False
        return
    from parity_tests.support.helpers import scanned_stacks

    with scanned_stacks():
        yield True
