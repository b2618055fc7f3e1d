"""The streaming interface and ``jaxformer generate``.

``stream`` must hand out exactly the tokens ``generate`` returns, step by step, in both twins.
The command runs on a random GPT-2 directory written here with a small byte-level BPE
``tokenizer.json`` trained on a few sentences: what it streams must be the prompt followed by
the decoded tokens of ``generate``, and it ends with a tokens/s summary.
"""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from jaxformer import cli as jaxformer_cli
from jaxformer.checkpoints import hf
from jaxformer.generation import cli
from jaxformer.generation import generate as jax_generate
from jaxformer.generation import stream as jax_stream
from jaxformer.loading import load
from jaxformer.models import gpt as jgpt
from parity_tests.support.generation import GPT_PRE_LN, hf_gpt2, left_padded, model_pair
from torch_ref.generation import generate as torch_generate
from torch_ref.generation import stream as torch_stream
from torch_ref.models import gpt as tgpt

TEXTS = ["the quick brown fox jumps over the lazy dog", "a journey of a thousand miles",
         "to be or not to be, that is the question", "all that glitters is not gold"] * 4


@pytest.mark.parametrize("framework", ["jax", "torch"])
@pytest.mark.parametrize("do_sample", [False, True])
def test_stream_yields_the_tokens_generate_returns(framework, do_sample):
    torch_model, jax_model = model_pair(tgpt.GPT, jgpt.GPT, GPT_PRE_LN)
    model, generate, stream = ((jax_model, jax_generate, jax_stream) if framework == "jax"
                               else (torch_model, torch_generate, torch_stream))
    ids, mask = left_padded(np.random.RandomState(8), 101, [4, 2], 4)
    kwargs = dict(max_new_tokens=8, do_sample=do_sample, temperature=3.0, seed=5, pad_token_id=1)
    free = torch_generate(torch_model, ids, mask, **kwargs).numpy()  # no compilation
    kwargs["eos_token_id"] = int(free[1, 6])  # row 1 finishes early, row 0 may
    expected = np.asarray(generate(model, ids, mask, **kwargs))
    steps = list(stream(model, ids, mask, **kwargs))
    assert len(steps) == expected.shape[1] - ids.shape[1]
    np.testing.assert_array_equal(np.stack(steps, axis=1), expected[:, ids.shape[1]:])
    assert (expected[1, 7:] == 1).all(), "finished rows stream pad tokens"


def test_stream_reports_errors():
    _, jax_model = model_pair(tgpt.GPT, jgpt.GPT, GPT_PRE_LN)
    with pytest.raises(ValueError, match="num_beams must be an integer >= 1"):
        list(jax_stream(jax_model, np.ones((1, 2), np.int64), max_new_tokens=2, num_beams=0))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2_with_tokenizer")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(TEXTS, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    eos = tokenizer.token_to_id("<|endoftext|>")
    hf_gpt2(seed=1, vocab_size=tokenizer.get_vocab_size(), eos_token_id=eos,
            bos_token_id=eos).save_pretrained(directory)
    return directory


def run_cli(argv) -> int:
    """Through the `jaxformer` command itself, so that its wiring is tested too."""
    return jaxformer_cli.main(["generate", *argv])


def test_generate_command_streams_what_generate_returns(model_dir, capsys):
    prompt = "the quick brown"
    assert run_cli(["--model", str(model_dir), "--prompt", prompt, "--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    tokenizer = load(model_dir).tokenizer
    ids = np.array([tokenizer.encode(prompt)])
    eos = tokenizer.eos_id
    assert eos == tokenizer.token_to_id("<|endoftext|>")
    new = np.asarray(jax_generate(hf.from_pretrained(model_dir), ids, max_new_tokens=8,
                                  eos_token_id=eos, pad_token_id=eos))[0, ids.shape[1]:]
    text = cli.continuation(tokenizer, ids[0].tolist(),
                            [t for t in cli._until_eos(new, eos) if t != eos])
    assert out == prompt + text + "\n"
    assert "tokens/s" in err
    assert "new tokens in" in err


def test_generate_command_batches_prompts(model_dir, capsys):
    argv = ["--model", str(model_dir), "--prompt", "to be", "--prompt", "all that glitters is",
            "--max-new-tokens", "5", "--framework", "torch", "--num-beams", "2"]
    assert run_cli(argv) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("[0] to be")
    assert lines[1].startswith("[1] all that glitters is")
    assert "(torch" in err


def test_generate_command_reports_a_missing_tokenizer(tmp_path, capsys):
    hf_gpt2(seed=1).save_pretrained(tmp_path)
    assert run_cli(["--model", str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxformer generate: error: {tmp_path}: has no tokenizer.json")
