"""``finetune`` and ``linear_init``: a backbone and a linear head trained end to end on images.

``finetune`` trains the pretrained backbone and a fresh head together
(`spmlkit.engine.fit_finetune`); ``linear_init`` (Cole et al.) first trains the head on the
frozen backbone's cached features for ``linear_epochs`` (at ``linear_lr``, default the run's lr),
then fine-tunes from that head with the loss's state carried over
(`spmlkit.engine.fit_linear_init`). Both run in one process or many under ``torchrun``
(process 0 writes the run folder). ``best.pt`` names the backbone, the input size and the
normalisation, so ``spml predict`` rebuilds the model from the run folder alone.

Fine-tuning options (defaults: today's runs, unchanged): ``augment`` (``none`` / ``weak`` /
``strong``, `train_transform`), ``weight_decay`` (decoupled, on weights only),
``warmup_epochs`` and ``lr_schedule`` (``constant`` / ``cosine``), ``cpu_bf16`` (bfloat16
autocast of the training forward on a CPU): `spmlkit.engine.FinetuneOptions`.

Options: ``backbone`` (``spml list backbones``), ``pretrained``, ``backbone_options``
(`spmlkit.models.create_backbone`'s), ``linear_epochs`` and ``linear_lr`` (linear_init),
and linear_init's feature store: ``feature_dtype``, ``cache_dir``, ``progress`` and more
`spmlkit.features.extract_features` options in ``features`` (``batch_size``,
``num_workers``).
"""
from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch

from ..engine import TrainConfig, fit_finetune, fit_linear_init, predict_items
from .contract import IMAGE_TRAIN_FIELDS, Fitted, RunContext, TrainingMethod, register_method

OPTIONS = {"backbone": "efficientnet_lite0", "pretrained": True, "backbone_options": {},
           "linear_epochs": 25, "linear_lr": None, "feature_dtype": "float32",
           "cache_dir": None, "progress": True, "features": {},
           "augment": "weak", "weight_decay": 0.0, "warmup_epochs": 0.0,
           "lr_schedule": "constant", "cpu_bf16": False}

#: the training images' augmentation (option ``augment``): `spmlkit.data.transforms`
AUGMENTATIONS = {"none": "eval_transform", "weak": "weak_view", "strong": "strong_view"}


def train_transform(augment: str, geometry: dict):
    """The training transform of ``augment`` at the run's size, mean and std: ``none`` (resize
    only, as evaluation), ``weak`` (default: resize + horizontal flip) or ``strong`` (LAC's
    strong view: flip, Cutout, RandAugment 2 ops at 9, colour jitter, grayscale)."""
    from ..data import transforms as T

    if augment not in AUGMENTATIONS:
        raise ValueError(f"augment must be one of {', '.join(AUGMENTATIONS)}, got {augment!r}")
    make = getattr(T, AUGMENTATIONS[augment])
    return make(geometry["image_size"], tuple(geometry["mean"]), tuple(geometry["std"]))


def tuning_options(o: dict):
    """The `spmlkit.engine.FinetuneOptions` of a run's options."""
    from ..engine import FinetuneOptions

    return FinetuneOptions(weight_decay=float(o["weight_decay"]),
                           warmup_epochs=float(o["warmup_epochs"]),
                           schedule=str(o["lr_schedule"]), cpu_bf16=bool(o["cpu_bf16"]))


#: a tiny run for the generated tests: a 4-channel CNN on 16-px images
SMOKE = {"backbone": "tiny_cnn", "pretrained": False, "linear_epochs": 2, "progress": False,
         "backbone_options": {"width": 4, "num_features": 8, "input_size": 16}}


def check_images(splits, method: str) -> None:
    """Fine-tuning needs image items, not feature vectors: say so, naming the dataset."""
    x = splits.train.x
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        raise ValueError(f"dataset {splits.name!r} holds feature vectors ({x.shape[1]}-d), not "
                         f"images: --mode {method} needs an image source (spml list datasets) "
                         f"without --backbone in --data; use --mode linear for features")


def linear_features(splits, backbone, *, size: int | None, progress: bool = True,
                    **store_options) -> tuple[np.memmap, np.memmap]:
    """Train and val features of ``splits`` for linear_init's linear phase: ``backbone`` (the
    fine-tuning model's own backbone module, so the linear head fits it exactly) on the eval
    transform at ``size``, through the feature store (computed once, reused afterwards),
    memory-mapped: the linear phase reads them chunk by chunk, as float32."""
    from ..features import extract_features

    return tuple(extract_features(getattr(splits, s).x, backbone, "eval", size,
                                  progress=progress, desc=f"{splits.name} {s} features",
                                  **store_options)
                 for s in ("train", "val"))


def _model(ctx: RunContext):
    """The classifier of this run, built once (run_config and fit both need it)."""
    from ..models.heads import build_image_classifier

    if "model" in ctx.prepared:
        return ctx.prepared["model"]
    o = ctx.options
    ctx.prepared["model"] = build_image_classifier(o["backbone"], len(ctx.splits.class_names),
                                  pretrained=o["pretrained"], seed=ctx.config.seed,
                                  **(o["backbone_options"] or {}))
    return ctx.prepared["model"]


def linear_config(ctx: RunContext) -> TrainConfig | None:
    """linear_init's linear phase: the run's config with ``linear_epochs`` and ``linear_lr``,
    and the run's ``weight_decay`` as the linear mode applies it (Adam's coupled L2 on the
    head's weights; the fine-tuning phase decays decoupled): a weight decay given for the run
    is the whole run's, not the fine-tuning's alone."""
    if ctx.method.name != "linear_init":
        return None
    o = ctx.options
    return TrainConfig(**{**asdict(ctx.config), "epochs": int(o["linear_epochs"]),
                          "lr": float(o["linear_lr"] or ctx.config.lr),
                          "weight_decay": float(o["weight_decay"] or 0.0)})


def _geometry(model, config: TrainConfig) -> dict:
    b = model.backbone
    return {"image_size": int(config.image_size or b.input_size),
            "mean": [float(v) for v in b.mean], "std": [float(v) for v in b.std]}


def run_config(ctx: RunContext) -> dict:
    from .. import distributed as dist_utils

    lin = linear_config(ctx)
    o = ctx.options
    return {"backbone": o["backbone"], "pretrained": o["pretrained"],
            "backbone_options": o["backbone_options"] or {},
            **_geometry(_model(ctx), ctx.config),
            "linear_train": asdict(lin) if lin else None,
            "processes": dist_utils.current_context(ctx.config.device).world_size}


def fit(ctx: RunContext) -> Fitted:
    from .. import distributed as dist_utils

    splits, config, o = ctx.splits, ctx.config, ctx.options
    check_images(splits, ctx.method.name)
    model = _model(ctx)
    geometry = _geometry(model, config)
    common = dict(val_items=splits.val.x, y_val=splits.val.y, k=ctx.k, on_epoch=ctx.on_epoch,
                  checkpoint=ctx.checkpoint, resume=ctx.resume,
                  train_transform=train_transform(o["augment"], geometry),
                  tuning=tuning_options(o))
    if ctx.method.name == "finetune":
        model, result = fit_finetune(model, splits.train.x, splits.observed, ctx.loss, config,
                                     **common)
    else:
        store = {"dtype": o["feature_dtype"], **({"cache_dir": o["cache_dir"]}
                                                  if o["cache_dir"] else {}),
                 **(o["features"] or {})}
        progress = bool(o["progress"]) and dist_utils.current_context(config.device).is_main
        train_f, val_f = linear_features(splits, model.backbone, size=geometry["image_size"],
                                         progress=progress, **store)
        model, result = fit_linear_init(model, splits.train.x, splits.observed, ctx.loss,
                                        config, linear_config=linear_config(ctx),
                                        train_features=train_f, val_features=val_f, **common)
    probs = {s: torch.sigmoid(predict_items(model, getattr(splits, s).x, config)).cpu().numpy()
             for s in ("train", "val", "test")}
    extra = {"backbone": o["backbone"]}
    if result.linear is not None:
        extra["linear_best_epoch"] = result.linear.best_epoch
        extra["linear_val_map"] = result.linear.val_map
    state = {n: t.detach().cpu().contiguous() for n, t in model.state_dict().items()}
    best = {"model": state, "backbone": o["backbone"],
            "backbone_options": o["backbone_options"] or {}, **geometry,
            "in_features": int(model.head.in_features)}
    return Fitted(result, probs, best, extra)


def load_model(best: dict, config: dict):
    """The fine-tuned backbone + head, rebuilt by the backbone's name (inputs: images)."""
    from ..models.backbones import create_backbone
    from ..models.heads import ImageClassifier

    options = {k: v for k, v in (best.get("backbone_options") or {}).items()
               if k != "weights"}  # the trained weights are in best.pt
    backbone = create_backbone(best["backbone"], pretrained=False, **options)
    model = ImageClassifier(backbone, int(best["num_classes"]))
    model.load_state_dict(best["model"])
    return model, {"inputs": "images", "image_size": int(best["image_size"]),
                   "mean": tuple(best["mean"]), "std": tuple(best["std"])}


#: Cole et al.'s fine-tuning epochs (docs/spec.md, training modes; the linear mode trains 25)
FINETUNE_EPOCHS = 10

FINETUNE = register_method(TrainingMethod(
    name="finetune", description="the backbone and a linear head trained end to end on an "
    "image source (one process, or many under torchrun)", paper="Cole et al. 2021",
    inputs="images", fit=fit, load_model=load_model, options=dict(OPTIONS),
    run_config=run_config, processes=True, smoke_options=SMOKE, default_epochs=FINETUNE_EPOCHS,
    checkpoint_seconds=0.0, train_fields=("head_lr_mult", *IMAGE_TRAIN_FIELDS)))
LINEAR_INIT = register_method(TrainingMethod(
    name="linear_init", description="a linear phase on the frozen backbone's cached features "
    "(linear_epochs), then fine-tuning from that head with the loss's state carried over",
    paper="Cole et al. 2021", inputs="images", fit=fit, load_model=load_model,
    options=dict(OPTIONS), run_config=run_config, processes=True, smoke_options=SMOKE,
    default_epochs=FINETUNE_EPOCHS,
    checkpoint_seconds=0.0, train_fields=("head_lr_mult", *IMAGE_TRAIN_FIELDS),
    count_epochs=lambda config, o: config.epochs + int(o["linear_epochs"])))
