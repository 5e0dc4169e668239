"""The papers' analyses on finished run folders: the numbers, as pure functions.

Each analysis reads files a run folder already holds (`spmlkit.runs`) and returns a small
result object with the numbers and a ``table()``. Their figures are drawn by
`spmlkit.experiments.figures` (``plot_pl_precision``, ``plot_ap_difference``,
``plot_wasserstein``, ``plot_histograms``); ``spml analyze ...`` prints the table and writes the
figure.

- `pseudo_label_precision`: per-epoch number of pseudo-labels and the share that is right
  (Zhou et al. Table 2, right), from ``metrics.jsonl``.
- `classwise_ap_difference`: per-class AP of run b minus run a (Zhou et al. Fig. 4c), from
  ``predictions.npz``.
- `wasserstein_per_class`: per class, the Wasserstein-1 distance between the predicted
  probabilities of unobserved positives and unobserved negatives on the train split (Zhou et al.
  Fig. 4a); `run_wasserstein` applies it to a run's ``predictions.npz``.
- `unobserved_positive_histograms`: histograms of the predicted probabilities of the
  unobserved positives on the train split at chosen epochs (Cole et al. Fig. 2), from
  ``train_probs.npy`` (``spml train --save-train-probs``).

"Unobserved" always refers to the run's *initial* observed labels (``observed`` in
``predictions.npz``, equal to ``observed.npy``): entries a method flips or pseudo-labels during
training still count as unobserved here, as in the papers.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .labels import UNOBSERVED, validate_full_labels, validate_observed
from .metrics import per_class_ap
from .runs import SPLITS, TRAIN_PROBS_FILE, load_array, read_config, read_metrics, \
    read_predictions, run_file


# --- run folders are read through spmlkit.runs (run_file, read_config, read_metrics,
# read_predictions: a missing file is named with the command that writes it) ---------------------
def run_label(run_dir) -> str:
    """How a run is named in tables and legends: its folder name."""
    return Path(run_dir).name


def class_names_of(run_dir, num_classes: int) -> list[str]:
    names = read_config(run_dir).get("class_names") or []
    if len(names) != num_classes:
        return [f"class{j}" for j in range(num_classes)]
    return [str(n) for n in names]


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


# --- tables ------------------------------------------------------------------------------------
def format_table(headers, rows, floatfmt: str = ".2f") -> str:
    """A plain-text table with aligned columns (floats with ``floatfmt``, NaN as ``nan``).

    >>> print(format_table(["a", "b"], [["x", 1.0], ["yy", float("nan")]]))
    a      b
    --  ----
    x   1.00
    yy   nan
    """
    def cell(v):
        if isinstance(v, (float, np.floating)):
            return "nan" if np.isnan(v) else format(float(v), floatfmt)
        return str(v)

    text = [[str(h) for h in headers]] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(headers))]
    numeric = [bool(rows) and all(isinstance(row[i], (int, float, np.integer, np.floating))
                                  or row[i] == "" for row in rows) for i in range(len(headers))]

    def line(r):
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(r, widths, numeric)).rstrip()

    return "\n".join([line(text[0]), line(["-" * w for w in widths])]
                     + [line(r) for r in text[1:]])


# --- pseudo-label precision --------------------------------------------------------------------
@dataclass
class PseudoLabelPrecision:
    """Per-epoch pseudo-label count and precision of one run."""

    run: str
    loss: str
    epoch: np.ndarray       # 1-based
    count: np.ndarray       # pseudo-labelled entries after the epoch
    precision: np.ndarray   # share whose asserted label is the true one (NaN when count is 0)

    def table(self) -> str:
        return format_table(["epoch", "pl_count", "pl_precision"],
                            [[int(e), int(c), float(p)] for e, c, p in
                             zip(self.epoch, self.count, self.precision)], ".4f")


def pseudo_label_precision(run_dir) -> PseudoLabelPrecision:
    """Per-epoch ``pl_count`` / ``pl_precision`` of a run (Zhou et al. Table 2, right).

    The engine logs them in ``metrics.jsonl`` for losses that pseudo-label
    (``hard_pseudo_labels()``: ``em_apl``, ``ll_cp``, ``soft_opml`` / ``opml_sp``); precision is
    the fraction of pseudo-labelled train entries whose asserted label equals the full label.

    Raises:
        FileNotFoundError: no ``metrics.jsonl``.
        ValueError: the run's loss does not pseudo-label (no ``pl_count`` in its records).
    """
    records = read_metrics(run_dir)
    config = read_config(run_dir)
    rows = [r for r in records if "pl_count" in r]
    if not rows:
        raise ValueError(f"{Path(run_dir) / 'metrics.jsonl'} has no pl_count / pl_precision: "
                         f"the run's loss {config.get('loss')!r} does not pseudo-label (the "
                         f"diagnostics are logged for em_apl, ll_cp, soft_opml and opml_sp)")
    return PseudoLabelPrecision(
        run=run_label(run_dir), loss=str(config.get("loss")),
        epoch=np.array([r["epoch"] for r in rows], dtype=np.int64),
        count=np.array([r["pl_count"] for r in rows], dtype=np.int64),
        precision=np.array([np.nan if r["pl_precision"] is None else r["pl_precision"]
                            for r in rows], dtype=np.float64))


# --- class-wise AP difference ------------------------------------------------------------------
@dataclass
class APDifference:
    """Per-class AP (x100) of two runs on one split; ``diff = ap_b - ap_a`` (NaN for a class
    without positives)."""

    run_a: str
    run_b: str
    split: str
    class_names: list
    ap_a: np.ndarray
    ap_b: np.ndarray

    @property
    def diff(self) -> np.ndarray:
        return self.ap_b - self.ap_a

    def order(self) -> np.ndarray:
        """Class indices sorted by difference, largest gain of b first; NaN classes left out."""
        d = self.diff
        present = np.flatnonzero(~np.isnan(d))
        return present[np.argsort(-d[present], kind="stable")]

    def table(self) -> str:
        rows = [[self.class_names[j], self.ap_a[j], self.ap_b[j], self.diff[j]]
                for j in self.order()]
        rows.append(["mean (mAP)", float(np.nanmean(self.ap_a)), float(np.nanmean(self.ap_b)),
                     float(np.nanmean(self.diff))])
        return format_table(["class", f"AP a: {self.run_a}", f"AP b: {self.run_b}", "b - a"],
                            rows)


def classwise_ap_difference(run_a, run_b, split: str = "test") -> APDifference:
    """Per-class AP of run b minus run a on ``split`` (Zhou et al. Fig. 4c).

    AP is `spmlkit.metrics.per_class_ap` of each run's best-epoch probabilities in
    ``predictions.npz``; class names come from ``config.json``. The mean of ``diff`` over classes
    with positives is the difference of the two mAPs (``"present"`` convention).

    Raises:
        FileNotFoundError: a run lacks ``predictions.npz`` or ``config.json``.
        ValueError: the runs' labels on ``split`` differ (not the same data).
    """
    split = _check_split(split)
    pa, pb = read_predictions(run_a, (split,)), read_predictions(run_b, (split,))
    ya, yb = pa[f"y_{split}"], pb[f"y_{split}"]
    if ya.shape != yb.shape or not np.array_equal(ya, yb):
        raise ValueError(f"{run_label(run_a)} and {run_label(run_b)} have different {split} "
                         f"labels ({ya.shape} vs {yb.shape}): compare runs on the same dataset")
    names = class_names_of(run_a, ya.shape[1])
    return APDifference(run_label(run_a), run_label(run_b), split, names,
                        per_class_ap(pa[f"probs_{split}"], ya),
                        per_class_ap(pb[f"probs_{split}"], yb))


# --- Wasserstein distance ----------------------------------------------------------------------
def wasserstein_1d(u, v) -> float:
    """Wasserstein-1 distance between two 1-D empirical distributions (equal weights).

    ``W1 = integral_0^1 |F^-1(t) - G^-1(t)| dt`` with ``F^-1``, ``G^-1`` the empirical quantile
    functions, which are step functions: ``F^-1(t) = u_(ceil(t n))`` for sorted ``u``. On the
    union of their breakpoints ``i / n`` and ``j / m`` (kept as the integers ``i m`` and ``j n``
    over ``n m``, so equal breakpoints are found exactly) both are constant, and the integral is
    a finite sum.

    >>> wasserstein_1d([0.0, 1.0], [0.5])
    0.5
    """
    a = np.sort(np.asarray(u, dtype=np.float64).ravel())
    b = np.sort(np.asarray(v, dtype=np.float64).ravel())
    n, m = a.size, b.size
    if n == 0 or m == 0:
        raise ValueError(f"both samples need at least one value, got {n} and {m}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("samples must be finite")
    # right ends of the pieces, in units of 1 / (n m)
    ends = np.union1d(np.arange(1, n + 1, dtype=np.int64) * m,
                      np.arange(1, m + 1, dtype=np.int64) * n)
    widths = np.diff(np.r_[0, ends]) / (n * m)
    ia = -(-ends // m) - 1          # ceil(end / m) - 1: the quantile index of u on the piece
    ib = -(-ends // n) - 1
    return float(np.sum(widths * np.abs(a[ia] - b[ib])))


def wasserstein_per_class(probs, observed, y) -> np.ndarray:
    """Per class, W1 between the predicted probabilities of the unobserved positives and of the
    unobserved negatives (Zhou et al. Fig. 4a: larger = the classifier separates the unobserved
    labels better).

    Args:
        probs: N x L predicted probabilities (the train split).
        observed: N x L observed labels (1 / 0 / -1); only ``observed == 0`` entries are used.
        y: N x L full 0/1 labels.

    Returns:
        L distances; NaN for a class without an unobserved positive or an unobserved negative.

    >>> wasserstein_per_class([[0.9, 0.2], [0.1, 0.4]], [[0, 0], [0, 0]], [[1, 0], [0, 0]])
    array([0.8, nan])
    """
    p = np.asarray(probs, dtype=np.float64)
    z = validate_observed(observed, "observed labels")
    y = validate_full_labels(y, "full labels")
    if not p.shape == z.shape == y.shape or p.ndim != 2:
        raise ValueError(f"probs {p.shape}, observed {z.shape} and labels {y.shape} must have the "
                         f"same N x L shape")
    unobs = z == UNOBSERVED
    out = np.full(p.shape[1], np.nan)
    for j in range(p.shape[1]):
        pos = p[unobs[:, j] & (y[:, j] == 1), j]
        neg = p[unobs[:, j] & (y[:, j] == 0), j]
        if pos.size and neg.size:
            out[j] = wasserstein_1d(pos, neg)
    return out


@dataclass
class WassersteinResult:
    """Per-class W1 distances of one run (train split), with the group sizes."""

    run: str
    class_names: list
    distance: np.ndarray
    n_pos: np.ndarray       # unobserved positives per class
    n_neg: np.ndarray       # unobserved negatives per class

    @property
    def mean(self) -> float:
        d = self.distance
        return float(np.nanmean(d)) if np.isfinite(d).any() else float("nan")


def _needs_full_train_labels(run_dir, what: str) -> None:
    """Refuse ``what`` (an analysis of the unobserved positives) on a run whose training labels
    were only the observed ones: which unobserved entries are positives is unknown there."""
    labels = (read_config(run_dir).get("labels") or {}) \
        if (Path(run_dir) / "config.json").is_file() else {}
    if labels.get("train_labels") == "observed":
        raise ValueError(f"{what} of {run_dir}: it compares the unobserved positives with the "
                         f"unobserved negatives of the train rows, and this run trained on "
                         f"observed labels only (regime given): its train rows' full labels "
                         f"are unknown")


def run_wasserstein(run_dir) -> WassersteinResult:
    """`wasserstein_per_class` on a run's best-epoch train probabilities
    (``predictions.npz``); a ValueError for a run on observed training labels only."""
    _needs_full_train_labels(run_dir, "the Wasserstein distance")
    pred = read_predictions(run_dir)
    z, y = pred["observed"], pred["y_train"]
    unobs = z == UNOBSERVED
    return WassersteinResult(run_label(run_dir), class_names_of(run_dir, y.shape[1]),
                             wasserstein_per_class(pred["probs_train"], z, y),
                             (unobs & (y == 1)).sum(axis=0), (unobs & (y == 0)).sum(axis=0))


def wasserstein_table(results) -> str:
    """Classes as rows, runs as columns, and a last row with each run's mean over classes."""
    results = list(results)
    if not results:
        raise ValueError("no run given")
    names = results[0].class_names
    rows = [[names[j], int(results[0].n_pos[j])] + [float(r.distance[j]) for r in results]
            for j in range(len(names))]
    rows.append(["mean", ""] + [r.mean for r in results])
    return format_table(["class", "unobs. pos."] + [r.run for r in results], rows, ".4f")


# --- histograms of unobserved positives --------------------------------------------------------
@dataclass
class Histograms:
    """Histograms of the unobserved positives' predicted probabilities, one per epoch."""

    run: str
    epochs: list            # 1-based
    edges: np.ndarray       # bins + 1 edges on [0, 1]
    counts: np.ndarray      # len(epochs) x bins
    n: int                  # number of unobserved positives (each histogram sums to it)
    mean: np.ndarray        # mean probability per epoch
    above_half: np.ndarray  # share with p >= 0.5 per epoch

    def table(self) -> str:
        return format_table(["epoch", "unobs. pos.", "mean p", "share p>=0.5"],
                            [[int(e), self.n, float(m), float(a)] for e, m, a in
                             zip(self.epochs, self.mean, self.above_half)], ".3f")


def unobserved_positive_histograms(run_dir, epochs=None, bins: int = 20) -> Histograms:
    """Histograms of the train-split probabilities of the unobserved positives (``y = 1``,
    ``observed = 0``) after the given epochs (Cole et al. Fig. 2).

    Args:
        run_dir: a run trained with ``save_train_probs=True`` (``spml train --save-train-probs``).
        epochs: 1-based epochs (default: the first, the middle and the last one stored).
        bins: equal-width bins on [0, 1].

    Raises:
        FileNotFoundError: no ``train_probs.npy`` (or ``predictions.npz``, which holds the labels).
        ValueError: an epoch the run does not have.
    """
    if int(bins) != bins or not 1 <= bins <= 100_000:
        raise ValueError(f"bins must be a whole number in [1, 100000], got {bins}")
    _needs_full_train_labels(run_dir, "the histograms of unobserved positives")
    probs = load_array(run_file(run_dir, TRAIN_PROBS_FILE), mmap_mode="r")
    pred = read_predictions(run_dir, probs=())
    z, y = pred["observed"], pred["y_train"]
    if probs.ndim != 3 or probs.shape[1:] != y.shape:
        raise ValueError(f"{Path(run_dir) / TRAIN_PROBS_FILE} has shape {probs.shape}; expected "
                         f"epochs x {y.shape[0]} x {y.shape[1]} (the run's train split)")
    total = probs.shape[0]
    if epochs is None:
        epochs = sorted({1, (total + 1) // 2, total})
    epochs = [int(e) for e in epochs]
    bad = [e for e in epochs if not 1 <= e <= total]
    if bad or not epochs:
        raise ValueError(f"epochs {bad or epochs} are not in the run: {TRAIN_PROBS_FILE} holds "
                         f"epochs 1..{total}")
    pos = (z == UNOBSERVED) & (y == 1)
    edges = np.linspace(0.0, 1.0, int(bins) + 1)
    counts, means, above = [], [], []
    for e in epochs:
        values = np.clip(np.asarray(probs[e - 1], dtype=np.float64)[pos], 0.0, 1.0)
        counts.append(np.histogram(values, edges)[0])
        means.append(values.mean() if values.size else np.nan)
        above.append((values >= 0.5).mean() if values.size else np.nan)
    return Histograms(run_label(run_dir), epochs, edges, np.array(counts, dtype=np.int64),
                      int(pos.sum()), np.array(means), np.array(above))
