"""Sharding: the mesh, the rule table, and training over 8 devices.

The suite's process runs JAX on one CPU device, so the 8-device cases run in one subprocess
(``tools/sharding_worker.py``), bounded in time, leaving no process behind; training over two
processes is ``training/test_multiprocess.py``'s. The tolerance (docs/design.md): sharded vs one
device, losses equal to 1e-5 relative over 20 steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jaxformer import sharding
from jaxformer.config import BertConfig, GPTConfig, TransformerConfig
from jaxformer.models.bert import BertForPreTraining
from jaxformer.models.encoder_decoder import Transformer
from jaxformer.models.gpt import GPT
from parity_tests.support.helpers import fast_compile_env

ROOT = Path(__file__).resolve().parent.parent
LOSS_RTOL = 1e-5
TIMEOUT = 600  # seconds, for a loaded 2-core machine; an idle one needs a tenth of it


def rel_diff(expected, actual) -> float:
    expected, actual = np.asarray(expected), np.asarray(actual)
    assert expected.shape == actual.shape
    return float(np.max(np.abs(expected - actual) / np.abs(expected)))


# ---------------------------------------------------------------------------------------------
# The mesh and the rules (this process, one device)
# ---------------------------------------------------------------------------------------------

def test_parse_mesh():
    assert sharding.parse_mesh("data=2,fsdp=2,tensor=2") == {"data": 2, "fsdp": 2, "tensor": 2}
    assert sharding.parse_mesh(" tensor = 4 ") == {"data": 1, "fsdp": 1, "tensor": 4}
    assert sharding.parse_mesh({"fsdp": -1}) == {"data": 1, "fsdp": -1, "tensor": 1}


@pytest.mark.parametrize(("spec", "message"), [
    ("data=2,model=4", "unknown axis 'model'"),
    ("data=2,data=4", "axis 'data' is given twice"),
    ("data:2", "cannot read 'data:2'"),
    ("data=0", "axis 'data' has size 0"),
    ("data=-1,fsdp=-1", "only one axis may be -1"),
])
def test_parse_mesh_errors(spec, message):
    with pytest.raises(sharding.MeshError, match=message):
        sharding.parse_mesh(spec)


def test_make_mesh_names_product_and_device_count():
    with pytest.raises(sharding.MeshError, match=r"needs 8 devices .* but 1 are available"):
        sharding.make_mesh("data=2,fsdp=2,tensor=2")
    mesh = sharding.make_mesh("data=-1")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}


def test_rules_megatron_and_fsdp():
    mesh = {"data": 2, "fsdp": 2, "tensor": 2}
    P = jax.sharding.PartitionSpec
    assert sharding.logical_spec(("embed", "mlp"), (32, 64), mesh) == P("fsdp", "tensor")  # fc1
    assert sharding.logical_spec(("mlp", "embed"), (64, 32), mesh) == P("tensor", "fsdp")  # fc2
    assert sharding.logical_spec(("heads", "embed"), (32, 32), mesh) == P("tensor", "fsdp")
    assert sharding.logical_spec(("batch", "seq"), (8, 16), mesh) == P(("data", "fsdp"), None)
    assert sharding.logical_spec(("layers", "norm"), (3, 32), mesh) == P(None, None)
    # A size the axes do not divide stays whole; a batch of 2 keeps the "data" prefix.
    assert sharding.logical_spec(("vocab", "embed"), (101, 32), mesh) == P(None, "fsdp")
    assert sharding.logical_spec(("batch",), (2,), mesh) == P("data")
    # Axes of size 1 are left out; a mesh axis is used once per array.
    assert sharding.logical_spec(("embed", "mlp"), (32, 64), {"data": 8}) == P(None, None)
    assert sharding.logical_spec(("mlp", "vocab"), (8, 8), {"tensor": 2}) == P("tensor", None)
    with pytest.raises(ValueError, match="unknown logical axis 'model'"):
        sharding.logical_spec(("model",), (4,), mesh)
    with pytest.raises(ValueError, match="2 logical names"):
        sharding.logical_spec(("embed", "mlp"), (4,), mesh)


@pytest.mark.parametrize(("cls", "config"), [(GPT, GPTConfig.tiny()),
                                         (BertForPreTraining, BertConfig.tiny()),
                                         (Transformer, TransformerConfig.tiny())])
def test_every_parameter_is_named_at_creation(cls, config):
    model = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
    unnamed = []
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        names = variable.get_metadata().get("out_sharding")
        if not names or len(names) != variable.get_value().ndim:
            unnamed.append(".".join(map(str, path)))
        else:
            sharding.logical_spec(names, variable.get_value().shape, {})  # known names only
    assert not unnamed, f"parameters without one logical name per axis: {unnamed}"


def test_constrain_is_a_no_op_without_a_mesh():
    x = jax.numpy.ones((2, 3, 4))
    assert sharding.constrain(x, ("batch", "seq", "hidden")) is x


# ---------------------------------------------------------------------------------------------
# 8 devices, one process (the worker)
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def eight_devices() -> dict:
    # The worker's time goes to compiling (the 20 steps of a tiny model take a fraction of a
    # second); the reference and the sharded runs compile alike (helpers.FAST_COMPILE).
    env = fast_compile_env(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    try:
        run = subprocess.run([sys.executable,
                              str(ROOT / "parity_tests" / "tools" / "sharding_worker.py")],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:  # subprocess.run kills the worker
        pytest.fail(f"the 8-device worker did not finish in {TIMEOUT} s")
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mesh", ["data=8", "fsdp=8", "data=2,tensor=4",
                                  "data=2,fsdp=2,tensor=2"])
def test_sharded_losses_equal_one_device(eight_devices, mesh):
    reference = eight_devices["losses"]["none"]
    assert len(reference) == 20
    assert reference[-1] < reference[0] - 0.5
    assert rel_diff(reference, eight_devices["losses"][mesh]) <= LOSS_RTOL


def test_placements_follow_the_rules(eight_devices):
    placed = eight_devices["placements"]
    # Data parallel: every weight whole on each of the 8 devices.
    assert all(v == [None] * len(v) for k, v in placed["data=8"].items() if k != "devices")
    # FSDP: weights and optimizer moments split along their "embed" axis.
    fsdp = placed["fsdp=8"]
    assert fsdp["fc1"] == ["fsdp", None]
    assert fsdp["fc2"] == [None, "fsdp"]
    assert fsdp["embedding"] == [None, "fsdp"]
    assert fsdp["embedding_mu"] == [None, "fsdp"]
    assert fsdp["fc1_mu"] == fsdp["fc1"]
    # Megatron: fc1 and query column-parallel, fc2 and the output row-parallel, vocab split.
    tp = placed["data=2,tensor=4"]
    assert tp["fc1"] == [None, "tensor"]
    assert tp["fc1_bias"] == ["tensor"]
    assert tp["query"] == [None, "tensor"]
    assert tp["output"] == ["tensor", None]
    assert tp["fc2"] == ["tensor", None]
    assert tp["embedding"] == ["tensor", None]
    mix = placed["data=2,fsdp=2,tensor=2"]
    assert mix["fc1"] == ["fsdp", "tensor"]
    assert mix["fc2"] == ["tensor", "fsdp"]
    assert mix["embedding"] == ["tensor", "fsdp"] == mix["embedding_mu"]
    assert mix["fc1_mu"] == mix["fc1"]
    assert mix["norm"] == [None]
    assert all(p["devices"] == 8 for p in placed.values())


def test_checkpoint_restores_across_meshes(eight_devices):
    """Saved under data=2,fsdp=2,tensor=2; restored under fsdp=8 and onto one device."""
    restored = eight_devices["checkpoint"]
    assert restored["fsdp=8"]["fc1"] == ["fsdp", None]
    assert restored["fsdp=8"]["fc1_devices"] == 8
    assert restored["none"]["fc1"] is None
    assert restored["none"]["fc1_devices"] == 1
    for target in restored.values():
        assert target["step"] == 20
        assert target["params_equal"]
        assert target["eval_diff"] <= LOSS_RTOL


def test_generate_sharded_equals_one_device(eight_devices):
    result = eight_devices["generate"]
    assert result["params_devices"] == 8
    assert len(result["single"][0]) == 6 + 8
    assert result["sharded"] == result["single"]
