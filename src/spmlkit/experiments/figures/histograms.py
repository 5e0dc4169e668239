"""Histograms of predicted probabilities on the train split: observed positives, unobserved
positives and negatives of the best epoch (Cole Fig. 2, OPML Fig. 3, Zhou Fig. 4b), and the
unobserved positives after chosen epochs (`spmlkit.analysis.unobserved_positive_histograms`,
Cole Fig. 2)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...analysis import format_table, run_label
from ...labels import POSITIVE, UNOBSERVED
from ...runs import read_predictions
from .plotting import new_figure, save_figure

GROUPS = ("observed positives", "unobserved positives", "negatives")


@dataclass
class ProbHistograms:
    """Histograms of train-split probabilities per group (observed positives ``z = 1``,
    unobserved positives ``z = 0, y = 1``, negatives ``y = 0``)."""

    run: str
    edges: np.ndarray           # bins + 1 on [0, 1]
    counts: np.ndarray          # 3 x bins
    n: np.ndarray               # 3: group sizes
    mean: np.ndarray            # 3: mean probability per group (NaN for an empty group)

    def table(self) -> str:
        return format_table(["group", "entries", "mean p", "share p>=0.5"],
                            [[g, int(n), float(m), float(a)] for g, n, m, a in
                             zip(GROUPS, self.n, self.mean, self.above_half)], ".3f")

    @property
    def above_half(self) -> np.ndarray:
        half = np.searchsorted(self.edges, 0.5)  # bins whose left edge is >= 0.5
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.counts[:, half:].sum(axis=1) / self.n


def probability_histograms(probs, observed, y, bins: int = 20, run: str = "") -> ProbHistograms:
    """Histograms of ``probs`` over the three groups of train entries.

    Args:
        probs: N x L probabilities (the train split).
        observed: N x L observed labels (1 / 0 / -1) the run trained with.
        y: N x L full 0/1 labels.
        bins: equal-width bins on [0, 1] (an edge falls on 0.5 when ``bins`` is even).

    >>> h = probability_histograms([[0.9, 0.2], [0.6, 0.1]], [[1, 0], [0, 0]], [[1, 0], [1, 0]],
    ...                            bins=2)
    >>> h.counts.tolist(), h.n.tolist()
    ([[0, 1], [0, 1], [2, 0]], [1, 1, 2])
    """
    if int(bins) != bins or not 1 <= bins <= 100_000:
        raise ValueError(f"bins must be a whole number in [1, 100000], got {bins}")
    p = np.clip(np.asarray(probs, dtype=np.float64), 0.0, 1.0)
    z, y = np.asarray(observed), np.asarray(y)
    if not p.shape == z.shape == y.shape or p.ndim != 2:
        raise ValueError(f"probs {p.shape}, observed {z.shape} and labels {y.shape} must have the "
                         f"same N x L shape")
    masks = [z == POSITIVE, (z == UNOBSERVED) & (y == 1), y == 0]
    edges = np.linspace(0.0, 1.0, int(bins) + 1)
    counts = np.array([np.histogram(p[m], edges)[0] for m in masks], dtype=np.int64)
    n = np.array([int(m.sum()) for m in masks], dtype=np.int64)
    mean = np.array([p[m].mean() if m.any() else np.nan for m in masks])
    return ProbHistograms(run, edges, counts, n, mean)


def plot_probability_histograms(h: ProbHistograms, out, *, force: bool = False) -> Path:
    """One panel per group (share of the group per bin, so groups of very different sizes
    compare), with the group's mean marked; returns the path written."""
    fig, axes = new_figure((11, 3.4), 1, 3, sharex=True)
    colours = ("tab:green", "tab:orange", "tab:blue")
    for ax, g, c, n, m, col in zip(axes[0], GROUPS, h.counts, h.n, h.mean, colours):
        share = c / n if n else c.astype(np.float64)
        ax.stairs(share, h.edges, fill=True, alpha=0.7, color=col, label=f"n = {int(n)}")
        if np.isfinite(m):
            ax.axvline(m, color="black", linestyle="--", label=f"mean {m:.2f}")
        ax.set(title=g, xlabel="predicted probability", ylabel="share of the group", xlim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"Predicted probabilities on the train split, {h.run}")
    return save_figure(fig, out, force=force)


def histograms_from_run(run, bins: int = 20) -> ProbHistograms:
    """`probability_histograms` of a run's best-epoch train probabilities
    (``predictions.npz``)."""
    pred = read_predictions(run)
    return probability_histograms(pred["probs_train"], pred["observed"], pred["y_train"], bins,
                                  run_label(run))


def plot_histograms(h, out, *, force: bool = False) -> Path:
    """Small multiples of `spmlkit.analysis.Histograms` (the unobserved positives'
    probabilities): one histogram per epoch, shared axes; returns the path written."""
    k = len(h.epochs)
    ncols = min(k, 4)
    nrows = -(-k // ncols)
    fig, axes = new_figure((3.2 * ncols, 2.8 * nrows), nrows, ncols, sharex=True, sharey=True)
    flat = axes.ravel()
    for ax, e, c, m in zip(flat, h.epochs, h.counts, h.mean):
        ax.stairs(c, h.edges, fill=True, alpha=0.7, label=f"unobserved positives (n={h.n})")
        if np.isfinite(m):
            ax.axvline(m, color="black", linestyle="--", label=f"mean {m:.2f}")
        ax.set(title=f"epoch {e}", xlabel="predicted probability", ylabel="count", xlim=(0, 1))
        ax.legend(fontsize="x-small", loc="upper left")
    for ax in flat[k:]:
        ax.set_visible(False)
    fig.suptitle(f"Predicted probabilities of unobserved positives (train split), {h.run}")
    return save_figure(fig, out, force=force)
