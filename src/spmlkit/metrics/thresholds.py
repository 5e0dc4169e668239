"""Decision thresholds chosen on the validation split by F1 (the thresholds ``thresholds.json``
stores and ``spml predict`` applies): one global threshold (max micro-F1) and one per class.

Full labels or partial ones (`PartialLabels`): partial labels are swept over their known
entries (each class over its known rows), whatever their mask.
"""
from __future__ import annotations

import numpy as np

from .ap import BLOCK_ENTRIES, _as_scores, sorted_columns
from .partial import checked_partial, is_partial, mask_of

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

    Partial labels (`PartialLabels`): over their known entries.

    Returns:
        ``(threshold, micro_f1)``; ``(0.5, nan)`` when ``y`` has no positive (F1 is undefined).

    >>> best_global_threshold([[0.9, 0.2], [0.6, 0.4]], [[1, 0], [0, 1]])
    (0.4, 0.8)
    """
    if is_partial(y):
        p = np.asarray(probs)
        _, positive, known = checked_partial(p, y)  # (shapes; NaN would be a threshold)
        if not positive.any():
            return 0.5, float("nan")
        return _best_f1(p[known], positive[known])
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

    Candidates and ties as `best_global_threshold`, per column (of partial labels: over the
    rows where the class is known). A class without a positive in ``y`` has no F1: it gets
    ``fallback`` (default: the global micro-F1 threshold) and F1 NaN.

    Returns:
        ``(thresholds (L,), f1 (L,))``.

    >>> t, f1 = best_class_thresholds([[0.9, 0.2], [0.6, 0.4], [0.3, 0.1]], [[1, 0], [1, 1],
    ...                                                                     [0, 0]])
    >>> t.tolist(), f1.tolist()
    ([0.6, 0.4], [1.0, 1.0])
    """
    if is_partial(y):
        p = np.asarray(probs)
        _, positive, known = checked_partial(p, y)
    else:
        p, positive = _as_scores(probs, y, keep_float32=True)
        known = None
    if fallback is None:
        fallback = best_global_threshold(p, y if known is not None else positive)[0]
    thresholds = np.full(p.shape[1], float(fallback))
    f1 = np.full(p.shape[1], np.nan)
    for j in range(p.shape[1]):
        rows = slice(None) if known is None else known[:, j]
        if positive[rows, j].any():
            cand, scores = _f1_sweep(p[rows, j], positive[rows, j])
            best = int(np.argmax(scores))
            thresholds[j], f1[j] = cand[best], scores[best]
    return thresholds, f1


def select_thresholds(probs, y, class_names=None) -> dict:
    """The decision thresholds a run stores (``thresholds.json``), chosen on ``(probs, y)``
    (the validation split): the global micro-F1 threshold and the per-class F1 thresholds, with
    the F1 each reaches there; of partial labels (over their known entries) with their mask and
    the share of entries known."""
    out = {"chosen_on": "val", "rows": int(np.shape(probs)[0])}
    if is_partial(y):
        out.update(mask=mask_of(y), known_entries=float((np.asarray(y) != 0).mean()))
    else:
        probs, y = _as_scores(probs, y, keep_float32=True)
    t_global, f1_global = best_global_threshold(probs, y)
    t_class, f1_class = best_class_thresholds(probs, y, t_global)
    return _thresholds_record(out, t_global, f1_global, t_class, f1_class, class_names)


def _thresholds_record(out: dict, t_global, f1_global, t_class, f1_class, class_names) -> dict:
    return {**out, "global": t_global, "global_micro_f1": f1_global,
            "per_class": t_class.tolist(),
            "per_class_f1": [None if np.isnan(v) else float(v) for v in f1_class],
            "class_names": list(class_names) if class_names is not None else None}


def runs_thresholds(probs, y, class_names=None) -> list[dict]:
    """`select_thresholds` of R runs' probabilities (R x N x L) chosen on the same full labels
    ``y``, equal to each run's own bit for bit: each run's global threshold as there, the
    per-class F1 sweeps of every run and class from one sort of all the columns
    (`_column_sweeps`: `_f1_sweep`'s candidates and F1s at the ends of the groups of tied
    scores) instead of two ``np.unique`` a column. Partial labels, or one run: run by run.

    Raises:
        ValueError: as `select_thresholds` (non-finite scores, bad shapes), or ``probs`` not
            R x N x L.
    """
    probs = np.asarray(probs)
    if probs.ndim != 3:
        raise ValueError(f"runs_thresholds: R x N x L probabilities, got {probs.shape}")
    if is_partial(y) or len(probs) < 2:
        return [select_thresholds(p, y, class_names) for p in probs]
    runs, n, classes = probs.shape
    checked = [_as_scores(p, y, keep_float32=True) for p in probs]  # (each run's own checks)
    positive = checked[0][1] > 0
    per = max(1, BLOCK_ENTRIES // max(1, n * classes))
    sweeps = [_column_sweeps(np.stack([p for p, _ in checked[r:r + per]]), positive)
              for r in range(0, runs, per)]
    t_all, f1_all = (np.concatenate(v) for v in zip(*sweeps))
    has = positive.any(axis=0)
    out = []
    for r, (p, labels) in enumerate(checked):
        t_global, f1_global = best_global_threshold(p, labels)
        t_class = np.where(has, t_all[r], float(t_global))
        out.append(_thresholds_record({"chosen_on": "val", "rows": n}, t_global, f1_global,
                                      t_class, f1_all[r], class_names))
    return out


def _column_sweeps(s: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each column's best threshold and its F1, as `best_class_thresholds` sweeps them
    (`_f1_sweep`, the first of the highest F1 from the top), of R runs' scores ``s``
    (R x N x L) against ``positive`` (N x L bool): every column sorted once, each group of
    tied scores scored at its last entry (the entries predicted positive there: its rank;
    the true positives: the positives up to it). R x L each; F1 NaN where a class has no
    positive (its threshold then the caller's)."""
    s, hits, end = sorted_columns(s.transpose(0, 2, 1), positive.T)  # R x L x N
    n = s.shape[-1]
    tp = np.cumsum(hits, axis=-1, dtype=np.int64)
    predicted = np.arange(1, n + 1, dtype=np.int64)
    total = positive.sum(axis=0, dtype=np.int64)[:, None]  # L x 1
    f1 = np.where(end, 2.0 * tp / (predicted + total), -np.inf)
    best = np.argmax(f1, axis=-1)[..., None]
    thresholds = np.take_along_axis(s, best, axis=-1)[..., 0].astype(np.float64)
    f1 = np.take_along_axis(f1, best, axis=-1)[..., 0]
    return thresholds, np.where(positive.any(axis=0), f1, np.nan)
