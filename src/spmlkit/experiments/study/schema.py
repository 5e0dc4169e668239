"""The study spec's schema as data: every key with its type, default, allowed values and help.

`SPEC_SCHEMA` is the one place a spec key is described. Validation
(`spmlkit.experiments.study.validate`) takes the known and required keys, the defaults of
the keys left out and the wording of its "expected ..." errors from it; ``docs/gen.py`` writes
the reference page ``docs/studies/schema.md`` from it; `METHOD_SCHEMA` does the same for a
method given as a mapping. A key added to the spec is added here, with its help text, or it is
an unknown key.
"""
from __future__ import annotations

from dataclasses import dataclass

#: the grid a spec without ``grid`` (or without its batch_size / lr) takes: Cole et al.'s
DEFAULT_GRID = {"batch_size": [8, 16], "lr": [1e-2, 1e-3, 1e-4, 1e-5]}
#: the ends and the point of a k estimate (``estimate:M:lower|point|upper``)
K_BOUNDS = ("lower", "point", "upper")
#: TrainConfig fields with their own spec key (the rest go under ``train:``)
OWN_KEYS = ("epochs", "batch_size", "lr", "seed", "early_stop", "metric")
#: the most runs one study may expand to (the largest preset has 1200): a spec beyond it is
#: refused before anything is expanded or written (a typo such as ``seeds: 1000000000``)
MAX_RUNS = 100_000

#: the default of a key that has none (it must be given)
REQUIRED = object()


@dataclass(frozen=True)
class Key:
    """One key of a study spec (or of a method given as a mapping).

    Attributes:
        name: the key.
        type: its type, in words (the docs' type column).
        default: the value a spec that leaves the key out has (`REQUIRED`: none, the
            key must be given); ``default_text`` says it in words where the value is derived
            (a name from the file's stem).
        help: what it means (Markdown; the docs' meaning column).
        expected: how an error names a valid value (``name: expected <expected>, got ...``),
            where the key has such an error.
        choices: ``choices() -> list`` of the allowed values, where they are a registry's names.
    """

    name: str
    type: str
    default: object
    help: str
    default_text: str | None = None
    expected: str | None = None
    choices: object = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def _modes() -> list:
    from ...methods import list_methods

    return [m.name for m in list_methods()]


def _metrics() -> list:
    from ...metrics import METRICS

    return list(METRICS)


SPEC_SCHEMA = (
    Key("name", "string (letters, digits, . _ -)", None,
        "the study's name; its folder is `runs/studies/<name>` unless `--out` says otherwise. "
        "Default: the YAML file's stem.",
        default_text="the file's stem", expected="a folder-safe name (letters, digits, . _ -)"),
    Key("title", "string", None,
        "a one-line title shown by `spml study status`, tables and the report (and, for a "
        "shipped preset, `spml study list`).",
        default_text="the name"),
    Key("description", "string", "", "free text, shown in the report."),
    Key("datasets", "list of names or `{name, options}` (required)", REQUIRED,
        "registered datasets (`spml list datasets`); `options` are the source's `--data` "
        "options (`spml list datasets NAME --details`), e.g. "
        "`{name: fmnist_mosaic, options: {backbone: efficientnet_lite0}}`."),
    Key("methods", "list of specs or `{label, spec, mode, mode_options, early_stop}` (required)",
        REQUIRED,
        "a spec is `loss[+reg:weight...][@regime]` (`an`, `bce@full`, `an+highrank:1e-3`); "
        "`bce` and `iun` are the reference rows. A mapping gives the row a `label`, and may "
        "train it in its own `mode` with its own `mode_options`, and with its own `early_stop` "
        "(a table of two papers' rows, each with its paper's protocol)."),
    Key("mode", "training method", "linear",
        "how every row trains unless it names its own mode (`spml list methods`).",
        choices=_modes),
    Key("seeds", "integer or list of integers", 3,
        "a count (seeds 0..n-1) or the seeds themselves; the seeds change the initialisation "
        "and the batch order, not the observed labels."),
    Key("epochs", "integer >= 1", 25, "epochs per run; the best epoch on val is kept."),
    Key("early_stop", "string", "none",
        "`none`, `patience:N` (Zhou et al.: `patience:1`) or `drop:X` (Kim et al.: stop X "
        "points below the best val mAP)."),
    Key("grid", "mapping of lists", DEFAULT_GRID,
        "what is *selected over* on val: `batch_size`, `lr`, `hparams.<name>` or another "
        "`TrainConfig` field, e.g. `weight_decay` (L2 of the heads on feature vectors, Adam's "
        "coupled decay; 0 is the run without it, its id unchanged; runs of different weight "
        "decays stack like learning rates); missing `batch_size` / `lr` take the paper grid."),
    Key("hparams", "mapping: method label or loss name -> mapping", {},
        "fixed loss hyperparameters, e.g. `{em: {alpha: 0.1}}`; unknown names are refused with "
        "the loss's list."),
    Key("vary", "mapping of lists", {},
        "what is *reported* (one column or figure point per value): `hparams.<name>`, "
        "`data.<option>`, `k` (a number, `true`, `estimate:M:lower|point|upper` or "
        "`interval:M:lower|upper|I/N`: Cole et al. App. B's interval I_M), `regime`, "
        "`option.<name>` (an option of the methods whose mode takes it, checked by that "
        "mode's own option check, e.g. `option.alpha` for BoostLU, `option.kl` for SMILE) or "
        "`lac.<field>` (LAC's spelling: a LACConfig field of the methods in mode `lac`, e.g. "
        "`lac.queue_size`, the same runs and ids as `option.queue_size`).",
        expected="hparams.<name>, data.<option>, k, regime or lac.<field> (LAC's), or "
                 "option.<name> (any mode's option)"),
    Key("train", "mapping", {},
        "more `TrainConfig` fields (table below); `epochs`, `batch_size`, `lr`, `seed`, "
        "`early_stop` and `metric` have their own keys."),
    Key("mode_options", "mapping", {},
        "the study mode's own options (table below), e.g. `{backbone: efficientnet_lite0}`."),
    Key("sklearn_reference", "boolean", False,
        "add the scikit-learn reference rows (`mode: linear`, feature vectors): one-vs-rest "
        "LogisticRegression on each method regime's observed labels, unknown = negative, C "
        "chosen on val mAP; `sklearn_lr@<regime>` rows of `spml study table`, the mAP tables "
        "of `spml report` and `spml study export --selected` (`sklearn-reference.json` in the "
        "study folder).", expected="true or false"),
    Key("mlflow", "boolean", False,
        "also log every run to MLflow (when it is installed).", expected="true or false"),
    Key("metric", "metric name", "map",
        "what epochs and grid points are selected on, on val (`spml list metrics`); lower is "
        "better for the losses.", choices=_metrics),
)

#: the keys of a method given as a mapping (``spec`` required)
METHOD_SCHEMA = (
    Key("label", "string", None, "the table's row name.", default_text="the spec"),
    Key("spec", "method spec", REQUIRED, "`loss[+reg:weight...][@regime]`, as in a list of "
        "specs."),
    Key("mode", "training method", None, "the row's training mode.",
        default_text="the study's", choices=_modes),
    Key("mode_options", "mapping", {},
        "the row's mode options: merged over the study's when it trains in the study's mode, "
        "alone when it names another mode."),
    Key("early_stop", "string", None, "the row's early stopping (another paper's protocol).",
        default_text="the study's"),
)

SCHEMA = {key.name: key for key in SPEC_SCHEMA}
SPEC_KEYS = tuple(SCHEMA)
REQUIRED_KEYS = tuple(k.name for k in SPEC_SCHEMA if k.required)
METHOD_KEYS = tuple(k.name for k in METHOD_SCHEMA)


def default(key: str):
    """The value of spec key ``key`` when a spec leaves it out (a fresh copy of a mapping)."""
    value = SCHEMA[key].default
    if value is REQUIRED:
        raise KeyError(f"{key} is required: it has no default")
    return dict(value) if isinstance(value, dict) else value


def expected(key: str) -> str:
    """How an error names a valid value of ``key``: its ``expected`` text, or one of its
    choices."""
    entry = SCHEMA[key]
    if entry.expected is not None:
        return entry.expected
    if entry.choices is not None:
        return f"one of {', '.join(entry.choices())}"
    return entry.type


def method_mapping_form() -> str:
    """A method mapping as an error shows it: ``{label: ..., spec: ..., mode_options: {...}}``."""
    parts = [f"{k.name}: {'{...}' if k.type == 'mapping' else '...'}" for k in METHOD_SCHEMA]
    return "{" + ", ".join(parts) + "}"
