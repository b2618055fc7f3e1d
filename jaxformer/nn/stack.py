"""A stack of identical blocks, unrolled or scanned, with a rematerialisation policy.

Every family keeps its blocks in a :class:`LayerStack` (GPT's ``blocks``, BERT's and the
encoder-decoder's ``layers``), so the models read the same in both modes, cached or not:
``x = self.blocks(x, mask)``. Twin: ``torch_ref/nn/stack.py``.
"""

from __future__ import annotations

import jax
from flax import nnx
from flax.nnx import spmd

# config.remat -> the jax.checkpoint policy of each block (None: save nothing).
REMAT_POLICIES = {
    "full": None,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


# The layer axis's logical name, added to every stacked variable's sharding names.
LAYER_AXIS = {nnx.PARTITION_NAME: "layers"}


def _call(block, *args):
    return block(*args)


def _one_layer(state):
    """One layer's slice of stacked variables: drop "layers" from their sharding names, as
    ``nnx.scan`` does, so the metadata describes the arrays it sits on."""
    return spmd.remove_axis(state, 0, LAYER_AXIS)


class LayerStack(nnx.Module):
    """``num_layers`` blocks ``block(config, rngs=rngs)``, applied in order.

    ``stack(x, *args)`` runs ``x = block(x, *args)`` through every layer; ``args`` (masks,
    memory) are shared by all layers. With ``cache`` (one per layer, see below) and
    ``cache_index`` it runs ``x, layer_cache = block(x, *args, layer_cache, cache_index)`` and
    returns ``(x, new cache)``.

    - Unrolled (``config.scan_layers=False``): block ``i`` is the attribute ``i``, exactly the paths
      an ``nnx.List`` gives (``blocks.0.attention.query.kernel``), and the call loops in Python. XLA
      then compiles every block on its own: compile time grows linearly with depth.
    - Scanned (``config.scan_layers=True``): one block, ``stacked``, whose every variable has a
      leading axis of length ``num_layers`` (``blocks.stacked.attention.query.kernel`` is
      ``(L, C, C)``). It is built with ``nnx.vmap`` over split RNG streams, so each layer draws its
      own initial weights and its own dropout masks, and applied with one ``jax.lax.scan`` over the
      layer axis: XLA compiles one block whatever the depth. The layer axis carries the logical axis
      name ``"layers"`` (``nnx.PARTITION_NAME``), which the sharding rules never shard.
      Weights convert to and from the per-layer torch and Hugging Face keys
      (``jaxformer.checkpoints.convert``), so a state dict is the same in both modes.

    The scan splits the stacked block into its parameters (scanned in, never returned: returning
    them would make XLA write a copy of every weight) and the rest (dropout RNG keys and counts,
    scanned in and out and written back, so each call draws fresh masks, as in ``nn.jit``).

    A KV cache (``nn/cache.py``) is per layer: a tuple of per-layer caches when unrolled, one cache
    whose arrays have a leading layer axis when scanned (scanned alongside the parameters).
    :meth:`LayerStack.map` builds either from a function of one block.

    Rematerialisation (``config.remat``): each block's forward runs under ``nnx.remat`` with the
    policy of :data:`REMAT_POLICIES`, so its activations are recomputed in the backward pass
    instead of kept: ``"full"`` keeps nothing but the block's input, ``"dots_saveable"`` keeps the
    matmul results, ``"dots_with_no_batch_dims_saveable"`` keeps the matmuls without batch
    dimensions (the projections, not attention's batched score and value products). Gradients are
    unchanged; peak memory and FLOPs are traded (``benchmarks/bench_remat.py``).
    """

    # Digit attribute names become integer path keys, as in nnx.List: blocks.0, blocks.1, ...
    _pytree__has_int_keys = True

    def __init__(self, config, block, num_layers: int, *, rngs: nnx.Rngs):
        self.num_layers = num_layers
        self.scan_layers = config.scan_layers
        self.remat = config.remat
        if not config.scan_layers:
            for i in range(num_layers):
                setattr(self, str(i), block(config, rngs=rngs))
            return

        @nnx.split_rngs(splits=num_layers)
        @nnx.vmap(in_axes=0, out_axes=0, transform_metadata=LAYER_AXIS)
        def build(rngs):
            return block(config, rngs=rngs)

        self.stacked = build(rngs)

    def __len__(self) -> int:
        return self.num_layers

    def __getitem__(self, i: int):
        """Layer ``i``. Scanned: a new module holding copies of layer ``i``'s arrays (to read or
        call on its own; writing to it does not change the stack)."""
        if not -self.num_layers <= i < self.num_layers:
            raise IndexError(f"layer {i} out of range for a stack of {self.num_layers}")
        i %= self.num_layers
        if not self.scan_layers:
            return getattr(self, str(i))
        graphdef, state = nnx.split(self.stacked)
        return nnx.merge(graphdef, _one_layer(jax.tree.map(lambda a: a[i], state)))

    def __iter__(self):
        return (self[i] for i in range(self.num_layers))

    def map(self, fn):
        """``fn(block)`` for every layer: a tuple when unrolled, one pytree with a leading layer
        axis when scanned (``fn``'s outputs stacked). How the models build a cache."""
        if not self.scan_layers:
            return tuple(fn(block) for block in self)
        graphdef, state = nnx.split(self.stacked)
        return jax.vmap(lambda layer: fn(nnx.merge(graphdef, _one_layer(layer))))(state)

    def _run_block(self, block, *args):
        if self.remat == "none":
            return block(*args)
        # Inside a scan, common-subexpression elimination cannot merge the recomputation with
        # the forward pass, so prevent_cse (which costs fusion opportunities) is only needed
        # when unrolled (jax.checkpoint's documentation).
        return nnx.remat(_call, policy=REMAT_POLICIES[self.remat],
                         prevent_cse=not self.scan_layers)(block, *args)

    def __call__(self, x, *args, cache=None, cache_index=None):
        cached = cache is not None
        if not self.scan_layers:
            new_cache = []
            for i, block in enumerate(self):
                if cached:
                    x, layer_cache = self._run_block(block, x, *args, cache[i], cache_index)
                    new_cache.append(layer_cache)
                else:
                    x = self._run_block(block, x, *args)
            return (x, tuple(new_cache)) if cached else x

        graphdef, params, rest = nnx.split(self.stacked, nnx.Param, ...)
        draws = self._draws()

        def layer(x, scanned):
            params, rest, layer_cache = scanned
            block = nnx.merge(graphdef, _one_layer(params), _one_layer(rest))
            if cached:
                x, layer_cache = self._run_block(block, x, *args, layer_cache, cache_index)
            else:
                x = self._run_block(block, x, *args)
            rest = (spmd.add_axis(nnx.split(block, nnx.Param, ...)[2], 0, LAYER_AXIS) if draws
                    else None)
            return x, (rest, layer_cache)

        x, (rest, new_cache) = jax.lax.scan(layer, x, (params, rest, cache))
        if draws:
            nnx.update(self.stacked, rest)
        return (x, new_cache) if cached else x

    def _draws(self) -> bool:
        """Whether a call draws random numbers (a dropout in train mode). Only then is the RNG
        state returned from the scan and written back: otherwise the call leaves the module
        untouched, as the unrolled loop does, and can run inside another trace (a generation
        loop) than the one the module was built in."""
        return any(isinstance(node, nnx.Dropout) and not node.deterministic and node.rate > 0
                   for _, node in nnx.iter_graph(self.stacked))
