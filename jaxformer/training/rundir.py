"""The run directory of ``jaxformer train`` (shared glue, no twin): where a run lives on disk.

One run lives in one directory (``--checkpoint-dir``, default ``runs/FAMILY-PRESET``):
``run.json`` (the run identity, the classifier's label names and how the run evaluates),
``tokenizer.json``, ``checkpoints/``, by default ``metrics.jsonl`` and its plot. Used by
``loop.prepare`` to refuse a directory or a resume that does not fit, naming each difference,
before anything is written; by ``loop.train`` to resume from the newest whole checkpoint
(:func:`resume_latest`) and to export the trained model (:func:`export_hf`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from jaxformer import outputs
from jaxformer.training.config import identity_differences


class ResumeError(ValueError):
    """The run directory cannot be (re)used as asked: names the reason or every difference."""


class DamagedFile(ValueError):
    """A file of a run cannot be read or does not fit the run: ``"PATH: what is wrong"``."""

    def __init__(self, path, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{path}: {problem}")


class CheckpointDamaged(DamagedFile):
    """A checkpoint that cannot be restored (``step``): the file and what is wrong with it."""

    def __init__(self, step: int, path, problem: str):
        self.step = step
        super().__init__(path, problem)


# What run.json's identity must hold (``config.run_identity``), with each value's JSON type.
_IDENTITY_FIELDS = {"family": str, "framework": str, "data_sha256": str, "model_config": dict,
                    "train_config": dict}


def read_json(path: Path, what: str = "a JSON object"):
    """The JSON object in ``path``, or a :class:`DamagedFile` naming it and the problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DamagedFile(path, "missing") from None
    except (OSError, UnicodeDecodeError) as error:
        raise DamagedFile(path, f"cannot be read ({error})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        problem = "empty" if not text.strip() else f"not valid JSON ({error})"
        raise DamagedFile(path, f"{problem}; expected {what}") from None
    if not isinstance(value, dict):
        raise DamagedFile(path, f"holds a JSON {type(value).__name__}, expected {what}")
    return value


def read_run(run_dir: Path) -> dict:
    """``run.json``, validated: an object whose ``identity`` holds every field of a run."""
    path = run_dir / "run.json"
    run = read_json(path, "the run's identity (run.json)")
    identity = run.get("identity")
    if not isinstance(identity, dict):
        raise DamagedFile(path, "has no 'identity' object")
    for name, kind in _IDENTITY_FIELDS.items():
        if not isinstance(identity.get(name), kind):
            raise DamagedFile(path, f"identity.{name} is missing or not a JSON "
                                    f"{'string' if kind is str else 'object'}")
    field = vocab_field(identity["model_config"])
    vocab_size = identity["model_config"].get(field)
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise DamagedFile(path, f"identity.model_config.{field} is missing or not an integer")
    labels = run.get("label_names")
    if labels is not None and not (isinstance(labels, list)
                                   and all(isinstance(x, str) for x in labels)):
        raise DamagedFile(path, "label_names must be a list of strings")
    return run


def vocab_field(model_config: dict) -> str:
    """The field of a run's model config (as run.json holds it) that the tokenizer sizes: the
    encoder-decoder's target vocabulary (``tgt_vocab_size``; jaxformer shares one tokenizer
    between source and target), every other family's ``vocab_size``."""
    return "tgt_vocab_size" if "tgt_vocab_size" in model_config else "vocab_size"


def run_directory(checkpoint_dir: str | None, family: str, preset: str) -> Path:
    """``--checkpoint-dir``, or ``runs/FAMILY-PRESET``."""
    return Path(checkpoint_dir or f"runs/{family}-{preset}")


def check_usable(run_dir: Path, resume: bool) -> None:
    """A fresh run needs a directory without a run; ``--resume`` needs one with a run."""
    run_json = run_dir / "run.json"
    if resume and not run_json.is_file():
        raise ResumeError(f"--resume: {run_dir} holds no run to resume (no run.json)")
    if not resume and (run_json.is_file() or (run_dir / "checkpoints").exists()):
        raise ResumeError(f"{run_dir} already holds a run; pass --resume to continue it or "
                          f"choose another --checkpoint-dir (nothing was overwritten)")


def check_identity(run_dir: Path, identity: dict, saved: dict | None = None) -> None:
    """Refuse to resume ``run_dir`` when its recorded identity (or ``saved``, that identity as
    an extension changes it) differs from ``identity``."""
    saved = read_run(run_dir)["identity"] if saved is None else saved
    differences = identity_differences(saved, identity)
    if differences:
        raise ResumeError(f"cannot resume {run_dir}: its run differs from this one "
                          f"(nothing was written):\n  " + "\n  ".join(differences))


def write_run(run_dir: Path, identity: dict, tokenizer, label_names: list[str] | None,
              evaluation: dict | None = None) -> None:
    """A new run: the directory, its ``tokenizer.json`` and its ``run.json`` (with
    ``evaluation``, how the run evaluates, when given)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(run_dir / "tokenizer.json"))
    run = {"identity": identity, "label_names": label_names}
    if evaluation is not None:
        run["evaluation"] = evaluation
    write_atomic(run_dir / "run.json", json.dumps(run, indent=1))


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:  # an exception (an interrupt included) leaves no temporary file behind
        tmp.unlink(missing_ok=True)


EXPORT_KIND = "hf-export"  # the outputs.MARKER kind of a --export-hf directory


def output_paths(run_dir: Path, options) -> tuple[Path, Path]:
    """The metrics file (``--metrics``, default ``DIR/metrics.jsonl``) and the plot (``--plot``,
    default: the metrics path with ``.png``)."""
    metrics_path = Path(options.metrics) if options.metrics else run_dir / "metrics.jsonl"
    return metrics_path, Path(options.plot) if options.plot else metrics_path.with_suffix(".png")


def _is_metrics(path: Path) -> bool:
    """A metrics file of a run: every line a JSON object with ``step`` and ``loss``."""
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        return all(isinstance(r := json.loads(line), dict) and {"step", "loss"} <= r.keys()
                   for line in lines)
    except (OSError, ValueError):
        return False


def _is_png(path: Path) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False


def check_outputs(run_dir: Path, options) -> None:
    """Every output of the run may be written (``jaxformer.outputs``), before any work: a fresh
    run's directory is absent or empty; its metrics and plot files are new, or, on ``--resume``,
    the run's own (a metrics file, a PNG), which the run rewrites; neither is a file of the run
    directory, the data, or the other; ``--export-hf`` is apart from the run directory, the
    metrics, the plot and the data, and is new, empty, or a previous export with
    ``--overwrite``; every directory written into is writable."""
    run_flag = "--checkpoint-dir" if options.checkpoint_dir else "--checkpoint-dir (default)"
    if not options.resume:
        outputs.check_directory(run_flag, run_dir, "a jaxformer run", overwrite=False,
                                previous=lambda d: False, replaced=False)
    else:
        outputs.check_writable(run_flag, run_dir)
    metrics_path, plot_path = output_paths(run_dir, options)
    run_files = {f"the run's {name} ({run_flag} {run_dir})": run_dir / name
                 for name in ("run.json", "tokenizer.json", "config.toml", "checkpoints")}
    data_files = {what: path for what, path in (
        (f"the data file (--data {options.data})", options.data),
        (f"the validation file (--val-data {options.val_data})", options.val_data))
        if path and Path(path).is_file()}  # a directory or nothing: data.read_text says so
    for flag, path, other, ours in (
            ("--metrics", metrics_path, {f"the plot (--plot {plot_path})": plot_path},
             _is_metrics),
            ("--plot", plot_path, {f"the metrics file (--metrics {metrics_path})": metrics_path},
             _is_png)):
        flag = flag if getattr(options, flag[2:]) else f"{flag} (default)"
        outputs.check_new_file(flag, path, ours=ours if options.resume else None,
                               keep={**run_files, **data_files, **other})
    if options.export_hf:
        outputs.check_directory(
            "--export-hf", options.export_hf, "a previous --export-hf export",
            overwrite=options.overwrite, previous=outputs.has_marker(EXPORT_KIND),
            keep={f"the run directory ({run_flag} {run_dir})": run_dir,
                  f"the metrics file (--metrics {metrics_path})": metrics_path,
                  f"the plot (--plot {plot_path})": plot_path, **data_files})


def run_tokenizer(run_dir: Path, saved_run: dict):
    """The run's ``tokenizer.json``, checked against the vocabulary of the run's model."""
    from tokenizers import Tokenizer

    path = run_dir / "tokenizer.json"
    read_json(path, "a tokenizers tokenizer.json")  # missing, empty, not JSON
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception
        raise DamagedFile(path, f"not a tokenizers tokenizer ({str(error)[:200]})") from None
    model_config = saved_run["identity"]["model_config"]
    expected = model_config[vocab_field(model_config)]
    if tokenizer.get_vocab_size() != expected:
        raise DamagedFile(path, f"holds {tokenizer.get_vocab_size()} tokens, but the run's model "
                                f"(run.json) has a vocabulary of {expected}: not the tokenizer "
                                f"the run was trained with")
    return tokenizer


def extension(run_dir: Path, saved_run: dict, identity: dict, options) -> dict:
    """``identity`` as resumed: the run's own warm-up when the flags derived one, and more
    ``steps`` than the run's only for the constant schedule (any other decays over the run's
    length, so the learning rate of the steps already taken would change)."""
    saved, now = saved_run["identity"]["train_config"], dict(identity["train_config"])
    if not options.warmup_given and "warmup_steps" in saved:
        now["warmup_steps"] = saved["warmup_steps"]
    old_steps, new_steps = saved.get("steps"), now["steps"]
    if isinstance(old_steps, int) and new_steps > old_steps and (
            saved.get("schedule") != "constant" or now["schedule"] != "constant"):
        raise ResumeError(
            f"cannot extend {run_dir} from {old_steps} to {new_steps} steps: its "
            f"{saved.get('schedule')} schedule decays over the run's {old_steps} steps, so the "
            f"steps already taken would have had other learning rates. Start a new run (another "
            f"--checkpoint-dir) from this run's final weights instead; only runs with --schedule "
            f"constant can be extended (nothing was written)")
    return {**identity, "train_config": now}


def resume_latest(checkpointer, trainer, accumulation_steps: int, strict: bool, run_dir: Path,
                  stream) -> int:
    """``--resume``: restore the newest checkpoint that is whole into ``trainer`` and return its
    step. A damaged newer one is reported and set aside (``DIR-damaged/``), with a warning naming
    both steps, unless ``strict`` (``--resume-strict``), which makes it an error; none at all:
    step 0. A checkpoint of step N must hold the state of step N and record the data position
    ``N * accumulation_steps``."""
    damaged: list[CheckpointDamaged] = []
    for step in reversed(checkpointer.steps()):
        try:
            meta = checkpointer.restore(trainer, step)
            expected = step * accumulation_steps
            if trainer.step != step:
                raise CheckpointDamaged(step, checkpointer.path(step), f"holds the state of step "
                                        f"{trainer.step}, not {step}")
            if meta.get("data_position") != expected:
                raise CheckpointDamaged(step, checkpointer.meta_path(step), f"records data "
                                        f"position {meta.get('data_position')!r}, expected "
                                        f"{expected}")
        except CheckpointDamaged as error:
            if strict:
                raise CheckpointDamaged(error.step, error.path, f"{error.problem} "
                                        f"(--resume-strict: not resuming from an earlier "
                                        f"checkpoint; nothing was changed)") from None
            damaged.append(error)
            continue
        for bad in damaged:
            moved = checkpointer.set_aside(bad.step)
            print(f"jaxformer train: warning: checkpoint step {bad.step} is damaged ({bad}); "
                  f"resuming from step {step}, the newest good checkpoint; step {bad.step} "
                  f"was moved to {moved}", file=sys.stderr, flush=True)
        print(f"resuming {run_dir} from step {step}", file=stream, flush=True)
        return step
    if damaged:
        raise CheckpointDamaged(damaged[-1].step, damaged[-1].path, f"{damaged[-1].problem}; no "
                                f"checkpoint of {checkpointer.directory} can be restored "
                                f"(damaged: steps {sorted(d.step for d in damaged)}; nothing was "
                                f"changed)")
    print(f"{run_dir} has no checkpoint yet: starting from step 0", file=stream, flush=True)
    return 0


def export_hf(model, run_dir: Path, path: Path, overwrite: bool = False) -> None:
    """The trained model as a Hugging Face directory (``config.json``, ``model.safetensors``)
    with the run's ``tokenizer.json`` beside them and an ``outputs.MARKER`` that lets a later
    ``--overwrite`` recognise the export; written whole or not at all. Refuses (again, in case
    it changed during the run) a target ``outputs.check_directory`` refuses."""
    from jaxformer.checkpoints.hf import save_pretrained
    from jaxformer.checkpoints.hf.files import CONFIG, SAFETENSORS
    from jaxformer.tokenizer import export_token_ids

    outputs.check_directory("--export-hf", path, "a previous --export-hf export",
                            overwrite=overwrite, previous=outputs.has_marker(EXPORT_KIND),
                            keep={f"the run directory ({run_dir})": run_dir})
    files = {"tokenizer.json": (run_dir / "tokenizer.json").read_bytes()}
    marker = outputs.marker_text(EXPORT_KIND, [CONFIG, SAFETENSORS, *files])
    save_pretrained(model, path, overwrite=True,
                    extra_files={**files, outputs.MARKER: marker.encode()},
                    token_ids=export_token_ids(model, run_dir / "tokenizer.json"),
                    label_names=read_run(run_dir).get("label_names"))
