"""What the ``spml`` commands share: argparse value types, the data and backbone options,
the one-line error."""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _pairs(items, what: str) -> dict:
    """``key=value`` options (``--data``, ``--hp``, ``--option``) as a dict; a value is read as
    JSON when it parses as JSON (``0.5``, ``true``, ``[1, 2]``), else kept as text."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} {item!r}: expected key=value, e.g. {what} "
                             f"{'root=/data/pascal' if what == '--data' else 'lam=2'}")
        out[key.strip().replace("-", "_")] = _value(value)
    return out


def _data(args) -> dict:
    """The ``--data`` options; the regime has its own flag (``--regime``)."""
    options = _pairs(args.data, "--data")
    if "regime" in options:
        raise ValueError(f"--data regime={options['regime']}: the label regime is not a "
                         f"dataset option; use --regime")
    return options


def _dataset(args) -> str:
    """``--dataset``: yeast when neither it nor ``--data`` is given; options for a source need
    the source named (else they would silently go to yeast, which takes none of them)."""
    from ..data import PROTOCOL_OPTIONS, check_source_options

    if args.dataset is not None:
        return args.dataset
    options = _pairs(args.data, "--data")
    try:
        check_source_options("yeast", options, PROTOCOL_OPTIONS, complete=False)
    except ValueError as err:  # e.g. labels=...: not yeast's, so meant for another source
        raise ValueError(f"{err} (no --dataset given, so the default yeast; --dataset names "
                         f"your source, e.g. --dataset tabular)") from None
    own = [item for item in args.data or []
           if item.partition("=")[0].strip().replace("-", "_") not in PROTOCOL_OPTIONS]
    if own:  # yeast's own path / seed: more likely your file (protocol options suit yeast)
        raise ValueError(f"--data {own[0]}: say which source the options are for with "
                         f"--dataset (e.g. --dataset tabular for a CSV / Parquet table, "
                         f"--dataset arrays for .npy files; spml list datasets); without "
                         f"--dataset the run is on the built-in yeast set")
    return "yeast"


def _describe_features(meta: dict, standardized: bool, out=None) -> None:
    """For a table source: which columns are the features, and whether they are standardised
    (a column that should not be a feature is seen before any run)."""
    cols = (meta or {}).get("feature_columns")
    if not cols:
        return
    from ..data.arrays import _preview

    how = "standardised with the train rows' mean and std (--data standardize=false keeps " \
          "them as they are)" if standardized else "not standardised (standardize=false)"
    print(f"features: {len(cols)} column(s) of {meta.get('path')}: {_preview(cols, 12)}; {how}",
          file=out or sys.stderr)


def _floats(text: str) -> list:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}") from None


def _ints(text: str) -> list:
    return [int(v) for v in _floats(text)]


def _whole(low: int, high: int | None = None):
    """An argparse type: a whole number >= ``low`` (and <= ``high``)."""
    want = f"a whole number >= {low}" + (f" and <= {high}" if high is not None else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {want}, got {value}")
        return value
    return parse


#: the most torch threads a process may ask for (--threads 1000 would fail in the OpenMP runtime
#: with its own message, or exhaust memory with thread stacks)
MAX_THREADS = max(64, 4 * (os.cpu_count() or 1))


def _real(above_zero: bool):
    """An argparse type: a finite number > 0 (``above_zero``) or >= 0."""
    want = "> 0" if above_zero else ">= 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {want}, got {text!r}") from None
        if not np.isfinite(value) or value < 0 or (above_zero and value == 0):
            raise argparse.ArgumentTypeError(f"expected a finite number {want}, got {text!r}")
        return value
    return parse


#: finite numbers > 0 (k, a Dask timeout): the options that set no record's field
_positive = _real(True)


def _device(text: str) -> str:
    """An argparse type: a torch device this machine has (``cpu``, ``cuda``, ``cuda:1``)."""
    from ..engine.config import check_device

    try:
        return check_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None



class LazyHelp(str):
    """A help text made from the registries by ``make()`` when it is shown (argparse formats
    help as ``help % params``; ``docs/gen.py`` does the same), not when the parser is built: the
    method, loss and backbone registries import torch, which parsing a command does not need."""

    def __new__(cls, make):
        self = super().__new__(cls, "(listed from the registry when shown)")
        self.make = make
        return self

    def __mod__(self, params):
        return self.make().replace("%", "%%") % params


def show_value(value) -> str:
    """A value as it reads in YAML / on the command line (``none``, ``true``, ``[a, b]``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def shown_default(action: argparse.Action, helptext: str) -> str | None:
    """The default an option's help shows, or None: an option that takes a value, has a
    default that is not empty (None, False, []) and whose help (``helptext``, expanded) does
    not already say its default. One rule for ``--help`` (`DefaultsFormatter`) and the CLI
    reference page (docs/gen.py)."""
    default = action.default
    if not action.option_strings or action.nargs == 0 or default is argparse.SUPPRESS or \
            default is None or default is False or default == [] or \
            "default" in helptext.lower():
        return None
    return show_value(default)


class DefaultsFormatter(argparse.HelpFormatter):
    """argparse's help with each option's default appended as ``(default: X)`` where
    `shown_default` gives one (the CLI reference page shows the same)."""

    def _expand_help(self, action):
        text = super()._expand_help(action)
        shown = shown_default(action, text)
        return f"{text} (default: {shown})" if shown is not None else text


def use_defaults_formatter(parser: argparse.ArgumentParser) -> None:
    """`DefaultsFormatter` for ``parser`` and every subcommand's parser below it."""
    parser.formatter_class = DefaultsFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                use_defaults_formatter(sub)


def _join(names, last: str = "") -> str:
    return ", ".join(names) + last


def _methods_help() -> str:
    from ..methods import list_methods

    methods = list_methods()
    many = " / ".join(m.name for m in methods if m.processes)
    return ("the training method (default linear): " + "; ".join(
        f"{m.name}: {m.description}" for m in methods) + f". {many} run under torchrun "
        "--nproc_per_node=N; a method's options are given with --option KEY=VALUE (spml list "
        "methods lists each method's options)")


def _losses_help() -> str:
    from ..losses import LOSSES

    return f"registered loss: {_join(LOSSES.names())} (spml list losses describes each)"


def _feature_data(args, data: dict | None = None) -> dict:
    """The dataset options of ``--backbone`` / ``--float16`` / ``--cache-dir``, merged with the
    extraction settings given as ``--data features={...}`` (those win)."""
    from ..loading import feature_options

    options = feature_options(getattr(args, "backbone", None), args.feature_dtype, args.cache_dir,
                              weights=getattr(args, "weights", None))
    given = (data or {}).get("features")
    if options and given is not None:
        if not isinstance(given, dict):
            raise ValueError(f"--data features={given!r}: with --backbone, expected a JSON "
                             f"object of extraction settings, e.g. --data "
                             f"'features={{\"num_workers\": 0}}'")
        options["features"] = {**options.get("features", {}), **given}
    return options


FORCE_HELP = "replace the output file if it exists (default: an existing file is an error; " \
             "a link, device, FIFO, folder or a run's or study's own file is never replaced)"


def _wrote(path) -> None:
    """``wrote PATH``."""
    print(f"wrote {path}")


#: the ``dest`` of each command's own subcommands (``spml study run``, ``spml figure curves``)
#: a study folder argument's help (`spmlkit.experiments.study.folder.study_folder`)
STUDY_DIR_HELP = ("a study folder, or the name a study ran under (runs/studies/<name>, where "
                  "spml study run puts it)")

SUBCOMMANDS = {"study": "action", "figure": "figure", "analyze": "analysis"}


def _prog(args) -> str:
    """``spml <command> [<subcommand>]``, as argparse names it in its own error lines."""
    sub = getattr(args, SUBCOMMANDS.get(args.command, ""), None)
    return f"spml {args.command}" + (f" {sub}" if sub else "")


def _os_message(err: OSError) -> str:
    """``<path>: <reason>`` of an operating-system error (a file that cannot be written or
    read), or its own text when it names no file."""
    if err.filename is None or not err.strerror:
        return str(err)
    paths = err.filename if err.filename2 is None else f"{err.filename} -> {err.filename2}"
    return f"{paths}: {err.strerror}"


def _fail(prog: str, message: str) -> int:
    """Print ``<prog>: error: <message>`` on one line; return exit status 2."""
    text = "; ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"{prog}: error: {text}", file=sys.stderr)
    return 2


def _acceleration(args):
    """The `spmlkit.accel.Acceleration` of the flags above."""
    from ..accel import Acceleration

    return Acceleration(cudnn_benchmark=bool(getattr(args, "cudnn_benchmark", False)),
                        compile=getattr(args, "compile", None),
                        gpu_decode=bool(getattr(args, "gpu_decode", False)),
                        jpeg_draft=bool(getattr(args, "jpeg_draft", False)))
