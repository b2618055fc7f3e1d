"""The ``jaxformer`` command: the parser and dispatch of ``parity``, ``embed``, ``train``,
``generate`` and ``data``; each subcommand's work lives in its package (``jaxformer.parity``,
``jaxformer.embed``, ``jaxformer.training``, ``jaxformer.generation``). ``DESCRIPTION`` is the
text of ``jaxformer --help``.
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxformer import embed as embed_module

DESCRIPTION = """The jaxformer command.

  jaxformer parity   builds every family in Flax NNX and in PyTorch with the same seeded weights
                     and prints, per component, the max abs difference and its bound.
  jaxformer embed    sentence embeddings from a Hugging Face BERT directory and their
                     cosine-similarity matrix.
  jaxformer train    trains a family on a text file, in JAX or with the PyTorch twin, with
                     metrics, a loss-curve PNG and checkpoints (see docs/training.md).
  jaxformer generate text from a Hugging Face GPT-2 directory with a KV cache: greedy, sampling
                     or beam search, streamed as it is produced (see docs/generation.md).
  jaxformer data     fetches a corpus (Shakespeare) and writes train.txt, val.txt split by
                     document and manifest.json (see docs/data.md).

Unknown arguments are reported with the usage of the subcommand they were given to.
"""


def _parity(args) -> int:
    try:
        from jaxformer import parity
    except ImportError as error:  # torch missing: one line naming the extra, not a traceback
        print(f"jaxformer parity: {error}", file=sys.stderr)
        return 2

    families = args.family or parity.available_families()
    unknown = sorted(set(families) - set(parity.available_families()))
    if unknown:
        print(f"jaxformer parity: unknown or unavailable family: {', '.join(unknown)} "
              f"(available: {', '.join(parity.available_families())})", file=sys.stderr)
        return 2
    rows, seconds = parity.run(families, args.preset, args.seed)
    failed = [r for r in rows if not r.passed]
    if args.json:
        print(json.dumps({
            "preset": args.preset, "seed": args.seed, "seconds": round(seconds, 2),
            "passed": not failed,
            "rows": [{"family": r.family, "component": r.component,
                      "max_abs_diff": r.max_abs_diff, "bound": r.bound, "pass": r.passed}
                     for r in rows]}, indent=2))
    else:
        width = max(len(r.component) for r in rows)
        print(f"{'family':<12} {'component':<{width}}  {'max abs diff':>12}  {'bound':>9}  pass")
        print("-" * (width + 46))
        for r in rows:
            print(f"{r.family:<12} {r.component:<{width}}  {r.max_abs_diff:12.3e}  "
                  f"{r.bound:9.1e}  {'yes' if r.passed else 'NO'}")
        print(f"\n{len(rows) - len(failed)}/{len(rows)} components within bounds "
              f"(preset {args.preset}, seed {args.seed}, {seconds:.1f} s)")
    return 1 if failed else 0


class _Parser(argparse.ArgumentParser):
    """The top-level parser, which also knows each subcommand's parser (for its usage)."""

    subcommands: dict[str, argparse.ArgumentParser]


def build_parser() -> _Parser:
    parser = _Parser(
        prog="jaxformer", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    parity = commands.add_parser(
        "parity", help="compare every family between Flax NNX and PyTorch",
        description="Build each model family in both frameworks from the same seeded random "
                    "weights and compare every component on padded inputs. Exits non-zero if any "
                    "component exceeds its bound (1e-5 x output scale; 1e-6 for jit vs eager).")
    parity.add_argument("--preset", choices=("tiny", "base"), default="tiny",
                        help="model sizes: tiny (default, seconds) or base (BERT-base, GPT-2 "
                             "small, Transformer base; minutes on a CPU)")
    parity.add_argument("--family", action="append", metavar="NAME",
                        help="only this family (bert, transformer, gpt); repeatable")
    parity.add_argument("--seed", type=int, default=0, help="weights and inputs seed")
    parity.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parity.set_defaults(func=_parity)

    embed = commands.add_parser(
        "embed", help="sentence embeddings and their cosine similarities",
        description="Embed TEXTs with a Hugging Face sentence-transformers BERT directory (mean "
                    "pooling over real tokens) and print their cosine-similarity matrix.")
    embed_module.add_arguments(embed)
    embed.set_defaults(func=embed_module.run)

    from jaxformer.training import command as train_command

    train = commands.add_parser(
        "train", help="train a model on a text file (JAX or the PyTorch twin)",
        description=train_command.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    train_command.add_arguments(train)
    train.set_defaults(func=train_command.run)

    from jaxformer.generation import cli as generate_command

    generate = commands.add_parser(
        "generate", help="generate text from a GPT-2 directory (JAX or the PyTorch twin)",
        description=generate_command.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    generate_command.add_arguments(generate)
    generate.set_defaults(func=generate_command.run)

    from jaxformer.training import corpus as data_command

    data = commands.add_parser(
        "data", help="fetch a corpus and write train.txt / val.txt (split by document)",
        description=data_command.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    data_command.add_arguments(data)
    data.set_defaults(func=data_command.run)
    parser.subcommands = {"parity": parity, "embed": embed, "train": train,
                          "generate": generate, "data": data}
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
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
