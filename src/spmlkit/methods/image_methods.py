"""What the image methods (``lac``, ``mime``, ``boostlu``) share.

Each builds a backbone of its own by name (option ``backbone``), reads its feature maps or the
images through it, and writes what rebuilds it into ``best.pt``; LAC and MIME train a
label-wise embedding head configured by a dataclass of their own (`LACConfig
<spmlkit.methods.lac.LACConfig>`, `MIMEConfig <spmlkit.methods.mime.MIMEConfig>`) from
the method's flat options. Here, once:

- the options of such a method and of its smoke run (`image_options`,
  `smoke_image_options`);
- the run's device, backbone and input geometry (`run_device`, `run_backbone`,
  `run_geometry`), what ``config.json`` / ``best.pt`` record of them
  (`backbone_record`), and the way back (`rebuild_backbone`,
  `image_model_info`);
- a dataclass config from a dict or from the method's options, with named ablations
  (`config_from_dict`, `config_from_options`), and the constraints a label-wise head's
  config shares (`head_constraints`, `check_head_config`);
- the training views of image splits: `CachedMapViews` (a frozen backbone's cached
  feature maps of weak / strong draws, the CPU path), `EvalMapViews` (its eval-view maps
  only, the store every method on that backbone shares) and `ImageViews` (the images
  through the weak and strong transforms at every step, the end-to-end path).
"""
from __future__ import annotations

import copy
import time
from dataclasses import fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..constraints import Boolean, Interval, Options, check_record
from ..data.rows import read_rows
from ..engine import ItemPredictor, TrainConfig, mix_seed
from ..data.image_views import finish_view, load_view
from ..data.image_views import image_reader as reader_of
from ..machine import loader_worker_init, loader_workers, prefetch_factor

__all__ = ["MAP_DTYPES", "CachedMapViews", "EvalMapViews", "ImageViews", "backbone_record",
           "check_head_config", "config_fields", "config_from_dict", "config_from_options",
           "head_constraints", "image_model_info", "image_options", "rebuild_backbone",
           "run_backbone", "run_device", "run_geometry", "smoke_image_options"]

#: the dtypes a feature-map store is written in (option ``map_dtype``)
MAP_DTYPES = ("float16", "float32")

#: a backbone-building method's options and their defaults, in the order listed
_IMAGE_OPTIONS = {"backbone": "efficientnet_lite0", "image_size": None, "cache_dir": None,
                  "progress": True, "pretrained": True, "backbone_options": None,
                  "features": None, "image_reader": None}

#: a smoke run's: a tiny random CNN on 16-px images, no progress bars, no loader processes
_SMOKE_OPTIONS = {"backbone": "tiny_cnn", "pretrained": False, "progress": False,
                  "backbone_options": {"width": 4, "num_features": 8, "input_size": 16},
                  "features": {"num_workers": 0}}


def image_options(*, without: Sequence[str] = (), **overrides) -> dict:
    """The options (with defaults) of a method that builds its own backbone: ``backbone``,
    ``image_size``, ``cache_dir``, ``progress``, ``pretrained``, ``backbone_options``,
    ``features`` (`spmlkit.features.extract_feature_maps` options), ``image_reader``;
    ``overrides`` change a default, ``without`` drops options the method does not take."""
    unknown = sorted((set(overrides) | set(without)) - set(_IMAGE_OPTIONS))
    if unknown:
        raise ValueError(f"image_options: no option(s) {unknown}")
    return {k: overrides.get(k, v) for k, v in _IMAGE_OPTIONS.items() if k not in without}


def smoke_image_options(**more) -> dict:
    """The options of such a method's smoke run (a tiny random CNN), with ``more`` on top."""
    return {**copy.deepcopy(_SMOKE_OPTIONS), **more}


# ---- the run's device, backbone and geometry -----------------------------------------------------
def run_device(config: TrainConfig) -> torch.device:
    """``config.device`` as a device; plain ``cuda`` becomes the current CUDA device."""
    device = torch.device(config.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def run_backbone(ctx) -> tuple[nn.Module, str]:
    """The run's backbone module and its name (option ``backbone``: a name of
    `spmlkit.models.backbones.create_backbone` or a module), built once per run (its
    ``run_config`` and ``fit`` both need it; kept in ``ctx.prepared``)."""
    from ..models.backbones import create_backbone

    if "backbone" not in ctx.prepared:
        o = ctx.options
        given = o["backbone"]
        net = given if isinstance(given, nn.Module) else \
            create_backbone(given, pretrained=o["pretrained"], **(o["backbone_options"] or {}))
        name = given if isinstance(given, str) else getattr(net, "name", type(net).__name__)
        ctx.prepared["backbone"] = (net, name)
    return ctx.prepared["backbone"]


def run_geometry(ctx) -> tuple[int, list, list]:
    """``(size, mean, std)``: the input side (option ``image_size``, else the run config's, else
    the backbone's) and the backbone's normalisation."""
    net, _ = run_backbone(ctx)
    size = int(ctx.options["image_size"] or ctx.config.image_size or net.input_size)
    return size, [float(v) for v in net.mean], [float(v) for v in net.std]


def backbone_record(ctx) -> dict:
    """What rebuilds the run's backbone and its inputs (``config.json``, ``best.pt``):
    ``backbone`` (name), ``pretrained``, ``backbone_options``, ``image_size``, ``mean``,
    ``std``."""
    _, name = run_backbone(ctx)
    size, mean, std = run_geometry(ctx)
    o = ctx.options
    return {"backbone": name, "pretrained": o["pretrained"],
            "backbone_options": o["backbone_options"] or {}, "image_size": size, "mean": mean,
            "std": std}


def rebuild_backbone(best: dict) -> nn.Module:
    """The backbone a `backbone_record` names (``best.pt``), built again."""
    from ..models.backbones import create_backbone

    return create_backbone(best["backbone"], pretrained=best.get("pretrained", True),
                           **(best.get("backbone_options") or {}))


def image_model_info(best: dict) -> dict:
    """The ``load_model`` info of a model on images: its inputs and their geometry."""
    return {"inputs": "images", "image_size": int(best["image_size"]),
            "mean": tuple(best["mean"]), "std": tuple(best["std"])}


# ---- a dataclass config from options -------------------------------------------------------------
def config_fields(cls) -> tuple[str, ...]:
    """The field names of the dataclass ``cls`` (each one a method option)."""
    return tuple(f.name for f in fields(cls))


def config_from_dict(cls, values: dict | None, *, what: str, ablations: dict | None = None):
    """A ``cls`` dataclass from a dict of its fields; ``ablation=NAME`` (when ``ablations``
    names some) lays that ablation's fields under the given ones.

    Raises:
        ValueError: an unknown ablation or field (the message lists the known ones, ``what``
            names the method), or a value the dataclass refuses.
    """
    values = dict(values or {})
    ablation = values.pop("ablation", None) if ablations is not None else None
    if ablation is not None:
        if ablation not in ablations:
            raise ValueError(f"unknown {what} ablation {ablation!r}; known: "
                             f"{', '.join(ablations)}")
        values = {**ablations[ablation], **values}
    known = config_fields(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        also = "ablation, " if ablations is not None else ""
        raise ValueError(f"unknown {what} option(s) {unknown}; known: {also}"
                         f"{', '.join(sorted(known))}")
    return cls(**values)


def config_from_options(cls, options: dict, *, what: str, ablations: dict | None = None,
                        more: dict | None = None):
    """A ``cls`` dataclass from a method's flat options: every field of ``cls`` that is not
    None there (None: the ablation's value, else the field's default) and ``ablation``, with
    the fields ``more`` on top (an unknown one refused); the method's other options are not the
    dataclass's and are left out."""
    given = {k: options[k] for k in config_fields(cls) if options.get(k) is not None}
    if ablations is not None and options.get("ablation") is not None:
        given["ablation"] = options["ablation"]
    return config_from_dict(cls, {**given, **(more or {})}, what=what, ablations=ablations)


def head_constraints(views: Sequence[str], maxima: dict | None = None) -> dict:
    """The `spmlkit.constraints` table of the fields a config of a label-wise embedding head
    shares (`LACConfig <spmlkit.methods.lac.LACConfig>`, `MIMEConfig
    <spmlkit.methods.mime.MIMEConfig>`): the head's sizes, ``dropout`` in [0, 1), the cached
    views, ``views`` one of ``views``, ``map_dtype`` one of `MAP_DTYPES`; a size at most
    ``maxima[name]`` where given (checked before anything is allocated)."""
    maxima = maxima or {}

    def size(name: str, least: int) -> Interval:
        return Interval(int, least, maxima.get(name), too_large="a size; the paper's is far "
                        "smaller") if name in maxima else Interval(int, least)

    return {"dim": size("dim", 4), "heads": size("heads", 1), "ffn": [size("ffn", 1), None],
            "dropout": Interval(float, 0, 1, closed="left"),
            "encoder_layers": size("encoder_layers", 0),
            "decoder_layers": size("decoder_layers", 1), "train_backbone": Boolean(),
            "views": Options(views), "weak_views": size("weak_views", 1),
            "map_dtype": Options(MAP_DTYPES)}


def check_head_config(cfg) -> None:
    """A config of a label-wise embedding head checked: its table
    (``parameter_constraints``, `head_constraints` among it), then what relates its fields:
    ``dim`` a multiple of 4 and of ``heads``, ``train_backbone`` only with
    ``views="images"``.

    Raises:
        ValueError: ``<Class>.<field> <why>, got <value>``, the first field found wrong.
    """
    check_record(cfg)

    def bad(name, why):
        raise ValueError(f"{type(cfg).__name__}.{name} {why}, got {getattr(cfg, name)!r}")

    if cfg.dim % 4 or cfg.dim % cfg.heads:
        bad("dim", f"must be a multiple of 4 and of heads ({cfg.heads})")
    if cfg.train_backbone and cfg.views != "images":
        bad("train_backbone", "needs views='images' (cached maps come from a frozen backbone)")

# ---- views of image splits -----------------------------------------------------------------------
def _view_choice(seed: int, epoch: int, rows, n_weak: int, n_strong: int):
    """Which cached weak / strong view each row takes this epoch (from mix_seed(seed, epoch,
    row))."""
    draws = [mix_seed(seed, epoch, int(r)) for r in rows]
    return (np.array([d % n_weak for d in draws]),
            np.array([(d // n_weak) % max(n_strong, 1) for d in draws]))  # 0: no strong views


@torch.no_grad()
def predict_rows(module: nn.Module, n: int, read: Callable, batch_size: int,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Eval-mode float32 outputs of ``module`` on rows ``0 .. n - 1`` (``read(rows)``: their
    inputs on the module's device), ``batch_size`` rows at a time, into one ``n x L`` tensor on
    ``device`` (filled in place: the outputs exist once)."""
    was = module.training
    module.eval()
    out = None
    try:
        for i in range(0, n, batch_size):
            rows = np.arange(i, min(i + batch_size, n))
            part = module(read(rows)).float()
            if out is None:
                out = torch.empty((n, *part.shape[1:]), dtype=torch.float32, device=device)
            out[i:i + len(rows)] = part.to(device)
    finally:
        module.train(was)
    return out if out is not None else torch.zeros(0, getattr(module, "num_classes", 0),
                                                     device=device)


class CachedMapViews:
    """Views from cached feature maps of a frozen backbone (the CPU path).

    Args:
        splits: image splits (``x`` are paths).
        backbone: the backbone module (its ``cache_key`` names the stores).
        size: input side.
        weak_views, strong_views: cached draws of the weak / strong view per train image
            (``strong_views=0``: none); map_dtype: the stores' dtype (`MAP_DTYPES`).
        seed: the run seed (the view choice per epoch; the cached views themselves are seeded
            ``0 .. n - 1`` and shared by every run).
        store_options: `spmlkit.features.extract_features` options (``cache_dir``,
            ``progress``, ``num_workers``, ``batch_size``, ``device``).
    """

    kind = "cached"

    def __init__(self, splits, backbone: nn.Module, size: int, *, weak_views: int,
                 strong_views: int, map_dtype: str, seed: int, device: torch.device,
                 **store_options):
        from ..features import extract_feature_maps

        t0 = time.perf_counter()
        self.seed, self.device = int(seed), device
        self.n_weak, self.n_strong = int(weak_views), int(strong_views)
        opts = {"dtype": map_dtype, **store_options}
        name = splits.name

        def maps(items, transform, what, seed=0):
            return extract_feature_maps(items, backbone, transform, size, seed=seed,
                                        desc=f"{name} {what}", **opts)

        self.weak = [maps(splits.train.x, "weak", f"train weak view {v + 1}/{self.n_weak}", v)
                     for v in range(self.n_weak)]
        self.strong = [maps(splits.train.x, "strong",
                            f"train strong view {v + 1}/{self.n_strong}", v)
                       for v in range(self.n_strong)]
        self.eval = {s: maps(getattr(splits, s).x, "eval", f"{s} eval view")
                     for s in ("train", "val", "test")}
        self.in_channels = int(self.eval["train"].shape[1])
        self.map_shape = tuple(int(v) for v in self.eval["train"].shape[1:])
        self.seconds = time.perf_counter() - t0

    def describe(self) -> dict:
        stores = [str(Path(m.filename).parent) for m in (*self.weak, *self.strong,
                                                         *self.eval.values())]
        return {"kind": self.kind, "weak_views": self.n_weak, "strong_views": self.n_strong,
                "map_shape": list(self.map_shape), "stores": stores}

    @staticmethod
    def _gather(stores, choice, rows) -> torch.Tensor:
        out = np.empty((len(rows), *stores[0].shape[1:]), dtype=np.float32)
        for v in np.unique(choice):
            take = choice == v
            out[take] = read_rows(stores[v], rows[take])
        return torch.from_numpy(out)

    def train_epoch(self, batches: Sequence[torch.Tensor], epoch: int, strong: bool):
        """Yields ``(weak B x C x h x w, strong or None, rows)`` for each batch of rows."""
        for rows in batches:
            r = rows.numpy()
            w_choice, s_choice = _view_choice(self.seed, epoch, r, self.n_weak, self.n_strong)
            weak = self._gather(self.weak, w_choice, r).to(self.device)
            stro = self._gather(self.strong, s_choice, r).to(self.device) if strong else None
            yield weak, stro, rows

    @torch.no_grad()
    def predict(self, module: nn.Module, split: str, batch_size: int = 256) -> torch.Tensor:
        """Eval-mode logits (float32, CPU) of ``module`` on ``split``'s eval view, row order."""
        maps = self.eval[split]
        return predict_rows(module, len(maps), lambda rows: torch.from_numpy(
            read_rows(maps, rows)).to(self.device), batch_size)

    def close(self) -> None:
        pass


class EvalMapViews(CachedMapViews):
    """The frozen backbone's eval-view maps of every split, the train rows trained on as they
    are (no augmentation): the store any method on the same backbone, size and dtype shares."""

    kind = "eval"

    def __init__(self, splits, backbone: nn.Module, size: int, *, dtype: str, seed: int,
                 device: torch.device, **store_options):
        from ..features import extract_feature_maps

        t0 = time.perf_counter()
        self.seed, self.device = int(seed), device
        self.eval = {s: extract_feature_maps(getattr(splits, s).x, backbone, "eval", size,
                                             dtype=dtype, desc=f"{splits.name} {s} eval view",
                                             **store_options)
                     for s in ("train", "val", "test")}
        self.weak, self.strong = [self.eval["train"]], []
        self.n_weak, self.n_strong = 1, 0
        self.in_channels = int(self.eval["train"].shape[1])
        self.map_shape = tuple(int(v) for v in self.eval["train"].shape[1:])
        self.seconds = time.perf_counter() - t0


class _TwoViewItems(torch.utils.data.Dataset):
    """Train images through the weak and (optionally) the strong transform; key ``(row,
    epoch, strong)``; generators seeded from ``mix_seed(seed, epoch, row, 0 | 1)``."""

    def __init__(self, items, weak, strong, read, seed: int):
        self.items, self.weak, self.strong, self.read, self.seed = items, weak, strong, read, seed

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key):
        row, epoch, strong = key
        item = self.items[row]
        img = self.read(item) if isinstance(item, (str, bytes)) or hasattr(item, "__fspath__") \
            else item
        gen = torch.Generator().manual_seed
        w = load_view(self.weak, img, gen(mix_seed(self.seed, epoch, row, 0)))
        s = load_view(self.strong, img, gen(mix_seed(self.seed, epoch, row, 1))) \
            if strong else None
        return w, s, row


def _stack_views(views):
    xs, flips = zip(*views)
    return torch.stack(xs), torch.tensor(flips, dtype=torch.bool)


def _collate_two(batch):
    """``((weak, weak flips), (strong, strong flips) or None, rows)`` of uint8 views."""
    weak = _stack_views([b[0] for b in batch])
    strong = _stack_views([b[1] for b in batch]) if batch[0][1] is not None else None
    return weak, strong, torch.tensor([b[2] for b in batch], dtype=torch.long)


class _Batches:
    """A batch sampler whose batches the trainer sets before each epoch (iterated in the main
    process, so persistent workers see every epoch's keys)."""

    def __init__(self):
        self.batches = []

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


class ImageViews:
    """Views computed from the images at every step (the end-to-end path, for a GPU).

    Weak view (`spmlkit.data.transforms.weak_view`) and strong view
    (`strong_view`) at the backbone's normalisation, in
    ``config.num_workers`` DataLoader workers; val / test / train predictions through the eval
    transform (`spmlkit.engine.ItemPredictor`, autocast on CUDA).
    """

    kind = "images"

    def __init__(self, splits, size: int, mean, std, config: TrainConfig, *,
                 seed: int, device: torch.device, image_reader: Callable | None = None):
        from ..accel import start
        from ..data import transforms as T

        accel = start(device, "this run on images")
        if accel.compile or accel.gpu_decode:
            raise ValueError(f"{' '.join(accel.flags())}: the image methods with a label-wise "
                             f"head (lac, mime) train on the strong view's PIL steps and do not "
                             f"compile their model; --compile and --gpu-decode are for "
                             f"finetune, linear_init and spml extract")
        self.device, self.seconds = device, 0.0
        self.size = int(size)
        weak, strong = T.weak_view(size, mean, std), T.strong_view(size, mean, std)
        self.weak, self.strong = weak, strong
        read = reader_of(image_reader, weak, list(splits.train.x))
        self.sampler = _Batches()
        workers = loader_workers(config.num_workers)
        more = {"prefetch_factor": prefetch_factor(config.batch_size)} if workers else {}
        self.loader = torch.utils.data.DataLoader(
            _TwoViewItems(list(splits.train.x), weak, strong, read, seed),
            batch_sampler=self.sampler, num_workers=workers, collate_fn=_collate_two,
            pin_memory=device.type == "cuda", persistent_workers=workers > 0,
            worker_init_fn=loader_worker_init,
            generator=torch.Generator(), **more)  # workers' base seed: not the global RNG
        eval_t = T.eval_transform(size, mean, std)
        self.predictors = {s: ItemPredictor(list(getattr(splits, s).x), eval_t, config,
                                            (3, size, size), device, read)
                           for s in ("train", "val", "test")}
        self.channels_last = device.type == "cuda" and config.channels_last

    def describe(self) -> dict:
        return {"kind": self.kind, "image_size": self.size}

    def train_epoch(self, batches: Sequence[torch.Tensor], epoch: int, strong: bool):
        self.sampler.batches = [[(int(r), int(epoch), bool(strong)) for r in b] for b in batches]
        last = self.channels_last
        for weak, stro, rows in self.loader:
            weak = finish_view(self.weak, *weak, self.device, last)
            if stro is not None:
                stro = finish_view(self.strong, *stro, self.device, last)
            yield weak, stro, rows

    def predict(self, module: nn.Module, split: str, batch_size: int = 0) -> torch.Tensor:
        return self.predictors[split](module).float().cpu()

    def close(self) -> None:
        self.loader = None
