"""The training loss around a run's trained weights: the plane ``theta + a d1 + b d2`` of two
filter-normalised random directions (Li et al. 2018; Zhou Fig. 5a-b)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...analysis import run_label
from ...runs import OBSERVED_FILE, load_array, run_file
from .plotting import new_canvas, save_figure, source_options


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
    ``linspace(-span, span, steps)``; ``d1``, ``d2`` from `filter_normalized_direction`
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

    if int(steps) != steps or not 2 <= steps <= 1001:  # steps^2 loss evaluations
        raise ValueError(f"steps must be a whole number in [2, 1001] (steps^2 loss "
                         f"evaluations), got {steps}")
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


def plot_landscape(ls: Landscape, out, *, force: bool = False) -> Path:
    """Contour map (left, the trained weights marked) and surface (right); returns the path
    written."""
    fig = new_canvas((11, 4.6))
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
    return save_figure(fig, out, force=force)


def _train_loss(ckpt, config, run, observed):
    """The run's loss with its best-epoch state (see `landscape_from_run`)."""
    from ...losses import TrainInfo, create_loss

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


def _observed(run, n_expected: int | None = None) -> np.ndarray:
    z = load_array(run_file(run, OBSERVED_FILE))
    if n_expected is not None and len(z) != n_expected:
        raise ValueError(f"{Path(run) / 'observed.npy'} has {len(z)} rows but the reloaded train "
                         f"split has {n_expected}: the dataset changed since the run")
    return z


def landscape_from_run(run, *, steps: int = 21, span: float = 1.0, seed: int = 0,
                       max_examples: int | None = None, batch_size: int = 256) -> Landscape:
    """The training loss landscape of a run folder.

    The model is rebuilt from ``best.pt`` (`spmlkit.predict`), the train split reloaded
    from ``config.json`` (dataset, its options, regime; linear runs on a backbone's cached
    features get those features) with the run's observed labels (``observed.npy``). The
    objective is the run's registered loss on the observed train labels, plus its
    ``penalty(model)``, as in training: ``create_loss(loss, **hparams)``, ``on_train_start``,
    ``on_epoch_start(best_epoch - 1)`` and the best epoch's state from ``best.pt`` (ROLE's
    estimator, pseudo-labels), in eval mode.

    Args:
        steps, span, seed: `loss_landscape`'s.
        max_examples: use this many train rows (seeded choice with ``seed``; default: all for
            linear runs, 256 for fine-tuned ones, whose every grid point runs the backbone).
        batch_size: rows per forward pass (the mean over batches is weighted by their sizes).

    Raises:
        FileNotFoundError: missing run files (named).
        ValueError: the reloaded data does not match the run (rows, width).
    """
    import torch

    from ...loading import load_splits
    from ...methods import load_run_model
    from ...runs import read_run

    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples (--max-examples) must be >= 1, got {max_examples}")
    found = read_run(run)
    ckpt, config = found.best(), found.config
    mode = ckpt.get("mode", config.get("mode", "linear"))
    splits = load_splits(config.get("source", config["dataset"]), config.get("regime", "1p"),
                         **(config.get("dataset_options") or {} if mode == "linear"
                            else source_options(config)))
    z_all = _observed(run, len(splits.train))
    rows = np.arange(len(z_all))
    cap = max_examples if max_examples is not None else (None if mode == "linear" else 256)
    if cap is not None and cap < len(rows):
        rows = np.sort(np.random.default_rng(seed).choice(len(rows), int(cap), replace=False))
    z = torch.as_tensor(z_all)
    if mode == "linear":  # the head on the cached features the run trained on
        weight = ckpt["model"]["weight"]
        model = torch.nn.Linear(weight.shape[1], weight.shape[0])
        model.load_state_dict(ckpt["model"])
        x = torch.as_tensor(np.asarray(splits.train.x, np.float32)[rows])
        if x.shape[1] != model.in_features:
            raise ValueError(f"the reloaded train features are {x.shape[1]}-d, the run's head "
                             f"takes {model.in_features}-d: the dataset options changed")
    else:
        from ...data.image_files import open_image
        from ...data.transforms import eval_transform

        model, info = load_run_model(run)
        t = eval_transform(info["image_size"], info["mean"], info["std"])
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
