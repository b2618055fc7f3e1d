"""Twin of ``jaxformer/generation/decoding.py``: ``generate`` and ``stream`` in PyTorch, with the
same arguments, checks (``jaxformer.generation.checks``) and semantics (see jaxformer's module
doc for what follows Hugging Face and where it differs)."""

from __future__ import annotations

import queue
import threading

import torch

from jaxformer.generation import checks
from torch_ref.generation import search
from torch_ref.models.encoder_decoder import Transformer
from torch_ref.models.gpt import GPT


def check_eval_mode(model) -> None:
    """Same as ``jaxformer.generation.decoding.check_eval_mode`` (an ``nn.Dropout`` of ``p > 0``
    in training mode)."""
    if any(isinstance(module, torch.nn.Dropout) and module.p > 0 and module.training
           for module in model.modules()):
        raise ValueError("generate needs the model in evaluation mode: it is in training mode "
                         "with dropout active; call model.eval() first")


@torch.no_grad()
def generate(model, input_ids, attention_mask=None, *, max_new_tokens=None, do_sample=False,
             temperature=1.0, top_k=0, top_p=1.0, num_beams=1, length_penalty=1.0,
             early_stopping=False, eos_token_id=None, pad_token_id=None, seed=0,
             decoder_start_token_id=None, streamer=None, max_length=None,
             forced_bos_token_id=None, forced_eos_token_id=None, bad_words_ids=None):
    """Same as ``jaxformer.generation.generate``; returns an int64 tensor."""
    if not isinstance(model, (GPT, Transformer)):
        raise TypeError(f"generate needs a GPT or an encoder-decoder Transformer, got "
                        f"{type(model).__name__}")
    config = model.config
    options, values = checks.check_arguments(config, isinstance(model, GPT), input_ids,
                                             attention_mask, locals())
    check_eval_mode(model)
    device = next(model.parameters()).device
    ids = torch.as_tensor(input_ids, device=device).long()
    values = {name: torch.as_tensor(value, device=device) if name != "seed" else int(value)
              for name, value in values.as_dict().items()}
    for name in ("eos_token_ids", "pad_token_id", "bad_words", "forced_bos_token_id",
                 "forced_eos_token_ids"):
        values[name] = values[name].long()
    if isinstance(model, GPT):
        mask = (torch.ones_like(ids, dtype=torch.bool) if attention_mask is None
                else torch.as_tensor(attention_mask, device=device).bool())
        B, P = ids.shape
        cache = model.init_cache(B, P + options.max_new_tokens)
        hidden, cache = model.hidden_states(ids, mask, cache=cache)
        last = P - 1 - torch.argmax(mask.flip(-1).long(), dim=-1)  # each row's last real token
        logits = model.logits(hidden[torch.arange(B, device=device), last])
        prompt = ids

        def step_fn(tokens, cache):
            hidden, cache = model.hidden_states(tokens[:, None], None, cache=cache)
            return model.logits(hidden[:, 0]), cache
    else:
        mask = (ids != config.src_pad_id if attention_mask is None
                else torch.as_tensor(attention_mask, device=device).bool())
        B = ids.shape[0]
        memory = model.encode(ids, mask)
        cache = model.init_cache(memory, 1 + options.max_new_tokens, mask)
        prompt = torch.full((B, 1), int(decoder_start_token_id), dtype=torch.long, device=device)
        logits, cache = model.decode(prompt, None, tgt_mask=torch.ones_like(prompt, dtype=bool),
                                     cache=cache)
        logits = logits[:, 0]

        def step_fn(tokens, cache):
            ones = torch.ones(tokens.shape[0], 1, dtype=torch.bool, device=device)
            logits, cache = model.decode(tokens[:, None], None, tgt_mask=ones, cache=cache)
            return logits[:, 0], cache

    if options.num_beams > 1:
        return search.beam(step_fn, logits, cache, prompt, options, values)
    return search.greedy(step_fn, logits, cache, prompt, options, values, streamer)


def stream(model, input_ids, attention_mask=None, **kwargs):
    """Iterate over the new tokens as they are produced, one numpy ``[batch]`` array per step,
    as jaxformer's ``stream`` does: ``generate`` runs in a background thread and hands each
    step's tokens over through its ``streamer``."""
    tokens: queue.Queue = queue.Queue()
    done = object()
    failure = []

    def run():
        try:
            generate(model, input_ids, attention_mask, streamer=tokens.put, **kwargs)
        except BaseException as error:  # handed to the consumer below
            failure.append(error)
        finally:
            tokens.put(done)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while (item := tokens.get()) is not done:
        yield item
    thread.join()
    if failure:
        raise failure[0]
