"""The training loop behind ``jaxformer train``, for either framework (shared glue, no twin).

:func:`prepare` does everything before the first step (every refusal first); :func:`train` builds
the step of ``frameworks.module(framework, "training.step")``, runs its updates (``updates``:
evaluations, checkpoints, reports, signals), and ends the run (the last save, the export, the
plot); the run's files are ``rundir``'s. Nothing here imports torch.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

from jaxformer import frameworks
from jaxformer.training import (
    config_file,
    data,
    init,
    interrupts,
    reporting,
    rundir,
    startup,
    tasks,
    vocab,
)
from jaxformer.training.config import TrainConfig, run_identity
from jaxformer.training.interrupts import RunAborted, RunInterrupted
from jaxformer.training.options import (
    CHECKPOINT_EVERY,
    FRAMEWORKS,
    PROGRESS,
    RunOptions,
    RunResult,
)
from jaxformer.training.rundir import CheckpointDamaged, DamagedFile, ResumeError
from jaxformer.training.updates import TrainingDiverged, Updates, data_tokens

__all__ = ["CHECKPOINT_EVERY", "FRAMEWORKS", "PROGRESS", "CheckpointDamaged", "DamagedFile",
           "ResumeError", "RunAborted", "RunInterrupted", "RunOptions", "RunResult",
           "TrainingDiverged", "build_trainer", "data_tokens", "prepare", "train"]


def build_trainer(family, framework, model_cfg, config, options, init=None):
    """The step and the checkpointer class of ``framework``, from the seed's weights: the torch
    twin starts from the very weights jaxformer initialises (a numpy state dict). ``init``
    (``--init-from``): a function of that state dict that returns it with the checkpoint's
    weights in place (``training.init.match``), so both frameworks start from the same
    checkpoint weights and the same fresh heads."""
    weights = None
    if framework != "jax" or init is not None:
        from jaxformer.checkpoints import convert
        from jaxformer.training import step as jax_step

        weights = convert.nnx_to_torch(jax_step.build_model(family, model_cfg, config.seed))
        if init is not None:
            weights = init(weights)
    step = frameworks.module(framework, "training.step")
    checkpointer = frameworks.module(framework, "training.checkpoint").Checkpointer
    return step.build_trainer(family, model_cfg, config, options, weights), checkpointer


def prepare(config: TrainConfig, options: RunOptions, status: startup.Status | None = None):
    """Everything before the first step, with every refusal before anything is written;
    ``status`` shows the tokenizer and data phases."""
    status = status or startup.Status(enabled=False)
    options.check()
    if options.mesh:  # the mesh fits the devices and the batch, before anything is written
        from jaxformer.sharding import distributed

        distributed.check_mesh(options.mesh, config.micro_batch_size)
    run_dir = rundir.run_directory(options.checkpoint_dir, options.family, options.preset_label)
    rundir.check_usable(run_dir, options.resume)
    rundir.check_outputs(run_dir, options)
    if config.gpt_windows != "packed" and options.family != "gpt":
        raise ValueError(f"gpt_windows {config.gpt_windows!r} is for the gpt family only, got "
                         f"family {options.family!r}")
    task = tasks.get(options.family)
    saved_run: dict = rundir.read_run(run_dir) if options.resume else {}
    if options.resume:
        _check_resumed_init(run_dir, saved_run, options)
    source = None
    if options.init_from:  # the architecture and the tokenizer are the checkpoint's
        source = init.read(options.init_from)
        init.check_family(source, task)
        init.check_flags(source, task, options)
    text = data.read_text(options.data)
    val_text = data.read_text(options.val_data) if options.val_data else None
    base = task.model_config(options.preset_label) if source is None else source.config
    with status.phase("tokenizer", _tokenizer_phase(options, run_dir)):
        if options.resume:
            tokenizer = rundir.run_tokenizer(run_dir, saved_run)
        elif source is not None:
            tokenizer = source.tokenizer
        elif options.tokenizer:
            # a character vocabulary spans both files, as nanoGPT's spans its whole corpus;
            # learned vocabularies see the training text only
            vocab_text = text + (val_text or "") if options.tokenizer == "char" else text
            tokenizer = vocab.build_tokenizer(options.tokenizer, vocab_text,
                                              options.vocab_size or task.vocab_size(base))
        else:
            tokenizer = vocab.wordpiece_tokenizer(text.splitlines(),
                                                  options.vocab_size or task.vocab_size(base))
    eval_fraction = 0.1 if options.eval_every and val_text is None else 0.0
    with status.phase("data", f"{options.family} examples from {options.data}"):
        train_set, eval_set = task.build_datasets(text, tokenizer, config, eval_fraction,
                                                  eval_text=val_text)
    specials = task.special_ids(tokenizer)
    model_cfg = task.configure(base, vocab_size=None if source else tokenizer.get_vocab_size(),
                               pad_id=specials.get("[PAD]"), num_labels=train_set.num_labels,
                               dropout=options.dropout, dtype=options.dtype,
                               param_dtype=options.param_dtype,
                               scan_layers=options.scan_layers, remat=options.remat)
    if config.seq_len > model_cfg.max_position_embeddings:
        what = (f"the {options.preset_label} preset's" if source is None
                else f"the checkpoint's ({options.init_from})")
        raise ValueError(f"seq_len ({config.seq_len}) exceeds {what} "
                         f"max_position_embeddings ({model_cfg.max_position_embeddings})")
    if options.export_hf:  # refused before training, not after it
        from jaxformer.checkpoints.hf import UnsupportedConfigError, export_architecture
        try:
            export_architecture(task.model_module.removeprefix("models."), task.model, model_cfg)
        except UnsupportedConfigError as error:
            raise ValueError(f"--export-hf: the {options.preset_label} preset {error}") from None
    identity = run_identity(options.family, options.framework, model_cfg, config,
                            data.file_sha256(options.data))
    if source is not None:
        identity["init_from"] = source.record()
    if options.val_data:
        identity["val_data_sha256"] = data.file_sha256(options.val_data)
    # several processes: the same run and tokenizer everywhere (every process has made its
    # checks by now: this waits for all), then process 0 alone writes
    primary = _processes_agree(identity, tokenizer)
    if options.resume:
        identity = rundir.extension(run_dir, saved_run, identity, options)
        saved = saved_run["identity"]
        extended = identity["train_config"]["steps"] > saved["train_config"].get("steps", 0)
        rundir.check_identity(run_dir, identity, saved={  # an extension changes the steps
            **saved, "train_config": {**saved["train_config"],
                                      "steps": identity["train_config"]["steps"]}}
            if extended else saved)
        updated = {**saved_run, "identity": identity,  # extended: the run is now this long
                   "evaluation": _evaluation(options)}
        if updated != saved_run and primary:
            rundir.write_atomic(run_dir / "run.json", json.dumps(updated, indent=1))
    elif primary:
        rundir.write_run(run_dir, identity, tokenizer, getattr(train_set, "label_names", None),
                         _evaluation(options))
    return run_dir, identity, model_cfg, train_set, eval_set, source


def _check_resumed_init(run_dir: Path, saved_run: dict, options: RunOptions) -> None:
    """``--resume`` repeats the run's own ``--init-from`` (as every flag of the run; the command
    printed on an interrupt does), and gives none to a run that did not start from one."""
    saved = saved_run["identity"].get("init_from")
    if saved and not options.init_from:
        raise ResumeError(f"cannot resume {run_dir}: the run started from --init-from "
                          f"{saved.get('path')}; give the same --init-from with --resume (its "
                          f"weights are then those of the run's checkpoint; nothing was written)")
    if options.init_from and not saved:
        raise ResumeError(f"cannot resume {run_dir} with --init-from {options.init_from}: the run "
                          f"did not start from a checkpoint, and --resume continues from its own "
                          f"(drop --init-from, or start a new run in another --checkpoint-dir; "
                          f"nothing was written)")


def initializer(source, options: RunOptions, train_set, run_dir: Path, stream,
                primary: bool = True):
    """``build_trainer``'s ``init`` for ``--init-from``: matches the checkpoint's weights to the
    task's model, prints what was loaded, created fresh and dropped, and records it in
    ``run.json`` (``init``)."""
    if source is None:
        return None

    def apply(fresh):
        labels = getattr(train_set, "label_names", None)
        renew = {}
        if source.label_names is not None and labels is not None and source.label_names != labels:
            renew["classifier"] = (f"the checkpoint's labels {source.label_names} are not the "
                                   f"data's {labels}")
        result = init.initial_weights(source, options.family, fresh, renew)
        for line in result.report(source, options.family):
            print(line, file=stream, flush=True)
        run = rundir.read_run(run_dir)
        if primary and run.get("init") != result.to_json():
            rundir.write_atomic(run_dir / "run.json",
                                json.dumps({**run, "init": result.to_json()}, indent=1))
        return result.weights

    return apply


def _compile_helper(family, model_cfg, config, options, train_set, eval_set, stream):
    """The helper process that compiles jaxformer's train step while the run builds its model
    (``training.precompile``: on the CPU, a step compiled in the process runs slower than one
    loaded from the compilation cache), or None."""
    if options.framework != "jax":
        return None
    from jaxformer.training import precompile

    if not precompile.wanted(options.mesh):
        return None
    evals = eval_set.eval_batches(options.eval_batches) if eval_set is not None else []
    return precompile.start(family, model_cfg, config, train_set.update_batch(0), evals,
                            stream, options.mesh)


def _processes_agree(identity: dict, tokenizer) -> bool:
    """With several processes (``sharding.distributed``): refuse unless every process describes
    the same run and built the same tokenizer. True for the process that writes the run's files
    (process 0, or the only one)."""
    from jaxformer.sharding import distributed

    distributed.check_same("the run (flags, data file, model)", json.dumps(identity,
                                                                        sort_keys=True))
    distributed.check_same("the tokenizer", tokenizer.to_str())
    return distributed.is_primary()


def _evaluation(options: RunOptions) -> dict:
    """How the run evaluates (run.json's ``evaluation``; not part of its identity): what
    ``jaxformer eval`` needs to name the batches training scored."""
    return {"eval_every": options.eval_every, "eval_batches": options.eval_batches,
            "held_out": bool(options.eval_every and not options.val_data)}


def _tokenizer_phase(options: RunOptions, run_dir: Path) -> str:
    if options.resume:
        return f"the run's {run_dir / 'tokenizer.json'}"
    if options.init_from:
        return f"the checkpoint's, from {options.init_from}"
    kind = options.tokenizer or "wordpiece"
    if kind in ("char", "bpe", "wordpiece"):
        return f"{kind}, built from {options.data}"
    return f"loaded from {kind}"


def train(config: TrainConfig, options: RunOptions, flags: list | None = None) -> RunResult:
    """The run ``options`` describe. ``--resume`` restores the latest checkpoint, drops the
    metrics lines after it and continues; the batches are a function of the step
    (``data.Dataset``), so the resumed run sees exactly the batches the uninterrupted one would
    have. ``--framework torch`` trains the torch twin from the very weights ``--framework jax``
    starts from, so the two runs' losses can be compared step by step; dropout masks come from
    each framework's own generator, so they match only at dropout 0. Given the command's ``flags``
    table (``command.FLAGS``), the resolved run is written to ``DIR/config.toml``
    (``config_file``), which ``--config`` runs again.
    """
    from jaxformer.sharding import distributed  # several processes (nothing with one)

    began = time.perf_counter()
    primary = distributed.is_primary()  # writes the run's files and reports; the others train
    stream = (options.stream or sys.stdout) if primary else io.StringIO()
    progress = options.progress if primary else "none"
    status = startup.Status(stream, enabled=progress != "none")
    run_dir, identity, model_cfg, train_set, eval_set, source = prepare(config, options, status)
    config = TrainConfig(**identity["train_config"])  # resolved (an extension keeps its warm-up)
    family = options.family
    # With --init-from the checkpoint's weights are matched in on --resume too: the restored
    # state replaces them, and a run interrupted before its first save starts where it began.
    helper = _compile_helper(family, model_cfg, config, options, train_set, eval_set, stream)
    try:
        with status.phase("build",
                          f"the {family} model and its train step ({options.framework})"):
            trainer, checkpointer_cls = build_trainer(
                family, options.framework, model_cfg, config, options,
                initializer(source, options, train_set, run_dir, stream, primary))
        if helper is not None:
            with status.phase("compile", "the train step, in a helper process"):
                helper.wait(trainer)
    finally:
        if helper is not None:
            helper.stop()
    checkpointer = checkpointer_cls(run_dir / "checkpoints", keep=options.keep)
    start = rundir.resume_latest(checkpointer, trainer, config.accumulation_steps,
                                 options.resume_strict, run_dir, stream) if options.resume \
        else 0
    if flags is not None and primary:  # the command's FLAGS: DIR/config.toml, which
        config_file.write(run_dir, config, options, flags)  # --config runs again; after a
        # refused resume, untouched
    status.block(f"jaxformer train: {family} ({options.framework})", startup.summary_rows(
        family, options, model_cfg, config, trainer, train_set, eval_set, run_dir, start))
    metrics_path, plot_path = rundir.output_paths(run_dir, options)
    if primary:
        kept = ([r for r in reporting.read_metrics(metrics_path) if r["step"] <= start]
                if options.resume else [])
        rundir.write_atomic(metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
    signals = interrupts.Signals(sys.stderr, checkpointer)
    saved_at = start if options.resume else None
    save_seconds = 0.0

    def save():
        nonlocal saved_at, save_seconds
        save_began = time.perf_counter()
        with signals.saving():
            checkpointer.save(trainer, {"step": trainer.step, "identity": identity,
                                        "data_position": trainer.step * config.accumulation_steps})
        saved_at = trainer.step
        save_seconds += time.perf_counter() - save_began

    updates = Updates(trainer, config, options, train_set, eval_set, start, save=save,
                      checkpointer=checkpointer, signals=signals, status=status, stream=stream,
                      progress=progress)
    interrupted, aborted = None, False
    # The signals are handled to the end of the wrap-up: a second one while the checkpointer
    # closes or the plot is drawn stops at once (RunAborted), as during the updates, instead of
    # meeting the default handlers (SIGTERM: killed, with no exit status of ours).
    with signals:
        try:
            with open(metrics_path if primary else os.devnull, "a") as metrics_file:
                interrupted = updates.run(metrics_file)
                # the end of the run, or an interrupt: the state reached is always saved
                if saved_at != trainer.step:
                    save()
                if options.export_hf and not interrupted:
                    model = distributed.whole_model(trainer)
                    if primary:
                        rundir.export_hf(model, run_dir, Path(options.export_hf),
                                         options.overwrite)
        except RunAborted:
            aborted = True
            raise
        finally:
            if updates.bar is not None:
                updates.bar.close()
            checkpointer.close()  # removes an unfinished save's temporary directory
            if not aborted and primary:
                records = reporting.read_metrics(metrics_path)
                if records:
                    reporting.plot_losses(records, plot_path, f"{family} "
                                          f"{options.preset_label} ({options.framework})")
    if interrupted:
        raise RunInterrupted(interrupted, trainer.step, checkpointer.directory)
    model = trainer.sync()
    model.eval()
    seconds = updates.update_seconds
    times = reporting.RunTimes(time.perf_counter() - began, sum(seconds),
                               seconds[0] if seconds else 0.0, updates.eval_seconds,
                               save_seconds)
    return RunResult(run_dir, metrics_path, plot_path, start, trainer.step, updates.losses,
                     times, model)

