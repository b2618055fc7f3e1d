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

Pre-training: the examples of ``jaxformer.training.tasks.bert_pretraining`` (BERT's recipe: 50% next
speech, 50% a random one; ``max_predictions`` masked positions per pair, 80/10/10), a WordPiece
vocabulary learned from the training plays, ``TrainStep`` (JAX), the checkpoint written by the
training checkpointer (orbax). Reported before and after on held-out plays: masked-token accuracy
(argmax at the masked positions) and NSP accuracy.

Fine-tuning: which of two plays, *As You Like It* or *Romeo and Juliet*, does a speech of at
least 6 words come from? Both plays are held out of pre-training; a seeded quarter of each
play's speeches is held out of fine-tuning, and both splits are balanced (chance = 50%). The
same classifier is trained twice on the same batches for the same steps, once with its encoder
restored from the pre-training checkpoint, once from scratch (the classification head starts
from the same weights in both).

Sizes, for a few minutes on a 2-core CPU shared with other work: 2 layers, width 128, 4 heads,
FFN 512 (0.93M parameters, 0.51M of them the 4,000-word embedding), sequences of 64 tokens (the
median speech has 12 words; longer pairs are cut longest first, as BERT does), batch 32, 10
masked positions per pair, 400 pre-training and 2 x 200 fine-tuning updates. A 4-layer,
width-256 BERT took 3.8 s per pre-training update on that machine under load (this size 0.6 s):
it would not fit the budget. ``--layers``, ``--width``, ``--steps`` scale it up.

What it found at these sizes (``results/learn_bert.json``): held-out masked-token accuracy 0 ->
11.1% (the loss leaves the unigram plateau only slowly), NSP stays at 47.9% (a constant answer),
and the classifier from the checkpoint (71.9%) does *not* beat the one from scratch (75.9%):
400 updates are too few for pre-training to pay off (with ``--lr 2e-3``: 11.8%, NSP constant,
70.9% vs the same 75.9%). Five times longer on a quiet machine (``--steps 2000``, 282 s of
pre-training, ``results/learn_bert_steps2000.json``): masked-token accuracy 22.9%, NSP still
constant (48.4%), fine-tuned 74.1% from the checkpoint vs 77.2% from scratch: still no gain.
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

TASK_PLAYS = ("as_you_like_it", "romeo_and_juliet")  # both held out of pre-training
MIN_WORDS = 6  # shorter speeches ("No.", "Ay, my lord.") could come from any play
TASK_HELD_OUT = 0.25
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


def play_task(plays: dict[str, str], seed: int) -> tuple[str, str]:
    """The fine-tuning task, ``LABEL<TAB>speech`` lines (``data``'s classifier format): which of
    :data:`TASK_PLAYS` a speech of at least :data:`MIN_WORDS` words comes from. Each play's
    speeches are split at random (seeded) into training and held-out ones (:data:`TASK_HELD_OUT`),
    and each split is balanced by keeping as many speeches of each play. -> (train, held-out)."""
    rng = np.random.default_rng([seed, 3])
    splits: dict[str, list[list[str]]] = {"train": [], "held_out": []}
    for name in TASK_PLAYS:
        rows = [s for s in speeches(plays[name]) if len(s.split()) >= MIN_WORDS]
        order = rng.permutation(len(rows))
        cut = round(len(rows) * TASK_HELD_OUT)
        splits["held_out"].append([f"{name}\t{rows[i]}" for i in order[:cut]])
        splits["train"].append([f"{name}\t{rows[i]}" for i in order[cut:]])
    out = []
    for per_play in splits.values():
        n = min(map(len, per_play))
        lines = [line for rows in per_play for line in rows[:n]]
        out.append("\n".join(lines[i] for i in rng.permutation(len(lines))) + "\n")
    return out[0], out[1]


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
    from jaxformer.training import tasks
    from jaxformer.training.checkpoint import Checkpointer
    from jaxformer.training.step import TrainStep, build_model
    from jaxformer.training.vocab import wordpiece_tokenizer

    train_text, val_text = bert_text(train_plays), bert_text(val_plays)
    tokenizer = wordpiece_tokenizer(train_text.splitlines(), args.vocab_size)
    model_cfg, config, _ = configs(args, tokenizer.get_vocab_size())
    train_set, _ = tasks.build_datasets("bert", train_text, tokenizer, config)
    val_set, _ = tasks.build_datasets("bert", val_text, tokenizer, config)
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


def finetune(args, pre: dict, val_plays) -> dict:
    from flax import nnx

    from jaxformer.training import tasks
    from jaxformer.training.checkpoint import Checkpointer
    from jaxformer.training.step import TrainStep, build_model

    tokenizer, (_, _, config) = pre["tokenizer"], configs(args, pre["tokenizer"].get_vocab_size())
    train_text, held_text = play_task(val_plays, args.seed)
    train_set, _ = tasks.build_datasets("classifier", train_text, tokenizer, config)
    val_set, _ = tasks.build_datasets("classifier", held_text, tokenizer, config)
    assert train_set.label_names == val_set.label_names == sorted(TASK_PLAYS)
    clf_cfg = dataclasses.replace(pre["model_config"], num_labels=2)
    print(f"fine-tuning: {len(train_set)} training speeches, {len(val_set)} held-out "
          f"(which of {', '.join(TASK_PLAYS)})", flush=True)
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
            "task": {"plays": TASK_PLAYS, "min_words": MIN_WORDS,
                     "held_out_fraction": TASK_HELD_OUT},
            "train_config": config.to_dict(), "runs": runs}


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
    axes[1, 0].set_title("fine-tuning loss (which play?)")
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
        fine = finetune(args, pre, val_plays)
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
