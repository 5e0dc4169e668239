"""Thresholding rules beside the F1-chosen thresholds: from scores to a set of labels per row.

`spmlkit.metrics.select_thresholds` chooses one global or per-class probability threshold on
val (max F1). These rules decide from the scores themselves and what an SPML method estimates:

* ``rcut`` (rank cut; Yang 2001): each row takes its ``k`` highest-scored labels.
* ``lcard`` (label cardinality; Read et al., MULAN / utiml): one global threshold, the score
  ``t`` at which the mean number of labels per row (``p >= t``) is closest to the expected
  cardinality ``k`` (EPR / ROLE's k: a run's ``k``); ties go to the higher ``t``.
* ``pcut`` (proportional cut; Yang 2001): class j is given to the ``round(prior_j * N)``
  highest-scored of the N rows (priors: the val labels' positive rates, or estimated ones such
  as CRISP's).
* ``mcut`` (maximum cut; Largeron, Moulin and Géry, IDA 2012): per row, the scores sorted
  from the highest; the threshold is the midpoint of the largest gap between two consecutive
  scores (the first such gap on a tie): the labels above the gap are predicted.

``lcard`` and ``pcut`` are set-level rules: they read every row given (as utiml applies them to
a prediction matrix), so they suit a batch of rows, not a single one. Ties between equal scores
go to the lower column (``rcut``) or row (``pcut``) index.

>>> p = [[0.9, 0.8, 0.1], [0.3, 0.6, 0.5]]
>>> apply_rule("rcut", p, k=1).astype(int).tolist()
[[1, 0, 0], [0, 1, 0]]
>>> apply_rule("mcut", p).astype(int).tolist()
[[1, 1, 0], [0, 1, 1]]
"""
from __future__ import annotations

import numpy as np

__all__ = ["RULES", "apply_rule", "rcut", "lcard", "lcard_threshold", "pcut", "mcut"]

#: the rules `apply_rule` knows: name -> what it needs
RULES = {"rcut": "k (labels per row)", "lcard": "k (expected labels per row)",
         "pcut": "priors (one rate per class)", "mcut": "nothing"}


def _scores(probs) -> np.ndarray:
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"scores must be N x L, got shape {p.shape}")
    if not np.isfinite(p).all():
        raise ValueError(f"scores hold {int((~np.isfinite(p)).sum())} non-finite value(s)")
    return p


def rcut(probs, k: int) -> np.ndarray:
    """N x L bool: each row's ``k`` highest scores (ties: the lower column first)."""
    p = _scores(probs)
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= p.shape[1]):
        raise ValueError(f"rcut: k must be a whole number in 1..{p.shape[1]} (the number of "
                         f"classes), got {k!r}")
    top = np.argsort(-p, axis=1, kind="stable")[:, :k]
    out = np.zeros(p.shape, dtype=bool)
    np.put_along_axis(out, top, True, axis=1)
    return out


def lcard_threshold(probs, cardinality: float) -> float:
    """The score ``t`` whose predicted cardinality ``mean_i |{j: p_ij >= t}|`` is closest to
    ``cardinality`` (candidates: the distinct scores; a tie goes to the higher ``t``)."""
    p = _scores(probs)
    if not 0 < cardinality <= p.shape[1]:
        raise ValueError(f"lcard: k (the expected labels per row) must be > 0 and at most "
                         f"{p.shape[1]} (the number of classes), got {cardinality!r}; a larger "
                         f"k would give every row every class")
    values, counts = np.unique(p, return_counts=True)  # ascending
    at_least = np.cumsum(counts[::-1])[::-1] / p.shape[0]  # mean labels per row at p >= value
    gap = np.abs(at_least - cardinality)
    best = np.flatnonzero(gap == gap.min())[-1]  # the highest value among the closest
    return float(values[best])


def lcard(probs, cardinality: float) -> np.ndarray:
    """N x L bool: ``p >= lcard_threshold(probs, cardinality)``."""
    return _scores(probs) >= lcard_threshold(probs, cardinality)


def pcut(probs, priors) -> np.ndarray:
    """N x L bool: class j given to its ``round(priors[j] * N)`` highest-scored rows (ties: the
    lower row first)."""
    p = _scores(probs)
    prior = np.asarray(priors, dtype=np.float64).ravel()
    if prior.shape != (p.shape[1],) or not ((prior >= 0) & (prior <= 1)).all():
        raise ValueError(f"pcut: priors must be {p.shape[1]} rates in [0, 1], got "
                         f"{prior.shape[0]} value(s) {prior[:5].tolist()}")
    take = np.round(prior * p.shape[0]).astype(np.int64)
    order = np.argsort(-p, axis=0, kind="stable")
    out = np.zeros(p.shape, dtype=bool)
    for j in range(p.shape[1]):
        out[order[:take[j], j], j] = True
    return out


def mcut(probs) -> np.ndarray:
    """N x L bool: per row, the labels above the largest gap between consecutive sorted
    scores (its midpoint is the threshold); a row of L = 1 label takes it."""
    p = _scores(probs)
    if p.shape[1] < 2:
        return np.ones(p.shape, dtype=bool)
    s = -np.sort(-p, axis=1)
    gap = np.argmax(s[:, :-1] - s[:, 1:], axis=1)
    rows = np.arange(len(p))
    threshold = (s[rows, gap] + s[rows, gap + 1]) / 2.0
    return p > threshold[:, None]


def apply_rule(name: str, probs, *, k: float | None = None, priors=None) -> np.ndarray:
    """The labels rule ``name`` (one of `RULES`) gives ``probs`` (N x L): ``rcut`` and
    ``lcard`` take ``k`` (``rcut`` rounds it, at least 1), ``pcut`` takes ``priors``.

    Raises:
        ValueError: an unknown rule (listing them), a missing or unused ``k`` / ``priors``.
    """
    if name not in RULES:
        raise ValueError(f"unknown threshold rule {name!r}; choose one of {', '.join(RULES)}")
    needs = {"rcut": "k", "lcard": "k", "pcut": "priors", "mcut": None}[name]
    for what, value in (("k", k), ("priors", priors)):
        if value is None and needs == what:
            raise ValueError(f"threshold rule {name} needs {RULES[name]}")
        if value is not None and needs != what:
            raise ValueError(f"threshold rule {name} does not use {what}")
    if name == "rcut":
        return rcut(probs, max(1, int(round(k))))
    if name == "lcard":
        return lcard(probs, k)
    if name == "pcut":
        return pcut(probs, priors)
    return mcut(probs)
