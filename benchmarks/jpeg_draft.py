"""``spml extract --jpeg-draft`` against the full decode, on photos of three sizes.

    PYTHONPATH=src python benchmarks/jpeg_draft.py --out results/jpeg-draft.csv

Writes photo-like JPEGs (``gpu_throughput.py``'s generator: smooth colour fields, edges, sensor
noise) of 640 x 480 (an MS-COCO / VOC photo), 1600 x 1200 and 4000 x 3000 (a 12-megapixel
phone photo, as species observations are), ``--images`` of each, into ``--workdir``. For each
size: the loader alone (spmlkit's loader over the eval view at 224 px, the decode and resize
in one worker: milliseconds per image), then `spmlkit.features.extract_features` with the
pretrained EfficientNet-Lite0 at 224 px (``--workers`` loader workers, a fresh store each
time: images per second), with the full decode (spmlkit's default; what a user's own PIL
loop does) and with ``--jpeg-draft``; and how far the drafted features are from the full
decode's (the mean over images of the cosine similarity, the largest absolute difference
relative to the features' scale).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_io import write_rows  # noqa: E402

SIZES = ((640, 480), (1600, 1200), (4000, 3000))


def photos(root: Path, width: int, height: int, n: int) -> list[str]:
    """``n`` photo-like JPEGs of ``width`` x ``height`` under ``root`` (kept when there)."""
    import multiprocessing

    from gpu_throughput import _photo

    folder = root / f"{width}x{height}"
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(str(folder / f"{i:04d}.jpg"), 1000 * width + i, width, height) for i in range(n)]
    todo = [j for j in jobs if not Path(j[0]).is_file()]
    if todo:
        with multiprocessing.Pool(os.cpu_count() or 1) as pool:
            pool.map(_photo, todo)
    return [j[0] for j in jobs]


def loader_ms(paths, draft: bool) -> float:
    """Milliseconds per image of spmlkit's loader (eval view, 224 px, one worker), the second
    of two passes."""
    from spmlkit.accel import acceleration
    from spmlkit.data.transforms import eval_transform
    from spmlkit.engine import TrainConfig
    from spmlkit.engine.image_batches import GlobalBatchSampler, ImageItems, make_loader

    with acceleration(jpeg_draft=draft):
        sampler = GlobalBatchSampler(len(paths), 8, 0, 0, 1)
        loader = make_loader(ImageItems(paths, eval_transform(224)), sampler,
                             TrainConfig(batch_size=8, num_workers=1), (3, 224, 224),
                             torch.device("cpu"))
    seconds = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        for _ in loader:
            pass
        seconds.append(time.perf_counter() - t0)
    return 1000 * seconds[-1] / len(paths)


def extract(paths, draft: bool, workers: int, cache: Path) -> tuple[float, np.ndarray]:
    from spmlkit.accel import acceleration
    from spmlkit.features import extract_features

    with acceleration(jpeg_draft=draft):
        t0 = time.perf_counter()
        feats = extract_features(paths, "efficientnet_lite0", size=224, num_workers=workers,
                                 cache_dir=cache, progress=False, batch_size=16)
        seconds = time.perf_counter() - t0
    return len(paths) / seconds, np.asarray(feats)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", default="/tmp/spmlkit-jpeg-draft")
    p.add_argument("--images", type=int, default=32, help="photos of each size")
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}"
    rows = []
    for width, height in SIZES:
        paths = photos(Path(args.workdir), width, height, args.images)
        full_ms, draft_ms = loader_ms(paths, False), loader_ms(paths, True)
        with tempfile.TemporaryDirectory() as cache:
            full_rate, full = extract(paths, False, args.workers, Path(cache))
            draft_rate, drafted = extract(paths, True, args.workers, Path(cache))
        cosine = np.sum(full * drafted, axis=1) / (np.linalg.norm(full, axis=1)
                                                   * np.linalg.norm(drafted, axis=1))
        for decode, ms, rate in (("full", full_ms, full_rate), ("jpeg-draft", draft_ms,
                                                                 draft_rate)):
            rows.append({"photo": f"{width}x{height}", "decode": decode,
                         "loader_ms_per_image": round(ms, 2),
                         "extract_images_per_s": round(rate, 1),
                         "speedup": round(rate / full_rate, 2),
                         "mean_cosine_to_full": round(float(cosine.mean()), 5)
                         if decode != "full" else "",
                         "max_abs_diff_rel": round(float(np.abs(full - drafted).max()
                                                         / np.abs(full).max()), 4)
                         if decode != "full" else "",
                         "images": len(paths), "workers": args.workers, "machine": machine})
            print(rows[-1], flush=True)
    write_rows(args.out, rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
