"""``jaxformer train --config FILE`` and the run's own ``config.toml``
(``jaxformer.training.config_file``), the error contract they report through
(``jaxformer.errors``), and the start-up summary and phase lines (``jaxformer.training.startup``),
which the same runs print.

Three tiny runs share one module fixture: A from flags, B from A's ``config.toml`` (the same
losses and final parameters bit for bit, and quiet under ``--progress none``), C resumes A
through its ``config.toml``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import tomllib

import numpy as np
import pytest

from jaxformer import cli, errors
from jaxformer.training import config_file
from jaxformer.training.checkpoint import Checkpointer
from jaxformer.training.command import FLAGS
from jaxformer.training.config import TrainConfig
from jaxformer.training.loop import RunOptions
from parity_tests.support.jaxprs import raw_leaves
from parity_tests.support.training import write_corpus


def train(*args):
    return cli.main(["train", *map(str, args)])


def write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


# --- The writer -------------------------------------------------------------------------------

FLOATS = [0.1, 1e-3, 3e-4, 1e-8, 1 / 3, 2.0 ** -1074, 1.7976931348623157e308, 1e16, -2.5e-7,
          123456789.123, 0.0, -0.0, math.inf, -math.inf]
STRINGS = ["runs/a b", 'say "hi"', "back\\slash", "tab\tand\nnewline", "ünïcödé ✓", "del\x7f",
           "", "# not a comment", "=", "'single'"]


def test_values_read_back_exactly():
    values = {f"f{i}": x for i, x in enumerate(FLOATS)}
    values |= {f"s{i}": x for i, x in enumerate(STRINGS)}
    values |= {"i0": 0, "i1": -5, "i2": 2 ** 62, "yes": True, "no": False, "nan": math.nan}
    text = config_file.dumps(values, header="line one\nline two")
    assert text.startswith("# line one\n# line two\n")
    back = tomllib.loads(text)
    assert math.isnan(back.pop("nan"))
    values.pop("nan")
    assert back == values
    for key, value in values.items():  # the same type and, for floats, the same bits
        assert type(back[key]) is type(value), key
        if isinstance(value, float):
            assert math.copysign(1, back[key]) == math.copysign(1, value), key


def test_every_flag_has_a_key_of_its_type(tmp_path):
    """Each key loads with a value of its flag's type and refuses one of another type, naming
    the key and the type."""
    samples = {bool: True, int: 3, float: 0.5, str: "x"}
    for name, key in config_file.keys(FLAGS).items():
        good = key.choices[0] if key.choices else samples[key.type]
        path = write(tmp_path / f"{name}.toml", config_file.dumps({name: good}))
        assert config_file.load(path, FLAGS) == {name: good}
        wrong = [1, 2.5, "x"] if key.type is bool else [True, "x"] if key.type is not str else [3]
        for value in wrong:
            path = write(tmp_path / f"{name}.toml", config_file.dumps({name: value}))
            with pytest.raises(errors.UsageError, match=rf"key '{name}' must be "):
                config_file.load(path, FLAGS)


def test_an_integer_is_taken_for_a_float(tmp_path):
    loaded = config_file.load(write(tmp_path / "c.toml", "lr = 1\n"), FLAGS)
    assert loaded == {"lr": 1.0}
    assert type(loaded["lr"]) is float


@pytest.mark.parametrize(("text", "message"), [
    ("seq_len = 16\n", r"unknown key 'seq_len' \(did you mean 'seq-len'\?"),
    ("eval-iters = 2\n", r"unknown key 'eval-iters' \(did you mean 'eval-batches'\?"),
    ("learning-rate = 0.1\n", r"unknown key 'learning-rate' \("),
    ("zzzz = 1\n", r"unknown key 'zzzz' \(Keys are the flags' names"),
    ("[train]\nsteps = 3\n", r"unknown key 'train'"),
    ("steps = '3'\n", r"key 'steps' must be an integer \(as --steps takes\), got '3'"),
    ("scan-layers = 1\n", r"key 'scan-layers' must be a boolean"),
    ("schedule = 'cosin'\n", r"key 'schedule' must be one of linear, cosine, "),
    ("steps = \n", r"not valid TOML"),
])
def test_bad_files_are_named_errors(tmp_path, capsys, text, message):
    """Through the command: exit 2, the one-line prefix, the key, no traceback."""
    path = write(tmp_path / "bad.toml", text)
    assert train("--config", path) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxformer train: error: --config {path}: ")
    assert re.search(message, err), err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_missing_file_and_debug_traceback(tmp_path, capsys, monkeypatch):
    missing = tmp_path / "nowhere.toml"
    assert train("--config", missing) == 2
    assert capsys.readouterr().err == f"jaxformer train: error: --config {missing}: no such file\n"
    assert cli.main(["train", "--config", str(missing), "--debug"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback")
    assert "UsageError" in err
    assert err.endswith(f"jaxformer train: error: --config {missing}: no such file\n")
    monkeypatch.setenv("JAXFORMER_DEBUG", "1")
    assert cli.main(["train", "--config", str(missing)]) == 2  # the environment alone
    assert capsys.readouterr().err.startswith("Traceback")


def test_report_exit_codes(capsys):
    assert errors.report("x", errors.UsageError("bad --flag 3")) == 2
    assert errors.report("x", errors.RunFailure("diverged")) == 1
    assert errors.report("x", KeyboardInterrupt()) == 130
    assert errors.report("x", PermissionError(13, "Permission denied", "/root/out")) == 1
    assert capsys.readouterr().err.splitlines() == [
        "jaxformer x: error: bad --flag 3", "jaxformer x: error: diverged",
        "jaxformer x: interrupted", "jaxformer x: error: /root/out: Permission denied"]
    with pytest.raises(TypeError):  # a bug keeps its traceback
        errors.report("x", KeyError("k"))


def _args(argv):
    parser = cli.build_parser()
    args = parser.parse_args(["train", *map(str, argv)])
    args.argv = ["train", *map(str, argv)]
    config_file.apply(args, FLAGS)
    return args


def test_the_documented_file_is_valid(tmp_path):
    """The TOML example of docs/training.md loads, and with it the command parses."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    blocks = re.findall(r"^```toml\n(.*?)^```", doc, re.S | re.M)
    assert len(blocks) == 1
    path = write(tmp_path / "baby.toml", blocks[0])
    values = config_file.load(path, FLAGS)
    assert values["eval-batches"] == 20
    args = _args(["--config", path, "--steps", 100])
    assert (args.family, args.preset, args.steps, args.lr) == ("gpt", "baby", 100, 1e-3)


def test_the_command_line_wins(tmp_path):
    path = write(tmp_path / "c.toml", "family = 'gpt'\ndata = 'x.txt'\nsteps = 5\nlr = 0.01\n"
                                      "decay-embeddings = true\nseq-len = 32\n")
    args = _args(["--config", path, "--steps", 7, "--no-decay-embeddings", "--seq-len=8"])
    assert (args.steps, args.lr, args.decay_embeddings, args.seq_len) == (7, 0.01, False, 8)
    assert (args.family, args.data) == ("gpt", "x.txt")
    args = _args(["--config", path])
    assert (args.steps, args.decay_embeddings, args.seq_len) == (5, True, 32)
    assert args.batch_size == TrainConfig.batch_size  # neither: the default


def test_family_and_data_are_required_somewhere(tmp_path, capsys):
    path = write(tmp_path / "c.toml", "steps = 5\n")
    assert train("--config", path, "--data", "x.txt") == 2
    err = capsys.readouterr().err
    assert "required: --family (on the command line or in --config FILE)" in err
    assert train("--family", "gpt") == 2
    assert "required: --data" in capsys.readouterr().err


def test_resolved_holds_every_set_flag_but_the_invocations():
    config = TrainConfig(steps=9, warmup_steps=2, schedule="cosine", learning_rate=3e-4)
    options = RunOptions(family="gpt", data="d.txt", resume=True, overwrite=True, dropout=0.0)
    values = config_file.resolved(config, options, FLAGS)
    assert set(values) <= set(config_file.keys(FLAGS))
    assert not set(values) & set(config_file.NOT_WRITTEN)
    assert values["checkpoint-dir"] == "runs/gpt-tiny"  # the default, resolved
    assert (values["lr"], values["warmup"], values["dropout"]) == (3e-4, 2, 0.0)
    assert "tokenizer" not in values  # None: the default stays the default
    assert tomllib.loads(config_file.dumps(values)) == values


# --- Runs -------------------------------------------------------------------------------------

COMMON = ["--family", "gpt", "--preset", "tiny", "--steps", 3, "--seq-len", 16, "--batch-size", 4,
          "--lr", 3e-3, "--min-lr", 1e-4, "--schedule", "cosine", "--eval-every", 2,
          "--log-every", 1]  # dropout on (the preset's): the RNG state is reproduced too


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A from flags (plain progress), B from A's config.toml with --progress none, C resuming A
    through its config.toml; each run's exit code and standard output."""
    root = tmp_path_factory.mktemp("config_runs")
    data = write_corpus(root / "corpus.txt")
    results = {}
    for name, argv in (
            ("a", [*COMMON, "--data", data, "--checkpoint-dir", root / "a", "--progress",
                   "plain"]),
            ("b", ["--config", root / "a" / "config.toml", "--checkpoint-dir", root / "b",
                   "--progress", "none"]),
            ("c", ["--config", root / "a" / "config.toml", "--resume", "--progress", "plain"])):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = train(*argv)
        results[name] = (code, out.getvalue())
    return root, results


def _losses(run_dir):
    return [(r["step"], r["loss"], r.get("eval_loss")) for r in map(
        json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def _final_params(run_dir):
    from jaxformer.config import GPTConfig
    from jaxformer.training.step import TrainStep, build_model

    identity = json.loads((run_dir / "run.json").read_text())["identity"]
    model_cfg = GPTConfig(**{k: v for k, v in identity["model_config"].items() if k != "class"})
    trainer = TrainStep("gpt", build_model("gpt", model_cfg, 99),
                        TrainConfig(**identity["train_config"]))
    Checkpointer(run_dir / "checkpoints").restore(trainer)
    state = trainer.state_dict()
    return raw_leaves((state["params"], state["opt_state"], state["rest"]))


def test_config_toml_reproduces_the_run_bit_for_bit(runs):
    root, results = runs
    assert results["a"][0] == 0
    assert results["b"][0] == 0
    a, b = _losses(root / "a"), _losses(root / "b")
    assert [step for step, *_ in a] == [1, 2, 3]
    assert a == b  # every loss and evaluation loss, exactly
    params_a, params_b = _final_params(root / "a"), _final_params(root / "b")
    assert len(params_a) == len(params_b) > 10
    for x, y in zip(params_a, params_b, strict=True):
        assert x.dtype == y.dtype
        assert np.array_equal(x, y)
    written_a = tomllib.loads((root / "a" / "config.toml").read_text())
    written_b = tomllib.loads((root / "b" / "config.toml").read_text())
    assert written_a.pop("checkpoint-dir") == str(root / "a")
    assert written_b.pop("checkpoint-dir") == str(root / "b")
    assert (written_a.pop("progress"), written_b.pop("progress")) == ("plain", "none")
    assert written_a == written_b
    assert written_a["warmup"] == 1  # resolved: a tenth of the steps, at least 1
    assert written_a["lr"] == 3e-3
    assert written_a["min-lr"] == 1e-4


def test_the_summary_and_phases_come_before_the_first_update(runs):
    root, results = runs
    out = results["a"][1]
    lines = [line for line in out.splitlines() if not line.startswith(" ")]  # not the block's
    names = [line.split()[0] for line in lines]
    phases = [n for n in names if n in ("tokenizer", "data", "build", "compile")]
    assert phases == ["tokenizer", "data", "build", "compile"]
    for line in lines:
        if line.split()[0] in phases:
            assert re.fullmatch(r"\w+\s+\S.* \.\.\. \d+\.\d s(: \S.*)?", line), line
    summary = names.index("jaxformer")
    assert names.index("build") < summary < names.index("compile") < names.index("step")
    rows = dict(re.findall(r"^  (\S+(?: \S+)?)\s{2,}(.+)$", out, re.M))
    identity = json.loads((root / "a" / "run.json").read_text())["identity"]
    from jaxformer.config import GPTConfig
    from jaxformer.models import flops

    model_cfg = GPTConfig(**{k: v for k, v in identity["model_config"].items() if k != "class"})
    assert rows["parameters"] == f"{flops.gpt_parameter_count(model_cfg):,}"
    assert rows["tokens/update"].startswith("64 (4 examples x 16 tokens)")
    assert rows["model"].startswith(f"gpt, preset tiny: GPT, vocabulary {model_cfg.vocab_size}")
    assert rows["dtype"] == "compute float32, parameters float32"
    assert rows["devices"].startswith("1 of ")
    assert rows["mesh"] == "none (one device)"
    assert rows["run directory"].startswith(str(root / "a"))
    assert rows["start"] == "step 0 of 3 (a new run)"


def test_progress_none_prints_only_the_result(runs):
    _, results = runs
    assert results["b"][1].splitlines() == [line for line in results["b"][1].splitlines()
                                            if line.startswith("trained gpt (jax) to step 3")]
    assert len(results["b"][1].splitlines()) == 1


def test_resume_through_the_config_file_names_the_resume_point(runs):
    root, results = runs
    code, out = results["c"]
    assert code == 0
    assert f"resuming {root / 'a'} from step 3" in out
    assert re.search(r"^  start\s+step 3 of 3 \(resumed\)$", out, re.M)
    assert "compile" not in out  # nothing left to run
    assert _losses(root / "a") == _losses(root / "b")
