"""Label sets with a stated coverage: one split-conformal threshold per class (LAMC's scheme,
arXiv 2509.10689), calibrated on held-out rows whose positives are known.

For class j, the calibration scores are the model's probabilities ``p_ij`` on the ``n_j``
calibration rows where j is a known positive: every positive of fully labelled rows, the known
positives (1) of partially labelled ones, each row's one observed positive of single-positive
rows. At coverage ``1 - alpha`` the threshold ``t_j`` is the ``k_j``-th smallest of those
scores, ``k_j = floor(alpha * (n_j + 1))`` (split conformal prediction's finite-sample
quantile), and class j is in a row's set when ``p_ij >= t_j``. With ``k_j = 0`` (fewer than
``1 / alpha - 1`` calibration positives: 9 at coverage 0.9, 19 at 0.95) no threshold can
promise the coverage and ``t_j = 0``: the class is in every set (`CoverageThresholds.always`
names them).

**The guarantee** (per class, over the draw of the calibration and test rows):
``1 - alpha <= P(j in the set | j is a true positive) < 1 - alpha + 1 / (n_j + 1)``
(the upper bound holds for scores without ties), **if** the calibration rows where j is a
known positive and the test rows where j is a true positive are exchangeable (alike in
distribution, drawn from the same population). That holds for fully labelled calibration
rows split at random from the same data as the test rows. For partially labelled rows it
needs the known positives of j to be a random sample of the true ones; for single-positive
rows, that the chance that j is the one observed positive of a row does not depend on the row
(its features, its other labels). Uniform draws among a row's positives (the SPML protocol)
meet this only when every row has the same number of positives: a row with three positives
shows j a third of the time, a row with one always, so rows with many labels are
under-represented (measured in results/coverage-tables.csv). It is a marginal, per-class
guarantee: not for each row, not for all classes at once.

>>> t = coverage_thresholds([[0.9], [0.3], [0.6], [0.8], [0.2]], [[1], [1], [1], [1], [0]], 0.75)
>>> t.counts.tolist(), t.ranks.tolist(), t.thresholds.tolist()
([4], [1], [0.3])
>>> t.apply([[0.31], [0.29]]).astype(int).tolist()
[[1], [0]]
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["CoverageThresholds", "coverage_thresholds", "calibration_positives",
           "check_coverage", "min_positives", "recall_floor"]


def check_coverage(coverage, where: str = "coverage") -> float:
    """``coverage`` as a float in (0, 1), or a ValueError that names ``where``."""
    if isinstance(coverage, (bool, np.bool_, str, bytes)) or not isinstance(
            coverage, (int, float, np.number)) or not 0.0 < float(coverage) < 1.0:
        raise ValueError(f"{where} must be a number strictly between 0 and 1 (the share of "
                         f"each class's true positives its sets should hold, e.g. 0.9), got "
                         f"{coverage!r}")
    return float(coverage)


def _rank(n, coverage: float):
    """``floor(alpha * (n + 1))`` without float noise (``1 - 0.9`` is 0.0999...98)."""
    alpha = 1.0 - coverage
    return np.floor(np.round(alpha * (np.asarray(n, dtype=np.float64) + 1.0), 9)).astype(
        np.int64)


def min_positives(coverage: float) -> int:
    """The fewest calibration positives a class needs for a threshold above 0 at ``coverage``.

    >>> min_positives(0.9), min_positives(0.95), min_positives(0.8)
    (9, 19, 4)
    """
    coverage = check_coverage(coverage)
    n = max(0, math.ceil(1.0 / (1.0 - coverage)) - 2)
    while _rank(n, coverage) < 1:
        n += 1
    return n


def calibration_positives(y, num_classes: int | None = None,
                          where: str = "calibration labels") -> np.ndarray:
    """The N x L bool matrix of known positives of calibration labels ``y``: full 0/1 labels
    (N x L), partial ones (1 known positive, -1 known negative, 0 or NaN unknown;
    `spmlkit.metrics.PartialLabels` or the plain matrix), or 1-D column indices (each
    row's single observed positive; ``num_classes`` columns, default the largest index + 1).

    Raises:
        ValueError: other values (named, with the first row holding one), a 1-D index
            outside ``0 .. num_classes - 1``, not 1-D or 2-D.

    >>> calibration_positives([2, 0], 3).astype(int).tolist()
    [[0, 0, 1], [1, 0, 0]]
    >>> calibration_positives([[1, -1], [0, 1]]).astype(int).tolist()
    [[1, 0], [0, 1]]
    """
    from .labels import label_values

    arr = np.asarray(label_values(y, where))
    if arr.ndim == 1:
        if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and np.isfinite(arr).all()
                                               and (arr == np.round(arr)).all()):
            raise ValueError(f"{where}: 1-D labels are each row's observed positive as a column "
                             f"index 0..L-1, got {arr.dtype} values {arr[:5].tolist()}")
        idx = arr.astype(np.int64)
        width = int(idx.max()) + 1 if num_classes is None and idx.size else int(num_classes or 0)
        bad = (idx < 0) | (idx >= width)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{where}: row {row} names column {int(idx[row])}, outside "
                             f"0..{width - 1} (the {width} classes)")
        out = np.zeros((len(idx), width), dtype=bool)
        out[np.arange(len(idx)), idx] = True
        return out
    if arr.ndim != 2:
        raise ValueError(f"{where} must be N x L labels or 1-D column indices, got shape "
                         f"{arr.shape}")
    if arr.dtype.kind == "b":
        return arr.copy()
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{where} must be numbers (1 positive; 0, -1 or NaN otherwise), got "
                         f"{arr.dtype}")
    values = np.where(np.isnan(arr), 0, arr) if arr.dtype.kind == "f" else arr
    bad = (values != 1) & (values != 0) & (values != -1)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        found = sorted(set(values[bad].tolist()))[:5]
        raise ValueError(f"{where} hold only 1 (positive), 0 (negative or unknown), -1 (known "
                         f"negative) and NaN (unknown); found {found} (first at row {row})")
    if num_classes is not None and arr.shape[1] != num_classes:
        raise ValueError(f"{where} have {arr.shape[1]} columns for {num_classes} classes")
    return values == 1


@dataclass
class CoverageThresholds:
    """Per-class conformal thresholds at ``coverage`` (made by `coverage_thresholds`).

    ``thresholds`` (L): class j is in a set where ``p >= thresholds[j]``; ``counts`` (L): the
    calibration positives ``n_j``; ``ranks`` (L): ``k_j`` (which smallest score is the
    threshold; 0: the class is in every set)."""

    coverage: float
    thresholds: np.ndarray
    counts: np.ndarray
    ranks: np.ndarray

    @property
    def always(self) -> np.ndarray:
        """The classes (column indices) with too few calibration positives for ``coverage``
        (fewer than `min_positives`): threshold 0, in every set."""
        return np.flatnonzero(self.ranks == 0)

    @property
    def upper(self) -> np.ndarray:
        """The upper bound of each class's coverage, ``1 - alpha + 1 / (n_j + 1)`` (1 for a
        class in every set)."""
        up = self.coverage + 1.0 / (self.counts + 1.0)
        return np.where(self.ranks == 0, 1.0, np.minimum(up, 1.0))

    def apply(self, probs) -> np.ndarray:
        """N x L bool: each row's set, ``probs >= thresholds``."""
        p = np.asarray(probs, dtype=np.float64)
        if p.ndim != 2 or p.shape[1] != len(self.thresholds):
            raise ValueError(f"scores must be N x {len(self.thresholds)} (one column per "
                             f"calibrated class), got shape {p.shape}")
        return p >= self.thresholds[None, :]

    def to_dict(self, class_names=None) -> dict:
        """What a run's JSON output records: the coverage, each class's threshold and
        calibration positives, the classes in every set."""
        names = list(class_names) if class_names is not None else list(
            range(len(self.thresholds)))
        return {"kind": "coverage", "coverage": self.coverage,
                "values": dict(zip(names, map(float, self.thresholds))),
                "calibration_positives": dict(zip(names, map(int, self.counts))),
                "always_included": [names[j] for j in self.always]}


def coverage_thresholds(probs, positives, coverage: float) -> CoverageThresholds:
    """Per-class split-conformal thresholds at ``coverage`` (module docstring: the guarantee
    and its assumption).

    Args:
        probs: N x L probabilities of the calibration rows (held out from training).
        positives: their labels, any form `calibration_positives` reads (full, partial, 1-D
            single positives as column indices, or an N x L bool matrix of known positives).
        coverage: ``1 - alpha`` in (0, 1).

    Returns:
        `CoverageThresholds`: ``t_j`` = the ``floor(alpha (n_j + 1))``-th smallest score of
        class j's calibration positives, 0 where that rank is 0.

    Raises:
        ValueError: a coverage outside (0, 1), scores outside [0, 1] or non-finite, shapes
            that differ, labels `calibration_positives` refuses.
    """
    coverage = check_coverage(coverage)
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"calibration scores must be N x L, got shape {p.shape}")
    if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise ValueError("calibration scores must be probabilities in [0, 1] (finite)")
    pos = calibration_positives(positives, p.shape[1])
    if pos.shape != p.shape:
        raise ValueError(f"calibration scores {p.shape} and labels {pos.shape} must have the "
                         f"same shape")
    counts = pos.sum(axis=0).astype(np.int64)
    ranks = _rank(counts, coverage)
    thresholds = np.zeros(p.shape[1], dtype=np.float64)
    for j in np.flatnonzero(ranks > 0):
        scores = p[pos[:, j], j]
        thresholds[j] = np.partition(scores, ranks[j] - 1)[ranks[j] - 1]
    return CoverageThresholds(coverage, thresholds, counts, ranks)


def recall_floor(n, m, coverage: float, delta: float = 0.05) -> np.ndarray:
    """The lowest empirical recall over ``m`` test positives that the guarantee still explains
    at level ``delta``: the ``delta``-quantile of ``X / m``, ``X`` beta-binomial
    ``(m, n + 1 - k, k)`` (a class's coverage given its ``n`` calibration positives is
    ``Beta(n + 1 - k, k)``, Vovk 2012; ``k = floor(alpha (n + 1))``). ``coverage`` minus it is
    the finite-sample slack of a measured recall. 1 where ``k = 0`` (always included); NaN
    where ``m = 0``.

    >>> recall_floor([99, 9], [100, 100], 0.9).tolist()   # 0.9 stated: slack 0.08, 0.19
    [0.82, 0.71]
    """
    from scipy.stats import betabinom

    coverage = check_coverage(coverage)
    n = np.atleast_1d(np.asarray(n, dtype=np.int64))
    m = np.broadcast_to(np.asarray(m, dtype=np.int64), n.shape)
    k = _rank(n, coverage)
    out = np.full(n.shape, np.nan)
    for i in range(len(n)):
        if m[i] <= 0:
            continue
        out[i] = 1.0 if k[i] == 0 else betabinom(int(m[i]), int(n[i] + 1 - k[i]),
                                                 int(k[i])).ppf(delta) / m[i]
    return out
