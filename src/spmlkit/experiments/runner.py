"""One training run from a dataset split to metrics (and, optionally, a run folder)."""
from __future__ import annotations

import platform
import time
from dataclasses import asdict

import numpy as np
import torch

from ..data import Splits
from ..engine import TrainConfig, fit_linear, predict_logits
from ..losses import LOSSES, create_loss
from ..metrics import evaluate, map_score, pseudo_label_stats, select_thresholds
from ..runs import PREDICTIONS_FILE, TRAIN_PROBS_FILE, RunDir


def resolve_hparams(loss: str, dataset: str | None, hparams: dict | None = None) -> dict:
    """The loss's official per-dataset defaults (if any) with the user's values on top."""
    return {**LOSSES.get(loss).hparams_for(dataset), **(hparams or {})}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    try:  # the installed version, without importing scikit-learn (seconds: scipy)
        sklearn_version = version("scikit-learn")
    except PackageNotFoundError:
        sklearn_version = None
    return {"spmlkit": __version__, "torch": torch.__version__, "numpy": np.__version__,
            "scikit-learn": sklearn_version, "python": platform.python_version()}


def _probs(model, x) -> np.ndarray:
    device = next(model.parameters()).device
    x = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x, np.float32))
    return torch.sigmoid(predict_logits(model, x.to(device))).cpu().numpy()


def pseudo_label_record(loss_module, y_train) -> dict:
    """``{"pl_count", "pl_precision"}`` of a loss that pseudo-labels, else ``{}``.

    A loss that pseudo-labels has the optional method ``hard_pseudo_labels()`` returning
    ``(mask, value)``: N_train x L bool (the entries it has pseudo-labelled so far) and
    N_train x L 0/1 (the label it asserts on each): ``em_apl`` (0: its soft negatives), ``ll_cp``
    (1: flipped entries), ``soft_opml`` / ``opml_sp`` (1: corrected entries). The name is not
    ``pseudo_labels()`` because ``em_apl`` already has that one, returning its soft targets.
    See :func:`spmlkit.metrics.pseudo_label_stats`.
    """
    method = getattr(loss_module, "hard_pseudo_labels", None)
    if method is None:
        return {}
    mask, value = method()
    mask = mask.detach().cpu().numpy() if torch.is_tensor(mask) else np.asarray(mask)
    value = value.detach().cpu().numpy() if torch.is_tensor(value) else np.asarray(value)
    count, precision = pseudo_label_stats(mask, value, y_train)
    return {"pl_count": count, "pl_precision": precision}


def train_one(splits: Splits, loss: str, hparams: dict | None = None,
              config: TrainConfig | None = None, *, k: float | None = None, out=None,
              run_name: str | None = None, on_epoch=None, dataset_options: dict | None = None,
              save_train_probs: bool = False):
    """Train ``loss`` on ``splits`` in linear mode and score the best epoch.

    Returns a dict with ``best_epoch``, ``val_map``, ``test_map``, ``train_recovery_map`` (mAP of
    the classifier's train-split predictions against the full train labels, Cole et al.
    Table 2), ``test`` (P@k etc.), ``seconds``, and ``run_dir`` when ``out`` is given (a new
    folder under ``out``: config, observed labels, per-epoch metrics, final metrics, checkpoint,
    and ``predictions.npz``: the best epoch's probabilities ``probs_train`` / ``probs_val`` /
    ``probs_test`` (float32), the full labels ``y_train`` / ``y_val`` / ``y_test`` (uint8), the
    observed train labels ``observed`` (int8) and ``best_epoch``; and ``thresholds.json``: the
    decision thresholds chosen on val for ``spml predict``, see
    :func:`spmlkit.metrics.select_thresholds`).

    When the loss pseudo-labels (it has ``hard_pseudo_labels()``, see
    :func:`pseudo_label_record`), every epoch record (``metrics.jsonl``, ``on_epoch``) gets
    ``pl_count`` and ``pl_precision`` (against the full train labels; NaN while nothing is
    pseudo-labelled), and so does the result, at the selected epoch (None for NaN).

    ``save_train_probs=True`` (needs ``out``) also stores the eval-mode train probabilities after
    every epoch as ``train_probs.npy`` (epochs x N_train x L, float16; row ``e - 1`` is epoch
    ``e``), for :func:`spmlkit.analysis.unobserved_positive_histograms`.
    """
    config = config or TrainConfig()
    if save_train_probs and out is None:
        raise ValueError("save_train_probs=True stores train_probs.npy in the run folder: give "
                         "out= (the folder the run folder is created in)")
    hparams = resolve_hparams(loss, splits.name, hparams)
    loss_fn = create_loss(loss, **hparams)
    k = splits.k if k is None else k
    run = None
    if out is not None:
        run = RunDir.create(out, run_name or f"{splits.name}-{loss}-{splits.regime}-s{config.seed}"
                            .replace(":", "_"))
        run.write_json("config.json", {
            "dataset": splits.name, "dataset_options": dataset_options or {},
            "regime": splits.regime, "loss": loss, "hparams": hparams, "k": k,
            "train": asdict(config), "sizes": {"train": len(splits.train),
                                               "val": len(splits.val), "test": len(splits.test)},
            "class_names": splits.class_names, "save_train_probs": bool(save_train_probs),
            "versions": versions()})
        run.save_array("observed.npy", splits.observed)

    x_train = torch.as_tensor(np.asarray(splits.train.x, np.float32))
    epoch_probs, pseudo = [], {}

    def log_epoch(record, model, loss_module):
        record.update(pseudo_label_record(loss_module, splits.train.y))
        pseudo[record["epoch"]] = {k: record[k] for k in ("pl_count", "pl_precision")
                                   if k in record}
        if save_train_probs:
            epoch_probs.append(_probs(model, x_train).astype(np.float16))
        if run is not None:
            run.append_jsonl("metrics.jsonl", record)
        if on_epoch is not None:
            on_epoch(record, model, loss_module)

    t0 = time.perf_counter()
    model, fit = fit_linear(splits.train.x, splits.observed, loss_fn, config, x_val=splits.val.x,
                            y_val=splits.val.y, k=k, on_epoch=log_epoch)
    conv = config.map_convention
    probs = {"train": _probs(model, x_train), "val": _probs(model, splits.val.x),
             "test": _probs(model, splits.test.x)}
    test = evaluate(probs["test"], splits.test.y, conv)
    result = {
        "loss": loss, "regime": splits.regime, "seed": config.seed,
        "batch_size": config.batch_size, "lr": config.lr, "best_epoch": fit.best_epoch,
        "epochs_run": len(fit.history), "val_map": fit.val_map, "test_map": test["map"],
        "train_recovery_map": map_score(probs["train"], splits.train.y, conv),
        "test": test,
    }
    for key, value in pseudo.get(fit.best_epoch, {}).items():  # at the selected epoch
        result[key] = value if np.isfinite(value) else None
    if hasattr(loss_fn, "estimated_labels"):
        result["estimator_recovery_map"] = map_score(loss_fn.estimated_labels().cpu().numpy(),
                                                     splits.train.y, conv)
    result["seconds"] = time.perf_counter() - t0
    if run is not None:
        run.save_torch("best.pt", {"model": model.state_dict(), "loss": loss_fn.state_dict(),
                                   "loss_name": loss, "hparams": hparams,
                                   "in_features": int(np.shape(splits.train.x)[1]),
                                   "num_classes": len(splits.class_names),
                                   "class_names": splits.class_names})
        run.save_npz(PREDICTIONS_FILE, best_epoch=fit.best_epoch, observed=splits.observed,
                     **{f"probs_{s}": p.astype(np.float32) for s, p in probs.items()},
                     **{f"y_{s}": getattr(splits, s).y for s in probs})
        if save_train_probs:
            run.save_array(TRAIN_PROBS_FILE, np.stack(epoch_probs))
        from ..predict import THRESHOLDS_FILE  # val-chosen thresholds for `spml predict`

        run.write_json(THRESHOLDS_FILE, select_thresholds(probs["val"], splits.val.y,
                                                          splits.class_names))
        run.write_json("final.json", result)
        result["run_dir"] = str(run.path)
    return result
