"""The validated study spec: `StudySpec` and its datasets and methods."""
from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from .schema import default


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
    """A validated study spec (see the package docstring; its keys, defaults and help:
    `spmlkit.experiments.study.schema`); `to_dict` is its resolved form,
    written to ``<out>/study.yaml`` and readable by `load_study` again."""

    name: str
    datasets: list
    methods: list
    title: str = ""
    description: str = ""
    mode: str = default("mode")
    seeds: list = field(default_factory=lambda: list(range(default("seeds"))))
    epochs: int = default("epochs")
    early_stop: str = default("early_stop")
    grid: dict = field(default_factory=lambda: default("grid"))
    hparams: dict = field(default_factory=dict)
    vary: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    mode_options: dict = field(default_factory=dict)
    mlflow: bool = default("mlflow")
    sklearn_reference: bool = default("sklearn_reference")
    source: str = "<dict>"
    metric: str = default("metric")

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
        if self.sklearn_reference:
            out["sklearn_reference"] = True
        if self.metric != default("metric"):
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

    def dataset_label(self, ds: DatasetSpec) -> str:
        """The tables' name of the dataset entry ``ds``: its source's name, with the entry's
        options when the spec lists that source more than once (``yeast (seed=7)``)."""
        if [d.name for d in self.datasets].count(ds.name) < 2 or not ds.options:
            return ds.name
        return f"{ds.name} ({', '.join(f'{k}={v}' for k, v in sorted(ds.options.items()))})"

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

