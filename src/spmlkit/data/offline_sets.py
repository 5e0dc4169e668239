"""Two real multi-label image sets that need no download from the internet at run time.

Both are built once from a package that a registry carries, written as PNG files into a cache
folder, and reused. The cache folder is ``cache_dir`` if given, else ``$SPMLKIT_CACHE``, else
``~/.cache/spmlkit``; each build goes into ``<cache>/<key>/`` where the key names every parameter
that changes the files. A build is written into a temporary folder next to it and renamed into
place, so an interrupted build never leaves a half-written set behind, and two processes building
the same set at once both end up using one complete copy.

``fmnist_mosaic``
    Fashion-MNIST (Xiao et al. 2017) from Debian's ``dataset-fashion-mnist`` (IDX files in
    ``/usr/share/datasets/fashion-mnist``). Each example is a 2 x 2 mosaic of 28 x 28 images
    (56 x 56 grayscale PNG); its labels are the set of classes of its four tiles (10 classes,
    Fashion-MNIST's names). For each mosaic, ``k`` is drawn uniformly from
    ``min_classes..max_classes`` (default 1..4), then ``k`` distinct classes, then the four tiles'
    classes (every chosen class at least once, in shuffled positions), then for each tile the
    next image of its class from a per-class random permutation (an image is reused only once
    its class is exhausted). The pool (default 4,000 mosaics) comes from the official 60,000
    training images with ``RandomState([seed, 0])``, the test set (default 1,000) from the
    official 10,000 test images with ``RandomState([seed, 1])``, so changing one size leaves the
    other set unchanged. The cache folder also keeps ``{pool,test}_tiles.npy`` (the N x 4 source
    indices, row-major: top-left, top-right, bottom-left, bottom-right) to rebuild any mosaic.

``mdi_icons``
    Material Design Icons from the npm package ``@mdi/svg`` (pinned to
    :data:`MDI_SVG_VERSION` by the project's set-up; SVG files in ``svg/`` and ``meta.json``
    whose per-icon ``tags`` are the icon's categories, e.g. "Home Automation"). Deprecated icons
    are left out; classes are the tags carried by at least ``min_count`` (default 30) of the
    remaining icons, in alphabetical order; an icon is kept if it has at least one kept tag
    (7.4.47: 7,188 non-deprecated icons, 5,074 kept, 52 classes, 1.28 tags per icon; pool
    3,552 / test 1,522). Icons are rendered with cairosvg at
    ``size`` x ``size`` (default 64), black on white, as RGB PNG. There is no official split,
    so the Cole split (fraction 0.3, seed 1200) over the icons sorted by name gives pool and
    test. ``limit`` keeps a seeded random subset of that many icons (for tests and quick demos;
    the classes stay those of the whole catalogue).

>>> tiles = draw_mosaics(np.repeat(np.arange(10), 3), 5, np.random.RandomState(0))
>>> tiles.shape
(5, 4)
"""
from __future__ import annotations

import functools
import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..labels import OFFICIAL_SEED
from .base import Dataset, LabelledSet, cole_split
from .registry import register

FORMAT_VERSION = 1           # bump when the files a build writes change

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
FMNIST_INSTALL = "sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist"
FMNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                  "Sneaker", "Bag", "Ankle boot"]

MDI_SVG_VERSION = "7.4.47"
MDI_ENV = "SPMLKIT_MDI_SVG"
MDI_TEST_FRACTION = 0.3


# ---------------------------------------------------------------------------------------------
# the cache

def cache_root(cache_dir=None) -> Path:
    """``cache_dir``, else ``$SPMLKIT_CACHE``, else ``~/.cache/spmlkit``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SPMLKIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "spmlkit"


def _build_atomically(final: Path, build) -> None:
    """Run ``build(tmp_folder)`` and rename the folder to ``final``; if another process put a
    complete ``final`` there first, keep that one and drop ours."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)                      # mkdtemp makes it private
        try:
            os.rename(tmp, final)
        except OSError as err:
            if not (final / "manifest.json").is_file():
                raise OSError(f"cannot move the built set into {final} ({err}); if that folder "
                              f"exists without a manifest.json it is an incomplete copy: "
                              f"delete it and load again") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _read_manifest(folder: Path, params: dict) -> dict | None:
    """The manifest of a complete cached build with these parameters, else None."""
    path = folder / "manifest.json"
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: unreadable cache manifest ({err}); delete the folder "
                         f"{folder} to rebuild it") from None
    if manifest.get("params") != params:
        raise ValueError(f"{path}: the cached set was built with {manifest.get('params')}, "
                         f"not {params}; delete the folder {folder} to rebuild it")
    return manifest


def _check_files(folder: Path, names: list[str]) -> list[str]:
    paths = [str(folder / n) for n in names]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"{missing[0]} (and {len(missing) - 1} more) missing from the "
                                f"cached set {folder}; delete that folder to rebuild it")
    return paths


def _write_manifest(folder: Path, manifest: dict) -> None:
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST mosaics

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
    above :data:`FOREGROUND_LEVEL`) as a fraction of the mosaic, the largest over the label's
    tiles. ``loc``: the distance of the object's foreground centroid (in mosaic coordinates) from
    the mosaic centre over the half diagonal, the smallest over the label's tiles. The four tile
    centres are equally far from the mosaic centre, so it is where the object sits in its tile
    (its shape's mass centre) that decides, a weaker bias than on COCO. NaN where a label is
    absent.

    Args:
        images: the source images (M x h x w uint8); ``labels`` their classes (M).
        tiles: N x 4 indices into them, row-major (top-left, top-right, bottom-left,
            bottom-right), as :func:`draw_mosaics` returns.

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
    _write_manifest(tmp, manifest)


@register("fmnist_mosaic", "Fashion-MNIST 2x2 mosaics (Debian dataset-fashion-mnist): 56x56 "
          "grayscale PNG, 10 classes, labels = classes present; 4,000 pool / 1,000 test",
          paper="Xiao et al. 2017 (Fashion-MNIST)", tags=("images", "embedded"))
def load_fmnist_mosaic(n_pool: int = 4000, n_test: int = 1000, min_classes: int = 1,
                       max_classes: int = 4, seed: int = OFFICIAL_SEED, root=None,
                       cache_dir=None) -> Dataset:
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
        pool's per-label instance metadata (:func:`mosaic_instances`; it reads the
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
    manifest = _read_manifest(folder, params)
    if manifest is None:
        fmnist_dir(root)                                  # fail before making any folder
        _build_atomically(folder, lambda tmp: _build_fmnist(tmp, params, root))
        manifest = _read_manifest(folder, params)
    folder = folder.resolve()
    sets = {}
    for name in ("pool", "test"):
        y = np.load(folder / f"{name}_labels.npy")
        ids = [f"{name}/{i:06d}.png" for i in range(len(y))]
        sets[name] = LabelledSet(_check_files(folder, ids), y, list(FMNIST_CLASSES), ids,
                                 f"fmnist_mosaic {name} ({folder})")
    tiles_file = folder / "pool_tiles.npy"

    def instances() -> dict:                 # computed only when a biased regime needs it
        images, labels = read_fmnist("train", root)
        return mosaic_instances(images, labels, np.load(tiles_file), len(FMNIST_CLASSES))

    return Dataset("fmnist_mosaic", sets["pool"], sets["test"],
                   meta={"source": manifest["source"], "cache": str(folder), **params,
                         "instances": instances})


# ---------------------------------------------------------------------------------------------
# Material Design Icons

def _mdi_install_command(cache_dir=None) -> str:
    return f"npm install --prefix {cache_root(cache_dir) / 'npm'} @mdi/svg@{MDI_SVG_VERSION}"


def mdi_svg_dir(svg_dir=None, cache_dir=None) -> Path:
    """The ``@mdi/svg`` package folder: ``svg_dir``, else ``$SPMLKIT_MDI_SVG``, else
    ``<cache>/npm/node_modules/@mdi/svg``, else ``.cache/npm/node_modules/@mdi/svg`` in this
    repository (where ``make image-data`` puts it) or in the working directory."""
    if svg_dir is not None or os.environ.get(MDI_ENV):
        given = Path(svg_dir if svg_dir is not None else os.environ[MDI_ENV]).expanduser()
        if not (given / "meta.json").is_file() or not (given / "svg").is_dir():
            origin = "svg_dir" if svg_dir is not None else f"${MDI_ENV}"
            raise FileNotFoundError(f"{given / 'meta.json'} not found: {origin} must point at a "
                                    f"node_modules/@mdi/svg folder (meta.json and svg/); "
                                    f"install one with: {_mdi_install_command(cache_dir)}")
        return given
    inside = Path("node_modules") / "@mdi" / "svg"
    candidates = [cache_root(cache_dir) / "npm" / inside]
    repo = Path(__file__).resolve().parents[3]
    if (repo / "pyproject.toml").is_file():
        candidates.append(repo / ".cache" / "npm" / inside)
    candidates.append(Path.cwd() / ".cache" / "npm" / inside)
    for folder in candidates:
        if (folder / "meta.json").is_file() and (folder / "svg").is_dir():
            return folder
    tried = ", ".join(str(c) for c in dict.fromkeys(candidates))
    raise FileNotFoundError(f"the npm package @mdi/svg was not found (looked in {tried}); "
                            f"install it with: {_mdi_install_command(cache_dir)}  (or `make "
                            f"image-data` in the repository, or set ${MDI_ENV} to an existing "
                            f"node_modules/@mdi/svg)")


def read_mdi_meta(package: Path) -> tuple[str, list[tuple[str, list[str]]]]:
    """The package version and (name, tags) of every non-deprecated icon, sorted by name."""
    path = Path(package) / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: unreadable ({err}); reinstall @mdi/svg") from None
    if not isinstance(meta, list):
        raise ValueError(f"{path}: expected a list of icons, got {type(meta).__name__}")
    icons = []
    for i, entry in enumerate(meta):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) \
                or not isinstance(entry.get("tags", []), list):
            raise ValueError(f"{path}: icon #{i} lacks a string 'name' or a list 'tags': "
                             f"{str(entry)[:120]}")
        if not entry.get("deprecated", False):
            icons.append((entry["name"], sorted({str(t) for t in entry.get("tags", [])})))
    version = "unknown"
    package_json = Path(package) / "package.json"
    if package_json.is_file():
        try:
            version = str(json.loads(package_json.read_text()).get("version", "unknown"))
        except (OSError, json.JSONDecodeError):
            version = "unknown"
    return version, sorted(icons)


def mdi_labels(icons, min_count: int = 30) -> tuple[list[str], list[str], np.ndarray]:
    """Classes = tags on >= ``min_count`` icons (alphabetical); keep icons with a kept tag.
    Returns (icon names, class names, N x L 0/1 labels)."""
    counts: dict[str, int] = {}
    for _, tags in icons:
        for t in tags:
            counts[t] = counts.get(t, 0) + 1
    classes = sorted(t for t, c in counts.items() if c >= min_count)
    if not classes:
        raise ValueError(f"no icon tag is carried by {min_count} or more icons (largest count "
                         f"{max(counts.values(), default=0)}); lower min_count")
    column = {t: j for j, t in enumerate(classes)}
    names, rows = [], []
    for name, tags in icons:
        cols = [column[t] for t in tags if t in column]
        if cols:
            names.append(name)
            rows.append(cols)
    y = np.zeros((len(names), len(classes)), dtype=np.uint8)
    for i, cols in enumerate(rows):
        y[i, cols] = 1
    return names, classes, y


def render_svg(svg_path: Path, png_path: Path, size: int) -> None:
    """Render one SVG to a ``size`` x ``size`` RGB PNG, black shapes on white."""
    import io

    import cairosvg
    from PIL import Image

    png = cairosvg.svg2png(url=str(svg_path), output_width=size, output_height=size,
                           background_color="white")
    with Image.open(io.BytesIO(png)) as img:
        rgba = img.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    Image.alpha_composite(white, rgba).convert("RGB").save(png_path)


def _require_cairosvg() -> None:
    try:
        import cairosvg  # noqa: F401
    except ModuleNotFoundError:
        raise ModuleNotFoundError("mdi_icons renders SVG with cairosvg, which is not installed: "
                                  "pip install 'spmlkit[images]'  (or: pip install cairosvg; it "
                                  "needs the cairo library, Debian: apt-get install libcairo2)"
                                  ) from None
    except OSError as err:
        raise OSError(f"cairosvg cannot load the cairo library ({err}); install it (Debian: "
                      f"apt-get install libcairo2)") from None


def _build_mdi(tmp: Path, params: dict, package: Path, version: str, names, classes, y) -> None:
    from tqdm import tqdm

    (tmp / "icons").mkdir()
    kept, skipped = [], []
    for i, name in enumerate(tqdm(names, desc="rendering @mdi/svg icons", unit="icon",
                                  disable=None, leave=False)):
        svg = package / "svg" / f"{name}.svg"
        try:
            render_svg(svg, tmp / "icons" / f"{name}.png", params["size"])
        except (OSError, ValueError, SyntaxError) as err:   # missing or malformed SVG
            skipped.append({"icon": name, "file": str(svg), "error": str(err)[:200]})
            continue
        kept.append(i)
    np.save(tmp / "labels.npy", y[kept])
    _write_manifest(tmp, {"params": params, "source": str(package), "version": version,
                          "classes": classes, "icons": [names[i] for i in kept],
                          "skipped": skipped, "format_version": FORMAT_VERSION})


@register("mdi_icons", "Material Design Icons (npm @mdi/svg) rendered with cairosvg: 64x64 "
          "RGB PNG, category tags as labels (tags on >= 30 icons: 52 classes, 5,074 icons)",
          paper="Templarian/MaterialDesign (icon catalogue)", tags=("images", "embedded"))
def load_mdi_icons(size: int = 64, min_count: int = 30, limit: int | None = None,
                   seed: int = OFFICIAL_SEED, svg_dir=None, cache_dir=None) -> Dataset:
    """Build (once) and load the icon set; pool / test by the Cole split (0.3, ``seed``).

    Args:
        size: rendered side in pixels (64).
        min_count: keep tags carried by at least this many non-deprecated icons (30).
        limit: keep a random subset of this many icons (``RandomState(seed)``); None keeps all.
        seed: the pool / test split seed (1200) and the ``limit`` subset's seed.
        svg_dir: the ``@mdi/svg`` package folder (see :func:`mdi_svg_dir` for the default).
        cache_dir: where built sets live (default ``$SPMLKIT_CACHE`` or ``~/.cache/spmlkit``).

    Icons whose SVG is missing or does not render are skipped and counted in
    ``meta["skipped"]`` (listed in the cache folder's ``manifest.json``).
    """
    if isinstance(size, bool) or int(size) != size or size < 8:
        raise ValueError(f"size must be an integer >= 8 pixels, got {size!r}")
    if int(min_count) < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    if limit is not None and int(limit) < 2:
        raise ValueError(f"limit must be at least 2 icons (or None for all), got {limit}")
    package = mdi_svg_dir(svg_dir, cache_dir)
    version, icons = read_mdi_meta(package)
    params = {"size": int(size), "min_count": int(min_count),
              "limit": None if limit is None else int(limit),
              "seed": int(seed) if limit is not None else None, "version": version}
    key = (f"mdi_icons-v{FORMAT_VERSION}-{version}-px{params['size']}-min{params['min_count']}"
           + ("" if limit is None else f"-limit{params['limit']}-seed{params['seed']}"))
    folder = cache_root(cache_dir) / key
    manifest = _read_manifest(folder, params)
    if manifest is None:
        _require_cairosvg()
        names, classes, y = mdi_labels(icons, params["min_count"])
        if limit is not None and limit < len(names):
            keep = np.sort(np.random.RandomState(seed).choice(len(names), int(limit),
                                                              replace=False))
            names, y = [names[i] for i in keep], y[keep]
        _build_atomically(folder, lambda tmp: _build_mdi(tmp, params, package, version, names,
                                                         classes, y))
        manifest = _read_manifest(folder, params)
    folder = folder.resolve()
    ids = [f"icons/{name}.png" for name in manifest["icons"]]
    full = LabelledSet(_check_files(folder, ids), np.load(folder / "labels.npy"),
                       list(manifest["classes"]), ids, f"mdi_icons ({folder})")
    pool_idx, test_idx = cole_split(len(full), MDI_TEST_FRACTION, seed)
    return Dataset("mdi_icons", full.subset(pool_idx), full.subset(test_idx),
                   meta={"source": manifest["source"], "cache": str(folder), **params,
                         "split_seed": int(seed), "test_fraction": MDI_TEST_FRACTION,
                         "skipped": len(manifest["skipped"])})
