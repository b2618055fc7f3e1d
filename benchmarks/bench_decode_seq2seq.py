#!/usr/bin/env python
"""Encoder-decoder decoding benchmark: a MarianMT-base-sized random checkpoint, greedy and beam
search, jaxformer against torch_ref and Hugging Face ``generate`` (eager), the same weights in
the same process.

A random ``transformers.MarianMTModel`` the size of the Helsinki-NLP opus-mt models (6+6 layers,
d_model 512, 8 heads, d_ff 2048, vocabulary 58101, swish, scaled shared embeddings; its own
seeded initialisation) with no eos token, so that every call makes exactly ``--new`` tokens, is
saved to a temporary directory and loaded into jaxformer and torch_ref by ``hf.from_pretrained``.
Sources: ``--source`` random tokens per row, no padding; the decoder starts from the pad id, as
Marian's does. Candidates: ``jaxformer.generation.generate`` (encoder once, cross-attention keys
and values once, then a compiled ``while_loop``), ``torch_ref.generation.generate`` (the twin, a
Python loop over the cached model) and ``MarianMTModel.generate(do_sample=False)``. The three
outputs are compared once and the share of identical tokens is recorded (random weights give
near-flat logits, so a near tie can send one framework down another path; the work per call is
the same).

Per case (batch in ``--batches`` x search in ``--beams``): decode tokens/s = ``batch x new`` over
the whole call (encoder included; with beams, tokens of the returned rows, not of every beam),
and jaxformer's compile time (its first call minus its median).

    python benchmarks/bench_decode_seq2seq.py                    # batch 1 and 8, greedy, beam 4
    python benchmarks/bench_decode_seq2seq.py --batches 1 --beams 1 --repeats 2 --no-save

``--jax-switch NAME`` adds the candidate ``jaxformer NAME=0`` (``harness.switched_off``), timed
interleaved with the default in the same process, and the default's speed-up over it.
"""

from __future__ import annotations

import sys
import tempfile
import time

import harness


def main(argv=None) -> int:
    parser = harness.argument_parser(__doc__, repeats=3, warmup=1)
    parser.add_argument("--batches", default="1,8", help="batch sizes (1,8)")
    parser.add_argument("--beams", default="1,4", help="num_beams values: 1 is greedy (1,4)")
    parser.add_argument("--source", type=int, default=24, help="source tokens per row (24)")
    parser.add_argument("--new", type=int, default=32, help="new tokens (32)")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate")
    harness.add_jax_switch(parser)
    args = parser.parse_args(argv)
    bench = harness.start(args, "decode_seq2seq",
                          title=f"Encoder-decoder decoding, MarianMT base: source {args.source}, "
                                f"{args.new} new tokens")
    if bench is None:
        return 0
    import numpy as np
    import torch
    import transformers

    from jaxformer.checkpoints import hf
    from jaxformer.generation import generate as jax_generate
    from torch_ref.generation import generate as torch_generate

    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    pad = 58100
    reference = transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
        decoder_ffn_dim=2048, max_position_embeddings=512, activation_function="swish",
        scale_embedding=True, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=None,
        forced_eos_token_id=None, bos_token_id=None)).eval()
    with tempfile.TemporaryDirectory() as directory:
        reference.save_pretrained(directory)
        jax_model = hf.from_pretrained(directory, "jax")
        torch_model = hf.from_pretrained(directory, "torch")
    reference.to(bench.tdev)
    torch_model.to(bench.tdev)
    settings = {"decoder_start_token_id": pad, "pad_token_id": pad}
    switch_off, variant = harness.switched_off(args.jax_switch, "_generate_seq2seq")

    for batch in (int(b) for b in args.batches.split(",")):
        for beams in (int(b) for b in args.beams.split(",")):
            rng = np.random.RandomState(args.seed)
            ids = rng.randint(0, pad, (batch, args.source))
            mask = np.ones_like(ids)
            tids, tmask = (torch.tensor(a, device=bench.tdev) for a in (ids, mask))
            search = {"max_new_tokens": args.new, "num_beams": beams, **settings}

            def run_jax(ids=ids, mask=mask, search=search):
                return np.asarray(jax_generate(jax_model, ids, mask, **search))

            def run_torch(tids=tids, tmask=tmask, search=search):
                out = torch_generate(torch_model, tids, tmask, **search)
                bench.sync()
                return out.cpu().numpy()

            def run_hf(tids=tids, tmask=tmask, search=search):
                with torch.inference_mode():
                    out = reference.generate(tids, attention_mask=tmask, do_sample=False,
                                             **search)
                bench.sync()
                return out.cpu().numpy()

            def run_variant(run=run_jax):
                with switch_off():
                    return run()

            fns = {"jaxformer": run_jax, "torch_ref": run_torch}
            if switch_off is not None:
                fns[variant] = run_variant
            if not args.no_hf:
                fns["hf_generate"] = run_hf
            t0 = time.perf_counter()
            outputs = {"jaxformer": run_jax()}
            first_call = time.perf_counter() - t0
            outputs.update({name: fn() for name, fn in fns.items() if name != "jaxformer"})
            same = {name: float((out == outputs["jaxformer"]).mean())
                    for name, out in outputs.items()
                    if name != "jaxformer" and out.shape == outputs["jaxformer"].shape}
            baseline = "torch_ref" if args.no_hf else "hf_generate"
            case = bench.measure(fns, baseline=baseline, tokens=batch * args.new, peak=False)
            compile_s = first_call - case["jaxformer"]["median_s"]
            case["jaxformer"]["compile_s"] = compile_s
            search_name = "greedy" if beams == 1 else f"beam {beams}"
            notes = {"identical tokens vs jaxformer": ", ".join(
                f"{k} {100 * v:.1f}%" for k, v in same.items()),
                "jaxformer compile s": f"{compile_s:.1f}"}
            if switch_off is not None:
                ratio = case[variant]["median_s"] / case["jaxformer"]["median_s"]
                case["jaxformer"]["speed_ratio_over_switch_off"] = ratio
                notes[f"jaxformer / {variant}"] = f"{ratio:.3f}"
            case.update(label=f"MarianMT base {search_name}, batch {batch}",
                        shape=f"{batch} x ({args.source} -> {args.new})", notes=notes)
            bench.add(f"marian_{'greedy' if beams == 1 else f'beam{beams}'}_b{batch}", case)
            print("  " + "; ".join(f"{k}: {v}" for k, v in notes.items()), flush=True)
    bench.footnote = ("Tokens/s counts the returned rows' new tokens (batch x new), the encoder "
                      "and, for beam search, every beam's work included.")
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
