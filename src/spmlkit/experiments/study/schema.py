"""The study spec's keys, their defaults and limits."""
from __future__ import annotations

SPEC_KEYS = ("name", "title", "description", "datasets", "methods", "mode", "seeds", "epochs",
             "early_stop", "grid", "hparams", "vary", "train", "mode_options", "mlflow",
             "metric")
REQUIRED_KEYS = ("datasets", "methods")
#: the keys of a method given as a mapping (``spec`` required)
METHOD_KEYS = ("label", "spec", "mode", "mode_options", "early_stop")
DEFAULT_GRID = {"batch_size": [8, 16], "lr": [1e-2, 1e-3, 1e-4, 1e-5]}
K_BOUNDS = ("lower", "point", "upper")
#: TrainConfig fields with their own spec key (the rest go under ``train:``)
OWN_KEYS = ("epochs", "batch_size", "lr", "seed", "early_stop", "metric")
#: the most runs one study may expand to (the largest preset has 1200): a spec beyond it is
#: refused before anything is expanded or written (a typo such as ``seeds: 1000000000``)
MAX_RUNS = 100_000
