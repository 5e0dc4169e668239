"""What the image sources share: building a [`Dataset`][spmlkit.data.protocol.Dataset] of image
paths whose unusable images are checked, dropped and counted, and the Cole split of one list.

Each image source lives in its own module (`voc`, `coco`,
`cub`, `nuswide`, `cole_images`,
`csv_images`, `folder`); importing it registers it. Every
one returns a ``Dataset`` whose ``pool`` is the official training set and whose ``test`` is the
official evaluation set; ``x`` is a list of **absolute** image paths (decode them with
`spmlkit.data.image_files.open_image`), ``ids`` the paths relative to the dataset's image
folder, chosen to equal the entries of the official ``formatted_*_images.npy`` lists. Row order
follows the official formatting scripts (github.com/elijahcole/single-positive-multi-label,
``preproc/format_{pascal,coco,cub}.py``), so the protocol's train / val split
(`make_splits`) selects the same images as the papers'.

Sources, the layout each reads, and its pool / test (sizes of the official sets):

``voc``
    ``VOCdevkit/VOC2012/ImageSets/Main/<class>_{train,val}.txt`` and ``JPEGImages/``; 20 classes
    in alphabetical order; label ``1`` is a positive, ``0`` (difficult) and ``-1`` negatives;
    images without a positive dropped; rows sorted by file name. Pool = VOC2012 train (5,717),
    test = VOC2012 val (5,823).
``coco``
    ``annotations/instances_{train,val}2014.json``, ``train2014/``, ``val2014/``; 80 classes in
    the order of the file's ``categories`` (category-id order); images without an annotation
    dropped; rows sorted by image id *as a string* (as ``format_coco.py``). Pool = train2014
    (82,081), test = val2014 (40,137).
``cub``
    ``CUB_200_2011/{images.txt, train_test_split.txt, attributes/image_attribute_labels.txt,
    images/}``, found at any depth (up to 3) below ``root``; 312 attribute labels
    (``is_present``), names from ``attributes.txt``. Pool = ``is_training_image`` 1 (5,994),
    test = 0 (5,794).
``nuswide``
    the published lists of the re-crawl, ``formatted_{train,val}_{images,labels}.npy``, with
    the images in ``Flickr/``; rows without a positive kept, as in the lists. Pool / test = the
    train / val lists (150,000 / 60,260 in the paper's crawl).
``cole_images``
    any dataset folder of Cole et al.: ``formatted_{train,val}_{images,labels}.npy`` (with
    ``formatted_train_labels_obs.npy``, the shipped single-positive draw) and its images.
``csv``
    one row per image: its path, then its class names. Test = a second CSV, else 0.3 of the
    rows (the Cole split, seed 1200, as for yeast).
``folder``
    ``<root>/<class>/<image>``: each image's folder is its only known positive. Test = a
    second tree, else 0.3 of the images (Cole split, seed 1200).

Broken inputs: a missing image raises ``FileNotFoundError`` naming it, unless
``skip_missing=True``, which drops the item; with ``skip_corrupt=True`` every image is decoded once
and unreadable ones are dropped too (without it a corrupt image fails when it is opened, with an
error naming it). Dropped items are counted in ``Dataset.meta["skipped"]`` and in one warning.
Dropping pool items shifts the rows the protocol splits, so the train / val split no longer
equals the official one (``meta["official_split"]`` is then ``False``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from .protocol import Dataset, LabelledSet, split_rows
from .image_files import check_images, warn_skipped

__all__ = ["TAGS", "TEST_FRACTION", "COLE", "image_set", "image_dataset", "join_paths", "carve",
           "with_groups"]

#: the registry tags of an image source
TAGS = ("images",)
#: Share of the rows that becomes the test set when a ``csv`` / ``folder`` source has no test
#: file (the Cole split, seed 1200, as for yeast and ``arrays``).
TEST_FRACTION = 0.3
COLE = "Cole et al. 2021 (formatting scripts)"


def image_set(name: str, part: str, paths: list, ids: list, y: np.ndarray, classes,
              skip_missing: bool, skip_corrupt: bool, observed=None):
    """Check the images of one part, drop (and count) the unusable ones, build the set."""
    where = f"{name} {part}"
    if not paths:
        raise ValueError(f"{where}: the annotations list no image")
    check = check_images(paths, skip_missing=skip_missing, skip_corrupt=skip_corrupt,
                         where=where)
    warn_skipped(check, where)
    if check.skipped:
        keep = check.keep
        paths, ids, y = [paths[i] for i in keep], [ids[i] for i in keep], y[keep]
        observed = None if observed is None else observed[keep]
    if not paths:
        raise ValueError(f"{where}: no usable image left ({check.skipped} skipped of "
                         f"{check.skipped + len(paths)})")
    info = {"listed": len(paths) + check.skipped, "missing": len(check.missing),
            "corrupt": len(check.corrupt), "first_skipped": (check.missing + check.corrupt)[:5],
            "missing_files": list(check.missing), "corrupt_files": list(check.corrupt)}
    return LabelledSet(paths, y, list(classes), ids, where=where), observed, info


def image_dataset(name: str, pool: tuple, test: tuple, classes, *, skip_missing: bool,
                  skip_corrupt: bool, meta: dict, pool_observed=None, observed=None,
                  val: tuple | None = None) -> Dataset:
    """``pool`` / ``test`` / ``val`` = (absolute paths, ids, y). Checks the images and
    assembles. ``observed``: the pool's observed training labels when they are all that is
    known (``Dataset.observed``, regime ``given``; then ``pool``'s y are ignored);
    ``pool_observed``: a shipped draw next to full labels."""
    if observed is not None:
        observed = np.asarray(observed)
        pool = (*pool[:2], (observed == 1).astype(np.uint8))
    _warn_shared_images(name, pool[0], {"test": test, "val": val})
    pool_set, kept, pool_info = image_set(name, "pool", *pool, classes, skip_missing,
                                          skip_corrupt, observed if observed is not None
                                          else pool_observed)
    test_set, _, test_info = image_set(name, "test", *test, classes, skip_missing,
                                       skip_corrupt)
    skipped = {"pool": pool_info, "test": test_info}
    val_set = None
    if val is not None:
        val_set, _, skipped["val"] = image_set(name, "val", *val, classes, skip_missing,
                                               skip_corrupt)
    meta = {**meta, "skipped": skipped,
            "skip_missing": bool(skip_missing), "skip_corrupt": bool(skip_corrupt)}
    if pool_info["missing"] or pool_info["corrupt"]:
        meta["official_split"] = False
    return Dataset(name, pool_set, test_set, pool_observed=None if observed is not None else kept,
                   meta=meta, observed=kept if observed is not None else None, val=val_set)


def with_groups(ds: Dataset, **parts) -> Dataset:
    """``ds`` with the groups of its sets: ``pool=``, ``test=``, ``val=`` each a mapping from
    an image's id to its group (None: that set has none). Mapped by id, after `image_set`
    dropped unusable images."""
    for part, groups in parts.items():
        labelled = getattr(ds, part)
        if groups is not None and labelled is not None:
            labelled.groups = np.asarray([groups[i] for i in labelled.ids])
    return ds


def _warn_shared_images(name: str, pool_paths, others: dict) -> None:
    """Warn when a test or val image is also a training image (the same file path): its score
    measures what the model memorised (a test CSV that lists images of the training tree)."""
    import warnings

    train = {os.path.normpath(os.fspath(p)) for p in pool_paths}
    for what, part in others.items():
        if part is None:
            continue
        shared = [p for p in part[0] if os.path.normpath(os.fspath(p)) in train]
        if shared:
            warnings.warn(f"{name}: {len(shared)} of the {len(part[0])} {what} images are also "
                          f"training images (first: {shared[0]}); their {what} scores measure "
                          f"what the model saw in training: list other images", stacklevel=3)


def join_paths(base: Path, rel: Sequence[str]) -> list[str]:
    """Absolute, normalised paths of ``rel`` under ``base`` (absolute entries stay as they are)."""
    base = os.path.abspath(os.fspath(base))
    return [os.path.normpath(os.path.join(base, r)) for r in rel]


def carve(name: str, paths, ids, y, test_fraction: float, seed: int, where: str, groups=None):
    """Split one list into pool / test with the Cole split (the rest / ``test_fraction``), or
    with `group_split` when ``groups`` (one per image) are given: whole groups."""
    pool_idx, test_idx = split_rows(len(y), test_fraction, seed, groups,
                                    f"{where}: the test set carved out")
    if not len(pool_idx) or not len(test_idx):
        raise ValueError(f"{where}: {len(y)} image(s) leave an empty "
                         f"{'test set' if not len(test_idx) else 'pool'} with test_fraction "
                         f"{test_fraction}; add images or give an explicit test set")

    def take(idx):
        return [paths[i] for i in idx], [ids[i] for i in idx], y[idx]

    return take(pool_idx), take(test_idx)
