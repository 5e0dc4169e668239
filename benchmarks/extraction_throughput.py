"""Feature extraction throughput: ``extract_features`` vs the backbone's bare forward pass.

The bare forward pass runs the backbone (same instance, eval mode, same memory format, same
threads, same batch size, inference mode) over tensors decoded and transformed beforehand and
held in memory: the ceiling for a pipeline that also has to read, decode and resize every image.
``extract_features`` does all of that (DataLoader worker processes decode while the main
process runs the backbone) and writes every batch into a fresh memory-mapped store with its
done-mask. The ratio of the two rates is the pipeline's efficiency (target >= 0.8).

Images: by default ``--n`` JPEGs of natural-ish content (smooth colour fields, gradients, shapes
and some texture; quality 90) at VOC's typical 500 x 375, generated with a fixed seed; with
``--source fmnist_mosaic`` the images of that registered source (small PNGs).

    python benchmarks/extraction_throughput.py [--n 300] [--backbone efficientnet_lite0]
        [--batch-size 32] [--workers N] [--device cpu] [--json results.json]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

from spmlkit.data.image_files import open_image
from spmlkit.features import extract_features, make_transform
from spmlkit.machine import default_workers
from spmlkit.models import create_backbone


def natural_jpegs(folder: Path, n: int, size=(500, 375), seed: int = 0) -> list[str]:
    """``n`` JPEGs with low-frequency colour, a gradient, random shapes and fine texture."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    paths = []
    for i in range(n):
        coarse = rng.random((6, 8, 3)).astype(np.float32)
        base = np.asarray(Image.fromarray((coarse * 255).astype(np.uint8)).resize(
            (w, h), Image.Resampling.BICUBIC), dtype=np.float32)
        angle = rng.uniform(0, 2 * np.pi)
        grad = (np.cos(angle) * xx / w + np.sin(angle) * yy / h)[..., None] * 60.0
        texture = rng.normal(0, 12, (h, w, 1)).astype(np.float32)
        arr = np.clip(base * 0.8 + grad + texture, 0, 255).astype(np.uint8)
        img = Image.fromarray(arr)
        draw = ImageDraw.Draw(img)
        for _ in range(rng.integers(3, 9)):
            x0, y0 = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
            x1, y1 = x0 + int(rng.integers(20, 200)), y0 + int(rng.integers(20, 160))
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1),
                                                                     fill=colour)
        img = img.filter(ImageFilter.GaussianBlur(0.8))
        path = folder / f"img{i:04d}.jpg"
        img.save(path, "JPEG", quality=90)
        paths.append(str(path))
    return paths


def bare_forward(net, x: torch.Tensor, batch_size: int, device, channels_last: bool) -> float:
    """Images per second of the backbone alone on pre-decoded tensors."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net.eval().to(device, memory_format=fmt)
    with torch.inference_mode():
        net(x[:batch_size].to(device).contiguous(memory_format=fmt))   # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for start in range(0, len(x), batch_size):
            out = net(x[start:start + batch_size].to(device).contiguous(memory_format=fmt))
            out.float().cpu()          # the features leave the device, as in extraction
        if device.type == "cuda":
            torch.cuda.synchronize()
        return len(x) / (time.perf_counter() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300, help="images (default 300)")
    ap.add_argument("--source", default="jpeg", help="'jpeg' (generated) or fmnist_mosaic")
    ap.add_argument("--backbone", default="efficientnet_lite0")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=None,
                    help=f"decoding processes (default {default_workers()} here)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = ap.parse_args(argv)

    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    workers = default_workers() if args.workers is None else args.workers
    tmp = Path(tempfile.mkdtemp(prefix="spml-extract-bench-"))
    if args.source == "jpeg":
        items = natural_jpegs(tmp / "images", args.n)
    else:
        from spmlkit.loading import load_dataset

        items = list(load_dataset(args.source).pool.x)[: args.n]
    net = create_backbone(args.backbone)
    tf, _ = make_transform("eval", net.input_size, net.mean, net.std)

    t0 = time.perf_counter()
    x = torch.stack([tf(open_image(p)) for p in items])
    decode_rate = len(items) / (time.perf_counter() - t0)   # one process, for reference

    bare = bare_forward(net, x, args.batch_size, device, channels_last=True)
    t0 = time.perf_counter()
    feats = extract_features(items, net, batch_size=args.batch_size, num_workers=workers,
                             cache_dir=tmp / "cache", device=device, dtype=args.dtype,
                             threads=threads, progress=False)
    extract = len(items) / (time.perf_counter() - t0)
    bare_after = bare_forward(net, x, args.batch_size, device, channels_last=True)
    bare_mean = (bare + bare_after) / 2
    with torch.inference_mode():
        check = net.eval()(x[:4].to(device).contiguous(memory_format=torch.channels_last))
    max_diff = float(np.abs(np.asarray(feats[:4], np.float32) - check.float().cpu().numpy()).max())

    res = {"backbone": args.backbone, "images": len(items), "source": args.source,
           "image_size": list(Image.open(items[0]).size), "input_size": net.input_size,
           "device": str(device), "torch_threads": threads, "workers": workers,
           "cpu_count": os.cpu_count(), "batch_size": args.batch_size, "dtype": args.dtype,
           "decode_transform_img_per_s_1proc": round(decode_rate, 2),
           "bare_forward_img_per_s": round(bare_mean, 2),
           "bare_forward_before_after": [round(bare, 2), round(bare_after, 2)],
           "extract_features_img_per_s": round(extract, 2),
           "ratio": round(extract / bare_mean, 3), "target": 0.8,
           "max_abs_diff_vs_bare": max_diff}
    for k, v in res.items():
        print(f"{k:34s} {v}")
    print("PASS" if res["ratio"] >= 0.8 else "BELOW TARGET", f"(ratio {res['ratio']:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
