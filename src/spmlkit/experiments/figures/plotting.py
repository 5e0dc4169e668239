"""Shared plotting: one way to make a figure, one way to write it.

Figures use matplotlib's object-oriented API on the Agg canvas (no pyplot, no global backend
switch); matplotlib is imported only when a figure is drawn. `save_figure` writes PNG, or
SVG for a ``.svg`` path, atomically and never over an existing file unless ``force``
(`spmlkit.safe_write.write_output`: an existing ``curves.png`` is an error).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...safe_write import write_output

FIGURE_SUFFIXES = (".png", ".svg")
#: the run-folder (or study-folder) subfolder the CLI writes figures into when no ``--out`` is
#: given
FIGURES_DIR = "figures"


def new_figure(figsize, nrows: int = 1, ncols: int = 1, **kw):
    """A matplotlib Figure on an Agg canvas and its ``nrows x ncols`` axes (always 2-D)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        from ...extras import install_hint

        raise ModuleNotFoundError("figures need matplotlib: " +
                                  install_hint("plots", "matplotlib")) from err
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def new_canvas(figsize):
    """A matplotlib Figure on an Agg canvas, without axes (for 3-D or mixed layouts)."""
    fig, axes = new_figure(figsize)
    fig.delaxes(axes[0, 0])
    return fig


def save_figure(fig, out, *, force: bool = False) -> Path:
    """Write ``fig`` to ``out`` (PNG, or SVG for a ``.svg`` path) atomically; returns ``out``;
    an existing ``out`` is an error unless ``force`` (`spmlkit.safe_write.write_output`)."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in FIGURE_SUFFIXES:
        raise ValueError(f"figures are PNG or SVG files: give an output path ending in .png or "
                         f".svg, got {out}")
    fmt = suffix[1:]
    from matplotlib.text import Text

    for text in fig.findobj(Text):  # names from files ("$x$") drawn as written, not as math
        text.set_parse_math(False)
    return write_output(out, lambda fh: fig.savefig(fh, format=fmt, dpi=120,
                                                    bbox_inches="tight"), force=force)


def integer_epochs(*axes) -> None:
    """Integer ticks on the x axes (epochs) and a light grid."""
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)


def pick_rows(count: int, n: int, seed: int) -> np.ndarray:
    """``min(n, count)`` sorted row indices drawn without replacement with ``seed``."""
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a whole number >= 1, got {n}")
    if count < 1:
        raise ValueError("the split has no example to show")
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(count, size=min(int(n), count), replace=False))


def short_list(names, limit: int = 4) -> str:
    """Up to ``limit`` names, comma-separated, then ``+N`` for the rest (``-`` for none)."""
    names = list(names)
    text = ", ".join(names[:limit]) + (f" +{len(names) - limit}" if len(names) > limit else "")
    return text or "-"


def source_options(config) -> dict:
    """A run's dataset options (``config.json``) without the feature-cache ones (``backbone``,
    ``features``): the options that reload its images."""
    return {k: v for k, v in (config.get("dataset_options") or {}).items()
            if k not in ("backbone", "features")}
