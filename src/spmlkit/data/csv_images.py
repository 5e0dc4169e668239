"""Your own images listed in a CSV file as a dataset source (``csv``): one row per image, its
path, then its class names. Test = a second CSV, else 0.3 of the rows (the Cole split, seed 1200,
as for yeast).
"""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..labels import OFFICIAL_SEED, positives_to_observed
from .protocol import Dataset, check_train_labels
from ..metrics import partial_labels
from .arrays import check_eval_labels, check_found_names, resolve_class_names
from .image_common import TAGS, TEST_FRACTION, carve, image_dataset, join_paths, with_groups
from .registry import register

__all__ = ["CSV_HEADERS", "CSV_NAME_SEPARATORS", "load_csv_images", "read_image_csv",
           "read_image_groups"]


#: A first row is a header when its first cell is one of these (any case).
CSV_HEADERS = ("path", "image", "image_path", "file", "filename", "file_name", "img")
CSV_NAME_SEPARATORS = (";", "|")


def _split_names(cell: str) -> list[str]:
    for sep in CSV_NAME_SEPARATORS[1:]:
        cell = cell.replace(sep, CSV_NAME_SEPARATORS[0])
    return [n.strip() for n in cell.split(CSV_NAME_SEPARATORS[0]) if n.strip()]


def _is_header(rows: list) -> bool:
    """Whether the first row is a header: its first cell one of `CSV_HEADERS`, or a name
    without an image file's suffix above rows whose first cells have one (``image_file,tags``)."""
    from .image_files import IMAGE_SUFFIXES

    first = rows[0][0].strip()
    if first.lower() in CSV_HEADERS:
        return True
    def image(cell: str) -> bool:
        return Path(cell.strip()).suffix.lower() in IMAGE_SUFFIXES
    rest = [r[0] for r in rows[1:6] if r and r[0].strip()]
    return bool(rest) and not image(first) and all(image(c) for c in rest)


#: the cells of a wide image CSV (a header of class names, one 0 / 1 column per class)
_WIDE_CELLS = {"": 0, "0": 0, "1": 1, "-1": -1, "0.0": 0, "1.0": 1, "-1.0": -1,
               "false": 0, "true": 1}


def _wide_classes(rows: list) -> list | None:
    """The class names of a wide image CSV, or None: a header row (`_is_header`) naming two
    classes or more whose data cells after the path are all 1 / 0 / -1 / true / false or empty
    (``path,cat,dog`` then ``a.jpg,1,0``), the form of a label matrix. One column after the
    path is the names form (``path,label`` over ``1`` / ``0``: classes named 1 and 0)."""
    if len(rows) < 2 or not _is_header(rows):
        return None
    header = list(rows[0])
    while header and not header[-1].strip():  # a trailing comma: no column
        header.pop()
    names = [c.strip() for c in header[1:]]
    if len(names) < 2 or not all(names) or any(n.lower() in _WIDE_CELLS for n in names):
        return None
    data = [r for r in rows[1:] if r and any(c.strip() for c in r)]
    if not data or any(c.strip().lower() not in _WIDE_CELLS for r in data for c in r[1:]):
        return None
    return names


def _read_wide(path, rows: list, names: list, classes, negatives: bool):
    """`read_image_csv` of a wide CSV: 1 a positive, -1 a known negative (``negatives``
    only), 0 or empty a negative of full labels or an unknown of partial ones."""
    if len(set(names)) < len(names):
        raise ValueError(f"{path}, line 1: a class column is named twice "
                         f"({sorted({n for n in names if names.count(n) > 1})})")
    classes = list(classes) if classes is not None else names
    if set(classes) != set(names):
        raise ValueError(f"{path}, line 1: its class columns {names[:10]} are not the classes "
                         f"{list(classes)[:10]}")
    order = [names.index(c) for c in classes]
    entries: dict[str, np.ndarray] = {}
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or not any(c.strip() for c in row):
            continue
        image = row[0].strip()
        if not image:
            raise ValueError(f"{path}, line {lineno}: empty image path")
        if any(c.strip() for c in row[len(names) + 1:]):
            raise ValueError(f"{path}, line {lineno}: {len(row) - 1} label cells for "
                             f"{len(names)} class columns")
        row = row[:len(names) + 1]
        cells = [_WIDE_CELLS[c.strip().lower()] for c in row[1:]] + \
            [0] * (len(names) + 1 - len(row))
        if -1 in cells and not negatives:
            raise ValueError(f"{path}, line {lineno}: -1 (a known negative) in labels that "
                             f"are 1 / 0 (partial val / test labels: eval_labels=partial)")
        values = np.asarray(cells, dtype=np.int8)[order]
        entries[image] = values if image not in entries else np.where(values != 0, values,
                                                                      entries[image])
    if not entries:
        raise ValueError(f"{path}: no image row after its header")
    y = np.stack(list(entries.values()))
    return list(entries), (y if negatives else y.astype(np.uint8)), classes


def _csv_rows(path: Path, delimiter: str) -> list:
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            return list(csv.reader(fh, delimiter=delimiter))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 text file ({err})") from None
    except csv.Error as err:
        raise ValueError(f"{path}: not a readable CSV file ({err})") from None


def read_image_groups(path, group_column: str, delimiter: str | None = None,
                      required: bool = True) -> dict | None:
    """The group of each image of an image CSV whose header names ``group_column``: ``{path as
    written: group}``; `read_image_csv` with ``drop_column=group_column`` reads its labels.
    A CSV without the column: None when not ``required``.

    Raises:
        ValueError: no header naming ``group_column`` (when ``required``), an empty group
            cell, an image listed twice with two groups (file and line named).
    """
    path = Path(path)
    rows = _csv_rows(path, _delimiter(path, delimiter)) if path.is_file() else []
    header = [c.strip() for c in rows[0]] if rows else []
    if group_column not in header:
        if not required:
            return None
        raise ValueError(f"{path}: group_column {group_column!r} needs a header row naming "
                         f"it (e.g. path,labels,{group_column}); the first row is "
                         f"{','.join(header[:6]) or 'empty'}")
    j = header.index(group_column)
    if j == 0:
        raise ValueError(f"{path}: group_column {group_column!r} is the path column")
    groups: dict = {}
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or not any(c.strip() for c in row):
            continue
        group = row[j].strip() if j < len(row) else ""
        if not group:
            raise ValueError(f"{path}, line {lineno}: empty {group_column!r} cell; every image "
                             f"needs its group")
        image = row[0].strip()
        if groups.setdefault(image, group) != group:
            raise ValueError(f"{path}, line {lineno}: image {image} is in group "
                             f"{groups[image]!r} on an earlier line and {group!r} here")
    return groups


def _warn_if_tags(path, y, classes) -> None:
    """Warn when full labels read from an image CSV look like tags: every row names at most
    one class and some name none."""
    per_row = y.sum(axis=1)
    if len(classes) > 2 and per_row.max() <= 1 and (per_row == 0).any():
        import warnings

        warnings.warn(f"{path}: every row names at most one class and {int((per_row == 0).sum())} "
                      f"name none: if these are tags (one known label per image, the others "
                      f"unknown), pass train_labels=observed; read as full labels (the default), "
                      f"every class a row does not name is trained and scored as absent",
                      stacklevel=3)


def _csv_groups(group_column: str | None, delimiter: str | None, **csvs) -> dict:
    """``{part: {image: group}}`` of the CSVs given (``pool=`` must have the column, a test
    or val CSV may), ``{}`` without a group column."""
    if group_column is None:
        return {}
    return {part: read_image_groups(given, group_column, delimiter, required=part == "pool")
            for part, given in csvs.items() if given is not None}


def _delimiter(path: Path, delimiter: str | None) -> str:
    if delimiter is None:
        return "\t" if path.suffix.lower() == ".tsv" else ","
    return delimiter


def _drop(rows: list, column: str | None) -> list:
    """``rows`` without the header's column named ``column`` (when the header names it)."""
    header = [c.strip() for c in rows[0]] if rows and column else []
    if column not in header:
        return rows
    j = header.index(column)
    return [r[:j] + r[j + 1:] for r in rows]


def read_image_csv(path, classes: Sequence[str] | None = None, delimiter: str | None = None,
                   unknown_hint: str = "Fix the name or declare every class with class_names=",
                   negatives: bool = False, drop_column: str | None = None):
    """Image paths and their positive class names from a CSV file.

    Form: one row per image, ``<path>,<name>[,<name>...]``; a cell may also hold several names
    separated by ``;`` or ``|`` (``img.jpg,"cat;dog"``). Or the wide form of a label matrix:
    a header ``path,<class>,<class>...`` and one 1 / 0 (or empty) cell per class, -1 for a
    known negative of partial labels. Names may contain spaces
    (``traffic light``); surrounding spaces are dropped. A row with no name is an image without
    a positive. Rows that repeat a path add their names to the first (so the long form, one
    ``path,name`` row per label, works too). An optional header row is recognised by its first
    cell (`CSV_HEADERS`). Delimiter: tab for ``.tsv`` files, else comma.

    Args:
        path: the CSV file.
        classes: the classes in column order; a name outside them is an error. Default: the
            sorted set of the names found.
        delimiter: the field separator (default from the extension).
        unknown_hint: the advice an unknown class name's error ends with (what the calling
            source offers to fix it).
        negatives: partial labels: a name written ``-name`` is a known negative
            (``img.jpg,"cat;-dog"``: cat positive, dog known absent, every other class unknown).
        drop_column: a column the header names that holds no labels (the group column,
            `read_image_groups`): left out.

    Returns:
        ``(paths as written, y uint8 N x L, classes)``; with ``negatives`` y is int8 with 1
        (named), -1 (``-name``) and 0 (unknown).

    Raises:
        FileNotFoundError: no such file.
        ValueError: no row, an empty path cell, or an unknown class name (the message names the
            file, the line and the known classes).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image list {path} does not exist; expected a CSV file with one "
                                f"row per image: <path>,<class name>[;<class name>...]")
    rows = _drop(_csv_rows(path, _delimiter(path, delimiter)), drop_column)
    wide = _wide_classes(rows) if rows and rows[0] else None
    if wide is not None:  # path,cat,dog then a.jpg,1,0: one 0 / 1 column per class
        return _read_wide(path, rows, wide, classes, negatives)
    entries: dict[str, list] = {}
    first_line: dict[str, int] = {}
    start = 1 if rows and rows[0] and _is_header(rows) else 0
    for lineno, row in enumerate(rows[start:], start=start + 1):
        if not row or not any(c.strip() for c in row):
            continue
        image = row[0].strip()
        if not image:
            raise ValueError(f"{path}, line {lineno}: empty image path (expected "
                             f"<path>,<class name>...)")
        names = [n for cell in row[1:] for n in _split_names(cell)]
        first_line.setdefault(image, lineno)
        entries.setdefault(image, []).extend((lineno, n) for n in names)
    if not entries:
        raise ValueError(f"{path}: no image row (expected <path>,<class name>[;<class name>...] "
                         f"per row, optionally after a header such as 'path,labels')")
    def bare(n: str) -> str:
        return n[1:].strip() if negatives and n.startswith("-") else n

    if classes is None:
        classes = sorted({bare(n) for names in entries.values() for _, n in names})
        check_found_names(classes, str(path))
    classes = list(classes)
    column = {c: j for j, c in enumerate(classes)}
    images = list(entries)
    y = np.zeros((len(images), len(classes)), dtype=np.int8 if negatives else np.uint8)
    for i, image in enumerate(images):
        for lineno, n in entries[image]:
            if bare(n) != n:  # a known negative
                n = bare(n)
                if n in column:
                    y[i, column[n]] = -1
                    continue
            j = column.get(n)
            if j is None:
                shown = ", ".join(classes[:10]) + (f", ... ({len(classes)} in all)"
                                                   if len(classes) > 10 else "")
                raise ValueError(f"{path}, line {lineno}: unknown class name {n!r} (image "
                                 f"{image}); known classes: {shown or 'none'}. {unknown_hint}")
            y[i, j] = 1
    return images, y, classes


@register("csv", "your own images: a CSV with one row per image (path, class names); test CSV "
          "given or carved out (0.3, seed 1200)", paper="Cole et al. 2021 (protocol)",
          tags=TAGS)
def load_csv_images(path: str | os.PathLike, test_path: str | os.PathLike | None = None,
                    image_root: str | os.PathLike | None = None,
                    test_image_root: str | os.PathLike | None = None,
                    class_names=None, test_fraction: float = TEST_FRACTION,
                    seed: int = OFFICIAL_SEED, name: str = "csv", delimiter: str | None = None,
                    skip_missing: bool = False, skip_corrupt: bool = False,
                    train_labels: str = "full",
                    val_path: str | os.PathLike | None = None,
                    eval_labels: str = "full", eval_mask: str | None = None,
                    group_column: str | None = None) -> Dataset:
    """Images listed in a CSV file with their full labels (form: `read_image_csv`).

    With ``train_labels="observed"`` the training CSV's names are each image's **known
    positives** (one tag per image, say) and nothing else is known: they become
    ``Dataset.observed`` (1 where named, 0 = unobserved elsewhere), the run uses regime
    ``given``, and the test CSV (required) and the val CSV (optional; default: carved out of the
    test set) must list every positive of their images.

    Args:
        path: the CSV of the training images (the pool).
        test_path: the CSV of the evaluation images. Without it, the test set is carved out of
            the rows with the Cole split (``cole_split(N, test_fraction, seed)``: 0.3, seed 1200,
            as for yeast), and the rest is the pool.
        image_root, test_image_root: the folders relative paths are resolved against (default:
            each CSV's own folder); absolute paths are used as they are.
        class_names: the classes in column order (list, text file with one per line, or the
            names separated by commas). Default: the
            sorted names of the training CSV; the test CSV may only use those.
        test_fraction, seed: the carve-out.
        name: the dataset's name.
        delimiter: field separator (default: tab for ``.tsv``, else comma).
        skip_missing, skip_corrupt: drop and count unusable images instead of raising.
        train_labels: ``"full"`` (default) or ``"observed"`` (see above).
        val_path: a CSV of fully labelled validation images (paths relative to its own folder
            or absolute); default: the protocol's val set.
        eval_labels: ``"full"`` (default) or ``"partial"``: in the test / val CSVs a name is a
            positive, ``-name`` a known negative, and every class not written is unknown; they
            are scored masked (`spmlkit.metrics.partial`).
        eval_mask: with partial evaluation labels, ``"entry"`` (default) or ``"row"``.
        group_column: a column of the CSV's header naming each image's group (a recording,
            an asset: images that must not sit on both sides of a split). The test set carved
            out and the val set then take whole groups, and the asset regulariser
            (``--hp asset_alpha=...``) averages over them; a test / val CSV may carry the
            column too.

    Returns:
        a [`Dataset`][spmlkit.data.protocol.Dataset]; ``ids`` are the paths as written in the CSV.

    Raises:
        FileNotFoundError: a missing CSV or image (named).
        ValueError: an unknown class name (file and line), an empty CSV, too few rows to carve a
            test set.

    >>> import tempfile
    >>> from pathlib import Path
    >>> from PIL import Image
    >>> d = Path(tempfile.mkdtemp())
    >>> for i in range(10):
    ...     Image.new("RGB", (8, 8)).save(d / f"{i}.png")
    >>> _ = (d / "labels.csv").write_text("path,labels\\n" + "".join(
    ...     f"{i}.png,{'cat;dog' if i % 2 else 'dog'}\\n" for i in range(10)))
    >>> ds = load_csv_images(d / "labels.csv")
    >>> ds.class_names, len(ds.pool), len(ds.test), ds.pool.ids[:2]
    (['cat', 'dog'], 7, 3, ['1.png', '2.png'])
    """
    path = Path(path)
    observed = check_train_labels(train_labels, f"dataset {name!r}") == "observed"
    check_eval_labels(eval_labels, eval_mask, test_path is not None or val_path is not None,
                      f"dataset {name!r}")
    partial = eval_labels == "partial"

    def labels_of(y, where):
        return partial_labels(y, eval_mask or "entry", where) if partial else y
    classes = resolve_class_names(class_names)
    groups = _csv_groups(group_column, delimiter, pool=path, test=test_path, val=val_path)
    meta_groups = {"group_column": group_column} if group_column else {}
    rel, y, classes = read_image_csv(path, classes, delimiter, drop_column=group_column)
    base = Path(image_root) if image_root is not None else path.parent
    paths = join_paths(base.resolve(), rel)
    meta = {"source": "csv", "path": str(path), "image_root": str(base), **meta_groups}
    if not observed:
        _warn_if_tags(path, y, classes)
    if observed:
        meta["observed_from"] = str(path)
        if test_path is None:
            raise ValueError(f"{path}: observed (partial) training labels need a fully labelled "
                             f"test CSV (test_path=...); a test set carved out of partially "
                             f"labelled images would be scored against incomplete labels")
    val = None
    if val_path is not None:
        val_path = Path(val_path)
        rel_v, yv, _ = read_image_csv(val_path, classes, delimiter, negatives=partial,
                                      drop_column=group_column)
        val = (join_paths(val_path.parent.resolve(), rel_v), rel_v, labels_of(yv, str(val_path)))
        meta.update(val_path=str(val_path))
    if test_path is None:
        pool, test = carve(name, paths, rel, y, test_fraction, seed, str(path),
                           [groups["pool"][r] for r in rel] if groups else None)
        meta.update(test_fraction=test_fraction, split_seed=seed)
    else:
        test_path = Path(test_path)
        rel_t, yt, _ = read_image_csv(test_path, classes, delimiter, negatives=partial,
                                      drop_column=group_column)
        base_t = Path(test_image_root) if test_image_root is not None else test_path.parent
        pool, test = (paths, rel, y), (join_paths(base_t.resolve(), rel_t), rel_t,
                                       labels_of(yt, str(test_path)))
        meta.update(test_path=str(test_path), test_image_root=str(base_t))
    ds = image_dataset(name, pool, test, classes, skip_missing=skip_missing,
                       skip_corrupt=skip_corrupt, meta=meta, val=val,
                       observed=positives_to_observed(y) if observed else None)
    # a test set carved out of the training CSV: its images' groups are the training CSV's
    return with_groups(ds, **groups, **({"test": groups["pool"]} if groups and
                                        test_path is None else {}))
