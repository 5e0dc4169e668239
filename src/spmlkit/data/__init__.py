"""Dataset sources behind one registry, and the protocol that splits them.

The data floor: a source is loaded by `load_source` with its own options, and `make_splits`
applies the protocol to it. The one public `load_dataset` / `load_splits` (a source by name,
a backbone's cached features for an image source, the protocol's options) stand a floor above,
in `spmlkit.loading`, where the feature floor is within reach.

>>> splits = make_splits(load_source("yeast"), "1p", seed=1200)
>>> len(splits.train), len(splits.val), len(splits.test)
(1354, 338, 725)
"""
from __future__ import annotations

# one module per source; importing it registers it (this order is the registry's, which
# `spml list datasets` and the README's table follow)
from . import arrays, tabular, cole, fmnist_mosaic, mdi_icons, yeast  # noqa: F401
from . import voc, coco, cub, cole_images, nuswide, csv_images, folder  # noqa: F401
from .protocol import Dataset, LabelledSet, Splits, cole_split, make_splits
from .options import PROTOCOL_OPTIONS, check_source_options, source_parameters
from .registry import DATASETS
from ..runs import SLUG

#: names that moved up to `spmlkit.loading` (where the feature floor is in reach)
_MOVED = {"load_dataset": "spmlkit.loading.load_dataset",
          "load_splits": "spmlkit.loading.load_splits"}


def load_source(name: str, /, **options) -> Dataset:
    """Load the registered source ``name`` with its own options (e.g. ``root=``; ``name=``
    among them is the source's, e.g. the name a ``csv`` dataset is given).

    The data floor does not compute features: ``backbone=NAME`` is refused here, and
    `spmlkit.loading.load_dataset` (which calls this for every other source) does it.

    Raises:
        ValueError: an unknown dataset, or options the source does not take (unknown or missing
            keys, values of the wrong type: `check_source_options`); ``backbone=``; the
            source's own errors for its files.
    """
    if options.get("backbone") is not None:
        raise ValueError(f"dataset {name!r}: backbone={options['backbone']!r} asks for "
                         f"cached backbone features, which spmlkit.data does not compute: "
                         f"load it with spmlkit.loading.load_dataset / load_splits")
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


def list_datasets() -> list[tuple[str, str]]:
    return [(e.name, e.description) for e in DATASETS.entries()]


def __getattr__(name: str):
    if name in _MOVED:
        raise AttributeError(f"spmlkit.data.{name} is now {_MOVED[name]} (one loader for a "
                             f"table as for images, with a backbone's cached features)")
    raise AttributeError(f"module 'spmlkit.data' has no attribute {name!r}")


__all__ = ["DATASETS", "PROTOCOL_OPTIONS", "trial_options", "Dataset", "LabelledSet", "Splits",
           "check_source_options", "cole_split", "list_datasets", "load_source", "make_splits",
           "source_parameters"]
