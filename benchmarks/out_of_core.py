"""Training on feature stores larger than memory: peak anonymous memory and time per epoch.

Builds an N x D float16 feature store in spmlkit's store format (``features.npy`` + ``meta.json``,
what ``spml extract`` writes; synthetic features with planted labels: each row holds 1-3 of C
classes and its features are the sum of those classes' prototypes plus noise), a test store
beside it, and the same rows as ``.npy`` files for the ``arrays`` source. Then, each in a fresh
child process whose ``RssAnon`` (and its children's, summed; not the page cache) is sampled
every 20 ms:

- ``store-single``: one linear run (AN, batch 16, lr 1e-3) on the memory-mapped store;
- ``store-stacked``: the default linear grid (AN, batch {8, 16} x lr {1e-2 ... 1e-5}) through
  ``train_runs`` (stacked runs);
- ``arrays``: ``spml train --dataset arrays --data features=x.npy ...`` (the command line);
- with ``--compare``: the same single and stacked runs with the store read into memory first
  (today's in-memory path), to compare results and time per epoch (use a store that fits).

    python benchmarks/out_of_core.py --rows 1000000 --epochs 1          # the 1M-row store
    python benchmarks/out_of_core.py --rows 100000 --epochs 3 --compare # store vs in memory

Seconds per epoch are wall-clock time and, in parentheses, the child's CPU time (user + system,
both threads: steadier than wall-clock time on a shared machine).

Prints one line per case: peak RssAnon, seconds per epoch, and the runs' best epochs and test
mAP; ``--compare`` also says whether the store's results equal the in-memory ones.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()


# ---- memory sampling ----------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _rss_anon_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_anon(pid: int) -> int:
    """RssAnon (KiB) of ``pid`` and all its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += _rss_anon_kib(p)
        todo += _children(p)
    return total


def run_sampled(cmd: list[str], env=None) -> tuple[int, float, int]:
    """Run ``cmd``; returns (exit code, seconds, peak RssAnon of its process tree in KiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    peak = 0
    stop = threading.Event()

    def sample():
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss_anon(proc.pid))
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    rc = proc.wait()
    stop.set()
    thread.join()
    return rc, time.perf_counter() - start, peak


# ---- the data -----------------------------------------------------------------------------------
def write_store(folder: Path, n: int, d: int, classes: int, seed: int, dtype: str,
                chunk: int = 65536) -> None:
    """A store (features.npy + meta.json as spmlkit.features writes them) and labels.npy."""
    from spmlkit.features import StorePlan, _write_meta

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    protos = np.random.default_rng(12345).standard_normal((classes, d)).astype(np.float32)
    feats = np.lib.format.open_memmap(folder / "features.npy", mode="w+", dtype=dtype,
                                      shape=(n, d))
    labels = np.zeros((n, classes), dtype=np.uint8)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        count = rng.integers(1, 4, size=m)
        y = np.zeros((m, classes), dtype=np.uint8)
        for j in range(3):
            cols = rng.integers(0, classes, size=m)
            y[np.arange(m)[count > j], cols[count > j]] = 1
        x = y.astype(np.float32) @ protos * 0.5 + rng.standard_normal((m, d), dtype=np.float32)
        feats[start:start + m] = x.astype(dtype)
        labels[start:start + m] = y
    feats.flush()
    del feats
    np.save(folder / "labels.npy", labels)
    plan = StorePlan(folder, key=f"synthetic-{n}x{d}-{seed}", fields={"synthetic": True},
                     n=n, d=d, dtype=dtype)
    _write_meta(plan, n, 0.0, [])


def build(root: Path, rows: int, dim: int, classes: int, dtype: str) -> None:
    for name, n, seed in (("pool", rows, 0), ("test", max(1000, rows // 20), 1)):
        folder = root / name
        if (folder / "meta.json").is_file():
            continue
        t = time.perf_counter()
        write_store(folder, n, dim, classes, seed, dtype)
        print(f"wrote {folder} ({n} x {dim} {dtype}) in {time.perf_counter() - t:.1f} s",
              flush=True)


# ---- one case, in a child process ---------------------------------------------------------------
def arrays_argv(root: Path, epochs: int, threads: int) -> list[str]:
    """``spml``'s arguments of the ``arrays`` case (one run of ``spml train --dataset
    arrays`` on the stores' files, the Adam mode)."""
    return ["train", "--dataset", "arrays", "--solver", "adam",
            "--data", f"features={root / 'pool' / 'features.npy'}",
            "--data", f"labels={root / 'pool' / 'labels.npy'}",
            "--data", f"test_features={root / 'test' / 'features.npy'}",
            "--data", f"test_labels={root / 'test' / 'labels.npy'}",
            "--loss", "an", "--epochs", str(epochs), "--batch-size", "16",
            "--threads", str(threads), "--out", str(root / "cli-runs")]


def child(args) -> None:
    if args.case == "arrays":  # the command line, in this process (out_of_core_stages.py)
        from spmlkit.cli import main as spml

        code = spml(arrays_argv(Path(args.root), args.epochs, args.threads))
        Path(args.result).write_text(json.dumps({"rc": code}))
        return
    import torch

    from spmlkit.data.protocol import Dataset, LabelledSet, make_splits
    from spmlkit.engine import TrainConfig
    from spmlkit.methods import train_runs

    torch.set_num_threads(args.threads)
    root = Path(args.root)

    def load(name):
        x = np.load(root / name / "features.npy", mmap_mode="r")
        if args.in_memory:
            x = np.asarray(x)   # today's path: the whole matrix in memory
        return LabelledSet(x, np.load(root / name / "labels.npy"))

    # the Dataset is let go once split, as load_splits (spml train) lets it go: its pool's full
    # labels are not kept beside the splits' own
    splits = make_splits(Dataset("synthetic", load("pool"), load("test")), "1p", seed=1)
    batches = [int(b) for b in args.batches.split(",")]
    lrs = [float(v) for v in args.lrs.split(",")]
    grid = [(16, 1e-3)] if args.case == "single" else \
        [(b, lr) for b in batches for lr in lrs]
    results = []
    start, cpu = time.perf_counter(), time.process_time()
    for bs in sorted({b for b, _ in grid}):
        configs = [TrainConfig(epochs=args.epochs, batch_size=bs, lr=lr, seed=1)
                   for b, lr in grid if b == bs]
        out = train_runs("linear", splits, "an", {}, configs)
        for config, res in zip(configs, out):
            if isinstance(res, BaseException):
                raise res
            results.append({"batch": bs, "lr": config.lr, "best_epoch": res["best_epoch"],
                             "test_map": res["test_map"]})
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    Path(args.result).write_text(json.dumps({"seconds": seconds, "cpu_seconds": cpu,
                                             "runs": results}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=1280)
    p.add_argument("--classes", type=int, default=80)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--root", default=None, help="where the stores go (default "
                   "runs/out-of-core-<rows>)")
    p.add_argument("--compare", action="store_true", help="also the in-memory path")
    p.add_argument("--batches", default="8,16", help="the stacked grid's batch sizes (each "
                   "batch size is one stack of the four learning rates)")
    p.add_argument("--lrs", default="1e-2,1e-3,1e-4,1e-5", help="the stacked grid's learning "
                   "rates (one stack per batch size; 8 or more: the stack's runs share their "
                   "rows, one seed)")
    p.add_argument("--cases", default="single,stacked,arrays")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--case", default="single", help=argparse.SUPPRESS)
    p.add_argument("--in-memory", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.root = args.root or f"runs/out-of-core-{args.rows}"
    if args.child:
        return child(args)
    root = Path(args.root)
    build(root, args.rows, args.dim, args.classes, args.dtype)
    cases = [c for c in args.cases.split(",") if c]
    rows = []
    for case in cases:
        for in_memory in ([False, True] if args.compare and case != "arrays" else [False]):
            result = root / f"result-{case}-{'mem' if in_memory else 'store'}.json"
            if case == "arrays":
                spml = str(Path(sys.executable).with_name("spml"))
                cmd = [spml, *arrays_argv(root, args.epochs, args.threads)]
            else:
                cmd = [sys.executable, str(HERE), "--child", "--case", case, "--root", str(root),
                       "--epochs", str(args.epochs), "--threads", str(args.threads),
                       "--batches", args.batches, "--lrs", args.lrs, "--result", str(result),
                       *(["--in-memory"] if in_memory else [])]
            rc, seconds, peak = run_sampled(cmd)
            info = json.loads(result.read_text()) if result.is_file() and rc == 0 else {}
            label = f"{case}{' (in memory)' if in_memory else ''}"
            per_epoch = info.get("seconds", seconds) / args.epochs
            cpu_epoch = info.get("cpu_seconds", float("nan")) / args.epochs
            rows.append({"case": label, "rc": rc, "peak_rss_anon_mib": round(peak / 1024, 1),
                         "seconds": round(seconds, 1), "train_seconds_per_epoch":
                         round(per_epoch, 2), "train_cpu_seconds_per_epoch": round(cpu_epoch, 2),
                         "runs": info.get("runs")})
            print(f"{label:24s} rc {rc}  peak RssAnon {peak / 1024:8.1f} MiB  "
                  f"{seconds:7.1f} s in all, {per_epoch:7.2f} s training per epoch "
                  f"({cpu_epoch:.2f} s of CPU time)", flush=True)
            if info.get("runs"):
                for r in info["runs"]:
                    print(f"    batch {r['batch']:2d} lr {r['lr']:g}: best epoch "
                          f"{r['best_epoch']}, test mAP {r['test_map']:.4f}")
    if args.compare:
        for case in cases:
            a = next((r for r in rows if r["case"] == case), None)
            b = next((r for r in rows if r["case"] == f"{case} (in memory)"), None)
            if a and b and a["runs"] and b["runs"]:
                same = all(x["best_epoch"] == y["best_epoch"] and
                           abs(x["test_map"] - y["test_map"]) < 1e-6
                           for x, y in zip(a["runs"], b["runs"]))
                ratio = a["train_seconds_per_epoch"] / max(b["train_seconds_per_epoch"], 1e-9)
                cpu = a["train_cpu_seconds_per_epoch"] / \
                    max(b["train_cpu_seconds_per_epoch"], 1e-9)
                print(f"{case}: store vs in memory: same best epochs and test mAP (1e-6): "
                      f"{same}; time per epoch ratio {ratio:.2f} (CPU time {cpu:.2f})")
    (root / "summary.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
