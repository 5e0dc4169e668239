"""``spml predict``: label new inputs with a run folder's best model."""
from __future__ import annotations

import sys

from ..coverage import check_coverage, min_positives
from ..thresholds import RULES
from .groups import add_loading, add_output_file


def cmd_predict(args) -> int:
    from pathlib import Path

    from ..predict import folder_images, predict_run, write_predictions
    from ..safe_write import check_output

    # the inputs (an input folder's images too) and the run's own files are never an output,
    # --force or not; checked first
    protect = []
    if args.out:
        protect = [*args.inputs, *(f for raw in args.inputs if Path(raw).is_dir()
                                   for f in folder_images(raw)),
                   *(p for p in Path(args.run).glob("*") if p.is_file())]
        check_output(args.out, force=args.force, protect=protect)
    fmt = args.format or ("json" if args.out and Path(args.out).suffix.lower() == ".json"
                          else "csv")
    if args.threshold is not None and args.threshold_rule is not None:
        raise ValueError("give --threshold or --threshold-rule, not both")
    if args.coverage is not None:
        given = [f for f, v in (("--threshold", args.threshold),
                                ("--threshold-rule", args.threshold_rule),
                                ("--threshold-k", args.threshold_k)) if v is not None]
        if given:
            raise ValueError(f"--coverage sets each class's threshold from the run's val rows; "
                             f"it does not use {', '.join(given)}: give one or the other")
    pred = predict_run(args.run, args.inputs, args.threshold or "global", device=args.device,
                       batch_size=args.batch_size, num_workers=args.workers,
                       skip_corrupt=args.skip_corrupt, rule=args.threshold_rule,
                       rule_k=args.threshold_k, coverage=args.coverage)
    if pred.conformal is not None and len(pred.conformal.always):
        names = [pred.class_names[j] for j in pred.conformal.always]
        shown = ", ".join(map(str, names[:5])) + (", ..." if len(names) > 5 else "")
        print(f"{len(names)} class(es) have too few val positives for coverage "
              f"{pred.conformal.coverage:g} (fewer than {min_positives(pred.conformal.coverage)})"
              f" and are in every row's set: {shown}", file=sys.stderr)
    if pred.skipped:
        shown = ", ".join(pred.skipped[:5]) + (", ..." if len(pred.skipped) > 5 else "")
        print(f"skipped {len(pred.skipped)} unreadable image(s): {shown}", file=sys.stderr)
    text = write_predictions(pred, fmt, args.out, args.run, force=args.force, protect=protect)
    if args.out:
        print(f"wrote {args.out} ({len(pred.items)} rows, {fmt}, threshold {pred.threshold_kind})",
              file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _coverage(text: str) -> float:
    import argparse

    try:
        return check_coverage(float(text), "--coverage")
    except ValueError as err:
        msg = str(err) if "--coverage" in str(err) else \
            f"--coverage must be a number strictly between 0 and 1, e.g. 0.9; got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def register(sub) -> None:
    """Add the command's parser to ``sub`` (``spml``'s subparsers)."""
    p = sub.add_parser("predict", help="label new inputs with a run folder's best model and "
                       "the thresholds chosen on val")
    p.add_argument("run", metavar="RUN", help="a run folder (spml train)")
    p.add_argument("inputs", nargs="+", metavar="INPUTS",
                   help="linear runs: .npy/.npz feature files (runs of the tabular source: "
                        ".csv/.parquet tables too, feature columns by name); fine-tuned runs (and "
                        "linear runs on --backbone features): image files or folders, or a "
                        ".csv listing image paths (the csv source's form; its labels unread)")
    p.add_argument("--threshold", default=None,
                   help="global (maximises val micro-F1, default), per-class (each class's "
                        "val-F1 maximiser) or a probability, e.g. 0.5")
    p.add_argument("--threshold-rule", default=None, choices=list(RULES),
                   help="instead of --threshold: rcut (each row's top k), lcard (the global "
                        "threshold whose mean labels per row is closest to k), pcut (each "
                        "class to its prior's share of the rows), mcut (per row, above the "
                        "largest score gap); spmlkit.thresholds")
    p.add_argument("--threshold-k", type=float, default=None, metavar="K",
                   help="k of rcut / lcard (default: the run's k, its expected positives per "
                        "row)")
    p.add_argument("--coverage", type=_coverage, default=None, metavar="C",
                   help="instead of --threshold / --threshold-rule: per-class thresholds "
                        "calibrated on the run's val rows so that each class's label sets hold "
                        "a share C (in (0, 1), e.g. 0.9) of its true positives (split "
                        "conformal; the guarantee and its assumption: spmlkit.coverage)")
    p.add_argument("--format", choices=["csv", "json"], default=None,
                   help="default: json when --out ends with .json, else csv")
    add_output_file(p, what="default: standard output")
    add_loading(p, batch_size=64, workers=0, workers_default="0, the main process loads them",
                device="cpu")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="leave out input images that cannot be decoded (listed on stderr and "
                        "in JSON output) instead of stopping at the first one")
    p.set_defaults(func=cmd_predict)
