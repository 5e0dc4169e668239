"""Validation of a raw study spec (a dict from YAML) into a `StudySpec`.

`validate` checks the keys one at a time, in the order an error is most useful (names
before numbers, numbers before the run count), each check its own function; the known keys,
the required ones, the defaults and the "expected ..." wording come from the schema table
(`spmlkit.experiments.study.schema`). Every error is a ``ValueError`` that names the
spec's source, the key (``methods[2].mode_options``) and what is expected."""
from __future__ import annotations

import dataclasses
import json
import math
import re

from .expand import applicable_axes
from .grammar import REFERENCES, accepted_hparams, parse_methods
from .schema import (DEFAULT_GRID, K_BOUNDS, MAX_RUNS, METHOD_KEYS, OWN_KEYS, REQUIRED_KEYS,
                     SPEC_KEYS, default, expected, method_mapping_form)
from .spec import DatasetSpec, MethodSpec, StudySpec, merged


def _short(values: list, shown: int = 8) -> str:
    """A list as shown in an error: its first values and how many there are in all."""
    if len(values) <= shown:
        return repr(values)
    return f"[{', '.join(map(repr, values[:shown]))}, ...] ({len(values)} values)"


def _fail(source: str, key: str, message: str):
    raise ValueError(f"{source}: {key}: {message}")


def _list(value, source: str, key: str, allow_scalar: bool = True) -> list:
    if isinstance(value, (list, tuple)):
        if not value:
            _fail(source, key, "expected a non-empty list")
        return list(value)
    if allow_scalar and value is not None and not isinstance(value, dict):
        return [value]
    _fail(source, key, f"expected a list, got {value!r}")


def _number(value, source: str, key: str, kind=float, positive: bool = True):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and kind is int:
        ok = float(value).is_integer()
    if not ok or (positive and not value > 0):
        what = "a positive integer" if kind is int else "a positive number"
        _fail(source, key, f"expected {what}, got {value!r}")
    return kind(value)


def _mapping(value, source: str, key: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        _fail(source, key, f"expected a mapping, got {value!r}")
    return dict(value)




def _check_k(value, source: str, key: str):
    if value == "true":
        return value
    if isinstance(value, bool):  # YAML reads a bare true / false as a boolean
        _fail(source, key, f"got the boolean {str(value).lower()}: for the train split's mean "
                           f"write the word in quotes, k: 'true' (YAML reads a bare true as a "
                           f"boolean), or give a number")
    if isinstance(value, str):
        from ...methods.contract import interval_position

        parts = value.split(":")
        ok = (len(parts) == 3 and parts[1].isdigit() and int(parts[1]) > 0
              and ((parts[0] == "estimate" and parts[2] in K_BOUNDS)
                   or (parts[0] == "interval" and interval_position(parts[2]) is not None)))
        if not ok:
            _fail(source, key, f"expected a number, 'true' (the train split's mean), "
                               f"'estimate:M:lower|point|upper' or 'interval:M:lower|upper|I/N' "
                               f"(M fully labelled rows), got {value!r}")
        return value
    _number(value, source, key)
    return value


def _printable(text: str, source: str, key: str, newlines: bool = False) -> None:
    """Refuse control characters (an escape sequence that would act on the terminal where
    ``spml study status`` prints the text); ``newlines`` allows line breaks and tabs."""
    allowed = "\n\t" if newlines else ""
    bad = [c for c in text if (ord(c) < 32 or 127 <= ord(c) < 160) and c not in allowed]
    if bad:
        _fail(source, key, f"holds the control character(s) {sorted(set(bad))} (terminal "
                           f"escapes?); write text only")


def validate(raw: dict, source: str, stem: str | None) -> StudySpec:
    """The `StudySpec` of the raw spec ``raw`` (read from ``source``; ``stem``: the
    name of a spec without ``name``), or a ``ValueError`` naming the source and the key."""
    unknown = sorted(set(raw) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; a study spec has "
                         f"{', '.join(SPEC_KEYS)}")
    for key in REQUIRED_KEYS:
        if raw.get(key) is None:
            _fail(source, key, "missing (required)")
    name = str(raw.get("name") or stem or "")
    if not name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        _fail(source, "name", f"expected {expected('name')}, got {name!r}")
    datasets = _datasets(raw, source)
    methods = _methods(raw, source)
    mode = raw.get("mode", default("mode"))
    method, modes = _modes(mode, methods, source)
    _backbones(raw, datasets, modes, source)
    seeds = _seeds(raw.get("seeds", default("seeds")), source)
    epochs = _number(raw.get("epochs", default("epochs")), source, "epochs", int)
    early_stop = str(raw.get("early_stop", default("early_stop")))
    _early_stop(early_stop, source, "early_stop")
    train, config_fields = _train(raw, source)
    accepts = {m.label: accepted_hparams(m.loss) for m in methods}
    grid = _grid(raw, accepts, config_fields, source)
    hparams = _hparams(raw, methods, accepts, source)
    vary = _vary(raw, datasets, methods, method, modes, accepts, source)
    mode_options = _mapping(raw.get("mode_options"), source, "mode_options")
    for where, trainer, opts in [("mode_options", method, mode_options)] + [
            (f"methods[{i}].mode_options", modes[m.label], m.mode_options)
            for i, m in enumerate(methods)]:
        try:
            trainer.check_options(opts)
        except ValueError as err:
            _fail(source, where, str(err))
    _printable(str(raw.get("title") or ""), source, "title")
    _printable(str(raw.get("description") or ""), source, "description", newlines=True)
    mlflow = raw.get("mlflow", default("mlflow"))
    if not isinstance(mlflow, bool):
        _fail(source, "mlflow", f"expected {expected('mlflow')}, got {mlflow!r}")
    sklearn = raw.get("sklearn_reference", default("sklearn_reference"))
    if not isinstance(sklearn, bool):
        _fail(source, "sklearn_reference", f"expected {expected('sklearn_reference')}, got "
                                           f"{sklearn!r}")
    if sklearn and mode not in ("linear", "solve"):
        _fail(source, "sklearn_reference", f"the scikit-learn rows train on feature vectors: "
                                           f"mode linear or solve, not {mode!r}")
    from ...metrics import check_metric

    metric = raw.get("metric", default("metric"))
    try:
        check_metric(metric)
    except ValueError as err:
        _fail(source, "metric", str(err))
    _check_run_count(datasets, methods, modes, seeds, vary, grid, source)
    return StudySpec(name=name, datasets=datasets, methods=methods,
                     title=str(raw.get("title") or name),
                     description=str(raw.get("description") or default("description")).strip(),
                     mode=mode, seeds=seeds, epochs=epochs, early_stop=early_stop, grid=grid,
                     hparams=hparams, vary=vary, train=train, mode_options=mode_options,
                     mlflow=mlflow, source=source, metric=metric, sklearn_reference=sklearn)


def _early_stop(text: str, source: str, key: str) -> None:
    from ...engine import parse_early_stop

    try:
        parse_early_stop(text)
    except ValueError as err:
        _fail(source, key, str(err))


def _datasets(raw: dict, source: str) -> list:
    from ...data import DATASETS
    from ...data.options import PROTOCOL_OPTIONS, check_source_options

    datasets = []
    for i, item in enumerate(_list(raw["datasets"], source, "datasets")):
        key = f"datasets[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or "name" not in item or set(item) - {"name", "options"}:
            _fail(source, key, f"expected a dataset name or {{name: ..., options: {{...}}}}, "
                               f"got {item!r}")
        try:
            DATASETS.get(str(item["name"]))
        except ValueError as err:
            _fail(source, key, str(err))
        options = _mapping(item.get("options"), source, f"{key}.options")
        try:  # keys and values; a vary axis may still supply a required option
            check_source_options(str(item["name"]), options, PROTOCOL_OPTIONS, complete=False)
        except ValueError as err:
            _fail(source, f"{key}.options", str(err))
        datasets.append(DatasetSpec(str(item["name"]), options))
    if len({(d.name, json.dumps(d.options, sort_keys=True)) for d in datasets}) < len(datasets):
        _fail(source, "datasets", "a dataset is listed twice")
    return datasets


def _methods(raw: dict, source: str) -> list:
    from ...labels import parse_regime

    methods = []
    for i, item in enumerate(_list(raw["methods"], source, "methods")):
        key = f"methods[{i}]"
        own_mode = None
        if isinstance(item, dict):
            unknown = sorted(map(str, set(item) - set(METHOD_KEYS)))
            if unknown:
                import difflib

                close = difflib.get_close_matches(unknown[0], list(METHOD_KEYS), n=1)
                _fail(source, key, f"unknown key(s) {unknown}"
                                   f"{f' (did you mean {close[0]!r}?)' if close else ''}; a "
                                   f"method mapping takes {', '.join(METHOD_KEYS)}")
            if "spec" not in item or set(item) - set(METHOD_KEYS) or \
                    ("mode" in item and not isinstance(item["mode"], str)):
                _fail(source, key, f"expected a method spec or {method_mapping_form()} (spec "
                                   f"required), got {item!r}")
            spec = str(item["spec"])
            label = str(item.get("label") or spec)
            options = _mapping(item.get("mode_options"), source, f"{key}.mode_options")
            own_mode = item.get("mode")
            own_stop = None if item.get("early_stop") is None else str(item["early_stop"])
            if own_stop is not None:
                _early_stop(own_stop, source, f"{key}.early_stop")
        elif isinstance(item, str):
            label = spec = item
            options = {}
            own_stop = None
        else:
            _fail(source, key, f"expected a method spec such as 'an' or 'bce@full', got {item!r}")
        try:
            (m,) = parse_methods([spec], references=())
            parse_regime(m.regime)
        except ValueError as err:
            _fail(source, key, str(err))
        fixed = "@" in spec or spec in REFERENCES
        methods.append(MethodSpec(label, spec, m.loss, m.regime, tuple(m.reg), fixed, options,
                                  own_mode, own_stop))
    labels = [m.label for m in methods]
    if len(set(labels)) < len(labels):
        _fail(source, "methods", f"labels must be unique, got {labels}")
    for i, label in enumerate(labels):
        _printable(label, source, f"methods[{i}].label")
    return methods


def _modes(mode, methods: list, source: str):
    """The study mode's TrainingMethod and ``{method label: its TrainingMethod}``."""
    from ...methods import get_method

    try:
        method = get_method(str(mode))
    except ValueError:
        _fail(source, "mode", f"expected {expected('mode')}, got {mode!r}")
    modes = {}  # method label -> its TrainingMethod
    for i, m in enumerate(methods):
        try:
            modes[m.label] = get_method(m.mode) if m.mode else method
        except ValueError:
            _fail(source, f"methods[{i}].mode", f"expected {expected('mode')}, got "
                                                f"{m.mode!r}")
        trainer = modes[m.label]
        if m.mode and trainer.losses is not None and m.loss not in trainer.losses:
            _fail(source, f"methods[{i}]", f"mode {trainer.name!r} trains with the loss(es) "
                                           f"{list(trainer.losses)}, got {m.loss!r}")
    return method, modes


def _backbones(raw: dict, datasets: list, modes: dict, source: str) -> None:
    """An image source needs a backbone's features when a mode trains on feature vectors."""
    from ...data import DATASETS

    backbone_varies = "data.backbone" in (raw.get("vary") or {})
    for trainer in {t.name: t for t in modes.values()}.values():  # the modes the rows use
        if trainer.inputs != "features" or backbone_varies:
            continue
        for i, ds in enumerate(datasets):
            if "images" in DATASETS.get(ds.name).tags and not ds.options.get("backbone"):
                _fail(source, f"datasets[{i}]", f"dataset {ds.name!r} holds images and mode "
                      f"{trainer.name!r} trains on feature vectors: give the dataset a backbone "
                      f"({{name: {ds.name}, options: {{backbone: NAME}}}}, or spml benchmark "
                      f"--backbone NAME; spml list backbones), or use an image mode (mode: "
                      f"finetune / lac with mode_options: {{backbone: NAME}})")


def _seeds(seeds, source: str) -> list:
    if isinstance(seeds, (list, tuple)):
        seeds = [_number(s, source, "seeds", int, positive=False) for s in
                 _list(seeds, source, "seeds")]
        if len(set(seeds)) < len(seeds) or min(seeds) < 0 or max(seeds) >= 2**32:
            _fail(source, "seeds", f"expected distinct integers in [0, 2**32), got "
                                   f"{_short(seeds)}")
        return seeds
    count = _number(seeds, source, "seeds", int)
    if count > MAX_RUNS:
        _fail(source, "seeds", f"{count} seeds: a study has at most {MAX_RUNS} runs")
    return list(range(count))


def _train(raw: dict, source: str):
    """The ``train:`` mapping (TrainConfig fields), and the TrainConfig field names."""
    from ...engine import TrainConfig

    config_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    train = _mapping(raw.get("train"), source, "train")
    for k in train:
        if k in OWN_KEYS:
            where = "grid" if k in ("batch_size", "lr") else k
            _fail(source, f"train.{k}", f"set {k} with the spec key {where!r}, not under train")
        if k not in config_fields:
            _fail(source, f"train.{k}", f"not a TrainConfig field; known: "
                                        f"{', '.join(sorted(config_fields - set(OWN_KEYS)))}")
    try:
        TrainConfig(**train)
    except (TypeError, ValueError) as err:
        _fail(source, "train", str(err))
    if "device" in train:  # before any folder is made (torch's AssertionError mid-run)
        _check_device(train["device"], source, "train.device")
    return train, config_fields


def _check_device(value, source: str, key: str) -> None:
    from ...engine.config import check_device

    try:
        check_device(value)
    except ValueError as err:
        _fail(source, key, str(err))


def _grid(raw: dict, accepts: dict, config_fields: set, source: str) -> dict:
    grid_raw = raw.get("grid")
    grid = default("grid") if grid_raw is None else _mapping(grid_raw, source, "grid")
    for k in ("batch_size", "lr"):
        grid.setdefault(k, DEFAULT_GRID[k])
    for k in list(grid):
        values = _list(grid[k], source, f"grid.{k}")
        if k == "batch_size":
            values = [_number(v, source, f"grid.{k}", int) for v in values]
        elif k == "lr":
            values = [_number(v, source, f"grid.{k}") for v in values]
        elif k.startswith("hparams."):
            if not any(k[8:] in a for a in accepts.values()):
                _fail(source, f"grid.{k}", f"no method's loss has the hyperparameter "
                                           f"{k[8:]!r}")
        elif k in OWN_KEYS or k not in config_fields:
            _fail(source, f"grid.{k}", "expected batch_size, lr, hparams.<name> or a "
                                       "TrainConfig field")
        else:  # another TrainConfig field (weight_decay): each value as TrainConfig checks it
            from ...engine import TrainConfig

            for v in values:
                try:
                    TrainConfig(**{k: v})
                except (TypeError, ValueError) as err:
                    _fail(source, f"grid.{k}", str(err))
                if k == "device":
                    _check_device(v, source, f"grid.{k}")
        if len(set(map(json.dumps, values))) < len(values):
            _fail(source, f"grid.{k}", f"values repeat: {values}")
        grid[k] = values
    return grid


def _hparams(raw: dict, methods: list, accepts: dict, source: str) -> dict:
    labels = [m.label for m in methods]
    hparams = _mapping(raw.get("hparams"), source, "hparams")
    for key, hp in hparams.items():
        hp = _mapping(hp, source, f"hparams.{key}")
        targets = [m for m in methods if key in (m.label, m.loss)]
        if not targets:
            _fail(source, f"hparams.{key}", f"no method labelled {key!r} or with loss {key!r} "
                                            f"(methods: {', '.join(labels)})")
        for m in targets:
            bad = sorted(set(hp) - accepts[m.label])
            if bad:
                _fail(source, f"hparams.{key}", f"loss {m.loss!r} has no hyperparameter(s) "
                                                f"{bad}; it takes {sorted(accepts[m.label])}")
        hparams[key] = hp
    return hparams


def _vary(raw: dict, datasets: list, methods: list, method, modes: dict, accepts: dict,
          source: str) -> dict:
    vary = _mapping(raw.get("vary"), source, "vary")
    for key in list(vary):
        values = _list(vary[key], source, f"vary.{key}")
        if len(set(map(json.dumps, values))) < len(values):
            _fail(source, f"vary.{key}", f"values repeat: {values}")
        if key.startswith("hparams.") and len(key) > 8:
            if not any(key[8:] in a for a in accepts.values()):
                _fail(source, f"vary.{key}", f"no method's loss has the hyperparameter "
                                             f"{key[8:]!r}")
        elif key.startswith("data.") and len(key) > 5:
            _vary_data(key, values, datasets, source)
        elif key.startswith("option.") and len(key) > 7:
            _vary_option(raw, key, values, methods, method, modes, source)
        elif key.startswith("lac.") and len(key) > 4:
            _vary_lac(raw, key, values, methods, method, modes, source)
        elif key == "k":
            values = [_check_k(v, source, "vary.k") for v in values]
            if not any("k" in a for a in accepts.values()):
                _fail(source, "vary.k", "no method's loss takes k (epr, role do)")
        elif key == "regime":
            values = _vary_regime(values, source)
        else:
            _fail(source, f"vary.{key}", f"expected {expected('vary')}")
        vary[key] = values
    both = {k[4:] for k in vary if k.startswith("lac.")} & \
        {k[7:] for k in vary if k.startswith("option.")}
    if both:
        _fail(source, f"vary.option.{min(both)}", f"varied twice (also as lac.{min(both)}): "
                                                  f"keep one spelling")
    return vary


def _vary_data(key: str, values: list, datasets: list, source: str) -> None:
    from ...data.options import PROTOCOL_OPTIONS, check_source_options

    for ds in datasets:  # the key and each value (completeness: when a run loads)
        for v in values:
            try:
                check_source_options(ds.name, {key[5:]: v}, PROTOCOL_OPTIONS, complete=False)
            except ValueError as err:
                _fail(source, f"vary.{key}", str(err))


def _own_options(raw: dict, rows: list, method, modes: dict, source: str) -> list:
    """``(method, its mode options)`` of each of ``rows``: its own merged over the study's
    when it trains in the study's mode, its own alone otherwise (as the runs get them)."""
    study_options = _mapping(raw.get("mode_options"), source, "mode_options")
    return [(m, merged(study_options, m.mode_options) if modes[m.label] is method
             else m.mode_options) for m in rows]


def _vary_option(raw: dict, key: str, values: list, methods: list, method, modes: dict,
                 source: str) -> None:
    """``option.<name>``: some method's mode takes option ``name``; every value passes the
    option check of each such method's mode (``TrainingMethod.check_options``)."""
    name = key[7:]
    rows = [m for m in methods if name in modes[m.label].options]
    if not rows:
        trainers = {modes[m.label].name: modes[m.label] for m in methods}
        takes = "; ".join(f"{n}: {', '.join(sorted(t.options)) or 'none'}"
                          for n, t in trainers.items())
        _fail(source, f"vary.{key}", f"no method's mode takes the option {name!r} ({takes})")
    for m, own in _own_options(raw, rows, method, modes, source):
        for v in values:
            try:
                modes[m.label].check_options(merged(own, {name: v}))
            except (TypeError, ValueError) as err:
                _fail(source, f"vary.{key}", f"{m.label}: {err}")


def _vary_lac(raw: dict, key: str, values: list, methods: list, method, modes: dict,
              source: str) -> None:
    """``lac.<field>``: LAC's spelling of ``option.<field>``, for a LACConfig field of the
    methods in mode lac."""
    lac_rows = [m for m in methods if modes[m.label].name == "lac"]
    if not lac_rows:
        _fail(source, f"vary.{key}", "no method trains in mode lac")
    from ...methods.lac import config_of

    for m, own in _own_options(raw, lac_rows, method, modes, source):
        for v in values:
            try:
                config_of(own, **{key[4:]: v})
            except (TypeError, ValueError) as err:
                _fail(source, f"vary.{key}", f"{m.label}: {err}")


def _vary_regime(values: list, source: str) -> list:
    from ...labels import parse_regime

    for v in values:
        try:
            parse_regime(str(v))
        except ValueError as err:
            _fail(source, "vary.regime", str(err))
    return [str(v) for v in values]


def _check_run_count(datasets, methods, modes, seeds, vary, grid, source: str) -> None:
    """A spec that expands to more than `MAX_RUNS` runs is refused, naming its axes."""
    runs = sum(len(seeds)
               * math.prod(len(vary[k]) for k in applicable_axes(modes[m.label].name, m, vary))
               * math.prod(len(grid[k]) for k in applicable_axes(modes[m.label].name, m, grid))
               for m in methods) * len(datasets)
    if runs > MAX_RUNS:
        axes = ", ".join([f"{len(datasets)} dataset(s)", f"{len(methods)} method(s)",
                          f"{len(seeds)} seed(s)", *(f"{k}: {len(v)}" for k, v in vary.items()),
                          *(f"grid.{k}: {len(v)}" for k, v in grid.items())])
        raise ValueError(f"{source}: the study expands to {runs} runs ({axes}); a study has at "
                         f"most {MAX_RUNS}: fewer seeds, vary or grid values")
