"""``boostlu``: a CAM head with BoostLU on a backbone's feature map (Kim et al., CVPR 2023).

Kim, Kim, Jeong, Schmid, Akata, Lee, "Bridging the Gap between Model Explanations in Partially
Annotated Multi-label Classification" (CVPR 2023). Official code
``youngwk/BridgeGapExplanationPAMC`` at commit ``3f3fbaa2e129a5b5d3a3c28cbdaaeeffffb6f701``
(``models.py``, ``losses.py``, ``train.py``, ``config.py``), read for this implementation.

The model is a 1 x 1 convolution ``C -> L`` on the backbone's last feature map (the class
activation map, CAM, ``B x L x h x w``), **BoostLU** on the CAM, then global average pooling::

    logits_c = mean_{h, w} BoostLU(CAM_c)      BoostLU(x) = alpha * x if x > 0 else x

(`spmlkit.models.heads.BoostLUHead`; ``alpha`` official default 5). The official code
applies BoostLU inside the model's ``forward``, so in **training and at inference** (val
selection, test, ``spml predict``), and so do we. The option ``eval_alpha`` (default: ``alpha``)
sets another factor for eval mode, to separate the two (not in the official code: an
ablation; ``alpha=1, eval_alpha=5`` trains a plain CAM head and boosts only at inference).
The paper trains it with the large-loss methods of Kim et al. 2022, LL-R / LL-Ct / LL-Cp, on
the pooled logits: here the ``--loss`` (any registered loss; the paper's ``ll_r``, ``ll_ct``,
``ll_cp``, `spmlkit.losses.large_loss`) takes the head's logits, exactly as the official
``compute_batch_loss(model(image), ...)``; BoostLU + LL-R is ``--mode boostlu --loss ll_r``.

Official settings (``config.py``): ``alpha`` 5, ``delta_rel`` 0.5 % per epoch for LL-R, 0.2 for
LL-Ct, 0.1 for LL-Cp (``--hp delta_rel=...``; spmlkit's ``ll_r`` default is 0.2), Adam at lr 1e-5
for the ResNet-50 and 10x for the 1 x 1 convolution, batch 16, 10 epochs, backbone fine-tuned.

Inputs (option ``backbone``):

- an **image source** with ``backbone=NAME``: the frozen backbone's last feature maps (the
  deterministic eval view, ``C x h x w``; 1280 x 7 x 7 for EfficientNet-Lite0 at 224 px) are
  extracted once into the memory-mapped store of `spmlkit.features.extract_feature_maps`
  (float16 by default, ``map_dtype``; the same store as LAC's eval view) and the head trains on
  them;
- **feature vectors** (yeast, ``arrays``, cached pooled features): each vector is a ``1 x 1``
  map. Pooling one cell is the identity, so BoostLU then scales the positive logits of a linear
  head: ``logits = BoostLU(W x + b)``. Because BoostLU is increasing, this changes no ranking at
  inference; it changes training only (the loss and its gradient see the boosted logits). With
  ``alpha = 1`` the run is the linear mode's, bit for bit.

Deviations from the official code (deliberate, documented):

- The backbone is **frozen** and its feature maps cached (CPU-feasible); the official code
  fine-tunes a ResNet-50 (ResNet-101 on OpenImages) end to end with the head at 10x the lr. The
  official training images are augmented by its data pipeline; the cached maps are the eval
  view (no augmentation).
- Training follows spmlkit's protocol like every method here: the linear mode's Adam (no weight
  decay) on the head, epochs, batch size and lr from the run's config (``spml train`` default
  25 epochs, batch 8, lr 1e-3; the tables use Cole et al.'s grid), seeded initialisation and
  batch order, the epoch with the best val mAP kept. The official ``train.py`` is unseeded.
- The large-loss schedule is spmlkit's (`spmlkit.losses.large_loss`): ``k`` from the exact
  product rather than the official running ``clean_rate`` (``k_rounding="official"`` gives the
  drifting one), the top-k among unobserved entries only, ``k`` clamped. Unlike the 2022
  repository, this one compares the scheme with ``==`` (``P['largelossmod_scheme'] ==
  'LL-Cp'``), so its LL-Cp does flip labels, as spmlkit's ``ll_cp`` does; its flips are the
  entries ``>=`` the threshold (``flip="selected"``, spmlkit's default).

No bug of the official BoostLU operation or its pooling was found: ``torch.where(CAM > 0, CAM *
alpha, CAM)`` then ``F.adaptive_avg_pool2d(CAM, 1)`` is what the paper's Eq. 3 states; our
logits, loss and gradients match it to float rounding (tests/test_boostlu.py pins values
computed by the official functions).
"""
from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from ..metrics import is_partial
from ..engine import (GeneratorState, Stage, StageParts, TrainConfig, batch_starts,
                      check_val_labels, epoch_rows, make_optimizer, train_loop, val_map)
from ..data.rows import Rows, as_rows, holds_vectors, is_stored, read_rows
from ..labels import validate_full_labels, validate_observed
from ..losses import TrainInfo
from ..models.heads import BoostLUClassifier, BoostLUHead, check_alpha
from .contract import (IMAGE_TRAIN_FIELDS, Fitted, RunContext, TrainingMethod, feature_preprocess,
                       register_method)
from .image_methods import (MAP_DTYPES, EvalMapViews, backbone_record, image_model_info,
                            image_options, predict_rows, rebuild_backbone, run_backbone,
                            run_geometry, smoke_image_options)

#: the official default of ``--alpha`` (config.py)
OFFICIAL_ALPHA = 5.0
#: rows per forward pass when predicting from stored maps
PREDICT_CHUNK = 256


class MapRows:
    """The inputs of one split for the head: feature maps ``N x C x h x w`` (a memory-mapped
    store, read per batch and cast to float32) or feature vectors ``N x C`` (held as one float32
    tensor)."""

    def __init__(self, data, device: torch.device):
        self.device = device
        self.maps, self.x = None, None
        if isinstance(data, np.memmap) or (isinstance(data, np.ndarray) and data.ndim == 4):
            self.maps = data
        elif is_stored(data):  # stored feature vectors (checked finite when loaded): read per batch
            self.maps = as_rows(data)
        else:
            self.x = torch.as_tensor(np.asarray(data, np.float32)).to(device)
            if self.x.ndim != 2 or not torch.isfinite(self.x).all():
                raise ValueError(f"feature vectors must be a finite N x C matrix, got shape "
                                 f"{tuple(self.x.shape)}")

    def __len__(self) -> int:
        return len(self.maps) if self.maps is not None else len(self.x)

    @property
    def shape(self) -> tuple:
        """``(C, h, w)`` of one row (``(C, 1, 1)`` for vectors)."""
        if self.maps is not None:
            shape = tuple(int(v) for v in self.maps.shape[1:])
            return shape if len(shape) == 3 else (shape[0], 1, 1)
        return (int(self.x.shape[1]), 1, 1)

    def take(self, rows: torch.Tensor) -> torch.Tensor:
        """The rows ``rows`` (in that order) as float32 on the device."""
        if self.x is not None:
            return self.x[torch.as_tensor(rows).to(self.device)]
        rows = rows.cpu().numpy() if isinstance(rows, torch.Tensor) else rows
        out = self.maps.take(rows) if isinstance(self.maps, Rows) else read_rows(self.maps, rows)
        return torch.from_numpy(out).to(self.device)

    @torch.no_grad()
    def logits(self, model: nn.Module, chunk: int = PREDICT_CHUNK) -> torch.Tensor:
        """Eval-mode logits of every row, in row order (float32, on the device)."""
        return predict_rows(model, len(self), self.take, chunk, self.device)


def fit_boostlu(train: MapRows, observed, loss, config: TrainConfig, *, val: MapRows | None,
                y_val=None, alpha: float = OFFICIAL_ALPHA, eval_alpha: float | None = None,
                k: float | None = None, on_epoch=None, checkpoint=None,
                resume: dict | None = None) -> tuple[BoostLUHead, object]:
    """Train a `BoostLUHead` on stored feature maps (or vectors) with ``loss``; keep the
    epoch with the best val score.

    The linear mode's loop (`spmlkit.engine.fit_linear`) with the head in place of
    ``nn.Linear``: one permutation of the train rows per epoch from a generator seeded with
    ``config.seed``, Adam (`spmlkit.engine.make_optimizer`) at ``config.lr``, the loss's
    hooks, the engine's selection, checkpoints (``checkpoint(state_fn)``) and ``resume`` (a
    saved state: the uninterrupted run's result).

    Args:
        train: the train rows (`MapRows`); observed: their N x L observed labels.
        loss: the SPML loss (its ``on_train_start`` is called here).
        config: the run's [`TrainConfig`][spmlkit.engine.config.TrainConfig].
        val, y_val: the val rows and their full labels (None: the last epoch is kept).
        alpha: BoostLU's factor; eval_alpha: its factor in eval mode (default ``alpha``;
            `spmlkit.models.heads.BoostLUHead`).
        k: expected positives per example, for the loss.
        on_epoch, checkpoint, resume: as `spmlkit.engine.fit_linear`.

    Returns:
        ``(head, result)``: the head holds the best epoch's weights, ``loss`` its state.

    Raises:
        ValueError: observed labels that do not match the rows or their encoding, val labels
            without a positive, no epoch with a finite val score.
    """
    start = time.perf_counter()
    device = torch.device(config.device)
    z = torch.as_tensor(validate_observed(observed, "train observed labels")).to(device)
    n, num_classes = z.shape
    if len(train) != n:
        raise ValueError(f"the train split has {len(train)} rows and {n} observed label rows")
    has_val = val is not None and y_val is not None
    if has_val:
        y_val = y_val if is_partial(y_val) else validate_full_labels(y_val, "validation labels")
        check_val_labels(y_val, config.map_convention)
    head = BoostLUHead(train.shape[0], num_classes, alpha, seed=config.seed,
                       eval_alpha=eval_alpha).to(device)
    loss = loss.to(device)
    loss.on_train_start(z, TrainInfo(n, num_classes, k, config.seed, config.epochs))
    gen = torch.Generator().manual_seed(config.seed)
    bs = config.batch_size

    def batches(epoch):
        perm = torch.randperm(n, generator=gen)
        for i in batch_starts(n, bs, config.drop_last):
            idx = perm[i:i + bs]
            yield train.take(idx), z[idx.to(device)], idx.to(device)

    def evaluate():
        return val_map(val.logits(head), y_val, config.map_convention, config.metric)

    stage = Stage(config.epochs, lambda: StageParts(make_optimizer(head, loss, config.lr)))
    result = train_loop(head, loss, [stage], num_examples=epoch_rows(n, bs, config.drop_last),
                        batches=batches,
                        evaluators={"model": evaluate} if has_val else None,
                        early_stop=config.early_stop, train_logits=lambda: train.logits(head),
                        on_epoch=on_epoch, checkpoint=checkpoint, resume=resume,
                        state={"batch_order": GeneratorState(gen)}, start=start,
                        metric=config.metric)
    return head, result


# ---- the training method ---------------------------------------------------------------------
def _check(ctx) -> bool:
    """True for feature vectors (1 x 1 maps), False for an image source with a backbone."""
    vectors = holds_vectors(ctx.splits.train.x)
    given = ctx.options["backbone"]
    if vectors and given is not None:
        raise ValueError(f"dataset {ctx.splits.name!r} holds feature vectors, which --mode "
                         f"boostlu reads as 1 x 1 maps; backbone={given!r} is for image "
                         f"sources (their cached feature maps): drop it")
    if not vectors and given is None:
        raise ValueError(f"dataset {ctx.splits.name!r} holds images: --mode boostlu trains on "
                         f"a backbone's feature maps, give --backbone NAME (spml list "
                         f"backbones), e.g. efficientnet_lite0")
    return vectors


def check_values(options: dict) -> None:
    """BoostLU's option check (``TrainingMethod.check_values``): ``alpha`` and ``eval_alpha``
    (`check_alpha`), ``map_dtype`` one of `MAP_DTYPES`."""
    check_alpha(options["alpha"])
    if options["eval_alpha"] is not None:
        check_alpha(options["eval_alpha"])
    if options["map_dtype"] not in MAP_DTYPES:
        raise ValueError(f"map_dtype must be one of {MAP_DTYPES}, got "
                         f"{options['map_dtype']!r}")


def _eval_alpha(options) -> dict:
    """``{"eval_alpha": value}`` when the option is set (results and config), else ``{}``."""
    value = options["eval_alpha"]
    return {} if value is None else {"eval_alpha": float(value)}


def run_config(ctx) -> dict:
    """BoostLU's entries of ``config.json``: alpha, the inputs, the backbone and geometry."""
    o = ctx.options
    out = {"alpha": float(o["alpha"]), **_eval_alpha(o)}
    if _check(ctx):
        return {**out, "inputs": "vectors as 1 x 1 maps"}
    return {**out, "inputs": "feature maps", **backbone_record(ctx), "map_dtype": o["map_dtype"]}


def _inputs(ctx, device) -> tuple[dict, dict]:
    """``(rows, info)``: a `MapRows` per split and what describes them."""
    splits, o = ctx.splits, ctx.options
    if _check(ctx):
        return ({s: MapRows(getattr(splits, s).x, device) for s in ("train", "val", "test")},
                {"inputs": "vectors"})
    net, name = run_backbone(ctx)
    size, _, _ = run_geometry(ctx)
    views = EvalMapViews(splits, net, size, dtype=o["map_dtype"], seed=0, device=device,
                         cache_dir=o["cache_dir"], progress=o["progress"],
                         **(o["features"] or {}))
    info = {"inputs": "feature maps", "backbone": name, "stores": views.describe()["stores"],
            "extract_seconds": round(views.seconds, 3)}
    return {s: MapRows(m, device) for s, m in views.eval.items()}, info


def fit(ctx: RunContext) -> Fitted:
    """BoostLU's fit for [`spmlkit.methods.train_run`][spmlkit.methods.train_run]: the split's maps
    (or vectors),
    `fit_boostlu`, the best epoch's probabilities."""
    splits, config, o = ctx.splits, ctx.config, ctx.options
    device = torch.device(config.device)
    rows, info = _inputs(ctx, device)
    head, result = fit_boostlu(rows["train"], splits.observed, ctx.loss, config,
                               val=rows["val"], y_val=splits.val.y, alpha=float(o["alpha"]),
                               eval_alpha=_eval_alpha(o).get("eval_alpha"), k=ctx.k,
                               on_epoch=ctx.on_epoch, checkpoint=ctx.checkpoint,
                               resume=ctx.resume)
    probs = {s: torch.sigmoid(r.logits(head)).cpu().numpy() for s, r in rows.items()}
    shape = list(rows["train"].shape)
    best = {"model": {k: v.detach().cpu() for k, v in head.state_dict().items()},
            "alpha": float(o["alpha"]), **_eval_alpha(o), "map_shape": shape, **info}
    if info["inputs"] == "vectors":
        best["preprocess"] = feature_preprocess(splits)
    else:
        record = backbone_record(ctx)
        best.update({k: v for k, v in record.items() if k != "backbone"})
    extra = {"alpha": float(o["alpha"]), **_eval_alpha(o), "map_shape": shape, **info}
    return Fitted(result, probs, best, extra)


def load_model(best: dict, config: dict):
    """The trained head (inputs: feature vectors) or, for a run on an image source, the backbone
    rebuilt by name with the head on its feature map (inputs: images)."""
    state = best["model"]
    num_classes, channels = state["weight"].shape
    head = BoostLUHead(int(channels), int(num_classes), float(best["alpha"]),
                       eval_alpha=best.get("eval_alpha"))
    head.load_state_dict(state)
    if best.get("inputs") == "vectors":
        return head, {"inputs": "features", "in_features": int(channels)}
    return BoostLUClassifier(rebuild_backbone(best), head), image_model_info(best)


BOOSTLU = register_method(TrainingMethod(
    name="boostlu", description="BoostLU: a 1x1-conv CAM head on a backbone's cached feature "
    "map (--backbone) whose positive CAM is scaled by alpha (default 5) before global average "
    "pooling, in training and inference; feature vectors are 1x1 maps; the paper's loss is "
    "--loss ll_r",
    paper="Kim et al. 2023 (BoostLU)", inputs="images", accepts_vectors=True, fit=fit,
    load_model=load_model, run_config=run_config,
    options={"alpha": OFFICIAL_ALPHA, "eval_alpha": None, "map_dtype": "float16",
             **image_options(backbone=None, without=("image_reader",))},
    default_lr=1e-3,
    default_lr_source="the linear mode's (a head on frozen features; the official 1e-5 with "
    "a 10x head lr is for a ResNet-50 fine-tuned end to end)",
    check_values=check_values, smoke_options=smoke_image_options(),
    train_fields=IMAGE_TRAIN_FIELDS))
