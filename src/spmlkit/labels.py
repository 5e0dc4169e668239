"""Label encoding, validation and the label regimes of single-positive learning.

Full labels ``y`` are a 0/1 matrix (N x L). Observed labels ``z`` use one encoding everywhere
(docs/spec.md#notation, the official code's ``labels_obs``)::

    POSITIVE = 1     observed positive
    UNOBSERVED = 0   nothing is known
    NEGATIVE = -1    observed negative

A *regime* turns full labels into observed labels with one pure, seeded function
([`make_observed`][spmlkit.labels.make_observed]), e.g. ``"1p"`` (single positive only, the SPML
setting) or ``"full"``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

POSITIVE = 1
UNOBSERVED = 0
NEGATIVE = -1

#: The seed of the official pipeline (splits and single-positive draws).
OFFICIAL_SEED = 1200

REGIMES = {
    "full": "All P. & All N.: every label observed (1 / -1)",
    "1p_alln": "1 P. & All N.: one observed positive, every negative observed (IUN)",
    "1p_1n": "1 P. & 1 N.: one observed positive and one observed negative (IU)",
    "1p": "1 P. & 0 N.: one observed positive, nothing else (SPML)",
    "mlml:<rate>": "missing labels: each full annotation dropped with probability <rate>",
    "1p_biased:<bias>": "one observed positive chosen with a bias: size (largest object), loc "
                        "(closest to the image centre) or semantic (most frequent class first)",
    "given": "your own observed training labels (1 / 0 / -1), used as they are (nothing "
             "drawn); val / test fully labelled",
}

#: The biases of ``1p_biased:<bias>`` (label-bias study, Arroyo, Perona & Cole 2023).
BIASES = ("size", "loc", "semantic")


def _where(where: str | None) -> str:
    return f" in {where}" if where else ""


#: label entries checked at once by the validators (bounds their temporary masks)
_CHECK_ENTRIES = 1 << 22


def _any_outside(arr: np.ndarray, allowed: tuple) -> bool:
    """Whether the 2-D ``arr`` holds a value outside ``allowed`` (NaN included), checked over
    blocks of rows so that a large matrix makes no N x L temporary."""
    step = max(1, _CHECK_ENTRIES // max(int(arr.shape[1]), 1))
    for start in range(0, arr.shape[0], step):
        block = arr[start:start + step]
        ok = block == allowed[0]
        for value in allowed[1:]:
            ok |= block == value
        if not ok.all():
            return True
    return False


def _check_numeric(arr: np.ndarray, what: str, where: str | None) -> None:
    """Raise naming the first value that is not a number (strings, None, objects)."""
    if np.issubdtype(arr.dtype, np.number) or arr.dtype == bool:
        return
    for pos, value in np.ndenumerate(arr):
        try:
            float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{what}{_where(where)} must be numeric; found {value!r} "
                             f"(first at row {pos[0]})") from None
    raise ValueError(f"{what}{_where(where)} must be numeric, got dtype {arr.dtype} (convert "
                     f"the values to numbers first)")


def label_values(y, where: str | None = None):
    """The values of a label matrix or vector as an ndarray, whatever holds them: a pandas
    DataFrame (its nullable ``Int64`` / ``boolean`` / ``Float64`` columns with ``pd.NA``
    read as NaN, an empty cell), a pandas Series, a numpy masked array (its masked entries
    as NaN), a scipy sparse matrix (densified), a list. An ndarray (a `PartialLabels` too) is
    returned as it is.

    Raises:
        ValueError: a DataFrame column that does not hold numbers (text, categories), named
            with its dtype.

    >>> import numpy.ma as ma
    >>> label_values(ma.masked_array([[1, -1]], mask=[[False, True]])).tolist()
    [[1.0, nan]]
    """
    if isinstance(y, np.ma.MaskedArray):
        return np.ma.filled(y.astype(np.float64), np.nan)
    if isinstance(y, np.ndarray):
        return y
    if hasattr(y, "toarray") and callable(y.toarray):  # scipy sparse
        return y.toarray()
    dtypes = getattr(y, "dtypes", None)
    if hasattr(dtypes, "items") and hasattr(y, "to_numpy"):  # a DataFrame (not a Series)
        nullable = sparse = False
        for name, dtype in dtypes.items():
            if hasattr(dtype, "subtype") and hasattr(y, "sparse"):  # pandas' SparseDtype
                sparse, dtype = True, np.dtype(dtype.subtype)
            numpy_dtype = getattr(dtype, "numpy_dtype", None)   # pandas' nullable dtypes
            nullable |= numpy_dtype is not None
            base = dtype if numpy_dtype is None else numpy_dtype
            kind = base.kind if isinstance(base, np.dtype) else "O"
            if kind not in "biuf":
                raise ValueError(f"{where or 'labels'}: column {name!r} holds {dtype}, not "
                                 f"numbers; labels are 1 / 0 / -1 or an empty cell (convert "
                                 f"it first, e.g. .astype(int))")
        if sparse:  # densified, as a scipy sparse matrix is
            y = y.apply(lambda col: col.sparse.to_dense() if hasattr(col, "sparse") else col)
            dtypes = y.dtypes
        kinds = {d.kind for d in dtypes if isinstance(d, np.dtype)}
        if nullable or len(kinds) > 1:  # pd.NA -> NaN; a bool column beside numbers
            return y.to_numpy(dtype=np.float64, na_value=np.nan)
        return y.to_numpy()
    return np.asarray(y)


def validate_full_labels(y, where: str | None = None, *, copy: bool = True) -> np.ndarray:
    """Check a full label matrix and return it as ``uint8`` (N x L, values in {0, 1}); with
    ``copy=False`` a ``uint8`` array is returned as it is (not copied).

    Raises:
        ValueError: not 2-D, or holds values other than 0 and 1 (the message names them and the
            first row where one occurs).

    >>> validate_full_labels([[0, 1], [1, 1]]).dtype
    dtype('uint8')
    """
    arr = np.asarray(y)
    if arr.ndim != 2:
        raise ValueError(f"full labels{_where(where)} must be a 2-D matrix (examples x classes), "
                         f"got shape {arr.shape}")
    if arr.dtype == bool:
        return arr.astype(np.uint8)
    _check_numeric(arr, "full labels", where)
    if _any_outside(arr, (0, 1)):
        bad = (arr != 0) & (arr != 1)  # NaN included
        row = int(np.argwhere(bad)[0][0])
        values = sorted({float(v) for v in np.unique(arr[bad])})[:5]
        raise ValueError(f"full labels{_where(where)} must hold only 0 and 1; found {values} "
                         f"(first at row {row})")
    return arr.astype(np.uint8, copy=copy)


def validate_observed(z, where: str | None = None, require_positive: bool = False, *,
                      copy: bool = True) -> np.ndarray:
    """Check an observed label matrix and return it as ``int8`` (values in {1, 0, -1}); with
    ``copy=False`` an ``int8`` array is returned as it is (not copied).

    Args:
        z: N x L matrix in the observed encoding.
        where: a short description of the source, used in error messages.
        require_positive: if True, every row must hold at least one observed positive
            (what single-positive training assumes).

    Raises:
        ValueError: wrong shape, values outside {1, 0, -1}, NaN, or (with ``require_positive``)
            rows without an observed positive; the message names the values and rows.

    >>> validate_observed([[1, 0, -1]]).tolist()
    [[1, 0, -1]]
    """
    arr = np.asarray(z)
    if arr.ndim != 2:
        raise ValueError(f"observed labels{_where(where)} must be a 2-D matrix (examples x "
                         f"classes), got shape {arr.shape}")
    _check_numeric(arr, "observed labels", where)
    if _any_outside(arr, (POSITIVE, UNOBSERVED, NEGATIVE)):
        bad = (arr != POSITIVE) & (arr != UNOBSERVED) & (arr != NEGATIVE)  # NaN included
        row = int(np.argwhere(bad)[0][0])
        values = sorted({float(v) for v in np.unique(arr[bad])}, key=str)[:5]
        raise ValueError(f"observed labels{_where(where)} must hold only {POSITIVE} (positive), "
                         f"{UNOBSERVED} (unobserved) and {NEGATIVE} (negative); found {values} "
                         f"(first at row {row})")
    out = arr.astype(np.int8, copy=copy)
    if require_positive:
        empty = np.flatnonzero((out == POSITIVE).sum(axis=1) == 0)
        if empty.size:
            raise ValueError(f"observed labels{_where(where)}: {empty.size} row(s) have no "
                             f"observed positive (first rows: {empty[:5].tolist()}); drop them or "
                             f"use a regime that observes negatives")
    return out


def observed_from_cells(values, where: str | None = None) -> np.ndarray:
    """Observed labels (int8, 1 / 0 / -1) from a matrix whose empty cells are NaN: an empty
    cell is unobserved, as a 0 is (`validate_observed` checks the rest).

    Raises:
        ValueError: empty cells beside 0s and no -1 at all. Both would mean unobserved, and
            such a table nearly always writes its known negatives as 0 (presence / absence
            with gaps): they would silently train as unknowns.

    >>> observed_from_cells([[1.0, float("nan"), -1.0]]).tolist()
    [[1, 0, -1]]
    """
    arr = np.asarray(values)
    if arr.dtype.kind == "f":
        empty = np.isnan(arr)
        if empty.any():
            if (arr == UNOBSERVED).any() and not (arr == NEGATIVE).any():
                raise ValueError(f"observed labels{_where(where)} hold 0s and empty (NaN) cells "
                                 f"but no -1: both mean unobserved in spmlkit's encoding, so "
                                 f"the 0s would count as unknown, not as negatives; write known "
                                 f"negatives "
                                 f"as -1 (if the 0s are unknown too, write every unknown one "
                                 f"way: all 0 or all empty)")
            arr = np.where(empty, 0.0, arr)
    return validate_observed(arr, where)


def positives_to_observed(y) -> np.ndarray:
    """Known positives (a 0/1 matrix) in the observed encoding: 1 -> 1, 0 -> 0 (unobserved).

    What a list of "this item is tagged with ..." says: the tags are observed positives and
    nothing is known about the other classes.

    >>> positives_to_observed([[0, 1], [1, 0]]).tolist()
    [[0, 1], [1, 0]]
    """
    y = validate_full_labels(y)
    return np.where(y == 1, POSITIVE, UNOBSERVED).astype(np.int8)


def observed_counts(z) -> dict:
    """What an observed matrix holds: ``positives``, ``negatives``, ``unobserved`` entries,
    ``rows``, ``rows_without_positive`` and ``rows_without_label`` (nothing observed).

    >>> observed_counts([[1, 0, -1], [0, 0, -1], [0, 0, 0]])["rows_without_positive"]
    2
    """
    z = validate_observed(z, copy=False)
    out = dict.fromkeys(("positives", "negatives", "unobserved", "rows_without_positive",
                         "rows_without_label"), 0)
    step = max(1, _CHECK_ENTRIES // max(int(z.shape[1]), 1))  # blocks of rows: no N x L masks
    for start in range(0, z.shape[0], step):
        block = z[start:start + step]
        pos, neg = (block == POSITIVE), (block == NEGATIVE)
        out["positives"] += int(pos.sum())
        out["negatives"] += int(neg.sum())
        out["unobserved"] += int((block == UNOBSERVED).sum())
        out["rows_without_positive"] += int((~pos.any(axis=1)).sum())
        out["rows_without_label"] += int((~(pos | neg).any(axis=1)).sum())
    return {"rows": int(z.shape[0]), **out}


def full_to_observed(y) -> np.ndarray:
    """Full 0/1 labels in the observed encoding (regime ``full``): 1 -> 1, 0 -> -1."""
    y = validate_full_labels(y)
    return np.where(y == 1, POSITIVE, NEGATIVE).astype(np.int8)


def sample_single_positive(y, num_pos: int = 1, num_neg: int = 0,
                           seed: int = OFFICIAL_SEED) -> np.ndarray:
    """Observe ``num_pos`` positives and ``num_neg`` negatives per row, as the official code does.

    Cole et al. 2021 (their ``observe_uniform``): a fresh ``numpy.random.RandomState(seed)``; for
    each row in order, the indices of its positives are shuffled with that generator and the
    first ``num_pos`` kept; then the same for its negatives (a shuffle is consumed even when
    ``num_neg = 0``). Rows with no positive get no observed positive. ``None`` or ``-1`` for a
    count observes every such label (the official ``-1``).

    Returns:
        int8 matrix in the observed encoding, same shape as ``y``.

    >>> sample_single_positive([[1, 1, 0], [0, 1, 1]], seed=0).tolist()
    [[0, 1, 0], [0, 1, 0]]
    """
    y = validate_full_labels(y)
    for name, count in (("num_pos", num_pos), ("num_neg", num_neg)):
        if count is not None and (not isinstance(count, (int, np.integer)) or count < -1):
            raise ValueError(f"{name} must be a count >= 0, or -1 / None for all; got {count!r}")
    rng = np.random.RandomState(seed)
    z = np.zeros(y.shape, dtype=np.int8)
    for i in range(y.shape[0]):
        pos = np.flatnonzero(y[i] == 1)
        rng.shuffle(pos)
        z[i, _first(pos, num_pos)] = POSITIVE
        neg = np.flatnonzero(y[i] == 0)
        rng.shuffle(neg)
        z[i, _first(neg, num_neg)] = NEGATIVE
    return z


def _first(idx: np.ndarray, count: int | None) -> np.ndarray:
    return idx if count is None or count == -1 else idx[:count]


def drop_annotations(y, rate: float, seed: int = OFFICIAL_SEED) -> np.ndarray:
    """Missing-label regime (``mlml:<rate>``): each full annotation hidden with prob. ``rate``."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"mlml drop rate must be in [0, 1), got {rate}")
    z = full_to_observed(y)
    hide = np.random.RandomState(seed).random_sample(z.shape) < rate
    z[hide] = UNOBSERVED
    return z


def sample_biased_positive(y, bias: str, seed: int = OFFICIAL_SEED, instances=None,
                           class_order=None) -> np.ndarray:
    """Observe one positive per row, chosen with a bias instead of uniformly (``1p_biased:<bias>``).

    The label-bias study of Cole et al.'s follow-up (Arroyo, Perona & Cole, "Understanding Label
    Bias in Single Positive Multi-Label Learning", 2023; docs/spec.md#regimes) replaces the
    uniform draw by an annotator's preference. Each row's positives are ranked by a score and the
    best one is observed; ties (and positives without a score) are broken at random: the
    positives are shuffled with one ``numpy.random.RandomState(seed)`` per call, row by row as in
    `sample_single_positive`, then stably sorted by score.

    - ``size``: the label whose largest instance covers the most of the image
      (``instances["size"]``, N x L, area as a fraction of the image, NaN = no instance known).
    - ``loc``: the label with an instance closest to the image centre (``instances["loc"]``,
      N x L, distance from the centre over the half diagonal; NaN = unknown).
    - ``semantic``: a fixed class preference, the same for every image: ``class_order`` (column
      indices, most preferred first; columns it leaves out come after, in frequency order), by
      default the classes from the most to the least frequent in ``y`` (ties: lower column
      first). The follow-up's own ordering is not reproduced; this is the "popular classes get
      named first" bias.

    A row with no positive gets no observed positive; positives with a NaN score rank last.

    Args:
        y: N x L full labels (0/1).
        bias: ``"size"``, ``"loc"`` or ``"semantic"``.
        seed: seeds the tie-breaking shuffle.
        instances: per-row instance metadata, a mapping with ``"size"`` / ``"loc"`` N x L float
            arrays (a source's ``Dataset.meta["instances"]``); needed for ``size`` and ``loc``.
        class_order: for ``semantic``, column indices in order of preference.

    Returns:
        int8 N x L matrix in the observed encoding (exactly one POSITIVE per row with positives).

    Raises:
        ValueError: unknown bias; ``size`` / ``loc`` without instance metadata of shape N x L;
            a ``class_order`` that is not a list of distinct column indices.

    >>> y = [[1, 1, 0], [0, 1, 1], [1, 0, 1]]
    >>> sample_biased_positive(y, "semantic").tolist()      # column 0, 1, 2 hold 2, 2, 2
    [[1, 0, 0], [0, 1, 0], [1, 0, 0]]
    >>> size = [[0.1, 0.5, np.nan], [np.nan, 0.2, 0.3], [0.9, np.nan, 0.1]]
    >>> sample_biased_positive(y, "size", instances={"size": size}).tolist()
    [[0, 1, 0], [0, 0, 1], [1, 0, 0]]
    """
    y = validate_full_labels(y, f"1p_biased:{bias}")
    n, num_labels = y.shape
    if bias not in BIASES:
        raise ValueError(f"unknown label bias {bias!r}; choose one of {', '.join(BIASES)}")
    if bias == "semantic":
        freq = y.sum(axis=0).astype(np.int64)
        rank_of = np.empty(num_labels, dtype=np.float64)
        order = sorted(range(num_labels), key=lambda j: (-freq[j], j))
        if class_order is not None:
            given = [int(j) for j in class_order]
            if len(set(given)) != len(given) or any(not 0 <= j < num_labels for j in given):
                raise ValueError(f"class_order must list distinct column indices in "
                                 f"0..{num_labels - 1}; got {list(class_order)}")
            order = given + [j for j in order if j not in set(given)]
        rank_of[order] = np.arange(num_labels)
        score = np.broadcast_to(-rank_of, (n, num_labels))        # higher = preferred
    else:
        table = instances.get(bias) if instances is not None else None
        if table is None:
            raise ValueError(f"regime '1p_biased:{bias}' needs per-label instance metadata "
                             f"(instances['{bias}'], an N x L array); this label matrix came "
                             f"without it")
        table = np.asarray(table, dtype=np.float64)
        if table.shape != y.shape:
            raise ValueError(f"instances['{bias}'] has shape {table.shape}, the labels "
                             f"{y.shape}; they must match row for row")
        score = table if bias == "size" else -table
    rng = np.random.RandomState(seed)
    z = np.zeros(y.shape, dtype=np.int8)
    for i in range(n):
        pos = np.flatnonzero(y[i] == 1)
        if not pos.size:
            continue
        rng.shuffle(pos)
        s = score[i, pos]
        s = np.where(np.isnan(s), -np.inf, s)
        z[i, pos[np.argsort(-s, kind="stable")[0]]] = POSITIVE
    return z


def parse_regime(regime: str) -> tuple[str, float | str | None]:
    """Split ``"mlml:0.5"`` into ``("mlml", 0.5)``; check the name. ``"1p"`` -> ``("1p", None)``,
    ``"1p_biased:size"`` -> ``("1p_biased", "size")``."""
    name, _, arg = str(regime).partition(":")
    if name == "1p_biased":
        if arg not in BIASES:
            raise ValueError(f"regime '1p_biased' needs a bias, one of "
                             f"{', '.join('1p_biased:' + b for b in BIASES)}; got {regime!r}")
        return name, arg
    if name == "mlml":
        try:
            return name, float(arg)
        except ValueError:
            raise ValueError(f"regime 'mlml' needs a drop rate, e.g. 'mlml:0.5'; "
                             f"got {regime!r}") from None
    if name not in REGIMES or arg:
        raise ValueError(f"unknown regime {regime!r}; choose one of {', '.join(REGIMES)}")
    return name, None


def make_observed(y, regime: str = "1p", seed: int = OFFICIAL_SEED, *, instances=None,
                  class_order=None) -> np.ndarray:
    """Observed labels of one regime, a pure function of ``(y, regime, seed)``.

    ``instances`` / ``class_order`` are used by ``1p_biased:<bias>`` only
    (`sample_biased_positive`). Regime ``given`` draws nothing (it is the observed
    labels a dataset was given: `spmlkit.data.make_splits`), so it is refused here.

    Raises:
        ValueError: an unknown regime, or ``given``.

    >>> make_observed([[1, 0], [1, 1]], "full").tolist()
    [[1, -1], [1, 1]]
    """
    name, arg = parse_regime(regime)
    if name == "given":
        raise ValueError("regime 'given' draws no labels: it uses the observed training labels "
                         "given with the data (a source's train_labels=observed; "
                         "spmlkit.data.make_splits), not full labels")
    if name == "1p_biased":
        return sample_biased_positive(y, arg, seed, instances, class_order)
    if name == "full":
        return full_to_observed(y)
    if name == "1p":
        return sample_single_positive(y, 1, 0, seed)
    if name == "1p_1n":
        return sample_single_positive(y, 1, 1, seed)
    if name == "1p_alln":
        return sample_single_positive(y, 1, None, seed)
    return drop_annotations(y, arg, seed)


@dataclass(frozen=True)
class KEstimate:
    """Expected positives per example, estimated from M fully labelled examples."""

    k: float
    low: float
    high: float
    m: int
    confidence: float


def estimate_k(y_labelled, confidence: float = 0.95) -> KEstimate:
    """Estimate k, the mean number of positives per example, from M fully labelled rows.

    Cole et al. 2021, App. B: k is the mean of the per-row positive counts of a small fully
    labelled subset; the interval is the normal (CLT) interval mean +- z * sd / sqrt(M), with the
    sample standard deviation (M - 1), clipped at 0.

    >>> est = estimate_k([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    >>> round(est.k, 3), est.m
    (2.0, 3)
    """
    y = validate_full_labels(y_labelled, "estimate_k")
    counts = y.sum(axis=1).astype(np.float64)
    m = counts.size
    if m == 0:
        raise ValueError("estimate_k needs at least one fully labelled example")
    from statistics import NormalDist

    k = float(counts.mean())
    half = 0.0
    if m > 1:
        zval = NormalDist().inv_cdf(0.5 + confidence / 2)
        half = zval * float(counts.std(ddof=1)) / math.sqrt(m)
    return KEstimate(k=k, low=max(0.0, k - half), high=k + half, m=m, confidence=confidence)


@dataclass(frozen=True)
class KInterval:
    """Cole et al. 2021 App. B's interval ``I_M`` of the estimate ``k_M`` (Table A2)."""

    low: float          # the ``percentiles[0]`` percentile of the T estimates
    high: float         # the ``percentiles[1]`` percentile
    k: float            # the mean positives of all the rows (the paper's true k*)
    m: int
    trials: int
    percentiles: tuple


def sample_subsets(n: int, m: int, trials: int, rng: np.random.Generator) -> np.ndarray:
    """``trials`` x ``m`` row indices: each row a uniform draw of ``m`` of ``range(n)`` without
    replacement (R. Floyd's algorithm, vectorised over the trials: ``m`` steps of ``trials``
    draws, never a ``trials`` x ``n`` array).

    >>> idx = sample_subsets(10, 4, 1000, np.random.default_rng(0))
    >>> idx.shape, all(len(set(r)) == 4 for r in idx.tolist()), int(idx.max()) < 10
    ((1000, 4), True, True)
    """
    if not 0 < m <= n:
        raise ValueError(f"cannot draw {m} rows without replacement from {n}")
    out = np.empty((trials, m), dtype=np.int64)
    for step, j in enumerate(range(n - m, n)):
        t = rng.integers(0, j + 1, size=trials)
        taken = (out[:, :step] == t[:, None]).any(axis=1)
        out[:, step] = np.where(taken, j, t)
    return out


def k_interval(y_full, m: int, trials: int = 100_000, percentiles=(5.0, 95.0),
               seed: int = 0) -> KInterval:
    """Cole et al. 2021, App. B: the interval ``I_M`` of "reasonable" values of k.

    As the paper computes Table A2: ``trials`` (T = 10^5) draws of ``m`` rows of the fully
    labelled set ``y_full`` (uniform, without replacement), the estimate of each draw (Eq. A1:
    the mean positives per row), and the 5th and 95th percentiles of the T estimates (the
    paper's "approximate 95% confidence interval"). The interval describes the data set (it
    needs all its full labels), not one labelled sample; `estimate_k` is the estimate
    from the M rows one has. ``seed`` seeds the draws (default 0: the same interval for every
    run).

    >>> y = np.array([[1, 0, 0]] * 50 + [[1, 1, 1]] * 50)
    >>> iv = k_interval(y, 10, trials=20_000)
    >>> iv.k, iv.low < 2.0 < iv.high, round(iv.low, 1), round(iv.high, 1)
    (2.0, True, 1.6, 2.4)
    """
    y = validate_full_labels(y_full, "k_interval")
    counts = y.sum(axis=1).astype(np.float64)
    lo, hi = (float(p) for p in percentiles)
    if not 0 <= lo < hi <= 100:
        raise ValueError(f"percentiles must be two increasing values in [0, 100], got "
                         f"{percentiles}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    idx = sample_subsets(counts.size, int(m), int(trials), np.random.default_rng(seed))
    estimates = counts[idx].mean(axis=1)
    low, high = np.percentile(estimates, [lo, hi])
    return KInterval(float(low), float(high), float(counts.mean()), int(m), int(trials),
                     (lo, hi))
