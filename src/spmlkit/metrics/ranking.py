"""Example-based ranking metrics: LRAP, ranking loss, coverage, one-error (Schapire & Singer
2000; Zhang & Zhou 2014), and LibMultiLabel's top-k metrics (nDCG@k, RP@k).

Each is a mean over rows; a row without a positive has no value by the definitions, and
``no_positive`` (`NO_POSITIVE`) says what it counts: ``"sklearn"`` as scikit-learn scores it,
``"exclude"`` left out. Ties count against the label, as in scikit-learn. The rows go by blocks
(`spmlkit.metrics.ap.BLOCK_ENTRIES` entries), so a large split's ranks stay within some tens of
MiB.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import ap as _ap
from .ap import _as_scores
from .partial import format_labels, is_partial, partial_or_full

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


def _ranking_metrics(s: np.ndarray, y: np.ndarray, no_positive: str, known=None) -> dict:
    """LRAP, ranking loss, coverage error and normalised coverage of validated scores and labels
    (`_as_scores`), from one computation of the ranks (the definitions, ties and rows
    without a positive are those of the public functions below).

    ``known`` (N x L bool; partial labels formatted per row,
    `spmlkit.metrics.partial.format_labels`): the entries known. The unknown ones come as
    negatives scored below every known label, which moves no positive's rank; they are not a
    row's negatives (the ranking loss's pairs) nor its labels (the normalised coverage divides
    each row's coverage by its known labels).
    """
    if s.size == 0:
        nan = float("nan")
        return {"lrap": nan, "ranking_loss": nan, "coverage": nan, "coverage_norm": nan}
    return ranking_means(ranking_rows(s, y, known), no_positive)


def ranking_rows(s: np.ndarray, y: np.ndarray, known=None) -> dict:
    """The per-row values `_ranking_metrics` averages (``lrap``, ``wrong``: the ranking loss,
    ``cover``: the coverage, each undefined where the row has no positive or negative) and the
    rows' ``n_pos``, ``n_neg`` and ``width`` (labels known: L, or per row with ``known``), from
    blocks of rows. Rows are independent: the rows of several runs' scores stacked give each
    run's own values (`spmlkit.metrics.scoring.runs_scores`)."""
    num_labels = y.shape[1] if y.ndim == 2 else 1
    n_pos = y.sum(axis=1, dtype=np.int64)
    width = num_labels if known is None else known.sum(axis=1, dtype=np.int64)
    n_neg = width - n_pos
    step = max(1, _ap.BLOCK_ENTRIES // num_labels)  # per-row values, from blocks of rows
    lrap, wrong, cover = (np.concatenate(v) for v in zip(*(
        _ranking_rows(s[i:i + step], y[i:i + step], n_pos[i:i + step], n_neg[i:i + step])
        for i in range(0, len(s), step))))
    return {"lrap": lrap, "wrong": wrong, "cover": cover, "n_pos": n_pos, "n_neg": n_neg,
            "width": width, "labels": num_labels, "partial": known is not None}


def ranking_means(rows: dict, no_positive: str) -> dict:
    """LRAP, ranking loss, coverage and normalised coverage: the row means of `ranking_rows`
    (of every row it was given, or of one run's rows: `rows_of`)."""
    cover, n_pos, n_neg, width = rows["cover"], rows["n_pos"], rows["n_neg"], rows["width"]
    coverage = _row_mean(cover, n_pos > 0, 0.0, no_positive)
    if not rows["partial"]:
        normalised = (coverage - 1.0) / rows["labels"]
    else:  # a row without a positive has coverage 0, as in `coverage`'s "sklearn" mean
        counted = n_pos > 0 if no_positive == "exclude" else np.ones(len(n_pos), dtype=bool)
        normalised = _row_mean((cover - 1.0) / np.maximum(width, 1), counted, 0.0, no_positive)
    return {"lrap": _row_mean(rows["lrap"], n_pos > 0, 1.0, no_positive),  # all positive: 1
            "ranking_loss": _row_mean(rows["wrong"], (n_pos > 0) & (n_neg > 0), 0.0,
                                      no_positive),
            "coverage": coverage, "coverage_norm": normalised}


def rows_of(rows: dict, part: slice) -> dict:
    """The rows ``part`` of per-row values (`ranking_rows`, `top_k_rows_of`): arrays sliced,
    the rest (the label count, flags) as it is."""
    return {k: v[part] if isinstance(v, np.ndarray) else v for k, v in rows.items()}


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
    return one_error_mean(one_error_rows(s, y), no_positive)


def one_error_rows(s: np.ndarray, y: np.ndarray) -> dict:
    """Per row of validated scores and labels: whether its top-ranked label is not a positive
    (``wrong``, 0 / 1), and its positives (``n_pos``)."""
    top = np.argmax(s, axis=1)
    return {"wrong": (y[np.arange(len(y)), top] == 0).astype(np.float64),
            "n_pos": y.sum(axis=1)}


def one_error_mean(rows: dict, no_positive: str) -> float:
    """One-error: the mean of `one_error_rows` (rows without a positive as ``no_positive``)."""
    return _row_mean(rows["wrong"], rows["n_pos"] > 0, 1.0, no_positive)


# ---- top-k ranking metrics (LibMultiLabel's) --------------------------------------------------
def top_k_hits(s: np.ndarray, pos: np.ndarray, k: int) -> np.ndarray:
    """N x k: whether each row's r-th top-scored label (ties: the lower column first) is a
    positive, for validated scores ``s`` and bool positives ``pos``, in blocks of rows (labels
    not to be ranked, unknown ones, come scored below every other label and not positive)."""
    if not 1 <= k <= s.shape[1]:
        raise ValueError(f"k must be in 1..{s.shape[1]} (the number of labels), got {k}")
    step = max(1, _ap.BLOCK_ENTRIES // s.shape[1])
    return np.concatenate([np.take_along_axis(pos[i:i + step], np.argsort(
        -s[i:i + step], axis=1, kind="stable")[:, :k], axis=1) for i in range(0, len(s), step)]
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
    (LibMultiLabel). Partial labels (`PartialLabels`, or a matrix holding -1 or NaN): each
    row's known labels ranked.

    >>> round(ndcg_at_k([[0.9, 0.8, 0.1]], [[0, 1, 1]], 2), 4)
    0.3869
    """
    return _top_k(scores, y, int(k), no_positive)[f"ndcg@{int(k)}"]


def rprecision_at_k(scores, y, k: int, no_positive: str = "sklearn") -> float:
    """RP@k (R-precision at k, LibMultiLabel): per row, the positives among its k top-scored
    labels divided by ``min(k, positives)``, averaged over rows; rows without a positive score
    0 (``"sklearn"``, as `ndcg_at_k`) or are left out (``"exclude"``); partial labels as
    `ndcg_at_k`.

    >>> rprecision_at_k([[0.9, 0.8, 0.1]], [[0, 1, 1]], 2)
    0.5
    """
    return _top_k(scores, y, int(k), no_positive)[f"rp@{int(k)}"]


def _top_k(scores, y, k: int, no_positive: str) -> dict:
    y = partial_or_full(y)
    if is_partial(y):
        scores, y, _ = format_labels(scores, y, "per_row")
    s, y = _as_scores(scores, y)
    return top_k_means(s, y > 0, (k,), no_positive)


def top_k_means(s: np.ndarray, pos: np.ndarray, ks, no_positive: str) -> dict:
    """``ndcg@k`` and ``rp@k`` (row means, rows without a positive as ``no_positive`` says) for
    each ``k`` of ``ks`` (each at most L), from one sort of each row (`top_k_hits`)."""
    return top_k_row_means(top_k_rows_of(s, pos, ks), ks, no_positive)


def top_k_rows_of(s: np.ndarray, pos: np.ndarray, ks) -> dict:
    """Per row: its top ``max(ks)`` labels' hits (`top_k_hits`) and its positives."""
    return {"hits": top_k_hits(s, pos, max(ks)), "n_pos": pos.sum(axis=1)}


def top_k_row_means(rows: dict, ks, no_positive: str) -> dict:
    """`top_k_means` of `top_k_rows_of` (of all its rows, or one run's: `rows_of`)."""
    out = {}
    for k in ks:
        ndcg, rp = top_k_rows(rows["hits"], rows["n_pos"], k)
        out[f"ndcg@{k}"] = _row_mean(ndcg, rows["n_pos"] > 0, 0.0, no_positive)
        out[f"rp@{k}"] = _row_mean(rp, rows["n_pos"] > 0, 0.0, no_positive)
    return out


#: the k of the top-k records (``ndcg@k``, ``rp@k``)
TOP_K = (3, 5)


def _top_k_metrics(p: np.ndarray, y: np.ndarray, no_positive: str, known=None) -> dict:
    """The top-k records (``ndcg@k``, ``rp@k`` for k in `TOP_K`) from one sort of each row;
    ``k`` above L ranks all L labels. (``known``, as every joint function takes it: unused,
    the unknown labels of partial ones come ranked last and not positive.)"""
    if p.size == 0:
        return {f"{name}@{k}": float("nan") for k in TOP_K for name in ("ndcg", "rp")}
    ks = top_k_ks(y.shape[1])
    return top_k_records(top_k_means(p, y > 0, ks, no_positive), y.shape[1])


def top_k_ks(width: int) -> list:
    """The k computed for the `TOP_K` records on ``width`` labels (a k above it ranks all)."""
    return sorted({min(k, width) for k in TOP_K})


def top_k_records(got: dict, width: int) -> dict:
    """The `TOP_K` records' values from `top_k_means` at `top_k_ks`."""
    return {f"{name}@{k}": got[f"{name}@{min(k, width)}"] for k in TOP_K for name in ("ndcg", "rp")}


def _top_k_record(name: str, k: int) -> Callable:
    """``fn(probs, y, no_positive)`` of the record ``{name}@{k}`` (`ndcg_at_k` /
    `rprecision_at_k` at ``min(k, L)``)."""
    def fn(probs, y, no_positive="sklearn") -> float:
        return _top_k_metrics(*_as_scores(probs, y), no_positive)[f"{name}@{k}"]
    fn.__doc__ = f"{'ndcg_at_k' if name == 'ndcg' else 'rprecision_at_k'} at k = min({k}, L)"
    return fn

