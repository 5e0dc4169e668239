"""Studies: a YAML spec of datasets x methods x seeds x vary x grid, run resumably in parallel.

A study reproduces one table or figure of a paper. Its spec (a YAML file, or a preset shipped in
``spmlkit/experiments/presets/``, looked up by name) names the datasets, the methods (benchmark
method specs ``loss[+reg...][@regime]``, see :func:`spmlkit.experiments.benchmark.parse_methods`),
the training mode, the seeds, the hyperparameter grid that is *selected over* on val mAP, fixed
hyperparameters, and the ``vary`` axes that are *reported* (one table column or figure point per
value)::

    name: cole-table1                  # output folder: runs/studies/<name>
    title: "Cole et al. 2021, Table 1 (linear)"
    description: free text
    datasets: [yeast]                  # or {name: fmnist_mosaic, options: {backbone: ...}}
    methods: [an, role, bce@full]      # or {label: IUN, spec: bce@1p_alln, mode: ...}
    mode: linear                       # linear | finetune | linear_init | lac | smile
    seeds: 3                           # or a list [0, 1, 2]
    epochs: 25
    early_stop: none
    grid: {batch_size: [8, 16], lr: [1e-2, 1e-3, 1e-4, 1e-5]}
    metric: map                        # what epochs and grid points are selected on (val)
    hparams: {em: {alpha: 0.1}}        # per method label or loss name
    vary: {hparams.alpha: [0.01, 0.1]} # hparams.<name> | data.<option> | k | regime | lac.<field>
    train: {}                          # more TrainConfig fields (device, head_lr_mult, ...)
    mode_options: {}                   # the trainer's own keywords (backbone, linear_epochs, ...)
    mlflow: false

A method is a spec string (``an``, ``an+reg``, ``bce@full``) or a mapping
``{spec, label, mode, mode_options, early_stop}`` (``spec`` required; ``label`` defaults to
it): its ``early_stop`` replaces the study's for that row (a table that sets rows of two
papers side by side, each with its paper's protocol: Zhou et al. stop early, Cole et al. do
not), its ``mode_options`` are merged over the study's for that row (the rows of LAC's Table 3 are
settings of one trainer, not losses). A method with a ``mode`` of its own trains in that mode
(SMILE beside the linear losses: ``{label: SMILE, spec: an, mode: smile}``); the study's
``mode_options`` are the study mode's, so such a row takes its own ``mode_options`` alone.
Its runs differ from the study mode's in their configuration (``mode``), hence in their run
ids; a method without one keeps the ids it always had. Tables show such a row with its mode
in brackets (``an [smile]``) unless the label names the mode already
(:meth:`StudySpec.row_labels`).

A vary axis applies to the methods it concerns: ``hparams.<name>`` to losses with that
hyperparameter, ``k`` to losses with a ``k`` (EPR, ROLE), ``regime`` to methods that do not fix
their regime with ``@``; ``data.<option>`` (passed to :func:`spmlkit.data.load_splits`) to all.
``lac.<field>`` (a :class:`spmlkit.methods.lac.LACConfig` field: ``lac.queue_size``,
``lac.temperature``, Xie et al. Figs. 4-5) to the methods that train in mode ``lac``, laid over
their ``mode_options`` (LAC's options are flat: ``mode_options: {queue_size: 512}``).
``k`` is a number, ``true`` (the train split's mean, Cole et al.'s k*),
``estimate:M:lower|point|upper`` (the estimate, or an end of its normal 95%
interval, from M fully labelled train rows drawn with the run's seed) or
``interval:M:lower|upper|I/N`` (Cole et al. App. B's interval I_M: the 5th / 95th percentiles of
the estimate over 10^5 draws of M rows, the same for every seed; ``I/N`` a point between them,
:func:`spmlkit.methods.resolve_k`).

Grid points and seeds differ in training only (initialisation, batch order): the observed labels
are drawn with the official seed 1200, as in the papers' code; ``vary: {data.seed: [...]}``
draws other ones.

:func:`expand` turns a spec into :class:`RunTask` s with stable ``run_id`` s (readable, plus a
short hash of the resolved configuration). :func:`run_study` runs the missing ones in worker
processes (:mod:`spmlkit.experiments.pool`), each in ``<out>/runs/<run_id>/`` through the mode's
trainer, and writes each finished run's row to ``<out>/results.sqlite``
(:class:`spmlkit.experiments.store.StudyStore`) as it comes back. A re-launch with the same
``out`` skips finished runs (and failed ones, unless ``retry_failed``) and reruns the rest:
a killed run's folder is resumed from its checkpoint, or replaced when it has none
(:func:`execute`). The runs go to the local pool, or to a Dask cluster (``dask``,
``scheduler_file``; :mod:`spmlkit.experiments.dask_executor`), through one executor seam.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import signal
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..runs import json_lines, make_folder, write_text
from .pool import InProcessExecutor, LocalExecutor, cached_splits, default_jobs, run_tasks
from .store import StudyStore

SPEC_KEYS = ("name", "title", "description", "datasets", "methods", "mode", "seeds", "epochs",
             "early_stop", "grid", "hparams", "vary", "train", "mode_options", "mlflow",
             "metric")
REQUIRED_KEYS = ("datasets", "methods")
#: the keys of a method given as a mapping (``spec`` required)
METHOD_KEYS = ("label", "spec", "mode", "mode_options", "early_stop")
PRESETS_DIR = Path(__file__).resolve().parent / "presets"
STUDIES_ROOT = Path("runs") / "studies"
DEFAULT_GRID = {"batch_size": [8, 16], "lr": [1e-2, 1e-3, 1e-4, 1e-5]}
K_BOUNDS = ("lower", "point", "upper")
#: TrainConfig fields with their own spec key (the rest go under ``train:``)
_OWN_KEYS = ("epochs", "batch_size", "lr", "seed", "early_stop", "metric")
SPEC_FILE = "study.yaml"
#: the most runs one study may expand to (the largest preset has 1200): a spec beyond it is
#: refused before anything is expanded or written (a typo such as ``seeds: 1000000000``)
MAX_RUNS = 100_000
RESULTS_FILE = "results.sqlite"
LAUNCHES_FILE = "launches.jsonl"
RUNS_DIR = "runs"


#: the reference rows of Cole et al. Table 1: name -> (loss, regime, description)
REFERENCES = {"bce": ("bce", "full", "BCE, all labels (All P. & All N.)"),
              "iun": ("bce", "1p_alln", "IUN, one positive + all negatives (1 P. & All N.)")}


# ---- method specs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Method:
    """One benchmark row: its label (the spec as given), loss, regime and regularisers."""

    label: str
    loss: str
    regime: str
    reg: tuple = ()


def parse_methods(losses, references=("bce", "iun"), regime: str = "1p") -> list[Method]:
    """``["an", "bce@full"]`` -> methods; ``"all"`` stands for every registered loss (but bce,
    a reference row, and the losses that need an external scorer's file, ``em_pl`` and ``gpr``:
    name them, with their ``scores`` in the hyperparameters) and may be combined with more specs
    (``"all,opml@full"``). ``regime``: the regime of a spec without ``@regime`` (another than
    ``1p`` is then written into its label: ``an@given``)."""
    from ..losses import LOSSES
    from ..losses.regularizers import parse_regularizers

    if isinstance(losses, str):
        losses = [s.strip() for s in losses.split(",") if s.strip()]
    every = [n for n in LOSSES.names()
             if n != "bce" and not getattr(LOSSES.get(n).factory, "needs_scores", False)]
    losses = [name for spec in losses for name in (every if spec == "all" else [spec])]
    default = regime
    out = []
    for spec in losses:
        name, _, regime = spec.partition("@")
        if name in REFERENCES and not regime:
            loss, regime, _ = REFERENCES[name]
            out.append(Method(name, loss, regime))
            continue
        name, *reg = name.split("+")
        LOSSES.get(name)  # unknown names fail here, with suggestions
        if reg:
            parse_regularizers(reg)  # so does a bad regulariser spec
        if not regime and default != "1p":
            spec, regime = f"{spec}@{default}", default
        out.append(Method(spec, name, regime or "1p", tuple(reg)))
    for ref in references or ():
        if ref not in REFERENCES:
            raise ValueError(f"unknown reference {ref!r}; known: {', '.join(REFERENCES)}")
        if all(m.label != ref for m in out):
            out.append(Method(ref, *REFERENCES[ref][:2]))
    return out


# ---- YAML --------------------------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-3`` as a string (its floats need a dot); grids are full of them.
    A key given twice in one mapping is an error (YAML would keep the last one silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == \
                        "tag:yaml.org,2002:merge":
                    continue
                key = key_node.value
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice (lines {seen[key] + 1} and "
                        f"{key_node.start_mark.line + 1}); YAML would keep only the last",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


#: the most values a spec may hold, aliases counted each time they are used (a YAML "billion
#: laughs" document of nested aliases is small as text and enormous as values)
MAX_SPEC_VALUES = 1_000_000


def _check_size(value, where: str) -> None:
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if count > MAX_SPEC_VALUES:
            raise ValueError(f"{where}: holds more than {MAX_SPEC_VALUES} values (aliases "
                             f"counted each time they are used); not a study spec")
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def read_spec_text(path) -> str:
    """A spec file's text: UTF-8 (with or without a byte-order mark), or UTF-16 / UTF-32 with
    one (what some Windows editors save); anything else is a ``ValueError`` naming the file."""
    import codecs

    data = Path(path).read_bytes()
    codec = next((c for bom, c in ((codecs.BOM_UTF32_LE, "utf-32"),
                                   (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
                                   (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
                  if data.startswith(bom)), "utf-8")
    try:
        text = data.decode(codec)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not {codec.upper().replace('-SIG', '')} text (byte "
                         f"{data[err.start:err.start + 1]!r} at offset {err.start}); save the "
                         f"spec as UTF-8") from None
    if "\x00" in text:
        raise ValueError(f"{path}: holds NUL characters, not a text file (UTF-16 without a "
                         f"byte-order mark?); save the spec as UTF-8")
    return text


def parse_yaml(text: str, where: str = "<text>"):
    """YAML ``text`` (with ``1e-3`` as a number); ``ValueError`` naming ``where`` and the line."""
    try:
        value = yaml.load(text, Loader=_Loader)
        _check_size(value, where)
        return value
    except RecursionError:
        raise ValueError(f"{where}: nested too deeply to be a study spec") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f", line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{where}{at}: not valid YAML ({getattr(err, 'problem', None) or err})") \
            from None


# ---- the spec ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DatasetSpec:
    name: str
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class MethodSpec:
    label: str          # the table's row name
    spec: str           # loss[+reg...][@regime]
    loss: str
    regime: str
    reg: tuple = ()
    fixed_regime: bool = False   # the spec names its regime (a vary regime axis skips it)
    mode_options: dict = field(default_factory=dict)  # merged over the study's, for this row
    mode: str | None = None      # this row's training mode (None: the study's)
    early_stop: str | None = None  # this row's early stopping (None: the study's)


@dataclass
class StudySpec:
    """A validated study spec (see the module docstring); :meth:`to_dict` is its resolved form,
    written to ``<out>/study.yaml`` and readable by :func:`load_study` again."""

    name: str
    datasets: list
    methods: list
    title: str = ""
    description: str = ""
    mode: str = "linear"
    seeds: list = field(default_factory=lambda: [0, 1, 2])
    epochs: int = 25
    early_stop: str = "none"
    grid: dict = field(default_factory=lambda: dict(DEFAULT_GRID))
    hparams: dict = field(default_factory=dict)
    vary: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    mode_options: dict = field(default_factory=dict)
    mlflow: bool = False
    source: str = "<dict>"
    metric: str = "map"

    def to_dict(self) -> dict:
        out = {"name": self.name, "title": self.title or self.name,
               "description": self.description,
               "datasets": [d.name if not d.options else {"name": d.name, "options": d.options}
                            for d in self.datasets],
               "methods": [_method_dict(m) for m in self.methods],
               "mode": self.mode, "seeds": list(self.seeds), "epochs": self.epochs,
               "early_stop": self.early_stop, "grid": self.grid, "hparams": self.hparams,
               "vary": self.vary, "train": self.train}
        if self.mode_options:
            out["mode_options"] = self.mode_options
        if self.mlflow:
            out["mlflow"] = True
        if self.metric != "map":
            out["metric"] = self.metric
        return out

    def method_mode(self, m: MethodSpec) -> str:
        """The training mode of method ``m``: its own, or the study's."""
        return m.mode or self.mode

    def method_options(self, m: MethodSpec) -> dict:
        """The mode options of method ``m``'s runs: its own merged over the study's when it
        trains in the study's mode; its own alone when it names another mode (the study's
        ``mode_options`` are that mode's)."""
        if self.method_mode(m) != self.mode:
            return dict(m.mode_options)
        return merged(self.mode_options, m.mode_options)

    def row_labels(self) -> dict:
        """``{method label: the label a table shows}``: a method trained in a mode other than
        the study's is shown with its mode in brackets (``an [smile]``), unless its label
        names the mode already (``SMILE``); the other labels are shown as they are."""
        out = {}
        for m in self.methods:
            mode = self.method_mode(m)
            named = mode == self.mode or mode.lower() in m.label.lower()
            out[m.label] = m.label if named else f"{m.label} [{mode}]"
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)


def _method_dict(m: MethodSpec):
    if m.mode or m.mode_options or m.early_stop:
        out = {"label": m.label, "spec": m.spec}
        if m.mode:
            out["mode"] = m.mode
        if m.mode_options:
            out["mode_options"] = m.mode_options
        if m.early_stop:
            out["early_stop"] = m.early_stop
        return out
    return m.spec if m.label == m.spec else {"label": m.label, "spec": m.spec}


def merged(base: dict, over: dict) -> dict:
    """``base`` with ``over`` laid on it, mappings merged key by key (a method's
    ``mode_options`` over the study's)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and \
            isinstance(out.get(key), dict) else value
    return out


def list_presets() -> list[tuple[str, str]]:
    """``(name, title)`` of every shipped preset (``spml study list``)."""
    out = []
    for path in sorted(PRESETS_DIR.glob("*.yaml")):
        try:
            raw = parse_yaml(path.read_text(), str(path)) or {}
            title = str(raw.get("title") or "") if isinstance(raw, dict) else ""
        except ValueError as err:
            title = f"(unreadable: {err})"
        out.append((path.stem, title))
    return out


def _set_dotted(raw: dict, key: str, value, where: str) -> None:
    parts = key.split(".")
    if parts[0] in ("vary", "grid") and len(parts) > 2:  # vary.hparams.alpha: one key
        parts = [parts[0], ".".join(parts[1:])]
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ValueError(f"{where}: cannot set {key!r}: {part!r} is not a mapping")
        node = child
    node[parts[-1]] = value


def apply_overrides(raw: dict, overrides, where: str = "--set") -> dict:
    """``raw`` with ``overrides`` set: a dict ``{"seeds": 1, "grid.lr": [1e-3]}`` or a list of
    ``key=value`` strings (values read as YAML: ``methods=[an, role]``)."""
    raw = json.loads(json.dumps(raw))  # a deep copy
    if isinstance(overrides, dict):
        items = list(overrides.items())
    else:
        items = []
        for item in overrides or ():
            key, sep, text = str(item).partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{where}: expected key=value (e.g. seeds=1), got {item!r}")
            items.append((key.strip(), parse_yaml(text, f"{where} {key.strip()}")))
    for key, value in items:
        _set_dotted(raw, key, value, where)
    return raw


def load_study(path_or_preset, overrides=None) -> StudySpec:
    """Read and validate a study spec.

    Args:
        path_or_preset: a YAML file, a study folder (its ``study.yaml``), a preset name
            (``"cole-table1"``: ``presets/cole-table1.yaml``), a dict, or a :class:`StudySpec`.
        overrides: see :func:`apply_overrides` (``["seeds=1", "epochs=5"]``).

    Raises:
        FileNotFoundError: neither a file, a study folder nor a preset (the presets are listed).
        ValueError: the spec is not valid; the message names the file, the key and what is
            expected.
    """
    if isinstance(path_or_preset, StudySpec):
        if not overrides:
            return path_or_preset
        raw, source, stem = path_or_preset.to_dict(), path_or_preset.source, None
    elif isinstance(path_or_preset, dict):
        raw, source, stem = path_or_preset, "<dict>", None
    else:
        path = Path(path_or_preset)
        if path.is_dir() and (path / SPEC_FILE).is_file():
            path = path / SPEC_FILE
        elif not path.is_file():
            preset = PRESETS_DIR / f"{path_or_preset}.yaml"
            if path.suffix or os.sep in str(path_or_preset) or not preset.is_file():
                names = ", ".join(n for n, _ in list_presets()) or "none"
                raise FileNotFoundError(f"no study spec {str(path_or_preset)!r}: not a YAML file, "
                                        f"a study folder or a preset (presets: {names})")
            path = preset
        source, stem = str(path), path.stem if path.name != SPEC_FILE else path.parent.name
        raw = parse_yaml(read_spec_text(path), source)
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: a study spec is a mapping of keys (name, datasets, methods, "
                         f"...), got {type(raw).__name__}")
    if overrides:
        raw = apply_overrides(raw, overrides)
        keys = overrides if isinstance(overrides, dict) else [o.split("=", 1)[0] for o in overrides]
        if "methods" in keys:
            _drop_orphan_hparams(raw)
    return _validate(raw, source, stem)


def _drop_orphan_hparams(raw: dict) -> None:
    """After ``--set methods=...``: the spec's ``hparams`` of methods no longer in the study
    are dropped, with a warning (in a spec file such an entry is an error: a typo)."""
    import warnings

    hparams, methods = raw.get("hparams"), raw.get("methods")
    if not isinstance(hparams, dict) or not isinstance(methods, list):
        return
    names = set()
    for m in methods:
        spec = str(m.get("spec", "")) if isinstance(m, dict) else str(m)
        names |= {str(m.get("label")) if isinstance(m, dict) else spec,
                  re.split(r"[@+]", spec)[0]}
    for key in [k for k in hparams if k not in names]:
        warnings.warn(f"--set methods: hparams.{key} names no method of the study now; dropped",
                      stacklevel=3)
        del hparams[key]


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


def _loss_hparams(loss: str) -> set:
    from ..losses import loss_hparams

    return set(loss_hparams(loss)) | {"reg"}


def _check_k(value, source: str, key: str):
    if value == "true":
        return value
    if isinstance(value, str):
        from ..methods.base import interval_position

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


def _validate(raw: dict, source: str, stem: str | None) -> StudySpec:
    from ..data import DATASETS
    from ..data.options import PROTOCOL_OPTIONS, check_source_options
    from ..engine import TrainConfig, parse_early_stop
    from ..labels import parse_regime

    unknown = sorted(set(raw) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; a study spec has "
                         f"{', '.join(SPEC_KEYS)}")
    for key in REQUIRED_KEYS:
        if raw.get(key) is None:
            _fail(source, key, "missing (required)")
    name = str(raw.get("name") or stem or "")
    if not name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        _fail(source, "name", f"expected a folder-safe name (letters, digits, . _ -), got "
                              f"{name!r}")

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

    methods = []
    for i, item in enumerate(_list(raw["methods"], source, "methods")):
        key = f"methods[{i}]"
        own_mode = None
        if isinstance(item, dict):
            if "spec" not in item or set(item) - set(METHOD_KEYS) or \
                    ("mode" in item and not isinstance(item["mode"], str)):
                _fail(source, key, f"expected a method spec or {{label: ..., spec: ..., "
                                   f"mode: ..., mode_options: {{...}}, early_stop: ...}} (spec "
                                   f"required), got {item!r}")
            spec = str(item["spec"])
            label = str(item.get("label") or spec)
            options = _mapping(item.get("mode_options"), source, f"{key}.mode_options")
            own_mode = item.get("mode")
            own_stop = None if item.get("early_stop") is None else str(item["early_stop"])
            if own_stop is not None:
                from ..engine import parse_early_stop as _parse_stop

                try:
                    _parse_stop(own_stop)
                except ValueError as err:
                    _fail(source, f"{key}.early_stop", str(err))
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

    from ..methods import get_method, list_methods

    mode = raw.get("mode", "linear")
    known_modes = ", ".join(m.name for m in list_methods())
    try:
        method = get_method(str(mode))
    except ValueError:
        _fail(source, "mode", f"expected one of {known_modes}, got {mode!r}")
    modes = {}  # method label -> its TrainingMethod
    for i, m in enumerate(methods):
        try:
            modes[m.label] = get_method(m.mode) if m.mode else method
        except ValueError:
            _fail(source, f"methods[{i}].mode", f"expected one of {known_modes}, got "
                                                f"{m.mode!r}")
        trainer = modes[m.label]
        if m.mode and trainer.losses is not None and m.loss not in trainer.losses:
            _fail(source, f"methods[{i}]", f"mode {trainer.name!r} trains with the loss(es) "
                                           f"{list(trainer.losses)}, got {m.loss!r}")

    backbone_varies = "data.backbone" in (raw.get("vary") or {})
    for trainer in {t.name: t for t in modes.values()}.values():  # the modes the rows use
        if trainer.inputs != "features" or backbone_varies:
            continue
        for i, ds in enumerate(datasets):  # an image source needs a backbone's features
            if "images" in DATASETS.get(ds.name).tags and not ds.options.get("backbone"):
                _fail(source, f"datasets[{i}]", f"dataset {ds.name!r} holds images and mode "
                      f"{trainer.name!r} trains on feature vectors: give the dataset a backbone "
                      f"({{name: {ds.name}, options: {{backbone: NAME}}}}, or spml benchmark "
                      f"--backbone NAME; spml list backbones), or use an image mode (mode: "
                      f"finetune / lac with mode_options: {{backbone: NAME}})")

    seeds = raw.get("seeds", 3)
    if isinstance(seeds, (list, tuple)):
        seeds = [_number(s, source, "seeds", int, positive=False) for s in
                 _list(seeds, source, "seeds")]
        if len(set(seeds)) < len(seeds) or min(seeds) < 0 or max(seeds) >= 2**32:
            _fail(source, "seeds", f"expected distinct integers in [0, 2**32), got "
                                   f"{_short(seeds)}")
    else:
        count = _number(seeds, source, "seeds", int)
        if count > MAX_RUNS:
            _fail(source, "seeds", f"{count} seeds: a study has at most {MAX_RUNS} runs")
        seeds = list(range(count))
    epochs = _number(raw.get("epochs", 25), source, "epochs", int)
    early_stop = str(raw.get("early_stop", "none"))
    try:
        parse_early_stop(early_stop)
    except ValueError as err:
        _fail(source, "early_stop", str(err))

    config_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    train = _mapping(raw.get("train"), source, "train")
    for k in train:
        if k in _OWN_KEYS:
            where = "grid" if k in ("batch_size", "lr") else k
            _fail(source, f"train.{k}", f"set {k} with the spec key {where!r}, not under train")
        if k not in config_fields:
            _fail(source, f"train.{k}", f"not a TrainConfig field; known: "
                                        f"{', '.join(sorted(config_fields - set(_OWN_KEYS)))}")
    try:
        TrainConfig(**train)
    except (TypeError, ValueError) as err:
        _fail(source, "train", str(err))

    accepts = {m.label: _loss_hparams(m.loss) for m in methods}
    grid_raw = raw.get("grid")
    grid = dict(DEFAULT_GRID) if grid_raw is None else _mapping(grid_raw, source, "grid")
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
        elif k in _OWN_KEYS or k not in config_fields:
            _fail(source, f"grid.{k}", "expected batch_size, lr, hparams.<name> or a "
                                       "TrainConfig field")
        if len(set(map(json.dumps, values))) < len(values):
            _fail(source, f"grid.{k}", f"values repeat: {values}")
        grid[k] = values

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
            for ds in datasets:  # the key and each value (completeness: when a run loads)
                for v in values:
                    try:
                        check_source_options(ds.name, {key[5:]: v}, PROTOCOL_OPTIONS,
                                             complete=False)
                    except ValueError as err:
                        _fail(source, f"vary.{key}", str(err))
        elif key.startswith("lac.") and len(key) > 4:
            lac_rows = [m for m in methods if modes[m.label].name == "lac"]
            if not lac_rows:
                _fail(source, f"vary.{key}", "no method trains in mode lac")
            from ..methods.lac import config_of

            study_options = _mapping(raw.get("mode_options"), source, "mode_options")
            for m in lac_rows:
                own = merged(study_options, m.mode_options) if modes[m.label] is method \
                    else m.mode_options
                for v in values:
                    try:
                        config_of(own, **{key[4:]: v})
                    except (TypeError, ValueError) as err:
                        _fail(source, f"vary.{key}", f"{m.label}: {err}")
        elif key == "k":
            values = [_check_k(v, source, "vary.k") for v in values]
            if not any("k" in a for a in accepts.values()):
                _fail(source, "vary.k", "no method's loss takes k (epr, role do)")
        elif key == "regime":
            for v in values:
                try:
                    parse_regime(str(v))
                except ValueError as err:
                    _fail(source, "vary.regime", str(err))
            values = [str(v) for v in values]
        else:
            _fail(source, f"vary.{key}", "expected hparams.<name>, data.<option>, k, regime "
                                         "or lac.<field>")
        vary[key] = values

    mode_options = _mapping(raw.get("mode_options"), source, "mode_options")
    for where, trainer, opts in [("mode_options", method, mode_options)] + [
            (f"methods[{i}].mode_options", modes[m.label], m.mode_options)
            for i, m in enumerate(methods)]:
        try:
            trainer.check_options(opts)
        except ValueError as err:
            _fail(source, where, str(err))
    mlflow = raw.get("mlflow", False)
    if not isinstance(mlflow, bool):
        _fail(source, "mlflow", f"expected true or false, got {mlflow!r}")
    from ..metrics import check_metric

    metric = raw.get("metric", "map")
    try:
        check_metric(metric)
    except ValueError as err:
        _fail(source, "metric", str(err))
    runs = sum(len(seeds) * math.prod(len(vary[k]) for k in _axes(modes[m.label].name, m, vary))
               * math.prod(len(grid[k]) for k in _axes(modes[m.label].name, m, grid))
               for m in methods) \
        * len(datasets)
    if runs > MAX_RUNS:
        axes = ", ".join([f"{len(datasets)} dataset(s)", f"{len(methods)} method(s)",
                          f"{len(seeds)} seed(s)", *(f"{k}: {len(v)}" for k, v in vary.items()),
                          *(f"grid.{k}: {len(v)}" for k, v in grid.items())])
        raise ValueError(f"{source}: the study expands to {runs} runs ({axes}); a study has at "
                         f"most {MAX_RUNS}: fewer seeds, vary or grid values")
    return StudySpec(name=name, datasets=datasets, methods=methods,
                     title=str(raw.get("title") or name),
                     description=str(raw.get("description") or "").strip(),
                     mode=mode, seeds=seeds, epochs=epochs, early_stop=early_stop, grid=grid,
                     hparams=hparams, vary=vary, train=train, mode_options=mode_options,
                     mlflow=mlflow, source=source, metric=metric)


# ---- expansion ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunTask:
    """One grid point of one (dataset, method, seed, vary assignment): one run folder, one row."""

    run_id: str
    study: str
    method: str
    loss: str
    dataset: str
    dataset_options: dict
    regime: str
    seed: int
    variant: dict        # the vary assignment ({} if none)
    hparams: dict
    k: object            # None (the train split's mean), a number, "estimate:M:bound" or
    #                      "interval:M:position" (resolve_k)
    mode: str
    train: dict          # TrainConfig fields
    mode_options: dict

    @property
    def batch_size(self) -> int:
        return int(self.train["batch_size"])

    @property
    def lr(self) -> float:
        return float(self.train["lr"])

    def config(self) -> dict:
        """The resolved configuration (what the run id's hash is of)."""
        return {"method": self.method, "loss": self.loss, "dataset": self.dataset,
                "dataset_options": self.dataset_options, "regime": self.regime,
                "hparams": self.hparams, "k": self.k, "mode": self.mode, "train": self.train,
                "mode_options": self.mode_options}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_")


#: settings that change where things are cached, what is shown and how fast, never the
#: numbers: left out of a run id's hash (so a run is found again whatever they were)
NOT_RESULTS = {"dataset_options": ("cache_dir", "progress"),
               "dataset_options.features": ("cache_dir", "progress", "num_workers",
                                            "batch_size", "device"),
               "mode_options": ("cache_dir", "progress"),
               "mode_options.features": ("num_workers", "batch_size", "device"),
               "train": ("num_workers", "eval_batch_size")}


def result_config(config: dict) -> dict:
    """``config`` without the :data:`NOT_RESULTS` keys (what a run id's hash is of)."""
    out = json.loads(json.dumps(config, default=str))
    for where, keys in NOT_RESULTS.items():
        node = out
        for part in where.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            for key in keys:
                node.pop(key, None)
    for where in ("dataset_options", "mode_options"):  # emptied by the above: as if absent
        if isinstance(out.get(where), dict) and out[where].get("features") == {}:
            del out[where]["features"]
    from ..methods import METHODS, get_method

    spelled = get_method(out["mode"]) if out.get("mode") in METHODS else None
    if spelled is not None and spelled.id_options and isinstance(out.get("mode_options"), dict):
        out["mode_options"] = spelled.id_options(out["mode_options"])  # LAC: ids kept
    return out


def run_id_for(config: dict, seed: int, variant: dict) -> str:
    """``<dataset>-<method>-<regime>-s<seed>-b<batch>-lr<lr>[-<vary>]-<hash8>``; the hash is of
    the resolved configuration without what cannot change the numbers (:func:`result_config`:
    cache folders, progress bars, worker counts), so the id changes with anything that changes
    the run and with nothing else."""
    digest = hashlib.sha1(json.dumps(result_config(config), sort_keys=True,
                                     default=str).encode()).hexdigest()
    train = config["train"]
    parts = [config["dataset"], config["method"], config["regime"], f"s{seed}",
             f"b{train['batch_size']}", f"lr{train['lr']:g}"]
    parts += [f"{k.split('.', 1)[-1]}{v}" for k, v in sorted(variant.items()) if k != "regime"]
    readable = "-".join(_slug(p) for p in parts)[:100]
    return f"{readable}-{digest[:8]}"


def _axes(mode: str, m: MethodSpec, keys) -> list:
    """The keys of ``keys`` (vary or grid axes) that apply to method ``m``, which trains in
    ``mode``."""
    accepts = _loss_hparams(m.loss)
    out = []
    for key in keys:
        if key.startswith("hparams."):
            use = key[8:] in accepts
        elif key == "k":
            use = "k" in accepts
        elif key == "regime":
            use = not m.fixed_regime
        elif key.startswith("lac."):
            use = mode == "lac"
        else:  # data.<option>, batch_size, lr, other TrainConfig fields
            use = True
        if use:
            out.append(key)
    return out


def _assignments(table: dict, keys: list) -> list[dict]:
    return [dict(zip(keys, values)) for values in itertools.product(*(table[k] for k in keys))]


def expand(spec: StudySpec) -> list[RunTask]:
    """Every run of a study: datasets x methods x seeds x vary assignments x grid points (a vary
    or grid axis only for the methods it applies to; see the module docstring)."""
    tasks, seen = [], set()
    for ds in spec.datasets:
        for m in spec.methods:
            fixed = {**spec.hparams.get(m.loss, {}), **spec.hparams.get(m.label, {})}
            vary_keys = _axes(spec.method_mode(m), m, spec.vary)
            grid_keys = _axes(spec.method_mode(m), m, spec.grid)
            for seed in spec.seeds:
                for variant in _assignments(spec.vary, vary_keys):
                    for point in _assignments(spec.grid, grid_keys):
                        hp = dict(fixed)
                        train = {"epochs": spec.epochs, "seed": seed,
                                 "early_stop": m.early_stop or spec.early_stop, **spec.train}
                        if spec.metric != "map":  # (map runs keep the ids they always had)
                            train["metric"] = spec.metric
                        options = dict(ds.options)
                        mode_options = spec.method_options(m)
                        for key, value in {**variant, **point}.items():
                            if key.startswith("hparams."):
                                hp[key[8:]] = value
                            elif key.startswith("lac."):
                                mode_options = {**mode_options, key[4:]: value}
                            elif key.startswith("data."):
                                options[key[5:]] = value
                            elif key not in ("k", "regime"):
                                train[key] = value
                        if options.get("protocol") == "tabular":
                            options.setdefault("seed", seed)  # a trial: its own split
                        if m.reg:
                            hp["reg"] = list(m.reg)
                        config = {"method": m.label, "loss": m.loss, "dataset": ds.name,
                                  "dataset_options": options,
                                  "regime": variant.get("regime", m.regime), "hparams": hp,
                                  "k": variant.get("k"), "mode": spec.method_mode(m),
                                  "train": dict(sorted(train.items())),
                                  "mode_options": mode_options}
                        run_id = run_id_for(config, seed, variant)
                        if run_id in seen:
                            continue
                        seen.add(run_id)
                        tasks.append(RunTask(run_id=run_id, study=spec.name, seed=seed,
                                             variant=variant, **config))
    return tasks


# ---- one run (in a worker process) -------------------------------------------------------------
def _row_header(task: dict) -> dict:
    """The store columns a task dict fixes before it runs (identity, grid point, config)."""
    row = {c: task[c] for c in ("run_id", "study", "method", "loss", "dataset", "regime", "seed",
                                "mode")}
    row.update(variant=json.dumps(task["variant"], sort_keys=True),
               batch_size=int(task["train"]["batch_size"]), lr=float(task["train"]["lr"]),
               config=json.dumps({k: task[k] for k in ("method", "loss", "dataset",
                                                       "dataset_options", "regime", "hparams",
                                                       "k", "mode", "train", "mode_options",
                                                       "variant")}, default=str))
    return row


def lost_row(task: dict, reason: str) -> dict:
    """The ``failed`` store row of a task whose worker process died on every try (``reason``,
    from :func:`spmlkit.experiments.pool.run_tasks`, says how and how often)."""
    return {**_row_header(task), "status": "failed", "error": reason, "seconds": None,
            "metrics": "{}"}


def resumable(folder: Path) -> bool:
    """Whether a run folder left by an earlier try can be continued rather than replaced: it has
    its ``config.json`` and a ``checkpoint.pt`` (or is finished: ``final.json``)."""
    from ..runs import CHECKPOINT_FILE, CONFIG_FILE, FINAL_FILE

    return (folder / CONFIG_FILE).is_file() and ((folder / CHECKPOINT_FILE).is_file()
                                                  or (folder / FINAL_FILE).is_file())


def _failed_row(task: dict, err: BaseException, text: str, seconds: float) -> dict:
    row = _row_header(task)
    if isinstance(err, FloatingPointError):
        text = f"diverged: {err}\n{text}"
    row.update(status="failed", error=text[-6000:], seconds=seconds, metrics="{}")
    return row


def _done_row(task: dict, res: dict, k) -> dict:
    row = _row_header(task)
    res = dict(res)
    run_dir = res.pop("run_dir", None)
    if run_dir is not None:
        try:  # relative to the study folder, so the folder can move
            run_dir = str(Path(run_dir).resolve().relative_to(
                Path(task["runs_root"]).resolve().parent))
        except ValueError:
            pass
    res["k_used"] = k
    row.update(status="done", val_map=res.get("val_map"), test_map=res.get("test_map"),
               train_recovery_map=res.get("train_recovery_map"),
               best_epoch=res.get("best_epoch"), seconds=res.get("seconds"),
               metrics=json.dumps(res, default=_plain), run_dir=run_dir)
    return row


def _task_setup(task: dict):
    """``(splits, k, method, options)`` of a task dict: the splits (cached per worker), the
    resolved k, the training method and its options (no per-run progress bars)."""
    from ..methods import get_method, resolve_k

    splits = cached_splits(task["dataset"], task["regime"], task["dataset_options"])
    k = resolve_k(task["k"], splits, task["seed"])
    method = get_method(task["mode"])
    options = dict(task["mode_options"])
    if "progress" in method.options:  # per-run bars would garble the study's bar
        options.setdefault("progress", False)
    return splits, k, method, options


def run_task(task: dict) -> list[dict]:
    """What the study's workers run: a task dict of one run (:func:`execute`) or of a group of
    runs trained at once (``{"group": [task, ...], ...}``, :func:`execute_group`); the store
    rows, one per run."""
    return execute_group(task) if "group" in task else [execute(task)]


def lost_rows(task: dict, reason: str) -> list[dict]:
    """:func:`lost_row` of every run of a (group) task."""
    return [lost_row(t, reason) for t in task.get("group", [task])]


def execute_group(task: dict) -> list[dict]:
    """Run a group of task dicts at once (the linear mode's stacked runs,
    :func:`spmlkit.methods.train_runs`; :func:`group_tasks` says which runs group); one store
    row per run, each as :func:`execute` would have made it: a run that fails (its data or k
    cannot be set up, its loss raises, it diverges) fails alone, the others train on."""
    from ..engine import TrainConfig
    from ..methods import train_runs

    t0 = time.perf_counter()
    members = [{**m, "runs_root": task["runs_root"]} for m in task["group"]]
    for m in members:
        folder = Path(m["runs_root"]) / m["run_id"]
        if folder.exists():  # left by a try whose worker died: the retry replaces it
            _safe_remove(folder, folder.parent / ".stale")
    rows: list = [None] * len(members)
    setups, ready = [], []
    for i, m in enumerate(members):  # a run whose data or k cannot be set up fails alone
        try:
            setups.append(_task_setup(m))  # splits cached: one load per regime
            ready.append(i)
        except Exception as err:  # noqa: BLE001 (recorded; the group's other runs go on)
            rows[i] = _failed_row(m, err, traceback.format_exc(), time.perf_counter() - t0)
    if not ready:
        return rows
    group = [members[i] for i in ready]
    first = group[0]
    try:
        method, options = setups[0][2], setups[0][3]
        ks = [setup[1] for setup in setups]
        results = train_runs(method, [setup[0] for setup in setups],
                             [m["loss"] for m in group], [dict(m["hparams"]) for m in group],
                             [TrainConfig(**m["train"]) for m in group], k=ks,
                             out=first["runs_root"], run_names=[m["run_id"] for m in group],
                             dataset_options=first["dataset_options"], **options)
    except Exception as err:  # every run of the group failed with it
        text = traceback.format_exc()
        for i, m in zip(ready, group):
            rows[i] = _failed_row(m, err, text, time.perf_counter() - t0)
        return rows
    for i, m, res, k in zip(ready, group, results, ks):
        if isinstance(res, BaseException):
            text = "".join(traceback.format_exception(type(res), res, res.__traceback__))
            rows[i] = _failed_row(m, res, text, None)
        else:
            rows[i] = _done_row(m, res, k)
    return rows


def group_tasks(tasks: list[RunTask], jobs: int = 1) -> list:
    """The tasks of a study as the workers get them: single :class:`RunTask` s, and lists of
    tasks that train together (the linear mode's stacked runs,
    :mod:`spmlkit.engine.vectorised`).

    Runs group when they differ only in seed and learning rate (same dataset and options,
    regime, method, loss and hyperparameters, ``k`` as resolved for the run (an
    ``estimate:`` / ``interval:`` k is resolved here, with the run's seed), batch size and the
    rest of the train config, mode options), their mode can train several at once
    (``TrainingMethod.fit_many``, no ``save_train_probs``) and their loss can be stacked
    (:func:`spmlkit.engine.vectorised.can_stack`). Runs of closed-form losses
    (:func:`spmlkit.engine.vectorised.closed_form`: AN, AN-LS, WAN, EPR, BCE, ...) group across
    losses, hyperparameters, regimes and ``k`` too (one stack for the BCE family of a batch
    size). A group is cut into chunks of at most
    :func:`spmlkit.engine.vectorised.stack_limit` runs (memory, and on a CPU whether the
    per-step work is small enough to gain: 1 means the runs stay single), and the largest
    groups are halved until there are at least ``jobs`` tasks, so every worker has work.
    """
    import numpy as np

    from ..data import load_splits
    from ..engine import TrainConfig
    from ..engine.vectorised import can_stack, closed_form, stack_limit
    from ..losses import create_loss
    from ..methods import get_method, resolve_k
    from .pool import cached_splits

    groups: dict = {}
    closed: dict = {}  # (loss, hparams) -> closed_form
    out: list = []
    for t in tasks:
        method = get_method(t.mode)
        if method.fit_many is None or t.mode_options.get("save_train_probs") or \
                t.mode_options.get("head", "linear") != "linear":
            out.append(t)
            continue
        k = t.k
        if isinstance(k, str):  # the value the run will train with (a stack shares one k)
            try:
                k = resolve_k(k, cached_splits(t.dataset, t.regime, t.dataset_options), t.seed)
            except Exception:  # noqa: BLE001 (the run itself will say what is wrong)
                out.append(t)
                continue
        rest = {k_: v for k_, v in t.train.items() if k_ not in ("seed", "lr")}
        own = [t.regime, t.method, t.loss, t.hparams, k]
        spec = json.dumps([t.loss, t.hparams], sort_keys=True, default=str)
        if spec not in closed:
            try:
                closed[spec] = closed_form(create_loss(t.loss, **t.hparams))
            except (TypeError, ValueError):  # the run itself will say what is wrong
                closed[spec] = False
        if closed[spec]:
            own = ["closed-form"]
        key = json.dumps([t.dataset, t.dataset_options, *own, t.mode, rest, t.mode_options],
                         sort_keys=True, default=str)
        groups.setdefault(key, []).append(t)
    shapes: dict = {}
    for members in groups.values():
        first = members[0]
        try:
            loss = create_loss(first.loss, **first.hparams)
            config = TrainConfig(**first.train)
        except (TypeError, ValueError):  # the run itself will say what is wrong
            out.extend(members)
            continue
        if len(members) < 2 or can_stack(loss, config) is not None:
            out.extend(members)
            continue
        data = (first.dataset, first.regime, json.dumps(first.dataset_options, sort_keys=True,
                                                        default=str))
        if data not in shapes:
            try:
                splits = load_splits(first.dataset, first.regime, **first.dataset_options)
                shapes[data] = (len(splits.train), len(splits.val),
                                int(np.shape(splits.train.x)[1]), len(splits.class_names))
                del splits
            except Exception:  # noqa: BLE001 (the runs report it)
                shapes[data] = None
        if shapes[data] is None:
            out.extend(members)
            continue
        limit = stack_limit(*shapes[data], config.batch_size, loss, config.device)
        if limit < 2:
            out.extend(members)
            continue
        chunks = -(-len(members) // limit)
        size = -(-len(members) // chunks)
        out.extend(members[i:i + size] for i in range(0, len(members), size))
    while len(out) < jobs:  # halve the largest group until every worker has a task
        big = max((i for i, t in enumerate(out) if isinstance(t, list)),
                  key=lambda i: len(out[i]), default=None)
        if big is None or len(out[big]) < 4:
            break
        members = out.pop(big)
        half = len(members) // 2
        out += [members[:half], members[half:]]
    return [t[0] if isinstance(t, list) and len(t) == 1 else t for t in out]


def execute(task: dict) -> dict:
    """Run one task dict (``RunTask`` fields plus ``runs_root``, the folder the run folder is
    made in, and optionally ``checkpoint_seconds``) and return its store row; an exception
    becomes a ``failed`` row with the traceback.

    A run folder left by an earlier try (a worker that died, a launch that was stopped) is
    *resumed* from its ``checkpoint.pt`` (:func:`spmlkit.methods.train_run` with ``resume``;
    the epochs after the checkpoint are trained again, none twice in ``metrics.jsonl``), or
    read back if it finished; one without a checkpoint, or one that cannot be resumed
    (:class:`spmlkit.methods.ResumeError`), is replaced by a fresh run.
    """
    from ..engine import TrainConfig
    from ..methods import ResumeError, train_run

    t0 = time.perf_counter()
    folder = Path(task["runs_root"]) / task["run_id"]
    resume = None
    if folder.exists():
        if resumable(folder):
            resume = folder
        else:  # killed before its first checkpoint: nothing to continue from
            _safe_remove(folder, folder.parent / ".stale")
    try:
        splits, k, method, options = _task_setup(task)

        def train(resume):
            return train_run(method, splits, task["loss"], dict(task["hparams"]),
                             TrainConfig(**task["train"]), k=k, out=task["runs_root"],
                             run_name=task["run_id"], dataset_options=task["dataset_options"],
                             resume=resume, checkpoint_seconds=task.get("checkpoint_seconds"),
                             **options)

        try:
            res = train(resume)
        except ResumeError:
            if resume is None:
                raise
            _safe_remove(folder, folder.parent / ".stale")
            res = train(None)
    except Exception as err:  # recorded as a failed run; the study goes on
        return _failed_row(task, err, traceback.format_exc(), time.perf_counter() - t0)
    return _done_row(task, res, k)


def failure_groups(rows) -> list[dict]:
    """The failed rows among ``rows`` grouped by their error: one group per identical
    traceback (compared with the run's own id taken out, so a path through its run folder does
    not split a group), the most common first.

    Returns:
        ``[{"reason", "count", "run_ids", "error"}]``: ``reason`` is the error's last line
        (the exception and its message), ``error`` the first run's full text.

    >>> rows = [{"run_id": f"r{i}", "status": "failed", "error": "Traceback ...\\nValueError: "
    ...          "dataset 'voc' needs the option(s) root"} for i in range(3)]
    >>> [(g["count"], g["reason"]) for g in failure_groups(rows)]
    [(3, "ValueError: dataset 'voc' needs the option(s) root")]
    """
    groups: dict = {}
    for row in rows:
        if row.get("status") != "failed":
            continue
        text = str(row.get("error") or "no error recorded")
        run_id = str(row.get("run_id") or "")
        key = text.replace(run_id, "<run>") if run_id else text
        if key not in groups:
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            groups[key] = {"reason": lines[-1] if lines else text, "count": 0, "run_ids": [],
                           "error": text}
        groups[key]["count"] += 1
        groups[key]["run_ids"].append(run_id)
    return sorted(groups.values(), key=lambda g: -g["count"])


def _plain(obj):
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


# ---- the study ---------------------------------------------------------------------------------
def _safe_remove(folder: Path, trash: Path) -> None:
    """Move a stale run folder out of the way atomically (a rename), then delete it; the
    trash folder goes too once it is empty (another worker may be using it: then it stays,
    and a worker whose trash folder was just removed makes it again)."""
    target = trash / f"{folder.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    for attempt in range(5):
        trash.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(folder, target)
            break
        except FileNotFoundError:
            if not folder.exists() or attempt == 4:
                raise
    shutil.rmtree(target, ignore_errors=True)
    with contextlib.suppress(OSError):
        trash.rmdir()


@contextlib.contextmanager
def _closing(executor):
    """A context that closes ``executor`` (a connected Dask executor, None: nothing) when it
    ends, whatever ends it."""
    try:
        yield executor
    finally:
        if executor is not None:
            executor.close()


@contextlib.contextmanager
def _study_lock(out: Path):
    """One launch per study folder at a time (an advisory ``flock`` on ``<out>/.lock``)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    fh = open(out / ".lock", "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            raise ValueError(f"{out} is being run by another launch (pid {holder}); wait for it "
                             f"or stop it first") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield
    finally:
        fh.close()


@contextlib.contextmanager
def _unless_refused(out: Path, created: bool):
    """A launch refused before it was recorded (``launches.jsonl``) leaves no study folder it
    made itself (a bad --jobs, a missing scheduler file, ...)."""
    try:
        yield
    except BaseException:
        if created and not (out / LAUNCHES_FILE).exists():
            shutil.rmtree(out, ignore_errors=True)
        raise


@contextlib.contextmanager
def _sigterm_as_exit():
    """SIGTERM (``timeout``, ``kill``) unwinds like Ctrl-C, so the workers are stopped too."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _update_launch(path: Path, launch: dict) -> None:
    lines = path.read_text().splitlines() if path.exists() else []
    out, found = [], False
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            out.append(line)
            continue
        if isinstance(rec, dict) and rec.get("launch_id") == launch["launch_id"]:
            line, found = json.dumps(launch), True
        out.append(line)
    if not found:
        out.append(json.dumps(launch))
    write_text(path, "\n".join(out) + "\n")


def _import_mlflow():
    try:
        import mlflow
    except ImportError:
        raise ModuleNotFoundError("mlflow logging was asked for (mlflow=True, --mlflow or "
                                  "`mlflow: true` in the spec) but mlflow is not installed: "
                                  "pip install mlflow") from None
    return mlflow


def _log_mlflow(mlflow, task: RunTask, row: dict) -> None:
    params = {"method": task.method, "loss": task.loss, "dataset": task.dataset,
              "regime": task.regime, "seed": task.seed, "batch_size": task.batch_size,
              "lr": task.lr, "mode": task.mode, "epochs": task.train.get("epochs"),
              "k": task.k, "variant": json.dumps(task.variant, sort_keys=True),
              **{f"hparams.{k}": v for k, v in task.hparams.items()},
              **{f"data.{k}": v for k, v in task.dataset_options.items()}}
    metrics = {k: float(row[k]) for k in ("val_map", "test_map", "train_recovery_map",
                                          "best_epoch", "seconds")
               if isinstance(row.get(k), (int, float)) and row[k] == row[k]}
    with mlflow.start_run(run_name=task.run_id):
        mlflow.log_params({k: str(v) for k, v in params.items()})
        if metrics:
            mlflow.log_metrics(metrics)
        mlflow.set_tag("status", row["status"])


def run_study(spec, out=None, jobs: int | None = None, progress: bool = True,
              mlflow: bool = False, *, argv=None, retry_failed: bool = False,
              threads: int | None = None, retries: int = 1,
              checkpoint_seconds: float | None = None, dask: str | None = None,
              scheduler_file=None, executor=None, vectorise: bool = True,
              connect_timeout: float | None = None) -> dict:
    """Run a study's missing runs in parallel; every finished run's row goes to the store at once.

    Args:
        spec: a :class:`StudySpec`, or anything :func:`load_study` reads.
        out: the study folder (default ``runs/studies/<name>``): ``study.yaml`` (the resolved
            spec), ``results.sqlite``, ``runs/<run_id>/``, ``launches.jsonl``.
        jobs: worker processes (default: the CPU count; 1: in this process), also those of a
            Dask ``LocalCluster`` (``dask="local"``); not with a running cluster (``dask`` an
            address, ``scheduler_file``), which has the workers it has.
        progress: a tqdm bar (runs done / total, failures, ETA).
        mlflow: also log each run's parameters and final metrics to MLflow (as does
            ``mlflow: true`` in the spec); needs ``pip install mlflow``.
        argv: the command line recorded in ``launches.jsonl`` (the CLI passes ``sys.argv``).
        retry_failed: run the runs recorded as failed again.
        threads: torch threads per worker (default 1 in linear mode, else cores / jobs).
        retries: how many more times a run whose worker process died (killed by the
            out-of-memory killer, say) is run (alone, in the local pool) before it is recorded
            as ``failed`` with the reason (:func:`spmlkit.experiments.pool.run_tasks`; on Dask
            see :mod:`spmlkit.experiments.dask_executor`). A retried run resumes from
            its ``checkpoint.pt`` (:func:`execute`), as does a run of an earlier launch that
            was stopped.
        checkpoint_seconds: how often a run writes its resumable checkpoint (seconds between
            writes, after an epoch; default
            :data:`spmlkit.methods.base.CHECKPOINT_SECONDS`; 0: every epoch).
        dask: run on Dask distributed (``pip install -e ".[dask]"`` in the clone): ``"local"`` for a
            ``LocalCluster`` of ``jobs`` worker processes on this machine, or a scheduler's
            address (``"tcp://host:8786"``); the study folder must be visible to the workers at
            the same path (:mod:`spmlkit.experiments.dask_executor`).
        scheduler_file: run on the Dask scheduler this JSON file names (``dask scheduler
            --scheduler-file``, dask-jobqueue). The scheduler is reached before anything is
            written; the stacks are cut for the worker threads it has then.
        executor: any :class:`spmlkit.experiments.pool.Executor` (overrides ``jobs``,
            ``dask`` and ``scheduler_file``).
        vectorise: train the runs that differ only in seed and learning rate together where
            the mode and loss can (:func:`group_tasks`; the linear mode's stacked runs, same
            results up to floating-point summation order); False: one task per run. A group
            whose worker dies is retried (or lost) as a whole and restarts from scratch.
        connect_timeout: seconds a Dask scheduler gets to answer (default
            :data:`spmlkit.experiments.dask_executor.CONNECT_TIMEOUT`).

    Returns:
        ``{"out", "runs_total", "runs_done_before", "runs_run", "failures", "seconds",
        "jobs", "executor", "failure_groups"}`` (``executor``: where the runs ran, in words);
        ``failure_groups``: this launch's failed runs grouped by their error
        (:func:`failure_groups`), also summarised in ``launches.jsonl``.

    Raises:
        ModuleNotFoundError: mlflow, or dask for ``dask`` / ``scheduler_file``, asked for but
            not installed.
        ValueError: the spec is invalid, another launch runs the same folder, both
            ``dask`` and ``scheduler_file`` are given, or the scheduler address is not one.
        FileNotFoundError: ``scheduler_file`` does not exist.
        ConnectionError: the Dask scheduler cannot be reached (nothing is written then).
        spmlkit.experiments.dask_executor.SchedulerLost: the Dask scheduler went away
            mid-study (a ConnectionError; the finished runs are in the store, the same call
            against a running scheduler runs the missing ones).
    """
    from tqdm import tqdm

    from ..methods import get_method

    spec = load_study(spec)
    mlflow_module = _import_mlflow() if (mlflow or spec.mlflow) else None
    if checkpoint_seconds is not None and not checkpoint_seconds >= 0:
        raise ValueError(f"checkpoint_seconds (seconds between checkpoints) must be >= 0, got "
                         f"{checkpoint_seconds}")
    if dask is not None and scheduler_file is not None:
        raise ValueError("give --dask (local or a scheduler address) or --scheduler-file, not "
                         "both")
    if connect_timeout is not None and scheduler_file is None and dask in (None, "local"):
        raise ValueError("connect_timeout is for a running Dask cluster (--scheduler, "
                         "--scheduler-file)")
    cluster = None  # a running Dask cluster's executor, connected before anything is written
    if dask is not None or scheduler_file is not None:
        from .dask_executor import DaskExecutor, import_distributed

        import_distributed()  # before anything is written: says how to install it
        if executor is None and dask != "local":
            options = {} if connect_timeout is None else {"connect_timeout": connect_timeout}
            cluster = DaskExecutor(dask, scheduler_file=scheduler_file, **options)
            if jobs is not None:  # (after the address is checked: the more basic error first)
                raise ValueError(f"jobs ({jobs}) is the size of a local pool or a Dask "
                                 f"LocalCluster; a running Dask cluster has the workers it has")
            cluster.connect()
    out = Path(out) if out is not None else STUDIES_ROOT / spec.name
    created = not out.exists()
    out = make_folder(out)
    with _closing(cluster), _study_lock(out), _unless_refused(out, created):
        write_text(out / SPEC_FILE, spec.to_yaml())
        make_folder(out / RUNS_DIR)  # a file in its place: refused here, not by every run
        store = StudyStore(out / RESULTS_FILE)
        tasks = expand(spec)
        status = {r["run_id"]: r["status"] for r in store.rows()}
        skip = {"done"} if retry_failed else {"done", "failed"}
        todo = [t for t in tasks if status.get(t.run_id) not in skip]
        finished_before = len(tasks) - len(todo)
        # longest first (small batches, stateful losses), for a balanced pool
        todo.sort(key=lambda t: (t.batch_size, t.loss != "role"))
        jobs = default_jobs(jobs, len(todo)) if cluster is None else cluster.slots()
        threads_given = threads is not None
        # feature-vector runs only (every method's mode): one thread each
        on_features = all(get_method(t.mode).inputs == "features" for t in todo or tasks)
        if threads is None:
            threads = 1 if on_features else \
                max(1, (os.cpu_count() or 1) // jobs)
        from ..methods import versions

        if cluster is not None:
            if not threads_given:  # the worker machines' cores are theirs to count
                threads = 1 if on_features else None
            cluster.threads = threads
            executor = cluster  # jobs: its worker threads now, for the launch record
        elif executor is None and dask == "local":
            executor = DaskExecutor(n_workers=jobs, threads=threads)
        where = executor.describe() if executor is not None else \
            InProcessExecutor().describe() if jobs <= 1 else LocalExecutor(jobs).describe()
        launch = {"launch_id": uuid.uuid4().hex, "argv": list(argv) if argv else None,
                  "started": _now(), "finished": None, "runs_total": len(tasks),
                  "runs_done_before": finished_before, "runs_run": 0, "failures": 0,
                  "seconds": None, "jobs": jobs, "executor": where, "versions": versions()}
        launches = out / LAUNCHES_FILE
        with open(launches, "a") as fh:
            fh.write(json.dumps(launch) + "\n")
        runs_root = out / RUNS_DIR
        with contextlib.suppress(OSError):
            (runs_root / ".stale").rmdir()  # when empty
        on_vectors = [t for t in todo if get_method(t.mode).inputs == "features"]
        if on_vectors:
            _prepare_features(spec, on_vectors, progress)
        if mlflow_module is not None and todo:
            mlflow_module.set_experiment(spec.name)
        by_id = {t.run_id: t for t in todo}
        units = group_tasks(todo, jobs) if vectorise else list(todo)
        units.sort(key=lambda u: -len(u) if isinstance(u, list) else 0)  # groups first
        root = str(runs_root.resolve())
        payloads = []
        for u in units:
            if isinstance(u, list):
                members = [dataclasses.asdict(t) for t in u]
                payloads.append({"run_id": f"{u[0].run_id}+{len(u) - 1}", "group": members,
                                 "runs_root": root})
            else:
                payloads.append({**dataclasses.asdict(u), "runs_root": root,
                                 "checkpoint_seconds": checkpoint_seconds})
        bar = tqdm(total=len(tasks), initial=finished_before, desc=f"study {spec.name}",
                   unit="run", disable=not progress)
        if finished_before and progress:
            bar.write(f"resuming {out}: {finished_before} of {len(tasks)} run(s) already "
                      f"finished")
        start = time.perf_counter()
        failed_rows = []
        try:
            with _sigterm_as_exit():
                for rows in run_tasks(run_task, payloads, jobs, threads, retries=retries,
                                      on_lost=lost_rows, executor=executor):
                    store.put_many(rows)  # a group's rows in one transaction
                    for row in rows:
                        launch["runs_run"] += 1
                        launch["failures"] += row["status"] == "failed"
                        if row["status"] == "failed":
                            failed_rows.append(row)
                        if mlflow_module is not None:
                            _log_mlflow(mlflow_module, by_id[row["run_id"]], row)
                        val = row.get("val_map")
                        last = f"val {val:.1f}" if isinstance(val, float) else row["status"]
                        bar.set_postfix_str(f"failed {launch['failures']}, last "
                                            f"{row['method']} {last}")
                        bar.update()
                    _update_launch(launches, launch)  # a killed launch's record stays true
            launch["finished"] = _now()
        finally:
            bar.close()
            launch["seconds"] = time.perf_counter() - start
            groups = failure_groups(failed_rows)
            if groups:
                launch["failure_reasons"] = [{"reason": g["reason"], "count": g["count"],
                                              "first": g["run_ids"][0]} for g in groups]
            _update_launch(launches, launch)
    return {"out": str(out), **{k: launch[k] for k in ("runs_total", "runs_done_before",
                                                       "runs_run", "failures", "seconds",
                                                       "jobs", "executor")},
            "failure_groups": groups}


def _prepare_features(spec: StudySpec, todo, progress: bool = True) -> None:
    """Image sources on a backbone's features: extract them once here (a progress bar unless
    ``progress`` is False), before the workers all want them."""
    from ..data import load_dataset

    wanted = {t.dataset for t in todo}
    for ds in spec.datasets:  # the spec's own options (a data.* vary axis is the runs' business)
        if ds.options.get("backbone") and ds.name in wanted:
            options = dict(ds.options)
            options["features"] = {"progress": progress, **(options.get("features") or {})}
            load_dataset(ds.name, **options)


# ---- reading a study folder --------------------------------------------------------------------
def study_spec(out) -> StudySpec:
    """The spec of the study folder ``out`` (its ``study.yaml``, validated).

    Raises:
        FileNotFoundError: ``out`` does not exist, or has no ``study.yaml`` (not a study
            folder).
        ValueError: ``study.yaml`` is not a valid spec (the file and key are named).
    """
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"study folder {out} does not exist (give the folder `spml study "
                                f"run` wrote, {STUDIES_ROOT}/<name> by default)")
    if not (out / SPEC_FILE).is_file():
        raise FileNotFoundError(f"{out / SPEC_FILE} is missing: {out} is not a study folder "
                                f"(`spml study run` writes it)")
    return load_study(out / SPEC_FILE)


@dataclass
class StudyFolder:
    """A study folder read against its current spec: what :func:`open_study` returns, and the
    one view of a study's results that ``spml study status | table | export``, ``spml report``
    and ``spml figure sweep`` share.

    A run id hashes the run's whole configuration, so a folder re-run with a changed spec
    (``--set epochs=3``, another grid) holds rows of the earlier spec's runs too. Those are
    ``stale``: kept in ``results.sqlite`` and counted, but in no table, figure, selection or
    default export.

    Attributes:
        path: the folder.
        spec: its validated spec (``study.yaml``); ``spec_text`` the file as written.
        run_ids: the current spec's run ids, in expansion order.
        rows: the stored rows of those runs (any status), ordered by run id.
        selected: per (method, dataset, regime, seed, variant) the finished row of ``rows``
            with the best val value of the spec's ``metric`` (mAP by default;
            :func:`spmlkit.experiments.store.select_best`).
        stale: the stored rows of runs the current spec does not have.
        has_results: whether ``results.sqlite`` exists (the study has run).
    """

    path: Path
    spec: StudySpec
    spec_text: str
    run_ids: list
    rows: list
    selected: list
    stale: list
    has_results: bool

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def title(self) -> str:
        return self.spec.title or self.spec.name

    @property
    def results_path(self) -> Path:
        return self.path / RESULTS_FILE

    @property
    def failed(self) -> list:
        """The current spec's failed rows."""
        return [r for r in self.rows if r.get("status") == "failed"]

    def status(self) -> dict:
        """Counts against the spec: ``total``, ``done``, ``failed``, ``missing`` (not run yet,
        or killed), ``stale`` (stored rows of runs the current spec no longer has)."""
        done = sum(r.get("status") == "done" for r in self.rows)
        failed = len(self.failed)
        return {"name": self.name, "title": self.title, "total": len(self.run_ids),
                "done": done, "failed": failed, "missing": len(self.run_ids) - done - failed,
                "stale": len(self.stale)}

    def read_launches(self) -> list:
        """The records of ``launches.jsonl`` (one per launch, oldest first; ``[]`` without the
        file). ``ValueError`` names a line that is not JSON."""
        path = self.path / LAUNCHES_FILE
        if not path.is_file():
            return []
        return [record for _, record in json_lines(path) if isinstance(record, dict)]

    def export(self, path, fmt: str = "csv", *, selected: bool = False,
               include_stale: bool = False, force: bool = False) -> Path:
        """Write the current spec's rows (or the selected ones; or, with ``include_stale``,
        every stored row) as ``csv`` / ``json`` / ``markdown`` / ``latex``
        (:func:`spmlkit.experiments.store.format_rows`) to ``path``, atomically; an existing
        file is kept and the next free name written unless ``force``. Returns the path written.
        """
        from ..runs import write_output
        from .store import format_rows

        if selected and include_stale:
            raise ValueError("selected rows are chosen among the current spec's runs: ask for "
                             "the selected rows or for every stored row, not both")
        if selected:
            rows = self.selected
        elif include_stale:
            rows = sorted(self.rows + self.stale, key=lambda r: r["run_id"])
        else:
            rows = self.rows
        return write_output(path, format_rows(rows, fmt), force=force)


def open_study(out) -> StudyFolder:
    """Read a study folder against its current spec (see :class:`StudyFolder`): ``study.yaml``,
    and ``results.sqlite`` when the study has run (a folder without it has no rows).

    Raises:
        FileNotFoundError: the folder or its ``study.yaml`` is missing.
        ValueError: ``study.yaml`` is not a valid spec, or ``results.sqlite`` cannot be read.
    """
    from .store import select_best

    out = Path(out)
    spec = study_spec(out)
    text = (out / SPEC_FILE).read_text(encoding="utf-8")
    run_ids = [t.run_id for t in expand(spec)]
    db = out / RESULTS_FILE
    stored = StudyStore(db).rows() if db.exists() else []  # a folder there: refused
    current = set(run_ids)
    rows = [r for r in stored if r["run_id"] in current]
    stale = [r for r in stored if r["run_id"] not in current]
    return StudyFolder(out, spec, text, run_ids, rows, select_best(rows, spec.metric), stale,
                       db.is_file())


def study_status(out) -> dict:
    """:meth:`StudyFolder.status` of the study folder ``out``."""
    return open_study(out).status()


def study_rows(out) -> tuple[StudySpec, list[dict]]:
    """A study folder's spec and its selected rows (best val per group among the current
    spec's runs; :func:`open_study`)."""
    study = open_study(out)
    return study.spec, study.selected


__all__ = ["DatasetSpec", "MethodSpec", "RunTask", "StudyFolder", "StudySpec", "apply_overrides",
           "execute", "execute_group", "expand", "failure_groups", "group_tasks",
           "list_presets", "load_study", "open_study", "result_config", "run_study", "run_task",
           "study_rows", "study_spec", "study_status"]
