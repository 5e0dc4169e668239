"""What a --gpu-decode batch of files' bytes costs the thread that receives it from the loader.

    PYTHONPATH=src python benchmarks/raw_batches.py --out results/raw-batches.csv

A DataLoader (persistent workers, batches of 32) over photo-like 640 x 480 JPEGs (the synthetic
MS-COCO layout of ``gpu_throughput.py``: ``--workdir``) delivers each batch's files either as a
list of one tensor per file (spmlkit before `spmlkit.data.image_views.RawFiles`: one
shared-memory block, one file descriptor and one memory map per file) or as one `RawFiles`
(one block for the batch). Per form and repeat: the receiving thread's CPU seconds per batch
(here the main thread; on CUDA it is the loader's pinning thread, which holds the interpreter's
lock for much of that work, next to the thread that queues the training steps) and the wall
seconds per batch. The forms alternate, so drifts of the machine fall on both.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_io import write_rows  # noqa: E402
from gpu_throughput import make_coco  # noqa: E402  (the benchmark's synthetic layout)

from spmlkit.data import transforms as T  # noqa: E402
from spmlkit.engine.image_batches import ImageItems, _Collate  # noqa: E402


def _as_list(batch):
    """The batch as spmlkit collated raw files before `RawFiles`: a list of tensors."""
    views, rows = zip(*batch)
    xs, flips = zip(*views)
    return list(xs), torch.tensor(flips, dtype=torch.bool), torch.tensor(rows)


def _thread_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def measure(files, collate, batch: int, workers: int, epochs: int) -> tuple[float, float, int]:
    items = ImageItems(files, T.eval_transform(448), raw=True)
    loader = torch.utils.data.DataLoader(items, batch_size=batch, num_workers=workers,
                                         collate_fn=collate, prefetch_factor=4,
                                         persistent_workers=True)
    for _ in loader:  # the workers started, the files in the page cache
        pass
    t0, c0, n = time.perf_counter(), _thread_cpu(), 0
    for _ in range(epochs):
        for _ in loader:
            n += 1
    wall, cpu = (time.perf_counter() - t0) / n, (_thread_cpu() - c0) / n
    del loader
    return cpu, wall, n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the CSV to write")
    p.add_argument("--workdir", default="/tmp/spmlkit-raw-batches")
    p.add_argument("--images", type=int, default=480)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    root = Path(args.workdir) / "coco"
    make_coco(root, args.images, 10, 640, 480)
    files = sorted(str(f) for f in (root / "train2014").glob("*.jpg"))
    kb = sum(os.path.getsize(f) for f in files) / len(files) / 1024
    forms = {"list of tensors": _as_list, "RawFiles": _Collate((3, 448, 448))}
    rows = []
    for repeat in range(1, args.repeats + 1):
        for form, collate in forms.items():
            cpu, wall, n = measure(files, collate, args.batch, args.workers, args.epochs)
            rows.append({"form": form, "repeat": repeat, "batches": n, "batch": args.batch,
                         "workers": args.workers, "mean_kb": round(kb, 1),
                         "receiver_cpu_ms": round(cpu * 1e3, 2),
                         "wall_ms": round(wall * 1e3, 2),
                         "device": f"cpu, {os.cpu_count()} cores, torch {torch.__version__}"})
            print(rows[-1], flush=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
