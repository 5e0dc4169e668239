"""The scikit-learn reference row: what a user would run instead of an SPML method.

One-vs-rest logistic regression (`sklearn.linear_model.LogisticRegression`, lbfgs, L2)
on the features the linear head sees (the same standardised train / val / test rows), trained
on the observed labels with every unknown label read as a negative (what AN assumes), its ``C``
chosen on the validation rows by val mAP from `C_GRID` (the selection the methods' grids
use), seeded (``random_state``; lbfgs draws nothing, so on the same splits every seed gives the
same fit, computed once: std 0). Where the data has full training labels the same is run on
them (``sklearn_lr@full``, beside the full-label BCE reference row).
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


def _fit_predict(x, targets: np.ndarray, c: float, seed: int, sets: list) -> list:
    """Per-class logistic regressions on ``targets`` (N x L, 0/1); each set's probabilities.
    A class with one target value only in training predicts that value's frequency (0 or 1)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    out = [np.zeros((len(s), targets.shape[1]), dtype=np.float64) for s in sets]
    for j in range(targets.shape[1]):
        t = targets[:, j]
        if t.min() == t.max():
            for o in out:
                o[:, j] = float(t[0])
            continue
        clf = LogisticRegression(C=c, max_iter=MAX_ITER, random_state=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(x, t)
        for o, s in zip(out, sets):
            o[:, j] = clf.predict_proba(s)[:, 1]
    return out


def sklearn_reference(splits, seed: int, labels: str = "observed", grid=C_GRID,
                      keep_probs: bool = False, on_fit=None) -> dict:
    """The reference row of one seed on ``splits`` (a `spmlkit.data.Splits`).

    ``labels``: ``"observed"`` (the regime's observed labels, unknown = negative) or ``"full"``
    (the full training labels; ValueError when the data has none). Returns ``{"C", "val_map",
    "test_map", "train_recovery_map", "val_maps", "seconds"}`` (recovery None without full
    training labels; ``val_maps`` per C of ``grid``); with ``keep_probs`` also ``"probs"``:
    the selected C's val and test probabilities (``{"val", "test"}``, float32), what the solver
    benchmark weighs the losses against (`spmlkit.experiments.solver_benchmark`).
    ``on_fit(c)`` is called after the fits of each C of ``grid`` (a progress bar).

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
    if labels == "full" and not splits.train_labels_complete:
        raise ValueError("sklearn_lr@full: the data's training labels are not complete")
    y = splits.train.y if labels == "full" else splits.observed
    targets = (np.asarray(y) > 0).astype(np.int64)
    x, xv, xt = (np.asarray(s.x, dtype=np.float64) for s in (splits.train, splits.val,
                                                             splits.test))
    scored, kept = [], None
    for c in grid:  # each C's fits predict train, val and test at once: the best C's are kept
        ptr, pv, pt = _fit_predict(x, targets, c, seed, [x, xv, xt])  # (no refit of it)
        scored.append(map_score(pv, splits.val.y))
        if kept is None or scored[-1] > max(scored[:-1]):  # the first of equal scores, as
            kept = ptr, pv, pt                                  # the grids select
        if on_fit is not None:
            on_fit(c)
    best = int(np.argmax(scored))
    ptr, pv, pt = kept
    recovery = map_score(ptr, splits.train.y) if splits.train_labels_complete else None
    return {"C": float(grid[best]), "val_map": map_score(pv, splits.val.y),
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
