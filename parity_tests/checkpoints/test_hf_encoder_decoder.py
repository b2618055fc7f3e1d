"""MarianMT and BART checkpoints in and out of the encoder-decoder ``Transformer``, against
Hugging Face transformers (which nobody here wrote).

Import: random transformers models (every parameter and ``final_logits_bias`` perturbed; Marian's
frozen sinusoidal tables left as they are) in several variants (shared or separate vocabularies,
tied or untied heads, scaled embeddings on and off, swish / ReLU / GELU), saved as safetensors or
``pytorch_model.bin``, loaded into both twins by ``hf.from_pretrained``; source and target both
padded. Encoder states (real source tokens), decoder logits (real target tokens) and the loss
must agree with transformers' to DESIGN.md's 1e-5 of their scale. Export: our models through
``save_pretrained`` into transformers' own ``from_pretrained`` (no missing or unexpected key),
the same logits, and back bit-identical; a transformers checkpoint through jaxformer and out again
gives the same tensors. Then the configurations that cannot be expressed, and bad input.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from jaxformer.checkpoints import convert, hf
from jaxformer.config import TransformerConfig
from jaxformer.models import encoder_decoder as jed
from jaxformer.training import losses as jlosses
from parity_tests.support.helpers import assert_close, to_numpy, twin_pair
from parity_tests.support.hf_models import hf_bart_config, hf_marian_config, hf_model
from torch_ref.models import encoder_decoder as ted
from torch_ref.training import losses as tlosses

FRAMEWORKS = ("jax", "torch")
B, S, T = 3, 9, 7

VARIANTS = {  # name -> (architecture, transformers config)
    "marian": ("MarianMTModel", hf_marian_config()),
    "marian_separate_vocab": ("MarianMTModel", hf_marian_config(
        share_encoder_decoder_embeddings=False, decoder_vocab_size=23, tie_word_embeddings=True,
        pad_token_id=22, decoder_start_token_id=22)),
    "marian_separate_untied": ("MarianMTModel", hf_marian_config(
        share_encoder_decoder_embeddings=False, decoder_vocab_size=23, tie_word_embeddings=False,
        pad_token_id=22, decoder_start_token_id=22)),
    "marian_relu_unscaled_untied": ("MarianMTModel", hf_marian_config(
        activation_function="relu", scale_embedding=False, tie_word_embeddings=False)),
    "bart": ("BartForConditionalGeneration", hf_bart_config()),
    "bart_scaled_untied": ("BartForConditionalGeneration", hf_bart_config(
        scale_embedding=True, tie_word_embeddings=False, activation_function="relu")),
}


def batch(config: TransformerConfig, seed: int = 0):
    """Source and target ids (never the pad id) and masks: source row 1 right-padded, row 2
    left-padded; target rows 1 and 2 right-padded; labels the next tokens, -100 at padding."""
    rng = np.random.RandomState(seed)
    src = rng.randint(3, min(config.src_vocab_size, config.tgt_vocab_size) - 1, size=(B, S))
    tgt = rng.randint(3, config.tgt_vocab_size - 1, size=(B, T + 1))
    src_mask = np.ones((B, S), np.int64)
    src_mask[1, 6:] = 0
    src_mask[2, :3] = 0
    tgt_mask = np.ones((B, T), np.int64)
    tgt_mask[1, 4:] = 0
    tgt_mask[2, 6:] = 0
    labels = np.where(tgt_mask > 0, tgt[:, 1:], -100)
    return src, tgt[:, :-1], src_mask, tgt_mask, labels


def hf_run(model, src, tgt, src_mask, tgt_mask, labels):
    t = torch.from_numpy
    with torch.no_grad():
        out = model(input_ids=t(src), attention_mask=t(src_mask), decoder_input_ids=t(tgt),
                    decoder_attention_mask=t(tgt_mask), labels=t(labels))
    return to_numpy(out.encoder_last_hidden_state), to_numpy(out.logits), float(out.loss)


def our_run(model, src, tgt, src_mask, tgt_mask, labels):
    if isinstance(model, torch.nn.Module):
        t = torch.from_numpy
        with torch.no_grad():
            memory = model.encode(t(src), t(src_mask))
            logits = model(t(src), t(tgt), t(src_mask), t(tgt_mask))
            loss = tlosses.seq2seq_loss(logits, t(labels))
    else:
        j = jnp.asarray
        memory = model.encode(j(src), j(src_mask))
        logits = model(j(src), j(tgt), j(src_mask), j(tgt_mask))
        loss = jlosses.seq2seq_loss(logits, j(labels))
    return to_numpy(memory), to_numpy(logits), float(loss)


def assert_same(expected, actual, src_mask, tgt_mask, what: str) -> None:
    assert_close(expected[0], actual[0], where=src_mask.astype(bool), what=f"{what} encoder")
    assert_close(expected[1], actual[1], where=tgt_mask.astype(bool), what=f"{what} logits")
    assert_close(np.float32(expected[2]), np.float32(actual[2]), what=f"{what} loss")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (transformers model, its saved directory), made once per module."""
    made = {}
    for name, (arch, config) in VARIANTS.items():
        model = hf_model(arch, config)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        made[name] = (model, path)
    return made


# ---------------------------------------------------------------------------------------------
# Import: transformers -> jaxformer / torch_ref
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_import_matches_transformers(saved, name, framework):
    reference, path = saved[name]
    ours = hf.from_pretrained(path, framework)
    assert type(ours).__name__ == "Transformer"
    assert not getattr(ours, "training", False)
    args = batch(ours.config)
    assert_same(hf_run(reference, *args), our_run(ours, *args), args[2], args[3],
                f"{name} ({framework})")


def test_config_mapping(saved):
    marian = hf.from_pretrained(saved["marian"][1], "torch").config
    assert (marian.activation, marian.sinusoidal_layout, marian.final_logits_bias,
            marian.share_embeddings, marian.scale_embeddings, marian.src_pad_id,
            marian.position_embedding_type) == ("silu", "split", True, True, True, 28,
                                                "sinusoidal")
    separate = hf.from_pretrained(saved["marian_separate_untied"][1], "torch").config
    assert (separate.src_vocab_size, separate.tgt_vocab_size, separate.share_embeddings,
            separate.tie_word_embeddings) == (29, 23, False, False)
    bart = hf.from_pretrained(saved["bart"][1], "torch").config
    assert (bart.position_embedding_type, bart.position_offset, bart.embedding_layer_norm,
            bart.activation, bart.scale_embeddings, bart.src_pad_id) == ("learned", 2, True,
                                                                        "gelu", False, 1)
    for config in (marian, separate, bart):
        arch = "BartForConditionalGeneration" if config is bart else "MarianMTModel"
        assert hf.config_from_hf(hf.config_to_hf(config, arch), arch) == config


def test_marian_table_is_transformers_own(saved):
    """The split table jaxformer computes is bit-identical to the one transformers builds."""
    reference = saved["marian"][0].model
    for side in (reference.encoder, reference.decoder):
        np.testing.assert_array_equal(
            side.embed_positions.weight.numpy(),
            jed.sinusoidal_table(64, 32, "split"))


@pytest.mark.parametrize("name", ["marian", "bart"])
def test_pytorch_bin_with_old_keys(saved, name, tmp_path):
    """A ``pytorch_model.bin`` with every key written out, as older exports have them: the tied
    copies of the shared table and lm_head, Marian's sinusoidal tables, BART's version stamps."""
    reference, _ = saved[name]
    state = dict(reference.state_dict())
    assert {"model.encoder.embed_tokens.weight", "lm_head.weight"} <= state.keys()
    if name == "bart":
        state["model.encoder.version"] = torch.tensor([2.0])
        state["model.decoder.version"] = torch.tensor([2.0])
    else:
        assert "model.encoder.embed_positions.weight" in state
    torch.save(state, tmp_path / "pytorch_model.bin")
    reference.config.architectures = [type(reference).__name__]
    reference.config.save_pretrained(tmp_path)
    for framework in FRAMEWORKS:
        ours = hf.from_pretrained(tmp_path, framework)
        args = batch(ours.config)
        assert_same(hf_run(reference, *args), our_run(ours, *args), args[2], args[3],
                    f"{name} .bin ({framework})")


# ---------------------------------------------------------------------------------------------
# Export: jaxformer / torch_ref -> transformers, and round trips
# ---------------------------------------------------------------------------------------------

TINY = TransformerConfig.tiny()
MARIAN_LIKE = dataclasses.replace(TINY, sinusoidal_layout="split", final_logits_bias=True,
                                  activation="silu", src_pad_id=22, tgt_pad_id=22)
BART_LIKE = dataclasses.replace(TINY, src_vocab_size=29, share_embeddings=True,
                                tie_word_embeddings=True, position_embedding_type="learned",
                                position_offset=2, embedding_layer_norm=True, activation="gelu",
                                scale_embeddings=False, final_logits_bias=True)
EXPORTS = {  # name -> (config, the Hugging Face architecture it becomes)
    "marian_separate": (MARIAN_LIKE, "MarianMTModel"),
    "marian_shared_tied": (dataclasses.replace(MARIAN_LIKE, src_vocab_size=29,
                                               share_embeddings=True, tie_word_embeddings=True),
                           "MarianMTModel"),
    # the seed's ReLU, untied head with its own bias: Marian's lm_head + final_logits_bias
    "seed_relu_split": (dataclasses.replace(TINY, sinusoidal_layout="split", src_pad_id=22,
                                            tgt_pad_id=22), "MarianMTModel"),
    "bart": (BART_LIKE, "BartForConditionalGeneration"),
    # untied: transformers 5 keeps a table per side (and an unread ``shared``, written as ours)
    "bart_untied": (dataclasses.replace(BART_LIKE, share_embeddings=False,
                                        tie_word_embeddings=False),
                    "BartForConditionalGeneration"),
}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("name", list(EXPORTS))
def test_export_loads_in_transformers(name, framework, tmp_path):
    config, arch = EXPORTS[name]
    torch_model, jax_model = twin_pair(ted.Transformer, jed.Transformer, config, seed=1,
                                       randomized=True)
    ours = jax_model if framework == "jax" else torch_model
    hf.save_pretrained(ours, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == [arch]
    loaded, info = getattr(transformers, arch).from_pretrained(tmp_path / "out",
                                                               output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    args = batch(config)
    expected = hf_run(loaded.eval(), *args)
    assert_same(expected, our_run(ours, *args), args[2], args[3], f"{name} from {framework}")
    back = hf.from_pretrained(tmp_path / "out", framework)  # and back: bit-identical weights
    before = {k: v.numpy() for k, v in torch_model.state_dict().items()}
    after = (convert.nnx_to_torch(back) if framework == "jax" else
             {k: v.numpy() for k, v in back.state_dict().items()})
    if not config.final_logits_bias and config.tie_word_embeddings is False:
        assert back.config == dataclasses.replace(config, final_logits_bias=True)
        before["final_logits_bias.bias"] = before.pop("output_projection.bias")
    else:
        assert back.config == config
    assert before.keys() == after.keys()
    for key in before:
        np.testing.assert_array_equal(before[key], after[key], err_msg=key)


@pytest.mark.parametrize("name", ["marian", "marian_separate_untied", "bart"])
def test_transformers_round_trip_is_exact(saved, name, tmp_path):
    """transformers -> jaxformer -> transformers: the same tensors under the same keys."""
    _, path = saved[name]
    hf.save_pretrained(hf.from_pretrained(path, "jax"), tmp_path / "again")
    original, again = load_file(path / "model.safetensors"), load_file(
        tmp_path / "again" / "model.safetensors")
    assert original.keys() == again.keys()
    for key in original:
        np.testing.assert_array_equal(original[key], again[key], err_msg=key)


@pytest.mark.parametrize(("config", "match"), [
    (TransformerConfig.simple_transformer(), r"MarianMT: it needs sinusoidal_layout='split'"),
    (dataclasses.replace(TINY, position_embedding_type="learned"),
     r"BART: it needs position_offset=2"),
    (dataclasses.replace(BART_LIKE, tie_word_embeddings=False),
     r"shares the source and target tables only together with the head"),
    (dataclasses.replace(TINY, src_vocab_size=29, share_embeddings=True,
                         position_embedding_type="learned"), r"BART: it needs position_offset=2"),
    (dataclasses.replace(MARIAN_LIKE, pre_norm=True), r"MarianMT: it needs pre_norm=False"),
    (dataclasses.replace(MARIAN_LIKE, tgt_pad_id=3), r"one pad_token_id.*src_pad_id=22 and "
                                                     r"tgt_pad_id=3"),
])
def test_export_refuses_what_transformers_cannot_express(config, match, tmp_path):
    model = ted.Transformer(dataclasses.replace(config, hidden_size=16, num_heads=2,
                                                intermediate_size=8, num_encoder_layers=1,
                                                num_decoder_layers=1))
    with pytest.raises(hf.UnsupportedConfigError, match=match):
        hf.save_pretrained(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------------------------
# Bad input: one clear error naming the field or key
# ---------------------------------------------------------------------------------------------

def edited(saved, name, tmp_path, config=None, state=None):
    _, path = saved[name]
    target = tmp_path / "edited"
    shutil.copytree(path, target)
    if config is not None:
        original = json.loads((path / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**original, **config}))
    if state is not None:
        save_file(state, target / "model.safetensors", metadata={"format": "pt"})
    return target


@pytest.mark.parametrize(("name", "overrides", "match"), [
    ("marian", {"normalize_before": True}, r"normalize_before=True is not supported \(MarianMT "
                                           r"is post-LN\)"),
    ("marian", {"add_bias_logits": True}, "add_bias_logits=True is not supported"),
    ("marian", {"static_position_embeddings": False}, "static_position_embeddings=False"),
    ("marian", {"decoder_ffn_dim": 40}, "encoder_ffn_dim=37 differs from decoder_ffn_dim=40"),
    ("marian", {"activation_function": "quick_gelu"}, "activation_function='quick_gelu'"),
    ("bart", {"normalize_before": True}, "normalize_before=True is not supported"),
    ("bart", {"add_final_layer_norm": True}, "add_final_layer_norm=True"),
    ("bart", {"decoder_attention_heads": 2}, "encoder_attention_heads=4 differs"),
    ("bart", {"architectures": ["BartForSequenceClassification"]},
     "architecture 'BartForSequenceClassification' is not supported"),
])
def test_unsupported_config(saved, tmp_path, name, overrides, match):
    path = edited(saved, name, tmp_path, config=overrides)
    with pytest.raises(hf.UnsupportedConfigError, match=match):
        hf.from_pretrained(path)


def test_bad_checkpoints(saved, tmp_path):
    with pytest.raises(hf.UnsupportedConfigError, match="model_type='bart', but BertModel needs "
                                                         "model_type='bert'"):
        hf.from_pretrained(saved["bart"][1], architecture="BertModel")
    with pytest.raises(hf.CheckpointError, match=r"decoder_vocab_size \(23\) != vocab_size"):
        hf.from_pretrained(edited(saved, "marian", tmp_path, config={"decoder_vocab_size": 23}))
    shutil.rmtree(tmp_path / "edited")
    state = load_file(saved["bart"][1] / "model.safetensors")
    del state["model.decoder.layers.1.fc2.bias"]
    state["model.decoder.layers.1.fc3.bias"] = np.zeros(32, np.float32)
    state["model.encoder.embed_positions.weight"] = np.zeros((64, 32), np.float32)
    path = edited(saved, "bart", tmp_path, state=state)
    with pytest.raises(hf.CheckpointError, match=(
            r"(?s)missing model keys \(1\): decoder\.layers\.1\.feed_forward\.fc2\.bias.*"
            r"unexpected checkpoint keys \(1\): model\.decoder\.layers\.1\.fc3\.bias.*"
            r"model\.encoder\.embed_positions\.weight: \(64, 32\) in the checkpoint, the model "
            r"expects \(66, 32\)")):
        hf.from_pretrained(path)


def test_import_randomized_twins_stay_twins(saved):
    """The two frameworks load the same checkpoint into models that agree with each other (the
    suite's twin parity, on an imported Marian)."""
    jax_model = hf.from_pretrained(saved["marian"][1], "jax")
    torch_model = hf.from_pretrained(saved["marian"][1], "torch")
    args = batch(jax_model.config, seed=4)
    ours_j, ours_t = our_run(jax_model, *args), our_run(torch_model, *args)
    assert_same(ours_t, ours_j, args[2], args[3], "jax vs torch")


# ---------------------------------------------------------------------------------------------
# train --export-hf for the transformer family
# ---------------------------------------------------------------------------------------------

def test_train_exports_marian_with_its_start_and_end_tokens(tmp_path):
    """``jaxformer train --family transformer --preset marian_tiny --export-hf DIR``: transformers
    loads the export as a MarianMTModel with the run's tokens as decoder start ([CLS]) and eos
    ([SEP]), and computes the logits of the model the run's final checkpoint restores. Trained
    without dropout (``--dropout 0``: half the train step's compilation; the export is compared
    in eval mode, where dropout does nothing)."""
    from jaxformer import cli
    from jaxformer.training.checkpoint import Checkpointer
    from jaxformer.training.config import TrainConfig
    from jaxformer.training.step import TrainStep, build_model
    from parity_tests.support.training import write_corpus

    data = write_corpus(tmp_path / "corpus.txt", lines=60)
    run_dir, export = tmp_path / "run", tmp_path / "hf"
    assert cli.main(["train", "--family", "transformer", "--preset", "marian_tiny", "--data",
                     data, "--steps", "3", "--seq-len", "16", "--vocab-size", "40", "--dropout",
                     "0", "--checkpoint-dir", str(run_dir), "--export-hf", str(export)]) == 0
    identity = json.loads((run_dir / "run.json").read_text())["identity"]
    config = TransformerConfig(**{k: v for k, v in identity["model_config"].items()
                                  if k != "class"})
    trainer = TrainStep("transformer", build_model("transformer", config, 123),
                        TrainConfig(**identity["train_config"]))
    Checkpointer(run_dir / "checkpoints").restore(trainer)
    ours = trainer.sync()
    ours.eval()
    hf_config = json.loads((export / "config.json").read_text())
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(export / "tokenizer.json"))
    assert (hf_config["architectures"], hf_config["decoder_start_token_id"],
            hf_config["eos_token_id"], hf_config["pad_token_id"]) == (
        ["MarianMTModel"], tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]"),
        tokenizer.token_to_id("[PAD]"))
    reference = transformers.MarianMTModel.from_pretrained(export).eval()
    args = batch(config)
    assert_same(hf_run(reference, *args), our_run(ours, *args), args[2], args[3], "trained")


# ---------------------------------------------------------------------------------------------
# jaxformer generate --model DIR
# ---------------------------------------------------------------------------------------------

def word_tokenizer(path, size: int, eos: str = "</s>") -> None:
    """A word-level ``tokenizer.json`` of ``size`` tokens, Marian's specials (``</s>`` 0,
    ``<unk>`` 1, ``<pad>`` last), ``</s>`` appended to every text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"</s>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, size - 1)}, "<pad>": size - 1}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["</s>", "<unk>", "<pad>"])
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {eos}",
                                                             special_tokens=[(eos, 0)])
    tokenizer.save(str(path))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_generate_command_translates_like_transformers(saved, tmp_path, capsys, framework):
    """``jaxformer generate --model DIR`` on a Marian directory with ``tokenizer.json`` and
    Marian's generation settings (pad as decoder start, eos 0 forced at the end, the pad token
    banned): the same tokens as transformers' ``generate`` with the directory's settings."""
    from tokenizers import Tokenizer

    from jaxformer import cli

    reference = saved["marian"][0]
    directory = edited(saved, "marian", tmp_path, config={"bad_words_ids": [[28]]})
    word_tokenizer(directory / "tokenizer.json", 29)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    prompts = ["w3 w4 w5 w6", "w9 w2"]
    assert cli.main(["generate", "--model", str(directory), "--framework", framework,
                     "--max-new-tokens", "6", "--num-beams", "2",
                     *[arg for p in prompts for arg in ("--prompt", p)]]) == 0
    out, err = capsys.readouterr()
    encoded = [tokenizer.encode(p).ids for p in prompts]
    width = max(map(len, encoded))
    ids = torch.tensor([e + [28] * (width - len(e)) for e in encoded])
    with torch.no_grad():
        expected = reference.generate(ids, attention_mask=(ids != 28).long(), max_new_tokens=6,
                                      num_beams=2, bad_words_ids=[[28]], do_sample=False)
    lines = [f"[{n}] {tokenizer.decode(row[1:].tolist(), skip_special_tokens=True)}"
             for n, row in enumerate(expected)]
    assert out.splitlines() == lines
    assert "new tokens in" in err


def test_generate_command_bad_directories(saved, tmp_path, capsys):
    from jaxformer import cli

    directory = edited(saved, "marian", tmp_path)
    (directory / "source.spm").write_bytes(b"")
    assert cli.main(["generate", "--model", str(directory), "--prompt", "w3"]) == 2
    assert "tokenizer.json" in capsys.readouterr().err
    word_tokenizer(directory / "tokenizer.json", 40)
    assert cli.main(["generate", "--model", str(directory), "--prompt", "w3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxformer generate: error: ")
    assert "40" in err
    assert "29" in err
