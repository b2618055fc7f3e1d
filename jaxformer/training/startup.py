"""What ``jaxformer train`` prints before its first update (shared glue, no twin): a status
line for each slow phase (data, tokenizer, build, compile) with its time, and one summary block
of the run (model, parameters, tokens per update, dtypes, devices and mesh, run directory,
resume point). ``--progress none`` prints none of it.

A phase line is written when the phase starts and completed with its time when it ends, so a
slow phase is never silent::

    tokenizer  wordpiece, trained on corpus.txt ... 0.8 s

and a phase may end its line with a note (the compile phase says when the compilation cache
served the train step: ``... 0.8 s: loaded from the compilation cache``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

WIDTH = 10  # the phase name's column


@dataclasses.dataclass
class Phase:
    """What a phase adds to its line when it ends (``note``, empty: nothing)."""

    note: str = ""


class Status:
    """The phase lines and the summary block on ``stream``; nothing when not ``enabled``."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True):
        self.stream = sys.stdout if stream is None else stream
        self.enabled = enabled
        self.seconds: dict[str, float] = {}  # each finished phase's time

    @contextlib.contextmanager
    def phase(self, name: str, what: str) -> Iterator[Phase]:
        """``name  what ...`` now, `` 1.2 s`` when the block ends (a line break if it raises),
        then ``: note`` if the block set the yielded :class:`Phase`'s ``note``."""
        if self.enabled:
            print(f"{name:<{WIDTH}} {what} ...", end="", file=self.stream, flush=True)
        began = time.perf_counter()
        current = Phase()
        try:
            yield current
        except BaseException:
            if self.enabled:
                print(file=self.stream, flush=True)
            raise
        self.seconds[name] = time.perf_counter() - began
        if self.enabled:
            note = f": {current.note}" if current.note else ""
            print(f" {self.seconds[name]:.1f} s{note}", file=self.stream, flush=True)

    def block(self, title: str, rows: list[tuple[str, str]]) -> None:
        if not self.enabled:
            return
        width = max(len(label) for label, _ in rows)
        lines = [title, *(f"  {label:<{width}}  {value}" for label, value in rows)]
        print("\n".join(lines), file=self.stream, flush=True)


def parameter_count(model) -> int:
    """Parameters of an NNX model (its ``nnx.Param`` leaves) or a torch module (tied ones once)."""
    from flax import nnx

    if isinstance(model, nnx.Module):
        import jax

        return sum(int(leaf.size) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return sum(p.numel() for p in model.parameters())


def devices(framework: str, trainer) -> tuple[str, str]:
    """(the devices the step runs on, its mesh) in words."""
    if framework != "jax":
        device = next(trainer.model.parameters()).device
        return f"{device} ({framework})", "none (one device)"
    import jax

    mesh = getattr(trainer, "mesh", None)
    local = jax.devices()
    kinds = sorted({d.platform if d.device_kind.lower() == d.platform else
                    f"{d.platform} ({d.device_kind})" for d in local})
    used = local[:1] if mesh is None else list(mesh.devices.flat)
    where = f"{len(used)} of {len(local)}: {', '.join(kinds)}"
    if jax.process_count() > 1:
        where += f"; process {jax.process_index()} of {jax.process_count()}"
    if mesh is None:
        return where, "none (one device)"
    return where, ", ".join(f"{axis}={size}" for axis, size in mesh.shape.items())


def summary_rows(family: str, options, model_cfg, config, trainer, train_set, eval_set,
                 run_dir: Path, start: int) -> list[tuple[str, str]]:
    from jaxformer.training import tasks

    task = tasks.get(family)
    tokens = config.batch_size * train_set.tokens_per_example
    micro = (f", {config.accumulation_steps} micro-batches of {config.micro_batch_size}"
             if config.accumulation_steps > 1 else "")
    where, mesh = devices(options.framework, trainer)
    held_out = (f", {len(eval_set):,} for evaluation" if eval_set is not None else "")
    if options.resume:
        resume = f"step {start} of {config.steps} (resumed)" if start else \
            f"step 0 of {config.steps} (resumed: no checkpoint yet)"
    else:
        resume = f"step 0 of {config.steps} (a new run)"
    return [
        ("model", f"{family}, preset {options.preset_label}: {task.model}, vocabulary "
                  f"{_vocab(model_cfg):,}"),
        ("parameters", f"{parameter_count(trainer.model):,}"),
        ("tokens/update", f"{tokens:,} ({config.batch_size} examples x "
                          f"{train_set.tokens_per_example} tokens{micro}); {config.steps:,} "
                          f"updates"),
        ("data", f"{len(train_set):,} training examples{held_out}"),
        ("dtype", f"compute {model_cfg.dtype}, parameters {model_cfg.param_dtype}"),
        ("devices", where),
        ("mesh", mesh),
        ("run directory", f"{run_dir} (config.toml, run.json, checkpoints/)"),
        ("start", resume),
    ]


def _vocab(model_cfg) -> int:
    size: int = getattr(model_cfg, "vocab_size", 0) or getattr(model_cfg, "tgt_vocab_size", 0)
    return size
