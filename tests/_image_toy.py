"""Tiny synthetic multi-label image sets for the fine-tuning, distributed and predict tests.

Each 16 x 16 PNG has a noisy grey background; class j present = a coloured 6 x 6 patch in its
own corner (red top-left, green bottom-right, blue top-right). Every image has a positive.
"""
from __future__ import annotations

import numpy as np
import torch

COLOURS = [(230, 30, 30), (30, 230, 30), (30, 30, 230)]
CORNERS = [(1, 1), (9, 9), (1, 9)]  # (row, col) of each class's patch


def make_images(folder, n: int, seed: int = 0, size: int = 16, prefix: str = "img"):
    """Write ``n`` images into ``folder``; return (absolute paths, N x 3 uint8 labels)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    y = (rng.random((n, 3)) < 0.45).astype(np.uint8)
    y[y.sum(1) == 0, rng.integers(0, 3)] = 1
    paths = []
    for i in range(n):
        arr = rng.integers(90, 160, size=(size, size, 3)).astype(np.uint8)
        for j in np.flatnonzero(y[i]):
            r, c = CORNERS[j]
            arr[r:r + 6, c:c + 6] = COLOURS[j]
        path = folder / f"{prefix}{i:03d}.png"
        Image.fromarray(arr).save(path)
        paths.append(str(path))
    return paths, y


def tiny_model(seed: int = 0, num_classes: int = 3):
    """tiny_cnn backbone (16 x 16 inputs, 8 features, no BatchNorm) + linear head."""
    from spmlkit.models.backbones import create_backbone
    from spmlkit.models.heads import ImageClassifier

    backbone = create_backbone("tiny_cnn", pretrained=False, seed=seed, width=4, num_features=8,
                               input_size=16)
    return ImageClassifier(backbone, num_classes, seed=seed)


def state_close(a: dict, b: dict) -> float:
    """Max absolute difference between two state dicts of the same keys."""
    assert a.keys() == b.keys()
    return max([float((a[k].float() - b[k].float()).abs().max()) if a[k].numel() else 0.0
                for k in a], default=0.0)


def torch_threads(n: int = 1) -> None:
    torch.set_num_threads(n)


def toy_splits(root, sizes=(24, 12, 12)):
    """Train / val / test splits of toy images written under ``root`` (classes red, green,
    blue), single positives drawn with the official seed: the image methods' tiny runs."""
    from spmlkit.data import LabelledSet, Splits
    from spmlkit.labels import make_observed

    names = ["red", "green", "blue"]
    parts = []
    for seed, (split, n) in enumerate(zip(("train", "val", "test"), sizes)):
        paths, y = make_images(root / split, n, seed=seed)
        parts.append(LabelledSet(paths, y, names, None, f"toy {split}"))
    tr, va, te = parts
    return Splits("toy", tr, va, te, make_observed(tr.y, "1p"), make_observed(va.y, "1p"), "1p",
                  float(tr.y.sum(1).mean()))
