"""Your own features and labels as a dataset source (``arrays``), and the file readers it shares
with :mod:`spmlkit.data.cole`.

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

Without a test file, the test set is carved out of all rows with the official split
(:func:`~spmlkit.data.base.cole_split`, fraction 0.3, seed 1200), as for yeast; the rest is the
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
from pathlib import Path
from typing import Sequence

import numpy as np

from ..labels import OFFICIAL_SEED, validate_full_labels
from .base import Dataset, LabelledSet, cole_split
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


def load_matrix(path, keys: Sequence[str] = (), what: str = "array",
                mmap_mode: str | None = None) -> np.ndarray:
    """Read one array from a ``.npy`` file, or from a ``.npz`` file (the first of ``keys`` it
    holds, else its only array).

    Args:
        path: the file.
        keys: preferred ``.npz`` keys, in order.
        what: what the array is, for error messages (``"features"``, ``"labels"``).
        mmap_mode: passed to :func:`numpy.load` for ``.npy`` files (``"r"`` maps the file instead
            of reading it; ignored for ``.npz``, which numpy cannot map).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: another extension, an unreadable file (e.g. a pickled object array), or an
            ``.npz`` file with several arrays and none of ``keys`` (the message lists its keys).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix not in MATRIX_SUFFIXES:
        raise ValueError(f"{path}: {what} must be a .npy or .npz file, got {path.suffix or 'no'} "
                         f"extension")
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
        raise FileNotFoundError(f"class-names file {path} does not exist")
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
    """``class_names`` as a list: ``None``, a sequence of names, or a path to a names file."""
    if class_names is None:
        return None
    if isinstance(class_names, (str, os.PathLike)):
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
        raise FileNotFoundError(f"labels file {path} does not exist")
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


def read_labels(labels, classes: Sequence[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """Full labels from a 0/1 ``.npy`` / ``.npz`` matrix or a ``.csv`` / ``.txt`` names file.

    Returns ``(y, classes)``; for a matrix without ``classes`` the names are ``class{j}``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown extension, values other than 0 / 1 (the message names the file and
            the first row), or a column count that differs from ``len(classes)``.
    """
    if isinstance(labels, np.ndarray):
        path, y = "labels array", labels
    else:
        path = Path(labels)
        if path.suffix.lower() in TEXT_SUFFIXES:
            return read_label_names(path, classes)
        if path.suffix.lower() not in MATRIX_SUFFIXES and path.is_file():
            raise ValueError(f"{path}: labels must be a .npy / .npz 0/1 matrix or a .csv / .txt "
                             f"file of class names, got {path.suffix or 'no'} extension")
        y = load_matrix(path, LABEL_KEYS, "labels")
    y = validate_full_labels(y, str(path))
    if classes is None:
        classes = [f"class{j}" for j in range(y.shape[1])]
    elif len(classes) != y.shape[1]:
        raise ValueError(f"{path}: {y.shape[1]} label columns but {len(classes)} class names "
                         f"({_preview(classes)})")
    return y, list(classes)


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


@register("arrays", "your own features + labels: .npy/.npz features; a 0/1 .npy/.npz matrix or a "
          ".csv/.txt of class names per example; test set given or carved out (0.3, seed 1200)",
          paper="Cole et al. 2021 (protocol)", tags=("features",))
def load_arrays(features: str | os.PathLike | np.ndarray, labels: str | os.PathLike | np.ndarray,
                test_features: str | os.PathLike | np.ndarray | None = None,
                test_labels: str | os.PathLike | np.ndarray | None = None,
                test_fraction: float = TEST_FRACTION, class_names=None,
                standardize: bool = False, name: str = "arrays",
                seed: int = OFFICIAL_SEED) -> Dataset:
    """Any feature matrix with full labels as a :class:`~spmlkit.data.base.Dataset`.

    Args:
        features: ``.npy`` / ``.npz`` file (or array), N x D.
        labels: ``.npy`` / ``.npz`` 0/1 matrix (N x L), or ``.csv`` / ``.txt`` with one line of
            class names per example (module docstring), or an array.
        test_features, test_labels: the evaluation set, same forms (both or neither). Without
            them the test set is carved out of the rows with ``cole_split(N, test_fraction,
            seed)``.
        test_fraction: share of the rows that becomes the test set (default 0.3, as for yeast).
        class_names: the classes, in column order: a list, or a text file with one name per
            line. Default: the sorted names of a names file, else ``class{j}``.
        standardize: standardise features with the train rows' mean and std (in ``make_splits``).
        name: the dataset's name.
        seed: seed of the carve-out (default 1200).

    Returns:
        a :class:`Dataset` with ``pool`` (the rows the protocol splits into train / val) and
        ``test``; ``ids`` are the row numbers in the given files.

    Raises:
        FileNotFoundError: a file does not exist.
        ValueError: unreadable files, wrong shapes, values other than 0 / 1, NaN / inf features,
            unknown class names, row or column counts that do not match (messages name the files
            and rows).
    """
    if (test_features is None) != (test_labels is None):
        raise ValueError("give both test_features and test_labels, or neither (then the test set "
                         f"is carved out of the rows with fraction {test_fraction})")
    classes = resolve_class_names(class_names)
    x, x_where = read_features(features)
    y, classes = read_labels(labels, classes)
    y_where = "labels array" if isinstance(labels, np.ndarray) else str(labels)
    check_rows(x, x_where, y, y_where)
    meta = {"features": x_where, "labels": y_where}
    if test_features is None:
        pool_idx, test_idx = cole_split(len(y), test_fraction, seed)
        if not len(pool_idx) or not len(test_idx):
            raise ValueError(f"{y_where}: {len(y)} example(s) leave an empty "
                             f"{'test set' if not len(test_idx) else 'pool'} with test_fraction "
                             f"{test_fraction}; give more rows or explicit test files")
        full = LabelledSet(x, y, classes, ids=range(len(y)), where=name)
        pool, test = full.subset(pool_idx), full.subset(test_idx)
        meta.update(test_fraction=test_fraction, split_seed=seed)
    else:
        xt, xt_where = read_features(test_features)
        yt, _ = read_labels(test_labels, classes)
        yt_where = "test labels array" if isinstance(test_labels, np.ndarray) else str(test_labels)
        check_rows(xt, xt_where, yt, yt_where)
        if xt.shape[1] != x.shape[1]:
            raise ValueError(f"{xt_where} has {xt.shape[1]} feature columns but {x_where} has "
                             f"{x.shape[1]}")
        pool = LabelledSet(x, y, classes, ids=range(len(y)), where=f"{name} train")
        test = LabelledSet(xt, yt, classes, ids=range(len(yt)), where=f"{name} test")
        meta.update(test_features=xt_where, test_labels=yt_where)
    return Dataset(name, pool, test, standardize=standardize, meta=meta)
