"""``jaxformer train --config FILE``: a run's flags in a TOML file, and the run's own
``config.toml`` (CLI glue, standard library only, no twin).

A key is a flag's name as typed, without the leading dashes (``seq-len = 64``, ``lr = 1e-3``,
``scan-layers = true``); the keys and their types come from the table the parser is built from
(``jaxformer.training.command.FLAGS``, handed to each function here as ``flags``: this module
imports neither the command nor the loop), so the file and the command line cannot drift
apart. A flag given on the
command line wins over the file. Unknown keys (``seq_len``, an alias such as ``eval-iters``, a
table) and values of the wrong type are :class:`jaxformer.errors.UsageError`\\ s naming the key,
the closest valid key or the type expected. Relative paths in the file are relative to the
working directory, as on the command line.

Every run writes its resolved configuration into the run directory (:data:`FILE_NAME`) with
:func:`dumps`, a writer of our own (the standard library reads TOML but does not write it):
every value of every flag that has one, floats in their shortest round-trip form, so that
``jaxformer train --config DIR/config.toml --checkpoint-dir NEW`` runs the same run again, bit
for bit. The flags of one invocation (:data:`NOT_WRITTEN`: ``--resume``, ``--resume-strict``,
``--overwrite``) are accepted in a file but never written.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import tomllib
from pathlib import Path
from typing import Any

from jaxformer.errors import UsageError

FILE_NAME = "config.toml"
# What one invocation does, not what the run is: accepted in a file, never written to one.
NOT_WRITTEN = ("resume", "resume-strict", "overwrite")

_TYPES = {bool: "a boolean (true or false)", int: "an integer", float: "a number",
          str: "a string"}


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of a config file: the flag it stands for and what its value must be."""

    name: str  # the flag without its dashes: "seq-len"
    flag: str  # "--seq-len"
    dest: str  # the attribute argparse stores it under: "seq_len"
    group: str  # "hyper": a TrainConfig field; otherwise a RunOptions field
    field: str  # that field's name
    type: type  # bool, int, float or str
    choices: tuple | None = None


Flags = list  # command.FLAGS: (group, flag names, field, argparse keywords) per flag


def _dest(names: tuple[str, ...]) -> str:
    """The attribute argparse stores a flag under (its first long name)."""
    return names[0].removeprefix("--").replace("-", "_")


def keys(flags: Flags) -> dict[str, Key]:
    """Every key a config file may hold, one per flag of ``flags`` (its first long name; its
    other names are not keys)."""
    table = {}
    for group, names, field, keywords in flags:
        action = keywords.get("action")
        kind = (bool if action in ("store_true", argparse.BooleanOptionalAction)
                else keywords.get("type", str))
        name = names[0].removeprefix("--")
        choices = keywords.get("choices")
        table[name] = Key(name, names[0], _dest(names), group, field, kind,
                          tuple(choices) if choices is not None else None)
    return table


def _check_value(path, key: Key, value: Any) -> Any:
    """``value`` as the flag's parser would have produced it, or a UsageError naming the key."""
    ok = {bool: lambda v: isinstance(v, bool),
          int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: lambda v: isinstance(v, str)}[key.type](value)
    if not ok:
        shown = "a table" if isinstance(value, dict) else repr(value)
        raise UsageError(f"--config {path}: key '{key.name}' must be {_TYPES[key.type]} "
                         f"(as {key.flag} takes), got {shown}")
    if key.type is float:
        value = float(value)
    if key.choices is not None and value not in key.choices:
        raise UsageError(f"--config {path}: key '{key.name}' must be one of "
                         f"{', '.join(map(str, key.choices))}, got {value!r}")
    return value


def _unknown(path, name: str, flags: Flags) -> UsageError:
    table = keys(flags)
    alias = next((names[0].removeprefix("--") for _, names, _, _ in flags
                  if f"--{name}" in names[1:]), None)
    close = [alias] if alias else difflib.get_close_matches(name, list(table), n=1, cutoff=0.6)
    hint = (f"did you mean '{close[0]}'? " if close else "") + \
        "Keys are the flags' names without the leading dashes, as jaxformer train --help lists"
    return UsageError(f"--config {path}: unknown key '{name}' ({hint})")


def load(path, flags: Flags) -> dict[str, Any]:
    """The checked ``{key: value}`` of the TOML file ``path``."""
    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"--config {path}: is a directory, not a TOML file") from None
    except OSError as error:
        raise UsageError(f"--config {path}: cannot be read ({error.strerror})") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"--config {path}: not valid TOML ({error})") from None
    except UnicodeDecodeError as error:
        raise UsageError(f"--config {path}: not UTF-8 text ({error})") from None
    table = keys(flags)
    values = {}
    for name, value in raw.items():
        if name not in table:
            raise _unknown(path, name, flags)
        values[name] = _check_value(path, table[name], value)
    return values


def _given(argv: list[str], flags: Flags) -> set[str]:
    """The dests of the train flags that ``argv`` (the arguments after ``train``) gives: the
    same flags parsed with every default suppressed, so only what was typed appears."""
    probe = argparse.ArgumentParser(add_help=False)
    for _, names, _, keywords in flags:
        keywords = {k: v for k, v in keywords.items()
                    if k not in ("default", "required", "choices", "help", "type")}
        probe.add_argument(*names, dest=_dest(names), default=argparse.SUPPRESS, **keywords)
    given, _ = probe.parse_known_args(argv)
    return set(vars(given))


def apply(args: argparse.Namespace, flags: Flags) -> None:
    """Fill ``args`` from ``args.config`` (the flags typed win) and check that the flags the run
    needs (``--family``, ``--data``) were given on the command line or in the file."""
    if getattr(args, "config", None):
        argv = list(getattr(args, "argv", None) or [])
        argv = argv[argv.index("train") + 1:] if "train" in argv else argv
        given = _given(argv, flags)
        table = keys(flags)
        for name, value in load(args.config, flags).items():
            if table[name].dest not in given:
                setattr(args, table[name].dest, value)
    missing = [names[0] for _, names, _, keywords in flags
               if keywords.get("required") and getattr(args, _dest(names)) is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (on the "
                         f"command line or in --config FILE)")


def resolved(config, options, flags: Flags) -> dict[str, Any]:
    """The run as config-file keys: every flag's value in the resolved ``TrainConfig`` and
    ``RunOptions`` (the task's schedule and label smoothing, the warm-up derived from the steps,
    the run directory), except flags without a value (None: the default stays the default)
    and :data:`NOT_WRITTEN`."""
    from jaxformer.training import rundir

    values = {}
    for name, key in keys(flags).items():
        if name in NOT_WRITTEN:
            continue
        value = getattr(config if key.group == "hyper" else options, key.field)
        if name == "checkpoint-dir":
            value = str(rundir.run_directory(value, options.family, options.preset_label))
        if value is not None:
            values[name] = value
    return values


def _string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # the shortest text that reads back as the same double
    if isinstance(value, str):
        return _string(value)
    raise TypeError(f"no TOML form for {type(value).__name__} {value!r}")


def dumps(values: dict[str, Any], header: str = "") -> str:
    """``values`` as TOML, one ``key = value`` line each (bare keys: letters, digits, dashes),
    ``header`` above as comment lines."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{name} = {_value(value)}" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def write(run_dir: Path, config, options, flags: Flags) -> Path:
    """The run's resolved configuration as ``run_dir/config.toml`` (atomically)."""
    from jaxformer.training import rundir

    path = Path(run_dir) / FILE_NAME
    header = ("The resolved configuration of this run (written by jaxformer train). Run it again "
              "with\n  jaxformer train --config THIS_FILE --checkpoint-dir NEW_DIR\nor continue "
              "it with --config THIS_FILE --resume. Keys are the flags' names without dashes.")
    rundir.write_atomic(path, dumps(resolved(config, options, flags), header))
    return path
