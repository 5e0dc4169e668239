"""Dataset sources behind one registry, and the protocol that splits them.

>>> splits = load_splits("yeast")
>>> len(splits.train), len(splits.val), len(splits.test)
(1354, 338, 725)
"""
from __future__ import annotations

from typing import Callable

# one module per source; importing it registers it (this order is the registry's, which
# `spml list datasets` and the README's table follow)
from . import arrays, tabular, cole, fmnist_mosaic, mdi_icons, yeast  # noqa: F401
from . import voc, coco, cub, cole_images, nuswide, csv_images, folder  # noqa: F401
from .protocol import Dataset, LabelledSet, Splits, cole_split, make_splits
from .options import PROTOCOL_OPTIONS, check_source_options, source_parameters
from .registry import DATASETS
from ..runs import SLUG


def load_dataset(name: str, /, *, feature_loader: Callable[..., Dataset] | None = None,
                 **options) -> Dataset:
    """Load the registered source ``name`` (options are the source's own, e.g. ``root=``;
    ``name=`` among them is the source's, e.g. the name a ``csv`` dataset is given).

    ``backbone=`` (and ``features={...}``) turns an image source's paths into cached backbone
    features. The data floor does not compute features: it is handed the loader that does,
    ``feature_loader(name, **options)`` (`spmlkit.features.load_feature_dataset`, which
    `spmlkit.features.load_dataset` and `spmlkit.features.load_splits` hand it).

    Raises:
        ValueError: an unknown dataset, or options the source does not take (unknown or missing
            keys, values of the wrong type: `check_source_options`); ``backbone=`` without
            a ``feature_loader``; the source's own errors for its files.
    """
    if options.get("backbone") is not None:
        if feature_loader is None:
            raise ValueError(f"dataset {name!r}: backbone={options['backbone']!r} asks for "
                             f"cached backbone features, which spmlkit.data does not compute: "
                             f"load it with spmlkit.features.load_dataset / load_splits (or "
                             f"hand feature_loader=spmlkit.features.load_feature_dataset)")
        return feature_loader(name, **options)
    params = source_parameters(name)
    if "backbone" in options and "backbone" not in params:
        del options["backbone"]  # backbone=None: the source's own items
    given = options.get("name")
    if given is not None and not (isinstance(given, str) and SLUG.fullmatch(given)):
        raise ValueError(f"dataset {name!r}: option name={given!r}: a dataset's name names its "
                         f"run folders, so it is a slug (letters, digits, . _ -, starting with "
                         f"a letter or digit), not a path")
    if "features" in options and "features" not in params:
        raise ValueError(f"dataset {name!r}: the features option (feature-extraction settings) "
                         f"needs a backbone (backbone=NAME, or --backbone NAME)")
    check_source_options(name, options)
    return DATASETS.get(name).factory(**options)


def trial_options(options: dict, seed: int) -> dict:
    """``options`` for a run of ``seed``: under the tabular protocol (``protocol=tabular``) each
    seed is a trial with its own split, so the split's ``seed`` option is the run's (unless the
    options name one); other options are returned as they are (a copy).

    >>> trial_options({"protocol": "tabular"}, 3), trial_options({}, 3)
    ({'protocol': 'tabular', 'seed': 3}, {})
    """
    out = dict(options)
    if out.get("protocol") == "tabular":
        out.setdefault("seed", seed)
    return out


def load_splits(name: str, /, regime: str = "1p", seed: int | None = None, *,
                feature_loader: Callable[..., Dataset] | None = None, **options) -> Splits:
    """Load a source and apply the protocol (observed labels drawn with ``seed``, default 1200).

    Options in `PROTOCOL_OPTIONS` go to `make_splits` (``subsample=0.5`` keeps a
    seeded half of the train rows; ``class_order=[...]`` for ``1p_biased:semantic``;
    ``protocol="tabular"``: the tabular SPML protocol, a random 80 / 10 / 10 split of all rows
    drawn with ``seed``, one trial per seed); the rest
    to the source (`load_dataset`, with ``feature_loader``). Every source takes them.

    Raises:
        ValueError: as `load_dataset` (a misspelt option names the closest one, e.g.
            ``subsampel`` -> ``subsample``), and as `make_splits`.
    """
    from ..labels import OFFICIAL_SEED

    check_source_options(name, options, PROTOCOL_OPTIONS)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"dataset {name!r}: the observed-label seed must be a whole number >= 0, "
                         f"got {seed!r}")
    protocol = {key: options.pop(key) for key in PROTOCOL_OPTIONS if key in options}
    splits = make_splits(load_dataset(name, feature_loader=feature_loader, **options), regime,
                         OFFICIAL_SEED if seed is None else seed, **protocol)
    splits.meta["source_name"] = DATASETS.get(name).name  # (splits.name may be a name= option)
    return splits


def list_datasets() -> list[tuple[str, str]]:
    return [(e.name, e.description) for e in DATASETS.entries()]


__all__ = ["DATASETS", "PROTOCOL_OPTIONS", "trial_options", "Dataset", "LabelledSet", "Splits",
           "check_source_options", "cole_split", "list_datasets", "load_dataset", "load_splits",
           "make_splits", "source_parameters"]
