"""Bad arguments to ``generate`` raise a clear error naming the problem, the same in both twins,
before anything is computed (issue 9, item 6, and a few more)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from jaxformer.generation import generate as jax_generate
from jaxformer.models import encoder_decoder as jed
from jaxformer.models import gpt as jgpt
from parity_tests.support.generation import GPT_PRE_LN, SEQ2SEQ_POST_LN, model_pair
from parity_tests.support.helpers import twin_pair
from torch_ref.generation import generate as torch_generate
from torch_ref.models import encoder_decoder as ted
from torch_ref.models import gpt as tgpt

IDS = np.array([[5, 6, 7], [8, 9, 10]])
MASK = np.array([[1, 1, 1], [0, 1, 1]])

GPT_CASES = {  # name: (generate arguments, expected message)
    "overruns_position_table": (dict(max_new_tokens=62),
                                r"reach 65 tokens, more than the position table holds "
                                r"\(max_position_embeddings=64\)"),
    "empty_prompt": (dict(input_ids=np.zeros((2, 0), np.int64), attention_mask=None),
                     r"input_ids is empty \(shape \(2, 0\)\)"),
    "empty_batch": (dict(input_ids=np.zeros((0, 3), np.int64), attention_mask=None),
                    r"input_ids is empty"),
    "row_of_only_padding": (dict(attention_mask=np.array([[1, 1, 1], [0, 0, 0]])),
                            r"attention_mask row\(s\) \[1\] hold only padding"),
    "num_beams_0": (dict(num_beams=0), r"num_beams must be an integer >= 1, got 0"),
    "top_p_0": (dict(do_sample=True, top_p=0.0), r"top_p must lie in \(0, 1\], got 0.0"),
    "top_p_above_1": (dict(do_sample=True, top_p=1.5), r"top_p must lie in \(0, 1\], got 1.5"),
    "temperature_0": (dict(do_sample=True, temperature=0.0),
                      r"temperature must be > 0 when sampling, got 0.0"),
    "temperature_negative": (dict(do_sample=True, temperature=-1.0),
                             r"temperature must be > 0 when sampling"),
    "eos_outside_vocab": (dict(eos_token_id=101),
                          r"eos_token_id \(101\) is outside the vocabulary \[0, 101\)"),
    "eos_negative_in_list": (dict(eos_token_id=[3, -1]),
                             r"eos_token_id \(-1\) is outside the vocabulary"),
    "pad_outside_vocab": (dict(pad_token_id=500), r"pad_token_id \(500\) is outside"),
    "max_new_tokens_0": (dict(max_new_tokens=0), r"max_new_tokens must be a positive integer"),
    "top_k_negative": (dict(do_sample=True, top_k=-1), r"top_k must be an integer >= 0"),
    "early_stopping_word": (dict(num_beams=2, early_stopping="always"),
                            r"early_stopping must be False, True or 'never'"),
    "ids_outside_vocab": (dict(input_ids=np.array([[5, 101, 7]]), attention_mask=None),
                          r"input_ids must lie in \[0, 101\); found 101"),
    "mask_shape": (dict(attention_mask=np.ones((2, 4), np.int64)),
                   r"attention_mask has shape \(2, 4\) but input_ids has shape \(2, 3\)"),
    "start_token_for_gpt": (dict(decoder_start_token_id=1),
                            r"decoder_start_token_id is for encoder-decoder models"),
    "streaming_beams": (dict(num_beams=2, streamer=print), r"streaming needs num_beams=1"),
}


def call(generate, model, wrap, case: dict):
    args = dict(input_ids=IDS, attention_mask=MASK, max_new_tokens=4) | case
    ids, mask = args.pop("input_ids"), args.pop("attention_mask")
    return generate(model, wrap(ids), None if mask is None else wrap(mask), **args)


@pytest.mark.parametrize("name", GPT_CASES)
def test_gpt_bad_input(name):
    torch_model, jax_model = model_pair(tgpt.GPT, jgpt.GPT, GPT_PRE_LN)
    case, message = GPT_CASES[name]
    messages = []
    for generate, model, wrap in ((jax_generate, jax_model, np.asarray),
                                  (torch_generate, torch_model, torch.tensor)):
        with pytest.raises(ValueError, match=message) as error:
            call(generate, model, wrap, case)
        messages.append(str(error.value))
    assert messages[0] == messages[1], "both twins give the same message"


SEQ2SEQ_CASES = {
    "no_decoder_start_token_id": (dict(decoder_start_token_id=None),
                                  r"an encoder-decoder model needs decoder_start_token_id"),
    "start_outside_vocab": (dict(decoder_start_token_id=29),
                            r"decoder_start_token_id \(29\) is outside the vocabulary \[0, 29\)"),
    "target_overruns_position_table": (dict(max_new_tokens=64),
                                       r"needs 65 target positions, more than the position "
                                       r"table holds \(max_position_embeddings=64\)"),
    "source_of_only_padding": (dict(input_ids=np.array([[3, 4], [0, 0]]), attention_mask=None),
                               r"input_ids row\(s\) \[1\] hold only src_pad_id \(0\)"),
    "eos_outside_target_vocab": (dict(eos_token_id=29), r"eos_token_id \(29\) is outside"),
    "forced_eos_outside_vocab": (dict(forced_eos_token_id=[3, 29]),
                                 r"forced_eos_token_id \(29\) is outside"),
    "forced_bos_list": (dict(forced_bos_token_id=[3]),
                        r"forced_bos_token_id must be one token id, got \[3\]"),
    "bad_words_of_two_tokens": (dict(bad_words_ids=[[3], [4, 5]]),
                                r"only single-token bad words are implemented, got \[\[4, 5\]\]"),
    "bad_words_not_lists": (dict(bad_words_ids=[3]),
                            r"bad_words_ids must be a list of token-id lists"),
    "max_length_and_max_new_tokens": (dict(max_length=5),
                                      r"give max_new_tokens or max_length, not both"),
    "max_length_leaves_nothing": (dict(max_new_tokens=None, max_length=1),
                                  r"max_length must be an integer above the decoder start "
                                  r"token \(1\), got 1"),
    "no_length": (dict(max_new_tokens=None), r"generate needs max_new_tokens \(or max_length\)"),
}


@pytest.mark.parametrize("name", SEQ2SEQ_CASES)
def test_encoder_decoder_bad_input(name):
    torch_model, jax_model = model_pair(ted.Transformer, jed.Transformer, SEQ2SEQ_POST_LN)
    case, message = SEQ2SEQ_CASES[name]
    case = dict(decoder_start_token_id=1, attention_mask=None) | case
    for generate, model, wrap in ((jax_generate, jax_model, np.asarray),
                                  (torch_generate, torch_model, torch.tensor)):
        with pytest.raises(ValueError, match=message):
            call(generate, model, wrap, case)


def test_only_gpt_and_encoder_decoder_generate():
    from jaxformer.config import BertConfig
    from torch_ref.models.bert import BertModel
    with pytest.raises(TypeError, match="generate needs a GPT or an encoder-decoder"):
        torch_generate(BertModel(BertConfig.tiny()), IDS, max_new_tokens=2)


@pytest.mark.parametrize("family", ["gpt", "encoder_decoder"])
def test_training_mode_with_dropout_is_refused(family):
    """A model left in training mode would drop activations while generating (torch) or fail on
    its dropout's random stream inside the compiled loop (flax): both twins refuse it by name.
    Training mode with every dropout rate at 0 computes what eval mode does, and is accepted."""
    classes, config, case = {
        "gpt": ((tgpt.GPT, jgpt.GPT), GPT_PRE_LN, {}),
        "encoder_decoder": ((ted.Transformer, jed.Transformer), SEQ2SEQ_POST_LN,
                            dict(decoder_start_token_id=1, attention_mask=None)),
    }[family]
    rates = dict(dropout_rate=0.1, attention_dropout_rate=0.0)
    torch_model, jax_model = twin_pair(*classes, dataclasses.replace(config, **rates))
    torch_model.train()
    jax_model.train()
    messages = []
    for generate, model, wrap in ((jax_generate, jax_model, np.asarray),
                                  (torch_generate, torch_model, torch.tensor)):
        with pytest.raises(ValueError, match=r"generate needs the model in evaluation mode: "
                                             r"it is in training mode with dropout active; "
                                             r"call model.eval\(\) first") as error:
            call(generate, model, wrap, case)
        messages.append(str(error.value))
    assert messages[0] == messages[1]

    no_dropout = dataclasses.replace(config, dropout_rate=0.0, attention_dropout_rate=0.0)
    torch_model, jax_model = twin_pair(*classes, no_dropout)
    tokens = [np.asarray(call(jax_generate, jax_model, np.asarray, case)),
              call(torch_generate, torch_model, torch.tensor, case).numpy()]
    torch_model.train()
    jax_model.train()
    np.testing.assert_array_equal(np.asarray(call(jax_generate, jax_model, np.asarray, case)),
                                  tokens[0])
    np.testing.assert_array_equal(call(torch_generate, torch_model, torch.tensor, case).numpy(),
                                  tokens[1])


def test_torch_generation_records_no_gradients():
    """The torch twin generates under ``torch.no_grad`` (its cached tensors are written in place
    and never differentiated): every step, as the streamer sees it, runs with gradients off, even
    when the caller has them on."""
    torch_model = model_pair(tgpt.GPT, jgpt.GPT, GPT_PRE_LN)[0]
    seen = []
    assert torch.is_grad_enabled()
    torch_generate(torch_model, torch.tensor(IDS[:1]), max_new_tokens=3,
                   streamer=lambda tokens: seen.append(torch.is_grad_enabled()))
    assert seen == [False, False, False]
