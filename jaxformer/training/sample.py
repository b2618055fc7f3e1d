"""Greedy continuation of a prompt by a trained GPT: the quick look at what a run has learned.
Twin: ``torch_ref/training/sample.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from jaxformer import validate
from jaxformer.nn.jit import jitted
from jaxformer.training.data import sample_context

if TYPE_CHECKING:
    from jaxformer.models.gpt import GPT


def greedy_sample(model: GPT, prompt_ids: npt.ArrayLike, length: int) -> np.ndarray:
    """The ``length`` ids a GPT appends greedily to ``prompt_ids`` (1-D ids), as int32.

    A host loop over the full forward pass, one token per call: nanoGPT's ``generate`` with
    ``argmax`` instead of sampling, and no KV cache (``jaxformer.generation`` has the fast, cached
    decoder). The context is the last ``max_position_embeddings`` tokens right-padded to that
    length (``data.sample_context``), so one compiled forward serves every step; the model is
    causal, so the padding after the last real token changes nothing before it. Ties go to the
    lowest id in both frameworks. The model is put in eval mode (no dropout) and left there.
    """
    config = model.config
    prompt = np.asarray(prompt_ids).reshape(-1)
    ids = prompt.tolist()
    sample_context(ids, length, config.max_position_embeddings)  # refuses before compiling
    validate.check_ids("prompt_ids", prompt, config.vocab_size)
    model.eval()
    next_id = jitted(model, fn=lambda m, window, mask, last: jnp.argmax(m(window, mask)[0, last]))
    for _ in range(length):
        window, mask, last = sample_context(ids, length, config.max_position_embeddings)
        ids.append(int(next_id(window, mask, np.int32(last))))
    return np.array(ids[len(prompt):], np.int32)
