"""``spml study run | status | table | export | list``."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from .common import MAX_THREADS, LazyHelp, _whole, _positive, _wrote, _prog, _fail, \
    STUDY_DIR_HELP
from .groups import add_output, add_output_file, add_pool


def _study_table(out, fmt: str = "markdown", metric: str = "test_map",
                 columns: str = "dataset", select: str | None = None) -> str:
    """The table of a study folder. ``metric``: a results column or metrics key (shown as
    is, the grid point selected on the spec's metric), a name of
    `spmlkit.metrics.METRICS` (its test value, the grid point selected on its val value
    with its direction, unless ``select`` names another), or several such names separated by
    commas (one column each; selection on ``select``, default the spec's ``metric``)."""
    from ..experiments.reference import reference_rows
    from ..experiments.store import select_best
    from ..experiments.study import open_study
    from ..experiments.tables import metric_column, metrics_table, study_table
    from ..metrics import METRICS, check_metric, higher_is_better

    study = open_study(out)
    if not study.selected:
        raise ValueError(f"{out}: no finished run to tabulate yet (spml study status {out})")
    names = [m.strip() for m in metric.split(",") if m.strip()]
    order = [m.label for m in study.spec.methods]
    labels = study.spec.row_labels()  # a method trained in another mode: "an [smile]"
    if len(names) > 1 or (names and names[0] in METRICS):
        by = check_metric(select) if select else \
            (names[0] if len(names) == 1 else study.spec.metric)
        selected = select_best(study.rows, by)
        if not selected:
            raise ValueError(f"{out}: no finished run has a val {by} (runs from before the "
                             f"classic metrics were recorded lack them)")
        title = f"{study.title} (test; grid point selected on val {by}, best epoch on val " \
                f"{study.spec.metric})"
        if len(names) > 1:
            return metrics_table(selected, names, fmt, title=title, order=order,
                                 labels=labels)
        name = names[0]
        return study_table(selected, fmt, metric_column(name), columns=columns, title=title,
                           order=order, decimals=METRICS[name].decimals,
                           higher_is_better=higher_is_better(name), labels=labels)
    if select:
        raise ValueError("--select needs --metric to name metrics of spml list metrics "
                         f"({', '.join(METRICS)}), not {metric!r}")
    return study_table(study.selected + reference_rows(study.path, metric), fmt, metric,
                       columns=columns, title=study.title, order=order, labels=labels)


def _study_source(args) -> tuple:
    """``(spec, overrides)`` of ``spml study run``: the spec (or, without one, a study made of
    the flags alone) and the flags as overrides."""
    flags = {"datasets": args.datasets and args.datasets.split(","),
             "methods": args.methods and args.methods.split(","), "seeds": args.seeds,
             "name": args.name}
    flags = {k: v for k, v in flags.items() if v}
    if args.spec is not None:
        return args.spec, [*args.set, *(f"{k}={json.dumps(v)}" for k, v in flags.items())]
    if "datasets" not in flags or "methods" not in flags:
        raise ValueError("spml study run needs a spec (a YAML file, a study folder or a preset: "
                         "spml study list) or --datasets and --methods")
    return {"name": "study", **flags}, args.set


def _print_failures(res: dict, shown: int = 3) -> None:
    """On stderr: this launch's failed runs grouped by their error, the most common first
    (its last line, how many runs share it, the first such run), and where the tracebacks
    are."""
    groups = res.get("failure_groups") or []
    if not groups:
        return
    every = res["failures"] == res["runs_run"]
    print(f"{'every one' if every else res['failures']} of the {res['runs_run']} run(s) of "
          f"this launch failed" + (", all for the same reason:" if len(groups) == 1 else ":"),
          file=sys.stderr)
    for g in groups[:shown]:
        print(f"  {g['count']} run(s): {g['reason']} (first: {g['run_ids'][0]})",
              file=sys.stderr)
    if len(groups) > shown:
        rest = sum(g["count"] for g in groups[shown:])
        print(f"  {rest} more run(s) with {len(groups) - shown} other error(s)", file=sys.stderr)
    print(f"full tracebacks: spml report {res['out']} (grouped), or spml study export "
          f"{res['out']} --format json --output errors.json", file=sys.stderr)


def _kept(spec, args, where: str = "") -> str:
    """What a stopped launch kept and that the same command goes on, for its one line."""
    from ..experiments import study as st

    out = args.out or st.STUDIES_ROOT / spec.name
    with contextlib.suppress(Exception):
        s = st.study_status(out)
        return (f"; {s['done']} of {s['total']} runs are done and kept in {out}, the same "
                f"command {where}runs the {s['missing']} missing ones")
    return "; the same command goes on where it stopped"


def cmd_study(args) -> int:
    """``spml study run | status | table | export | list``."""
    from ..experiments import study as st

    if args.action == "list":
        presets = st.list_presets()
        width = max((len(n) for n, _ in presets), default=0)
        for name, title in presets:
            print(f"{name:<{width}}  {title}")
        return 0
    if args.action == "run":
        spec = st.load_study(*_study_source(args))
        if args.out is None and args.spec is not None and \
                (Path(args.spec) / st.SPEC_FILE).is_file():
            args.out = args.spec  # a study folder continues where it is (not runs/studies/NAME)
        try:
            res = st.run_study(spec, out=args.out, jobs=args.jobs, progress=not args.quiet,
                               mlflow=args.mlflow, argv=sys.argv,
                               retry_failed=args.retry_failed, retries=args.retries,
                               threads=args.threads, checkpoint_seconds=args.checkpoint_seconds,
                               dask=args.dask if args.scheduler is None else args.scheduler,
                               scheduler_file=args.scheduler_file,
                               vectorise=not args.no_vectorise,
                               connect_timeout=args.connect_timeout)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM (kill, timeout)
            out = args.out or st.STUDIES_ROOT / spec.name
            with contextlib.suppress(Exception):
                s = st.study_status(out)
                print(f"{spec.name}: stopped with {s['done']} of {s['total']} runs done; the "
                      f"same command runs the {s['missing']} missing ones", file=sys.stderr)
            raise
        except ConnectionError as err:
            from ..experiments.dask_executor import NoWorkers, SchedulerLost

            if not isinstance(err, (SchedulerLost, NoWorkers)):
                raise
            _fail(_prog(args), f"{err}{_kept(spec, args, 'against a running scheduler ')}")
            return 1
        except RuntimeError as err:
            from ..experiments.pool import WorkerServerLost

            if not isinstance(err, WorkerServerLost):
                raise
            _fail(_prog(args), f"{err}{_kept(spec, args)}")
            return 1
        print(f"{spec.name}: {res['runs_run']} run(s) in {res['seconds']:.1f} s on "
              f"{res['executor']}, {res['failures']} failed; "
              f"{res['runs_done_before']} of {res['runs_total']} were finished before")
        try:  # a study selected on another metric shows it (its test value)
            print(_study_table(res["out"], metric="test_map" if spec.metric == "map"
                               else spec.metric), end="")
        except ValueError as err:
            print(err)
        print(f"study folder: {res['out']}")
        _print_failures(res)
        failed = res["failures"]
        if not failed and not args.retry_failed:
            failed = st.study_status(res["out"])["failed"]
            if failed:  # counted in "finished before": say that they are not in the table
                print(f"{failed} run(s) of this spec failed in an earlier launch and are not in "
                      f"the table; --retry-failed runs them again (spml study status "
                      f"{res['out']}, spml report {res['out']}: their errors)", file=sys.stderr)
        return 1 if failed else 0
    if args.action == "status":
        s = st.study_status(args.dir)
        print(f"{s['name']} ({s['title']}): {s['total']} runs: {s['done']} done, "
              f"{s['failed']} failed, {s['missing']} missing"
              + (f"; {s['stale']} stored run(s) not in the current spec" if s["stale"] else ""))
        return 0
    if args.action == "table":
        print(_study_table(args.dir, args.format, args.metric, args.columns, args.select),
              end="")
        return 0
    study = st.open_study(args.dir)
    if not study.has_results:
        raise FileNotFoundError(f"{study.results_path} is missing: the study has not run yet")
    path = study.export(args.output, args.format, selected=args.selected,
                        include_stale=args.all, force=args.force)
    _wrote(path)
    if study.stale and not args.all:
        print(f"{len(study.stale)} stored run(s) of an earlier version of the spec left out "
              f"(--all includes them)")
    return 0


STUDY_ACTIONS = ("run", "status", "table", "export", "list")


def _table_metric_help() -> str:
    from ..metrics import METRICS

    return ("a results column or a key of the run's metrics (default test_map); or a metric "
            f"name ({', '.join(METRICS)}): its test value, the grid point selected on its val "
            "value (lower is better for the losses); or several names, comma-separated: one "
            "column each")


def register(sub) -> None:
    """Add the command's parser to ``sub`` (``spml``'s subparsers)."""
    p = sub.add_parser("study", help="run a study (a YAML spec or preset: datasets x methods x "
                       "seeds x vary x grid; parallel, resumable) and tabulate it; `spml study "
                       "PRESET` is `spml study run PRESET`")
    ssub = p.add_subparsers(dest="action", required=True)
    s = ssub.add_parser("run", help="run a study's missing runs (re-running resumes)",
                        description="Run a study's missing runs (re-running resumes) and print "
                        "its table. Exit status 1 when runs of the spec failed, in this launch "
                        "or an earlier one (they are not in the table).")
    spec = s.add_argument_group("the study", "which spec, and what on the command line "
                                "changes in it")
    runs = s.add_argument_group("runs", "which runs this launch runs, and how")
    workers = s.add_argument_group("workers", "where the runs go: the local pool (default) "
                                   "or a Dask cluster")
    output = s.add_argument_group("output")
    spec.add_argument("spec", metavar="SPEC_OR_PRESET", nargs="?", default=None,
                      help="a study YAML file, a study folder, or a preset (spml study list); "
                           "without it the study is --datasets x --methods x --seeds")
    spec.add_argument("--datasets", default=None, metavar="A,B",
                      help="registered datasets, comma-separated (overrides the spec's)")
    spec.add_argument("--methods", default=None, metavar="A,B",
                      help="method specs, comma-separated, e.g. an,role,bce@full,"
                           "an+highrank:1e-3 (overrides the spec's)")
    spec.add_argument("--seeds", type=_whole(1), default=None, help="seeds per grid point")
    spec.add_argument("--name", default=None, help="the study's name (folder runs/studies/NAME)")
    spec.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                      help="override spec keys, e.g. --set seeds=1 epochs=5 grid.lr=[1e-3]")
    runs.add_argument("--retry-failed", action="store_true", help="run failed runs again")
    runs.add_argument("--retries", type=_whole(0), default=1, metavar="N",
                      help="run a run whose worker process died (e.g. out of memory) N more "
                           "times (in the local pool: alone), resuming from its checkpoint, "
                           "before recording it as failed (default 1)")
    runs.add_argument("--checkpoint-seconds", type=float, default=None, metavar="S",
                      help="write a run's resumable checkpoint after an epoch once S seconds "
                           "passed since the last (default 10; 0: every epoch); runs trained "
                           "stacked (see --no-vectorise) keep none")
    add_pool(workers)
    workers.add_argument("--threads", type=_whole(1, MAX_THREADS), default=None,
                         help="torch threads per worker (default 1 in linear mode, else cores / "
                              "jobs; on a Dask cluster the worker machine's cores)")
    where = workers.add_mutually_exclusive_group()
    where.add_argument("--dask", choices=["local"], default=None,
                       help="run on a Dask LocalCluster of --jobs worker processes "
                            "(pip install -e \".[dask]\" in the clone)")
    where.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="run on the Dask cluster of this scheduler (tcp://host:8786); "
                            "the workers need spmlkit and the study folder at the same path")
    where.add_argument("--scheduler-file", default=None, metavar="PATH",
                       help="run on the Dask scheduler this JSON file names (dask scheduler "
                            "--scheduler-file PATH, dask-jobqueue)")
    workers.add_argument("--connect-timeout", type=_positive, default=None, metavar="S",
                         help="seconds the Dask scheduler (--scheduler, --scheduler-file) gets "
                              "to answer before the launch is refused, and the longest the "
                              "launch waits with no worker connected (default 30)")
    add_output(output, out_help="study folder (default runs/studies/<name>)")
    output.add_argument("--mlflow", action="store_true",
                        help="also log each run to MLflow (pip install mlflow)")
    s = ssub.add_parser("status", help="runs done / failed / missing of a study folder")
    s.add_argument("dir", metavar="DIR", help=STUDY_DIR_HELP)
    s = ssub.add_parser("table", help="the paper-style table of a study folder (mean ± std "
                        "over seeds of the best-val grid point; best bold, second underlined)")
    s.add_argument("dir", metavar="DIR", help=STUDY_DIR_HELP)
    s.add_argument("--format", choices=["md", "markdown", "latex", "csv", "html"], default="md",
                   help="md / markdown (default), latex, csv or html")
    s.add_argument("--metric", default="test_map", help=LazyHelp(_table_metric_help))
    s.add_argument("--select", default=None, metavar="METRIC",
                   help="with metric names: the val metric the grid point is selected on "
                        "(default: the one shown, or the study's metric for several)")
    s.add_argument("--columns", default="dataset",
                   help="what makes the columns: dataset (default) or a vary key")
    s = ssub.add_parser("export", help="the rows of the current spec's runs (or the selected "
                        "ones) to a file")
    s.add_argument("dir", metavar="DIR", help=STUDY_DIR_HELP)
    s.add_argument("--format", choices=["csv", "md", "markdown", "latex", "json"],
                   required=True, help="the file's format")
    add_output_file(s, what="the file written", required=True, flag="--output")
    which = s.add_mutually_exclusive_group()
    which.add_argument("--selected", action="store_true",
                       help="only the best-val run per (method, dataset, regime, seed, variant)")
    which.add_argument("--all", action="store_true",
                       help="also the stored rows of runs an earlier version of the spec had "
                            "(after a re-run with a changed spec)")
    ssub.add_parser("list", help="the shipped presets with their titles")
    p.set_defaults(func=cmd_study)
