"""Cached feature maps (LAC / MIME / BoostLU): peak anonymous memory against the number of rows.

Writes an N x C x h x w float16 map store (synthetic, memory-mapped as ``spml`` caches maps),
then, in a fresh child process per case and size, sampling ``RssAnon`` every 20 ms (as
``out_of_core.py``):

- ``lac``: :class:`spmlkit.methods.image_methods.CachedMapViews` over that store (its weak
  view and eval views): one epoch of batches of 32 rows through ``train_epoch`` and the eval
  logits of every row through ``predict`` (head: a 1x1 convolution, pooling, a linear layer);
- ``boostlu``: :class:`spmlkit.methods.boostlu.MapRows`: one epoch of ``take`` and the eval
  ``logits``.

    python benchmarks/out_of_core_maps.py --rows 20000,80000 --root runs/out-of-core-maps

Prints per case and size the peak RssAnon, the store's size and what N x L float32 logits take;
a path that reads the maps batch by batch peaks flat in the store's size (what grows is N x L).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from out_of_core import run_sampled  # noqa: E402


def write_maps(path: Path, n: int, shape: tuple, seed: int = 0, chunk: int = 4096) -> None:
    if path.is_file():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    maps = np.lib.format.open_memmap(path, mode="w+", dtype="float16", shape=(n, *shape))
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        maps[start:start + m] = rng.standard_normal((m, *shape), dtype=np.float32)
    maps.flush()


def child(args) -> None:
    import torch
    from torch import nn

    torch.set_num_threads(args.threads)
    maps = np.load(args.store, mmap_mode="r")
    n, c = maps.shape[:2]
    head = nn.Sequential(nn.Conv2d(c, 16, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, args.classes))
    head.num_classes = args.classes
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    batches = [perm[i:i + 32] for i in range(0, n, 32)]
    start = time.perf_counter()
    if args.case == "lac":
        from spmlkit.methods.image_methods import CachedMapViews

        views = CachedMapViews.__new__(CachedMapViews)   # its stores, without extracting them
        views.seed, views.device = 0, torch.device("cpu")
        views.n_weak, views.n_strong = 1, 0
        views.weak, views.strong = [maps], []
        views.eval = {"train": maps}
        for weak, _, _ in views.train_epoch(batches, 0, False):
            head(weak)
        logits = views.predict(head, "train")
    else:
        from spmlkit.methods.boostlu import MapRows

        rows = MapRows(maps, torch.device("cpu"))
        for idx in batches:
            head(rows.take(idx))
        logits = rows.logits(head)
    Path(args.result).write_text(json.dumps({"seconds": time.perf_counter() - start,
                                             "logits": list(logits.shape)}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="20000,80000")
    p.add_argument("--shape", default="64,7,7", help="C,h,w of one map")
    p.add_argument("--classes", type=int, default=80)
    p.add_argument("--cases", default="lac,boostlu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--root", default="runs/out-of-core-maps")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    shape = tuple(int(v) for v in args.shape.split(","))
    root = Path(args.root)
    for n in (int(v) for v in args.rows.split(",")):
        store = root / f"maps-{n}.npy"
        write_maps(store, n, shape)
        for case in args.cases.split(","):
            result = root / f"result-{case}-{n}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--case", case,
                   "--store", str(store), "--classes", str(args.classes), "--threads",
                   str(args.threads), "--result", str(result)]
            rc, seconds, peak = run_sampled(cmd)
            size = store.stat().st_size / 2 ** 20
            logits = n * args.classes * 4 / 2 ** 20
            print(f"{case:8s} {n:8d} rows  rc {rc}  peak RssAnon {peak / 1024:7.1f} MiB  "
                  f"(store {size:7.1f} MiB; N x L float32 {logits:5.1f} MiB)  {seconds:6.1f} s",
                  flush=True)


if __name__ == "__main__":
    main()
