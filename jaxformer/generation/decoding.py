"""``generate`` and ``stream`` for GPT and the encoder-decoder: greedy, sampling and beam search
with a KV cache, each one compiled program, following Hugging Face ``generate`` where it defines
the behaviour. Twin: ``torch_ref/generation/decoding.py``.
"""

from __future__ import annotations

import functools
import queue
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import runtime
from jaxformer.generation import checks, search
from jaxformer.models.encoder_decoder import Transformer
from jaxformer.models.gpt import GPT
from jaxformer.nn import params

# model -> the new tokens of its calls since its last call that made (or could have made) kernel
# copies: shorter calls make none, until together they reach runtime.VECTOR_KERNEL_SHORT_TOKENS
_TOKENS_WITHOUT_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vector_steps(model, graphdef, state, rows: int, options) -> dict:
    """At most ``runtime.VECTOR_ROWS`` rows a step (prompts times beams) on the CPU
    (``runtime.cpu_vector_kernels``): copies of weights in a faster layout, kept with the model
    (``params.kept_vector_kernels``; every linear layer's for more than one row, or for one where
    ``runtime.cpu_gemv_one_row``), which the loop multiplies by; the prefill and the encoder keep
    the stored ones. A call of fewer than ``VECTOR_KERNEL_MIN_TOKENS`` tokens makes none (one
    call would not repay them) but uses those an earlier call made, unless the model's calls
    since its last that made them, or could have, reach ``VECTOR_KERNEL_SHORT_TOKENS`` together
    (short calls repeated: a chat's turns). ``{}`` otherwise."""
    steps, step_rows = options.max_new_tokens, rows * options.num_beams
    if step_rows <= runtime.VECTOR_ROWS and steps > 1 and runtime.cpu_vector_kernels():
        wide = step_rows > 1 or runtime.cpu_gemv_one_row()
        owed = _TOKENS_WITHOUT_COPIES.get(model, 0) + steps
        make = (steps >= runtime.VECTOR_KERNEL_MIN_TOKENS
                or owed >= runtime.VECTOR_KERNEL_SHORT_TOKENS)
        _TOKENS_WITHOUT_COPIES[model] = 0 if make else owed
        return params.kept_vector_kernels(model, graphdef, state, widening=wide, make=make)
    return {}


def check_eval_mode(model) -> None:
    """Generation runs the model without dropout: a model left in training mode with a dropout
    rate above 0 (``nnx.Dropout`` not deterministic) is refused with a clear error, not traced
    into a program that would drop activations (or fail on the dropout's random stream)."""
    if any(isinstance(module, nnx.Dropout) and module.rate > 0 and not module.deterministic
           for _, module in nnx.iter_graph(model)):
        raise ValueError("generate needs the model in evaluation mode: it is in training mode "
                         "with dropout active; call model.eval() first")


def _search(step_fn, logits, cache, prompt, options, values, stream_id):
    if options.num_beams > 1:
        return search.beam(step_fn, logits, cache, prompt, options, values)
    return search.greedy(step_fn, logits, cache, prompt, options, values, stream_id)


@functools.partial(jax.jit, static_argnames=("graphdef", "options"))
def _generate_gpt(graphdef, state, copies, input_ids, attention_mask, values, stream_id, *,
                  options):
    model = nnx.merge(graphdef, state)
    params.use_vector_head(model)
    B, P = input_ids.shape
    cache = model.init_cache(B, P + options.max_new_tokens)
    hidden, cache = model.hidden_states(input_ids, attention_mask, cache=cache)
    last = P - 1 - jnp.argmax(attention_mask[:, ::-1], axis=-1)  # each row's last real token
    logits = model.logits(jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0])
    params.use_vector_kernels(model, copies)

    def step_fn(tokens, cache):
        hidden, cache = model.hidden_states(tokens[:, None], None, cache=cache)
        return model.logits(hidden[:, 0]), cache

    return _search(step_fn, logits, cache, input_ids, options, values, stream_id)


@functools.partial(jax.jit, static_argnames=("graphdef", "options"))
def _generate_seq2seq(graphdef, state, copies, src_ids, src_mask, decoder_start_token_id,
                      values, stream_id, *, options):
    model = nnx.merge(graphdef, state)
    params.use_vector_head(model)
    B = src_ids.shape[0]
    memory = model.encode(src_ids, src_mask)
    cache = model.init_cache(memory, 1 + options.max_new_tokens, src_mask)
    start = jnp.full((B, 1), decoder_start_token_id, jnp.int32)
    logits, cache = model.decode(start, None, tgt_mask=jnp.ones((B, 1), bool), cache=cache)
    params.use_vector_kernels(model, copies)

    def step_fn(tokens, cache):
        ones = jnp.ones((tokens.shape[0], 1), bool)  # generated tokens always count
        logits, cache = model.decode(tokens[:, None], None, tgt_mask=ones, cache=cache)
        return logits[:, 0], cache

    return _search(step_fn, logits[:, 0], cache, start, options, values, stream_id)


def generate(model, input_ids, attention_mask=None, *, max_new_tokens=None, do_sample=False,
             temperature=1.0, top_k=0, top_p=1.0, num_beams=1, length_penalty=1.0,
             early_stopping=False, eos_token_id=None, pad_token_id=None, seed=0,
             decoder_start_token_id=None, streamer=None, max_length=None,
             forced_bos_token_id=None, forced_eos_token_id=None, bad_words_ids=None):
    """Generate with a KV cache in one compiled program (the semantics are below).

    ``model`` is a ``GPT`` (``input_ids`` = the prompt, ``[batch, seq]``, left-padded with
    ``attention_mask``) or a ``Transformer`` (``input_ids`` = the source, ``attention_mask`` its
    mask, default from ``src_pad_id``; ``decoder_start_token_id`` required), in eval mode
    (``model.eval()``: with dropout active it raises ``ValueError``). ``eos_token_id`` is an id
    or a list of ids. ``streamer``, a callable, receives each step's new tokens (a numpy
    ``[batch]`` array) as they are produced (``num_beams=1`` only).
    Returns int32 token ids (the shape is under eos below). ``max_length`` (the whole returned
    sequence: GPT's prompt included, the encoder-decoder's start token included, as in Hugging
    Face) may be given instead of ``max_new_tokens``.

    What Hugging Face ``generate`` users can rely on (it is followed where it defines the
    behaviour):

    - first the constraints, greedy, sampling and beam alike: ``bad_words_ids`` (single tokens)
      never chosen, ``forced_bos_token_id`` as the sequence's first token (the encoder-decoder's
      first generated token), ``forced_eos_token_id`` (an id or a list) as the last token the
      length allows (``processors.constrain``); beam search applies them to log-probabilities.
    - processors, with ``do_sample=True`` only, in the order temperature -> top-k -> top-p; top-k
      keeps ties with the k-th score; top-p keeps the smallest set of most likely tokens whose
      probability exceeds ``top_p`` and never removes the best token; beam methods keep at least
      ``len(eos) + 1`` tokens. Beam search applies them to log-probabilities, as HF does.
    - beam scores: sum of the log-probabilities of the generated tokens divided by
      ``generated_length ** length_penalty``; ``early_stopping`` False (HF's heuristic: stop when
      the best running beam, scored at the current length, cannot beat the worst finished one), True
      (stop as soon as ``num_beams`` hypotheses are finished) or ``"never"`` (the same heuristic at
      the best length a running beam could reach: ``max_new_tokens`` when ``length_penalty > 0``).
    - eos: a row that produced one is finished; later positions hold ``pad_token_id`` (``eos`` when
      no pad token is given). The result ends when every row is finished: ``[batch, prompt +
      generated]`` for GPT (the prompt included, as HF returns for decoder-only models), ``[batch, 1
      + generated]`` target ids (starting with ``decoder_start_token_id``) for the encoder-decoder.
    - GPT prompts are left-padded (the mask's 0s first); positions count real tokens, as HF's
      ``generate`` computes them from the mask.

    Where it differs, on purpose:

    - ``top_k`` defaults to 0 (off); HF's ``GenerationConfig`` defaults to 50.
    - the random numbers: HF samples with ``torch.multinomial``; here the tokens are the Gumbel-max
      of the processed scores with counter-based uniforms (``checks.uniforms``), so the same
      ``seed`` gives the same tokens in jaxformer and torch_ref (not HF's tokens; the same
      distribution).
    - beam search fills finished hypotheses with ``pad_token_id``; HF fills them with eos when
      ``pad_token_id`` is 0 (its ``pad_token_id or eos_token_id[0]``).
    - a prompt with padding after real tokens is continued from its last real token (HF continues
      from the last column and warns); the padding stays inside the returned row.
    - only these arguments; bad values raise ``ValueError`` before anything runs.
    """
    if not isinstance(model, (GPT, Transformer)):
        raise TypeError(f"generate needs a GPT or an encoder-decoder Transformer, got "
                        f"{type(model).__name__}")
    config = model.config
    options, values = checks.check_arguments(config, isinstance(model, GPT), input_ids,
                                             attention_mask, locals())
    check_eval_mode(model)
    graphdef, state = nnx.split(model)
    ids = jnp.asarray(np.asarray(input_ids), jnp.int32)
    copies = _vector_steps(model, graphdef, state, ids.shape[0], options)
    values = {name: jnp.asarray(value) for name, value in values.as_dict().items()}
    stream_id = search._register(streamer) if streamer is not None else 0
    try:
        if isinstance(model, GPT):
            mask = (jnp.ones(ids.shape, bool) if attention_mask is None
                    else jnp.asarray(np.asarray(attention_mask)).astype(bool))
            sequences, length = _generate_gpt(graphdef, state, copies, ids, mask, values,
                                              stream_id, options=options)
        else:
            mask = (ids != config.src_pad_id if attention_mask is None
                    else jnp.asarray(np.asarray(attention_mask)).astype(bool))
            sequences, length = _generate_seq2seq(
                graphdef, state, copies, ids, mask, jnp.int32(decoder_start_token_id), values,
                stream_id, options=options)
        return sequences[:, :int(length)]
    finally:
        search._STREAMERS.pop(stream_id, None)


def stream(model, input_ids, attention_mask=None, **kwargs):
    """Iterate over the new tokens as they are produced: one numpy ``[batch]`` array per step
    (finished rows give ``pad_token_id``). Takes ``generate``'s arguments (``num_beams=1``).

    The compiled loop runs in a background thread and hands each step's tokens over through a
    host callback, so streaming costs one host round trip per token and nothing else.
    """
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
