"""The sequence-to-sequence task (key ``transformer``): the encoder-decoder Transformer.

``SOURCE<TAB>TARGET`` lines (without tabs, each line is the source of the next) become source
``tokens [SEP]``, decoder input ``[CLS] target`` and labels ``target [SEP]``
(:func:`seq2seq_arrays`, which ``training.synthetic`` uses too). Defaults as the paper's:
inverse_sqrt schedule, label smoothing 0.1.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from jaxformer import validate
from jaxformer.config import TransformerConfig
from jaxformer.training import data
from jaxformer.training.config import IGNORE_INDEX
from jaxformer.training.data import Dataset, check_labels
from jaxformer.training.tasks.base import Task
from jaxformer.training.vocab import DataError


def seq2seq_arrays(src, tgt, seq_len: int, specials: dict[str, int]) -> dict[str, np.ndarray]:
    """The ``transformer`` arrays of (source ids, target ids) pairs, each cut to ``seq_len - 1``
    tokens: source ``s [SEP]``, decoder input ``[CLS] t``, labels ``t [SEP]`` (-100 at padding),
    masks 1 on real tokens."""
    T = seq_len
    pad, bos, eos = specials["[PAD]"], specials["[CLS]"], specials["[SEP]"]
    src_ids = data.pad([np.append(s[: T - 1], eos) for s in src], T, pad)
    tgt_ids = data.pad([np.concatenate([[bos], t[: T - 1]]) for t in tgt], T, pad)
    labels = data.pad([np.append(t[: T - 1], eos) for t in tgt], T, IGNORE_INDEX)
    src_len = np.array([min(len(s), T - 1) + 1 for s in src])
    tgt_len = np.array([min(len(t), T - 1) + 1 for t in tgt])
    src_mask = (np.arange(T)[None] < src_len[:, None]).astype(np.int32)
    tgt_mask = (np.arange(T)[None] < tgt_len[:, None]).astype(np.int32)
    return {"src_ids": src_ids, "src_mask": src_mask, "tgt_ids": tgt_ids, "tgt_mask": tgt_mask,
            "labels": labels}


@dataclass(frozen=True)
class Seq2Seq(Task):
    def make_datasets(self, text, tokenizer, config, specials, eval_fraction):
        T, lines = config.seq_len, [line for line in text.splitlines() if line.strip()]
        if any("\t" in line for line in lines):
            bad = [n for n, line in enumerate(lines, 1) if "\t" not in line]
            if bad:
                raise DataError(f"transformer data with tabs needs SOURCE<TAB>TARGET on every "
                                f"line; non-empty line {bad[0]} has no tab")
            pairs = [line.split("\t", 1) for line in lines]
        else:
            pairs = list(itertools.pairwise(lines))
        if not pairs:
            raise DataError("the data file is too short: transformer training needs at least one "
                            "SOURCE<TAB>TARGET line or two lines")
        arrays = seq2seq_arrays(data.encode(tokenizer, [s for s, _ in pairs]),
                                data.encode(tokenizer, [t for _, t in pairs]), T, specials)
        train, held = data.split(len(pairs), eval_fraction)

        def dataset(subset, stream_id):
            def make(indices, rngs):
                pick = subset[indices]
                return {key: value[pick] for key, value in arrays.items()}
            return Dataset(self.name, len(subset), make, config, tokens_per_example=2 * T,
                           stream=stream_id)

        return dataset(train, 0), (dataset(held, 1) if len(held) else None)

    def check_values(self, batch, model_config):
        validate.check_ids("src_ids", batch["src_ids"], model_config.src_vocab_size)
        validate.check_ids("tgt_ids", batch["tgt_ids"], model_config.tgt_vocab_size)
        check_labels("labels", batch["labels"], model_config.tgt_vocab_size)

    def step_flops(self, model_config, config):
        try:
            from jaxformer.models import flops
        except ImportError:
            return None
        T = config.seq_len
        return flops.train_step_flops(model_config, config.batch_size, T, T)


SEQ2SEQ = Seq2Seq(
    name="transformer", config_class=TransformerConfig, model_module="models.encoder_decoder",
    model="Transformer", loss="seq2seq_batch_loss",
    batch_keys=("src_ids", "src_mask", "tgt_ids", "tgt_mask", "labels"),
    needed_specials=("[PAD]", "[CLS]", "[SEP]"),
    vocab_fields=("tgt_vocab_size", "src_vocab_size"), pad_fields=("src_pad_id", "tgt_pad_id"),
    default_schedule="inverse_sqrt", default_label_smoothing=0.1, hf_export=True)
