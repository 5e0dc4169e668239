"""MS-COCO as a dataset source (``coco``), labelled as the official ``format_coco.py`` does.

Layout: ``annotations/instances_{train,val}2014.json``, ``train2014/``, ``val2014/``; 80 classes
in the order of the file's ``categories`` (category-id order); images without an annotation
dropped; rows sorted by image id *as a string* (as ``format_coco.py``). Pool = train2014
(82,081), test = val2014 (40,137). ``ids`` are ``train2014/COCO_train2014_000000000009.jpg``.
The pool's bounding boxes give the per-label instance metadata (``meta["instances"]``) of the
``1p_biased:size|loc`` regimes.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .protocol import Dataset
from .cole import COCO_CLASSES
from .image_common import COLE, TAGS, image_dataset, join_paths
from .image_files import listing
from .registry import register

__all__ = ["COCO_CLASSES", "load_coco", "read_coco_split"]


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
        (`_coco_geometry`), for the ``1p_biased:size|loc`` regimes.

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
def load_coco(root: str | os.PathLike, year: str | int = 2014, skip_missing: bool = False,
              skip_corrupt: bool = False) -> Dataset:
    """MS-COCO from the official files, labelled as ``format_coco.py`` labels it.

    Args:
        root: the folder holding ``annotations/instances_{train,val}<year>.json`` and the image
            folders ``train<year>/`` and ``val<year>/`` (also looked for under ``images/``).
        year: ``2014`` (official for SPML); ``2017`` reads the same way.
        skip_missing, skip_corrupt: drop and count unusable images instead of raising.

    Returns:
        a [`Dataset`][spmlkit.data.protocol.Dataset]; ids are ``train2014/<file_name>``;
        ``meta["unannotated"]`` counts the images dropped for having no annotation;
        ``meta["instances"]`` holds the pool's per-label box metadata (``size``, ``loc``; see
        `read_coco_split`) for the ``1p_biased:size|loc`` regimes.

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
        parts[part] = (join_paths(base, ids), ids, y)
    (names, cat_ids, ann_pool), (names_t, cat_ids_t, ann_test) = found["pool"], found["test"]
    if names != names_t or cat_ids != cat_ids_t:
        raise ValueError(f"{ann_pool} and {ann_test} declare different categories; both must "
                         f"list the same categories in the same order")
    meta = {"source": "coco", "root": str(root), "year": year, "unannotated": unannotated,
            "category_ids": cat_ids}
    ds = image_dataset("coco", parts["pool"], parts["test"], names, skip_missing=skip_missing,
                       skip_corrupt=skip_corrupt, meta=meta)
    row = {image: i for i, image in enumerate(pool_geometry[0])}   # rows kept after skipping
    kept = np.array([row[image] for image in ds.pool.ids], dtype=np.int64)
    ds.meta["instances"] = {key: v[kept] for key, v in pool_geometry[1].items()}
    return ds
