"""Multilabel-stratified splits and folds of your own data, with the ``iterative-stratification``
package (Sechidis, Tsoumakas and Vlahavas 2011; Szymański and Kajdanowicz 2017's second-order
variant is not used): each class keeps about its share of positives in every part, which a
random split does not promise for rare classes.

* `stratified_split`: train / val / test row indices with given fractions (a test set carved
  with ``MultilabelStratifiedShuffleSplit``, then val from the rest).
* `MultilabelFolds`: a scikit-learn cross-validation splitter (``cv=``) that stratifies on the
  rows' **positives** of any SPML label form: a 1-D ``y`` of single positives, an observed
  1 / 0 / -1 matrix (known positives) or full 0 / 1 labels; ``SPMLClassifier`` with
  ``cross_val_score`` / ``GridSearchCV`` takes it.
* The ``tabular`` and ``arrays`` sources take ``split=stratified``: the carved-out test set and
  the val set split from the training rows are stratified (full training labels).

Needs the ``stratify`` extra (``pip install "spmlkit[stratify]"``).

>>> import numpy as np
>>> y = np.eye(4, dtype=np.uint8)[np.arange(40) % 4]
>>> tr, va, te = stratified_split(y, (0.5, 0.25, 0.25), seed=0)
>>> len(tr), len(va), len(te), y[te].sum(axis=0).tolist()
(20, 11, 9, [2, 2, 3, 2])
"""
from __future__ import annotations

import numpy as np

__all__ = ["SPLITS", "stratified_split", "stratified_test", "MultilabelFolds", "positives_of"]

#: how a source splits rows it carves test / val sets out of
SPLITS = ("random", "stratified")


def _iterstrat():
    try:
        from iterstrat import ml_stratifiers
    except ImportError as err:
        from ..extras import install_hint

        raise ModuleNotFoundError("stratified splits need iterative-stratification: " +
                                  install_hint("stratify", "iterative-stratification")) from err
    return ml_stratifiers


def positives_of(y) -> np.ndarray:
    """N x L 0/1 positives of SPML labels: a 1-D ``y`` of class labels (one-hot over its sorted
    classes), an observed 1 / 0 / -1 matrix (the 1s) or full 0 / 1 labels."""
    arr = np.asarray(y)
    if arr.ndim == 1:
        classes, index = np.unique(arr, return_inverse=True)
        return np.eye(len(classes), dtype=np.uint8)[index]
    if arr.ndim != 2:
        raise ValueError(f"labels must be 1-D or N x L, got shape {arr.shape}")
    return (np.nan_to_num(arr.astype(np.float64)) == 1).astype(np.uint8)


def stratified_test(y, fraction: float, seed: int, where: str | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``(rest, test)`` sorted row indices: about ``round(fraction * N)`` test rows (iterative
    stratification places rows class by class, so the sizes can differ by a few rows),
    stratified on the positives of ``y``; ``where`` (the file and option the split comes
    from) starts the message of a split that leaves a part empty."""
    pos = positives_of(y)
    n = len(pos)
    n_test = int(round(fraction * n))
    if not 0 < n_test < n:
        at = f"{where}: " if where else ""
        raise ValueError(f"{at}a fraction of {fraction} of {n} row(s) leaves an empty part "
                         f"({n_test} row(s) carved out, {n - n_test} left); give more rows"
                         f"{' or the part in a file of its own' if where else ''}")
    if pos.shape[1] == 1:  # one class: stratify on it and its absence (iterstrat needs two)
        pos = np.concatenate([pos, 1 - pos], axis=1)
    splitter = _iterstrat().MultilabelStratifiedShuffleSplit(n_splits=1, test_size=n_test,
                                                             random_state=seed)
    rest, test = next(splitter.split(np.zeros((n, 1)), pos))
    return np.sort(rest), np.sort(test)


def stratified_split(y, fractions=(0.8, 0.1, 0.1), seed: int = 0
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train / val / test sorted row indices with ``fractions`` (summing to 1), each class's
    positives spread in about those shares.

    Raises:
        ValueError: fractions that are not three positive numbers summing to 1, or a part that
            would be empty.
    """
    f = np.asarray(fractions, dtype=np.float64)
    if f.shape != (3,) or (f <= 0).any() or abs(f.sum() - 1) > 1e-9:
        raise ValueError(f"fractions must be three positive shares summing to 1, got "
                         f"{list(fractions)}")
    pos = positives_of(y)
    rest, test = stratified_test(pos, f[2], seed)
    inner_train, inner_val = stratified_test(pos[rest], f[1] / (f[0] + f[1]), seed)
    return rest[inner_train], rest[inner_val], test


class MultilabelFolds:
    """K stratified folds for scikit-learn's ``cv=``: ``MultilabelStratifiedKFold`` on the
    positives of ``y`` (`positives_of`), so SPML's 1-D single positives and observed matrices
    stratify too.

    >>> import numpy as np
    >>> y = np.arange(30) % 3  # single positives, 3 classes
    >>> folds = MultilabelFolds(5, seed=0).split(y, y)
    >>> all(np.bincount(y[test]).tolist() == [2, 2, 2] for _, test in folds)
    True
    """

    def __init__(self, n_splits: int = 5, seed: int | None = 0, shuffle: bool = True):
        if int(n_splits) != n_splits or n_splits < 2:
            raise ValueError(f"n_splits must be a whole number >= 2, got {n_splits}")
        self.n_splits, self.seed, self.shuffle = int(n_splits), seed, shuffle

    def get_n_splits(self, X=None, y=None, groups=None) -> int:
        return self.n_splits

    def split(self, X, y, groups=None):
        """The folds' ``(train, test)`` row indices. With ``groups`` (one label per row) each
        group lies in one fold: the folds stratify the groups on their positives (a group's
        positives: any of its rows'), as ``GroupKFold`` keeps groups apart, and each group's
        rows follow it."""
        if y is None:
            raise ValueError("MultilabelFolds stratifies on the labels: give y")
        pos = positives_of(y)
        folds = _iterstrat().MultilabelStratifiedKFold(
            n_splits=self.n_splits, shuffle=self.shuffle,
            random_state=self.seed if self.shuffle else None)
        if groups is None:
            yield from folds.split(np.zeros((len(pos), 1)), pos)
            return
        codes = np.unique(np.asarray(groups), return_inverse=True)[1].reshape(-1)
        if len(codes) != len(pos):
            raise ValueError(f"MultilabelFolds: {len(codes)} groups for {len(pos)} rows")
        num_groups = int(codes.max()) + 1
        if num_groups < self.n_splits:
            raise ValueError(f"MultilabelFolds: {num_groups} group(s) cannot fill "
                             f"{self.n_splits} folds with whole groups")
        per_group = np.zeros((num_groups, pos.shape[1]), dtype=np.int64)
        np.maximum.at(per_group, codes, np.asarray(pos, dtype=np.int64))
        for _, test_groups in folds.split(np.zeros((num_groups, 1)), per_group):
            in_test = np.isin(codes, test_groups)
            yield np.flatnonzero(~in_test), np.flatnonzero(in_test)
