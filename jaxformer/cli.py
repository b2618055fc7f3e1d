"""The ``jaxformer`` command: the parser and dispatch of ``parity``, ``embed``, ``train``,
``eval``, ``generate``, ``classify``, ``fill-mask`` and ``data``; each subcommand's work lives
in its package or module (``jaxformer.parity``, ``jaxformer.embed``, ``jaxformer.training``,
``jaxformer.evaluate``, ``jaxformer.generation``, ``jaxformer.classify``,
``jaxformer.fill_mask``). ``DESCRIPTION`` is the
text of ``jaxformer --help``.
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxformer import embed as embed_module
from jaxformer import errors

DESCRIPTION = """The jaxformer command.

  parity     builds every family in Flax NNX and in PyTorch with the same seeded weights and
             prints, per component, the max abs difference and its bound.
  embed      sentence embeddings from a bert/classifier run or a Hugging Face BERT directory:
             their cosine-similarity matrix, or a .npy / .jsonl file.
  train      trains a family on a text file, in JAX or with the PyTorch twin, with metrics, a
             loss-curve PNG and checkpoints (see docs/training.md).
  eval       measures a trained run (or a Hugging Face directory) on a text file: loss,
             perplexity, the family's accuracies (see docs/workflow.md).
  generate   text from a GPT or encoder-decoder run, or a Hugging Face directory, with a KV
             cache: greedy, sampling or beam search, streamed as produced (docs/generation.md).
  classify   the label and its probability for each text, from a classifier run.
  fill-mask  the most likely tokens for each [MASK], from a bert run or a Hugging Face BERT
             directory with a masked-LM head.
  data       fetches a corpus (Shakespeare) and writes train.txt, val.txt split by document and
             manifest.json (see docs/data.md).

Unknown arguments are reported with the usage of the subcommand they were given to. Errors are
one line, `jaxformer COMMAND: error: ...`, exit status 2 for bad input, 1 for a failed run, 130
when interrupted; --debug (or JAXFORMER_DEBUG=1) adds the Python traceback.

  jaxformer parity --family gpt --json
  jaxformer train --config run.toml --steps 100   # a TOML file of flags; the command line wins
  jaxformer train --help                          # a command's flags and examples
  jaxformer --version
"""


# The bounds below are jaxformer.parity.compare's FORWARD_RTOL, JIT_TOL and JIT_NOISE_FACTOR
# (parity_tests/test_cli_help.py holds the text to them; this module does not import torch).
PARITY_DESCRIPTION = """\
Build each model family in both frameworks from the same seeded random weights and compare every
component on padded inputs (padded query rows are not compared). Each full model also runs jitted
and, as the exact reference, in float64 (the torch twin cast to float64).

Each row says which two things it compares (column "compared"):
  "jaxformer vs torch_ref"  the component in Flax NNX against its PyTorch twin, float32
  "X vs float64"            a float32 evaluation X (torch_ref, jaxformer, jaxformer jit)
                            against the float64 run
  "jit vs eager"            jaxformer under jax.jit against jaxformer run op by op

The "bound" column is absolute: with scale = max(1, max |reference output|),
  1e-5 x scale             every "jaxformer vs torch_ref" and every "vs float64" row
  max(1e-6 x scale, 2 x d) "jit vs eager", where d is the larger error against float64 of
                           torch_ref and eager jaxformer (so at --preset base the bound printed
                           is above 1e-6 x scale: two float32 evaluations that are each d from
                           the exact result may be 2 x d apart)
Exit status 1 if any row exceeds its bound, 0 otherwise.

  jaxformer parity                        # every family, tiny preset, a table
  jaxformer parity --family gpt --json    # one family, JSON
  jaxformer parity --preset base          # BERT-base, GPT-2 small, Transformer base
"""


def _parity(args) -> int:
    try:
        from jaxformer import parity
    except ImportError as error:  # torch missing: one line naming the extra, not a traceback
        raise errors.UsageError(str(error)) from None

    families = args.family or parity.available_families()
    unknown = sorted(set(families) - set(parity.available_families()))
    if unknown:
        raise errors.UsageError(f"--family {', '.join(unknown)}: unknown or unavailable family "
                                f"(available: {', '.join(parity.available_families())})")
    rows, seconds = parity.run(families, args.preset, args.seed)
    failed = [r for r in rows if not r.passed]
    if args.json:
        print(json.dumps({
            "preset": args.preset, "seed": args.seed, "seconds": round(seconds, 2),
            "passed": not failed,
            "rows": [{"family": r.family, "component": r.component, "compared": r.compared,
                      "max_abs_diff": r.max_abs_diff, "bound": r.bound, "pass": r.passed}
                     for r in rows]}, indent=2))
    else:
        width = max(len(r.component) for r in rows)
        pair = max(len(r.compared) for r in rows)
        print(f"{'family':<12} {'component':<{width}}  {'compared':<{pair}}  {'max abs diff':>12}"
              f"  {'bound':>9}  pass")
        print("-" * (width + pair + 48))
        for r in rows:
            print(f"{r.family:<12} {r.component:<{width}}  {r.compared:<{pair}}  "
                  f"{r.max_abs_diff:12.3e}  {r.bound:9.1e}  {'yes' if r.passed else 'NO'}")
        print(f"\n{len(rows) - len(failed)}/{len(rows)} rows within bounds "
              f"(preset {args.preset}, seed {args.seed}, {seconds:.1f} s)\nbound: 1e-5 x max(1, "
              f"max |reference|); jit vs eager: the larger of 1e-6 x that and twice the larger "
              f"float64 error\nof torch_ref and eager jaxformer (jaxformer parity --help)")
    return 1 if failed else 0


class _Parser(argparse.ArgumentParser):
    """The top-level parser, which also knows each subcommand's parser (for its usage)."""

    subcommands: dict[str, argparse.ArgumentParser]


def build_parser() -> _Parser:
    parser = _Parser(
        prog="jaxformer", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    parser.add_argument("--debug", action="store_true",
                        help="print the Python traceback of an error (also JAXFORMER_DEBUG=1)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # --debug after the subcommand too; SUPPRESS keeps the top-level value when it is not given
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="print the Python traceback of an error (also JAXFORMER_DEBUG=1)")

    parity = commands.add_parser(
        "parity", parents=[common],
        help="compare every family between Flax NNX and PyTorch",
        description=PARITY_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parity.add_argument("--preset", choices=("tiny", "base"), default="tiny",
                        help="model sizes: tiny (default, seconds) or base (BERT-base, GPT-2 "
                             "small, Transformer base; minutes on a CPU)")
    parity.add_argument("--family", action="append", metavar="NAME",
                        help="only this family (bert, transformer, gpt); repeatable")
    parity.add_argument("--seed", type=int, default=0, help="weights and inputs seed")
    parity.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parity.set_defaults(func=_parity)

    embed = commands.add_parser(
        "embed", parents=[common],
        help="sentence embeddings and their cosine similarities",
        description="Embed TEXTs with a bert or classifier run, or a Hugging Face "
                    "sentence-transformers BERT directory (mean pooling over real tokens unless "
                    "its modules.json says otherwise), and print their cosine-similarity matrix "
                    "or write them to --out FILE (.npy or .jsonl).")
    embed_module.add_arguments(embed)
    embed.set_defaults(func=embed_module.run)

    from jaxformer.training import command as train_command

    train = commands.add_parser(
        "train", parents=[common],
        help="train a model on a text file (JAX or the PyTorch twin)",
        description=train_command.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    train_command.add_arguments(train)
    train.set_defaults(func=train_command.run)

    from jaxformer import evaluate as eval_command

    evaluate = commands.add_parser(
        "eval", parents=[common],
        help="loss, perplexity and accuracies of a trained model on a text file",
        description=eval_command.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    eval_command.add_arguments(evaluate)
    evaluate.set_defaults(func=eval_command.run)

    from jaxformer.generation import cli as generate_command

    generate = commands.add_parser(
        "generate", parents=[common],
        help="generate text from a GPT or encoder-decoder run or a GPT-2 directory",
        description=generate_command.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    generate_command.add_arguments(generate)
    generate.set_defaults(func=generate_command.run)

    from jaxformer import classify as classify_command
    from jaxformer import fill_mask as fill_mask_command

    classify = commands.add_parser(
        "classify", parents=[common], help="label and probability per text, from a classifier run",
        description=classify_command.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    classify_command.add_arguments(classify)
    classify.set_defaults(func=classify_command.run)

    fill_mask = commands.add_parser(
        "fill-mask", parents=[common],
        help="the most likely tokens for each [MASK], from a BERT with an MLM head",
        description=fill_mask_command.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    fill_mask_command.add_arguments(fill_mask)
    fill_mask.set_defaults(func=fill_mask_command.run)

    from jaxformer.training import corpus as data_command

    data = commands.add_parser(
        "data", parents=[common],
        help="fetch a corpus and write train.txt / val.txt (split by document)",
        description=data_command.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    data_command.add_arguments(data)
    data.set_defaults(func=data_command.run)
    parser.subcommands = {"parity": parity, "embed": embed, "train": train, "eval": evaluate,
                          "generate": generate, "classify": classify, "fill-mask": fill_mask,
                          "data": data}
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    # parse_args would report an unknown argument with the top-level usage; the subcommand that
    # was given it is the one whose usage helps (argparse.error exits with status 2).
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        owner = parser.subcommands.get(args.command, parser)
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help()
        return 2
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for `train`'s resume command
    if args.command in ("train", "generate", "embed"):  # compiled programs kept between runs
        from jaxformer import runtime

        runtime.enable_compilation_cache()
    try:
        return args.func(args)
    except (errors.UserError, OSError, KeyboardInterrupt) as error:
        return errors.report(args.command, error, args.debug)


def version() -> str:
    """The installed distribution's version (importlib.metadata), or "unknown" when jaxformer
    runs from a source tree that was never installed."""
    from importlib import metadata

    try:
        return metadata.version("jaxformer")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


if __name__ == "__main__":
    sys.exit(main())
