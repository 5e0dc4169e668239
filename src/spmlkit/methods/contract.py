"""What a training method is: [`TrainingMethod`][spmlkit.methods.contract.TrainingMethod], the
registry (`METHODS`), what a method's ``fit`` is given (`RunContext`) and returns (`Fitted`), and
what it is checked and resolved with (inputs, learning-rate defaults, the loss's hyperparameters,
k).

A *training method* says how a model is trained on a dataset's splits with a loss: ``linear``
(a linear head on feature vectors, Cole et al.'s linear protocol), ``finetune`` and
``linear_init`` (a backbone end to end on images), ``lac`` (Xie et al.'s label-wise embedding
model), ``smile`` (Xu et al.), ``mime`` (Liu et al.), ``boostlu`` (Kim et al. 2023's CAM head).
Each is one [`TrainingMethod`][spmlkit.methods.contract.TrainingMethod] in `METHODS`, registered by
the module that implements it, with:

- ``fit(ctx) -> Fitted``: trains and predicts (the engine's loop does the epochs);
- ``load_model(best, config) -> (model, info)``: rebuilds the trained model from ``best.pt``
  (``spml predict``, the figures);
- ``options``: its own settings with their defaults (``--backbone``, ``linear_epochs``, LAC's
  options, ...), as the CLI's flags and a study's ``mode_options`` give them;
- what it needs (feature vectors or images), its default batch size, whether it runs under
  ``torchrun``.

Adding a method: one module with its ``fit`` and ``load_model`` and one
[`register_method`][spmlkit.methods.contract.register_method] call; the CLI (``spml train --mode``),
studies (``mode:``), ``spml predict``, the figures and the generated tests (tests/test_methods.py)
pick it up. `spmlkit.methods.driver` runs it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..engine import TrainConfig
from ..losses import LOSSES
from ..registry import Registry
from ..data.rows import holds_vectors



@dataclass(frozen=True)
class TrainingMethod:
    """One training method (see the module docstring)."""

    name: str
    description: str
    paper: str
    inputs: str                                   # "features" or "images"
    fit: Callable[["RunContext"], "Fitted"]
    load_model: Callable[[dict, dict], tuple]
    options: dict = field(default_factory=dict)   # option -> default
    run_config: Callable[["RunContext"], dict] | None = None  # extra config.json keys
    default_batch_size: int = 8
    processes: bool = False                       # runs under torchrun --nproc_per_node=N
    default_epochs: int = 25
    #: the learning rate of a run that names none (``spml train`` without ``--lr``) and the
    #: loss has no selected value for (`SELECTED_LR`), and where it comes from
    default_lr: float = 1e-4
    default_lr_source: str = "no selected value for this loss is known here; Adam at 1e-4, " \
        "spmlkit's earlier default for every mode"
    #: the losses the method trains with (None: any registered loss); a method with its own
    #: objective (``smile``) names the one whose terms it uses
    losses: tuple | None = None
    #: the epochs a run will show (a progress bar's total): count_epochs(config, options)
    count_epochs: Callable | None = None
    #: write the resumable checkpoint when this many seconds passed since the last one
    #: (None: `CHECKPOINT_SECONDS`; 0: every epoch)
    checkpoint_seconds: float | None = None
    #: the run's TrainConfig from the given one and the options (LAC: its stages fix the
    #: epochs, LACConfig's batch size and lr win): resolve_config(config, options)
    resolve_config: Callable | None = None
    #: options of a tiny run (a 16-px toy image set or a small feature set, seconds on a CPU):
    #: the generated tests (tests/test_methods.py) train, resume and predict every method so
    smoke_options: dict = field(default_factory=dict)
    #: several runs at once (the linear mode's stacked runs): ``fit_many(contexts)`` returns
    #: a ``Fitted`` or the exception that ended it, per context (`train_runs`); None:
    #: the method trains one run at a time
    fit_many: Callable | None = None
    #: an image method that also trains on feature vectors, read as D x 1 x 1 maps (mime,
    #: boostlu)
    accepts_vectors: bool = False
    #: ``baseline_cause(config, options) -> str | None``: the likely cause, in this method's
    #: terms, of a run ending near the trivial baseline (`baseline_warning`; None: the
    #: generic learning-rate advice)
    baseline_cause: Callable | None = None
    #: ``check_run(splits, config, options, resume)``: refuses (ValueError) a run this method
    #: cannot train, before its run folder is made (a refusal leaves nothing behind)
    check_run: Callable | None = None
    #: ``check_loss(loss, name)``: refuses (ValueError) a loss module this method cannot train
    #: with, before the run folder is made (the solver: a loss it cannot minimise); None:
    #: every loss the method takes
    check_loss: Callable | None = None
    #: ``id_options(options) -> dict``: the options as a study's run id hashes them, where
    #: their spelling changed after ids were given out (LAC's fields, flat now, hashed nested
    #: under ``lac`` as before), so that the ids stay; None: as they are
    id_options: Callable | None = None
    #: ``check_values(options)``: the method's own option check, refusing (ValueError naming
    #: the option) values it cannot train with, the defaults filled in; `check_options`
    #: calls it, so a run, a study's ``mode_options`` and each value of a study's
    #: ``option.<name>`` axis are checked before anything is trained. None: the keys alone
    check_values: Callable | None = None
    #: ``stack_refusal(options) -> str | None``: why runs with these options (defaults filled
    #: in) cannot train stacked by ``fit_many``, None when they can (`can_stack`)
    stack_refusal: Callable | None = None
    #: the `TrainConfig` fields it reads besides `COMMON_TRAIN_FIELDS` (the image
    #: fields of the image methods, ``weight_decay`` of the heads on feature vectors); a run
    #: that sets another away from its default is refused (`check_train_fields`)
    train_fields: tuple = ()
    #: the `COMMON_TRAIN_FIELDS` it does not read (the solver: epochs, batch size, learning
    #: rate, early stopping, drop_last): refused away from their defaults, and a study's grid
    #: axes over them do not apply to it
    unused_train_fields: tuple = ()

    def can_stack(self, options: dict) -> str | None:
        """None when runs with ``options`` can train together (``fit_many``), else the reason
        they train one by one (as `spmlkit.engine.vectorised.can_stack` says for a loss).
        A method without ``fit_many`` never stacks."""
        if self.fit_many is None:
            return f"method {self.name!r} trains one run at a time"
        if self.stack_refusal is None:
            return None
        return self.stack_refusal({**self.options, **options})

    def total_epochs(self, config, options: dict) -> int:
        """How many epoch records a run with ``config`` and ``options`` writes (after
        ``resolve_config``: LAC's stage epochs fix its total); an unknown option is refused
        first (`check_options`)."""
        options = self.check_options(options)
        if self.resolve_config is not None:
            config = self.resolve_config(config, options)
        if self.count_epochs is None:
            return int(config.epochs)
        return int(self.count_epochs(config, options))

    def check_options(self, options: dict, where: str = "options") -> dict:
        """``options`` over the defaults; an unknown key, or a value the method's own check
        (``check_values``) refuses, is a ``ValueError`` naming it."""
        import difflib

        unknown = sorted(set(options) - set(self.options))
        if unknown:
            close = difflib.get_close_matches(unknown[0], list(self.options), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where}: method {self.name!r} has no option(s) {unknown}{hint}; "
                             f"it takes {sorted(self.options) or 'none'}")
        for key, value in options.items():
            _check_option_type(self.name, key, value, self.options[key], where)
        full = {**self.options, **options}
        if self.check_values is not None:
            self.check_values(full)
        return full


def _check_option_type(method: str, key: str, value, default, where: str) -> None:
    """Refuse an option value whose kind differs from its default's (a word for a number, a
    number for a flag or for a word): the method's code would fail on it later, after a run
    folder was made, with a message that names no option. A default of None, a list or a
    mapping says nothing of the kind, and is not checked; where the default is a word, an
    object (a backbone module given from Python) passes."""
    import numbers

    import numpy as np

    if default is None or value is None or isinstance(default, (list, tuple, dict)):
        return
    flag = isinstance(value, (bool, np.bool_))  # numpy's scalars count as Python's
    if isinstance(default, bool):
        ok, kind = flag, "true or false"
    elif isinstance(default, int):
        ok, kind = isinstance(value, numbers.Integral) and not flag, "an integer"
    elif isinstance(default, float):
        ok, kind = isinstance(value, numbers.Real) and not flag, "a number"
    elif isinstance(default, str):  # a word, or an object the method takes (a backbone)
        ok, kind = not (flag or isinstance(value, numbers.Number)), "a word"
    else:
        return
    if not ok:
        raise ValueError(f"{where}: method {method!r} option {key}={value!r}: expected {kind} "
                         f"(its default is {default!r})")


METHODS = Registry("training method")

#: the `TrainConfig` fields every method reads (the loop's epochs, batches, selection)
COMMON_TRAIN_FIELDS = ("epochs", "batch_size", "lr", "seed", "early_stop", "map_convention",
                       "device", "metric", "drop_last", "train_predictions")
#: the ``spml train`` flag of each other `TrainConfig` field (an error names it)
TRAIN_FIELD_FLAGS = {"head_lr_mult": "--head-lr-mult", "amp": "--amp",
                     "channels_last": "channels_last", "num_workers": "--workers",
                     "image_size": "--image-size", "eval_batch_size": "eval_batch_size",
                     "weight_decay": "--weight-decay", "epochs": "--epochs",
                     "batch_size": "--batch-size", "lr": "--lr", "early_stop": "--early-stop",
                     "drop_last": "--drop-last", "train_predictions": "--train-predictions"}
#: image-method fields of `TrainConfig` (the loaders, autocast, input size)
IMAGE_TRAIN_FIELDS = ("amp", "channels_last", "num_workers", "image_size", "eval_batch_size")


def check_train_fields(method: "TrainingMethod", config: TrainConfig) -> None:
    """Refuse a ``config`` that sets a `TrainConfig` field ``method`` does not read
    (neither in `COMMON_TRAIN_FIELDS` nor its ``train_fields``) to other than its
    default: an option a mode does not use is an error, never silently ignored.

    Raises:
        ValueError: naming the field, its flag, the mode and the modes that use it.
    """
    from dataclasses import fields

    for f in fields(TrainConfig):
        if (f.name in COMMON_TRAIN_FIELDS or f.name in method.train_fields) and \
                f.name not in method.unused_train_fields:
            continue
        value = getattr(config, f.name)
        if value != f.default:
            users = [m.name for m in list_methods() if f.name in m.train_fields or (
                f.name in COMMON_TRAIN_FIELDS and f.name not in m.unused_train_fields)]
            flag = TRAIN_FIELD_FLAGS.get(f.name, f.name)
            also = " (its weight_decay option: --weight-decay)" \
                if "weight_decay" in method.options and f.name == "weight_decay" else ""
            raise ValueError(f"{flag} / train.{f.name}={value!r}: --mode {method.name} does not "
                             f"use it{also}; it is for --mode {', '.join(users) or 'none'}")


def register_method(method: TrainingMethod) -> TrainingMethod:
    """Add ``method`` to `METHODS` (one call per method module)."""
    METHODS.register(method.name, method.description, paper=method.paper,
                     defaults=method.options, factory=method)
    return method


def get_method(name: str) -> TrainingMethod:
    """The registered method ``name`` (``ValueError`` with suggestions otherwise)."""
    return METHODS.get(name).factory


def list_methods() -> list[TrainingMethod]:
    """Every registered method, in registration order."""
    return [e.factory for e in METHODS.entries()]


# ---- what every run shares -------------------------------------------------------------------
#: learning rates a paper selected or prescribes for a loss under a training method:
#: ``(method, loss, dataset or None for every dataset) -> (lr, source)``; ``spml train`` uses
#: them when ``--lr`` is not given (`default_lr`). Cole et al.'s own per-loss selections
#: (their supplement) are not in the text this project has, so their losses fall back to the
#: method's default.
SELECTED_LR: dict = {
    **{("finetune", "em_apl", d): (lr, "Zhou et al. 2022, official batch/lr per dataset "
                                       "(docs/spec.md#zhou)")
       for d, lr in {"voc": 1e-5, "coco": 1e-5, "nuswide": 1e-5, "cub": 1e-4}.items()},
    **{("finetune", name, None): (1e-5, "Kim et al. 2022, official lr (docs/spec.md#large-loss)")
       for name in ("ll_r", "ll_ct", "ll_cp")},
}


def default_lr(method: "str | TrainingMethod", loss: str, dataset: str | None
               ) -> tuple[float, str]:
    """``(lr, why)``: the learning rate of a run that names none.

    The paper's selected value for ``loss`` under ``method`` on ``dataset`` where
    `SELECTED_LR` has one (for that dataset, else for every dataset), otherwise the
    method's ``default_lr``. ``why`` says which, for the user.

    >>> default_lr("finetune", "ll_r", "voc")[0], default_lr("linear", "an", "yeast")[0]
    (1e-05, 0.001)

    Raises:
        ValueError: an unknown method or loss.
    """
    method = method if isinstance(method, TrainingMethod) else get_method(method)
    name = LOSSES.get(loss).name
    for key in ((method.name, name, dataset), (method.name, name, None)):
        if key in SELECTED_LR:
            lr, source = SELECTED_LR[key]
            where = f" on {dataset}" if key[2] is not None else ""
            return lr, f"the value selected for {name}{where} with --mode {method.name} " \
                       f"({source})"
    return method.default_lr, f"the --mode {method.name} default, {method.default_lr_source}"


def resolve_hparams(loss: str, dataset: str | None, hparams: dict | None = None) -> dict:
    """The loss's official per-dataset defaults (if any) with the user's values on top."""
    return {**LOSSES.get(loss).hparams_for(dataset), **(hparams or {})}


def interval_position(text: str) -> float | None:
    """Where ``lower``, ``upper`` or ``I/N`` (0 <= I <= N, N > 0) lies in an interval, 0 .. 1;
    None for anything else."""
    if text in ("lower", "upper"):
        return 0.0 if text == "lower" else 1.0
    num, _, den = text.partition("/")
    if num.isdigit() and den.isdigit() and 0 <= int(num) <= int(den) and int(den) > 0:
        return int(num) / int(den)
    return None


_INTERVALS: dict = {}


def _k_interval(y, m: int):
    """`spmlkit.labels.k_interval` of ``y``, kept per (rows, M): a study's runs resolve
    the same interval many times."""
    from ..labels import k_interval

    y = np.ascontiguousarray(y)
    key = (y.shape, y.dtype.str, hash(y.tobytes()), m)
    if key not in _INTERVALS:
        if len(_INTERVALS) > 64:
            _INTERVALS.clear()
        _INTERVALS[key] = k_interval(y, m)
    return _INTERVALS[key]


def resolve_k(k, splits, seed: int, report: bool = False, given: str | None = None):
    """A run's ``k`` (expected positives per example): ``None`` and numbers as they are;
    ``"true"`` the split's own mean (``splits.k``: the paper's k*, what ``None`` trains with);
    ``"estimate:M:lower|point|upper"`` estimated from M fully labelled rows drawn with ``seed``
    (`spmlkit.labels.estimate_k`): the estimate or an end of its normal 95% interval;
    ``"interval:M:lower|upper|I/N"`` a value of Cole et al. App. B's interval ``I_M`` (Table A2:
    the 5th and 95th percentiles of the estimate over 10^5 draws of M rows,
    `spmlkit.labels.k_interval`; the same for every seed): its low end, its high end, or
    ``low + I/N (high - low)`` (Figure A1's linearly spaced values: ``0/9`` .. ``9/9``). The
    rows are train rows, or val rows when the training labels are only observed ones (regime
    ``given``: the train rows' full labels are unknown). ``report`` prints the estimate to
    stderr. ``given``: how the user spelled ``k`` (``"--k-estimate 50"``), named in the errors
    (default ``k '<k>'``).

    Raises:
        ValueError: a k that is not > 0, a malformed estimate, or M larger than the rows there
            are to draw from (naming the split).
    """
    if k == "true":  # Cole et al.'s k*: the mean positives of the (fully labelled) train rows
        return float(splits.k)
    if not isinstance(k, str):
        if k is not None and not k > 0:
            raise ValueError(f"k (expected positives per example) must be > 0, got {k}")
        return k
    import sys

    from ..labels import estimate_k

    parts = k.split(":")
    position = None if len(parts) != 3 or parts[0] != "interval" else \
        interval_position(parts[2])
    if len(parts) != 3 or not parts[1].isdigit() or not (
            (parts[0] == "estimate" and parts[2] in ("lower", "point", "upper"))
            or (parts[0] == "interval" and position is not None)):
        raise ValueError(f"k {k!r}: expected a number, 'true', "
                         f"'estimate:M:lower|point|upper' or 'interval:M:lower|upper|I/N'")
    m, bound = int(parts[1]), parts[2]
    complete = getattr(splits, "train_labels_complete", True)
    split = "train" if complete else "val"
    labelled = splits.train if complete else splits.val
    n = len(labelled)
    if not 0 < m <= n:
        why = "" if complete else " (the training labels are partial, so k is estimated from " \
                                  "the fully labelled val rows; or give k directly: --k)"
        raise ValueError(f"{given or f'k {k!r}'}: estimating k from {m} fully labelled rows "
                         f"needs that many, and the {split} split has only {n} rows{why}")
    from ..metrics import is_partial

    if is_partial(labelled.y):
        raise ValueError(f"{given or f'k {k!r}'}: estimating k needs fully labelled rows, and "
                         f"the {split} labels are partial (unknown entries); give k directly "
                         f"(--k), or leave it to the default (each class's positive rate among "
                         f"its known {split} rows)")
    if position is not None:
        iv = _k_interval(labelled.y, m)
        return iv.low + position * (iv.high - iv.low)
    rows = np.random.RandomState(seed).choice(n, m, replace=False)
    est = estimate_k(labelled.y[rows])
    if report:
        truth = f"true mean {splits.k:.3f}" if complete else \
            f"mean of all {n} val rows {splits.k:.3f}"
        print(f"k estimated from {est.m} fully labelled {split} rows: {est.k:.3f} "
              f"({est.confidence:.0%} interval {est.low:.3f} .. {est.high:.3f}); {truth}",
              file=sys.stderr)
    return {"lower": est.low, "point": est.k, "upper": est.high}[bound]


def check_inputs(method: "TrainingMethod", splits) -> None:
    """Refuse splits whose items are not what ``method`` trains on, saying what to add: a
    features method (``linear``) on an image source needs a backbone's cached features, an
    image method needs images.

    Raises:
        ValueError: naming the dataset, the method and the flags that fix it.
    """
    x = splits.train.x
    vectors = holds_vectors(x)
    image_modes = [m.name for m in list_methods() if m.inputs == "images"]
    if method.inputs == "features" and not vectors:
        raise ValueError(f"dataset {splits.name!r} holds images, not feature vectors, and "
                         f"--mode {method.name} trains on feature vectors: an image source needs "
                         f"a backbone (--backbone NAME, or backbone=NAME in the dataset options; "
                         f"spml list backbones) to train on its cached features, or an image "
                         f"mode (--mode {' / '.join(image_modes)} --backbone NAME)")
    if method.inputs == "images" and vectors and not method.accepts_vectors:
        raise ValueError(f"dataset {splits.name!r} holds feature vectors, and --mode "
                         f"{method.name} trains on images (with --backbone NAME): use --mode "
                         f"linear for feature vectors, or an image source")
    if method.inputs == "images" and not vectors:
        check_decodable(splits)


def check_decodable(splits) -> None:
    """Decode every image of train, val and test once before an image method trains (a few ms
    an image, several threads), so an unreadable file is named before the first epoch, not
    found by a DataLoader worker mid-epoch. Skipped when the source already decoded them
    (``skip_corrupt=True``: ``meta["skip_corrupt"]``).

    Raises:
        ValueError: the first unreadable image, named, with the option that drops such files.
    """
    from ..data.image_files import check_images

    if (splits.meta or {}).get("skip_corrupt"):
        return
    for part in ("train", "val", "test"):
        items = getattr(splits, part).x
        paths = [p for p in items if isinstance(p, (str, os.PathLike))]
        if paths:
            check_images(paths, skip_missing=True, decode=True, where=f"{splits.name} {part}")


def feature_preprocess(splits) -> dict:
    """What a model trained on ``splits`` needs applied to new raw features: the train rows'
    standardisation statistics (``{"mean", "std"}`` tensors in the dtype they were computed
    in) when the source standardised them, else ``{}``."""
    stats = (splits.meta or {}).get("standardize")
    if not stats:
        return {}
    dtype = np.dtype(stats.get("dtype", "float64"))
    return {key: torch.as_tensor(np.asarray(stats[key], dtype)) for key in ("mean", "std")}


def feature_record(splits) -> dict:
    """What ``config.json`` records of the features a run trains on (key ``features``): the
    table columns used (the ``tabular`` source), and the standardisation: ``{"by": "train
    rows", "mean", "std"}`` (what ``spml predict`` applies to new rows, from ``best.pt``) or
    False."""
    meta = splits.meta or {}
    stats = meta.get("standardize")
    shape = tuple(getattr(splits.train.x, "shape", ()))  # arrays only (never converts items)
    out = {"standardized": {"by": "train rows", "mean": stats["mean"], "std": stats["std"]}
           if stats else False}
    if len(shape) == 2:  # feature vectors (image sources' inputs are files)
        out["dim"] = int(shape[1])
    if meta.get("feature_columns"):
        out["columns"] = list(meta["feature_columns"])
    return out


@dataclass
class RunContext:
    """What a method's ``fit`` gets from `train_run`."""

    method: TrainingMethod
    splits: Any
    loss_name: str
    hparams: dict
    loss: Any                    # the loss module (create_loss)
    k: float
    config: TrainConfig
    options: dict                # the method's options, defaults filled in
    on_epoch: Callable           # on_epoch(record, model, loss): logs, then the caller's
    checkpoint: Callable | None  # the engine's checkpoint writer (None: no run folder)
    resume: dict | None          # the saved state to continue from
    is_main: bool = True         # process 0 (torchrun): the one that writes
    run_dir: Path | None = None  # the run folder being written (None: none)
    prepared: dict = field(default_factory=dict)  # what run_config built and fit reuses


@dataclass
class Fitted:
    """What a method's ``fit`` returns: the fit, the best model's probabilities on every
    split, the model's entries of ``best.pt`` and its own result keys."""

    fit: Any                     # spmlkit.engine.FitResult (best_epoch, val_map, history)
    probs: dict                  # split -> N x L probabilities (numpy)
    best: dict                   # "model" state dict + what load_model needs to rebuild it
    result: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)   # more arrays for the run folder: name -> array


def preprocess_features(x: torch.Tensor, preprocess: dict) -> torch.Tensor:
    """Raw feature rows as the model saw them in training (standardised with the train
    statistics when the source standardised; unchanged otherwise)."""
    if preprocess:
        mean, std = preprocess["mean"], preprocess["std"]
        x = ((x.to(mean.dtype) - mean) / std).float()  # as the source computed it
    return x
