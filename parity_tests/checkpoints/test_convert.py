"""``jaxformer.checkpoints.convert``: torch ``state_dict`` <-> NNX parameters for every BERT class.

- torch -> NNX -> torch is bit-identical (every key, every value, every dtype);
- what ``nnx_to_torch`` produces loads into the torch twin with ``strict=True``, and the twin then
  computes what the NNX model computes (the NNX -> torch direction). The weights are randomised
  to unit-scale activations (not the N(0, 0.02) init, behind which a transposed square weight
  moves the output by only ~1e-4: measured below);
- missing, unexpected, mis-shaped, non-floating and non-finite keys each raise
  ``StateDictMismatchError`` naming the key, and nothing is loaded: the model is left exactly as
  it was;
- ``nnx_to_torch`` returns writable arrays (``torch.from_numpy`` takes them without a warning).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer.checkpoints import convert
from jaxformer.checkpoints.convert import StateDictMismatchError
from jaxformer.config import BertConfig
from jaxformer.models import bert as jb
from jaxformer.nn import layers as jl
from parity_tests.support.helpers import (
    FORWARD_RTOL,
    assert_close,
    make_attention_mask,
    max_rel_diff,
)
from torch_ref.models import bert as tb
from torch_ref.nn import layers as tl

TINY = BertConfig.tiny()
# Seed 003's preset at small sizes: ReLU, no embedding LayerNorm, untied MLM decoder.
D2L_SMALL = dataclasses.replace(BertConfig.d2l_bert(), vocab_size=99, hidden_size=32,
                                num_heads=4, intermediate_size=37, max_position_embeddings=64)
CONFIGS = {"tiny": TINY, "d2l_small": D2L_SMALL}

BERT_CLASSES = ["BertEmbeddings", "BertEncoder", "BertPooler", "BertModel", "BertMLMHead",
                "BertNSPHead", "BertForPreTraining", "BertForSequenceClassification"]
if hasattr(jb, "BertForMaskedLM"):
    BERT_CLASSES.append("BertForMaskedLM")
LAYER_CLASSES = ["MultiHeadAttention", "FeedForward", "TransformerBlock"]


def classes(name):
    if name in LAYER_CLASSES:
        return getattr(tl, name), getattr(jl, name)
    return getattr(tb, name), getattr(jb, name)


def torch_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def assert_state_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]):
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert value.dtype == b[key].dtype, key
        assert np.array_equal(value, b[key]), f"{key} differs"


def randomize_nnx(model: nnx.Module, seed: int) -> nnx.Module:
    """Every parameter moved far from its init: kernels by N(0, 1/fan_in) (unit-scale
    activations, so each projection matters to the output), the rest by N(0, 0.5) (embeddings,
    biases off zero, LayerNorm scales off one)."""
    rng = np.random.default_rng(seed)
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = np.asarray(variable.get_value())
        scale = 1 / np.sqrt(value.shape[0]) if str(path[-1]) == "kernel" else 0.5
        noise = rng.normal(size=value.shape).astype(np.float32) * scale
        variable.set_value(jnp.asarray(value + noise))
    return model


@pytest.mark.usefixtures("scan_layers")
@pytest.mark.parametrize("config_name", ["tiny", "d2l_small"])
@pytest.mark.parametrize("name", BERT_CLASSES + LAYER_CLASSES)
def test_round_trip_is_bit_identical(name, config_name):
    config = CONFIGS[config_name]
    torch_cls, jax_cls = classes(name)
    torch.manual_seed(0)
    torch_model = torch_cls(config)
    with torch.no_grad():  # nothing left at an init constant (zero biases, unit scales)
        for p in torch_model.parameters():
            p.add_(torch.randn(p.shape) * 0.1)
    jax_model = jax_cls(config, rngs=nnx.Rngs(0))
    before = torch_state(torch_model)
    assert convert.torch_to_nnx(torch_model.state_dict(), jax_model) is jax_model
    after = convert.nnx_to_torch(jax_model)
    assert_state_equal(before, after)
    assert all(v.dtype == np.float32 for v in after.values())
    # NNX keeps JAX arrays (copies, not views of the torch tensors).
    for _, variable in nnx.to_flat_state(nnx.state(jax_model, nnx.Param)):
        assert isinstance(variable.get_value(), jnp.ndarray)


def test_tied_and_untied_layouts():
    """Tied weights exist once on both sides; untied adds exactly the decoder."""
    tied = convert.nnx_to_torch(jb.BertForPreTraining(TINY, rngs=nnx.Rngs(0)))
    untied_config = dataclasses.replace(TINY, tie_word_embeddings=False)
    untied = convert.nnx_to_torch(jb.BertForPreTraining(untied_config, rngs=nnx.Rngs(0)))
    assert "mlm.decoder.weight" not in tied
    assert untied.keys() - tied.keys() == {"mlm.decoder.weight"}
    assert tied.keys() == set(tb.BertForPreTraining(TINY).state_dict())
    assert untied.keys() == set(tb.BertForPreTraining(untied_config).state_dict())
    assert untied["mlm.decoder.weight"].shape == (TINY.vocab_size, TINY.hidden_size)


def test_leaf_rules():
    """kernel <- weight.T, scale <- weight, embedding <- weight, bias <- bias."""
    torch.manual_seed(1)
    torch_model = tb.BertModel(TINY)
    jax_model = convert.torch_to_nnx(torch_model.state_dict(), jb.BertModel(TINY,
                                                                            rngs=nnx.Rngs(1)))
    sd = torch_state(torch_model)
    block = jax_model.encoder.layers[0]
    np.testing.assert_array_equal(np.asarray(block.feed_forward.fc1.kernel[...]),
                                  sd["encoder.layers.0.feed_forward.fc1.weight"].T)
    np.testing.assert_array_equal(np.asarray(block.feed_forward.fc1.bias[...]),
                                  sd["encoder.layers.0.feed_forward.fc1.bias"])
    np.testing.assert_array_equal(np.asarray(block.attention_norm.scale[...]),
                                  sd["encoder.layers.0.attention_norm.weight"])
    np.testing.assert_array_equal(
        np.asarray(jax_model.embeddings.word_embeddings.embedding[...]),
        sd["embeddings.word_embeddings.weight"])


@pytest.mark.parametrize("name", ["BertModel", "BertForPreTraining",
                                  "BertForSequenceClassification"])
@pytest.mark.parametrize("config_name", ["tiny", "d2l_small"])
def test_torch_loads_nnx_weights_strictly_and_agrees(name, config_name):
    """NNX -> torch: the twin loads NNX's (randomised) weights strictly and computes the same."""
    config = CONFIGS[config_name]
    torch_cls, jax_cls = classes(name)
    jax_model = randomize_nnx(jax_cls(config, rngs=nnx.Rngs(2)), seed=2)
    jax_model.eval()
    torch_model = torch_cls(config).eval()
    state = convert.nnx_to_torch(jax_model)
    result = torch_model.load_state_dict({k: torch.tensor(v) for k, v in state.items()},
                                         strict=True)
    assert not result.missing_keys
    assert not result.unexpected_keys
    assert_state_equal(state, torch_state(torch_model))
    rng = np.random.RandomState(3)
    input_ids = rng.randint(0, config.vocab_size, (3, 7))
    attention_mask = make_attention_mask("right_padding", 3, 7)
    with torch.no_grad():
        expected = torch_model(torch.from_numpy(input_ids),
                               attention_mask=torch.from_numpy(attention_mask))
    got = jax_model(jnp.asarray(input_ids), attention_mask=jnp.asarray(attention_mask))
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    for e, g in zip(expected, got):
        where = attention_mask.astype(bool) if e.ndim == 3 else None
        assert_close(e, g, where=where)


def test_output_comparison_sees_a_transposed_square_weight():
    """The comparison above has power: a square weight loaded transposed (same shape, so no key
    or shape check can see it) moves the outputs far beyond the 1e-5 bound. With the N(0, 0.02)
    init the same bug moved the sequence output by only 1e-4 (measured): too thin a margin,
    hence the randomised weights."""
    jax_model = randomize_nnx(jb.BertModel(TINY, rngs=nnx.Rngs(2)), seed=2)
    state = convert.nnx_to_torch(jax_model)
    ids = torch.from_numpy(np.random.RandomState(3).randint(0, TINY.vocab_size, (3, 7)))
    outputs = []
    for transpose in (False, True):
        key = "encoder.layers.0.attention.query.weight"
        given = {**state, key: state[key].T.copy()} if transpose else state
        torch_model = tb.BertModel(TINY).eval()
        torch_model.load_state_dict({k: torch.tensor(v) for k, v in given.items()})
        with torch.no_grad():
            outputs.append(torch_model(ids))
    for right, wrong in zip(*outputs):
        assert max_rel_diff(right, wrong) > 1000 * FORWARD_RTOL


# ------------------------------------------------------------------------------------------------
# mismatches: a clear error, and nothing loaded


@pytest.fixture
def loaded_pair():
    torch.manual_seed(4)
    torch_model = tb.BertForPreTraining(TINY)
    jax_model = jb.BertForPreTraining(TINY, rngs=nnx.Rngs(4))
    convert.torch_to_nnx(torch_model.state_dict(), jax_model)
    return torch_model, jax_model


def shifted_state(torch_model) -> dict[str, np.ndarray]:
    """A state_dict whose every value differs from the loaded one: a partial load would show."""
    return {k: v + 1.0 for k, v in torch_state(torch_model).items()}


def assert_rejected_and_unchanged(jax_model, state, *needles):
    before = convert.nnx_to_torch(jax_model)
    with pytest.raises(StateDictMismatchError) as info:
        convert.torch_to_nnx(state, jax_model)
    message = str(info.value)
    assert "nothing was loaded" in message
    for needle in needles:
        assert needle in message, f"{needle!r} not in:\n{message}"
    assert_state_equal(before, convert.nnx_to_torch(jax_model))
    return message


def test_missing_key(loaded_pair):
    torch_model, jax_model = loaded_pair
    state = shifted_state(torch_model)
    del state["bert.pooler.dense.bias"]
    assert_rejected_and_unchanged(jax_model, state, "missing keys (1)", "bert.pooler.dense.bias")


def test_unexpected_key(loaded_pair):
    torch_model, jax_model = loaded_pair
    state = shifted_state(torch_model)
    state["bert.pooler.extra.weight"] = np.zeros((2, 2), np.float32)
    assert_rejected_and_unchanged(jax_model, state, "unexpected keys (1)",
                                  "bert.pooler.extra.weight")


def test_misshaped_key(loaded_pair):
    torch_model, jax_model = loaded_pair
    state = shifted_state(torch_model)
    state["bert.embeddings.word_embeddings.weight"] = np.zeros((98, 32), np.float32)
    assert_rejected_and_unchanged(jax_model, state, "mis-shaped keys (1)",
                                  "bert.embeddings.word_embeddings.weight: got (98, 32), "
                                  "expected (99, 32)")


def test_transposed_linear_weight_is_misshaped(loaded_pair):
    """Shapes are checked in torch layout: an [in, out] kernel where [out, in] belongs fails."""
    torch_model, jax_model = loaded_pair
    state = shifted_state(torch_model)
    key = "bert.encoder.layers.0.feed_forward.fc1.weight"
    state[key] = state[key].T.copy()
    assert_rejected_and_unchanged(jax_model, state, f"{key}: got (32, 37), expected (37, 32)")


def test_every_problem_listed_at_once(loaded_pair):
    torch_model, jax_model = loaded_pair
    state = shifted_state(torch_model)
    del state["nsp.classifier.weight"]
    del state["mlm.bias"]
    state["mlm.decoder.weight"] = np.zeros((99, 32), np.float32)
    state["nsp.classifier.bias"] = np.zeros((3,), np.float32)
    message = assert_rejected_and_unchanged(
        jax_model, state, "missing keys (2)", "mlm.bias", "nsp.classifier.weight",
        "unexpected keys (1)", "mlm.decoder.weight", "mis-shaped keys (1)",
        "nsp.classifier.bias: got (3,), expected (2,)")
    assert issubclass(StateDictMismatchError, ValueError)
    assert "BertForPreTraining" in message


def test_tied_state_into_untied_model_and_back():
    torch.manual_seed(5)
    untied_config = dataclasses.replace(TINY, tie_word_embeddings=False)
    tied_state = tb.BertForPreTraining(TINY).state_dict()
    untied_state = tb.BertForPreTraining(untied_config).state_dict()
    with pytest.raises(StateDictMismatchError, match=r"missing keys \(1\): mlm\.decoder\.weight"):
        convert.torch_to_nnx(tied_state, jb.BertForPreTraining(untied_config, rngs=nnx.Rngs(0)))
    with pytest.raises(StateDictMismatchError,
                       match=r"unexpected keys \(1\): mlm\.decoder\.weight"):
        convert.torch_to_nnx(untied_state, jb.BertForPreTraining(TINY, rngs=nnx.Rngs(0)))


def test_state_of_another_class_is_rejected():
    """A bare BertModel state lacks the ``bert.`` prefix the task models use."""
    torch.manual_seed(6)
    with pytest.raises(StateDictMismatchError, match="missing keys") as info:
        convert.torch_to_nnx(tb.BertModel(TINY).state_dict(),
                             jb.BertForSequenceClassification(TINY, rngs=nnx.Rngs(0)))
    assert "unexpected keys" in str(info.value)


def test_numpy_and_torch_inputs_load_alike():
    torch.manual_seed(7)
    torch_model = tb.BertModel(TINY)
    from_torch = convert.torch_to_nnx(torch_model.state_dict(), jb.BertModel(TINY,
                                                                             rngs=nnx.Rngs(0)))
    from_numpy = convert.torch_to_nnx(torch_state(torch_model),
                                      jb.BertModel(TINY, rngs=nnx.Rngs(1)))
    assert_state_equal(convert.nnx_to_torch(from_torch), convert.nnx_to_torch(from_numpy))


def test_loaded_model_does_not_alias_torch_memory():
    """Training the torch model after conversion must not change the NNX model."""
    torch.manual_seed(8)
    torch_model = tb.BertModel(TINY)
    jax_model = convert.torch_to_nnx(torch_model.state_dict(), jb.BertModel(TINY,
                                                                            rngs=nnx.Rngs(0)))
    before = convert.nnx_to_torch(jax_model)
    with torch.no_grad():
        for p in torch_model.parameters():
            p.add_(1.0)
    assert_state_equal(before, convert.nnx_to_torch(jax_model))


def test_unknown_leaf_is_refused():
    class Odd(nnx.Module):
        def __init__(self):
            self.gain = nnx.Param(jnp.ones(3))

    with pytest.raises(ValueError, match="leaf 'gain'"):
        convert.nnx_to_torch(Odd())
    with pytest.raises(ValueError, match="leaf 'gain'"):
        convert.torch_to_nnx({}, Odd())


# ------------------------------------------------------------------------------------------------
# values: only finite floating-point weights load


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool", "torch.int64", "torch.bool"])
def test_integer_and_boolean_tensors_are_refused(loaded_pair, dtype):
    """An int64 tensor of zeros used to load silently as a weight of zeros."""
    torch_model, jax_model = loaded_pair
    state = shifted_state(torch_model)
    key = "bert.pooler.dense.bias"
    zeros = np.zeros(state[key].shape, dtype.removeprefix("torch."))
    state[key] = torch.from_numpy(zeros) if dtype.startswith("torch.") else zeros
    assert_rejected_and_unchanged(jax_model, state, "non-floating keys (1)",
                                  f"{key} ({dtype.removeprefix('torch.')})")


def test_non_finite_weights_are_refused(loaded_pair):
    torch_model, jax_model = loaded_pair
    state = shifted_state(torch_model)
    state["mlm.bias"][3] = np.nan
    state["nsp.classifier.weight"][0, :2] = [np.inf, -np.inf]
    state["bert.embeddings.word_embeddings.weight"] = state[
        "bert.embeddings.word_embeddings.weight"].astype(np.int16)
    assert_rejected_and_unchanged(
        jax_model, state, "non-finite keys (2)", "mlm.bias (1 NaN, 0 infinite)",
        "nsp.classifier.weight (0 NaN, 2 infinite)", "non-floating keys (1)",
        "bert.embeddings.word_embeddings.weight (int16)")


def test_half_precision_weights_load(loaded_pair):
    """bfloat16 (numpy's ml_dtypes and torch's) and float16 are floating point: they load,
    upcast exactly to the model's float32."""
    import ml_dtypes

    torch_model, jax_model = loaded_pair
    state = shifted_state(torch_model)
    given = {}
    for n, (key, value) in enumerate(state.items()):
        kind = n % 3
        given[key] = (value.astype(ml_dtypes.bfloat16) if kind == 0 else
                      torch.from_numpy(value).to(torch.bfloat16) if kind == 1 else
                      value.astype(np.float16))
    convert.torch_to_nnx(given, jax_model)
    expected = {k: (v.float().numpy() if isinstance(v, torch.Tensor) else v.astype(np.float32))
                for k, v in given.items()}
    assert_state_equal(expected, convert.nnx_to_torch(jax_model))


def test_nnx_to_torch_gives_writable_copies():
    """``np.asarray`` of a JAX array is read-only: ``torch.from_numpy`` warned on it, and the
    README's transfer snippet with it. Now each array is a writable copy of its own."""
    jax_model = jb.BertForPreTraining(TINY, rngs=nnx.Rngs(0))
    state = convert.nnx_to_torch(jax_model)
    assert all(v.flags.writeable and v.flags.c_contiguous for v in state.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensors = {k: torch.from_numpy(v) for k, v in state.items()}
    torch_model = tb.BertForPreTraining(TINY)
    torch_model.load_state_dict(tensors, strict=True)
    before = {k: v.copy() for k, v in state.items()}
    for value in state.values():
        value += 1.0  # writing into the arrays must not reach the model
    assert_state_equal(before, convert.nnx_to_torch(jax_model))
