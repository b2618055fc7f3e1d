"""Training checkpoints with orbax: :class:`Checkpointer` saves a ``TrainStep``'s whole state with
the loop's meta and restores it, safe against a kill at any moment and across meshes. Twin:
``torch_ref/training/checkpoint.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _path_name(entry) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    raise TypeError(f"unexpected tree path entry {entry!r}")


# The state is stored as nested dictionaries named by the tree paths (typed PRNG keys as their raw
# ``uint32`` data) and restored into the structure of a live ``TrainStep``, so the file layout does
# not depend on how optax or flax represent their trees.
def _to_nested(tree) -> dict:
    """``{"a": {"b": array}}`` named by the tree paths; PRNG keys as their raw data."""
    out: dict = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        node = out
        names = [_path_name(entry) for entry in path]
        for name in names[:-1]:
            node = node.setdefault(name, {})
        node[names[-1]] = jax.random.key_data(leaf) if _is_key(leaf) else leaf
    return out


def _from_nested(nested: dict, template):
    """Values of ``nested`` in the tree structure of ``template``."""
    leaves = []
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    for path, like in paths:
        value: Any = nested
        for entry in path:
            value = value[_path_name(entry)]
        if _is_key(like):
            value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(like))
        leaves.append(value)
    return jax.tree_util.tree_unflatten(treedef, leaves)


class Checkpointer:
    """``save(trainer, meta)`` at ``trainer.step``; ``restore(trainer)`` loads the latest (or
    ``step``) into the trainer and returns its meta; ``read_meta`` needs no trainer.

    A checkpoint is ``DIR/<step>/`` holding ``state`` (the parameters, the optimizer state, the RNG
    state of the model's ``nnx.Rngs`` and the step: everything
    :meth:`jaxformer.training.step.TrainStep.state_dict` returns) and ``meta`` (JSON: the data
    position, the run identity ``--resume`` checks, what the loop needs). orbax writes each
    checkpoint into a temporary directory and renames it when complete, so a kill at any moment,
    during a save included, leaves the previous checkpoints intact and the half-written one
    invisible; it keeps the last ``keep`` checkpoints.

    Arrays are saved sharded, as they lie (each process writes its own pieces), and restored with
    the shardings of the live trainer's state: a checkpoint saved under one mesh restores under
    another mesh, or onto one device, with the same values.
    """

    def __init__(self, directory, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, trainer, meta: dict) -> None:
        state = _to_nested(trainer.state_dict())
        self._manager.save(trainer.step, force=True, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta))))
        self._manager.wait_until_finished()

    def _step(self, step: int | None) -> int:
        steps = self.steps()
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if step is None:
            return steps[-1]
        if step not in steps:
            raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory} "
                                    f"(it holds {steps})")
        return step

    def read_meta(self, step: int | None = None) -> dict:
        step = self._step(step)
        return dict(self._manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"])

    def restore(self, trainer, step: int | None = None) -> dict:
        step = self._step(step)
        template = trainer.state_dict()
        abstract = jax.tree.map(  # the target layout: the trainer's, whatever the saved one
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
            _to_nested(template))
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        trainer.load_state_dict(_from_nested(restored["state"], template))
        return dict(restored["meta"])

    def close(self) -> None:
        self._manager.close()
