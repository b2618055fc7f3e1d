"""``jaxformer.runtime``'s allocator settings and the train step's one compiled signature.

- The allocator settings (docs/performance.md) only work when glibc takes them before XLA starts
  its threads: importing ``jaxformer.runtime`` before any JAX backend exists applies them when the
  platform will be the CPU; once a backend exists, only ``tune_allocator`` (on the CPU backend)
  does. The user's ``MALLOC_*`` variables and ``JAXFORMER_TUNE_MALLOC=0`` win. Each case runs in a
  fresh interpreter (the settings are per process).
- A resumed run's state (a checkpoint's arrays, committed to their device) lowers to the same
  program as a fresh run's, so resuming finds the compiled update in the compilation cache.
- The fast initialiser gives the same parameters; a small embedding table's gradient taken as
  masked sums equals the scatter-add's.
- A tied LM head given one query vector reads the table as it lies, on the CPU.
- The cuDNN attention switches follow the device and their variables.
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import runtime
from jaxformer.config import GPTConfig, TransformerConfig
from jaxformer.training import step, tasks
from jaxformer.training.config import TrainConfig
from parity_tests.support.jaxprs import equations, raw_leaves

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr(
    "CS_GNU_LIBC_VERSION") is None, reason="mallopt is glibc's")

PROBE = """
import jax
{before}
from jaxformer import runtime
print(runtime._TUNED_AT_IMPORT, runtime.tune_allocator())
"""


def _python(code: str, **env: str | None) -> str:
    """``code``'s output in a fresh CPU interpreter, with none of the allocator variables of this
    process but ``env``'s (a variable given as None is unset)."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k != "JAXFORMER_TUNE_MALLOC"}
    merged = {**clean, "JAX_PLATFORMS": "cpu", **env}
    return subprocess.run([sys.executable, "-c", code],
                          env={k: v for k, v in merged.items() if v is not None},
                          capture_output=True, text=True, timeout=120, check=True).stdout


def _probe(before: str = "", **env: str) -> str:
    return _python(PROBE.format(before=before), **env).split("\n")[-2]


@glibc
@pytest.mark.parametrize(("before", "env", "expected"), [
    ("", {}, "True True"),  # imported first: applied before XLA's threads exist
    ("jax.devices()", {}, "False True"),  # a backend exists: applied when a step is built
    ("", {"JAXFORMER_TUNE_MALLOC": "0"}, "False False"),
    ("", {"MALLOC_ARENA_MAX": "4"}, "False False"),  # the user's own settings win
], ids=["before-the-backend", "after-the-backend", "switched-off", "user-malloc-variables"])
def test_allocator_settings_are_applied_when_they_can_work(before, env, expected):
    assert _probe(before, **env) == expected


GEMV_PROBE = """
import os
import jax
{before}
from jaxformer import runtime
print(repr(os.environ.get("XLA_FLAGS")), runtime.cpu_gemv_one_row())
"""
ONE_ROW = "--xla_backend_extra_options=xla_llvm_dot_tiling_factor=1"


def _gemv_env(xla_flags: str, **env: str) -> dict[str, str | None]:
    """``env`` over ``XLA_FLAGS`` = ``xla_flags`` (unset when empty) and no switch: the suite's own
    process has the option in its flags."""
    return {"XLA_FLAGS": xla_flags or None, "JAXFORMER_CPU_GEMV_ONE_ROW": None, **env}


@pytest.mark.parametrize(("before", "env", "flags", "one_row"), [
    ("", {}, ONE_ROW, True),  # imported first: XLA reads its flags when the backend starts
    ("jax.devices()", {}, "", False),  # too late: the backend read them already
    ("", {"JAXFORMER_CPU_GEMV_ONE_ROW": "0"}, "", False),
    ("", {"XLA_FLAGS": "--xla_cpu_max_isa=AVX2"}, f"--xla_cpu_max_isa=AVX2 {ONE_ROW}", True),
    ("", {"XLA_FLAGS": "--xla_backend_extra_options=xla_llvm_dot_tiling_factor=16"},
     "--xla_backend_extra_options=xla_llvm_dot_tiling_factor=16", False),  # the user's options
    ("jax.devices()", {"XLA_FLAGS": ONE_ROW}, ONE_ROW, True),  # the user's own, at start-up
], ids=["before-the-backend", "after-the-backend", "switched-off", "other-user-flags",
        "user-backend-options", "user-one-row"])
def test_gemv_one_row_is_added_to_xla_flags_when_it_can_work(before, env, flags, one_row):
    """``runtime.cpu_gemv_one_row``: the option goes into ``XLA_FLAGS`` when ``jaxformer.runtime``
    is imported before JAX starts its CPU backend, after the user's flags, never over backend
    options the user passes; the function says whether the process has it."""
    output = _python(GEMV_PROBE.format(before=before), **_gemv_env("", **env))
    assert output.split("\n")[-2] == f"{flags or None!r} {one_row}"


GEMV_BITS = """
import numpy as np
from jaxformer import runtime
import jax
rng = np.random.default_rng(0)
w = rng.standard_normal((2304, 768), dtype=np.float32)
x = rng.standard_normal(768, dtype=np.float32)
np.save({path!r}, np.asarray(jax.jit(lambda w, x: w @ x)(w, x)))
"""


def test_gemv_one_row_reaches_xla_and_changes_only_the_rounding(tmp_path):
    """The option is XLA's: a matrix-vector product over an ``(out, in)`` matrix compiles to
    another summation order with it (the last bits of some outputs differ: the kernel that reads
    one row at a time ran) and the same values within float32 rounding."""
    outputs = {}
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f != ONE_ROW)
    for switch in ("1", "0"):
        path = tmp_path / f"{switch}.npy"
        _python(GEMV_BITS.format(path=str(path)),
                **_gemv_env(flags, JAXFORMER_CPU_GEMV_ONE_ROW=switch))
        outputs[switch] = np.load(path)
    assert not np.array_equal(outputs["1"], outputs["0"])
    scale = np.abs(outputs["0"]).max()
    # measured (2026-11-29): 53-54% of the outputs differ, by at most 7.7e-8 of the largest,
    # natively (an AVX-512 EPYC) and capped to AVX2 and to AVX, 2 threads and one core (each row
    # is summed by one task, whatever the threads); the bound is 5x that
    np.testing.assert_allclose(outputs["1"], outputs["0"], rtol=0, atol=4e-7 * scale)


REUSE = """
import ctypes, resource, threading
from jaxformer import runtime
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
SIZE = {size}
faults = []

def cycles():  # as XLA's scratch: a block from one of its threads, written, freed, again
    for _ in range(2):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(SIZE)
        ctypes.memset(block, 1, SIZE)
        libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

thread = threading.Thread(target=cycles)
thread.start()
thread.join()
print(*faults)
"""


@glibc
@pytest.mark.parametrize("tune", ["1", "0"])
def test_a_freed_scratch_block_is_reused_without_page_faults(tune):
    """The settings' purpose, measured: a 1.2 GB block (the size of a GPT-2 small step's
    scratch at 4 x 128) malloc'ed by a thread other than the main one, written and freed, then
    malloc'ed and written again: the second time takes (almost) no page faults with the
    settings, and as many as the first time without them (the block went back to the kernel)."""
    output = _python(REUSE.format(size=1_200_000_000), JAXFORMER_TUNE_MALLOC=tune)
    first, second = map(int, output.split())
    assert first > 0, output
    if tune == "1":
        assert second < 0.05 * first, f"page faults: first {first}, second {second}"
    else:
        assert second > 0.5 * first, f"page faults: first {first}, second {second}"


def test_a_restored_state_lowers_to_the_fresh_runs_program():
    config = GPTConfig.tiny()
    trainer = step.TrainStep("gpt", step.build_model("gpt", config, 0),
                             TrainConfig(steps=4, batch_size=2, seq_len=8))
    ids = np.random.RandomState(0).randint(0, config.vocab_size, (1, 2, 8)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    fresh = trainer._lower(batch).as_text()
    # what a checkpoint restore hands over: arrays committed to their device (a fresh step kept
    # uncommitted ones before, and its resumed run compiled a second program)
    restored = jax.tree.map(lambda x: jax.device_put(x, jax.devices()[0]), trainer.state_dict())
    trainer.load_state_dict(restored)
    assert trainer._lower(batch).as_text() == fresh


def _initializer_leaves(initialize, seed=5) -> list[np.ndarray]:
    return raw_leaves(initialize(np.uint32(seed)))


def _primitives(initialize, name: str) -> int:
    """How many ``name`` equations the initialiser's jaxpr holds, nested ones included."""
    return sum(eqn.primitive.name == name
               for eqn in equations(initialize.trace(np.uint32(0)).jaxpr.jaxpr))


@pytest.mark.parametrize(("family", "scan"), [("gpt", False), ("transformer", False),
                                              ("bert", False), ("classifier", False),
                                              ("gpt", True)])
def test_the_fast_initialiser_gives_the_same_parameters_and_keys(family, scan, monkeypatch):
    """On the CPU backend a model's initialiser is built for a short compile (its normal draws
    grouped by shape, its keys derived in blocks: ``jaxformer.nn.initializer``) and compiled with
    LLVM at level 1: its parameters and RNG keys (dropout on) must equal, bit for bit, those of
    the initialiser built and compiled as everything else, and its model's graph be the same. A
    scanned stack is built as nnx builds it."""
    # GPT's baby preset (0.8M parameters): the tiny presets' draws were too small to tell a
    # draw rounded otherwise (the stacked draw scaled after the loop: 27% of the baby's entries)
    preset = "baby" if family == "gpt" else "tiny"
    config = tasks.model_config(family, preset, vocab_size=96, dropout=0.1, scan_layers=scan)
    monkeypatch.delenv("JAXFORMER_FAST_INITIALIZER", raising=False)
    on_cpu = jax.default_backend() == "cpu"
    assert runtime.fast_initializer() == on_cpu
    assert (runtime.initializer_compiler_options() is not None) == on_cpu
    fast_graphs, fast = step._initializer.__wrapped__(family, config)
    got = _initializer_leaves(fast)
    monkeypatch.setenv("JAXFORMER_FAST_INITIALIZER", "0")
    assert not runtime.fast_initializer()
    assert runtime.initializer_compiler_options() is None
    usual_graphs, usual = step._initializer.__wrapped__(family, config)
    expected = _initializer_leaves(usual)
    assert fast_graphs[-1] == usual_graphs[-1]
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    if on_cpu and not scan:  # the layout that compiles fast: one draw per shape of weight
        # matrix (every 2-D parameter is drawn, every other is constant), one block of keys
        matrices = [x.shape for x in expected if x.ndim == 2]
        assert _primitives(usual, "random_bits") == len(matrices)
        assert _primitives(fast, "random_bits") == len(set(matrices)) < len(matrices)
        assert _primitives(fast, "random_fold_in") == 1 < _primitives(usual, "random_fold_in")


def test_a_module_that_changes_its_initial_value_is_refused():
    """The grouped initialiser puts each draw where its placeholder lies in the model's state; a
    module that built something else from the value would keep zeros: refused, named."""
    from flax import nnx

    from jaxformer.nn import initializer

    class Doubled(nnx.Module):
        def __init__(self, rngs):
            self.kernel = nnx.Param(initializer.normal(0.02)(rngs.params(), (4, 4)) * 2)

    with pytest.raises(RuntimeError, match="1 of the model's 1 deferred normal draws"):
        jax.jit(lambda seed: initializer.build(Doubled, jax.random.key(seed))[1])(0)
    plain = jax.jit(lambda seed: initializer.build(Doubled, jax.random.key(seed),
                                                   grouped=False)[1])(0)
    assert float(jnp.abs(plain["kernel"][...]).max()) > 0


def _embedding_and_gradient(table_rows: int, ids: np.ndarray, select: str, monkeypatch):
    """An ``Embed`` of ``table_rows`` rows read at ``ids``, and the gradient of a fixed weighting
    of what it read with respect to its table, with ``JAXFORMER_SELECT_SMALL_TABLES=select``
    (read at trace time: each call traces anew)."""
    from flax import nnx

    from jaxformer.config import BertConfig
    from jaxformer.nn.params import embedding

    monkeypatch.setenv("JAXFORMER_SELECT_SMALL_TABLES", select)
    table = embedding(table_rows, BertConfig.tiny(), names=("types", "embed"),
                      rngs=nnx.Rngs(0))
    weights = np.random.RandomState(1).standard_normal(ids.shape + (table.features,))

    def loss(module):
        return (module(ids) * weights).sum()

    return np.asarray(table(ids)), np.asarray(nnx.grad(loss)(table)["embedding"][...])


@pytest.mark.parametrize("rows", [2, runtime.SMALL_TABLE_ROWS])
def test_a_small_tables_gradient_as_sums_equals_the_scatter(rows, monkeypatch):
    """Off the CPU, the gradient of a table of a few rows (BERT's token types) is a masked sum
    per row instead of a scatter-add (on a GPU the scatter serialised: docs/performance.md).
    Both give the same rows, bit for bit, NaN rows for ids out of range (negative included), and
    the same gradient up to the order of float32 sums."""
    ids = np.random.RandomState(0).randint(0, rows, (3, 40)).astype(np.int32)
    selected, grad_selected = _embedding_and_gradient(rows, ids, "1", monkeypatch)
    gathered, grad_gathered = _embedding_and_gradient(rows, ids, "0", monkeypatch)
    np.testing.assert_array_equal(selected, gathered)
    # measured (2026-11-26, AMD EPYC: default and XLA capped to AVX2, 1 and 2 threads, the same
    # figures): at most 0.24 of this allowance (largest difference 5.7e-6 absolute, 9.9e-6
    # relative, on gradients of 0.01 to ~2)
    np.testing.assert_allclose(grad_selected, grad_gathered, rtol=1e-5, atol=1e-6)
    assert np.abs(grad_selected).min() > 0  # every row was read

    bad = np.array([[-1, 0, rows - 1, rows]], np.int32)
    out, _ = _embedding_and_gradient(rows, bad, "1", monkeypatch)
    assert np.isnan(out[0, [0, 3]]).all()
    assert np.isfinite(out[0, [1, 2]]).all()


def test_only_small_tables_take_the_summed_gradient(monkeypatch):
    """The switch's default (off the CPU only), a small table's gradient program without a
    scatter, and a table one row over the limit keeping the scatter-add."""
    monkeypatch.delenv("JAXFORMER_SELECT_SMALL_TABLES", raising=False)
    assert runtime.select_small_tables() == (jax.default_backend() != "cpu")
    monkeypatch.setenv("JAXFORMER_SELECT_SMALL_TABLES", "1")
    from flax import nnx

    from jaxformer.config import BertConfig
    from jaxformer.nn.params import embedding

    ids = np.zeros((2, 5), np.int32)

    def program(rows):
        table = embedding(rows, BertConfig.tiny(), names=("types", "embed"), rngs=nnx.Rngs(0))
        return jax.jit(nnx.grad(lambda m: m(ids).sum())).lower(table).as_text()

    assert "scatter" not in program(runtime.SMALL_TABLE_ROWS)
    assert "scatter" in program(runtime.SMALL_TABLE_ROWS + 1)


@pytest.mark.parametrize(("query_shape", "vector"), [((1, 32), True), ((1, 1, 32), True),
                                                    ((2, 32), False), ((1, 3, 32), False)])
def test_a_single_query_vector_multiplies_the_table_as_it_lies(query_shape, vector, monkeypatch):
    """On the CPU a tied LM head given one query vector (batch-1 decoding) is ``table . query``
    (docs/performance.md): the program's one product takes the ``(vocab, hidden)`` table as its
    first operand; any other query keeps ``query . table^T``, as does the switch turned off. Both
    give the logits of a float64 reference, in the query's shape."""
    from flax import nnx

    from jaxformer.nn.params import embedding

    table = embedding(101, GPTConfig.tiny(), names=("vocab", "embed"), rngs=nnx.Rngs(0))
    assert table.features == query_shape[-1]
    query = np.random.RandomState(2).standard_normal(query_shape).astype(np.float32)
    expected = query.astype(np.float64) @ np.asarray(table.embedding[...], np.float64).T

    def first_operands(switch):
        if switch is None:
            monkeypatch.delenv("JAXFORMER_CPU_VECTOR_HEAD", raising=False)
        else:
            monkeypatch.setenv("JAXFORMER_CPU_VECTOR_HEAD", switch)
        logits = np.asarray(jax.jit(table.attend)(query))
        assert logits.shape == query_shape[:-1] + (101,)
        # 32-term float32 dot products, logits up to 0.36: measured (2026-11-28, Intel Xeon,
        # AVX-512, capped to AVX2 and to AVX on one core) at most 6.4e-8 from float64
        np.testing.assert_allclose(logits, expected, rtol=1e-6, atol=2e-7)
        jaxpr = jax.make_jaxpr(table.attend)(query).jaxpr
        return [e.invars[0].aval.shape for e in jaxpr.eqns if e.primitive.name == "dot_general"]

    by_table, by_query = [(101, 32)], [query_shape]
    assert first_operands(None) == (by_table if vector and jax.default_backend() == "cpu"
                                    else by_query)
    assert first_operands("0") == by_query
    assert first_operands("1") == (by_table if vector else by_query)


@pytest.mark.parametrize(("query_shape", "by_table"), [((2, 32), True), ((3, 2, 32), True),
                                                      ((16, 1, 32), True), ((17, 32), False)])
def test_a_few_query_vectors_in_generation_multiply_the_table_as_it_lies(query_shape, by_table):
    """Inside generation (``params.use_vector_head``) a tied LM head given at most
    ``runtime.VECTOR_ROWS`` query vectors (a step's rows and beams) computes ``(table .
    query^T)^T`` on the CPU, the transposed product kept apart by a barrier; more rows, or the
    same rows outside generation, keep ``query . table^T``. The logits of a float64 reference,
    in the query's shape, either way."""
    from flax import nnx

    from jaxformer.nn import params

    table = params.embedding(101, GPTConfig.tiny(), names=("vocab", "embed"), rngs=nnx.Rngs(0))
    query = np.random.RandomState(3).standard_normal(query_shape).astype(np.float32)
    expected = query.astype(np.float64) @ np.asarray(table.embedding[...], np.float64).T

    def first_operands():
        logits = np.asarray(jax.jit(table.attend)(query))
        assert logits.shape == query_shape[:-1] + (101,)
        # 32-term float32 dot products, as in the single-vector test: measured (2026-11-29,
        # AVX-512 EPYC; default, capped to AVX2 and to AVX, 2 threads and one core) at most 0.21
        # of this allowance (0.19 natively, 0.21 capped to AVX)
        np.testing.assert_allclose(logits, expected, rtol=1e-6, atol=2e-7)
        jaxpr = jax.make_jaxpr(table.attend)(query).jaxpr
        return [e.invars[0].aval.shape for e in jaxpr.eqns if e.primitive.name == "dot_general"]

    assert first_operands() == [query_shape]  # outside generation
    params.use_vector_head(table)
    assert table._vector_rows == runtime.VECTOR_ROWS == 16
    assert first_operands() == ([(101, 32)] if by_table and jax.default_backend() == "cpu"
                                else [query_shape])


def test_cudnn_attention_switches(monkeypatch):
    """"auto" tries cuDNN on a CUDA GPU of compute capability 8.0 or more, without a mesh, unless
    told otherwise; never where the first device is not a CUDA GPU; the mask types are on unless
    told. The device is stood in for by its compute capability, so every case runs anywhere."""
    for name in ("JAXFORMER_CUDNN_ATTENTION", "JAXFORMER_CUDNN_MASK_TYPES"):
        monkeypatch.delenv(name, raising=False)
    if jax.devices()[0].platform != "gpu":
        assert runtime._cuda_compute_capability() == ()
    for capability, expected in (((), False), ((7, 5), False), ((8, 0), True), ((9, 0), True)):
        monkeypatch.setattr(runtime, "_cuda_compute_capability", lambda c=capability: c)
        assert runtime.auto_cudnn_attention() is expected, capability
        with jax.set_mesh(jax.make_mesh((1,), ("data",))):  # measured on one device only
            assert not runtime.auto_cudnn_attention()
    assert runtime.cudnn_mask_types()
    for value, expected in (("0", False), ("1", True)):
        monkeypatch.setenv("JAXFORMER_CUDNN_ATTENTION", value)
        monkeypatch.setenv("JAXFORMER_CUDNN_MASK_TYPES", value)
        assert runtime.auto_cudnn_attention() is expected
        assert runtime.cudnn_mask_types() is expected


def _dot_generals(jaxpr) -> list:
    """The ``dot_general`` equations of ``jaxpr`` and of the programs inside it (a custom
    gradient's forward, a loop's body)."""
    return [eqn for eqn in equations(jaxpr) if eqn.primitive.name == "dot_general"]


@pytest.mark.parametrize("input_shape", [(1, 1, 37), (1, 37), (3, 5, 37)])
def test_a_narrowing_linear_layer_multiplies_by_its_vector_kernel_as_it_lies(input_shape):
    """``params.vector_kernels`` gives a narrowing linear layer (more inputs than outputs) an
    ``(out, in)`` copy of its kernel (docs/performance.md, "Decoding at batch 1"): the layer's
    one product then takes that copy as it lies, for one row or several, and gives the float64
    reference's output, as the stored kernel does. A widening or square layer keeps its kernel
    (no faster for one row), and gets a copy too with ``widening`` (for a few rows)."""
    from flax import nnx

    from jaxformer.nn.params import linear, use_vector_kernels, vector_kernels

    config = GPTConfig.tiny()
    layer = linear(37, 32, config, names=("mlp", "embed"), rngs=nnx.Rngs(0))
    layer.bias[...] = np.linspace(-1, 1, 32, dtype=np.float32)
    others = [linear(32, 37, config, names=("embed", "mlp"), rngs=nnx.Rngs(1)),
              linear(32, 32, config, names=("embed", "embed"), rngs=nnx.Rngs(2))]
    x = np.random.RandomState(3).standard_normal(input_shape).astype(np.float32)
    expected = (x.astype(np.float64) @ np.asarray(layer.kernel[...], np.float64)
                + np.asarray(layer.bias[...], np.float64))

    def output_and_matrix(module, v):
        out = np.asarray(module(v))
        (dot,) = _dot_generals(jax.make_jaxpr(lambda u: module(u))(v).jaxpr)
        rows = (v.shape, (int(np.prod(v.shape[:-1])), v.shape[-1]), v.shape[-1:])  # the input
        return out, [u.aval.shape for u in dot.invars if u.aval.shape not in rows]

    stored, stored_matrix = output_and_matrix(layer, x)
    for module in [layer, *others]:
        use_vector_kernels(module, vector_kernels(module))
    copied, copied_matrix = output_and_matrix(layer, x)
    assert stored_matrix == [(37, 32)]
    assert copied_matrix == [(32, 37)]
    for out in (stored, copied):
        assert out.shape == input_shape[:-1] + (32,)
        # 37-term float32 dot products, outputs up to ~3: float32 rounding. Measured
        # (2026-11-29, AVX-512 EPYC; default, capped to AVX2 and to AVX, 2 threads and one core,
        # the same figure: products this small are not split across threads) at most 0.054 of
        # this allowance, both the stored and the copied kernel
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    for module in others:
        kernel = module.kernel[...]
        assert output_and_matrix(module, x[..., :kernel.shape[0]])[1] == [kernel.shape]
        use_vector_kernels(module, vector_kernels(module, widening=True))
        assert output_and_matrix(module, x[..., :kernel.shape[0]])[1] == [kernel.shape[::-1]]


def test_cached_self_attention_projects_one_row_by_one_matrix():
    """``MultiHeadAttention.vector_copies`` joins the query, key and value kernels into one
    ``(3C, C)`` matrix: cached self-attention then makes its queries, keys and values with one
    product by it, and gives the output and cache of the three stored kernels (float32 rounding);
    cross-attention and uncached calls keep the stored kernels."""
    from flax import nnx

    from jaxformer.nn import params
    from jaxformer.nn.attention import MultiHeadAttention
    from jaxformer.nn.cache import LayerCache

    config = GPTConfig.tiny()
    C, nh = config.hidden_size, config.num_heads
    attention = MultiHeadAttention(config, rngs=nnx.Rngs(0))
    attention.eval()
    for projection in (attention.query, attention.key, attention.value):
        projection.bias[...] = np.random.RandomState(4).standard_normal(C).astype(np.float32)
    rng = np.random.RandomState(5)
    x = rng.standard_normal((1, 1, C)).astype(np.float32)
    slots = rng.standard_normal((2, nh, 7, C // nh)).astype(np.float32)  # (B * nh, L, hs)
    cache = LayerCache(key=slots[0], value=slots[1])
    mask = np.ones((1, 1, 1, 7), bool)

    def cached(v):
        return attention(v, mask=mask, cache=cache, cache_index=3)

    def matrices(fn, *args):  # traced afresh each time (a function's trace is cached)
        jaxpr = jax.make_jaxpr(lambda *a: fn(*a))(*args).jaxpr
        return sorted({tuple(u.aval.shape) for e in _dot_generals(jaxpr) for u in e.invars
                       if u.aval.ndim == 2 and u.aval.shape != (1, C)})

    stored, stored_cache = cached(x)
    assert matrices(cached, x) == [(C, C)]  # four products by (C, C) kernels
    params.use_vector_kernels(attention, params.vector_kernels(attention))
    assert attention._qkv_kernel.shape == (3 * C, C)
    one, one_cache = cached(x)
    assert matrices(cached, x) == [(C, C), (3 * C, C)]  # the output's kernel, and the copy
    # C-term float32 dot products over values of order 1, summed in another order: float32
    # rounding. Measured (2026-11-29, AVX-512 EPYC; default, capped to AVX2 and to AVX, 2 threads
    # and one core, the same figure) at most 0.164 of this allowance, output and cache
    np.testing.assert_allclose(np.asarray(one), np.asarray(stored), rtol=1e-6, atol=1e-7)
    for a, b in zip(jax.tree.leaves(one_cache), jax.tree.leaves(stored_cache), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    context = LayerCache(key=slots[0], value=slots[1])
    assert matrices(lambda v: attention(v, mask=mask, cache=context), x) == [(C, C)]
    assert matrices(lambda v: attention(v), x) == [(C, C)]


def _spy_kept_copies(monkeypatch) -> list:
    """The copies ``params.kept_vector_kernels`` returns from now on (it still does its work)."""
    from jaxformer.nn import params

    calls = []
    real = params.kept_vector_kernels
    monkeypatch.setattr(params, "kept_vector_kernels",
                        lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    return calls


@pytest.mark.parametrize("one_row", [False, True], ids=["gemv-8-rows", "gemv-one-row"])
def test_vector_kernels_serve_long_generation_of_a_few_rows(one_row, monkeypatch):
    """The loop's layers get kernel copies for at most ``runtime.VECTOR_ROWS`` rows a step
    (prompts times beams): on the CPU by default, wherever ``JAXFORMER_CPU_VECTOR_KERNELS=1``,
    nowhere with it off. For one row the narrowing layers' and the joined query/key/value (every
    linear layer's too where XLA:CPU streams matrix-vector products one row at a time,
    ``runtime.cpu_gemv_one_row``); for more, every linear layer's (made again, wider, if only the
    one-row set was kept; a later one-row call keeps the wider set). A call of at least
    ``VECTOR_KERNEL_MIN_TOKENS`` tokens makes them; a shorter one makes none (it would not repay
    them) but uses those an earlier call made, unless the model's calls since the last that made
    them reach ``VECTOR_KERNEL_SHORT_TOKENS`` together; a call of one token has no steps."""
    from flax import nnx

    from jaxformer.generation import checks, decoding
    from jaxformer.models.gpt import GPT

    monkeypatch.setattr(runtime, "cpu_gemv_one_row", lambda: one_row)
    model = GPT(GPTConfig.tiny(), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    new = runtime.VECTOR_KERNEL_MIN_TOKENS

    def copies(switch, rows=1, **kwargs):
        if switch is None:
            monkeypatch.delenv("JAXFORMER_CPU_VECTOR_KERNELS", raising=False)
        else:
            monkeypatch.setenv("JAXFORMER_CPU_VECTOR_KERNELS", switch)
        kwargs = dict(dict(max_new_tokens=new), **kwargs)
        options, _ = checks.check_generate(vocab_size=29, **kwargs)
        return decoding._vector_steps(model, graphdef, state, rows, options)

    def applied(*args, **kwargs):
        return bool(copies(*args, **kwargs))

    def widening(made):  # the first feed-forward matrix (it widens) has a copy
        return any(path.endswith("feed_forward/fc1") for path in made)

    assert not applied("1", max_new_tokens=new - 1)  # nothing made yet
    assert not applied("0")
    assert applied(None) == (jax.default_backend() == "cpu")
    one = copies("1")
    assert one
    assert widening(one) == one_row
    assert applied("1", max_new_tokens=4 * new)
    assert applied("1", max_new_tokens=2)  # the copies made above
    assert not applied("0")
    assert not applied("0", max_new_tokens=2)
    assert not applied("1", max_new_tokens=1)
    assert copies("1", rows=2, max_new_tokens=2) is one  # too short to make the wider set
    wide = copies("1", rows=2)
    assert widening(wide)
    assert (wide is one) == one_row  # the one-row set was already the wider one
    assert copies("1") is wide  # one row keeps the wider set
    assert copies("1", num_beams=2) is wide
    assert copies("1", rows=runtime.VECTOR_ROWS // 2, num_beams=2) is wide
    assert not applied("1", rows=runtime.VECTOR_ROWS + 1)
    assert not applied("1", rows=runtime.VECTOR_ROWS // 2 + 1, num_beams=2)
    assert not applied("0", rows=2)

    short = GPT(GPTConfig.tiny(), rngs=nnx.Rngs(1))  # short calls, repeated
    monkeypatch.setenv("JAXFORMER_CPU_VECTOR_KERNELS", "1")

    def short_copies(tokens):
        options, _ = checks.check_generate(vocab_size=29, max_new_tokens=tokens)
        return decoding._vector_steps(short, *nnx.split(short), 1, options)

    calls, rest = divmod(runtime.VECTOR_KERNEL_SHORT_TOKENS - 1, new - 1)
    for _ in range(calls):
        assert not short_copies(new - 1)
    if rest > 1:
        assert not short_copies(rest)  # together one token short
    made = short_copies(2)  # the call that reaches them makes the copies
    assert made
    assert short_copies(2) is made  # and the next short call uses them


def _generation_model(family):
    from flax import nnx

    from jaxformer.models.encoder_decoder import Transformer
    from jaxformer.models.gpt import GPT

    if family == "gpt":
        model, extra = GPT(GPTConfig.tiny(), rngs=nnx.Rngs(4)), {}
    else:
        model = Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(4))
        extra = dict(decoder_start_token_id=1)
    model.eval()
    return model, extra


@pytest.mark.parametrize(("family", "rows", "beams", "one_row"), [
    ("gpt", 1, 1, False), ("seq2seq", 1, 1, False), ("gpt", 1, 1, True), ("seq2seq", 1, 1, True),
    ("gpt", 3, 1, False), ("seq2seq", 2, 2, False)])
def test_generation_with_vector_kernels_gives_the_stored_kernels_tokens(family, rows, beams,
                                                                        one_row, monkeypatch):
    """The same tokens with the loop's kernel copies as with the stored kernels (the same
    products; for several rows summed in another order). The copies are the steps' modules'
    only: the decoder's self-attention and narrowing layers (for several rows, or for one where
    ``runtime.cpu_gemv_one_row``, every linear layer of theirs, a cross-attention's query and
    output included), never the encoder's (it runs once, before the loop) nor a cross-attention's
    key and value (it reads its context's from the cache) or joined copy, nor the query, key and
    value layers the joined copy replaces."""
    from jaxformer.generation import generate

    monkeypatch.setattr(runtime, "cpu_gemv_one_row", lambda: one_row)
    model, extra = _generation_model(family)
    ids = np.random.RandomState(5).randint(3, 20, (rows, 6)).astype(np.int32)
    kept = _spy_kept_copies(monkeypatch)
    tokens = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("JAXFORMER_CPU_VECTOR_KERNELS", switch)
        kept.clear()
        new = runtime.VECTOR_KERNEL_MIN_TOKENS
        tokens[switch] = np.asarray(generate(model, ids, max_new_tokens=new, num_beams=beams,
                                             **extra))
        assert len(kept) == (switch == "1")
    assert tokens["1"].shape[1] > runtime.VECTOR_KERNEL_MIN_TOKENS
    np.testing.assert_array_equal(tokens["1"], tokens["0"])
    layers = (model.config.num_layers if family == "gpt"
              else model.config.num_decoder_layers)
    attentions = sorted(path for path, made in kept[0].items() if "_qkv_kernel" in made)
    linears = sorted(path for path, made in kept[0].items() if "_vector_kernel" in made)

    def count(suffix):
        return len([path for path in linears if path.endswith(suffix)])

    assert len(attentions) == layers
    assert all(path.endswith("attention") for path in attentions)
    assert count("feed_forward/fc2") == layers
    widening = rows * beams > 1 or one_row
    assert count("feed_forward/fc1") == count("self_attention/output" if family == "seq2seq"
                                              else "attention/output") == layers * widening
    cross = [path for path in linears if "cross_attention" in path]
    assert sorted(path.rsplit("/", 1)[1] for path in cross) == sorted(
        ["output", "query"] * layers * (family == "seq2seq" and widening))
    assert not any(path.endswith(("/key", "/value"))
                   or (path.endswith("/query") and path not in cross)
                   or path.startswith("encoder/") for path in linears + attentions)
    if family == "seq2seq":
        assert all(path.endswith("/self_attention") for path in attentions)


@pytest.mark.parametrize("family", ["gpt", "seq2seq"])
def test_kernel_copies_are_kept_with_the_model_until_its_weights_change(family, monkeypatch):
    """``params.kept_vector_kernels``: a model's second ``generate`` call reuses the copies of
    its first; new weights (here the narrowing kernels replaced) get new copies, and the tokens
    those weights give without copies; the copies go with the model."""
    import gc

    from jaxformer.generation import generate
    from jaxformer.nn import params

    monkeypatch.setenv("JAXFORMER_CPU_VECTOR_KERNELS", "1")
    model, extra = _generation_model(family)
    ids = np.random.RandomState(6).randint(3, 20, (1, 5)).astype(np.int32)
    new = runtime.VECTOR_KERNEL_MIN_TOKENS
    made = []
    real = params._make_vector_kernels
    monkeypatch.setattr(params, "_make_vector_kernels",
                        lambda *a: made.append(real(*a)) or made[-1])
    first = np.asarray(generate(model, ids, max_new_tokens=new, **extra))
    np.testing.assert_array_equal(np.asarray(generate(model, ids, max_new_tokens=new, **extra)),
                                  first)
    assert len(made) == 1

    stack = model.blocks if family == "gpt" else model.decoder.layers
    for layer in stack:
        fc2 = layer.feed_forward.fc2
        assert fc2.kernel[...].shape[0] > fc2.kernel[...].shape[1]  # narrowing: it has a copy
        fc2.kernel[...] = fc2.kernel[...][::-1] * 30.0
    fc2 = stack[0].feed_forward.fc2
    changed = np.asarray(generate(model, ids, max_new_tokens=new, **extra))
    assert len(made) == 2
    (path,) = [p for p, m in made[1].items() if m.get("_vector_kernel") is not None
               and p.endswith("0/feed_forward/fc2")]
    np.testing.assert_array_equal(np.asarray(made[1][path]["_vector_kernel"]),
                                  np.asarray(fc2.kernel[...]).T)
    monkeypatch.setenv("JAXFORMER_CPU_VECTOR_KERNELS", "0")
    np.testing.assert_array_equal(np.asarray(generate(model, ids, max_new_tokens=new, **extra)),
                                  changed)
    assert not np.array_equal(changed, first)  # the new weights do change the tokens

    assert len(params._KEPT) >= 1
    kept = len(params._KEPT)
    del model, stack, layer, fc2
    gc.collect()
    assert len(params._KEPT) == kept - 1
