"""The BERT pre-training task (key ``bert``): masked LM plus next-sentence prediction.

One of the Tasks of ``jaxformer.training.tasks`` (framework-free): BERT's
``create_pretraining_data.py`` recipe as a dataset builder, its batch check, and the names of its
model (``BertForPreTraining``) and loss (``pretraining_batch_loss``) in each framework.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxformer import validate
from jaxformer.config import BertConfig
from jaxformer.training import data
from jaxformer.training.config import IGNORE_INDEX
from jaxformer.training.data import Dataset, check_labels
from jaxformer.training.tasks.base import Task
from jaxformer.training.vocab import DataError


@dataclass(frozen=True)
class BertPretraining(Task):
    """Each line of the data file is a sentence, blank lines separate documents. Example ``i`` is
    sentence ``i`` as sentence A; half the time B is the next sentence of its document (NSP label
    0), else a random sentence (label 1): ``[CLS] A [SEP] B [SEP]``, longest first truncated. As
    BERT's ``create_pretraining_data.py``: ``min(max_predictions, max(1, round(0.15 * length)))``
    positions (``length`` counts ``[CLS]`` and ``[SEP]``, ``0.15`` is ``mlm_probability``, ``round``
    halves to even as Python 3's) are drawn uniformly among the real non-special tokens; 80% of
    those become ``[MASK]``, 10% a random non-special token, 10% stay. ``masked_positions (B, P)``
    lists them in ascending order, ``P = min(max_predictions, seq_len)``, padded with index 0 and
    label -100, and ``mlm_labels (B, P)`` holds their original ids, so the MLM head runs at ``P``
    positions only. ``max_predictions = 0`` keeps dense labels instead: each real non-special token
    is chosen with probability 0.15, ``mlm_labels (B, T)`` and ``masked_positions`` is every
    position."""

    def make_datasets(self, text, tokenizer, config, specials, eval_fraction):
        T = config.seq_len
        if T < 5:
            raise DataError(f"bert needs seq_len >= 5 ([CLS] A [SEP] B [SEP]), got {T}")
        sentences, documents, doc = [], [], 0
        for line in text.splitlines():
            if line.strip():
                sentences.append(line.strip())
                documents.append(doc)
            else:
                doc += 1
        ids = data.encode(tokenizer, sentences)
        documents = np.array(documents)
        cls, sep, mask_id, pad = (specials[k] for k in ("[CLS]", "[SEP]", "[MASK]", "[PAD]"))
        special = np.array(sorted(specials.values()))
        vocab = tokenizer.get_vocab_size()
        ordinary = np.setdiff1d(np.arange(vocab), special)  # what a random replacement draws from
        train, held = data.split(len(sentences), eval_fraction)

        def pack(a, b):
            a, b = list(a), list(b)
            while len(a) + len(b) > T - 3:  # longest first
                (a if len(a) >= len(b) else b).pop()
            tokens = [cls, *a, sep, *b, sep]
            types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
            return tokens, types

        def choose(input_ids, attention_mask, candidates, rng):
            """One row: -> ``chosen (T,)`` (the tokens to predict), ``masked_positions``,
            ``mlm_labels``."""
            if not config.max_predictions:  # dense: every position carries a label or -100
                chosen = candidates & (rng.random(T) < config.mlm_probability)
                positions = np.arange(T, dtype=np.int32)
                return chosen, positions, np.where(chosen, input_ids, IGNORE_INDEX).astype(np.int32)
            P = min(config.max_predictions, T)
            n = min(P, max(1, round(attention_mask.sum() * config.mlm_probability)),
                    candidates.sum())
            chosen = np.zeros_like(candidates)
            positions = np.zeros(P, np.int32)
            mlm_labels = np.full(P, IGNORE_INDEX, np.int32)
            picked = np.sort(rng.choice(np.flatnonzero(candidates), n, replace=False))
            chosen[picked] = True
            positions[:n] = picked
            mlm_labels[:n] = input_ids[picked]
            return chosen, positions, mlm_labels

        def dataset(subset, stream_id):
            def make(indices, rngs):
                # each row draws from its own generator (data.RowGenerators), in this order:
                # the NSP partner, the positions to predict, their replacement
                gens = [rngs[r] for r in range(len(indices))]
                rows, type_rows, nsp = [], [], []
                for k, rng in zip(indices, gens):
                    i = subset[k]
                    follows = k + 1 < len(subset) and documents[subset[k + 1]] == documents[i]
                    if follows and rng.random() < 0.5:
                        j, label = subset[k + 1], 0
                    else:
                        j, label = subset[rng.integers(len(subset))], 1
                    tokens, types = pack(ids[i], ids[j])
                    rows.append(np.array(tokens))
                    type_rows.append(np.array(types))
                    nsp.append(label)
                input_ids = data.pad(rows, T, pad)
                attention_mask = (input_ids != pad).astype(np.int32)
                candidates = attention_mask.astype(bool) & ~np.isin(input_ids, special)
                replaced, positions, mlm_labels = [], [], []
                for r, rng in enumerate(gens):
                    chosen, where, labels = choose(input_ids[r], attention_mask[r],
                                                   candidates[r], rng)
                    roll = rng.random(T)
                    row = np.where(chosen & (roll < 0.8), mask_id, input_ids[r])
                    random_tokens = rng.choice(ordinary, size=T) if len(ordinary) else pad
                    replaced.append(np.where(chosen & (roll >= 0.8) & (roll < 0.9),
                                             random_tokens, row))
                    positions.append(where)
                    mlm_labels.append(labels)
                return {"input_ids": np.stack(replaced).astype(np.int32),
                        "token_type_ids": data.pad(type_rows, T, 0),
                        "attention_mask": attention_mask,
                        "masked_positions": np.stack(positions),
                        "mlm_labels": np.stack(mlm_labels),
                        "nsp_labels": np.array(nsp, np.int32)}
            return Dataset(self.name, len(subset), make, config, tokens_per_example=T,
                           stream=stream_id)

        return dataset(train, 0), (dataset(held, 1) if len(held) else None)

    def check_values(self, batch, model_config):
        super().check_values(batch, model_config)
        positions, labels = batch["masked_positions"], batch["mlm_labels"]
        if tuple(positions.shape[:-1]) != tuple(batch["input_ids"].shape[:-1]):
            raise DataError(f"masked_positions has shape {tuple(positions.shape)} but input_ids "
                            f"{tuple(batch['input_ids'].shape)}: one row of positions per row")
        if tuple(labels.shape) != tuple(positions.shape):
            raise DataError(f"mlm_labels has shape {tuple(labels.shape)} but masked_positions "
                            f"{tuple(positions.shape)}: one label per masked position")
        validate.check_ids("masked_positions", positions, batch["input_ids"].shape[-1])
        check_labels("mlm_labels", labels, model_config.vocab_size)
        check_labels("nsp_labels", batch["nsp_labels"], 2)


BERT_PRETRAINING = BertPretraining(
    name="bert", config_class=BertConfig, model_module="models.bert",
    model="BertForPreTraining", loss="pretraining_batch_loss",
    batch_keys=("input_ids", "token_type_ids", "attention_mask", "masked_positions",
                "mlm_labels", "nsp_labels"),
    needed_specials=("[PAD]", "[CLS]", "[SEP]", "[MASK]"), flops_model="BertForPreTraining",
    hf_export=True)
