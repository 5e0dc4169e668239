"""Feature rows read on demand from a stored matrix, so data larger than memory trains.

A feature store (``spml extract``'s ``features.npy``) or your own ``.npy`` file is opened as a
memory map. The protocol's train / val / test parts of such a matrix are `Rows`: the
stored matrix, an index array of its rows and, when the features are standardised, the
statistics. Nothing is copied until a batch is read: `Rows.take` gathers the rows in
file order (sorted, so the map reads forward), casts them to float32 and standardises them,
and returns them in the order asked for. The engine reads a chunk of a shuffled permutation at a
time this way (`spmlkit.engine.linear.fit_linear`), so the batch order, and with it every
result, is the in-memory path's.

What stays in memory is one chunk (`CHUNK_ROWS` rows as float32) and what a run produces
(logits and probabilities of N x L), never the N x D matrix.

>>> import numpy as np
>>> base = np.arange(12, dtype=np.float16).reshape(6, 2)
>>> part = Rows(base).subset([4, 1, 2])
>>> part.shape, part.take([2, 0]).tolist()
((3, 2), [[4.0, 5.0], [8.0, 9.0]])
>>> stats = streaming_stats(part)
>>> np.asarray(part.standardized(*stats)).mean(axis=0).round(6).tolist()
[0.0, 0.0]
"""
from __future__ import annotations

import numpy as np

#: rows read at once by the engine and by `Rows.chunks` (64 MiB of 2,048-d float32)
CHUNK_ROWS = 8192
#: entries checked at once for NaN / inf (bounds the temporary mask)
_CHECK_ENTRIES = 1 << 24


def is_stored(x) -> bool:
    """Whether ``x`` is read on demand (a memory map or `Rows`), not held in memory."""
    return isinstance(x, (Rows, np.memmap))


class Rows:
    """Rows ``rows`` of the stored N x D matrix ``base`` (all of them when ``rows`` is None),
    read as float32 and, with ``mean`` / ``std``, standardised as ``(x - mean) / std``.

    It has ``shape``, ``ndim``, ``dtype`` (float32, what reads return), ``len`` and
    ``np.asarray`` (reads every row: for small parts only), and indexes like an array with an
    integer array, a list or a slice (`take`); ``shift`` / ``scale`` are the
    standardisation's mean and std (None when not standardised). For anything else of numpy's,
    ``np.asarray(rows)`` first.
    """

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, base, rows=None, mean=None, std=None):
        if isinstance(base, Rows):
            rows = base.rows if rows is None else (
                np.asarray(rows, np.int64) if base.rows is None else base.rows[rows])
            mean, std, base = base.shift if mean is None else mean, \
                base.scale if std is None else std, base.base
        if getattr(base, "ndim", None) != 2:
            raise ValueError(f"stored features must be an N x D matrix, got shape "
                             f"{getattr(base, 'shape', None)}")
        self.base = base
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        self.shift = None if mean is None else np.asarray(mean, dtype=np.float32)
        self.scale = None if std is None else np.asarray(std, dtype=np.float32)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self), int(self.base.shape[1]))

    @property
    def stored_dtype(self) -> np.dtype:
        """The dtype on disk (float16 for a half-precision store)."""
        return self.base.dtype

    @property
    def filename(self):
        """The memory-mapped file (None for an in-memory base)."""
        return getattr(self.base, "filename", None)

    def __len__(self) -> int:
        return int(self.base.shape[0] if self.rows is None else len(self.rows))

    def __repr__(self) -> str:
        return (f"Rows({len(self)} of {self.base.shape[0]} x {self.base.shape[1]} "
                f"{self.base.dtype}{', standardised' if self.shift is not None else ''})")

    def take(self, idx) -> np.ndarray:
        """Rows ``idx`` (positions in this part) as a float32 ``len(idx) x D`` array, in the
        order given; the stored rows are read in file order, each distinct row once.

        A row asked for several times (the runs of a stack that draw the same batches) is read,
        cast and standardised once and then copied; the cast from a half-precision store is
        torch's (numpy's float16 conversion is ~4x slower), the same values."""
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        block, inverse = _read_distinct(self.base, idx if self.rows is None else self.rows[idx])
        if self.shift is not None:
            block -= self.shift
            block /= self.scale
        return block if inverse is None else np.take(block, inverse, axis=0)

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, tuple):  # rows, then columns of those rows (``x[:, 0]``)
            return self[key[0]][(slice(None), *key[1:])]
        if isinstance(key, (int, np.integer)):
            return self.take([np.arange(len(self))[key]])[0]
        if isinstance(key, slice):
            key = np.arange(len(self))[key]
        return self.take(key)

    def __iter__(self):
        for _, block in self.chunks():
            yield from block

    def __array__(self, dtype=None, copy=None):
        out = self.take(np.arange(len(self)))
        return out if dtype is None else out.astype(dtype, copy=False)

    def subset(self, idx) -> "Rows":
        """Rows ``idx`` of this part, still unread."""
        return Rows(self, idx)

    def standardized(self, mean, std) -> "Rows":
        """The same rows, read as ``(x - mean) / std``."""
        return Rows(self.base, self.rows, mean, std)

    def chunks(self, size: int | None = None):
        """``(start, block)`` over the part in order, ``block`` float32 of up to ``size`` rows
        (default `CHUNK_ROWS`)."""
        size = size or CHUNK_ROWS
        for start in range(0, len(self), size):
            yield start, self.take(np.arange(start, min(start + size, len(self))))


class JoinedRows:
    """Two stored matrices (memory maps or `Rows`) of the same width, one after the
    other, read on demand: the base of a `Rows` over both (the tabular protocol's
    pool-then-test rows, `spmlkit.data.protocol.make_splits`), never concatenated."""

    ndim = 2
    filename = None

    def __init__(self, first, second):
        if first.shape[1] != second.shape[1]:
            raise ValueError(f"stored matrices of {first.shape[1]} and {second.shape[1]} "
                             f"columns cannot be joined")
        self.parts = (first, second)
        self.split = int(first.shape[0])
        self.shape = (self.split + int(second.shape[0]), int(first.shape[1]))
        self.dtype = np.result_type(first.dtype, second.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key) -> np.ndarray:
        key = np.arange(self.shape[0])[key] if isinstance(key, slice) else \
            np.asarray(key, dtype=np.int64)
        out = np.empty((len(key), self.shape[1]), dtype=self.dtype)
        first = key < self.split
        for part, where, offset in ((self.parts[0], first, 0),
                                    (self.parts[1], ~first, self.split)):
            if where.any():
                rows = key[where] - offset
                out[where] = part.take(rows) if isinstance(part, Rows) else part[rows]
        return out


def _read_distinct(base, src: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The distinct rows of ``src`` read from ``base`` (N x ...) in file order, consecutive
    rows as one slice, as a new float32 array, and where each asked row is in it (``None``:
    ``src`` was in file order, each row once)."""
    if len(src) == 0:
        return np.empty((0, *base.shape[1:]), dtype=np.float32), None
    if bool((src[1:] > src[:-1]).all()):  # in file order, each row once (a chunk read in order)
        unique, inverse = src, None
    else:
        unique, inverse = np.unique(src, return_inverse=True)
        inverse = inverse.reshape(-1)
    if unique[-1] - unique[0] + 1 == len(unique):  # consecutive rows: one slice
        block = base[int(unique[0]):int(unique[-1]) + 1]
    else:
        block = base[unique]
    return _as_float32(block), inverse


def read_rows(base, rows) -> np.ndarray:
    """Rows ``rows`` of a stored array (a memory-mapped N x ... store: features, feature maps)
    as a new float32 array in the order given; each distinct row read once, in file order,
    and cast once (`Rows.take` for matrices)."""
    block, inverse = _read_distinct(base, np.asarray(rows, dtype=np.int64).reshape(-1))
    return block if inverse is None else np.take(block, inverse, axis=0)


def _as_float32(block: np.ndarray) -> np.ndarray:
    """``block`` as a new float32 array (never a view of the store). Half precision goes
    through torch's conversion (vectorised; numpy's is ~4x slower here), exact like numpy's."""
    if block.dtype == np.float16:
        import warnings

        import torch

        out = np.empty(block.shape, dtype=np.float32)  # numpy's memory, torch's conversion
        with warnings.catch_warnings():  # a slice of a read-only map, only read here
            warnings.simplefilter("ignore", UserWarning)
            source = torch.from_numpy(np.ascontiguousarray(block))
        torch.from_numpy(out).copy_(source)
        return out
    return np.array(block, dtype=np.float32, order="C")


def as_rows(x) -> Rows:
    """``x`` (a memory map or `Rows`) as `Rows`."""
    return x if isinstance(x, Rows) else Rows(x)


def streaming_stats(x, chunk: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean and standard deviation (population, 0 -> 1) of ``x`` in one pass over
    chunks of rows, accumulated in float64; returned as float32."""
    rows = as_rows(x)
    total = np.zeros(rows.shape[1], dtype=np.float64)
    squares = np.zeros(rows.shape[1], dtype=np.float64)
    for _, block in rows.chunks(chunk):
        b = block.astype(np.float64)
        total += b.sum(axis=0)
        squares += np.square(b).sum(axis=0)
    n = max(len(rows), 1)
    mean = total / n
    std = np.sqrt(np.maximum(squares / n - mean ** 2, 0.0))
    std[std == 0] = 1.0
    return mean.astype(np.float32), std.astype(np.float32)


def nonfinite_rows(x) -> np.ndarray:
    """Indices of the rows of the N x D float matrix ``x`` that hold NaN or inf, checked over
    blocks of rows (a memory map is never read at once)."""
    step = max(1, _CHECK_ENTRIES // max(int(x.shape[1]), 1))
    bad = [start + np.flatnonzero(~np.isfinite(np.asarray(x[start:start + step])).all(axis=1))
           for start in range(0, x.shape[0], step)]
    return np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)


def holds_vectors(x) -> bool:
    """Whether ``x`` is a matrix of feature vectors (in memory or stored), not a list of items
    such as image paths."""
    return isinstance(x, Rows) or (isinstance(x, np.ndarray) and x.dtype.kind in "fiu")
