"""Figures of a run's images: panels of images with their labels and top predictions (Zhou
Fig. 6), class activation maps ``CAM_k = sum_c W_kc fmap_c`` (Zhou et al. 2016; OPML Fig. 7) and
a LAC model's label-wise attention maps (LAC Fig. 6).

Models come from the run folder through
[`spmlkit.methods.load_run_model`][spmlkit.methods.load_run_model]; the images from reloading the
run's dataset (``config.json``) without its feature cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...analysis import run_label
from ...labels import POSITIVE
from ...runs import read_config, read_predictions
from .plotting import new_figure, pick_rows, save_figure, short_list, source_options


@dataclass
class Panel:
    """What `plot_panel` draws for each image."""

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


def plot_panel(panel: Panel, out, top: int = 3, ncols: int = 4, *, force: bool = False) -> Path:
    """A grid of images, each with its labels (and its true labels when ``panel.true_labels``
    is given) and its top-``top`` predicted probabilities (green: a true label, red: not;
    without ``true_labels`` the shown labels decide); returns the path written."""
    n = len(panel.images)
    if n == 0:
        raise ValueError("no image to show")
    if len(panel.labels) != n or len(panel.probs) != n:
        raise ValueError(f"{n} images but {len(panel.labels)} label lists and "
                         f"{len(panel.probs)} probability rows")
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig, axes = new_figure((3.0 * ncols, 3.6 * nrows), nrows, ncols)
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
        text = f"{panel.label_kind}: {short_list(labels)}"
        if panel.true_labels is not None:
            text += f"\ntrue: {short_list(true)}"
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
    return save_figure(fig, out, force=force)


def _image_split(run, config, split: str):
    """The image paths and full labels of ``split`` of the run's dataset (reloaded without the
    feature cache), checked against ``predictions.npz``."""
    from ...loading import load_splits

    splits = load_splits(config.get("source", config["dataset"]), config.get("regime", "1p"),
                         **source_options(config))
    s = getattr(splits, split)
    x = s.x
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        raise ValueError(f"run {run_label(run)} trained on dataset {config['dataset']!r}, which "
                         f"holds feature vectors, not images: image figures need an image "
                         f"source run")
    return list(x), np.asarray(s.y), splits


def panel_from_run(run, split: str = "test", n: int = 8, seed: int = 0) -> Panel:
    """`Panel` of ``n`` images of ``split`` (seeded choice) with the run's best-epoch
    probabilities (``predictions.npz``); labels are the observed positives on ``train``, the
    true labels otherwise. Works for fine-tuned runs and linear runs on a backbone's features
    (the image paths come from reloading the dataset of ``config.json``)."""
    from ...data.image_files import open_image

    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be train, val or test, got {split!r}")
    config = read_config(run)
    pred = read_predictions(run, (split,))
    items, y, splits = _image_split(run, config, split)
    probs = pred[f"probs_{split}"]
    if len(items) != len(probs) or not np.array_equal(y, pred[f"y_{split}"]):
        raise ValueError(f"the reloaded {split} split of {config['dataset']!r} ({len(items)} "
                         f"images) does not match {Path(run) / 'predictions.npz'} "
                         f"({len(probs)} rows): the dataset changed since the run")
    names = list(config.get("class_names") or splits.class_names)
    rows = pick_rows(len(items), n, seed)
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
    """Per image, maps of its top classes (what `plot_overlays` draws)."""

    images: list                # n RGB images (PIL or H x W x 3)
    maps: np.ndarray            # n x L x h x w
    probs: np.ndarray           # n x L
    class_names: list
    items: list = field(default_factory=list)
    kind: str = "CAM"
    title: str = ""
    note: str = ""              # e.g. the GAP check of a CAM
    true_labels: list | None = None   # per image, its true class names (shown under it)


def plot_overlays(ov: MapOverlays, out, top: int = 3, *, force: bool = False) -> Path:
    """One row per image: the image (with its true labels under it when ``ov.true_labels`` is
    given), then its ``top`` predicted classes' maps (min-max scaled per map, upsampled
    bilinearly) over it, each titled green when the class is a true label, red when not;
    returns the path written."""
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
    fig, axes = new_figure((2.6 * (top + 1), 2.7 * n), n, top + 1)
    for i in range(n):
        img = _to_array(ov.images[i])
        h, w = img.shape[:2]
        ax = axes[i, 0]
        ax.imshow(img)
        ax.set_title(Path(str(ov.items[i])).name if ov.items else f"image {i}",
                     fontsize="x-small")
        truth = set(ov.true_labels[i]) if ov.true_labels is not None else None
        if truth is not None:
            ax.set_xlabel("true: " + (short_list(sorted(truth))), fontsize="x-small")
        order = np.argsort(-probs[i], kind="stable")[:top]
        up = upsample_maps(maps[i, order], (h, w))
        for r, (k, m) in enumerate(zip(order, up)):
            lo, hi = float(m.min()), float(m.max())
            scaled = (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)
            a = axes[i, r + 1]
            a.imshow(img)
            a.imshow(scaled, cmap="jet", alpha=0.5, vmin=0, vmax=1)
            a.set_title(f"{ov.class_names[k]} p={probs[i, k]:.2f}", fontsize="small",
                        color="black" if truth is None else "green" if ov.class_names[k] in truth
                        else "red")
        for a in axes[i]:
            a.set_xticks([])
            a.set_yticks([])
    fig.suptitle((ov.title or f"{ov.kind} of the top-{top} predicted classes")
                 + ("; under each image its true labels, a predicted class in green when true, "
                    "red when not" if ov.true_labels is not None else "")
                 + (f"\n{ov.note}" if ov.note else ""), fontsize="medium")
    return save_figure(fig, out, force=force)


def plot_cam(images, fmap, weight, probs, class_names, out, top: int = 3, items=(),
             title: str = "", *, force: bool = False) -> Path:
    """`class_activation_maps` of ``fmap`` (n x C x h x w) with ``weight`` (L x C), drawn
    over ``images`` for each image's ``top`` classes by ``probs`` (n x L); returns the path
    written."""
    return plot_overlays(MapOverlays(list(images), class_activation_maps(fmap, weight), probs,
                                     list(class_names), list(items), "CAM", title), out, top,
                         force=force)


def plot_attention(images, maps, probs, class_names, out, top: int = 3, items=(),
                   title: str = "", *, force: bool = False) -> Path:
    """The label-wise model's attention maps (n x L x h x w, e.g.
    ``LabelEmbeddingHead.attention_maps``) over ``images`` for each image's ``top`` classes by
    ``probs``; returns the path written."""
    return plot_overlays(MapOverlays(list(images), np.asarray(maps), probs, list(class_names),
                                     list(items), "attention", title
                                     or f"Label-wise attention of the top-{top} classes"),
                         out, top, force=force)


def _run_images(run, split: str, n: int, seed: int):
    """``(paths, true, load)`` of ``n`` images of ``split`` (seeded choice): ``true`` their true
    class names, ``load(size, mean, std)`` the model's input tensor and the images to
    display."""
    import torch

    from ...data.image_files import open_image
    from ...data.transforms import eval_transform

    config = read_config(run)
    items, y, splits = _image_split(run, config, split)
    rows = pick_rows(len(items), n, seed)
    names = list(splits.class_names)
    true = [[names[j] for j in np.flatnonzero(y[i])] for i in rows]
    chosen = [items[i] for i in rows]
    return chosen, true, lambda size, mean, std: (
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

    from ...methods import load_run_model
    from ...models.heads import BoostLUHead, boostlu

    mode = read_config(run).get("mode", "linear")
    if mode == "lac":
        raise ValueError(f"run {run_label(run)} is a LAC run: its label-wise embedding head has "
                         f"no linear classifier to weight the feature map with, so it has no "
                         f"class activation map; draw where each label's query looks with "
                         f"`spml figure attention {run}`")
    if mode == "mime":
        raise ValueError(f"run {run_label(run)} is a MIME run: its label-wise embedding head "
                         f"(LAC's, with a Gaussian bottleneck per label) has no linear "
                         f"classifier to weight the feature map with, so it has no class "
                         f"activation map (`spml figure panel {run}` shows its predictions)")
    model, info = load_run_model(run)
    if info["inputs"] != "images":
        raise ValueError(f"run {run_label(run)} is a linear run on feature vectors: class "
                         f"activation maps need an image model (a fine-tuned run, or a linear "
                         f"run on a backbone's features of an image source)")
    chosen, true, load = _run_images(run, split, n, seed)
    x, shown = load(info["image_size"], info["mean"], info["std"])
    with torch.no_grad():
        fmap = model.backbone.forward_features(x)
        logits = model(x)
    names = list(info["class_names"])
    if isinstance(model.head, BoostLUHead):  # the map whose spatial mean is the logit
        model.eval()
        alpha = model.head.current_alpha
        with torch.no_grad():
            maps = boostlu(model.head.cam(fmap), alpha).double().numpy()
        err = float(np.abs(maps.mean(axis=(2, 3)) - logits.numpy()).max())
        return MapOverlays(shown, maps, torch.sigmoid(logits).numpy(), names, chosen,
                           "BoostLU CAM", f"BoostLU class activation maps (alpha {alpha:g}), "
                           f"{run_label(run)} ({split})",
                           f"check: each logit is its map's mean (the CAM, bias included, with "
                           f"positive cells x {alpha:g}); largest difference {err:.2g}", true)
    weight = model.head.weight.detach().numpy()
    maps = class_activation_maps(fmap.numpy(), weight)
    gap = maps.mean(axis=(2, 3)) + model.head.bias.detach().numpy()[None].astype(np.float64)
    err = float(np.abs(gap - logits.numpy()).max())
    return MapOverlays(shown, maps, torch.sigmoid(logits).numpy(), names, chosen, "CAM",
                       f"Class activation maps, {run_label(run)} ({split})",
                       f"check: each logit is its CAM's mean plus the bias (average-pooling "
                       f"backbones); largest difference {err:.2g}", true)


def attention_from_run(run, split: str = "test", n: int = 4, seed: int = 0) -> MapOverlays:
    """Attention maps of ``n`` images (seeded choice) of a LAC run: where each label's query
    looks in the last decoder layer of the label-wise embedding head (LAC Fig. 6), with the
    model's probabilities recomputed from the images.

    Raises:
        ValueError: the run is not a LAC run (use `cam_from_run` for a linear head).
    """
    import torch

    config = read_config(run)
    mode = config.get("mode", "linear")
    if mode != "lac":
        raise ValueError(f"run {run_label(run)} is a {mode} run: attention maps exist only for "
                         f"LAC runs (mode lac, label-wise embedding head); `spml figure cam` "
                         f"draws the class activation maps of a run whose head is linear on "
                         f"the backbone's features (finetune, linear_init, boostlu)")
    from ...methods import load_run_model

    model, info = load_run_model(run)
    best = info["checkpoint"]  # best.pt's record: the epoch, stage and weights it kept
    chosen, true, load = _run_images(run, split, n, seed)
    x, shown = load(int(info["image_size"]), info["mean"], info["std"])
    with torch.no_grad():
        maps = model.attention_maps(x)
        probs = torch.sigmoid(model(x))
    return MapOverlays(shown, maps.numpy(), probs.numpy(), list(info["class_names"]), chosen,
                       "attention", f"Label-wise attention maps, {run_label(run)} ({split})",
                       f"best epoch {best['best_epoch']} (stage {best['best_stage']}, "
                       f"{best['best_source']})", true)
