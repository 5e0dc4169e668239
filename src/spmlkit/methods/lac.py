"""LAC (Xie, Xiao, Huang, NeurIPS 2022) as a runnable, resumable two-stage recipe.

"Label-Aware Global Consistency for Multi-Label Learning with Single Positive Labels"
(NeurIPS 2022; docs/spec.md#lac). The model is a backbone feature map
through a label-wise embedding head (`spmlkit.models.LabelEmbeddingModel`); every train
image is seen in a weak view ``w`` (flip + resize) and a strong view ``s`` (Cutout,
RandAugment, colour jitter, grayscale; `spmlkit.data.transforms`). With ``z_obs`` the
observed labels and ``h`` the label-wise embeddings::

    stage 1 (delta1):  base(z_w) + lambda_plc * PLC(z_s | z_w, z_obs, delta1)
    stage 2 (delta2):  base(z_w) + lambda_plc * PLC(z_s | z_w, z_obs, delta2)
                                 + lambda_lac * LAC(proj(h_w), proj(h_s), positives, queue)

``base`` is any registered SPML loss on the weak view's logits (default ``an``, the paper's;
every other loss on this model gives the paper's "LEM" columns). PLC and LAC are
`spmlkit.losses.lac.plc_loss` and `spmlkit.losses.lac.lac_loss`; LAC's positive
entries are the observed positives and the pseudo-positives of the stage's delta; as in the
authors' ``second_stage.train`` (pinned by ``tests/test_lac_official.py``), each step first
writes them (both views) into the memory queue (`spmlkit.losses.lac.LACQueue`) and then
takes every valid queue item's two views as the anchors (`spmlkit.losses.lac.lac_term`).
Stage 2 starts from stage 1's best weights (the better of the model and its EMA on val), adds
the projection head (frozen, i.e. not optimised, in stage 1) and LAC, with a fresh AdamW,
OneCycle schedule, EMA and queue (empty at the start of stage 2, as the official second stage's;
it then lives across the stage's epochs); the base loss's own state (ROLE's estimator ...)
carries over from stage 1's best epoch.

Each stage: AdamW (weight decay 0.01) with a per-step OneCycle schedule (max lr 1e-4, 20 %
warm-up, cosine annealing, momentum cycled), an EMA of the weights (decay 0.9997) updated after
every step, and after every epoch both the model and the EMA scored on val (mAP); the epoch's
score is the better of the two, and the run keeps the best epoch over both stages (recording
whether the model or the EMA won). ``config.early_stop`` applies within each stage (stage 1
"until convergence").

Table 3 of the paper (the ablation) as configurations (`ABLATIONS`): ``an`` (no PLC, no
LAC: one stage), ``an_plc`` (one stage), ``an_plc_lac`` (two stages), and the two variants
``lac_end_to_end`` (LAC from the first epoch, one stage) and ``no_queue`` (queue_size 0).

Views (``LACConfig.views``):

- ``"cached"`` (the default; for a CPU): the backbone is frozen and its feature maps are
  computed once per view and stored memory-mapped (`spmlkit.features.extract_feature_maps`,
  float16, resumable, shared by every later run with the same backbone, size and images):
  ``weak_views`` draws of the weak view and ``strong_views`` draws of the strong view of every
  train image (view ``v`` seeded with ``v``), and the eval view of train / val / test. Each
  epoch every row takes one cached weak and one cached strong view, chosen from
  ``mix_seed(seed, epoch, row)``.
- ``"images"`` (end to end; for a GPU): images go through the weak and strong transforms at
  every step (``DataLoader`` workers, per-row generators seeded from ``(seed, epoch, row)``),
  the backbone trainable (``train_backbone=True``, BatchNorm frozen as the authors' ResNet) or
  frozen; autocast on CUDA (``config.amp``).

Randomness: the head's initialisation, the batch order and the view choice come from
``config.seed`` through explicit generators; dropout (which draws from torch's global RNG) runs
inside ``torch.random.fork_rng`` re-seeded from ``mix_seed(seed, epoch)`` every epoch, so the
caller's global RNG is left as it was and a resumed run repeats an uninterrupted one exactly.

The loop is the engine's (`spmlkit.engine.train_loop`): LAC is its stages (each stage's
set-up builds AdamW, OneCycle, the EMA and resets the queue; stage 2 starts from the best
weights), a step hook (PLC and LAC terms with the queue, schedule and EMA steps) and two evaluators
(the model and its EMA). `fit_lac` runs it on given views; the registered method (``lac``:
[`spmlkit.methods.train_run`][spmlkit.methods.train_run]) adds the run folder.

Resuming: after every epoch the run folder gets ``checkpoint.pt`` (written atomically, through
the loop's ``checkpoint=`` callback) with the loop's whole state: model, EMA, optimiser,
schedule, loss, queue, stage and epoch, the best weights so far with their score, the history
and the elapsed time; tensors, numbers and strings only, loaded with ``weights_only=True``
(`spmlkit.runs.load_torch`: a file holding pickled code is refused, nothing runs).
``train_run("lac", ..., resume=RUN_DIR)`` (``spml train --resume RUN_DIR``, or
`spmlkit.methods.resume_run`) continues in either stage and ends with the same weights and
metrics as a run that was never interrupted.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from dataclasses import asdict, dataclass
from typing import Callable, ClassVar

import numpy as np
import torch
from torch import nn

from ..constraints import Boolean, Interval
from ..data import Splits
from ..engine import (FitResult, GlobalBatchSampler, LossScaler, Stage, StageParts, StepBatch,
                      StepHook, TrainConfig, amp_dtype, check_val_labels, mix_seed, train_loop,
                      val_map)
from ..labels import validate_observed
from ..losses import TrainInfo
from ..losses.lac import LACQueue, lac_term, plc_loss, plc_targets
from ..models.ema import ModelEMA
from ..models.label_embedding import LabelEmbeddingModel
from .image_methods import (CachedMapViews, ImageViews, backbone_record, check_head_config,
                            config_fields, config_from_dict, config_from_options,
                            head_constraints, image_model_info, image_options,
                            rebuild_backbone, run_backbone, run_device, run_geometry,
                            smoke_image_options)

__all__ = ["ABLATIONS", "CHECKPOINT_FILE", "CONFIG_KEYS", "LACConfig", "ablation_config",
           "config_of", "fit_lac", "id_options", "lac_model_from_checkpoint", "upgrade_options"]

CHECKPOINT_FILE = "checkpoint.pt"
#: the paper's batch size, OneCycle max learning rate and epoch budget (section 4.1)
OFFICIAL_BATCH_SIZE, OFFICIAL_LR, OFFICIAL_EPOCHS = 32, 1e-4, 40
VIEWS = ("cached", "images")

#: Table 3 of the paper as LACConfig overrides
ABLATIONS = {
    "an": {"plc": False, "lac": False},
    "an_plc": {"plc": True, "lac": False},
    "an_plc_lac": {"plc": True, "lac": True, "two_stage": True},
    "lac_end_to_end": {"plc": True, "lac": True, "two_stage": False},
    "no_queue": {"plc": True, "lac": True, "two_stage": True, "queue_size": 0},
}


# ---- configuration -----------------------------------------------------------------------------
#: the largest sizes LACConfig takes (a typo such as dim=100000000 would allocate first)
_LAC_MAX = {"dim": 8192, "heads": 256, "encoder_layers": 64, "decoder_layers": 64,
            "proj_dim": 8192, "queue_size": 10_000_000, "weak_views": 64, "strong_views": 64,
            "ffn": 65536}
_TOO_LARGE = "a size; the paper's is far smaller"


@dataclass
class LACConfig:
    """LAC's hyperparameters, validated; defaults are the paper's / the authors' code's.

    Label-wise embedding head (`spmlkit.models.LabelEmbeddingHead`):

    - ``dim`` (256; official 2048 = ResNet-50's channels), ``heads`` (4), ``ffn`` (None: 4 *
      dim; official 8192), ``dropout`` (0.1), ``encoder_layers`` (1), ``decoder_layers`` (2),
      ``proj_dim`` (128, the projection head's output).

    Regularisers and the ablation switches (Table 3; `ABLATIONS`):

    - ``plc`` (True): the PLC term; ``lambda_plc`` (1.0); ``delta1`` (0.6, stage 1),
      ``delta2`` (0.9, stage 2), both in [0.5, 1] (the paper searches 0.5 .. 0.9);
    - ``lac`` (True): the LAC term, in a second stage when ``two_stage`` (True; False puts LAC
      in the one stage from the first epoch, the paper's "end-to-end" row, with ``delta1``);
      ``lambda_lac`` (1.0), ``temperature`` (0.5), ``queue_size`` (512; 0 = no queue: the
      anchors are the batch's own positive entries). Without ``lac`` there is one stage.

    Schedule (per stage): ``stage1_epochs`` / ``stage2_epochs`` (None: ``config.epochs``
    split in two, stage 1 taking the larger half; one stage takes all; official 40 epochs in
    all with early stopping), ``batch_size`` / ``lr`` (None: the run's
    [`spmlkit.engine.TrainConfig`][spmlkit.engine.TrainConfig] values, so a study grid selects over
    them; official 32 and 1e-4, the OneCycle max lr), ``weight_decay`` (0.01, AdamW), ``pct_start``
    (0.2, OneCycle warm-up fraction), ``ema_decay`` (0.9997; with a few hundred steps per run, as on
    a CPU, an EMA that slow barely leaves its start: use e.g. 0.99 there).

    Views: ``views`` (``"cached"``: frozen backbone + cached feature maps; ``"images"``: end
    to end), ``weak_views`` (2) and ``strong_views`` (4) cached draws per train image,
    ``map_dtype`` (``"float16"``) of the cached maps, ``train_backbone`` (False; images only:
    fine-tune the backbone with its BatchNorm frozen, as the authors).

    Raises:
        ValueError: a value out of range (the message names the field), or an unknown field
            in `from_dict`.

    >>> LACConfig(**ABLATIONS["an_plc_lac"]).stages(10)
    [(1, 5, 0.6), (2, 5, 0.9)]
    >>> LACConfig(plc=False, lac=False).stages(10)
    [(1, 10, 0.6)]
    """

    dim: int = 256
    heads: int = 4
    ffn: int | None = None
    dropout: float = 0.1
    encoder_layers: int = 1
    decoder_layers: int = 2
    proj_dim: int = 128
    plc: bool = True
    lac: bool = True
    two_stage: bool = True
    queue_size: int = 512
    temperature: float = 0.5
    lambda_plc: float = 1.0
    lambda_lac: float = 1.0
    delta1: float = 0.6
    delta2: float = 0.9
    stage1_epochs: int | None = None
    stage2_epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float = 0.01
    pct_start: float = 0.2
    ema_decay: float = 0.9997
    views: str = "cached"
    weak_views: int = 2
    strong_views: int = 4
    map_dtype: str = "float16"
    train_backbone: bool = False

    #: what each field accepts (`spmlkit.constraints`): the head's (`head_constraints`, with
    #: LAC's largest sizes) and LAC's own
    parameter_constraints: ClassVar[dict] = {
        **head_constraints(VIEWS, _LAC_MAX),
        "proj_dim": Interval(int, 1, _LAC_MAX["proj_dim"], too_large=_TOO_LARGE),
        "plc": Boolean(), "lac": Boolean(), "two_stage": Boolean(),
        "queue_size": Interval(int, 0, _LAC_MAX["queue_size"], too_large=_TOO_LARGE),
        "temperature": Interval(float, 0, None, closed="right"),
        "lambda_plc": Interval(float, 0), "lambda_lac": Interval(float, 0),
        "delta1": Interval(float, 0.5, 1), "delta2": Interval(float, 0.5, 1),
        "stage1_epochs": [Interval(int, 1), None], "stage2_epochs": [Interval(int, 1), None],
        "batch_size": [Interval(int, 1), None],
        "lr": [Interval(float, 0, None, closed="right"), None],
        "weight_decay": Interval(float, 0), "pct_start": Interval(float, 0, 1, closed="neither"),
        "ema_decay": Interval(float, 0, 1),
        "strong_views": Interval(int, 1, _LAC_MAX["strong_views"], too_large=_TOO_LARGE),
    }

    def __post_init__(self):
        check_head_config(self)
        if self.stage2_epochs is not None and self.num_stages == 1:
            raise ValueError(f"LACConfig.stage2_epochs needs a second stage (lac=True and "
                             f"two_stage=True), got {self.stage2_epochs!r}")

    @property
    def num_stages(self) -> int:
        return 2 if self.lac and self.two_stage else 1

    def head_kwargs(self) -> dict:
        """The `spmlkit.models.LabelEmbeddingHead` arguments."""
        return {"dim": self.dim, "heads": self.heads, "ffn": self.ffn, "dropout": self.dropout,
                "encoder_layers": self.encoder_layers, "decoder_layers": self.decoder_layers,
                "proj_dim": self.proj_dim}

    def stages(self, total_epochs: int) -> list[tuple[int, int, float]]:
        """``[(stage, epochs, delta), ...]`` for a run of ``total_epochs`` (used where the
        stage epochs are None)."""
        if self.num_stages == 1:
            return [(1, self.stage1_epochs or int(total_epochs), float(self.delta1))]
        s1, s2 = self.stage1_epochs, self.stage2_epochs
        if s1 is None and s2 is None:
            s1 = math.ceil(total_epochs / 2)
            s2 = int(total_epochs) - s1
        elif s1 is None:
            s1 = int(total_epochs) - s2
        elif s2 is None:
            s2 = int(total_epochs) - s1
        if s1 < 1 or s2 < 1:
            raise ValueError(f"LAC's two stages need at least one epoch each: {total_epochs} "
                             f"epochs in all give stage 1 {s1} and stage 2 {s2}; set more "
                             f"epochs or stage1_epochs / stage2_epochs")
        return [(1, int(s1), float(self.delta1)), (2, int(s2), float(self.delta2))]

    @classmethod
    def from_dict(cls, values: dict | None) -> "LACConfig":
        """A config from a dict of its fields; ``ablation=NAME`` applies `ABLATIONS`
        first; unknown keys raise (`spmlkit.methods.image_methods.config_from_dict`)."""
        return config_from_dict(cls, values, what="LAC", ablations=ABLATIONS)



#: LACConfig's fields: each a method option (None: the ablation's value, else the default)
CONFIG_KEYS = config_fields(LACConfig)


def upgrade_options(options: dict) -> dict:
    """LAC's options in their flat form: the nested ``lac={FIELD: VALUE, ...}`` of earlier
    versions (deprecated; study specs and run folders written with it still load) spread into
    the fields, where a flat field given beside it (not None) wins.

    Raises:
        ValueError: a nested key that is no LACConfig field.

    >>> upgrade_options({"lac": {"dim": 64, "lac": False}, "backbone": "tiny_cnn"})
    {'dim': 64, 'lac': False, 'backbone': 'tiny_cnn'}
    """
    nested = options.get("lac")
    if not isinstance(nested, dict):
        return options
    unknown = sorted(set(nested) - {*CONFIG_KEYS, "ablation"})
    if unknown:
        raise ValueError(f"unknown LAC option(s) {unknown} in lac={{...}}; known: ablation, "
                         f"{', '.join(sorted(CONFIG_KEYS))}")
    rest = {k: v for k, v in options.items() if k != "lac" and (v is not None or k not in nested)}
    return {**nested, **rest}


def config_of(options: dict, **fields) -> LACConfig:
    """The run's `LACConfig` from the method's options (``--option KEY=VALUE``, a
    study's ``mode_options``): ``ablation`` (a name of `ABLATIONS`) and every field not
    None there (`upgrade_options` reads the deprecated nested form), ``fields`` on top."""
    return config_from_options(LACConfig, upgrade_options(options), what="LAC",
                               ablations=ABLATIONS, more=fields)


def id_options(options: dict) -> dict:
    """LAC's options as a study's run id hashes them: its LACConfig fields (and ``ablation``)
    nested under ``lac``, the spelling the ids were first given out with, so that a study's ids
    stay what they were before the options went flat; the other options as they are.

    >>> id_options({"backbone": "tiny_cnn", "dim": 64, "lac": False})
    {'backbone': 'tiny_cnn', 'lac': {'dim': 64, 'lac': False}}
    """
    options = upgrade_options(options)
    own = {k: v for k, v in options.items() if k in CONFIG_KEYS or k == "ablation"}
    return {**{k: v for k, v in options.items() if k not in own}, **({"lac": own} if own else {})}


def ablation_config(name: str, **overrides) -> LACConfig:
    """The Table-3 row ``name`` (`ABLATIONS`) with ``overrides`` on top.

    >>> ablation_config("an").num_stages, ablation_config("an_plc_lac").num_stages
    (1, 2)
    """
    return LACConfig.from_dict({"ablation": name, **overrides})


def resolve_train_config(config: TrainConfig | None, lac: LACConfig) -> TrainConfig:
    """The run's TrainConfig: ``config`` (default: the paper's 40 epochs, batch 32, lr 1e-4)
    with LACConfig's ``batch_size`` / ``lr`` on top where set, and ``epochs`` the sum of the
    stages."""
    config = config or TrainConfig(epochs=OFFICIAL_EPOCHS, batch_size=OFFICIAL_BATCH_SIZE,
                                   lr=OFFICIAL_LR)
    total = sum(e for _, e, _ in lac.stages(config.epochs))
    return dataclasses.replace(config, epochs=total,
                               batch_size=lac.batch_size or config.batch_size,
                               lr=lac.lr or config.lr)


# ---- LAC on the engine's loop ------------------------------------------------------------------
def _state(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class _EMAView(nn.Module):
    """The model's (frozen or absent) backbone with the EMA's head: what the EMA predicts
    when it tracks the head only. Holds references, owns nothing."""

    def __init__(self, model: LabelEmbeddingModel, head: nn.Module):
        super().__init__()
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_head", head)

    def forward(self, x):
        with torch.no_grad():
            return self._head(self._model.features(x))


class _LACStep(StepHook):
    """LAC's per-step additions to the base loss, on the weak view's logits ``lw`` and the
    strong view's ``ls``, the label-wise embeddings ``ew`` / ``es`` (the batch's extras)::

        + lambda_plc * PLC(ls | lw, observed, delta)          (lac.plc)
        + lambda_lac * LAC(proj(ew), proj(es), positives, queue)   (this stage's LAC)

    (the queue is written before the LAC term, `spmlkit.losses.lac.lac_term`); after
    the optimiser step, the OneCycle step and the EMA update. The
    epoch's record gets the mean base / PLC / LAC losses, the pseudo-positives PLC found on
    unobserved entries (``pl_count``) and the fraction of them that are true positives
    (``pl_precision`` in [0, 1], as `spmlkit.metrics.pseudo_label_stats`; NaN when
    none), the queue's fill and the learning rate of the epoch's last step."""

    def __init__(self, recipe: "_LACRecipe", lac_on: bool, delta: float, opt, sched, ema):
        self.recipe, self.lac, self.lac_on, self.delta = recipe, recipe.lac, lac_on, delta
        self.opt, self.sched, self.ema = opt, sched, ema
        self.queue = recipe.queue

    def on_epoch_start(self, epoch: int) -> None:
        self.sums = {"base_loss": 0.0, "plc_loss": 0.0, "lac_loss": 0.0}
        self.pl_count = self.pl_true = 0
        self.last_lr = float("nan")

    def terms(self, batch: StepBatch):
        lac, delta, obs = self.lac, self.delta, batch.observed
        lw = batch.logits
        ls, ew, es = batch.extras
        out = []
        self.parts = {"base_loss": batch.value}
        if lac.plc or self.lac_on:
            targets, _ = plc_targets(lw, obs, delta)
            positive = targets.bool()
            new = positive & (obs == 0)
            self.pl_count += int(new.sum())
            self.pl_true += int((new & self.recipe.y_train[batch.index]).sum())
        if lac.plc:
            p = plc_loss(ls, lw, obs, delta)
            out.append((lac.lambda_plc, p))
            self.parts["plc_loss"] = p
        if self.lac_on:
            with self.recipe.autocast():
                pw, ps = self.recipe.model.head.project(ew), self.recipe.model.head.project(es)
            c = lac_term(pw.float(), ps.float(), positive, self.queue, lac.temperature)
            out.append((lac.lambda_lac, c))
            self.parts["lac_loss"] = c
        return out

    def after_step(self, batch: StepBatch) -> None:
        self.last_lr = float(self.opt.param_groups[0]["lr"])  # this step's
        self.sched.step()
        model = self.recipe.model
        self.ema.update(model.head if self.recipe.ema_head_only else model)
        b = len(batch.index)
        for key, value in self.parts.items():
            self.sums[key] += float(value.detach()) * b

    def epoch_record(self) -> dict:
        n, lac = self.recipe.sampler.rows_per_epoch, self.lac
        record = {"base_loss": self.sums["base_loss"] / n}
        if lac.plc:
            record["plc_loss"] = self.sums["plc_loss"] / n
        if self.lac_on:
            record["lac_loss"] = self.sums["lac_loss"] / n
        if lac.plc or self.lac_on:
            record["pl_count"] = self.pl_count
            record["pl_precision"] = self.pl_true / self.pl_count if self.pl_count \
                else float("nan")
        if self.queue is not None and self.lac_on:
            record["queue"] = len(self.queue)
        record["lr"] = self.last_lr
        return record


class _LACRecipe:
    """LAC as stages, step hooks and evaluators of `spmlkit.engine.train_loop`.

    Each stage's set-up builds AdamW (weight decay on the model; the loss's own state at
    ``lr * loss.lr_multiplier`` without), the per-step OneCycle schedule, a fresh EMA of what
    trains (the head, or the whole model when the backbone trains), the fp16 loss scaler
    (CUDA), and resets the queue; the projection head trains only in a stage with LAC. Stage
    2 starts from the best weights so far (model or EMA) and loss state. The evaluators are
    the model and its EMA on val.
    """

    def __init__(self, model: LabelEmbeddingModel, loss, views, z, y_train, y_val,
                 lac: LACConfig, config: TrainConfig, stages, device):
        self.model, self.loss, self.views, self.z = model, loss, views, z
        self.y_train = torch.as_tensor(np.asarray(y_train) > 0).to(device)
        self.y_val = y_val
        self.lac, self.config, self.stages, self.device = lac, config, stages, device
        self.n = int(z.shape[0])
        self.amp = amp_dtype(config.amp, device)
        self.sampler = GlobalBatchSampler(self.n, config.batch_size, config.seed,
                                          drop_last=config.drop_last)
        self.steps_per_epoch = len(self.sampler)
        self.queue = LACQueue(lac.queue_size, lac.proj_dim).to(device) \
            if lac.queue_size > 0 else None
        # the EMA tracks what trains: the head, or the whole model when the backbone trains (a
        # frozen backbone's EMA would only pick up rounding, and double the memory)
        self.ema_head_only = model.backbone is None or model.freeze_backbone
        self.ema: ModelEMA | None = None

    def lac_on(self, stage: int) -> bool:
        return self.lac.lac and (stage == 2 or not self.lac.two_stage)

    def loop_stages(self) -> list[Stage]:
        return [Stage(epochs, functools.partial(self.setup, i), name=stage,
                      info={"delta": delta}, from_best=i > 0)
                for i, (stage, epochs, delta) in enumerate(self.stages)]

    def setup(self, index: int) -> StageParts:
        stage, epochs, delta = self.stages[index]
        lac_on = self.lac_on(stage)
        projector = {id(p) for p in self.model.head.projector.parameters()}
        params = [p for p in self.model.parameters()
                  if p.requires_grad and (lac_on or id(p) not in projector)]
        groups = [{"params": params, "lr": self.config.lr,
                   "weight_decay": self.lac.weight_decay}]
        own = [p for p in self.loss.parameters() if p.requires_grad]
        if own:
            groups.append({"params": own, "lr": self.config.lr * self.loss.lr_multiplier,
                           "weight_decay": 0.0})
        opt = torch.optim.AdamW(groups, lr=self.config.lr, weight_decay=self.lac.weight_decay)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=[g["lr"] for g in groups], total_steps=self.steps_per_epoch * epochs,
            pct_start=self.lac.pct_start)
        self.ema = ModelEMA(self.model.head if self.ema_head_only else self.model,
                            self.lac.ema_decay)
        if self.queue is not None:
            self.queue.reset()
        state = {"scheduler": sched, "ema": self.ema}
        if self.queue is not None:
            state["queue"] = self.queue
        step = None
        if self.amp == torch.float16:
            scaler = LossScaler(params + own)
            state["scaler"] = scaler
            step = functools.partial(scaler.step, optimizer=opt)
        strong = self.lac.plc or lac_on
        return StageParts(opt, step=step,
                          hooks=[_LACStep(self, lac_on, delta, opt, sched, self.ema)],
                          state=state, batches=functools.partial(self.batches, strong=strong),
                          forward=functools.partial(self.forward, strong=strong))

    # -- steps -------------------------------------------------------------------------------
    def autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp)

    def batches(self, epoch: int, strong: bool):
        """``((weak, strong or None), observed, index)`` of every batch of ``epoch``."""
        for weak, stro, rows in self.views.train_epoch(self.sampler.global_batches(epoch),
                                                       epoch, strong):
            idx = rows.to(self.device)
            yield (weak, stro), self.z[idx], idx

    def forward(self, inputs, obs, idx, strong: bool):
        """The weak view's float32 logits, and ``(ls, ew, es)`` for the step hook."""
        weak, stro = inputs
        b = len(idx)
        if strong:
            with self.autocast():
                logits, emb = self.model.forward_all(torch.cat([weak, stro]))
            return logits[:b].float(), obs, idx, (logits[b:].float(), emb[:b], emb[b:])
        with self.autocast():
            lw, ew = self.model.forward_all(weak)
        return lw.float(), obs, idx, (None, ew, None)

    # -- evaluation ----------------------------------------------------------------------------
    def ema_model(self) -> nn.Module:
        return _EMAView(self.model, self.ema.module) if self.ema_head_only else self.ema.module

    def val(self, module) -> float:
        return val_map(self.views.predict(module, "val"), self.y_val,
                       self.config.map_convention, self.config.metric)

    def evaluators(self) -> dict:
        return {"model": lambda: self.val(self.model), "ema": lambda: self.val(self.ema_model())}

    def weights(self, source: str) -> dict:
        """A copy of the whole model's state dict with the weights ``source`` scored."""
        if source != "ema":
            return _state(self.model)
        if not self.ema_head_only:
            return _state(self.ema.module)
        return {**_state(self.model), **{f"head.{k}": v for k, v in
                                         _state(self.ema.module).items()}}

    def train_logits(self) -> torch.Tensor:
        return self.views.predict(self.model, "train").to(self.device)


def fit_lac(model: LabelEmbeddingModel, loss, views, observed, y_train, y_val, lac: LACConfig,
            config: TrainConfig, *, k: float | None = None,
            on_epoch: Callable[..., None] | None = None,
            checkpoint: Callable[[Callable[[], dict]], None] | None = None,
            resume: dict | None = None) -> FitResult:
    """Train LAC's label-wise embedding model on the engine's loop; keep the best epoch.

    The loop of ``train_run("lac", ...)`` without the run folder: the stages of
    ``lac.stages(config.epochs)``, LAC's step hook, the model and its EMA as evaluators (the
    best epoch's weights are the winner's), ``config.early_stop`` within each stage, dropout
    seeded per epoch from ``mix_seed(config.seed, 0x1AC, epoch)``.

    Args:
        model: a `spmlkit.models.LabelEmbeddingModel` on the run's device.
        loss: the base SPML loss (``on_train_start`` is called here).
        views: `CachedMapViews` or `ImageViews` of the splits.
        observed: N x L observed train labels; ``y_train``: their full labels (PLC's
            ``pl_precision``); ``y_val``: the full val labels (selection).
        lac, config: the method's and the run's settings.
        k: expected positives per example, for the base loss.
        on_epoch: ``on_epoch(record, model, loss)`` after each epoch.
        checkpoint, resume: as `spmlkit.engine.fit_linear`: ``checkpoint(state_fn)``
            after every epoch, ``state_fn()`` the whole resumable state (model, loss, AdamW,
            OneCycle, EMA, queue, loss scaler, stage and epoch, best weights, history, time;
            it loads with ``torch.load(weights_only=True)``), and ``resume=`` such a state to
            continue in either stage with the uninterrupted run's result.

    Returns:
        the `spmlkit.engine.FitResult` (``best_stage``, ``best_source``: ``"model"``
        or ``"ema"``); ``model`` and ``loss`` hold the best epoch's state.
    """
    if loss.row_parameters():
        raise ValueError(f"--mode lac: {type(loss).__name__}'s own state has row-wise (sparse) "
                         f"gradients (ROLE's estimator_update='rows'), which LAC's AdamW with "
                         f"its OneCycle schedule does not step: leave estimator_update at "
                         f"'dense' here ('rows' is for the modes that train with Adam: linear, "
                         f"finetune, linear_init, boostlu)")
    device = next(model.parameters()).device
    z = torch.as_tensor(validate_observed(observed, "train observed labels")).to(device)
    check_val_labels(y_val, config.map_convention)
    stages = lac.stages(config.epochs)
    loss.on_train_start(z, TrainInfo(len(z), z.shape[1], k, config.seed, config.epochs))
    recipe = _LACRecipe(model, loss, views, z, y_train, y_val, lac, config, stages, device)
    return train_loop(model, loss, recipe.loop_stages(), num_examples=recipe.sampler.rows_per_epoch,
                      evaluators=recipe.evaluators(), weights=recipe.weights,
                      early_stop=config.early_stop, train_logits=recipe.train_logits,
                      on_epoch=on_epoch, checkpoint=checkpoint, resume=resume,
                      epoch_seed=lambda epoch: mix_seed(config.seed, 0x1AC, epoch),
                      metric=config.metric)


# ---- LAC as a training method (spmlkit.methods.train_run writes its run folder) ---------------
def _check_images(splits: Splits) -> None:
    x = splits.train.x
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        raise ValueError(f"dataset {splits.name!r} holds feature vectors ({x.shape[1]}-d), not "
                         f"images: LAC's label-wise embedding model needs an image source "
                         f"(spml list datasets) without a backbone in its options; the "
                         f"backbone is LAC's own (backbone=...)")


def run_config(ctx) -> dict:
    """LAC's entries of ``config.json``: the backbone, the input geometry, LACConfig, stages."""
    lac = config_of(ctx.options)
    return {**backbone_record(ctx), "lac": asdict(lac),
            "stages": [list(s) for s in lac.stages(ctx.config.epochs)]}


def fit(ctx):
    """LAC's fit for [`spmlkit.methods.train_run`][spmlkit.methods.train_run]: views (cached feature
    maps or images),
    the label-wise embedding model, `fit_lac`; the best epoch's predictions."""
    from .contract import Fitted

    splits, config, o = ctx.splits, ctx.config, ctx.options
    _check_images(splits)
    lac = config_of(o)
    device = run_device(config)
    net, name = run_backbone(ctx)
    size, mean, std = run_geometry(ctx)
    if lac.views == "cached":
        views = CachedMapViews(splits, net, size, weak_views=lac.weak_views,
                               strong_views=lac.strong_views, map_dtype=lac.map_dtype,
                               seed=config.seed, device=device, cache_dir=o["cache_dir"],
                               progress=o["progress"], **(o["features"] or {}))
        model = LabelEmbeddingModel(None, len(splits.class_names),
                                    in_channels=views.in_channels, seed=config.seed,
                                    **lac.head_kwargs())
    else:
        views = ImageViews(splits, size, mean, std, config, seed=config.seed, device=device,
                           image_reader=o["image_reader"])
        model = LabelEmbeddingModel(net, len(splits.class_names),
                                    freeze_backbone=not lac.train_backbone,
                                    freeze_batchnorm=lac.train_backbone, seed=config.seed,
                                    **lac.head_kwargs())
    channels_last = device.type == "cuda" and config.channels_last and lac.views == "images"
    model = model.to(device, memory_format=torch.channels_last if channels_last
                     else torch.contiguous_format)
    loss = ctx.loss.to(device)
    try:
        result = fit_lac(model, loss, views, splits.observed, splits.train.y, splits.val.y,
                         lac, config, k=ctx.k, on_epoch=ctx.on_epoch,
                         checkpoint=ctx.checkpoint, resume=ctx.resume)
        # the best epoch's weights (fit_lac left them in the model) -> predictions
        probs = {s: torch.sigmoid(views.predict(model, s)).numpy()
                 for s in ("train", "val", "test")}
        views_info = views.describe()
    finally:
        views.close()
    stages = lac.stages(config.epochs)
    stage1 = [h["val_map"] for h in result.history if h["stage"] == 1 and "val_map" in h]
    extra = {"backbone": name, "best_stage": int(result.best_stage),
             "best_source": result.best_source,
             "stage_epochs": [sum(1 for h in result.history if h["stage"] == s)
                              for s, _, _ in stages],
             "stage1_val_map": max(stage1) if stage1 else float("nan"), "lac": asdict(lac),
             "views": views.kind, "image_size": size,
             "extract_seconds": round(float(getattr(views, "seconds", 0.0)), 3)}
    state = {n: t.detach().cpu().contiguous() for n, t in model.state_dict().items()}
    best = {"model": state, "views": views_info, **backbone_record(ctx),
            "in_channels": model.head.in_channels,
            "head": {**lac.head_kwargs(), "seed": config.seed},
            "best_epoch": int(result.best_epoch), "best_stage": int(result.best_stage),
            "best_source": result.best_source}
    return Fitted(result, probs, best, extra)


def lac_model_from_checkpoint(info: dict) -> LabelEmbeddingModel:
    """The model of a LAC ``best.pt`` dict, in eval mode on the CPU: the backbone rebuilt by
    name (with the run's own weights when it was trained end to end) and the head."""
    model = LabelEmbeddingModel(rebuild_backbone(info), info["num_classes"],
                                freeze_backbone=True, **info["head"])
    state = info["model"]
    if any(key.startswith("backbone.") for key in state):
        model.load_state_dict(state)
    else:
        model.head.load_state_dict({key[len("head."):]: v for key, v in state.items()})
    return model.eval()


# ---- registration ------------------------------------------------------------------------------
def _load_model(best: dict, config: dict):
    return lac_model_from_checkpoint(best), image_model_info(best)


from .contract import IMAGE_TRAIN_FIELDS, TrainingMethod, register_method  # noqa: E402

def baseline_cause(config: TrainConfig, options: dict) -> str:
    """Why a LAC run may end near the trivial baseline: the paper's learning rate on a short
    schedule (`spmlkit.methods.driver.baseline_warning`)."""
    lr = float(config.lr)
    if lr <= 1e-4:
        return (f"LAC's lr {lr:g} is the paper's OneCycle peak for 40 epochs on a GPU; on a "
                f"{int(config.epochs)}-epoch schedule it barely moves the model: try --lr 1e-3")
    return f"lr {lr:g} may be too large for LAC's label embeddings: try 1e-4 .. 1e-3"


LAC = register_method(TrainingMethod(
    name="lac", description="LAC: a label-wise embedding model on the backbone's feature maps, "
    "pseudo-label consistency, label-aware global consistency with a memory queue, two stages "
    "and an EMA",
    paper="Xie et al. 2022", inputs="images", fit=fit, load_model=_load_model,
    run_config=run_config,
    options={**{k: None for k in CONFIG_KEYS}, "ablation": None, **image_options()},
    default_batch_size=OFFICIAL_BATCH_SIZE, default_epochs=OFFICIAL_EPOCHS,
    default_lr=OFFICIAL_LR,
    default_lr_source="the OneCycle max lr of Xie et al. 2022",
    checkpoint_seconds=0.0, baseline_cause=baseline_cause, train_fields=IMAGE_TRAIN_FIELDS,
    resolve_config=lambda config, o: resolve_train_config(config, config_of(o)),
    id_options=id_options, check_values=config_of,
    smoke_options=smoke_image_options(dim=8, heads=2, ffn=16, proj_dim=8, queue_size=16,
                                      weak_views=2, strong_views=2, ema_decay=0.9)))
