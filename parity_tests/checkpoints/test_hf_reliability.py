"""``jaxformer.checkpoints.hf`` on bad input (issue 12): every case a clear error that names what
is wrong and where, and nothing loaded or written by halves.

- ``config.json``: a missing shape field, a field of the wrong type, a file that is not a JSON
  object;
- weights: integer or boolean tensors where a weight belongs, NaN or infinite weights (refused,
  by key; the integer buffers real checkpoints carry still load);
- ``save_pretrained``: a read-only parent is reported as the target, an existing empty directory
  keeps its permissions, and a failure leaves it as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import stat

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from jaxformer.checkpoints import hf
from jaxformer.config import BertConfig
from parity_tests.support.hf_models import fail_writes_halfway, hf_gpt2_config, hf_model
from torch_ref.models import bert as tb

BERT_SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings")
GPT2_SHAPE_FIELDS = ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions")


@pytest.fixture(scope="module")
def saved_bert(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    hf_model("BertForMaskedLM").save_pretrained(path)
    return path


def with_config(src, dst, edit) -> object:
    """A copy of the model directory ``src`` whose config.json went through ``edit(dict)``."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(edit(config)))
    return dst


# ---------------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field", BERT_SHAPE_FIELDS)
def test_missing_bert_field_is_named_with_the_file(tmp_path, saved_bert, field):
    """It was a bare ``KeyError: 'hidden_size'``."""
    path = with_config(saved_bert, tmp_path / "m", lambda c: {k: v for k, v in c.items()
                                                              if k != field})
    with pytest.raises(hf.CheckpointError) as info:
        hf.from_pretrained(path, "torch")
    assert str(info.value) == f"{path / 'config.json'}: required field {field!r} is missing"


@pytest.mark.parametrize("field", GPT2_SHAPE_FIELDS)
def test_missing_gpt2_field_is_named(field):
    """GPT-2's shape fields are required too (they silently defaulted to GPT-2 small, which
    then showed as a page of mis-shaped keys)."""
    config = {k: v for k, v in hf_gpt2_config().to_dict().items() if k != field}
    with pytest.raises(hf.CheckpointError, match=f"^x/config.json: required field '{field}' is "
                                                 f"missing$"):
        hf.config_from_hf(config, "GPT2LMHeadModel", source="x/config.json")


@pytest.mark.parametrize(("edit", "match"), [
    ({"hidden_size": "32"}, r"hidden_size must be an integer, got str '32'"),
    ({"num_hidden_layers": 2.0}, r"num_hidden_layers must be an integer, got float 2.0"),
    ({"vocab_size": True}, r"vocab_size must be an integer, got bool True"),
    ({"hidden_size": 30}, r"hidden_size \(30\) is not divisible by num_heads \(4\)"),
    ({"layer_norm_eps": "1e-12"}, r"layer_norm_eps must be float, got str '1e-12'"),
])
def test_malformed_field_is_named_with_the_file(tmp_path, saved_bert, edit, match):
    path = with_config(saved_bert, tmp_path / "m", lambda c: {**c, **edit})
    with pytest.raises(hf.CheckpointError, match=f"^{path / 'config.json'}: .*{match}"):
        hf.from_pretrained(path, "torch")


def test_config_that_is_not_an_object(tmp_path, saved_bert):
    path = with_config(saved_bert, tmp_path / "m", lambda c: [c])
    with pytest.raises(hf.CheckpointError, match=r"config\.json holds a JSON list, not an object"):
        hf.from_pretrained(path)


# ---------------------------------------------------------------------------------------------
# Weights: finite floating point only
# ---------------------------------------------------------------------------------------------

def test_integer_boolean_and_non_finite_weights_are_refused(tmp_path, saved_bert):
    """They used to load silently (int64 zeros as weights; NaN through to every output)."""
    state = load_file(saved_bert / "model.safetensors")
    edited = dict(state)
    edited["cls.predictions.transform.dense.bias"] = np.zeros(32, np.int64)
    edited["cls.predictions.transform.LayerNorm.weight"] = np.ones(32, np.bool_)
    nan = edited["bert.encoder.layer.1.output.dense.weight"].copy()
    nan[0, 0] = np.nan
    nan[1, :2] = np.inf
    edited["bert.encoder.layer.1.output.dense.weight"] = nan
    path = tmp_path / "m"
    shutil.copytree(saved_bert, path)
    save_file(edited, path / "model.safetensors", metadata={"format": "pt"})
    for framework in ("torch", "jax"):
        with pytest.raises(hf.CheckpointError) as info:
            hf.from_pretrained(path, framework)
        message = str(info.value)
        assert "nothing was loaded" in message
        assert ("non-floating keys (2): cls.predictions.transform.LayerNorm.weight (bool), "
                "cls.predictions.transform.dense.bias (int64)") in message
        assert ("non-finite keys (1): bert.encoder.layer.1.output.dense.weight (1 NaN, "
                "2 infinite)") in message
        assert "missing" not in message  # a refused key is not reported twice


def test_integer_weight_in_pytorch_bin_and_buffers_still_load(tmp_path):
    """The int64 ``position_ids`` buffer is not a weight: ignored as before. An integer tensor
    under a weight's key is refused."""
    model = hf_model("BertModel")
    state = dict(model.state_dict())
    state["embeddings.position_ids"] = torch.arange(64)[None]
    torch.save(state, tmp_path / "pytorch_model.bin")
    model.config.architectures = ["BertModel"]
    model.config.save_pretrained(tmp_path)
    assert hf.from_pretrained(tmp_path, "torch").pooler is not None
    state["encoder.layer.0.attention.self.key.bias"] = torch.zeros(32, dtype=torch.int32)
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(hf.CheckpointError, match=r"non-floating keys \(1\): "
                                                 r"encoder\.layer\.0\.attention\.self\.key\.bias "
                                                 r"\(int32\)"):
        hf.from_pretrained(tmp_path, "torch")


# ---------------------------------------------------------------------------------------------
# save_pretrained: where it writes
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_model():
    return tb.BertForSequenceClassification(BertConfig.tiny())


def make_read_only(directory, monkeypatch) -> None:
    """``directory`` read-only. root ignores permission bits, so there the refusal the kernel
    would give (EACCES on creating an entry in it) is reproduced at ``os.mkdir``."""
    directory.chmod(0o555)
    if os.geteuid() == 0:
        real_mkdir = os.mkdir

        def mkdir(path, mode=0o777, **kwargs):
            if os.path.dirname(os.path.abspath(path)) == str(directory):
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real_mkdir(path, mode, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir)


def test_read_only_parent_names_the_target(tmp_path, small_model, monkeypatch):
    """It named the hidden temporary directory (``.out.tmp-<hex>``) instead."""
    parent = tmp_path / "ro"
    parent.mkdir()
    make_read_only(parent, monkeypatch)
    target = parent / "out"
    try:
        with pytest.raises(PermissionError) as info:
            hf.save_pretrained(small_model, target)
    finally:
        parent.chmod(0o755)
    assert info.value.filename == str(target)
    assert str(target) in str(info.value)
    assert ".tmp-" not in str(info.value)
    assert f"{parent} must be writable" in str(info.value)
    assert os.listdir(parent) == []


@pytest.mark.parametrize("mode", [0o705, 0o750, 0o555])
def test_existing_empty_directory_keeps_its_permissions(tmp_path, small_model, mode):
    """It was replaced by a new directory with the umask's permissions."""
    target = tmp_path / "out"
    target.mkdir()
    target.chmod(mode)
    hf.save_pretrained(small_model, target)
    assert stat.S_IMODE(target.stat().st_mode) == mode
    assert sorted(os.listdir(target)) == ["config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["out"]
    target.chmod(0o750)  # overwrite=True replaces the content and keeps the (new) mode too
    hf.save_pretrained(small_model, target, overwrite=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    target.chmod(0o755)


def test_failure_leaves_an_existing_empty_directory_as_it_was(tmp_path, small_model,
                                                              monkeypatch):
    target = tmp_path / "out"
    target.mkdir()
    target.chmod(0o705)
    fail_writes_halfway(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        hf.save_pretrained(small_model, target)
    assert os.listdir(target) == []
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o705

