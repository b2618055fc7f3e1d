"""``jaxformer generate`` on run directories: tiny GPT (WordPiece and character vocabularies) and
encoder-decoder runs trained here, JAX against the torch twin (the same tokens for greedy,
sampling and beam search), prompt cropping, and every bad input (exit code 2, the
``jaxformer generate: error:`` prefix, the flag named, no traceback, no model loaded for a bad
flag)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from jaxformer import cli
from jaxformer.generation import generate as jax_generate
from jaxformer.generation.cli import continuation
from jaxformer.loading import load
from parity_tests.support.training import tiny_run

PREFIX = "jaxformer generate: error: "


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate_runs")
    return {"gpt": tiny_run(root, "gpt"),
            "char": tiny_run(root, "gpt", "--tokenizer", "char", name="char"),
            "transformer": tiny_run(root, "transformer"),
            "classifier": tiny_run(root, "classifier")}


def generate(capsys, *argv):
    code = cli.main(["generate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str) -> str:
    """The one error line: prefixed, alone on its line, no traceback."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("jaxformer generate: error")]
    assert len(lines) == 1, err
    assert lines[0].startswith(PREFIX), err
    return lines[0]


@pytest.mark.parametrize("options", [
    [],
    ["--do-sample", "--temperature", "1.5", "--top-k", "7", "--top-p", "0.9", "--seed", "3"],
    ["--num-beams", "3", "--length-penalty", "0.5"],
])
def test_gpt_run_generates_the_same_text_in_jax_and_torch(runs, capsys, options):
    argv = ["--model", runs["gpt"], "--prompt", "the cat sat", "--prompt", "a dog",
            "--max-new-tokens", 6, *options]
    outputs = {}
    for framework in ("jax", "torch"):
        code, out, err = generate(capsys, *argv, "--framework", framework)
        assert code == 0, err
        assert "new tokens in" in err
        outputs[framework] = out
    assert outputs["jax"] == outputs["torch"]
    lines = outputs["jax"].splitlines()
    assert lines[0].startswith("[0] the cat sat")
    assert lines[1].startswith("[1] a dog")


def test_gpt_run_output_is_what_generate_returns(runs, capsys):
    """The command's text is the decoded ``generate`` of the loaded model (greedy, eos [SEP])."""
    loaded = load(runs["gpt"])
    ids = np.array([loaded.tokenizer.encode("the cat sat")])
    eos = loaded.tokenizer.sep_id
    tokens = np.asarray(jax_generate(loaded.model, ids, max_new_tokens=6, eos_token_id=eos,
                                     pad_token_id=loaded.tokenizer.pad_id))[0, ids.shape[1]:]
    expected = continuation(loaded.tokenizer, ids[0].tolist(), [t for t in tokens if t != eos])
    assert expected.startswith(" ")  # WordPiece: the continuation is a new word
    code, out, _ = generate(capsys, "--model", runs["gpt"], "--prompt", "the cat sat",
                            "--max-new-tokens", 6)  # one prompt: streamed
    assert code == 0
    assert out == "the cat sat" + expected + "\n"


def test_char_run_streams_and_refuses_unknown_characters(runs, capsys):
    code, out, err = generate(capsys, "--model", runs["char"], "--prompt", "the dog",
                              "--max-new-tokens", 5)
    assert code == 0, err
    assert out.startswith("the dog")
    assert len(out) == len("the dog") + 5 + 1
    code, out, err = generate(capsys, "--model", runs["char"], "--prompt", "the DOG",
                              "--framework", "torch")
    assert code == 2
    line = error_line(err)
    assert "--prompt number 1" in line
    assert "'D'" in line
    assert "'G'" in line
    assert "'O'" in line
    assert out == ""  # nothing echoed before the error


def test_long_prompts_are_cropped_to_the_context(runs, capsys):
    """Context 64 (tiny preset), 60 new tokens: prompts keep their last 4 tokens, said once; the
    result is the one of the cropped prompt given alone."""
    loaded = load(runs["char"])
    context = loaded.config.max_position_embeddings
    prompt = ("the cat sat near the river " * 4).strip()
    assert len(prompt) > context - 60
    code, out, err = generate(capsys, "--model", runs["char"], "--prompt", prompt,
                              "--prompt", "dog", "--max-new-tokens", 60)
    assert code == 0, err
    assert len(re.findall("cropped", err)) == 1
    assert f"prompt(s) 1 cropped to their last {context - 60} tokens" in err
    code, cropped_out, _ = generate(capsys, "--model", runs["char"], "--prompt",
                                    prompt[-(context - 60):], "--prompt", "dog",
                                    "--max-new-tokens", 60)
    assert code == 0
    full, alone = out.splitlines()[0], cropped_out.splitlines()[0]
    assert full == "[0] " + prompt + alone[len("[0] " + prompt[-(context - 60):]):]
    code, _, err = generate(capsys, "--model", runs["char"], "--prompt", "the",
                            "--max-new-tokens", context)
    assert code == 2
    line = error_line(err)
    assert f"--max-new-tokens {context} leaves no room for the prompt" in line
    assert f"use --max-new-tokens {context - 1} or fewer" in line


@pytest.mark.parametrize("options", [[], ["--num-beams", "2"], ["--do-sample", "--seed", "1"]])
def test_encoder_decoder_run_translates_the_same_in_jax_and_torch(runs, capsys, options):
    argv = ["--model", runs["transformer"], "--prompt", "the cat sat near the tree",
            "--prompt", "a bird flew", "--max-new-tokens", 5, *options]
    outputs = {}
    for framework in ("jax", "torch"):
        code, out, err = generate(capsys, *argv, "--framework", framework)
        assert code == 0, err
        outputs[framework] = out
    assert outputs["jax"] == outputs["torch"]
    lines = outputs["jax"].splitlines()
    assert [line[:4] for line in lines] == ["[0] ", "[1] "]
    assert "the cat sat" not in lines[0]  # a target, not the source echoed


def test_encoder_decoder_run_output_is_what_generate_returns(runs, capsys):
    loaded = load(runs["transformer"])
    tok = loaded.tokenizer
    src = np.array([tok.encode("a bird flew") + [tok.sep_id]])
    tokens = np.asarray(jax_generate(loaded.model, src, np.ones_like(src), max_new_tokens=5,
                                     eos_token_id=tok.sep_id, pad_token_id=tok.pad_id,
                                     decoder_start_token_id=tok.cls_id))[0, 1:]
    expected = tok.decode([t for t in tokens if t != tok.sep_id])
    code, out, _ = generate(capsys, "--model", runs["transformer"], "--prompt", "a bird flew",
                            "--max-new-tokens", 5)
    assert code == 0
    assert out == expected + "\n"


def test_wrong_family_is_one_line_naming_path_family_and_need(runs, capsys):
    code, _out, err = generate(capsys, "--model", runs["classifier"], "--prompt", "hello")
    assert code == 2
    line = error_line(err)
    assert str(runs["classifier"]) in line
    assert "classifier run" in line
    assert "gpt or transformer" in line


def test_an_error_after_the_echoed_prompt_stands_on_its_own_line(runs, capsys, monkeypatch):
    from jaxformer.generation import decoding

    def failing_stream(*args, **kwargs):
        yield np.array([5])
        raise ValueError("the device went away")

    monkeypatch.setattr(decoding, "stream", failing_stream)
    code, out, err = generate(capsys, "--model", runs["char"], "--prompt", "the cat")
    assert code == 2
    assert out.startswith("the cat")
    assert out.endswith("\n")
    assert error_line(err) == PREFIX + "the device went away"


MISSING = "no/such/model/dir"


@pytest.mark.parametrize(("flags", "named"), [
    (["--temperature", "0.7"], "--temperature only applies when sampling: add --do-sample"),
    (["--top-k", "5", "--top-p", "0.9"], "--top-k, --top-p only applies when sampling: add "
                                         "--do-sample"),
    (["--do-sample", "--temperature", "0"], "--temperature must be a finite number > 0"),
    (["--do-sample", "--top-p", "1.5"], "--top-p must lie in (0, 1]"),
    (["--do-sample", "--top-k", "-1"], "--top-k must be >= 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
    (["--num-beams", "0"], "--num-beams must be at least 1, got 0"),
    (["--length-penalty", "2"], "--length-penalty only applies to beam search: add --num-beams"),
    (["--early-stopping", "true"], "--early-stopping only applies to beam search"),
    (["--step", "-1"], "--step must be a checkpoint step >= 0"),
    (["--prompt", " "], "--prompt number 2 is empty"),
])
def test_bad_flags_are_reported_before_any_model_is_loaded(capsys, monkeypatch, flags, named):
    import jaxformer.loading

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(jaxformer.loading, "load", no_load)
    code, out, err = generate(capsys, "--model", MISSING, "--prompt", "hi", *flags)
    assert code == 2
    line = error_line(err)
    assert named in line
    assert MISSING not in line
    assert out == ""


def test_a_bad_model_path_is_one_line_naming_it(tmp_path, capsys):
    code, _, err = generate(capsys, "--model", tmp_path / "missing", "--prompt", "hi")
    assert code == 2
    line = error_line(err)
    assert str(tmp_path / "missing") in line
    assert "does not exist" in line


def test_hugging_face_sources_are_framed_by_their_tokenizer():
    """A Hugging Face encoder-decoder's source is what its tokenizer.json's post-processor makes
    of one sequence (BART: ``<s> text </s>``); the closing tokens survive a cut to the context."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from jaxformer.generation.cli import framed_source, seq2seq_sources

    words = {"<s>": 0, "</s>": 1, "the": 2, "cat": 3, "sat": 4}
    backend = Tokenizer(models.WordLevel(words, unk_token="</s>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)])
    body, end = framed_source(SimpleNamespace(backend=backend), "the cat sat")
    assert (body, end) == ([0, 2, 3, 4], [1])
    assert seq2seq_sources([body], end, context=4, max_new_tokens=2) == [[0, 2, 3, 1]]
