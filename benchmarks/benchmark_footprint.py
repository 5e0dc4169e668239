"""What ``spml benchmark --solver adam`` leaves on disk and holds in memory, against one run.

Draws an N x 256 float16 feature store with 50 labels (``out_of_core.write_store``: planted
prototypes, 1-3 positives a row) and a test store of N / 20 rows, then, each command in a
fresh process tree whose ``RssAnon`` is sampled every 20 ms (the main process, its fork
server and its workers, summed; not the page cache):

- ``one run``: ``spml train --solver adam --dataset arrays ...`` (AN, one epoch, batch 16);
- ``benchmark``: ``spml benchmark --solver adam --dataset arrays ...`` with ``--losses`` (default
  an,wan,epr,hill) x ``--seeds`` x the default grid on your own data (batch 8, 16 x lr 1e-2 ...
  1e-5 x 3 weight decays) and the reference rows, one epoch, ``--jobs 1`` (ROLE's dense
  estimator, stacked over a grid, is a working set of its own: R x N x L and Adam's moments);
- ``benchmark --train-predictions``: the same, keeping every run's train probabilities.

Prints and writes (``--out``/benchmark-footprint.csv) per command: runs, peak RssAnon, bytes
written under its folder, and wall seconds::

    python benchmarks/benchmark_footprint.py --rows 50000 --out DIR
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import out_of_core  # noqa: E402

LOSSES = "an,wan,epr,hill"


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--labels", type=int, default=50)
    p.add_argument("--losses", default=LOSSES)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--out", default="runs/benchmark-footprint")
    p.add_argument("--cases", default="one,benchmark,benchmark-train")
    args = p.parse_args(argv)
    out = Path(args.out)
    data = out / "data"
    for name, n, seed in (("pool", args.rows, 0), ("test", max(1000, args.rows // 20), 1)):
        if not (data / name / "meta.json").is_file():
            out_of_core.write_store(data / name, n, args.features, args.labels, seed, "float16")
    spml = str(Path(sys.executable).with_name("spml"))
    source = ["--dataset", "arrays",
              "--data", f"features={data / 'pool' / 'features.npy'}",
              "--data", f"labels={data / 'pool' / 'labels.npy'}",
              "--data", f"test_features={data / 'test' / 'features.npy'}",
              "--data", f"test_labels={data / 'test' / 'labels.npy'}"]
    commands = {
        "one": [spml, "train", "--solver", "adam", *source, "--loss", "an", "--epochs", "1",
                "--batch-size", "16", "--quiet", "--out"],
        "benchmark": [spml, "benchmark", "--solver", "adam", *source, "--losses", args.losses,
                      "--seeds", str(args.seeds), "--epochs", "1", "--jobs", "1", "--quiet",
                      "--out"],
    }
    commands["benchmark-train"] = [*commands["benchmark"][:-1], "--train-predictions", "--out"]
    rows = []
    for case in [c for c in args.cases.split(",") if c]:
        folder = out / f"runs-{case}"
        shutil.rmtree(folder, ignore_errors=True)
        cmd = [*commands[case], str(folder)]
        rc, seconds, peak = out_of_core.run_sampled(cmd)
        runs = len(list((folder).rglob("final.json")))
        if case != "one" and (folder / "results.json").is_file():
            runs = len(list((folder / "runs").iterdir()))
        row = {"case": case, "rows": args.rows, "features": args.features,
               "labels": args.labels, "runs": runs, "rc": rc,
               "peak_rss_anon_mib": round(peak / 1024, 1),
               "written_mib": round(folder_bytes(folder) / 2**20, 1),
               "seconds": round(seconds, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(out / "benchmark-footprint.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out / 'benchmark-footprint.csv'} at {time.strftime('%Y-%m-%d %H:%M')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
