"""Partial evaluation labels, and the one formatting step through which every metric scores them.

**The encoding of a partial evaluation matrix** is spmlkit's one label encoding
(`spmlkit.labels`): ``1`` a known positive, ``-1`` a known negative, ``0`` unknown; ``NaN``
(an empty cell of a table) is unknown too. A 1 / 0 / NaN matrix (OpenImages' "0 = verified
negative") must write its negatives as -1: a partial matrix without any -1 is refused (every
class would score AP 100 against positives only).

Two masks (``mask``):

* ``"entry"`` (default; the OpenImages rule): each metric scores the known entries as its
  record's ``partial`` rule says (`PARTIAL_RULES`): mAP each class over the rows where it is
  known, the ranking metrics each row over its known labels, the micro averages the known
  entries pooled.
* ``"row"`` (the L48 benchmark's rule): only the rows whose every label is known are scored,
  with the ordinary metrics.

Classes without a known positive: ``convention`` as everywhere (``"present"`` leaves them out,
``"official"`` scores them 0). A class with known positives and no known negative (where it is
scored) ranks its positives against nothing, an AP of 100 whatever the scores: it is left out
of every per-class metric (mAP, weighted AP, macro F1) under both conventions, and named by
`classes_without_negatives`.

`PartialLabels` is such a matrix as it travels through a run (a source reads it, the engine
selects epochs on it, the result scores the test rows with it): an int8 ndarray that carries
its ``mask``. The metrics of `spmlkit.metrics` take it wherever they take full labels
(``map_score``, ``metric_score``, ``classic_metrics``, ``evaluate``, ``select_thresholds``):
`format_labels` turns it into what a metric's own function reads, full 0 / 1 labels, as the
metric's record says; full labels are scored as they are (bit-identical results).

>>> y = partial_labels([[1, -1], [-1, 0], [0, 1]])
>>> from spmlkit.metrics import map_score
>>> map_score([[0.9, 0.2], [0.1, 0.8], [0.7, 0.6]], y)
100.0
"""
from __future__ import annotations

import numpy as np

from ..labels import label_values

__all__ = ["MASKS", "PARTIAL_RULES", "PartialLabels", "partial_labels", "is_partial",
           "partial_or_full", "known_entries", "checked_partial", "classes_without_negatives",
           "format_labels"]

#: the masks of a partial evaluation matrix
MASKS = ("entry", "row")

#: how a metric scores partial labels under mask ``"entry"`` (`format_labels`): the rule a
#: metric's record names (``Metric(partial=...)``); a record without one is refused there by
#: name. Every rule leaves out the rows without any known label (nothing to score); under mask
#: ``"row"`` every rule scores the fully known rows.
PARTIAL_RULES = {
    "per_class": "each class over the rows where it is known: an unknown entry enters as a "
                 "negative scored below every score (predicted negative at any threshold), "
                 "which moves no value read from the positives' ranks and the positive "
                 "predictions (AP, F1); a class with known positives and no known negative is "
                 "left out",
    "per_row": "each row over its known labels: an unknown label enters as a negative ranked "
               "below every known one, which moves no value read from where the row's "
               "positives rank (LRAP, coverage, one-error, nDCG); a metric's joint function "
               "also gets the known mask (the ranking loss counts the known negatives' pairs, "
               "the normalised coverage divides by the row's known labels); rows without a "
               "known positive as no_positive='exclude'",
    "entries": "the known entries pooled, as one column (micro averages, Hamming loss)",
    "full_rows": "the rows whose every label is known, as full labels",
}


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
    """Whether ``y`` is a `PartialLabels` matrix (what the metrics dispatch on)."""
    return isinstance(y, PartialLabels)


def partial_or_full(y):
    """``y`` as `PartialLabels` when it is partial (already, or a label matrix holding -1 or
    NaN: the partial encoding), else as it is (full labels): what the metrics that read a plain
    -1 / 0 / 1 matrix as partial (``micro_average_precision``, ``ndcg_at_k``, ...) dispatch
    on."""
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


def checked_partial(scores, y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(scores as float64, positive, known)`` of partial labels ``y``, the scores checked
    (the labels' shape, finite)."""
    s = np.asarray(scores, dtype=np.float64)
    pos, known = known_entries(y)
    if s.shape != pos.shape:
        raise ValueError(f"scores {s.shape} and labels {pos.shape} must have the same shape")
    if not np.isfinite(s).all():
        raise ValueError(f"scores hold {int((~np.isfinite(s)).sum())} non-finite value(s)")
    return s, pos, known


def mask_of(y, mask: str | None = None) -> str:
    """``mask``, or the one ``y`` carries (``"entry"`` for a plain matrix)."""
    mask = mask if mask is not None else (y.mask if is_partial(y) else "entry")
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    return mask


def _no_negative(pos: np.ndarray, known: np.ndarray | None) -> np.ndarray:
    """Per class: known positives and no known negative (``known`` None: every entry
    known)."""
    if known is None:
        return pos.any(axis=0) & pos.all(axis=0)
    return (pos & known).any(axis=0) & ~(known & ~pos).any(axis=0)


def classes_without_negatives(y, mask: str | None = None) -> list[int]:
    """The columns of partial labels ``y`` with a known positive but no known negative where
    they are scored (their known rows, or the fully known rows of mask ``"row"``): their AP
    would be 100 whatever the scores, so the per-class metrics leave them out.

    >>> classes_without_negatives(partial_labels([[1, 1], [0, -1], [1, 0]]))
    [0]
    """
    y = y if is_partial(y) else partial_labels(y)
    pos, known = known_entries(y)
    if mask_of(y, mask) == "row":
        rows = known.all(axis=1)
        return np.flatnonzero(_no_negative(pos[rows], None)).tolist()
    return np.flatnonzero(_no_negative(pos, known)).tolist()


def format_labels(scores, y, rule: str, threshold: float = 0.5, mask: str | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The formatting step: partial labels ``y`` and their ``scores`` as what a metric of
    `PARTIAL_RULES` rule ``rule`` scores, ``(scores, labels, known)``: float64 scores, full
    0 / 1 labels (uint8) and which of those entries are known (None: all of them).

    Under ``mask`` ``"entry"`` (default: the one ``y`` carries) the rows without any known
    label are left out, then ``"per_class"`` and ``"per_row"`` give unknown entries a score
    below every score and below ``threshold`` and the label 0 (``"per_class"`` also leaves out
    the classes with known positives and no known negative), ``"entries"`` pools the known
    entries into one column and ``"full_rows"`` keeps the fully known rows. Under mask
    ``"row"`` every rule keeps the fully known rows (``"per_class"`` leaving out, there too,
    the classes without a negative).

    >>> s, t, known = format_labels([[0.9, 0.2], [0.4, 0.8]], partial_labels([[1, 0], [-1, 1]]),
    ...                             "per_row")
    >>> s.tolist(), t.tolist(), known.tolist()
    ([[0.9, -1.0000000000000002], [0.4, 0.8]], [[1, 0], [0, 1]], [[True, False], [True, True]])

    Raises:
        ValueError: an unknown rule or mask, scores of another shape or not finite.
    """
    if rule not in PARTIAL_RULES:
        raise ValueError(f"unknown partial-label rule {rule!r}; one of {', '.join(PARTIAL_RULES)}")
    s, pos, known = checked_partial(scores, y)
    mask = mask_of(y, mask)
    if mask == "row" or rule == "full_rows":
        rows = known.all(axis=1)
        s, pos = s[rows], pos[rows]
        if rule == "per_class":
            keep = ~_no_negative(pos, None)
            s, pos = s[:, keep], pos[:, keep]
        return s, pos.astype(np.uint8), None
    if rule == "entries":
        return s[known][:, None], pos[known][:, None].astype(np.uint8), None
    rows = known.any(axis=1)
    if not rows.all():
        s, pos, known = s[rows], pos[rows], known[rows]
    low = min(0.0, float(threshold), float(s.min()) if s.size else 0.0) - 1.0
    s = np.where(known, s, np.nextafter(low, -np.inf))
    if rule == "per_class":
        keep = ~_no_negative(pos, known)
        s, pos, known = s[:, keep], pos[:, keep], known[:, keep]
    return s, pos.astype(np.uint8), known
