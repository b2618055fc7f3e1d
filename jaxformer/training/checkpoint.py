"""Training checkpoints with orbax: :class:`Checkpointer` saves a ``TrainStep``'s whole state with
the loop's meta and restores it, safe against a kill at any moment and across meshes. Twin:
``torch_ref/training/checkpoint.py``.
"""

from __future__ import annotations

import shutil
import zlib
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxformer.training.rundir import CheckpointDamaged

COMMIT_MARKER = "commit_success.txt"  # orbax writes it into the temporary directory, last
_TMP = ".orbax-checkpoint-tmp"
# Arrays of at most this many bytes are saved packed, one buffer per dtype (see Checkpointer)
PACK_BYTES = 1 << 20
_PACKED = "_packed"  # the packed buffers' key in the saved state


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


def _flat(nested: dict, prefix: str = "") -> dict:
    """``{"a/b": leaf}`` of a nested dictionary."""
    out = {}
    for key, value in nested.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _nested(flat: dict) -> dict:
    """The nested dictionaries of ``{"a/b": leaf}`` (the inverse of :func:`_flat`)."""
    out: dict = {}
    for name, leaf in flat.items():
        node = out
        *parents, last = name.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = leaf
    return out


def _pack(leaves: dict, names: list[str]) -> dict[str, np.ndarray]:
    """The arrays ``names`` of ``leaves`` (NumPy), flattened and joined, one buffer per dtype in
    the order of ``names``."""
    parts: dict[str, list[np.ndarray]] = {}
    for name in names:
        parts.setdefault(str(leaves[name].dtype), []).append(np.ravel(leaves[name]))
    return {dtype: np.concatenate(arrays) for dtype, arrays in parts.items()}


def _packed_sizes(names: list[str], recorded: dict) -> dict[str, int]:
    """The length of each dtype's buffer that :func:`_pack` made of the arrays ``names``."""
    sizes: dict[str, int] = {}
    for name in names:
        shape, dtype = recorded[name][0], recorded[name][1]
        sizes[dtype] = sizes.get(dtype, 0) + int(np.prod(shape, dtype=np.int64))
    return sizes


def _unpack(buffers: dict, names: list[str], recorded: dict) -> dict[str, np.ndarray]:
    """The arrays ``names`` cut out of ``buffers`` (:func:`_pack`'s) with their recorded shapes."""
    offsets = dict.fromkeys(buffers, 0)
    out = {}
    for name in names:
        shape, dtype = recorded[name][0], recorded[name][1]
        size = int(np.prod(shape, dtype=np.int64))
        start = offsets[dtype]
        out[name] = buffers[dtype][start:start + size].reshape(shape)
        offsets[dtype] = start + size
    return out


def _placed(host: dict, like: dict) -> dict:
    """The NumPy arrays of ``host`` (nested dictionaries, emptied on the way) placed where their
    counterparts in ``like`` lie, each host copy dropped once it is placed: the memory a restore
    needs beyond the live state is one array, not a second copy of the state."""
    out: dict[str, Any] = {}
    for key in list(host):
        value = host.pop(key)
        if isinstance(value, dict):
            out[key] = _placed(value, like[key])
        elif not isinstance(value, np.ndarray):  # already read in place (several processes)
            out[key] = value
        elif like[key].is_fully_addressable:
            out[key] = jax.device_put(value, like[key].sharding)
        else:  # each process places its own pieces of the whole array it holds
            out[key] = jax.make_array_from_callback(value.shape, like[key].sharding,
                                                    value.__getitem__)
    return out


def _crc(array) -> int:
    return zlib.crc32(np.ascontiguousarray(np.asarray(array)).tobytes())


def _one_line(error: Exception) -> str:
    """An orbax or TensorStore error, cut to its first line (without the TensorStore spec)."""
    text = str(error).split("See full TensorStore details")[0].strip()
    first = text.splitlines()[0].strip() if text else ""
    return f"{type(error).__name__}: {first}"[:300].rstrip(": ")


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
    another mesh, or onto one device, with the same values. A run of one process saves its arrays
    of at most ``pack_bytes`` (1 MiB) packed, one buffer per dtype, named in the meta's
    ``packed`` list: orbax spends about half a millisecond on every array it writes, and a baby
    GPT's state is 225 arrays of 43 KB on average (a save 146 -> 41 ms). Restoring cuts them
    out again; checkpoints without the list (older ones, those of several processes) restore as
    they are.

    Only directories named by a step are checkpoints: one without orbax's commit marker
    (``commit_success.txt``, written last) is incomplete and never read, and unfinished temporary
    directories are removed by the next ``Checkpointer`` on the directory and by :meth:`close`.
    Every checkpoint is validated when it is restored (the commit marker; the meta, a JSON object;
    each array's shape, dtype and CRC-32, which :meth:`save` records in the meta), and anything
    wrong is a :class:`~jaxformer.training.rundir.CheckpointDamaged` naming the file and the
    problem; ``set_aside(step)`` moves such a checkpoint into ``DIR-damaged/``.
    """

    def __init__(self, directory, keep: int = 3, read_only: bool = False,
                 pack_bytes: int = PACK_BYTES):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.pack_bytes = pack_bytes  # 0: every array saved on its own
        self.directory = Path(directory).absolute()
        self.read_only = read_only  # loading (jaxformer.loading): nothing created or removed
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                               enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self.remove_unfinished()

    def remove_unfinished(self) -> None:
        """Delete the temporary directories of saves that never completed (a kill, an abort);
        never with ``read_only`` (the run may be saving one right now)."""
        if jax.process_index() == 0 and self.directory.is_dir() and not self.read_only:
            for stale in self.directory.glob(f"*{_TMP}*"):
                shutil.rmtree(stale, ignore_errors=True)

    def path(self, step: int) -> Path:
        return self.directory / str(step)

    def meta_path(self, step: int) -> Path:
        return self.path(step) / "meta" / "metadata"

    def steps(self) -> list[int]:
        """Every step directory (complete or not: :meth:`restore` tells), temporary ones never."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir()
                      if p.is_dir() and p.name.isdigit())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, trainer, meta: dict) -> None:
        state = _to_nested(trainer.state_dict())
        if jax.process_count() == 1:  # every array is whole in this process: saved from host
            # memory. For a jax.Array orbax works out, array by array in Python, which device
            # holds which replica and copies it over (~1.5 ms an array: half of a baby GPT's
            # save); a NumPy array goes straight to TensorStore. The files are the same arrays,
            # and restore reads them into the live trainer's layout either way. (device_get
            # starts every device-to-host copy before waiting for any.)
            state = jax.device_get(state)
        meta = dict(meta)
        leaves = _flat(state)
        if all(getattr(x, "is_fully_addressable", True) for x in leaves.values()):
            meta["arrays"] = {name: [list(x.shape), str(x.dtype), _crc(x)]
                              for name, x in leaves.items()}
        if jax.process_count() == 1 and self.pack_bytes:  # host arrays, all of them
            packed = [name for name, x in leaves.items() if x.nbytes <= self.pack_bytes]
            if packed:
                meta["packed"] = packed
                state = _nested({k: v for k, v in leaves.items() if v.nbytes > self.pack_bytes})
                state[_PACKED] = _pack(leaves, packed)
        self._manager.save(trainer.step, force=True, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
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

    def _raw_meta(self, step: int) -> dict:
        path = self.path(step)
        for marker in (path / COMMIT_MARKER, path / "meta" / COMMIT_MARKER):
            if not marker.is_file():
                raise CheckpointDamaged(step, marker, "missing: the checkpoint is incomplete "
                                                      "(orbax writes this commit marker last)")
        meta_path = self.meta_path(step)
        if not meta_path.is_file():
            raise CheckpointDamaged(step, meta_path, "missing")
        self._manager.reload()
        try:
            meta = self._manager.restore(step, args=ocp.args.Composite(
                meta=ocp.args.JsonRestore()))["meta"]
        except Exception as error:  # orbax raises whatever its JSON reader raised
            raise CheckpointDamaged(step, meta_path, f"cannot be read ({_one_line(error)})"
                                    ) from None
        if not isinstance(meta, dict):
            raise CheckpointDamaged(step, meta_path, "is not a JSON object")
        return dict(meta)

    def read_meta(self, step: int | None = None) -> dict:
        meta = self._raw_meta(self._step(step))
        meta.pop("arrays", None)  # the checkpoint's own records, not the loop's meta
        meta.pop("packed", None)
        return meta

    def restore(self, trainer, step: int | None = None) -> dict:
        step = self._step(step)
        meta = self._raw_meta(step)
        recorded = meta.pop("arrays", None)
        packed = meta.pop("packed", None)
        state_dir = self.path(step) / "state"
        if not (state_dir / COMMIT_MARKER).is_file():
            raise CheckpointDamaged(step, state_dir / COMMIT_MARKER,
                                    "missing: the checkpoint is incomplete")
        template = trainer.state_dict()
        nested = _to_nested(template)
        if recorded is not None:
            self._check_layout(step, state_dir, recorded, _flat(nested))
        if packed is not None:
            self._check_packed(step, packed, recorded)
        whole = jax.process_count() == 1  # every array in this process
        if whole:  # read into host memory (as :meth:`save` writes), then placed in the
            # trainer's layout (_placed)
            target = jax.tree.map(lambda x: np.empty(x.shape, x.dtype), nested)
        else:  # each process reads its pieces, in the trainer's layout whatever the saved one
            target = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), nested)
        if packed is not None:  # the packed arrays are read whole, as their buffers
            listed, sizes = set(packed), _packed_sizes(packed, recorded)
            target = _nested({k: v for k, v in _flat(target).items() if k not in listed})
            target[_PACKED] = {dtype: np.empty(size, dtype) for dtype, size in sizes.items()}
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target)))["state"]
        except Exception as error:  # orbax and TensorStore raise many kinds
            raise CheckpointDamaged(step, state_dir, f"cannot be read ({_one_line(error)})"
                                    ) from None
        if packed is not None:
            buffers = restored.pop(_PACKED)  # as stored, whatever the target's length
            if any(buffers[dtype].size != size for dtype, size in sizes.items()):
                raise CheckpointDamaged(step, state_dir, "its packed arrays do not add up to the "
                                        "arrays its meta lists")
            restored = _nested({**_flat(restored), **_unpack(buffers, packed, recorded)})
        if recorded is not None:
            for name, value in _flat(restored).items():
                addressable = getattr(value, "is_fully_addressable", True)
                if addressable and _crc(value) != recorded[name][2]:
                    raise CheckpointDamaged(step, state_dir, f"array {name} does not match the "
                                            f"CRC-32 recorded when it was saved (a corrupt file)")
        if whole or packed is not None:
            restored = _placed(restored, nested)
        trainer.load_state_dict(_from_nested(restored, template))
        return meta

    def _check_packed(self, step: int, packed, recorded) -> None:
        """The meta's ``packed`` list names recorded arrays, each once."""
        if recorded is None or not isinstance(packed, list) or not all(
                isinstance(name, str) and name in recorded for name in packed) or len(
                set(packed)) != len(packed):
            raise CheckpointDamaged(step, self.meta_path(step), "its 'packed' entry is not a list "
                                    "of the arrays it records, each once")

    @staticmethod
    def _check_layout(step: int, state_dir: Path, recorded, live: dict) -> None:
        if not isinstance(recorded, dict):
            raise CheckpointDamaged(step, state_dir.parent / "meta" / "metadata",
                                    "its 'arrays' entry is not a JSON object")
        if not all(isinstance(v, list) and len(v) == 3 for v in recorded.values()):
            raise CheckpointDamaged(step, state_dir.parent / "meta" / "metadata",
                                    "its 'arrays' entries are not [shape, dtype, crc32]")
        missing, extra = sorted(set(live) - set(recorded)), sorted(set(recorded) - set(live))
        if missing or extra:
            raise CheckpointDamaged(step, state_dir, f"holds other arrays than the model "
                                    f"(missing {missing[:3]}, unexpected {extra[:3]})")
        for name, x in live.items():
            shape, dtype = recorded[name][0], recorded[name][1]
            if list(x.shape) != list(shape) or str(x.dtype) != dtype:
                raise CheckpointDamaged(step, state_dir, f"array {name} is {dtype}{list(shape)} "
                                        f"in the checkpoint, the model needs "
                                        f"{x.dtype}{list(x.shape)} (a checkpoint of another "
                                        f"model?)")

    def set_aside(self, step: int) -> Path:
        """Move a damaged checkpoint to ``DIR-damaged/<step>`` (kept for inspection) and return
        where it went."""
        moved = _set_aside(self.path(step), self.directory, move=jax.process_index() == 0)
        _barrier(f"jaxformer-set-aside-{step}")  # moved (by process 0) before anyone goes on
        self._manager.reload()  # orbax forgets the step, so that it can be saved anew
        return moved

    def close(self) -> None:
        self._manager.close()
        self.remove_unfinished()


def _set_aside(path: Path, directory: Path, move: bool = True) -> Path:
    """Where ``path`` goes in ``DIR-damaged/``; moved there when ``move`` (process 0 moves, the
    others of a run over several processes only learn the name)."""
    target_dir = directory.with_name(f"{directory.name}-damaged")
    target, n = target_dir / path.name, 1
    while target.exists():
        target, n = target_dir / f"{path.name}.{n}", n + 1
    if move:
        target_dir.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
    return target


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
