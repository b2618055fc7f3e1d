"""Twin of ``jaxformer/training/sample.py``: greedy continuation by the torch GPT, a host loop
over the full forward (eager, in eval mode, which it leaves the model in)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from jaxformer import validate
from jaxformer.training.data import sample_context


@torch.no_grad()
def greedy_sample(model: nn.Module, prompt_ids, length: int) -> np.ndarray:
    config = model.config
    prompt = np.asarray(prompt_ids).reshape(-1)
    ids = prompt.tolist()
    sample_context(ids, length, config.max_position_embeddings)
    validate.check_ids("prompt_ids", prompt, config.vocab_size)
    model.eval()
    device = next(model.parameters()).device
    for _ in range(length):
        window, mask, last = sample_context(ids, length, config.max_position_embeddings)
        logits = model(torch.as_tensor(window, device=device).long(),
                       torch.as_tensor(mask, device=device).long())
        ids.append(int(torch.argmax(logits[0, last])))
    return np.array(ids[len(prompt):], np.int32)
