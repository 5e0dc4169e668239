"""How long the training thread stops for a run folder's checkpoint: written in the training
thread (spmlkit before issue 31's follow-up) against written by a thread of its own (now).

    PYTHONPATH=src python benchmarks/checkpoint_stall.py --out results/checkpoint-stall.csv
    PYTHONPATH=src python benchmarks/checkpoint_stall.py --device cuda --out /tmp/stall.csv

The state is the fine-tuning loop's for a model of ResNet-50's size (``--params``, in 161
tensors as ResNet-50's): the weights, the best epoch's weights and Adam's two moments (about
400 MB), built as the loop builds it (`spmlkit.engine.selection.snapshot` of the live
tensors) on ``--device``, and saved through `spmlkit.runs.RunDir.checkpointer` into a run
folder under ``--folder`` after each of ``--epochs`` "epochs" of ``--pause`` seconds (the
training the write can overlap). Per mode: the training thread's seconds in each checkpoint
call; the last write is waited for and not counted (a run waits for it before it finishes).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from spmlkit.engine.optim import LeanAdam
from spmlkit.engine.selection import snapshot
from spmlkit.runs import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_io import write_rows  # noqa: E402  (benchmarks/: the script's folder)


def stalls(device: torch.device, params: int, epochs: int, pause: float, folder: str,
           background: bool) -> list[float]:
    sizes = [params // 161 + (i < params % 161) for i in range(161)]
    weights = [torch.randn(n, device=device, requires_grad=True) for n in sizes]
    opt = LeanAdam([(weights, 1e-3)])
    best = {f"w{i}": w.detach().clone() for i, w in enumerate(weights)}
    out = []
    with tempfile.TemporaryDirectory(dir=folder) as root:
        save = RunDir.create(root, "run").checkpointer(0.0, background=background)
        for _ in range(epochs):
            time.sleep(pause)  # the epoch trains
            t0 = time.perf_counter()
            save(lambda: {**snapshot({"model": {f"w{i}": w for i, w in enumerate(weights)},
                                      "optimizer": opt.state_dict()}), "best": best})
            out.append(time.perf_counter() - t0)
        save.wait()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--params", type=int, default=25_557_032, help="ResNet-50's parameters")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--pause", type=float, default=1.0, help="seconds of an epoch")
    p.add_argument("--folder", default=".", help="where the run folders are written")
    p.add_argument("--repeats", type=int, default=2, help="of each mode, interleaved")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"cpu, {os.cpu_count()} cores"
    rows = []
    for repeat in range(args.repeats):
        for mode in ("training thread", "own thread"):
            got = stalls(device, args.params, args.epochs, args.pause, args.folder,
                         background=mode == "own thread")
            rows.append({"mode": mode, "repeat": repeat + 1,
                         "state_mb": round(4 * 4 * args.params / 2 ** 20),
                         "mean_s": round(sum(got) / len(got), 3), "max_s": round(max(got), 3),
                         "stalls_s": " ".join(f"{s:.3f}" for s in got),
                         "device": f"{name}, torch {torch.__version__}"})
            print(rows[-1], flush=True)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
