"""``spml benchmark``: the paper's grid as a study folder."""
from __future__ import annotations

import sys

from .common import _data, _dataset, _describe_features, _feature_data, _floats, _ints
from .groups import add_backbone, add_data, add_output, add_pool, add_solver, add_training


def _decays(text: str) -> list:
    """``--weight-decays``: comma-separated finite numbers >= 0."""
    import argparse
    import math

    values = _floats(text)
    bad = [v for v in values if not math.isfinite(v) or v < 0]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated finite numbers >= 0, got "
                                         f"{text!r}")
    return values


#: the options each solver does not use (flag -> how to tell it was given)
_ADAM_FLAGS = {"--batch-sizes": lambda a: a.batch_sizes is not None,
               "--lrs": lambda a: a.lrs is not None,
               "--weight-decays": lambda a: a.weight_decays is not None,
               "--epochs": lambda a: a.epochs is not None,
               "--early-stop": lambda a: a.early_stop != "none",
               "--metric": lambda a: a.metric != "map",
               "--drop-last": lambda a: a.drop_last,
               "--no-vectorise": lambda a: a.no_vectorise,
               "--jobs": lambda a: a.jobs is not None}
_SOLVER_FLAGS = {"--cs": lambda a: a.cs is not None, "--pick": lambda a: a.pick is not None}


def _solver(args, options: dict) -> str:
    """The benchmark's solver: ``--solver``, else L-BFGS on your own data and Adam (the papers'
    protocol) on the built-in sets; the other solver's options refused by name."""
    from ..experiments.benchmark import own_data

    solver = args.solver or ("lbfgs" if own_data(args.dataset, options) else "adam")
    unused = _ADAM_FLAGS if solver == "lbfgs" else _SOLVER_FLAGS
    given = [flag for flag, test in unused.items() if test(args)]
    if given:
        why = ("the solver (--solver lbfgs) solves each loss along the C path (--cs) in one "
               "process; give --solver adam for the papers' mini-batch grid"
               if solver == "lbfgs" else
               "they are the solver's (--solver lbfgs); --solver adam trains the papers' grid")
        where = "your own data" if solver == "lbfgs" else "the built-in sets"
        default = "" if args.solver else f" (--solver {solver} is the default on {where})"
        raise ValueError(f"{', '.join(given)}: not used with --solver {solver}{default}: {why}")
    return solver


def cmd_benchmark(args) -> int:
    """``spml benchmark``: the paper's grid as a study in ``--out`` (resumable, one launch at a
    time), its table printed and written; with the solver, every loss solved along the C
    path."""
    from ..experiments.benchmark import DEFAULT_LOSSES, run_benchmark
    from ..experiments.study import DEFAULT_GRID

    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    if _solver(args, {**_data(args), **_feature_data(args)}) == "lbfgs":
        return _cmd_solver_benchmark(args)
    args.losses = ",".join(DEFAULT_LOSSES) if args.losses is None else args.losses
    grid = {"batch_size": tuple(args.batch_sizes or DEFAULT_GRID["batch_size"]),
            "lr": tuple(args.lrs or DEFAULT_GRID["lr"])}
    refs = [] if args.no_references else ["bce", "iun"]
    options = {**_data(args), **_feature_data(args)}
    args.dataset = _dataset(args)
    if args.weight_decays is not None:  # else run_benchmark's default for the data
        grid["weight_decay"] = tuple(args.weight_decays)
    given = {"epochs": args.epochs} if args.epochs is not None else {}  # else the paper's 25
    _columns(args.dataset, options)
    res = run_benchmark(args.dataset, args.losses, refs, args.seeds, args.out, args.jobs,
                        grid=grid, early_stop=args.early_stop, dataset_options=options,
                        metric=args.metric, regime=args.regime, drop_last=args.drop_last,
                        progress=not args.quiet, argv=sys.argv,
                        vectorise=not args.no_vectorise, sklearn=not args.no_references,
                        train_predictions=args.train_predictions, **given)
    print(res["table"] if res["results"] else "no grid point finished: nothing to tabulate")
    print(f"wrote {args.out}/results.json and {args.out}/table.md (a study folder: spml study "
          f"status | table | export {args.out}, spml report {args.out})")
    groups, missing = res["failure_groups"], res["missing"]
    if groups:
        failed = sum(g["count"] for g in groups)
        print(f"{failed} grid point(s) failed and were left out of the selection"
              + (", all for the same reason:" if len(groups) == 1 else ":"), file=sys.stderr)
        for g in groups[:3]:
            print(f"  {g['count']} run(s): {g['reason']} (first: {g['run_ids'][0]})",
                  file=sys.stderr)
        if len(groups) > 3:
            print(f"  {sum(g['count'] for g in groups[3:])} more run(s) with "
                  f"{len(groups) - 3} other error(s)", file=sys.stderr)
        print(f"full tracebacks: spml report {args.out} (grouped), or spml study export "
              f"{args.out} --format json --output errors.json", file=sys.stderr)
    if missing:
        shown = ", ".join(f"{label} (seed {seed})" for label, seed in missing[:6])
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        print(f"spml benchmark: error: no grid point finished for {shown}{more}: the table "
              f"lacks {'them' if len(missing) > 1 else 'it'}", file=sys.stderr)
        return 1
    return 0


def _columns(dataset: str, options: dict) -> None:
    """A table's feature columns, said before any run: its source read with the source's own
    options (a protocol option, ``subsample=F``, is the splits', not the source's: spml train
    takes it, and so does spml benchmark)."""
    if dataset != "tabular" or "path" not in options:
        return
    from ..data import PROTOCOL_OPTIONS
    from ..loading import load_dataset

    ds = load_dataset(dataset, **{k: v for k, v in options.items()
                                  if k not in PROTOCOL_OPTIONS})
    _describe_features(ds.meta, ds.standardize)


def _cmd_solver_benchmark(args) -> int:
    from ..engine.solve import C_PATH
    from ..experiments.solver_benchmark import DEFAULT_SOLVER_LOSSES, run_solver_benchmark

    options = {**_data(args), **_feature_data(args)}
    args.dataset = _dataset(args)
    _columns(args.dataset, options)
    losses = ",".join(DEFAULT_SOLVER_LOSSES) if args.losses is None else args.losses
    res = run_solver_benchmark(args.dataset, losses,
                               args.seeds, args.out, c=args.cs or C_PATH,
                               dataset_options=options, regime=args.regime,
                               pick=args.pick or "significant", sklearn=not args.no_references,
                               progress=not args.quiet, train_predictions=args.train_predictions,
                               argv=sys.argv)
    print(res["table"])
    print(f"wrote {args.out}/results.json, {args.out}/table.md and {args.out}/predictions/ "
          f"(val and test probabilities of each loss x seed at its selected C)")
    return 0


def register(sub) -> None:
    """Add the command's parser to ``sub`` (``spml``'s subparsers)."""
    from ..experiments.benchmark import DEFAULT_LOSSES
    from ..experiments.solver_benchmark import DEFAULT_SOLVER_LOSSES

    p = sub.add_parser("benchmark", help="the paper's grid for several methods and seeds",
                       description="The paper's grid (batch sizes x learning rates) for every "
                       "method and seed, selected on val, as a resumable study folder. Exit "
                       "status 1 when a method x seed has no finished grid point (its row "
                       "would be missing from the table); failed grid points are listed "
                       "grouped by their error either way.")
    data = p.add_argument_group("data", "which dataset, which labels, which features")
    grid = p.add_argument_group("methods and grid")
    training = p.add_argument_group("training")
    output = p.add_argument_group("output")
    add_data(data, regime="the regime of every method given without @regime")
    add_training(training)
    grid.add_argument("--losses", default=None,
                      help=f"comma-separated losses, loss@regime, or 'all' (default: "
                           f"{','.join(DEFAULT_LOSSES)}; with the solver "
                           f"{','.join(DEFAULT_SOLVER_LOSSES)})")
    add_solver(grid, lbfgs="each loss solved to a tolerance along the C path, warm-started, "
               "its C picked on val, the loss picked on val over AN (the tuned logistic "
               "regression)", adam="the papers' mini-batch grid (batch sizes x learning rates, "
               "epochs)")
    grid.add_argument("--pick", choices=("significant", "best"), default=None,
                      help="how the solver benchmark picks a row per seed: significant "
                           "(default) keeps the scikit-learn row (the tuned logistic "
                           "regression; AN with --no-references) unless the best loss's val "
                           "gain over it is significant (a paired bootstrap over the val rows, "
                           "5%% one-sided, shared among the candidates); best takes the best "
                           "val mAP as it is")
    grid.add_argument("--no-references", action="store_true",
                      help="leave out the reference rows: bce (full labels), iun and the "
                           "scikit-learn logistic regression (sklearn_lr; its full-label row and "
                           "bce / iun are left out anyway, with a note, on data whose training "
                           "labels are observed ones)")
    grid.add_argument("--seeds", type=int, default=3,
                      help="seeds per method (0, 1, ... N-1): each its own initialisation and "
                           "batch order (the observed labels are drawn once, the same for every "
                           "seed); a table cell is the mean +- sample standard deviation over "
                           "them (default: %(default)s, as Cole et al.)")
    grid.add_argument("--batch-sizes", type=_ints, default=None, help="grid, default 8,16")
    grid.add_argument("--lrs", type=_floats, default=None, help="grid, default 1e-2,1e-3,1e-4,1e-5")
    grid.add_argument("--weight-decays", type=_decays, default=None,
                      help="grid of the linear head's weight decay (Adam's coupled L2 on the "
                           "weights; runs of different decays stack like learning rates); "
                           "default: 0,1e-3,1e-2,1e-1 on your own data (--data "
                           "train_labels=observed, or the tabular / arrays / csv / folder "
                           "sources), none (the papers' grid) on the built-in sets")
    add_pool(training, jobs="worker processes of --solver adam")
    add_output(output, out="runs/benchmark",
               out_help="output folder, a study folder; re-running with the same folder runs "
                        "only the grid points it is missing")
    output.add_argument("--train-predictions", action="store_true",
                        help="also keep the train rows' probabilities (the solver: each loss "
                             "x seed's in predictions/; --solver adam: in every run's "
                             "predictions.npz, what spml analyze reads); default: val and test "
                             "only")
    add_backbone(data)
    p.set_defaults(func=cmd_benchmark)
