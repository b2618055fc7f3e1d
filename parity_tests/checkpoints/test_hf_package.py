"""The ``jaxformer.checkpoints.hf`` package: its public names, and the claim that a family is one
object registered in one place (the engine knows none). A made-up family, ``toybert`` (our
BertModel under other key names and a config.json of its own), is registered the way a real one
would be, and a checkpoint written through the engine's export direction loads back
bit-identically: nothing outside the family object had to change.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from jaxformer.checkpoints import convert, hf
from jaxformer.checkpoints.hf import bert, engine, files
from jaxformer.config import BertConfig
from parity_tests.support.helpers import FORWARD_RTOL, assert_close, max_rel_diff
from parity_tests.support.hf_models import hf_model
from torch_ref.models import bert as tb

PUBLIC = ("from_pretrained", "save_pretrained", "CheckpointError", "UnsupportedConfigError",
          "config_from_hf", "config_to_hf", "key_table", "read_checkpoint", "ARCHITECTURES",
          "Rule")


def test_public_names():
    for name in PUBLIC:
        assert hasattr(hf, name), name
    assert issubclass(hf.CheckpointError, ValueError)
    assert issubclass(hf.UnsupportedConfigError, ValueError)
    assert set(hf.ARCHITECTURES) == {"BertModel", "BertForPreTraining", "BertForMaskedLM",
                                     "BertForSequenceClassification", "GPT2Model",
                                     "GPT2LMHeadModel", "MarianMTModel",
                                     "BartForConditionalGeneration"}
    assert {a.family for a in hf.ARCHITECTURES.values()} == set(hf.FAMILIES)


class ToyBertFamily(engine.Family):
    """BertModel with layers under ``blocks/<i>/`` and our own field names in config.json."""

    model_type = "toybert"
    module = "bert"
    base_prefix = ""
    buffers = (r"step",)

    def architectures(self):
        return (engine.Architecture("ToyBertModel", self, "BertModel", "", ""),)

    def key_table(self, arch, config, options):
        real = hf.ARCHITECTURES["BertModel"]
        return [(dataclasses.replace(rule, hf=rule.hf.replace("encoder.layer.{i}.", "blocks/{i}/"),
                                     aliases=()), is_base)
                for rule, is_base in bert.FAMILY.key_table(real, config, options)]

    def config_from_hf(self, config, arch, source):
        return engine.build_config(BertConfig, source, **config["ours"])

    def config_to_hf(self, config, arch):
        return {"ours": dataclasses.asdict(config)}


def test_a_new_family_is_one_registration(tmp_path, monkeypatch):
    toy = ToyBertFamily()
    monkeypatch.setattr(hf, "FAMILIES", (*hf.FAMILIES, toy))
    monkeypatch.setattr(hf, "ARCHITECTURES", {**hf.ARCHITECTURES,
                                              **{a.name: a for a in toy.architectures()}})
    config = BertConfig.tiny()
    torch.manual_seed(0)
    source = tb.BertModel(config)
    ours = {k: v.numpy() for k, v in source.state_dict().items()}
    arch = hf.ARCHITECTURES["ToyBertModel"]
    state = engine.to_hf_state_dict(ours, arch, config, {})
    assert "blocks/1/attention.self.query.weight" in state
    assert not any("layer." in k
                                                                       for k in state)
    save_file({**state, "step": np.array([7])}, tmp_path / files.SAFETENSORS)
    (tmp_path / files.CONFIG).write_text(json.dumps(hf.config_to_hf(config, "ToyBertModel")))
    for framework in ("torch", "jax"):
        loaded = hf.from_pretrained(tmp_path, framework)
        assert type(loaded).__name__ == "BertModel"
        assert loaded.config == config
        back = loaded.state_dict() if framework == "torch" else convert.nnx_to_torch(loaded)
        assert back.keys() == ours.keys()
        for key, value in ours.items():
            np.testing.assert_array_equal(np.asarray(back[key]), value, err_msg=key)
    with pytest.raises(hf.UnsupportedConfigError, match="model_type='bert', but ToyBertModel "
                                                        "needs model_type='toybert'"):
        hf.config_from_hf({"model_type": "bert"}, "ToyBertModel")


def test_a_swapped_qkv_split_is_seen_by_the_output_comparison(tmp_path, monkeypatch):
    """The import tests have power: with their randomised weights, GPT-2's fused ``c_attn``
    split into (key, query, value) instead of (query, key, value), a bug no key or shape check
    can see, moves the logits far beyond the 1e-5 bound."""
    model = hf_model("GPT2LMHeadModel")
    model.save_pretrained(tmp_path)
    ids = torch.from_numpy(np.random.RandomState(0).randint(0, 101, (2, 9)))
    with torch.no_grad():
        expected = model(ids).logits
    forward, inverse = engine.TRANSFORMS["conv1d_split_qkv"]
    assert_close(expected, _logits(hf.from_pretrained(tmp_path, "torch"), ids))
    monkeypatch.setitem(engine.TRANSFORMS, "conv1d_split_qkv",
                        (lambda x: (lambda q, k, v: (k, q, v))(*forward(x)), inverse))
    swapped = _logits(hf.from_pretrained(tmp_path, "torch"), ids)
    assert max_rel_diff(expected, swapped) > 1000 * FORWARD_RTOL


def _logits(model, ids):
    with torch.no_grad():
        return model(ids)
