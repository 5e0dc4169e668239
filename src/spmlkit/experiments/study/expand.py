"""Expansion: a study spec -> its runs (`RunTask`), each with a stable run id."""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass

from .grammar import accepted_hparams
from .spec import MethodSpec, StudySpec


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
    def batch_size(self) -> int | None:
        """The run's batch size; None for a mode that reads none (the solver)."""
        return int(self.train["batch_size"]) if "batch_size" in self.train else None

    @property
    def lr(self) -> float | None:
        """The run's learning rate; None for a mode that reads none (the solver)."""
        return float(self.train["lr"]) if "lr" in self.train else None

    def config(self) -> dict:
        """The resolved configuration (what the run id's hash is of)."""
        return {"method": self.method, "loss": self.loss, "dataset": self.dataset,
                "dataset_options": self.dataset_options, "regime": self.regime,
                "hparams": self.hparams, "k": self.k, "mode": self.mode, "train": self.train,
                "mode_options": self.mode_options}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_")


#: settings that change where things are cached, what is shown and how fast (``mmap``: a
#: source's files mapped or read), never the numbers: left out of a run id's hash (so a run is
#: found again whatever they were)
NOT_RESULTS = {"dataset_options": ("cache_dir", "progress", "mmap"),
               "dataset_options.features": ("cache_dir", "progress", "num_workers",
                                            "batch_size", "device"),
               "mode_options": ("cache_dir", "progress"),
               "mode_options.features": ("num_workers", "batch_size", "device"),
               "train": ("num_workers", "eval_batch_size", "train_predictions")}


def result_config(config: dict) -> dict:
    """``config`` without the `NOT_RESULTS` keys (what a run id's hash is of)."""
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
    from ...methods import METHODS, get_method

    spelled = get_method(out["mode"]) if out.get("mode") in METHODS else None
    if spelled is not None and spelled.id_options and isinstance(out.get("mode_options"), dict):
        out["mode_options"] = spelled.id_options(out["mode_options"])  # LAC: ids kept
    return out


def run_id_for(config: dict, seed: int, variant: dict) -> str:
    """``<dataset>-<method>-<regime>-s<seed>-b<batch>-lr<lr>[-<vary>]-<hash8>``; the hash is of
    the resolved configuration without what cannot change the numbers (`result_config`:
    cache folders, progress bars, worker counts), so the id changes with anything that changes
    the run and with nothing else."""
    digest = hashlib.sha1(json.dumps(result_config(config), sort_keys=True,
                                     default=str).encode()).hexdigest()
    train = config["train"]
    parts = [config["dataset"], config["method"], config["regime"], f"s{seed}",
             *((f"b{train['batch_size']}", f"lr{train['lr']:g}") if "batch_size" in train
               else ("solve",))]
    if train.get("weight_decay"):  # (absent at 0: the ids runs without it always had)
        parts.append(f"wd{train['weight_decay']:g}")
    parts += [f"{k.split('.', 1)[-1]}{v}" for k, v in sorted(variant.items()) if k != "regime"]
    readable = "-".join(_slug(p) for p in parts)[:100]
    return f"{readable}-{digest[:8]}"


def applicable_axes(mode: str, m: MethodSpec, keys) -> list:
    """The keys of ``keys`` (vary or grid axes) that apply to method ``m``, which trains in
    ``mode`` (``option.<name>``: the modes that take option ``name``; ``lac.<field>``: mode
    ``lac``)."""
    from ...methods import get_method

    accepts = accepted_hparams(m.loss)
    out = []
    for key in keys:
        if key.startswith("hparams."):
            use = key[8:] in accepts
        elif key == "k":
            use = "k" in accepts
        elif key == "regime":
            use = not m.fixed_regime
        elif key.startswith("option."):
            use = key[7:] in get_method(mode).options
        elif key.startswith("lac."):
            use = mode == "lac"
        else:  # data.<option>, batch_size, lr, other TrainConfig fields (not the ones the
            # mode does not read: the solver's grid is its path of C, not batch x lr)
            use = key not in get_method(mode).unused_train_fields
        if use:
            out.append(key)
    return out


def _assignments(table: dict, keys: list) -> list[dict]:
    return [dict(zip(keys, values)) for values in itertools.product(*(table[k] for k in keys))]


def expand(spec: StudySpec) -> list[RunTask]:
    """Every run of a study: datasets x methods x seeds x vary assignments x grid points (a vary
    or grid axis only for the methods it applies to; see the module docstring)."""
    from ...data import trial_options
    from ...methods import get_method

    tasks, seen = [], set()
    for ds in spec.datasets:
        for m in spec.methods:
            fixed = {**spec.hparams.get(m.loss, {}), **spec.hparams.get(m.label, {})}
            vary_keys = applicable_axes(spec.method_mode(m), m, spec.vary)
            unused = get_method(spec.method_mode(m)).unused_train_fields
            grid_keys = applicable_axes(spec.method_mode(m), m, spec.grid)
            for seed in spec.seeds:
                for variant in _assignments(spec.vary, vary_keys):
                    for point in _assignments(spec.grid, grid_keys):
                        hp = dict(fixed)
                        train = {"epochs": spec.epochs, "seed": seed,
                                 "early_stop": m.early_stop or spec.early_stop, **spec.train}
                        for key in unused:  # what the mode does not read: not in its config
                            train.pop(key, None)
                        if spec.metric != "map":  # (map runs keep the ids they always had)
                            train["metric"] = spec.metric
                        options = dict(ds.options)
                        mode_options = spec.method_options(m)
                        for key, value in {**variant, **point}.items():
                            if key.startswith("hparams."):
                                hp[key[8:]] = value
                            elif key.startswith(("option.", "lac.")):
                                mode_options = {**mode_options, key.split(".", 1)[1]: value}
                            elif key.startswith("data."):
                                options[key[5:]] = value
                            elif key not in ("k", "regime"):
                                train[key] = value
                        if not train.get("weight_decay", 1):  # 0: the run without weight
                            del train["weight_decay"]  # decay, with the id it always had
                        options = trial_options(options, seed)  # a trial: its own split
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

