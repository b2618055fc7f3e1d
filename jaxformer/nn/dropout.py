"""Dropout with ``nnx.Dropout``'s masks, bit for bit, drawn in one pass on the CPU.

``nnx.Dropout`` draws its mask with ``jax.random.bernoulli``, whose random bits come from
Threefry-2x32. JAX lowers that hash for the CPU backend as a loop over its five groups of four
rounds (a small program, quick to compile), and each trip of the loop reads and writes the whole
array of counters: a dropout mask costs several passes over memory per element (the 19.3 million
mask values of a BERT-base step at 4 x 128 take 185-210 ms to draw that way, 38 ms in one pass;
a tiny GPT's training step is 1.24x faster, a baby GPT's at dropout 0.2 1.11x, BERT-base's
1.01-1.03x, where XLA already overlapped the draw with the products: docs/performance.md,
"Dropout masks in one pass").

:func:`random_bits` writes the twenty rounds out as one elementwise expression over the counters
JAX itself uses (with ``jax_threefry_partitionable``, the default: element ``i`` of the flattened
shape hashes the counter pair ``(0, i)`` and keeps the XOR of the two output words), so XLA fuses
the hash, the comparison and the select into one pass. The bits are ``jax.random.bits``'s,
hence the masks are ``jax.random.bernoulli``'s and a run draws the same masks as before
(``parity_tests/nn/test_dropout_masks.py``). Threefry-2x32, the counter-based hash: two 32-bit
words, twenty rounds of add, rotate and xor with the rotations ``(13, 15, 26, 6)`` and ``(17,
29, 16, 24)`` in alternate groups of four, a word of the key schedule added after each group.

Where the shortcut would not reproduce JAX's draw (another key implementation, the
non-partitionable counters, 64-bit floats, a broadcast mask, a key or mode given at call time) or
where it was not measured (another backend, a device mesh: ``runtime.cpu_dropout_masks``),
:class:`Dropout` is ``nnx.Dropout``. No twin: torch draws its masks from its own generator, and
``torch_ref`` uses ``nn.Dropout``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jaxformer import runtime

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)  # Threefry's key-schedule constant


def _rotate_left(x, r: int):
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(key, x0, x1):
    """Threefry-2x32 (20 rounds) of the counter words ``x0``, ``x1`` (uint32 arrays of one
    shape) under ``key`` (two uint32 words), written out as elementwise operations."""
    schedule = (key[0], key[1], key[0] ^ key[1] ^ _PARITY)
    x0, x1 = x0 + schedule[0], x1 + schedule[1]
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, r) ^ x0
        x0 = x0 + schedule[(group + 1) % 3]
        x1 = x1 + schedule[(group + 2) % 3] + np.uint32(group + 1)
    return x0, x1


def reproducible(key) -> bool:
    """Whether :func:`random_bits` gives ``jax.random.bits(key, shape)``'s bits for ``key``: a
    typed Threefry-2x32 key under ``jax_threefry_partitionable``."""
    return (bool(jax.config.values["jax_threefry_partitionable"])
            and jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ()
            and str(jax.random.key_impl(key)) == "threefry2x32")


def random_bits(key, shape: tuple[int, ...]) -> jax.Array:
    """``jax.random.bits(key, shape)`` (uint32) for a key :func:`reproducible` accepts, as one
    fusible expression: element ``i`` of the flattened shape is the XOR of the two words
    Threefry-2x32 makes from the counters ``(0, i)``."""
    size = math.prod(shape)
    if size >= 2 ** 32:
        raise ValueError(f"random_bits draws fewer than 2**32 values; shape {shape} has {size}")
    words = jax.random.key_data(key)
    index = lax.iota(jnp.uint32, size).reshape(shape)
    high, low = threefry2x32((words[0], words[1]), jnp.zeros(shape, jnp.uint32), index)
    return high ^ low


def bernoulli(key, p: float, shape: tuple[int, ...]) -> jax.Array:
    """``jax.random.bernoulli(key, p, shape)`` for a key :func:`reproducible` accepts and a
    float32 ``p``: its uniform floats (the top 23 bits as a mantissa in ``[1, 2)``, minus 1)
    compared with ``p``, from :func:`random_bits`."""
    mantissa = random_bits(key, shape) >> np.uint32(9)
    floats = lax.bitcast_convert_type(mantissa | np.uint32(0x3F800000), jnp.float32) - 1.0
    return floats < np.float32(p)


class Dropout(nnx.Dropout):
    """``nnx.Dropout`` (the same arguments, state and masks) whose mask, on the CPU backend
    without a device mesh, comes from :func:`bernoulli` (module docstring)."""

    def __call__(self, inputs, *, deterministic: bool | None = None, rngs=None):
        keep = 1.0 - self.rate
        if (deterministic is not None or rngs is not None or self.deterministic is not False
                or self.broadcast_dims or not 0.0 < self.rate < 1.0
                or not isinstance(self.rngs, nnx.RngStream) or lax.dtype(keep) != jnp.float32
                or not runtime.cpu_dropout_masks()):
            return super().__call__(inputs, deterministic=deterministic, rngs=rngs)
        key = self.rngs()  # advances the stream as nnx.Dropout does
        if not reproducible(key):
            mask = jax.random.bernoulli(key, keep, inputs.shape)
        else:
            mask = bernoulli(key, keep, inputs.shape)
        return lax.select(mask, inputs / keep, jnp.zeros_like(inputs))
