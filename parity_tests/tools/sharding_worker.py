"""The 8-device half of ``test_sharding.py``, run in a subprocess with 8 CPU devices (the test
process has already started JAX with one). One process runs every case, so the import and the
compilations of the single-device reference are paid once; it prints one JSON line: the losses,
the placements (partition specs) and the checkpoint and ``generate`` comparisons, which the test
asserts.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ["JAX_NUM_CPU_DEVICES"] = "8"

import jax
import numpy as np
from flax import nnx

from jaxformer import sharding
from jaxformer.generation import generate
from jaxformer.training.checkpoint import Checkpointer

STEPS = 20
MESHES = ("data=8", "fsdp=8", "data=2,tensor=4", "data=2,fsdp=2,tensor=2")


def demo_config():
    """GPT tiny with one block, 128 tokens and 128 intermediate units: every size divides 8, so
    each weight is split on every mesh of 8 devices (4 heads: ``tensor`` up to 4)."""
    import dataclasses

    from jaxformer.config import GPTConfig

    return dataclasses.replace(GPTConfig.tiny(), num_layers=1, vocab_size=128,
                               intermediate_size=128)


def demo_trainer(mesh_spec: str, steps: int, seed: int = 0, batch_size: int = 8,
                 seq_len: int = 16):
    """``(trainer, dataset)``: the :func:`demo_config` GPT on ``mesh_spec`` (``"none"``: one
    device) and random windows of a random phrase of 64 tokens repeated: learnable, so the losses
    fall and the runs compared really move their weights."""
    from jaxformer.training import data, step
    from jaxformer.training.config import TrainConfig

    model_config = demo_config()
    config = TrainConfig(steps=steps, batch_size=batch_size, seq_len=seq_len, warmup_steps=2,
                         seed=seed, learning_rate=3e-3)
    phrase = np.random.default_rng(seed).integers(0, model_config.vocab_size, 64)
    tokens = np.tile(phrase, 64)
    mesh = None if mesh_spec == "none" else sharding.make_mesh(mesh_spec)
    trainer = step.TrainStep("gpt", step.build_model("gpt", model_config, seed), config,
                             mesh=mesh)
    return trainer, data.RandomWindows(tokens, config)


def spec(x) -> list:
    """A placed array's partition spec as JSON (None, an axis, or a list of axes per dim)."""
    if not hasattr(x.sharding, "spec"):
        return None  # on one device
    return [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec] + [None] * (
        x.ndim - len(x.sharding.spec))


def placements(trainer) -> dict:
    params = trainer._params
    block = params["blocks"]
    block = block[0] if 0 in block else block  # noqa: SIM401 (a State of blocks or one stack)
    mu = trainer._opt_state
    mu_params = next(s.mu for s in jax.tree.leaves(mu, is_leaf=lambda s: hasattr(s, "mu"))
                     if hasattr(s, "mu"))
    mu_block = mu_params["blocks"][0] if 0 in mu_params["blocks"] else mu_params["blocks"]
    return {
        "fc1": spec(block["feed_forward"]["fc1"]["kernel"][...]),
        "fc1_bias": spec(block["feed_forward"]["fc1"]["bias"][...]),
        "fc2": spec(block["feed_forward"]["fc2"]["kernel"][...]),
        "query": spec(block["attention"]["query"]["kernel"][...]),
        "output": spec(block["attention"]["output"]["kernel"][...]),
        "norm": spec(block["attention_norm"]["scale"][...]),
        "embedding": spec(params["embeddings"]["word_embeddings"]["embedding"][...]),
        "fc1_mu": spec(mu_block["feed_forward"]["fc1"]["kernel"][...]),
        "embedding_mu": spec(mu_params["embeddings"]["word_embeddings"]["embedding"][...]),
        "devices": len(block["feed_forward"]["fc1"]["kernel"][...].sharding.device_set),
    }


def train(mesh: str, steps: int = STEPS):
    trainer, dataset = demo_trainer(mesh, steps)
    return trainer, dataset, [trainer(dataset.update_batch(i))["loss"] for i in range(steps)]


def params_of(trainer) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(trainer._params)]


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    out: dict = {"losses": {}, "placements": {}}
    _, dataset, out["losses"]["none"] = train("none")
    trainers = {}
    for mesh in MESHES:
        began = time.perf_counter()
        trainers[mesh], _, out["losses"][mesh] = train(mesh)
        print(f"{mesh}: {time.perf_counter() - began:.1f} s", file=sys.stderr)
        out["placements"][mesh] = placements(trainers[mesh])

    # A checkpoint saved under the 2x2x2 mesh, restored under fsdp=8 and onto one device.
    source = trainers["data=2,fsdp=2,tensor=2"]
    probe = dataset.micro_batch(STEPS + 1)
    expected = source.evaluate(probe)
    with tempfile.TemporaryDirectory() as directory:
        checkpointer = Checkpointer(directory)
        checkpointer.save(source, {"step": source.step})
        restored = {}
        for target in ("fsdp=8", "none"):
            trainer, _ = demo_trainer(target, STEPS)
            checkpointer.restore(trainer)
            restored[target] = {
                "step": trainer.step,
                "params_equal": all(np.array_equal(a, b) for a, b in
                                    zip(params_of(source), params_of(trainer))),
                "eval_diff": abs(trainer.evaluate(probe) - expected) / abs(expected),
                "fc1": placements(trainer)["fc1"],
                "fc1_devices": placements(trainer)["devices"],
            }
        checkpointer.close()
    out["checkpoint"] = restored

    # generate: the trained model placed on the 2x2x2 mesh against the same model on one device.
    model = source.sync()
    model.eval()
    prompt = np.asarray(dataset.micro_batch(0, 2)["input_ids"][:, :6])
    mask = np.ones_like(prompt)
    mask[1, :2] = 0  # left padding on one row
    single = generate(model, prompt, mask, max_new_tokens=8)
    single = np.asarray(single)
    mesh = sharding.make_mesh("data=2,fsdp=2,tensor=2")
    sharding.shard_model(model, mesh)
    sharded = np.asarray(generate(model, prompt, mask, max_new_tokens=8))
    state = nnx.state(model, nnx.Param)
    out["generate"] = {"single": single.tolist(), "sharded": sharded.tolist(),
                       "params_devices": min(len(x.sharding.device_set)
                                             for x in jax.tree.leaves(state))}
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
