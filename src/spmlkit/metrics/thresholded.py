"""Metrics of 0 / 1 predictions: Hamming loss and F1 at a threshold, and the precision of a
method's pseudo-labels.

A thresholded metric predicts positive where ``probs >= threshold``; a run takes its numbers at
the global threshold chosen on val (`spmlkit.metrics.THRESHOLD_POLICY`).
"""
from __future__ import annotations

import numpy as np

from ..labels import validate_full_labels
from .ap import _as_scores

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


def _f1_pair(p: np.ndarray, y: np.ndarray, threshold: float, known=None) -> dict:
    """Micro and macro F1 from one count of the entries (``known``, as every joint function
    takes it: unused, unknown entries of partial labels come predicted negative and negative,
    which no F1 counts)."""
    micro, macro = f1_micro_macro(p, y, threshold)
    return {"micro_f1": micro, "macro_f1": macro}


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
