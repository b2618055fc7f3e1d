"""The training loop behind ``jaxformer train``, for either framework (shared glue, no twin).

One run lives in one directory (``--checkpoint-dir``): ``run.json`` (the run identity: family,
framework, model and train configs, the data file's hash), ``tokenizer.json``, ``checkpoints/``,
and by default ``metrics.jsonl`` and ``loss.png``. ``--resume`` refuses a directory whose identity
differs from the current flags (naming each difference, writing nothing), restores the latest
checkpoint, drops the metrics lines after it and continues; the batches are a function of the step
(``data.Dataset``), so the resumed run sees exactly the batches the uninterrupted one would have.

``--framework torch`` trains the torch twin through the same loop, from the very weights
``--framework jax`` starts from (built by jaxformer from ``--seed``, copied with
``checkpoints.convert``), so the two runs' losses can be compared step by step. Dropout masks come
from each framework's own generator, so they match only at dropout 0.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from jaxformer.training import data, vocab
from jaxformer.training.config import TrainConfig, identity_differences, model_config, run_identity

FRAMEWORKS = ("jax", "torch")
PROGRESS = ("auto", "bar", "plain", "none")
HF_EXPORTS = ("bert", "classifier", "gpt")  # families checkpoints.hf.save_pretrained writes
# evaluation keys of a metrics line: on the held-out tenth of the data file, or on --val-data
EVAL_KEYS = ("eval_loss", "val_loss")
_FLOPS_MODELS = {"bert": "BertForPreTraining", "classifier": "BertForSequenceClassification"}


class ResumeError(ValueError):
    """The run directory cannot be (re)used as asked: names the reason or every difference."""


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm stopped being finite; the last good checkpoint is kept."""


@dataclass
class RunOptions:
    """Everything about a run that is not a hyper-parameter (see ``jaxformer train --help``)."""

    family: str
    data: str
    preset: str = "tiny"
    framework: str = "jax"
    tokenizer: str | None = None
    vocab_size: int | None = None
    dropout: float | None = None
    dtype: str | None = None  # compute dtype (default: the preset's, float32)
    param_dtype: str | None = None  # parameter storage dtype (default: the preset's)
    scan_layers: bool | None = None  # scanned layer stacks (default: the preset's, unrolled)
    remat: str | None = None  # rematerialisation policy of each block (default: none)
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep: int = 3
    resume: bool = False
    metrics: str | None = None
    plot: str | None = None
    eval_every: int = 0
    eval_batches: int = 4
    val_data: str | None = None  # a validation text file instead of the held-out tenth
    progress: str = "auto"
    log_every: int = 10
    peak_tflops: float | None = None
    compile: bool = False
    export_hf: str | None = None
    mesh: str | None = None  # "data=2,fsdp=2,tensor=2": train sharded (jaxformer.sharding)
    stream: object = field(default=None, repr=False)  # plain progress lines (default stdout)

    def check(self) -> None:
        rules = [(self.framework in FRAMEWORKS, "framework", f"one of {FRAMEWORKS}"),
                 (self.progress in PROGRESS, "progress", f"one of {PROGRESS}"),
                 (self.checkpoint_every >= 0, "checkpoint_every", "0 (only at the end) or more"),
                 (self.keep >= 1, "keep", "at least 1"),
                 (self.eval_every >= 0, "eval_every", "0 (never) or more"),
                 (self.eval_batches >= 1, "eval_batches", "at least 1"),
                 (self.val_data is None or self.eval_every > 0, "val_data",
                  "given only with eval_every > 0 (it is read by the evaluations)"),
                 (self.log_every >= 1, "log_every", "at least 1"),
                 (self.vocab_size is None or self.vocab_size >= 8, "vocab_size", "at least 8"),
                 (self.peak_tflops is None or self.peak_tflops > 0, "peak_tflops", "positive"),
                 (self.export_hf is None or self.family in HF_EXPORTS, "export_hf",
                  f"only given for {sorted(HF_EXPORTS)} (Hugging Face has no {self.family} "
                  f"model jaxformer exports)"),
                 (self.mesh is None or self.framework == "jax", "mesh",
                  "given only with framework jax (the torch twin runs on one device)")]
        for ok, name, rule in rules:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")


@dataclass
class RunResult:
    run_dir: Path
    metrics_path: Path
    plot_path: Path
    start_step: int
    final_step: int
    losses: list[float]  # of this session's steps


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _vocab_of(config) -> int:
    return getattr(config, "vocab_size", None) or config.tgt_vocab_size


def _build_trainer(family, framework, model_cfg, config, options):
    """The step and the checkpointer of ``framework``, starting from the seed's weights."""
    from jaxformer.training import step as jax_step

    model = jax_step.build_model(family, model_cfg, config.seed)
    if framework == "jax":
        from jaxformer.training.checkpoint import Checkpointer

        mesh = None
        if options.mesh:
            from jaxformer.sharding import make_mesh

            mesh = make_mesh(options.mesh)
        return jax_step.TrainStep(family, model, config, mesh=mesh), Checkpointer
    import torch

    from jaxformer.checkpoints import convert
    from torch_ref.training import step as torch_step
    from torch_ref.training.checkpoint import Checkpointer

    torch_model = torch_step.build_model(family, model_cfg, config.seed)  # seeds dropout too
    weights = {k: torch.from_numpy(v) for k, v in convert.nnx_to_torch(model).items()}
    torch_model.load_state_dict(weights, strict=True)
    if options.compile:
        torch_model.compile()  # in place: the module and its state_dict keys stay
    return torch_step.TrainStep(family, torch_model, config), Checkpointer


def _step_flops(family, model_cfg, config: TrainConfig) -> int | None:
    try:
        from jaxformer.models import flops
    except ImportError:
        return None
    B, T = config.batch_size, config.seq_len
    if family == "transformer":
        return flops.train_step_flops(model_cfg, B, T, T)
    if family in _FLOPS_MODELS:
        return flops.train_step_flops(model_cfg, B, T, model=_FLOPS_MODELS[family])
    return flops.train_step_flops(model_cfg, B, T)


def prepare(config: TrainConfig, options: RunOptions):
    """Everything before the first step, with every refusal before anything is written."""
    options.check()
    if options.mesh:  # the mesh fits the devices and the batch, before anything is written
        from jaxformer.sharding import check_batch_size, make_mesh

        check_batch_size(config.micro_batch_size, make_mesh(options.mesh))
    run_dir = Path(options.checkpoint_dir or f"runs/{options.family}-{options.preset}")
    run_json = run_dir / "run.json"
    if options.resume and not run_json.is_file():
        raise ResumeError(f"--resume: {run_dir} holds no run to resume (no run.json)")
    if not options.resume and (run_json.is_file() or (run_dir / "checkpoints").exists()):
        raise ResumeError(f"{run_dir} already holds a run; pass --resume to continue it or "
                          f"choose another --checkpoint-dir (nothing was overwritten)")
    if config.gpt_windows != "packed" and options.family != "gpt":
        raise ValueError(f"gpt_windows {config.gpt_windows!r} is for the gpt family only, got "
                         f"family {options.family!r}")
    text = data.read_text(options.data)
    val_text = data.read_text(options.val_data) if options.val_data else None
    base = model_config(options.family, options.preset)
    if options.resume:
        tokenizer = data.load_tokenizer(run_dir / "tokenizer.json")
    elif options.tokenizer:
        # a character vocabulary spans both files, as nanoGPT's spans its whole corpus; learned
        # vocabularies see the training text only
        vocab_text = text + (val_text or "") if options.tokenizer == "char" else text
        tokenizer = vocab.build_tokenizer(options.tokenizer, vocab_text,
                                          options.vocab_size or _vocab_of(base))
    else:
        tokenizer = vocab.wordpiece_tokenizer(text.splitlines(),
                                              options.vocab_size or _vocab_of(base))
    eval_fraction = 0.1 if options.eval_every and val_text is None else 0.0
    train_set, eval_set = data.build_datasets(options.family, text, tokenizer, config,
                                              eval_fraction, eval_text=val_text)
    specials = data.special_ids(tokenizer, options.family)
    model_cfg = model_config(options.family, options.preset,
                             vocab_size=tokenizer.get_vocab_size(), pad_id=specials.get("[PAD]"),
                             num_labels=train_set.num_labels, dropout=options.dropout,
                             dtype=options.dtype, param_dtype=options.param_dtype,
                             scan_layers=options.scan_layers, remat=options.remat)
    if config.seq_len > model_cfg.max_position_embeddings:
        raise ValueError(f"seq_len ({config.seq_len}) exceeds the {options.preset} preset's "
                         f"max_position_embeddings ({model_cfg.max_position_embeddings})")
    identity = run_identity(options.family, options.framework, model_cfg, config,
                            data.file_sha256(options.data))
    if options.val_data:
        identity["val_data_sha256"] = data.file_sha256(options.val_data)
    if options.resume:
        saved = json.loads(run_json.read_text())["identity"]
        differences = identity_differences(saved, identity)
        if differences:
            raise ResumeError(f"cannot resume {run_dir}: its run differs from this one "
                              f"(nothing was written):\n  " + "\n  ".join(differences))
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(run_dir / "tokenizer.json"))
        _write_atomic(run_json, json.dumps(
            {"identity": identity, "label_names": getattr(train_set, "label_names", None)},
            indent=1))
    return run_dir, identity, model_cfg, train_set, eval_set


def train(config: TrainConfig, options: RunOptions) -> RunResult:
    run_dir, identity, model_cfg, train_set, eval_set = prepare(config, options)
    family = options.family
    trainer, checkpointer_cls = _build_trainer(family, options.framework, model_cfg, config,
                                               options)
    checkpointer = checkpointer_cls(run_dir / "checkpoints", keep=options.keep)
    stream = options.stream or sys.stdout
    start = 0
    if options.resume and checkpointer.latest_step() is not None:
        meta = checkpointer.restore(trainer)
        start = trainer.step
        expected = start * config.accumulation_steps
        if meta["data_position"] != expected:
            raise ResumeError(f"checkpoint of step {start} records data position "
                              f"{meta['data_position']}, expected {expected}")
    elif options.resume:
        print(f"{run_dir} has no checkpoint yet: starting from step 0", file=stream)
    metrics_path = Path(options.metrics) if options.metrics else run_dir / "metrics.jsonl"
    plot_path = Path(options.plot) if options.plot else metrics_path.with_suffix(".png")
    kept = [r for r in _read_metrics(metrics_path) if r["step"] <= start] if options.resume else []
    _write_atomic(metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
    step_flops = _step_flops(family, model_cfg, config)
    eval_sets = eval_set.eval_batches(options.eval_batches) if eval_set is not None else []
    eval_key = "val_loss" if options.val_data else "eval_loss"  # the validation file's, or not
    use_bar = options.progress == "bar" or (options.progress == "auto" and sys.stderr.isatty())
    bar = None
    if use_bar:
        from tqdm import tqdm

        bar = tqdm(total=config.steps, initial=start, unit="step",
                   desc=f"{family} ({options.framework})")

    def save():
        checkpointer.save(trainer, {"step": trainer.step, "identity": identity,
                                    "data_position": trainer.step * config.accumulation_steps})

    losses, saved_at = [], None
    try:
        with open(metrics_path, "a") as metrics_file:
            for step in range(start, config.steps):
                batch = train_set.update_batch(step)
                began = time.perf_counter()
                result = trainer(batch)
                seconds = time.perf_counter() - began
                for name in ("loss", "grad_norm"):
                    if not math.isfinite(result[name]):
                        raise TrainingDiverged(
                            f"step {step + 1}: the {name.replace('_', ' ')} is {result[name]}; "
                            f"training stopped. The last good checkpoint is step "
                            f"{checkpointer.latest_step()} in {checkpointer.directory}")
                record = {"step": step + 1, "loss": result["loss"],
                          "learning_rate": result["learning_rate"],
                          "grad_norm": result["grad_norm"], "seconds": seconds,
                          "tokens_per_s": data_tokens(train_set, config) / seconds}
                if step_flops is not None:
                    record["model_tflops_per_s"] = step_flops / seconds / 1e12
                    if options.peak_tflops:
                        record["mfu"] = record["model_tflops_per_s"] / options.peak_tflops
                last = step + 1 == config.steps
                if eval_sets and ((step + 1) % options.eval_every == 0 or last):
                    record[eval_key] = sum(map(trainer.evaluate, eval_sets)) / len(eval_sets)
                metrics_file.write(json.dumps(record) + "\n")
                metrics_file.flush()
                losses.append(result["loss"])
                _report(record, config.steps, bar, options, stream, last)
                if options.checkpoint_every and (step + 1) % options.checkpoint_every == 0:
                    save()
                    saved_at = trainer.step
        if saved_at != trainer.step and trainer.step > start:
            save()
        if options.export_hf:
            export_hf(trainer.sync(), run_dir, Path(options.export_hf))
    finally:
        if bar is not None:
            bar.close()
        checkpointer.close()
        records = _read_metrics(metrics_path)
        if records:
            plot_losses(records, plot_path, f"{family} {options.preset} ({options.framework})")
    return RunResult(run_dir, metrics_path, plot_path, start, trainer.step, losses)


def export_hf(model, run_dir: Path, path: Path) -> None:
    """The trained model as a Hugging Face directory (``config.json``, ``model.safetensors``)
    with the run's ``tokenizer.json`` beside them."""
    import shutil

    from jaxformer.checkpoints.hf import save_pretrained

    save_pretrained(model, path, overwrite=True)
    shutil.copyfile(run_dir / "tokenizer.json", path / "tokenizer.json")


def data_tokens(dataset: data.Dataset, config: TrainConfig) -> int:
    """Token positions of one update: examples times tokens per example (padding included)."""
    return config.batch_size * dataset.tokens_per_example


def _report(record: dict, total: int, bar, options: RunOptions, stream, last: bool) -> None:
    if bar is not None:
        postfix = {"loss": f"{record['loss']:.4f}", "lr": f"{record['learning_rate']:.2e}"}
        for key in EVAL_KEYS:
            if key in record:
                postfix[key.removesuffix("_loss")] = f"{record[key]:.4f}"
        bar.set_postfix(postfix, refresh=False)
        bar.update(1)
    elif options.progress != "none" and (record["step"] % options.log_every == 0 or last
                                         or record["step"] == 1
                                         or any(key in record for key in EVAL_KEYS)):
        line = (f"step {record['step']}/{total}  loss {record['loss']:.6f}  "
                f"lr {record['learning_rate']:.3e}  grad_norm {record['grad_norm']:.4f}  "
                f"tokens/s {record['tokens_per_s']:.0f}")
        for key in EVAL_KEYS:
            if key in record:
                line += f"  {key} {record[key]:.6f}"
        print(line, file=stream, flush=True)


def plot_losses(records: list[dict], path: Path, title: str) -> None:
    """The loss curve (and the learning rate below it) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    top.plot(steps, [r["loss"] for r in records], label="train loss")
    for key in EVAL_KEYS:
        evals = [(r["step"], r[key]) for r in records if key in r]
        if evals:
            top.plot(*zip(*evals), "o-", label=key.replace("_", " "))
    top.set_ylabel("loss")
    top.set_title(title)
    top.legend()
    top.grid(alpha=0.3)
    bottom.plot(steps, [r["learning_rate"] for r in records], color="tab:green")
    bottom.set_ylabel("learning rate")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    save_figure(fig, path)


def save_figure(fig, path: Path) -> None:
    """A matplotlib figure as a PNG, atomically (a temporary file renamed into place), closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
