"""``spml extract``: an image source's backbone features, computed once."""
from __future__ import annotations


import numpy as np

from .common import _acceleration, _data, _whole
from .groups import add_acceleration, add_backbone, add_data, add_loading, add_output


def cmd_extract(args) -> int:
    import time

    from ..loading import load_dataset
    from ..features import feature_dataset, require_images

    ds = require_images(load_dataset(args.dataset, **_data(args)))
    if args.limit is not None:  # the first N of each set, with their observed labels
        import dataclasses

        first = {s: np.arange(min(args.limit, len(getattr(ds, s)))) for s in ("pool", "test")}
        ds = dataclasses.replace(
            ds, pool=ds.pool.subset(first["pool"]), test=ds.test.subset(first["test"]),
            val=None if ds.val is None else ds.val.subset(np.arange(min(args.limit,
                                                                         len(ds.val)))),
            observed=None if ds.observed is None else ds.observed[first["pool"]])
    from ..accel import acceleration

    t0 = time.perf_counter()
    with acceleration(_acceleration(args)):
        out = feature_dataset(ds, args.backbone, transform=args.transform, size=args.size,
                              batch_size=args.batch_size, num_workers=args.workers,
                              dtype=args.feature_dtype, cache_dir=args.cache_dir,
                              pretrained=not args.random_init, device=args.device,
                              progress=not args.quiet, recompute=args.recompute,
                              weights=args.weights)
    seconds = time.perf_counter() - t0
    for what, s, store in zip(("pool", "test"), (out.pool, out.test), out.meta["feature_stores"]):
        print(f"{args.dataset} {what}: {s.x.shape[0]} x {s.x.shape[1]} {s.x.dtype} -> {store}")
    print(f"{len(out.pool) + len(out.test)} images in {seconds:.1f} s (stores already complete "
          f"are reused, not recomputed)")
    return 0


def register(sub) -> None:
    """Add the command's parser to ``sub`` (``spml``'s subparsers)."""
    p = sub.add_parser("extract", help="compute the backbone features of an image source once "
                       "(memory-mapped store, resumable; reused by train/benchmark --backbone)")
    add_data(p, image_source=True)
    add_backbone(p, default="efficientnet_lite0")
    p.add_argument("--transform", default="eval", choices=["eval", "weak", "strong"],
                   help="the image transform before the backbone: eval (resize and "
                        "normalise; default), weak or strong (the training augmentations)")
    p.add_argument("--size", type=_whole(1), default=None,
                   help="input side (default: the backbone's)")
    add_loading(p, batch_size=32, workers=None, workers_default="cores - 1, at most 8",
                device=None)
    p.add_argument("--limit", type=_whole(1), default=None, metavar="N",
                   help="only the first N images of pool and test (a quick try)")
    p.add_argument("--random-init", action="store_true", help="backbone without pretrained "
                   "weights")
    p.add_argument("--recompute", action="store_true", help="discard the stores and recompute")
    add_output(p)
    add_acceleration(p)
    p.set_defaults(func=cmd_extract)
