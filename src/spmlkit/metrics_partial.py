"""Metrics on partially labelled evaluation sets, and ranking metrics LibMultiLabel users expect.

**The encoding of a partial evaluation matrix** is spmlkit's one label encoding
(`spmlkit.labels`): ``1`` a known positive, ``-1`` a known negative, ``0`` unknown; ``NaN``
(an empty cell of a table) is unknown too. A 1 / 0 / NaN matrix (OpenImages' "0 = verified
negative") must write its negatives as -1: a partial matrix without any -1 is refused (every
class would score AP 100 against positives only).

Two masks (``mask``):

* ``"entry"`` (default; the OpenImages rule): each class is scored over the rows where that
  class is known; the example-based metrics rank each row's known labels only.
* ``"row"`` (the L48 benchmark's rule): only the rows whose every label is known are scored,
  with the ordinary metrics.

Classes without a known positive: ``convention`` as everywhere (``"present"`` leaves them out,
``"official"`` scores them 0). A class with known positives and no known negative (where it is
scored) ranks its positives against nothing, an AP of 100 whatever the scores: it is left out
of the mAP (and the weighted AP) under both conventions, and named by
`classes_without_negatives` (``masked_evaluate``'s ``"classes_without_negatives"``).

`PartialLabels` is such a matrix as it travels through a run (a source reads it, the engine
selects epochs on it, the result scores the test rows with it): an int8 ndarray that carries
its ``mask``. The ``split_*`` functions score a split whichever its labels: full ones with
`spmlkit.metrics` (unchanged), partial ones with the masked metrics; the engine and the run's
result call them.

>>> y = partial_labels([[1, -1], [-1, 0], [0, 1]])
>>> masked_map([[0.9, 0.2], [0.1, 0.8], [0.7, 0.6]], y)
100.0
"""
from __future__ import annotations

import numpy as np

from . import metrics as full
from .labels import label_values
from .metrics import BLOCK_ENTRIES, METRICS, _best_f1, _count_at_least, _f1_sweep, _row_mean, \
    _top_k_metrics, average_precision, classic_metrics, f1_micro_macro, map_from_ap, \
    per_class_ap, top_k_means

__all__ = ["MASKS", "PartialLabels", "partial_labels", "is_partial", "known_entries",
           "masked_per_class_ap", "classes_without_negatives", "masked_map", "masked_metrics",
           "micro_average_precision",
           "weighted_average_precision", "ndcg_at_k", "rprecision_at_k", "masked_evaluate",
           "masked_class_thresholds", "masked_select_thresholds", "masked_global_threshold",
           "split_map", "split_metric", "split_metrics", "split_evaluate", "split_thresholds"]

#: the masks of a partial evaluation matrix
MASKS = ("entry", "row")


class PartialLabels(np.ndarray):
    """An N x L int8 matrix of partial evaluation labels (1 / -1 known, 0 unknown) that
    carries its ``mask`` (``"entry"`` or ``"row"``) through indexing; made by
    `partial_labels`."""

    mask: str = "entry"
    #: the class names of the columns, when made from a DataFrame (`partial_labels`); not
    #: carried into a slice or a copy, whose columns may be others
    columns: list | None = None

    def __array_finalize__(self, obj):
        self.mask = getattr(obj, "mask", "entry")
        self.columns = None

    def __reduce__(self):  # pickles (worker processes) with its mask and column names
        fn, args, state = super().__reduce__()
        return fn, args, (state, self.mask, self.columns)

    def __setstate__(self, state):
        base, self.mask, *rest = state
        self.columns = rest[0] if rest else None
        super().__setstate__(base)


def partial_labels(values, mask: str = "entry", where: str | None = None) -> PartialLabels:
    """``values`` (N x L: 1 known positive, -1 known negative, 0 or NaN unknown) as
    `PartialLabels`.

    Raises:
        ValueError: not 2-D, values outside {1, 0, -1, NaN} (naming them and the first row),
            no known negative at all, an unknown ``mask``.
    """
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    at = f" ({where})" if where else ""
    arr = np.asarray(label_values(values, where))  # a DataFrame's pd.NA, a masked entry: NaN
    if arr.ndim != 2:
        raise ValueError(f"partial labels{at} must be a 2-D matrix (rows x classes), got shape "
                         f"{arr.shape}")
    if arr.dtype.kind == "f":
        arr = np.where(np.isnan(arr), 0.0, arr)
    elif arr.dtype.kind not in "iub":
        raise ValueError(f"partial labels{at} must be numbers (1 / -1 / 0 or NaN), got "
                         f"{arr.dtype}")
    bad = (arr != 1) & (arr != 0) & (arr != -1)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ValueError(f"partial labels{at} hold only 1 (positive), -1 (known negative) and "
                         f"0 or NaN (unknown); found {sorted({float(v) for v in arr[bad]})[:5]} "
                         f"(first at row {row})")
    if arr.size and not (arr == -1).any():
        raise ValueError(f"partial labels{at} hold no known negative (-1): in spmlkit's "
                         f"encoding 0 is unknown, so every class would be scored against its "
                         f"positives only; write known negatives as -1 (full 0 / 1 labels "
                         f"are not partial: give them as full labels)")
    out = arr.astype(np.int8).view(PartialLabels)
    out.mask = mask
    names = getattr(values, "columns", None)  # a DataFrame's: matched to an estimator's classes
    out.columns = None if names is None else list(names)
    return out


def is_partial(y) -> bool:
    """Whether ``y`` is a `PartialLabels` matrix (what `spmlkit.metrics` dispatches on)."""
    return isinstance(y, PartialLabels)


def _partial_or_full(y):
    """``y`` as `PartialLabels` when it is partial (already, or a label matrix holding -1 or
    NaN: the partial encoding), else as it is (full labels): what the functions of this
    module that take either dispatch on."""
    if is_partial(y):
        return y
    arr = np.asarray(label_values(y))
    if arr.ndim == 2 and arr.dtype.kind in "iuf" and (
            (arr == -1).any() or (arr.dtype.kind == "f" and np.isnan(arr).any())):
        return partial_labels(arr)  # (no float copy of an integer matrix to look for NaN)
    return arr


def known_entries(y) -> tuple[np.ndarray, np.ndarray]:
    """``(positive, known)``: two N x L bool matrices of partial labels ``y`` (any form
    `partial_labels` reads)."""
    y = y if is_partial(y) else partial_labels(y)
    arr = np.asarray(y)
    return arr == 1, arr != 0


def _checked(scores, y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    pos, known = known_entries(y)
    if s.shape != pos.shape:
        raise ValueError(f"scores {s.shape} and labels {pos.shape} must have the same shape")
    if not np.isfinite(s).all():
        raise ValueError(f"scores hold {int((~np.isfinite(s)).sum())} non-finite value(s)")
    return s, pos, known


def _mask_of(y, mask):
    mask = mask if mask is not None else (y.mask if is_partial(y) else "entry")
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    return mask


def _complete_rows(s, pos, known):
    rows = known.all(axis=1)
    return s[rows], pos[rows].astype(np.uint8), rows


def masked_per_class_ap(scores, y, mask: str | None = None) -> np.ndarray:
    """AP (x100) of every class over its known rows (``"entry"``) or over the fully known rows
    (``"row"``); NaN for a class without a known positive there."""
    s, pos, known = _checked(scores, y)
    if _mask_of(y, mask) == "row":
        s, labels, _ = _complete_rows(s, pos, known)
        return per_class_ap(s, labels)
    return np.array([average_precision(s[known[:, j], j], pos[known[:, j], j]) * 100.0
                     for j in range(s.shape[1])])


def _no_negative(pos, known, mask: str) -> np.ndarray:
    """Per class: known positives and no known negative where the class is scored (its known
    rows, or the fully known rows of mask ``"row"``)."""
    if mask == "row":
        rows = known.all(axis=1)
        return pos[rows].any(axis=0) & pos[rows].all(axis=0)
    return (pos & known).any(axis=0) & ~(known & ~pos).any(axis=0)


def classes_without_negatives(y, mask: str | None = None) -> list[int]:
    """The columns of partial labels ``y`` with a known positive but no known negative where
    they are scored: their AP would be 100 whatever the scores, so the mAP leaves them out.

    >>> classes_without_negatives(partial_labels([[1, 1], [0, -1], [1, 0]]))
    [0]
    """
    y = y if is_partial(y) else partial_labels(y)
    pos, known = known_entries(y)
    return np.flatnonzero(_no_negative(pos, known, _mask_of(y, mask))).tolist()


def _scored_ap(ap: np.ndarray, pos, known, mask: str) -> np.ndarray:
    """``ap`` without the classes `_no_negative` names (nothing to rank their positives
    against)."""
    return ap[~_no_negative(pos, known, mask)]


def masked_map(scores, y, convention: str = "present", mask: str | None = None) -> float:
    """mAP x100 of partial labels (`masked_per_class_ap`, averaged as
    `spmlkit.metrics.map_from_ap`), leaving out the classes without a known negative
    (`classes_without_negatives`)."""
    _, pos, known = _checked(scores, y)
    mask = _mask_of(y, mask)
    return map_from_ap(_scored_ap(masked_per_class_ap(scores, y, mask), pos, known, mask),
                       convention)


def micro_average_precision(scores, y) -> float:
    """`spmlkit.metrics.micro_average_precision`, or of partial labels: one AP over every known
    entry."""
    y = _partial_or_full(y)
    if not is_partial(y):
        return full.micro_average_precision(scores, y)
    s, pos, known = _checked(scores, y)
    return average_precision(s[known], pos[known]) * 100.0


def weighted_average_precision(scores, y) -> float:
    """`spmlkit.metrics.weighted_average_precision`, or of partial labels: each class's AP over
    its known rows, weighted by its known positives."""
    y = _partial_or_full(y)
    if not is_partial(y):
        return full.weighted_average_precision(scores, y)
    _, pos, known = _checked(scores, y)
    scored = ~_no_negative(pos, known, "entry")
    return full.weighted_ap(masked_per_class_ap(scores, y, "entry")[scored],
                            pos.sum(axis=0)[scored])


def ndcg_at_k(scores, y, k: int, no_positive: str = "sklearn") -> float:
    """`spmlkit.metrics.ndcg_at_k`, or of partial labels: each row's known labels ranked
    (rows without a known positive: 0, or left out with ``"exclude"``).

    >>> ndcg_at_k([[0.9, 0.8, 0.1]], partial_labels([[0, 1, -1]]), 1)  # 0.9 is unknown
    1.0
    """
    return _top_k(scores, y, int(k), no_positive)[0]


def rprecision_at_k(scores, y, k: int, no_positive: str = "sklearn") -> float:
    """`spmlkit.metrics.rprecision_at_k`, or of partial labels: each row's known labels
    ranked."""
    return _top_k(scores, y, int(k), no_positive)[1]


def _top_k(scores, y, k: int, no_positive: str) -> tuple[float, float]:
    y = _partial_or_full(y)
    if not is_partial(y):
        got = full._top_k(scores, y, k, no_positive)
    else:
        s, pos, known = _checked(scores, y)
        got = top_k_means(np.where(known, s, -np.inf), pos, (k,), no_positive)
    return got[f"ndcg@{k}"], got[f"rp@{k}"]


def _masked_ranking_rows(s, pos, known):
    """Per row: LRAP, ranking loss, coverage and one-error ranking its known labels only."""
    masked = np.where(known, s, -np.inf)
    rank_all = _count_at_least(masked)
    rank_pos = _count_at_least(np.where(pos, s, -np.inf))
    n_pos = pos.sum(axis=1)
    n_neg = (known & ~pos).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        lrap = np.where(pos, rank_pos / rank_all, 0.0).sum(axis=1) / n_pos
        wrong = np.where(pos, rank_all - rank_pos, 0).sum(axis=1) / (n_pos * n_neg)
    cover = np.where(pos, rank_all, 0).max(axis=1).astype(np.float64)
    top = np.argmax(masked, axis=1)
    one = (~pos[np.arange(len(s)), top]).astype(np.float64)
    return lrap, wrong, cover, one


def _masked_ranking(s, pos, known) -> dict:
    """LRAP, ranking loss, one-error and coverage ranking each row's known labels only, from
    blocks of rows (`BLOCK_ENTRIES` entries: the ranks' int64 copies of a 20k x 10k split
    took GBs)."""
    step = max(1, BLOCK_ENTRIES // max(1, s.shape[1]))
    parts = [_masked_ranking_rows(s[i:i + step], pos[i:i + step], known[i:i + step])
             for i in range(0, len(s), step)] or [(np.zeros(0),) * 4]
    lrap, wrong, cover, one = (np.concatenate(v) for v in zip(*parts))
    n_pos = pos.sum(axis=1)
    n_neg = (known & ~pos).sum(axis=1)
    has = n_pos > 0
    coverage = _row_mean(cover, has, 0.0, "exclude")
    return {"lrap": _row_mean(lrap, has, 1.0, "exclude"),
            "ranking_loss": _row_mean(wrong, has & (n_neg > 0), 0.0, "exclude"),
            "coverage": coverage, "coverage_norm": (coverage - 1.0) / s.shape[1],
            "one_error": _row_mean(one, has, 1.0, "exclude")}


def masked_metrics(probs, y, *, convention: str = "present", threshold: float = 0.5,
                   mask: str | None = None) -> dict:
    """Every metric of `spmlkit.metrics.METRICS` on partial labels, with ``threshold``,
    ``mask``, ``known_entries`` (their share) and ``rows_scored``.

    ``"entry"``: mAP (and weighted AP) over each class's known rows, micro AP, F1s and Hamming
    loss over the known entries, the ranking and top-k metrics over each row's known labels
    (rows without a known positive left out:
    ``no_positive="exclude"`` of `spmlkit.metrics`, whatever was asked there).
    ``"row"``: `spmlkit.metrics.classic_metrics` of the fully known rows.
    """
    s, pos, known = _checked(probs, y)
    mask = _mask_of(y, mask)
    if mask == "row":
        s_rows, labels, rows = _complete_rows(s, pos, known)
        if not rows.any():
            raise ValueError("mask 'row': no row of the partial labels is fully known")
        out = classic_metrics(s_rows, labels, convention=convention, threshold=threshold)
        scored = ~_no_negative(pos, known, "row")
        ap = per_class_ap(s_rows, labels)[scored]
        out["map"] = map_from_ap(ap, convention)
        out["weighted_ap"] = full.weighted_ap(ap, labels.sum(axis=0)[scored])
        out["rows_scored"] = int(rows.sum())
    else:
        scored = ~_no_negative(pos, known, "entry")
        ap = masked_per_class_ap(s, y, "entry")[scored]
        out = {"map": map_from_ap(ap, convention), **_masked_ranking(s, pos, known),
               "micro_ap": average_precision(s[known], pos[known]) * 100.0,
               "weighted_ap": full.weighted_ap(ap, pos.sum(axis=0)[scored]),
               **_top_k_metrics(s, pos, "exclude", known)}
        pred = s >= threshold
        out["hamming_loss"] = float((pred != pos)[known].mean()) if known.any() else float("nan")
        # F1 over the known entries: unknown ones count neither as positives nor as predictions
        out["micro_f1"], out["macro_f1"] = f1_micro_macro(np.where(known, s, -1.0),
                                                          pos.astype(np.uint8), threshold)
        out = {name: out[name] for name in METRICS}
        out["threshold"] = float(threshold)
        out["rows_without_positives"] = int((~pos.any(axis=1)).sum())  # left out of ranking
        out["rows_scored"] = int((pos.any(axis=1)).sum())
    out["mask"] = mask
    out["known_entries"] = float(known.mean()) if known.size else float("nan")
    return out


def masked_evaluate(scores, y, convention: str = "present") -> dict:
    """`spmlkit.metrics.evaluate` of partial labels: the masked mAP, the classes without a
    known positive, those without a known negative (left out of the mAP), P@k / R@k ranking each
    row's known labels (``"entry"``) or of the fully known rows (``"row"``), and the mask.
    """
    s, pos, known = _checked(scores, y)
    mask = _mask_of(y, None)
    ap = masked_per_class_ap(s, y, mask)
    no_negative = _no_negative(pos, known, mask)

    out = {"map": map_from_ap(ap[~no_negative], convention),
           "classes_without_positives": np.flatnonzero(np.isnan(ap)).tolist(),
           "classes_without_negatives": np.flatnonzero(no_negative).tolist(), "mask": mask}
    if mask == "row":
        s, labels, _ = _complete_rows(s, pos, known)
    else:
        s, labels = np.where(known, s, -np.inf), pos.astype(np.uint8)
    for k in (1, 3):
        if k <= s.shape[1] and len(s):
            top = np.argsort(-s, axis=1, kind="mergesort")[:, :k]
            hits = np.take_along_axis(labels, top, axis=1).sum(axis=1)
            n_pos = labels.sum(axis=1)
            has = n_pos > 0
            out[f"p@{k}"] = float(hits.mean() / k)
            out[f"r@{k}"] = float((hits[has] / n_pos[has]).mean()) if has.any() else float("nan")
    return out


def masked_class_thresholds(probs, y, fallback: float | None = None):
    """`spmlkit.metrics.best_class_thresholds` of partial labels: each class's F1 threshold
    over its known rows (the fallback, default the known entries' global one, for a class
    without a known positive)."""
    p = np.asarray(probs)
    _, pos, known = _checked(p, y)  # (shapes, and finite scores: NaN would be a threshold)
    if fallback is None:
        fallback = masked_global_threshold(p, y)[0]
    thresholds = np.full(p.shape[1], float(fallback))
    f1 = np.full(p.shape[1], np.nan)
    for j in range(p.shape[1]):
        rows = known[:, j]
        if pos[rows, j].any():
            cand, scores = _f1_sweep(p[rows, j], pos[rows, j])
            best = int(np.argmax(scores))
            thresholds[j], f1[j] = cand[best], scores[best]
    return thresholds, f1


def masked_select_thresholds(probs, y, class_names=None) -> dict:
    """`spmlkit.metrics.select_thresholds` of partial val labels (over the known entries)."""
    t_global, f1_global = masked_global_threshold(probs, y)
    t_class, f1_class = masked_class_thresholds(probs, y, t_global)
    return {"chosen_on": "val", "rows": int(np.shape(probs)[0]), "mask": _mask_of(y, None),
            "known_entries": float(known_entries(y)[1].mean()),
            "global": t_global, "global_micro_f1": f1_global, "per_class": t_class.tolist(),
            "per_class_f1": [None if np.isnan(v) else float(v) for v in f1_class],
            "class_names": list(class_names) if class_names is not None else None}


def masked_global_threshold(probs, y) -> tuple[float, float]:
    """`spmlkit.metrics.best_global_threshold` over the known entries of partial labels."""
    p = np.asarray(probs)
    _, positive, known = _checked(p, y)
    if not positive.any():
        return 0.5, float("nan")
    return _best_f1(p[known], positive[known])


# ---- one split's scores, whichever its labels: what a run calls --------------------------------
# Full 0 / 1 labels go to `spmlkit.metrics` as they are (bit-identical results); `PartialLabels`
# to the masked metrics above.

def split_map(scores, y, convention: str = "present") -> float:
    """`spmlkit.metrics.map_score`, or `masked_map` of partial labels."""
    return masked_map(scores, y, convention) if is_partial(y) else \
        full.map_score(scores, y, convention)


def split_metric(name: str, probs, y, *, convention: str = "present",
                 threshold: float | str = 0.5) -> float:
    """`spmlkit.metrics.metric_score`, or the same metric of `masked_metrics` (``"chosen"``:
    the known entries' global micro-F1 threshold)."""
    if not is_partial(y):
        return full.metric_score(name, probs, y, convention=convention, threshold=threshold)
    full.check_metric(name)
    if threshold == "chosen":
        threshold = masked_global_threshold(probs, y)[0]
    return masked_metrics(probs, y, convention=convention, threshold=threshold)[name]


def split_metrics(probs, y, *, convention: str = "present", threshold: float = 0.5) -> dict:
    """`spmlkit.metrics.classic_metrics`, or `masked_metrics` of partial labels."""
    if is_partial(y):
        return masked_metrics(probs, y, convention=convention, threshold=threshold)
    return classic_metrics(probs, y, convention=convention, threshold=threshold)


def split_evaluate(scores, y, convention: str = "present") -> dict:
    """`spmlkit.metrics.evaluate`, or `masked_evaluate` of partial labels."""
    return masked_evaluate(scores, y, convention) if is_partial(y) else \
        full.evaluate(scores, y, convention)


def split_thresholds(probs, y, class_names=None) -> dict:
    """`spmlkit.metrics.select_thresholds`, or `masked_select_thresholds` of partial labels."""
    return masked_select_thresholds(probs, y, class_names) if is_partial(y) else \
        full.select_thresholds(probs, y, class_names)
