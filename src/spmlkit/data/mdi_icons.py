"""Material Design Icons as a dataset source (``mdi_icons``), rendered once into the cache
(`spmlkit.data.offline_cache`) from the npm package ``@mdi/svg``.

The package is pinned to `MDI_SVG_VERSION` by the project's set-up; SVG files in ``svg/``
and ``meta.json`` whose per-icon ``tags`` are the icon's categories, e.g. "Home Automation".
Deprecated icons are left out; classes are the tags carried by at least ``min_count`` (default 30)
of the remaining icons, in alphabetical order; an icon is kept if it has at least one kept tag
(7.4.47: 7,188 non-deprecated icons, 5,074 kept, 52 classes, 1.28 tags per icon; pool 3,552 /
test 1,522). Icons are rendered with cairosvg at ``size`` x ``size`` (default 64), black on
white, as RGB PNG. There is no official split, so the Cole split (fraction 0.3, seed 1200) over
the icons sorted by name gives pool and test. ``limit`` keeps a seeded random subset of that many
icons (for tests and quick demos; the classes stay those of the whole catalogue).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..extras import install_hint
from ..labels import OFFICIAL_SEED
from .protocol import Dataset, LabelledSet, cole_split
from .offline_cache import FORMAT_VERSION, build_atomically, cache_root, check_files, \
    read_manifest, write_manifest
from .registry import register

__all__ = ["MDI_ENV", "MDI_SVG_VERSION", "MDI_TEST_FRACTION", "load_mdi_icons", "mdi_labels",
           "mdi_svg_dir", "read_mdi_meta", "render_svg"]

MDI_SVG_VERSION = "7.4.47"
MDI_ENV = "SPMLKIT_MDI_SVG"
MDI_TEST_FRACTION = 0.3


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
                            f"mdi-icons` in the repository, or set ${MDI_ENV} to an existing "
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


def require_cairosvg() -> None:
    try:
        import cairosvg  # noqa: F401
    except ModuleNotFoundError:
        raise ModuleNotFoundError("mdi_icons renders SVG with cairosvg, which is not installed: "
                                  + install_hint("images", "cairosvg") + "; cairosvg "
                                  "needs the cairo library, Debian: apt-get install libcairo2"
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
    write_manifest(tmp, {"params": params, "source": str(package), "version": version,
                          "classes": classes, "icons": [names[i] for i in kept],
                          "skipped": skipped, "format_version": FORMAT_VERSION})


@register("mdi_icons", "Material Design Icons (npm @mdi/svg) rendered with cairosvg: 64x64 "
          "RGB PNG, category tags as labels (tags on >= 30 icons: 52 classes, 5,074 icons)",
          paper="Templarian/MaterialDesign (icon catalogue)", tags=("images", "embedded"))
def load_mdi_icons(size: int = 64, min_count: int = 30, limit: int | None = None,
                   seed: int = OFFICIAL_SEED, svg_dir: str | os.PathLike | None = None,
                   cache_dir: str | os.PathLike | None = None) -> Dataset:
    """Build (once) and load the icon set; pool / test by the Cole split (0.3, ``seed``).

    Args:
        size: rendered side in pixels (64).
        min_count: keep tags carried by at least this many non-deprecated icons (30).
        limit: keep a random subset of this many icons (``RandomState(seed)``); None keeps all.
        seed: the pool / test split seed (1200) and the ``limit`` subset's seed.
        svg_dir: the ``@mdi/svg`` package folder (see `mdi_svg_dir` for the default).
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
    manifest = read_manifest(folder, params)
    if manifest is None:
        require_cairosvg()
        names, classes, y = mdi_labels(icons, params["min_count"])
        if limit is not None and limit < len(names):
            keep = np.sort(np.random.RandomState(seed).choice(len(names), int(limit),
                                                              replace=False))
            names, y = [names[i] for i in keep], y[keep]
        build_atomically(folder, lambda tmp: _build_mdi(tmp, params, package, version, names,
                                                         classes, y))
        manifest = read_manifest(folder, params)
    folder = folder.resolve()
    ids = [f"icons/{name}.png" for name in manifest["icons"]]
    full = LabelledSet(check_files(folder, ids), np.load(folder / "labels.npy"),
                       list(manifest["classes"]), ids, f"mdi_icons ({folder})")
    pool_idx, test_idx = cole_split(len(full), MDI_TEST_FRACTION, seed)
    return Dataset("mdi_icons", full.subset(pool_idx), full.subset(test_idx),
                   meta={"source": manifest["source"], "cache": str(folder), **params,
                         "split_seed": int(seed), "test_fraction": MDI_TEST_FRACTION,
                         "skipped": len(manifest["skipped"])})
