"""Tests of spmlkit.metrics: AP / mAP against scikit-learn, the two mAP conventions for classes
without positives, P@k / R@k by hand, F1 against scikit-learn, and input errors."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, f1_score

from spmlkit.metrics import (average_precision, evaluate, f1_scores, map_score,
                             mean_average_precision, per_class_ap, precision_recall_at_k)


def _sk_ap(scores, targets):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(average_precision_score(np.asarray(targets), np.asarray(scores)))


# ------------------------------------------------------------------ average_precision --------
def test_ap_doc_example_by_hand():
    # ranks: 0.9 (pos) P=1, 0.8 (neg), 0.1 (pos) P=2/3 -> (1 + 2/3) / 2
    assert average_precision([0.9, 0.8, 0.1], [1, 0, 1]) == pytest.approx(5 / 6)


def test_ap_ties_grouped_by_hand():
    # the two tied scores form one threshold: P = 1/2 at recall 1
    assert average_precision([0.5, 0.5], [1, 0]) == pytest.approx(0.5)
    # tie between a positive and a negative after a positive:
    # thresholds 0.9: tp=1, P=1, R=1/2; 0.4: tp=2, n=3, P=2/3, R=1 -> 0.5*1 + 0.5*2/3
    assert average_precision([0.9, 0.4, 0.4], [1, 1, 0]) == pytest.approx(0.5 + 1 / 3)


def test_ap_no_positive_is_nan():
    assert math.isnan(average_precision([0.3, 0.2], [0, 0]))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n=st.integers(1, 40), ties=st.booleans())
def test_ap_equals_sklearn(data, n, ties):
    if ties:  # few distinct values -> many ties
        scores = data.draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, -3.0]),
                                    min_size=n, max_size=n))
    else:
        scores = data.draw(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=n,
                                    max_size=n, unique=True))
    targets = data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    assume(sum(targets) > 0)
    assert average_precision(scores, targets) == pytest.approx(_sk_ap(scores, targets),
                                                               rel=1e-12, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_map_equals_sklearn_per_class(seed):
    rng = np.random.RandomState(seed)
    n, L = rng.randint(2, 30), rng.randint(1, 8)
    y = (rng.random_sample((n, L)) < 0.3).astype(np.uint8)
    s = np.round(rng.random_sample((n, L)), 1)  # ties
    res = mean_average_precision(s, y)
    want = [100 * _sk_ap(s[:, j], y[:, j]) if y[:, j].any() else np.nan for j in range(L)]
    np.testing.assert_allclose(res.per_class, want, rtol=1e-12, atol=1e-10)
    present = [w for w in want if not np.isnan(w)]
    if present:
        assert res.value == pytest.approx(np.mean(present), rel=1e-12)
        # sklearn's macro AP over present classes
        cols = y.any(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sk = 100 * average_precision_score(y[:, cols], s[:, cols], average="macro")
        assert res.value == pytest.approx(sk, rel=1e-12)
    else:
        assert math.isnan(res.value)


@pytest.mark.parametrize("seed", range(4))
def test_columns_with_and_without_ties_equal_sklearn_and_each_column_alone(seed):
    # ranked_ap takes columns without tied scores by their short path and the others by the
    # grouped one; a block mixing both equals sklearn and the columns scored two by two
    rng = np.random.default_rng(seed)
    n, L = 50, 9
    s = rng.random((n, L))
    s[:, ::3] = np.round(s[:, ::3], 1)  # every third column tied
    y = (rng.random((n, L)) < 0.3).astype(np.uint8)
    y[0] = 1
    ap = per_class_ap(s, y)
    want = [100 * _sk_ap(s[:, j], y[:, j]) for j in range(L)]
    np.testing.assert_allclose(ap, want, rtol=1e-12)
    pairs = np.concatenate([per_class_ap(s[:, j:j + 2], y[:, j:j + 2]) for j in range(0, L - 1, 2)])
    assert np.array_equal(ap[:L - 1], pairs)  # each column's AP its own, bit for bit


def test_ap_length_mismatch_raises():
    with pytest.raises(ValueError):
        average_precision([0.9, 0.8, 0.1], [1, 0, 1, 1])


def test_ap_nan_score_raises():
    with pytest.raises(ValueError):
        average_precision([0.9, np.nan, 0.1], [1, 0, 1])


# ------------------------------------------------------------------ mAP conventions ----------
class TestMapConventions:
    # class 0: perfect (AP 100); class 1: no positive; class 2: AP 50; class 3: no positive
    s = np.array([[0.9, 0.1, 0.2, 0.5],
                  [0.1, 0.8, 0.9, 0.4],
                  [0.2, 0.3, 0.1, 0.3]])
    y = np.array([[1, 0, 1, 0],
                  [0, 0, 0, 0],
                  [0, 0, 0, 0]])

    def test_per_class(self):
        ap = per_class_ap(self.s, self.y)
        assert ap[0] == pytest.approx(100.0)
        assert ap[2] == pytest.approx(50.0)
        assert math.isnan(ap[1]) and math.isnan(ap[3])

    def test_present(self):
        res = mean_average_precision(self.s, self.y)
        assert res.convention == "present"
        assert res.missing == [1, 3]
        assert res.value == pytest.approx(75.0)
        assert float(res) == pytest.approx(75.0)
        assert map_score(self.s, self.y) == pytest.approx(75.0)

    def test_official(self):
        res = mean_average_precision(self.s, self.y, convention="official")
        assert res.convention == "official"
        assert res.missing == [1, 3]
        assert res.value == pytest.approx((100.0 + 0 + 50.0 + 0) / 4)
        assert map_score(self.s, self.y, "official") == pytest.approx(37.5)

    def test_all_missing(self):
        y = np.zeros((3, 2), dtype=int)
        res = mean_average_precision(self.s[:, :2], y)
        assert math.isnan(res.value) and res.missing == [0, 1]
        assert mean_average_precision(self.s[:, :2], y, "official").value == 0.0

    def test_bad_convention(self):
        with pytest.raises(ValueError, match="convention"):
            mean_average_precision(self.s, self.y, convention="paper")

    def test_evaluate_report(self):
        out = evaluate(self.s, self.y)
        assert out["map"] == pytest.approx(75.0)
        assert out["classes_without_positives"] == [1, 3]
        assert {"p@1", "r@1", "p@3", "r@3"} <= set(out)


# ------------------------------------------------------------------ P@k / R@k ----------------
def test_precision_recall_at_k_by_hand():
    s = np.array([[0.9, 0.8, 0.1, 0.3],
                  [0.2, 0.7, 0.6, 0.1],
                  [0.5, 0.4, 0.3, 0.2]])
    y = np.array([[1, 0, 0, 1],
                  [0, 0, 1, 0],
                  [0, 0, 0, 0]])
    # k=1: tops are cols 0, 1, 0 -> hits 1, 0, 0
    p1, r1 = precision_recall_at_k(s, y, 1)
    assert p1 == pytest.approx((1 + 0 + 0) / 3)
    assert r1 == pytest.approx((1 / 2 + 0 / 1) / 2)  # row 2 has no positive: left out of R
    # k=2: row0 {0,1} -> 1 hit; row1 {1,2} -> 1 hit; row2 {0,1} -> 0
    p2, r2 = precision_recall_at_k(s, y, 2)
    assert p2 == pytest.approx((1 + 1 + 0) / (3 * 2))
    assert r2 == pytest.approx((1 / 2 + 1 / 1) / 2)
    # k=3: row0 {0,1,3} -> 2 hits
    p3, r3 = precision_recall_at_k(s, y, 3)
    assert p3 == pytest.approx((2 + 1 + 0) / 9)
    assert r3 == pytest.approx(1.0)


def test_precision_recall_at_k_no_positive_rows():
    p, r = precision_recall_at_k([[0.1, 0.2]], [[0, 0]], 1)
    assert p == 0.0 and math.isnan(r)


@pytest.mark.parametrize("k", [0, 5, -1])
def test_precision_recall_at_k_bad_k(k):
    with pytest.raises(ValueError, match="k must be"):
        precision_recall_at_k(np.zeros((2, 4)), np.zeros((2, 4), dtype=int), k)


# ------------------------------------------------------------------ F1 ----------------------
@pytest.mark.parametrize("seed", range(5))
def test_f1_micro_samples_equal_sklearn(seed):
    rng = np.random.RandomState(seed)
    y = (rng.random_sample((30, 6)) < 0.4).astype(int)
    p = rng.random_sample((30, 6))
    out = f1_scores(p, y, threshold=0.6)
    pred = (p >= 0.6).astype(int)
    assert out["micro"] == pytest.approx(f1_score(y, pred, average="micro", zero_division=0))
    assert out["samples"] == pytest.approx(f1_score(y, pred, average="samples",
                                                    zero_division=0))
    # every class has positives here, so the macro conventions agree
    assert y.any(0).all()
    assert out["macro"] == pytest.approx(f1_score(y, pred, average="macro", zero_division=0))


def test_f1_threshold_inclusive_by_hand():
    # p >= 0.5 is a positive prediction
    out = f1_scores([[0.5, 0.49]], [[1, 1]])
    # tp=1, fn=1, fp=0 -> F1 = 2/3 (micro and samples)
    assert out["micro"] == pytest.approx(2 / 3)
    assert out["samples"] == pytest.approx(2 / 3)


def test_f1_macro_leaves_out_empty_classes():
    out = f1_scores([[0.9, 0.1], [0.8, 0.2]], [[1, 0], [1, 0]])
    assert out["macro"] == pytest.approx(1.0)


# ------------------------------------------------------------------ errors ------------------
@pytest.mark.parametrize("fn", [lambda s, y: mean_average_precision(s, y),
                                lambda s, y: per_class_ap(s, y),
                                lambda s, y: precision_recall_at_k(s, y, 1),
                                lambda s, y: f1_scores(s, y)])
def test_shape_mismatch(fn):
    with pytest.raises(ValueError, match=r"\(3, 2\).*\(3, 3\)"):
        fn(np.zeros((3, 2)), np.zeros((3, 3), dtype=int))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("fn", [lambda s, y: mean_average_precision(s, y),
                                lambda s, y: precision_recall_at_k(s, y, 1),
                                lambda s, y: f1_scores(s, y)])
def test_non_finite_scores(fn, bad):
    s = np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    s[1, 0] = bad
    s[2, 1] = bad
    with pytest.raises(ValueError, match="2 non-finite"):
        fn(s, np.array([[1, 0], [0, 1], [1, 1]]))


def test_bad_targets_named():
    with pytest.raises(ValueError, match=r"row 1"):
        mean_average_precision(np.zeros((2, 2)), [[1, 0], [-1, 0]])


# ------------------------------------------------------- classic example-based metrics --------
from sklearn.metrics import (coverage_error as sk_coverage_error,  # noqa: E402
                             hamming_loss as sk_hamming_loss,
                             label_ranking_average_precision_score, label_ranking_loss)

from spmlkit import metrics as metrics_module  # noqa: E402
from spmlkit.metrics import (METRIC_SETTINGS, METRICS, Metric,  # noqa: E402
                             check_metric, classic_metrics, coverage_error, f1_micro_macro,
                             hamming_loss, higher_is_better,
                             label_ranking_average_precision, metric_score,
                             normalised_coverage, one_error, ranking_loss)


def _random_case(seed: int, ties: bool):
    """Random N x L scores and labels; rows without a positive and all-positive rows occur.
    L >= 2: scikit-learn's ranking metrics take only a multi-label indicator matrix."""
    rng = np.random.RandomState(seed)
    n, L = rng.randint(1, 25), rng.randint(2, 9)
    y = (rng.random_sample((n, L)) < rng.choice([0.1, 0.4, 0.9])).astype(np.uint8)
    s = rng.random_sample((n, L))
    if ties:
        s = np.round(s, 1)
    return s, y


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 10**6), ties=st.booleans())
def test_ranking_metrics_equal_sklearn(seed, ties):
    s, y = _random_case(seed, ties)
    assert label_ranking_average_precision(s, y) == pytest.approx(
        label_ranking_average_precision_score(y, s), rel=1e-12, abs=1e-12)
    assert ranking_loss(s, y) == pytest.approx(label_ranking_loss(y, s), rel=1e-12, abs=1e-12)
    assert coverage_error(s, y) == pytest.approx(sk_coverage_error(y, s), rel=1e-12)
    assert normalised_coverage(s, y) == pytest.approx(
        (sk_coverage_error(y, s) - 1) / y.shape[1], rel=1e-12, abs=1e-12)


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 10**6), threshold=st.sampled_from([0.3, 0.5, 0.7]))
def test_threshold_metrics_equal_sklearn(seed, threshold):
    s, y = _random_case(seed, ties=True)
    pred = (s >= threshold).astype(np.uint8)
    assert hamming_loss(s, y, threshold) == pytest.approx(sk_hamming_loss(y, pred), rel=1e-12)
    micro, macro = f1_micro_macro(s, y, threshold)
    assert micro == pytest.approx(f1_score(y, pred, average="micro", zero_division=0),
                                  rel=1e-12, abs=1e-12)
    want = f1_score(y, pred, average="macro", zero_division=np.nan)
    if np.isnan(want):
        assert np.isnan(macro)
    else:
        assert macro == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_ranking_metrics_by_hand_with_ties():
    # row 0: positives at 0.9 and 0.1, a negative at 0.5 -> LRAP (1/1 + 2/3) / 2 = 5/6;
    #        pairs (0.9 > 0.5 right, 0.1 < 0.5 wrong) -> 1/2; coverage 3
    # row 1: a positive tied with a negative at the top -> LRAP 1/2, ranking loss 1 (a tie is
    #        wrong), coverage 2; one-error: argmax takes column 0 (the negative) -> error
    s = [[0.9, 0.5, 0.1], [0.7, 0.7, 0.0]]
    y = [[1, 0, 1], [0, 1, 0]]
    assert label_ranking_average_precision(s, y) == pytest.approx((5 / 6 + 1 / 2) / 2)
    assert ranking_loss(s, y) == pytest.approx((1 / 2 + 2 / 2 / 2) / 2)
    assert coverage_error(s, y) == pytest.approx(2.5)
    assert normalised_coverage(s, y) == pytest.approx(1.5 / 3)
    assert one_error(s, y) == pytest.approx(0.5)


def test_one_error_by_hand():
    s = np.array([[0.1, 0.8, 0.3], [0.6, 0.2, 0.1], [0.3, 0.3, 0.9], [0.5, 0.5, 0.0]])
    y = np.array([[0, 1, 0], [0, 1, 1], [1, 0, 1], [0, 1, 0]])
    # tops: col 1 (positive), col 0 (negative), col 2 (positive), tie 0/1 -> col 0 (negative)
    assert one_error(s, y) == pytest.approx(2 / 4)
    # reversed: tops col 0 (negative), col 2 (positive), tie 0/1 -> col 0 (positive), col 2
    # (negative)
    assert one_error(-s, y) == pytest.approx(2 / 4)
    assert one_error(-s, 1 - y) == pytest.approx(2 / 4)


def test_rows_without_positives_conventions():
    s = np.array([[0.9, 0.1, 0.2], [0.3, 0.2, 0.1]])
    y = np.array([[0, 1, 0], [0, 0, 0]])  # row 1 has no positive
    # row 0: positive ranked 3rd of 3
    assert label_ranking_average_precision(s, y) == pytest.approx((1 / 3 + 1) / 2)
    assert label_ranking_average_precision(s, y, "exclude") == pytest.approx(1 / 3)
    assert ranking_loss(s, y) == pytest.approx((1 + 0) / 2)
    assert ranking_loss(s, y, "exclude") == pytest.approx(1.0)
    assert coverage_error(s, y) == pytest.approx((3 + 0) / 2)
    assert coverage_error(s, y, "exclude") == pytest.approx(3.0)
    assert one_error(s, y) == pytest.approx(1.0)          # row 1's top cannot be a positive
    assert one_error(s, y, "exclude") == pytest.approx(1.0)
    none = np.zeros((2, 3), np.uint8)
    for fn in (label_ranking_average_precision, ranking_loss, coverage_error, one_error):
        assert math.isnan(fn(s, none, "exclude"))
    assert label_ranking_average_precision(s, none) == 1.0
    assert ranking_loss(s, np.ones((2, 3), np.uint8)) == 0.0  # no negative: no pair
    with pytest.raises(ValueError, match="no_positive"):
        ranking_loss(s, y, "drop")


def test_classic_metrics_and_directions():
    rng = np.random.RandomState(0)
    y = (rng.random_sample((30, 5)) < 0.4).astype(np.uint8)
    y[:, 0] = 1
    y[0] = 0
    s = rng.random_sample((30, 5))
    out = classic_metrics(s, y, threshold=0.6)
    assert set(METRICS) <= set(out)
    assert out["rows_without_positives"] == 1 and out["threshold"] == 0.6
    for name in METRICS:
        assert out[name] == pytest.approx(metric_score(name, s, y, threshold=0.6), nan_ok=True)
    assert out["map"] == pytest.approx(map_score(s, y))
    assert out["hamming_loss"] == pytest.approx(sk_hamming_loss(y, (s >= 0.6).astype(int)))
    # perfect scores: the best value of every metric
    perfect = classic_metrics(y * 0.8 + 0.1, y)
    assert perfect["lrap"] == 1 and perfect["ranking_loss"] == 0
    assert perfect["one_error"] == pytest.approx(1 / 30)  # row 0 has no positive: an error
    assert classic_metrics(y * 0.8 + 0.1, y, no_positive="exclude")["one_error"] == 0
    assert perfect["hamming_loss"] == 0 and perfect["micro_f1"] == 1
    with pytest.raises(ValueError, match="did you mean 'ranking_loss'"):
        check_metric("ranking_los")


# ---- the metric records: a reference value per metric, generated from its record ---------------
def _same(got, want):
    return (np.isnan(want) and np.isnan(got)) or got == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("name", list(METRICS))
def test_every_metric_equals_its_reference(name):
    """Every record's value through metric_score, classic_metrics and its own function equals
    its scikit-learn counterpart (30 random cases with ties, rows without a positive and
    all-positive rows; thresholded metrics on the 0/1 predictions at 0.5), or its example
    computed by hand."""
    m = METRICS[name]
    default = METRIC_SETTINGS.get(m.takes)
    cases = [m.example] if m.example is not None else []
    for seed in range(30 if m.sklearn is not None else 0):
        s, y = _random_case(seed, ties=bool(seed % 2))
        x = (s >= 0.5).astype(np.uint8) if m.needs_threshold else s
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scikit-learn's undefined-value warnings
            cases.append((s, y, m.sklearn(y, x)))
    defined = 0
    for probs, y, want in cases:
        for got in (metric_score(name, probs, y), classic_metrics(probs, y)[name],
                    m.fn(probs, y, default)):
            assert _same(got, want), (name, got, want)
        defined += not np.isnan(want)
    assert defined > len(cases) // 2  # the comparison is not NaN against NaN


@pytest.mark.parametrize("name", list(METRICS))
def test_every_record_says_its_direction_and_whether_it_is_thresholded(name):
    """The selection direction is the record's, and the values agree with it (the perfect
    ranking beats the reversed one in that direction); only a thresholded record's value moves
    with the threshold. (Both were hand lists of names, which a new record fell out of.)"""
    m = METRICS[name]
    assert higher_is_better(name) is m.higher_is_better
    rng = np.random.RandomState(4)
    while True:  # every row and class with a positive and a negative; more labels than top-k's
        y = (rng.random_sample((12, 8)) < 0.4).astype(np.uint8)
        if all(y.any(axis=a).all() and (y == 0).any(axis=a).all() for a in (0, 1)):
            break
    perfect, reversed_ = (metric_score(name, v * 0.8 + 0.1, y) for v in (y, 1 - y))
    assert (perfect > reversed_) if m.higher_is_better else (perfect < reversed_)
    s, y = _random_case(3, ties=False)
    moved = metric_score(name, s, y, threshold=0.9) != metric_score(name, s, y, threshold=0.1)
    assert moved is m.needs_threshold


@pytest.fixture
def scratch_metrics():
    """`METRICS` as it was before the test, whatever the test registers."""
    saved = dict(METRICS)
    yield METRICS
    METRICS.clear()
    METRICS.update(saved)


def test_registering_one_record_reaches_metric_score_tables_and_cli(scratch_metrics, capsys):
    def top_is_positive(probs, y, no_positive):
        s, y = metrics_module.ap._as_scores(probs, y)
        return float((y[np.arange(len(y)), s.argmax(axis=1)] > 0).mean())

    metrics_module.register_metric(Metric(
        "top_hit", top_is_positive, True, 3, "share of rows whose top label is a positive",
        "no_positive", example=([[0.9, 0.1], [0.2, 0.7]], [[1, 0], [1, 0]], 0.5)))
    assert metric_score("top_hit", [[0.9, 0.1], [0.2, 0.7]], [[1, 0], [1, 0]]) == 0.5
    assert classic_metrics([[0.9, 0.1]], [[1, 0]])["top_hit"] == 1.0
    from spmlkit.cli import main
    assert main(["list", "metrics"]) == 0
    assert "top_hit" in capsys.readouterr().out
    for bad, match in ((Metric("map", map_score, True, 2, "again", "convention",
                               example=([[1.0]], [[1]], 100.0)), "registered twice"),
                       (Metric("x", map_score, True, 2, "x", "cutoff", example=((), (), 0)),
                        "takes='cutoff'"),
                       (Metric("y", map_score, True, 2, "y", "convention"),
                        "needs a reference value")):
        with pytest.raises(ValueError, match=match):
            metrics_module.register_metric(bad)


def test_a_record_without_a_partial_rule_is_refused_by_name_on_partial_labels(scratch_metrics,
                                                                              capsys):
    """A record registered as the metric page's first version did (no ``partial`` rule) made
    every run with partial val / test labels fail with a KeyError; it is refused by name, and
    with a rule it is scored."""
    from spmlkit.metrics import classic_metrics, partial_labels

    def top_hit(probs, y, no_positive="sklearn"):
        p, y = np.asarray(probs, dtype=float), np.asarray(y)
        return float((y[np.arange(len(y)), p.argmax(axis=1)] > 0).mean())

    case = dict(takes="no_positive", example=([[0.9, 0.1], [0.2, 0.7]], [[1, 0], [1, 0]], 0.5))
    metrics_module.register_metric(Metric("top_hit", top_hit, True, 4, "top is a positive",
                                          **case))
    s = np.array([[0.9, 0.95, 0.1], [0.2, 0.7, 0.6], [0.3, 0.1, 0.8]])
    y = partial_labels([[1, 0, -1], [1, -1, -1], [0, -1, 1]])  # 0.95 unknown: row 0's top
    got = classic_metrics(s, y)
    assert "top_hit" not in got and "map" in got
    assert got["not_scored"] == {"top_hit": metrics_module.partial_refusal("top_hit")}
    with pytest.raises(ValueError, match="metric 'top_hit' does not score partial labels: its "
                                         "record gives no rule"):
        metric_score("top_hit", s, y)
    assert metric_score("top_hit", s, partial_labels(y, "row")) == 0.0  # full row 1: a miss
    del METRICS["top_hit"]
    metrics_module.register_metric(Metric("top_hit", top_hit, True, 4, "top is a positive",
                                          partial="per_row", **case))
    assert metric_score("top_hit", s, y) == classic_metrics(s, y)["top_hit"] == 2 / 3
    with pytest.raises(ValueError, match="partial='rows'; one of per_class, per_row"):
        metrics_module.register_metric(Metric("x", top_hit, True, 4, "x", partial="rows",
                                              **case))


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1 << 21])
def test_global_threshold_swept_in_blocks_is_the_highest_of_the_best(block, monkeypatch):
    """The blockwise sweep (SWEEP_ENTRIES scores at a time, from the top) picks what one sweep
    over every distinct score picks: the best micro-F1 and, among thresholds tying on it, the
    highest. Tied F1s across blocks occur with few distinct scores; scores tie within and
    across block edges."""
    from spmlkit.metrics import thresholds as M

    monkeypatch.setattr(M, "SWEEP_ENTRIES", block)
    rng = np.random.RandomState(0)  # the same cases for every block size
    ties = 0
    for _ in range(40):
        s = np.round(rng.random_sample((rng.randint(2, 12), 3)), 1)
        y = (rng.random_sample(s.shape) < 0.4).astype(np.uint8)
        if not y.any():
            continue
        values, f1 = M._f1_sweep(s, y)  # highest threshold first
        best = np.flatnonzero(f1 == f1.max())
        ties += len(best) > 1
        assert M.best_global_threshold(s, y) == (float(values[best[0]]), float(f1.max()))
    assert ties  # the tie rule was exercised


def test_micro_ap_pools_every_entry_in_the_memory_of_one_sorted_copy():
    """The micro AP equals scikit-learn's (ties included) and holds no N x L temporaries of 8
    bytes: its traced peak stays within 3 copies of float32 scores (the cumulative arrays of a
    one-column AP took 14; on a 1M-row store's val split that was 1.3 GB)."""
    import tracemalloc

    from sklearn.metrics import average_precision_score

    from spmlkit.metrics import micro_average_precision

    rng = np.random.default_rng(3)
    for ties in (False, True):
        s = rng.random((300, 7)).astype(np.float32)
        if ties:
            s = np.round(s * 5) / 5
        y = (rng.random((300, 7)) < 0.25).astype(np.uint8)
        assert micro_average_precision(s, y) == pytest.approx(
            100 * average_precision_score(y.ravel(), s.ravel()), abs=1e-10)
    s = rng.random((2000, 500)).astype(np.float32)
    y = (rng.random((2000, 500)) < 0.05).astype(np.uint8)
    tracemalloc.start()
    try:
        micro_average_precision(s, y)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * s.nbytes, f"peak {peak / 2**20:.1f} MiB for {s.nbytes / 2**20:.1f} MiB"
