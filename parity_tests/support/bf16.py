"""The bfloat16 tests' models, inputs and losses, and their bound.

``FAMILIES`` (torch class, JAX class, tiny config per family), ``INNER`` (hidden states that must
be in the compute dtype), ``inputs``, ``loss_labels``, ``loss`` and ``as_tuple`` serve
``models/test_bf16.py``, ``models/test_autocast.py`` and ``support/autocast.py`` (so
``benchmarks/bf16_error.py``); ``BF16_BOUND`` serves ``models/test_bf16.py`` and ``test_gpu.py``.
"""

from __future__ import annotations

import numpy as np

from jaxformer.config import BertConfig, GPTConfig, TransformerConfig
from jaxformer.models import bert as jb
from jaxformer.models import encoder_decoder as jed
from jaxformer.models import gpt as jg
from torch_ref.models import bert as tb
from torch_ref.models import encoder_decoder as ted
from torch_ref.models import gpt as tg

BF16_BOUND = 5e-2  # scale-relative, against float32 (see the measurement in models/test_bf16.py)
B, T, S = 3, 7, 8

FAMILIES = {
    "bert": (tb.BertForPreTraining, jb.BertForPreTraining, BertConfig.tiny()),
    "gpt": (tg.GPT, jg.GPT, GPTConfig.tiny()),
    "encoder_decoder": (ted.Transformer, jed.Transformer, TransformerConfig.tiny()),
}
# Hidden states inside each model, which must be in the compute dtype (the logits alone could be
# bfloat16 because of the output projection): BERT's sequence output, GPT's hidden states, the
# encoder-decoder's memory.
INNER = {
    "bert": lambda m, a: m.bert(a["input_ids"], attention_mask=a["attention_mask"])[0],
    "gpt": lambda m, a: m.hidden_states(a["input_ids"], a["attention_mask"]),
    "encoder_decoder": lambda m, a: m.encode(a["src_ids"], a["src_mask"]),
}


def inputs(family: str) -> dict[str, np.ndarray]:
    rng = np.random.RandomState(0)
    mask = np.ones((B, T), np.int64)
    mask[1, 5:] = 0  # right padding in one row
    if family == "bert":
        return {"input_ids": rng.randint(1, 99, (B, T)), "attention_mask": mask}
    if family == "gpt":
        return {"input_ids": rng.randint(1, 101, (B, T)), "attention_mask": mask}
    src_mask = np.ones((B, S), np.int64)
    src_mask[2, 6:] = 0
    return {"src_ids": rng.randint(1, 23, (B, S)), "tgt_ids": rng.randint(1, 29, (B, T)),
            "src_mask": src_mask, "tgt_mask": mask}


def loss_labels(family: str, args: dict) -> dict[str, np.ndarray]:
    """The labels of the family's training loss (besides the inputs), at real positions."""
    rng = np.random.RandomState(1)
    if family == "bert":
        mask = args["attention_mask"].astype(bool)
        chosen = mask & (rng.rand(*mask.shape) < 0.4)
        mlm = np.where(chosen, rng.randint(1, 99, mask.shape), -100)
        return {"mlm_labels": mlm, "nsp_labels": rng.randint(0, 2, mask.shape[0])}
    if family == "encoder_decoder":
        mask = args["tgt_mask"].astype(bool)
        return {"labels": np.where(mask, rng.randint(1, 29, mask.shape), -100)}
    return {}


def loss(family: str, losses, outputs, args, labels):
    """The family's training loss from its outputs; ``losses``: either framework's module."""
    if family == "bert":
        return (losses.masked_lm_loss(outputs[1], labels["mlm_labels"])
                + losses.next_sentence_loss(outputs[2], labels["nsp_labels"]))
    if family == "gpt":
        return losses.causal_lm_loss(outputs[0], args["input_ids"], args["attention_mask"])
    return losses.seq2seq_loss(outputs[0], labels["labels"])


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)
