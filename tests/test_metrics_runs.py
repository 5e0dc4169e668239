"""`runs_scores` and `runs_thresholds`: many runs' metrics and thresholds from shared passes equal
each run's own `classic_metrics`, `evaluate` and `select_thresholds`, bit for bit, for every
metric record."""
from __future__ import annotations

import numpy as np
import pytest

from spmlkit.metrics import METRICS, classic_metrics, evaluate, partial_labels, select_thresholds
from spmlkit.metrics.scoring import runs_scores
from spmlkit.metrics.thresholds import runs_thresholds


def _same(a, b) -> bool:
    """Equal values (NaN equal to NaN), the same keys in the same order."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return a == b
    return (np.isnan(a) and np.isnan(b)) if isinstance(a, float) and np.isnan(a) else a == b


def _case(seed: int, runs: int, n: int, classes: int, ties: bool):
    rng = np.random.default_rng(seed)
    probs = rng.random((runs, n, classes)).astype(np.float32)
    if ties:  # few distinct values: ties within rows, columns and runs
        probs = np.round(probs * 4) / 4
    y = (rng.random((n, classes)) < 0.3).astype(np.uint8)
    y[0] = 0  # a row without a positive
    if classes > 2:
        y[:, 1] = 0  # a class without a positive
    thresholds = rng.uniform(0.2, 0.8, runs)
    return probs, y, thresholds


@pytest.mark.parametrize("convention", ["present", "official"])
@pytest.mark.parametrize("no_positive", ["sklearn", "exclude"])
@pytest.mark.parametrize("seed,runs,n,classes,ties", [
    (0, 5, 60, 14, False), (1, 4, 40, 6, True), (2, 3, 30, 1, False), (3, 3, 25, 2, True),
    (4, 2, 1, 4, False)])
def test_each_run_equals_its_own_scores(convention, no_positive, seed, runs, n, classes, ties):
    probs, y, thresholds = _case(seed, runs, n, classes, ties)
    got = runs_scores(probs, y, thresholds, convention=convention, no_positive=no_positive,
                      report=True)
    for r in range(runs):
        own = classic_metrics(probs[r], y, convention=convention, threshold=thresholds[r],
                              no_positive=no_positive)
        assert set(METRICS) <= set(own)
        assert _same(got[r][0], own), (r, got[r][0], own)
        assert _same(got[r][1], evaluate(probs[r], y, convention))
    alone = runs_scores(probs, y, thresholds, convention=convention, no_positive=no_positive)
    assert all(_same(a, b[0]) for a, b in zip(alone, got))


def test_partial_labels_and_one_run_are_scored_run_by_run():
    probs, y, thresholds = _case(5, 3, 30, 5, False)
    known = np.random.default_rng(0).random(y.shape) < 0.5
    partial = partial_labels(np.where(known, y.astype(int) * 2 - 1, 0), "entry")
    got = runs_scores(probs, partial, thresholds)
    for r in range(3):
        assert _same(got[r], classic_metrics(probs[r], partial, threshold=thresholds[r]))
    assert _same(runs_scores(probs[:1], y, thresholds[:1])[0],
                 classic_metrics(probs[0], y, threshold=thresholds[0]))


def test_bad_inputs_are_refused():
    probs, y, thresholds = _case(6, 3, 20, 4, False)
    with pytest.raises(ValueError, match="one threshold per run"):
        runs_scores(probs, y, thresholds[:2])
    with pytest.raises(ValueError, match="one threshold per run"):
        runs_scores(probs[0], y, thresholds)
    probs[1, 3, 2] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        runs_scores(probs, y, thresholds)


@pytest.mark.parametrize("seed,runs,n,classes,ties", [
    (0, 5, 60, 14, False), (1, 4, 40, 6, True), (2, 3, 30, 1, True), (3, 2, 1, 3, False)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_thresholds_of_many_runs_equal_each_runs_own(seed, runs, n, classes, ties, dtype):
    probs, y, _ = _case(seed, runs, n, classes, ties)
    probs = probs.astype(dtype)
    names = [f"c{j}" for j in range(classes)]
    got = runs_thresholds(probs, y, names)
    for r in range(runs):
        assert _same(got[r], select_thresholds(probs[r], y, names)), r


def test_thresholds_of_partial_labels_or_one_run_are_chosen_run_by_run():
    probs, y, _ = _case(7, 3, 30, 5, True)
    known = np.random.default_rng(1).random(y.shape) < 0.6
    partial = partial_labels(np.where(known, y.astype(int) * 2 - 1, 0), "entry")
    got = runs_thresholds(probs, partial)
    assert all(_same(got[r], select_thresholds(probs[r], partial)) for r in range(3))
    assert _same(runs_thresholds(probs[:1], y)[0], select_thresholds(probs[0], y))
    with pytest.raises(ValueError, match="R x N x L"):
        runs_thresholds(probs[0], y)
