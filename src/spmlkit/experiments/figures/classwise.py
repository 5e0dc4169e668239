"""Per-class bars of two or more runs: the AP difference (Zhou et al. Fig. 4c) and the
Wasserstein-1 distance between unobserved positives and negatives (Zhou et al. Fig. 4a), drawn
from `spmlkit.analysis` results."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .plotting import new_figure, save_figure


def plot_ap_difference(res, out, *, force: bool = False) -> Path:
    """Bars of AP(b) - AP(a) per class (`spmlkit.analysis.APDifference`), sorted by the
    difference; returns the path written."""
    order = res.order()
    d = res.diff[order]
    fig, axes = new_figure((max(6.0, 0.35 * len(order) + 2), 4.5))
    ax = axes[0, 0]
    x = np.arange(len(order))
    gain, loss_ = d >= 0, d < 0
    ax.bar(x[gain], d[gain], color="tab:green", label=f"b better ({int(gain.sum())})")
    ax.bar(x[loss_], d[loss_], color="tab:red", label=f"a better ({int(loss_.sum())})")
    ax.axhline(0.0, color="black", linewidth=0.8)
    if len(order):
        ax.axhline(float(np.mean(d)), color="tab:blue", linestyle="--",
                   label=f"mean = mAP difference ({np.mean(d):+.2f})")
    ax.set_xticks(x, [res.class_names[j] for j in order], rotation=90, fontsize="small")
    ax.set(xlabel="class (sorted by difference)", ylabel="AP(b) - AP(a), points")
    left_out = int(np.isnan(res.diff).sum())
    ax.set_title(f"Class-wise AP difference on {res.split}\na = {res.run_a}, b = {res.run_b}"
                 + (f" ({left_out} classes without positives left out)" if left_out else ""),
                 fontsize="medium")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, out, force=force)


def plot_wasserstein(results, out, *, force: bool = False) -> Path:
    """Grouped bars of the per-class W1 distance (`spmlkit.analysis.WassersteinResult`
    per run), one colour per run; returns the path written."""
    results = list(results)
    if not results:
        raise ValueError("no run given")
    names = results[0].class_names
    for r in results[1:]:
        if len(r.class_names) != len(names):
            raise ValueError(f"{r.run} has {len(r.class_names)} classes, {results[0].run} "
                             f"{len(names)}: compare runs on the same dataset")
    fig, axes = new_figure((max(6.0, 0.3 * len(names) * len(results) + 2), 4.5))
    ax = axes[0, 0]
    x = np.arange(len(names))
    width = 0.8 / len(results)
    for i, r in enumerate(results):
        ax.bar(x - 0.4 + width * (i + 0.5), r.distance, width,  # NaN: no bar
               label=f"{r.run} (mean {r.mean:.3f})")
    ax.set_xticks(x, names, rotation=90, fontsize="small")
    ax.set(xlabel="class", ylabel="Wasserstein-1 distance",
           title="Unobserved positives vs unobserved negatives on the train split\n"
                 "(Wasserstein-1 of predicted probabilities, Zhou et al. Fig. 4a)")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, out, force=force)
