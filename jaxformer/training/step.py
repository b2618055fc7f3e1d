"""The train step and the eval step, jitted. Twin: ``torch_ref/training/step.py``.

:class:`TrainStep` compiles one pure function for a whole optimizer update of the model its Task
(``training.tasks``) names, scored by the Task's loss; :func:`build_trainer` is what
``jaxformer train`` calls through ``jaxformer.frameworks``, as it calls the torch twin's.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxformer import runtime, sharding
from jaxformer.nn import initializer
from jaxformer.training import losses, tasks
from jaxformer.training.config import TrainConfig
from jaxformer.training.optim import clip_by_global_norm, learning_rate, make_optimizer

if TYPE_CHECKING:
    from jaxformer.models.bert import BertForPreTraining, BertForSequenceClassification
    from jaxformer.models.encoder_decoder import Transformer
    from jaxformer.models.gpt import GPT

    # The models of the tasks in ``training.tasks``: nnx Modules that keep their ``config``.
    _TrainableModel = BertForPreTraining | BertForSequenceClassification | GPT | Transformer

# task key -> the model class it trains (``task.model`` of ``jaxformer.<task.model_module>``)
MODELS = {name: getattr(importlib.import_module(f"jaxformer.{task.model_module}"), task.model)
          for name, task in tasks.TASKS.items()}


def build_model(family: str, model_config, seed: int) -> _TrainableModel:
    """The model task ``family`` trains, initialised from ``seed`` (weights and dropout keys)."""
    graphdefs, initialize = _initializer(family, model_config)
    state = initialize(np.uint32(seed))
    return nnx.merge(graphdefs[-1], state)


def build_trainer(family: str, model_config, config: TrainConfig, options, weights=None):
    """The :class:`TrainStep` of ``jaxformer train``: the model of task ``family`` from
    ``config.seed``, or from ``weights`` (a numpy state dict in torch's key layout) when given,
    on the mesh ``options.mesh`` names (None: one device)."""
    model = build_model(family, model_config, config.seed)
    if weights is not None:
        from jaxformer.checkpoints import convert

        convert.torch_to_nnx(weights, model)  # loads in place
    mesh = sharding.make_mesh(options.mesh) if options.mesh else None
    return TrainStep(family, model, config, mesh=mesh)


@functools.lru_cache(maxsize=8)
def _initializer(family: str, model_config):
    """One compiled initialiser per model (any seed), instead of one eager dispatch per
    parameter or one compilation per call."""
    tasks.get(family)  # a clear error for an unknown key
    graphdefs: list = []  # the model's graph, recorded when the initialiser is traced: a second
    # trace only for it (nnx.eval_shape) cost 0.25 s of a baby GPT's start-up, 0.8 s of GPT-2's

    grouped = runtime.fast_initializer() and not model_config.scan_layers

    def initialize(seed):  # nnx.Rngs(seed) does this with a Python int; here it is traced
        graphdef, state = initializer.build(lambda rngs: MODELS[family](model_config, rngs=rngs),
                                            jax.random.key(seed), grouped=grouped)
        graphdefs.append(graphdef)
        return state

    return graphdefs, jax.jit(initialize,
                              compiler_options=runtime.initializer_compiler_options())


class TrainStep:
    """``step(batch) -> {"loss", "grad_norm", "learning_rate"}`` for one optimizer update.

    ``batch`` holds the ``accumulation_steps`` micro-batches of the update stacked on a leading
    axis (``data.Dataset.update_batch``); ``evaluate(micro_batch)`` is the loss in eval mode.
    The step owns the state: :meth:`sync` writes it back into ``model`` and returns the model.

    The model is split once into its graph, its parameters and the rest of its state (the
    dropout RNG keys and counters of the model's ``nnx.Rngs``), and one pure function is compiled
    for a whole update: forward and backward over each micro-batch (a ``lax.scan`` when gradients
    are accumulated), the mean of the micro-batch gradients, clipping, AdamW. The buffers of the
    parameters, the optimizer state and the RNG state are donated to the call that replaces them.
    The RNG state goes in and comes back out of every call, so each step draws fresh dropout masks
    and a run is reproducible from its seed alone (and, restored from a checkpoint, from there).

    Given a ``mesh`` (``jaxformer.sharding.make_mesh``), the parameters and the optimizer state
    are placed by the logical-axis rules, the batch is split over ``("data", "fsdp")`` (each
    process feeding its own rows), and the compiled step keeps every output where its input was;
    XLA's partitioner inserts the collectives. The losses equal the one-device run's up to the
    order of float32 sums. ``mesh`` None: one device.

    ``compiler_options``: XLA options for the step's programs; None takes the runtime's
    (``jaxformer.runtime.train_compiler_options``), ``{}`` none at all.
    """

    def __init__(self, family: str, model: _TrainableModel, config: TrainConfig,
                 mesh: jax.sharding.Mesh | None = None, compiler_options: dict | None = None):
        self.family, self.config, self.model, self.mesh = family, config, model, mesh
        runtime.tune_allocator()  # CPU backend: keep XLA's freed scratch memory (glibc)
        self.task = tasks.get(family)
        if mesh is not None:
            sharding.check_batch_size(config.micro_batch_size, mesh)
        self.model_config = model.config
        model.eval()
        eval_graphdef = nnx.graphdef(model)
        model.train()
        # Two filters give exactly (graphdef, params, rest); flax types the tail as variadic.
        graphdef, params, *others = nnx.split(model, nnx.Param, ...)
        (rest,) = others
        # Own copies: the donated buffers must not be the ones the module still holds.
        params, rest = self._place(params), self._place(rest)
        self._tx = make_optimizer(config, params)
        # One program for the optimizer's zeros: eagerly, every distinct shape compiled its
        # own, too small for the persistent cache to keep (0.3-0.4 s of a warm start)
        opt_state = self._place(jax.jit(self._tx.init)(params))
        # The compiled functions take and return the states' leaves (flat lists of arrays), the
        # trees being rebuilt inside the trace: unflattening the nnx Variables of every output
        # in Python cost milliseconds per call (10% of a small model's step on a CPU).
        self._treedefs = tuple(jax.tree.structure(t) for t in (params, opt_state, rest))
        self._leaves = [jax.tree.leaves(t) for t in (params, opt_state, rest)]
        self.step = 0
        if compiler_options is None:
            compiler_options = runtime.train_compiler_options()
        placement: dict[str, Any] = {}
        if mesh is not None:  # every output stays where its input was
            placement["out_shardings"] = (*(jax.tree.leaves(sharding.shardings(tree, mesh))
                                            for tree in (params, opt_state, rest)),
                                          sharding.replicated(mesh))
        self._train = jax.jit(_on_leaves(_train_fn(self.task, graphdef, self._tx, config),
                                         self._treedefs, 3),
                              donate_argnums=(0, 1, 2), compiler_options=compiler_options,
                              **placement)
        on_eval = (self._treedefs[0], self._treedefs[2])
        self._eval = jax.jit(_on_leaves(_eval_fn(self.task.loss, eval_graphdef, config),
                                        on_eval, 0), compiler_options=compiler_options)
        self._accuracy = (jax.jit(_on_leaves(_eval_fn(self.task.accuracy, eval_graphdef, config),
                                             on_eval, 0), compiler_options=compiler_options)
                          if self.task.accuracy else None)

    def _tree(self, i: int):
        return jax.tree.unflatten(self._treedefs[i], self._leaves[i])

    @property
    def _params(self):
        return self._tree(0)

    @property
    def _opt_state(self):
        return self._tree(1)

    @property
    def _rest(self):
        return self._tree(2)

    def _lower(self, batch: dict):
        """``jax.jit(...).lower`` of the update for ``batch``: ``.compile()`` it for the compile
        time or XLA's cost analysis."""
        return self._train.lower(*self._leaves, self._batch(batch, batch_axis=1),
                                 np.float32(learning_rate(self.config, self.step)))

    def _place(self, tree):
        """Own copies of ``tree``'s arrays where the step keeps its state: on the mesh, or
        committed to the default device. Committed, as a restored checkpoint's arrays are: the
        compiled update then has one signature, so a resumed run finds the program a fresh run
        compiled (in memory and in the persistent compilation cache) instead of compiling its
        own."""
        if self.mesh is not None:
            return sharding.place(tree, self.mesh)
        device = jax.devices()[0]
        return jax.tree.map(lambda x: jax.device_put(x, device, may_alias=False), tree)

    def _run(self, fn, *args):
        """``fn(*args)``, under the mesh when there is one (activation constraints read it)."""
        if self.mesh is None:
            return fn(*args)
        with jax.set_mesh(self.mesh):
            return fn(*args)

    def _batch(self, batch: dict, batch_axis: int) -> dict:
        self.task.check_batch(batch, self.model_config)
        if self.mesh is None:
            return batch
        return sharding.shard_batch(batch, self.mesh, batch_axis)

    def __call__(self, batch: dict) -> dict[str, float]:
        return self.fetch(self.dispatch(batch))

    @property
    def dispatch_ahead(self) -> bool:
        """Whether a loop should dispatch the next update before fetching this one's metrics:
        on an accelerator, where the update runs while the host goes on (fetching first leaves
        the device idle while the host reads the loss and prepares the next call: 8-12% of
        GPT-2's and BERT-base's steps on an H100, docs/performance.md); not on a CPU, whose
        threads run the update (no gain measured there)."""
        devices = self.mesh.devices.flat if self.mesh is not None else jax.devices()[:1]
        return any(device.platform != "cpu" for device in devices)

    def dispatch(self, batch: dict) -> dict[str, jax.Array]:
        """The update, without waiting for it: its metrics stay on the device until
        :meth:`fetch` reads them. A loop that dispatches the next update before fetching the
        previous one's metrics keeps an accelerator busy while the host prepares the call."""
        batch = self._batch(batch, batch_axis=1)  # (micro-batches, batch, ...)
        # The schedule's value, an argument of the compiled update (``optim.learning_rate``).
        rate = learning_rate(self.config, self.step)
        *leaves, metrics = self._run(self._train, *self._leaves, batch, np.float32(rate))
        self._leaves = leaves
        self.step += 1
        return {**metrics, "learning_rate": rate}

    @staticmethod
    def fetch(metrics: dict) -> dict[str, float]:
        """The metrics :meth:`dispatch` returned, as floats (waits for their update)."""
        return {key: float(value) for key, value in jax.device_get(metrics).items()}

    def evaluate(self, batch: dict) -> float:
        return float(self._run(self._eval, self._leaves[0], self._leaves[2],
                               self._batch(batch, 0)))

    def accuracy(self, batch: dict) -> float:
        """The task's accuracy on ``batch`` in eval mode (a ValueError if it has none)."""
        if self._accuracy is None:
            raise ValueError(f"the {self.family} task reports no accuracy")
        return float(self._run(self._accuracy, self._leaves[0], self._leaves[2],
                               self._batch(batch, 0)))

    def state_dict(self) -> dict:
        """Everything a checkpoint needs: parameters, optimizer state, RNG state, step."""
        return {"params": self._params, "opt_state": self._opt_state, "rest": self._rest,
                "step": self._place(jnp.asarray(self.step, jnp.int32))}

    def load_state_dict(self, state: dict) -> None:
        leaves = [jax.tree.leaves(state[k]) for k in ("params", "opt_state", "rest")]
        for key, got, mine in zip(("params", "opt_state", "rest"), leaves, self._leaves,
                                  strict=True):
            if len(got) != len(mine):
                raise ValueError(f"the restored {key} has {len(got)} arrays, this model's "
                                 f"training state {len(mine)}")
        self._leaves = leaves
        self.step = int(state["step"])

    def sync(self) -> nnx.Module:
        """The model with the trained parameters and current RNG state."""
        nnx.update(self.model, _copy(self._params), _copy(self._rest))
        return self.model


def _copy(tree):
    """New buffers with the same values, where they are (a device copy; nothing to compile),
    arrays spread over several processes included."""
    def copy(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return _device_copy(x)  # device_put cannot name another process's devices
        return jax.device_put(x, may_alias=False)

    return jax.tree.map(copy, tree)


_device_copy = jax.jit(jnp.copy)  # a new buffer with the input's sharding, PRNG keys included


def _on_leaves(fn, treedefs, trees_out: int):
    """``fn`` over trees, as a function of the trees' leaf lists (the ``treedefs``' order,
    then any other arguments as they are); its first ``trees_out`` outputs (trees of the same
    structures) come back as leaf lists too."""

    def wrapped(*args):
        n = len(treedefs)
        trees = [jax.tree.unflatten(d, leaves) for d, leaves in zip(treedefs, args[:n],
                                                                    strict=True)]
        out = fn(*trees, *args[n:])
        if not trees_out:
            return out
        return (*(jax.tree.leaves(t) for t in out[:trees_out]), *out[trees_out:])

    return wrapped


def _train_fn(task, graphdef, tx, config: TrainConfig):
    accum = config.accumulation_steps
    batch_loss = getattr(losses, task.loss)

    def micro_step(carry, micro_batch):
        params, rest, grad_sum, loss_sum = carry

        def loss_fn(params, rest):
            # Fresh Variables (copy=True) of this trace, so dropout may advance their RNG counts.
            model = nnx.merge(graphdef, params, rest, copy=True)
            loss = batch_loss(model, micro_batch, config) / accum
            return loss, nnx.split(model, nnx.Param, ...)[2]

        (loss, rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest)
        return (params, rest, jax.tree.map(jnp.add, grad_sum, grads), loss_sum + loss), None

    def train(params, opt_state, rest, batch, rate):
        zeros = jax.tree.map(jnp.zeros_like, params)
        init = (params, rest, zeros, jnp.zeros((), jnp.float32))
        if accum == 1:  # no loop to compile
            (_, rest, grads, loss), _ = micro_step(init, jax.tree.map(lambda x: x[0], batch))
        else:
            (_, rest, grads, loss), _ = jax.lax.scan(micro_step, init, batch)
        grads, norm = clip_by_global_norm(grads, config.clip_norm)
        updates, opt_state = tx.update(grads, opt_state, params, learning_rate=rate)
        params = optax.apply_updates(params, updates)
        return params, opt_state, rest, {"loss": loss, "grad_norm": norm}

    return train


def _eval_fn(name: str, graphdef, config: TrainConfig):
    """The function ``name`` of ``training.losses`` (a loss or an accuracy) in eval mode."""
    metric = getattr(losses, name)

    def evaluate(params, rest, batch):
        return metric(nnx.merge(graphdef, params, rest), batch, config)

    return evaluate
