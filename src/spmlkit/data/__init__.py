"""Dataset sources behind one registry, and the protocol that splits them.

>>> splits = load_splits("yeast")
>>> len(splits.train), len(splits.val), len(splits.test)
(1354, 338, 725)
"""
from __future__ import annotations

# one module per source; importing it registers it (this order is the registry's, which
# `spml list datasets` and the README's table follow)
from . import arrays, cole, offline_sets, yeast  # noqa: F401
from . import voc, coco, cub, cole_images, nuswide, csv_images, folder  # noqa: F401
from . import image_sources  # noqa: F401  (the image sources' names in one place)
from .base import Dataset, LabelledSet, Splits, cole_split, make_splits
from .registry import DATASETS


def load_dataset(name: str, **options) -> Dataset:
    """Load the registered source ``name`` (options are the source's own, e.g. ``root=``).

    ``backbone=`` (and ``features={...}``) turns an image source's paths into cached backbone
    features (:func:`spmlkit.features.load_feature_dataset`)."""
    if options.get("backbone") is not None:
        from ..features import load_feature_dataset

        return load_feature_dataset(name, **options)
    return DATASETS.get(name).factory(**options)


#: ``load_splits`` options that belong to the protocol (:func:`make_splits`), not to the source
PROTOCOL_OPTIONS = ("subsample", "subsample_seed", "class_order")


def load_splits(name: str, regime: str = "1p", seed: int | None = None, **options) -> Splits:
    """Load a source and apply the protocol (observed labels drawn with ``seed``, default 1200).

    Options in :data:`PROTOCOL_OPTIONS` go to :func:`make_splits` (``subsample=0.5`` keeps a
    seeded half of the train rows; ``class_order=[...]`` for ``1p_biased:semantic``); the rest
    to the source (:func:`load_dataset`). Every source takes them.
    """
    from ..labels import OFFICIAL_SEED

    protocol = {key: options.pop(key) for key in PROTOCOL_OPTIONS if key in options}
    return make_splits(load_dataset(name, **options), regime,
                       OFFICIAL_SEED if seed is None else seed, **protocol)


def list_datasets() -> list[tuple[str, str]]:
    return [(e.name, e.description) for e in DATASETS.entries()]


__all__ = ["DATASETS", "PROTOCOL_OPTIONS", "Dataset", "LabelledSet", "Splits", "cole_split",
           "list_datasets", "load_dataset", "load_splits", "make_splits"]
