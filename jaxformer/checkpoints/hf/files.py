"""The files of a Hugging Face model directory: reading weights and ``config.json``, writing a
directory atomically. Weights come from ``model.safetensors``, a sharded
``model.safetensors.index.json`` or ``pytorch_model.bin`` (``torch.load(weights_only=True)``),
always as numpy; the engine refuses what is not a weight.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxformer.checkpoints.checks import is_floating
from jaxformer.checkpoints.hf.engine import CheckpointError

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
CONFIG = "config.json"


def float_numpy(value) -> np.ndarray:
    """A tensor or array as numpy, floats as float32 (bfloat16 and float16 upcast exactly);
    other dtypes are kept, for :func:`~jaxformer.checkpoints.hf.engine.map_checkpoint` to refuse
    where they meet a weight."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch
        value = value.detach().cpu()
        if value.is_floating_point():
            value = value.float()
        value = value.numpy()
    value = np.asarray(value)
    return value.astype(np.float32) if is_floating(value.dtype) else value


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError

    try:
        tensors: Mapping[str, Any]
        try:
            from safetensors.numpy import load_file as load_numpy
            tensors = load_numpy(path)
        except TypeError:  # bfloat16, which numpy lacks: read through torch
            from safetensors.torch import load_file as load_torch
            tensors = load_torch(path)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"cannot read {path}: {e} (is the file truncated or "
                              f"corrupted?)") from e
    return {k: float_numpy(v) for k, v in tensors.items()}


def _read_pytorch_bin(path: Path) -> dict[str, np.ndarray]:
    import pickle
    import zipfile

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"cannot read {path}: {e} (is the file truncated or corrupted? "
                              f"only plain tensors are accepted: weights_only=True)") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state_dict")
    return {k: float_numpy(v) for k, v in state.items()}


def read_checkpoint(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint in ``directory`` as numpy (floats as float32).

    Looks for ``model.safetensors``, then ``model.safetensors.index.json`` (shards), then
    ``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``).
    """
    directory = Path(directory)
    if (directory / SAFETENSORS).is_file():
        return _read_safetensors(directory / SAFETENSORS)
    if (directory / SAFETENSORS_INDEX).is_file():
        try:
            weight_map = json.loads((directory / SAFETENSORS_INDEX).read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{directory / SAFETENSORS_INDEX} is not a valid shard index: "
                                  f"{e}") from e
        state = {}
        for shard in sorted(set(weight_map.values())):
            if not (directory / shard).is_file():
                raise CheckpointError(f"shard {shard} listed in {SAFETENSORS_INDEX} is missing")
            state.update(_read_safetensors(directory / shard))
        if set(state) != set(weight_map):
            raise CheckpointError(f"the shards in {directory} do not hold exactly the keys "
                                  f"their index lists")
        return state
    if (directory / PYTORCH_BIN).is_file():
        return _read_pytorch_bin(directory / PYTORCH_BIN)
    raise FileNotFoundError(f"no weights in {directory}: expected {SAFETENSORS}, "
                            f"{SAFETENSORS_INDEX} or {PYTORCH_BIN}")


def read_config(directory: Path) -> dict:
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory")
    path = directory / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG} in {directory}: not a Hugging Face model "
                                f"directory")
    try:
        hf = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(hf, dict):
        raise CheckpointError(f"{path} holds a JSON {type(hf).__name__}, not an object")
    return hf


def write_directory(target: Path, write: Callable[[Path], None], *, overwrite: bool) -> Path:
    """Make ``target`` a directory holding exactly what ``write(directory)`` writes, atomically.

    ``write`` fills a temporary directory beside ``target``, which is then renamed into place: an
    error at any point leaves ``target`` as it was (absent, empty, or its old content). A
    non-empty ``target`` is refused unless ``overwrite``; an existing one (empty or replaced)
    keeps its permission bits. Errors name ``target``, not the temporary directory.
    """
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty; pass overwrite=True to "
                              f"replace it")
    mode = stat.S_IMODE(target.stat().st_mode) if target.is_dir() else None
    target.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:12]
    tmp = target.parent / f".{target.name}.tmp-{tag}"  # mkdir, not mkdtemp: keep the umask
    old = target.parent / f".{target.name}.old-{tag}"
    try:
        tmp.mkdir()
    except OSError as e:  # typically a read-only parent: say what could not be written
        raise type(e)(e.errno, f"cannot write {target}: {e.strerror} (the directory "
                               f"{target.parent} must be writable)", str(target)) from e
    moved = False
    try:
        write(tmp)
        if mode is not None:
            os.chmod(tmp, mode)  # after writing: the mode may well forbid writing
        if target.exists():
            os.replace(target, old)
            moved = True
        os.replace(tmp, target)
    except BaseException:
        if moved and not target.exists():
            os.replace(old, target)  # put the previous directory back
        if tmp.exists():
            os.chmod(tmp, stat.S_IRWXU)
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if moved:
        shutil.rmtree(old, ignore_errors=True)
    return target
