"""The ``spml`` command line: parses, resolves the configuration, calls the API.

One module per command (`train`, `predict`, `benchmark`, `extract`,
`figures` for analyze / figure / report, `study`, `listing`), each with its
``cmd_*`` function and a ``register(sub)`` that adds its parser; what they share is in
`common`. Importing this package imports no torch (the commands import it when they run).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from pathlib import Path

from . import benchmark, extract, figures, listing, predict, study, train
from .benchmark import cmd_benchmark
from .common import _fail, _os_message, _prog, use_defaults_formatter
from .study import STUDY_ACTIONS, cmd_study
from .train import cmd_train

__all__ = ["build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spml", description="Single-positive multi-label "
                                     "learning: train and compare the published methods.")
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"spml (spmlkit) {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (train, predict, benchmark, extract, figures, study, listing):
        command.register(sub)
    use_defaults_formatter(parser)  # each option's default, as the CLI reference shows it
    return parser


def _plain_warnings() -> None:
    """The library's warnings (a source's skipped images, a loss's settings) as one
    ``warning: ...`` line on stderr, not Python's ``file:line: UserWarning`` and source line."""
    import warnings

    default = warnings.formatwarning
    if getattr(default, "spmlkit_plain", False):
        return

    def plain(message, category, filename, lineno, line=None):
        if issubclass(category, UserWarning) and "spmlkit" in str(filename):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    plain.spmlkit_plain = True
    warnings.formatwarning = plain


def _threads(args) -> int | None:
    """``--threads``, or its default: spml train / benchmark 1 for the feature modes, None
    (torch's default, the machine's cores) for an image mode (``spml train --mode finetune``
    and the other methods that train on images, a resumed one too); other commands: None
    (extraction takes the cores itself, a study sets its workers')."""
    if getattr(args, "threads", None) or args.func not in (cmd_train, cmd_benchmark):
        return getattr(args, "threads", None)
    if args.func is cmd_train:
        try:
            if args.resume:
                from ..runs import read_run

                mode = read_run(args.resume).config.get("mode", "linear")
            else:
                mode = args.mode
            from ..methods import get_method

            if get_method(mode).inputs == "images":
                return None
        except (ValueError, OSError):  # the command itself reports it
            pass
    return 1


def run() -> int:
    """The ``spml`` program (its console script, ``python -m spmlkit``): `main`, with the
    cyclic garbage collector kept off the modules every command imports and off everything at
    the exit. The imports (torch and spmlkit's engine: some hundred thousand objects, none of
    them garbage) run with the collector off, then those objects are frozen out of it
    (``gc.freeze``) and it is turned back on: the full collections the imports triggered, and
    those that later imports and work would make over the same objects, took ~0.2 s of CPU.
    The command done, every object is frozen so that the interpreter's exit does not sweep
    them all for reference cycles (~0.5 s with torch and scikit-learn loaded); objects are
    still released as the modules are torn down, only garbage in cycles is left to the
    operating system. Called as a function, `main` leaves the caller's collector as it is."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        from .. import engine  # noqa: F401 (what build_parser imports for every command)
    except ImportError:  # (main says what is missing, as it would without this)
        pass
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
    code = main()
    gc.freeze()
    return code


def main(argv=None) -> int:
    """``spml``: parse ``argv``, run the command; a bad input ends in one line
    ``spml <command>: error: <what is wrong and where>`` on stderr and exit status 2."""
    import sqlite3

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["study"] and len(argv) > 1 and argv[1] not in STUDY_ACTIONS and \
            not argv[1].startswith("-"):
        argv.insert(1, "run")  # `spml study <preset or spec>` is `spml study run ...`
    args = build_parser().parse_args(argv)
    prog = _prog(args)
    if getattr(args, "config", None):  # spml train --config FILE: its options under the flags
        from .train import parse_with_config

        try:
            if args.resume:
                raise ValueError("--config gives the options of a new run; --resume continues "
                                 "a run with the settings in its config.json")
            args = parse_with_config(argv, args.config)
        except ValueError as err:
            return _fail(prog, str(err))
        except OSError as err:
            return _fail(prog, _os_message(err))
    if (args.func is cmd_benchmark or (args.func is cmd_study and args.action == "run")) and \
            getattr(args, "jobs", None) != 1 and not getattr(args, "dask", None) and \
            not getattr(args, "scheduler", None) and not getattr(args, "scheduler_file", None):
        from ..experiments.pool import start_worker_server

        start_worker_server()  # its imports run while this process imports and plans
    _plain_warnings()
    threads = _threads(args)
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        return args.func(args)
    except (ValueError, ModuleNotFoundError, FloatingPointError) as err:
        return _fail(prog, str(err))  # what is wrong and where, said by the code that found it
    except BrokenPipeError as err:
        if err.filename is not None:
            return _fail(prog, _os_message(err))
        # the reader of standard output left (spml study table ... | head): stop quietly, as
        # other commands do; what is left to flush goes nowhere
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for such a command
    except OSError as err:  # ours (FileNotFoundError naming the file and what was expected),
        return _fail(prog, _os_message(err))  # else a file the system refused: path, reason
    except RuntimeError as err:
        from ..experiments.pool import WorkerServerLost

        if not isinstance(err, WorkerServerLost):
            raise
        _fail(prog, f"{err}; finished runs are kept: the same command goes on where it stopped")
        return 1
    except sqlite3.Error as err:  # last resort: stores turn the known cases into ValueError
        return _fail(prog, f"the study's results store (SQLite) failed: {err}")
    except KeyboardInterrupt as err:
        from ..methods.driver import RunInterrupted

        if int(os.environ.get("RANK", "0") or 0) > 0:  # torchrun: process 0 says what to do
            return 130
        if isinstance(err, RunInterrupted) and args.func is cmd_train:  # a new folder each run
            from ..runs import CHECKPOINT_FILE

            if (Path(err.run_dir) / CHECKPOINT_FILE).is_file():
                print(f"interrupted; {err.run_dir} keeps the epochs of its last checkpoint: "
                      f"continue it with spml train --resume {err.run_dir}", file=sys.stderr)
            else:  # a linear run checkpoints after 10 s: stopped before its first
                print(f"interrupted before the run's first checkpoint: {err.run_dir} keeps no "
                      f"epoch to continue from; spml train --resume {err.run_dir} starts it "
                      f"again from epoch 1", file=sys.stderr)
        else:
            print("interrupted; finished work is kept (re-run the same command to resume)",
                  file=sys.stderr)
        return 130

