"""Bad input: a clear ``ValueError`` naming the problem, in both frameworks.

JAX clamps out-of-range gather indices where torch raises ``IndexError`` deep inside
``nn.Embedding``; either way a bad id would give a silently wrong answer or an obscure error, so
both twins validate at the public boundary (``jaxformer.validate``). Config errors are raised by
``BertConfig`` itself, before any model exists.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer import validate
from jaxformer.config import BertConfig, GPTConfig, TransformerConfig
from jaxformer.models import bert as jb
from parity_tests.support.helpers import twin_pair
from torch_ref.models import bert as tb

TINY = BertConfig.tiny()  # vocab 99, type_vocab 3, 64 positions
B, T = 3, 7  # the shape test_bert.py runs at: its compiled primitives are reused
FRAMEWORKS = ("jax", "torch")


@pytest.fixture(scope="module")
def models():
    torch_model, jax_model = twin_pair(tb.BertForPreTraining, jb.BertForPreTraining, TINY)
    return {"torch": torch_model, "jax": jax_model}


def call(models, framework, input_ids, token_type_ids=None, attention_mask=None,
         masked_positions=None):
    arrays = (input_ids, token_type_ids, attention_mask, masked_positions)
    if framework == "torch":
        with torch.no_grad():
            return models["torch"](*(None if a is None else torch.as_tensor(a) for a in arrays))
    return models["jax"](*(None if a is None else jnp.asarray(a) for a in arrays))


def good_ids():
    return np.random.RandomState(0).randint(0, TINY.vocab_size, (B, T))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_good_input_runs(models, framework):
    _, mlm, nsp = call(models, framework, good_ids(), np.zeros((B, T), np.int64),
                       np.ones((B, T), np.int64), np.zeros((B, 3), np.int64))
    assert tuple(mlm.shape) == (B, 3, TINY.vocab_size)
    assert tuple(nsp.shape) == (B, 2)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("bad", [-1, 99, 1000])
def test_token_id_out_of_vocabulary(models, framework, bad):
    ids = good_ids()
    ids[1, 3] = bad
    with pytest.raises(ValueError, match=rf"input_ids must lie in \[0, 99\); found {bad}"):
        call(models, framework, ids)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("bad", [-1, 3])
def test_segment_id_out_of_range(models, framework, bad):
    types = np.zeros((B, T), np.int64)
    types[0, -1] = bad
    with pytest.raises(ValueError, match=rf"token_type_ids must lie in \[0, 3\); found {bad}"):
        call(models, framework, good_ids(), types)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_sequence_longer_than_position_table(models, framework):
    ids = np.zeros((1, TINY.max_position_embeddings + 1), np.int64)
    with pytest.raises(ValueError, match=r"input_ids has length 65, longer than the position "
                                         r"table \(max_position_embeddings=64\)"):
        call(models, framework, ids)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("shape", [(B, T + 1), (B + 1, T), (T,), (B, 1, 1, T)])
def test_attention_mask_wrong_shape(models, framework, shape):
    with pytest.raises(ValueError, match=r"attention_mask (has|must have) shape .*\(3, 7\)"):
        call(models, framework, good_ids(), attention_mask=np.ones(shape, np.int64))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("shape", [(B, T - 1), (1, T)])
def test_token_type_ids_wrong_shape(models, framework, shape):
    with pytest.raises(ValueError, match=r"token_type_ids has shape .* but input_ids has shape"):
        call(models, framework, good_ids(), np.zeros(shape, np.int64))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_input_ids_wrong_rank(models, framework):
    with pytest.raises(ValueError, match=r"input_ids must have 2 dimensions, got shape \(7,\)"):
        call(models, framework, good_ids()[0])


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("bad", [-1, T, 50])
def test_masked_positions_out_of_range(models, framework, bad):
    positions = np.array([[0, 1], [2, 3], [4, bad]])
    with pytest.raises(ValueError, match=rf"masked_positions must lie in \[0, 7\); found {bad}"):
        call(models, framework, good_ids(), masked_positions=positions)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_masked_positions_wrong_batch_or_rank(models, framework):
    with pytest.raises(ValueError, match="masked_positions has batch size 4 but the sequence "
                                         "has batch size 3"):
        call(models, framework, good_ids(), masked_positions=np.zeros((4, 2), np.int64))
    with pytest.raises(ValueError, match=r"masked_positions must have 2 dimensions"):
        call(models, framework, good_ids(), masked_positions=np.zeros((B,), np.int64))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_tied_mlm_head_needs_word_embeddings(framework):
    if framework == "torch":
        head = tb.BertMLMHead(TINY)
        x = torch.zeros(B, T, TINY.hidden_size)
    else:
        head = jb.BertMLMHead(TINY, rngs=nnx.Rngs(0))
        x = jnp.zeros((B, T, TINY.hidden_size))
    with pytest.raises(ValueError, match="tied weights: pass word_embeddings"):
        head(x)


def test_shape_errors_are_raised_under_jit(models):
    """Shapes are static, so the checks still run inside ``nnx.jit``; values are checked on the
    host (``validate.check_ids``) before a jitted step."""
    forward = nnx.jit(lambda m, ids, mask: m(ids, attention_mask=mask))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        forward(models["jax"], jnp.asarray(good_ids()), jnp.ones((B, T + 1), jnp.int32))
    ids = good_ids()
    ids[0, 0] = 99
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 99\)"):
        validate.check_ids("input_ids", ids, TINY.vocab_size)


# ------------------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize(("hidden_size", "num_heads"), [(30, 4), (32, 5), (768, 7)])
def test_hidden_size_not_divisible_by_heads(hidden_size, num_heads):
    with pytest.raises(ValueError, match=rf"hidden_size \({hidden_size}\) is not divisible by "
                                         rf"num_heads \({num_heads}\)"):
        BertConfig(hidden_size=hidden_size, num_heads=num_heads)
    with pytest.raises(ValueError, match="not divisible"):
        dataclasses.replace(TINY, num_heads=num_heads, hidden_size=hidden_size)


@pytest.mark.parametrize("activation", ["swish", "GELU", "gelu_new", ""])
def test_bad_activation_name(activation):
    with pytest.raises(ValueError, match=rf"activation {activation!r} is not one of"):
        dataclasses.replace(TINY, activation=activation)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("num_layers", 0, "num_layers must be positive"),
    ("num_heads", 0, "num_heads must be positive"),
    ("vocab_size", 0, "vocab_size must be positive"),
    ("type_vocab_size", 0, "type_vocab_size must be positive"),
    ("max_position_embeddings", -1, "max_position_embeddings must be positive"),
    ("dropout_rate", 1.0, r"dropout_rate must be in \[0, 1\)"),
    ("attention_dropout_rate", -0.1, r"attention_dropout_rate must be in \[0, 1\)"),
    ("layer_norm_eps", 0.0, "layer_norm_eps must be positive"),
    ("dtype", "float64", "dtype 'float64' is not one of"),
    ("pad_token_id", 99, r"pad_token_id \(99\) is outside the vocabulary \[0, 99\)"),
    ("pad_token_id", -1, r"pad_token_id \(-1\) is outside the vocabulary"),
])
def test_other_config_errors(field, value, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **{field: value})


def test_config_is_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TINY.hidden_size = 64  # type: ignore[misc]
    assert hash(TINY) == hash(BertConfig.tiny())


@pytest.mark.parametrize("cls", [BertConfig, GPTConfig, TransformerConfig])
@pytest.mark.parametrize(("field", "value", "expected"), [
    ("hidden_size", 32.0, "int"), ("num_heads", "4", "int"), ("num_heads", True, "int"),
    ("layer_norm_eps", "1e-5", "float"), ("dropout_rate", None, "float"),
    ("activation", 3, "str"), ("attention_implementation", None, "str"),
])
def test_config_field_of_wrong_type_names_the_field(cls, field, value, expected):
    """A field of the wrong type is refused by the config itself with a ``TypeError`` naming the
    field (it used to fail deep inside a layer, or not at all for 32.0)."""
    with pytest.raises(TypeError, match=rf"{cls.__name__}: {field} must be {expected}, got"):
        dataclasses.replace(cls.tiny(), **{field: value})


def test_config_accepts_int_for_float_fields():
    assert dataclasses.replace(TINY, layer_norm_eps=1).layer_norm_eps == 1


@pytest.mark.parametrize("value", ["fast", "XLA", ""])
def test_bad_attention_implementation(value):
    with pytest.raises(ValueError, match=rf"attention_implementation {value!r} is not one of"):
        dataclasses.replace(TINY, attention_implementation=value)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_empty_sequence_is_refused(models, framework):
    """Sequence length 0 used to reach the pooler and fail with an opaque IndexError."""
    with pytest.raises(ValueError, match="input_ids has sequence length 0"):
        call(models, framework, np.zeros((2, 0), np.int64))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("argument", ["input_ids", "token_type_ids", "masked_positions"])
@pytest.mark.parametrize("dtype", [np.float32, np.bool_])
def test_non_integer_ids_name_the_argument(models, framework, argument, dtype):
    arrays = {"input_ids": good_ids(), "token_type_ids": np.zeros((B, T), np.int64),
              "attention_mask": None, "masked_positions": np.zeros((B, 2), np.int64)}
    arrays[argument] = arrays[argument].astype(dtype)
    with pytest.raises(TypeError, match=rf"{argument} must hold integer ids, got dtype "):
        call(models, framework, **arrays)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(("src_len", "tgt_len", "name"), [(0, 3, "src_ids"), (3, 0, "tgt_ids")])
def test_encoder_decoder_empty_sequences_are_refused(framework, src_len, tgt_len, name):
    """An empty source used to give finite logits from a decoder that attended to nothing."""
    from jaxformer.models import encoder_decoder as jed
    from torch_ref.models import encoder_decoder as ted

    config = TransformerConfig.tiny()
    src, tgt = np.ones((2, src_len), np.int64), np.ones((2, tgt_len), np.int64)
    torch_model, jax_model = twin_pair(ted.Transformer, jed.Transformer, config)
    if framework == "torch":
        model, src_in, tgt_in = torch_model, torch.as_tensor(src), torch.as_tensor(tgt)
    else:
        model, src_in, tgt_in = jax_model, jnp.asarray(src), jnp.asarray(tgt)
    with pytest.raises(ValueError, match=rf"{name} has sequence length 0"):
        model(src_in, tgt_in)
    if src_len == 0:
        memory = np.zeros((2, 0, config.hidden_size), np.float32)
        memory_in = torch.as_tensor(memory) if framework == "torch" else jnp.asarray(memory)
        with pytest.raises(ValueError, match="memory has source length 0"):
            model.decode(tgt_in, memory_in)
