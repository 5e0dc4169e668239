"""The papers' figures as functions on explicit data, and thin loaders for runs and studies.

Every ``plot_*`` function takes plain arrays / rows, draws on matplotlib's Agg canvas (the
object-oriented API of :mod:`spmlkit.analysis`, no pyplot), writes the figure atomically (PNG, or
SVG when the output path ends in ``.svg``) and returns the path. The numbers behind a figure come
from a pure function (``sweep_points``, ``probability_histograms``, ``loss_landscape``,
``class_activation_maps``) so they can be tested and printed. The ``*_from_run(s)`` loaders read
run folders (:mod:`spmlkit.runs`) and study folders (:func:`spmlkit.experiments.study.open_study`,
the current spec's runs). ``spml figure ...`` wires them.

- curves: val mAP and train loss per epoch of one or more runs (OPML Fig. 4);
- sweep: selected test mAP (mean +- std over seeds) against a study's vary axis (LAC Figs. 3-5,
  Zhou Fig. 3a, Cole Fig. 1);
- histograms: predicted probabilities of observed positives, unobserved positives and negatives
  on the train split (Cole Fig. 2, OPML Fig. 3, Zhou Fig. 4b);
- landscape: the training loss on the plane ``theta + a d1 + b d2`` of two filter-normalised
  random directions (Li et al. 2018; Zhou Fig. 5a-b);
- panel: images with their labels and top predicted probabilities (Zhou Fig. 6);
- cam: class activation maps ``CAM_k = sum_c W_kc fmap_c`` (Zhou et al. 2016; OPML Fig. 7);
- attention: the label-wise decoder's attention maps (LAC Fig. 6).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..analysis import _figure, format_table, read_config, read_metrics, read_predictions, \
    run_file, run_label
from ..labels import POSITIVE, UNOBSERVED
from ..runs import _atomic
from .tables import row_variant

FIGURE_SUFFIXES = (".png", ".svg")
#: the run-folder subfolder the CLI writes figures into when no ``--out`` is given
FIGURES_DIR = "figures"


# --- common ------------------------------------------------------------------------------------
def _canvas(figsize):
    """A matplotlib Figure on an Agg canvas, without axes (for 3-D or mixed layouts)."""
    fig, axes = _figure(figsize)
    fig.delaxes(axes[0, 0])
    return fig


def save_figure(fig, out) -> Path:
    """Write ``fig`` atomically to ``out`` (PNG, or SVG for a ``.svg`` path); returns ``out``."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in FIGURE_SUFFIXES:
        raise ValueError(f"figures are PNG or SVG files: give an output path ending in .png or "
                         f".svg, got {out}")
    fmt = suffix[1:]
    _atomic(out, lambda fh: fig.savefig(fh, format=fmt, dpi=120, bbox_inches="tight"))
    return out


def _pick(count: int, n: int, seed: int) -> np.ndarray:
    """``min(n, count)`` sorted row indices drawn without replacement with ``seed``."""
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a whole number >= 1, got {n}")
    if count < 1:
        raise ValueError("the split has no example to show")
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(count, size=min(int(n), count), replace=False))


def _short(names, limit: int = 4) -> str:
    names = list(names)
    text = ", ".join(names[:limit]) + (f" +{len(names) - limit}" if len(names) > limit else "")
    return text or "-"


# --- 1. training curves ------------------------------------------------------------------------
#: up to this many lines, each panel has its own legend; more get one legend beside the figure
LEGEND_INSIDE = 8


def plot_curves(curves: dict, out, metric: str = "val_map", title: str | None = None) -> Path:
    """Per-epoch ``metric`` (left) and ``train_loss`` (right, when the records have it) of
    several runs, one line per run; the best value of ``metric`` is marked.

    Args:
        curves: legend label -> list of epoch records (dicts with ``epoch``, ``metric`` and
            optionally ``train_loss``: the lines of ``metrics.jsonl``). Records are drawn in
            order; runs with two phases (``linear_init``) are numbered consecutively.
        out: ``.png`` or ``.svg`` path.
        metric: the record key on the left panel (``val_map``, ``pl_precision``, ...).

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
    fig, axes = _figure((10 if has_loss else 5.5, 4), 1, 2 if has_loss else 1)
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
    ax_m.set(xlabel="epoch", ylabel=metric.replace("_", " "),
             title=f"{metric.replace('_', ' ')} per epoch (star: best)")
    panels = [ax_m]
    if has_loss:
        axes[0, 1].set(xlabel="epoch", ylabel="train loss", title="training loss per epoch")
        panels.append(axes[0, 1])
    from matplotlib.ticker import MaxNLocator

    for ax in panels:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if not many:
            ax.legend(fontsize="small")
    if many:
        fig.legend(*ax_m.get_legend_handles_labels(), loc="center left", fontsize="small",
                   bbox_to_anchor=(1.0, 0.5), ncol=1 + len(curves) // 25)
    fig.suptitle(title or "Training curves")
    return save_figure(fig, out)


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
            cfg_path = Path(run) / "config.json"
            loss = json.loads(cfg_path.read_text()).get("loss") if cfg_path.is_file() else None
            label = run_label(run) + (f" ({loss})" if loss else "")
        base, j = label, 2
        while label in out:
            label, j = f"{base} #{j}", j + 1
        out[label] = records
    return out


# --- 2. sensitivity sweeps ---------------------------------------------------------------------
@dataclass
class SweepLine:
    """One method's selected metric against the swept axis (mean and std over seeds)."""

    method: str
    dataset: str
    label: str                  # method, plus the other vary keys' values if any
    x: list                     # axis values (numbers, or strings for a categorical axis)
    mean: np.ndarray
    std: np.ndarray             # sample std over seeds (ddof=1); 0 for a single seed
    n: np.ndarray               # seeds per point
    reference: bool = False     # a method without the axis: one value, drawn as a flat line


def _axis_value(row, variant: dict, axis: str):
    """The row's value on ``axis``: the vary assignment's key (also nested: ``hparams`` ->
    ``alpha``), else a row column such as ``regime`` when the study varies it; ``KeyError``."""
    if axis in variant:
        return variant[axis]
    head, _, rest = axis.partition(".")
    if rest and isinstance(variant.get(head), dict) and rest in variant[head]:
        return variant[head][rest]
    raise KeyError(axis)


def _as_number(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float, np.integer, np.floating)):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def sweep_points(rows, axis: str, metric: str = "test_map") -> list[SweepLine]:
    """Group selected study rows by (dataset, method, other vary keys) and axis value.

    Args:
        rows: dicts with ``method``, ``dataset``, ``seed``, ``variant`` (JSON of the vary
            assignment, e.g. ``{"hparams.alpha": 0.1}``) and ``metric``: what
            ``StudyStore.selected()`` returns. Rows whose status is not ``done`` are skipped.
        axis: a vary key (``hparams.alpha``, ``data.subsample``, ``k``, ``regime``).
        metric: the row column on the y axis.

    Returns:
        one :class:`SweepLine` per (dataset, method, other keys): x sorted (numerically when
        every value is a number), mean and sample std over seeds. Methods without the axis in
        any row (references such as ``bce@full``) give one ``reference`` line with one value.

    Raises:
        ValueError: no row, or no row has ``axis`` (the message lists the study's axes).

    >>> rows = [{"method": "an", "dataset": "d", "seed": s, "variant": json.dumps({"k": k}),
    ...          "test_map": 10 * k + s} for k in (1, 2) for s in (0, 2)]
    >>> line, = sweep_points(rows, "k")
    >>> line.x, line.mean.tolist(), line.std.round(3).tolist()
    ([1.0, 2.0], [11.0, 21.0], [1.414, 1.414])
    """
    rows = [r for r in rows if r.get("status", "done") == "done"]
    if not rows:
        raise ValueError("no finished run to plot (the study has no row with status 'done')")
    axes = sorted({k for r in rows for k in row_variant(r)})
    groups: dict = {}
    refs: dict = {}
    any_axis = False
    for r in rows:
        variant = row_variant(r)
        value = r.get(metric)
        if value is None:
            raise ValueError(f"run {r.get('run_id')} has no {metric!r}; columns: {sorted(r)}")
        try:
            x = _axis_value(r, variant, axis)
        except KeyError:
            if axis in r and axis in ("regime", "dataset", "seed", "mode"):
                x = r[axis]
            else:
                refs.setdefault((r["dataset"], r["method"]), []).append(float(value))
                continue
        any_axis = True
        others = {k: v for k, v in variant.items() if k != axis}
        label = r["method"] + (" (" + ", ".join(f"{k}={v}" for k, v in sorted(others.items()))
                               + ")" if others else "")
        key = (r["dataset"], r["method"], label)
        groups.setdefault(key, {}).setdefault(json.dumps(x, sort_keys=True, default=str),
                                              (x, []))[1].append(float(value))
    if not any_axis:
        raise ValueError(f"no run varies {axis!r}: the study's vary axes are "
                         f"{axes or 'none (it has no vary: section)'}")

    def stats(values):
        v = np.asarray(values, dtype=np.float64)
        return v.mean(), (v.std(ddof=1) if len(v) > 1 else 0.0), len(v)

    lines = []
    for (dataset, method, label), points in sorted(groups.items()):
        xs = [p[0] for p in points.values()]
        numeric = all(_as_number(x) is not None for x in xs)
        order = sorted(range(len(xs)), key=(lambda i: _as_number(xs[i])) if numeric
                       else (lambda i: str(xs[i])))
        st = [stats(list(points.values())[i][1]) for i in order]
        lines.append(SweepLine(method, dataset, label,
                               [_as_number(xs[i]) if numeric else str(xs[i]) for i in order],
                               np.array([s[0] for s in st]), np.array([s[1] for s in st]),
                               np.array([s[2] for s in st], dtype=np.int64)))
    for (dataset, method), values in sorted(refs.items()):
        m, s, n = stats(values)
        lines.append(SweepLine(method, dataset, method, [], np.array([m]), np.array([s]),
                               np.array([n], dtype=np.int64), reference=True))
    return lines


def sweep_table(lines, axis: str, metric: str = "test_map") -> str:
    """A plain-text table of :func:`sweep_points`' lines (one row per point)."""
    rows = []
    for ln in lines:
        xs = ln.x if not ln.reference else ["(all)"]
        rows += [[ln.dataset, ln.label, str(x), float(m), float(s), int(n)]
                 for x, m, s, n in zip(xs, ln.mean, ln.std, ln.n)]
    return format_table(["dataset", "method", axis, f"{metric} mean", "std", "seeds"], rows)


def plot_sweep(lines, axis: str, out, metric: str = "test_map", title: str | None = None,
               logx: bool | None = None) -> Path:
    """Mean +- std (band) of ``metric`` against ``axis``, one line per method, one panel per
    dataset; reference methods as dashed flat lines. ``logx`` (default: automatic) uses a log
    axis when every x is positive and they span a factor >= 100."""
    lines = list(lines)
    if not lines:
        raise ValueError("no sweep line to plot")
    datasets = sorted({ln.dataset for ln in lines})
    fig, axes = _figure((5.5 * len(datasets), 4.2), 1, len(datasets))
    for ax, ds in zip(axes[0], datasets):
        mine = [ln for ln in lines if ln.dataset == ds]
        curves = [ln for ln in mine if not ln.reference]
        numeric = all(isinstance(x, float) for ln in curves for x in ln.x)
        cats = [] if numeric else sorted({str(x) for ln in curves for x in ln.x})
        for ln in curves:
            x = np.array(ln.x, dtype=np.float64) if numeric else \
                np.array([cats.index(str(v)) for v in ln.x], dtype=np.float64)
            (h,) = ax.plot(x, ln.mean, marker="o", label=ln.label)
            ax.fill_between(x, ln.mean - ln.std, ln.mean + ln.std, alpha=0.2,
                            color=h.get_color())
        refs = [ln for ln in mine if ln.reference]
        for i, ln in enumerate(refs):  # dashed; grey alone, else the colours after the curves'
            ax.axhline(ln.mean[0], linestyle="--", linewidth=1.2,
                       color="gray" if len(refs) == 1 else f"C{(len(curves) + i) % 10}",
                       label=f"{ln.label} ({ln.mean[0]:.2f})")
        if numeric:
            xs = np.array([x for ln in curves for x in ln.x], dtype=np.float64)
            auto = xs.size > 0 and xs.min() > 0 and xs.max() / xs.min() >= 100
            if logx if logx is not None else auto:
                ax.set_xscale("log")
        else:
            ax.set_xticks(range(len(cats)), cats, rotation=30, fontsize="small")
        ax.set(xlabel=axis, ylabel=f"{metric.replace('_', ' ')} (mean ± std over seeds)",
               title=ds)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title or f"Sensitivity to {axis}")
    return save_figure(fig, out)


def sweep_from_study(study_dir, axis: str, metric: str = "test_map") -> tuple[list, str]:
    """:func:`sweep_points` of a study folder's selected rows (the current spec's runs, read by
    :func:`spmlkit.experiments.study.open_study`), and a title (the study's title).

    Raises:
        FileNotFoundError: no study folder, ``study.yaml`` or ``results.sqlite`` (named).
        ValueError: no finished run, or ``axis`` is not one of the study's vary axes.
    """
    from .study import open_study

    study = open_study(study_dir)
    if not study.has_results:
        raise FileNotFoundError(f"{study.results_path} is missing: the study has not run yet "
                                f"(`spml study run` writes it)")
    return sweep_points(study.selected, axis, metric), f"{study.title}: sensitivity to {axis}"


# --- 3. probability histograms -----------------------------------------------------------------
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
    if int(bins) != bins or bins < 1:
        raise ValueError(f"bins must be a whole number >= 1, got {bins}")
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


def plot_probability_histograms(h: ProbHistograms, out) -> Path:
    """One panel per group (share of the group per bin, so groups of very different sizes
    compare), with the group's mean marked; returns ``out``."""
    fig, axes = _figure((11, 3.4), 1, 3, sharex=True)
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
    return save_figure(fig, out)


def histograms_from_run(run, bins: int = 20) -> ProbHistograms:
    """:func:`probability_histograms` of a run's best-epoch train probabilities
    (``predictions.npz``)."""
    pred = read_predictions(run)
    return probability_histograms(pred["probs_train"], pred["observed"], pred["y_train"], bins,
                                  run_label(run))


# --- 4. loss landscape -------------------------------------------------------------------------
@dataclass
class Landscape:
    """The objective on the grid ``theta + alphas[i] d1 + betas[j] d2`` (``values[i, j]``)."""

    alphas: np.ndarray
    betas: np.ndarray
    values: np.ndarray
    title: str = ""

    @property
    def centre(self) -> float:
        """The value at the trained weights (a = b = 0, the grid's middle for odd steps)."""
        i, j = int(np.argmin(np.abs(self.alphas))), int(np.argmin(np.abs(self.betas)))
        return float(self.values[i, j])

    @property
    def argmin(self) -> tuple[float, float]:
        i, j = np.unravel_index(int(np.nanargmin(self.values)), self.values.shape)
        return float(self.alphas[i]), float(self.betas[j])

    def summary(self) -> str:
        a, b = self.argmin
        return (f"{self.values.shape[0]} x {self.values.shape[1]} grid, span "
                f"{self.alphas.max():g}: loss at the trained weights {self.centre:.6g}, "
                f"min {np.nanmin(self.values):.6g} at (a, b) = ({a:g}, {b:g}), max "
                f"{np.nanmax(self.values):.6g}")


def filter_normalized_direction(model, generator):
    """A random direction in ``model``'s parameter space, filter-normalised (Li et al. 2018).

    Each parameter with 2 or more dimensions gets a Gaussian draw whose every filter (slice
    along dimension 0: a convolution's output channel, a linear layer's row) is rescaled to the
    norm of the same filter of the weights: ``d_i <- d_i / ||d_i|| * ||theta_i||``. Biases and
    other 1-D parameters (BatchNorm's) get 0, as in Li et al.

    Args:
        model: an ``nn.Module``.
        generator: a seeded ``torch.Generator`` (the draw reads no global state).

    Returns:
        a list of tensors, one per ``model.parameters()`` entry, same shapes.
    """
    import torch

    out = []
    for p in model.parameters():
        if p.dim() <= 1:
            out.append(torch.zeros_like(p))
            continue
        d = torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.dtype)
        dn = d.flatten(1).norm(dim=1)
        pn = p.detach().flatten(1).norm(dim=1)
        scale = pn / dn.clamp_min(1e-12)
        out.append(d * scale.view(-1, *([1] * (p.dim() - 1))))
    return out


def loss_landscape(model, objective, *, steps: int = 21, span: float = 1.0, seed: int = 0,
                   directions=None, title: str = "") -> Landscape:
    """The objective on a ``steps x steps`` grid around ``model``'s weights.

    ``values[i, j] = objective(model with theta + a_i d1 + b_j d2)`` for ``a, b`` in
    ``linspace(-span, span, steps)``; ``d1``, ``d2`` from :func:`filter_normalized_direction`
    with ``torch.Generator().manual_seed(seed)`` (drawn one after the other). The model's
    weights are restored afterwards.

    Args:
        model: an ``nn.Module`` at its trained weights.
        objective: ``objective(model) -> float`` (called under ``torch.no_grad()``).
        steps: grid points per axis (odd puts the trained weights on the grid).
        span: the grid's half-width in units of the directions.
        seed: the directions' seed.
        directions: ``(d1, d2)`` to use instead of drawing them.

    Raises:
        ValueError: ``steps < 2`` or ``span <= 0``.
    """
    import torch

    if int(steps) != steps or steps < 2:
        raise ValueError(f"steps must be a whole number >= 2, got {steps}")
    if not span > 0 or not math.isfinite(span):
        raise ValueError(f"span must be a positive number, got {span}")
    params = list(model.parameters())
    if directions is None:
        g = torch.Generator().manual_seed(int(seed))
        directions = (filter_normalized_direction(model, g),
                      filter_normalized_direction(model, g))
    d1, d2 = directions
    theta = [p.detach().clone() for p in params]
    grid = np.linspace(-float(span), float(span), int(steps))
    values = np.empty((len(grid), len(grid)))
    try:
        with torch.no_grad():
            for i, a in enumerate(grid):
                for j, b in enumerate(grid):
                    for p, t, u, v in zip(params, theta, d1, d2):
                        p.copy_(t + a * u + b * v)
                    values[i, j] = float(objective(model))
    finally:
        with torch.no_grad():
            for p, t in zip(params, theta):
                p.copy_(t)
    return Landscape(grid, grid.copy(), values, title)


def plot_landscape(ls: Landscape, out) -> Path:
    """Contour map (left, the trained weights marked) and surface (right); returns ``out``."""
    fig = _canvas((11, 4.6))
    ax = fig.add_subplot(1, 2, 1)
    B, A = np.meshgrid(ls.betas, ls.alphas)
    finite = np.isfinite(ls.values)
    values = np.where(finite, ls.values, np.nanmax(np.where(finite, ls.values, -np.inf)))
    cs = ax.contourf(A, B, values, levels=20, cmap="viridis")
    ax.contour(A, B, values, levels=20, colors="white", linewidths=0.4, alpha=0.6)
    fig.colorbar(cs, ax=ax, label="training loss")
    ax.plot([0], [0], marker="*", color="red", markersize=12, label="trained weights")
    a, b = ls.argmin
    ax.plot([a], [b], marker="x", color="white", markersize=9, label="grid minimum")
    ax.set(xlabel="direction 1 (a)", ylabel="direction 2 (b)", title="contours")
    ax.legend(fontsize="small", loc="upper right")
    ax3 = fig.add_subplot(1, 2, 2, projection="3d")
    ax3.plot_surface(A, B, values, cmap="viridis", linewidth=0, antialiased=True)
    ax3.set(xlabel="a", ylabel="b", zlabel="loss", title="surface")
    ax3.set_box_aspect(None, zoom=0.85)
    fig.suptitle(ls.title or "Loss landscape (filter-normalised directions, Li et al. 2018)")
    return save_figure(fig, out)


def _train_loss(ckpt, config, run, observed):
    """The run's loss with its best-epoch state (see :func:`landscape_from_run`)."""
    from ..losses import TrainInfo, create_loss

    name = ckpt.get("loss_name") or config.get("loss")
    if not name:
        raise ValueError(f"{Path(run) / 'best.pt'} names no loss (loss_name) and config.json "
                         f"has no 'loss'")
    loss = create_loss(name, **(ckpt.get("hparams") or config.get("hparams") or {}))
    train = config.get("train", {})
    n, num_classes = observed.shape
    loss.on_train_start(observed, TrainInfo(n, num_classes, config.get("k"),
                                            int(train.get("seed", 0)),
                                            int(train.get("epochs", 1))))
    best = _best_epoch(run)
    if best:
        loss.on_epoch_start(best - 1)
    if ckpt.get("loss") is not None:
        loss.load_state_dict(ckpt["loss"])
    loss.eval()
    return loss, name


def _best_epoch(run) -> int:
    path = Path(run) / "final.json"
    if path.is_file():
        return int(json.loads(path.read_text()).get("best_epoch") or 0)
    return 0


def _source_options(config) -> dict:
    """The dataset options without the feature-cache ones (``backbone``, ``features``)."""
    return {k: v for k, v in (config.get("dataset_options") or {}).items()
            if k not in ("backbone", "features")}


def _observed(run, n_expected: int | None = None) -> np.ndarray:
    z = np.load(run_file(run, "observed.npy"), allow_pickle=False)
    if n_expected is not None and len(z) != n_expected:
        raise ValueError(f"{Path(run) / 'observed.npy'} has {len(z)} rows but the reloaded train "
                         f"split has {n_expected}: the dataset changed since the run")
    return z


def landscape_from_run(run, *, steps: int = 21, span: float = 1.0, seed: int = 0,
                       max_examples: int | None = None, batch_size: int = 256) -> Landscape:
    """The training loss landscape of a run folder.

    The model is rebuilt from ``best.pt`` (:mod:`spmlkit.predict`), the train split reloaded
    from ``config.json`` (dataset, its options, regime; linear runs on a backbone's cached
    features get those features) with the run's observed labels (``observed.npy``). The
    objective is the run's registered loss on the observed train labels, plus its
    ``penalty(model)``, as in training: ``create_loss(loss, **hparams)``, ``on_train_start``,
    ``on_epoch_start(best_epoch - 1)`` and the best epoch's state from ``best.pt`` (ROLE's
    estimator, pseudo-labels), in eval mode.

    Args:
        steps, span, seed: :func:`loss_landscape`'s.
        max_examples: use this many train rows (seeded choice with ``seed``; default: all for
            linear runs, 256 for fine-tuned ones, whose every grid point runs the backbone).
        batch_size: rows per forward pass (the mean over batches is weighted by their sizes).

    Raises:
        FileNotFoundError: missing run files (named).
        ValueError: the reloaded data does not match the run (rows, width).
    """
    import torch

    from ..data import load_splits
    from ..predict import _image_model, _linear_head, load_checkpoint

    ckpt, config = load_checkpoint(run)
    if not config:
        run_file(run, "config.json")  # raises, naming it
    mode = ckpt.get("mode", config.get("mode", "linear"))
    splits = load_splits(config["dataset"], config.get("regime", "1p"),
                         **(config.get("dataset_options") or {} if mode == "linear"
                            else _source_options(config)))
    z_all = _observed(run, len(splits.train))
    rows = np.arange(len(z_all))
    cap = max_examples if max_examples is not None else (None if mode == "linear" else 256)
    if cap is not None and cap < len(rows):
        rows = np.sort(np.random.default_rng(seed).choice(len(rows), int(cap), replace=False))
    z = torch.as_tensor(z_all)
    if mode == "linear":
        model = _linear_head(ckpt)
        x = torch.as_tensor(np.asarray(splits.train.x, np.float32)[rows])
        if x.shape[1] != model.in_features:
            raise ValueError(f"the reloaded train features are {x.shape[1]}-d, the run's head "
                             f"takes {model.in_features}-d: the dataset options changed")
    else:
        from ..data.images import open_image
        from ..data.transforms import eval_transform

        model, size, mean, std = _image_model(ckpt, config)
        t = eval_transform(size, mean, std)
        x = torch.stack([t(open_image(splits.train.x[i])) for i in rows])
    model.eval()
    loss, name = _train_loss(ckpt, config, run, z)
    index = torch.as_tensor(rows)
    zr = z[index]

    def objective(m):
        total = 0.0
        for s in range(0, len(rows), batch_size):
            sl = slice(s, s + batch_size)
            total += float(loss(m(x[sl]), zr[sl], index=index[sl])) * len(index[sl])
        value = total / len(rows)
        extra = loss.penalty(m)
        return value + (float(extra) if torch.is_tensor(extra) else float(extra or 0.0))

    title = (f"Loss landscape of {run_label(run)} ({name}, {mode}; {len(rows)} train rows, "
             f"seed {seed})")
    return loss_landscape(model, objective, steps=steps, span=span, seed=seed, title=title)


# --- 5. image panels ---------------------------------------------------------------------------
@dataclass
class Panel:
    """What :func:`plot_panel` draws for each image."""

    images: list                # RGB PIL images or H x W x 3 uint8 arrays
    items: list                 # names (paths)
    labels: list                # per image: the class names shown as its labels
    probs: np.ndarray           # n x L predicted probabilities
    class_names: list
    label_kind: str = "true"    # "true" or "observed"
    title: str = ""
    true_labels: list | None = None   # per image, the true labels when ``labels`` are not


def top_predictions(probs, class_names, top: int = 3) -> list[list[tuple[str, float]]]:
    """Per row, the ``top`` classes by probability (ties: lower index first).

    >>> top_predictions([[0.1, 0.8, 0.5]], ["a", "b", "c"], 2)
    [[('b', 0.8), ('c', 0.5)]]
    """
    p = np.asarray(probs, dtype=np.float64)
    order = np.argsort(-p, axis=1, kind="stable")[:, :top]
    return [[(class_names[j], float(p[i, j])) for j in row] for i, row in enumerate(order)]


def plot_panel(panel: Panel, out, top: int = 3, ncols: int = 4) -> Path:
    """A grid of images, each with its labels (and its true labels when ``panel.true_labels``
    is given) and its top-``top`` predicted probabilities (green: a true label, red: not;
    without ``true_labels`` the shown labels decide); returns ``out``."""
    n = len(panel.images)
    if n == 0:
        raise ValueError("no image to show")
    if len(panel.labels) != n or len(panel.probs) != n:
        raise ValueError(f"{n} images but {len(panel.labels)} label lists and "
                         f"{len(panel.probs)} probability rows")
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig, axes = _figure((3.0 * ncols, 3.6 * nrows), nrows, ncols)
    tops = top_predictions(panel.probs, panel.class_names, top)
    truth = panel.true_labels if panel.true_labels is not None else panel.labels
    if len(truth) != n:
        raise ValueError(f"{n} images but {len(truth)} true-label lists")
    for ax, img, item, labels, true, preds in zip(axes.ravel(), panel.images, panel.items,
                                                  panel.labels, truth, tops):
        ax.imshow(np.asarray(img))
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(Path(str(item)).name, fontsize="x-small")
        text = f"{panel.label_kind}: {_short(labels)}"
        if panel.true_labels is not None:
            text += f"\ntrue: {_short(true)}"
        ax.set_xlabel(text, fontsize="small")
        for r, (c, p) in enumerate(preds):
            ax.text(0.02, 0.97 - 0.11 * r, f"{c} {p:.2f}", transform=ax.transAxes,
                    fontsize="small", va="top", color="white",
                    bbox={"facecolor": "tab:green" if c in true else "tab:red",
                          "alpha": 0.75, "pad": 1.5, "edgecolor": "none"})
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    fig.suptitle(panel.title or f"Top-{top} predictions ({panel.label_kind} labels below; "
                 f"green: a true label)")
    return save_figure(fig, out)


def _image_split(run, config, split: str):
    """The image paths and full labels of ``split`` of the run's dataset (reloaded without the
    feature cache), checked against ``predictions.npz``."""
    from ..data import load_splits

    splits = load_splits(config["dataset"], config.get("regime", "1p"), **_source_options(config))
    s = getattr(splits, split)
    x = s.x
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        raise ValueError(f"run {run_label(run)} trained on dataset {config['dataset']!r}, which "
                         f"holds feature vectors, not images: image figures need an image "
                         f"source run")
    return list(x), np.asarray(s.y), splits


def panel_from_run(run, split: str = "test", n: int = 8, seed: int = 0) -> Panel:
    """:class:`Panel` of ``n`` images of ``split`` (seeded choice) with the run's best-epoch
    probabilities (``predictions.npz``); labels are the observed positives on ``train``, the
    true labels otherwise. Works for fine-tuned runs and linear runs on a backbone's features
    (the image paths come from reloading the dataset of ``config.json``)."""
    from ..data.images import open_image

    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be train, val or test, got {split!r}")
    config = read_config(run)
    pred = read_predictions(run)
    items, y, splits = _image_split(run, config, split)
    probs = pred[f"probs_{split}"]
    if len(items) != len(probs) or not np.array_equal(y, pred[f"y_{split}"]):
        raise ValueError(f"the reloaded {split} split of {config['dataset']!r} ({len(items)} "
                         f"images) does not match {Path(run) / 'predictions.npz'} "
                         f"({len(probs)} rows): the dataset changed since the run")
    names = list(config.get("class_names") or splits.class_names)
    rows = _pick(len(items), n, seed)
    if split == "train":
        lab = pred["observed"] == POSITIVE
        kind = "observed"
    else:
        lab = y.astype(bool)
        kind = "true"
    true = [[names[j] for j in np.flatnonzero(y[i])] for i in rows]
    return Panel([open_image(items[i]) for i in rows], [items[i] for i in rows],
                 [[names[j] for j in np.flatnonzero(lab[i])] for i in rows], probs[rows], names,
                 kind, f"{run_label(run)}: {split} images, top-k predictions of the best epoch "
                       f"({config.get('loss')}; green: a true label)",
                 true if split == "train" else None)


# --- 6. class activation maps and attention ----------------------------------------------------
def class_activation_maps(fmap, weight) -> np.ndarray:
    """Class activation maps ``CAM_k(h, w) = sum_c W_kc fmap_c(h, w)`` (Zhou et al. 2016).

    For a head ``logits = W mean_hw(fmap) + b`` (global average pooling, then linear) this is
    exact: ``mean_hw(CAM_k) + b_k`` is the logit of class ``k``.

    Args:
        fmap: B x C x H x W (or C x H x W) feature maps.
        weight: L x C head weights.

    Returns:
        B x L x H x W (float64).

    >>> class_activation_maps(np.ones((1, 2, 1, 1)), [[1.0, 2.0], [0.5, 0.0]]).ravel().tolist()
    [3.0, 0.5]
    """
    f = np.asarray(fmap, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    if f.ndim == 3:
        f = f[None]
    if f.ndim != 4 or w.ndim != 2 or w.shape[1] != f.shape[1]:
        raise ValueError(f"fmap must be B x C x H x W and weight L x C with the same C; got "
                         f"{f.shape} and {w.shape}")
    return np.einsum("bchw,lc->blhw", f, w)


def upsample_maps(maps, size) -> np.ndarray:
    """Bilinear upsampling of ``... x h x w`` maps to ``size = (H, W)``."""
    import torch
    import torch.nn.functional as F

    m = np.asarray(maps, dtype=np.float64)
    lead = m.shape[:-2]
    t = torch.from_numpy(m.reshape(-1, 1, *m.shape[-2:]))
    up = F.interpolate(t, size=tuple(int(s) for s in size), mode="bilinear",
                       align_corners=False)
    return up.numpy().reshape(*lead, *up.shape[-2:])


def _to_array(img) -> np.ndarray:
    a = np.asarray(img)
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=2)
    return a


@dataclass
class MapOverlays:
    """Per image, maps of its top classes (what :func:`plot_overlays` draws)."""

    images: list                # n RGB images (PIL or H x W x 3)
    maps: np.ndarray            # n x L x h x w
    probs: np.ndarray           # n x L
    class_names: list
    items: list = field(default_factory=list)
    kind: str = "CAM"
    title: str = ""
    note: str = ""              # e.g. the GAP check of a CAM


def plot_overlays(ov: MapOverlays, out, top: int = 3) -> Path:
    """One row per image: the image, then its ``top`` predicted classes' maps (min-max scaled
    per map, upsampled bilinearly) over it; returns ``out``."""
    n = len(ov.images)
    maps = np.asarray(ov.maps, dtype=np.float64)
    probs = np.asarray(ov.probs, dtype=np.float64)
    if n == 0:
        raise ValueError("no image to show")
    if maps.ndim != 4 or maps.shape[0] != n or probs.shape != maps.shape[:2]:
        raise ValueError(f"maps must be n x L x h x w and probs n x L for {n} images; got "
                         f"{maps.shape} and {probs.shape}")
    if len(ov.class_names) != maps.shape[1]:
        raise ValueError(f"{len(ov.class_names)} class names for {maps.shape[1]} maps per image")
    top = min(int(top), maps.shape[1])
    fig, axes = _figure((2.6 * (top + 1), 2.7 * n), n, top + 1)
    for i in range(n):
        img = _to_array(ov.images[i])
        h, w = img.shape[:2]
        ax = axes[i, 0]
        ax.imshow(img)
        ax.set_title(Path(str(ov.items[i])).name if ov.items else f"image {i}",
                     fontsize="x-small")
        order = np.argsort(-probs[i], kind="stable")[:top]
        up = upsample_maps(maps[i, order], (h, w))
        for r, (k, m) in enumerate(zip(order, up)):
            lo, hi = float(m.min()), float(m.max())
            scaled = (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)
            a = axes[i, r + 1]
            a.imshow(img)
            a.imshow(scaled, cmap="jet", alpha=0.5, vmin=0, vmax=1)
            a.set_title(f"{ov.class_names[k]} p={probs[i, k]:.2f}", fontsize="small")
        for a in axes[i]:
            a.set_xticks([])
            a.set_yticks([])
    fig.suptitle((ov.title or f"{ov.kind} of the top-{top} predicted classes")
                 + (f"\n{ov.note}" if ov.note else ""), fontsize="medium")
    return save_figure(fig, out)


def plot_cam(images, fmap, weight, probs, class_names, out, top: int = 3, items=(),
             title: str = "") -> Path:
    """:func:`class_activation_maps` of ``fmap`` (n x C x h x w) with ``weight`` (L x C), drawn
    over ``images`` for each image's ``top`` classes by ``probs`` (n x L); returns ``out``."""
    return plot_overlays(MapOverlays(list(images), class_activation_maps(fmap, weight), probs,
                                     list(class_names), list(items), "CAM", title), out, top)


def plot_attention(images, maps, probs, class_names, out, top: int = 3, items=(),
                   title: str = "") -> Path:
    """The label-wise model's attention maps (n x L x h x w, e.g.
    ``LabelEmbeddingHead.attention_maps``) over ``images`` for each image's ``top`` classes by
    ``probs``; returns ``out``."""
    return plot_overlays(MapOverlays(list(images), np.asarray(maps), probs, list(class_names),
                                     list(items), "attention", title
                                     or f"Label-wise attention of the top-{top} classes"),
                         out, top)


def _run_images(run, split: str, n: int, seed: int):
    """The run's model input tensors and display images of ``n`` images of ``split``."""
    import torch

    from ..data.images import open_image
    from ..data.transforms import eval_transform

    config = read_config(run)
    items, _, splits = _image_split(run, config, split)
    rows = _pick(len(items), n, seed)
    chosen = [items[i] for i in rows]
    return config, splits, chosen, lambda size, mean, std: (
        torch.stack([eval_transform(size, mean, std)(open_image(p)) for p in chosen]),
        [open_image(p).resize((size, size)) for p in chosen])


def cam_from_run(run, split: str = "test", n: int = 4, seed: int = 0) -> MapOverlays:
    """CAMs of ``n`` images (seeded choice) of a run with a linear head on pooled backbone
    features: fine-tuned runs (``best.pt`` holds the whole model) and linear runs on a
    backbone's cached features (the backbone named in the dataset options is rebuilt, as
    ``spml predict`` does). Probabilities are recomputed from the images; ``note`` reports
    ``max |mean_hw CAM + b - logit|``, 0 up to rounding when the backbone pools by averaging.
    """
    import torch

    from ..predict import _image_model, load_checkpoint

    ckpt, _ = load_checkpoint(run)
    config, splits, chosen, load = _run_images(run, split, n, seed)
    model, size, mean, std = _image_model(ckpt, config)
    model.eval()
    x, shown = load(size, mean, std)
    with torch.no_grad():
        fmap = model.backbone.forward_features(x)
        logits = model(x)
    weight = model.head.weight.detach().numpy()
    maps = class_activation_maps(fmap.numpy(), weight)
    gap = maps.mean(axis=(2, 3)) + model.head.bias.detach().numpy()[None].astype(np.float64)
    err = float(np.abs(gap - logits.numpy()).max())
    names = list(ckpt["class_names"])
    return MapOverlays(shown, maps, torch.sigmoid(logits).numpy(), names, chosen, "CAM",
                       f"Class activation maps, {run_label(run)} ({split})",
                       f"max |mean CAM + bias - logit| = {err:.2g}")


def attention_from_run(run, split: str = "test", n: int = 4, seed: int = 0) -> MapOverlays:
    """Attention maps of ``n`` images (seeded choice) of a LAC run: where each label's query
    looks in the last decoder layer of the label-wise embedding head (LAC Fig. 6), with the
    model's probabilities recomputed from the images.

    Raises:
        ValueError: the run is not a LAC run (use :func:`cam_from_run` for a linear head).
    """
    import torch

    config = read_config(run)
    mode = config.get("mode", "linear")
    if mode != "lac":
        raise ValueError(f"run {run_label(run)} is a {mode} run: attention maps exist only for "
                         f"LAC runs (mode lac, label-wise embedding head); use `spml figure "
                         f"cam` for a linear head")
    from ..methods.lac import load_lac_model

    model, info = load_lac_model(run)
    _, _, chosen, load = _run_images(run, split, n, seed)
    x, shown = load(int(info["image_size"]), info["mean"], info["std"])
    with torch.no_grad():
        maps = model.attention_maps(x)
        probs = torch.sigmoid(model(x))
    return MapOverlays(shown, maps.numpy(), probs.numpy(), list(info["class_names"]), chosen,
                       "attention", f"Label-wise attention maps, {run_label(run)} ({split})",
                       f"best epoch {info['best_epoch']} (stage {info['best_stage']}, "
                       f"{info['best_source']})")
