"""The scikit-learn reference row: what a user would run instead of an SPML method.

One-vs-rest logistic regression (`sklearn.linear_model.LogisticRegression`, lbfgs, L2)
on the features the linear head sees (the same standardised train / val / test rows), trained
on the observed labels with every unknown label read as a negative (what AN assumes), its ``C``
chosen on the validation rows by val mAP from `C_GRID` (the selection the methods' grids
use), seeded (``random_state``; lbfgs draws nothing, so on the same splits every seed gives the
same fit, computed once: std 0). Where the data has full training labels the same is run on
them (``sklearn_lr@full``, beside the full-label BCE reference row).

The grid is searched as ``LogisticRegressionCV`` and glmnet search theirs, and as spmlkit's
solver searches its path (`spmlkit.engine.solve`): from strong regularisation to weak, each
class's fit started from its fit at the previous C (``warm_start``), and stopped once val has
clearly turned (`spmlkit.engine.solve.turned_since`: 3 values in a row more than 0.1 below
the best; the weak end, where lbfgs needs the most iterations, is then not fitted). Each fit
ends at scikit-learn's tolerance from a nearer start than a cold one, so its scores differ from
cold fits' in the second or third decimal (yeast: val mAP 45.29 either way at the selected C).
In ``make demo`` the two rows' fits took 4.3 s of CPU cold at all 17 values, 0.8 to 1.0 s so.
"""
from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np

#: the inverse regularisation strengths searched on val: 10^-4 ... 10^4 in half decades (17
#: values; yeast selects 10^-2.5 on its single positives, flags 10^2.5, movies' full labels
#: 10^3.5: a coarser grid ending at 100 tuned the alternative less well than a user would)
C_GRID = tuple(float(c) for c in np.logspace(-4, 4, 17))
#: lbfgs iterations per class (yeast's 103 standardised features converge in far fewer)
MAX_ITER = 500
#: the reference rows' name in the tables
NAME = "sklearn_lr"
#: their records in a benchmark or study folder
SKLEARN_FILE = "sklearn-reference.json"
#: the most train entries (rows x features) the rows are fitted on: scikit-learn holds them in
#: memory as float64 (160 MB here); a larger store (spmlkit's out-of-core path) has no such row
MAX_ENTRIES = 20_000_000


def _classifiers(targets: np.ndarray, seed: int) -> list:
    """One warm-started ``LogisticRegression`` per class of ``targets`` (N x L, 0/1); None for a
    class with one target value only in training (it predicts that value's frequency, 0 or
    1)."""
    from sklearn.linear_model import LogisticRegression

    return [None if t.min() == t.max() else
            LogisticRegression(max_iter=MAX_ITER, random_state=seed, warm_start=True)
            for t in targets.T]


def _fit(clfs: list, x: np.ndarray, targets: np.ndarray, c: float) -> tuple:
    """Each class's fit at ``c``, started from its fit at the previous C (``warm_start``): the
    coefficients ``(L x F, L)`` of the one-vs-rest model."""
    from sklearn.exceptions import ConvergenceWarning

    w = np.zeros((targets.shape[1], x.shape[1]))
    b = np.zeros(targets.shape[1])
    for j, clf in enumerate(clfs):
        if clf is None:
            continue
        clf.set_params(C=c)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(x, targets[:, j])
        w[j], b[j] = clf.coef_[0], clf.intercept_[0]
    return w, b


def _probs(x: np.ndarray, coefs: tuple, targets: np.ndarray) -> np.ndarray:
    """The one-vs-rest model's probabilities on ``x``: each class's ``predict_proba`` (the
    logistic of ``x @ coef + intercept``), all classes in one product; a class with one target
    value in training predicts it."""
    from scipy.special import expit

    w, b = coefs
    out = expit(x @ w.T + b)
    for j in np.flatnonzero(targets.min(axis=0) == targets.max(axis=0)):
        out[:, j] = float(targets[0, j])
    return out


def sklearn_reference(splits, seed: int, labels: str = "observed", grid=C_GRID,
                      keep_probs: bool = False, on_fit=None) -> dict:
    """The reference row of one seed on ``splits`` (a `spmlkit.data.Splits`).

    ``labels``: ``"observed"`` (the regime's observed labels, unknown = negative) or ``"full"``
    (the full training labels; ValueError when the data has none). Returns ``{"C", "val_map",
    "test_map", "train_recovery_map", "val_maps", "seconds"}`` (recovery None without full
    training labels; ``val_maps`` per C fitted: the first values of ``grid`` in ascending
    order (strong to weak regularisation), all of them unless val turned before its end);
    with ``keep_probs`` also ``"probs"``: the selected C's val and test probabilities
    (``{"val", "test"}``, float32), what the solver benchmark weighs the losses against
    (`spmlkit.experiments.solver_benchmark`). ``on_fit(c)`` is called after the fits of each C
    fitted (a progress bar).

    Raises:
        ValueError: ``labels="full"`` on data without full training labels, data that holds
            images instead of feature vectors, or more than `MAX_ENTRIES` train entries.
    """
    # scikit-learn (and the BLAS it loads) imported before the limit: a library first loaded
    # inside threadpool_limits is not limited by it, and the fits ran with every BLAS thread
    # (make demo took 2.65x the CPU of the release before the reference rows)
    import sklearn.linear_model  # noqa: F401
    from threadpoolctl import threadpool_limits

    from ..data.rows import holds_vectors
    from ..metrics import map_score  # partial val / test labels scored masked

    if not holds_vectors(splits.train.x):
        raise ValueError("sklearn_lr trains on feature vectors; this data holds images (give "
                         "--backbone NAME for their features)")
    size = int(np.prod(np.shape(splits.train.x)))
    if size > MAX_ENTRIES:
        raise ValueError(f"sklearn_lr: {np.shape(splits.train.x)[0]} x "
                         f"{np.shape(splits.train.x)[1]} train features are more than the "
                         f"{MAX_ENTRIES:,} entries scikit-learn is given in memory")
    start = time.perf_counter()
    with threadpool_limits(1):  # BLAS threads on busy cores: 15x slower (66 s vs 4 s, yeast)
        out = _reference(splits, seed, labels, grid, start, map_score, on_fit)
    if not keep_probs:
        out.pop("probs")
    return out


def _reference(splits, seed, labels, grid, start, map_score, on_fit=None) -> dict:
    from ..engine.solve import PATIENCE, turned_since

    if labels == "full" and not splits.train_labels_complete:
        raise ValueError("sklearn_lr@full: the data's training labels are not complete")
    y = splits.train.y if labels == "full" else splits.observed
    targets = (np.asarray(y) > 0).astype(np.int64)
    x, xv, xt = (np.asarray(s.x, dtype=np.float64) for s in (splits.train, splits.val,
                                                             splits.test))
    grid = sorted(float(c) for c in grid)  # strong to weak, as the solver's path
    clfs, scored, path, since = _classifiers(targets, seed), [], [], 0
    for c in grid:  # each fit from the last
        path.append(_fit(clfs, x, targets, c))
        scored.append(map_score(_probs(xv, path[-1], targets), splits.val.y))
        since = turned_since(since, scored[-1], max(scored))
        if on_fit is not None:
            on_fit(c)
        if since >= PATIENCE:  # val has turned: the weaker values are not fitted
            break
    best = int(np.argmax(scored))  # the first of equal scores, as the grids select
    ptr, pv, pt = (_probs(s, path[best], targets) for s in (x, xv, xt))
    recovery = map_score(ptr, splits.train.y) if splits.train_labels_complete else None
    return {"C": float(grid[best]), "val_map": scored[best],
            "test_map": map_score(pt, splits.test.y), "train_recovery_map": recovery,
            "val_maps": [float(v) for v in scored], "seconds": time.perf_counter() - start,
            "probs": {"val": pv.astype(np.float32), "test": pt.astype(np.float32)}}


def reference_records(dataset: str, options: dict, regimes, seeds) -> list:
    """The records of the scikit-learn rows on ``dataset``: per regime of ``regimes`` and
    seed, `sklearn_reference` on that regime's observed labels (``full``: the full
    labels), labelled ``sklearn_lr`` for the single-positive and ``given`` regimes and
    ``sklearn_lr@<regime>`` for the others. Records as `spmlkit.experiments.benchmark.
    run_benchmark`'s (``loss`` the row's label; ``C`` where the methods have
    ``(batch_size, lr)``), with ``dataset``."""
    from ..data import trial_options
    from .pool import cached_splits

    out, done = [], {}
    for regime in regimes:
        label = NAME if regime in ("1p", "given") else f"{NAME}@{regime}"
        for seed in seeds:
            splits = cached_splits(dataset, regime, trial_options(options, seed))
            # lbfgs draws nothing: on the same splits every seed's fit is the same one
            if id(splits) not in done:
                try:
                    done[id(splits)] = sklearn_reference(splits, seed)
                except ValueError as err:  # images, or too large: the row is left out
                    done[id(splits)] = err
            res = done[id(splits)]
            if isinstance(res, ValueError):
                print(f"note: {label} left out on {dataset}: {res}", file=sys.stderr)
                break
            out.append({"loss": label, "dataset": dataset, "regime": regime, "seed": seed,
                        "C": res["C"], "val_map": res["val_map"], "test_map": res["test_map"],
                        "train_recovery_map": res["train_recovery_map"],
                        "seconds": res["seconds"], "val_maps": res["val_maps"],
                        "reference": "scikit-learn"})
    return out


def study_references(spec) -> list:
    """The scikit-learn rows of a study (``sklearn_reference: true``): per dataset entry and
    per value of the spec's ``vary`` axes over the data (``data.<option>``, ``regime``), the
    regimes of its methods, or the axis's (`reference_records`). Each record carries that
    assignment as its ``variant``, so that a table with such an axis as its columns shows each
    fit in its own column (one fit on the entry's options stood in every one)."""
    import itertools

    axes = {k: v for k, v in spec.vary.items() if k.startswith("data.")}
    regimes = list(spec.vary.get("regime") or dict.fromkeys(m.regime for m in spec.methods))
    out = []
    for ds in spec.datasets:
        for values in itertools.product(*axes.values()):
            assigned = dict(zip(axes, values))
            options = {**ds.options, **{k[5:]: v for k, v in assigned.items()}}
            for r in reference_records(ds.name, options, regimes, spec.seeds):
                variant = {**assigned, **({"regime": r["regime"]} if "regime" in spec.vary
                                          else {})}
                out.append({**r, "dataset": spec.dataset_label(ds), "variant": variant})
    return out


def table_rows(records) -> list:
    """The records as selected study rows (`spmlkit.experiments.tables.study_table`)."""
    return [{"method": f"{r['loss']} (scikit-learn reference)", "dataset": r["dataset"],
             "regime": r["regime"], "seed": r["seed"], "test_map": r["test_map"],
             "val_map": r["val_map"], "train_recovery_map": r["train_recovery_map"],
             "status": "done", "variant": json.dumps(r.get("variant") or {}, sort_keys=True)}
            for r in records]


#: the columns the scikit-learn rows have (`table_rows`)
ROW_METRICS = ("test_map", "val_map", "train_recovery_map")


def reference_rows(folder, metric: str = "test_map") -> list:
    """The scikit-learn rows of the study or benchmark folder ``folder`` (its
    ``sklearn-reference.json``, written with ``sklearn_reference: true`` / by ``spml
    benchmark``) as selected study rows (`table_rows`); ``[]`` without the file or for a
    ``metric`` column they do not have. What ``spml study table``, ``spml report`` and ``spml
    study export --selected`` add to the methods' rows, so the alternative is in the same
    table."""
    from pathlib import Path

    path = Path(folder) / SKLEARN_FILE
    if metric not in ROW_METRICS or not path.is_file():
        return []
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(records, list):
            raise ValueError(f"a list of records, got {type(records).__name__}")
        return table_rows(records)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        raise ValueError(f"{path}: not the JSON spml wrote ({type(err).__name__}: "
                         f"{str(err)[:200]}); remove it and run the study again to write the "
                         f"scikit-learn rows") from None
