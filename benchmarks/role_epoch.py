"""ROLE's epoch against AN's, with its estimator stepped densely (the official algorithm, the
default) or row by row (``estimator_update="rows"``), and what "rows" costs in test mAP on yeast
(issue 44: "a 200,000-row run's epoch within 3x an AN epoch").

1. Cost: CPU seconds (``time.process_time``: every thread of this process; torch on one thread)
   of one epoch of the linear engine (`spmlkit.engine.fit_linear`, one epoch, no val set) on
   synthetic features: N rows x 256 features (N(0, 1), a few correlated blocks) x 50 labels
   (a sparse linear model, about 2.5 positives a row), one observed positive a row, batch 64,
   lr 1e-3, k the true mean. AN and ROLE "rows" are timed a whole epoch; ROLE "dense" too
   up to ``--max-steps`` steps an epoch, beyond that its first ``--sample-steps`` steps of the
   same engine run (``batch_progress`` stops it) and the epoch is extrapolated from them: the
   time up to step ``WARM`` (setup and warm-up) plus the mean step after it times the
   remaining steps. Up to ``--check-rows`` rows dense is timed both ways, so the
   extrapolation can be compared with the whole epoch.
2. Accuracy: test mAP on yeast (`spmlkit.loading.load_splits("yeast")`: the Cole protocol,
   one observed positive a row) of ROLE dense and ROLE rows with the yeast-papers preset's
   settings (linear head, 25 epochs, no early stopping, batch {8, 16} x lr {1e-2 .. 1e-5}
   selected on val mAP, 3 seeds), run as one study (``OUT/study``; re-running resumes it).

    python benchmarks/role_epoch.py --out runs/role-epoch

Writes ``OUT/role-epoch.csv`` (both parts; ``results/role-epoch.csv`` is a copy) and prints
the tables.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from spmlkit.engine import TrainConfig, fit_linear
from spmlkit.engine.loop import batch_progress
from spmlkit.losses import create_loss

#: the steps after which a partial epoch's per-step time is measured (setup and warm-up before)
WARM = 10
METHODS = {"an": ("an", {}), "role_dense": ("role", {"estimator_update": "dense"}),
           "role_rows": ("role", {"estimator_update": "rows"})}


class _Stop(Exception):
    pass


def make_data(rows: int, features: int, labels: int, seed: int = 0):
    """``(x, observed, k)``: features, one observed positive a row, the true mean count."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features), dtype=np.float32)
    x[:, 10:20] += x[:, :10]
    w = (rng.standard_normal((features, labels)) * (rng.random((features, labels)) < 0.1))
    s = x @ w.astype(np.float32) + rng.standard_normal((rows, labels), dtype=np.float32)
    y = s > np.quantile(s, 0.95, axis=0)
    y[~y.any(axis=1), 0] = True
    observed = np.zeros((rows, labels), dtype=np.int8)
    pick = (rng.random(rows)[:, None] * y.sum(1, keepdims=True)).astype(int)
    cols = np.argmax(np.cumsum(y, axis=1) > pick, axis=1)  # a random positive of each row
    observed[np.arange(rows), cols] = 1
    return x, observed, float(y.sum(1).mean())


def time_epoch(x, z, k, method: str, batch: int, max_steps: int | None) -> dict:
    """One epoch's CPU seconds of ``method`` (whole, or extrapolated from ``max_steps``)."""
    name, hp = METHODS[method]
    loss = create_loss(name, **hp)
    steps = math.ceil(len(x) / batch)
    marks: list[float] = []

    def report(rows, per_epoch):
        marks.append(time.process_time())
        if max_steps is not None and len(marks) >= max_steps:
            raise _Stop

    config = TrainConfig(epochs=1, batch_size=batch, lr=1e-3, seed=0)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        with batch_progress(report):
            fit_linear(x, z, loss, config, k=k)
    except _Stop:
        pass
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if max_steps is None or len(marks) < max_steps:
        return {"steps_timed": len(marks), "cpu_s": cpu, "wall_s": wall, "how": "whole epoch"}
    step = (marks[-1] - marks[WARM - 1]) / (len(marks) - WARM)
    return {"steps_timed": len(marks), "cpu_s": marks[WARM - 1] - cpu0 + step * (steps - WARM),
            "wall_s": float("nan"), "step_ms": 1e3 * step,
            "how": f"extrapolated from {len(marks)} steps"}


def cost_table(sizes, features, labels, batch, max_steps, sample_steps,
               check_rows) -> list[dict]:
    out = []
    for n in sizes:
        x, z, k = make_data(n, features, labels)
        steps = math.ceil(n / batch)
        an = None
        for method in METHODS:
            caps = [None]  # a whole epoch
            if method == "role_dense" and sample_steps < steps:
                caps = ([None] if steps <= max_steps else []) + \
                    ([sample_steps] if steps > max_steps or n <= check_rows else [])
            for cap in caps:
                r = time_epoch(x, z, k, method, batch, cap)
                an = r["cpu_s"] if method == "an" else an
                row = {"part": "cost", "rows": n, "features": features, "labels": labels,
                       "batch": batch, "epoch_steps": steps, "method": method, **r,
                       "ratio_to_an": r["cpu_s"] / an}
                out.append(row)
                print(f"{n:>8,} {method:<11} {r['cpu_s']:9.2f} CPU s  "
                      f"({row['ratio_to_an']:6.2f}x AN; {r['how']})", flush=True)
    return out


def accuracy_table(out: Path, seeds: int, jobs: int) -> list[dict]:
    """ROLE dense and rows on yeast with the yeast-papers preset's settings, as one study."""
    from spmlkit.cli import main as spml

    spec = {"name": "role-epoch-yeast",
            "title": "ROLE's estimator stepped densely (official) or row by row, yeast",
            "datasets": ["yeast"],
            "methods": [{"label": "ROLE dense", "spec": "role"},
                        {"label": "ROLE rows", "spec": "role"}],
            "mode": "linear", "seeds": seeds, "epochs": 25, "early_stop": "none",
            "grid": {"batch_size": [8, 16], "lr": [1.0e-2, 1.0e-3, 1.0e-4, 1.0e-5]},
            "hparams": {"ROLE rows": {"estimator_update": "rows"}}}
    spec_path = out / "study.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    code = spml(["study", "run", str(spec_path), "--out", str(out / "study"), "--jobs",
                 str(jobs), "--quiet"])
    if code:
        raise SystemExit(f"the study failed (exit {code}); see {out / 'study'}")
    print(f"study: {time.perf_counter() - wall0:.0f} s wall, {time.process_time() - cpu0:.0f} "
          f"CPU s in this process")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        spml(["study", "table", str(out / "study"), "--format", "csv"])
    table = []
    for cells in csv.DictReader(buf.getvalue().splitlines()):
        method = {"ROLE dense": "role_dense", "ROLE rows": "role_rows"}[cells["method"]]
        table.append({"part": "yeast_test_map", "method": method,
                      "test_map_mean": float(cells["yeast mean"]),
                      "test_map_std": float(cells["yeast std"]), "seeds": int(cells["yeast n"]),
                      "how": "yeast-papers settings: 25 epochs, batch {8, 16} x lr "
                             "{1e-2 .. 1e-5} selected on val mAP; mean +- std over seeds"})
        print(f"yeast {cells['method']:<11} test mAP {cells['yeast mean']} +- "
              f"{cells['yeast std']}")
    return table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/role-epoch")
    p.add_argument("--sizes", default="10000,50000,200000")
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--labels", type=int, default=50)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=1000,
                   help="ROLE dense: a whole epoch up to this many steps, else extrapolated")
    p.add_argument("--sample-steps", type=int, default=200,
                   help="the steps an extrapolated epoch is timed on")
    p.add_argument("--check-rows", type=int, default=50_000,
                   help="dense also extrapolated up to this N (to compare with its whole epoch)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--skip-yeast", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = cost_table(sizes, args.features, args.labels, args.batch, args.max_steps,
                      args.sample_steps, args.check_rows)
    if not args.skip_yeast:
        rows += accuracy_table(out, args.seeds, args.jobs)
    fields = ["part", "rows", "features", "labels", "batch", "method", "epoch_steps",
              "steps_timed", "cpu_s", "wall_s", "ratio_to_an", "test_map_mean", "test_map_std",
              "seeds", "how"]
    with open(out / "role-epoch.csv", "w", newline="", encoding="utf-8") as f:
        f.write(f"# python benchmarks/role_epoch.py {' '.join(argv or sys.argv[1:])}\n"
                f"# {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
                f"on {args.threads} thread(s)\n")
        wr = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        wr.writeheader()
        for row in rows:
            wr.writerow({key: (round(v, 3) if isinstance(v, float) else v)
                         for key, v in row.items()})
    print(f"wrote {out / 'role-epoch.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
