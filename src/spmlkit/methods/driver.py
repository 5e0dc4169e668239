"""The one driver that turns a method's fit into a run (`spmlkit.methods.contract` says
what a method is).

[`train_run`][spmlkit.methods.driver.train_run] is the one driver of every method: it resolves the
loss and its hyperparameters, creates the run folder (`spmlkit.runs.RunDir`) and writes its config,
logs every epoch, hands the method a checkpoint writer and, for ``resume``, the saved state, then
scores the best epoch's predictions the same way for every method and finishes the folder.
`train_runs` trains several runs of one method at once where the method can (the linear
mode's stacked runs); `resume_run` continues an interrupted run folder with its own
settings (what the folder records, and what a resume checks: `spmlkit.methods.provenance`);
[`load_run_model`][spmlkit.methods.saved.load_run_model] rebuilds a finished run's model.
"""
from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ..accel import acceleration
from ..engine import TrainConfig
from ..losses import bind_groups, create_loss
from ..metrics import METRICS, THRESHOLD_POLICY, map_score, pseudo_label_stats
from ..metrics import classic_metrics as split_metrics
from ..metrics import evaluate as split_evaluate
from ..metrics import map_score as split_map
from ..metrics import select_thresholds as split_thresholds
from ..data.protocol import describe_labels
from ..runs import RunDir, checkpoint_history, read_run
from ..safe_write import sync_files
from .contract import (RunContext, TrainingMethod, check_inputs, check_train_fields,
                       get_method, resolve_hparams, resolve_k)
from .provenance import SKIPPED_FILE, ResumeError, check_data_files, check_resume, fresh_config, \
    run_decoder, skipped_images


#: runs of a method whose epochs take longer than this write a resumable checkpoint
CHECKPOINT_SECONDS = 10.0


def training_warnings(fit) -> list[str]:
    """Warnings about a finished fit (a `spmlkit.engine.FitResult`), for the user and
    ``final.json``: the best epoch being the last of two or more (val mAP still rising, so
    the model is probably under-trained)."""
    n = len(fit.history)
    if n >= 2 and int(fit.best_epoch) == n:
        return [f"best epoch is the last ({n}); the model may be under-trained: train again "
                f"with more --epochs or a larger --lr"]
    return []


#: a run of an image method whose test mAP closes less than this share of the way from the
#: trivial baseline (every image scored alike) to 100 is reported (`baseline_warning`)
BASELINE_LIFT = 0.15


def trivial_map(y, convention: str = "present") -> float:
    """The test mAP of scoring every image alike (each class's AP is then its prevalence): the
    baseline a model that learned nothing reaches. Partial labels (`PartialLabels`) are
    scored masked, as the run's own test mAP is."""
    return split_map(np.zeros(np.shape(y), dtype=np.float32), y, convention)


def baseline_warning(method: "TrainingMethod", config, options: dict, test_map: float,
                     trivial: float) -> str | None:
    """A warning when an image run's test mAP is near the trivial baseline (less than
    `BASELINE_LIFT` of the way from it to 100), naming the likely cause from the method
    and its learning rates; None otherwise."""
    if not np.isfinite(test_map) or trivial >= 100:
        return None
    lift = (test_map - trivial) / (100.0 - trivial)
    if lift >= BASELINE_LIFT:
        return None
    lr, epochs = float(config.lr), int(config.epochs)
    cause = method.baseline_cause(config, options) if method.baseline_cause else None
    if cause is None and lr <= 1e-4:
        cause = f"lr {lr:g} is probably too small for {epochs} epoch(s): try --lr 1e-3"
    elif cause is None and lr * float(getattr(config, "head_lr_mult", 1.0)) >= 1e-2:
        cause = (f"lr {lr:g} (head x {getattr(config, 'head_lr_mult', 1.0):g}) is probably too "
                 f"large and the model collapsed: try --lr 1e-3 or 1e-4")
    elif cause is None:
        cause = (f"too few epochs ({epochs}), too few observed positives, or an lr ({lr:g}) "
                 f"that does not suit this backbone: check the curves (spml figure curves)")
    return (f"test mAP {test_map:.2f} is near the trivial baseline {trivial:.2f} (every image "
            f"scored alike; {max(lift, 0.0):.0%} of the way from it to 100): the model barely "
            f"learned. Likely cause: {cause}")


def pseudo_label_record(loss_module, y_train) -> dict:
    """``{"pl_count", "pl_precision"}`` of a loss that pseudo-labels, else ``{}``.

    A loss that pseudo-labels has the optional method ``hard_pseudo_labels()`` returning
    ``(mask, value)``: N_train x L bool (the entries it has pseudo-labelled so far) and
    N_train x L 0/1 (the label it asserts on each): ``em_apl`` (0: its soft negatives), ``ll_cp``
    (1: flipped entries), ``soft_opml`` / ``opml_sp`` (1: corrected entries). ``pl_precision``
    is a fraction in [0, 1] (NaN while nothing is pseudo-labelled); see
    `spmlkit.metrics.pseudo_label_stats`.
    """
    method = getattr(loss_module, "hard_pseudo_labels", None)
    if method is None:
        return {}
    mask, value = method()
    mask = mask.detach().cpu().numpy() if torch.is_tensor(mask) else np.asarray(mask)
    value = value.detach().cpu().numpy() if torch.is_tensor(value) else np.asarray(value)
    count, precision = pseudo_label_stats(mask, value, y_train)
    return {"pl_count": count, "pl_precision": precision}


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run that writes a folder: ``run_dir`` keeps the epochs its last
    checkpoint holds, and ``spml train --resume run_dir`` continues it."""

    def __init__(self, run_dir):
        super().__init__(str(run_dir))
        self.run_dir = str(run_dir)


def _interrupted(err: BaseException, run, is_main: bool) -> BaseException:
    """What a run re-raises for ``err``: Ctrl-C as `RunInterrupted` naming the run folder; a
    failure recorded in the folder (``failed.json``) first."""
    if run is None or not is_main:
        return err
    if isinstance(err, KeyboardInterrupt):
        return err if isinstance(err, RunInterrupted) else RunInterrupted(run.path)
    run.fail(err)
    return err


def default_run_name(method: TrainingMethod, splits, loss: str, config: TrainConfig) -> str:
    """A run folder's default name: ``{dataset}-{loss}[-{method}]-{regime}-s{seed}`` (no
    method for the default one, linear; ``:`` of a regime such as ``1p_biased:2`` as ``_``)."""
    parts = [splits.name, loss, *([] if method.name == "linear" else [method.name]),
             splits.regime, f"s{config.seed}"]
    return "-".join(parts).replace(":", "_")


def _run_settings(method: TrainingMethod, splits, loss: str, hparams, config, k, options,
                  resume=None):
    """What a run of ``method`` trains with, checked: ``(config, hparams, loss module, k)``
    (the loss among the method's, the method's config defaults and rules, the loss's
    per-dataset hyperparameters, k resolved on the splits, the method's own refusals)."""
    if method.losses is not None and loss not in method.losses:
        raise ValueError(f"method {method.name!r} trains with its own objective and takes only "
                         f"the loss(es) {list(method.losses)}, got {loss!r}")
    config = config or TrainConfig(epochs=method.default_epochs,
                                   batch_size=method.default_batch_size,
                                   lr=method.default_lr)
    if method.resolve_config is not None:
        config = method.resolve_config(config, options)
    if resume is None:  # (a resumed run trains with its folder's settings, as they were)
        check_train_fields(method, config)
    hparams = resolve_hparams(loss, splits.name, hparams)
    loss_fn = create_loss(loss, **hparams)
    bind_groups(loss_fn, splits.train.groups)  # the asset regulariser's rows -> groups
    if method.check_loss is not None:  # refused before a run folder is made
        method.check_loss(loss_fn, loss)
    own_k = hparams.get("k")  # the loss's own k (EPR, ROLE, GPR) wins over the run's
    if own_k is not None and k is not None and resume is None:
        raise ValueError(f"k is given twice: the run's k {k!r} (--k / --k-estimate, k=) and the "
                         f"loss's hyperparameter k={own_k!r} (--hp k=); give one")
    if own_k is not None and not isinstance(own_k, bool) and isinstance(own_k, (int, float)):
        k = own_k  # what the loss trains with, so config.json records it
    k = splits.k if k is None else resolve_k(k, splits, config.seed)
    if method.check_run is not None:
        method.check_run(splits, config, options, resume)
    return config, hparams, loss_fn, k


def train_run(method: str | TrainingMethod, splits, loss: str, hparams: dict | None = None,
              config: TrainConfig | None = None, *, k: float | None = None, out=None,
              run_name: str | None = None, on_epoch=None, dataset_options: dict | None = None,
              resume=None, checkpoint_seconds: float | None = None, **options) -> dict:
    """Train one run of ``method`` with ``loss`` on ``splits`` and score its best epoch.

    Args:
        method: a registered training method (``spml list methods``) or its entry.
        splits: the dataset's splits ([`spmlkit.loading.load_splits`][spmlkit.loading.load_splits]).
        loss: a registered loss (``spml list losses``).
        hparams: the loss's hyperparameters, over its per-dataset official defaults (default
            None: those defaults).
        config: [`spmlkit.engine.TrainConfig`][spmlkit.engine.TrainConfig] (default: the method's
            epochs and batch).
        k: expected positives per example for the loss (default: the train split's mean).
        out: the folder to create the run folder in (default None: nothing is written).
        run_name: the run folder's name under ``out`` (default None:
            ``{dataset}-{loss}[-{method}]-{regime}-s{seed}``, no method for linear).
        on_epoch: ``on_epoch(record, model, loss)`` after every epoch (after it is logged).
        dataset_options: recorded in ``config.json`` (what ``load_splits`` was given).
        resume: a run folder of this method to continue from its ``checkpoint.pt`` (use
            `resume_run`, which reads the settings from the folder); a finished folder
            returns its ``final.json``.
        checkpoint_seconds: write the resumable checkpoint after an epoch when this many
            seconds have passed since the last one (default `CHECKPOINT_SECONDS`; 0 every
            epoch).
        **options: the method's options (``TrainingMethod.options``).

    Returns:
        the result: ``best_epoch``, ``epochs_run``, ``val_map``, ``test_map``,
        ``train_recovery_map`` (the train split's predictions against its full labels, Cole et
        al. Table 2; None for regime ``given``, whose train rows have no full labels),
        ``labels`` (one line: which labels trained and scored the run,
        `spmlkit.data.protocol.describe_labels`), ``test`` (P@k ...), ``metric`` (what the
        best epoch was selected on, ``config.metric``) and ``val_score`` (its value there),
        ``val_metrics`` and ``test_metrics`` (every metric of `spmlkit.metrics.METRICS`
        of the selected epoch's predictions,
        [`spmlkit.metrics.classic_metrics`][spmlkit.metrics.classic_metrics]; F1s and Hamming loss
        at ``threshold["value"]``, the global threshold chosen on val that ``spml predict`` applies
        by default: `spmlkit.metrics.THRESHOLD_POLICY`), ``test_metrics_at_paper_threshold``
        for a loss whose paper names its own cut (``paper_threshold``: EM's 0.75; the
        threshold and the test metrics that depend on it), ``seconds``,
        ``loss``, ``mode``, ``regime``, ``seed``, ``batch_size``, ``lr``; ``pl_count`` /
        ``pl_precision`` at the selected epoch for a loss that pseudo-labels
        (``pl_precision`` None for regime ``given``);
        ``estimator_recovery_map`` for ROLE (not for ``given``); the method's
        own keys; ``warnings`` (`training_warnings`, e.g. the best epoch being the
        last); ``run_dir`` when a folder was written.

    Raises:
        ResumeError: ``resume`` names a folder that cannot be continued (started with other
            settings, an unreadable ``checkpoint.pt``).
    """
    from .. import distributed as dist_utils

    method = method if isinstance(method, TrainingMethod) else get_method(method)
    options = method.check_options(options)
    check_inputs(method, splits)  # e.g. an image source without a backbone: says what to add
    config, hparams, loss_fn, k = _run_settings(method, splits, loss, hparams, config, k,
                                                options, resume)
    is_main = dist_utils.current_context(config.device).is_main
    with contextlib.ExitStack() as held:
        if resume is not None and is_main and Path(resume).is_dir():  # one process at a time
            held.enter_context(RunDir(resume).locked())
        return _train_run(method, splits, loss, hparams, loss_fn, config, k, options,
                          dataset_options, out, run_name, on_epoch, resume, checkpoint_seconds,
                          is_main, held)


def _train_run(method, splits, loss, hparams, loss_fn, config, k, options, dataset_options, out,
               run_name, on_epoch, resume, checkpoint_seconds, is_main, held) -> dict:
    """`train_run` once its settings are resolved (and a resumed folder locked; a new one is
    locked in ``held`` as soon as it is made, so that a resume of it waits its turn)."""
    run, state = None, None
    if resume is not None:
        run = RunDir(resume)
        done = read_run(run.path)
        if done.final is None:
            try:
                state = run.resume_state(trim_metrics=is_main)
            except ValueError as err:  # an unreadable checkpoint.pt
                raise ResumeError(f"cannot resume {run.path}: {err}") from err
    elif out is not None and is_main:
        run = RunDir.create(out, run_name or default_run_name(method, splits, loss, config))
        held.enter_context(run.locked())
    pseudo: dict = {}  # epoch -> pl_count / pl_precision (the epochs before a resume too)
    for record in checkpoint_history(state) or []:
        pseudo[record["epoch"]] = {key: record[key] for key in ("pl_count", "pl_precision")
                                   if key in record}

    log_epoch = _epoch_logger(splits, run, pseudo, on_epoch, is_main)
    every = checkpoint_seconds if checkpoint_seconds is not None else \
        method.checkpoint_seconds if method.checkpoint_seconds is not None else \
        CHECKPOINT_SECONDS
    saver = run.checkpointer(every) if run is not None and is_main else None
    ctx = RunContext(method, splits, loss, hparams, loss_fn, k, config, options, log_epoch,
                     saver, state, is_main, run.path if run is not None else None)
    if run is not None and resume is None:
        run.start(fresh_config(method, ctx, dataset_options), splits.observed)
        dropped = skipped_images(splits)
        if dropped is not None:
            run.write_json(SKIPPED_FILE, dropped)
    elif run is not None:
        check_resume(run.path, done.config, fresh_config(method, ctx, dataset_options))
        if done.final is not None:  # finished: its result
            return {**done.final, "run_dir": str(run.path)}
        if is_main:
            run.clear_failure()
    t0 = time.perf_counter()
    try:
        fitted = method.fit(ctx)
        if saver is not None:  # the last checkpoint on disk before the folder is finished
            saver.wait()
    except BaseException as err:
        if saver is not None:  # ... or failed (the run's error is the one raised)
            saver.wait(raise_error=False)
        raised = _interrupted(err, run, is_main)
        if raised is err:
            raise
        raise raised from err
    return _complete_run(ctx, run, fitted, pseudo, t0)


def _epoch_logger(splits, run, pseudo: dict, on_epoch=None, is_main: bool = True):
    """The ``log_epoch(record, model, loss)`` of a run: adds the pseudo-label counts (and
    precision, unknown for partial training labels) to the record, keeps them in ``pseudo``
    (epoch -> values), logs the record in the run folder, then calls ``on_epoch``."""
    complete = getattr(splits, "train_labels_complete", True)

    def log_epoch(record, model, loss_module):
        record.update(pseudo_label_record(loss_module, splits.train.y))
        if not complete and "pl_precision" in record:  # against observed positives only: unknown
            record["pl_precision"] = float("nan")
        pseudo[record["epoch"]] = {key: record[key] for key in ("pl_count", "pl_precision")
                                   if key in record}
        if run is not None and is_main:
            run.log(record)
        if on_epoch is not None and is_main:
            on_epoch(record, model, loss_module)

    return log_epoch


def _few_known_negatives(y_val, threshold: float) -> str | None:
    """A warning when partial val labels hold fewer known negatives than known positives: the
    threshold that maximises their micro-F1 (what spml predict applies by default) then tends
    to call most labels present (presence-only data: 0.001, every species predicted)."""
    from ..metrics import is_partial

    if not is_partial(y_val):
        return None
    y = np.asarray(y_val)
    pos, neg = int((y == 1).sum()), int((y == -1).sum())
    if neg >= pos:
        return None
    return (f"the val labels hold {neg} known negative(s) for {pos} known positive(s): the "
            f"threshold chosen on them ({threshold:.4g}, max val micro-F1, what spml predict "
            f"applies by default) is fitted to few absences and may call most labels present; "
            f"spml predict --threshold-rule rcut (the top k labels a row) or --threshold T "
            f"chooses otherwise")


def _run_scores(probs, splits, conv: str, complete: bool) -> dict:
    """A fitted run's scores: the test report (masked for partial labels), the thresholds
    chosen on val, the val and test metrics at the global one, the train recovery mAP (None
    without complete training labels)."""
    chosen = split_thresholds(probs["val"], splits.val.y, splits.class_names)
    threshold = chosen["global"]
    return {"test": split_evaluate(probs["test"], splits.test.y, conv), "chosen": chosen,
            "val_metrics": split_metrics(probs["val"], splits.val.y, convention=conv,
                                         threshold=threshold),
            "test_metrics": split_metrics(probs["test"], splits.test.y, convention=conv,
                                          threshold=threshold),
            "train_recovery_map": map_score(probs["train"], splits.train.y, conv)
            if complete else None}


#: entries (runs x rows x classes, the val, test and train rows together) of a stack's
#: probabilities scored at once (`_stack_scores`): their float64 copies within ~64 MiB
SCORE_ENTRIES = 1 << 23


def _stack_scores(ctxs: list, fitted: list) -> list:
    """`_run_scores` of a stack's fitted runs (None for a failed one), those on the same full
    val / test / train labels scored together (`spmlkit.metrics.scoring.runs_scores`,
    `spmlkit.metrics.thresholds.runs_thresholds`: equal to each run's own bit for bit), in
    chunks of runs within `SCORE_ENTRIES`; a run left None (partial labels, alone on its
    labels, a chunk with a non-finite score) is scored alone when it is finished, which says
    what is wrong."""
    from ..metrics import is_partial, map_from_ap, per_class_ap
    from ..metrics.scoring import runs_scores
    from ..metrics.thresholds import runs_thresholds

    out: list = [None] * len(fitted)
    groups: dict = {}
    for j, (ctx, fit) in enumerate(zip(ctxs, fitted)):
        sp = ctx.splits
        if isinstance(fit, BaseException) or is_partial(sp.val.y) or is_partial(sp.test.y):
            continue
        train = getattr(sp, "train_labels_complete", True)
        if train and is_partial(sp.train.y):
            continue
        key = (id(sp.val.y), id(sp.test.y), id(sp.train.y) if train else None,
               ctx.config.map_convention)
        groups.setdefault(key, []).append(j)
    for members in (m for m in groups.values() if len(m) > 1):
        sp = ctxs[members[0]].splits
        conv = ctxs[members[0]].config.map_convention
        train = getattr(sp, "train_labels_complete", True)
        rows = len(sp.val.y) + len(sp.test.y) + (len(sp.train.y) if train else 0)
        per = max(2, SCORE_ENTRIES // max(1, rows * len(sp.class_names)))
        for start in range(0, len(members), per):
            chunk = members[start:start + per]
            probs = [fitted[j].probs for j in chunk]
            try:
                pv = np.stack([p["val"] for p in probs])
                chosen = runs_thresholds(pv, sp.val.y, sp.class_names)
                cut = [c["global"] for c in chosen]
                val = runs_scores(pv, sp.val.y, cut, convention=conv)
                test = runs_scores(np.stack([p["test"] for p in probs]), sp.test.y, cut,
                                   convention=conv, report=True)
                recovery = [map_from_ap(a, conv) for a in per_class_ap(
                    np.stack([p["train"] for p in probs]), sp.train.y)] if train \
                    else [None] * len(chunk)
            except ValueError:  # (non-finite scores): each run alone says which
                continue
            for i, j in enumerate(chunk):
                out[j] = {"test": test[i][1], "chosen": chosen[i], "val_metrics": val[i],
                          "test_metrics": test[i][0], "train_recovery_map": recovery[i]}
    return out


def _complete_run(ctx: RunContext, run, fitted, pseudo: dict, t0: float,
                  extra: dict | None = None, durable: bool = True,
                  scores: dict | None = None) -> dict:
    """Score a fitted run and finish its folder (the end of
    [`train_run`][spmlkit.methods.driver.train_run]; ``durable``: as
    `spmlkit.runs.RunDir.finish`; ``scores``: its `_run_scores` when already computed, with
    its stack's, `_stack_scores`)."""
    method, splits, config, loss, loss_fn = ctx.method, ctx.splits, ctx.config, \
        ctx.loss_name, ctx.loss
    is_main, hparams = ctx.is_main, ctx.hparams
    complete = getattr(splits, "train_labels_complete", True)
    try:
        fit, probs = fitted.fit, fitted.probs
        conv = config.map_convention
        if scores is None:
            scores = _run_scores(probs, splits, conv, complete)
        test, chosen, val_metrics = scores["test"], scores["chosen"], scores["val_metrics"]
        threshold = chosen["global"]  # THRESHOLD_POLICY: what spml predict applies by default
        metric = getattr(fit, "metric", "map")
        result = {"loss": loss, "mode": method.name, "regime": splits.regime,
                  "seed": config.seed, "batch_size": config.batch_size, "lr": config.lr,
                  "best_epoch": fit.best_epoch, "epochs_run": len(fit.history),
                  "val_map": fit.val_map if metric == "map" else val_metrics["map"],
                  "test_map": test["map"],
                  "train_recovery_map": scores["train_recovery_map"],
                  "test": test, "labels": describe_labels(splits)["summary"],
                  "metric": metric, "val_score": getattr(fit, "val_score", fit.val_map),
                  "val_metrics": val_metrics,
                  "test_metrics": scores["test_metrics"],
                  "threshold": {"value": threshold, "policy": THRESHOLD_POLICY},
                  **fitted.result, "warnings": training_warnings(fit)}
        paper = getattr(loss_fn, "paper_threshold", None)
        if paper is not None:  # EM's F1 as its paper reports it (its own cut)
            at = split_metrics(probs["test"], splits.test.y, convention=conv, threshold=paper)
            result["test_metrics_at_paper_threshold"] = {
                "threshold": paper, **{name: at[name] for name in METRICS
                                       if METRICS[name].needs_threshold and name in at}}
        sparse = _few_known_negatives(splits.val.y, threshold)
        if sparse is not None:
            result["warnings"] = [*result["warnings"], sparse]
        if test.get("classes_without_negatives"):
            # partial test labels: positives and no known negative, an AP of 100 whatever the
            # scores; left out of the test mAP and named (val's warning is the threshold's)
            names = [str(splits.class_names[j]) for j in test["classes_without_negatives"]]
            result["test_map_left_out_without_negative"] = names
            result["warnings"] = [*result["warnings"], (
                f"test mAP: {len(names)} class(es) have known positives and no known negative "
                f"in the partial test labels (an AP of 100 whatever the scores) and are left "
                f"out of the mean: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}")]
        if conv == "present" and test.get("classes_without_positives"):
            # left out of the test mAP's mean (no positive to rank): named where it is read
            result["test_map_left_out"] = [str(splits.class_names[j])
                                           for j in test["classes_without_positives"]]
        dropped = skipped_images(splits)
        if dropped is not None:
            result["skipped_images"] = dropped["skipped"]
        x = splits.train.x
        if method.inputs == "images" and not (isinstance(x, np.ndarray) and x.dtype.kind in
                                              "fiu"):  # image items, not feature vectors
            trivial = trivial_map(splits.test.y, conv)
            result["trivial_test_map"] = trivial
            note = baseline_warning(method, config, ctx.options, test["map"], trivial)
            if note is not None:
                result["warnings"] = [*result["warnings"], note]
        for key, value in pseudo.get(fit.best_epoch, {}).items():  # at the selected epoch
            result[key] = value if np.isfinite(value) else None
        if hasattr(loss_fn, "estimated_labels") and complete:
            result["estimator_recovery_map"] = map_score(
                loss_fn.estimated_labels().cpu().numpy(), splits.train.y, conv)
        result["seconds"] = time.perf_counter() - t0  # this launch's
        result.update(extra or {})
    except BaseException as err:
        raised = _interrupted(err, run, is_main)
        if raised is err:
            raise
        raise raised from err
    if run is not None and is_main:
        for name, array in fitted.files.items():
            run.save_array(name, array)
        best = {**fitted.best, "loss": loss_fn.state_dict(), "loss_name": loss,
                "hparams": hparams, "mode": method.name,
                "num_classes": len(splits.class_names),
                "class_names": list(splits.class_names),
                **{key: splits.meta[key] for key in ("feature_columns", "id_column")
                   if (splits.meta or {}).get(key)}}
        run.finish(result, best, {
            "best_epoch": fit.best_epoch, "observed": splits.observed,
            **{f"probs_{s}": np.asarray(p, np.float32) for s, p in probs.items()
               if s != "train" or config.train_predictions},
            **{f"y_{s}": getattr(splits, s).y for s in probs}},
            chosen, durable=durable)
        result["run_dir"] = str(run.path)
    return result


def train_runs(method: str | TrainingMethod, splits, loss, hparams, configs, *,
               k=None, out=None, run_names=None, dataset_options: dict | None = None,
               **options) -> list:
    """Train several fresh runs of one method that differ in their
    [`TrainConfig`][spmlkit.engine.config.TrainConfig] (seed, learning rate) at once, when the
    method can (``TrainingMethod.fit_many``: the linear mode's stacked runs,
    `spmlkit.engine.vectorised`), else one after the other.

    Each run gets the folder, records and result [`train_run`][spmlkit.methods.driver.train_run]
    gives it alone (``config.json``, ``metrics.jsonl``, ``best.pt``, ``predictions.npz``,
    ``final.json``), but no ``checkpoint.pt`` while it trains (runs trained together are not resumed
    one by one: a study trains an interrupted group again; `resume_run` restarts such a folder); its
    ``seconds`` is its share of the stacked training plus its own scoring, and its result has
    ``"vectorised"``: how many runs trained together.

    Args:
        splits, loss, hparams, k: as [`train_run`][spmlkit.methods.driver.train_run], one for all
            runs or a list with one per run (the linear mode stacks runs of different losses,
            hyperparameters and regimes of one dataset when every loss is closed-form,
            `spmlkit.engine.vectorised.closed_form`).
        configs: one [`TrainConfig`][spmlkit.engine.config.TrainConfig] per run.
        run_names: one folder name per run (with ``out``).
        Others: as [`train_run`][spmlkit.methods.driver.train_run].

    Returns:
        per run, its result dict or the exception that ended it (that run's folder records
        the failure; the other runs are unaffected).
    """
    method = method if isinstance(method, TrainingMethod) else get_method(method)
    configs = list(configs)
    count = len(configs)

    def per_run(value, what):
        if isinstance(value, list):
            if len(value) != count:
                raise ValueError(f"train_runs: {len(value)} {what} for {count} configs")
            return value
        return [value] * count

    splits_l, loss_l = per_run(splits, "splits"), per_run(loss, "losses")
    hparams_l, k_l = per_run(hparams, "hparams"), per_run(k, "k values")
    names = list(run_names) if run_names is not None else [None] * count
    if method.fit_many is None or count < 2:
        out_list = []
        for sp, ls, hp, k_, config, name in zip(splits_l, loss_l, hparams_l, k_l, configs,
                                                names):
            try:
                out_list.append(train_run(method, sp, ls, hp, config, k=k_, out=out,
                                          run_name=name, dataset_options=dataset_options,
                                          **options))
            except Exception as err:
                out_list.append(err)
        return out_list
    options = method.check_options(options)
    with contextlib.ExitStack() as held:  # each run's folder locked while the stack trains
        return _train_stack(method, splits_l, loss_l, hparams_l, k_l, configs, names, out,
                            dataset_options, options, held)


def _train_stack(method, splits_l, loss_l, hparams_l, k_l, configs, names, out,
                 dataset_options, options, held) -> list:
    """`train_runs` of a method that trains them together (``fit_many``); ``held`` keeps
    each new run folder's lock until the stack is done (a ``--resume`` of one of them waits
    its turn, as for a run trained alone)."""
    count = len(configs)
    checked: dict = {}  # id(splits) -> None or the error of check_inputs
    ctxs, runs, pseudos = [], [], []
    results: list = [None] * count  # a run whose setup fails ends with its error, alone
    for i, (sp, ls, hp, k_, config, name) in enumerate(zip(splits_l, loss_l, hparams_l, k_l,
                                                           configs, names)):
        run = None
        try:
            if id(sp) not in checked:
                try:
                    check_inputs(method, sp)
                    checked[id(sp)] = None
                except Exception as err:  # noqa: BLE001 (the runs on these splits fail)
                    checked[id(sp)] = err
            if checked[id(sp)] is not None:
                raise checked[id(sp)]
            config, hp, loss_fn, run_k = _run_settings(method, sp, ls, hp, config, k_, options)
            if out is not None:
                run = RunDir.create(out, name or default_run_name(method, sp, ls, config))
                held.enter_context(run.locked())
            pseudo: dict = {}
            log_epoch = _epoch_logger(sp, run, pseudo)
            # no checkpoint.pt: a group that stopped is trained again as a whole (a study
            # replaces its folders), and a folder without one restarts when resumed alone
            ctx = RunContext(method, sp, ls, hp, loss_fn, run_k, config, options,
                             log_epoch, None, None, True, run.path if run is not None else None)
            if run is not None:
                run.start(fresh_config(method, ctx, dataset_options), sp.observed)
        except Exception as err:  # noqa: BLE001 (this run fails; the others train)
            if run is not None:
                run.fail(err)
            results[i] = err
            continue
        ctxs.append((i, ctx))
        runs.append(run)
        pseudos.append(pseudo)
    fitted = method.fit_many([ctx for _, ctx in ctxs]) if ctxs else []
    scores = _stack_scores([ctx for _, ctx in ctxs], fitted)
    for j, ((i, ctx), run, pseudo) in enumerate(zip(ctxs, runs, pseudos)):
        # each run's outputs are let go once it is scored and written (a method may compute
        # them on first use: the linear mode's stacked runs on stored features)
        fit, fitted[j] = fitted[j], None
        if isinstance(fit, BaseException):
            if run is not None:
                run.fail(fit)
            results[i] = fit
            continue
        try:
            # seconds: the run's share of the stacked training, then its own scoring
            results[i] = _complete_run(ctx, run, fit, pseudo,
                                       time.perf_counter() - fit.fit.seconds,
                                       {"vectorised": len(ctxs)}, durable=False,
                                       scores=scores[j])
            scores[j] = None
        except Exception as err:  # noqa: BLE001
            results[i] = err
    if out is not None:
        sync_files()  # the finished folders on disk at once (not two fsyncs a run)
    return results


def resume_run(run_dir, *, on_epoch=None, device: str | None = None,
               checkpoint_seconds: float | None = None, splits=None, **overrides) -> dict:
    """Continue the interrupted run in ``run_dir`` with the settings of its ``config.json``
    (dataset, regime, loss, train config, the method's options); a finished run returns its
    ``final.json``. ``device`` overrides the stored device (a GPU run resumed on a CPU then
    matches only up to floating-point differences); ``overrides`` set method options that do
    not change results (``progress``, ``cache_dir``). ``splits``: the splits the run trained
    on, for data made in Python that ``load_splits`` cannot reload (default: reloaded from the
    dataset and options in ``config.json``).

    Raises:
        FileNotFoundError: not a run folder.
        ResumeError: (a ValueError) written by a method that cannot resume, or by another
            spmlkit version.
    """
    from ..loading import load_splits

    run = read_run(run_dir)
    cfg = run.config
    method = get_method(cfg.get("mode", "linear"))
    if run.final is not None:
        return {**run.final, "run_dir": str(run.path)}
    if "options" not in cfg:
        raise ResumeError(f"cannot resume {run.path}: its config.json was written by an older "
                         f"spmlkit (no 'options'); train the run again")
    train = dict(cfg["train"])
    if device is not None:
        train["device"] = device
    check_data_files(run.path, cfg.get("data_files"))
    from ..loading import named_cache_dirs

    from .. import distributed as dist_utils

    if dist_utils.current_context(train.get("device", "cpu")).is_main and \
            (cfg["options"].get("progress", True) or overrides.get("progress")):
        named = named_cache_dirs(cfg.get("dataset_options"), cfg["options"])
        given = named_cache_dirs(None, overrides)
        for where in sorted(named | given):
            why = "the --cache-dir given" if where in given else \
                "a cache_dir its config.json names"
            print(f"note: resuming {run.path}: feature stores are read and written in {where} "
                  f"({why})", file=sys.stderr)
    if splits is None:
        splits = load_splits(cfg.get("source", cfg["dataset"]), cfg["regime"],
                             **(cfg.get("dataset_options") or {}))
    with acceleration(run_decoder(run.path, cfg, train.get("device"))):
        return train_run(method, splits, cfg["loss"], cfg["hparams"], TrainConfig(**train),
                         k=cfg["k"], dataset_options=cfg.get("dataset_options"),
                         resume=run.path, on_epoch=on_epoch,
                         checkpoint_seconds=checkpoint_seconds,
                         **{**cfg["options"], **overrides})
