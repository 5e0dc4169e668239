"""Cost of the loss's per-call observed-label check in the linear mode's hot loop.

Trains the yeast linear head (batch 8, 3 epochs) with the check on every loss call, and inside
``spmlkit.losses.observed_validated`` (the check skipped: what a caller that validated the whole
matrix once can do), the two interleaved so that a busy machine slows both alike; prints the
minimum and median ms per epoch of each.

    python benchmarks/observed_check.py [--loss an] [--repeats 20]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from spmlkit.loading import load_splits
from spmlkit.engine import TrainConfig, fit_linear
from spmlkit.losses import create_loss, observed_validated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loss", default="an")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    splits = load_splits("yeast")
    x, z = torch.as_tensor(splits.train.x), torch.as_tensor(splits.observed)
    config = TrainConfig(epochs=3, batch_size=8, lr=1e-3)
    # warm-up: the first optimiser step of a process pays one-time imports
    fit_linear(x[:16], z[:16], create_loss(args.loss), TrainConfig(epochs=1), k=splits.k)
    times: dict[str, list] = {"checked every call": [], "observed_validated": []}
    for _ in range(args.repeats):
        for kind, runs in times.items():
            loss = create_loss(args.loss)
            t0 = time.perf_counter()
            if kind == "observed_validated":
                with observed_validated(loss):
                    fit_linear(x, z, loss, config, k=splits.k)
            else:
                fit_linear(x, z, loss, config, k=splits.k)
            runs.append((time.perf_counter() - t0) / config.epochs * 1e3)
    for kind, runs in times.items():
        print(f"{args.loss} {kind:19s}: min {min(runs):6.2f}  median "
              f"{statistics.median(runs):6.2f} ms/epoch")


if __name__ == "__main__":
    main()
