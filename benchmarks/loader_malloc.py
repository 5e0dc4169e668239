"""What glibc's malloc costs an image loader worker, and what `loader_worker_init` saves.

    PYTHONPATH=src python benchmarks/loader_malloc.py --out results/loader-malloc.csv

A DataLoader worker decodes a photo into buffers of a few MiB (640 x 480 RGB: 1.2 MiB, again
for its resize and its array). Whether glibc maps and unmaps such buffers (or grows and trims
its heap) for every image depends on its dynamic thresholds, which a forked worker inherits
from whatever its parent process freed before: the same loader is fast or slow by the history
of the process that starts it. spmlkit's loaders start their workers with
`spmlkit.machine.loader_worker_init` (fixed thresholds: `WORKER_MALLOC`).

Each row: one loader, with glibc's defaults or with `loader_worker_init` in its workers, started
by a process with one of two histories: ``fresh`` (an interpreter that imported what the loader
needs) or ``freed 16 MiB`` (the same, after it freed a 16 MiB buffer: glibc raised its
thresholds, which the workers inherit), over the photo-like 640 x 480 JPEGs of
``gpu_throughput.py``'s synthetic MS-COCO layout (``--workdir``), at one output size and worker
count, in an interpreter of its own, ``--passes`` passes over the images, the first left out
(workers starting): milliseconds per image and images per second.

- ``spmlkit``: spmlkit's training loader (`make_loader` over `ImageItems`, the weak view:
  PIL decode, resize, flip drawn -> uint8); its ``defaults`` rows are spmlkit before;
- ``bare``: the loader a user writes (PIL open, convert, resize, flip -> uint8, default
  ``DataLoader``; with ``worker_init_fn=loader_worker_init`` in its other rows).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_io import write_rows  # noqa: E402

LOADERS = ("spmlkit", "bare")
MALLOC = ("defaults", "loader_worker_init")
HISTORIES = ("fresh", "freed 16 MiB")


class _BareItems:
    """The user's dataset: PIL open, convert, resize, flip -> 3 x S x S uint8."""

    def __init__(self, paths, size):
        self.paths, self.size = paths, size

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import numpy as np
        import torch
        from PIL import Image

        with Image.open(self.paths[i]) as img:
            img = img.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        if np.random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy()), i


def child(args) -> dict:
    """One loader's passes, in this interpreter; the seconds of each pass."""
    import torch

    from spmlkit.machine import loader_worker_init, prefetch_factor

    torch.set_num_threads(1)
    paths = sorted(str(p) for p in (Path(args.workdir) / "coco" / "train2014").glob("*.jpg"))
    batch = 8
    init = loader_worker_init if args.malloc == "loader_worker_init" else None
    if args.child == "spmlkit":
        from spmlkit.data.transforms import weak_view
        from spmlkit.engine import TrainConfig, image_batches

        image_batches.loader_worker_init = init  # (read when the loader is made)
        sampler = image_batches.GlobalBatchSampler(len(paths), batch, 0, 0, 1)
        loader = image_batches.make_loader(
            image_batches.ImageItems(paths, weak_view(args.size), seed=0), sampler,
            TrainConfig(batch_size=batch, num_workers=args.workers),
            (3, args.size, args.size), torch.device("cpu"))
    else:
        sampler = None
        loader = torch.utils.data.DataLoader(
            _BareItems(paths, args.size), batch_size=batch, shuffle=True,
            num_workers=args.workers, persistent_workers=True,
            prefetch_factor=prefetch_factor(batch), worker_init_fn=init)
    if args.history == "freed 16 MiB":
        import numpy as np

        freed = np.ones(2 << 20)  # 16 MiB of float64, freed before the workers fork
        del freed
    seconds = []
    for epoch in range(args.passes):
        if sampler is not None:
            sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        for _ in loader:
            pass
        seconds.append(time.perf_counter() - t0)
    return {"images": len(paths), "seconds": seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the CSV to write")
    p.add_argument("--workdir", default="/tmp/spmlkit-gpu-throughput",
                   help="where gpu_throughput.py's synthetic layout is (made when missing)")
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--sizes", default="448,224")
    p.add_argument("--workers", default="1")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--malloc", default=None, help=argparse.SUPPRESS)
    p.add_argument("--history", default=None, help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        args.workers = int(args.workers)
        print(json.dumps(child(args)))
        return 0
    from gpu_throughput import make_coco

    made = make_coco(Path(args.workdir) / "coco", args.images, 10, 640, 480)
    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, " \
              f"{os.confstr('CS_GNU_LIBC_VERSION') or 'no glibc'}"
    images = len(list((Path(args.workdir) / "coco" / "train2014").glob("*.jpg")))
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        for workers in (int(w) for w in args.workers.split(",")):
            for kind in args.loaders.split(","):
                for history in HISTORIES:
                    for malloc in MALLOC:
                        ms = _measure(args, kind, malloc, history, size, workers)
                        rows.append({"loader": kind, "malloc": malloc, "history": history,
                                     "image_size": size, "workers": workers,
                                     "ms_per_image": round(ms, 3),
                                     "images_per_s": round(1000 / ms, 1),
                                     "passes_timed": args.passes - 1, "images": images,
                                     "machine": machine})
                        print(f"{kind:>8} {malloc:>18} {history:>12} size {size:>3} workers "
                              f"{workers}: {ms:.2f} ms/image", flush=True)
    write_rows(args.out, rows)
    print(f"wrote {args.out} ({made['images']} images in the layout, {images} read)")
    return 0


def _measure(args, kind, malloc, history, size, workers) -> float:
    """Milliseconds per image of one loader, in an interpreter of its own."""
    done = subprocess.run(
        [sys.executable, __file__, "--out", args.out, "--child", kind, "--malloc", malloc,
         "--history", history, "--size", str(size), "--workers", str(workers),
         "--passes", str(args.passes), "--workdir", args.workdir],
        capture_output=True, text=True, timeout=900, check=True)
    res = json.loads(done.stdout.strip().splitlines()[-1])
    timed = res["seconds"][1:] or res["seconds"]
    return 1000 * sum(timed) / len(timed) / res["images"]


if __name__ == "__main__":
    sys.exit(main())
