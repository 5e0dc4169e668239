"""Label sets with a stated coverage (spmlkit.coverage): the exact conformal quantile on
hand-made numbers, the coverage a simulation measures, the estimator's predict_sets and
``spml predict --coverage``."""
import json
import warnings

import numpy as np
import pytest
import torch

from spmlkit.cli import main
from spmlkit.coverage import (calibration_positives, coverage_thresholds, min_positives,
                              recall_floor)
from spmlkit.estimator import SPMLClassifier
from spmlkit.metrics import partial_labels


def test_the_threshold_is_the_floor_alpha_n_plus_1_th_smallest_positive_score():
    # class 0: positives score 0.1 .. 1.0 (n = 10); negatives never count
    scores = np.round(np.arange(1, 11) / 10, 1)
    probs = np.concatenate([scores, [0.05, 0.01]])[:, None]
    y = np.array([1] * 10 + [0, 0])[:, None]
    # coverage 0.8: alpha (n + 1) = 2.2 -> the 2nd smallest, 0.2
    assert coverage_thresholds(probs, y, 0.8).thresholds.tolist() == [0.2]
    # 0.9: 1.1 -> the smallest, 0.1 (1 - 0.9 is 0.0999... in floats: still rank 1)
    t = coverage_thresholds(probs, y, 0.9)
    assert t.ranks.tolist() == [1] and t.thresholds.tolist() == [0.1]
    assert t.upper.tolist() == pytest.approx([0.9 + 1 / 11])
    # 0.95: 0.55 -> rank 0, too few positives: threshold 0, in every set
    t = coverage_thresholds(probs, y, 0.95)
    assert t.ranks.tolist() == [0] and t.thresholds.tolist() == [0.0]
    assert t.always.tolist() == [0] and t.upper.tolist() == [1.0]
    assert t.apply([[0.0]]).tolist() == [[True]]
    # coverage 0.5 on 10 positives: alpha (n + 1) = 5.5 -> the 5th smallest, 0.5; >= keeps ties
    t = coverage_thresholds(probs, y, 0.5)
    assert t.thresholds.tolist() == [0.5]
    assert t.apply([[0.5], [0.4999]]).tolist() == [[True], [False]]


def test_min_positives_is_where_the_rank_first_reaches_one():
    for coverage, n in ((0.5, 1), (0.8, 4), (0.9, 9), (0.95, 19), (0.99, 99)):
        assert min_positives(coverage) == n
        probs = np.linspace(0.1, 0.9, n)[:, None]
        assert coverage_thresholds(probs, np.ones((n, 1)), coverage).ranks.tolist() == [1]
        assert coverage_thresholds(probs[1:], np.ones((n - 1, 1)),
                                   coverage).ranks.tolist() == [0]


def test_full_partial_and_single_positive_labels_calibrate_on_their_positives():
    probs = np.array([[0.9, 0.2, 0.7], [0.4, 0.8, 0.3], [0.6, 0.5, 0.1], [0.3, 0.9, 0.8]])
    full = np.array([[1, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 1]])
    assert coverage_thresholds(probs, full, 0.5).counts.tolist() == [3, 3, 2]
    partial = partial_labels([[1, -1, 0], [0, 1, -1], [-1, 1, 0], [1, 0, 1]])
    assert calibration_positives(partial).astype(int).tolist() == \
        [[1, 0, 0], [0, 1, 0], [0, 1, 0], [1, 0, 1]]
    single = np.array([2, 1, 1, 0])   # each row's observed positive (a column index)
    assert calibration_positives(single, 3).sum(axis=0).tolist() == [1, 2, 1]
    nan = np.array([[1, np.nan], [np.nan, 1]])
    assert calibration_positives(nan).tolist() == [[True, False], [False, True]]


def test_three_positive_classes_thresholds_by_hand():
    probs = np.array([[0.9, 0.2, 0.7], [0.4, 0.8, 0.3], [0.6, 0.5, 0.1], [0.3, 0.9, 0.8]])
    full = np.array([[1, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 1]])
    t = coverage_thresholds(probs, full, 0.5)
    # class 0: positives 0.9, 0.4, 0.3 (n = 3, rank 2) -> 0.4; class 1: 0.8, 0.5, 0.9 -> 0.8;
    # class 2: 0.7, 0.8 (n = 2, rank floor(1.5) = 1) -> 0.7
    assert t.ranks.tolist() == [2, 2, 1]
    assert t.thresholds.tolist() == [0.4, 0.8, 0.7]


def test_bad_inputs_name_what_is_wrong():
    p = np.array([[0.5, 0.5]])
    for bad in (0, 1, 1.5, -0.1, float("nan"), "0.9", True):
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            coverage_thresholds(p, [[1, 0]], bad)
    with pytest.raises(ValueError, match=r"found \[2\] \(first at row 0\)"):
        coverage_thresholds(p, [[2, 0]], 0.9)
    with pytest.raises(ValueError, match="row 0 names column 5, outside 0..1"):
        coverage_thresholds(p, [5], 0.9)
    with pytest.raises(ValueError, match="probabilities in"):
        coverage_thresholds([[1.5, 0.2]], [[1, 0]], 0.9)
    with pytest.raises(ValueError, match="2 columns for 3 classes|must have the same shape"):
        coverage_thresholds([[0.5, 0.5, 0.5]], [[1, 0]], 0.9)


@pytest.mark.parametrize("coverage", [0.8, 0.9, 0.95])
def test_simulated_coverage_is_at_least_stated_and_below_the_upper_bound(coverage):
    # 4000 independent trials at once (one column each): n calibration positives and m test
    # positives drawn from the same score distribution (exchangeable); the mean recall over the
    # trials estimates the coverage, which lies in [1 - alpha, 1 - alpha + 1 / (n + 1)]
    rng = np.random.default_rng(7)
    trials, n, m = 4000, 40, 60
    cal = rng.beta(2, 3, size=(n, trials))
    t = coverage_thresholds(cal, np.ones_like(cal), coverage)
    test = rng.beta(2, 3, size=(m, trials))
    recall = t.apply(test).mean(axis=0)
    exact = 1 - np.floor(round((1 - coverage) * (n + 1), 9)) / (n + 1)
    se = recall.std() / np.sqrt(trials)
    assert recall.mean() >= coverage - 4 * se
    assert recall.mean() == pytest.approx(exact, abs=4 * se)
    assert recall.mean() <= coverage + 1 / (n + 1)
    # each trial's recall: below recall_floor at 5 % only about 5 % of the time
    floor = recall_floor(n, m, coverage, 0.05)[0]
    assert (recall < floor).mean() <= 0.05 + 4 * np.sqrt(0.05 * 0.95 / trials)


def test_single_positive_calibration_under_a_uniform_draw_misses_when_cardinality_varies():
    # the assumption matters: rows with 3 positives show a given class a third as often as
    # rows with 1, so if those rows score lower the single-positive calibration scores are
    # biased upwards and the coverage falls short; full labels keep it
    rng = np.random.default_rng(3)
    rows = 60000
    many = rng.random(rows) < 0.5                     # rows with 3 positives, else 1
    y = np.zeros((rows, 3), dtype=int)
    y[~many, 0] = 1
    y[many] = 1
    score = np.where(many, rng.beta(2, 5, rows), rng.beta(5, 2, rows))  # class 0's score
    probs = np.column_stack([score, rng.random(rows), rng.random(rows)])
    observed = np.array([rng.choice(np.flatnonzero(r)) for r in y])
    cal, test = slice(0, rows // 2), slice(rows // 2, None)
    pos_test = y[test, 0] == 1
    full = coverage_thresholds(probs[cal], y[cal], 0.9).apply(probs[test])[:, 0]
    one = coverage_thresholds(probs[cal], calibration_positives(observed[cal], 3),
                              0.9).apply(probs[test])[:, 0]
    assert full[pos_test].mean() >= 0.89
    assert one[pos_test].mean() < 0.85


def test_predict_sets_calibrates_on_val_or_given_rows():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1500, 5))
    Y = (X[:, :3] + 0.5 * rng.normal(size=(1500, 3)) > 0).astype(int)
    keep = Y.any(axis=1)
    X, Y = X[keep], Y[keep]
    y = np.array([rng.choice(np.flatnonzero(r)) for r in Y])
    tr, va, te = slice(0, 500), slice(500, 900), slice(900, None)
    clf = SPMLClassifier(C=0.1).fit(X[tr], y[tr], X_val=X[va], Y_val=Y[va])
    sets = clf.predict_sets(X[te], coverage=0.9)
    assert sets.dtype == np.int64 and sets.shape == Y[te].shape
    recall = (sets * Y[te]).sum(axis=0) / Y[te].sum(axis=0)
    assert (recall >= 0.85).all(), recall
    # the same thresholds from the module, on the val probabilities
    t = coverage_thresholds(clf.predict_proba(X[va]), Y[va], 0.9)
    assert np.array_equal(sets, t.apply(clf.predict_proba(X[te])).astype(np.int64))
    # given calibration rows: full, 1-D single positives (class labels), partial
    for Y_cal in (Y[va], y[va], partial_labels(np.where(Y[va] == 1, 1, -1))):
        got = clf.predict_sets(X[te], 0.9, X_cal=X[va], Y_cal=Y_cal)
        want = coverage_thresholds(clf.predict_proba(X[va]), np.asarray(
            clf._eval_labels(Y_cal, "Y_cal")), 0.9).apply(clf.predict_proba(X[te]))
        assert np.array_equal(got, want.astype(np.int64))
    # a higher coverage gives sets at least as large
    assert (clf.predict_sets(X[te], 0.95) >= clf.predict_sets(X[te], 0.8)).all()


def test_predict_sets_refusals_and_the_few_positives_warning():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 3))
    y = np.where(X[:, 0] > 0, "cat", "dog")
    clf = SPMLClassifier(C=0.1).fit(X, y)
    with pytest.raises(ValueError, match="pass X_cal and Y_cal, or fit with X_val"):
        clf.predict_sets(X)
    with pytest.raises(ValueError, match="together"):
        clf.predict_sets(X, X_cal=X)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        clf.predict_sets(X, coverage=90, X_cal=X, Y_cal=y)
    with pytest.raises(ValueError, match="not among the fitted classes"):
        clf.predict_sets(X, X_cal=X[:2], Y_cal=np.array(["cat", "cow"]))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sets = clf.predict_sets(X[:4], 0.95, X_cal=X[:10], Y_cal=y[:10])
    assert sets.all()   # 10 rows: fewer than 19 positives a class: every class in every set
    assert any("fewer than 19 calibration positives" in str(w.message) for w in seen)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("coverage")
    assert main(["train", "--loss", "an", "--epochs", "3", "--quiet", "--out",
                 str(out / "runs")]) == 0
    (folder,) = (out / "runs").iterdir()
    return folder


def test_spml_predict_coverage_on_a_yeast_run(run, tmp_path, capsys):
    from spmlkit.loading import load_dataset

    data = load_dataset("yeast")
    feats = tmp_path / "test.npy"   # raw rows, as new ones come (predict standardises them)
    np.save(feats, np.asarray(data.test.x, dtype=np.float32))
    out = tmp_path / "sets.json"
    assert main(["predict", str(run), str(feats), "--coverage", "0.9", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    thr = got["threshold"]
    assert thr["kind"] == "coverage" and thr["coverage"] == 0.9
    stored = np.load(run / "predictions.npz")
    want = coverage_thresholds(stored["probs_val"], stored["y_val"], 0.9)
    names = got["class_names"]
    assert [thr["values"][c] for c in names] == pytest.approx(want.thresholds.tolist())
    assert [thr["calibration_positives"][c] for c in names] == want.counts.tolist()
    assert thr["always_included"] == [names[j] for j in want.always]
    labels = np.array([[c in r["labels"] for c in names] for r in got["predictions"]])
    probs = np.array([[r["scores"][c] for c in names] for r in got["predictions"]])
    assert np.array_equal(labels, want.apply(probs))
    # measured on the full test labels: every class's recall within its finite-sample slack
    y = np.asarray(data.test.y)
    m = y.sum(axis=0)
    recall = (labels & (y == 1)).sum(axis=0) / np.maximum(m, 1)
    floor = recall_floor(want.counts, m, 0.9, 0.05 / y.shape[1])
    ok = m > 0
    assert (recall[ok] >= floor[ok]).all(), (recall, floor)
    assert recall[ok].mean() >= 0.85
    # the CSV's labels column holds the sets
    csv_out = tmp_path / "sets.csv"
    assert main(["predict", str(run), str(feats), "--coverage", "0.9", "--out",
                 str(csv_out)]) == 0
    first = csv_out.read_text().splitlines()[1].split(",")[1].split(";")
    assert first == [c for c, on in zip(names, labels[0]) if on]


@pytest.mark.parametrize("extra", [["--threshold", "0.5"], ["--threshold", "global"],
                                   ["--threshold-rule", "mcut"], ["--threshold-k", "2"]])
def test_coverage_refuses_a_threshold_option(run, tmp_path, capsys, extra):
    feats = tmp_path / "x.npy"
    np.save(feats, np.zeros((2, 103), dtype=np.float32))
    assert main(["predict", str(run), str(feats), "--coverage", "0.9", *extra]) == 2
    assert "--coverage" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "1", "1.2", "-0.5", "nan", "ninety"])
def test_coverage_outside_zero_one_is_refused(run, tmp_path, capsys, bad):
    feats = tmp_path / "x.npy"
    np.save(feats, np.zeros((2, 103), dtype=np.float32))
    with pytest.raises(SystemExit) as err:
        main(["predict", str(run), str(feats), "--coverage", bad])
    assert err.value.code == 2
    assert "strictly between 0 and 1" in capsys.readouterr().err


def test_the_guides_coverage_numbers_are_those_of_results():
    # docs/guide/thresholds-calibration.md quotes results/coverage-tables.csv (numbers in prose
    # come from a measurement): each quoted cell, rounded as quoted, is the CSV's
    import csv
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with (root / "results" / "coverage-tables.csv").open(newline="", encoding="utf-8") as f:
        rows = {(r["dataset"], r["method"], r["calibration"], r["coverage"]): r
                for r in csv.DictReader(f)}
    page = (root / "docs" / "guide" / "thresholds-calibration.md").read_text(encoding="utf-8")
    page = " ".join(page.split())
    quoted = [(("yeast", "conformal", "full", "0.9"), "recall_mean", "0.905"),
              (("emotions", "conformal", "full", "0.9"), "recall_mean", "0.914"),
              (("hobbies", "conformal", "full", "0.9"), "recall_mean", "0.896"),
              (("nmes", "conformal", "full", "0.9"), "recall_mean", "0.909"),
              (("yeast", "conformal", "full", "0.9"), "recall_min", "0.839"),
              (("emotions", "conformal", "full", "0.9"), "recall_min", "0.831"),
              (("hobbies", "conformal", "full", "0.9"), "recall_min", "0.842"),
              (("nmes", "conformal", "full", "0.9"), "recall_min", "0.876"),
              (("yeast", "f1-per-class", "full", ""), "recall_min", "0.105"),
              (("yeast", "mapie-crc", "full", "0.9"), "row_recall", "0.928"),
              (("yeast", "mapie-crc", "full", "0.9"), "recall_min", "0.000"),
              (("yeast", "conformal", "full", "0.9"), "set_size", "11.52"),
              (("yeast", "f1-per-class", "full", ""), "set_size", "7.77"),
              (("yeast", "conformal", "full", "0.9"), "labels_per_row", "4.24"),
              (("yeast", "conformal", "single", "0.95"), "always", "19")]
    for key, column, text in quoted:
        decimals = len(text.split(".")[1]) if "." in text else 0
        assert f"{float(rows[key][column]):.{decimals}f}" == text, (key, column)
        assert text in page, text
    held = [r for r in rows.values() if r["method"] == "conformal" and r["calibration"] == "full"]
    fails = {r["dataset"] for r in held if r["holds"] != "yes"}
    assert "holds on five tables of six" in page and len({r["dataset"] for r in held}) == 6
    assert fails == {"hobbies"}
    flags = rows[("flags", "conformal", "single", "0.9")]
    assert flags["always"] == flags["checked"]   # "on flags every class does from 0.9"
