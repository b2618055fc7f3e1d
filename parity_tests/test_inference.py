"""``jaxformer.inference`` against its twin ``torch_ref.inference`` (and against the models'
own logits): class probabilities, masked-token probabilities and pooled embeddings, on padded
batches with identical random weights. Bound: the forward bound (1e-5 of the output's scale)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxformer import inference as jax_inference
from jaxformer.config import BertConfig
from jaxformer.models import bert as jbert
from parity_tests.support.helpers import assert_close, twin_pair
from torch_ref import inference as torch_inference
from torch_ref.models import bert as tbert

CONFIG = BertConfig.tiny()


def padded_batch(rng, lengths, width):
    ids = rng.randint(5, CONFIG.vocab_size, (len(lengths), width)).astype(np.int32)
    mask = (np.arange(width)[None] < np.array(lengths)[:, None]).astype(np.int32)
    return np.where(mask == 1, ids, 0), np.zeros_like(ids), mask


@pytest.fixture(scope="module")
def classifier():
    return twin_pair(tbert.BertForSequenceClassification, jbert.BertForSequenceClassification,
                     CONFIG, seed=3, randomized=True)


@pytest.fixture(scope="module")
def pretraining():
    return twin_pair(tbert.BertForPreTraining, jbert.BertForPreTraining, CONFIG, seed=4,
                     randomized=True)


def test_class_probabilities_match(classifier):
    torch_model, jax_model = classifier
    ids, types, mask = padded_batch(np.random.RandomState(0), [9, 4, 1], 12)
    ours = jax_inference.BertInference(jax_model).class_probabilities(ids, types, mask)
    twin = torch_inference.BertInference(torch_model).class_probabilities(ids, types, mask)
    assert ours.shape == (3, CONFIG.num_labels)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours.sum(-1), 1.0, atol=1e-6)
    assert_close(twin, ours, what="class probabilities")
    # The softmax of the model's own logits, and padding does not change a row's result.
    logits = np.asarray(jax_model(ids, types, mask), np.float64)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    assert_close(expected / expected.sum(-1, keepdims=True), ours, what="softmax of logits")
    alone = jax_inference.BertInference(jax_model).class_probabilities(
        ids[1:2, :4], types[1:2, :4], mask[1:2, :4])
    assert_close(alone, ours[1:2], what="one text alone vs padded in a batch")


def test_masked_token_probabilities_match(pretraining):
    torch_model, jax_model = pretraining
    ids, types, mask = padded_batch(np.random.RandomState(1), [10, 6], 10)
    positions = np.array([[2, 7], [1, 1]], np.int32)
    ours = jax_inference.BertInference(jax_model).masked_token_probabilities(
        ids, types, mask, positions)
    twin = torch_inference.BertInference(torch_model).masked_token_probabilities(
        ids, types, mask, positions)
    assert ours.shape == (2, 2, CONFIG.vocab_size)
    np.testing.assert_allclose(ours.sum(-1), 1.0, atol=1e-5)
    assert_close(twin, ours, what="masked-token probabilities")
    _, logits, _ = jax_model(ids, types, mask, positions)
    logits = np.asarray(logits, np.float64)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    assert_close(expected / expected.sum(-1, keepdims=True), ours, what="softmax of MLM logits")


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
@pytest.mark.parametrize("normalize", [False, True])
def test_sentence_embeddings_match(classifier, pooling, normalize):
    torch_model, jax_model = classifier
    ids, types, mask = padded_batch(np.random.RandomState(2), [7, 3], 8)
    ours = jax_inference.BertInference(jax_model).sentence_embeddings(
        ids, types, mask, pooling, normalize)
    twin = torch_inference.BertInference(torch_model).sentence_embeddings(
        ids, types, mask, pooling, normalize)
    assert ours.shape == (2, CONFIG.hidden_size)
    assert_close(twin, ours, what=f"{pooling} pooling")
    hidden, _ = jax_model.bert(ids, types, mask)
    hidden = np.asarray(hidden, np.float64)
    real = mask[..., None].astype(bool)
    expected = {"mean": (hidden * real).sum(1) / real.sum(1), "cls": hidden[:, 0],
                "max": np.where(real, hidden, -np.inf).max(1)}[pooling]
    if normalize:
        expected = expected / np.linalg.norm(expected, axis=-1, keepdims=True)
    assert_close(expected, ours, what=f"{pooling} pooling vs numpy")


@pytest.mark.parametrize("side", [jax_inference, torch_inference])
def test_refusals(side, classifier):
    model = classifier[0] if side is torch_inference else classifier[1]
    ids, types, mask = padded_batch(np.random.RandomState(3), [3], 4)
    with pytest.raises(ValueError, match="has no masked-LM head"):
        side.BertInference(model).masked_token_probabilities(ids, types, mask,
                                                             np.zeros((1, 1), np.int32))
    with pytest.raises(ValueError, match="pooling must be one of"):
        side.BertInference(model).sentence_embeddings(ids, types, mask, "median")
    with pytest.raises(ValueError, match="input_ids"):
        side.BertInference(model).class_probabilities(ids + CONFIG.vocab_size, types, mask)
