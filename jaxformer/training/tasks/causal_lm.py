"""The causal language-model task (key ``gpt``): a GPT learns to predict each next token.

One of the Tasks of ``jaxformer.training.tasks`` (framework-free): its dataset builder and batch
check, and the names of its model (``GPT``) and loss (``causal_lm_batch_loss``) in each framework.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxformer.config import GPTConfig
from jaxformer.training import data
from jaxformer.training.data import Dataset, RandomWindows, check_labels
from jaxformer.training.tasks.base import Task
from jaxformer.training.vocab import DataError, encode_chars, is_char_tokenizer

END_OF_TEXT = "<|endoftext|>"  # GPT-2's one special token: its documents' separator


@dataclass(frozen=True)
class CausalLM(Task):
    """The data file's lines, each followed by ``[SEP]`` (end of line), concatenated into one token
    stream; with a character tokenizer (``vocab.char_tokenizer``) the stream is the raw text,
    newlines included, as nanoGPT's ``shakespeare_char``. ``gpt_windows="packed"`` cuts the stream
    into windows of ``seq_len`` tokens and the loss predicts each next token of a window
    (``seq_len - 1`` predictions); ``"random"`` is nanoGPT's ``get_batch``
    (``data.RandomWindows``): ``seq_len + 1`` tokens at random offsets, ``input_ids`` the first
    ``seq_len``, ``labels`` the last ``seq_len``. Every window is full, so a batch carries no
    ``attention_mask``: the model's causal mask is then a constant when it is traced, which lets
    cuDNN's attention run as its causal type without a conditional (``nn.attention``); a batch
    given one (padded text) is read with it."""

    def special_ids(self, tokenizer) -> dict[str, int]:
        """None with a character tokenizer (its stream is the raw text, with no ``[SEP]``). A
        tokenizer without ``[SEP]`` but with GPT-2's ``<|endoftext|>`` (a Hugging Face GPT-2
        directory, ``--init-from``) ends each line with that token instead."""
        if is_char_tokenizer(tokenizer):
            return {}
        end = tokenizer.token_to_id(END_OF_TEXT)
        if tokenizer.token_to_id("[SEP]") is None and end is not None:
            return {"[SEP]": end}
        return super().special_ids(tokenizer)

    def make_datasets(self, text, tokenizer, config, specials, eval_fraction):
        T = config.seq_len
        if is_char_tokenizer(tokenizer):
            stream = encode_chars(tokenizer, text)
        else:
            stream = np.concatenate([np.append(ids, specials["[SEP]"])
                                     for ids in data.encode(tokenizer, data.lines(text))])
        if config.gpt_windows == "random":
            cut = len(stream) - (0 if eval_fraction <= 0 else round(len(stream) * eval_fraction))
            if eval_fraction > 0 and len(stream) - cut < T + 1:
                raise DataError(f"the held-out tail ({len(stream) - cut} tokens) is shorter than "
                                f"one random window of seq_len + 1 = {T + 1}; give a longer file, "
                                f"--val-data or no evaluation")
            return (RandomWindows(stream[:cut], config),
                    RandomWindows(stream[cut:], config, stream=1) if cut < len(stream) else None)
        if len(stream) < T:
            raise DataError(f"the data file is too short: it yields {len(stream)} tokens, fewer "
                            f"than one window of seq_len={T}")
        windows = stream[: len(stream) // T * T].reshape(-1, T)
        train, held = data.split(len(windows), eval_fraction)

        def dataset(rows, stream_id):
            def make(indices, rngs):
                ids = windows[rows[indices]]
                return {"input_ids": ids}  # full windows: no padding, no mask
            return Dataset(self.name, len(rows), make, config, tokens_per_example=T,
                           stream=stream_id)

        return dataset(train, 0), (dataset(held, 1) if len(held) else None)

    def check_values(self, batch, model_config):
        super().check_values(batch, model_config)
        if "labels" in batch:  # random windows carry their targets
            check_labels("labels", batch["labels"], model_config.vocab_size)


CAUSAL_LM = CausalLM(
    name="gpt", config_class=GPTConfig, model_module="models.gpt", model="GPT",
    loss="causal_lm_batch_loss", batch_keys=("input_ids",),
    needed_specials=("[SEP]",), hf_export=True)
