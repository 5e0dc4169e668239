"""Sensitivity sweeps of a study: the selected metric (mean +- std over seeds) against a reported
(``vary``) axis, one line per method (LAC Figs. 3-5, Zhou Fig. 3a, Cole Fig. 1).

The numbers come from `sweep_points` on selected rows; `sweep_from_study` takes them
from a study folder through
[`spmlkit.experiments.study.open_study`][spmlkit.experiments.study.open_study], the one reader of
study folders (the current spec's runs only, as ``spml study table`` and ``spml report``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...analysis import format_table
from ..study import open_study
from ..tables import row_variant
from .plotting import new_figure, save_figure


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


#: ``sweep_points(..., x=TRAIN_LABELS)``: each point at its runs' number of observed training
#: labels (Cole et al. Fig. 1's x axis) instead of the axis value
TRAIN_LABELS = "train_labels"


#: ``sweep_points(..., x=K_VALUE)``: each point at the k its runs trained with (an
#: ``interval:`` / ``estimate:`` / ``true`` k resolved, `spmlkit.methods.resolve_k`; Cole
#: et al. Fig. A1 plots mAP against k)
K_VALUE = "k_value"
#: the x axis label of a `TRAIN_LABELS` sweep
TRAIN_LABELS_XLABEL = "number of observed training labels (log scale)"


def default_x(axis: str) -> str | None:
    """The x a sweep of ``axis`` is drawn against by default: `TRAIN_LABELS` for
    ``data.subsample`` (Cole et al. Fig. 1: mAP against the number of training labels),
    `K_VALUE` for ``k`` (Fig. A1: mAP against the value of k), else the axis value
    (None)."""
    return {"data.subsample": TRAIN_LABELS, "k": K_VALUE}.get(axis)


def x_layout(x: str | None) -> tuple:
    """``(logx, xlabel)`` of a sweep drawn against ``x`` (`sweep_points`): a log axis
    of training labels, k's value, or the defaults (``None, None``)."""
    if x == TRAIN_LABELS:
        return True, TRAIN_LABELS_XLABEL
    if x == K_VALUE:
        return None, "k (expected positives per example)"
    return None, None


def metric_label(metric: str) -> str:
    """How an axis names a results column: ``test_map`` -> ``test mAP``."""
    words = metric.replace(".", " ").replace("_", " ").split()
    return " ".join("mAP" if w.lower() == "map" else w for w in words)


def _row_splits(row):
    from ..pool import cached_splits

    config = row.get("config")
    config = json.loads(config) if isinstance(config, str) else config
    if not isinstance(config, dict) or "dataset" not in config:
        raise ValueError(f"run {row.get('run_id')}: its row has no config naming its dataset")
    return config, cached_splits(config["dataset"], config.get("regime") or row.get("regime"),
                                 config.get("dataset_options") or {})


def resolved_k(row) -> float:
    """The k a study row's run trained with (its ``k`` resolved on its splits and seed)."""
    from ...methods import resolve_k

    config, splits = _row_splits(row)
    k = resolve_k(config.get("k"), splits, int(row.get("seed") or 0))
    return float(splits.k if k is None else k)


def train_label_count(row) -> int:
    """The number of observed training labels of a study row's run (Cole et al. Fig. 1's x):
    ``splits.meta["observed_labels"]`` of the splits its ``config`` names (dataset, options,
    regime): kept train rows x L for full labels, one a row for a single positive.

    Raises:
        ValueError: the row has no ``config`` (a row of an older store).
    """
    return int(_row_splits(row)[1].meta["observed_labels"])


def sweep_points(rows, axis: str, metric: str = "test_map",
                 x: str | None = None) -> list[SweepLine]:
    """Group selected study rows by (dataset, method, other vary keys) and axis value.

    Args:
        rows: dicts with ``method``, ``dataset``, ``seed``, ``variant`` (JSON of the vary
            assignment, e.g. ``{"hparams.alpha": 0.1}``) and ``metric``: what
            ``StudyStore.selected()`` returns. Rows whose status is not ``done`` are skipped.
        axis: a vary key (``hparams.alpha``, ``data.subsample``, ``k``, ``regime``).
        metric: the row column on the y axis.
        x: ``None`` (the axis value), `TRAIN_LABELS`: the point of each axis value is
            drawn at its runs' number of observed training labels (`train_label_count`;
            Cole et al. Fig. 1 plots mAP against it on a log axis), or `K_VALUE`: at the
            k the runs trained with (`resolved_k`).

    Returns:
        one `SweepLine` per (dataset, method, other keys): x sorted (numerically when
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
            value_x = _axis_value(r, variant, axis)
        except KeyError:
            if axis in r and axis in ("regime", "dataset", "seed", "mode"):
                value_x = r[axis]
            else:
                refs.setdefault((r["dataset"], r["method"]), []).append(float(value))
                continue
        any_axis = True
        if x == TRAIN_LABELS:
            value_x = float(train_label_count(r))
        elif x == K_VALUE:
            value_x = round(resolved_k(r), 6)
        elif x is not None:
            raise ValueError(f"x must be None, {TRAIN_LABELS!r} or {K_VALUE!r}, got {x!r}")
        others = {k: v for k, v in variant.items() if k != axis}
        label = r["method"] + (" (" + ", ".join(f"{k}={v}" for k, v in sorted(others.items()))
                               + ")" if others else "")
        key = (r["dataset"], r["method"], label)
        groups.setdefault(key, {}).setdefault(json.dumps(value_x, sort_keys=True, default=str),
                                              (value_x, []))[1].append(float(value))
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
    """A plain-text table of `sweep_points`' lines (one row per point)."""
    rows = []
    for ln in lines:
        xs = ln.x if not ln.reference else ["(all)"]
        rows += [[ln.dataset, ln.label, str(x), float(m), float(s), int(n)]
                 for x, m, s, n in zip(xs, ln.mean, ln.std, ln.n)]
    return format_table(["dataset", "method", axis, f"{metric} mean", "std", "seeds"], rows)


def plot_sweep(lines, axis: str, out, metric: str = "test_map", title: str | None = None,
               logx: bool | None = None, *, xlabel: str | None = None,
               force: bool = False) -> Path:
    """Mean +- std (band) of ``metric`` against ``axis``, one line per method, one panel per
    dataset; reference methods as dashed flat lines. ``logx`` (default: automatic) uses a log
    axis when every x is positive and they span a factor >= 100; ``xlabel`` names the x axis
    (default ``axis``). Returns the path written (``force``: replace ``out`` if it exists,
    else the next free name is taken). `draw_sweep` draws it."""
    fig = draw_sweep(lines, axis, metric, title, logx, xlabel=xlabel)
    return save_figure(fig, out, force=force)


def draw_sweep(lines, axis: str, metric: str = "test_map", title: str | None = None,
               logx: bool | None = None, *, xlabel: str | None = None):
    """The matplotlib Figure `plot_sweep` writes."""
    lines = list(lines)
    if not lines:
        raise ValueError("no sweep line to plot")
    datasets = sorted({ln.dataset for ln in lines})
    fig, axes = new_figure((5.5 * len(datasets), 4.2), 1, len(datasets))
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
        ax.set(xlabel=xlabel or axis, ylabel=f"{metric_label(metric)} (mean ± std over seeds)",
               title=ds)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title or f"Sensitivity to {axis}")
    return fig


def sweep_from_study(study_dir, axis: str, metric: str = "test_map",
                     x: str | None = None) -> tuple[list, str]:
    """`sweep_points` of a study folder's selected rows (the current spec's runs, read by
    [`spmlkit.experiments.study.open_study`][spmlkit.experiments.study.open_study]; ``x`` as there),
    and a title (the study's title).

    Raises:
        FileNotFoundError: no study folder, ``study.yaml`` or ``results.sqlite`` (named).
        ValueError: no finished run, or ``axis`` is not one of the study's vary axes.
    """
    study = open_study(study_dir)
    if not study.has_results:
        raise FileNotFoundError(f"{study.results_path} is missing: the study has not run yet "
                                f"(`spml study run` writes it)")
    if x is not None:
        return sweep_points(study.selected, axis, metric, x), study.title
    return sweep_points(study.selected, axis, metric), f"{study.title}: sensitivity to {axis}"
