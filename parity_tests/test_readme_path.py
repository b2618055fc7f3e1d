"""The README's whole path (data, train, eval, generate, fine-tune, export, classify) runs as
written, on a tiny budget.

The block between ``<!-- readme-path: begin -->`` and ``<!-- readme-path: end -->`` is read from
README.md and each command runs in order through ``jaxformer.cli.main`` in a temporary working
directory, with the budget made tiny by flags appended after the README's own (argparse keeps the
last value). Two stand-ins, both for the network: ``jaxformer data shakespeare`` (which downloads
the corpus) is replaced by small text files at the paths it writes, and ``runs/minilm`` (the
pretrained checkpoint) by a tiny random Hugging Face ``BertModel`` with a WordPiece tokenizer.
Every other flag is the README's; a command that fails fails the test with its stderr.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from jaxformer import cli
from parity_tests.support.training import WORDS, write_corpus

ROOT = Path(__file__).resolve().parent.parent

# Appended to each command of the README, by command (and family for train).
TINY = {
    ("train", "gpt"): ["--preset", "tiny", "--steps", "4", "--batch-size", "4", "--seq-len", "32",
                       "--warmup", "1", "--eval-every", "2", "--eval-batches", "2"],
    ("train", "classifier"): ["--steps", "4", "--batch-size", "4", "--seq-len", "32",
                              "--eval-every", "2", "--eval-batches", "1"],
    ("eval", None): ["--max-batches", "2"],
    ("generate", None): ["--max-new-tokens", "5"],
}


def readme_commands() -> list[list[str]]:
    """The README block's commands, continuation lines joined, each without its program."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    begin, end = "<!-- readme-path: begin -->", "<!-- readme-path: end -->"
    assert begin in text, "README.md lost its readme-path markers"
    assert end in text, "README.md lost its readme-path markers"
    block = text.split(begin, 1)[1].split(end, 1)[0]
    lines = [line for line in block.splitlines() if not line.startswith("```")]
    joined = " ".join(line.rstrip("\\").strip() for line in lines).replace(" .venv/", "\n.venv/")
    commands = [shlex.split(line) for line in joined.splitlines() if line.strip()]
    assert all(c[0] == ".venv/bin/jaxformer" for c in commands), commands
    return [c[1:] for c in commands]


def _stand_ins(workdir: Path) -> None:
    from jaxformer.training import vocab
    from parity_tests.support.hf_models import hf_bert_config, hf_model

    shakespeare = workdir / "data" / "shakespeare"
    shakespeare.mkdir(parents=True)
    write_corpus(shakespeare / "train.txt", lines=120, seed=0)
    with open(shakespeare / "train.txt", "a") as f:  # the README's prompt is in the vocabulary
        f.write("ROMEO:\nthe cat sat\n")
    write_corpus(shakespeare / "val.txt", lines=40, seed=1)
    write_corpus(workdir / "labels.tsv", lines=60, seed=2, tabs=True)
    write_corpus(workdir / "labels_val.tsv", lines=30, seed=3, tabs=True)
    tokenizer = vocab.wordpiece_tokenizer([" ".join(WORDS)], 120)
    minilm = workdir / "runs" / "minilm"
    hf_model("BertModel", hf_bert_config(vocab_size=tokenizer.get_vocab_size(),
                                         pad_token_id=0)).save_pretrained(minilm)
    tokenizer.save(str(minilm / "tokenizer.json"))


def test_readme_block_is_the_whole_path():
    commands = [c[0] for c in readme_commands()]
    assert commands == ["data", "train", "eval", "generate", "train", "classify"]
    finetune = readme_commands()[4]
    assert "--init-from" in finetune
    assert "--export-hf" in finetune


def test_readme_path_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _stand_ins(tmp_path)
    outputs = {}
    for argv in readme_commands():
        command = argv[0]
        if command == "data":  # the download: stood in for by _stand_ins
            assert argv[1:] == ["shakespeare", "--out", "data/shakespeare"]
            continue
        family = argv[argv.index("--family") + 1] if "--family" in argv else None
        code = cli.main(argv + TINY.get((command, family), []))
        out, err = capsys.readouterr()
        assert code == 0, f"{shlex.join(argv)}: exit {code}\n{err}"
        outputs[(command, family)] = out
    assert "loss" in outputs[("eval", None)]
    assert outputs[("generate", None)].startswith("ROMEO:")
    assert "init:" in outputs[("train", "classifier")]
    label = outputs[("classify", None)].split("\t")[0]
    assert label in ("yes", "no")
    exported = json.loads((tmp_path / "exported" / "genre" / "config.json").read_text())
    assert exported["architectures"] == ["BertForSequenceClassification"]
    assert exported["eos_token_id"] is not None
