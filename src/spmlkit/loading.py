"""A dataset by name: the one `load_dataset` and `load_splits`, for a table as for images.

What ``spml train``, ``spml benchmark``, a study's workers and `spmlkit.methods.driver.resume_run`
call with a run's ``dataset`` and ``dataset_options``. It stands above both floors it joins:
the data floor (`spmlkit.data`: the sources behind their registry, the protocol that splits
them) and the feature floor (`spmlkit.features`: a backbone's features, extracted once into a
memory-mapped store). An image source given ``backbone=NAME`` has its paths replaced by that
backbone's cached features (`load_feature_dataset`); any other source is loaded as it is.

>>> splits = load_splits("yeast")
>>> len(splits.train), len(splits.val), len(splits.test)
(1354, 338, 725)
"""
from __future__ import annotations

from pathlib import Path

from .data import DATASETS, PROTOCOL_OPTIONS, check_source_options, load_source, make_splits
from .data.protocol import Dataset, Splits
from .features import FEATURE_OPTIONS, feature_dataset, require_images


def load_dataset(name: str, /, **options) -> Dataset:
    """Load the registered source ``name`` with its options (``root=``, ``path=``, ...;
    ``name=`` among them is the source's, e.g. the name a ``csv`` dataset is given).

    ``backbone=`` (and ``features={...}``) turns an image source's paths into cached backbone
    features (`load_feature_dataset`); without them this is `spmlkit.data.load_source`.

    Raises:
        ValueError: an unknown dataset, or options the source does not take (unknown or missing
            keys, values of the wrong type: `spmlkit.data.check_source_options`); the errors
            of `load_feature_dataset`; the source's own errors for its files.
    """
    if options.get("backbone") is not None:
        return load_feature_dataset(name, **options)
    return load_source(name, **options)


def load_splits(name: str, /, regime: str = "1p", seed: int | None = None,
                **options) -> Splits:
    """Load a source and apply the protocol (observed labels drawn with ``seed``, default 1200).

    Options in `spmlkit.data.PROTOCOL_OPTIONS` go to `spmlkit.data.make_splits`
    (``subsample=0.5`` keeps a seeded half of the train rows; ``class_order=[...]`` for
    ``1p_biased:semantic``; ``protocol="tabular"``: the tabular SPML protocol, a random
    80 / 10 / 10 split of all rows drawn with ``seed``, one trial per seed); the rest to the
    source (`load_dataset`: ``backbone=`` trains on cached features). Every source takes them.
    This is what a run's ``dataset_options`` describe.

    Raises:
        ValueError: as `load_dataset` (a misspelt option names the closest one, e.g.
            ``subsampel`` -> ``subsample``), and as `spmlkit.data.make_splits`.
    """
    from .labels import OFFICIAL_SEED

    check_source_options(name, options, PROTOCOL_OPTIONS)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"dataset {name!r}: the observed-label seed must be a whole number >= 0, "
                         f"got {seed!r}")
    protocol = {key: options.pop(key) for key in PROTOCOL_OPTIONS if key in options}
    splits = make_splits(load_dataset(name, **options), regime,
                         OFFICIAL_SEED if seed is None else seed, **protocol)
    splits.meta["source_name"] = DATASETS.get(name).name  # (splits.name may be a name= option)
    return splits


def load_feature_dataset(name: str, /, backbone: str, features: dict | None = None,
                         **source_options) -> Dataset:
    """Load the image source ``name`` and replace its items by cached ``backbone`` features.

    This is what `load_dataset` ``(name, backbone=..., features={...})`` does, so a run's
    ``dataset_options`` (config.json, benchmark workers) name the features it trained on.

    Args:
        name: a registered image source.
        backbone: train on this backbone's cached features (``spml list backbones``),
            extracted first where missing; the same as ``--backbone``.
        features: extraction settings, a mapping with keys among
            `spmlkit.features.FEATURE_OPTIONS` (``dtype``, ``cache_dir``, ``num_workers``, ...;
            `spmlkit.features.extract_features`).
        **source_options: the source's own options.

    Raises:
        ValueError: an unknown feature option, ``features`` that is not a mapping, a source
            that already holds feature vectors, or a bad source option (as
            `spmlkit.data.load_source`: ``name=`` that is not a slug too).
    """
    if features is not None and not isinstance(features, dict):
        raise ValueError(f"the features option is a mapping of extraction options (e.g. "
                         f'{{"dtype": "float16"}}), got {features!r}')
    features = dict(features or {})
    unknown = sorted(set(features) - set(FEATURE_OPTIONS))
    if unknown:
        raise ValueError(f"unknown feature option(s) {unknown}; known: "
                         f"{', '.join(FEATURE_OPTIONS)}")
    return feature_dataset(require_images(load_source(name, **source_options)), backbone,
                           **features)


def feature_option_rows() -> list[dict]:
    """The options an image source takes to train on cached backbone features (``backbone``,
    ``features``), described from `load_feature_dataset`'s signature and docstring, as
    rows of `spmlkit.data.options.describe_options` (``spml list datasets --details``)."""
    import inspect

    from .data.options import FEATURE_KEYS, parameter_rows

    params = dict(inspect.signature(load_feature_dataset).parameters)
    params["backbone"] = params["backbone"].replace(default=None)  # optional as an option
    return parameter_rows(params, inspect.getdoc(load_feature_dataset), "features",
                          FEATURE_KEYS)


def feature_options(backbone: str | None, dtype: str | None = None, cache_dir=None,
                    **extra) -> dict:
    """Dataset options that make `load_dataset` return cached features (``{}`` without a
    backbone): what ``spml train / benchmark --backbone`` add to ``--data`` (``weights=`` in
    ``extra``: your own weights file, recorded as an absolute path)."""
    if not backbone:
        if extra.get("weights") is not None:
            raise ValueError(f"--weights {extra['weights']}: weights are for a backbone; give "
                             f"--backbone NAME too (spml list backbones)")
        unused = [flag for flag, given in (("--float16", dtype not in (None, "float32")),
                                           ("--cache-dir", cache_dir is not None)) if given]
        if unused:
            raise ValueError(f"{' and '.join(unused)}: for the features a --backbone extracts "
                             f"and caches; without --backbone the features are the data's own")
        return {}
    if extra.get("weights") is not None:
        extra["weights"] = str(Path(extra["weights"]).resolve())
    features = {k: v for k, v in {"dtype": dtype, "cache_dir": None if cache_dir is None
                                  else str(cache_dir), **extra}.items() if v is not None}
    return {"backbone": backbone, **({"features": features} if features else {})}


def named_cache_dirs(dataset_options: dict | None, mode_options: dict | None = None) -> set:
    """The feature-store folders a run's settings name (``cache_dir`` in the dataset's
    options, in its ``features`` or in the mode's options), resolved: where a spec or a run
    folder received from someone else would read and write stores, which a launch and a
    resume say."""
    opts = dataset_options or {}
    features = opts.get("features")  # a backbone's feature options; a table's: its columns
    found = set()
    for value in (opts.get("cache_dir"),
                  features.get("cache_dir") if isinstance(features, dict) else None,
                  (mode_options or {}).get("cache_dir")):
        if value:
            found.add(Path(value).expanduser().resolve())
    return found
