"""Your own images, one subfolder per class, as a dataset source (``folder``):
``<root>/<class>/<image>``, each image's folder its only known positive. Test = a second tree,
else 0.3 of the images (Cole split, seed 1200).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from ..labels import OFFICIAL_SEED, positives_to_observed
from .protocol import Dataset, check_train_labels
from .image_common import TAGS, TEST_FRACTION, carve, image_dataset, join_paths, with_groups
from .image_files import IMAGE_SUFFIXES, is_image_name, listing
from .registry import register

__all__ = ["SPLIT_FOLDER_NAMES", "load_folder", "scan_class_folders"]


SPLIT_FOLDER_NAMES = {"train", "training", "val", "valid", "validation", "test", "testing"}


def scan_class_folders(root, classes: Sequence[str] | None = None):
    """The images of a one-folder-per-class tree.

    Each subfolder of ``root`` (hidden ones skipped) is a class; its images (files ending in
    `IMAGE_SUFFIXES`, searched recursively, sorted) are
    labelled with it. Other files are ignored and counted.

    Args:
        root: the tree.
        classes: the class columns (default: the sorted subfolder names). A subfolder outside
            them is an error.

    Returns:
        ``(paths relative to root, class index per image, classes, number of ignored files)``.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: no class subfolder, a tree that looks like ``train/``, ``test/`` split
            folders, an unknown class folder, a class folder without an image (training tree:
            ``classes`` not given), or no image at all.
    """
    root = Path(root)
    if not root.is_dir():
        state = "is a file, not a folder" if root.exists() else "does not exist"
        raise FileNotFoundError(f"image folder {root} {state}; expected one subfolder per "
                                f"class holding that class's images")
    subdirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    loose = [p.name for p in root.iterdir() if p.is_file() and is_image_name(p.name)]
    if not subdirs:
        raise ValueError(f"{root}: no class subfolder; expected <root>/<class>/<image> "
                         f"({listing(root)})")
    if set(s.lower() for s in subdirs) <= SPLIT_FOLDER_NAMES and all(
            any(q.is_dir() for q in (root / s).iterdir()) for s in subdirs):
        train = next((s for s in subdirs if s.lower() in ("train", "training")), subdirs[0])
        test = next((s for s in subdirs if s.lower() in ("test", "testing")), "<test folder>")
        raise ValueError(f"{root} holds split folders ({', '.join(subdirs)}), not class folders; "
                         f"pass root={root / train} and test_root={root / test}")
    empty_ok = classes is not None  # an evaluation tree may lack images of a class
    if classes is None:
        classes = subdirs
    classes = list(classes)
    column = {c: j for j, c in enumerate(classes)}
    unknown = [s for s in subdirs if s not in column]
    if unknown:
        raise ValueError(f"{root / unknown[0]}: class folder {unknown[0]!r} is not one of the "
                         f"training classes ({', '.join(classes[:10])}"
                         f"{', ...' if len(classes) > 10 else ''})")
    rel, label, ignored, empty = [], [], 0, []
    first_ignored = None
    for cls in subdirs:
        found, seen = [], set()
        # linked subfolders are followed as a linked class folder is; each real folder once
        for dirpath, dirnames, filenames in os.walk(root / cls, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in seen:  # a link back up the tree: walked already
                dirnames[:] = []
                continue
            seen.add(real)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in filenames:
                if is_image_name(f):
                    found.append(os.path.relpath(os.path.join(dirpath, f), root))
                elif not f.startswith("."):
                    ignored += 1
                    first_ignored = first_ignored or os.path.join(dirpath, f)
        found.sort()
        if not found:
            empty.append(cls)
        rel.extend(p.replace(os.sep, "/") for p in found)
        label.extend([column[cls]] * len(found))
    if not rel:
        raise ValueError(f"{root}: no image in any class folder (image files end in "
                         f"{', '.join(IMAGE_SUFFIXES)})")
    if empty and not empty_ok:
        more = f" (and {len(empty) - 1} more: {', '.join(empty[1:4])})" if len(empty) > 1 else ""
        raise ValueError(f"{root / empty[0]}: class folder {empty[0]!r} holds no image{more} "
                         f"(image files end in {', '.join(IMAGE_SUFFIXES)}), so the class "
                         f"would have no training image; add its images or remove the folder")
    if loose:
        warnings.warn(f"{root}: {len(loose)} image(s) lie directly in the folder, outside any "
                      f"class folder, and are ignored (first: {loose[0]})", stacklevel=3)
    if ignored:
        warnings.warn(f"{root}: {ignored} file(s) in the class folders are not read: their "
                      f"names do not end in an image suffix ({', '.join(IMAGE_SUFFIXES)}); "
                      f"first: {first_ignored}", stacklevel=3)
    return rel, np.asarray(label, dtype=np.int64), classes, ignored


def _one_hot(label: np.ndarray, num_classes: int) -> np.ndarray:
    y = np.zeros((len(label), num_classes), dtype=np.uint8)
    y[np.arange(len(label)), label] = 1
    return y


def default_train_labels(test_csv) -> str:
    """The folder source's ``train_labels`` when none is given: a tree of tagged images is
    observed labels when full ones exist elsewhere (a ``test_csv``), else its labels."""
    return "observed" if test_csv is not None else "full"


@register("folder", "your own images, one subfolder per class: each image's folder is its single "
          "known positive (test folder given or carved out, 0.3, seed 1200)",
          paper="Cole et al. 2021 (protocol)", tags=TAGS)
def load_folder(root: str | os.PathLike, test_root: str | os.PathLike | None = None,
                test_fraction: float = TEST_FRACTION,
                seed: int = OFFICIAL_SEED, name: str = "folder", skip_missing: bool = False,
                skip_corrupt: bool = False, train_labels: str | None = None,
                test_csv: str | os.PathLike | None = None,
                val_csv: str | os.PathLike | None = None,
                group_by_folder: bool = False) -> Dataset:
    """A one-folder-per-class tree (torchvision's ``ImageFolder`` layout) for SPML.

    This is the practitioner's case: each image is known to show its folder's class, and nothing
    is known about the others. The full labels are therefore the **one-hot** of the folder class
    (``meta["labels"] == "folder_class_only"``):

    * training with the default regime ``1p`` observes exactly that positive, which is all the
      information there is; regimes that also observe negatives (``full``, ``1p_alln``,
      ``1p_1n``, ``mlml:r``) would treat the unknown classes as known negatives: do not use them
      here;
    * val / test mAP against these labels treats every unlisted class as absent, so an image that
      really shows two classes counts as a false positive for the second. The score is an
      estimate that is usually **pessimistic** (a correct, confident prediction of an unlisted
      class lowers precision for the listed positives ranked below it), but it is not a strict
      lower bound on the mAP against complete labels (an unlisted positive ranked low would have
      lowered that mAP too). Only a fully labelled test set gives the true value: ``test_csv``.

    ``train_labels="observed"`` treats the tree as what it is: the folder class is each
    training image's observed positive and every other label unobserved (``Dataset.observed``,
    regime ``given``, or ``1p``, which on a folder tree means the same); a fully labelled
    ``test_csv`` is then required (and ``val_csv`` optional; default: carved out of the test
    set), epochs are selected on fully labelled val images, and ROLE / EPR's ``k`` comes from
    those full labels instead of the folders' one per image. **This is the default whenever a
    ``test_csv`` is given**: selecting epochs on a val set carved out of the folders would score
    them against one tag per image. ``train_labels="full"`` keeps the folder-class-only labels
    everywhere (val from the training folders); the run's label summary then says that val
    holds the folder class only, never that it is fully labelled.

    Args:
        root: the tree ``<root>/<class>/<image>`` (subfolders within a class are searched too).
        test_root: a second tree with the evaluation images (its class folders must be among
            ``root``'s). Without it, the test set is carved out of all images with the Cole split
            (``cole_split(N, test_fraction, seed)``: 0.3, seed 1200, as for yeast).
        test_fraction, seed: the carve-out.
        name: the dataset's name.
        skip_missing, skip_corrupt: drop and count unusable images (``skip_corrupt`` decodes every
            image once) instead of raising when they are opened.
        train_labels: ``"observed"`` (the default with ``test_csv``; see above) or ``"full"``
            (the default without it: the one-hot folder classes, regime ``1p``).
        test_csv: fully labelled test images (the final scores) in the ``csv`` source's form
            (`read_image_csv`: path, then every class name of the image; paths relative to
            the CSV's folder or absolute), instead of ``test_root``.
        val_csv: fully labelled validation images (what the best epoch or threshold is chosen
            on), in ``test_csv``'s form, instead of the val set the protocol splits off the
            training images.
        group_by_folder: each image's group is the folder that holds it
            (``<root>/<class>/<recording>/<image>``: the recording; an image directly in its
            class folder: that class folder). The test set carved out and the val set then
            take whole groups, so that frames of one recording never sit on both sides, and the
            asset regulariser (``--hp asset_alpha=...``) averages over them.

    Returns:
        a [`Dataset`][spmlkit.data.protocol.Dataset]; classes are the sorted folder names; ids are
        paths relative to the tree; ``meta["ignored_files"]`` counts non-image files.

    Raises:
        FileNotFoundError: no such folder.
        ValueError: no class folder, split folders given as root, an unknown class folder in
            ``test_root``, no image.
    """
    from .csv_images import read_image_csv

    root = Path(root)
    if train_labels is None:
        train_labels = default_train_labels(test_csv)
    observed = check_train_labels(train_labels, f"dataset {name!r}") == "observed"
    rel, label, classes, ignored = scan_class_folders(root)
    y = _one_hot(label, len(classes))
    paths = join_paths(root.resolve(), rel)
    meta = {"source": "folder", "root": str(root), "labels": "folder_class_only",
            "ignored_files": {"pool": ignored}}
    _check_test_set(root, test_root, test_csv, observed)
    if observed:
        meta["observed_from"] = f"{root} (each image's folder)"

    def listed(csv_path):
        csv_path = Path(csv_path)
        rel_c, y_c, _ = read_image_csv(
            csv_path, classes, unknown_hint=f"Fix the name, or add a class folder of that name "
            f"with its training images under {root} (the folder source's classes are its "
            f"class folders)")
        return (join_paths(csv_path.parent.resolve(), rel_c), rel_c, y_c)

    val = None
    if val_csv is not None:
        val = listed(val_csv)
        meta.update(val_csv=str(val_csv))
    if test_csv is not None:
        pool, test = (paths, rel, y), listed(test_csv)
        meta.update(test_csv=str(test_csv), test_labels_file=str(test_csv))
    elif test_root is None:
        pool, test = carve(name, paths, rel, y, test_fraction, seed, str(root),
                           [_folder_of(r) for r in rel] if group_by_folder else None)
        meta.update(test_fraction=test_fraction, split_seed=seed)
    else:
        pool, test = (paths, rel, y), _test_tree(Path(test_root), classes, meta)
    empty = [c for j, c in enumerate(classes) if not pool[2][:, j].any()]
    if empty:
        meta["classes_without_pool_images"] = empty
    meta.update({"group_by_folder": True} if group_by_folder else {})
    ds = image_dataset(name, pool, test, classes, skip_missing=skip_missing,
                       skip_corrupt=skip_corrupt, meta=meta, val=val,
                       observed=positives_to_observed(pool[2]) if observed else None)
    # the images of a tree (the pool, a carved or a test_root test set) have folders; those
    # listed in a test / val CSV: the folder of their path as written
    return with_groups(ds, **dict.fromkeys(("pool", "test", "val"), _FolderOf())) \
        if group_by_folder else ds


def _check_test_set(root: Path, test_root, test_csv, observed: bool) -> None:
    """Refuse a test set given twice, and observed training labels without a fully labelled
    test CSV."""
    if test_root is not None and test_csv is not None:
        raise ValueError("give test_root (a tree: one class per image) or test_csv (every "
                         "class of each image), not both")
    if observed and test_csv is None:
        raise ValueError(f"{root}: observed training labels (train_labels=observed) need a "
                         f"fully labelled test set: test_csv=FILE, a CSV listing each test "
                         f"image's path and all its class names (a test_root tree gives only "
                         f"one class per image)")


def _test_tree(test_root: Path, classes, meta: dict) -> tuple:
    """The test set of a second tree, ``(paths, ids, one-hot labels)`` (its class folders among
    the pool's ``classes``); its folder and ignored files noted in ``meta``."""
    rel_t, label_t, _, ignored_t = scan_class_folders(test_root, classes)
    meta.update(test_root=str(test_root))
    meta["ignored_files"]["test"] = ignored_t
    return join_paths(test_root.resolve(), rel_t), rel_t, _one_hot(label_t, len(classes))


class _FolderOf(dict):
    """``{image id: the folder holding it}`` for any id (`with_groups`)."""

    def __missing__(self, image_id):
        return _folder_of(image_id)


def _folder_of(rel: str) -> str:
    """The folder that holds an image, from its path as written (``a/b/c.jpg`` -> ``a/b``)."""
    return os.path.dirname(os.path.normpath(os.fspath(rel))) or "."
