"""Fashion-MNIST 2 x 2 mosaics as a dataset source (``fmnist_mosaic``), built once into the
cache (`spmlkit.data.offline_cache`) from Debian's ``dataset-fashion-mnist``.

Fashion-MNIST (Xiao et al. 2017) comes as IDX files in ``/usr/share/datasets/fashion-mnist``.
Each example is a 2 x 2 mosaic of 28 x 28 images (56 x 56 grayscale PNG); its labels are the set
of classes of its four tiles (10 classes, Fashion-MNIST's names). For each mosaic, ``k`` is drawn
uniformly from ``min_classes..max_classes`` (default 1..4), then ``k`` distinct classes, then the
four tiles' classes (every chosen class at least once, in shuffled positions), then for each tile
the next image of its class from a per-class random permutation (an image is reused only once
its class is exhausted). The pool (default 4,000 mosaics) comes from the official 60,000
training images with ``RandomState([seed, 0])``, the test set (default 1,000) from the official
10,000 test images with ``RandomState([seed, 1])``, so changing one size leaves the other set
unchanged. The cache folder also keeps ``{pool,test}_tiles.npy`` (the N x 4 source indices,
row-major: top-left, top-right, bottom-left, bottom-right) to rebuild any mosaic.

>>> tiles = draw_mosaics(np.repeat(np.arange(10), 3), 5, np.random.RandomState(0))
>>> tiles.shape
(5, 4)
"""
from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path

import numpy as np

from ..labels import OFFICIAL_SEED
from .protocol import Dataset, LabelledSet
from .offline_cache import FORMAT_VERSION, build_atomically, cache_root, check_files, \
    read_manifest, write_manifest
from .registry import register

__all__ = ["FMNIST_CLASSES", "FMNIST_DIR", "FMNIST_FILES", "FMNIST_INSTALL", "FOREGROUND_LEVEL",
           "compose_mosaic", "draw_mosaics", "fmnist_dir", "load_fmnist_mosaic",
           "mosaic_instances", "mosaic_labels", "read_fmnist", "read_idx"]

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
FMNIST_INSTALL = (
    "sudo apt-get update && sudo apt-get install --no-install-recommends dataset-fashion-mnist")
FMNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                  "Sneaker", "Bag", "Ankle boot"]


def fmnist_dir(root=None) -> Path:
    """The folder holding the four Fashion-MNIST IDX files (``.gz`` or not)."""
    folder = Path(root) if root is not None else FMNIST_DIR
    for images, labels in FMNIST_FILES.values():
        for stem in (images, labels):
            if not (folder / f"{stem}.gz").is_file() and not (folder / stem).is_file():
                hint = ("install Debian's package: " + FMNIST_INSTALL) if root is None else \
                    "point root= at the folder holding the four Fashion-MNIST IDX files"
                raise FileNotFoundError(f"{folder / (stem + '.gz')} not found: the "
                                        f"fmnist_mosaic set needs Fashion-MNIST; {hint}")
    return folder


def read_idx(path) -> np.ndarray:
    """An IDX file of unsigned bytes (``.gz`` or plain) as a numpy array of its stated shape."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as err:
        raise ValueError(f"{path}: cannot read the IDX file ({err}); reinstall it "
                         f"({FMNIST_INSTALL})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (header {data[:4].hex()}, "
                         f"expected 0000 08 <ndim>)")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    size = int(np.prod(shape))
    if len(data) != header + size:
        raise ValueError(f"{path}: header says shape {shape} ({size} bytes) but the file holds "
                         f"{len(data) - header} bytes of data; reinstall it ({FMNIST_INSTALL})")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


@functools.lru_cache(maxsize=4)
def _read_idx_cached(path: str, mtime_ns: int) -> np.ndarray:
    """read_idx, remembered per (file, modification time); the arrays are read-only."""
    return read_idx(path)


def read_fmnist(split: str, root=None) -> tuple[np.ndarray, np.ndarray]:
    """Official ``"train"`` or ``"test"`` images (N x 28 x 28 uint8) and labels (N, 0..9)."""
    if split not in FMNIST_FILES:
        raise ValueError(f"Fashion-MNIST split must be 'train' or 'test', got {split!r}")
    folder = fmnist_dir(root)
    found = []
    for stem in FMNIST_FILES[split]:
        gz = folder / f"{stem}.gz"
        path = gz if gz.is_file() else folder / stem
        found.append(_read_idx_cached(str(path.resolve()), path.stat().st_mtime_ns))
    images, labels = found
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"{folder}: {split} images {images.shape} and labels {labels.shape} "
                         f"do not match (expected N x 28 x 28 and N)")
    if labels.size and labels.max() >= len(FMNIST_CLASSES):
        raise ValueError(f"{folder / FMNIST_FILES[split][1]}: label {int(labels.max())} outside "
                         f"0..{len(FMNIST_CLASSES) - 1}")
    return images, labels


def draw_mosaics(labels: np.ndarray, n: int, rng: np.random.RandomState, min_classes: int = 1,
                 max_classes: int = 4, num_classes: int = 10) -> np.ndarray:
    """Draw ``n`` mosaics over the images with ``labels``: N x 4 indices into them (row-major
    tiles). See the module docstring for the procedure."""
    if not 1 <= min_classes <= max_classes <= 4:
        raise ValueError(f"classes per mosaic must satisfy 1 <= min_classes <= max_classes <= 4, "
                         f"got {min_classes}..{max_classes}")
    if int(n) != n or n < 1:
        raise ValueError(f"number of mosaics must be a positive integer, got {n!r}")
    labels = np.asarray(labels)
    members = [np.flatnonzero(labels == c) for c in range(num_classes)]
    present = np.array([c for c in range(num_classes) if members[c].size])
    if present.size < max_classes:
        raise ValueError(f"only {present.size} classes have images; cannot draw mosaics with "
                         f"{max_classes} classes")
    queues = [np.empty(0, np.int64) for _ in range(num_classes)]
    tiles = np.empty((int(n), 4), dtype=np.int64)
    for i in range(int(n)):
        k = rng.randint(min_classes, max_classes + 1)
        chosen = rng.choice(present, size=k, replace=False)
        tile_classes = np.concatenate([chosen, rng.choice(chosen, size=4 - k)])
        rng.shuffle(tile_classes)
        for t, c in enumerate(tile_classes):
            if queues[c].size == 0:
                queues[c] = rng.permutation(members[c])
            tiles[i, t], queues[c] = queues[c][0], queues[c][1:]
    return tiles


def compose_mosaic(images: np.ndarray, tiles_row) -> np.ndarray:
    """One 2h x 2w mosaic from four images (top-left, top-right, bottom-left, bottom-right)."""
    a, b, c, d = (images[j] for j in tiles_row)
    return np.block([[a, b], [c, d]])


def mosaic_labels(labels: np.ndarray, tiles: np.ndarray, num_classes: int = 10) -> np.ndarray:
    """N x ``num_classes`` 0/1: the classes present among each mosaic's tiles."""
    y = np.zeros((len(tiles), num_classes), dtype=np.uint8)
    y[np.arange(len(tiles))[:, None], np.asarray(labels)[tiles]] = 1
    return y


#: a pixel above this grey level (of 255) is foreground (the object) in a Fashion-MNIST tile
FOREGROUND_LEVEL = 32


def mosaic_instances(images: np.ndarray, labels: np.ndarray, tiles: np.ndarray,
                     num_classes: int = 10) -> dict:
    """Per-label instance metadata of mosaics, for the ``1p_biased:size`` / ``loc`` regimes.

    Each tile is one object instance of its class. ``size``: the object's foreground area (pixels
    above `FOREGROUND_LEVEL`) as a fraction of the mosaic, the largest over the label's
    tiles. ``loc``: the distance of the object's foreground centroid (in mosaic coordinates) from
    the mosaic centre over the half diagonal, the smallest over the label's tiles. The four tile
    centres are equally far from the mosaic centre, so it is where the object sits in its tile
    (its shape's mass centre) that decides, a weaker bias than on COCO. NaN where a label is
    absent.

    Args:
        images: the source images (M x h x w uint8); ``labels`` their classes (M).
        tiles: N x 4 indices into them, row-major (top-left, top-right, bottom-left,
            bottom-right), as `draw_mosaics` returns.

    Returns:
        ``{"size": N x L float32, "loc": N x L float32}``.

    >>> img = np.zeros((2, 4, 4), np.uint8); img[0, :2, :2] = 255; img[1] = 255
    >>> inst = mosaic_instances(img, np.array([0, 1]), np.array([[0, 1, 1, 1]]), 2)
    >>> inst["size"].round(4).tolist()
    [[0.0625, 0.25]]
    """
    tiles = np.asarray(tiles)
    n = len(tiles)
    h, w = images.shape[1:3]
    size = np.full((n, num_classes), np.nan, dtype=np.float32)
    loc = np.full((n, num_classes), np.nan, dtype=np.float32)
    rows, cols = np.mgrid[0:h, 0:w]
    half_diag = float(np.hypot(h, w))                     # the mosaic is 2h x 2w
    for t in range(4):
        fg = images[tiles[:, t]] > FOREGROUND_LEVEL      # N x h x w
        area = fg.sum(axis=(1, 2)).astype(np.float64)
        safe = np.maximum(area, 1.0)
        cy = (fg * rows).sum(axis=(1, 2)) / safe + (t // 2) * h + 0.5
        cx = (fg * cols).sum(axis=(1, 2)) / safe + (t % 2) * w + 0.5
        cy = np.where(area > 0, cy, (t // 2) * h + h / 2)   # an empty tile: its centre
        cx = np.where(area > 0, cx, (t % 2) * w + w / 2)
        dist = np.hypot(cy - h, cx - w) / half_diag
        frac = area / (4 * h * w)
        cls = np.asarray(labels)[tiles[:, t]]
        idx = np.arange(n)
        size[idx, cls] = np.fmax(size[idx, cls], frac)
        loc[idx, cls] = np.fmin(loc[idx, cls], dist)
    return {"size": size, "loc": loc}


def _fmnist_key(params: dict) -> str:
    return (f"fmnist_mosaic-v{FORMAT_VERSION}-n{params['n_pool']}-{params['n_test']}-"
            f"k{params['min_classes']}-{params['max_classes']}-seed{params['seed']}")


def _build_fmnist(tmp: Path, params: dict, root) -> None:
    from PIL import Image

    manifest = {"params": params, "source": str(fmnist_dir(root)), "classes": FMNIST_CLASSES,
                "format_version": FORMAT_VERSION, "sets": {}}
    for name, split, n, stream in (("pool", "train", params["n_pool"], 0),
                                   ("test", "test", params["n_test"], 1)):
        images, labels = read_fmnist(split, root)
        tiles = draw_mosaics(labels, n, np.random.RandomState([params["seed"], stream]),
                             params["min_classes"], params["max_classes"], len(FMNIST_CLASSES))
        (tmp / name).mkdir()
        for i, row in enumerate(tiles):
            Image.fromarray(compose_mosaic(images, row), "L").save(tmp / name / f"{i:06d}.png")
        np.save(tmp / f"{name}_tiles.npy", tiles)
        np.save(tmp / f"{name}_labels.npy", mosaic_labels(labels, tiles, len(FMNIST_CLASSES)))
        manifest["sets"][name] = {"official_split": split, "n": int(n)}
    write_manifest(tmp, manifest)


@register("fmnist_mosaic", "Fashion-MNIST 2x2 mosaics (Debian dataset-fashion-mnist): 56x56 "
          "grayscale PNG, 10 classes, labels = classes present; 4,000 pool / 1,000 test",
          paper="Xiao et al. 2017 (Fashion-MNIST)", tags=("images", "embedded"))
def load_fmnist_mosaic(n_pool: int = 4000, n_test: int = 1000, min_classes: int = 1,
                       max_classes: int = 4, seed: int = OFFICIAL_SEED,
                       root: str | os.PathLike | None = None,
                       cache_dir: str | os.PathLike | None = None) -> Dataset:
    """Build (once) and load the Fashion-MNIST mosaic set.

    Args:
        n_pool: mosaics drawn from the official training images (the pool; 4,000).
        n_test: mosaics drawn from the official test images (the test set; 1,000).
        min_classes, max_classes: the number of distinct classes per mosaic is uniform in
            this range (1..4).
        seed: seeds ``RandomState([seed, 0])`` (pool) and ``RandomState([seed, 1])`` (test).
        root: folder of the Fashion-MNIST IDX files (default: where Debian's package puts them).
        cache_dir: where built sets live (default ``$SPMLKIT_CACHE`` or ``~/.cache/spmlkit``).

    Returns:
        Dataset whose ``x`` are absolute PNG paths and ``ids`` the names relative to the
        cache folder (``pool/000000.png``); ``meta["instances"]`` is a function giving the
        pool's per-label instance metadata (`mosaic_instances`; it reads the
        Fashion-MNIST images, so it runs only when a ``1p_biased:size|loc`` regime asks).

    Raises:
        FileNotFoundError: Fashion-MNIST is not installed (the message gives the command), or a
            cached file went missing (the message names it).
    """
    params = {"n_pool": int(n_pool), "n_test": int(n_test), "min_classes": int(min_classes),
              "max_classes": int(max_classes), "seed": int(seed)}
    if params["n_pool"] < 1 or params["n_test"] < 1:
        raise ValueError(f"n_pool and n_test must be positive, got {n_pool} and {n_test}")
    if not 1 <= params["min_classes"] <= params["max_classes"] <= 4:
        raise ValueError(f"classes per mosaic must satisfy 1 <= min_classes <= max_classes <= 4,"
                         f" got {min_classes}..{max_classes}")
    folder = cache_root(cache_dir) / _fmnist_key(params)
    manifest = read_manifest(folder, params)
    if manifest is None:
        fmnist_dir(root)                                  # fail before making any folder
        build_atomically(folder, lambda tmp: _build_fmnist(tmp, params, root))
        manifest = read_manifest(folder, params)
    folder = folder.resolve()
    sets = {}
    for name in ("pool", "test"):
        y = np.load(folder / f"{name}_labels.npy")
        ids = [f"{name}/{i:06d}.png" for i in range(len(y))]
        sets[name] = LabelledSet(check_files(folder, ids), y, list(FMNIST_CLASSES), ids,
                                 f"fmnist_mosaic {name} ({folder})")
    tiles_file = folder / "pool_tiles.npy"

    def instances() -> dict:                 # computed only when a biased regime needs it
        images, labels = read_fmnist("train", root)
        return mosaic_instances(images, labels, np.load(tiles_file), len(FMNIST_CLASSES))

    return Dataset("fmnist_mosaic", sets["pool"], sets["test"],
                   meta={"source": manifest["source"], "cache": str(folder), **params,
                         "instances": instances})
