"""The paper's comparison: every method x seed over the hyperparameter grid, selected on val mAP.

A *method* is a loss name, optionally with regularisers and a regime: ``an`` trains on the
single-positive regime (``1p``), ``bce@full`` on full labels, ``an+highrank:1e-3`` adds the
high-rank regulariser to AN. Two reference rows are added by default, as in Cole et al.
Table 1: ``bce`` (``bce@full``, all labels) and ``iun`` (``bce@1p_alln``, one positive and every
negative).

`run_benchmark` is a front of the study runner (`spmlkit.experiments.study`): it
turns its arguments into a study spec (one dataset, the methods, ``range(seeds)``, the grid,
linear mode) and runs it in ``DIR``, which is then a study folder: ``study.yaml``,
``results.sqlite`` (one row per grid point, written as each finishes), ``runs/<run_id>/`` and
``launches.jsonl``. The study gives the resume (a re-launch runs only the missing grid points;
the run ids hash the whole resolved configuration, so other data, epochs or hyperparameters are
other runs, never stale ones), the lock (one launch per folder at a time) and the selection (per
method and seed the grid point with the best val mAP, among the current spec's runs). At the end
``DIR/results.json`` (one record per method x seed) and ``DIR/table.md`` are written atomically;
``spml study table / report / export DIR`` work on the folder too.
"""
from __future__ import annotations

import numbers
import re
import sys
from pathlib import Path

import numpy as np

from ..safe_write import write_json, write_text
from .study import DEFAULT_GRID, MAX_RUNS, REFERENCES, parse_methods

DEFAULT_LOSSES = ("an", "an_ls", "wan", "epr", "role", "pr")
#: the resume file of the benchmarks before they ran as studies (no longer read)
OLD_RESUME_FILE = "grid.jsonl"


def observed_labels(dataset_options: dict | None) -> bool:
    """Whether the data's training labels are the user's observed ones (the option
    ``train_labels=observed`` of the sources that take your own data): then they have no full
    training labels, and every method trains with regime ``given``."""
    return (dataset_options or {}).get("train_labels") == "observed"


#: the weight-decay grid ``spml benchmark`` searches on your own data (the built-in sets keep
#: the papers' grid: batch size x learning rate); measured on yeast and the README's toy CSV:
#: results/weight-decay-grid.csv
OWN_DATA_WEIGHT_DECAYS = (0.0, 1e-3, 1e-2, 1e-1)
#: the sources of your own data
OWN_SOURCES = ("tabular", "arrays", "csv", "folder")


def own_data(dataset: str, dataset_options: dict | None) -> bool:
    """Whether the data is the user's own: observed training labels (``train_labels=observed``)
    or one of `OWN_SOURCES`."""
    return observed_labels(dataset_options) or dataset in OWN_SOURCES


def kept_references(references, dataset_options: dict | None) -> tuple[list, list]:
    """``(kept, skipped)``: the reference rows that can run on the data, and those that cannot
    (every reference row trains on full labels, regime ``full`` or ``1p_alln``, which data
    with observed training labels does not have)."""
    references = list(references or ())
    if observed_labels(dataset_options):
        return [], references
    return references, []


def benchmark_study(dataset: str = "yeast", losses=DEFAULT_LOSSES, references=("bce", "iun"),
                    seeds: int = 3, epochs: int = 25, grid: dict | None = None,
                    early_stop: str = "none", hparams: dict | None = None,
                    dataset_options: dict | None = None, metric: str = "map",
                    regime: str | None = None, drop_last: bool = False,
                    train_predictions: bool = False) -> dict:
    """The study spec (a dict for
    [`spmlkit.experiments.study.load_study`][spmlkit.experiments.study.load_study]) of a benchmark:
    the arguments mean what they mean in `run_benchmark`.

    >>> spec = benchmark_study("yeast", "an,epr@1p_1n", seeds=2, epochs=5)
    >>> spec["methods"], spec["seeds"], spec["grid"]["batch_size"]
    (['an', 'epr@1p_1n', 'bce', 'iun'], [0, 1], [8, 16])
    >>> benchmark_study("tabular", "an,role", dataset_options={"train_labels": "observed"}
    ...                 )["methods"]
    ['an@given', 'role@given']

    Raises:
        ValueError: seeds below 1; on data with observed training labels a method with another
            regime than ``given``; regime ``given`` on data without them.
    """
    if not isinstance(seeds, numbers.Integral) or seeds < 1:
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    if seeds > MAX_RUNS:  # before the list of seeds is made
        raise ValueError(f"seeds: {seeds} seeds: a study has at most {MAX_RUNS} runs")
    observed = observed_labels(dataset_options)
    regime = regime or ("given" if observed else "1p")
    methods = parse_methods(losses, kept_references(references, dataset_options)[0], regime)
    if observed:
        drawn = [m.label for m in methods if m.regime != "given"]
        if drawn:
            raise ValueError(f"method(s) {', '.join(drawn)}: the training labels of "
                             f"{dataset!r} are your observed ones (train_labels=observed), so "
                             f"regimes that draw from full labels cannot run; train them with "
                             f"regime given (loss@given, or no @regime)")
    else:
        given = [m.label for m in methods if m.regime == "given"]
        if given:
            raise ValueError(f"method(s) {', '.join(given)}: regime given trains on the "
                             f"observed training labels of your own data; say that the "
                             f"data's labels are those with --data train_labels=observed "
                             f"(1 / 0 / -1 or empty cells in the training rows)")
    extra = {} if metric == "map" else {"metric": metric}
    # (drop_last absent when off: the run ids stay those of every earlier benchmark;
    # train_predictions changes no number and no run id)
    extra["train"] = {**({"drop_last": True} if drop_last else {}),
                      **({} if train_predictions else {"train_predictions": False})}
    return {**extra, "name": "benchmark-" + re.sub(r"[^A-Za-z0-9._-]+", "_", dataset),
            "title": f"spml benchmark on {dataset}",
            "datasets": [{"name": dataset, "options": dict(dataset_options or {})}],
            "methods": [m.label for m in methods], "mode": "linear",
            "seeds": list(range(seeds)), "epochs": epochs, "early_stop": early_stop,
            "grid": {**DEFAULT_GRID, **(grid or {})}, "hparams": dict(hparams or {})}


def run_benchmark(dataset: str = "yeast", losses=DEFAULT_LOSSES, references=("bce", "iun"),
                  seeds: int = 3, out="runs/benchmark", jobs: int | None = None,
                  epochs: int = 25, grid: dict | None = None, early_stop: str = "none",
                  hparams: dict | None = None, dataset_options: dict | None = None,
                  progress: bool = True, *, argv=None, vectorise: bool = True,
                  metric: str = "map", regime: str | None = None,
                  drop_last: bool = False, sklearn: bool = True,
                  train_predictions: bool = False) -> dict:
    """Run the grid for every method and seed as a study in ``out``; write results.json and
    table.md there.

    Args:
        dataset, dataset_options: the data (``spmlkit.loading.load_splits``).
        losses: method specs, a list or comma-separated (see `parse_methods`).
        references: reference rows added unless listed already (``bce``, ``iun``); left out,
            with a note on stderr, when the data's training labels are observed ones
            (``dataset_options["train_labels"] == "observed"``): they need full labels.
        regime: the regime of the methods given without ``@regime``; default ``given`` when
            the data's training labels are observed ones (``train_labels=observed``), else
            ``1p``.
        seeds: seeds ``0 .. seeds-1`` (at least 1).
        out: the study folder; a re-launch with the same arguments resumes, one with other
            arguments runs what they need (the other runs' rows stay in the store, unused).
        jobs: worker processes (default: the CPU count).
        epochs, early_stop: per run (`spmlkit.engine.TrainConfig`).
        grid: ``{"batch_size": [...], "lr": [...]}`` laid over `DEFAULT_GRID`, and
            optionally ``"weight_decay": [...]`` (``spml benchmark --weight-decays``); without
            it, `OWN_DATA_WEIGHT_DECAYS` on your own data (`own_data`), none on the papers' sets.
        hparams: per-loss (or per method label) hyperparameter overrides,
            ``{"epr": {"lam": 2.0}}``.
        progress: the study's progress bar.
        metric: the val metric the best epoch and grid point are selected on
            (`spmlkit.metrics.METRICS`; lower is better for the losses); the table adds
            its test and val columns when it is not ``map``.
        drop_last: train without each epoch's last, shorter batch (``TrainConfig.drop_last``,
            Cole et al.'s loader); validation and test still score every row.
        train_predictions: each run's ``predictions.npz`` also holds the train rows'
            probabilities (``TrainConfig.train_predictions``; default False: val and test
            only, so that a grid on many rows does not write every run's train probabilities).
        argv: the command line recorded in ``launches.jsonl``.
        vectorise: train the grid points that differ only in seed, learning rate and weight
            decay together (`spmlkit.experiments.study.run_study`); False: one run at a
            time.
        sklearn: add the scikit-learn reference rows (`spmlkit.experiments.reference`:
            one-vs-rest logistic regression on the observed labels, unknown = negative, C
            chosen on val; and on full labels where the data has them), written to
            ``DIR/sklearn-reference.json`` and in the table, marked as references.

    Returns:
        ``{"results": [...], "table": str, "seconds": float, "study": dict,
        "failure_groups": [...], "missing": [...]}``: one result per method x seed (the
        selected grid point), the Markdown table, the wall time of this launch's runs, what
        [`spmlkit.experiments.study.run_study`][spmlkit.experiments.study.run_study] returned, the
        failed grid points grouped by their error (`spmlkit.experiments.study.failure_groups`; this
        launch's and earlier ones') and the ``(method, seed)`` pairs with no finished grid point
        (absent from the table).

    Raises:
        ValueError: an invalid argument (the study spec's message), or another launch is
            running ``out``.
    """
    from ..data.folder import default_train_labels
    from .study import SPEC_FILE, load_study, run_study

    if dataset == "folder" and "train_labels" not in (dataset_options or {}) and \
            default_train_labels((dataset_options or {}).get("test_csv")) == "observed":
        # the source's own default, said out loud: the regimes and references follow it
        dataset_options = {**(dataset_options or {}), "train_labels": "observed"}
    grid = dict(grid or {})
    if "weight_decay" not in grid and own_data(dataset, dataset_options):
        grid["weight_decay"] = OWN_DATA_WEIGHT_DECAYS
    if tuple(grid.get("weight_decay", ())) in ((0,), (0.0,)):  # none: the runs, ids and table
        del grid["weight_decay"]                                # as without weight decay
    try:
        spec = load_study(benchmark_study(dataset, losses, references, seeds, epochs, grid,
                                          early_stop, hparams, dataset_options, metric, regime,
                                          drop_last, train_predictions))
    except ValueError as err:  # the spec's keys, said as the options that made them
        raise ValueError(_as_options(str(err))) from None
    skipped = [r for r in kept_references(references, dataset_options)[1]
               if r not in [m.label for m in spec.methods]]
    if skipped:
        print(f"note: reference row(s) {', '.join(skipped)} left out: they train on full "
              f"labels, and the training labels of this data are the observed ones "
              f"(train_labels=observed)", file=sys.stderr)
    out = Path(out)
    if (out / OLD_RESUME_FILE).is_file() and not (out / SPEC_FILE).is_file():
        print(f"note: {out} holds a benchmark from an older spmlkit ({out / OLD_RESUME_FILE}); "
              f"its results are not reused: this launch runs every grid point again and makes "
              f"{out} a study folder ({SPEC_FILE}, results.sqlite, runs/)", file=sys.stderr)
    res = run_study(spec, out=out, jobs=jobs, progress=progress, argv=argv, vectorise=vectorise)
    selected = _selected_records(out)
    have = {(r["loss"], r["seed"]) for r in selected}
    missing = [(m.label, s) for m in spec.methods for s in spec.seeds if (m.label, s) not in have]
    refs = []
    if sklearn:
        from .reference import SKLEARN_FILE, reference_records

        regimes = [regime or ("given" if observed_labels(dataset_options) else "1p")]
        refs = reference_records(dataset, dict(dataset_options or {}),
                                 regimes + ([] if observed_labels(dataset_options) else ["full"]),
                                 spec.seeds)
        write_json(out / SKLEARN_FILE, refs)
    table = format_table(selected, spec.methods, dataset, seeds, spec.grid, spec.epochs,
                         res["seconds"], metric, bool(spec.train.get("drop_last")), refs)
    write_json(out / "results.json", selected)
    write_text(out / "table.md", table)
    return {"results": selected, "table": table, "seconds": res["seconds"], "study": res,
            "sklearn": refs,
            "failure_groups": _failure_groups(out, spec), "missing": missing}


#: the spml benchmark option behind each key of the study spec it builds
_SPEC_OPTIONS = {"methods": "--losses (with the reference rows)", "seeds": "--seeds",
                 "epochs": "--epochs", "grid.lr": "--lrs", "grid.batch_size": "--batch-sizes",
                 "grid.weight_decay": "--weight-decays", "early_stop": "--early-stop",
                 "metric": "--metric", "hparams": "--hp", "datasets": "--dataset"}


def _as_options(message: str) -> str:
    """A study spec's error (``<dict>: grid.lr: ...``) as one about benchmark's options."""
    prefix = "<dict>: "
    if not message.startswith(prefix):
        return message
    rest = message[len(prefix):]
    key = rest.split(":", 1)[0]
    option = _SPEC_OPTIONS.get(key)
    return f"{option}: {rest[len(key) + 1:].lstrip()}" if option else \
        f"the benchmark's study spec: {rest}"


def _failure_groups(out: Path, spec) -> list[dict]:
    """The failed runs of the current spec (this launch's and earlier ones'), grouped by their
    error (`spmlkit.experiments.study.failure_groups`)."""
    from .store import StudyStore
    from .study import RESULTS_FILE, expand, failure_groups

    ids = {t.run_id for t in expand(spec)}
    return failure_groups(r for r in StudyStore(out / RESULTS_FILE).rows(status="failed")
                          if r["run_id"] in ids)


def _selected_records(out: Path) -> list[dict]:
    """The study's selected run per method x seed (`spmlkit.experiments.study.study_rows`)
    as results.json records, in the spec's method order."""
    from .store import StudyStore
    from .study import RESULTS_FILE, expand, study_rows

    spec, rows = study_rows(out)
    ids = {t.run_id for t in expand(spec)}
    spent: dict = {}  # seconds of every grid point of a (method, seed), failed ones included
    for r in StudyStore(out / RESULTS_FILE).rows():
        if r["run_id"] in ids:
            key = (r["method"], r["seed"])
            spent[key] = spent.get(key, 0.0) + float(r["seconds"] or 0.0)
    order = {m.label: i for i, m in enumerate(spec.methods)}
    rows = sorted(rows, key=lambda r: (order.get(r["method"], len(order)), r["seed"]))
    return [{"loss": r["method"], "regime": r["regime"], "seed": r["seed"],
             "batch_size": r["batch_size"], "lr": r["lr"], "best_epoch": r["best_epoch"],
             "val_map": r["val_map"], "test_map": r["test_map"],
             "train_recovery_map": r["train_recovery_map"], "seconds": r["seconds"],
             **_weight_decay(r), **_classic(r),
             "grid_seconds": spent[(r["method"], r["seed"])], "run_id": r["run_id"],
             "run_dir": r["run_dir"]} for r in rows]


def _weight_decay(row: dict) -> dict:
    """``{"weight_decay": wd}`` of a store row whose run trained with weight decay (else {})."""
    import json

    try:
        wd = json.loads(row.get("config") or "{}").get("train", {}).get("weight_decay")
    except (TypeError, json.JSONDecodeError, AttributeError):
        return {}
    return {"weight_decay": wd} if wd else {}


def _classic(row: dict) -> dict:
    """``val_metrics`` / ``test_metrics`` of a store row's metrics JSON (when it has them)."""
    import json

    try:
        found = json.loads(row.get("metrics") or "{}")
    except (TypeError, json.JSONDecodeError):
        return {}
    return {k: found[k] for k in ("metric", "val_metrics", "test_metrics") if k in found}


def _mean_std(values, decimals: int = 2) -> str:
    v = np.asarray(values, dtype=float)
    if v.size and np.isnan(v).all():  # train recovery of partial training labels: unknown
        return "n/a"
    return f"{v.mean():.{decimals}f} ± {v.std(ddof=1):.{decimals}f}" if v.size > 1 else \
        f"{v.mean():.{decimals}f}"


def _c_grid():
    from .reference import C_GRID

    return C_GRID


def _pick(r: dict, decays: bool) -> str:
    """A record's selected grid point: ``(batch, lr)``, ``(batch, lr, wd)`` with a weight-decay
    grid, ``C=...`` for a scikit-learn row."""
    if "C" in r:
        return f"C={r['C']:g}"
    point = f"{r['batch_size']}, {r['lr']:g}"
    return f"({point}, {r.get('weight_decay', 0.0):g})" if decays else f"({point})"


def format_table(selected, methods, dataset, seeds, grid, epochs, seconds,
                 metric: str = "map", drop_last: bool = False, sklearn=()) -> str:
    """Markdown: test mAP mean ± std per method, then the reference rows; with another
    selection ``metric`` also its test and val values (from the records' ``test_metrics`` /
    ``val_metrics``).

    ``selected`` are `run_benchmark`'s records (the study's selected run per method x
    seed); ``methods`` have a ``label`` and a ``regime`` (`Method` or the study's
    ``MethodSpec``); ``seconds`` is the launch's wall time; ``sklearn``: the scikit-learn
    reference rows' records (`spmlkit.experiments.reference.reference_records`), after
    the other reference rows. Drawn with the study tables' renderer
    (`spmlkit.experiments.tables.markdown_grid`)."""
    from ..metrics import METRICS
    from .tables import markdown_grid

    on = "mAP" if metric == "map" else metric
    decays = "weight_decay" in grid
    lines = [f"Test mAP on `{dataset}` (mean ± std over {seeds} seed(s); per seed the grid point "
             f"with the best val {on}; batch {list(grid['batch_size'])} x lr "
             f"{list(grid['lr'])}"
             + (f" x weight decay {list(grid['weight_decay'])}" if decays else "")
             + f", {epochs} epochs, linear head"
             + ("; training drops each epoch's last short batch" if drop_last else "") + ").",
             ""]
    header = ["method", "regime", "test mAP", "val mAP", "train recovery mAP",
              "selected (batch, lr" + (", weight decay)" if decays else ")")]
    extra = [] if metric == "map" else ["test", "val"]  # the selection metric's columns
    body = []
    refs = [m for m in methods if m.label in REFERENCES]
    for m in [m for m in methods if m.label not in REFERENCES] + refs:
        rows = [r for r in selected if r["loss"] == m.label]
        if not rows:
            continue
        picks = sorted({(r["batch_size"], r["lr"], r.get("weight_decay", 0.0)) for r in rows})
        picks = [_pick({"batch_size": b, "lr": lr, "weight_decay": wd}, decays)
                 for b, lr, wd in picks]
        name = m.label if m.label not in REFERENCES else f"*{m.label}* (reference)"
        body.append([name, m.regime, _mean_std([r["test_map"] for r in rows]),
                     _mean_std([r["val_map"] for r in rows]),
                     _mean_std([r["train_recovery_map"] for r in rows]), ", ".join(picks)]
                    + [_mean_std([r[f"{split}_metrics"][metric] for r in rows],
                                 METRICS[metric].decimals) for split in extra])
    for label in dict.fromkeys(r["loss"] for r in sklearn):
        rows = [r for r in sklearn if r["loss"] == label]
        recovery = [np.nan if r["train_recovery_map"] is None else r["train_recovery_map"]
                    for r in rows]
        body.append([f"*{label}* (reference, scikit-learn)", rows[0]["regime"],
                     _mean_std([r["test_map"] for r in rows]),
                     _mean_std([r["val_map"] for r in rows]), _mean_std(recovery),
                     ", ".join(sorted({_pick(r, False) for r in rows}))] + [None] * len(extra))
    lines += markdown_grid(header + [f"{split} {metric}" for split in extra], body)
    if sklearn:
        lines += ["", "*sklearn_lr*: one-vs-rest LogisticRegression (lbfgs, L2) on the same "
                  "features, the observed labels with unknown = negative (@full: the full "
                  "labels), C chosen on val mAP along "
                  f"{', '.join(f'{c:.3g}' for c in _c_grid())} (strong to weak, each fit "
                  "warm-started from the last, stopped once val turned); what a user would "
                  "run instead."]
    lines += ["", f"Wall time: {seconds:.0f} s for the grid points run in this launch."]
    return "\n".join(lines) + "\n"
