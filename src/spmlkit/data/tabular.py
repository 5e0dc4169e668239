"""Your own tables as a dataset source (``tabular``): CSV or Parquet files with one row per
example, feature columns and label columns chosen by name or pattern.

Files: ``.csv`` (comma), ``.tsv`` (tab), ``.parquet`` / ``.pq`` (needs pyarrow). pandas reads
them; both come with the ``tabular`` extra (``pip install -e ".[tabular]"`` in a clone of spmlkit).

Columns:

* ``labels`` (required): the label columns, as names and/or shell-style patterns
  (``label_*``), comma-separated or a list; the class names are the column names. Values: 0 / 1
  (full labels), or with ``train_labels="observed"`` in the training rows 1 (positive),
  0 (unobserved), -1 (negative), an empty cell counting as unobserved. Or a **single** column of
  text holding each row's class names separated by ``;`` or ``|`` (``"cat;dog"``): the classes
  are then the sorted names found (or ``class_names``), and in observed training rows the names
  are the known positives.
* ``features``: names and/or patterns likewise; default every numeric column that is not a
  label, the split or the id column (left-out text columns are listed in a warning). A
  whole-number column with a different value on every row looks like a row identifier and is
  refused as a feature (give it as ``id_column``, or name it in ``features`` to keep it).
  Features are standardised (z-score with the train rows' mean and std) unless
  ``standardize=false``.
* ``id_column``: an identifier per row (the dataset's ids, and ``spml predict``'s item names).
* ``split_column``: with one file for every row, the column saying ``train``, ``val`` or
  ``test`` per row (``training``, ``valid``, ``validation``, ``testing`` too, any case).

Sets: ``path`` holds the training rows (or every row, with ``split_column``); ``test_path`` /
``val_path`` fully labelled evaluation / validation rows with the same feature columns. Without
a test set the test rows are carved out of ``path`` exactly as the ``arrays`` source does
(`features_dataset`: Cole split, 0.3, seed 1200), which is also where
standardisation and observed training labels are handled.

>>> import tempfile, numpy as np, pandas as pd
>>> from pathlib import Path
>>> d = Path(tempfile.mkdtemp())
>>> rng = np.random.RandomState(0)
>>> df = pd.DataFrame({"f1": rng.rand(10), "f2": rng.rand(10), "cat": [1, 0] * 5,
...                    "dog": [1] * 10})
>>> df.to_csv(d / "rows.csv", index=False)
>>> ds = load_tabular(d / "rows.csv", labels="cat,dog")
>>> ds.class_names, ds.meta["feature_columns"], len(ds.pool), len(ds.test)
(['cat', 'dog'], ['f1', 'f2'], 7, 3)
"""
from __future__ import annotations

import bz2
import contextlib
import fnmatch
import gzip
import lzma
import os
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from ..labels import OFFICIAL_SEED, observed_from_cells, positives_to_observed, \
    validate_full_labels
from .arrays import TEST_FRACTION, Part, _preview, check_eval_labels, check_features, \
    features_dataset, no_such_file, partial_part, check_found_names, resolve_class_names
from .protocol import Dataset, check_train_labels
from .registry import register

__all__ = ["TABLE_SUFFIXES", "table_kind", "SPLIT_VALUES", "load_tabular", "read_table",
           "select_columns", "table_features", "table_labels"]

#: file endings the tabular source reads
TABLE_SUFFIXES = (".csv", ".tsv", ".parquet", ".pq")
#: compressions pandas reads a CSV / TSV in (from the extension: ``rows.csv.gz``)
COMPRESSED = (".gz", ".bz2", ".xz", ".zip", ".zst")


def table_kind(path) -> str | None:
    """The table format of ``path`` from its name: one of `TABLE_SUFFIXES` (a compressed
    CSV / TSV, ``x.csv.gz``, is ``.csv`` / ``.tsv``), or None for other files.

    >>> table_kind("rows.csv.gz"), table_kind("x.PARQUET"), table_kind("x.npy")
    ('.csv', '.parquet', None)
    """
    name = Path(path).name.lower()
    for ext in COMPRESSED:
        if name.endswith((".csv" + ext, ".tsv" + ext)):
            name = name[:-len(ext)]
    suffix = Path(name).suffix
    return suffix if suffix in TABLE_SUFFIXES else None
#: the values a split column may hold (any case) and the set each means
SPLIT_VALUES = {"train": "train", "training": "train", "val": "val", "valid": "val",
                "validation": "val", "test": "test", "testing": "test"}
_NAME_SEPARATORS = (";", "|")


def _pandas():
    try:
        import pandas
    except ModuleNotFoundError:
        from ..extras import install_hint

        raise ModuleNotFoundError("the tabular source reads files with pandas, which is not "
                                  "installed: " + install_hint("tabular", "pandas pyarrow")
                                  ) from None
    return pandas


class _InflationError(ValueError):
    """A compressed table inflating past what memory holds (`spmlkit.resources`)."""


@contextlib.contextmanager
def _inflating(path: Path):
    """For a compressed file (`COMPRESSED`): its decompressed stream, bounded to what this
    process can hold (`spmlkit.resources.bounded_reader`); else None (pandas opens it)."""
    from ..resources import bounded_reader

    opener = _DECOMPRESSORS.get(path.suffix.lower())
    if opener is None:
        yield None
        return
    fh = bounded_reader(opener(path), path)
    try:
        yield fh
    except ValueError as err:
        if "inflates to more than" in str(err):
            raise _InflationError(str(err)) from None
        raise
    finally:
        fh.close()


def _zip_member(path: Path):
    """The one file of a zipped table (pandas' rule), as a stream; the archive's file closes
    with it."""
    import zipfile

    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as err:
        raise ValueError(f"not a zip archive ({err})") from None
    files = [i for i in archive.infolist() if not i.is_dir()]
    if len(files) != 1:
        archive.close()
        raise ValueError(f"a zipped table holds one file, this archive {len(files)} "
                         f"({', '.join(i.filename for i in files[:5]) or 'none'}); zip the "
                         f"table alone")
    member = archive.open(files[0])
    archive.close()  # (zipfile keeps the file open until its open member is closed too)
    return member


def _zstd(path: Path):
    try:
        import zstandard
    except ModuleNotFoundError:
        raise ModuleNotFoundError(f"{path}: reading a .zst table needs the zstandard package "
                                  f"(pip install zstandard), or give it as .csv.gz / .xz") \
            from None
    return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)


#: how each of `COMPRESSED` is opened: a stream of the table's text
_DECOMPRESSORS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open, ".zip": _zip_member,
                  ".zst": _zstd}


def read_table(path, what: str = "table", text_columns: Sequence[str] = (),
               option: str | None = None):
    """A CSV / TSV / Parquet file as a pandas ``DataFrame``; the CSV columns named in
    ``text_columns`` (an id column) are read as text, as written (``007`` stays ``007``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: another extension, an unreadable or empty file, a header that names a
            column twice, data rows with more fields than the header (the message names it).
        ModuleNotFoundError: pandas (or pyarrow, for Parquet) is not installed.
    """
    pd = _pandas()
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} file {path} is a folder; give the path of a "
                         f"{', '.join(TABLE_SUFFIXES)} file")
    if not path.is_file():
        raise no_such_file(path, what, option)
    suffix = table_kind(path)
    if suffix is None:
        raise ValueError(f"{path}: a {what} must be a {', '.join(TABLE_SUFFIXES)} file (a .csv "
                         f"or .tsv also compressed: {', '.join(COMPRESSED)}), got "
                         f"{path.suffix or 'no'} extension")
    try:
        if suffix in (".parquet", ".pq"):
            try:
                import pyarrow  # noqa: F401
            except ModuleNotFoundError:
                from ..extras import install_hint

                raise ModuleNotFoundError("reading Parquet files needs pyarrow: " +
                                          install_hint("tabular", "pyarrow")) from None
            df = pd.read_parquet(path)
        else:
            sep = "\t" if suffix == ".tsv" else ","
            with _inflating(path) as fh:  # a compressed file: its inflation bounded
                header = pd.read_csv(fh if fh is not None else path, sep=sep, header=None,
                                     nrows=1, encoding="utf-8-sig", dtype=str)
            with _inflating(path) as fh, warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", pd.errors.ParserWarning)
                # index_col=False: more fields than the header is a ParserWarning, not the
                # first column read as the index and every other one a place to the left
                df = pd.read_csv(fh if fh is not None else path, sep=sep, encoding="utf-8-sig",
                                 dtype={c: str for c in text_columns}, index_col=False)
            longer = any(issubclass(w.category, pd.errors.ParserWarning) for w in caught)
            names = [str(c).strip() for c in header.iloc[0].tolist()] if len(header) else []
    except _InflationError as err:
        raise ValueError(str(err)) from None
    except EOFError as err:  # a compressed file cut short
        raise ValueError(f"{path}: the compressed file is truncated (it ends before its "
                         f"compressed stream does: {err}); copy it again") from None
    except (ValueError, OSError, UnicodeDecodeError) as err:  # pandas' parser errors too
        raise ValueError(f"{path}: not a readable {suffix} table ({err})") from None
    if suffix not in (".parquet", ".pq"):
        _check_header(path, names, df, longer, sep)
    if df.empty:
        raise ValueError(f"{path}: the {what} has no row (expected a header line, then one row "
                         f"per example)")
    df.columns = [str(c).strip() for c in df.columns]
    return df


def _warn_shared_rows(path, other_path, train, other, what: str, by_ids: bool) -> None:
    """Warn when the test / val rows are training rows: the same file, or (``by_ids``: an id
    column) ids in both."""
    if other is None or other_path is None:
        return
    if Path(other_path).resolve() == Path(path).resolve():
        warnings.warn(f"{other_path}: the {what} file is the training file: its scores are "
                      f"on the rows the model trains on", stacklevel=3)
    elif by_ids:
        shared = set(train.ids) & set(other.ids)
        if shared:
            warnings.warn(f"{other_path}: {len(shared)} of its {len(other.ids)} ids are also "
                          f"training rows' ids in {path} (first: {sorted(shared)[0]!r}); rows in "
                          f"both are scored on what the model trained on", stacklevel=3)


def table_ids(df, id_column: str, where: str) -> list[str]:
    """The ``id_column`` values as text (as written: `read_table` reads the column as text);
    a ValueError naming the first row with an empty id."""
    col = df[id_column]
    empty = col.isna().to_numpy().nonzero()[0]
    if len(empty):
        more = f" ({len(empty) - 1} more)" if len(empty) > 1 else ""
        raise ValueError(f"{where}: id column {id_column!r} is empty at data row "
                         f"{int(empty[0]) + 1}{more}; every row needs an id")
    return [str(v) for v in col]


def table_groups(df, group_column: str, where: str) -> np.ndarray:
    """The group of each row (``group_column``'s values as text), or an error naming the file,
    the column and the first empty cell."""
    if group_column not in df.columns:
        raise ValueError(f"{where}: group_column {group_column!r} is not a column; the columns "
                         f"are {_preview(list(df.columns), 12)}")
    cells = df[group_column]
    empty = np.flatnonzero(cells.isna().to_numpy() | (cells.astype(str).str.strip() == ""))
    if empty.size:
        raise ValueError(f"{where}: group column {group_column!r} is empty at data row "
                         f"{int(empty[0]) + 1} ({empty.size} empty cell(s)); every row needs "
                         f"its group")
    return cells.astype(str).str.strip().to_numpy()


def _check_header(path: Path, names: list[str], df, longer: bool, sep: str) -> None:
    """Refuse a header of one column holding another separator than ``sep`` (a ';'-separated
    .csv), a header naming a column twice (pandas renames the second ``f1`` to ``f1.1``) and
    data rows with more fields than the header (``longer``: pandas' ParserWarning)."""
    import collections

    other = next((c for c in (";", "\t", ",", "|") if c != sep and c in names[0]), None) \
        if len(names) == 1 else None
    if other is not None:
        name = {"\t": "tab", ";": "';'", ",": "','", "|": "'|'"}[other]
        raise ValueError(f"{path}: the header is one column, {names[0]!r:.80}: the file looks "
                         f"{name}-separated; a {table_kind(path)} file is read "
                         f"{'tab' if sep == chr(9) else 'comma'}-separated (save it as CSV "
                         f"with commas, or tab-separated as .tsv)")
    twice = [n for n, c in collections.Counter(names).items() if c > 1 and n != "nan"]
    if twice:
        raise ValueError(f"{path}: the header names column {twice[0]!r} twice; give each "
                         f"column a name of its own")
    if longer:
        raise ValueError(f"{path}: the data rows have more fields than the header's "
                         f"{len(df.columns)} (a column without a name in the header?); every "
                         f"row needs one field per header name")


def _patterns(spec) -> list[str]:
    if spec is None:
        return []
    items = spec.split(",") if isinstance(spec, str) else [str(s) for s in spec]
    return [s.strip() for s in items if s.strip()]


def select_columns(columns: Sequence[str], spec, what: str, where: str) -> list[str]:
    """The columns ``spec`` names: exact names and shell-style patterns (``f_*``), given as a
    comma-separated string or a list, in the table's column order, each once.

    Raises:
        ValueError: an empty ``spec``, or a name / pattern that matches no column (the message
            lists the table's columns).

    >>> select_columns(["id", "f1", "f2", "y_a", "y_b"], "y_*", "label", "t.csv")
    ['y_a', 'y_b']
    """
    items = _patterns(spec)
    if not items:
        raise ValueError(f"{where}: no {what} column given (names or patterns such as "
                         f"'label_*', comma-separated)")
    repeated = sorted({i for i in items if items.count(i) > 1})
    if repeated:
        raise ValueError(f"{where}: {what} column(s) {repeated} given more than once in "
                         f"{','.join(items)!r}; name each column once")
    chosen = set()
    for item in items:
        found = [c for c in columns if c == item or fnmatch.fnmatchcase(c, item)]
        if not found:
            raise ValueError(f"{where}: {what} column {item!r} matches no column; the columns "
                             f"are {_preview(list(columns), 12)}")
        chosen.update(found)
    return [c for c in columns if c in chosen]


#: a whole-number column with a different value on every one of at least this many rows is
#: taken for a row identifier (refused as a feature unless named in ``features=``)
ID_MIN_ROWS = 10


def identifier_columns(df, columns: Sequence[str]) -> list[str]:
    """The ``columns`` of ``df`` that look like row identifiers: whole numbers (an integer
    dtype) with a different value on every row, in a table of at least `ID_MIN_ROWS`
    rows.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"id": range(20), "f": [0.5] * 20, "n": [1, 2] * 10})
    >>> identifier_columns(df, ["id", "f", "n"])
    ['id']
    """
    if len(df) < ID_MIN_ROWS:
        return []
    return [c for c in columns if df[c].dtype.kind in "iu" and df[c].is_unique]


def table_features(df, columns: Sequence[str], where: str) -> np.ndarray:
    """The float32 N x D matrix of ``columns`` (`check_features`).

    Raises:
        ValueError: a missing column, a column that is not numeric, or empty / NaN / inf cells
            (the message names the column and the first row, counted from 0 after the header).
    """
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{where}: feature column(s) {_preview(missing)} missing (the run "
                         f"needs the columns it was trained on, by name)")
    for c in columns:
        col = df[c]
        if col.dtype.kind not in "fiub":
            bad = next((i for i, v in enumerate(col) if not _is_number(v)), 0)
            raise ValueError(f"{where}: feature column {c!r} is not numeric (row {bad}: "
                             f"{col.iloc[bad]!r}); choose the feature columns with features=")
        if col.isna().any():
            raise ValueError(f"{where}: feature column {c!r} has an empty / NaN cell (first at "
                             f"row {int(np.flatnonzero(col.isna().to_numpy())[0])})")
    # column by column into the float32 matrix (the same values as casting an N x D float64
    # copy, which is never made: one column's float64 at a time)
    x = np.empty((len(df), len(columns)), dtype=np.float32)
    for j, c in enumerate(columns):
        values = df[c].to_numpy(dtype=np.float64)
        with np.errstate(over="ignore"):
            x[:, j] = values
        bad = np.flatnonzero(~np.isfinite(x[:, j]))
        if bad.size:  # inf in the file, or a value past float32's 3.4e38
            raise ValueError(f"{where}: feature column {c!r} holds {float(values[bad[0]]):g} "
                             f"at data row {int(bad[0]) + 1} ({bad.size} such cell(s)): features "
                             f"must be finite float32 numbers (at most 3.4e38)")
    return check_features(x, where)


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _split_names(cell) -> list[str]:
    if cell is None or (isinstance(cell, float) and np.isnan(cell)):
        return []
    text = str(cell)
    for sep in _NAME_SEPARATORS[1:]:
        text = text.replace(sep, _NAME_SEPARATORS[0])
    return [n.strip() for n in text.split(_NAME_SEPARATORS[0]) if n.strip()]


def _partial_hint(split: str) -> str:
    """The option that reads a split's labels as partial (1 / -1 known, 0 or empty unknown)."""
    if split == "train":
        return "partial training labels, 1 / -1 known and an empty cell unknown: --data " \
               "train_labels=observed"
    return f"partial {split} labels, 1 / -1 known and an empty cell unknown: --data " \
           f"eval_labels=partial"


def table_labels(df, columns: Sequence[str], where: str, observed: bool = False,
                 classes: Sequence[str] | None = None, split: str = "train"
                 ) -> tuple[np.ndarray, list[str]]:
    """The label matrix of ``columns``: full 0 / 1 labels, or (``observed``) 1 / 0 / -1 with
    empty cells unobserved; one text column of ``;``-separated class names per row works too.
    ``split`` (train, val or test) chooses the option a refusal of full labels points to
    (``train_labels=observed``, or ``eval_labels=partial`` for val / test labels).

    Returns:
        ``(y, classes)``: uint8 (full) or int8 (observed) N x L, and the class names (the
        column names, or for a names column the sorted names found / ``classes``).

    Raises:
        ValueError: values outside {0, 1} (full) or {1, 0, -1} (observed), empty cells in full
            labels, a name outside ``classes``, ``classes`` whose length differs from the columns
            (messages name the file, column and row).
    """
    columns = list(columns)
    if len(columns) == 1 and df[columns[0]].dtype.kind not in "fiub":
        names = [_split_names(v) for v in df[columns[0]]]
        found = sorted({n for row in names for n in row})
        if classes is None:
            check_found_names(found, f"{where}, column {columns[0]!r}")
        classes = list(classes) if classes is not None else found
        column = {c: j for j, c in enumerate(classes)}
        y = np.zeros((len(names), len(classes)), dtype=np.uint8)
        for i, row in enumerate(names):
            for n in row:
                if n not in column:
                    raise ValueError(f"{where}, row {i}: unknown class name {n!r} in column "
                                     f"{columns[0]!r}; known classes: {_preview(classes)}")
                y[i, column[n]] = 1
        if not classes:
            raise ValueError(f"{where}: column {columns[0]!r} names no class on any row")
        return (positives_to_observed(y) if observed else y), classes
    for c in columns:
        if df[c].dtype.kind not in "fiub":
            bad = next((i for i, v in enumerate(df[c]) if not _is_number(v)), 0)
            raise ValueError(f"{where}: label column {c!r} is not numeric (row {bad}: "
                             f"{df[c].iloc[bad]!r}); label columns hold "
                             f"{'1 / 0 / -1' if observed else '0 / 1'}, or give one column of "
                             f"class names")
    values = df[columns].to_numpy(dtype=np.float64)
    empty = np.isnan(values)
    if observed:
        y = observed_from_cells(values, f"{where} (columns {_preview(columns)})")
    else:
        if empty.any():
            r, j = np.argwhere(empty)[0]
            raise ValueError(f"{where}: label column {columns[j]!r} has an empty cell (row {r}); "
                             f"full labels are 0 or 1 in every cell ({_partial_hint(split)})")
        try:
            y = validate_full_labels(values, f"{where} (columns {_preview(columns)})")
        except ValueError as err:
            if not (values == -1).any():
                raise
            raise ValueError(f"{err} ({_partial_hint(split)})") from None
    if classes is not None and len(classes) != len(columns):
        raise ValueError(f"{where}: {len(columns)} label columns but {len(classes)} class names")
    return y, list(classes) if classes is not None else columns


@register("tabular", "your own tables: CSV or Parquet rows with feature and label columns by name "
          "or pattern; test / val files or a split column (or test carved out, 0.3, seed 1200); "
          "train_labels=observed: your partial 1/0/-1 training labels (regime given)",
          paper="Cole et al. 2021 (protocol)", tags=("features",))
def load_tabular(path: str | os.PathLike, labels: str | list,
                 features: str | list | None = None,
                 test_path: str | os.PathLike | None = None,
                 val_path: str | os.PathLike | None = None,
                 split_column: str | None = None, id_column: str | None = None,
                 train_labels: str = "full", class_names=None,
                 test_fraction: float = TEST_FRACTION, standardize: bool = True,
                 name: str = "tabular", seed: int = OFFICIAL_SEED,
                 eval_labels: str = "full", eval_mask: str | None = None,
                 split: str = "random", group_column: str | None = None) -> Dataset:
    """A CSV / Parquet table (or several) as a [`Dataset`][spmlkit.data.protocol.Dataset] (the
    module docstring describes the files and columns).

    Args:
        path: the training rows (every row, with ``split_column``).
        labels: label columns (names / patterns) or one column of class names.
        features: feature columns (names / patterns); default every other numeric column.
        test_path: fully labelled test rows (the final scores), same columns (not with
            ``split_column``); default: carved out of ``path`` (``test_fraction``).
        val_path: fully labelled validation rows (what the best epoch, C or threshold is
            chosen on), same columns (not with ``split_column``); default: a share of the
            training rows, split off by the protocol.
        split_column: the column saying ``train`` / ``val`` / ``test`` per row of ``path``.
        id_column: a column of row identifiers.
        train_labels: ``"full"`` (0 / 1 training labels; a regime draws the observed ones) or
            ``"observed"`` (your partial 1 / 0 / -1 training labels, regime ``given``; needs a
            test set: ``test_path`` or ``split_column``).
        class_names: the classes of a names column, in column order (a list, a file, or the names
            separated by commas: ``cat,dog,bird``).
        test_fraction, seed: the carve-out when no test set is given.
        standardize: standardise the features (z-score) with the train rows' mean and std
            (default True: table columns come in any units; ``standardize=false`` keeps them as
            they are). The statistics are recorded in the run (``config.json`` key
            ``features``, and ``best.pt``, from which ``spml predict`` applies them to new
            rows).
        name: the dataset's name.
        eval_labels: ``"full"`` (default) or ``"partial"``: the test / val rows' label columns
            are partial (1 positive, -1 known negative, 0 or an empty cell unknown: the
            encoding of observed training labels) and are scored masked
            (`spmlkit.metrics.partial`; needs ``test_path`` / ``val_path`` or
            ``split_column``).
        eval_mask: with partial evaluation labels, ``"entry"`` (default: each class over its
            known rows; the OpenImages rule) or ``"row"`` (the fully known rows only).
        split: ``"random"`` (default) or ``"stratified"``: the test set carved out of
            ``path`` and the val set split from the training rows are multilabel-stratified
            (`spmlkit.data.stratify`, needs the ``stratify`` extra).
        group_column: a column naming each row's group (a recording, an asset, a patient:
            rows that must not sit on both sides of a split). The test set carved out of
            ``path``, the val set and the tabular protocol's splits then take whole groups
            (`spmlkit.data.protocol.group_split`), and the asset regulariser
            (``--hp asset_alpha=...``) averages over them. Not a feature.

    Returns:
        a [`Dataset`][spmlkit.data.protocol.Dataset]; ``meta["feature_columns"]`` /
        ``meta["label_columns"]`` name the columns used (``spml predict`` reads new rows' features
        by those names).

    Raises:
        FileNotFoundError: a file does not exist.
        ModuleNotFoundError: pandas / pyarrow missing.
        ValueError: unreadable files, columns that match nothing or are missing in a test / val
            file, non-numeric or empty cells, labels outside the encoding, a split column with
            other values, a test set given twice.
    """
    check_train_labels(train_labels, f"dataset {name!r}")
    check_eval_labels(eval_labels, eval_mask, split_column is not None or test_path is not None
                      or val_path is not None, f"dataset {name!r}")
    observed = train_labels == "observed"
    path = Path(path)
    text = [c for c in (id_column, group_column) if c]
    df = read_table(path, text_columns=text, option="path")
    where = str(path)
    if split_column is not None and (test_path is not None or val_path is not None):
        raise ValueError(f"{where}: give split_column (one file of every row) or test_path / "
                         f"val_path (separate files), not both")
    label_cols = select_columns(list(df.columns), labels, "label", where)
    reserved = set(label_cols) | _named_columns(df, where, split_column=split_column,
                                                id_column=id_column, group_column=group_column)
    feature_cols = _feature_columns(df, features, reserved, where)
    classes = resolve_class_names(class_names)
    frames = {"train": (df, where)} if split_column is None else \
        _split_frames(df, split_column, where)
    for s, p in (("test", test_path), ("val", val_path)):
        if p is not None:
            frames[s] = (read_table(p, f"{s} table", text, f"{s}_path"), str(p))

    def part(s: str, observed_labels: bool = False):
        frame, frame_where = frames[s]
        x = table_features(frame, feature_cols, frame_where)
        missing = [c for c in label_cols if c not in frame.columns]
        if missing:
            raise ValueError(f"{frame_where}: label column(s) {_preview(missing)} missing")
        y, names = table_labels(frame, label_cols, frame_where, observed_labels, classes, s)
        ids = table_ids(frame, id_column, frame_where) \
            if id_column and id_column in frame.columns else None
        groups = table_groups(frame, group_column, frame_where) if group_column and (
            s == "train" or group_column in frame.columns) else None  # a file given apart: may
        return Part(x, y, frame_where, frame_where, ids, groups), names

    train, classes = part("train", observed)
    partial = eval_labels == "partial"  # read as observed labels, then masked
    test = part("test", partial)[0] if "test" in frames else None
    val = part("val", partial)[0] if "val" in frames else None
    for s, part_ in (("test", test), ("val", val)):
        _warn_shared_rows(path, {"test": test_path, "val": val_path}[s], train, part_, s,
                          id_column is not None)
    if partial:
        test, val = (None if p is None else partial_part(p, eval_mask) for p in (test, val))
    meta = {"source": "tabular", "path": where, "feature_columns": feature_cols,
            "label_columns": label_cols, "id_column": id_column, "split_column": split_column,
            **({"group_column": group_column} if group_column else {}),
            **({"eval_labels": "partial", "eval_mask": eval_mask or "entry"} if partial else {})}
    return features_dataset(name, train, classes, test=test, val=val, train_labels=train_labels,
                            test_fraction=test_fraction, seed=seed, standardize=standardize,
                            meta=meta, split=split)


def _named_columns(df, where: str, **named) -> set:
    """The columns named by options (``split_column=...``, ``None``: not given), each checked
    to be a column of the table."""
    for what, c in named.items():
        if c is not None and c not in df.columns:
            raise ValueError(f"{where}: {what} {c!r} is not a column; the columns are "
                             f"{_preview(list(df.columns), 12)}")
    return {c for c in named.values() if c is not None}


def _feature_columns(df, features, reserved: set, where: str) -> list:
    """The feature columns of a table: those ``features`` names (none of ``reserved``, the
    label / split / id columns), or every other numeric column; a column of numbers but for a
    few cells, and one that looks like row identifiers, are refused with what to do."""
    if features is None:
        feature_cols = [c for c in df.columns if c not in reserved and df[c].dtype.kind in "fiub"]
        skipped = [c for c in df.columns if c not in reserved and c not in feature_cols]
        for c in skipped:  # numbers but for a few cells: a typo, a repeated header line
            cells = df[c].dropna()
            bad = [i for i, v in cells.items() if not _is_number(v)]
            if len(bad) < len(cells) and len(bad) <= max(1, len(cells) // 10):
                i = bad[0]
                raise ValueError(f"{where}: column {c!r} holds numbers but for {len(bad)} "
                                 f"cell(s), the first at data row {int(i) + 1}: "
                                 f"{df[c].loc[i]!r:.60} (a typo, or a header line repeated in "
                                 f"the file?); fix the cell, or choose the feature columns with "
                                 f"features=")
        if skipped:
            warnings.warn(f"{where}: non-numeric column(s) {_preview(skipped)} are not used as "
                          f"features (choose the feature columns with features=)", stacklevel=3)
        if not feature_cols:
            raise ValueError(f"{where}: no numeric column besides the labels to use as features")
    else:
        feature_cols = select_columns(list(df.columns), features, "feature", where)
        clash = sorted(reserved & set(feature_cols))
        if clash:
            raise ValueError(f"{where}: column(s) {clash} are chosen as features and as labels / "
                             f"split / id")
    named = set(_patterns(features))  # a column named exactly is a feature by choice
    ids = [c for c in identifier_columns(df, feature_cols) if c not in named]
    if ids:
        raise ValueError(f"{where}: column(s) {_preview(ids)} look like row identifiers (whole "
                         f"numbers, a different one on each of the {len(df)} rows) and would "
                         f"be used as features: give id_column={ids[0]} (its values then name "
                         f"the rows, e.g. in spml predict's output), or choose the features with "
                         f"features=... (a column named there is kept as a feature)")
    return feature_cols


def _split_frames(df, split_column: str, where: str) -> dict:
    """``{"train" | "val" | "test": (rows, where)}`` of a table whose ``split_column`` says
    which part each row is (an empty cell, another value, or no train row refused)."""
    empty = np.flatnonzero(df[split_column].isna().to_numpy())
    if empty.size:
        raise ValueError(f"{where}: split column {split_column!r} is empty at data row "
                         f"{int(empty[0]) + 1} ({empty.size} empty cell(s)); expected train, "
                         f"val or test per row")
    kind = df[split_column].astype(str).str.strip().str.lower()
    unknown = sorted(set(kind) - set(SPLIT_VALUES))
    if unknown:
        first = int(np.flatnonzero(kind.isin(unknown).to_numpy())[0])
        raise ValueError(f"{where}: split column {split_column!r} holds {unknown[:5]} (first "
                         f"at data row {first + 1}); expected train, val or test per row")
    kind = kind.map(SPLIT_VALUES)
    frames = {s: (df[kind == s].reset_index(drop=True), f"{where} ({split_column}={s})")
              for s in ("train", "val", "test") if (kind == s).any()}
    if "train" not in frames:
        raise ValueError(f"{where}: no row has {split_column}=train")
    return frames
