"""``jaxformer train`` over two processes of 4 CPU devices each, and its multi-process options.

The processes are started by ``python -m jaxformer.sharding launch`` (a free local port, bounded
in time, every process stopped when one fails) and train one model over the 8-device mesh
``data=2,fsdp=2,tensor=2``. The one-process references run here, on this process's one device.
The bound is the suite's for sharding (docs/design.md: sharded vs one device, losses equal to
1e-5 relative); the runs use a constant learning rate, so that a 3-step run extends to 6 steps
with ``--resume`` and the two halves meet the 6-step reference step for step.

- bert: two processes train steps 1-3 and write the checkpoint; one process resumes it (steps
  4-6). Dropout 0: the dropout sites' RNG would double each compilation (the reference's and the
  two processes'); gpt keeps the preset's dropout, so the RNG state crosses the resume there.
- gpt: one process trains steps 1-3 (the reference's own checkpoint); two processes resume it
  and export the model (``--export-hf``: the sharded parameters gathered, process 0 writes),
  which is held to the reference's export by the design's bound on parameters after N steps.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxformer import cli
from jaxformer.sharding import launch
from jaxformer.training.checkpoint import Checkpointer
from parity_tests.support.bounds import check
from parity_tests.support.helpers import fast_compile_flags
from parity_tests.support.training import write_corpus

LOSS_RTOL = 1e-5  # docs/design.md: sharded vs one device
PARAMS_RTOL = 1e-4  # docs/design.md: parameters after N optimizer steps (global L2)
TIMEOUT = 600  # seconds, for a loaded 2-core machine; an idle one needs a fifth of it
MESH = "data=2,fsdp=2,tensor=2"
# A tiny run with a constant learning rate (extensible with --resume) and every output quiet.
COMMON = ("--steps", "6", "--schedule", "constant", "--warmup", "1", "--batch-size", "8",
          "--seq-len", "16", "--progress", "plain", "--log-every", "1")


def train(*args) -> int:
    return cli.main(["train", *map(str, args)])


def losses(run_dir) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))  # written once each
    return [r["loss"] for r in records]


def two_processes(*args) -> list[str]:
    return launch.launch(2, 4, [*map(str, args)], timeout=TIMEOUT)


@pytest.fixture(autouse=True)
def fast_compile(monkeypatch):
    """The launched processes compile without LLVM's expensive optimisations: a third less time
    at this size, and the same arithmetic up to the order of float32 sums, which the bound
    covers (``helpers.FAST_COMPILE``)."""
    monkeypatch.setenv("XLA_FLAGS", fast_compile_flags())


def params_diff(expected: dict, actual: dict) -> float:
    """The parameters' global L2 distance relative to their norm."""
    num = sum(float(np.sum((expected[k] - actual[k]).astype(np.float64) ** 2)) for k in expected)
    den = sum(float(np.sum(expected[k].astype(np.float64) ** 2)) for k in expected)
    return (num / den) ** 0.5


def rel_diff(expected, actual) -> float:
    expected, actual = np.asarray(expected), np.asarray(actual)
    assert expected.shape == actual.shape
    return float(np.max(np.abs(expected - actual) / np.abs(expected)))


def check_outputs(outputs: list[str], first: int, last: int) -> None:
    """Process 0 reports steps ``first`` to ``last``; process 1 trains silently."""
    steps = [int(n) for n in re.findall(r"^step (\d+)/\d+ ", outputs[0], re.M)]
    assert steps == list(range(first, last + 1)), outputs[0][-2000:]
    assert "trained " in outputs[0]
    assert not re.search(r"^step \d+/|trained |resuming ", outputs[1], re.M), outputs[1][-2000:]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("multiprocess") / "corpus.txt")


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_two_processes_equal_one_and_share_checkpoints(family, corpus, tmp_path):
    reference_dir = tmp_path / "reference"
    common = (*COMMON, "--dropout", 0) if family == "bert" else COMMON
    export = ("--export-hf", tmp_path / "hf-one") if family == "gpt" else ()
    assert train("--family", family, "--data", corpus, *common, "--checkpoint-every", 3,
                 "--checkpoint-dir", reference_dir, *export) == 0
    reference = losses(reference_dir)
    assert len(reference) == 6
    assert reference[-1] < reference[0]
    run_dir = tmp_path / "run"
    if family == "bert":  # two processes write step 3, one process resumes it
        outputs = two_processes("--family", family, "--data", corpus, *common, "--steps", 3,
                                "--mesh", MESH, "--checkpoint-dir", run_dir)
        check_outputs(outputs, 1, 3)
        assert Checkpointer(run_dir / "checkpoints").steps() == [3]
        assert (run_dir / "metrics.png").is_file()
        assert train("--family", family, "--data", corpus, *common, "--checkpoint-dir", run_dir,
                     "--resume") == 0
    else:  # one process wrote step 3 (the reference's checkpoint), two processes resume it
        shutil.copytree(reference_dir, run_dir)
        shutil.rmtree(run_dir / "checkpoints" / "6")
        outputs = two_processes("--family", family, "--data", corpus, *common, "--mesh", MESH,
                                "--checkpoint-dir", run_dir, "--resume",
                                "--export-hf", tmp_path / "hf-two")
        check_outputs(outputs, 4, 6)
        assert "resuming" in outputs[0]
        # the export gathers the sharded parameters; process 0 writes it
        one, two = (load_file(str(tmp_path / d / "model.safetensors"))
                    for d in ("hf-one", "hf-two"))
        assert one.keys() == two.keys()
        assert all(one[k].shape == two[k].shape for k in one)
        check(params_diff(one, two), PARAMS_RTOL, "gpt: two processes' exported parameters")
    assert Checkpointer(run_dir / "checkpoints").steps() == [3, 6]
    check(rel_diff(reference, losses(run_dir)), LOSS_RTOL,
          f"{family}: two processes' losses against one device's")


# ---------------------------------------------------------------------------------------------
# Bad options: one line naming the flag, exit 2, before anything is joined or written
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (("--process-id", 1), "--process-id 1 needs --num-processes"),
    (("--num-processes", 2, "--process-id", 2, "--coordinator", "127.0.0.1:1"),
     "--process-id 2 is out of range for --num-processes 2 (0 to 1)"),
    (("--num-processes", 2, "--process-id", -1, "--coordinator", "127.0.0.1:1"),
     "--process-id -1 is out of range"),
    (("--num-processes", 0, "--process-id", 0, "--coordinator", "127.0.0.1:1"),
     "--num-processes must be at least 1, got 0"),
    (("--num-processes", 2, "--process-id", 0, "--coordinator", "127.0.0.1:1", "--framework",
      "torch"), "--coordinator trains over several processes in JAX; --framework torch"),
    (("--num-processes", 2, "--framework", "torch"), "--framework torch trains in one process"),
    (("--num-processes", 2, "--process-id", 0), "--num-processes needs --coordinator HOST:PORT"),
    (("--num-processes", 2), "--num-processes needs --coordinator HOST:PORT, --num-processes N "
                             "and --process-id I together"),
    (("--coordinator", "node0", "--num-processes", 2, "--process-id", 0),
     "--coordinator 'node0' is not HOST:PORT"),
    (("--mesh", "data=2,fsdp=2"), "--mesh data=2,fsdp=2: mesh data=2,fsdp=2,tensor=1 needs 4 "
                                  "devices"),
])
def test_bad_options_name_the_flag(args, message, corpus, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train("--family", "gpt", "--data", corpus, "--checkpoint-dir", run_dir, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxformer train: error: "), err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not run_dir.exists()


def test_launch_stops_every_process_when_one_fails(tmp_path):
    """A bad command line ends both processes (usage errors, before JAX starts) and the launcher
    names the failing one and its output."""
    with pytest.raises(RuntimeError, match=r"process \d of 2 exited with status 2\b[\s\S]*"
                                           r"--data"):
        launch.launch(2, 1, ["--family", "gpt", "--checkpoint-dir", str(tmp_path / "run")],
                      timeout=TIMEOUT)
    assert not (tmp_path / "run").exists()
