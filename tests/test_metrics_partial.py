"""Masked metrics of partial evaluation labels (1 / -1 known, 0 / NaN unknown), against
torchmetrics' ``ignore_index`` multilabel metrics and scikit-learn where both are defined."""
import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from spmlkit.metrics import (METRICS, classes_without_negatives, classic_metrics, evaluate,
                             map_score, masked_metrics, metric_score, micro_average_precision,
                             ndcg_at_k, partial_labels, per_class_ap, rprecision_at_k,
                             select_thresholds, weighted_average_precision)

tm = pytest.importorskip("torchmetrics.functional.classification")


def _random_partial(seed, n=60, classes=7, unknown=0.35):
    rng = np.random.default_rng(seed)
    scores = rng.random((n, classes))
    scores[:, 0] = np.round(scores[:, 0], 1)  # ties
    y = np.where(rng.random((n, classes)) < 0.3, 1, -1)
    y[rng.random((n, classes)) < unknown] = 0
    return scores, y


def _torchmetrics_target(y):
    """Ours (1 / -1 / 0 unknown) as torchmetrics': 1 / 0, unknown = ignore_index -1."""
    return torch.from_numpy(np.where(y == 1, 1, np.where(y == -1, 0, -1)))


@pytest.mark.parametrize("seed", range(5))
def test_masked_ap_matches_torchmetrics_ignore_index(seed):
    scores, y = _random_partial(seed)
    ours = per_class_ap(scores, partial_labels(y))
    theirs = tm.multilabel_average_precision(torch.from_numpy(scores), _torchmetrics_target(y),
                                             num_labels=y.shape[1], average=None,
                                             ignore_index=-1).numpy() * 100
    defined = ~np.isnan(ours)
    assert defined.sum() == y.shape[1]
    np.testing.assert_allclose(ours[defined], theirs[defined], rtol=1e-6)
    macro = tm.multilabel_average_precision(torch.from_numpy(scores), _torchmetrics_target(y),
                                            num_labels=y.shape[1], average="macro",
                                            ignore_index=-1).item() * 100
    assert map_score(scores, partial_labels(y)) == pytest.approx(macro, rel=1e-6)
    micro = tm.multilabel_average_precision(torch.from_numpy(scores), _torchmetrics_target(y),
                                            num_labels=y.shape[1], average="micro",
                                            ignore_index=-1).item() * 100
    assert micro_average_precision(scores, partial_labels(y)) == pytest.approx(micro, rel=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_masked_f1_and_hamming_match_torchmetrics(seed):
    scores, y = _random_partial(seed)
    m = masked_metrics(scores, partial_labels(y), threshold=0.55)
    p, t = torch.from_numpy(scores), _torchmetrics_target(y)
    kw = dict(num_labels=y.shape[1], threshold=0.55, ignore_index=-1)
    assert m["micro_f1"] == pytest.approx(tm.multilabel_f1_score(p, t, average="micro",
                                                                  **kw).item(), rel=1e-6)
    assert m["macro_f1"] == pytest.approx(tm.multilabel_f1_score(p, t, average="macro",
                                                                  **kw).item(), rel=1e-6)
    assert m["hamming_loss"] == pytest.approx(tm.multilabel_hamming_distance(
        p, t, average="micro", **kw).item(), rel=1e-6)


def test_entry_mask_differs_from_scoring_unknowns_as_negatives():
    """The issue's trap: unknowns scored as negatives lower mAP; the mask does not."""
    scores, y = _random_partial(0)
    as_negatives = map_score(scores, (y == 1).astype(np.uint8))
    assert map_score(scores, partial_labels(y)) != pytest.approx(as_negatives)


def test_full_labels_as_partial_equal_the_ordinary_metrics():
    rng = np.random.default_rng(3)
    scores, full = rng.random((40, 5)), (rng.random((40, 5)) < 0.4).astype(np.uint8)
    part = partial_labels(np.where(full == 1, 1, -1))
    plain = classic_metrics(scores, full, threshold=0.5, no_positive="exclude")
    masked = masked_metrics(scores, part, threshold=0.5)
    for name in METRICS:
        assert masked[name] == pytest.approx(plain[name]), name
    assert weighted_average_precision(scores, full) == pytest.approx(
        average_precision_score(full, scores, average="weighted") * 100)
    assert micro_average_precision(scores, full) == pytest.approx(
        average_precision_score(full, scores, average="micro") * 100)


def test_row_mask_scores_the_fully_known_rows_only():
    scores, y = _random_partial(1, n=80, unknown=0.05)
    rows = (y != 0).all(axis=1)
    got = masked_metrics(scores, partial_labels(y, mask="row"))
    want = classic_metrics(scores[rows], (y[rows] == 1).astype(np.uint8))
    assert got["rows_scored"] == rows.sum() > 0
    assert got["map"] == pytest.approx(want["map"])
    assert evaluate(scores, partial_labels(y, mask="row"))["map"] == pytest.approx(want["map"])


def test_hand_computed_masked_ap_and_classes_without_a_known_positive():
    # class 0: known rows 0, 1, 3 (scores .9 +, .8 -, .1 +): AP = (1 + 2/3) / 2
    y = partial_labels([[1, -1], [-1, 0], [0, -1], [1, -1]])
    s = [[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.1, 0.4]]
    ap = per_class_ap(s, y)
    assert ap[0] == pytest.approx(100 * (1 + 2 / 3) / 2) and np.isnan(ap[1])
    assert map_score(s, y) == pytest.approx(ap[0])
    assert map_score(s, y, "official") == pytest.approx(ap[0] / 2)


def test_nan_is_unknown_and_bad_values_are_refused():
    y = partial_labels(np.array([[1.0, np.nan], [-1.0, 1.0], [np.nan, -1.0]]))
    assert y.tolist() == [[1, 0], [-1, 1], [0, -1]]
    with pytest.raises(ValueError, match="no known negative"):
        partial_labels([[1, 0], [0, 1]])
    with pytest.raises(ValueError, match=r"found \[2.0\] \(first at row 1\)"):
        partial_labels([[1, -1], [2, 0]])
    with pytest.raises(ValueError, match="mask must be one of"):
        partial_labels([[1, -1]], mask="rows")


def test_thresholds_chosen_on_the_known_entries():
    y = partial_labels([[1, -1], [0, 1], [-1, 0], [1, -1]])
    s = np.array([[0.9, 0.2], [0.05, 0.6], [0.3, 0.99], [0.5, 0.1]])
    chosen = select_thresholds(s, y)
    assert chosen["per_class"] == [0.5, 0.6]  # the unknown 0.05 / 0.99 do not count
    assert chosen["known_entries"] == 0.75


def test_ndcg_and_rp_by_hand():
    s, y = [[0.9, 0.8, 0.1, 0.7]], [[0, 1, 1, 0]]
    ideal = 1 + 1 / np.log2(3)
    assert ndcg_at_k(s, y, 2) == pytest.approx((1 / np.log2(3)) / ideal)
    assert ndcg_at_k(s, y, 4) == pytest.approx((1 / np.log2(3) + 1 / np.log2(5)) / ideal)
    assert rprecision_at_k(s, y, 1) == 0.0 and rprecision_at_k(s, y, 3) == 0.5


@pytest.mark.parametrize("k", [1, 3, 5])
def test_ndcg_equals_scikit_learn_where_no_scores_tie(k):
    """Rows without a positive score 0 by default, as in scikit-learn's ndcg_score; with
    ``"exclude"`` they are left out (LibMultiLabel)."""
    from sklearn.metrics import ndcg_score

    rng = np.random.default_rng(k)
    s, y = rng.random((50, 7)), (rng.random((50, 7)) < 0.3).astype(np.uint8)
    y[:4] = 0
    assert ndcg_at_k(s, y, k) == pytest.approx(ndcg_score(y, s, k=k), rel=1e-12)
    has = y.any(axis=1)
    assert ndcg_at_k(s, y, k, "exclude") == pytest.approx(ndcg_score(y[has], s[has], k=k))
    assert rprecision_at_k(s, y, k) == pytest.approx(rprecision_at_k(s, y, k, "exclude")
                                                     * has.mean())


def test_top_k_of_partial_labels_ranks_the_known_labels_only():
    """An unknown label scored on top is skipped; the known ones rank as full labels of the
    known columns; masked_metrics reports the same (rows without a known positive left out)."""
    s = np.array([[0.95, 0.9, 0.8, 0.1], [0.99, 0.2, 0.6, 0.7], [0.5, 0.4, 0.3, 0.2]])
    y = partial_labels([[0, -1, 1, 1], [0, 1, -1, 1], [0, -1, -1, -1]])
    known = s[:2, 1:], (np.asarray(y)[:2, 1:] == 1).astype(np.uint8)
    for k in (1, 2, 3):
        assert ndcg_at_k(s, y, k, "exclude") == pytest.approx(ndcg_at_k(*known, k))
        assert rprecision_at_k(s, y, k, "exclude") == pytest.approx(rprecision_at_k(*known, k))
        assert ndcg_at_k(s, y, k) == pytest.approx(ndcg_at_k(*known, k) * 2 / 3)
    m = masked_metrics(s, y)
    assert m["ndcg@3"] == pytest.approx(ndcg_at_k(*known, 3))
    assert m["rp@5"] == pytest.approx(rprecision_at_k(*known, 3))  # k = 5 > L ranks all four
    assert m["micro_ap"] == pytest.approx(micro_average_precision(s, y))
    assert m["weighted_ap"] == pytest.approx(weighted_average_precision(s, y))
    with pytest.raises(ValueError, match=r"k must be in 1..4"):
        ndcg_at_k(s, y, 5)


def test_partial_labels_keep_their_mask_through_indexing_and_pickling():
    import pickle

    y = partial_labels([[1, -1], [0, 1]], mask="row")
    for copy in (y[[1]], y[:1], pickle.loads(pickle.dumps(y))):
        assert copy.mask == "row" and isinstance(copy, type(y))


def test_masked_metrics_go_by_blocks_of_rows_with_the_same_numbers(monkeypatch):
    """The masked ranking and top-k metrics made N x L masked copies and int64 ranks of the
    whole split (1.5 GB at 4,000 x 5,000: +344 MiB now); they go by blocks of rows, each row
    ranked on its own, so the numbers are the same whatever the block (AP's blocks of columns:
    up to summation order)."""
    from spmlkit.metrics import ap

    rng = np.random.default_rng(1)
    s = rng.random((57, 23))
    y = np.zeros((57, 23))
    r = rng.random((57, 23))
    y[r < 0.15] = 1
    y[(r > 0.15) & (r < 0.4)] = -1
    y[3] = 0  # a row without a known label
    labels = partial_labels(y)
    whole = masked_metrics(s, labels, threshold=0.5)
    monkeypatch.setattr(ap, "BLOCK_ENTRIES", 50)  # 2 rows a block
    blocks = masked_metrics(s, labels, threshold=0.5)
    assert blocks.pop("mask") == whole.pop("mask") and blocks.keys() == whole.keys()
    for key, value in whole.items():  # (AP goes by blocks of columns: summation order)
        assert blocks[key] == pytest.approx(value, rel=1e-12, nan_ok=True), key


def test_partial_labels_are_read_from_frames_masked_arrays_and_plain_arrays():
    """A DataFrame (nullable columns with pd.NA too) and a masked array are read like the
    ndarray; the metrics that take full or partial labels read a plain -1 / 0 / 1 array as
    partial (it used to be refused as full labels, and a DataFrame's .mask method was taken
    for the mask)."""
    pd = pytest.importorskip("pandas")
    scores, y = _random_partial(5)
    wrapped = partial_labels(y)
    expected = masked_metrics(scores, wrapped)
    frame = pd.DataFrame(y, columns=[f"c{j}" for j in range(y.shape[1])])
    assert masked_metrics(scores, frame) == expected
    nullable = frame.astype("Int64").mask(frame == 0)          # unknown as pd.NA
    assert masked_metrics(scores, nullable) == expected
    hidden = np.ma.masked_array(np.where(y == 0, 1, y), mask=(y == 0))  # masked: unknown
    assert masked_metrics(scores, hidden) == expected
    assert np.array_equal(partial_labels(hidden), wrapped)
    for fn in (micro_average_precision, weighted_average_precision):
        assert fn(scores, y) == fn(scores, wrapped) == expected[fn.__name__.replace(
            "_average_precision", "_ap")]
    for fn in (ndcg_at_k, rprecision_at_k):
        assert fn(scores, y, 3) == fn(scores, wrapped, 3)
    full = (y == 1).astype(np.uint8)                             # 0 / 1: full labels, as before
    assert micro_average_precision(scores, full) == average_precision_score(
        full.ravel(), scores.ravel()) * 100
    with pytest.raises(ValueError, match="column 'c0' holds category"):
        partial_labels(frame.astype("category"))


@pytest.mark.parametrize("mask", ["entry", "row"])
def test_a_class_with_positives_and_no_known_negative_is_left_out_of_the_map(mask):
    # class 0: two known positives, no known negative: AP 100 whatever the scores (it raised
    # the test mAP without a word); class 1 is scored as usual
    y = partial_labels([[1, 1], [1, -1], [0, -1]], mask)
    s = np.array([[0.1, 0.2], [0.2, 0.9], [0.3, 0.4]])  # class 1: the positive ranks last
    assert per_class_ap(s, y)[0] == 100.0
    want = per_class_ap(s, y)[1]
    assert want < 100.0
    assert classes_without_negatives(y) == [0]
    assert map_score(s, y) == pytest.approx(want)
    assert masked_metrics(s, y)["map"] == pytest.approx(want)
    assert masked_metrics(s, y)["weighted_ap"] == pytest.approx(want)
    assert map_score(s, y, "official") == pytest.approx(want)
    got = evaluate(s, y)
    assert got["map"] == pytest.approx(want) and got["classes_without_negatives"] == [0]


# ---- every record on partial labels, as its rule says (generated from METRICS) -----------------
def _full_case(seed, n=30, classes=6):
    """Scores (ties) and full labels where every row and every class holds a positive and a
    negative."""
    rng = np.random.default_rng(seed)
    while True:
        y = (rng.random((n, classes)) < 0.35).astype(np.uint8)
        if all(y.any(axis=a).all() and (y == 0).any(axis=a).all() for a in (0, 1)):
            return np.round(rng.random((n, classes)), 2), y


def _same(got, want):
    return got == pytest.approx(want, rel=1e-12, abs=1e-12, nan_ok=True)


@pytest.mark.parametrize("name", list(METRICS))
def test_every_metric_scores_partial_labels_as_its_record_says(name):
    """A record's rule (``partial``) is what scores it on partial labels: all entries known is
    the full-label value; rows with nothing known are left out; whole classes unknown are the
    full-label value of the other classes (a row's known labels, a class's known rows, the known
    entries pooled), the fully known rows for ``full_rows``; the scores of unknown entries move
    nothing. A record without a rule is refused by name, and scored on the fully known rows of
    mask ``"row"``. (A metric registered without a ``partial`` rule failed every partial-label
    run with a KeyError.)"""
    rule = METRICS[name].partial
    s, y = _full_case(0)
    signed = np.where(y == 1, 1, -1)
    rows = signed.copy()
    rows[:8] = 0                                            # rows with nothing known
    cols = signed.copy()
    cols[:, :2] = 0                                         # classes known nowhere
    mixed = np.where(np.random.default_rng(1).random(y.shape) < 0.3, 0, signed)

    def partial(labels, scores=s, mask="entry"):  # as a run selects: at the val-chosen threshold
        return metric_score(name, scores, partial_labels(labels, mask), threshold="chosen")

    def full(scores, labels):
        return metric_score(name, scores, labels, no_positive="exclude", threshold="chosen")

    if rule is None:
        with pytest.raises(ValueError, match=f"metric '{name}' does not score partial labels"):
            partial(mixed)
        got = classic_metrics(s, partial_labels(mixed))
        assert name not in got and name in got["not_scored"][name]
        known = (mixed != 0).all(axis=1)
        assert _same(partial(mixed, mask="row"), metric_score(name, s[known], y[known],
                                                              threshold="chosen"))
        return
    assert _same(partial(signed), full(s, y))
    assert _same(partial(rows), full(s[8:], y[8:]))
    noise = np.where(mixed == 0, np.random.default_rng(2).random(s.shape), s)
    assert _same(partial(mixed, noise), partial(mixed))
    if rule == "full_rows":
        known = (mixed != 0).all(axis=1)
        assert _same(partial(mixed), full(s[known], y[known]))
    else:
        assert _same(partial(cols), full(s[:, 2:], y[:, 2:]))
