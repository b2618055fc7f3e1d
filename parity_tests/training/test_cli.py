"""``jaxformer train`` end to end (in process), its refusals, and the subcommands' usage errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from jaxformer import cli
from jaxformer.training.checkpoint import Checkpointer
from parity_tests.support.training import write_corpus
from torch_ref.training.checkpoint import Checkpointer as TorchCheckpointer


def train(*args):
    return cli.main(["train", *map(str, args)])


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """The issue's command: ``jaxformer train --family gpt --preset tiny --data FILE --steps 50``
    (plus a checkpoint period and the run directory)."""
    root = tmp_path_factory.mktemp("gpt_run")
    data = write_corpus(root / "corpus.txt")
    run_dir = root / "run"
    return data, run_dir


def test_train_gpt_writes_progress_metrics_png_and_checkpoints(gpt_run, capsys):
    data, run_dir = gpt_run
    assert train("--family", "gpt", "--preset", "tiny", "--data", data, "--steps", 50,
                 "--checkpoint-dir", run_dir, "--checkpoint-every", 20,
                 "--export-hf", run_dir.parent / "hf", "--peak-tflops", 0.5) == 0
    out = capsys.readouterr().out
    # Not a terminal here: plain progress lines (a bar is the default on a terminal).
    assert re.search(r"^step 1/50  loss \d+\.\d+  lr ", out, re.M)
    assert re.search(r"^step 50/50  loss ", out, re.M)
    assert "trained gpt (jax) to step 50" in out
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 51))
    for r in records:
        assert {"step", "loss", "learning_rate", "grad_norm", "seconds", "tokens_per_s",
                "model_tflops_per_s", "mfu"} <= r.keys()
        assert np.isfinite(r["loss"])
        assert r["tokens_per_s"] > 0
        assert r["mfu"] == pytest.approx(r["model_tflops_per_s"] / 0.5)
    assert np.mean([r["loss"] for r in records[-5:]]) < records[0]["loss"] - 0.5  # it learns
    # where the time went: the parts add up, the three saves counted (no evaluation: the run
    # names no --eval-every)
    assert not any("eval_loss" in r for r in records)
    times = re.search(r"^time (\S+) s: updates (\S+) s \(the first (\S+) s\), evaluations "
                      r"(\S+) s, checkpoints (\S+) s, the rest (\S+) s", out, re.M)
    assert times, out[-500:]
    # The updates are the metrics lines' seconds, summed in order (JSON keeps each float
    # exactly): the same number, so the same printed digits.
    assert times[2] == f"{sum(r['seconds'] for r in records):.1f}"
    assert times[3] == f"{records[0]['seconds']:.1f}"
    total, _, _, evaluations, saves, rest = map(float, times.groups())
    assert evaluations == 0
    assert saves > 0
    assert rest > 0
    # The rest is the total less the three parts, exactly; each of the five printed figures is
    # rounded to 0.1 s, off by at most 0.05, so the printed ones add up to within 5 x 0.05 (the
    # 1e-9: the printed decimals' float error). Rounding arithmetic, no kernel: the same on
    # every CPU.
    assert abs(total - (float(times[2]) + evaluations + saves + rest)) <= 0.25 + 1e-9
    assert (run_dir / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Checkpointer(run_dir / "checkpoints").steps() == [20, 40, 50]
    assert (run_dir / "tokenizer.json").is_file()
    assert (run_dir / "run.json").is_file()


def test_the_trained_model_exports_to_transformers(gpt_run):
    """The final checkpoint, restored into a fresh step, is the model that was exported, and
    Hugging Face transformers loads the export and computes the same logits."""
    import torch
    from transformers import GPT2LMHeadModel

    from jaxformer.config import GPTConfig
    from jaxformer.training.config import TrainConfig
    from jaxformer.training.step import TrainStep, build_model

    _, run_dir = gpt_run
    if not (run_dir.parent / "hf").is_dir():
        pytest.skip("needs the run of the test above")
    identity = json.loads((run_dir / "run.json").read_text())["identity"]
    model_cfg = GPTConfig(**{k: v for k, v in identity["model_config"].items() if k != "class"})
    trainer = TrainStep("gpt", build_model("gpt", model_cfg, 123),
                        TrainConfig(**identity["train_config"]))
    assert Checkpointer(run_dir / "checkpoints").restore(trainer)["step"] == 50
    ours = trainer.sync()
    ours.eval()
    ids = np.random.RandomState(0).randint(0, model_cfg.vocab_size, (2, 12))
    hf = GPT2LMHeadModel.from_pretrained(run_dir.parent / "hf").eval()
    with torch.no_grad():
        expected = hf(torch.tensor(ids)).logits.numpy()
    got = np.asarray(ours(ids))
    assert np.abs(got - expected).max() <= 1e-5 * max(1.0, np.abs(expected).max())
    assert (run_dir.parent / "hf" / "tokenizer.json").is_file()


def _snapshot(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize(("change", "difference"), [
    (["--lr", "0.002"], "train_config.learning_rate: saved 0.001, now 0.002"),
    (["--family", "bert"], "family: saved 'gpt', now 'bert'"),
    (["--framework", "torch"], "framework: saved 'jax', now 'torch'"),
    (["--dropout", "0"], "model_config.dropout_rate: saved 0.1, now 0.0"),
])
def test_resume_refuses_another_run_and_writes_nothing(gpt_run, capsys, change, difference):
    data, run_dir = gpt_run
    if not (run_dir / "run.json").is_file():
        pytest.skip("needs the run of the test above")
    before = _snapshot(run_dir)
    args = {"--family": "gpt", "--data": data, "--steps": "50", "--checkpoint-dir": run_dir,
            "--checkpoint-every": "20"}
    args.update(dict(zip(change[::2], change[1::2])))
    assert train(*[x for kv in args.items() for x in kv], "--resume") == 2
    err = capsys.readouterr().err
    assert f"cannot resume {run_dir}" in err
    assert difference in err
    assert "nothing was written" in err
    assert _snapshot(run_dir) == before
    # Without --resume an existing run is never overwritten either.
    assert train("--family", "gpt", "--data", data, "--checkpoint-dir", run_dir) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err
    assert _snapshot(run_dir) == before


def test_jax_and_torch_print_matching_losses(tmp_path, capsys):
    data = write_corpus(tmp_path / "labels.txt", tabs=True)
    common = ["--family", "classifier", "--data", data, "--steps", 12, "--dropout", 0,
              "--seq-len", 24, "--batch-size", 4, "--warmup", 3, "--schedule", "cosine",
              "--clip", 0.5, "--weight-decay", 0.1, "--no-decay-embeddings", "--eval-every", 6]
    assert train(*common, "--checkpoint-dir", tmp_path / "jax", "--progress", "plain",
                 "--log-every", 1) == 0
    printed_jax = re.findall(r"(?<!eval_)loss (\d+\.\d+)", capsys.readouterr().out)
    assert train(*common, "--checkpoint-dir", tmp_path / "torch", "--framework", "torch",
                 "--progress", "bar") == 0
    bar = capsys.readouterr().err
    assert "12/12" in bar
    assert "classifier (torch)" in bar
    jax_records, torch_records = (
        [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        for name in ("jax", "torch"))
    jax_loss, torch_loss = (np.array([r["loss"] for r in records])
                            for records in (jax_records, torch_records))
    assert len(printed_jax) == 12
    np.testing.assert_allclose(np.array(printed_jax, float), jax_loss, atol=1e-6)
    np.testing.assert_allclose(jax_loss, torch_loss, rtol=1e-5)
    # The eval steps (eval mode, held-out examples) agree too.
    evals = [[(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
             for records in (jax_records, torch_records)]
    assert [s for s, _ in evals[0]] == [s for s, _ in evals[1]] == [6, 12]
    np.testing.assert_allclose([e for _, e in evals[0]], [e for _, e in evals[1]], rtol=1e-5)
    assert TorchCheckpointer(tmp_path / "torch" / "checkpoints").steps() == [12]


def test_runs_differing_in_the_schedule_share_one_compiled_step(tmp_path, capsys):
    """A learning-rate sweep compiles the train step once: the schedule (``--lr``, ``--warmup``,
    ``--steps``, ``--schedule``) is an argument of the compiled update, not part of the program
    (docs/training.md), so the second run's compile line says the compilation cache (the
    suite's, ``conftest.py``) served it. The first compiles it (a length no other test trains
    at) and says nothing: the first update looks up one program, the step."""
    data = write_corpus(tmp_path / "corpus.txt")
    common = ["--family", "gpt", "--preset", "tiny", "--data", data, "--dropout", 0,
              "--seq-len", 12, "--batch-size", 3, "--progress", "plain"]
    lines = []
    for i, schedule in enumerate((["--steps", 2, "--lr", 1e-3],
                                  ["--steps", 3, "--lr", 2e-3, "--warmup", 2, "--schedule",
                                   "cosine"])):
        assert train(*common, *schedule, "--checkpoint-dir", tmp_path / f"run{i}") == 0
        lines.append(next(line for line in capsys.readouterr().out.splitlines()
                          if line.startswith("compile")))
    line = r"compile +the first update \(XLA compiles the train step\) \.\.\. \d+\.\d s"
    assert re.fullmatch(line, lines[0]), lines
    assert re.fullmatch(line + ": loaded from the compilation cache", lines[1]), lines


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    data = write_corpus(tmp_path / "corpus.txt")
    run_dir = tmp_path / "run"
    # A learning rate of 1e30 sends the weights past float32 within a step or two.
    code = train("--family", "gpt", "--data", data, "--steps", 20, "--lr", 1e30, "--warmup", 1,
                 "--seq-len", 16, "--batch-size", 2, "--framework", "torch", "--checkpoint-dir",
                 run_dir, "--checkpoint-every", 1, "--progress", "none")
    assert code == 1
    err = capsys.readouterr().err
    match = re.search(r"step (\d+): the (loss|grad norm) is (nan|inf|-inf); training stopped\. "
                      r"The last good checkpoint is step (\d+)", err)
    assert match, err
    bad, last_good = int(match.group(1)), int(match.group(4))
    assert last_good == bad - 1 >= 1
    checkpointer = TorchCheckpointer(run_dir / "checkpoints")
    assert checkpointer.latest_step() == last_good
    assert checkpointer.read_meta()["data_position"] == last_good
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, bad))  # the bad step is not recorded
    assert (run_dir / "metrics.png").is_file()


@pytest.mark.parametrize(("flags", "content", "message"), [
    (["--lr", "-0.001"], None, "--lr must be positive, got -0.001"),
    (["--warmup", "30", "--steps", "20"], None, r"--warmup is longer than the run \(steps=20"),
    (["--batch-size", "0"], None, "--batch-size must be at least 1, got 0"),
    (["--clip", "-1"], None, "--clip must not be negative"),
    ([], b"", "is empty"),
    ([], b"\xff\xfe\x00h\x00i", "is not UTF-8 text: byte 0xff at offset 0"),
    ([], b"too short\n", r"fewer than one window of seq_len=64"),
    (["--preset", "huge"], None, "family 'gpt' has no preset 'huge'"),
    (["--seq-len", "100"], None, r"--seq-len \(100\) exceeds the tiny preset's "
                                 r"max_position_embeddings \(64\)"),
    (["--family", "classifier"], None, "classifier data needs LABEL<TAB>TEXT lines"),
    (["--family", "transformer", "--export-hf", "out"], None,
     r"--export-hf: the tiny preset cannot export as MarianMT: it needs "
     r"sinusoidal_layout='split', the model has 'interleaved'"),
])
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, capsys, flags, content, message):
    path = tmp_path / "data.txt"
    if content is None:
        write_corpus(path)
    else:
        path.write_bytes(content)
    run_dir = tmp_path / "run"
    args = ["--family", "gpt", "--data", path, "--checkpoint-dir", run_dir, "--steps", 50]
    assert train(*args, *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxformer train: error: "), err
    assert re.search(message, err), err
    assert not run_dir.exists()


def test_resume_without_a_run(tmp_path, capsys):
    data = write_corpus(tmp_path / "corpus.txt")
    assert train("--family", "gpt", "--data", data, "--checkpoint-dir", tmp_path / "none",
                 "--resume") == 2
    assert "holds no run to resume" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "usage"), [
    (["parity", "--bogus"], "usage: jaxformer parity"),
    (["embed", "hello", "--bogus"], "usage: jaxformer embed"),
    (["train", "--family", "gpt", "--data", "x.txt", "--bogus"], "usage: jaxformer train"),
    (["--bogus"], "usage: jaxformer [-h]"),
])
def test_unknown_arguments_show_the_subcommand_usage(capsys, argv, usage):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage)
    assert "unrecognized arguments: --bogus" in err
    if argv[0] != "--bogus":
        assert "usage: jaxformer [-h] COMMAND" not in err


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = capsys.readouterr().out
    flags = ["--family", "--preset", "--data", "--steps", "--batch-size", "--seq-len", "--lr",
             "--warmup", "--schedule", "--weight-decay", "--clip", "--dropout", "--seed",
             "--eval-every", "--framework", "--checkpoint-dir", "--checkpoint-every", "--resume",
             "--metrics", "--tokenizer", "--accumulation-steps", "--label-smoothing", "--keep",
             "--init-from"]
    for flag in flags:
        assert re.search(rf"^\s+{flag}\b.*\n?.*\w", text, re.M), flag
    for family in ("gpt", "bert", "transformer", "classifier"):
        assert re.search(rf"^\s+{family}\s+\w", text, re.M)  # what each family makes of FILE


def test_scanned_rematerialised_run_matches_the_torch_twin(tmp_path):
    """``--scan-layers --remat full``: recorded in the run identity, and the JAX run (one scan,
    recomputed blocks) follows the torch twin (per-layer blocks under torch.utils.checkpoint)
    from the same initial weights."""
    data = write_corpus(tmp_path / "corpus.txt")
    common = ["--family", "gpt", "--data", data, "--steps", 4, "--dropout", 0, "--seq-len", 16,
              "--batch-size", 4, "--warmup", 1, "--scan-layers", "--remat", "full",
              "--progress", "none"]
    assert train(*common, "--checkpoint-dir", tmp_path / "jax") == 0
    assert train(*common, "--checkpoint-dir", tmp_path / "torch", "--framework", "torch") == 0
    identity = json.loads((tmp_path / "jax" / "run.json").read_text())["identity"]
    assert identity["model_config"]["scan_layers"] is True
    assert identity["model_config"]["remat"] == "full"
    jax_loss, torch_loss = (
        [json.loads(line)["loss"] for line in (tmp_path / name / "metrics.jsonl").open()]
        for name in ("jax", "torch"))
    assert len(jax_loss) == 4
    np.testing.assert_allclose(jax_loss, torch_loss, rtol=1e-5)
