"""Multi-label metrics with explicit edge cases.

mAP is the mean over classes of non-interpolated average precision (scikit-learn's
``average_precision_score``), times 100. A class without any positive has no AP: by default it is
left out of the mean and reported (``MAPResult.missing``); ``convention="official"`` scores it 0
and keeps it in the mean, as the official code does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .labels import validate_full_labels


def _as_scores(scores, y, keep_float32: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Validated scores (float64; float32 ones kept as they are with ``keep_float32``, where
    only their order and distinct values matter: no float64 copy of a large split) and labels."""
    s = np.asarray(scores)
    if not (keep_float32 and s.dtype == np.float32):
        s = s.astype(np.float64, copy=False)
    y = validate_full_labels(y, "metrics targets", copy=False)  # read only: not copied
    if s.shape != y.shape:
        raise ValueError(f"scores {s.shape} and labels {y.shape} must have the same shape")
    step = max(1, BLOCK_ENTRIES // max(1, int(np.prod(s.shape[1:]))))  # blocks of rows
    if not all(np.isfinite(s[i:i + step]).all() for i in range(0, len(s), step)):
        raise ValueError(f"scores hold {int((~np.isfinite(s)).sum())} non-finite value(s)")
    return s, y


def average_precision(scores, targets) -> float:
    """AP of one class: sum over distinct thresholds of (R_n - R_{n-1}) * P_n (ties grouped).

    Returns NaN when ``targets`` has no positive.

    >>> average_precision([0.9, 0.8, 0.1], [1, 0, 1])
    0.8333333333333333
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    t = np.asarray(targets).ravel()
    if s.shape != t.shape:
        raise ValueError(f"average_precision: {s.size} scores for {t.size} targets")
    if not np.isfinite(s).all():
        raise ValueError(f"average_precision: {int((~np.isfinite(s)).sum())} non-finite score(s)")
    t = t.astype(bool)
    if not t.any():
        return float("nan")
    return float(_columns_ap(s[None], t[None])[0])


#: entries of the N x L scores handled at once by the metrics (blocks of columns for AP, of rows
#: for the ranking metrics): their temporaries stay within some tens of MiB however many rows
BLOCK_ENTRIES = 1 << 20


def per_class_ap(scores, y) -> np.ndarray:
    """AP (x100) of every class; NaN where a class has no positive: `average_precision`
    of every column at once (one sort of all columns, in blocks of columns of at most
    `BLOCK_ENTRIES` entries, then `ranked_ap`; equal to it up to summation order).

    ``scores`` N x L, or R x N x L: R runs' scores against the same labels ``y`` (N x L);
    returns R x L then, each run's row equal to its own ``per_class_ap`` bit for bit (what
    the stacked linear engine scores every epoch).
    """
    if np.ndim(scores) == 3:
        s = np.asarray(scores)
        runs, n, classes = s.shape
        y = validate_full_labels(y, "metrics targets", copy=False)
        if y.shape != (n, classes):
            raise ValueError(f"scores {s.shape} (runs x rows x classes) and labels {y.shape} "
                             f"must have the same rows and classes")
        if not np.isfinite(s).all():
            raise ValueError(f"scores hold {int((~np.isfinite(s)).sum())} non-finite value(s)")
        if n == 0:
            return np.full((runs, classes), np.nan)
        # runs at once (one class: one run, summed as its own per_class_ap, see ranked_ap)
        per = 1 if classes == 1 else max(1, BLOCK_ENTRIES // (n * classes))
        return np.concatenate([_columns_ap(s[r:r + per].transpose(0, 2, 1), y.T)
                               for r in range(0, runs, per)]) * 100.0
    # float32 scores (a run's probabilities) are sorted as they are: only their order and ties
    # count, the same as a float64 copy's (no such copy of a large split; a faster sort)
    s, y = _as_scores(scores, y, keep_float32=True)
    n, classes = s.shape
    if n == 0:
        return np.full(classes, np.nan)
    step = max(1, BLOCK_ENTRIES // n)
    return np.concatenate([_columns_ap(s[:, j:j + step].T, y[:, j:j + step].T)
                           for j in range(0, classes, step)]) * 100.0


def _columns_ap(s: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`ranked_ap` of validated scores ``s`` (... x K x N: a column's N scores along the
    last axis) and labels ``y`` (K x N), every column from one sort (each temporary let go
    once used: a block of a large split stays within ~40 bytes an entry)."""
    s = np.ascontiguousarray(s)  # (the sort and everything after: along contiguous rows)
    order = np.argsort(-s, axis=-1)  # tied scores are grouped: their order does not matter
    s = np.take_along_axis(s, order, axis=-1)
    hits = np.take_along_axis(np.broadcast_to(y > 0, order.shape), order, axis=-1)
    del order
    end = np.ones_like(s, dtype=bool)  # the last entry of every group of tied scores
    end[..., :-1] = s[..., 1:] != s[..., :-1]
    del s
    return ranked_ap(hits, end)


def ranked_ap(hits: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The AP core (a fraction, NaN for a column without positive) of every column of ``hits``
    (... x N, whether each entry is a positive), its entries along the last axis in descending
    order of the column's scores; ``end`` (same shape) marks the last entry of every group of
    tied scores: AP = sum over groups of (R_g - R_{g-1}) * P_g at the group's end
    (`average_precision`), summed in rank order. Every AP of spmlkit comes from here
    (`average_precision` and `per_class_ap` sort with numpy; the stacked linear
    engine on a GPU sorts there, `spmlkit.engine.vectorised.stacked_val_map`)."""
    n = hits.shape[-1]
    # the counts in integers (exact, and a faster cumulative sum than into float64)
    count = np.cumsum(hits, axis=-1, dtype=np.intp)
    # at each group's end: the recall gained since the previous end times the precision there
    at_end = np.where(end, count, 0)
    np.maximum.accumulate(at_end, axis=-1, out=at_end)
    gain = np.zeros_like(count)  # tp at the previous group's end, then the group's positives
    gain[..., 1:] = at_end[..., :-1]
    del at_end
    np.subtract(count, gain, out=gain)
    tp = count.astype(np.float64)
    del count
    gain = gain.astype(np.float64)
    gain *= tp / np.arange(1, n + 1, dtype=np.float64)
    gain = np.where(end, gain, 0.0)
    # summed one by one in rank order, as numpy sums the rows of an N x K matrix (the layout
    # before; the same numbers to the last bit); one column alone: numpy's pairwise sum, as
    # it summed an N x 1 matrix
    total = gain.sum(axis=-1) if gain.size == n else np.cumsum(gain, axis=-1, out=gain)[..., -1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tp[..., -1] > 0, total / tp[..., -1], np.nan)


@dataclass
class MAPResult:
    value: float
    per_class: np.ndarray
    missing: list = field(default_factory=list)  # classes with no positive
    convention: str = "present"

    def __float__(self) -> float:
        return self.value


def mean_average_precision(scores, y, convention: str = "present") -> MAPResult:
    """mAP x100.

    Args:
        convention: ``"present"`` (default) averages over classes with at least one positive and
            lists the others in ``missing``; ``"official"`` scores them 0 and averages over all.

    >>> float(mean_average_precision([[0.9, 0.2], [0.1, 0.3]], [[1, 0], [0, 0]]))
    100.0
    """
    check_convention(convention)
    ap = per_class_ap(scores, y)
    missing = np.flatnonzero(np.isnan(ap)).tolist()
    return MAPResult(map_from_ap(ap, convention), ap, missing, convention)


def check_convention(convention: str) -> None:
    """Refuse a mAP convention other than ``"present"`` and ``"official"``."""
    if convention not in ("present", "official"):
        raise ValueError(f"convention must be 'present' or 'official', got {convention!r}")


def map_from_ap(ap: np.ndarray, convention: str = "present") -> float:
    """mAP x100 from per-class AP (`per_class_ap`, NaN for a class without positive):
    ``"present"`` averages the classes with positives (NaN when none has one), ``"official"``
    scores the others 0 and averages all."""
    check_convention(convention)
    if convention == "official":
        return float(np.nan_to_num(ap, nan=0.0).mean())
    return float(np.nanmean(ap)) if not np.isnan(ap).all() else float("nan")


def map_score(scores, y, convention: str = "present") -> float:
    """mAP x100 as a float (see `mean_average_precision`)."""
    return mean_average_precision(scores, y, convention).value


def precision_recall_at_k(scores, y, k: int) -> tuple[float, float]:
    """P@k and R@k, averaged over rows (rows without positives left out of R@k)."""
    s, y = _as_scores(scores, y)
    if not 1 <= k <= s.shape[1]:
        raise ValueError(f"k must be in 1..{s.shape[1]}, got {k}")
    top = np.argsort(-s, axis=1, kind="mergesort")[:, :k]
    hits = np.take_along_axis(y, top, axis=1).sum(axis=1)
    n_pos = y.sum(axis=1)
    has = n_pos > 0
    recall = float((hits[has] / n_pos[has]).mean()) if has.any() else float("nan")
    return float(hits.mean() / k), recall


def f1_scores(probs, y, threshold: float = 0.5) -> dict:
    """Micro, macro (over classes with positives or predictions; a class with neither has no F1
    and is left out) and sample-averaged F1."""
    from sklearn.metrics import f1_score

    p, y = _as_scores(probs, y)
    pred = (p >= threshold).astype(np.uint8)
    return {
        "micro": float(f1_score(y, pred, average="micro", zero_division=0)),
        "macro": float(f1_score(y, pred, average="macro", zero_division=np.nan)),
        "samples": float(f1_score(y, pred, average="samples", zero_division=0)),
    }


def evaluate(scores, y, convention: str = "present") -> dict:
    """The standard report of one split: mAP, the classes left out, P@1, P@3, R@3."""
    res = mean_average_precision(scores, y, convention)
    out = {"map": res.value, "classes_without_positives": res.missing}
    for k in (1, 3):
        if k <= np.shape(y)[1]:
            p, r = precision_recall_at_k(scores, y, k)
            out[f"p@{k}"], out[f"r@{k}"] = p, r
    return out


# ---- the classic example-based multi-label metrics ---------------------------------------------
#: the one threshold policy of a run's thresholded numbers (F1s, Hamming loss): at every epoch
#: and in the result, the global threshold that maximises micro-F1 on the val split
#: (`best_global_threshold`), the threshold ``spml predict`` applies by default
THRESHOLD_POLICY = "the global threshold chosen on val (max val micro-F1), as spml predict uses"
#: what rows without any positive do in the example-based ranking metrics
NO_POSITIVE = ("sklearn", "exclude")


def _count_at_least(s: np.ndarray) -> np.ndarray:
    """Per entry (i, j): ``|{k: s_ik >= s_ij}|`` (``scipy.stats.rankdata(-s, "max", axis=1)``),
    from one sort of every row."""
    order = np.argsort(-s, axis=1)  # tied scores are grouped: their order does not matter
    ss = np.take_along_axis(s, order, axis=1)
    width = s.shape[1]
    ends = np.ones_like(ss, dtype=bool)  # the last position of every group of tied scores
    ends[:, :-1] = ss[:, 1:] != ss[:, :-1]
    at = np.where(ends, np.arange(width), width)  # a position's group ends at the next end
    last = np.minimum.accumulate(at[:, ::-1], axis=1)[:, ::-1]
    out = np.empty(s.shape, dtype=np.int64)
    np.put_along_axis(out, order, last + 1, axis=1)
    return out


def _ranks(s: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per entry (i, j): ``|{k: s_ik >= s_ij}|`` (rank among all labels, ties counted against
    the entry) and ``|{k positive: s_ik >= s_ij}|`` (meaningful on the positives only)."""
    return _count_at_least(s), _count_at_least(np.where(y > 0, s, -np.inf))


def _row_mean(values: np.ndarray, defined: np.ndarray, fill: float, no_positive: str) -> float:
    """Mean over rows: rows not ``defined`` count as ``fill`` (``"sklearn"``) or are left out
    (``"exclude"``; NaN when no row is left)."""
    if no_positive not in NO_POSITIVE:
        raise ValueError(f"no_positive must be one of {NO_POSITIVE}, got {no_positive!r}")
    if no_positive == "sklearn":
        return float(np.where(defined, values, fill).mean()) if values.size else float("nan")
    return float(values[defined].mean()) if defined.any() else float("nan")


def _ranking_rows(s, y, n_pos, n_neg) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: LRAP, ranking loss and coverage (undefined rows NaN or inf, masked by the
    caller), from one computation of the ranks."""
    rank_all, rank_pos = _ranks(s, y)
    positive = y > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        lrap = np.where(positive, rank_pos / rank_all, 0.0).sum(axis=1) / n_pos
        # negatives scored >= a positive j: all labels >= s_j minus the positives >= s_j
        wrong = np.where(positive, rank_all - rank_pos, 0).sum(axis=1) / (n_pos * n_neg)
    cover = np.where(positive, rank_all, 0).max(axis=1).astype(np.float64)
    return lrap, wrong, cover


def _ranking_metrics(s: np.ndarray, y: np.ndarray, no_positive: str) -> dict:
    """LRAP, ranking loss, coverage error and normalised coverage of validated scores and labels
    (`_as_scores`), from one computation of the ranks (the definitions, ties and rows
    without a positive are those of the public functions below)."""
    num_labels = y.shape[1] if y.ndim == 2 else 1
    if s.size == 0:
        nan = float("nan")
        return {"lrap": nan, "ranking_loss": nan, "coverage": nan, "coverage_norm": nan}
    n_pos = y.sum(axis=1, dtype=np.int64)
    n_neg = y.shape[1] - n_pos
    step = max(1, BLOCK_ENTRIES // num_labels)  # per-row values, from blocks of rows
    lrap, wrong, cover = (np.concatenate(v) for v in zip(*(
        _ranking_rows(s[i:i + step], y[i:i + step], n_pos[i:i + step], n_neg[i:i + step])
        for i in range(0, len(s), step))))
    coverage = _row_mean(cover, n_pos > 0, 0.0, no_positive)
    return {"lrap": _row_mean(lrap, n_pos > 0, 1.0, no_positive),  # all positive: 1 by itself
            "ranking_loss": _row_mean(wrong, (n_pos > 0) & (n_neg > 0), 0.0, no_positive),
            "coverage": coverage, "coverage_norm": (coverage - 1.0) / num_labels}


def label_ranking_average_precision(scores, y, no_positive: str = "sklearn") -> float:
    """LRAP, the literature's example-based "average precision" (Schapire & Singer 2000; Zhang &
    Zhou 2014): per row, the mean over its positives j of ``|{k positive: s_k >= s_j}| /
    |{k: s_k >= s_j}|``, averaged over rows. Ties count against the label (a tie with a negative
    lowers the precision), as scikit-learn's ``label_ranking_average_precision_score``.

    Rows without a positive: ``no_positive="sklearn"`` scores them 1, as scikit-learn does;
    ``"exclude"`` leaves them out (the literature's definition needs a positive; NaN when no row
    has one). A row whose every label is positive scores 1 by the definition.

    >>> label_ranking_average_precision([[0.9, 0.5, 0.1]], [[1, 0, 1]])
    0.8333333333333333
    """
    return _ranking_metrics(*_as_scores(scores, y), no_positive)["lrap"]


def ranking_loss(scores, y, no_positive: str = "sklearn") -> float:
    """Ranking loss (Zhang & Zhou 2014): per row, the share of (positive j, negative k) pairs
    with ``s_k >= s_j`` (a tie counts as wrongly ordered, as in scikit-learn's
    ``label_ranking_loss``), averaged over rows.

    A row without a positive or without a negative has no pair: ``no_positive="sklearn"`` scores
    it 0 (scikit-learn); ``"exclude"`` leaves it out (NaN when no row has a pair).

    >>> ranking_loss([[0.9, 0.5, 0.1]], [[1, 0, 1]])
    0.5
    """
    return _ranking_metrics(*_as_scores(scores, y), no_positive)["ranking_loss"]


def coverage_error(scores, y, no_positive: str = "sklearn") -> float:
    """Coverage error: per row, how many labels from the top of the ranking must be taken to
    include every positive (``max over positives j of |{k: s_k >= s_j}|``, ties counted in),
    averaged over rows; scikit-learn's ``coverage_error``. The literature's "coverage" (Zhang &
    Zhou 2014) is this minus 1; `normalised_coverage` is ``(coverage_error - 1) / L``.

    Rows without a positive: ``no_positive="sklearn"`` counts them as 0 (scikit-learn);
    ``"exclude"`` leaves them out (NaN when no row has a positive).

    >>> coverage_error([[0.9, 0.5, 0.1]], [[1, 0, 1]])
    3.0
    """
    return _ranking_metrics(*_as_scores(scores, y), no_positive)["coverage"]


def normalised_coverage(scores, y, no_positive: str = "sklearn") -> float:
    """``(coverage_error - 1) / L``: the literature's coverage divided by the number of labels
    (the form SMILE-style tabular SPML tables report), in [0, 1).

    >>> normalised_coverage([[0.9, 0.5, 0.1]], [[1, 0, 1]])
    0.6666666666666666
    """
    num_labels = np.shape(y)[1] if np.ndim(y) == 2 else 1
    return (coverage_error(scores, y, no_positive) - 1.0) / num_labels


def one_error(scores, y, no_positive: str = "sklearn") -> float:
    """One-error (Schapire & Singer 2000): the share of rows whose top-ranked label (the
    highest score; a tie for the top goes to the lowest column index, ``argmax``) is not a
    positive.

    Rows without a positive: ``no_positive="sklearn"`` applies the definition as written (the
    top label cannot be a positive: an error, 1); ``"exclude"`` leaves them out (NaN when no row
    has a positive). scikit-learn has no one-error.

    >>> one_error([[0.9, 0.5], [0.2, 0.7]], [[1, 0], [1, 0]])
    0.5
    """
    s, y = _as_scores(scores, y)
    if s.size == 0:
        return float("nan")
    top = np.argmax(s, axis=1)
    wrong = (y[np.arange(len(y)), top] == 0).astype(np.float64)
    return _row_mean(wrong, y.sum(axis=1) > 0, 1.0, no_positive)


# ---- top-k ranking metrics (LibMultiLabel's) and AP averaged over entries ----------------------
def top_k_hits(s: np.ndarray, pos: np.ndarray, k: int, known=None) -> np.ndarray:
    """N x k: whether each row's r-th top-scored label (ties: the lower column first) is a
    positive, for validated scores ``s`` and bool positives ``pos``, in blocks of rows. Labels
    not to be ranked (unknown ones) are passed as ``-inf`` scores that are not positive, or
    (``known``, N x L bool) left out block by block (no N x L masked copy)."""
    if not 1 <= k <= s.shape[1]:
        raise ValueError(f"k must be in 1..{s.shape[1]} (the number of labels), got {k}")
    step = max(1, BLOCK_ENTRIES // s.shape[1])

    def block(i):
        b = s[i:i + step] if known is None else np.where(known[i:i + step], s[i:i + step],
                                                           -np.inf)
        return np.take_along_axis(pos[i:i + step],
                                  np.argsort(-b, axis=1, kind="stable")[:, :k], axis=1)
    return np.concatenate([block(i) for i in range(0, len(s), step)]
                          or [np.zeros((0, k), dtype=bool)])


def top_k_rows(hits: np.ndarray, n_pos: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: nDCG@k and RP@k (NaN where the row has no positive) from `top_k_hits` (its
    first ``k`` columns) and the rows' positive counts."""
    hits = hits[:, :k].astype(np.float64)
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    best = np.minimum(n_pos, k)
    with np.errstate(invalid="ignore", divide="ignore"):
        ndcg = np.where(best > 0, (hits @ discount) / np.cumsum(discount)[np.maximum(best, 1) - 1],
                        np.nan)
        rp = np.where(best > 0, hits.sum(axis=1) / best, np.nan)
    return ndcg, rp


def ndcg_at_k(scores, y, k: int, no_positive: str = "sklearn") -> float:
    """nDCG@k (LibMultiLabel's definition): per row, ``sum_{r<=k} rel_r / log2(r + 1)`` over
    its k top-scored labels (ties: the lower column first) divided by the same sum of an ideal
    ranking (``min(k, positives)`` hits on top), averaged over rows.

    Rows without a positive: ``no_positive="sklearn"`` scores them 0 (scikit-learn's
    ``ndcg_score``, which equals this where no scores tie); ``"exclude"`` leaves them out
    (LibMultiLabel). ``spmlkit.metrics_partial.ndcg_at_k`` also takes partial labels.

    >>> round(ndcg_at_k([[0.9, 0.8, 0.1]], [[0, 1, 1]], 2), 4)
    0.3869
    """
    return _top_k(scores, y, int(k), no_positive)[f"ndcg@{int(k)}"]


def rprecision_at_k(scores, y, k: int, no_positive: str = "sklearn") -> float:
    """RP@k (R-precision at k, LibMultiLabel): per row, the positives among its k top-scored
    labels divided by ``min(k, positives)``, averaged over rows; rows without a positive score
    0 (``"sklearn"``, as `ndcg_at_k`) or are left out (``"exclude"``).

    >>> rprecision_at_k([[0.9, 0.8, 0.1]], [[0, 1, 1]], 2)
    0.5
    """
    return _top_k(scores, y, int(k), no_positive)[f"rp@{int(k)}"]


def _top_k(scores, y, k: int, no_positive: str) -> dict:
    s, y = _as_scores(scores, y)
    return top_k_means(s, y > 0, (k,), no_positive)


def top_k_means(s: np.ndarray, pos: np.ndarray, ks, no_positive: str, known=None) -> dict:
    """``ndcg@k`` and ``rp@k`` (row means, rows without a positive as ``no_positive`` says) for
    each ``k`` of ``ks`` (each at most L), from one sort of each row (`top_k_hits`: unknown
    labels passed as ``-inf`` scores, or left out by ``known``)."""
    n_pos = pos.sum(axis=1)
    hits = top_k_hits(s, pos, max(ks), known)
    out = {}
    for k in ks:
        ndcg, rp = top_k_rows(hits, n_pos, k)
        out[f"ndcg@{k}"] = _row_mean(ndcg, n_pos > 0, 0.0, no_positive)
        out[f"rp@{k}"] = _row_mean(rp, n_pos > 0, 0.0, no_positive)
    return out


def micro_average_precision(scores, y) -> float:
    """Micro-averaged AP x100: one AP over every entry of the N x L matrix, as scikit-learn's
    ``average_precision_score(average="micro")``; NaN without any positive.

    >>> micro_average_precision([[0.9, 0.2], [0.1, 0.8]], [[1, 0], [1, 0]])
    75.0
    """
    s, y = _as_scores(scores, y)
    return average_precision(s.ravel(), y.ravel()) * 100.0


def weighted_average_precision(scores, y) -> float:
    """Per-class AP x100 averaged with weights the classes' positive counts, as scikit-learn's
    ``average_precision_score(average="weighted")`` (a class without a positive weighs 0);
    NaN without any positive.

    >>> round(weighted_average_precision([[0.9, 0.2], [0.1, 0.8], [0.5, 0.3]],
    ...                                  [[1, 0], [1, 1], [0, 0]]), 4)
    88.8889
    """
    s, y = _as_scores(scores, y)
    return weighted_ap(per_class_ap(s, y), y.sum(axis=0))


def weighted_ap(ap: np.ndarray, positives: np.ndarray) -> float:
    """Per-class ``ap`` averaged with weights ``positives`` (NaN APs weigh 0); NaN when no
    class has a positive."""
    weight = np.asarray(positives, dtype=np.float64)
    if weight.sum() == 0:
        return float("nan")
    return float(np.nansum(np.asarray(ap) * weight) / weight.sum())


#: the k of the top-k records (``ndcg@k``, ``rp@k``)
TOP_K = (3, 5)


def _top_k_metrics(p: np.ndarray, y: np.ndarray, no_positive: str, known=None) -> dict:
    """The top-k records (``ndcg@k``, ``rp@k`` for k in `TOP_K`) from one sort of each row;
    ``k`` above L ranks all L labels (``known``: the labels each row ranks, `top_k_hits`)."""
    if p.size == 0:
        return {f"{name}@{k}": float("nan") for k in TOP_K for name in ("ndcg", "rp")}
    width = y.shape[1]
    got = top_k_means(p, y > 0, sorted({min(k, width) for k in TOP_K}), no_positive, known)
    return {f"{name}@{k}": got[f"{name}@{min(k, width)}"] for k in TOP_K for name in ("ndcg", "rp")}


def _top_k_record(name: str, k: int) -> Callable:
    """``fn(probs, y, no_positive)`` of the record ``{name}@{k}`` (`ndcg_at_k` /
    `rprecision_at_k` at ``min(k, L)``)."""
    def fn(probs, y, no_positive="sklearn") -> float:
        return _top_k_metrics(*_as_scores(probs, y), no_positive)[f"{name}@{k}"]
    fn.__doc__ = f"{'ndcg_at_k' if name == 'ndcg' else 'rprecision_at_k'} at k = min({k}, L)"
    return fn


def _no_setting(fn: Callable) -> Callable:
    """``fn(probs, y)`` as a record's ``fn(probs, y, setting)`` (a metric no setting changes)."""
    def record(probs, y, _setting=None) -> float:
        return fn(probs, y)
    record.__doc__ = f"`{fn.__name__}`"
    return record


def hamming_loss(probs, y, threshold: float = 0.5) -> float:
    """The share of the N x L label entries predicted wrongly, predicting positive where
    ``probs >= threshold`` (scikit-learn's ``hamming_loss`` of those predictions). No edge case:
    every entry counts.

    >>> hamming_loss([[0.9, 0.6], [0.2, 0.4]], [[1, 0], [1, 0]])
    0.5
    """
    p, y = _as_scores(probs, y)
    if p.size == 0:
        return float("nan")
    return float(((p >= threshold) != (y > 0)).mean())


def f1_micro_macro(probs, y, threshold: float = 0.5) -> tuple[float, float]:
    """``(micro F1, macro F1)`` of the predictions ``probs >= threshold``.

    Micro: ``2 TP / (2 TP + FP + FN)`` summed over all entries (0 when there is no positive and
    no positive prediction at all). Macro: the mean of the per-class F1 over the classes with a
    positive or a positive prediction; a class with neither has no F1 and is left out (NaN when
    no class is left); scikit-learn's ``f1_score(average="macro", zero_division=np.nan)``.

    >>> f1_micro_macro([[0.9, 0.6], [0.2, 0.4]], [[1, 0], [1, 0]])
    (0.5, 0.3333333333333333)
    """
    p, y = _as_scores(probs, y)
    pred, true = p >= threshold, y > 0
    tp = (pred & true).sum(axis=0).astype(np.float64)
    fp = (pred & ~true).sum(axis=0)
    fn = (~pred & true).sum(axis=0)
    denom = 2 * tp + fp + fn
    micro = float(2 * tp.sum() / denom.sum()) if denom.sum() > 0 else 0.0
    has = denom > 0
    macro = float((2 * tp[has] / denom[has]).mean()) if has.any() else float("nan")
    return micro, macro


def micro_f1(probs, y, threshold: float = 0.5) -> float:
    """Micro F1 of ``probs >= threshold`` (`f1_micro_macro`)."""
    return f1_micro_macro(probs, y, threshold)[0]


def macro_f1(probs, y, threshold: float = 0.5) -> float:
    """Macro F1 of ``probs >= threshold`` (`f1_micro_macro`)."""
    return f1_micro_macro(probs, y, threshold)[1]


def _f1_pair(p: np.ndarray, y: np.ndarray, threshold: float) -> dict:
    """Micro and macro F1 from one count of the entries."""
    micro, macro = f1_micro_macro(p, y, threshold)
    return {"micro_f1": micro, "macro_f1": macro}


# ---- the metric records: every metric one record ------------------------------------------------
def _sklearn_map(y, x) -> float:
    """100 * mean(average_precision_score(y[:, j], x[:, j]) for the classes j with a positive)"""
    from sklearn.metrics import average_precision_score

    has = np.asarray(y).sum(axis=0) > 0
    if not has.any():
        return float("nan")
    return 100.0 * float(np.mean([average_precision_score(y[:, j], x[:, j])
                                  for j in np.flatnonzero(has)]))


def _sklearn(name: str, after: Callable | None = None, **kwargs) -> Callable:
    """``sklearn.metrics.<name>(y, x, **kwargs)`` (then ``after(value, L)``), imported on call."""
    def counterpart(y, x) -> float:
        import sklearn.metrics

        value = float(getattr(sklearn.metrics, name)(y, x, **kwargs))
        return value if after is None else after(value, np.shape(y)[1])

    shown = ", ".join(["y", "x", *(f"{k}={v!r}" for k, v in kwargs.items())])
    counterpart.__doc__ = f"{name}({shown})" + ("" if after is None else after.__doc__)
    return counterpart


def _per_label_minus_one(value: float, num_labels: int) -> float:
    """, minus 1, over L"""
    return (value - 1.0) / num_labels


def _times_100(value: float, num_labels: int) -> float:
    """, x100"""
    return value * 100.0


#: the top-k records' example: row 0 ranks 0.9 (-), 0.8 (+), 0.7 (-), 0.1 (+); row 1 has no
#: positive (0 at the default setting); L = 4, so k = 5 ranks all four labels
_TOP_K_CASE = ([[0.9, 0.8, 0.1, 0.7], [0.2, 0.3, 0.4, 0.1]], [[0, 1, 1, 0], [0, 0, 0, 0]])
_IDEAL_2 = 1 + 1 / np.log2(3)  # two positives on top


#: the settings a metric's function takes as its third argument, and their defaults
METRIC_SETTINGS = {"convention": "present", "threshold": 0.5, "no_positive": "sklearn"}


@dataclass(frozen=True)
class Metric:
    """One metric, as everything that reports, selects on, tabulates or documents it reads it
    (`metric_score`, `classic_metrics`, ``--metric``, ``spml list metrics``, the
    study and benchmark tables, the docs' metric reference and the generated value tests).

    Args:
        name: the metric's name (``--metric NAME``, ``val_NAME`` / ``test_NAME``).
        fn: ``fn(probs, y, setting) -> float``: ``probs`` N x L, ``y`` the full labels N x L;
            ``setting`` is the one of `METRIC_SETTINGS` named by ``takes``.
        higher_is_better: the selection direction.
        decimals: decimals shown in tables and the CLI.
        description: one line (``spml list metrics``).
        takes: ``"convention"`` (mAP's classes without positives), ``"threshold"`` (the
            metric scores 0/1 predictions ``probs >= threshold``), ``"no_positive"`` (rows
            without a positive, `NO_POSITIVE`) or ``None`` (no setting changes it; ``fn``
            gets ``None``).
        sklearn: ``(y, x) -> float``, scikit-learn's value of the metric at the default
            setting, ``x`` the scores (a thresholded metric: the 0/1 predictions at 0.5);
            ``None`` where scikit-learn has none.
        example: ``(probs, y, value)`` computed by hand, at the default setting; required
            where ``sklearn`` is ``None``.
        joint: ``(p, y, setting) -> {name: value}``: this metric computed with its siblings from
            one pass (the ranking metrics share one ranking); `classic_metrics` calls it
            once for all of them.
    """
    name: str
    fn: Callable[..., float]
    higher_is_better: bool
    decimals: int
    description: str
    takes: str | None
    sklearn: Callable[..., float] | None = None
    example: tuple | None = None
    joint: Callable[..., dict] | None = None

    @property
    def needs_threshold(self) -> bool:
        """Whether it scores predictions at a threshold (F1s, Hamming loss)."""
        return self.takes == "threshold"


#: every metric a run reports and a selection can use, name -> `Metric`, in the order
#: of the tables. mAP is x100 (as everywhere in spmlkit); the others are as the multi-label
#: literature writes them (fractions in [0, 1]; ``coverage`` in [0, L]).
METRICS: dict[str, Metric] = {}


def register_metric(metric: Metric) -> Metric:
    """Add ``metric`` to `METRICS` (the CLI, tables, docs and value tests pick it up).

    Raises:
        ValueError: a name taken, a setting not in `METRIC_SETTINGS`, or no reference
            value (neither ``sklearn`` nor ``example``).
    """
    if metric.name in METRICS:
        raise ValueError(f"metric {metric.name!r} is registered twice")
    if metric.takes is not None and metric.takes not in METRIC_SETTINGS:
        raise ValueError(f"metric {metric.name!r}: takes={metric.takes!r}; one of "
                         f"{', '.join(METRIC_SETTINGS)}")
    if metric.sklearn is None and metric.example is None:
        raise ValueError(f"metric {metric.name!r} needs a reference value: its scikit-learn "
                         f"counterpart (sklearn=) or an example computed by hand (example=)")
    METRICS[metric.name] = metric
    return metric


for _metric in (
    Metric("map", map_score, True, 2, "mean average precision over classes, x100",
           "convention", sklearn=_sklearn_map),
    Metric("lrap", label_ranking_average_precision, True, 4,
           "label-ranking average precision (the literature's 'average precision')",
           "no_positive", sklearn=_sklearn("label_ranking_average_precision_score"),
           joint=_ranking_metrics),
    Metric("ranking_loss", ranking_loss, False, 4,
           "share of (positive, negative) label pairs ordered wrongly", "no_positive",
           sklearn=_sklearn("label_ranking_loss"), joint=_ranking_metrics),
    Metric("coverage", coverage_error, False, 3,
           "coverage error: how far down the ranking all positives are covered "
           "(scikit-learn's coverage_error, in 1..L)", "no_positive",
           sklearn=_sklearn("coverage_error"), joint=_ranking_metrics),
    Metric("coverage_norm", normalised_coverage, False, 4,
           "normalised coverage (coverage - 1) / L, in [0, 1)", "no_positive",
           sklearn=_sklearn("coverage_error", _per_label_minus_one), joint=_ranking_metrics),
    # row 0's top (0.8) is a positive; row 1's (0.6) a negative; row 2's tie for the top goes
    # to column 0, a negative; row 3 has no positive: an error -> 3 of 4
    Metric("one_error", one_error, False, 4,
           "share of rows whose top-ranked label is not a positive", "no_positive",
           example=([[0.1, 0.8, 0.3], [0.6, 0.2, 0.1], [0.5, 0.5, 0.0], [0.4, 0.3, 0.2]],
                    [[0, 1, 0], [0, 1, 1], [0, 1, 0], [0, 0, 0]], 0.75)),
    Metric("hamming_loss", hamming_loss, False, 4,
           "share of label entries predicted wrongly at the threshold", "threshold",
           sklearn=_sklearn("hamming_loss")),
    Metric("micro_f1", micro_f1, True, 4, "F1 over all label entries at the threshold",
           "threshold", sklearn=_sklearn("f1_score", average="micro", zero_division=0),
           joint=_f1_pair),
    Metric("macro_f1", macro_f1, True, 4, "mean of the per-class F1 at the threshold",
           "threshold", sklearn=_sklearn("f1_score", average="macro", zero_division=np.nan),
           joint=_f1_pair),
    Metric("micro_ap", _no_setting(micro_average_precision), True, 2,
           "micro-averaged AP, x100: one AP over every label entry", None,
           sklearn=_sklearn("average_precision_score", _times_100, average="micro")),
    Metric("weighted_ap", _no_setting(weighted_average_precision), True, 2,
           "per-class AP weighted by the classes' positive counts, x100", None,
           sklearn=_sklearn("average_precision_score", _times_100, average="weighted")),
    Metric("ndcg@3", _top_k_record("ndcg", 3), True, 4,
           "nDCG of each row's 3 top-ranked labels (LibMultiLabel's)", "no_positive",
           example=(*_TOP_K_CASE, (1 / np.log2(3)) / _IDEAL_2 / 2), joint=_top_k_metrics),
    Metric("ndcg@5", _top_k_record("ndcg", 5), True, 4,
           "nDCG of each row's 5 top-ranked labels", "no_positive",
           example=(*_TOP_K_CASE, (1 / np.log2(3) + 1 / np.log2(5)) / _IDEAL_2 / 2),
           joint=_top_k_metrics),
    Metric("rp@3", _top_k_record("rp", 3), True, 4,
           "R-precision at 3: positives among the row's top 3 / min(3, its positives)",
           "no_positive", example=(*_TOP_K_CASE, 0.25), joint=_top_k_metrics),
    Metric("rp@5", _top_k_record("rp", 5), True, 4,
           "R-precision at 5", "no_positive", example=(*_TOP_K_CASE, 0.5), joint=_top_k_metrics),
):
    register_metric(_metric)


def check_metric(name: str) -> str:
    """``name`` if it is one of `METRICS`, else a ``ValueError`` listing them."""
    if name not in METRICS:
        import difflib

        close = difflib.get_close_matches(str(name), list(METRICS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown metric {name!r}{hint}; choose one of {', '.join(METRICS)}")
    return name


def higher_is_better(name: str) -> bool:
    """The selection direction of metric ``name`` (``ranking_loss``, ``coverage``,
    ``coverage_norm``, ``one_error``, ``hamming_loss``: lower is better).

    >>> higher_is_better("map"), higher_is_better("ranking_loss")
    (True, False)
    """
    return METRICS[check_metric(name)].higher_is_better


def metric_score(name: str, probs, y, *, convention: str = "present",
                 threshold: float | str = 0.5, no_positive: str = "sklearn") -> float:
    """One metric of `METRICS` of ``probs`` (N x L probabilities) against the full labels
    ``y``: what an epoch is selected on.

    ``threshold`` (for the F1s and Hamming loss): a probability, or ``"chosen"``: the global
    micro-F1 threshold of these same rows (`best_global_threshold`), the policy a run
    applies on its val split (`THRESHOLD_POLICY`).

    Raises:
        ValueError: an unknown metric (listing them), bad shapes or non-finite scores.
    """
    metric = METRICS[check_metric(name)]
    if metric.needs_threshold and threshold == "chosen":
        threshold = best_global_threshold(probs, y)[0]
    settings = {"convention": convention, "threshold": threshold, "no_positive": no_positive}
    return metric.fn(probs, y, settings.get(metric.takes))


def classic_metrics(probs, y, *, convention: str = "present", threshold: float = 0.5,
                    no_positive: str = "sklearn") -> dict:
    """Every metric of `METRICS` of one split (``probs`` N x L probabilities, ``y`` the
    full labels), plus ``threshold`` and ``rows_without_positives`` (how many rows the
    ``no_positive`` convention applied to).

    >>> m = classic_metrics([[0.9, 0.2], [0.3, 0.8]], [[1, 0], [0, 1]])
    >>> m["map"], m["lrap"], m["ranking_loss"], m["hamming_loss"], m["one_error"]
    (100.0, 1.0, 0.0, 0.0, 0.0)
    """
    p, y = _as_scores(probs, y)
    settings = {"convention": convention, "threshold": threshold, "no_positive": no_positive}
    out, shared = {}, {}
    for name, metric in METRICS.items():
        setting = settings.get(metric.takes)
        if metric.joint is None:
            out[name] = metric.fn(p, y, setting)
            continue
        if metric.joint not in shared:
            shared[metric.joint] = metric.joint(p, y, setting)
        out[name] = shared[metric.joint][name]
    out["threshold"] = float(threshold)
    out["rows_without_positives"] = int((y.sum(axis=1) == 0).sum())
    return out


def pseudo_label_stats(mask, value, y) -> tuple[int, float]:
    """How many entries a method has pseudo-labelled, and the share it got right.

    Args:
        mask: N x L bool, the entries the method asserts a label for
            (``loss.hard_pseudo_labels()``).
        value: N x L 0/1, the label asserted on each entry (read only where ``mask`` is set).
        y: N x L full 0/1 labels of the same rows.

    Returns:
        ``(count, precision)``: the number of pseudo-labelled entries and the fraction of them
        whose asserted label equals ``y`` (Zhou et al. Table 2, right); precision is NaN when
        ``count`` is 0.

    >>> pseudo_label_stats([[True, True], [False, True]], [[0, 0], [0, 0]], [[1, 0], [1, 0]])
    (3, 0.6666666666666666)
    """
    m = np.asarray(mask, dtype=bool)
    v = np.asarray(value)
    y = validate_full_labels(y, "pseudo-label precision targets")
    if not m.shape == v.shape == y.shape:
        raise ValueError(f"pseudo-label mask {m.shape}, values {v.shape} and labels {y.shape} "
                         f"must have the same N x L shape")
    count = int(m.sum())
    if count == 0:
        return 0, float("nan")
    return count, float((v[m].astype(np.int64) == y[m].astype(np.int64)).mean())


# ---- decision thresholds (chosen on the validation split, used by `spml predict`) -------------
def _f1_sweep(scores: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every distinct score as a threshold (predict positive where ``score >= t``), highest
    first, and the F1 of each over all the given entries: ``2 TP / (2 TP + FP + FN)``."""
    s = np.asarray(scores)
    s = (s if s.dtype == np.float32 else s.astype(np.float64)).ravel()
    t = np.asarray(targets).ravel().astype(bool)
    # each distinct score (a group of tied scores), with how many entries and positives score
    # it; counted from the highest: the entries predicted positive and the true positives
    values, count = np.unique(s, return_counts=True)
    positives = np.zeros(len(values), dtype=np.int64)
    pos_values, pos_count = np.unique(s[t], return_counts=True)
    positives[np.searchsorted(values, pos_values)] = pos_count
    predicted = np.cumsum(count[::-1])
    tp = np.cumsum(positives[::-1])
    f1 = 2.0 * tp / (predicted + int(t.sum()))
    return values[::-1].astype(np.float64), f1


def best_global_threshold(probs, y) -> tuple[float, float]:
    """The single threshold that maximises micro-F1 over all entries (``p >= t`` is positive).

    Candidates are the distinct values of ``probs``; among equally good ones the highest is
    taken (the fewest positive predictions). Micro-F1 = ``2 TP / (2 TP + FP + FN)`` summed over
    every entry of the N x L matrix.

    Returns:
        ``(threshold, micro_f1)``; ``(0.5, nan)`` when ``y`` has no positive (F1 is undefined).

    >>> best_global_threshold([[0.9, 0.2], [0.6, 0.4]], [[1, 0], [0, 1]])
    (0.4, 0.8)
    """
    p, y = _as_scores(probs, y, keep_float32=True)
    if not y.any():
        return 0.5, float("nan")
    return _best_f1(p, y)


#: sorted scores swept at once by `_best_f1`
SWEEP_ENTRIES = 1 << 21


def _best_f1(scores: np.ndarray, targets: np.ndarray) -> tuple[float, float]:
    """The best of `_f1_sweep` (the highest threshold of the highest F1) and its F1, the
    same numbers, from one sorted copy of the scores swept in blocks from the top: the
    distinct scores' counts are not all held at once (a val split of 200,000 x 80 would need
    some 500 MB for them)."""
    s = np.asarray(scores)
    s = (s if s.dtype == np.float32 else s.astype(np.float64)).ravel()
    t = np.asarray(targets).ravel().astype(bool)
    total = int(t.sum())
    pos = np.sort(s[t])  # the positives' scores: the true positives of a threshold
    del t
    s = np.sort(s)
    n = s.size
    best, best_f1 = None, -np.inf
    for hi in range(n, 0, -SWEEP_ENTRIES):  # the highest scores first
        lo = max(0, hi - SWEEP_ENTRIES)
        block = s[lo:hi]
        first = np.empty(len(block), dtype=bool)  # the first of each group of tied scores
        first[1:] = block[1:] != block[:-1]
        first[0] = lo == 0 or s[lo] != s[lo - 1]
        starts = lo + np.flatnonzero(first)
        if not len(starts):  # every score of the block ties with the one before it
            continue
        values = s[starts]
        predicted = n - starts  # entries scoring >= the value
        tp = len(pos) - np.searchsorted(pos, values, side="left")  # positives among them
        f1 = (2.0 * tp / (predicted + total))[::-1]  # highest value first, as _f1_sweep
        i = int(np.argmax(f1))
        if f1[i] > best_f1:  # ties: the higher threshold, found first
            best, best_f1 = values[::-1][i], f1[i]
    return float(best), float(best_f1)


def best_class_thresholds(probs, y, fallback: float | None = None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """One threshold per class, each maximising that class's F1 (``p >= t`` is positive).

    Candidates and ties as `best_global_threshold`, per column. A class without a
    positive in ``y`` has no F1: it gets ``fallback`` (default: the global micro-F1 threshold)
    and F1 NaN.

    Returns:
        ``(thresholds (L,), f1 (L,))``.

    >>> t, f1 = best_class_thresholds([[0.9, 0.2], [0.6, 0.4], [0.3, 0.1]], [[1, 0], [1, 1],
    ...                                                                     [0, 0]])
    >>> t.tolist(), f1.tolist()
    ([0.6, 0.4], [1.0, 1.0])
    """
    p, y = _as_scores(probs, y, keep_float32=True)
    if fallback is None:
        fallback = best_global_threshold(p, y)[0]
    thresholds = np.full(p.shape[1], float(fallback))
    f1 = np.full(p.shape[1], np.nan)
    for j in range(p.shape[1]):
        if y[:, j].any():
            cand, scores = _f1_sweep(p[:, j], y[:, j])
            best = int(np.argmax(scores))
            thresholds[j], f1[j] = cand[best], scores[best]
    return thresholds, f1


def select_thresholds(probs, y, class_names=None) -> dict:
    """The decision thresholds a run stores (``thresholds.json``), chosen on ``(probs, y)``
    (the validation split): the global micro-F1 threshold and the per-class F1 thresholds, with
    the F1 each reaches there."""
    p, y = _as_scores(probs, y, keep_float32=True)
    t_global, f1_global = best_global_threshold(p, y)
    t_class, f1_class = best_class_thresholds(p, y, t_global)
    return {"chosen_on": "val", "rows": int(p.shape[0]),
            "global": t_global, "global_micro_f1": f1_global,
            "per_class": t_class.tolist(),
            "per_class_f1": [None if np.isnan(v) else float(v) for v in f1_class],
            "class_names": list(class_names) if class_names is not None else None}
