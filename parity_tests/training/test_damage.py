"""Damaged runs and extended runs (``docs/training.md``, "Interrupts, damage and resuming").

Each damage, in each framework whose checkpointer it concerns, is one row of a table: the
message names the file and what is wrong, on one line, with no traceback and exit status 2. A
damaged latest checkpoint without ``--resume-strict`` is reported with a warning naming both
steps, set aside, and the run resumes from the newest good checkpoint, with the losses of an
uninterrupted run; with ``--resume-strict`` it is an error and nothing changes. A constant
schedule extends with ``--resume --steps N`` exactly as if the run had been that long from the
start; any other schedule is refused with what to do instead.

Sentences of the doc section and their tests: "every file of a run is validated when it is
read" (`test_a_damaged_file_is_named`), "resumes from the newest good checkpoint"
(`test_a_damaged_latest_checkpoint_falls_back_to_the_newest_good_one`), "half-written ... never
taken for complete" (`test_a_checkpoint_without_its_commit_marker_is_incomplete`),
"--resume-strict" (`test_a_damaged_file_is_named`, strict rows), "extended"
(`test_a_constant_schedule_run_extends_exactly`, `test_other_schedules_refuse_to_extend`).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from jaxformer import cli
from jaxformer.training import vocab
from parity_tests.support.training import WORDS, write_corpus

STEPS = 3


def train(*args):
    return cli.main(["train", *map(str, args)])


def _args(data, run_dir, framework, steps=STEPS, *extra):
    return ["--family", "gpt", "--data", data, "--steps", steps, "--seq-len", 16,
            "--batch-size", 2, "--framework", framework, "--checkpoint-dir", run_dir,
            "--checkpoint-every", 1, "--keep", 3, "--progress", "none", *extra]


def _losses(run_dir):
    return [(r["step"], r["loss"]) for r in map(
        json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def _snapshot(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(framework)``: (framework, data, run directory) of a finished run of STEPS steps
    with a checkpoint after each, made once per framework (the tests only copy it)."""
    made = {}

    def get(framework):
        if framework not in made:
            root = tmp_path_factory.mktemp(f"damage_{framework}")
            data = write_corpus(root / "corpus.txt")
            run_dir = root / "run"
            assert train(*_args(data, run_dir, framework)) == 0
            made[framework] = framework, data, run_dir
        return made[framework]

    return get


def _step_dir(run_dir, framework, step):
    return run_dir / "checkpoints" / (str(step) if framework == "jax" else f"step_{step}")


def _truncate_arrays(run_dir, framework):
    if framework == "torch":
        path = _step_dir(run_dir, framework, STEPS) / "state.pt"
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return "state.pt"
    data = _step_dir(run_dir, framework, STEPS) / "state" / "ocdbt.process_0" / "d"
    for path in data.iterdir():
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return "state"


def _flip_array_bytes(run_dir, framework):
    """Bytes of the largest array file changed, its length kept: only the CRC-32s can tell."""
    data = _step_dir(run_dir, framework, STEPS) / "state" / "ocdbt.process_0" / "d"
    path = max(data.iterdir(), key=lambda p: p.stat().st_size)
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle: middle + 64] = bytes(64)
    path.write_bytes(bytes(raw))
    return "state"


def _delete_state(run_dir, framework):
    step = _step_dir(run_dir, framework, STEPS)
    if framework == "torch":
        (step / "state.pt").unlink()
        return "state.pt: missing"
    shutil.rmtree(step / "state")
    return "commit_success.txt: missing"


def _garbage_meta(run_dir, framework):
    step = _step_dir(run_dir, framework, STEPS)
    path = step / ("meta.json" if framework == "torch" else "meta/metadata")
    path.write_text("{not json")
    return path.name


def _wrong_shapes(run_dir, framework):
    """Step STEPS replaced by a checkpoint of a model with a larger vocabulary."""
    from jaxformer.config import GPTConfig
    from jaxformer.training.config import TrainConfig

    identity = json.loads((run_dir / "run.json").read_text())["identity"]
    fields = {k: v for k, v in identity["model_config"].items() if k != "class"}
    model_cfg = GPTConfig(**{**fields, "vocab_size": fields["vocab_size"] + 3})
    config = TrainConfig(**identity["train_config"])
    shutil.rmtree(_step_dir(run_dir, framework, STEPS))
    if framework == "jax":
        from jaxformer.training.checkpoint import Checkpointer
        from jaxformer.training.step import TrainStep, build_model

        trainer = TrainStep("gpt", build_model("gpt", model_cfg, 0), config)
    else:
        from torch_ref.training.checkpoint import Checkpointer
        from torch_ref.training.step import TrainStep, build_model

        trainer = TrainStep("gpt", build_model("gpt", model_cfg, 0), config)
    trainer.step = STEPS
    checkpointer = Checkpointer(run_dir / "checkpoints", keep=3)
    checkpointer.save(trainer, {"step": STEPS, "identity": identity, "data_position": STEPS})
    checkpointer.close()
    return "the model needs" if framework == "jax" else "does not fit the model"


def _garbage_run_json(run_dir, framework):
    (run_dir / "run.json").write_text('{"identity": ')
    return "run.json: not valid JSON"


def _run_json_without_identity(run_dir, framework):
    (run_dir / "run.json").write_text('{"label_names": null}')
    return "run.json: has no 'identity' object"


def _garbage_tokenizer(run_dir, framework):
    (run_dir / "tokenizer.json").write_text("")
    return "tokenizer.json: empty"


def _other_tokenizer(run_dir, framework):
    other = vocab.wordpiece_tokenizer([" ".join(WORDS[:5])], 20)
    other.save(str(run_dir / "tokenizer.json"))
    return "tokenizer.json: holds"


# (damage, the frameworks whose code it reaches, whether it damages the latest checkpoint)
DAMAGES = [
    (_truncate_arrays, ("jax", "torch"), True),
    (_flip_array_bytes, ("jax",), True),
    (_delete_state, ("jax", "torch"), True),
    (_garbage_meta, ("jax", "torch"), True),
    (_wrong_shapes, ("jax", "torch"), True),
    (_garbage_run_json, ("jax",), False),
    (_run_json_without_identity, ("jax",), False),
    (_garbage_tokenizer, ("torch",), False),
    (_other_tokenizer, ("torch",), False),
]


CASES = [(framework, damage, checkpoint) for damage, frameworks, checkpoint in DAMAGES
         for framework in frameworks]


@pytest.mark.parametrize(("framework", "damage", "checkpoint"), CASES,
                         ids=[f"{f}-{d.__name__.strip('_')}" for f, d, _ in CASES])
def test_a_damaged_file_is_named(runs, tmp_path, capsys, framework, damage, checkpoint):
    _, data, source = runs(framework)
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    message = damage(run_dir, framework)
    before = _snapshot(run_dir)
    capsys.readouterr()
    strict = ["--resume-strict"] if checkpoint else []
    assert train(*_args(data, run_dir, framework), "--resume", *strict) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxformer train: error: "), err
    assert len(err.strip().splitlines()) == 1, err
    assert message in err, err
    assert "Traceback" not in err
    if checkpoint:
        assert "--resume-strict: not resuming from an earlier checkpoint" in err
    assert _snapshot(run_dir) == before  # nothing changed


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_good_one(runs, tmp_path, capsys,
                                                                       framework):
    _, data, source = runs(framework)
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    _truncate_arrays(run_dir, framework)
    capsys.readouterr()
    assert train(*_args(data, run_dir, framework), "--resume") == 0
    captured = capsys.readouterr()
    assert f"warning: checkpoint step {STEPS} is damaged" in captured.err
    assert f"resuming from step {STEPS - 1}, the newest good checkpoint" in captured.err
    assert f"resuming {run_dir} from step {STEPS - 1}" in captured.out
    assert _losses(run_dir) == _losses(source)  # step STEPS again, bit for bit
    assert (run_dir / "checkpoints-damaged" / _step_dir(run_dir, framework, STEPS).name).is_dir()
    again = _step_dir(run_dir, framework, STEPS)
    assert again.is_dir()  # saved anew, whole


def test_a_checkpoint_without_its_commit_marker_is_incomplete(runs, tmp_path, capsys):
    """orbax renames a finished checkpoint into place and writes commit_success.txt before;
    a step directory without it is never restored (torch: the rename alone, tested by
    test_checkpoint.py's unfinished saves)."""
    framework, data, source = runs("jax")
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    (_step_dir(run_dir, framework, STEPS) / "commit_success.txt").unlink()
    assert train(*_args(data, run_dir, framework), "--resume", "--resume-strict") == 2
    assert "commit_success.txt: missing: the checkpoint is incomplete" in capsys.readouterr().err


def test_a_constant_schedule_run_extends_exactly(tmp_path, capsys):
    """10 constant-schedule steps, then --resume --steps 20 (the derived warm-up, 2, is not
    taken: the run keeps its own, 1): the losses of a 20-step run from the start."""
    data = write_corpus(tmp_path / "corpus.txt")
    common = ["--schedule", "constant", "--dropout", "0.1"]
    assert train(*_args(data, tmp_path / "short", "torch", 10, *common)) == 0
    assert train(*_args(data, tmp_path / "short", "torch", 20, *common), "--resume") == 0
    assert "resuming" in capsys.readouterr().out
    assert train(*_args(data, tmp_path / "long", "torch", 20, *common, "--warmup", 1)) == 0
    assert _losses(tmp_path / "short") == _losses(tmp_path / "long")
    saved = json.loads((tmp_path / "short" / "run.json").read_text())["identity"]
    assert saved["train_config"]["steps"] == 20
    assert saved["train_config"]["warmup_steps"] == 1


def test_other_schedules_refuse_to_extend(tmp_path, capsys):
    data = write_corpus(tmp_path / "corpus.txt")
    run_dir = tmp_path / "run"
    assert train(*_args(data, run_dir, "torch", 4, "--schedule", "cosine")) == 0
    before = _snapshot(run_dir)
    capsys.readouterr()
    assert train(*_args(data, run_dir, "torch", 8, "--schedule", "cosine"), "--resume") == 2
    err = capsys.readouterr().err
    assert "cannot extend" in err
    assert "from 4 to 8 steps" in err
    assert "Start a new run (another --checkpoint-dir) from this run's final weights" in err
    assert _snapshot(run_dir) == before
    assert np.isfinite([loss for _, loss in _losses(run_dir)]).all()


def test_no_restorable_checkpoint_is_refused(runs, tmp_path, capsys):
    framework, data, source = runs("torch")  # the loop's logic, the same for both
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    for path in (run_dir / "checkpoints").glob("step_*/state.pt"):
        path.write_bytes(b"")
    before = _snapshot(run_dir)
    capsys.readouterr()
    assert train(*_args(data, run_dir, framework), "--resume") == 2
    err = capsys.readouterr().err
    assert f"step_{STEPS - 2}/state.pt: cannot be read" in err
    assert "no checkpoint of" in err
    assert "can be restored (damaged: steps [1, 2, 3]; nothing was changed)" in err
    assert _snapshot(run_dir) == before
