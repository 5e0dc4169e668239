"""A dataset folder of Cole et al. as images (``cole_images``): the official formatted lists
``formatted_{train,val}_{images,labels}.npy`` (with ``formatted_train_labels_obs.npy``, the
shipped single-positive draw) and the images they name; the image counterpart of the ``cole``
feature source (`spmlkit.data.cole`), same files and conventions.
`load_formatted` also serves the ``nuswide`` source (`spmlkit.data.nuswide`).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..labels import validate_full_labels
from .protocol import Dataset
from .arrays import load_matrix
from .cole import cole_class_names, observed_file, read_observed
from .image_common import COLE, TAGS, image_dataset, join_paths
from .image_files import listing
from .registry import register

__all__ = ["COLE_IMAGE_ROOTS", "FORMATTED", "load_cole_images", "load_formatted"]


#: Where the official ``datasets.py`` looks for each dataset's images, relative to the folder.
COLE_IMAGE_ROOTS = {
    "pascal": ("VOCdevkit/VOC2012/JPEGImages",),
    "voc": ("VOCdevkit/VOC2012/JPEGImages",),
    "coco": (".",),
    "nuswide": ("Flickr",),
    "nus": ("Flickr",),
    "cub": ("CUB_200_2011/CUB_200_2011/images", "CUB_200_2011/images", "images"),
}
FORMATTED = ("formatted_train_labels.npy", "formatted_val_labels.npy",
             "formatted_train_images.npy", "formatted_val_images.npy")


def _formatted_phase(root: Path, phase: str):
    labels_path = root / f"formatted_{phase}_labels.npy"
    images_path = root / f"formatted_{phase}_images.npy"
    y = validate_full_labels(load_matrix(labels_path, what="labels"), str(labels_path))
    images = load_matrix(images_path, what="image list")
    if images.ndim != 1 or images.dtype.kind not in "US":
        raise ValueError(f"{images_path}: expected a 1-D array of image paths (strings), got "
                         f"dtype {images.dtype} and shape {images.shape}")
    if len(images) != len(y):
        raise ValueError(f"{images_path} lists {len(images)} images but {labels_path.name} has "
                         f"{len(y)} label rows; they must describe the same images in order")
    ids = [s.decode() if isinstance(s, bytes) else str(s) for s in images.tolist()]
    return ids, y


def _image_root(root: Path, name: str, ids: list[str], image_root) -> Path:
    if image_root is not None:
        base = Path(image_root)
        return base if base.is_absolute() else root / base
    named = COLE_IMAGE_ROOTS.get(name.lower(), ())
    others = [c for roots in COLE_IMAGE_ROOTS.values() for c in roots if c not in named]
    candidates = list(dict.fromkeys([*named, *others, "images"]))
    probe = ids[:20]
    for cand in candidates:
        base = root / cand
        if base.is_dir() and any((base / i).is_file() for i in probe):
            return base
    tried = ", ".join(str(root / c) for c in candidates)
    raise FileNotFoundError(f"{root}: none of the first listed images (e.g. {ids[0]}) exists "
                            f"under {tried}; pass image_root= (the folder the paths in "
                            f"formatted_train_images.npy are relative to)")


def load_formatted(root, name: str, image_root, observed, class_names, drop_empty: bool,
                   skip_missing: bool, skip_corrupt: bool, source: str) -> Dataset:
    """The formatted lists in ``root`` with their images, as the ``source`` (``cole_images``
    or ``nuswide``) reads them; arguments as `load_cole_images`."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{source}: data folder {root} does not exist; expected a folder "
                                f"holding {', '.join(FORMATTED)} and the images")
    missing = [f for f in FORMATTED if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{root}: missing {', '.join(missing)}; the {source} source reads "
                                f"the formatted lists {', '.join(FORMATTED)} (optionally "
                                f"formatted_train_labels_obs.npy, class_names.txt) ("
                                f"{listing(root)})")
    ids, y = _formatted_phase(root, "train")
    ids_t, yt = _formatted_phase(root, "val")
    if not ids or not ids_t:
        raise ValueError(f"{root}: formatted_{'train' if not ids else 'val'}_images.npy lists no "
                         f"image")
    if yt.shape[1] != y.shape[1]:
        raise ValueError(f"{root}: formatted_val_labels.npy has {yt.shape[1]} classes but "
                         f"formatted_train_labels.npy has {y.shape[1]}")
    obs_path = observed_file(root, observed)
    z = None if obs_path is None else read_observed(obs_path, y, root /
                                                    "formatted_train_labels.npy")
    classes, names_from = cole_class_names(root, name, y.shape[1], class_names)
    if not classes:
        classes = [f"class{j}" for j in range(y.shape[1])]
    base = _image_root(root, name, ids, image_root)
    empty = {"pool": int((y.sum(axis=1) == 0).sum()), "test": int((yt.sum(axis=1) == 0).sum())}
    if drop_empty:
        keep, keep_t = np.flatnonzero(y.sum(axis=1) > 0), np.flatnonzero(yt.sum(axis=1) > 0)
        ids, y = [ids[i] for i in keep], y[keep]
        z = None if z is None else z[keep]
        ids_t, yt = [ids_t[i] for i in keep_t], yt[keep_t]
    meta = {"source": source, "root": str(root), "image_root": str(base),
            "observed_file": None if obs_path is None else obs_path.name,
            "class_names_from": names_from, "rows_without_positive": empty,
            "drop_empty": bool(drop_empty)}
    if drop_empty and empty["pool"]:
        meta["official_split"] = False
    return image_dataset(name, (join_paths(base, ids), ids, y),
                         (join_paths(base, ids_t), ids_t, yt), classes,
                         skip_missing=skip_missing, skip_corrupt=skip_corrupt, meta=meta,
                         pool_observed=z)


@register("cole_images", "a Cole et al. dataset folder as images: formatted_{train,val}_"
          "{images,labels}.npy (+ the shipped observed labels) and the dataset's images",
          paper=COLE, tags=TAGS)
def load_cole_images(root: str | os.PathLike, name: str | None = None,
                     image_root: str | os.PathLike | None = None,
                     observed: str | None = "uniform", class_names=None,
                     drop_empty: bool = False, skip_missing: bool = False,
                     skip_corrupt: bool = False) -> Dataset:
    """The official formatted lists of Cole et al. with the images they name (the image
    counterpart of the ``cole`` feature source, same files and conventions).

    Args:
        root: one dataset folder of the official repository's ``data/`` (``data/pascal``,
            ``data/coco``, ``data/nuswide``, ``data/cub``).
        name: the dataset (default: the folder's name); picks the official class names
            (``pascal``, ``coco``) and where the images are.
        image_root: the folder the listed paths are relative to (a relative ``image_root`` is
            taken relative to ``root``). Default: where the official
            ``datasets.py`` looks (``VOCdevkit/VOC2012/JPEGImages`` for pascal, the folder itself
            for coco, ``Flickr`` for nuswide, ``CUB_200_2011/CUB_200_2011/images`` for cub),
            else the first of those under which the first listed images exist.
        observed: the shipped observed labels to use (as the ``cole`` source: ``"uniform"``, a
            bias of the label-bias follow-up, or ``None``).
        class_names: the column names (list or file; default as the ``cole`` source).
        drop_empty: drop rows without a positive (the official lists keep them; NUS-WIDE has
            such rows). Changes the protocol's split; recorded in ``meta``.
        skip_missing, skip_corrupt: drop and count unusable images instead of raising.

    Raises:
        FileNotFoundError: a missing list (the message lists the expected files), no folder
            under which the images are found, or a missing image.
        ValueError: labels other than 0 / 1, lists whose lengths differ from the labels',
            observed labels that are not the single-positive draw of these labels.
    """
    root = Path(root)
    return load_formatted(root, name or root.resolve().name, image_root, observed, class_names,
                          drop_empty, skip_missing, skip_corrupt, "cole_images")
