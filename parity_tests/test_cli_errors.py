"""One error contract for every subcommand (jaxformer/errors.py), table-driven: each row runs
``jaxformer`` in-process with bad input and asserts the exit status (2 for the user's input),
the one prefix ``jaxformer COMMAND: error: `` on stderr, the flag (as typed) or value the message
must name, and that no Python traceback is printed. Every row fails before a model is trained;
the models it needs are tiny Hugging Face directories made here.
"""

from __future__ import annotations

import pytest

from jaxformer import cli
from parity_tests.support.training import WORDS, write_corpus


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """Files the rows name: a corpus, a labelled file, a directory, a damaged run, a config
    file with an unknown key, tiny GPT-2 and BERT directories with their tokenizers."""
    from jaxformer.training import vocab
    from parity_tests.support.hf_models import hf_bert_config, hf_gpt2_config, hf_model

    root = tmp_path_factory.mktemp("errors")
    write_corpus(root / "c.txt", lines=40)
    write_corpus(root / "l.tsv", lines=40, tabs=True)
    (root / "adir").mkdir()
    (root / "damaged" / "checkpoints").mkdir(parents=True)
    (root / "damaged" / "run.json").write_text("{")
    (root / "bad.toml").write_text('family = "gpt"\nseq_len = 16\n')
    (root / "notoml.toml").write_text("family = = gpt\n")
    tokenizer = vocab.wordpiece_tokenizer([" ".join(WORDS)], 120)
    size = tokenizer.get_vocab_size()
    for name, model in (("gpt2", hf_model("GPT2LMHeadModel", hf_gpt2_config(vocab_size=size))),
                        ("bert", hf_model("BertModel", hf_bert_config(vocab_size=size,
                                                                      pad_token_id=0)))):
        model.save_pretrained(root / name)
        tokenizer.save(str(root / name / "tokenizer.json"))
    return root


# (id, argv with {p} for the fixture's directory, exit status, what stderr must name)
CASES = [
    # train
    ("train-no-data", "train --family gpt", 2, "--data"),
    ("train-missing-data", "train --family gpt --data {p}/missing.txt", 2, "missing.txt"),
    ("train-data-is-dir", "train --family gpt --data {p}/adir", 2, "adir"),
    ("train-bad-family", "train --family nope --data {p}/c.txt", 2, "--family"),
    ("train-zero-steps", "train --family gpt --data {p}/c.txt --steps 0", 2, "--steps"),
    ("train-negative-lr", "train --family gpt --data {p}/c.txt --lr -1", 2, "--lr"),
    ("train-checkpoint-every", "train --family gpt --data {p}/c.txt --checkpoint-every -1", 2,
     "--checkpoint-every"),
    ("train-eval-batches", "train --family gpt --data {p}/c.txt --eval-batches 0", 2,
     "--eval-batches"),
    ("train-seq-len", "train --family gpt --data {p}/c.txt --seq-len 100000", 2, "seq"),
    ("train-resume-strict", "train --family gpt --data {p}/c.txt --resume-strict", 2,
     "--resume-strict"),
    ("train-unknown-flag", "train --family gpt --data {p}/c.txt --bogus", 2, "--bogus"),
    ("train-missing-config", "train --config {p}/missing.toml", 2, "missing.toml"),
    ("train-config-unknown-key", "train --config {p}/bad.toml --data {p}/c.txt", 2, "seq-len"),
    ("train-config-not-toml", "train --config {p}/notoml.toml", 2, "notoml.toml"),
    ("train-process-id-alone", "train --family gpt --data {p}/c.txt --process-id 1", 2,
     "--process-id"),
    ("train-torch-mesh", "train --family gpt --data {p}/c.txt --framework torch --mesh data=2", 2,
     "--mesh"),
    ("train-init-from-missing", "train --family classifier --data {p}/l.tsv --init-from "
     "{p}/missing", 2, "missing"),
    ("train-init-from-wrong-family", "train --family classifier --data {p}/l.tsv --init-from "
     "{p}/gpt2", 2, "gpt2"),
    ("train-checkpoint-dir-is-file", "train --family gpt --data {p}/c.txt --checkpoint-dir "
     "{p}/c.txt", 2, "c.txt"),
    ("train-resume-damaged", "train --family gpt --data {p}/c.txt --checkpoint-dir {p}/damaged "
     "--resume", 2, "run.json"),
    # eval
    ("eval-missing-model", "eval --model {p}/missing --data {p}/c.txt", 2, "--model"),
    ("eval-missing-data", "eval --model {p}/gpt2 --data {p}/missing.txt", 2, "missing.txt"),
    ("eval-max-batches", "eval --model {p}/gpt2 --data {p}/c.txt --max-batches 0", 2,
     "--max-batches"),
    ("eval-neither-run-nor-hf", "eval --model {p}/adir --data {p}/c.txt", 2, "adir"),
    ("eval-damaged-run", "eval --model {p}/damaged --data {p}/c.txt", 2, "run.json"),
    # generate
    ("generate-temperature", "generate --model {p}/gpt2 --prompt a --temperature 0.5", 2,
     "--do-sample"),
    ("generate-top-k", "generate --model {p}/gpt2 --prompt a --top-k 5", 2, "--do-sample"),
    ("generate-beams", "generate --model {p}/gpt2 --prompt a --num-beams 0", 2, "--num-beams"),
    ("generate-max-new", "generate --model {p}/gpt2 --prompt a --max-new-tokens 0", 2,
     "--max-new-tokens"),
    ("generate-missing-model", "generate --model {p}/missing --prompt a", 2, "missing"),
    ("generate-wrong-family", "generate --model {p}/bert --prompt a", 2, "bert"),
    # classify, fill-mask, embed
    ("classify-wrong-family", "classify --model {p}/gpt2 hello", 2, "gpt"),
    ("classify-no-text", "classify --model {p}/gpt2", 2, "--file"),
    ("classify-missing-file", "classify --model {p}/gpt2 --file {p}/missing.txt", 2,
     "missing.txt"),
    ("fill-mask-wrong-family", "fill-mask --model {p}/gpt2 the [MASK]", 2, "gpt"),
    ("fill-mask-no-head", "fill-mask --model {p}/bert the [MASK]", 2, "masked-LM"),
    ("embed-bad-extension", "embed --model {p}/bert hello --out {p}/e.txt", 2, ".txt"),
    ("embed-missing-model", "embed --model {p}/missing hello", 2, "missing"),
    ("embed-batch-size", "embed --model {p}/bert hello --batch-size 0", 2, "--batch-size"),
    # data, parity, the command itself
    ("data-no-out", "data shakespeare", 2, "--out"),
    ("data-val-fraction", "data shakespeare --out {p}/d --val-fraction 2", 2, "--val-fraction"),
    ("parity-bad-family", "parity --family nope", 2, "nope"),
    ("parity-bad-preset", "parity --preset huge", 2, "--preset"),
]


@pytest.mark.parametrize(("argv", "status", "names"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_follows_the_contract(place, capsys, argv, status, names):
    args = [a.replace("{p}", str(place)) for a in argv.split()]
    command = args[0]
    try:
        code = cli.main(args)
    except SystemExit as exit_:  # argparse's own errors exit from inside the parser
        code = exit_.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    assert code == status, err
    lines = [line for line in err.splitlines() if line.startswith(f"jaxformer {command}: ")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"jaxformer {command}: error: "), err
    assert names in lines[0], lines[0]


def test_every_subcommand_has_a_row():
    commands = {case[1].split()[0] for case in CASES}
    assert commands == set(cli.build_parser().subcommands)
