"""Twin of ``jaxformer/nn/stack.py``: a stack of identical blocks with a rematerialisation policy.

torch has no scan: the blocks are always submodules ``0 .. num_layers-1`` (the state dict keys
``blocks.0.attention.query.weight`` ...), whatever ``config.scan_layers`` says, and a cache is
always a tuple of per-layer caches (``torch_ref/nn/cache.py``).
"""

from __future__ import annotations

from torch import nn
from torch.utils.checkpoint import checkpoint


class LayerStack(nn.Module):
    """``num_layers`` blocks applied in order; jaxformer's scanned stacks convert to and from
    their per-layer keys.

    Rematerialisation: in training mode with ``config.remat != "none"`` each block runs under
    ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``, which keeps only the block's
    input and recomputes the rest in the backward pass, whichever JAX policy is named (torch's
    checkpoint has no counterpart of "save the matmuls"): the gradients are the same in every case.
    """

    def __init__(self, config, block, num_layers: int):
        super().__init__()
        self.num_layers = num_layers
        self.remat = config.remat
        for i in range(num_layers):
            self.add_module(str(i), block(config))

    def __len__(self) -> int:
        return self.num_layers

    def __getitem__(self, i: int):
        if not -self.num_layers <= i < self.num_layers:
            raise IndexError(f"layer {i} out of range for a stack of {self.num_layers}")
        return getattr(self, str(i % self.num_layers))

    def __iter__(self):
        return (self[i] for i in range(self.num_layers))

    def map(self, fn):
        return tuple(fn(block) for block in self)

    def _run_block(self, block, *args):
        if self.remat == "none" or not self.training:
            return block(*args)
        return checkpoint(block, *args, use_reentrant=False)

    def forward(self, x, *args, cache=None, cache_index=None):
        cached = cache is not None
        new_cache = []
        for i, block in enumerate(self):
            if cached:
                x, layer_cache = self._run_block(block, x, *args, cache[i], cache_index)
                new_cache.append(layer_cache)
            else:
                x = self._run_block(block, x, *args)
        return (x, tuple(new_cache)) if cached else x
