"""The synthetic corpora and twin train steps the training tests share.

``WORDS`` is their vocabulary; ``corpus`` (a family's text, in memory) and ``twin_steps`` (the
JAX and torch train steps of a family from identical weights, with their data) serve
``training/test_trajectory.py`` and ``training/test_bert_examples.py``; ``write_corpus`` (a corpus
file for ``jaxformer train``) serves ``training/test_cli.py`` and ``models/test_autocast.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from jaxformer.checkpoints import convert
from jaxformer.training import tasks, vocab
from jaxformer.training.config import TrainConfig
from jaxformer.training.step import MODELS, TrainStep
from jaxformer.training.tasks import model_config
from torch_ref.training.step import TrainStep as TorchTrainStep
from torch_ref.training.step import build_model as torch_build_model

WORDS = ["the", "a", "cat", "dog", "bird", "sat", "ran", "flew", "over", "under", "near", "house",
         "tree", "river", "quickly", "slowly", "red", "green", "big", "small"]


def corpus(family: str, lines: int = 80) -> str:
    rng = np.random.RandomState(0)
    out = []
    for i in range(lines):
        sentence = " ".join(rng.choice(WORDS, rng.randint(4, 12)))
        if family == "classifier":
            sentence = f"{'yes' if 'cat' in sentence else 'no'}\t{sentence}"
        out.append(sentence)
        if family == "bert" and i % 10 == 9:
            out.append("")  # documents
    return "\n".join(out) + "\n"


def twin_steps(family: str, config: TrainConfig, seed: int = 0, **model_changes):
    """The JAX and torch steps of ``family`` from identical weights, and the training data.
    ``model_changes``: fields of the tiny preset's model config to replace."""
    text = corpus(family)
    tokenizer = vocab.wordpiece_tokenizer(text.splitlines(), 120)
    dataset, _ = tasks.build_datasets(family, text, tokenizer, config)
    model_cfg = dataclasses.replace(
        model_config(family, "tiny", vocab_size=tokenizer.get_vocab_size(), pad_id=0,
                     num_labels=dataset.num_labels, dropout=0.0), **model_changes)
    torch_model = torch_build_model(family, model_cfg, seed)
    jax_model = convert.abstract_model(lambda: MODELS[family](model_cfg, rngs=nnx.Rngs(seed)))
    convert.torch_to_nnx(torch_model.state_dict(), jax_model)
    torch_step = TorchTrainStep(family, torch_model, config)
    return TrainStep(family, jax_model, config), torch_step, dataset


def write_corpus(path, lines=150, seed=0, tabs=False):
    rng = np.random.RandomState(seed)
    rows = [" ".join(rng.choice(WORDS, rng.randint(5, 14))) for _ in range(lines)]
    if tabs:
        rows = [f"{'yes' if 'cat' in r else 'no'}\t{r}" for r in rows]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def tiny_run(directory, family: str, *flags, framework: str = "torch", steps: int = 3,
             name: str | None = None):
    """A run directory of ``jaxformer train --family FAMILY`` on a small corpus: the tiny preset,
    ``steps`` updates of 2 x 16 tokens, trained with the torch twin by default (no compilation:
    a second or two). ``flags`` are added to the command (``--tokenizer char``...). Serves the
    inference commands' tests (``generation/test_cli_runs.py``, ``test_inference_commands.py``)."""
    from pathlib import Path

    from jaxformer import cli

    directory = Path(directory)
    data = write_corpus(directory / f"{name or family}.txt", tabs=family == "classifier")
    run_dir = directory / (name or family)
    code = cli.main(["train", "--family", family, "--data", data, "--steps", str(steps),
                     "--seq-len", "16", "--batch-size", "2", "--framework", framework,
                     "--checkpoint-dir", str(run_dir), "--progress", "none",
                     *map(str, flags)])
    assert code == 0, f"training the tiny {family} run failed"
    return run_dir
