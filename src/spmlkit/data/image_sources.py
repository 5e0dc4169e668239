"""Image dataset sources: the four benchmark sets in their official layouts, the formatted lists of
Cole et al., and two forms for your own images (a CSV file, one folder per class).

Every source returns a :class:`~spmlkit.data.base.Dataset` whose ``pool`` is the official training
set and whose ``test`` is the official evaluation set; ``x`` is a list of **absolute** image paths
(decode them with :func:`spmlkit.data.images.open_image`), ``ids`` the paths relative to the
dataset's image folder, chosen to equal the entries of the official ``formatted_*_images.npy``
lists (``2008_000008.jpg``, ``train2014/COCO_train2014_000000000009.jpg``,
``001.Black_footed_Albatross/Black_Footed_Albatross_0046_18.jpg``). Row order follows the
official formatting scripts (github.com/elijahcole/single-positive-multi-label,
``preproc/format_{pascal,coco,cub}.py``), so the protocol's train / val split
(:func:`~spmlkit.data.base.make_splits`) selects the same images as the papers'.

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

Broken inputs: a missing annotation file raises ``FileNotFoundError`` naming it and the layout
expected; a malformed line raises ``ValueError`` naming the file and line; a missing image raises
``FileNotFoundError`` naming it, unless ``skip_missing=True``, which drops the item; with
``skip_corrupt=True`` every image is decoded once and unreadable ones are dropped too (without it a
corrupt image fails when it is opened, with an error naming it). Dropped items are counted in
``Dataset.meta["skipped"]`` and in one warning. Dropping pool items shifts the rows the protocol
splits, so the train / val split no longer equals the official one (``meta["official_split"]``
is then ``False``).
"""
from __future__ import annotations

import csv
import json
import os
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from ..labels import OFFICIAL_SEED, validate_full_labels
from .arrays import load_matrix, resolve_class_names
from .base import Dataset, LabelledSet, cole_split
from .cole import COCO_CLASSES, VOC_CLASSES, _class_names, _observed_file, read_observed
from .images import IMAGE_SUFFIXES, check_images, is_image_name, listing, locate, parse_int, \
    read_fields, warn_skipped
from .registry import register

__all__ = ["VOC_CLASSES", "COCO_CLASSES", "TEST_FRACTION", "load_voc", "load_coco", "load_cub",
           "load_nuswide", "load_cole_images", "load_csv_images", "load_folder",
           "read_voc_split", "read_coco_split", "read_cub", "read_image_csv",
           "scan_class_folders"]

TAGS = ("images",)
#: Share of the rows that becomes the test set when a ``csv`` / ``folder`` source has no test
#: file (the Cole split, seed 1200, as for yeast and ``arrays``).
TEST_FRACTION = 0.3
COLE = "Cole et al. 2021 (formatting scripts)"


# ------------------------------------------------------------------ building the Dataset
def _image_set(name: str, part: str, paths: list, ids: list, y: np.ndarray, classes,
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
            "corrupt": len(check.corrupt), "first_skipped": (check.missing + check.corrupt)[:5]}
    return LabelledSet(paths, y, list(classes), ids, where=where), observed, info


def _dataset(name: str, pool: tuple, test: tuple, classes, *, skip_missing: bool,
             skip_corrupt: bool, meta: dict, pool_observed=None) -> Dataset:
    """``pool`` / ``test`` = (absolute paths, ids, y). Checks the images and assembles."""
    pool_set, pool_observed, pool_info = _image_set(name, "pool", *pool, classes, skip_missing,
                                                    skip_corrupt, pool_observed)
    test_set, _, test_info = _image_set(name, "test", *test, classes, skip_missing,
                                        skip_corrupt)
    meta = {**meta, "skipped": {"pool": pool_info, "test": test_info},
            "skip_missing": bool(skip_missing), "skip_corrupt": bool(skip_corrupt)}
    if pool_info["missing"] or pool_info["corrupt"]:
        meta["official_split"] = False
    return Dataset(name, pool_set, test_set, pool_observed=pool_observed, meta=meta)


def _join(base: Path, rel: Sequence[str]) -> list[str]:
    """Absolute, normalised paths of ``rel`` under ``base`` (absolute entries stay as they are)."""
    base = os.path.abspath(os.fspath(base))
    return [os.path.normpath(os.path.join(base, r)) for r in rel]


def _carve(name: str, paths, ids, y, test_fraction: float, seed: int, where: str):
    """Split one list into pool / test with the Cole split (the rest / ``test_fraction``)."""
    pool_idx, test_idx = cole_split(len(y), test_fraction, seed)
    if not len(pool_idx) or not len(test_idx):
        raise ValueError(f"{where}: {len(y)} image(s) leave an empty "
                         f"{'test set' if not len(test_idx) else 'pool'} with test_fraction "
                         f"{test_fraction}; add images or give an explicit test set")

    def take(idx):
        return [paths[i] for i in idx], [ids[i] for i in idx], y[idx]

    return take(pool_idx), take(test_idx)


# ------------------------------------------------------------------ voc
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
def load_voc(root, year: str | int = 2012, pool_split: str = "train", test_split: str = "val",
             skip_missing: bool = False, skip_corrupt: bool = False) -> Dataset:
    """PASCAL VOC from its official tree, labelled as ``format_pascal.py`` labels it.

    Args:
        root: the folder that holds ``VOCdevkit/`` (also accepted: ``VOCdevkit/`` itself or
            ``VOC2012/`` itself).
        year: the VOC edition (``2012``; ``2007`` works with the same layout).
        pool_split, test_split: the image sets read as pool and test (official: ``train`` and
            ``val``; with VOC2007's test tarball unpacked, ``trainval`` / ``test``).
        skip_missing, skip_corrupt: drop and count unusable images instead of raising.

    Returns:
        a :class:`Dataset` of image paths (module docstring); ``meta["dropped_no_positive"]``
        counts the images listed without a positive (dropped, as in the official script).

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
        parts[part] = (_join(images, names), names, y)
    meta = {"source": "voc", "root": str(voc), "year": year,
            "splits": {"pool": pool_split, "test": test_split},
            "dropped_no_positive": dropped}
    return _dataset("voc", parts["pool"], parts["test"], VOC_CLASSES, skip_missing=skip_missing,
                    skip_corrupt=skip_corrupt, meta=meta)


# ------------------------------------------------------------------ coco
def _require(obj, key: str, path, what: str):
    if not isinstance(obj, dict) or key not in obj:
        keys = sorted(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(f"{path}: {what} has no key '{key}' (it has {keys}); expected a COCO "
                         f"instances file with 'images', 'annotations' and 'categories'")
    return obj[key]


def _coco_geometry(data: dict, path, order: list, column: dict) -> dict:
    """Per-label instance metadata of the images ``order`` (rows) from the boxes of ``data``.

    ``size``: the label's largest box (``bbox`` width x height) as a fraction of the image area;
    ``loc``: the smallest distance of one of its boxes' centre from the image centre, over the
    half diagonal. NaN where the label has no box or the image no ``width`` / ``height``.
    """
    row = {image_id: i for i, image_id in enumerate(order)}
    wh = {}
    for img in data.get("images", []):
        if isinstance(img, dict) and img.get("width") and img.get("height"):
            wh[img.get("id")] = (float(img["width"]), float(img["height"]))
    size = np.full((len(order), len(column)), np.nan, dtype=np.float32)
    loc = np.full((len(order), len(column)), np.nan, dtype=np.float32)
    for k, ann in enumerate(data["annotations"]):
        box = ann.get("bbox")
        image_id = ann["image_id"]
        if box is None or image_id not in wh:
            continue
        if not isinstance(box, (list, tuple)) or len(box) != 4:
            raise ValueError(f"{path}: annotations[{k}] has bbox {box!r}; expected "
                             f"[x, y, width, height]")
        x, y0, bw, bh = (float(v) for v in box)
        width, height = wh[image_id]
        i, j = row[image_id], column[ann["category_id"]]
        frac = bw * bh / (width * height)
        dist = float(np.hypot(x + bw / 2 - width / 2, y0 + bh / 2 - height / 2)
                     / np.hypot(width / 2, height / 2))
        size[i, j] = np.fmax(size[i, j], frac)
        loc[i, j] = np.fmin(loc[i, j], dist)
    return {"size": size, "loc": loc}


def read_coco_split(path, prefix: str = "", instances: bool = False):
    """Labels of one COCO instances file, as ``format_coco.py`` builds them.

    Columns follow the order of ``categories`` in the file (category-id order in the official
    files); the rows are the images with at least one annotation, sorted by their id **as a
    string** (the official order; the protocol's split depends on it). Crowd annotations count.

    Args:
        path: ``instances_<split><year>.json``.
        prefix: prepended to each file name in the ids (``"train2014/"``).

    Returns:
        ``(ids, y uint8 N x 80, class names, category ids, number of images without
        annotation)``; the file name of an image is its ``file_name`` in ``images`` (or
        ``COCO_<split><year>_<12-digit id>.jpg`` when the file lists no images). With
        ``instances=True`` a sixth item: ``{"size", "loc"}`` N x 80 arrays of the boxes
        (:func:`_coco_geometry`), for the ``1p_biased:size|loc`` regimes.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, a missing key (named, with the entry's index), an annotation of a
            category the file does not declare, an annotated image not in ``images``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"COCO annotation file {path} does not exist; expected "
                                f"annotations/instances_{{train,val}}2014.json (from "
                                f"annotations_trainval2014.zip) ({listing(path.parent)})")
    try:
        with open(path, "rb") as fh:
            data = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a readable JSON file ({err})") from None
    categories = _require(data, "categories", path, "the file")
    annotations = _require(data, "annotations", path, "the file")
    if not isinstance(categories, list) or not categories:
        raise ValueError(f"{path}: 'categories' must be a non-empty list")
    names, column = [], {}
    for c, cat in enumerate(categories):
        cid = _require(cat, "id", path, f"categories[{c}]")
        name = _require(cat, "name", path, f"categories[{c}]")
        if cid in column:
            raise ValueError(f"{path}: category id {cid} is declared twice (categories[{c}])")
        column[cid] = c
        names.append(str(name))
    file_names = None
    if "images" in data:
        file_names = {}
        for k, img in enumerate(data["images"]):
            file_names[_require(img, "id", path, f"images[{k}]")] = \
                _require(img, "file_name", path, f"images[{k}]")
    labels: dict[int, list[int]] = {}
    for k, ann in enumerate(annotations):
        image_id = _require(ann, "image_id", path, f"annotations[{k}]")
        cid = _require(ann, "category_id", path, f"annotations[{k}]")
        if cid not in column:
            raise ValueError(f"{path}: annotations[{k}] has category_id {cid!r}, which "
                             f"'categories' does not declare")
        labels.setdefault(image_id, []).append(column[cid])
    order = sorted(labels, key=str)
    stem = path.stem.replace("instances_", "")          # e.g. train2014
    ids = []
    for image_id in order:
        if file_names is None:
            ids.append(f"{prefix}COCO_{stem}_{int(image_id):012d}.jpg")
        elif image_id in file_names:
            ids.append(prefix + str(file_names[image_id]))
        else:
            raise ValueError(f"{path}: image {image_id} is annotated but not listed in 'images'")
    y = np.zeros((len(order), len(names)), dtype=np.uint8)
    for i, image_id in enumerate(order):
        y[i, labels[image_id]] = 1
    unannotated = 0 if file_names is None else len(set(file_names) - set(labels))
    if instances:
        return ids, y, names, list(column), unannotated, _coco_geometry(data, path, order,
                                                                         column)
    return ids, y, names, list(column), unannotated


@register("coco", "MS-COCO 2014 images (annotations/instances_*.json): 80 classes; pool = "
          "train2014, test = val2014", paper="Lin et al. 2014; " + COLE, tags=TAGS)
def load_coco(root, year: str | int = 2014, skip_missing: bool = False,
              skip_corrupt: bool = False) -> Dataset:
    """MS-COCO from the official files, labelled as ``format_coco.py`` labels it.

    Args:
        root: the folder holding ``annotations/instances_{train,val}<year>.json`` and the image
            folders ``train<year>/`` and ``val<year>/`` (also looked for under ``images/``).
        year: ``2014`` (official for SPML); ``2017`` reads the same way.
        skip_missing, skip_corrupt: drop and count unusable images instead of raising.

    Returns:
        a :class:`Dataset`; ids are ``train2014/<file_name>``; ``meta["unannotated"]`` counts the
        images dropped for having no annotation; ``meta["instances"]`` holds the pool's
        per-label box metadata (``size``, ``loc``; see :func:`read_coco_split`) for the
        ``1p_biased:size|loc`` regimes.

    Raises:
        FileNotFoundError: a missing annotation file, image folder or image (named).
        ValueError: a malformed file (the message names the file and the missing key), or train
            and val files that declare different categories.
    """
    root = Path(root)
    year = str(year)
    parts, found, unannotated = {}, {}, {}
    for part, split in (("pool", "train"), ("test", "val")):
        ann = root / "annotations" / f"instances_{split}{year}.json"
        folder = f"{split}{year}"
        ids, y, names, cat_ids, unannotated[part], *geometry = read_coco_split(
            ann, prefix=folder + "/", instances=part == "pool")
        if geometry:
            pool_geometry = (ids, geometry[0])
        base = root / "images" if not (root / folder).is_dir() and \
            (root / "images" / folder).is_dir() else root
        if not (base / folder).is_dir():
            raise FileNotFoundError(f"COCO image folder {root / folder} does not exist (nor "
                                    f"{root / 'images' / folder}); unpack {folder}.zip in {root} "
                                    f"({listing(root)})")
        found[part] = (names, cat_ids, ann)
        parts[part] = (_join(base, ids), ids, y)
    (names, cat_ids, ann_pool), (names_t, cat_ids_t, ann_test) = found["pool"], found["test"]
    if names != names_t or cat_ids != cat_ids_t:
        raise ValueError(f"{ann_pool} and {ann_test} declare different categories; both must "
                         f"list the same categories in the same order")
    meta = {"source": "coco", "root": str(root), "year": year, "unannotated": unannotated,
            "category_ids": cat_ids}
    ds = _dataset("coco", parts["pool"], parts["test"], names, skip_missing=skip_missing,
                  skip_corrupt=skip_corrupt, meta=meta)
    row = {image: i for i, image in enumerate(pool_geometry[0])}   # rows kept after skipping
    kept = np.array([row[image] for image in ds.pool.ids], dtype=np.int64)
    ds.meta["instances"] = {key: v[kept] for key, v in pool_geometry[1].items()}
    return ds


# ------------------------------------------------------------------ cub
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
def load_cub(root, skip_missing: bool = False, skip_corrupt: bool = False) -> Dataset:
    """CUB-200-2011 as an attribute-labelling task, as ``format_cub.py`` builds it.

    Args:
        root: any folder above ``CUB_200_2011/`` (up to three levels; the folder that holds
            ``images.txt`` is found, so ``CUB_200_2011/CUB_200_2011/`` also works).
            Attribute names come from ``attributes.txt`` next to that folder or inside it.
        skip_missing, skip_corrupt: drop and count unusable images instead of raising.

    Returns:
        a :class:`Dataset`; ids are paths relative to ``images/``.

    Raises:
        FileNotFoundError: no CUB folder, a missing list or image (named).
        ValueError: malformed lines (file and line), inconsistent ids.
    """
    cub = _cub_dir(Path(root))
    rel, is_train, y, names, names_from = read_cub(cub)
    images = cub / "images"
    if not images.is_dir():
        raise FileNotFoundError(f"CUB image folder {images} does not exist ({listing(cub)})")
    paths = _join(images, rel)
    part = {}
    for key, mask in (("pool", is_train), ("test", ~is_train)):
        idx = np.flatnonzero(mask)
        part[key] = ([paths[i] for i in idx], [rel[i] for i in idx], y[idx])
    classes = names if names is not None else [f"class{j}" for j in range(y.shape[1])]
    meta = {"source": "cub", "root": str(cub), "class_names_from": names_from}
    return _dataset("cub", part["pool"], part["test"], classes, skip_missing=skip_missing,
                    skip_corrupt=skip_corrupt, meta=meta)


# ------------------------------------------------------------------ cole_images / nuswide
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


def _load_formatted(root, name: str, image_root, observed, class_names, drop_empty: bool,
                    skip_missing: bool, skip_corrupt: bool, source: str) -> Dataset:
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
    obs_path = _observed_file(root, observed)
    z = None if obs_path is None else read_observed(obs_path, y, root /
                                                    "formatted_train_labels.npy")
    classes, names_from = _class_names(root, name, y.shape[1], class_names)
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
    return _dataset(name, (_join(base, ids), ids, y), (_join(base, ids_t), ids_t, yt), classes,
                    skip_missing=skip_missing, skip_corrupt=skip_corrupt, meta=meta,
                    pool_observed=z)


@register("cole_images", "a Cole et al. dataset folder as images: formatted_{train,val}_"
          "{images,labels}.npy (+ the shipped observed labels) and the dataset's images",
          paper=COLE, tags=TAGS)
def load_cole_images(root, name: str | None = None, image_root=None,
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
    return _load_formatted(root, name or root.resolve().name, image_root, observed, class_names,
                           drop_empty, skip_missing, skip_corrupt, "cole_images")


@register("nuswide", "NUS-WIDE images with the published formatted lists (formatted_{train,val}_"
          "{images,labels}.npy) and Flickr/; 81 concepts; rows without a positive kept",
          paper="Chua et al. 2009; " + COLE, tags=TAGS)
def load_nuswide(root, image_root=None, observed: str | None = "uniform", class_names=None,
                 drop_empty: bool = False, skip_missing: bool = False,
                 skip_corrupt: bool = False) -> Dataset:
    """NUS-WIDE as published for SPML: the authors re-crawled the images, so the sets are the
    formatted lists they distribute (``formatted_{train,val}_images.npy``: paths relative to
    ``Flickr/``; ``formatted_{train,val}_labels.npy``: 0/1 over the 81 concepts), read with
    the images unpacked from ``Flickr.zip`` into ``<root>/Flickr``.

    Rows without a positive are **kept** by default, as in the official lists (the protocol
    gives them no observed positive, METHODS.md section 2; they remain negatives for every class
    at evaluation); ``drop_empty=True`` drops them. Images of the lists that a local copy of
    ``Flickr.zip`` lacks can be dropped and counted with ``skip_missing=True``.

    Class names: ``class_names=`` or ``class_names.txt`` in the folder (the published lists
    carry none), else ``class{j}``. Other arguments as :func:`load_cole_images`.
    """
    return _load_formatted(Path(root), "nuswide", image_root, observed, class_names,
                           drop_empty, skip_missing, skip_corrupt, "nuswide")


# ------------------------------------------------------------------ csv
#: A first row is a header when its first cell is one of these (any case).
CSV_HEADERS = ("path", "image", "image_path", "file", "filename", "file_name", "img")
CSV_NAME_SEPARATORS = (";", "|")


def _split_names(cell: str) -> list[str]:
    for sep in CSV_NAME_SEPARATORS[1:]:
        cell = cell.replace(sep, CSV_NAME_SEPARATORS[0])
    return [n.strip() for n in cell.split(CSV_NAME_SEPARATORS[0]) if n.strip()]


def read_image_csv(path, classes: Sequence[str] | None = None, delimiter: str | None = None):
    """Image paths and their positive class names from a CSV file.

    Form: one row per image, ``<path>,<name>[,<name>...]``; a cell may also hold several names
    separated by ``;`` or ``|`` (``img.jpg,"cat;dog"``). Names may contain spaces
    (``traffic light``); surrounding spaces are dropped. A row with no name is an image without
    a positive. Rows that repeat a path add their names to the first (so the long form, one
    ``path,name`` row per label, works too). An optional header row is recognised by its first
    cell (:data:`CSV_HEADERS`). Delimiter: tab for ``.tsv`` files, else comma.

    Args:
        path: the CSV file.
        classes: the classes in column order; a name outside them is an error. Default: the
            sorted set of the names found.
        delimiter: the field separator (default from the extension).

    Returns:
        ``(paths as written, y uint8 N x L, classes)``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: no row, an empty path cell, or an unknown class name (the message names the
            file, the line and the known classes).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image list {path} does not exist; expected a CSV file with one "
                                f"row per image: <path>,<class name>[;<class name>...]")
    if delimiter is None:
        delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(fh, delimiter=delimiter))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 text file ({err})") from None
    except csv.Error as err:
        raise ValueError(f"{path}: not a readable CSV file ({err})") from None
    entries: dict[str, list] = {}
    first_line: dict[str, int] = {}
    start = 1 if rows and rows[0] and rows[0][0].strip().lower() in CSV_HEADERS else 0
    for lineno, row in enumerate(rows[start:], start=start + 1):
        if not row or not any(c.strip() for c in row):
            continue
        image = row[0].strip()
        if not image:
            raise ValueError(f"{path}, line {lineno}: empty image path (expected "
                             f"<path>,<class name>...)")
        names = [n for cell in row[1:] for n in _split_names(cell)]
        first_line.setdefault(image, lineno)
        entries.setdefault(image, []).extend((lineno, n) for n in names)
    if not entries:
        raise ValueError(f"{path}: no image row (expected <path>,<class name>[;<class name>...] "
                         f"per row, optionally after a header such as 'path,labels')")
    if classes is None:
        classes = sorted({n for names in entries.values() for _, n in names})
    classes = list(classes)
    column = {c: j for j, c in enumerate(classes)}
    images = list(entries)
    y = np.zeros((len(images), len(classes)), dtype=np.uint8)
    for i, image in enumerate(images):
        for lineno, n in entries[image]:
            j = column.get(n)
            if j is None:
                shown = ", ".join(classes[:10]) + (f", ... ({len(classes)} in all)"
                                                   if len(classes) > 10 else "")
                raise ValueError(f"{path}, line {lineno}: unknown class name {n!r} (image "
                                 f"{image}); known classes: {shown or 'none'}. Fix the name or "
                                 f"declare every class with class_names=")
            y[i, j] = 1
    return images, y, classes


@register("csv", "your own images: a CSV with one row per image (path, class names); test CSV "
          "given or carved out (0.3, seed 1200)", paper="Cole et al. 2021 (protocol)",
          tags=TAGS)
def load_csv_images(path, test_path=None, image_root=None, test_image_root=None,
                    class_names=None, test_fraction: float = TEST_FRACTION,
                    seed: int = OFFICIAL_SEED, name: str = "csv", delimiter: str | None = None,
                    skip_missing: bool = False, skip_corrupt: bool = False) -> Dataset:
    """Images listed in a CSV file with their full labels (form: :func:`read_image_csv`).

    Args:
        path: the CSV of the training images (the pool).
        test_path: the CSV of the evaluation images. Without it, the test set is carved out of
            the rows with the Cole split (``cole_split(N, test_fraction, seed)``: 0.3, seed 1200,
            as for yeast), and the rest is the pool.
        image_root, test_image_root: the folders relative paths are resolved against (default:
            each CSV's own folder); absolute paths are used as they are.
        class_names: the classes in column order (list or text file, one per line). Default: the
            sorted names of the training CSV; the test CSV may only use those.
        test_fraction, seed: the carve-out.
        name: the dataset's name.
        delimiter: field separator (default: tab for ``.tsv``, else comma).
        skip_missing, skip_corrupt: drop and count unusable images instead of raising.

    Returns:
        a :class:`Dataset`; ``ids`` are the paths as written in the CSV.

    Raises:
        FileNotFoundError: a missing CSV or image (named).
        ValueError: an unknown class name (file and line), an empty CSV, too few rows to carve a
            test set.

    >>> import tempfile
    >>> from pathlib import Path
    >>> from PIL import Image
    >>> d = Path(tempfile.mkdtemp())
    >>> for i in range(10):
    ...     Image.new("RGB", (8, 8)).save(d / f"{i}.png")
    >>> _ = (d / "labels.csv").write_text("path,labels\\n" + "".join(
    ...     f"{i}.png,{'cat;dog' if i % 2 else 'dog'}\\n" for i in range(10)))
    >>> ds = load_csv_images(d / "labels.csv")
    >>> ds.class_names, len(ds.pool), len(ds.test), ds.pool.ids[:2]
    (['cat', 'dog'], 7, 3, ['1.png', '2.png'])
    """
    path = Path(path)
    classes = resolve_class_names(class_names)
    rel, y, classes = read_image_csv(path, classes, delimiter)
    base = Path(image_root) if image_root is not None else path.parent
    paths = _join(base.resolve(), rel)
    meta = {"source": "csv", "path": str(path), "image_root": str(base)}
    if test_path is None:
        pool, test = _carve(name, paths, rel, y, test_fraction, seed, str(path))
        meta.update(test_fraction=test_fraction, split_seed=seed)
    else:
        test_path = Path(test_path)
        rel_t, yt, _ = read_image_csv(test_path, classes, delimiter)
        base_t = Path(test_image_root) if test_image_root is not None else test_path.parent
        pool, test = (paths, rel, y), (_join(base_t.resolve(), rel_t), rel_t, yt)
        meta.update(test_path=str(test_path), test_image_root=str(base_t))
    return _dataset(name, pool, test, classes, skip_missing=skip_missing,
                    skip_corrupt=skip_corrupt, meta=meta)


# ------------------------------------------------------------------ folder
SPLIT_FOLDER_NAMES = {"train", "training", "val", "valid", "validation", "test", "testing"}


def scan_class_folders(root, classes: Sequence[str] | None = None):
    """The images of a one-folder-per-class tree.

    Each subfolder of ``root`` (hidden ones skipped) is a class; its images (files ending in
    :data:`~spmlkit.data.images.IMAGE_SUFFIXES`, searched recursively, sorted) are labelled with
    it. Other files are ignored and counted.

    Args:
        root: the tree.
        classes: the class columns (default: the sorted subfolder names). A subfolder outside
            them is an error.

    Returns:
        ``(paths relative to root, class index per image, classes, number of ignored files)``.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: no class subfolder, a tree that looks like ``train/``, ``test/`` split
            folders, an unknown class folder, or no image at all.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist; expected one subfolder per "
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
    if classes is None:
        classes = subdirs
    classes = list(classes)
    column = {c: j for j, c in enumerate(classes)}
    unknown = [s for s in subdirs if s not in column]
    if unknown:
        raise ValueError(f"{root / unknown[0]}: class folder {unknown[0]!r} is not one of the "
                         f"training classes ({', '.join(classes[:10])}"
                         f"{', ...' if len(classes) > 10 else ''})")
    rel, label, ignored = [], [], 0
    for cls in subdirs:
        found = []
        for dirpath, dirnames, filenames in os.walk(root / cls):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in filenames:
                if is_image_name(f):
                    found.append(os.path.relpath(os.path.join(dirpath, f), root))
                elif not f.startswith("."):
                    ignored += 1
        found.sort()
        rel.extend(p.replace(os.sep, "/") for p in found)
        label.extend([column[cls]] * len(found))
    if not rel:
        raise ValueError(f"{root}: no image in any class folder (image files end in "
                         f"{', '.join(IMAGE_SUFFIXES)})")
    if loose:
        warnings.warn(f"{root}: {len(loose)} image(s) lie directly in the folder, outside any "
                      f"class folder, and are ignored (first: {loose[0]})", stacklevel=3)
    return rel, np.asarray(label, dtype=np.int64), classes, ignored


def _one_hot(label: np.ndarray, num_classes: int) -> np.ndarray:
    y = np.zeros((len(label), num_classes), dtype=np.uint8)
    y[np.arange(len(label)), label] = 1
    return y


@register("folder", "your own images, one subfolder per class: each image's folder is its single "
          "known positive (test folder given or carved out, 0.3, seed 1200)",
          paper="Cole et al. 2021 (protocol)", tags=TAGS)
def load_folder(root, test_root=None, test_fraction: float = TEST_FRACTION,
                seed: int = OFFICIAL_SEED, name: str = "folder", skip_missing: bool = False,
                skip_corrupt: bool = False) -> Dataset:
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
      lowered that mAP too). Only a fully labelled test set gives the true value.

    Args:
        root: the tree ``<root>/<class>/<image>`` (subfolders within a class are searched too).
        test_root: a second tree with the evaluation images (its class folders must be among
            ``root``'s). Without it, the test set is carved out of all images with the Cole split
            (``cole_split(N, test_fraction, seed)``: 0.3, seed 1200, as for yeast).
        test_fraction, seed: the carve-out.
        name: the dataset's name.
        skip_missing, skip_corrupt: drop and count unusable images (``skip_corrupt`` decodes every
            image once) instead of raising when they are opened.

    Returns:
        a :class:`Dataset`; classes are the sorted folder names; ids are paths relative to the
        tree; ``meta["ignored_files"]`` counts non-image files.

    Raises:
        FileNotFoundError: no such folder.
        ValueError: no class folder, split folders given as root, an unknown class folder in
            ``test_root``, no image.
    """
    root = Path(root)
    rel, label, classes, ignored = scan_class_folders(root)
    y = _one_hot(label, len(classes))
    paths = _join(root.resolve(), rel)
    meta = {"source": "folder", "root": str(root), "labels": "folder_class_only",
            "ignored_files": {"pool": ignored}}
    if test_root is None:
        pool, test = _carve(name, paths, rel, y, test_fraction, seed, str(root))
        meta.update(test_fraction=test_fraction, split_seed=seed)
    else:
        test_root = Path(test_root)
        rel_t, label_t, _, ignored_t = scan_class_folders(test_root, classes)
        pool = (paths, rel, y)
        test = (_join(test_root.resolve(), rel_t), rel_t, _one_hot(label_t, len(classes)))
        meta.update(test_root=str(test_root))
        meta["ignored_files"]["test"] = ignored_t
    empty = [c for j, c in enumerate(classes) if not pool[2][:, j].any()]
    if empty:
        meta["classes_without_pool_images"] = empty
    return _dataset(name, pool, test, classes, skip_missing=skip_missing,
                    skip_corrupt=skip_corrupt, meta=meta)
