"""Process-level speed settings of the JAX runtime, decided at run time (no twin: torch has
nothing to compile and its own allocator habits). See docs/performance.md for the measurements.

- :func:`cpu_weight_gradients`: whether linear layers compute their weight gradient with the
  transpose materialised first (XLA:CPU runs ``X^T dY``, a product contracting over the rows of
  both operands, on a generic kernel at about 2/3 of its speed on the usual layout; copying
  ``X^T`` first costs far less than it saves). On by default on the CPU backend, off elsewhere
  and under a device mesh; ``JAXFORMER_CPU_WEIGHT_GRADIENTS=0`` turns it off, ``=1`` forces it.
- :func:`cpu_dropout_masks`: dropout draws its masks with the 20 rounds of Threefry-2x32 written
  out as one elementwise expression over the counters JAX uses, the same bits as
  ``jax.random.bits`` (``jaxformer.nn.dropout``): JAX's CPU lowering of the hash loops over its
  rounds in passes over the whole array (a tiny GPT's training step 1.24x faster, a baby GPT's
  at dropout 0.2 1.11x, and a third less of the compile time dropout adds). On by default on
  the CPU backend, off elsewhere and under a device mesh;
  ``JAXFORMER_CPU_DROPOUT_MASKS=0`` turns it off, ``=1`` forces it.
- :func:`cpu_vector_head`: a tied LM head given a single query vector (batch-1 decoding) is
  ``table . query``, a matrix-vector product over the ``(vocab, hidden)`` table as it lies,
  instead of ``query . table^T``: inside the generation loop XLA:CPU fused a transposed copy of
  the whole table with that product, or copied the table transposed in every step (GPT-2 small:
  a decode step 1.1-1.3x faster; a MarianMT-sized encoder-decoder 7x). Inside generation, 2 to
  ``VECTOR_ROWS`` query vectors (a step's rows and beams) are ``(table . query^T)^T`` behind a
  barrier (1.1-1.3x a step). On by default on the CPU backend, off elsewhere and under a device
  mesh; ``JAXFORMER_CPU_VECTOR_HEAD=0`` turns it off, ``=1`` forces it.
- :func:`cpu_vector_kernels`: generation of one row for at least ``VECTOR_KERNEL_MIN_TOKENS``
  new tokens multiplies, in each step, by copies of some weights in the layout XLA:CPU streams a
  matrix-vector product fastest from, made once per model and kept with it while its weights
  stay the same (``jaxformer.nn.params.kept_vector_kernels``): the narrowing linear kernels
  (more inputs than outputs: the second feed-forward matrix) as ``(out, in)``, about 1.5x faster
  than the ``(in, out)`` the parameters keep, and self-attention's query, key and value kernels
  as one ``(3C, C)`` matrix (GPT-2's widths: 1.4x faster than three ``(C, C)`` products as
  stored); widening kernels stay as they are for one row (no gain, or a loss), unless
  :func:`cpu_gemv_one_row` holds, when every linear kernel of the steps is copied. From 2 to
  ``VECTOR_ROWS`` rows a step (prompts times beams) every linear kernel of the steps' layers is
  copied as ``(out, in)`` and multiplied as ``(W . x^T)^T`` (XLA:CPU's product of a few rows by
  the stored layout streams at about half the speed; GPT-2 small's step 1.26-1.32x). The copies
  hold memory while the model lives (GPT-2 small: 198 MB, 340 MB once a call of several rows
  made the wider set), and the call that makes them pays for it, hence the minimum: a shorter
  call makes none but uses those an earlier call made, unless the model's calls since the last
  that made them (or could have) reach ``VECTOR_KERNEL_SHORT_TOKENS`` together (that call
  compiles the loop again). On by default on the CPU backend, off
  elsewhere and under a device mesh; read when ``generate`` is called;
  ``JAXFORMER_CPU_VECTOR_KERNELS=0`` turns it off, ``=1`` forces it (the minimum still holds).
- :func:`cpu_gemv_one_row`: XLA:CPU compiles a matrix-vector product (its own tiled kernel, not a
  library's) streaming 8 rows of the matrix at once; one at a time (``GEMV_TILING`` in
  ``XLA_FLAGS``) it reads a matrix stored as ``(out, in)`` at 93-98% of a plain sum's bandwidth
  on one core, where 8 rows reached about 75% (GPT-2 small's batch-1 decode step 1.15-1.32x
  faster, with copies of every linear kernel as ``(out, in)``: ``cpu_vector_kernels``), but a
  product reading a matrix along its columns (one row by an ``(in, out)`` kernel as stored)
  becomes 1.5-2x slower. No training step of the families has a matrix-vector product. XLA
  reads its flags once, when JAX starts its backend: the option is added to ``XLA_FLAGS`` when
  this module is imported before that and the platform will be the CPU, as the allocator settings
  below (and child processes inherit it); ``JAXFORMER_CPU_GEMV_ONE_ROW=0`` leaves ``XLA_FLAGS``
  alone, as do flags that already set ``xla_backend_extra_options`` (the user's win).
- :func:`tune_allocator`: glibc's ``malloc`` gives every large block back to the kernel on
  ``free`` and takes it again on the next ``malloc`` (XLA:CPU frees tens to hundreds of MB of
  scratch per call: thousands of page faults per step). ``mallopt`` makes it keep them. A thread
  arena other than the main one cannot hold a block over 64 MiB (glibc's heap size), so such
  blocks are always mapped and unmapped again; one arena avoids that, but a thread keeps the
  arena it first used, so the settings must come before XLA starts its threads: they are applied
  when this module is imported if no JAX backend exists yet and the platform will be the CPU
  (``JAX_PLATFORMS=cpu``, or no GPU/TPU plugin installed), else when a jaxformer training step or
  compiled model is built on the CPU backend (glibc only); ``JAXFORMER_TUNE_MALLOC=0`` leaves the
  allocator alone, as do ``MALLOC_*`` variables set before the process started (the user's
  settings win).
- :func:`select_small_tables`: the gradient of an embedding table of at most
  ``SMALL_TABLE_ROWS`` rows (BERT's two token types) is one masked sum per row (float32) instead
  of the gather's usual scatter-add. On a GPU XLA's scatter-add of 16,384 rows into two
  serialised on atomic adds: 29 ms of a 64 ms BERT-base step at 32 x 512 on an H200. The lookup
  itself stays a gather (the same rows, out-of-range ids still caught by ``checked`` mode). Off
  the CPU backend (there the scatter is a plain loop and faster than the sums);
  ``JAXFORMER_SELECT_SMALL_TABLES=0`` turns it off, ``=1`` forces it.
- :func:`auto_cudnn_attention`: ``attention_implementation="auto"`` takes cuDNN's fused (flash)
  attention for bfloat16 and float16 on a CUDA GPU of compute capability 8.0 or more, where
  cuDNN accepts the call (else XLA's, as on every other backend), without a device mesh (it was
  measured on one GPU; under a mesh ``"cudnn"`` is the user's to ask for);
  ``JAXFORMER_CUDNN_ATTENTION=0`` keeps XLA's, ``=1`` tries cuDNN whatever the device and mesh.
- :func:`cudnn_mask_types`: cuDNN attention runs a mask that is causal, right padding of the
  keys, or both, as cuDNN's own mask types (the causal one skips the blocks above the diagonal)
  instead of an additive bias, whose gradient cuDNN then computes too (the pattern is checked on
  the device: see ``jaxformer.nn.attention.cudnn_attention``); ``JAXFORMER_CUDNN_MASK_TYPES=0``
  always passes the bias.
- :func:`fast_initializer`, :func:`initializer_compiler_options`: on the CPU backend a model's
  initialiser is built for a short compile (``jaxformer.nn.initializer``: its draws grouped by
  shape, its keys derived in blocks) and compiled with LLVM at optimisation level 1 (GPT-2
  small's build 6.6 -> 3.4-5.0 s; the same parameters and keys bit for bit);
  ``JAXFORMER_FAST_INITIALIZER=0`` turns it off, ``=1`` forces it elsewhere.
- :func:`train_compiler_options`: XLA options for compiling the training step. On the GPU
  backend XLA's own Triton GEMM kernels are turned off, so that its products go to cuBLAS (a
  GPT-2 small step in bfloat16 on an H200: see docs/performance.md); ``JAXFORMER_TRITON_GEMM=1``
  keeps XLA's choice. Nothing on the CPU (the option is the GPU compiler's).
- :func:`enable_compilation_cache`: XLA's persistent compilation cache, so a second run of the
  same program skips compiling (``jaxformer train`` and the benchmarks turn it on; the library
  never does on import). Directory: ``$JAXFORMER_COMPILATION_CACHE``, else
  ``$XDG_CACHE_HOME/jaxformer/xla`` (``~/.cache/jaxformer/xla``); ``JAXFORMER_COMPILATION_CACHE=0``
  (or ``off``, or empty) turns it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import jax

_OFF = ("0", "off", "false", "no", "")

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8
# Blocks under 2 GiB (mallopt's largest value: it takes an int) come from the heap and stay there
# when freed (the scratch of a GPT-2 small step at 4 x 128 is 1.09 GB, of 6 layers 0.77 GB); up
# to 2 GiB of free memory at the heap top is kept rather than trimmed; one arena (see the module
# docstring: a second arena maps every block over 64 MiB anew on each call).
_INT_MAX = (1 << 31) - 1
ALLOCATOR_SETTINGS = {_M_MMAP_THRESHOLD: _INT_MAX, _M_TRIM_THRESHOLD: _INT_MAX,
                      _M_TOP_PAD: 64 << 20, _M_ARENA_MAX: 1}


def env_switch(name: str) -> bool | None:
    """True / False when the variable ``name`` says so, None when it is unset."""
    value = os.environ.get(name)
    if value is None:
        return None
    return value.strip().lower() not in _OFF


def _cpu_rule(variable: str) -> bool:
    """A CPU layout rule, read at trace time: on for the CPU backend without a device mesh,
    unless ``variable`` says otherwise."""
    forced = env_switch(variable)
    if forced is not None:
        return forced
    return jax.default_backend() == "cpu" and jax.sharding.get_abstract_mesh().empty


def cpu_weight_gradients() -> bool:
    """Whether ``jaxformer.nn.params`` linear layers take the transposed weight-gradient path."""
    return _cpu_rule("JAXFORMER_CPU_WEIGHT_GRADIENTS")


def cpu_dropout_masks() -> bool:
    """Whether ``jaxformer.nn.dropout.Dropout`` draws its masks with Threefry written out as one
    fusible expression (the same bits as ``jax.random.bits``) instead of JAX's CPU lowering."""
    return _cpu_rule("JAXFORMER_CPU_DROPOUT_MASKS")


# the most rows a generation step multiplies by weights as they lie, copies of the layers'
# kernels (``cpu_vector_kernels``) and a tied LM head's table (``jaxformer.nn.params.
# use_vector_head``): GPT-2 small's step 1.26-1.32x at 2-16 rows; a MarianMT-sized beam search
# 1.02-1.10x at 4-16 rows but 0.96x at 32 (docs/performance.md, "A few rows")
VECTOR_ROWS = 16


def cpu_vector_head() -> bool:
    """Whether a tied LM head given one query vector (or, inside generation, a few) multiplies
    the table by it as the table lies (``jaxformer.nn.params.Embed.attend``)."""
    return _cpu_rule("JAXFORMER_CPU_VECTOR_HEAD")


VECTOR_KERNEL_MIN_TOKENS = 32
# Shorter calls make the copies once a model's calls since the last that made them (or could
# have) reach this many tokens together: the call that makes them also compiles the generation
# loop again (GPT-2 small: about 2.7 s, and 61 ms of copying), and each 8-token call then gained
# about 70 ms, 8.8 ms a token, with XLA's one-row matrix-vector kernel (cpu_gemv_one_row; a
# twenty-first session, 2026-11-29): some 300 tokens repay it
VECTOR_KERNEL_SHORT_TOKENS = 256


def cpu_vector_kernels() -> bool:
    """Whether generating at most ``VECTOR_ROWS`` rows a step multiplies by copies of weights in
    a faster layout, made by a call of at least ``VECTOR_KERNEL_MIN_TOKENS`` tokens (or by the
    shorter call that brings a model's calls since the last that made them to
    ``VECTOR_KERNEL_SHORT_TOKENS``) and kept with the model
    (``jaxformer.nn.params.kept_vector_kernels``)."""
    return _cpu_rule("JAXFORMER_CPU_VECTOR_KERNELS")


SMALL_TABLE_ROWS = 16


def select_small_tables() -> bool:
    """Whether ``jaxformer.nn.params.Embed`` takes the gradient of a table of at most
    ``SMALL_TABLE_ROWS`` rows as masked sums (read at trace time; see the module docstring)."""
    forced = env_switch("JAXFORMER_SELECT_SMALL_TABLES")
    if forced is not None:
        return forced
    return jax.default_backend() != "cpu"


def auto_cudnn_attention() -> bool:
    """Whether ``attention_implementation="auto"`` tries cuDNN (read at trace time; see the
    module docstring)."""
    forced = env_switch("JAXFORMER_CUDNN_ATTENTION")
    if forced is not None:
        return forced
    return _cuda_compute_capability() >= (8, 0) and jax.sharding.get_abstract_mesh().empty


@functools.lru_cache(maxsize=1)
def _cuda_compute_capability() -> tuple[int, ...]:
    """The first device's CUDA compute capability, ``()`` when it is not a CUDA GPU."""
    device = jax.devices()[0]
    if device.platform != "gpu":
        return ()
    try:  # "9.0" on CUDA; ROCm devices name their architecture instead
        return tuple(int(part) for part in str(device.compute_capability).split("."))
    except (AttributeError, ValueError):
        return ()


def cudnn_mask_types() -> bool:
    """Whether cuDNN attention runs causal and right-padding masks as its own mask types (read
    at trace time; see the module docstring)."""
    return env_switch("JAXFORMER_CUDNN_MASK_TYPES") is not False


def fast_initializer() -> bool:
    """Whether a model's initialiser (``training.step.build_model``) is built and compiled for a
    short compile: its draws grouped by shape and its keys derived in blocks
    (``jaxformer.nn.initializer``), LLVM at optimisation level 1 instead of XLA's 3
    (:func:`initializer_compiler_options`). The initialiser runs once; compiling it was most of a
    model's start-up outside the step (GPT-2 small's build 6.6 -> 3.4-5.0 s: docs/performance.md),
    and its parameters are the same bit for bit (``parity_tests/test_runtime.py``). On the CPU
    backend (where that was checked); ``JAXFORMER_FAST_INITIALIZER=0`` builds and compiles it as
    everything else, ``=1`` forces it on any backend."""
    switch = env_switch("JAXFORMER_FAST_INITIALIZER")
    return switch if switch is not None else jax.default_backend() == "cpu"


def initializer_compiler_options() -> dict | None:
    """XLA options for compiling a model's initialiser: LLVM at level 1 where
    :func:`fast_initializer` says (an option of XLA:CPU's; none on other backends)."""
    if not fast_initializer() or jax.default_backend() != "cpu":
        return None
    return {"xla_backend_optimization_level": 1}


def train_compiler_options() -> dict | None:
    """XLA options for the training step's programs (``training.step.TrainStep``), read when
    the step is built: see the module docstring."""
    if jax.default_backend() != "gpu" or env_switch("JAXFORMER_TRITON_GEMM"):
        return None
    return {"xla_gpu_enable_triton_gemm": False}


@functools.lru_cache(maxsize=1)
def tune_allocator() -> bool:
    """Keep freed memory in the process (glibc ``mallopt``, see the module docstring); once per
    process, on the CPU backend only. Returns whether the settings were applied."""
    if _TUNED_AT_IMPORT:
        return True
    return jax.default_backend() == "cpu" and _apply_allocator_settings()


def _apply_allocator_settings() -> bool:
    if env_switch("JAXFORMER_TUNE_MALLOC") is False or not sys.platform.startswith("linux"):
        return False
    if any(k.startswith("MALLOC_") for k in os.environ):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(key, value) == 1 for key, value in ALLOCATOR_SETTINGS.items())


def _cpu_before_backend() -> bool:
    """Whether no JAX backend exists yet and the one JAX will start is the CPU's: the platforms
    asked for (``JAX_PLATFORMS``) are only ``cpu``, or none was asked for and no GPU or TPU
    plugin is installed (JAX would fall back to the CPU)."""
    from jax._src import xla_bridge

    if getattr(xla_bridge, "_backends", None):  # a backend (and its threads) already exists
        return False
    platforms = jax.config.jax_platforms  # type: ignore[attr-defined]
    if platforms:
        return {p.strip() for p in platforms.split(",")} == {"cpu"}
    if importlib.metadata.entry_points(group="jax_plugins"):
        return False
    try:
        import jax_plugins  # the plugins' namespace package
    except ImportError:
        pass
    else:
        if any(True for _ in pkgutil.iter_modules(jax_plugins.__path__)):
            return False
    return importlib.util.find_spec("libtpu") is None


# XLA:CPU's matrix-vector kernel (its tiled LLVM IR GEMV) for a matrix read along its rows
# (``W . x`` with ``W`` as ``(out, in)``) streams this many rows at once; one row streams GPT-2
# small's layer copies at 93-98% of the bandwidth of a plain sum on one core where 8 (XLA's
# default) reached about 75%, but a matrix read along its columns (``x . W``, ``W`` as ``(in,
# out)``) then updates the whole output vector for every input, 1.5-2x slower
# (docs/performance.md, "One row at a time")
GEMV_TILING = "xla_llvm_dot_tiling_factor=1"


def _apply_gemv_tiling() -> bool:
    """Add ``GEMV_TILING`` to ``XLA_FLAGS`` (read once, when JAX starts its backend) unless it is
    switched off or the user's flags already pass XLA:CPU's backend options."""
    if env_switch("JAXFORMER_CPU_GEMV_ONE_ROW") is False:
        return False
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_extra_options" in flags:
        return False
    os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_extra_options={GEMV_TILING}".strip()
    return True


_CPU_AT_IMPORT = _cpu_before_backend()
_TUNED_AT_IMPORT = _CPU_AT_IMPORT and _apply_allocator_settings()
_GEMV_AT_IMPORT = _CPU_AT_IMPORT and _apply_gemv_tiling()


def cpu_gemv_one_row() -> bool:
    """Whether this process's XLA:CPU streams a matrix-vector product one row of the matrix at a
    time (``GEMV_TILING``: set when this module was imported before JAX started its CPU backend,
    or in the user's own ``XLA_FLAGS`` then). Generation of one row then multiplies by ``(out,
    in)`` copies of every linear kernel of its steps (``cpu_vector_kernels``), the layout that
    reads rows."""
    if _GEMV_AT_IMPORT:
        return True
    return (jax.default_backend() == "cpu" and re.search(
        rf"\b{GEMV_TILING}\b", os.environ.get("XLA_FLAGS", "")) is not None)


def compilation_cache_dir() -> Path | None:
    """Where :func:`enable_compilation_cache` puts compiled programs (None: turned off)."""
    value = os.environ.get("JAXFORMER_COMPILATION_CACHE")
    if value is not None:
        return None if value.strip().lower() in _OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path("~/.cache").expanduser()
    return Path(base) / "jaxformer" / "xla"


@contextlib.contextmanager
def cache_lookups() -> Iterator[dict[str, int]]:
    """``{"hits": n, "misses": m}``: the programs XLA's persistent compilation cache served
    (read instead of compiled) and the ones it did not have, inside the block, as JAX reports
    them (``jax.monitoring``; no lookups when the cache is off)."""
    counts = {"hits": 0, "misses": 0}

    def listener(event: str, **kwargs) -> None:
        kind = event.removeprefix("/jax/compilation_cache/cache_")
        if kind in counts:
            counts[kind] += 1

    jax.monitoring.register_event_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_listener(listener)


def enable_compilation_cache() -> Path | None:
    """Turn on XLA's persistent compilation cache (see the module docstring) unless it is
    turned off or the user already configured one; returns the directory in use."""
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    if current:
        return Path(current)
    directory = compilation_cache_dir()
    if directory is None:
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # Cache every program that took a noticeable time to compile, whatever its size: a tenth of
    # a second keeps the evaluation and decoding programs (0.3 s each for a baby GPT), which
    # half a second left to be compiled again by every run (docs/performance.md).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
