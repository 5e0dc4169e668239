"""The fine-tuning modes: end to end from image items (`fit_finetune`) and Cole et al.'s
``linear_init`` (`fit_linear_init`: the linear phase, then fine-tuning from its head)."""
from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Callable, ClassVar, Sequence

import numpy as np
import torch
from torch import nn

from ..metrics import is_partial
from .. import distributed as dist_utils
from ..constraints import Boolean, Interval, Options, check_record
from ..labels import validate_full_labels, validate_observed
from ..accel import start as start_acceleration
from ..data.image_views import finish_view, finished_batches
from ..losses import SPMLLoss, TrainInfo, carry_state
from .amp import LossScaler, amp_dtype, run_model
from .config import TrainConfig
from .image_batches import (GlobalBatchSampler, ImageItems, ItemPredictor, check_items,
                            make_loader, _transforms, mix_seed)
from .linear import fit_linear, val_map
from .loop import FitResult, Stage, StageParts, StepHook, check_val_labels, snapshot, \
    train_loop
from .optim import make_optimizer

#: the ``format`` of a `fit_linear_init` state (it holds the phase's own train-loop state)
LINEAR_INIT_FORMAT = "spmlkit-linear-init-state/1"
#: tag of the fine-tuning modes' per-epoch seeds of torch's global RNG (dropout)
_RNG_TAG = 0xF17E


def fit_finetune(model: nn.Module, train_items: Sequence, observed, loss: SPMLLoss,
                 config: TrainConfig, *, val_items: Sequence | None = None, y_val=None,
                 k: float | None = None, on_epoch: Callable[..., None] | None = None,
                 train_transform: Callable | None = None,
                 eval_transform: Callable | None = None,
                 image_reader: Callable | None = None,
                 checkpoint: Callable[[Callable[[], dict]], None] | None = None,
                 resume: dict | None = None,
                 tuning: "FinetuneOptions | None" = None) -> tuple[nn.Module, FitResult]:
    """Train ``model`` end to end on image items with ``loss``; select the best epoch on val.

    The loop is `train_loop`'s; batches come from a ``DataLoader`` (``config.num_workers``
    worker processes) over a `GlobalBatchSampler` seeded with ``config.seed``. Training
    images go through ``train_transform`` (default: the weak view of
    `spmlkit.data.transforms` at the backbone's size, mean and std), seeded per
    ``(seed, epoch, row)``; val and train predictions through ``eval_transform``. On CUDA the
    model runs under autocast (``config.amp``) in channels-last memory format; the loss always
    gets float32 logits. The head trains at ``config.lr * config.head_lr_mult`` (the model must
    then have a ``head``, as `spmlkit.models.heads.ImageClassifier`), the loss's own
    state at ``config.lr * loss.lr_multiplier``.

    Many processes (``torchrun --nproc_per_node=N``, after
    `spmlkit.distributed.init_distributed`): ``config.batch_size`` is the global batch and
    every process trains on its share under ``DistributedDataParallel``; each process's logits
    are all-gathered (differentiably) and every process evaluates the loss on the whole global
    batch, so per-example state (ROLE's estimator, pseudo-labels, LL-Cp's flips) and batch-level
    terms (EPR, the high-rank regulariser) see what one process would. ``on_epoch_end`` gets the
    gathered train logits of every row, in row order, in every process; val mAP is computed in
    every process from the gathered predictions (so early stopping agrees); ``on_epoch`` is
    called in process 0 only. See `spmlkit.distributed` for what is synchronised and why.

    Args:
        model: maps ``B x 3 x S x S`` images to ``B x L`` logits.
        train_items: N image paths (``LabelledSet.x`` of an image source) or PIL images.
        observed: N x L observed labels (1 / 0 / -1).
        loss, config, k, on_epoch: as `fit_linear`.
        val_items, y_val: validation items and full 0/1 labels for selection.
        train_transform, eval_transform: ``t(img, generator) -> 3 x S x S`` tensors.
        image_reader: ``path -> PIL image`` (default ``spmlkit.data.image_files.open_image``).
        checkpoint: ``checkpoint(state_fn)`` after every epoch, in process 0 only, as in
            `fit_linear`; the state holds the model, the loss's state, the optimiser's,
            the fp16 loss scaler's, the best epoch and weights, the history.
        tuning: `FinetuneOptions` (weight decay, warm-up and schedule of the learning
            rate, CPU bfloat16 autocast); the default changes nothing.
        resume: such a state (loaded in every process): continue after its epoch. Batches,
            augmentations (seeded per ``(seed, epoch, row)``) and torch's global RNG during the
            training steps (dropout: seeded per ``(seed, epoch, rank)``, the caller's RNG left
            as it was) do not depend on what ran before, so the result is the uninterrupted
            run's, bit for bit on the same machine.

    Returns:
        ``(model, result)``: the model (unwrapped, on ``config.device``) holds the best
        epoch's weights and ``loss`` the best epoch's state, in every process.
    """
    start = time.perf_counter()
    train_items, z, val_items, yv = _checked_inputs(train_items, observed, val_items, y_val,
                                                    config)
    has_val = val_items is not None
    ctx = dist_utils.current_context(config.device)
    device = ctx.device
    n, num_classes = z.shape
    train_t, eval_t, shape = _transforms(model, config, train_transform, eval_transform)
    tuning = tuning or FinetuneOptions()
    amp = _forward_dtype(config, tuning, device)
    channels_last = device.type == "cuda" and config.channels_last
    # one memory format in every process (DDP compares strides), whatever touched the model
    # before (e.g. a feature extraction that ran it channels-last in one process only)
    model = model.to(device, memory_format=torch.channels_last if channels_last
                     else torch.contiguous_format)
    loss = loss.to(device)
    z = z.to(device)
    loss.on_train_start(z, TrainInfo(n, num_classes, k, config.seed, config.epochs))
    if ctx.world_size > 1:
        dist_utils.broadcast_state(loss)  # one start in every process, whatever it drew
    accel = start_acceleration(device, "this fine-tuning run")
    net = accel.compiled(dist_utils.wrap_model(model, ctx))
    sampler = GlobalBatchSampler(n, config.batch_size, config.seed, ctx.rank, ctx.world_size,
                                 drop_last=config.drop_last)
    loader = make_loader(ImageItems(train_items, train_t, image_reader, config.seed,
                                    raw=accel.gpu_decode), sampler, config, shape, device)
    feed = _GlobalBatches(loader, sampler, z, train_t, net, ctx, amp, channels_last,
                          accel.gpu_decode, tuning, config.epochs)
    predict_train = ItemPredictor(train_items, eval_t, config, shape, device, image_reader, ctx)
    predict_val = ItemPredictor(val_items, eval_t, config, shape, device, image_reader, ctx) \
        if has_val else None
    predicted = accel.compiled(model)  # the eval passes (compiled: one graph of their own)

    def evaluate():
        return val_map(predict_val(predicted), yv, config.map_convention, config.metric)

    def after_epoch():
        if ctx.world_size > 1:
            dist_utils.broadcast_state(loss)

    def report(record, m, lo):
        if on_epoch is not None and ctx.is_main:
            on_epoch(record, m, lo)

    setup = functools.partial(_stage_parts, model, loss, config, tuning, amp, feed)
    result = train_loop(model, loss, [Stage(config.epochs, setup)],
                        num_examples=sampler.rows_per_epoch,
                        batches=feed.batches, forward=feed.forward,
                        evaluators={"model": evaluate} if has_val else None,
                        early_stop=config.early_stop,
                        train_logits=lambda: predict_train(predicted),
                        after_epoch=after_epoch,
                        on_epoch=report, checkpoint=checkpoint if ctx.is_main else None,
                        resume=resume, metric=config.metric,
                        epoch_seed=lambda epoch: mix_seed(config.seed, _RNG_TAG, epoch,
                                                          ctx.rank),
                        start=start)
    return model, result


def _checked_inputs(train_items, observed, val_items, y_val, config: TrainConfig) -> tuple:
    """``(train items, observed labels as a tensor, val items, val labels)`` of a fine-tuning
    run, checked against each other (`_checked_val`: ``(None, None)`` without validation);
    ``TrainConfig.weight_decay``, which fine-tuning does not use, is refused."""
    if config.weight_decay:  # (it would do nothing here)
        raise ValueError(f"fit_finetune: TrainConfig.weight_decay ({config.weight_decay:g}) is "
                         f"the feature heads' coupled L2 (fit_linear); fine-tuning decays with "
                         f"tuning=FinetuneOptions(weight_decay=...) (decoupled, weights only)")
    train_items = check_items(train_items, "train items")
    z = torch.as_tensor(validate_observed(observed, "train observed labels"))
    if z.shape[0] != len(train_items):
        raise ValueError(f"{len(train_items)} train items but {z.shape[0]} rows of observed "
                         f"labels")
    return (train_items, z, *_checked_val(val_items, y_val, z.shape[1], config.map_convention))


class _GlobalBatches:
    """A fine-tuning run's batches and forward pass for `train_loop`: each process's share
    of the global batch (`GlobalBatchSampler`), finished on the device, with the observed
    labels and index of the whole global batch; the learning rate set from ``(epoch, batch)``
    before each step when ``tuning`` schedules it (the same on a resume); the logits of every
    process gathered (differentiably) so the loss sees the global batch."""

    def __init__(self, loader, sampler, z, transform, net, ctx, amp, channels_last: bool,
                 ahead: bool, tuning: "FinetuneOptions", epochs: int):
        self.loader, self.sampler, self.z, self.transform = loader, sampler, z, transform
        self.net, self.ctx, self.amp, self.channels_last = net, ctx, amp, channels_last
        self.ahead, self.tuning, self.epochs = ahead, tuning, epochs
        self.opt, self.base = None, None  # the stage's optimiser and its groups' base lrs

    def batches(self, epoch: int):
        device, per_epoch = self.ctx.device, len(self.sampler)
        self.sampler.set_epoch(epoch)
        finished = finished_batches(self.loader, self._finish, device, ahead=self.ahead)
        for i, ((inputs, local), rows) in enumerate(zip(finished,
                                                        self.sampler.global_batches(epoch))):
            if self.tuning.schedules and self.opt is not None:  # from (epoch, batch)
                set_lr(self.opt, self.base, self.tuning.lr_factor(
                    epoch * per_epoch + i, self.epochs * per_epoch, per_epoch))
            # one process: the loader's (pinned) rows are the global batch's
            rows = (local if self.ctx.world_size == 1 else rows).to(device, non_blocking=True)
            yield inputs, self.z[rows], rows  # observed labels and index of the global batch

    def _finish(self, batch):
        inputs, flips, local = batch
        return finish_view(self.transform, inputs, flips, self.ctx.device), local

    def forward(self, inputs, obs, idx):
        logits = run_model(self.net, inputs, self.ctx.device, self.amp,
                           self.channels_last).float()
        if self.ctx.world_size > 1:
            logits = dist_utils.gather_rows(logits, self.sampler.chunk_sizes(len(idx)))
        return logits, obs, idx


def _stage_parts(model, loss, config: TrainConfig, tuning: "FinetuneOptions", amp,
                 feed: _GlobalBatches) -> StageParts:
    """The fine-tuning stage's optimiser (its learning rates handed to ``feed``'s schedule),
    decoupled weight decay when ``tuning`` asks for it, and an fp16 loss scaler."""
    opt = make_optimizer(model, loss, config.lr, config.head_lr_mult)
    feed.opt, feed.base = opt, group_lrs(opt)
    hooks = [WeightDecay(model, opt, tuning.weight_decay)] if tuning.weight_decay else []
    if amp != torch.float16:
        return StageParts(opt, hooks=hooks)
    scaler = LossScaler(list(model.parameters()) + list(loss.parameters()))
    return StageParts(opt, step=lambda value: scaler.step(value, opt),
                      state={"scaler": scaler}, hooks=hooks)


def _checked_val(val_items, y_val, classes: int, convention: str) -> tuple:
    """``(val items, val labels)`` checked (full 0/1 labels, or partial ones) against each
    other and the ``classes`` train classes, or ``(None, None)`` without validation."""
    if val_items is None or y_val is None:
        return None, None
    val_items = check_items(val_items, "validation items")
    yv = y_val if is_partial(y_val) else validate_full_labels(y_val, "validation labels")
    if len(val_items) != len(yv) or yv.shape[1] != classes:
        raise ValueError(f"{len(val_items)} validation items and labels {yv.shape} do not "
                         f"match each other or the {classes} train classes")
    check_val_labels(yv, convention)
    return val_items, yv


def _forward_dtype(config: TrainConfig, tuning: "FinetuneOptions", device: torch.device):
    """The autocast dtype of the model's forward (None: float32): ``config.amp``'s on CUDA,
    bfloat16 on a CPU with ``tuning.cpu_bf16`` (the loss stays float32); a warning when
    ``config.amp`` asks for it off CUDA."""
    amp = amp_dtype(config.amp, device)
    if amp is None and tuning.cpu_bf16 and device.type == "cpu":
        amp = torch.bfloat16
    elif config.amp in ("bf16", "fp16") and device.type != "cuda":
        warnings.warn(f"amp={config.amp!r} applies on CUDA only; this {device.type} run is "
                      f"float32", stacklevel=3)  # (fit_finetune's caller)
    return amp


#: the learning-rate schedules after the warm-up (`FinetuneOptions`)
LR_SCHEDULES = ("constant", "cosine")


@dataclass
class FinetuneOptions:
    """What a timm user expects of fine-tuning beyond
    [`TrainConfig`][spmlkit.engine.config.TrainConfig]; every default leaves a run exactly as
    before.

    - ``weight_decay``: decoupled (AdamW-style) decay, ``w <- w * (1 - lr_group * weight_decay)``
      after every optimiser step, on weights only (tensors of 2+ dimensions: convolutions and
      linear layers; biases and normalisation parameters are not decayed, as timm's default);
      0 = off (Cole et al.'s Adam has none);
    - ``warmup_epochs``: the learning rate rises linearly from ``1 / warmup_steps`` of its value
      to its value over this many epochs (counted in steps: every batch moves it);
    - ``schedule``: after the warm-up, ``"constant"`` (default) or ``"cosine"`` (to 0 at the last
      step); each parameter group keeps its ratio (the head's ``head_lr_mult``);
    - ``cpu_bf16``: on a CPU, run the model's training forward under bfloat16 autocast (the
      loss and the val / test predictions stay float32; results differ from float32 runs).
      It pays only on CPUs with native bfloat16 (AVX-512-BF16 / AMX); on one without
      (spmlkit's 2-core test machine) an EfficientNet-Lite0 step at batch 8 took 1.11x as long
      as in float32, hence off by default. CUDA runs use ``TrainConfig.amp``.
    """

    weight_decay: float = 0.0
    warmup_epochs: float = 0.0
    schedule: str = "constant"
    cpu_bf16: bool = False

    #: what each field accepts (`spmlkit.constraints`; ``spml train`` reads it too)
    parameter_constraints: ClassVar[dict] = {
        "weight_decay": Interval(float, 0), "warmup_epochs": Interval(float, 0),
        "schedule": Options(LR_SCHEDULES), "cpu_bf16": Boolean()}

    def __post_init__(self):
        check_record(self)

    @property
    def schedules(self) -> bool:
        return self.warmup_epochs > 0 or self.schedule != "constant"

    def lr_factor(self, step: int, total: int, per_epoch: int) -> float:
        """The learning rate's factor at 0-based ``step`` of ``total``.

        >>> o = FinetuneOptions(warmup_epochs=1, schedule="cosine")
        >>> [round(o.lr_factor(s, 6, 2), 3) for s in range(6)]
        [0.5, 1.0, 1.0, 0.75, 0.25, 0.0]
        """
        warm = int(round(self.warmup_epochs * per_epoch))
        if step < warm:
            return (step + 1) / warm
        if self.schedule == "constant":
            return 1.0
        rest = max(total - warm - 1, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(step - warm, rest) / rest))


def group_lrs(opt) -> list[float]:
    """The learning rate of each parameter group (LeanAdam or a torch optimiser)."""
    groups = getattr(opt, "groups", None)
    if groups is None:
        groups = opt.param_groups
    return [float(g["lr"]) for g in groups]


def set_lr(opt, base: Sequence[float], factor: float) -> None:
    """Every group's learning rate to ``base * factor``."""
    groups = getattr(opt, "groups", None)
    if groups is None:
        groups = opt.param_groups
    for g, lr in zip(groups, base):
        g["lr"] = lr * factor


class WeightDecay(StepHook):
    """Decoupled weight decay after each optimiser step (`FinetuneOptions`)."""

    def __init__(self, model: nn.Module, opt, weight_decay: float):
        self.opt, self.weight_decay = opt, float(weight_decay)
        decayed = {id(p) for p in model.parameters() if p.ndim >= 2}
        groups = getattr(opt, "groups", None) or opt.param_groups
        self.groups = [(g, [p for p in g["params"] if id(p) in decayed]) for g in groups]

    @torch.no_grad()
    def after_step(self, batch) -> None:
        for g, params in self.groups:
            if params:
                torch._foreach_mul_(params, 1.0 - g["lr"] * self.weight_decay)


def predict_items(model: nn.Module, items: Sequence, config: TrainConfig, *,
                  transform: Callable | None = None,
                  image_reader: Callable | None = None, out=None) -> torch.Tensor:
    """Eval-mode outputs (float32, on ``config.device``) of ``model`` on every image item, in
    row order; gathered across processes when running under ``torchrun``. ``transform``
    defaults to the eval transform at the model's size, mean and std. ``out``: a writable
    N x ... numpy array (a memory map of a file) the outputs are written into batch by batch
    and which is returned (one process only;
    `ItemPredictor`)."""
    ctx = dist_utils.current_context(config.device)
    _, eval_t, shape = _transforms(model, config, None, transform, train=False)
    model = model.to(ctx.device)
    return ItemPredictor(check_items(items, "items"), eval_t, config, shape, ctx.device,
                         image_reader, ctx)(model, out=out)


# ---- linear_init ------------------------------------------------------------------------------
def fit_linear_init(model: nn.Module, train_items: Sequence, observed, loss: SPMLLoss,
                    config: TrainConfig, *, linear_config: TrainConfig | None = None,
                    train_features=None, val_features=None, val_items: Sequence | None = None,
                    y_val=None, k: float | None = None,
                    on_epoch: Callable[..., None] | None = None,
                    train_transform: Callable | None = None,
                    eval_transform: Callable | None = None,
                    image_reader: Callable | None = None,
                    checkpoint: Callable[[Callable[[], dict]], None] | None = None,
                    resume: dict | None = None,
                    tuning: FinetuneOptions | None = None) -> tuple[nn.Module, FitResult]:
    """Cole et al.'s ``linear_init``: a linear phase on cached features, then fine-tuning from
    that head, with the same loss object (ROLE's label estimator continues).

    Phase 1 is `fit_linear` on ``train_features`` / ``val_features`` (the frozen
    backbone's pooled features of the eval-transformed images, e.g. from the feature store;
    computed here with ``model.backbone`` when not given) with ``linear_config`` (default
    ``config`` with Cole's 25 linear epochs). Its best head is copied into ``model.head`` and
    phase 2 is `fit_finetune` with ``config``. ``loss`` goes from one phase to the next
    as it is: a loss whose ``on_train_start`` keeps state that fits the same labels (ROLE's
    ``label_logits``, LL-Cp's flips, soft OPML's AP and corrections, em_apl's pseudo-labels)
    continues from the linear phase's best epoch. The optimiser starts afresh (Adam moments are
    not carried over).

    ``on_epoch`` records carry ``"phase": "linear"`` or ``"finetune"``.

    Checkpoint and resume: ``checkpoint(state_fn)`` after every epoch of either phase (process
    0 only); ``state_fn()`` returns ``{"format", "phase": "linear" | "finetune", "state": the
    phase's train-loop state}`` and, in the fine-tuning phase, ``"linear_result"`` (the linear
    phase's `FitResult` as a dict). ``resume=`` such a state continues in its phase (a
    fine-tuning phase neither computes features nor runs the linear phase again), with the
    uninterrupted run's result.

    Returns:
        ``(model, result)``: the fine-tuning phase's `FitResult`, with the linear
        phase's in ``result.linear``.
    """
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear):
        raise ValueError(f"linear_init copies a linear head into model.head; "
                         f"{type(model).__name__} has no nn.Linear `head` (use "
                         f"spmlkit.models.heads.ImageClassifier)")
    phase = None
    if resume is not None:
        found = resume.get("format") if isinstance(resume, dict) else type(resume).__name__
        phase = resume.get("phase") if isinstance(resume, dict) else None
        if found != LINEAR_INIT_FORMAT or phase not in ("linear", "finetune"):
            raise ValueError(f"resume: not a linear_init state (format {found!r}, phase "
                             f"{phase!r}; expected format {LINEAR_INIT_FORMAT!r} and phase "
                             f"'linear' or 'finetune'): pass what fit_linear_init's checkpoint "
                             f"state function returned")
    has_val = val_items is not None and y_val is not None

    def tagged(phase):
        def call(record, m, lo):
            if on_epoch is not None:
                on_epoch({**record, "phase": phase}, m, lo)
        return call

    def saving(phase, **extra):
        if checkpoint is None:
            return None
        return lambda state_fn: checkpoint(lambda: {"format": LINEAR_INIT_FORMAT,
                                                    "phase": phase, **extra,
                                                    "state": state_fn()})

    is_main = dist_utils.current_context(config.device).is_main
    if phase == "finetune":
        lin_result = FitResult.from_dict(resume["linear_result"])
    else:
        train_features, val_features = _linear_init_features(
            model, head, train_items, val_items if has_val else None, config, train_features,
            val_features, eval_transform, image_reader)
        linear_config = linear_config or TrainConfig(**{**asdict(config), "epochs": 25})
        lin_config = TrainConfig(**{**asdict(linear_config), "device": config.device})
        linear_head, lin_result = fit_linear(
            train_features, observed, loss, lin_config,
            x_val=val_features if has_val else None, y_val=y_val if has_val else None, k=k,
            on_epoch=tagged("linear") if is_main else None,
            checkpoint=saving("linear") if is_main else None,
            resume=resume["state"] if phase == "linear" else None)
        with torch.no_grad():
            head.weight.copy_(linear_head.weight.to(head.weight))
            head.bias.copy_(linear_head.bias.to(head.bias))
        carry_state(loss)  # fine-tuning continues the linear phase's loss (ROLE's estimates)
    model, result = fit_finetune(model, train_items, observed, loss, config, val_items=val_items,
                                 y_val=y_val, k=k, on_epoch=tagged("finetune"),
                                 train_transform=train_transform, eval_transform=eval_transform,
                                 image_reader=image_reader,
                                 checkpoint=saving("finetune",
                                                   linear_result=snapshot(lin_result.to_dict())),
                                 resume=resume["state"] if phase == "finetune" else None,
                                 tuning=tuning)
    result.linear = lin_result
    return model, result


def _linear_init_features(model, head, train_items, val_items, config, train_features,
                          val_features, eval_transform, image_reader):
    """The linear phase's train / val features: as given, else the backbone's pooled features
    of the eval-transformed images; checked against the head's width."""
    if train_features is None or (val_items is not None and val_features is None):
        backbone = getattr(model, "backbone", None)
        if not isinstance(backbone, nn.Module):
            raise ValueError("linear_init without features needs model.backbone to compute them")
        _, eval_t, _ = _transforms(model, config, None, eval_transform, train=False)
        if train_features is None:
            train_features = _backbone_features(backbone, train_items, head.in_features,
                                                config, eval_t, image_reader, "train")
        if val_items is not None and val_features is None:
            val_features = _backbone_features(backbone, val_items, head.in_features, config,
                                              eval_t, image_reader, "validation")
    width = int(np.shape(train_features)[1]) if np.ndim(train_features) == 2 else -1
    if width != head.in_features:
        raise ValueError(f"train features of shape {tuple(np.shape(train_features))} do not fit "
                         f"model.head ({head.in_features} inputs): compute them with this "
                         f"model's backbone")
    return train_features, val_features


def _backbone_features(backbone: nn.Module, items, width: int, config: TrainConfig, eval_t,
                       image_reader, what: str):
    """The backbone's pooled features of ``items`` for the linear phase, written batch by batch
    into a memory map of a nameless temporary file in the feature cache's folder
    (`spmlkit.machine.default_cache_dir`: on disk, where /tmp may be memory; the file is
    gone when the map is let go), so the N x D float32 features of a large image set are read
    by the linear engine chunk by chunk (`spmlkit.data.rows`) and never held in memory.
    Under ``torchrun`` (every process needs every row) they are gathered in memory instead."""
    if dist_utils.current_context(config.device).world_size > 1:
        return predict_items(backbone, items, config, transform=eval_t,
                             image_reader=image_reader).cpu()
    import tempfile

    from ..data.rows import nonfinite_rows
    from ..machine import default_cache_dir

    n = len(check_items(items, f"{what} items"))
    given = getattr(backbone, "num_features", None)
    if isinstance(given, int) and given != width:
        raise ValueError(f"{what} features of shape ({n}, {given}) do not fit model.head "
                         f"({width} inputs): compute them with this model's backbone")
    folder = default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(prefix="spmlkit-features-", dir=folder) as f:
        from ..safe_write import preallocate

        preallocate(f.fileno(), 4 * max(n, 1) * width, folder / "spmlkit-features-(temporary)")
        store = np.memmap(f, dtype=np.float32, mode="w+", shape=(max(n, 1), width))[:n]
    predict_items(backbone, items, config, transform=eval_t, image_reader=image_reader,
                  out=store)
    bad = nonfinite_rows(store)
    if len(bad):
        raise ValueError(f"{what} features hold NaN or inf (first rows: {bad[:5].tolist()})")
    return store
