"""The option groups the ``spml`` commands share, each written once (a command's ``register``
adds them to its parser, then its own options): the data and the training options, the
backbone's features, the image paths' speed-ups."""
from __future__ import annotations

import argparse

from .common import MAX_THREADS, LazyHelp, _join, _metric, _whole


def _datasets_help() -> str:
    from ..data import DATASETS

    return (f"registered dataset: {_join(DATASETS.names())} (spml list datasets); default "
            "yeast, and required with a source's --data options (e.g. --dataset tabular for "
            "your own CSV / Parquet table)")


def _metric_help() -> str:
    from ..metrics import METRICS

    def names(up):
        return _join(f"{n} (default)" if n == "map" else n
                     for n, m in METRICS.items() if m.higher_is_better == up)
    return ("the val metric the best epoch (and grid point) is selected on: "
            f"{names(True)} (higher is better) or {names(False)} (lower is better)")


def _threads_help() -> str:
    from ..methods import list_methods

    images = " / ".join(m.name for m in list_methods() if m.inputs == "images")
    return ("torch threads per process (default: 1 for the feature modes, where a linear head "
            "on small batches is bound by per-operation overhead and extra threads only add "
            f"contention; the machine's cores for the image modes --mode {images}, whose "
            "convolutions use them)")


def _backbone_help(default: str | None) -> str:
    from ..models.backbones import list_backbones

    names = _join(name for name, _ in list_backbones())
    if default is None:
        return ("image sources: train on this backbone's cached features, extracted first if "
                f"missing: {names} (spml list backbones)")
    return f"backbone: {names} (spml list backbones; timm:<model> with timm installed)"


def _add_common(p: argparse.ArgumentParser, data=None, training=None) -> None:
    """``--dataset`` and ``--data`` (into the ``data`` group), the epochs, early stopping, the
    selection metric, ``--drop-last`` and ``--threads`` (into ``training``); without groups,
    into ``p``."""
    data, training = data or p, training or p
    data.add_argument("--dataset", default=None,
                      help=LazyHelp(_datasets_help))
    data.add_argument("--data", action="append", metavar="KEY=VALUE",
                      help="dataset option, e.g. --data root=/data/pascal (repeatable; a "
                           "source's options: spml list datasets NAME --details)")
    training.add_argument("--epochs", type=_whole(1), default=None,
                          help="default 25 (spml train: the method's, e.g. 40 for --mode lac)")
    training.add_argument("--early-stop", default="none",
                          help="none | patience:N | drop:X (default none: fixed epochs, Cole et "
                               "al.)")
    training.add_argument("--metric", default="map", type=_metric,
                          help=LazyHelp(_metric_help))
    training.add_argument("--drop-last", action="store_true",
                          help="train without each epoch's last, shorter batch, as Cole et al.'s "
                               "and Xie et al.'s loaders (drop_last=True); default: every row "
                               "trains. Validation and test always score every row (a subset that "
                               "depends on the batch size would make grid points incomparable)")
    training.add_argument("--threads", type=_whole(1, MAX_THREADS), default=None,
                          help=LazyHelp(_threads_help))


def _add_backbone(p: argparse.ArgumentParser, default: str | None = None,
                  group=None) -> None:
    """``--backbone``, ``--float32`` / ``--float16``, ``--cache-dir`` and ``--weights``, into
    ``group`` (default ``p``)."""
    p = group or p
    p.add_argument("--backbone", default=default,
                   help=LazyHelp(lambda: _backbone_help(default)))
    g = p.add_mutually_exclusive_group()
    g.add_argument("--float32", dest="feature_dtype", action="store_const", const="float32",
                   default="float32", help="store features as float32 (default)")
    g.add_argument("--float16", dest="feature_dtype", action="store_const", const="float16",
                   help="store features as float16 (half the disk and memory)")
    p.add_argument("--cache-dir", default=None,
                   help="feature stores folder (default $SPMLKIT_CACHE/features or "
                        "~/.cache/spmlkit/features)")
    p.add_argument("--weights", default=None, metavar="FILE",
                   help="your own weights for --backbone instead of its pretrained ones: a "
                        "state dict of that architecture (saved by spmlkit, torchvision or "
                        "timm; module. / model. prefixes and the ImageNet classifier are "
                        "handled; keys that do not match are named)")


def _add_acceleration(p) -> None:
    """``--cudnn-benchmark``, ``--compile [MODE]``, ``--gpu-decode``, ``--jpeg-draft``: the
    opt-in speed-ups of the image paths (`spmlkit.accel`), each changing bits."""
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="CUDA: cudnn's autotuner (seconds at the start and at each new input "
                        "shape; results no longer bit-reproducible)")
    p.add_argument("--compile", nargs="?", const="default", default=None, metavar="MODE",
                   choices=["default", "reduce-overhead", "max-autotune"],
                   help="run the model through torch.compile (MODE: default, reduce-overhead = "
                        "CUDA graphs for small batches, max-autotune); costs a compilation of "
                        "tens of seconds or more at the start and per new batch shape")
    p.add_argument("--gpu-decode", action="store_true",
                   help="decode JPEGs on the GPU (torchvision's nvJPEG) and resize there "
                        "(antialiased bilinear: pixels differ a little from PIL's); eval and "
                        "weak views only; needs CUDA and torchvision; decodes on a CUDA stream of "
                        "its own (docs/guide/images.md)")
    p.add_argument("--jpeg-draft", action="store_true",
                   help="decode JPEGs at a reduced scale (1/2, 1/4, 1/8) no smaller than the "
                        "view, then resize as before: several times faster for photos much "
                        "larger than the view; pixels differ by a fraction of a level")
