"""Checkpoints of the train step, both frameworks: everything comes back bit for bit (weights,
optimizer moments, RNG state, step), a restored torch step continues exactly, only the last
``keep`` checkpoints stay, and an unfinished save is never read.

That a restored JAX step continues exactly is shown by the kill-and-resume test of the whole
command (``test_kill_resume.py``, dropout on), which would otherwise repeat its compilation here.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxformer.training import tasks, vocab
from jaxformer.training.checkpoint import PACK_BYTES, Checkpointer
from jaxformer.training.config import TrainConfig
from jaxformer.training.rundir import CheckpointDamaged
from jaxformer.training.step import TrainStep, build_model
from jaxformer.training.tasks import model_config
from parity_tests.support.jaxprs import raw_leaves
from torch_ref.training.checkpoint import Checkpointer as TorchCheckpointer
from torch_ref.training.step import TrainStep as TorchTrainStep
from torch_ref.training.step import build_model as torch_build_model

CONFIG = TrainConfig(steps=8, batch_size=4, seq_len=16, warmup_steps=2, learning_rate=3e-3)
LINES = [f"the {w} sat on the mat near tree {i % 5}" for i, w in
         enumerate(["cat", "dog", "bird", "fox"] * 10)]


@pytest.fixture(scope="module")
def setup():
    tokenizer = vocab.wordpiece_tokenizer(LINES, 60)
    dataset, _ = tasks.build_datasets("gpt", "\n".join(LINES), tokenizer, CONFIG)
    model_cfg = model_config("gpt", "tiny", vocab_size=tokenizer.get_vocab_size(), dropout=0.2)
    return dataset, model_cfg


def _trainer(framework, model_cfg, seed):
    if framework == "jax":
        return TrainStep("gpt", build_model("gpt", model_cfg, seed), CONFIG), Checkpointer
    return (TorchTrainStep("gpt", torch_build_model("gpt", model_cfg, seed), CONFIG),
            TorchCheckpointer)


def _leaves(trainer) -> list[np.ndarray]:
    """Every array of a JAX step's state, PRNG keys as their raw data."""
    return raw_leaves(trainer.state_dict())


@pytest.mark.parametrize("saved_packing", [PACK_BYTES, 1024, 0])
def test_jax_round_trip_is_bit_identical(setup, tmp_path, saved_packing):
    """Every array back, bit for bit, whichever arrays were saved packed: all (the default: the
    tiny model's are all small), those of at most 1 KB, none (the layout before packing, which
    a checkpointer that packs restores as it is)."""
    _, model_cfg = setup
    source, _ = _trainer("jax", model_cfg, 0)
    # Moments and counts that are not their initial zeros, and advanced RNG counters.
    rng = np.random.RandomState(0)
    state = source.state_dict()
    state["opt_state"] = jax.tree.map(lambda x: x + rng.rand(*x.shape).astype(x.dtype) * 3
                                      if x.dtype == np.float32 else x + 7, state["opt_state"])
    state["rest"] = jax.tree.map(lambda x: x if jax.dtypes.issubdtype(
        x.dtype, jax.dtypes.prng_key) else x + 5, state["rest"])
    state["step"] = state["step"] + 7
    source.load_state_dict(state)
    Checkpointer(tmp_path, pack_bytes=saved_packing).save(source, {"data_position": 7})
    meta = json.loads(Checkpointer(tmp_path).meta_path(7).read_text())
    sizes = {name: int(np.prod(shape)) * np.dtype(dtype).itemsize
             for name, (shape, dtype, _) in meta["arrays"].items()}
    small = [name for name, size in sizes.items() if size <= saved_packing]
    assert meta.get("packed", []) == small  # in the recorded order
    if saved_packing == 1024:  # packed and unpacked arrays in one checkpoint
        assert 0 < len(small) < len(sizes)
    target, _ = _trainer("jax", model_cfg, 1)  # other weights and keys
    assert Checkpointer(tmp_path).restore(target) == {"data_position": 7}
    assert target.step == 7
    a, b = _leaves(source), _leaves(target)
    assert len(a) == len(b)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # ...and the structure is the live one (optax states, nnx.State), not nested dicts.
    assert (jax.tree.structure(target.state_dict()["opt_state"])
            == jax.tree.structure(source.state_dict()["opt_state"]))


@pytest.mark.parametrize("packed", [["nowhere"], "params", "twice"])
def test_a_damaged_packed_list_is_named(setup, tmp_path, packed):
    """The meta's list of packed arrays decides where every array is cut from: one that names an
    array the checkpoint does not record, is not a list, or names an array twice is refused."""
    _, model_cfg = setup
    source, _ = _trainer("jax", model_cfg, 0)
    source.step = 3
    Checkpointer(tmp_path).save(source, {"data_position": 3})
    path = Checkpointer(tmp_path).meta_path(3)
    meta = json.loads(path.read_text())
    meta["packed"] = meta["packed"] + meta["packed"][:1] if packed == "twice" else packed
    path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointDamaged, match=r"metadata: its 'packed' entry is not a list"):
        Checkpointer(tmp_path).restore(_trainer("jax", model_cfg, 1)[0])


def test_packed_buffers_of_another_checkpoint_are_named(setup, tmp_path):
    """A checkpoint whose state directory is another one's (a model with a smaller vocabulary):
    its meta fits the model and orbax reads the buffers as stored, shorter than the meta's list
    adds up to; refused, instead of cutting arrays past the buffers' end (a reshape error)."""
    import dataclasses
    import shutil

    _, model_cfg = setup
    ours, _ = _trainer("jax", model_cfg, 0)
    wider, _ = _trainer("jax", dataclasses.replace(model_cfg,
                                                   vocab_size=model_cfg.vocab_size + 3), 0)
    for trainer, directory in ((ours, tmp_path / "ours"), (wider, tmp_path / "wider")):
        trainer.step = 3
        Checkpointer(directory).save(trainer, {"data_position": 3})
    shutil.rmtree(tmp_path / "wider" / "3" / "state")
    shutil.copytree(tmp_path / "ours" / "3" / "state", tmp_path / "wider" / "3" / "state")
    with pytest.raises(CheckpointDamaged, match="its packed arrays do not add up"):
        Checkpointer(tmp_path / "wider").restore(wider)


def test_torch_restored_step_continues_exactly(setup, tmp_path):
    dataset, model_cfg = setup
    trainer, checkpointer_cls = _trainer("torch", model_cfg, 0)
    checkpointer = checkpointer_cls(tmp_path / "ckpt", keep=2)
    for step in range(3):
        trainer(dataset.update_batch(step))
    checkpointer.save(trainer, {"data_position": 3})
    first = [trainer(dataset.update_batch(step))["loss"] for step in range(3, 7)]
    # Dropout is on: without the RNG state the next losses would differ.
    other, _ = _trainer("torch", model_cfg, 5)
    assert checkpointer.restore(other) == {"data_position": 3}
    assert other.step == 3
    again = [other(dataset.update_batch(step))["loss"] for step in range(3, 7)]
    assert again == first  # bit-identical


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_keep_last_n_and_unfinished_saves(setup, tmp_path, framework):
    _, model_cfg = setup
    trainer, checkpointer_cls = _trainer(framework, model_cfg, 0)
    directory = tmp_path / "ckpt"
    checkpointer = checkpointer_cls(directory, keep=2)
    for step in range(1, 5):
        trainer.step = step
        checkpointer.save(trainer, {"data_position": step})
    assert checkpointer.steps() == [3, 4]
    # What a kill in the middle of a save leaves: a temporary directory, never a checkpoint.
    name = "5.orbax-checkpoint-tmp-1" if framework == "jax" else ".tmp-step_5-1"
    (directory / name / "state").mkdir(parents=True)
    (directory / name / "state" / "partial").write_bytes(b"\0" * 10)
    again = checkpointer_cls(directory, keep=2)
    assert again.latest_step() == 4
    assert again.read_meta() == {"data_position": 4}
    trainer.step = 0
    assert again.restore(trainer) == {"data_position": 4}
    assert trainer.step == 4
    with pytest.raises(FileNotFoundError, match=r"no checkpoint of step 1 .*holds \[3, 4\]"):
        again.restore(trainer, step=1)
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        checkpointer_cls(tmp_path / "empty").read_meta()
    checkpointer.close()
    again.close()
