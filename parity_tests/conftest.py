"""Pins precision and seeds for the parity suite; shared helpers are in ``support/helpers.py``.

float32 matmuls default to TF32 on GPU in both frameworks; parity needs full precision, so both
are pinned here, before any test builds a model.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# `jaxformer train/generate/embed` keep compiled programs under ~/.cache (jaxformer.runtime); the
# suite's commands never write there (a test that wants the cache sets its own directory).
os.environ.setdefault("JAXFORMER_COMPILATION_CACHE", "0")
# One XLA compilation cache for the whole run instead: both xdist workers and every `jaxformer`
# process a test starts (they inherit the variables). Many tests build the same tiny models'
# programs again (a new TrainStep is a new jit), and most of a test's time is compiling; a
# cached executable is the compiled one, so no result changes. A new directory per run (the
# run), removed when the run ends; a JAX_COMPILATION_CACHE_DIR already set wins.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # set before xdist starts its workers
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["JAXFORMER_SUITE_CACHE"] = (
        tempfile.mkdtemp(prefix="jaxformer-suite-xla-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# glibc's allocator as it comes, in the suite's processes and the ones they start: the library's
# settings (jaxformer.runtime.tune_allocator) put every thread on one malloc arena, which makes
# XLA's compiler, whose HLO and code-generation threads allocate all the time, about 1.2x slower
# (docs/testing.md); the suite is mostly compiling. Memory settings change no compiled program
# and no result; the tests of the settings themselves run in interpreters of their own.
os.environ.setdefault("JAXFORMER_TUNE_MALLOC", "0")

import jax
import numpy as np
import pytest
import torch
from hypothesis import settings

pytest.register_assert_rewrite("parity_tests.support")  # their bounds explain themselves too
from parity_tests.support import bounds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
jax.config.update("jax_default_matmul_precision", "highest")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")

settings.register_profile("parity", max_examples=15, deadline=None, derandomize=True)
settings.load_profile("parity")

if os.environ.get(bounds.MARGINS_ENV):  # a margins run (parity_tests/tools/margins.py)
    _assert_allclose = np.testing.assert_allclose

    def _recorded_assert_allclose(actual, desired, rtol=1e-7, atol=0, *args, **kwargs):
        caller = sys._getframe(1)
        where = f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}"
        measured, bound = bounds.allclose_margin(actual, desired, rtol, atol)
        bounds.record(measured, bound, f"assert_allclose(rtol={rtol:g}, atol={atol:g})", where)
        return _assert_allclose(actual, desired, rtol, atol, *args, **kwargs)

    np.testing.assert_allclose = _recorded_assert_allclose


# The files that take longest, longest first (seconds of one worker on the 2-core machine of
# docs/testing.md, 2026-11-27; 25 s or more). Run first, they leave the short files to fill the
# end of a parallel run, so that no worker idles while the other finishes a long file. Only the
# order of whole files changes (a file's own tests keep theirs); a file missing here runs after
# these, in collection order.
LONGEST_FIRST = (
    "training/test_loading.py", "generation/test_hf_seq2seq.py",
    "checkpoints/test_hf_encoder_decoder.py", "test_docs.py", "nn/test_stack.py",
    "models/test_gpt.py", "test_benchmark_scripts.py", "training/test_multiprocess.py",
    "training/test_trajectory.py", "training/test_interrupt.py", "models/test_encoder_decoder.py",
    "models/test_bert.py", "test_parity_job.py", "generation/test_cli_runs.py",
    "checkpoints/test_hf.py", "training/test_finetune.py", "test_runtime.py",
    "generation/test_hf_parity.py", "test_sharding.py", "nn/test_lookups.py",
    "training/test_cli.py", "nn/test_attention.py", "training/test_dispatch_ahead.py",
    "models/test_bf16.py", "test_readme_path.py", "generation/test_cache.py",
)


_RANK = {name: i for i, name in enumerate(LONGEST_FIRST)}


def _longest_first(item) -> int:
    """``item``'s file's place in ``LONGEST_FIRST`` (after them all when it is not there)."""
    try:
        name = Path(str(item.path)).relative_to(ROOT / "parity_tests").as_posix()
    except ValueError:  # outside parity_tests/
        return len(_RANK)
    return _RANK.get(name, len(_RANK))


def pytest_assertion_pass(item, lineno, orig, expl):
    """In a margins run (``-o enable_assertion_pass_hook=true``), records every passing
    ``assert measured <= bound`` between numbers in this repository's tests (pytest rewrites
    the assertions of plugins too: hypothesis's are not ours)."""
    pair = bounds.comparison(expl) if os.environ.get(bounds.MARGINS_ENV) else None
    if pair is None:
        return
    frame = sys._getframe(1)
    while frame is not None and {"_pytest", "pluggy"} & set(Path(frame.f_code.co_filename).parts):
        frame = frame.f_back
    if frame is not None and Path(frame.f_code.co_filename).is_relative_to(ROOT / "parity_tests"):
        bounds.record(*pair, what=orig, where=f"{Path(frame.f_code.co_filename).name}:{lineno}")


def pytest_sessionfinish(session, exitstatus):
    """The run's compilation cache goes with the run (in the xdist controller, or the single
    process: not in a worker, whose siblings may still be using it)."""
    ours = os.environ.get("JAXFORMER_SUITE_CACHE")
    if ours and not hasattr(session.config, "workerinput"):
        shutil.rmtree(ours, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """The long files first (``LONGEST_FIRST``; the Makefile's ``--no-loadscope-reorder`` keeps
    this order for pytest-xdist, whose default sorts files by their number of tests). Tests
    marked ``gpu`` run only where JAX sees a GPU; elsewhere they are skipped, saying what the
    machine has."""
    items.sort(key=_longest_first)  # stable: the rest keeps collection order
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
