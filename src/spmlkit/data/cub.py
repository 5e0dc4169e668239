"""CUB-200-2011 as an attribute-labelling dataset source (``cub``), as ``format_cub.py`` builds it.

Layout: ``CUB_200_2011/{images.txt, train_test_split.txt, attributes/image_attribute_labels.txt,
images/}``, found at any depth (up to 3) below ``root``; 312 attribute labels (``is_present``),
names from ``attributes.txt``. Pool = ``is_training_image`` 1 (5,994), test = 0 (5,794); ``ids``
are paths relative to ``images/``
(``001.Black_footed_Albatross/Black_Footed_Albatross_0046_18.jpg``).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from .protocol import Dataset
from .image_common import COLE, TAGS, image_dataset, join_paths
from .image_files import listing, locate, parse_int, read_fields
from .registry import register

__all__ = ["load_cub", "read_cub"]


def _cub_dir(root: Path) -> Path:
    found = locate(root, "images.txt", max_depth=3)
    if found is None or not (found / "train_test_split.txt").is_file():
        raise FileNotFoundError(
            f"no CUB-200-2011 folder under {root}: expected a folder (at any depth up to 3) "
            f"holding images.txt, train_test_split.txt, attributes/image_attribute_labels.txt "
            f"and images/ (the layout of CUB_200_2011.tgz); {listing(root)}")
    return found


def _cub_attribute_names(cub: Path) -> tuple[list[str] | None, str]:
    for path in (cub / "attributes.txt", cub.parent / "attributes.txt",
                 cub / "attributes" / "attributes.txt"):
        if path.is_file():
            names = [fields[1] for _, fields in read_fields(path, "CUB attribute names",
                                                            "<attribute id> <name>", 2, 2)]
            return names, str(path)
    return None, "default class{j}"


def _read_attribute_triples(path: Path) -> np.ndarray:
    """``image_attribute_labels.txt`` as an M x 3 int array (image id, attribute id,
    is_present); fields after the third (certainty, time, anything extra) are not read."""
    if not path.is_file():
        raise FileNotFoundError(f"CUB attribute labels {path} do not exist; expected "
                                f"attributes/image_attribute_labels.txt with lines '<image id> "
                                f"<attribute id> <is_present> <certainty id> <time>' "
                                f"({listing(path.parent.parent)})")
    form = "<image id> <attribute id> <is_present> <certainty id> <time>"
    table = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")              # "empty input file" is handled below
            table = np.loadtxt(path, usecols=(0, 1, 2), dtype=np.int64, ndmin=2)
    except ValueError:
        pass                                             # malformed: the slow path names the line
    if table is None or not np.isin(table[:, 2], (0, 1)).all():
        rows = [(parse_int(f[0], path, n, "the image id"),
                 parse_int(f[1], path, n, "the attribute id"),
                 parse_int(f[2], path, n, "is_present", allowed=(0, 1)))
                for n, f in read_fields(path, "CUB attribute labels", form, 3)]
        table = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    if not len(table):
        raise ValueError(f"{path}: no attribute label (expected lines '{form}')")
    return table


def read_cub(cub):
    """Image list, train/test flags and the 312 attribute labels of CUB-200-2011.

    Returns:
        ``(relative image paths, is_train bool array, y uint8 N x A, attribute names or None,
        where the names came from)``, in the order of ``images.txt`` (the official order).

    Raises:
        FileNotFoundError: a missing file (named).
        ValueError: malformed lines (file and line), an image id listed in one file and not the
            other, or an (image, attribute) pair without a label.
    """
    cub = Path(cub)
    images_txt, split_txt = cub / "images.txt", cub / "train_test_split.txt"
    image_ids, rel = [], []
    for n, (iid, name) in read_fields(images_txt, "CUB image list", "<image id> <path>", 2, 2):
        image_ids.append(parse_int(iid, images_txt, n, "the image id"))
        rel.append(name)
    row = {iid: r for r, iid in enumerate(image_ids)}
    if len(row) != len(image_ids):
        raise ValueError(f"{images_txt}: an image id is listed twice")
    is_train = np.full(len(rel), -1, dtype=np.int8)
    for n, (iid, flag) in read_fields(split_txt, "CUB train/test split",
                                      "<image id> <is_training_image 0|1>", 2, 2):
        r = row.get(parse_int(iid, split_txt, n, "the image id"))
        if r is None:
            raise ValueError(f"{split_txt}, line {n}: image id {iid} is not in {images_txt.name}")
        is_train[r] = parse_int(flag, split_txt, n, "is_training_image", allowed=(0, 1))
    if (is_train < 0).any():
        first = image_ids[int(np.flatnonzero(is_train < 0)[0])]
        raise ValueError(f"{split_txt}: image id {first} of {images_txt.name} has no train/test "
                         f"flag")
    labels_txt = cub / "attributes" / "image_attribute_labels.txt"
    if not labels_txt.is_file() and (cub / "image_attribute_labels.txt").is_file():
        labels_txt = cub / "image_attribute_labels.txt"
    table = _read_attribute_triples(labels_txt)
    names, names_from = _cub_attribute_names(cub)
    num_attr = len(names) if names is not None else int(table[:, 1].max())
    rows = np.array([row.get(int(i), -1) for i in table[:, 0]], dtype=np.int64)
    if (rows < 0).any():
        k = int(np.flatnonzero(rows < 0)[0])
        raise ValueError(f"{labels_txt}: entry {k + 1} names image id {int(table[k, 0])}, which "
                         f"is not in {images_txt.name}")
    cols = table[:, 1] - 1
    if cols.min() < 0 or cols.max() >= num_attr:
        k = int(np.flatnonzero((cols < 0) | (cols >= num_attr))[0])
        raise ValueError(f"{labels_txt}: entry {k + 1} has attribute id {int(table[k, 1])}, "
                         f"outside 1..{num_attr} ({names_from})")
    y = np.zeros((len(rel), num_attr), dtype=np.uint8)
    covered = np.zeros_like(y, dtype=bool)
    y[rows, cols] = table[:, 2]
    covered[rows, cols] = True
    if not covered.all():
        r, c = np.argwhere(~covered)[0]
        raise ValueError(f"{labels_txt}: image {image_ids[r]} has no label for attribute {c + 1} "
                         f"({int((~covered).sum())} (image, attribute) pairs unlabelled)")
    return rel, is_train.astype(bool), y, names, names_from


@register("cub", "CUB-200-2011 images with their 312 attribute labels; pool = "
          "is_training_image 1, test = 0", paper="Wah et al. 2011; " + COLE, tags=TAGS)
def load_cub(root: str | os.PathLike, skip_missing: bool = False,
             skip_corrupt: bool = False) -> Dataset:
    """CUB-200-2011 as an attribute-labelling task, as ``format_cub.py`` builds it.

    Args:
        root: any folder above ``CUB_200_2011/`` (up to three levels; the folder that holds
            ``images.txt`` is found, so ``CUB_200_2011/CUB_200_2011/`` also works).
            Attribute names come from ``attributes.txt`` next to that folder or inside it.
        skip_missing, skip_corrupt: drop and count unusable images instead of raising.

    Returns:
        a [`Dataset`][spmlkit.data.protocol.Dataset]; ids are paths relative to ``images/``.

    Raises:
        FileNotFoundError: no CUB folder, a missing list or image (named).
        ValueError: malformed lines (file and line), inconsistent ids.
    """
    cub = _cub_dir(Path(root))
    rel, is_train, y, names, names_from = read_cub(cub)
    images = cub / "images"
    if not images.is_dir():
        raise FileNotFoundError(f"CUB image folder {images} does not exist ({listing(cub)})")
    paths = join_paths(images, rel)
    part = {}
    for key, mask in (("pool", is_train), ("test", ~is_train)):
        idx = np.flatnonzero(mask)
        part[key] = ([paths[i] for i in idx], [rel[i] for i in idx], y[idx])
    classes = names if names is not None else [f"class{j}" for j in range(y.shape[1])]
    meta = {"source": "cub", "root": str(cub), "class_names_from": names_from}
    return image_dataset("cub", part["pool"], part["test"], classes,
                         skip_missing=skip_missing, skip_corrupt=skip_corrupt, meta=meta)
