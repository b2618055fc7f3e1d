"""Trajectory parity: 100 AdamW steps of each family's objective, JAX (optax) against the torch
twin (torch.optim.AdamW), from the same weights on the same host-side batches, dropout 0, with a
float64 run of the torch twin beside them as the exact reference.

Warm-up, decay (a different schedule per family), the weight-decay mask and clipping are all
active; the BERT run accumulates gradients over two micro-batches. Bounds (DESIGN.md): per-step
losses equal to 1e-5 relative for the first 10 steps and 1e-4 over 100; parameters equal to 1e-4
relative in global L2 after 100 steps, over every parameter whose exact gradient is not zero
(``support.bounds.zero_gradient``); and float32 jaxformer no farther from the float64 run than
``FROM_EXACT`` times float32 torch_ref is (for BERT, the median of that ratio over three initial
weights: ``MORE_SEEDS``). The measured curves are printed (``pytest -s``); the margins on
several CPUs are in docs/testing.md.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxformer.checkpoints import convert
from jaxformer.training import tasks, vocab
from jaxformer.training.config import TrainConfig
from jaxformer.training.tasks import model_config
from parity_tests.support.bounds import check, zero_gradient
from parity_tests.support.training import corpus, twin_steps
from torch_ref.training.step import TrainStep as TorchTrainStep
from torch_ref.training.step import build_model as torch_build_model

STEPS = 100
CASES = {  # family -> TrainConfig changes
    "gpt": dict(schedule="linear", warmup_steps=10),
    "bert": dict(schedule="cosine", warmup_steps=10, accumulation_steps=2, min_learning_rate=1e-4),
    "transformer": dict(schedule="inverse_sqrt", warmup_steps=10, label_smoothing=0.1),
    "classifier": dict(schedule="cosine", warmup_steps=5),
}
# The encoder-decoder's preset activation is ReLU, whose derivative jumps at 0. Over 100 steps a
# pre-activation comes within rounding distance of 0 (measured: |x| = 4.7e-6, step 43, unit 26 of
# the first encoder feed-forward): the two frameworks take different sides of the kink for that
# token, and Adam turns the difference of one unit's gradient into a full step on its row
# (relative L2 6.2e-5 after 100 steps on an AVX2 CPU, all of it in that row, while float32 torch
# stays within 8e-7 of float64). Which side each framework takes is decided by rounding, so the
# margin was luck. The trajectory measures the optimizer, schedule and loss semantics; it runs the
# family with exact GELU, whose derivative is continuous. ReLU's forward and gradients are proven
# equal by the model tests, where no step compounds a kink.
MODEL_CHANGES = {"transformer": dict(activation="gelu")}
FROM_EXACT = 4  # jaxformer may be this many times farther from float64 than torch_ref is
# That distance is float32 rounding compounded over 100 steps, and its ratio between the
# frameworks is one draw that depends on the initial weights. BERT's (two micro-batches a step)
# varies most: on an AVX-512 Xeon (torch at one thread, as here) seed 0 gave 3.0 (loss) and 2.7
# (parameters) where seeds 1, 2 and 3 gave 0.85-1.04 and 0.77-0.99, and 5.2 with torch at two
# threads (docs/testing.md). So BERT's ratio is the median over three initial weights, seed 0's
# and these; every other family's single draw keeps a margin of 2x or more on every CPU measured.
MORE_SEEDS = {"bert": (1, 2)}


def state(model) -> dict[str, np.ndarray]:
    """A torch or NNX model's parameters as float64 numpy, by torch state_dict key."""
    if isinstance(model, torch.nn.Module):
        return {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    return {k: np.asarray(v, np.float64) for k, v in convert.nnx_to_torch(model).items()}


def global_rel_l2(ours: dict, theirs: dict) -> float:
    """Global relative L2 distance over the parameters with a non-zero exact gradient."""
    keys = [k for k in theirs if not zero_gradient(k)]
    num = sum(((ours[k] - theirs[k]) ** 2).sum() for k in keys)
    return float(np.sqrt(num / sum((theirs[k] ** 2).sum() for k in keys)))


def zero_gradient_ratio(model: torch.nn.Module) -> float:
    """max |gradient| of the zero-gradient parameters over the global gradient norm, from the
    ``.grad`` the torch step leaves behind."""
    grads = {n: p.grad.double() for n, p in model.named_parameters()}
    norm = float(torch.sqrt(sum((g ** 2).sum() for g in grads.values())))
    return max(float(g.abs().max()) for n, g in grads.items() if zero_gradient(n)) / norm


def trajectories(family: str, config: TrainConfig, seed: int = 0, after_step=None):
    """``STEPS`` updates of float32 jaxformer, float32 torch_ref and float64 torch_ref from the
    weights of ``seed``: each step's metrics ``(jax, torch, float64)``, the float64 model's
    starting parameters, and the three final parameter sets. ``after_step(torch_model,
    float64_model)`` runs after every step."""
    jax_step, torch_step, dataset = twin_steps(family, config, seed,
                                               **MODEL_CHANGES.get(family, {}))
    exact = TorchTrainStep(family, copy.deepcopy(torch_step.model).double(), config)
    start, rows = state(exact.model), []
    for step in range(STEPS):
        batch = dataset.update_batch(step)
        rows.append((jax_step(batch), torch_step(batch), exact(batch)))
        if after_step is not None:
            after_step(torch_step.model, exact.model)
    return rows, start, (state(jax_step.sync()), state(torch_step.model), state(exact.model))


def distances_from_exact(rows, params) -> dict[str, tuple[float, float]]:
    """Each float32 framework's distance from the float64 run: the worst step's relative loss
    difference and the final parameters' relative L2."""
    losses = [np.array([r[i]["loss"] for r in rows]) for i in range(3)]
    return {who: ((np.abs(losses[i] - losses[2]) / losses[2]).max(),
                  global_rel_l2(params[i], params[2]))
            for i, who in enumerate(("jaxformer", "torch_ref"))}


@pytest.mark.parametrize("family", sorted(CASES))
def test_trajectory_matches_torch(family):
    config = TrainConfig(steps=STEPS, batch_size=4, seq_len=16, learning_rate=3e-3,
                         weight_decay=0.1, decay_embeddings=False, clip_norm=0.5,
                         **CASES[family])
    zero_grad = {"float64": 0.0, "float32": 0.0}

    def watch_zero_gradients(torch_model, exact_model):
        zero_grad["float64"] = max(zero_grad["float64"], zero_gradient_ratio(exact_model))
        zero_grad["float32"] = max(zero_grad["float32"], zero_gradient_ratio(torch_model))

    rows, start, (ours, theirs, exact_params) = trajectories(family, config,
                                                             after_step=watch_zero_gradients)
    zero_grad_64, zero_grad_32 = zero_grad["float64"], zero_grad["float32"]
    loss_j, loss_t = (np.array([r[i]["loss"] for r in rows]) for i in range(2))
    rel = np.abs(loss_j - loss_t) / np.abs(loss_t)
    params = global_rel_l2(ours, theirs)
    from_exact = distances_from_exact(rows, (ours, theirs, exact_params))
    curve = " ".join(f"{rel[i:i + 10].max():.1e}" for i in range(0, STEPS, 10))
    print(f"\n{family}: loss {loss_t[0]:.3f} -> {loss_t[-1]:.3f}; max rel loss diff per 10 steps: "
          f"{curve}; params rel L2 after {STEPS}: {params:.1e}; from float64 (losses, params): "
          + ", ".join(f"{who} {a:.1e} {b:.1e}" for who, (a, b) in from_exact.items())
          + f"; zero-gradient parameters' |grad| / norm: float64 {zero_grad_64:.1e}, float32 "
          f"{zero_grad_32:.1e}")
    # Everything the test claims to exercise is exercised:
    lr = np.array([t["learning_rate"] for _, t, _ in rows])
    assert lr.argmax() == config.warmup_steps - 1
    assert lr[-1] < 0.5 * lr.max()
    norms = np.array([t["grad_norm"] for _, t, _ in rows])
    assert (norms > config.clip_norm).any()  # clipping acted
    np.testing.assert_allclose([j["grad_norm"] for j, _, _ in rows], norms, rtol=1e-3)
    np.testing.assert_allclose([j["learning_rate"] for j, _, _ in rows], lr, rtol=1e-6)
    assert loss_t[-10:].mean() < 0.9 * loss_t[:10].mean()  # it learns
    # The zero-gradient parameters: exactly zero in float64 (1e-12 of the norm is 10^4 times
    # float64's rounding and 10^3 below the smallest float32 noise measured), so they never move
    # there, and excluding them from the comparison drops no signal.
    check(zero_grad_64, 1e-12, "float64 zero-gradient parameters' |grad| / norm")
    moved = max(np.abs(exact_params[k] - start[k]).max() for k in start if zero_gradient(k))
    check(moved, 1e-9, "float64 zero-gradient parameters' movement")
    # The bounds.
    check(rel[:10].max(), 1e-5, f"loss, first 10 steps (worst step {rel[:10].argmax() + 1})")
    check(rel.max(), 1e-4, f"loss, {STEPS} steps (worst step {rel.argmax() + 1})")
    check(params, 1e-4, f"parameters after {STEPS} steps, relative L2")
    # Against the exact trajectory: float32 jaxformer is as close to it as float32 torch_ref is.
    # Measured jaxformer / torch_ref: losses 0.9-1.7, parameters 0.7-1.1 (AVX2, 1 and 2 cores);
    # optax's float32 bias correction, before optim.scale_by_adam, gave 13-50 on the classifier.
    draws = [from_exact]
    for seed in MORE_SEEDS.get(family, ()):
        seed_rows, _, seed_params = trajectories(family, config, seed)
        draws.append(distances_from_exact(seed_rows, seed_params))
    for n, what in enumerate(("loss, worst step", "parameters, relative L2")):
        ratios = [draw["jaxformer"][n] / draw["torch_ref"][n] for draw in draws]
        print(f"{what}: jaxformer / torch_ref distance from float64, per initial weights: "
              + ", ".join(f"{r:.2f}" for r in ratios))
        over = f" (median of {len(ratios)} initial weights)" if len(ratios) > 1 else ""
        check(float(np.median(ratios)), FROM_EXACT,
              f"{what}: jaxformer's distance from float64 over torch_ref's{over}")


def test_accumulation_equals_one_big_batch():
    """Two micro-batches of 4 give the update of one batch of 8 (classification: every example
    weighs the same in both). Shown on the torch twin, whose accumulation is plain ``.grad``
    summation; the BERT trajectory above holds the JAX step's accumulation (a ``lax.scan``) to
    the torch one, so JAX accumulation equals the big batch too."""
    common = dict(steps=5, seq_len=16, learning_rate=3e-3, warmup_steps=1, clip_norm=0.5)
    whole = TrainConfig(batch_size=8, **common)
    split = TrainConfig(batch_size=8, accumulation_steps=2, **common)
    text = corpus("classifier")
    tokenizer = vocab.wordpiece_tokenizer(text.splitlines(), 120)
    dataset, _ = tasks.build_datasets("classifier", text, tokenizer, split)
    model_cfg = model_config("classifier", "tiny", vocab_size=tokenizer.get_vocab_size(),
                             num_labels=dataset.num_labels, dropout=0.0)
    step_whole = TorchTrainStep("classifier", torch_build_model("classifier", model_cfg, 3), whole)
    step_split = TorchTrainStep("classifier", torch_build_model("classifier", model_cfg, 3), split)
    for step in range(4):
        micro = dataset.update_batch(step)  # (2, 4, ...)
        one = {k: v.reshape(1, 8, *v.shape[2:]) for k, v in micro.items()}
        a, b = step_whole(one), step_split(micro)
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * a["loss"]
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * a["grad_norm"]
    # Micro-batching changes the order of the sums, so the zero-gradient parameters get other
    # rounding noise, which Adam scales up: compared are the others (support.bounds).
    for key, value in step_whole.model.state_dict().items():
        if zero_gradient(key):
            continue
        other = step_split.model.state_dict()[key]
        check(float((value - other).abs().max()), 1e-6 * max(1.0, float(value.abs().max())),
              f"{key} after 4 updates, one batch vs two micro-batches")


def test_dispatched_updates_equal_called_ones():
    """``dispatch`` sends an update without waiting and ``fetch`` reads its metrics: three updates
    each dispatched before the previous one is read give, in both frameworks, the metrics and
    the weights of three ``step(batch)`` calls, bit for bit."""
    config = TrainConfig(steps=10, batch_size=4, seq_len=16, learning_rate=3e-3, warmup_steps=2)
    jax_step, torch_step, dataset = twin_steps("gpt", config, seed=4)
    batches = [dataset.update_batch(i) for i in range(3)]
    start_jax = jax.tree.map(jnp.copy, jax_step.state_dict())
    start_torch = copy.deepcopy(torch_step.state_dict())
    for step, start in ((jax_step, start_jax), (torch_step, start_torch)):
        called = [step(batch) for batch in batches]
        after_calls = {k: np.asarray(v) for k, v in state(step.sync()).items()}
        step.load_state_dict(jax.tree.map(jnp.copy, start) if step is jax_step else start)
        first, second = step.dispatch(batches[0]), step.dispatch(batches[1])
        fetched = [step.fetch(first)]
        third = step.dispatch(batches[2])
        fetched += [step.fetch(second), step.fetch(third)]
        assert fetched == called, type(step)
        for key, value in state(step.sync()).items():
            np.testing.assert_array_equal(np.asarray(value), after_calls[key], err_msg=key)
