"""Two real multi-label image sets that need no download from the internet at run time.

Each source has its own module (:mod:`~spmlkit.data.fmnist_mosaic`,
:mod:`~spmlkit.data.mdi_icons`; the cache they share is :mod:`~spmlkit.data.offline_cache`);
this module imports both, which registers them, and re-exports their names.

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
"""
from __future__ import annotations

from .fmnist_mosaic import FMNIST_CLASSES, FMNIST_DIR, FMNIST_FILES, FMNIST_INSTALL, \
    FOREGROUND_LEVEL, compose_mosaic, draw_mosaics, fmnist_dir, load_fmnist_mosaic, \
    mosaic_instances, mosaic_labels, read_fmnist, read_idx
from .mdi_icons import MDI_ENV, MDI_SVG_VERSION, MDI_TEST_FRACTION, require_cairosvg, \
    load_mdi_icons, mdi_labels, mdi_svg_dir, read_mdi_meta, render_svg
from .offline_cache import FORMAT_VERSION, cache_root

__all__ = ["FMNIST_CLASSES", "FMNIST_DIR", "FMNIST_FILES", "FMNIST_INSTALL", "FOREGROUND_LEVEL",
           "FORMAT_VERSION", "MDI_ENV", "MDI_SVG_VERSION", "MDI_TEST_FRACTION",
           "require_cairosvg", "cache_root", "compose_mosaic", "draw_mosaics", "fmnist_dir",
           "load_fmnist_mosaic", "load_mdi_icons", "mdi_labels", "mdi_svg_dir",
           "mosaic_instances", "mosaic_labels", "read_fmnist", "read_idx", "read_mdi_meta",
           "render_svg"]
