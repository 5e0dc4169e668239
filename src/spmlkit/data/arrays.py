"""Your own features and labels as a dataset source (``arrays``), and the file readers it shares
with `spmlkit.data.cole`.

Features: a ``.npy`` file (N x D), or a ``.npz`` file whose key ``features`` or ``x`` holds them
(else its only array). Any real dtype; kept as float32.

Labels, one of:

* a ``.npy`` / ``.npz`` 0/1 matrix (N x L; npz key ``labels`` or ``y``, else its only array);
* a ``.csv`` / ``.txt`` text file (UTF-8) with **one line per example**, line i describing row i of
  the features: the names of the example's positive classes, separated by commas, semicolons
  and/or whitespace (so a name cannot contain any of them: write ``traffic_light``); quotes around
  a name are dropped. A line with no name is an example without a positive (it still counts as a
  row). The first line is a header, and skipped, only when it reads exactly ``labels`` (any case);
  a file whose first example has the single class ``labels`` therefore needs that header.
  The classes are the sorted set of the names in the (training) labels file, unless
  ``class_names`` declares them (in that order); then a name outside them is an error that names
  the line.

Your own partial training labels (``train_labels="observed"``, trained with regime ``given``):
``labels`` is then a 1 (positive) / 0 (unobserved) / -1 (negative) matrix, or a names file whose
names are each row's known positives; a fully labelled test set is required and a val set may be
given (``val_features`` / ``val_labels``; default: carved out of the test set by the protocol).
`features_dataset` assembles the sets; the ``tabular`` source shares it.

Without a test file, the test set is carved out of all rows with the official split
(`cole_split`, fraction 0.3, seed 1200), as for yeast; the rest is the
pool that the protocol splits into train / val.

>>> import tempfile, numpy as np
>>> from pathlib import Path
>>> d = Path(tempfile.mkdtemp())
>>> np.save(d / "x.npy", np.random.RandomState(0).rand(10, 3))
>>> _ = (d / "y.csv").write_text("labels\\ncat\\ndog,cat\\n\\n" + "dog\\n" * 7)
>>> ds = load_arrays(d / "x.npy", d / "y.csv")
>>> ds.class_names, len(ds.pool), len(ds.test)
(['cat', 'dog'], 7, 3)
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..labels import OFFICIAL_SEED, POSITIVE, observed_from_cells, positives_to_observed, \
    validate_full_labels, validate_observed
from .protocol import Dataset, LabelledSet, check_train_labels, split_rows
from ..runs import check_array_file
from .registry import register

MATRIX_SUFFIXES = (".npy", ".npz")
TEXT_SUFFIXES = (".csv", ".txt")
FEATURE_KEYS = ("features", "x")
LABEL_KEYS = ("labels", "y")
TEST_FRACTION = 0.3
HEADER = "labels"

_SEPARATORS = re.compile(r"[,;\s]+")
_QUOTES = "\"'"
#: Rows checked at once for NaN / inf (bounds the temporary mask on memory-mapped files).
_CHUNK_ENTRIES = 1 << 24


def _preview(names: Sequence[str], n: int = 8) -> str:
    shown = ", ".join(map(str, list(names)[:n]))
    return shown + (f", ... ({len(names)} in all)" if len(names) > n else "")


def _class_names(classes, width: int, path) -> list[str]:
    """The class names of a label matrix of ``width`` columns read from ``path``: ``classes``
    (checked against the width), or ``class0``, ``class1``, ... when none are given."""
    if classes is None:
        return [f"class{j}" for j in range(width)]
    if len(classes) != width:
        raise ValueError(f"{path}: {width} label columns but {len(classes)} class names "
                         f"({_preview(classes)})")
    return list(classes)


def no_such_file(path, what: str, option: str | None = None) -> FileNotFoundError:
    """The error of a missing ``what`` file ``path``: the option that gave it (``--data
    OPTION=...``) and, for a relative path, the folder it was looked for in."""
    given = f" (given as --data {option}={path})" if option else ""
    here = "" if Path(path).is_absolute() else \
        f"; a relative path is read from the current folder, {os.getcwd()}"
    return FileNotFoundError(f"{what} file {path}{given} does not exist{here}")


def load_matrix(path, keys: Sequence[str] = (), what: str = "array",
                mmap_mode: str | None = None) -> np.ndarray:
    """Read one array from a ``.npy`` file, or from a ``.npz`` file (the first of ``keys`` it
    holds, else its only array).

    Args:
        path: the file.
        keys: preferred ``.npz`` keys, in order.
        what: what the array is, for error messages (``"features"``, ``"labels"``).
        mmap_mode: passed to `numpy.load` for ``.npy`` files (``"r"`` maps the file instead
            of reading it; ignored for ``.npz``, which numpy cannot map).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: another extension, an unreadable file (e.g. a pickled object array), or an
            ``.npz`` file with several arrays and none of ``keys`` (the message lists its keys).
    """
    path = Path(path)
    if not path.is_file():
        raise no_such_file(path, what)
    suffix = path.suffix.lower()
    if suffix not in MATRIX_SUFFIXES:
        raise ValueError(f"{path}: {what} must be a .npy or .npz file, got {path.suffix or 'no'} "
                         f"extension")
    check_array_file(path)  # a header claiming a huge shape: refused before numpy allocates it
    try:
        if suffix == ".npy":
            return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
        archive = np.load(path, allow_pickle=False)
    except (OSError, EOFError, ValueError) as err:
        raise ValueError(f"{path}: not a readable {suffix} file ({err})") from None
    with archive:
        names = list(archive.files)
        key = next((k for k in keys if k in names), None)
        if key is None and len(names) == 1:
            key = names[0]
        if key is None:
            wanted = " or ".join(repr(k) for k in keys) or "one array"
            raise ValueError(f"{path}: expected the {what} under key {wanted} (or a file with a "
                             f"single array); the file holds keys {names}")
        try:
            return archive[key]
        except (OSError, EOFError, ValueError) as err:
            raise ValueError(f"{path}: array {key!r} is not readable ({err})") from None


def check_features(x, where: str, to_float32: bool = True) -> np.ndarray:
    """Check an N x D feature matrix: 2-D, real numbers, every entry finite.

    The finiteness check runs over blocks of rows, so a memory-mapped matrix is never held in
    memory at once. With ``to_float32`` the result is a float32 array (a copy unless it already
    is one); otherwise a float matrix is returned as it is (e.g. still memory-mapped) and any
    other real dtype converted to float32.

    Raises:
        ValueError: wrong number of dimensions, no row or no column, non-numeric dtype, or rows
            with NaN / inf (the message names ``where``, the number of such rows and the first
            of them).

    >>> check_features([[0.5, 1.0], [2.0, float("nan")]], "x.npy")
    Traceback (most recent call last):
    ...
    ValueError: x.npy: 1 row(s) hold NaN or inf (first rows: [1])
    """
    arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{where}: features must be a 2-D matrix (examples x dimensions), got "
                         f"shape {arr.shape}")
    if 0 in arr.shape:
        raise ValueError(f"{where}: the feature matrix is empty ({arr.shape[0]} rows x "
                         f"{arr.shape[1]} columns); expected one row per example and at least "
                         f"one feature column")
    if arr.dtype.kind not in "fiub":
        raise ValueError(f"{where}: features must be real numbers, got dtype {arr.dtype}")
    if to_float32 or arr.dtype.kind != "f":
        arr = np.asarray(arr, dtype=np.float32)
    if arr.dtype.kind == "f":
        step = max(1, _CHUNK_ENTRIES // max(arr.shape[1], 1))
        bad = [start + np.flatnonzero(~np.isfinite(arr[start:start + step]).all(axis=1))
               for start in range(0, arr.shape[0], step)]
        rows = np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)
        if rows.size:
            raise ValueError(f"{where}: {rows.size} row(s) hold NaN or inf (first rows: "
                             f"{rows[:5].tolist()})")
    return arr


def read_class_names(path) -> list[str]:
    """Class names from a text file, one per line (surrounding spaces dropped, blank lines
    skipped; a name may contain spaces).

    Raises:
        FileNotFoundError: no such file.
        ValueError: no name at all, or a name given twice (the message names both lines).
    """
    path = Path(path)
    if not path.is_file():
        raise no_such_file(path, "class-names", "class_names")
    names, seen = [], {}
    for lineno, line in enumerate(_read_lines(path), start=1):
        name = line.strip()
        if not name:
            continue
        if name in seen:
            raise ValueError(f"{path}, line {lineno}: class name {name!r} already given on line "
                             f"{seen[name]}")
        seen[name] = lineno
        names.append(name)
    if not names:
        raise ValueError(f"{path}: no class name (expected one name per line)")
    return names


def resolve_class_names(class_names) -> list[str] | None:
    """``class_names`` as a list: ``None``, a sequence of names, a path to a names file, or
    text naming no file that lists the names separated by commas or semicolons
    (``--data class_names=cat,dog,bird``)."""
    if class_names is None:
        return None
    if isinstance(class_names, str) and not Path(class_names).exists() and \
            ("," in class_names or ";" in class_names):
        class_names = [n.strip() for n in class_names.replace(";", ",").split(",")]
        if not all(class_names):
            raise ValueError(f"class_names {','.join(class_names)!r} holds an empty name")
    elif isinstance(class_names, (str, os.PathLike)):
        return read_class_names(class_names)
    names = [str(c) for c in class_names]
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise ValueError(f"class_names lists {dup} more than once")
    if not names:
        raise ValueError("class_names is empty")
    return names


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 text file ({err})") from None


def read_label_names(path, classes: Sequence[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """Full labels from a text file that lists each example's positive class names.

    One line per example (see the module docstring for the form). ``classes`` fixes the columns
    and their order; without it they are the sorted set of the names found.

    Returns:
        ``(y, classes)``: the N x L uint8 matrix and the class names of its columns.

    Raises:
        FileNotFoundError: no such file.
        ValueError: no example, or (with ``classes``) a name outside them (the message names the
            line, the example's row and the known classes).

    >>> import tempfile
    >>> from pathlib import Path
    >>> f = Path(tempfile.mkdtemp()) / "y.txt"
    >>> _ = f.write_text("dog; cat\\n\\ncat\\n")
    >>> y, names = read_label_names(f)
    >>> names, y.tolist()
    (['cat', 'dog'], [[1, 1], [0, 0], [1, 0]])
    """
    path = Path(path)
    if not path.is_file():
        raise no_such_file(path, "labels")
    lines = _read_lines(path)
    first = 1 if lines and lines[0].strip().strip(_QUOTES).lower() == HEADER else 0
    rows = []
    for lineno, line in enumerate(lines[first:], start=first + 1):
        tokens = (t.strip(_QUOTES) for t in _SEPARATORS.split(line.strip()))
        rows.append((lineno, [t for t in tokens if t]))
    if not rows:
        raise ValueError(f"{path}: no example (expected one line per example listing its class "
                         f"names, optionally after a header line '{HEADER}')")
    if classes is None:
        classes = sorted({n for _, names in rows for n in names})
        if not classes:
            raise ValueError(f"{path}: no class name on any line")
    classes = list(classes)
    column = {c: j for j, c in enumerate(classes)}
    y = np.zeros((len(rows), len(classes)), dtype=np.uint8)
    for r, (lineno, names) in enumerate(rows):
        for n in names:
            j = column.get(n)
            if j is None:
                raise ValueError(f"{path}, line {lineno} (example row {r}): unknown class name "
                                 f"{n!r}; known classes: {_preview(classes)}. Declare every "
                                 f"class with class_names= (names cannot contain commas, "
                                 f"semicolons or spaces)")
            y[r, j] = 1
    return y, classes


def read_labels(labels, classes: Sequence[str] | None = None,
                what: str = "labels") -> tuple[np.ndarray, list[str]]:
    """Full labels from a 0/1 ``.npy`` / ``.npz`` matrix or a ``.csv`` / ``.txt`` names file
    (``what``: which labels, in a message about an array).

    Returns ``(y, classes)``; for a matrix without ``classes`` the names are ``class{j}``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown extension, values other than 0 / 1 (the message names the file and
            the first row), or a column count that differs from ``len(classes)``.
    """
    if isinstance(labels, np.ndarray):
        path, y = f"{what} array", labels
    else:
        path = Path(labels)
        if path.suffix.lower() in TEXT_SUFFIXES:
            return read_label_names(path, classes)
        if path.suffix.lower() not in MATRIX_SUFFIXES and path.is_file():
            raise ValueError(f"{path}: labels must be a .npy / .npz 0/1 matrix or a .csv / .txt "
                             f"file of class names, got {path.suffix or 'no'} extension")
        y = load_matrix(path, LABEL_KEYS, "labels")
    y = validate_full_labels(y, str(path))
    return y, _class_names(classes, y.shape[1], path)


def read_features(features, mmap_mode: str | None = None) -> tuple[np.ndarray, str]:
    """Features from a ``.npy`` / ``.npz`` file (or an array), checked; returns ``(x, where)``."""
    if isinstance(features, np.ndarray):
        return check_features(features, "features array"), "features array"
    x = load_matrix(features, FEATURE_KEYS, "features", mmap_mode)
    return check_features(x, str(features), to_float32=mmap_mode is None), str(features)


def check_rows(x, x_where: str, y, y_where: str) -> None:
    """Features and labels must have one row per example each (the message names both)."""
    if len(x) != len(y):
        raise ValueError(f"{x_where} has {len(x)} rows but {y_where} has {len(y)} label rows; "
                         f"they must describe the same examples in the same order")


def read_observed(labels, classes: Sequence[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """Observed (partial) training labels: a 1 / 0 / -1 ``.npy`` / ``.npz`` matrix, or a
    ``.csv`` / ``.txt`` names file whose names are each row's **known positives** (every other
    label unobserved; a matrix is the way to give observed negatives).

    Returns ``(z, classes)``: the N x L int8 matrix and the class names of its columns.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown extension, values outside {1, 0, -1} (the message names the file
            and the first row), or a column count that differs from ``len(classes)``.

    >>> z, names = read_observed(np.array([[1, -1, 0], [0, 1, 0]]))
    >>> names, z.dtype.name
    (['class0', 'class1', 'class2'], 'int8')
    """
    if isinstance(labels, np.ndarray):
        path, z = "observed labels array", labels
    else:
        path = Path(labels)
        if path.suffix.lower() in TEXT_SUFFIXES:
            y, classes = read_label_names(path, classes)
            return positives_to_observed(y), classes
        if path.suffix.lower() not in MATRIX_SUFFIXES and path.is_file():
            raise ValueError(f"{path}: observed labels must be a .npy / .npz matrix of 1 "
                             f"(positive), 0 (unobserved) and -1 (negative), or a .csv / .txt "
                             f"file of the known positives' names, got {path.suffix or 'no'} "
                             f"extension")
        z = load_matrix(path, LABEL_KEYS, "observed labels")
    z = validate_observed(z, str(path))
    return z, _class_names(classes, z.shape[1], path)


#: what a source's ``eval_labels`` option takes: full 0 / 1 val / test labels, or partial ones
#: (1 positive, -1 known negative, 0 / NaN / an empty cell unknown; `spmlkit.metrics.partial`)
EVAL_LABELS = ("full", "partial")


def check_found_names(classes: Sequence[str], where: str) -> None:
    """Check the class names a file's cells hold: refuse a name that is other class names joined
    by commas (``"cat, dog"`` beside ``cat``: a cell listing a row's classes with commas, which
    would make each combination a class of its own; a name with a comma whose parts are no
    classes, ``"Washington, D.C."``, stays), and warn of names that differ only in case
    (``Cat`` and ``cat``: two classes)."""
    import warnings

    folded: dict[str, list] = {}
    for name in classes:
        folded.setdefault(str(name).casefold(), []).append(str(name))
    twins = [names for names in folded.values() if len(names) > 1]
    if twins:
        warnings.warn(f"{where}: class names {', '.join(map(repr, twins[0]))} differ only in "
                      f"case and are {len(twins[0])} classes"
                      f"{f' ({len(twins) - 1} more such group(s))' if len(twins) > 1 else ''}; "
                      f"write them alike if they are one", stacklevel=3)
    known = set(classes)
    for name in classes:
        parts = [p.strip() for p in str(name).split(",")]
        if len(parts) > 1 and any(p in known for p in parts):
            raise ValueError(f"{where}: class name {name!r} is class names joined by commas "
                             f"({', '.join(repr(p) for p in parts)}); separate the class names "
                             f"of a cell with ';' or '|' (a comma would make every combination a "
                             f"class of its own)")


def check_eval_labels(eval_labels: str, eval_mask: str | None, given: bool, where: str) -> None:
    """Refuse an unknown ``eval_labels`` / ``eval_mask``, a mask without partial labels, and
    partial labels without a val or test set given (nothing they would apply to)."""
    from ..metrics import MASKS

    if eval_labels not in EVAL_LABELS:
        raise ValueError(f"{where}: eval_labels must be one of {EVAL_LABELS}, got "
                         f"{eval_labels!r}")
    if eval_mask is not None and eval_mask not in MASKS:
        raise ValueError(f"{where}: eval_mask must be one of {MASKS}, got {eval_mask!r}")
    if eval_mask is not None and eval_labels != "partial":
        raise ValueError(f"{where}: eval_mask={eval_mask} applies to partial evaluation labels "
                         f"only; add eval_labels=partial")
    if eval_labels == "partial" and not given:
        raise ValueError(f"{where}: eval_labels=partial applies to val / test labels given "
                         f"apart (test files, val files or a split column); none was given")


def partial_part(part: "Part", mask: str | None) -> "Part":
    """``part`` with its labels read as partial evaluation labels (1 / -1 known, 0 / NaN
    unknown), scored with ``mask`` (default ``"entry"``)."""
    from ..metrics import partial_labels

    y = partial_labels(part.y, mask or "entry", part.y_where)
    if y.mask == "row" and not (y != 0).all(axis=1).any():
        raise ValueError(f"{part.y_where}: eval_mask=row scores the rows whose every label is "
                         f"known, and no row of these {len(y)} is; use eval_mask=entry")
    return Part(part.x, y, part.x_where, part.y_where, part.ids)


@dataclass
class Part:
    """One set of feature rows and their labels, with where each came from (for messages)."""

    x: np.ndarray
    y: np.ndarray
    x_where: str
    y_where: str
    ids: Sequence | None = None
    groups: np.ndarray | None = None  # one group label per row (splits keep groups apart)

    def __post_init__(self):
        check_rows(self.x, self.x_where, self.y, self.y_where)
        if self.ids is None:
            self.ids = range(len(self.y))


def features_dataset(name: str, train: Part, classes: Sequence[str], *, test: Part | None = None,
                     val: Part | None = None, train_labels: str = "full",
                     test_fraction: float = TEST_FRACTION, seed: int = OFFICIAL_SEED,
                     standardize: bool = False, meta: dict | None = None,
                     split: str = "random") -> Dataset:
    """Feature rows and labels already read, as a [`Dataset`][spmlkit.data.protocol.Dataset]: what
    the ``arrays`` and ``tabular`` sources share.

    Args:
        name: the dataset's name.
        train: the training rows; ``train.y`` full 0/1 labels, or with
            ``train_labels="observed"`` observed 1 / 0 / -1 labels (``Dataset.observed``,
            regime ``given``).
        classes: the class names of the label columns.
        test, val: fully labelled evaluation / validation rows. Without ``test`` the test set is
            carved out of the training rows with ``cole_split(N, test_fraction, seed)`` (full
            training labels only); without ``val`` the protocol finds one (``make_splits``).
        train_labels: ``"full"`` or ``"observed"``.
        test_fraction, seed: the carve-out.
        standardize: standardise the features with the train rows' statistics (``make_splits``).
        meta: recorded in ``Dataset.meta`` (with the files and the carve-out).
        split: ``"random"`` (default: `cole_split`) or ``"stratified"``: the carved-out test
            set and the val set the protocol splits from the rows are multilabel-stratified
            (`spmlkit.data.stratify`; ``meta["split"]``).

    Raises:
        ValueError: feature widths that differ between the parts, observed training labels
            without a test set, a carve-out that leaves an empty set.
    """
    check_train_labels(train_labels, name)
    from .stratify import SPLITS

    if split not in SPLITS:
        raise ValueError(f"{name}: split must be one of {SPLITS}, got {split!r}")
    if split == "stratified" and test is not None and val is not None:
        raise ValueError(f"{name}: split=stratified splits the rows that test / val sets are "
                         f"carved out of, and both were given apart: nothing to split")
    observed = train_labels == "observed"
    meta = dict(meta or {})
    if split == "stratified":
        meta["split"] = split
    meta.update(features=train.x_where, labels=train.y_where)
    for part, what in ((test, "test"), (val, "val")):
        if part is not None and part.x.shape[1] != train.x.shape[1]:
            raise ValueError(f"{part.x_where} has {part.x.shape[1]} feature columns but "
                             f"{train.x_where} has {train.x.shape[1]}")
        if part is not None:
            meta.update({f"{what}_features": part.x_where, f"{what}_labels": part.y_where})
    if observed:
        meta["observed_from"] = train.y_where
        if test is None:
            raise ValueError(f"{train.y_where}: observed (partial) training labels need a fully "
                             f"labelled test set given apart (test files); a test set carved "
                             f"out of partially labelled rows would be scored against "
                             f"incomplete labels")
    if test is None and split == "stratified" and train.groups is not None:
        raise ValueError(f"{name}: split=stratified does not keep groups on one side; with a "
                         f"group column the test set takes whole groups (leave split out)")
    if test is None and split == "stratified":
        from .stratify import stratified_test

        pool_idx, test_idx = stratified_test(
            train.y, test_fraction, seed, f"{train.y_where}: the test set carved out (--data "
            f"split=stratified, test_fraction={test_fraction})")
    elif test is None:
        pool_idx, test_idx = split_rows(len(train.y), test_fraction, seed, train.groups,
                                        f"{train.y_where}: the test set carved out")
    if test is None:
        if not len(pool_idx) or not len(test_idx):
            raise ValueError(f"{train.y_where}: {len(train.y)} example(s) leave an empty "
                             f"{'test set' if not len(test_idx) else 'pool'} with test_fraction "
                             f"{test_fraction}; give more rows or explicit test files")
        full = LabelledSet(train.x, train.y, list(classes), ids=list(train.ids), where=name,
                           groups=train.groups)
        pool, test_set = full.subset(pool_idx), full.subset(test_idx)
        meta.update(test_fraction=test_fraction, split_seed=seed)
    else:
        y_pool = (train.y == POSITIVE).astype(np.uint8) if observed else train.y
        pool = LabelledSet(train.x, y_pool, list(classes), ids=train.ids, where=f"{name} train",
                           groups=train.groups)
        test_set = LabelledSet(test.x, test.y, list(classes), ids=test.ids, where=f"{name} test",
                               groups=test.groups)
    val_set = None if val is None else LabelledSet(val.x, val.y, list(classes), ids=val.ids,
                                                   where=f"{name} val", groups=val.groups)
    return Dataset(name, pool, test_set, standardize=standardize, meta=meta,
                   observed=train.y if observed else None, val=val_set)


def _part(features, labels, what: str, classes, observed: bool = False) -> tuple[Part, list]:
    """Read one set of feature and label files (or arrays) into a `Part`; a ``.npy``
    features file is memory-mapped (read batch by batch in its own dtype, never loaded whole:
    `spmlkit.data.rows`)."""
    x, x_where = read_features(features, mmap_mode="r")
    if observed and isinstance(labels, np.ndarray) and labels.dtype.kind == "f":
        # NaN: unknown, as an empty cell
        labels = observed_from_cells(labels, f"{what} array")
    elif observed and not isinstance(labels, np.ndarray) and \
            Path(labels).suffix.lower() in MATRIX_SUFFIXES:
        matrix = load_matrix(labels, LABEL_KEYS, "observed labels")
        if matrix.dtype.kind == "f" and np.isnan(matrix).any():
            y, classes = read_observed(observed_from_cells(matrix, str(labels)), classes)
            return Part(x, y, x_where, str(labels)), classes
    if observed:
        y, classes = read_observed(labels, classes)
    else:
        try:
            y, classes = read_labels(labels, classes, what)
        except ValueError as err:
            if what == "labels" or "must hold only 0 and 1" not in str(err):
                raise
            raise ValueError(f"{err}; for partial {what} (1 / -1 known, 0 or NaN unknown) give "
                             f"eval_labels=partial") from None
    y_where = f"{what} array" if isinstance(labels, np.ndarray) else str(labels)
    return Part(x, y, x_where, y_where), classes


@register("arrays", "your own features + labels: .npy/.npz features; a 0/1 .npy/.npz matrix or a "
          ".csv/.txt of class names per example (train_labels=observed: your partial 1/0/-1 "
          "training labels, regime given); test set given or carved out (0.3, seed 1200)",
          paper="Cole et al. 2021 (protocol)", tags=("features",))
def load_arrays(features: str | os.PathLike | np.ndarray, labels: str | os.PathLike | np.ndarray,
                test_features: str | os.PathLike | np.ndarray | None = None,
                test_labels: str | os.PathLike | np.ndarray | None = None,
                test_fraction: float = TEST_FRACTION, class_names=None,
                standardize: bool = False, name: str = "arrays",
                seed: int = OFFICIAL_SEED, train_labels: str = "full",
                val_features: str | os.PathLike | np.ndarray | None = None,
                val_labels: str | os.PathLike | np.ndarray | None = None,
                eval_labels: str = "full", eval_mask: str | None = None,
                split: str = "random") -> Dataset:
    """Any feature matrix with its labels as a [`Dataset`][spmlkit.data.protocol.Dataset].

    Args:
        features: ``.npy`` / ``.npz`` file (or array), N x D.
        labels: the training labels: ``.npy`` / ``.npz`` 0/1 matrix (N x L), or ``.csv`` /
            ``.txt`` with one line of class names per example (module docstring), or an array.
            With ``train_labels="observed"``: your observed labels, a 1 / 0 / -1 matrix or a
            names file of each row's known positives (`read_observed`).
        test_features, test_labels: the evaluation set, same forms, fully labelled (both or
            neither). Without them the test set is carved out of the rows with ``cole_split(N,
            test_fraction, seed)`` (not with observed training labels: then they are required).
        test_fraction: share of the rows that becomes the test set (default 0.3, as for yeast).
        class_names: the classes, in column order: a list, a text file with one name per
            line, or the names separated by commas (``cat,dog,bird``). Default: the sorted
            names of a names file, else ``class{j}``.
        standardize: standardise features with the train rows' mean and std (in ``make_splits``).
        name: the dataset's name.
        seed: seed of the carve-out (default 1200).
        train_labels: ``"full"`` (default; a regime draws the observed labels) or ``"observed"``
            (``labels`` are your partial training labels; train with regime ``given``).
        val_features, val_labels: a fully labelled validation set (both or neither); default:
            split from the training rows, or for observed training labels carved out of the test
            set (``make_splits``).
        eval_labels: ``"full"`` (default) or ``"partial"``: the test / val label matrices are
            partial (1 positive, -1 known negative, 0 or NaN unknown) and are scored masked
            (`spmlkit.metrics.partial`).
        eval_mask: with partial evaluation labels, ``"entry"`` (default: each class over its
            known rows) or ``"row"`` (the fully known rows only).
        split: ``"random"`` (default) or ``"stratified"``: the test set carved out of the rows
            and the val set split from the training rows are multilabel-stratified
            (`spmlkit.data.stratify`, needs the ``stratify`` extra).

    Returns:
        a [`Dataset`][spmlkit.data.protocol.Dataset] with ``pool`` (the rows the protocol splits
        into train / val) and ``test``; ``ids`` are the row numbers in the given files.

    Raises:
        FileNotFoundError: a file does not exist.
        ValueError: unreadable files, wrong shapes, values other than 0 / 1 (or 1 / 0 / -1 for
            observed labels), NaN / inf features, unknown class names, row or column counts
            that do not match (messages name the files and rows).
    """
    for a, b, what in ((test_features, test_labels, "test"), (val_features, val_labels, "val")):
        if (a is None) != (b is None):
            raise ValueError(f"give both {what}_features and {what}_labels, or neither")
    check_train_labels(train_labels, f"dataset {name!r}")
    check_eval_labels(eval_labels, eval_mask, test_features is not None or
                      val_features is not None, f"dataset {name!r}")
    partial = eval_labels == "partial"
    classes = resolve_class_names(class_names)
    for value, option in ((features, "features"), (labels, "labels"),
                          (test_features, "test_features"), (test_labels, "test_labels"),
                          (val_features, "val_features"), (val_labels, "val_labels")):
        if isinstance(value, (str, os.PathLike)) and not Path(value).exists():
            raise no_such_file(value, option.replace("_", " "), option)
    train, classes = _part(features, labels, "labels", classes, train_labels == "observed")
    test = val = None
    if test_features is not None:
        test, _ = _part(test_features, test_labels, "test labels", classes, partial)
    if val_features is not None:
        val, _ = _part(val_features, val_labels, "val labels", classes, partial)
    if partial:
        test, val = (None if p is None else partial_part(p, eval_mask) for p in (test, val))
    return features_dataset(name, train, classes, test=test, val=val, train_labels=train_labels,
                            test_fraction=test_fraction, seed=seed, standardize=standardize,
                            split=split)
