"""Compile the train step in a helper process, then load it (CPU backend; no twin: torch_ref's
step is eager, there is nothing to compile).

On the CPU backend, under the allocator settings (``jaxformer.runtime.tune_allocator``: one
malloc arena), a process that compiled its train step runs it slower than one that loaded the
same program from the persistent compilation cache: the compiler leaves the one arena's heap in
pieces (a baby GPT's: some 15,000 free chunks against 900 after loading), so the step's own
``malloc`` calls search longer and wait on the arena's lock several times as often (its update
1.1-1.35x slower; nothing done to the heap after compiling cured it: docs/performance.md, "What
the compiler leaves behind"), and the one arena slows the compiler itself about 1.2x. So
``jaxformer train``, when its compilation cache does not hold the step yet, starts ``python -m
jaxformer.training.precompile`` beside its own start-up: a child without the allocator
settings that builds the same step (on the model with zeros for weights: it compiles, it never
runs), compiles the update and the evaluations for the run's first batch and evaluation batches
into the cache, and exits. Meanwhile the run builds its model and step and traces its update;
it then loads those programs instead of compiling them: the same programs (the cache key is a
hash of the program and its compile options), the same losses bit for bit.

When: the CPU backend, one process, no device mesh, the persistent cache on
(``jaxformer.runtime.enable_compilation_cache``) and the allocator settings applied.
``JAXFORMER_COMPILE_HELPER=0`` never starts the helper, ``=1`` starts it whenever there is a
cache (without the allocator settings too). A run whose step a helper already compiled into the
cache starts none: a marker in ``<cache>/jaxformer-precompiled/`` names the run's model, step,
batch shapes, JAX, XLA flags and jaxformer's sources, and the cache entries the helper wrote; it
counts only while those entries are there. A helper that fails costs nothing but its time: the
run says so and compiles in its own process, as without one.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import jax

import jaxformer
from jaxformer import runtime

MARKERS = "jaxformer-precompiled"
_CACHE_SUFFIX = "-cache"  # the name JAX's file cache gives its entries: <key>-cache
# The allocator settings and the cache's place are the process's, not the program's.
_PROCESS_VARIABLES = ("JAXFORMER_TUNE_MALLOC", "JAXFORMER_COMPILATION_CACHE",
                      "JAXFORMER_COMPILE_HELPER")
# Fields of the TrainConfig that are arguments of the compiled update or of the initialiser, not
# part of either program (docs/training.md, "Schedule"): a run that changes only these loads the
# programs an earlier run's helper compiled.
_ARGUMENT_FIELDS = ("steps", "learning_rate", "min_learning_rate", "warmup_steps", "schedule",
                    "seed")
# JAX options the helper does not take from the run: it runs on the CPU whatever was asked.
_PLATFORM_OPTIONS = ("jax_platforms", "jax_platform_name")


def wanted(mesh=None) -> bool:
    """Whether a run on this process's backend would compile its step in a helper (see the
    module docstring; the marker is checked by :func:`start`)."""
    switch = runtime.env_switch("JAXFORMER_COMPILE_HELPER")
    if switch is False or mesh is not None or _cache_dir() is None:
        return False
    if jax.default_backend() != "cpu" or jax.process_count() > 1:
        return False
    return switch is True or runtime.tune_allocator()


def _cache_dir() -> Path | None:
    """The persistent compilation cache's directory, None when there is none in use."""
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    enabled = jax.config.jax_enable_compilation_cache  # type: ignore[attr-defined]
    return Path(current) if current and enabled else None


def _batch_shapes(batch: dict) -> dict:
    return {key: (tuple(value.shape), str(value.dtype)) for key, value in sorted(batch.items())}


def _sources_digest() -> str:
    """jaxformer's ``.py`` files by path, size and modification time: a changed library may
    trace to another program."""
    root = Path(jaxformer.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _marker_key(spec: dict) -> str:
    """What the helper's programs depend on, hashed: the run's model, step (not its schedule)
    and batch shapes, JAX and the device, XLA's flags, jaxformer's switches and sources."""
    import jaxlib

    device = jax.devices()[0]
    described = {
        "family": spec["family"], "model_config": repr(spec["model_config"]),
        "train_config": {k: v for k, v in spec["config"].to_dict().items()
                         if k not in _ARGUMENT_FIELDS},
        "batch": _batch_shapes(spec["batch"]),
        "eval_batches": [_batch_shapes(b) for b in spec["eval_batches"]],
        "jax_config": repr(sorted(spec["jax_config"].items())),
        "jax": jax.__version__, "jaxlib": jaxlib.__version__,
        "platform": f"{device.platform} {device.device_kind} {device.client.platform_version}",
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "switches": sorted((k, v) for k, v in os.environ.items()
                           if k.startswith("JAXFORMER_") and k not in _PROCESS_VARIABLES),
        "sources": _sources_digest()}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def _compiled_before(cache: Path, key: str) -> bool:
    """Whether a helper compiled these programs into ``cache`` and its entries are still there."""
    marker = cache / MARKERS / f"{key}.json"
    try:
        entries = json.loads(marker.read_text())["entries"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return all((cache / name).is_file() for name in entries)


class Helper:
    """A running helper process; :meth:`wait` for it before the step's first call."""

    def __init__(self, spec: dict, cache: Path, key: str, stream):
        self.cache, self.key, self.stream = cache, key, stream
        self.batch = spec["batch"]
        self._dir = tempfile.TemporaryDirectory(prefix="jaxformer-precompile-")
        work = Path(self._dir.name)
        spec_path, self._log_path = work / "spec.pkl", work / "helper.log"
        self._result_path = work / "entries.json"
        spec_path.write_bytes(pickle.dumps(spec))
        env = {**os.environ, "JAXFORMER_TUNE_MALLOC": "0", "JAX_PLATFORMS": "cpu",
               "JAXFORMER_COMPILATION_CACHE": str(cache)}
        with open(self._log_path, "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "jaxformer.training.precompile", str(spec_path),
                 str(self._result_path)],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait(self, trainer=None) -> bool:
        """Waits for the helper; True when it compiled the programs into the cache. A helper
        that failed is reported on the stream (the run then compiles in its own process).
        ``trainer``: the run's step, traced for the helper's batch meanwhile (its first update
        then takes that trace, 0.4-0.6 s of a baby GPT's start-up, and loads the program)."""
        try:
            if trainer is not None:
                trainer._lower(self.batch)
            code = self._process.wait()
            if code != 0:
                tail = self._log_path.read_text(errors="replace").strip().splitlines()[-3:]
                print(f"\nthe helper process compiling the train step failed (exit {code}): "
                      f"{' | '.join(tail) or 'no output'}; compiling it in this process",
                      file=self.stream, flush=True)
                return False
            self._write_marker()
            return True
        finally:
            self.stop()

    def _write_marker(self) -> None:
        """Records the helper's work (the entries it wrote) for the next run, which then starts
        none; a cache it cannot write to only means the next run starts a helper again."""
        marker = self.cache / MARKERS / f"{self.key}.json"
        tmp = marker.with_name(f".{marker.name}.{os.getpid()}")
        try:
            entries = self._result_path.read_text()
            marker.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(entries)
            os.replace(tmp, marker)
        except OSError:
            tmp.unlink(missing_ok=True)

    def stop(self) -> None:
        """Ends the helper if it still runs (an interrupted or failed start-up), and removes
        its files."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._dir.cleanup()


def start(family: str, model_config, config, batch: dict, eval_batches: list[dict],
          stream=None, mesh=None) -> Helper | None:
    """Starts the helper that compiles the step of ``family``'s model for ``batch`` (an update
    batch) and the evaluations for ``eval_batches`` (one per shape is enough), or returns None
    when the run should compile in its own process (see the module docstring)."""
    if not wanted(mesh):
        return None
    cache = _cache_dir()
    assert cache is not None  # wanted() checked it
    distinct: dict[str, dict] = {}
    for b in eval_batches:
        distinct.setdefault(json.dumps(_batch_shapes(b)), b)
    # JAX's options as this process has them (the default matmul precision, say, is in the
    # traced program; the cache directory and its thresholds decide what is written)
    options = {name: value for name, value in jax.config.values.items()
               if name not in _PLATFORM_OPTIONS
               and isinstance(value, str | int | float | bool | type(None))}  # not a device
    spec = {"family": family, "model_config": model_config, "config": config, "batch": batch,
            "eval_batches": list(distinct.values()), "jax_config": options}
    key = _marker_key(spec)
    if _compiled_before(cache, key):
        return None
    stream = stream or sys.stderr
    try:
        return Helper(spec, cache, key, stream)
    except OSError as error:  # no interpreter to start, no room for the spec
        print(f"could not start the helper process that compiles the train step ({error}); "
              f"compiling it in this process", file=stream, flush=True)
        return None


def compile_step(trainer, batch: dict, eval_batches: list[dict]) -> None:
    """Compiles ``trainer``'s update for ``batch`` and its evaluations (the loss, and the
    accuracy when the task has one) for each of ``eval_batches``, without running them: into
    the persistent compilation cache when it is on."""
    trainer._run(lambda: trainer._lower(batch).compile())
    params, rest = trainer._leaves[0], trainer._leaves[2]
    for eval_batch in eval_batches:
        placed = trainer._batch(eval_batch, 0)
        for fn in (trainer._eval, trainer._accuracy):
            if fn is not None:
                trainer._run(lambda f, b: f.lower(params, rest, b).compile(), fn, placed)


def _stand_in(family: str, model_config):
    """The model with zeros for parameters: the helper compiles the step, it never runs it, so
    the initialiser's own compilation (the run does that one) is not needed here."""
    import numpy as np
    from flax import nnx

    from jaxformer.checkpoints import convert
    from jaxformer.training import step

    model = convert.abstract_model(lambda: step.MODELS[family](model_config, rngs=nnx.Rngs(0)))
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), params))
    return model


def main(argv: list[str] | None = None) -> int:
    """The helper: builds the step the spec describes and compiles its programs into the
    cache; writes the cache entries it added to the result file (JSON)."""
    argv = sys.argv[1:] if argv is None else argv
    spec = pickle.loads(Path(argv[0]).read_bytes())
    from jaxformer.training import step, tasks

    tasks.get(spec["family"])  # a clear error for an unknown family

    for name, value in spec["jax_config"].items():  # the run's options, before anything runs
        if jax.config.values.get(name) != value:
            jax.config.update(name, value)
    cache = _cache_dir()
    if cache is None:
        raise SystemExit("the helper has no compilation cache to compile into")
    before = set(cache.glob(f"*{_CACHE_SUFFIX}")) if cache.is_dir() else set()
    trainer = step.TrainStep(spec["family"], _stand_in(spec["family"], spec["model_config"]),
                             spec["config"])
    compile_step(trainer, spec["batch"], spec["eval_batches"])
    added = sorted(p.name for p in set(cache.glob(f"*{_CACHE_SUFFIX}")) - before)
    Path(argv[1]).write_text(json.dumps({"entries": added}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
