"""The linear mode: a linear head on feature vectors (Cole et al.'s protocol).

One epoch = a permutation of the train rows drawn from one ``torch.Generator`` seeded with
``config.seed`` (one draw per epoch, in order), cut into batches that index pre-loaded tensors
(no per-row ``DataLoader``). Adam (`LeanAdam`), with
``config.weight_decay`` as Adam's coupled L2 on the weights (default 0: none), no schedule.

Stored features (a memory map or `Rows`: a feature store, your own
``.npy``) are not loaded: each chunk of `CHUNK_ROWS` rows of the epoch's
permutation is read at once (in file order, cast to float32) and cut into the same batches, so
the batches and every result equal the in-memory path's, while memory holds one chunk.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..data import rows as stored_rows
from ..data.rows import as_rows, is_stored
from ..labels import validate_full_labels, validate_observed
from ..losses import SPMLLoss, TrainInfo
from ..metrics import is_partial, map_score, metric_score
from ..models.heads import seeded_linear
from .config import TrainConfig, batch_starts, epoch_rows
from .loop import (FitResult, GeneratorState, Stage, StageParts, check_val_labels, train_loop)
from .optim import make_optimizer


def _as_tensor(x, where: str):
    """``x`` as a finite float32 N x D tensor (errors name ``where`` and the bad rows); stored
    features (`is_stored`) as `Rows`, unread
    (their source checked them for NaN / inf when it opened them)."""
    if is_stored(x):
        return as_rows(x)
    t = torch.as_tensor(np.asarray(x, dtype=np.float32))
    if t.ndim != 2:
        raise ValueError(f"{where} must be an N x D matrix, got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        rows = torch.nonzero(~torch.isfinite(t).all(dim=1)).flatten()[:5].tolist()
        raise ValueError(f"{where} hold NaN or inf (first rows: {rows})")
    return t


def make_linear_head(in_features: int, num_classes: int, seed: int) -> nn.Linear:
    """``nn.Linear`` with PyTorch's default init, drawn from ``seed`` (global RNG untouched;
    thread-safe: `spmlkit.models.rng.global_rng`)."""
    return seeded_linear(in_features, num_classes, seed)


def to_device(block: np.ndarray, device: torch.device) -> torch.Tensor:
    """A float32 block read from a store as a tensor on ``device`` (through pinned memory, without
    blocking, on CUDA)."""
    t = torch.from_numpy(block)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@torch.no_grad()
def predict_logits(model: nn.Module, x, chunk: int | None = None) -> torch.Tensor:
    """Eval-mode logits of ``x`` (a tensor, or stored features read chunk by chunk) in chunks
    of ``chunk`` rows (default `CHUNK_ROWS`; the mode is restored
    afterwards)."""
    chunk = chunk or stored_rows.CHUNK_ROWS
    was = model.training
    model.eval()
    if is_stored(x):
        device = next(model.parameters()).device
        parts = [model(to_device(block, device)) for _, block in as_rows(x).chunks(chunk)]
        out = torch.cat(parts) if parts else model(torch.zeros(0, x.shape[1], device=device))
    else:
        out = torch.cat([model(x[i:i + chunk]) for i in range(0, len(x), chunk)]) if len(x) \
            else model(x)
    model.train(was)
    return out.float()


def epoch_batches(x, z, perm: torch.Tensor, bs: int, device: torch.device,
                  drop_last: bool = False):
    """``(x[idx], z[idx], idx)`` for consecutive batches ``idx`` of ``perm`` (on ``device``;
    without the last, shorter one when ``drop_last``: `batch_starts`). ``x`` a tensor on
    ``device``, or stored features: then a chunk of the permutation (a multiple of ``bs`` rows,
    about `CHUNK_ROWS`) is read at once and cut into the same
    batches."""
    starts = batch_starts(len(perm), bs, drop_last)
    n = starts[-1] + bs if drop_last else len(perm)
    perm = perm[:n]
    if not is_stored(x):
        perm = perm.to(device)
        for i in range(0, n, bs):
            idx = perm[i:i + bs]
            yield x[idx], z[idx], idx
        return
    step = max(1, stored_rows.CHUNK_ROWS // bs) * bs
    rows = as_rows(x)
    for start in range(0, n, step):
        part = perm[start:start + step]
        block = to_device(rows.take(part.numpy()), device)
        part = part.to(device)
        for i in range(0, len(part), bs):
            idx = part[i:i + bs]
            yield block[i:i + bs], z[idx], idx



def val_map(scores: torch.Tensor, y, convention: str, metric: str = "map") -> float:
    """mAP of sigmoid(``scores``) against ``y`` (or another ``metric`` of
    `spmlkit.metrics.METRICS`; the thresholded ones at the global micro-F1 threshold of
    these rows, `spmlkit.metrics.THRESHOLD_POLICY`); NaN (no score for the epoch) when the
    scores are not all finite."""
    probs = torch.sigmoid(scores.float()).cpu().numpy()
    if not np.isfinite(probs).all():
        return float("nan")
    if metric == "map":
        return map_score(probs, y, convention)
    return metric_score(metric, probs, y, convention=convention, threshold="chosen")


def linear_inputs(x_train, observed, x_val, y_val, config: TrainConfig):
    """The checked inputs of a linear fit on ``config.device``: ``(x, z, x_val, y_val)``, the
    train features and observed labels as tensors, the val features as a tensor and the val
    labels (numpy) or ``(None, None)`` without a val set.

    Raises:
        ValueError: rows of features and labels that do not match, observed or full labels
            outside their encoding, val labels without a positive (naming them).
    """
    device = torch.device(config.device)
    x = _as_tensor(x_train, "train features")
    x = x if is_stored(x) else x.to(device)
    # an int8 matrix is not copied (the engine only reads it: N x L bytes fewer at 1M rows)
    z = validate_observed(observed, "train observed labels", copy=False)
    z = torch.as_tensor(z if z.flags.writeable else z.copy()).to(device)
    if z.shape[0] != x.shape[0]:
        raise ValueError(f"train features have {x.shape[0]} rows, observed labels "
                         f"{z.shape[0]}")
    has_val = x_val is not None and y_val is not None
    if has_val:
        xv = _as_tensor(x_val, "validation features")
        xv = xv if is_stored(xv) else xv.to(device)
        yv = y_val if is_partial(y_val) else validate_full_labels(y_val, "validation labels")
        if len(xv) != len(yv) or yv.shape[1] != z.shape[1]:
            raise ValueError(f"validation features {tuple(xv.shape)} and labels {yv.shape} do "
                             f"not match each other or the {z.shape[1]} train classes")
        check_val_labels(yv, config.map_convention)
        return x, z, xv, yv
    return x, z, None, None


def fit_linear(x_train, observed, loss: SPMLLoss, config: TrainConfig, *, x_val=None,
               y_val=None, k: float | None = None, model: nn.Module | None = None,
               on_epoch: Callable[..., None] | None = None,
               checkpoint: Callable[[Callable[[], dict]], None] | None = None,
               resume: dict | None = None) -> tuple[nn.Module, FitResult]:
    """Train a linear head on feature vectors with ``loss``; select the best epoch on val.

    Args:
        x_train: N x D features of the train split: in memory, or stored (a memory map or
            `Rows`: read chunk by chunk, never loaded whole).
        observed: N x L observed labels (1 / 0 / -1).
        loss: a loss from [`spmlkit.losses.create_loss`][spmlkit.losses.create_loss]; its hooks are
            called here.
        config: [`TrainConfig`][spmlkit.engine.config.TrainConfig].
        x_val, y_val: validation features and full 0/1 labels for selection (without them the
            last epoch is kept).
        k: expected positives per example, handed to the loss through `TrainInfo`.
        model: start from this head instead of a fresh ``nn.Linear``.
        on_epoch: called as ``on_epoch(record, model, loss)`` after each epoch (progress display,
            logging, diagnostics); ``model`` is in train mode and must not be modified. Fields
            it adds to ``record`` are kept in the history (and in the checkpoint state).
        checkpoint: called as ``checkpoint(state_fn)`` after every epoch (after ``on_epoch``,
            also when it raises); ``state_fn()`` returns the resumable state: model, loss state,
            optimiser moments and step counts, the batch-order generator's state, best epoch
            and weights, history, elapsed seconds; a dict of tensors, numbers, strings, lists
            and dicts (``torch.save`` it; `spmlkit.runs.load_torch` loads it). It is built
            only when called: e.g. ``checkpoint=lambda state: run.save_torch("checkpoint.pt",
            state())``, or call it every N epochs / minutes only.
        resume: a state from ``state_fn``: continue after its epoch, with the same arguments
            as the run that saved it; the result (weights, history, best epoch) is the
            uninterrupted run's, bit for bit on the same machine.

    Returns:
        ``(model, result)``: the model holds the best epoch's weights, and ``loss`` the best
        epoch's state.

    Raises:
        ValueError: bad inputs (naming them); validation labels without a positive (val mAP
            undefined); no epoch with a finite val mAP; a ``resume`` state that does not fit.
        FloatingPointError: the training diverged.
    """
    start = time.perf_counter()
    device = torch.device(config.device)
    x, z, xv, yv = linear_inputs(x_train, observed, x_val, y_val, config)
    has_val = xv is not None
    n, num_classes = z.shape
    model = (model or make_linear_head(x.shape[1], num_classes, config.seed)).to(device)
    loss = loss.to(device)
    loss.on_train_start(z, TrainInfo(n, num_classes, k, config.seed, config.epochs))
    gen = torch.Generator().manual_seed(config.seed)
    bs = config.batch_size

    def batches(epoch):  # indexes the pre-loaded tensors (or chunks read from a store)
        return epoch_batches(x, z, torch.randperm(n, generator=gen), bs, device,
                             config.drop_last)

    def evaluate():
        return val_map(predict_logits(model, xv), yv, config.map_convention, config.metric)

    stage = Stage(config.epochs, lambda: StageParts(make_optimizer(
        model, loss, config.lr, weight_decay=config.weight_decay)))
    result = train_loop(model, loss, [stage], num_examples=epoch_rows(n, bs, config.drop_last),
                        batches=batches, evaluators={"model": evaluate} if has_val else None,
                        early_stop=config.early_stop,
                        train_logits=lambda: predict_logits(model, x), on_epoch=on_epoch,
                        checkpoint=checkpoint, resume=resume,
                        state={"batch_order": GeneratorState(gen)}, start=start,
                        metric=config.metric)
    return model, result
