"""The main job: every family, built in both frameworks with the same seeded weights, compared.

Each family builds its torch_ref twin from a seed, moves the weights into the NNX model with
``jaxformer.checkpoints.convert``, feeds both the same inputs (with padding), and compares every component and
the full model. Only rows that carry meaning are compared (padded query rows are not). The bound
is DESIGN.md's, relative to the output's scale: max abs diff <= 1e-5 x max(1, max |torch output|),
and 1e-6 x max(1, max |eager output|) for the jitted model against the eager one.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from jaxformer.checkpoints import convert
from jaxformer.config import BertConfig, GPTConfig, TransformerConfig

FORWARD_RTOL = 1e-5
JIT_TOL = 1e-6
PRESETS = ("tiny", "base")


@dataclasses.dataclass
class Row:
    family: str
    component: str
    max_abs_diff: float
    bound: float

    @property
    def passed(self) -> bool:
        return bool(self.max_abs_diff <= self.bound)  # NaN fails


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=np.float32)


def compare(family, component, expected, actual, rows=None, tol=FORWARD_RTOL) -> Row:
    """Row for ``component``; ``rows`` (bool over leading axes) selects the meaningful rows."""
    expected, actual = _np(expected), _np(actual)
    if expected.shape != actual.shape:
        return Row(family, f"{component} (shape {expected.shape} vs {actual.shape})",
                   float("inf"), 0.0)
    if rows is not None:
        expected, actual = expected[rows], actual[rows]
    diff = float(np.abs(expected - actual).max(initial=0.0))
    return Row(family, component, diff, tol * max(1.0, float(np.abs(expected).max(initial=0.0))))


def twin(torch_cls, jax_cls, config, seed: int):
    torch.manual_seed(seed)
    torch_model = torch_cls(config).eval()
    jax_model = convert.abstract_model(lambda: jax_cls(config, rngs=nnx.Rngs(seed)))
    convert.torch_to_nnx(torch_model.state_dict(), jax_model)
    jax_model.eval()
    return torch_model, jax_model


def jit_vs_eager(family, component, model, *args) -> Row:
    """The split/merge jitted forward against the eager one, same framework."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, *args):
        return nnx.merge(graphdef, state)(*args)

    eager, jitted = model(*args), forward(state, *args)
    eager, jitted = jax.tree.leaves(eager)[0], jax.tree.leaves(jitted)[0]
    return compare(family, f"{component} (jit vs eager)", eager, jitted, tol=JIT_TOL)


def padded_batch(rng, batch: int, seq: int, vocab: int):
    """Token ids and a right-padded ``[batch, seq]`` mask (row 0 full, others shorter)."""
    ids = rng.randint(1, vocab, size=(batch, seq))
    lengths = np.maximum(1, seq - np.arange(batch) * max(1, seq // (batch + 1)))
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    return ids, mask


def bert_rows(preset: str, seed: int) -> Iterator[Row]:
    from jaxformer.models import bert as jb
    from jaxformer.nn import masks as jmasks
    from torch_ref.models import bert as tb
    from torch_ref.nn import masks as tmasks

    cfg = BertConfig.tiny() if preset == "tiny" else BertConfig.base()
    rng = np.random.RandomState(seed)
    B, T, C = 3, min(16, cfg.max_position_embeddings), cfg.hidden_size
    tm, jm = twin(tb.BertForPreTraining, jb.BertForPreTraining, cfg, seed)
    ids, am = padded_batch(rng, B, T, cfg.vocab_size)
    tt = (np.arange(T)[None, :] >= T // 2).astype(np.int64).repeat(B, 0)
    pos = rng.randint(0, T // 2, size=(B, 3))
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    real = am.astype(bool)
    t, j = torch.from_numpy, jnp.asarray
    tmask, jmask = tmasks.padding_mask(t(am)), jmasks.padding_mask(j(am))
    tl, jl = tm.bert.encoder.layers[0], jm.bert.encoder.layers[0]
    with torch.inference_mode():
        cases = [
            ("embeddings", tm.bert.embeddings(t(ids), t(tt)), jm.bert.embeddings(j(ids), j(tt)),
             real),
            ("attention", tl.attention(t(x), mask=tmask), jl.attention(j(x), mask=jmask), real),
            ("feed-forward", tl.feed_forward(t(x)), jl.feed_forward(j(x)), None),
            ("encoder layer", tl(t(x), tmask), jl(j(x), jmask), real),
            ("encoder", tm.bert.encoder(t(x), tmask), jm.bert.encoder(j(x), jmask), real),
            ("pooler", tm.bert.pooler(t(x)), jm.bert.pooler(j(x)), None),
            ("MLM head (all positions)",
             tm.mlm(t(x), None, tm.bert.embeddings.word_embeddings),
             jm.mlm(j(x), None, jm.bert.embeddings.word_embeddings), real),
            ("MLM head (masked positions)",
             tm.mlm(t(x), t(pos), tm.bert.embeddings.word_embeddings),
             jm.mlm(j(x), j(pos), jm.bert.embeddings.word_embeddings), None),
            ("NSP head", tm.nsp(t(x[:, 0])), jm.nsp(j(x[:, 0])), None),
        ]
        full_t = tm(t(ids), t(tt), t(am), t(pos))
    full_j = jm(j(ids), j(tt), j(am), j(pos))
    for name, expected, actual, rows in cases:
        yield compare("bert", name, expected, actual, rows)
    for name, e, a, rows in zip(("sequence output", "MLM logits", "NSP logits"), full_t, full_j,
                                (real, None, None)):
        yield compare("bert", f"BertForPreTraining: {name}", e, a, rows)
    yield jit_vs_eager("bert", "BertForPreTraining", jm, j(ids), j(tt), j(am), j(pos))


def gpt_rows(preset: str, seed: int) -> Iterator[Row]:
    from jaxformer.models import gpt as jg
    from jaxformer.nn import masks as jmasks
    from torch_ref.models import gpt as tg
    from torch_ref.nn import masks as tmasks

    cfg = GPTConfig.tiny() if preset == "tiny" else GPTConfig.gpt2()
    rng = np.random.RandomState(seed)
    B, T, C = 3, 16, cfg.hidden_size
    tm, jm = twin(tg.GPT, jg.GPT, cfg, seed)
    ids, am = padded_batch(rng, B, T, cfg.vocab_size)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    real = am.astype(bool)
    t, j = torch.from_numpy, jnp.asarray
    tmask = tmasks.combine_masks(tmasks.causal_mask(T), tmasks.padding_mask(t(am)))
    jmask = jmasks.combine_masks(jmasks.causal_mask(T), jmasks.padding_mask(j(am)))
    positions = np.broadcast_to(np.arange(T), (B, T))
    tblock, jblock = tm.blocks[0], jm.blocks[0]
    with torch.inference_mode():
        cases = [
            ("embeddings", tm.embeddings(t(ids), t(positions.copy())),
             jm.embeddings(j(ids), j(positions)), real),
            ("causal attention", tblock.attention(t(x), mask=tmask), jblock.attention(j(x), mask=jmask),
             real),
            ("feed-forward", tblock.feed_forward(t(x)), jblock.feed_forward(j(x)), None),
            ("block", tblock(t(x), tmask), jblock(j(x), jmask), real),
            ("hidden states", tm.hidden_states(t(ids), t(am)), jm.hidden_states(j(ids), j(am)),
             real),
        ]
        full_t = tm(t(ids), t(am))
    full_j = jm(j(ids), j(am))
    for name, expected, actual, rows in cases:
        yield compare("gpt", name, expected, actual, rows)
    yield compare("gpt", "GPT: logits", full_t, full_j, real)
    yield jit_vs_eager("gpt", "GPT", jm, j(ids), j(am))


def transformer_rows(preset: str, seed: int) -> Iterator[Row]:
    from jaxformer.models import encoder_decoder as je
    from jaxformer.nn import masks as jmasks
    from torch_ref.models import encoder_decoder as te
    from torch_ref.nn import masks as tmasks

    cfg = TransformerConfig.tiny() if preset == "tiny" else TransformerConfig.base()
    rng = np.random.RandomState(seed)
    B, S, T, C = 3, 12, 10, cfg.hidden_size
    tm, jm = twin(te.Transformer, je.Transformer, cfg, seed)
    src, src_mask = padded_batch(rng, B, S, cfg.src_vocab_size)
    tgt, tgt_mask = padded_batch(rng, B, T, cfg.tgt_vocab_size)
    src, tgt = np.where(src_mask, src, cfg.src_pad_id), np.where(tgt_mask, tgt, cfg.tgt_pad_id)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    memory = rng.standard_normal((B, S, C)).astype(np.float32)
    real_src, real_tgt = src_mask.astype(bool), tgt_mask.astype(bool)
    t, j = torch.from_numpy, jnp.asarray
    t_self = tmasks.combine_masks(tmasks.causal_mask(T), tmasks.padding_mask(t(tgt_mask)))
    j_self = jmasks.combine_masks(jmasks.causal_mask(T), jmasks.padding_mask(j(tgt_mask)))
    t_cross, j_cross = tmasks.padding_mask(t(src_mask)), jmasks.padding_mask(j(src_mask))
    tl, jl = tm.decoder.layers[0], jm.decoder.layers[0]
    with torch.inference_mode():
        cases = [
            ("source embeddings", tm.src_embeddings(t(src), tm.shared_embeddings),
             jm.src_embeddings(j(src), jm.shared_embeddings), real_src),
            ("encoder", tm.encoder(t(memory), t_cross), jm.encoder(j(memory), j_cross),
             real_src),
            ("cross-attention", tl.cross_attention(t(x), t(memory), t_cross),
             jl.cross_attention(j(x), j(memory), j_cross), real_tgt),
            ("decoder layer", tl(t(x), t(memory), t_self, t_cross),
             jl(j(x), j(memory), j_self, j_cross), real_tgt),
            ("decoder", tm.decoder(t(x), t(memory), t_self, t_cross),
             jm.decoder(j(x), j(memory), j_self, j_cross), real_tgt),
        ]
        full_t = tm(t(src), t(tgt), t(src_mask), t(tgt_mask))
        default_t = tm(t(src), t(tgt))
    for name, expected, actual, rows in cases:
        yield compare("transformer", name, expected, actual, rows)
    yield compare("transformer", "Transformer: logits", full_t,
                  jm(j(src), j(tgt), j(src_mask), j(tgt_mask)), real_tgt)
    yield compare("transformer", "Transformer: logits (masks from pad ids)", default_t,
                  jm(j(src), j(tgt)), real_tgt)
    yield jit_vs_eager("transformer", "Transformer", jm, j(src), j(tgt), j(src_mask), j(tgt_mask))


FAMILIES: dict[str, tuple[str, Callable[[str, int], Iterator[Row]]]] = {
    "bert": ("jaxformer.models.bert", bert_rows),
    "transformer": ("jaxformer.models.encoder_decoder", transformer_rows),
    "gpt": ("jaxformer.models.gpt", gpt_rows),
}


def available_families() -> list[str]:
    """The families whose module is present in this installation."""
    return [name for name, (module, _) in FAMILIES.items()
            if importlib.util.find_spec(module) is not None]


def run(families=None, preset: str = "tiny", seed: int = 0) -> tuple[list[Row], float]:
    """All rows for ``families`` (default: every available one) and the seconds it took."""
    jax.config.update("jax_default_matmul_precision", "highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    start = time.perf_counter()
    rows = []
    for name in families or available_families():
        rows.extend(FAMILIES[name][1](preset, seed))
    return rows, time.perf_counter() - start
