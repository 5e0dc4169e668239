"""``spml analyze``, ``spml figure`` and ``spml report``: tables, figures and pages of run
and study folders."""
from __future__ import annotations

from ..calibration import MAX_BINS
from .common import _ints, _whole, _wrote, STUDY_DIR_HELP
from .groups import add_output_file

#: the most images a panel / map figure shows (one row each)
MAX_IMAGES = 64


def _check_out(path, force: bool) -> None:
    """The output name by the writer rule, before anything is computed (a refused name is
    said at once, not after a landscape or a page)."""
    from ..safe_write import check_output

    if path is not None:
        check_output(path, force=force)


def cmd_analyze(args) -> int:
    from .. import analysis as an
    from ..experiments import figures as fg

    _check_out(args.out, args.force)
    if args.analysis == "pl-precision":
        results = [an.pseudo_label_precision(run) for run in args.runs]
        for r in results:
            print(f"{r.run} ({r.loss})\n{r.table()}\n")
        out = fg.plot_pl_precision(results, args.out, force=args.force)
    elif args.analysis == "ap-diff":
        res = an.classwise_ap_difference(args.run_a, args.run_b, args.split)
        print(res.table())
        out = fg.plot_ap_difference(res, args.out, force=args.force)
    elif args.analysis == "wasserstein":
        results = [an.run_wasserstein(run) for run in args.runs]
        print(an.wasserstein_table(results))
        out = fg.plot_wasserstein(results, args.out, force=args.force)
    else:
        res = an.unobserved_positive_histograms(args.run, args.epochs, args.bins)
        print(res.table())
        out = fg.plot_histograms(res, args.out, force=args.force)
    _wrote(out)
    return 0


def cmd_figure(args) -> int:
    from pathlib import Path

    from ..experiments import figures as fg

    from ..experiments.study import study_folder

    kind = args.figure
    base = study_folder(args.study) if kind == "sweep" else \
        Path(args.runs[0] if kind == "curves" else args.run)
    name = f"sweep-{args.axis}" if kind == "sweep" else kind
    if args.out is None:  # the folder's own figures folder: never through a planted link
        from ..safe_write import own_folder

        own_folder(base / fg.FIGURES_DIR, create=False)
    wanted = args.out or base / fg.FIGURES_DIR / f"{name}.png"
    force = args.force
    _check_out(wanted, force)
    if kind == "curves":
        labels = args.labels.split(",") if args.labels else None
        out = fg.plot_curves(fg.curves_from_runs(args.runs, labels), wanted, args.metric,
                             force=force)
    elif kind == "sweep":
        x = fg.default_x(args.axis) if args.x == "auto" else \
            {"train-labels": fg.TRAIN_LABELS, "k-value": fg.K_VALUE}.get(args.x)
        lines, title = fg.sweep_from_study(args.study, args.axis, args.metric, x)
        logx, xlabel = fg.x_layout(x)
        print(fg.sweep_table(lines, xlabel or args.axis, args.metric))
        out = fg.plot_sweep(lines, args.axis, wanted, args.metric, title, logx=logx,
                            xlabel=xlabel, force=force)
    elif kind == "histograms":
        h = fg.histograms_from_run(args.run, args.bins)
        print(h.table())
        out = fg.plot_probability_histograms(h, wanted, force=force)
    elif kind == "landscape":
        ls = fg.landscape_from_run(args.run, steps=args.steps, span=args.span, seed=args.seed,
                                   max_examples=args.max_examples)
        print(ls.summary())
        out = fg.plot_landscape(ls, wanted, force=force)
    elif kind == "calibration":
        cal = fg.calibration_from_run(args.run, args.bins, args.temperature)
        print(cal.table())
        out = fg.plot_calibration(cal, wanted, force=force)
    elif kind == "panel":
        out = fg.plot_panel(fg.panel_from_run(args.run, args.split, args.n, args.seed), wanted,
                            args.top, force=force)
    else:
        loader = fg.cam_from_run if kind == "cam" else fg.attention_from_run
        ov = loader(args.run, args.split, args.n, args.seed)
        if ov.note:
            print(ov.note)
        out = fg.plot_overlays(ov, wanted, args.top, force=force)
    _wrote(out)
    return 0


def cmd_report(args) -> int:

    from pathlib import Path

    from ..experiments.report import REPORT_FILE, write_report
    from ..experiments.study import study_folder

    folder = Path(args.study)
    if (folder / "config.json").is_file() and not (folder / "study.yaml").exists():
        raise ValueError(f"{folder} is a run folder (config.json), not a study folder: spml "
                         f"report writes the page of a study (spml study run). A run is read by "
                         f"spml figure curves | calibration | histograms RUN, spml analyze ... "
                         f"RUN and spml predict RUN; its numbers are in {folder / 'final.json'}")
    _check_out(args.out or study_folder(args.study) / REPORT_FILE, args.force)
    out = write_report(args.study, args.out, force=args.force)
    _wrote(out)
    if args.open:
        import webbrowser

        webbrowser.open(out.resolve().as_uri())
    return 0


def register(sub) -> None:
    """Add the command's parser to ``sub`` (``spml``'s subparsers)."""
    p = sub.add_parser("analyze", help="the papers' analyses of finished run folders: a table "
                       "and a PNG figure")
    asub = p.add_subparsers(dest="analysis", required=True)
    a = asub.add_parser("pl-precision", help="pseudo-label count and precision per epoch "
                        "(em_apl, ll_cp, soft_opml, opml_sp runs; Zhou et al. Table 2)")
    a.add_argument("runs", nargs="+", metavar="RUN", help="run folders")
    a = asub.add_parser("ap-diff", help="per-class AP of RUN_B minus RUN_A (Zhou et al. "
                        "Fig. 4c)")
    a.add_argument("run_a", metavar="RUN_A")
    a.add_argument("run_b", metavar="RUN_B")
    a.add_argument("--split", choices=["train", "val", "test"], default="test",
                   help="the split whose per-class AP is compared (default: test)")
    a = asub.add_parser("wasserstein", help="per-class Wasserstein-1 distance between unobserved "
                        "positives and negatives on the train split (Zhou et al. Fig. 4a)")
    a.add_argument("runs", nargs="+", metavar="RUN", help="run folders")
    a = asub.add_parser("histograms", help="histograms of the unobserved positives' predicted "
                        "probabilities at chosen epochs (Cole et al. Fig. 2; needs a run "
                        "trained with --save-train-probs)")
    a.add_argument("run", metavar="RUN")
    a.add_argument("--epochs", type=_ints, default=None,
                   help="comma-separated 1-based epochs, e.g. 1,5,25 (default: first, middle, "
                        "last)")
    a.add_argument("--bins", type=_whole(1, MAX_BINS), default=20,
                   help=f"histogram bins, 1 to {MAX_BINS} (default: 20)")
    for a in asub.choices.values():
        add_output_file(a, what="where to write the figure (.png or .svg)", required=True)
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("figure", help="the papers' figures of runs and studies (PNG, or SVG "
                       "with --out *.svg)")
    fsub = p.add_subparsers(dest="figure", required=True)
    f = fsub.add_parser("curves", help="val mAP and train loss per epoch of runs (OPML Fig. 4)")
    f.add_argument("runs", nargs="+", metavar="RUN", help="run folders")
    f.add_argument("--metric", default="val_map", help="epoch-record key (default val_map)")
    f.add_argument("--labels", default=None, help="comma-separated legend labels, one per run")
    f = fsub.add_parser("sweep", help="selected test mAP (mean ± std over seeds) against a "
                        "study's vary axis (LAC Figs. 3-5, Zhou Fig. 3a, Cole Fig. 1)")
    f.add_argument("study", metavar="STUDY_DIR", help=STUDY_DIR_HELP)
    f.add_argument("--axis", required=True,
                   help="vary key: hparams.<name>, data.<option>, k, regime, lac.<field> "
                        "(lac.queue_size: Xie et al. Fig. 5, lac.temperature: Fig. 4)")
    f.add_argument("--metric", default="test_map", help="results column (default test_map)")
    f.add_argument("--x", choices=("auto", "axis", "train-labels", "k-value"), default="auto",
                   help="the x axis: the axis value, each point's number of observed training "
                        "labels on a log axis (Cole et al. Fig. 1), or the value of k its runs "
                        "trained with (Fig. A1); auto (default): train-labels for --axis "
                        "data.subsample, k-value for --axis k, else the axis value")
    f = fsub.add_parser("histograms", help="train probabilities of observed positives, "
                        "unobserved positives and negatives (Cole Fig. 2, Zhou Fig. 4b)")
    f.add_argument("run", metavar="RUN")
    f.add_argument("--bins", type=_whole(1, MAX_BINS), default=20,
                   help=f"histogram bins, 1 to {MAX_BINS} (default: 20)")
    f = fsub.add_parser("landscape", help="training loss around the trained weights along two "
                        "filter-normalised random directions (Li et al. 2018; Zhou Fig. 5)")
    f.add_argument("run", metavar="RUN")
    f.add_argument("--steps", type=int, default=21,
                   help="grid points per axis, 2 to 1001 (steps^2 loss evaluations; default 21)")
    f.add_argument("--span", type=float, default=1.0, help="grid half-width")
    f.add_argument("--seed", type=int, default=0, help="seed of the directions")
    f.add_argument("--max-examples", type=int, default=None,
                   help="train rows used (default: all for linear runs, 256 for fine-tuned)")
    f = fsub.add_parser("calibration", help="reliability diagram and per-class expected "
                        "calibration error of a run's test probabilities (spmlkit.calibration)")
    f.add_argument("run", metavar="RUN")
    f.add_argument("--bins", type=_whole(1, MAX_BINS), default=15,
                   help=f"equal-width bins, 1 to {MAX_BINS} (default 15)")
    f.add_argument("--temperature", action="store_true",
                   help="also fit one temperature per class on the val split and show the "
                        "test calibration after it")
    for name, shown, what in (
            ("panel", 8, "images with their labels and top predictions (Zhou Fig. 6)"),
            ("cam", 4, "class activation maps of the top classes (OPML Fig. 7)"),
            ("attention", 4, "a LAC run's label-wise attention maps (LAC Fig. 6)")):
        f = fsub.add_parser(name, help=what)
        f.add_argument("run", metavar="RUN")
        f.add_argument("--n", type=_whole(1, MAX_IMAGES), default=shown,
                       help=f"images shown, 1 to {MAX_IMAGES} (default {shown})")
        f.add_argument("--split", choices=["train", "val", "test"], default="test",
                       help="the split the images are drawn from (default: test)")
        f.add_argument("--top", type=_whole(1), default=3,
                       help="predicted classes shown per image (default 3)")
        f.add_argument("--seed", type=int, default=0, help="seed of the image choice")
    for f in fsub.choices.values():
        add_output_file(f, what="a .png or .svg file (default: <RUN or STUDY_DIR>/figures/"
                                "<figure>.png)")
    p.set_defaults(func=cmd_figure)

    p = sub.add_parser("report", help="one self-contained HTML page of a study: tables, "
                       "figures, commands, versions, failures (opens offline)")
    p.add_argument("study", metavar="STUDY_DIR", help=STUDY_DIR_HELP)
    add_output_file(p, what="the HTML file (default <STUDY_DIR>/report.html)")
    p.add_argument("--open", action="store_true", help="open it in the default browser")
    p.set_defaults(func=cmd_report)
