"""Does BERT learn? Masked-LM + next-sentence pre-training on Shakespeare, then fine-tuning
``BertForSequenceClassification`` from that checkpoint against the same model from scratch.

    jaxformer data shakespeare --out data/shakespeare   # train.txt, val.txt, manifest.json
    python benchmarks/learn_bert.py --data data/shakespeare
    python benchmarks/learn_bert.py --data data/shakespeare --steps 5   # smoke test

The corpus is split by whole plays (``manifest.json`` names them): pre-training reads the
training plays only, and every held-out number below comes from plays it never saw.

What a "sentence" is. BERT's input is one sentence per line and a blank line between documents;
a play is verse and prose lines under speaker tags. Here a sentence is one *speech*: a paragraph
whose first line is a speaker tag (``HELENA.``, ``Ber.``: one short line ending in a full stop)
and whose other lines are joined with spaces, bracketed stage directions removed. A document is
a play. So next-sentence prediction asks "is B the reply to A in the same play?", a question
about the dialogue, where a verse line's successor would often be the middle of its sentence.

Pre-training: the examples of ``jaxformer.training.data`` (BERT's recipe: 50% next speech, 50% a
random one; ``max_predictions`` masked positions per pair, 80/10/10), a WordPiece vocabulary
learned from the training plays, ``TrainStep`` (JAX), the checkpoint written by the training
checkpointer (orbax). Reported before and after on held-out plays: masked-token accuracy (argmax
at the masked positions) and NSP accuracy.

Fine-tuning: is a speech from a comedy or a tragedy (the First Folio's own grouping; histories
and the poems left out)? Training speeches come from the training plays, balanced between the two
classes; held-out speeches from *As You Like It* (comedy) and *Romeo and Juliet* (tragedy), not
seen in pre-training either, balanced too (chance = 50%). The same classifier is trained twice
on the same batches for the same steps, once with its encoder restored from the pre-training
checkpoint, once from scratch (the classification head starts from the same weights in both).

Sizes, for a few minutes on a 2-core CPU shared with other work: 4 layers, width 256, 4 heads,
sequences of 64 tokens (a pair of speeches rarely needs more; longer pairs are cut longest first,
as BERT does), batch 32, a vocabulary of 4,000.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tempfile
from pathlib import Path

import learn_common
import numpy as np

COMEDIES = ("alls_well_that_ends_well", "as_you_like_it", "comedy_of_errors",
            "loves_labours_lost", "measure_for_measure", "merchant_of_venice",
            "merry_wives_of_windsor", "midsummer_nights_dream", "much_ado_about_nothing",
            "taming_of_the_shrew", "tempest", "twelfth_night", "two_gentlemen_of_verona",
            "winters_tale")
TRAGEDIES = ("antony_and_cleopatra", "coriolanus", "cymbeline", "hamlet", "julius_caesar",
             "lear", "macbeth", "othello", "romeo_and_juliet", "timon_of_athens",
             "tragedy_of_titus_andronicus", "troilus_and_cressida")
HELD_OUT_CLASSES = {"as_you_like_it": "comedy", "romeo_and_juliet": "tragedy"}
SPEAKER = re.compile(r"^[A-Z][A-Za-z'&-]*(?: [A-Za-z'&-]+){0,3}\.$")
STAGE = re.compile(r"\[[^\]]*\]")


# ---------------------------------------------------------------------------------- the corpus

def read_plays(directory: Path, split: str) -> dict[str, str]:
    """``{play: text}`` of ``split`` (train or val), cut from ``SPLIT.txt`` by the character
    counts of ``manifest.json`` (the documents are joined by a blank line, in manifest order)."""
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        raise SystemExit(f"{manifest_path} does not exist: make the corpus with "
                         f"`jaxformer data shakespeare --out {directory}`")
    manifest = json.loads(manifest_path.read_text())
    text = (directory / manifest[split]["file"]).read_text(encoding="utf-8")
    sizes = {d["name"]: d["characters"] for d in manifest["documents"]}
    plays, offset = {}, 0
    for name in manifest[split]["documents"]:
        plays[name] = text[offset: offset + sizes[name]]
        offset += sizes[name] + 2
    if offset - 1 != len(text):
        raise SystemExit(f"{directory / manifest[split]['file']} does not match manifest.json "
                         f"({len(text)} characters, the manifest adds up to {offset - 1})")
    return plays


def speeches(play: str) -> list[str]:
    """The play's speeches, one string each (see the module doc)."""
    out = []
    for block in re.split(r"\n\s*\n", play):
        lines = [line.strip() for line in block.strip().splitlines()]
        if len(lines) < 2 or not SPEAKER.match(lines[0]):
            continue
        speech = " ".join(STAGE.sub(" ", " ".join(lines[1:])).replace("\t", " ").split())
        if speech:
            out.append(speech)
    return out


def bert_text(plays: dict[str, str]) -> str:
    """One speech per line, a blank line between plays: ``data``'s bert format."""
    documents = ["\n".join(speeches(text)) for text in plays.values()]
    return "\n\n".join(d for d in documents if d) + "\n"


def genre_text(plays: dict[str, str], labels: dict[str, str], seed: int) -> str:
    """``LABEL<TAB>speech`` lines (``data``'s classifier format), the classes balanced by
    keeping a seeded random subset of the larger one, in a seeded order."""
    rows = {label: [] for label in sorted(set(labels.values()))}
    for name, text in plays.items():
        if name in labels:
            rows[labels[name]] += speeches(text)
    rng = np.random.default_rng([seed, 3])
    n = min(len(r) for r in rows.values())
    lines = [f"{label}\t{s}" for label, r in rows.items()
             for s in (r[i] for i in sorted(rng.permutation(len(r))[:n]))]
    return "\n".join(lines[i] for i in rng.permutation(len(lines))) + "\n"


# ------------------------------------------------------------------------------------- models

def configs(args, vocab_size: int):
    from jaxformer.config import BertConfig
    from jaxformer.training.config import TrainConfig

    model = BertConfig(vocab_size=vocab_size, hidden_size=args.width, num_layers=args.layers,
                       num_heads=4, intermediate_size=4 * args.width,
                       max_position_embeddings=args.seq_len, type_vocab_size=2, pad_token_id=0)
    common = dict(batch_size=args.batch_size, seq_len=args.seq_len, schedule="linear",
                  weight_decay=0.01, clip_norm=1.0, seed=args.seed)
    pretrain = TrainConfig(steps=args.steps, learning_rate=args.lr,
                           warmup_steps=args.steps // 10, max_predictions=args.max_predictions,
                           **common)
    finetune = TrainConfig(steps=args.finetune_steps, learning_rate=args.finetune_lr,
                           warmup_steps=args.finetune_steps // 10, **common)
    return model, pretrain, finetune


class Scorer:
    """Held-out accuracies from one jitted forward; the trained parameters go in per call."""

    def __init__(self, trainer, fn, batches):
        from jaxformer.nn.jit import Jitted

        self.trainer, self.fn, self.batches, self._jitted = trainer, fn, batches, None
        self._Jitted = Jitted

    def __call__(self) -> dict[str, float]:
        from flax import nnx

        model = self.trainer.sync()
        model.eval()
        if self._jitted is None:
            self._jitted = self._Jitted(model, fn=self.fn)
        self._jitted.params = nnx.state(model, nnx.Param)
        totals: dict[str, list[float]] = {}
        for batch in self.batches:
            for name, (right, count) in self._jitted(batch).items():
                t = totals.setdefault(name, [0.0, 0.0])
                t[0] += float(right)
                t[1] += float(count)
        model.train()
        return {name: right / max(count, 1.0) for name, (right, count) in totals.items()}


def pretraining_accuracy(model, batch):
    import jax.numpy as jnp

    _, mlm, nsp = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                        batch["masked_positions"])
    real = batch["mlm_labels"] != -100
    return {"masked_token_accuracy": (jnp.sum((mlm.argmax(-1) == batch["mlm_labels"]) & real),
                                      jnp.sum(real)),
            "nsp_accuracy": (jnp.sum(nsp.argmax(-1) == batch["nsp_labels"]),
                             batch["nsp_labels"].shape[0])}


def classification_accuracy(model, batch):
    import jax.numpy as jnp

    logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    return {"accuracy": (jnp.sum(logits.argmax(-1) == batch["labels"]),
                         batch["labels"].shape[0])}


def held_out_batches(dataset, size: int, limit: int) -> list[dict]:
    count = min(limit, len(dataset) // size)
    return [dataset.micro_batch(k, size) for k in range(max(1, count))]


# ---------------------------------------------------------------------------------------- run

def pretrain(args, train_plays, val_plays, work: Path) -> dict:
    from jaxformer.training import data
    from jaxformer.training.checkpoint import Checkpointer
    from jaxformer.training.step import TrainStep, build_model

    try:
        from jaxformer.training.vocab import wordpiece_tokenizer
    except ImportError:  # before the vocabulary builders moved out of data
        wordpiece_tokenizer = data.train_tokenizer
    train_text, val_text = bert_text(train_plays), bert_text(val_plays)
    tokenizer = wordpiece_tokenizer(train_text.splitlines(), args.vocab_size)
    model_cfg, config, _ = configs(args, tokenizer.get_vocab_size())
    train_set, _ = data.build_datasets("bert", train_text, tokenizer, config)
    val_set, _ = data.build_datasets("bert", val_text, tokenizer, config)
    print(f"pre-training: {len(train_set)} training speeches, {len(val_set)} held-out speeches, "
          f"vocabulary {tokenizer.get_vocab_size()}", flush=True)
    trainer = TrainStep("bert", build_model("bert", model_cfg, args.seed), config)
    scorer = Scorer(trainer, pretraining_accuracy,
                    held_out_batches(val_set, config.batch_size, args.eval_batches))
    history = learn_common.train(trainer, train_set.update_batch, config.steps, evaluate=scorer,
                                 eval_every=max(1, config.steps // 5), name="pre-train",
                                 log_every=args.log_every)
    checkpointer = Checkpointer(work / "pretrain", keep=1)
    checkpointer.save(trainer, {"step": trainer.step})
    checkpointer.close()
    return {"tokenizer": tokenizer, "model_config": model_cfg, "train_config": config,
            "speeches": {"train": len(train_set), "held_out": len(val_set)},
            "history": history, "checkpoint": work / "pretrain"}


def finetune(args, pre: dict, train_plays, val_plays) -> dict:
    from flax import nnx

    from jaxformer.training import data
    from jaxformer.training.checkpoint import Checkpointer
    from jaxformer.training.step import TrainStep, build_model

    labels = {**{n: "comedy" for n in COMEDIES}, **{n: "tragedy" for n in TRAGEDIES}}
    tokenizer, (_, _, config) = pre["tokenizer"], configs(args, pre["tokenizer"].get_vocab_size())
    train_set, _ = data.build_datasets("classifier", genre_text(train_plays, labels, args.seed),
                                       tokenizer, config)
    val_set, _ = data.build_datasets("classifier",
                                     genre_text(val_plays, HELD_OUT_CLASSES, args.seed),
                                     tokenizer, config)
    assert train_set.label_names == val_set.label_names == ["comedy", "tragedy"]
    clf_cfg = dataclasses.replace(pre["model_config"], num_labels=2)
    print(f"fine-tuning: {len(train_set)} training speeches, {len(val_set)} held-out "
          f"({', '.join(HELD_OUT_CLASSES)})", flush=True)
    # the pre-trained encoder, from the orbax checkpoint
    restored = TrainStep("bert", build_model("bert", pre["model_config"], args.seed),
                         pre["train_config"])
    checkpointer = Checkpointer(pre["checkpoint"], keep=1)
    checkpointer.restore(restored)
    checkpointer.close()
    encoder = nnx.state(restored.sync().bert)
    runs = {}
    for start in ("pretrained", "scratch"):
        model = build_model("classifier", clf_cfg, args.seed)
        if start == "pretrained":
            nnx.update(model.bert, encoder)
        trainer = TrainStep("classifier", model, config)
        scorer = Scorer(trainer, classification_accuracy,
                        held_out_batches(val_set, config.batch_size, args.eval_batches))
        runs[start] = learn_common.train(trainer, train_set.update_batch, config.steps,
                                         evaluate=scorer, eval_every=max(1, config.steps // 5),
                                         name=f"fine-tune from {start}",
                                         log_every=args.log_every)
    return {"speeches": {"train": len(train_set), "held_out": len(val_set)},
            "held_out_plays": HELD_OUT_CLASSES, "train_config": config.to_dict(), "runs": runs}


def plot(pre: dict, fine: dict, path: Path) -> None:
    plt = learn_common.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    h = pre["history"]
    axes[0, 0].plot(range(1, len(h["loss"]) + 1), h["loss"])
    axes[0, 0].set_title("pre-training loss (masked LM + NSP)")
    for name in ("masked_token_accuracy", "nsp_accuracy"):
        axes[0, 1].plot([e["step"] for e in h["evals"]], [100 * e[name] for e in h["evals"]],
                        "o-", label=name.replace("_", " "))
    axes[0, 1].set_title("pre-training: held-out plays")
    for start, run in fine["runs"].items():
        axes[1, 0].plot(range(1, len(run["loss"]) + 1), run["loss"], label=start)
        axes[1, 1].plot([e["step"] for e in run["evals"]],
                        [100 * e["accuracy"] for e in run["evals"]], "o-", label=start)
    axes[1, 0].set_title("fine-tuning loss (comedy / tragedy)")
    axes[1, 1].set_title("fine-tuning: held-out accuracy (%), chance 50")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    learn_common.save_figure(fig, path)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = learn_common.argument_parser(__doc__, steps=400)
    p.add_argument("--data", default="data/shakespeare",
                   help="the directory `jaxformer data shakespeare --out DIR` writes")
    p.add_argument("--finetune-steps", type=int, default=None,
                   help="updates of each fine-tuning run (default: --steps / 2)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--vocab-size", type=int, default=4000)
    p.add_argument("--max-predictions", type=int, default=10,
                   help="masked positions per pair (BERT's max_predictions_per_seq; 10 at "
                        "seq_len 64, as BERT's 20 at 128)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--finetune-lr", type=float, default=3e-4)
    p.add_argument("--eval-batches", type=int, default=16)
    args = p.parse_args(argv)
    if args.finetune_steps is None:
        args.finetune_steps = max(1, args.steps // 2)
    run = learn_common.Run(argv)
    directory = Path(args.data)
    train_plays, val_plays = read_plays(directory, "train"), read_plays(directory, "val")
    with tempfile.TemporaryDirectory(prefix="learn_bert-") as work:
        pre = pretrain(args, train_plays, val_plays, Path(work))
        fine = finetune(args, pre, train_plays, val_plays)
    evals = pre["history"]["evals"]
    summary = {"pretraining": {k: {"before": evals[0][k], "after": evals[-1][k]}
                               for k in ("masked_token_accuracy", "nsp_accuracy")},
               "finetuning_held_out_accuracy": {
                   start: r["evals"][-1]["accuracy"] for start, r in fine["runs"].items()}}
    record = {"benchmark": "learn_bert", **run.finish(), "summary": summary,
              "setup": {"model_config": dataclasses.asdict(pre["model_config"]),
                        "pretrain_config": pre["train_config"].to_dict(),
                        "pretrain_speeches": pre["speeches"],
                        "sentence": "one speech (speaker tag dropped); document: one play"},
              "pretraining": pre["history"], "finetuning": fine}
    print(json.dumps(summary, indent=1))
    if not args.no_save:
        out = Path(args.out)
        learn_common.write_json(out / "learn_bert.json", record)
        plot(pre, fine, out / "learn_bert.png")
        print(f"wrote {out / 'learn_bert.json'} and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
