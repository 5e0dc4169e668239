"""The offline image sets: fmnist_mosaic (Debian dataset-fashion-mnist) and mdi_icons (@mdi/svg).

Tests that need the real packages skip with the install command when they are missing;
`make test` installs @mdi/svg into .cache/npm; Debian's dataset-fashion-mnist only with
`make test SYSTEM_DEPS=1` (as CI runs it) or `make fmnist-data`.
"""
import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from spmlkit.data import DATASETS
from spmlkit.loading import load_dataset
from spmlkit.data import fmnist_mosaic, mdi_icons


def _have_fmnist() -> bool:
    try:
        fmnist_mosaic.fmnist_dir()
    except FileNotFoundError:
        return False
    return True


needs_fmnist = pytest.mark.skipif(
    not _have_fmnist(), reason=f"Fashion-MNIST not installed ({fmnist_mosaic.FMNIST_DIR}): "
    f"`make test SYSTEM_DEPS=1` or `make fmnist-data` installs Debian's dataset-fashion-mnist")


def _mdi_package():
    try:
        return mdi_icons.mdi_svg_dir()
    except FileNotFoundError:
        return None


def _have_cairosvg() -> bool:
    try:
        mdi_icons.require_cairosvg()
    except (ModuleNotFoundError, OSError):
        return False
    return True


needs_cairosvg = pytest.mark.skipif(not _have_cairosvg(),
                                    reason="cairosvg missing: pip install -e '.[images]'")
needs_mdi = pytest.mark.skipif(
    _mdi_package() is None or not _have_cairosvg(),
    reason="@mdi/svg or cairosvg missing: run `make mdi-icons` (npm install --prefix "
    ".cache/npm @mdi/svg) and pip install -e '.[images]'")

SMALL = dict(n_pool=24, n_test=10)


@pytest.fixture(scope="module")
def small_mosaics(tmp_path_factory):
    if not _have_fmnist():
        pytest.skip(f"Fashion-MNIST not installed ({fmnist_mosaic.FMNIST_DIR}): `make test "
                    "SYSTEM_DEPS=1` or `make fmnist-data` installs Debian's dataset-fashion-mnist")
    cache = tmp_path_factory.mktemp("cache")
    return cache, load_dataset("fmnist_mosaic", cache_dir=cache, seed=5, **SMALL)


def test_both_sources_are_registered_as_embedded_image_sets():
    for name in ("fmnist_mosaic", "mdi_icons"):
        assert {"images", "embedded"} <= set(DATASETS.get(name).tags)


@needs_fmnist
def test_mosaic_shapes_paths_and_class_names(small_mosaics):
    cache, ds = small_mosaics
    assert (len(ds.pool), len(ds.test)) == (24, 10)
    assert ds.class_names == fmnist_mosaic.FMNIST_CLASSES and ds.pool.y.shape == (24, 10)
    for s in (ds.pool, ds.test):
        assert all(os.path.isabs(p) and p.endswith(i) for p, i in zip(s.x, s.ids))
        with Image.open(s.x[0]) as img:
            assert (img.mode, img.size) == ("L", (56, 56))
    assert set(ds.pool.y.sum(axis=1)) <= {1, 2, 3, 4} and ds.pool.y.sum(axis=1).min() >= 1


@needs_fmnist
def test_mosaic_labels_are_the_classes_of_the_tiles_found_in_the_idx_data(small_mosaics):
    """Cut every PNG into its four tiles, look each tile up in the official IDX images by its
    pixels, and compare the official labels with the mosaic's label row."""
    _, ds = small_mosaics
    for labelled, split in ((ds.pool, "train"), (ds.test, "test")):
        images, labels = fmnist_mosaic.read_fmnist(split)
        owners: dict[bytes, set] = {}
        for img, lab in zip(images, labels):
            owners.setdefault(img.tobytes(), set()).add(int(lab))
        for path, row in zip(labelled.x, labelled.y):
            with Image.open(path) as img:
                mosaic = np.array(img)
            classes = set()
            for r in (0, 28):
                for c in (0, 28):
                    found = owners.get(mosaic[r:r + 28, c:c + 28].tobytes())
                    assert found is not None, f"{path}: tile at ({r}, {c}) is not a {split} image"
                    classes |= found
            assert classes == set(np.flatnonzero(row).tolist()), path


@needs_fmnist
def test_cached_tile_indices_rebuild_the_mosaics(small_mosaics):
    _, ds = small_mosaics
    folder = Path(ds.meta["cache"])
    images, labels = fmnist_mosaic.read_fmnist("train")
    tiles = np.load(folder / "pool_tiles.npy")
    for i in (0, 7, 23):
        with Image.open(ds.pool.x[i]) as img:
            assert np.array_equal(np.array(img), fmnist_mosaic.compose_mosaic(images, tiles[i]))
    assert np.array_equal(fmnist_mosaic.mosaic_labels(labels, tiles), ds.pool.y)


@needs_fmnist
def test_same_seed_same_files_other_seed_differs(small_mosaics, tmp_path):
    _, ds = small_mosaics
    again = load_dataset("fmnist_mosaic", cache_dir=tmp_path / "a", seed=5, **SMALL)
    assert np.array_equal(again.pool.y, ds.pool.y) and np.array_equal(again.test.y, ds.test.y)
    assert all(Path(a).read_bytes() == Path(b).read_bytes()
               for a, b in zip(again.pool.x + again.test.x, ds.pool.x + ds.test.x))
    other = load_dataset("fmnist_mosaic", cache_dir=tmp_path / "b", seed=6, **SMALL)
    assert not np.array_equal(other.pool.y, ds.pool.y)
    # the test set does not depend on the pool size (separate random streams)
    bigger = load_dataset("fmnist_mosaic", cache_dir=tmp_path / "c", seed=5, n_pool=30,
                          n_test=10)
    assert np.array_equal(bigger.test.y, ds.test.y)
    assert np.array_equal(bigger.pool.y[:24], ds.pool.y)     # the first draws are shared


@needs_fmnist
def test_cache_is_reused_not_rewritten(small_mosaics):
    cache, ds = small_mosaics
    folder = Path(ds.meta["cache"])
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    before = {p: p.stat().st_mtime_ns for p in files}
    again = load_dataset("fmnist_mosaic", cache_dir=cache, seed=5, **SMALL)
    assert again.pool.x == ds.pool.x
    assert {p: p.stat().st_mtime_ns for p in files} == before
    assert sorted(p for p in folder.rglob("*") if p.is_file()) == files
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []   # no temp left


@needs_fmnist
def test_a_deleted_cached_file_is_named(small_mosaics, tmp_path):
    ds = load_dataset("fmnist_mosaic", cache_dir=tmp_path, seed=5, **SMALL)
    os.remove(ds.test.x[3])
    with pytest.raises(FileNotFoundError, match="test/000003.png.*delete that folder"):
        load_dataset("fmnist_mosaic", cache_dir=tmp_path, seed=5, **SMALL)


@needs_fmnist
def test_a_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    real = fmnist_mosaic.read_fmnist

    def fail_on_test(split, root=None):
        if split == "test":
            raise ValueError("simulated failure")
        return real(split, root)

    monkeypatch.setattr(fmnist_mosaic, "read_fmnist", fail_on_test)  # where the build looks
    with pytest.raises(ValueError, match="simulated"):
        load_dataset("fmnist_mosaic", cache_dir=tmp_path, **SMALL)
    assert list(tmp_path.iterdir()) == []


def test_missing_debian_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(fmnist_mosaic, "FMNIST_DIR", tmp_path / "not-installed")
    with pytest.raises(FileNotFoundError,
                       match=r"not-installed/train-images-idx3-ubyte\.gz.*apt-get install "
                             r"--no-install-recommends dataset-fashion-mnist"):
        load_dataset("fmnist_mosaic", cache_dir=tmp_path / "cache", **SMALL)
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []


def test_corrupt_idx_file_is_named(tmp_path):
    bad = tmp_path / "train-images-idx3-ubyte.gz"
    with gzip.open(bad, "wb") as fh:
        fh.write(bytes([0, 0, 8, 3]) + (5).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
                 + bytes(100))
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz.*shape \(5, 28, 28\)"):
        fmnist_mosaic.read_idx(bad)
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz: cannot read"):
        fmnist_mosaic.read_idx(bad)


def test_draw_mosaics_respects_the_class_range():
    labels = np.repeat(np.arange(10), 5)
    for lo, hi in ((1, 1), (2, 3), (4, 4)):
        tiles = fmnist_mosaic.draw_mosaics(labels, 40, np.random.RandomState(0), lo, hi)
        counts = fmnist_mosaic.mosaic_labels(labels, tiles).sum(axis=1)
        assert counts.min() == lo and counts.max() == hi
    with pytest.raises(ValueError, match="min_classes"):
        fmnist_mosaic.draw_mosaics(labels, 3, np.random.RandomState(0), 3, 2)


# ---------------------------------------------------------------------------------------------
# mdi_icons

@needs_mdi
def test_mdi_tiny_build(tmp_path):
    ds = load_dataset("mdi_icons", limit=12, size=32, cache_dir=tmp_path)
    assert (len(ds.pool), len(ds.test)) == (8, 4)          # Cole split, fraction 0.3
    _, icons = mdi_icons.read_mdi_meta(_mdi_package())
    _, classes, _ = mdi_icons.mdi_labels(icons, 30)
    assert ds.class_names == classes and len(classes) >= 10
    tags = dict(icons)
    for s in (ds.pool, ds.test):
        assert (s.y.sum(axis=1) >= 1).all()
        for path, row in zip(s.x, s.y):
            name = Path(path).stem
            assert {classes[j] for j in np.flatnonzero(row)} == set(tags[name]) & set(classes)
    with Image.open(ds.pool.x[0]) as img:
        assert (img.mode, img.size) == ("RGB", (32, 32))
        arr = np.array(img)
    assert arr.min() < 60 and arr.max() == 255              # a dark icon on white
    assert ds.meta["skipped"] == 0


@needs_mdi
def test_mdi_cache_reused(tmp_path):
    first = load_dataset("mdi_icons", limit=4, size=16, cache_dir=tmp_path)
    stamp = {p: os.stat(p).st_mtime_ns for p in first.pool.x}
    again = load_dataset("mdi_icons", limit=4, size=16, cache_dir=tmp_path)
    assert again.pool.x == first.pool.x
    assert {p: os.stat(p).st_mtime_ns for p in again.pool.x} == stamp


SVG = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24">'
       '<path d="M{0},4H20V20H{0}Z"/></svg>')


@needs_cairosvg
def test_mdi_broken_icons_are_skipped_and_counted(tmp_path):
    pkg = tmp_path / "svg-pkg"
    (pkg / "svg").mkdir(parents=True)
    meta = [{"name": f"good{i}", "tags": ["Box"], "deprecated": False} for i in range(5)]
    meta += [{"name": "missing", "tags": ["Box"], "deprecated": False},
             {"name": "broken", "tags": ["Box"], "deprecated": False},
             {"name": "old", "tags": ["Box"], "deprecated": True},
             {"name": "untagged", "tags": [], "deprecated": False}]
    for i in range(5):
        (pkg / "svg" / f"good{i}.svg").write_text(SVG.format(4 + i))
    (pkg / "svg" / "broken.svg").write_text("<svg this is not xml")
    (pkg / "meta.json").write_text(json.dumps(meta))
    ds = load_dataset("mdi_icons", svg_dir=pkg, min_count=2, size=16, cache_dir=tmp_path / "c")
    assert ds.class_names == ["Box"] and ds.meta["skipped"] == 2
    assert sorted(Path(p).stem for p in ds.pool.x + ds.test.x) == [f"good{i}" for i in range(5)]
    manifest = json.loads((Path(ds.meta["cache"]) / "manifest.json").read_text())
    assert sorted(s["icon"] for s in manifest["skipped"]) == ["broken", "missing"]


def test_mdi_missing_package_names_the_npm_command(tmp_path, monkeypatch):
    monkeypatch.setenv(mdi_icons.MDI_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"nowhere/meta\.json.*npm install --prefix .*"
                                                r"@mdi/svg"):
        load_dataset("mdi_icons", cache_dir=tmp_path)
    monkeypatch.delenv(mdi_icons.MDI_ENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mdi_icons, "__file__", str(tmp_path / "a" / "b" / "c" / "d.py"))
    with pytest.raises(FileNotFoundError, match=r"@mdi/svg was not found.*npm install --prefix "
                                                r".*make mdi-icons"):
        load_dataset("mdi_icons", cache_dir=tmp_path)


def test_mdi_labels_keep_frequent_tags_only():
    icons = [("a", ["X", "Y"]), ("b", ["X"]), ("c", ["Z"]), ("d", ["Y", "X"])]
    names, classes, y = mdi_icons.mdi_labels(icons, min_count=2)
    assert names == ["a", "b", "d"] and classes == ["X", "Y"]
    assert y.tolist() == [[1, 1], [1, 0], [1, 1]]
    with pytest.raises(ValueError, match="lower min_count"):
        mdi_icons.mdi_labels(icons, min_count=5)
