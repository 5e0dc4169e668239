"""Labelled sets, dataset sources and the Cole et al. protocol that turns a source into splits.

A *source* (a registered function, see `spmlkit.data`) returns a
[`Dataset`][spmlkit.data.protocol.Dataset]: the official training set (the *pool*), the official
evaluation set (our *test*, as in all four papers), class names, and optionally the official
observed labels of the pool. The protocol (`make_splits`) then draws the observed labels on the pool
with a regime and seed, and splits the pool into train / val (docs/spec.md#protocol), exactly as the
official pipeline does.

Your own partially labelled data is the other case: a source given ``train_labels="observed"``
returns a [`Dataset`][spmlkit.data.protocol.Dataset] whose ``observed`` holds the training labels as
they were observed (1 / 0 / -1; the full labels are unknown) and whose val / test sets are fully
labelled. Regime ``given`` uses them as they are (nothing is drawn, the whole pool trains, val is a
given set or carved out of the test set), and every other regime refuses such a dataset.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from ..metrics import is_partial
from ..labels import OFFICIAL_SEED, POSITIVE, full_to_observed, make_observed, \
    observed_counts, parse_regime, validate_full_labels, validate_observed
from .rows import JoinedRows, Rows, holds_vectors, is_stored, nonfinite_rows, streaming_stats

#: what a source's ``train_labels`` option takes
TRAIN_LABELS = ("full", "observed")


def check_train_labels(value, where: str) -> str:
    """A source's ``train_labels`` option: ``"full"`` (complete 0/1 training labels, a regime
    draws the observed ones) or ``"observed"`` (your own partial labels, regime ``given``).

    Raises:
        ValueError: any other value (the message names ``where``).
    """
    if value not in TRAIN_LABELS:
        raise ValueError(f"{where}: train_labels must be 'full' (complete 0/1 training labels; "
                         f"a regime such as 1p draws the observed ones) or 'observed' (your own "
                         f"partial labels: 1 / 0 / -1, or the names of the known positives; "
                         f"train with regime 'given'), got {value!r}")
    return value


@dataclass
class LabelledSet:
    """Examples with full labels: ``x`` is an N x D feature matrix (in memory, memory-mapped,
    or `Rows` of a stored one) or a sequence of N items (e.g. image
    paths); ``y`` the N x L 0/1 labels, or for a val / test set partial evaluation labels
    (`spmlkit.metrics.PartialLabels`: 1 / -1 known, 0 unknown, scored masked). A
    subset of stored features is a `Rows` view: row indices, no copy."""

    x: Any
    y: np.ndarray
    class_names: list = field(default_factory=list)
    ids: Sequence | None = None
    where: str = ""
    #: one group label per row (a recording, an asset, a patient: rows that must stay on one
    #: side of a split), or None; `make_splits` keeps each group on one side
    groups: np.ndarray | None = None

    def __post_init__(self):
        if not is_partial(self.y):  # partial evaluation labels (spmlkit.metrics.partial) stay
            self.y = validate_full_labels(self.y, self.where or None)
        n = len(self.x)
        if n != self.y.shape[0]:
            raise ValueError(f"{self.where or 'labelled set'}: {n} examples but "
                             f"{self.y.shape[0]} label rows")
        if self.groups is not None:
            self.groups = np.asarray(self.groups)
            if self.groups.shape != (n,):
                raise ValueError(f"{self.where or 'labelled set'}: {len(self.groups)} group "
                                 f"labels for {n} examples (one group per row)")
        if not self.class_names:
            self.class_names = [f"class{j}" for j in range(self.y.shape[1])]
        bad = [str(c) for c in self.class_names if any(ch in str(c) for ch in "\0\n\r")]
        if bad:  # a NUL cuts names in C strings, a newline breaks CSV / JSON lines readers
            raise ValueError(f"{self.where or 'labelled set'}: class name {bad[0]!r} holds a NUL "
                             f"byte or a line break; class names are printable text")
        if len(self.class_names) != self.y.shape[1]:
            raise ValueError(f"{self.where or 'labelled set'}: {len(self.class_names)} class "
                             f"names for {self.y.shape[1]} label columns")
        if isinstance(self.x, np.ndarray) and self.x.dtype.kind == "f":
            if self.x.ndim != 2:
                raise ValueError(f"{self.where or 'features'} must be N x D, got {self.x.shape}")
            rows = nonfinite_rows(self.x)  # over blocks of rows: a memory map stays unread
            if rows.size:
                raise ValueError(f"{self.where or 'features'}: {rows.size} row(s) hold NaN or "
                                 f"inf (first rows: {rows[:5].tolist()})")

    def __len__(self) -> int:
        return self.y.shape[0]

    @property
    def num_classes(self) -> int:
        return self.y.shape[1]

    def subset(self, idx) -> "LabelledSet":
        idx = np.asarray(idx, dtype=np.int64)
        if is_stored(self.x):
            x = Rows(self.x, idx)
        else:
            x = self.x[idx] if isinstance(self.x, np.ndarray) else [self.x[i] for i in idx]
        ids = None if self.ids is None else [self.ids[i] for i in idx]
        groups = None if self.groups is None else self.groups[idx]
        return LabelledSet(x, self.y[idx], list(self.class_names), ids, self.where, groups)


@dataclass
class Dataset:
    """What a source returns: the official train set (pool) and evaluation set (test).

    ``observed``: the pool's training labels as the user observed them (regime ``given``), an
    int8 pool-row x L matrix in the 1 / 0 / -1 encoding; then the full labels of the pool are
    unknown and ``pool.y`` holds only the observed positives (set here). ``meta["observed_from"]``
    says where they came from (a file name). ``val``: a fully labelled validation set given apart
    from the pool (then the whole pool trains). ``pool_observed`` is another thing: the official
    single-positive draw shipped next to full labels (``cole``).

    Raises:
        ValueError: ``observed`` or ``val`` that does not fit the pool (shape, values, columns).
    """

    name: str
    pool: LabelledSet
    test: LabelledSet
    pool_observed: np.ndarray | None = None   # official observed labels of the pool, if shipped
    val_fraction: float = 0.2
    standardize: bool = False                 # standardise features with the train rows' stats
    meta: dict = field(default_factory=dict)
    observed: np.ndarray | None = None        # your own observed training labels ('given')
    val: LabelledSet | None = None            # a fully labelled val set given apart

    def __post_init__(self):
        if self.observed is not None:
            where = self.meta.get("observed_from") or f"{self.name} observed training labels"
            z = validate_observed(self.observed, str(where))
            if z.shape != self.pool.y.shape:
                raise ValueError(f"{where}: observed labels have shape {z.shape}, the training "
                                 f"rows and classes are {self.pool.y.shape}")
            if not (z == POSITIVE).any():  # all 0 / -1: nothing for an SPML loss to learn from
                kinds = sorted({int(v) for v in np.unique(z)})
                said = {0: "0 (unobserved)", -1: "-1 (negative)"}
                raise ValueError(f"{where}: the observed training labels hold no positive "
                                 f"(every cell is {' or '.join(said[v] for v in kinds)}); "
                                 f"observed labels mark each row's known positives with 1 "
                                 f"(-1 a known negative, 0 or an empty cell unknown), and "
                                 f"the losses of regime given learn from those positives")
            self.observed = z
            self.pool.y = (z == POSITIVE).astype(np.uint8)  # all that is known of them
        if self.val is not None and self.val.num_classes != self.pool.num_classes:
            raise ValueError(f"{self.name}: the val set has {self.val.num_classes} label columns, "
                             f"the training set {self.pool.num_classes}")

    @property
    def class_names(self) -> list:
        return self.pool.class_names


#: what ``val_variant`` takes: the val rows' full labels, or those the regime observes
VAL_VARIANTS = ("full", "observed")


@dataclass
class Splits:
    """Train / val / test after the protocol, with the observed train labels."""

    name: str
    train: LabelledSet
    val: LabelledSet
    test: LabelledSet
    observed: np.ndarray            # observed labels of the train rows (int8, 1/0/-1)
    val_observed: np.ndarray        # observed labels of the val rows (same regime)
    regime: str
    k: float                        # mean positives per row (train, or val for 'given')
    meta: dict = field(default_factory=dict)

    @property
    def class_names(self) -> list:
        return self.train.class_names

    @property
    def train_labels_complete(self) -> bool:
        """Whether ``train.y`` are full labels; False for regime ``given`` (then ``train.y``
        holds only the observed positives, and train-label recovery cannot be measured), and
        for a folder tree's one tag per image (``train_labels=full`` on the ``folder`` source:
        the labels 1p observes, not full ones)."""
        return self.meta.get("train_labels", "full") != "observed" and \
            self.meta.get("labels") != "folder_class_only"


def cole_split(n: int, fraction: float, seed: int = OFFICIAL_SEED) -> tuple[np.ndarray, np.ndarray]:
    """The official split: ``n_b = round(fraction * n)``,
    ``perm = RandomState(seed).permutation(n)``,
    a = sorted(perm[:n - n_b]), b = sorted(perm[n - n_b:]).

    >>> a, b = cole_split(10, 0.2, seed=0)
    >>> len(a), len(b), sorted(np.r_[a, b].tolist()) == list(range(10))
    (8, 2, True)
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"split fraction must be in (0, 1), got {fraction}")
    n_b = int(np.round(fraction * n))
    perm = np.random.RandomState(seed).permutation(n)
    return np.sort(perm[: n - n_b]), np.sort(perm[n - n_b:])


def group_split(groups, fraction: float, seed: int = OFFICIAL_SEED,
                where: str = "groups") -> tuple[np.ndarray, np.ndarray]:
    """`cole_split` that keeps each group on one side: the groups in a
    ``RandomState(seed)`` order go to ``b`` until it holds at least ``round(fraction * n)``
    rows; ``a`` holds the rest. Both sorted. Rows of one recording (asset, patient) then never
    sit on both sides, where they would leak.

    >>> groups = ["r1", "r1", "r2", "r2", "r3", "r3"]
    >>> a, b = group_split(groups, 0.3, seed=0)
    >>> len(b), sorted({groups[i] for i in b}), sorted({groups[i] for i in a})
    (2, ['r3'], ['r1', 'r2'])

    Raises:
        ValueError: a fraction outside (0, 1), fewer than two groups.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"split fraction must be in (0, 1), got {fraction}")
    codes = np.unique(np.asarray(groups), return_inverse=True)[1].reshape(-1)
    num_groups = int(codes.max()) + 1 if codes.size else 0
    if num_groups < 2:
        raise ValueError(f"{where}: {num_groups} group(s) cannot be split so that each group "
                         f"stays on one side; give rows of at least two groups")
    target = int(np.round(fraction * len(codes)))
    sizes = np.bincount(codes, minlength=num_groups)
    order = np.random.RandomState(seed).permutation(num_groups)
    taken = np.cumsum(sizes[order])
    count = int(np.searchsorted(taken, target)) + 1  # groups until b holds >= target rows
    count = min(max(count, 1), num_groups - 1)      # each side keeps at least one group
    in_b = np.zeros(num_groups, dtype=bool)
    in_b[order[:count]] = True
    b = np.flatnonzero(in_b[codes])
    return np.flatnonzero(~in_b[codes]), b


def split_rows(n: int, fraction: float, seed: int, groups=None,
               where: str = "groups") -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` of ``n`` rows: `group_split` of ``groups`` (one per row) when given, else
    `cole_split`: every carve-out of the protocol and the sources splits through here."""
    if groups is not None:
        return group_split(groups, fraction, seed, where)
    return cole_split(n, fraction, seed)


def _instances(ds: Dataset, bias: str) -> dict:
    """The pool's per-label instance metadata (``meta["instances"]``, computed on first use when
    the source stores a function), or an error naming the dataset."""
    inst = ds.meta.get("instances")
    if callable(inst):
        inst = inst()
    if inst is None or inst.get(bias) is None:
        raise ValueError(f"regime '1p_biased:{bias}' needs per-label instance metadata, which "
                         f"dataset {ds.name!r} does not provide (Dataset.meta['instances']"
                         f"['{bias}']); sources that have it: coco (bounding boxes), "
                         f"fmnist_mosaic (tiles). '1p_biased:semantic' works on every dataset")
    return inst


def _class_order(ds: Dataset, order) -> list[int] | None:
    """Class names or column indices -> column indices (``1p_biased:semantic``)."""
    if order is None:
        return None
    if isinstance(order, str):
        order = [order]
    out = []
    for c in order:
        if isinstance(c, (int, np.integer)) and not isinstance(c, bool):
            out.append(int(c))
        elif c in ds.class_names:
            out.append(ds.class_names.index(c))
        else:
            raise ValueError(f"class_order: {c!r} is neither a class of dataset {ds.name!r} nor "
                             f"a column index (classes: {ds.class_names[:8]}...)")
    return out


def _subsample(train_idx: np.ndarray, fraction, seed: int, where: str) -> np.ndarray:
    """Keep ``round(fraction * n)`` (at least 1) of the train rows, seeded, sorted."""
    try:
        fraction = float(fraction)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: subsample must be a fraction in (0, 1], got "
                         f"{fraction!r}") from None
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"{where}: subsample must be a fraction in (0, 1], got {fraction}")
    if fraction == 1.0:
        return train_idx
    keep = max(1, int(np.round(fraction * len(train_idx))))
    perm = np.random.RandomState(seed).permutation(len(train_idx))
    return train_idx[np.sort(perm[:keep])]


def _given_or_refused(ds: Dataset, name: str, regime: str) -> bool:
    """Whether the splits use the dataset's own observed labels (regime ``given``); refuses a
    regime that does not fit the labels the dataset holds."""
    source = ds.meta.get("observed_from") or "the source"
    if name == "given" and ds.observed is None:
        raise ValueError(f"regime 'given' uses observed training labels given with the data, and "
                         f"dataset {ds.name!r} was given full labels only; pass the source "
                         f"train_labels=observed (--data train_labels=observed: its training "
                         f"labels are then read as observed ones, with a fully labelled "
                         f"test set), or use a regime that draws from full labels, e.g. 1p")
    if name == "1p" and ds.observed is not None and ds.meta.get("labels") == \
            "folder_class_only":
        return True  # a folder tree's one tag per image: what 1p would observe, nothing drawn
    if name != "given" and ds.observed is not None:
        raise ValueError(f"dataset {ds.name!r} holds observed (partial) training labels (from "
                         f"{source}); regime {regime!r} would draw from them as if they were "
                         f"complete: use regime 'given' (spml train --regime given)")
    return name == "given"


def _mean_positives(y) -> float:
    """Mean positives per row; of partial labels, the sum over classes of each class's positive
    rate among its known rows (unknown cells missing at random: not counted as negatives)."""
    arr = np.asarray(y)
    if not is_partial(y):
        return float(arr.sum(axis=1).mean())
    known = (arr != 0).sum(axis=0)
    return float(((arr == 1).sum(axis=0) / np.maximum(known, 1)).sum())


def _val_split(ds: Dataset, rows: LabelledSet, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rest, val)`` row indices of ``rows``: `cole_split`, `group_split` when the rows have
    groups, or multilabel-stratified on their positives for a dataset with ``meta["split"] ==
    "stratified"``."""
    y = rows.y
    if ds.meta.get("split") == "stratified" and rows.groups is not None:
        raise ValueError(f"{ds.name}: split=stratified does not keep groups on one side; with a "
                         f"group column the val set takes whole groups (leave split out)")
    if ds.meta.get("split") == "stratified":
        from .stratify import stratified_test

        return stratified_test(y, ds.val_fraction, seed,
                               f"{ds.meta.get('labels') or ds.name}: the val set split from the "
                               f"training rows (--data split=stratified, val fraction "
                               f"{ds.val_fraction})")
    return split_rows(len(rows), ds.val_fraction, seed, rows.groups, f"{ds.name}: the val set")


def _as_observed(y) -> np.ndarray:
    """Val labels in the observed encoding: full ones converted, partial ones as they are."""
    return np.asarray(y, dtype=np.int8).copy() if is_partial(y) else full_to_observed(y)


def _standardized(train: LabelledSet, val: LabelledSet, test: LabelledSet, names=None):
    """The three sets standardised with the train rows' mean and std (0 std -> 1), and the
    statistics as ``meta["standardize"]`` records them. Stored features (a memory map,
    `Rows`) stay stored: the statistics come from one streaming pass
    (float64 accumulators) and the sets read standardised rows batch by batch."""
    if is_stored(train.x):
        mean, std = streaming_stats(train.x)
        stats = {"mean": mean.tolist(), "std": std.tolist(), "dtype": str(mean.dtype)}
        sets = tuple(LabelledSet(Rows(s.x).standardized(mean, std), s.y, s.class_names, s.ids,
                                 s.where, s.groups) for s in (train, val, test))
        return sets, stats
    # float16 rows sum in float32 (in float16 the std of 84,000 rows came out half the true
    # one); float32 / float64 rows as before
    acc = np.float32 if train.x.dtype == np.float16 else None
    with np.errstate(over="ignore"):
        mean = train.x.mean(axis=0, dtype=acc)
        std = train.x.std(axis=0, dtype=acc)
    if not (np.isfinite(mean).all() and np.isfinite(std).all()):
        # a float32 square overflows past ~1.8e19 (a 1e20 "missing" sentinel): the std was inf
        # and the column became 0 for every row; those sums in float64, and a word
        _warn_huge(train, ~(np.isfinite(mean) & np.isfinite(std)), names)
        mean = train.x.mean(axis=0, dtype=np.float64).astype(np.float32)
        std = train.x.std(axis=0, dtype=np.float64).astype(np.float32)
    std[std == 0] = 1.0
    stats = {"mean": mean.tolist(), "std": std.tolist(), "dtype": str(mean.dtype)}
    sets = tuple(LabelledSet(((s.x - mean) / std).astype(np.float32), s.y, s.class_names, s.ids,
                             s.where, s.groups) for s in (train, val, test))
    return sets, stats


def _warn_huge(train: LabelledSet, columns: np.ndarray, names) -> None:
    """Warn that the train rows' ``columns`` hold values past 1e19: standardised, every other
    row of such a column is all but the same number."""
    import warnings

    j = int(np.flatnonzero(columns)[0])
    i = int(np.argmax(np.abs(train.x[:, j])))
    name = repr(str(names[j])) if names is not None and j < len(names) else str(j)
    more = f" ({int(columns.sum()) - 1} more column(s))" if columns.sum() > 1 else ""
    warnings.warn(f"{train.where or 'train rows'}: feature column {name}{more} holds "
                  f"{float(train.x[i, j]):g} (train row {i}); standardised, its other rows are "
                  f"all but equal, so the column tells them apart no more. A missing-value "
                  f"code? Fill such cells with a real value, or drop the column", stacklevel=4)


#: the tabular SPML protocol's train / val / test fractions (SMILE, CRISP on MULAN sets)
TABULAR_FRACTIONS = (0.8, 0.1, 0.1)
PROTOCOLS = ("cole", "tabular")


def tabular_split(n: int, seed: int, groups=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tabular protocol's random 80 / 10 / 10 split of ``n`` rows: ``perm =
    RandomState(seed).permutation(n)``; val and test get ``round(0.1 n)`` rows each (val the
    rows after train's, test the last), train the rest; each part sorted.

    With ``groups`` (one per row) each group stays on one side: test takes whole groups
    (`group_split`, 0.1 of the rows), then val whole groups of the rest (0.1 of ``n``).

    >>> tr, va, te = tabular_split(20, seed=0)
    >>> len(tr), len(va), len(te), sorted(np.r_[tr, va, te].tolist()) == list(range(20))
    (16, 2, 2, True)
    """
    if n < 3:
        raise ValueError(f"the tabular protocol needs at least 3 rows, got {n}")
    if groups is not None:
        groups = np.asarray(groups)
        rest, test = group_split(groups, TABULAR_FRACTIONS[2], seed, "the tabular protocol")
        inner = TABULAR_FRACTIONS[1] / (TABULAR_FRACTIONS[0] + TABULAR_FRACTIONS[1])
        train, val = group_split(groups[rest], inner, seed, "the tabular protocol")
        return rest[train], rest[val], test
    n_val = max(1, int(np.round(TABULAR_FRACTIONS[1] * n)))
    n_test = max(1, int(np.round(TABULAR_FRACTIONS[2] * n)))
    perm = np.random.RandomState(seed).permutation(n)
    n_train = n - n_val - n_test
    return (np.sort(perm[:n_train]), np.sort(perm[n_train:n_train + n_val]),
            np.sort(perm[n_train + n_val:]))


def _all_rows(ds: Dataset) -> LabelledSet:
    """The pool's rows followed by the test rows, as one labelled set."""
    pool, test = ds.pool, ds.test
    if holds_vectors(pool.x) and holds_vectors(test.x) and \
            (is_stored(pool.x) or is_stored(test.x)):  # read on demand, never joined in memory
        x = Rows(JoinedRows(pool.x, test.x))
    elif holds_vectors(pool.x) and holds_vectors(test.x):
        x = np.concatenate([np.asarray(pool.x), np.asarray(test.x)])
    else:
        x = list(pool.x) + list(test.x)
    ids = None if pool.ids is None or test.ids is None else list(pool.ids) + list(test.ids)
    groups = None if pool.groups is None or test.groups is None else \
        np.concatenate([pool.groups, test.groups])
    return LabelledSet(x, np.concatenate([pool.y, test.y]), list(pool.class_names), ids,
                       pool.where, groups)


def make_splits(ds: Dataset, regime: str = "1p", seed: int = OFFICIAL_SEED,
                split_seed: int = OFFICIAL_SEED, *, subsample: float | None = None,
                subsample_seed: int | None = None, class_order=None,
                protocol: str = "cole", val_variant: str = "full") -> Splits:
    """Apply the protocol: observe labels on the pool, split the pool into train / val.

    With regime ``1p`` and the official seed, a source's shipped observed labels
    (``pool_observed``) are used as they are (they are what the official pipeline drew).

    Regime ``given`` (a dataset with ``observed``, your own partial training labels): nothing is
    drawn, every pool row trains with its observed labels, val is the dataset's ``val`` or, when
    none was given, carved out of the (fully labelled) test set with
    ``cole_split(len(test), val_fraction, split_seed)`` (the rest stays the test set), and ``k``
    is the mean number of positives per **val** row (the training labels cannot tell it). Any
    other regime refuses such a dataset, and ``given`` refuses a dataset of full labels.

    A dataset's ``val`` given apart (any regime): the whole pool trains, ``val_observed`` is the
    val set's full labels in the observed encoding.

    Args:
        ds: the source's dataset.
        regime: a label regime (`spmlkit.labels.REGIMES`); ``1p_biased:size`` and
            ``1p_biased:loc`` need the source's per-label instance metadata
            (``ds.meta["instances"]``: a mapping with ``"size"`` / ``"loc"`` pool-row x label
            arrays, or a function returning one, called only then).
        seed: the observed-label draw's seed (``--data seed=N``, a study's ``data.seed``; the
            papers draw once, with 1200, and vary only the training's seed).
        split_seed: the train / val split's seed.
        subsample: keep only this fraction of the train rows (Cole et al. Fig. 1: test mAP
            against the number of training labels, m% of the training images): a seeded
            ``RandomState(subsample_seed).permutation`` of the train rows, its first
            ``round(subsample * n_train)`` kept (at least one) in their original order. Val and
            test are untouched; the observed labels of a kept row are those of the full run, and
            for one seed a smaller fraction keeps a subset of a larger one's rows. ``None`` or
            1 keeps every row.
        subsample_seed: defaults to ``seed``, so a study's seeds draw different subsets.
        class_order: class names or column indices, most preferred first, for
            ``1p_biased:semantic`` (default: the most frequent class first).
        protocol: ``"cole"`` (default: the above) or ``"tabular"``, the tabular SPML protocol
            of SMILE and CRISP on MULAN sets: the pool and the test rows together (pool
            first) split at random 80 / 10 / 10 into train / val / test with ``seed``
            (`tabular_split`; ``split_seed`` is not used), the observed labels drawn
            with ``seed`` (``1p``: one positive drawn uniformly per training row); val and
            test are scored on their full labels. One ``seed`` is one trial (the papers: 5
            trials, mean ± std). ``meta["train_rows"]`` etc. index the pool-then-test rows.
        val_variant: ``"full"`` (default: val rows scored, and the epoch selected, on their
            full labels) or ``"observed"``: on the labels the regime observes of them, an
            unobserved entry counted as negative (Cole et al.'s ``val_set_variant
            'observed'``: selection without full labels anywhere). Only for a val set split
            from the training rows, whose labels the regime draws.

    ``meta`` records ``subsample``, ``observed_labels`` (the number of observed entries in the
    train rows, Fig. 1's x axis), ``observed_counts`` (`spmlkit.labels.observed_counts`
    of the train rows), ``train_labels`` (``"full"`` or ``"observed"``), ``val_from``
    (``"pool"``, ``"given"`` or ``"test"``) and ``k_from`` (``"train"`` or ``"val"``);
    ``meta["instances"]`` is left out of the splits' meta.

    Raises:
        ValueError: a biased regime the source has no metadata for (naming the dataset), a
            subsample outside (0, 1], an unknown class in ``class_order``; ``given`` on full
            labels or another regime on observed ones; a test set too small to carve a val set.
    """
    name, arg = parse_regime(regime)
    given = _given_or_refused(ds, name, regime)
    _check_protocol(ds, protocol, val_variant, regime, given)
    pool = ds.pool
    if given:
        observed = ds.observed
    elif protocol == "tabular":
        pool = _all_rows(ds)
        train_idx, val_idx, test_idx = tabular_split(len(pool), seed, pool.groups)
        observed = make_observed(pool.y, regime, seed, class_order=_class_order(
            ds, class_order)) if name == "1p_biased" else make_observed(pool.y, regime, seed)
    elif name == "1p" and seed == OFFICIAL_SEED and ds.pool_observed is not None:
        observed = _shipped_observed(ds)
    elif name == "1p_biased":
        inst = None if arg == "semantic" else _instances(ds, arg)
        observed = make_observed(ds.pool.y, regime, seed, instances=inst,
                                 class_order=_class_order(ds, class_order))
    else:
        observed = make_observed(ds.pool.y, regime, seed)
    # (the tabular protocol drew train_idx, val_idx and test_idx with the observed labels)
    if protocol != "tabular" and (given or ds.val is not None):
        train_idx, val_idx = np.arange(len(pool)), np.zeros(0, dtype=np.int64)
    elif protocol != "tabular":
        train_idx, val_idx = _val_split(ds, pool, split_seed)
    if subsample is not None:
        train_idx = _subsample(train_idx, subsample, seed if subsample_seed is None
                               else subsample_seed, ds.name)
    train = pool.subset(train_idx)
    if protocol == "tabular":
        val, test = pool.subset(val_idx), pool.subset(test_idx)
        val_observed, extra = observed[val_idx], {"val_from": "pool"}
    else:
        val, test, val_observed, extra = _val_and_test(ds, pool, observed, val_idx, given,
                                                       split_seed)
    if val_variant == "observed":
        val = _scored_on_observed(ds, val, val_observed, extra)
    standardize = None
    if ds.standardize:
        (train, val, test), standardize = _standardized(train, val, test,
                                                        ds.meta.get("feature_columns"))
    k = _default_k(val if given else train, extra)
    train_observed = observed[train_idx]  # one copy of the train rows' observed labels
    counts = observed_counts(train_observed)
    tabular = {"protocol": "tabular", "test_rows": test_idx.tolist(), "trial_seed": seed} \
        if protocol == "tabular" else {}
    meta = {**{key: v for key, v in ds.meta.items() if key != "instances"},
            "train_rows": train_idx.tolist(), "val_rows": val_idx.tolist(),
            "subsample": 1.0 if subsample is None else float(subsample), **tabular,
            "observed_labels": int(counts["positives"] + counts["negatives"]),
            "observed_counts": counts,
            "train_labels": "observed" if given else "full", "k_from": "val" if given else "train",
            **extra}
    if standardize is not None:  # what new raw features need to look like these (predict)
        meta["standardize"] = standardize
    if train.groups is not None:  # a group column: how many groups each side holds
        meta["groups"] = _group_counts(train=train, val=val, test=test)
    return Splits(ds.name, train, val, test, train_observed, val_observed, regime, k, meta)


def _check_protocol(ds: Dataset, protocol: str, val_variant: str, regime: str,
                    given: bool) -> None:
    """Refuse a protocol or val variant that is not one, and what the tabular protocol (which
    splits the pool and test rows anew and draws the observed labels itself) cannot take."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"{ds.name}: protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if val_variant not in VAL_VARIANTS:
        raise ValueError(f"{ds.name}: val_variant must be one of {VAL_VARIANTS}, got "
                         f"{val_variant!r}")
    if protocol != "tabular":
        return
    if given or ds.val is not None:
        what = "observed training labels (regime given)" if given else "a val set given apart"
        raise ValueError(f"{ds.name}: the tabular protocol splits the pool and test rows anew "
                         f"and draws the observed labels itself; it does not take {what}: use "
                         f"protocol 'cole'")
    if any(is_partial(s.y) for s in (ds.pool, ds.test)):
        raise ValueError(f"{ds.name}: the tabular protocol splits the rows anew and scores them "
                         f"on full labels; partial test labels need protocol 'cole'")
    name, arg = parse_regime(regime)
    if name == "1p_biased" and arg != "semantic":
        raise ValueError(f"regime {regime!r} needs the source's per-label instance "
                         f"metadata of the pool rows, which the tabular protocol (pool and "
                         f"test rows split anew) does not carry; use protocol 'cole'")


def _shipped_observed(ds: Dataset) -> np.ndarray:
    """The observed labels a source ships with its pool (what the official pipeline drew for
    ``1p`` with the official seed), checked."""
    observed = validate_observed(ds.pool_observed, f"{ds.name} shipped observed labels")
    if observed.shape != ds.pool.y.shape:
        raise ValueError(f"{ds.name}: shipped observed labels have shape {observed.shape}, "
                         f"full labels {ds.pool.y.shape}")
    return observed


def _default_k(labelled: LabelledSet, extra: dict) -> float:
    """The splits' default k: the mean positives per row of ``labelled`` (train's, or val's
    for regime ``given``); of partial labels, noting in ``extra`` how many classes have no
    known negative (they count as present wherever unknown)."""
    if is_partial(labelled.y):
        known_neg = (np.asarray(labelled.y) == -1).any(axis=0)
        extra["k_classes_without_negative"] = int((~known_neg).sum())
    return _mean_positives(labelled.y)


def _group_counts(**sides: LabelledSet) -> dict:
    """The number of groups of each side that has groups (no group is on two sides: the
    carve-outs take whole groups, `group_split`)."""
    return {name: int(len(np.unique(part.groups))) for name, part in sides.items()
            if part.groups is not None}


def _val_and_test(ds: Dataset, pool: LabelledSet, observed, val_idx, given: bool,
                  split_seed: int) -> tuple:
    """``(val, test, val observed labels, meta entries)`` of the Cole protocol: a val set given
    apart, one carved out of the fully labelled test set (regime ``given``), or the pool's
    rows ``val_idx``."""
    if ds.val is not None:
        return ds.val, ds.test, _as_observed(ds.val.y), {"val_from": "given"}
    if not given:
        return pool.subset(val_idx), ds.test, observed[val_idx], {"val_from": "pool"}
    test_idx, carved = _val_split(ds, ds.test, split_seed)
    if not len(carved) or not len(test_idx):
        raise ValueError(f"{ds.name}: regime 'given' carves the val set out of the fully "
                         f"labelled test set ({ds.val_fraction} of its {len(ds.test)} rows), "
                         f"which leaves an empty {'val' if not len(carved) else 'test'} set; "
                         f"give more test rows or a fully labelled val set")
    val, test = ds.test.subset(carved), ds.test.subset(test_idx)
    return val, test, _as_observed(val.y), {"val_from": "test",
                                            "val_rows_of_test": carved.tolist(),
                                            "val_fraction": ds.val_fraction}


def _scored_on_observed(ds: Dataset, val: LabelledSet, val_observed, extra: dict) -> LabelledSet:
    """``val`` scored on the labels the regime observes of it (``val_variant='observed'``,
    noted in ``extra``); only a val set split from the training rows has such labels."""
    if extra["val_from"] != "pool":
        how = "given apart" if extra["val_from"] == "given" else "carved out of the test set"
        raise ValueError(f"{ds.name}: val_variant='observed' scores the val rows on the labels "
                         f"the regime draws of them; this val set is {how} with its own "
                         f"labels: leave val_variant out")
    extra["val_variant"] = "observed"
    return replace(val, y=(np.asarray(val_observed) == POSITIVE).astype(np.uint8))


def describe_labels(splits: Splits) -> dict:
    """Which labels a run trains and is scored on, for ``spml train``'s summary and the run
    folder (``config.json`` / ``final.json`` key ``labels``).

    Returns:
        ``{"regime", "train_labels", "observed_from", "positives", "negatives", "unobserved",
        "rows_without_positive", "classes_without_positive", "val_from", "k_from", "k",
        "summary"}``; ``summary`` is one
        line, e.g. ``regime given: observed training labels from y_obs.csv (100 rows: 100
        positives, 40 negatives, ...); val (20 rows carved out of the test set, fraction 0.2)
        and test (80 rows) fully labelled; default k 1.800 from the val labels``.
    """
    meta = splits.meta or {}
    counts = meta.get("observed_counts") or observed_counts(splits.observed)
    given = not splits.train_labels_complete
    source = meta.get("observed_from") or ("the class folders (one tag per image)" if
                                           meta.get("labels") == "folder_class_only" else None)
    val_from = meta.get("val_from", "pool")
    where = {"pool": "split from the training rows", "given": "given apart",
             "test": f"carved out of the test set, fraction {meta.get('val_fraction', 0.2)}"}
    numbers = (f"{counts['rows']} rows: {counts['positives']} positives, {counts['negatives']} "
               f"negatives, {counts['unobserved']} unobserved; {counts['rows_without_positive']} "
               f"row(s) without an observed positive")
    # a class no training row observes as positive is learnt as absent
    seen = (np.asarray(splits.observed) == 1).any(axis=0)
    unseen = [str(c) for c, ok in zip(splits.class_names, seen) if not ok]
    if unseen:
        numbers += (f"; {len(unseen)} class(es) without an observed positive, learnt as "
                    f"absent: {', '.join(unseen[:5])}{', ...' if len(unseen) > 5 else ''}")
    if given:
        head = f"regime {splits.regime}: observed training labels from {source or 'the source'} " \
               f"({numbers})"
    else:
        head = f"regime {splits.regime}: observed training labels drawn from full labels " \
               f"({numbers})"
    folder = meta.get("labels") == "folder_class_only"
    partial_val = folder and val_from == "pool"  # carved out of the folders: one tag per image
    partial_test = folder and not meta.get("test_labels_file")
    val_part = f"val ({len(splits.val)} rows {where.get(val_from, val_from)})"
    test_part = f"test ({len(splits.test)} rows)"
    only = "labelled with the folder class only (one tag per image: partial labels, scores " \
           "are estimates; give test_csv=FILE for full ones)"
    if partial_val and partial_test:
        scored = f"{val_part} and {test_part} {only}"
    elif partial_val:
        scored = f"{val_part} {only}; {test_part} fully labelled"
    elif partial_test:
        scored = f"{val_part} fully labelled; {test_part} {only}"
    elif meta.get("val_variant") == "observed":
        scored = f"{val_part} scored on its observed labels (unobserved as negatives); " \
                 f"{test_part} fully labelled"
    else:
        scored = f"{val_part} and {test_part} fully labelled"
    masked = {s: _mask_note(getattr(splits, s).y) for s in ("val", "test")}
    if any(masked.values()):
        scored = f"{val_part} {masked['val'] or 'fully labelled'}; " \
                 f"{test_part} {masked['test'] or 'fully labelled'}"
    summary = (f"{head}; {scored}; default k {splits.k:.3f} from the "
               f"{meta.get('k_from', 'train')} labels")
    if meta.get("groups"):  # a group column: every carve-out took whole groups
        summary += "; groups kept apart (" + ", ".join(
            f"{side} {count}" for side, count in meta["groups"].items()) + " groups)"
    if meta.get("k_classes_without_negative"):  # presence-only val labels inflate k
        summary += (f" (partial: each class's positive rate among its known rows; "
                    f"{meta['k_classes_without_negative']} class(es) without a known negative "
                    f"count as present wherever unknown: give --k if unknown mostly means "
                    f"absent)")
    return {"regime": splits.regime, "train_labels": "observed" if given else "full",
            "observed_from": source, **{k: counts[k] for k in (
                "positives", "negatives", "unobserved", "rows_without_positive")},
            "classes_without_positive": unseen,
            "val_from": val_from, "k_from": meta.get("k_from", "train"), "k": float(splits.k),
            **({f"{s}_mask": masked[s] for s in masked if masked[s]}), "summary": summary}


def _mask_note(y) -> str | None:
    """How partial evaluation labels are scored (None for full ones)."""
    if not is_partial(y):
        return None
    known = float((np.asarray(y) != 0).mean()) if y.size else 0.0
    rule = ("each class over its known rows" if y.mask == "entry"
            else f"the {int((np.asarray(y) != 0).all(axis=1).sum())} fully known rows only")
    return f"partially labelled ({100 * known:.1f}% of entries known), scored masked: {rule}"
