"""Per-label calibration: expected calibration error per class, reliability curves, and a
per-class temperature fitted on val.

SPML models are miscalibrated by construction (an assumed-negative loss pushes the unobserved
positives down; Zhou et al. recommend a temperature for EM), so a probability of 0.7 need not
mean 70 %. For each class j, the scores are cut into ``bins`` equal-width bins on [0, 1];

    ECE_j = sum_b (n_bj / n_j) * |positive rate in b - mean score in b|

(Naeini et al. 2015, Guo et al. 2017, per label). Labels may be full 0 / 1 or partial
(`spmlkit.metrics.partial`: then over each class's known rows).

A per-class temperature T_j rescales the logits, ``sigmoid(logit / T_j)``, T_j minimising the
binary cross-entropy of the val rows (a bounded 1-D search over ``log T`` in [-4, 4]); it changes
no ranking (AP, mAP, the ranking metrics stay as they are), only the probabilities.

>>> round(float(class_ece([[0.9], [0.9], [0.1], [0.1]], [[1], [0], [0], [0]], bins=2)[0]), 3)
0.25
"""
from __future__ import annotations

import numpy as np

__all__ = ["class_ece", "reliability", "fit_class_temperatures", "unfitted_classes",
           "apply_temperatures"]

#: a probability is never exactly 0 or 1 in a logit (float32 sigmoid saturates at about 17)
EPS = 1e-7
#: the most bins a reliability curve or an ECE takes (a billion asked numpy for gigabytes)
MAX_BINS = 100_000


def _labels(probs, y):
    from .metrics import is_partial, known_entries

    p = np.asarray(probs, dtype=np.float64)
    if is_partial(y):
        pos, known = known_entries(y)
    else:
        from .labels import validate_full_labels

        pos = validate_full_labels(y, "calibration labels") > 0
        known = np.ones(pos.shape, dtype=bool)
    if p.shape != pos.shape:
        raise ValueError(f"scores {p.shape} and labels {pos.shape} must have the same shape")
    if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise ValueError("calibration needs probabilities in [0, 1]")
    return p, pos, known


def _bins(p: np.ndarray, bins: int) -> np.ndarray:
    if int(bins) != bins or not 1 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be a whole number in [1, {MAX_BINS}], got {bins}")
    return np.minimum((p * bins).astype(np.int64), bins - 1)


def class_ece(probs, y, bins: int = 15) -> np.ndarray:
    """ECE of every class (L,), over its (known) rows; NaN for a class without one."""
    p, pos, known = _labels(probs, y)
    b = _bins(p, bins)
    out = np.full(p.shape[1], np.nan)
    for j in range(p.shape[1]):
        rows = known[:, j]
        if not rows.any():
            continue
        n = np.bincount(b[rows, j], minlength=bins).astype(np.float64)
        conf = np.bincount(b[rows, j], p[rows, j], minlength=bins)
        hit = np.bincount(b[rows, j], pos[rows, j].astype(np.float64), minlength=bins)
        out[j] = float(np.abs(hit - conf).sum() / n.sum())
    return out


def reliability(probs, y, bins: int = 15) -> dict:
    """The reliability curve of all (known) entries pooled: per bin its ``count``, mean score
    ``confidence`` and ``positive_rate`` (NaN for an empty bin), and the pooled ``ece``."""
    p, pos, known = _labels(probs, y)
    b = _bins(p, bins)[known]
    n = np.bincount(b, minlength=bins).astype(np.float64)
    conf = np.bincount(b, p[known], minlength=bins)
    hit = np.bincount(b, pos[known].astype(np.float64), minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"edges": np.linspace(0.0, 1.0, bins + 1), "count": n,
                "confidence": conf / n, "positive_rate": hit / n,
                "ece": float(np.abs(hit - conf).sum() / n.sum()) if n.sum() else float("nan")}


def _logits(probs: np.ndarray) -> np.ndarray:
    p = np.clip(probs, EPS, 1.0 - EPS)
    return np.log(p) - np.log1p(-p)


def unfitted_classes(y) -> list[int]:
    """The columns of labels ``y`` whose (known) rows are all of one kind: no positive or no
    negative, so no temperature can be fitted for them (`fit_class_temperatures` keeps 1)."""
    _, pos, known = _labels(np.zeros(np.shape(y)), y)
    return [j for j in range(pos.shape[1])
            if not (pos[known[:, j], j].any() and (~pos[known[:, j], j]).any())]


def fit_class_temperatures(probs, y) -> np.ndarray:
    """One temperature per class (L,), fitted on ``(probs, y)`` (the val split): T_j minimises
    the mean binary cross-entropy of ``sigmoid(logit(p) / T_j)`` over the class's (known) rows;
    1 for a class whose rows are all of one kind (no finite optimum: `unfitted_classes`), with
    a ``UserWarning`` naming those columns."""
    import warnings

    temps, unfitted = _fit_temperatures(probs, y)
    if unfitted:
        warnings.warn(f"no temperature fitted for {len(unfitted)} class(es) (columns "
                      f"{unfitted[:10]}{' ...' if len(unfitted) > 10 else ''}): their rows hold "
                      f"no positive or no negative; T = 1 kept (the probabilities unchanged)",
                      UserWarning, stacklevel=2)
    return temps


def _fit_temperatures(probs, y) -> tuple[np.ndarray, list[int]]:
    from scipy.optimize import minimize_scalar

    p, pos, known = _labels(probs, y)
    z = _logits(p)
    temps = np.ones(p.shape[1])
    unfitted = []
    for j in range(p.shape[1]):
        rows = known[:, j]
        t, s = pos[rows, j], z[rows, j]
        if not (t.any() and (~t).any()):
            unfitted.append(j)
            continue

        def nll(log_t, s=s, t=t):
            x = s / np.exp(log_t)
            return float(np.mean(np.logaddexp(0.0, x) - t * x))  # BCE with logits

        temps[j] = float(np.exp(minimize_scalar(nll, bounds=(-4.0, 4.0), method="bounded",
                                                options={"xatol": 1e-6}).x))
    return temps, unfitted


def apply_temperatures(probs, temperatures) -> np.ndarray:
    """``sigmoid(logit(probs) / T)``, one temperature per class (or one for all)."""
    p = np.asarray(probs, dtype=np.float64)
    t = np.asarray(temperatures, dtype=np.float64)
    if (t <= 0).any():
        raise ValueError("temperatures must be > 0")
    return 1.0 / (1.0 + np.exp(-_logits(p) / t))
