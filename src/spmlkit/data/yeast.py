"""The MULAN yeast set (Elisseeff & Weston 2001), as shipped inside the ``river`` package.

2,417 genes x 103 features, 14 functional classes. It has no official test split, so the
official procedure is applied to it (README, "Data"): the Cole split with fraction 0.3 and seed
1200 over all rows gives a 1,692-row pool and a 725-row test set; the single positives are drawn
on the pool; the pool then splits 0.2 / seed 1200 into train / val (1,354 / 338); features are
standardised with the train rows' mean and std.
"""
from __future__ import annotations

import csv
import functools
import gzip
import importlib.util
import os
import warnings
from pathlib import Path

import numpy as np

from ..extras import install_hint
from ..labels import OFFICIAL_SEED
from .protocol import Dataset, LabelledSet, cole_split
from .registry import register

TEST_FRACTION = 0.3


def yeast_path() -> Path:
    """Where river keeps ``yeast.csv.gz`` (found without importing river, which is slow)."""
    spec = importlib.util.find_spec("river")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the yeast dataset ships inside the 'river' package, which is not installed: "
            + install_hint("demo", "'river>=0.26.0'"))
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "yeast.csv.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: river>=0.26.0 ships it; reinstall river")
    return path


def read_yeast_csv(path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Features (``Att*`` columns), labels (``Class*`` columns) and the class names.

    The numbers are parsed by ``numpy.loadtxt`` (compiled: ~7x faster than Python's csv reader
    on this file, which every worker of a benchmark reads; the same float64 values)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", newline="") as fh:
            first = fh.readline()
            if not first.strip():
                raise ValueError(f"{path}: empty file")
            header = next(csv.reader([first]))
            att = [j for j, c in enumerate(header) if c.startswith("Att")]
            cls = [j for j, c in enumerate(header) if c.startswith("Class")]
            if not att or not cls:
                raise ValueError(f"{path}: expected columns Att* and Class*, got "
                                 f"{header[:4]}...")
            with warnings.catch_warnings():  # (no rows: said below, not as numpy's warning)
                warnings.simplefilter("ignore", UserWarning)
                table = np.loadtxt(fh, delimiter=",", quotechar='"', dtype=np.float64,
                                   ndmin=2)
    except (ValueError, csv.Error) as err:  # a bad cell, a ragged row, not text
        if str(err).startswith(str(path)):
            raise
        why = str(err).split("; use `usecols`")[0]  # (numpy's hint is not for this file)
        why = why if len(why) <= 200 else why[:200] + "..."
        raise ValueError(f"{path}: not a readable CSV file of numbers ({why}; rows counted "
                         f"from 0 after the header)") from None
    if table.shape[0] == 0:
        raise ValueError(f"{path}: no rows after the header")
    if table.shape[1] != len(header):
        raise ValueError(f"{path}: the rows have {table.shape[1]} columns, the header "
                         f"{len(header)}")
    return table[:, att].astype(np.float32), table[:, cls].astype(np.uint8), \
        [header[j] for j in cls]


def _read_once(path: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """`read_yeast_csv` of ``path``, parsed once per process while the file is unchanged (a
    benchmark's worker loads the set for each regime it trains), as copies."""
    stat = path.stat()
    x, y, names = _parsed(str(path), stat.st_mtime_ns, stat.st_size)
    return x.copy(), y.copy(), list(names)


@functools.lru_cache(maxsize=2)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple:
    return read_yeast_csv(path)


@register("yeast", "MULAN yeast (river): 2,417 x 103 features, 14 classes; the embedded "
          "default", paper="Elisseeff & Weston 2001", tags=("features", "embedded"))
def load_yeast(path: str | os.PathLike | None = None, seed: int = OFFICIAL_SEED) -> Dataset:
    """The yeast set: pool and test by the Cole split (fraction 0.3), features standardised
    with the train rows' statistics by the protocol.

    Args:
        path: a ``yeast.csv`` / ``yeast.csv.gz`` with ``Att*`` and ``Class*`` columns
            (default: the copy inside the installed ``river`` package).
        seed: seed of the pool / test split (default 1200, the official one).

    Returns:
        a [`Dataset`][spmlkit.data.protocol.Dataset] (1,692 pool rows, 725 test rows with the
        default seed).

    Raises:
        ModuleNotFoundError: no ``path`` and river is not installed (the message says how).
        FileNotFoundError, ValueError: a missing or malformed file (named).
    """
    x, y, names = _read_once(Path(path or yeast_path()))
    pool_idx, test_idx = cole_split(len(y), TEST_FRACTION, seed)
    full = LabelledSet(x, y, names, where="yeast")
    return Dataset("yeast", full.subset(pool_idx), full.subset(test_idx), standardize=True,
                   meta={"source": str(path or yeast_path()), "test_fraction": TEST_FRACTION})
