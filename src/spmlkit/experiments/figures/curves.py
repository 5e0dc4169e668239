"""Per-epoch curves of runs: val mAP and training loss (OPML Fig. 4), and the pseudo-label
count and precision of `spmlkit.analysis.pseudo_label_precision` (Zhou et al. Table 2)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...analysis import run_label
from ...runs import read_metrics
from .plotting import integer_epochs, new_figure, save_figure
from .sweeps import metric_label

#: up to this many lines, each panel has its own legend; more get one legend beside the figure
LEGEND_INSIDE = 8


def plot_curves(curves: dict, out, metric: str = "val_map", title: str | None = None, *,
                force: bool = False) -> Path:
    """Per-epoch ``metric`` (left) and ``train_loss`` (right, when the records have it) of
    several runs, one line per run; the best value of ``metric`` is marked.

    Args:
        curves: legend label -> list of epoch records (dicts with ``epoch``, ``metric`` and
            optionally ``train_loss``: the lines of ``metrics.jsonl``). Records are drawn in
            order; runs with two phases (``linear_init``) are numbered consecutively.
        out: ``.png`` or ``.svg`` path.
        metric: the record key on the left panel (``val_map``, ``pl_precision``, ...).
        force: replace ``out`` if it exists (else the next free name is written).

    Returns:
        the path written (see `save_figure`).

    Raises:
        ValueError: no curve, or a curve without ``metric`` in any record.
    """
    if not curves:
        raise ValueError("no run given")
    for label, records in curves.items():
        if not any(metric in r for r in records):
            keys = sorted({k for r in records for k in r})
            raise ValueError(f"{label}: no epoch record has {metric!r} (keys: {keys})")
    has_loss = any("train_loss" in r for records in curves.values() for r in records)
    many = len(curves) > LEGEND_INSIDE  # one legend beside the panels, line styles cycling
    fig, axes = new_figure((10 if has_loss else 5.5, 4), 1, 2 if has_loss else 1)
    ax_m = axes[0, 0]
    for i, (label, records) in enumerate(curves.items()):
        rows = [r for r in records if r.get(metric) is not None]
        x = np.arange(1, len(records) + 1)[[i for i, r in enumerate(records)
                                            if r.get(metric) is not None]]
        y = np.array([r[metric] for r in rows], dtype=np.float64)
        (line,) = ax_m.plot(x, y, marker="o", markersize=3, label=label,
                            linestyle=("-", "--", ":")[i // 10 % 3])
        if np.isfinite(y).any():
            b = int(np.nanargmax(y))
            ax_m.plot(x[b], y[b], marker="*", markersize=12, color=line.get_color())
        if has_loss:
            lr = [(i + 1, r["train_loss"]) for i, r in enumerate(records) if "train_loss" in r]
            if lr:
                axes[0, 1].plot(*zip(*lr), marker="o", markersize=3, label=label,
                                color=line.get_color(), linestyle=line.get_linestyle())
    ax_m.set(xlabel="epoch", ylabel=metric_label(metric),
             title=f"{metric_label(metric)} per epoch (star: best)")
    panels = [ax_m]
    if has_loss:
        axes[0, 1].set(xlabel="epoch", ylabel="train loss", title="training loss per epoch")
        panels.append(axes[0, 1])
    integer_epochs(*panels)
    if many:
        fig.legend(*ax_m.get_legend_handles_labels(), loc="center left", fontsize="small",
                   bbox_to_anchor=(1.0, 0.5), ncol=1 + len(curves) // 25)
    else:
        for ax in panels:
            ax.legend(fontsize="small")
    fig.suptitle(title or "Training curves")
    return save_figure(fig, out, force=force)


def plot_small_curves(panels: dict, out, metric: str = "val_map", title: str | None = None,
                      *, ncols: int = 4, force: bool = False) -> Path:
    """Small multiples of per-epoch curves: one panel per entry of ``panels`` (a method), with
    its own lines (``{line label: epoch records}``: the method's variants, or one line),
    on one shared y range; the other panels' lines are drawn faint grey behind, for context,
    when a panel has one line. Several lines in a panel take colours along a sequential map
    in their order (a swept value) and are named in one legend beside the panels.

    Returns:
        the path written (see `save_figure`).

    Raises:
        ValueError: no panel.
    """
    import matplotlib

    panels = {name: lines for name, lines in panels.items() if lines}
    if not panels:
        raise ValueError("no run given")
    n = len(panels)
    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    fig, axes = new_figure((3.2 * ncols, 2.6 * nrows + 0.6), nrows, ncols, sharex=True,
                           sharey=True)

    def xy(records):
        keep = [(i + 1, r[metric]) for i, r in enumerate(records)
                if r.get(metric) is not None]
        return (np.array([a for a, _ in keep], dtype=np.float64),
                np.array([b for _, b in keep], dtype=np.float64))

    single = all(len(lines) == 1 for lines in panels.values())
    cmap = matplotlib.colormaps["viridis"]
    for idx, (name, lines) in enumerate(panels.items()):
        ax = axes[idx // ncols, idx % ncols]
        if single:
            for other, olines in panels.items():
                if other != name:
                    for records in olines.values():
                        ax.plot(*xy(records), color="0.85", linewidth=0.8, zorder=1)
        for j, (label, records) in enumerate(lines.items()):
            color = "C0" if len(lines) == 1 else cmap(j / max(1, len(lines) - 1) * 0.9)
            x, y = xy(records)
            ax.plot(x, y, color=color, linewidth=1.4, label=label, zorder=2)
            if np.isfinite(y).any():
                b = int(np.nanargmax(y))
                ax.plot(x[b], y[b], marker="*", markersize=8, color=color, zorder=3)
        ax.set_title(name, fontsize="small")
        ax.grid(alpha=0.3)
        if idx % ncols == 0:
            ax.set_ylabel(metric_label(metric))
        if idx + ncols >= n:  # no panel below: this one shows the epochs
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel("epoch")
    if not single:  # one legend for every panel (the same variants), beside them
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside right upper", fontsize="x-small",
                   ncol=1 + len(labels) // 26)
    for idx in range(n, nrows * ncols):
        axes[idx // ncols, idx % ncols].set_visible(False)
    integer_epochs(*[axes[i // ncols, i % ncols] for i in range(n)])
    fig.suptitle(title or f"{metric_label(metric)} per epoch (star: best)")
    return save_figure(fig, out, force=force)


def curves_from_runs(runs, labels=None) -> dict:
    """``{legend label: metrics.jsonl records}`` of run folders; labels default to
    ``<folder> (<loss>)``, made unique.

    Raises:
        FileNotFoundError: a run folder or its ``metrics.jsonl`` is missing (named).
        ValueError: as many labels as runs are needed.
    """
    runs = list(runs)
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"{len(labels)} labels for {len(runs)} runs: give one label per run")
    out = {}
    for i, run in enumerate(runs):
        records = read_metrics(run)
        if not records:
            raise ValueError(f"{Path(run) / 'metrics.jsonl'} holds no epoch record")
        if labels is not None:
            label = str(labels[i])
        else:
            from ...runs import read_run

            cfg_path = Path(run) / "config.json"  # read and checked: a damaged one is named
            loss = read_run(run).config.get("loss") if cfg_path.is_file() else None
            label = run_label(run) + (f" ({loss})" if loss else "")
        base, j = label, 2
        while label in out:
            label, j = f"{base} #{j}", j + 1
        out[label] = records
    return out


def plot_pl_precision(results, out, *, force: bool = False) -> Path:
    """Pseudo-label count and precision per epoch, one line per run
    (`spmlkit.analysis.PseudoLabelPrecision` results); returns the path written."""
    results = list(results)
    if not results:
        raise ValueError("no run given")
    fig, axes = new_figure((10, 4), 1, 2)
    ax_count, ax_prec = axes[0]
    for r in results:
        label = f"{r.run} ({r.loss})"
        ax_count.plot(r.epoch, r.count, marker="o", label=label)
        ax_prec.plot(r.epoch, r.precision, marker="o", label=label)
    ax_count.set(title="Pseudo-labelled train entries", xlabel="epoch", ylabel="count")
    ax_prec.set(title="Pseudo-label precision", xlabel="epoch",
                ylabel="share equal to the true label", ylim=(-0.02, 1.02))
    integer_epochs(ax_count, ax_prec)
    for ax in (ax_count, ax_prec):
        ax.legend(fontsize="small")
    fig.suptitle("Pseudo-label precision (Zhou et al. Table 2)")
    return save_figure(fig, out, force=force)
