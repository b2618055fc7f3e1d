"""The classification task (key ``classifier``): BERT with a classifier on the pooled ``[CLS]``.

The data file holds ``LABEL<TAB>TEXT`` lines; the labels are the distinct strings, sorted, and
each example is ``[CLS] text [SEP]`` cut to ``seq_len``. The datasets carry ``label_names``,
which ``run.json`` records so that a resumed or exported run keeps the same classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxformer.config import BertConfig
from jaxformer.training import data
from jaxformer.training.data import Dataset, check_labels
from jaxformer.training.tasks.base import Task
from jaxformer.training.vocab import DataError


@dataclass(frozen=True)
class Classification(Task):
    def make_datasets(self, text, tokenizer, config, specials, eval_fraction):
        T, rows = config.seq_len, []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            if "\t" not in line:
                raise DataError(f"classifier data needs LABEL<TAB>TEXT lines; line {number} has no "
                                f"tab: {line[:60]!r}")
            label, sentence = line.split("\t", 1)
            rows.append((label.strip(), sentence))
        names = sorted({label for label, _ in rows})
        ids = [np.concatenate([[specials["[CLS]"]], s[: T - 2], [specials["[SEP]"]]])
               for s in data.encode(tokenizer, [sentence for _, sentence in rows])]
        input_ids = data.pad(ids, T, specials["[PAD]"])
        labels = np.array([names.index(label) for label, _ in rows], np.int32)
        mask = (np.arange(T)[None] < np.array([len(i) for i in ids])[:, None]).astype(np.int32)
        train, held = data.split(len(rows), eval_fraction)

        def dataset(subset, stream_id):
            def make(indices, rngs):
                pick = subset[indices]
                return {"input_ids": input_ids[pick],
                        "token_type_ids": np.zeros_like(input_ids[pick]),
                        "attention_mask": mask[pick], "labels": labels[pick]}
            out = Dataset(self.name, len(subset), make, config, tokens_per_example=T,
                          num_labels=len(names), stream=stream_id)
            out.label_names = names
            return out

        return dataset(train, 0), (dataset(held, 1) if len(held) else None)

    def check_values(self, batch, model_config):
        super().check_values(batch, model_config)
        check_labels("labels", batch["labels"], model_config.num_labels)


CLASSIFICATION = Classification(
    name="classifier", config_class=BertConfig, model_module="models.bert",
    model="BertForSequenceClassification", loss="classification_batch_loss",
    accuracy="classification_batch_accuracy",
    batch_keys=("input_ids", "token_type_ids", "attention_mask", "labels"),
    needed_specials=("[PAD]", "[CLS]", "[SEP]"), flops_model="BertForSequenceClassification",
    hf_export=True)
