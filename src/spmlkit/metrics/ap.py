"""Average precision: per class, its mean (mAP), micro- and weight-averaged, and P@k / R@k.

mAP is the mean over classes of non-interpolated average precision (scikit-learn's
``average_precision_score``), times 100. A class without any positive has no AP: by default it is
left out of the mean and reported (``MAPResult.missing``); ``convention="official"`` scores it 0
and keeps it in the mean, as the official code does.

Every function takes full 0 / 1 labels; `per_class_ap`, `map_score`,
`micro_average_precision` and `weighted_average_precision` take partial ones too
(`spmlkit.metrics.partial`), scored through its formatting step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..labels import validate_full_labels
from .partial import format_labels, is_partial, partial_or_full

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
    the stacked linear engine scores every epoch). Partial labels (`PartialLabels`, N x L):
    each class over the rows where it is known (NaN without a known positive there).
    """
    if is_partial(y):
        s, y, _ = format_labels(scores, y, "per_row")  # (every column: the AP of each class)
        return per_class_ap(s, y)
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
    _, hits, end = sorted_columns(s, y)  # (the sorted scores let go at once)
    return ranked_ap(hits, end)


def sorted_columns(s: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every column of scores ``s`` (... x K x N: a column's N scores along the last axis)
    sorted in descending order, with its labels ``y`` (K x N) in that order as positives
    (``y > 0``) and ``end``: the last entry of every group of tied scores (`ranked_ap`'s
    inputs; the per-class F1 sweeps', `spmlkit.metrics.thresholds.runs_thresholds`)."""
    s = np.ascontiguousarray(s)  # (the sort and everything after: along contiguous rows)
    order = np.argsort(-s, axis=-1)  # tied scores are grouped: their order does not matter
    s = np.take_along_axis(s, order, axis=-1)
    hits = np.take_along_axis(np.broadcast_to(y > 0, order.shape), order, axis=-1)
    del order
    end = np.ones_like(s, dtype=bool)  # the last entry of every group of tied scores
    end[..., :-1] = s[..., 1:] != s[..., :-1]
    return s, hits, end


def ranked_ap(hits: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The AP core (a fraction, NaN for a column without positive) of every column of ``hits``
    (... x N, whether each entry is a positive), its entries along the last axis in descending
    order of the column's scores; ``end`` (same shape) marks the last entry of every group of
    tied scores: AP = sum over groups of (R_g - R_{g-1}) * P_g at the group's end
    (`average_precision`), summed in rank order. Every AP of spmlkit comes from here
    (`average_precision` and `per_class_ap` sort with numpy; the stacked linear
    engine on a GPU sorts there, `spmlkit.engine.vectorised.stacked_val_map`)."""
    n = hits.shape[-1]
    pairwise = hits.size == n  # one column: numpy's pairwise sum (`_ap_of`)
    tied = ~end.all(axis=-1)  # the columns with tied scores
    if not tied.any():
        return _untied_ap(hits, n, pairwise)
    if tied.all():
        return _tied_ap(hits, end, n, pairwise)
    out = _untied_ap(hits, n, pairwise)  # each column's AP is its own: the tied ones again
    out[tied] = _tied_ap(hits[tied], end[tied], n, pairwise)
    return out


def _untied_ap(hits: np.ndarray, n: int, pairwise: bool) -> np.ndarray:
    """`ranked_ap` of columns without tied scores (the usual case): each entry is its own
    group, whose gain is the precision at its rank for a positive, 0 for a negative: the tied
    path's numbers (1 or 0 times the precision) in 4 passes instead of 11."""
    tp = np.cumsum(hits, axis=-1, dtype=np.float64)  # (exact counts)
    gain = tp / np.arange(1, n + 1, dtype=np.float64)
    np.multiply(gain, hits, out=gain)
    return _ap_of(gain, tp, pairwise)


def _tied_ap(hits: np.ndarray, end: np.ndarray, n: int, pairwise: bool) -> np.ndarray:
    """`ranked_ap` of columns with groups of tied scores."""
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
    return _ap_of(np.where(end, gain, 0.0), tp, pairwise)


def _ap_of(gain: np.ndarray, tp: np.ndarray, pairwise: bool) -> np.ndarray:
    """`ranked_ap` from each entry's gain and the running positives ``tp``."""
    # summed one by one in rank order, as numpy sums the rows of an N x K matrix (the layout
    # before; the same numbers to the last bit); one column alone: numpy's pairwise sum, as
    # it summed an N x 1 matrix
    total = gain.sum(axis=-1) if pairwise else np.cumsum(gain, axis=-1, out=gain)[..., -1]
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
    """mAP x100 as a float (see `mean_average_precision`); of partial labels
    (`PartialLabels`), each class over its known rows, the classes without a known negative
    left out (the ``"per_class"`` rule of `spmlkit.metrics.partial.format_labels`)."""
    if is_partial(y):
        s, y, _ = format_labels(scores, y, "per_class")
        return map_from_ap(per_class_ap(s, y), convention)
    return mean_average_precision(scores, y, convention).value


def precision_recall_at_k(scores, y, k: int) -> tuple[float, float]:
    """P@k and R@k, averaged over rows (rows without positives left out of R@k)."""
    s, y = _as_scores(scores, y)
    if not 1 <= k <= s.shape[1]:
        raise ValueError(f"k must be in 1..{s.shape[1]}, got {k}")
    return precision_recall_means(top_k_counts(s, y, k), k)


def top_k_counts(s: np.ndarray, y: np.ndarray, k: int) -> dict:
    """Per row of validated scores and labels: the positives among its ``k`` top-scored labels
    (ties: the lower column first) and its positives."""
    top = np.argsort(-s, axis=1, kind="mergesort")[:, :k]
    return {"hits": np.take_along_axis(y, top, axis=1).sum(axis=1), "n_pos": y.sum(axis=1)}


def precision_recall_means(rows: dict, k: int) -> tuple[float, float]:
    """P@k and R@k: the row means of `top_k_counts` (rows without positives left out of
    R@k)."""
    hits, n_pos = rows["hits"], rows["n_pos"]
    has = n_pos > 0
    recall = float((hits[has] / n_pos[has]).mean()) if has.any() else float("nan")
    return float(hits.mean() / k), recall



def micro_average_precision(scores, y) -> float:
    """Micro-averaged AP x100: one AP over every entry of the N x L matrix, as scikit-learn's
    ``average_precision_score(average="micro")``; NaN without any positive. Partial labels
    (`PartialLabels`, or a matrix holding -1 or NaN): one AP over the known entries.

    >>> micro_average_precision([[0.9, 0.2], [0.1, 0.8]], [[1, 0], [1, 0]])
    75.0
    """
    y = partial_or_full(y)
    if is_partial(y):
        scores, y, _ = format_labels(scores, y, "entries")
    s, y = _as_scores(scores, y, keep_float32=True)
    return pooled_average_precision(s, y) * 100.0


def pooled_average_precision(scores, targets) -> float:
    """`average_precision` of every entry of ``scores`` pooled into one ranking (the micro
    AP), in the memory of one sorted copy of the scores (float32 ones stay float32): only
    the groups of tied scores that hold a positive add to AP, each ``(positives in the group)
    * (positives scored >= it) / (entries scored >= it)``, so the counts come from two
    ``searchsorted`` over the sorted scores instead of `ranked_ap`'s cumulative arrays, seven
    N x L arrays of 8 bytes (1.3 GB for the 200,000 x 80 val split of a 1M-row store). Equal
    to `average_precision` up to summation order.

    >>> pooled_average_precision([[0.9, 0.8], [0.1, 0.8]], [[1, 0], [1, 1]])  # (1 + 2/3 + 3/4) / 3
    0.8055555555555555
    """
    s = np.asarray(scores).ravel()
    t = np.asarray(targets).ravel().astype(bool)
    if s.shape != t.shape:
        raise ValueError(f"pooled_average_precision: {s.size} scores for {t.size} targets")
    positives = np.sort(s[t])
    if not positives.size:
        return float("nan")
    values, counts = np.unique(positives, return_counts=True)  # ascending
    ranked = np.sort(s)
    at_least = s.size - np.searchsorted(ranked, values, side="left")
    del ranked
    hits = positives.size - np.searchsorted(positives, values, side="left")
    gain = counts * (hits / at_least)
    return float(np.cumsum(gain[::-1])[-1] / positives.size)  # in rank order


def weighted_average_precision(scores, y) -> float:
    """Per-class AP x100 averaged with weights the classes' positive counts, as scikit-learn's
    ``average_precision_score(average="weighted")`` (a class without a positive weighs 0);
    NaN without any positive. Partial labels (`PartialLabels`, or a matrix holding -1 or NaN):
    each class's AP over its known rows weighted by its known positives, the classes without a
    known negative left out.

    >>> round(weighted_average_precision([[0.9, 0.2], [0.1, 0.8], [0.5, 0.3]],
    ...                                  [[1, 0], [1, 1], [0, 0]]), 4)
    88.8889
    """
    y = partial_or_full(y)
    if is_partial(y):
        scores, y, _ = format_labels(scores, y, "per_class")
    s, y = _as_scores(scores, y)
    return weighted_ap(per_class_ap(s, y), y.sum(axis=0))


def weighted_ap(ap: np.ndarray, positives: np.ndarray) -> float:
    """Per-class ``ap`` averaged with weights ``positives`` (NaN APs weigh 0); NaN when no
    class has a positive."""
    weight = np.asarray(positives, dtype=np.float64)
    if weight.sum() == 0:
        return float("nan")
    return float(np.nansum(np.asarray(ap) * weight) / weight.sum())


