"""Stacked (vectorised) linear runs vs one run at a time, measured interleaved (A B A B ...).

Two measurements, each printing every pair and the median ratio (today / new):

- ``yeast``: the default yeast benchmark (``spml benchmark``: 8 methods x 3 seeds x batch {8, 16}
  x lr {1e-2 .. 1e-5} = 192 runs, 25 epochs), ``run_benchmark(..., vectorise=False)`` (today's
  path: one task per run) against ``vectorise=True`` (runs differing only in seed and lr
  stacked, 16 groups of 12), each in a fresh folder, wall time of the whole call (worker start
  included); the two tables must be identical (the wall-time line aside).
- ``coco``: a COCO-shaped synthetic feature store (``--coco-rows`` x 2048 features, 80 labels;
  default 20,000 rows so that one measurement takes well under 3 minutes here, 1 epoch, batch 8,
  4 lrs x 3 seeds = 12 runs of AN) as an ``arrays`` study, vectorise off vs on: on a CPU the
  engine's rule (``stack_limit``: B x D x L = 1.3M > ``CPU_STACK_WORK``) stacks such
  compute-bound runs ``CPU_LARGE_STACK`` (12) at most (here 2 groups of 6, one per worker);
  ``--coco-forced`` also times the engine alone, the 12 runs stacked (``fit_linear_stacked``)
  vs 12 ``fit_linear`` one after the other in one process.

- ``--against SRC``: the yeast benchmark as a user runs it (``spml benchmark``, a fresh
  interpreter each time, so worker start and imports count) with the source tree
  ``SRC`` (an older checkout's ``src``, e.g. the commit the speed issue was written against)
  against this checkout's, interleaved; the tables must be identical.

    python benchmarks/bench_vectorised.py [--repeats 2] [--skip-yeast] [--skip-coco]
        [--coco-rows 20000] [--coco-forced] [--jobs N] [--device cuda] [--against SRC]

On a GPU (``--device cuda``) the coco measurement stacks (the rule has no compute limit there):
``--coco-runs 96`` for the issue's 96-run grid.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _table(text: str) -> str:
    return text.split("Wall time")[0]


def yeast(repeats: int, jobs):
    from spmlkit.experiments.benchmark import run_benchmark

    ratios, tables = [], set()
    root = Path(tempfile.mkdtemp(prefix="bench-vec-yeast-"))
    for i in range(repeats):
        times = {}
        for vec in (False, True):
            t = time.perf_counter()
            res = run_benchmark("yeast", out=root / f"{i}-{vec}", jobs=jobs, progress=False,
                                vectorise=vec)
            times[vec] = time.perf_counter() - t
            tables.add(_table(res["table"]))
        ratios.append(times[False] / times[True])
        print(f"yeast pair {i + 1}: today {times[False]:.1f} s, stacked {times[True]:.1f} s, "
              f"ratio {ratios[-1]:.2f}x", flush=True)
    print(f"yeast: median ratio {statistics.median(ratios):.2f}x over {repeats} pair(s); "
          f"tables identical: {len(tables) == 1}")
    print(next(iter(tables)))
    return ratios


def yeast_against(src: str, repeats: int, jobs):
    """``spml benchmark`` on yeast with the source tree ``src`` vs this checkout's, each in a
    fresh interpreter and folder, interleaved (old, new, old, new ...)."""
    import subprocess

    here = str(Path(__file__).resolve().parents[1] / "src")
    root = Path(tempfile.mkdtemp(prefix="bench-vec-against-"))
    ratios, tables = [], set()
    for i in range(repeats):
        times = {}
        for name, tree in (("old", src), ("new", here)):
            out = root / f"{name}-{i}"
            # the CLI's entry point (older trees have no ``python -m spmlkit``)
            cmd = [sys.executable, "-c", "import sys; from spmlkit.cli import main; "
                   "sys.exit(main())", "benchmark", "--out", str(out), "--quiet"]
            if jobs:
                cmd += ["--jobs", str(jobs)]
            env = {**os.environ, "PYTHONPATH": tree}
            t = time.perf_counter()
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
            times[name] = time.perf_counter() - t
            tables.add(_table((out / "table.md").read_text()))
        ratios.append(times["old"] / times["new"])
        print(f"yeast pair {i + 1}: {src} {times['old']:.1f} s, this checkout "
              f"{times['new']:.1f} s, ratio {ratios[-1]:.2f}x", flush=True)
    print(f"yeast against {src}: median ratio {statistics.median(ratios):.2f}x over {repeats} "
          f"pair(s); tables identical: {len(tables) == 1}")
    return ratios


def coco_store(root: Path, rows: int, features: int = 2048, classes: int = 80, seed: int = 0):
    """A COCO-shaped synthetic store: ``x.npy`` (rows x features, float32) and ``y.npy``
    (rows x classes, 0/1, ~2.9 positives per row, at least one), linearly related."""
    g = np.random.default_rng(seed)
    y = (g.random((rows, classes)) < 2.9 / classes).astype(np.uint8)
    y[np.arange(rows), g.integers(0, classes, rows)] = 1
    proj = g.standard_normal((classes, features), dtype=np.float32) / 4
    x = y.astype(np.float32) @ proj
    x += g.standard_normal(x.shape, dtype=np.float32)
    np.save(root / "x.npy", x)
    np.save(root / "y.npy", y)
    return root / "x.npy", root / "y.npy"


def coco(repeats: int, rows: int, runs: int, jobs, device: str, forced: bool):
    from spmlkit.experiments.study import load_study, run_study

    root = Path(tempfile.mkdtemp(prefix="bench-vec-coco-"))
    x_path, y_path = coco_store(root, rows)
    lrs = [1e-2, 1e-3, 1e-4, 1e-5]
    seeds = max(1, runs // len(lrs))
    spec = load_study({"name": "coco-shaped", "datasets": [{"name": "arrays", "options": {
        "features": str(x_path), "labels": str(y_path)}}], "methods": ["an"],
        "seeds": seeds, "epochs": 1, "grid": {"batch_size": [8], "lr": lrs},
        "train": {"device": device}})
    ratios = []
    for i in range(repeats):
        times = {}
        for vec in (False, True):
            t = time.perf_counter()
            run_study(spec, out=root / f"{i}-{vec}", jobs=jobs, progress=False, vectorise=vec)
            times[vec] = time.perf_counter() - t
        ratios.append(times[False] / times[True])
        print(f"coco-shaped ({rows} x 2048, 80 labels, {seeds * len(lrs)} runs, {device}) pair "
              f"{i + 1}: today {times[False]:.1f} s, new {times[True]:.1f} s, ratio "
              f"{ratios[-1]:.2f}x", flush=True)
    print(f"coco-shaped study: median ratio {statistics.median(ratios):.2f}x")
    if forced:
        _coco_forced(x_path, y_path, lrs, seeds, repeats, device)
    return ratios


def _coco_forced(x_path, y_path, lrs, seeds, repeats, device):
    """The engine alone: R runs stacked (whatever the rule says) vs R single runs, 1 epoch."""
    from spmlkit.loading import load_splits
    from spmlkit.engine import TrainConfig, fit_linear
    from spmlkit.engine.vectorised import fit_linear_stacked
    from spmlkit.losses import create_loss

    splits = load_splits("arrays", "1p", features=str(x_path), labels=str(y_path))
    configs = [TrainConfig(epochs=1, batch_size=8, lr=lr, seed=s, device=device)
               for lr in lrs for s in range(seeds)]
    ratios = []
    for i in range(repeats):
        t = time.perf_counter()
        for c in configs:
            fit_linear(splits.train.x, splits.observed, create_loss("an"), c,
                       x_val=splits.val.x, y_val=splits.val.y)
        single = time.perf_counter() - t
        t = time.perf_counter()
        fit_linear_stacked(splits.train.x, splits.observed,
                           [create_loss("an") for _ in configs], configs, x_val=splits.val.x,
                           y_val=splits.val.y)
        stacked = time.perf_counter() - t
        ratios.append(single / stacked)
        print(f"coco-shaped engine, {len(configs)} runs forced stacked ({device}) pair {i + 1}: "
              f"single {single:.1f} s, stacked {stacked:.1f} s, ratio {ratios[-1]:.2f}x",
              flush=True)
    print(f"coco-shaped engine forced: median ratio {statistics.median(ratios):.2f}x")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--skip-yeast", action="store_true")
    p.add_argument("--skip-coco", action="store_true")
    p.add_argument("--coco-rows", type=int, default=20_000)
    p.add_argument("--coco-runs", type=int, default=12)
    p.add_argument("--coco-forced", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--against", metavar="SRC", help="an older source tree (its src folder) to "
                   "time the yeast benchmark against, as a user runs it")
    args = p.parse_args(argv)
    print(f"python {' '.join(sys.argv)}  (cores: {os.cpu_count()})", flush=True)
    if args.against:
        yeast_against(args.against, args.repeats, args.jobs)
        return
    if not args.skip_yeast:
        yeast(args.repeats, args.jobs)
    if not args.skip_coco:
        coco(args.repeats, args.coco_rows, args.coco_runs, args.jobs, args.device,
             args.coco_forced)


if __name__ == "__main__":
    main()
