"""PASCAL VOC as a dataset source (``voc``), labelled as the official ``format_pascal.py`` does.

Layout: ``VOCdevkit/VOC2012/ImageSets/Main/<class>_{train,val}.txt`` and ``JPEGImages/``; 20
classes in alphabetical order; label ``1`` is a positive, ``0`` (difficult) and ``-1`` negatives;
images without a positive dropped; rows sorted by file name. Pool = VOC2012 train (5,717),
test = VOC2012 val (5,823). ``ids`` are the file names (``2008_000008.jpg``), as in the official
``formatted_*_images.npy`` lists. A missing annotation file raises ``FileNotFoundError`` naming
it and the layout expected; a malformed line raises ``ValueError`` naming the file and line.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from .protocol import Dataset
from .cole import VOC_CLASSES
from .image_common import COLE, TAGS, image_dataset, join_paths
from .image_files import listing, locate, parse_int, read_fields
from .registry import register

__all__ = ["VOC_CLASSES", "load_voc", "read_voc_split"]


def _voc_dir(root: Path, year: str) -> Path:
    for cand in (root / "VOCdevkit" / f"VOC{year}", root / f"VOC{year}", root):
        if (cand / "ImageSets" / "Main").is_dir():
            return cand
    found = locate(root, f"VOC{year}/ImageSets/Main", max_depth=2)
    if found is not None:
        return found / f"VOC{year}"
    raise FileNotFoundError(
        f"no PASCAL VOC{year} tree under {root}: expected {root}/VOCdevkit/VOC{year}/ImageSets/"
        f"Main/<class>_{{train,val}}.txt and {root}/VOCdevkit/VOC{year}/JPEGImages/ (the layout "
        f"of VOCtrainval_11-May-2012.tar unpacked in {root}); {listing(root)}")


def read_voc_split(main_dir, split: str, classes: Sequence[str] = VOC_CLASSES):
    """Labels of one VOC image set from its per-class lists, as ``format_pascal.py`` builds them.

    Each ``<class>_<split>.txt`` has lines ``<image id> <label>`` with label ``1`` (present),
    ``0`` (present but difficult) or ``-1`` (absent); only ``1`` is a positive. Images without a
    positive in any class are dropped; rows are sorted by file name.

    Returns:
        ``(file names "<id>.jpg", y uint8 N x L, number of images dropped for having no
        positive)``.

    Raises:
        FileNotFoundError: a class list is missing (the message names it and the 20 expected).
        ValueError: a line that is not ``<image id> <1|0|-1>`` (names the file and line).
    """
    main_dir = Path(main_dir)
    positives: dict[str, list[int]] = {}
    seen: set[str] = set()
    for j, cls in enumerate(classes):
        path = main_dir / f"{cls}_{split}.txt"
        if not path.is_file():
            present = sorted(p.name for p in main_dir.glob(f"*_{split}.txt"))
            raise FileNotFoundError(
                f"VOC annotation file {path} does not exist; expected one list <class>_{split}.txt "
                f"per class in {main_dir} for the {len(classes)} classes "
                f"({', '.join(classes)}), lines '<image id> <1|0|-1>'; found {len(present)} such "
                f"list(s){': ' + ', '.join(present[:5]) if present else ''}")
        for lineno, (image, label) in read_fields(path, "VOC class list",
                                                  "<image id> <1 | 0 | -1>", 2, 2):
            value = parse_int(label, path, lineno, "the label", allowed=(1, 0, -1))
            seen.add(image)
            if value == 1:
                positives.setdefault(image, []).append(j)
    names = sorted(f"{image}.jpg" for image in positives)
    y = np.zeros((len(names), len(classes)), dtype=np.uint8)
    for i, fname in enumerate(names):
        y[i, positives[fname[:-4]]] = 1
    return names, y, len(seen) - len(positives)


@register("voc", "PASCAL VOC 2012 images (VOCdevkit layout): 20 classes; pool = VOC2012 train, "
          "test = VOC2012 val", paper="Everingham et al. 2010; " + COLE, tags=TAGS)
def load_voc(root: str | os.PathLike, year: str | int = 2012, pool_split: str = "train",
             test_split: str = "val", skip_missing: bool = False,
             skip_corrupt: bool = False) -> Dataset:
    """PASCAL VOC from its official tree, labelled as ``format_pascal.py`` labels it.

    Args:
        root: the folder that holds ``VOCdevkit/`` (also accepted: ``VOCdevkit/`` itself or
            ``VOC2012/`` itself).
        year: the VOC edition (``2012``; ``2007`` works with the same layout).
        pool_split, test_split: the image sets read as pool and test (official: ``train`` and
            ``val``; with VOC2007's test tarball unpacked, ``trainval`` / ``test``).
        skip_missing, skip_corrupt: drop and count unusable images instead of raising.

    Returns:
        a [`Dataset`][spmlkit.data.protocol.Dataset] of image paths (module docstring);
        ``meta["dropped_no_positive"]`` counts the images listed without a positive (dropped, as in
        the official script).

    Raises:
        FileNotFoundError: no VOC tree, a missing class list, or a missing image (names it).
        ValueError: a malformed line (file and line).

    Example (on a tree in the official layout)::

        splits = load_splits("voc", root="/data/pascal")   # 4,574 / 1,143 / 5,823
    """
    root = Path(root)
    year = str(year)
    voc = _voc_dir(root, year)
    main_dir, images = voc / "ImageSets" / "Main", voc / "JPEGImages"
    if not images.is_dir():
        raise FileNotFoundError(f"VOC image folder {images} does not exist; expected the JPEG "
                                f"images next to ImageSets/ ({listing(voc)})")
    parts, dropped = {}, {}
    for part, split in (("pool", pool_split), ("test", test_split)):
        names, y, dropped[part] = read_voc_split(main_dir, split)
        if not names:
            raise ValueError(f"{main_dir}: no image of the '{split}' set has a positive label")
        parts[part] = (join_paths(images, names), names, y)
    meta = {"source": "voc", "root": str(voc), "year": year,
            "splits": {"pool": pool_split, "test": test_split},
            "dropped_no_positive": dropped}
    return image_dataset("voc", parts["pool"], parts["test"], VOC_CLASSES,
                         skip_missing=skip_missing, skip_corrupt=skip_corrupt, meta=meta)
