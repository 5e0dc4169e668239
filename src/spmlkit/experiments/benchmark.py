"""The paper's comparison: every method x seed over the hyperparameter grid, selected on val mAP.

A *method* is a loss name, optionally with regularisers and a regime: ``an`` trains on the
single-positive regime (``1p``), ``bce@full`` on full labels, ``an+highrank:1e-3`` adds the
high-rank regulariser to AN. Two reference rows are added by default, as in Cole et al.
Table 1: ``bce`` (``bce@full``, all labels) and ``iun`` (``bce@1p_alln``, one positive and every
negative).

Grid points run in parallel worker processes (:mod:`spmlkit.experiments.pool`, the runner that
:mod:`spmlkit.experiments.study` uses too); each finished point is appended to
``DIR/grid.jsonl`` as it completes, so an interrupted benchmark resumes where it stopped. At the
end ``DIR/results.json`` (one record per method x seed, the grid point with the best val mAP) and
``DIR/table.md`` are written atomically.
"""
from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engine import TrainConfig
from ..losses import LOSSES
from ..losses.regularizers import parse_regularizers
from ..runs import write_json, write_text
from .pool import default_jobs, run_tasks

DEFAULT_LOSSES = ("an", "an_ls", "wan", "epr", "role", "pr")
REFERENCES = {"bce": ("bce", "full", "BCE, all labels (All P. & All N.)"),
              "iun": ("bce", "1p_alln", "IUN, one positive + all negatives (1 P. & All N.)")}
PAPER_GRID = {"batch_size": (8, 16), "lr": (1e-2, 1e-3, 1e-4, 1e-5)}


@dataclass(frozen=True)
class Method:
    label: str
    loss: str
    regime: str
    reg: tuple = ()


def parse_methods(losses, references=("bce", "iun")) -> list[Method]:
    """``["an", "bce@full"]`` -> methods; ``"all"`` stands for every registered loss (but bce,
    a reference row) and may be combined with more specs (``"all,opml@full"``)."""
    if isinstance(losses, str):
        losses = [s.strip() for s in losses.split(",") if s.strip()]
    every = [n for n in LOSSES.names() if n != "bce"]
    losses = [name for spec in losses for name in (every if spec == "all" else [spec])]
    out = []
    for spec in losses:
        name, _, regime = spec.partition("@")
        if name in REFERENCES and not regime:
            loss, regime, _ = REFERENCES[name]
            out.append(Method(name, loss, regime))
            continue
        name, *reg = name.split("+")
        LOSSES.get(name)  # unknown names fail here, with suggestions
        if reg:
            parse_regularizers(reg)  # so does a bad regulariser spec
        out.append(Method(spec, name, regime or "1p", tuple(reg)))
    for ref in references or ():
        if ref not in REFERENCES:
            raise ValueError(f"unknown reference {ref!r}; known: {', '.join(REFERENCES)}")
        if all(m.label != ref for m in out):
            out.append(Method(ref, *REFERENCES[ref][:2]))
    return out


# ---- worker side (run through spmlkit.experiments.pool) ----------------------------------------
def _run_point(task: dict) -> dict:
    from .pool import cached_splits
    from ..methods import train_run

    task = dict(task)
    dataset, options = task.pop("dataset"), task.pop("dataset_options")
    splits = cached_splits(dataset, task["regime"], options)
    config = TrainConfig(epochs=task["epochs"], batch_size=task["batch_size"], lr=task["lr"],
                         seed=task["seed"], early_stop=task["early_stop"])
    try:
        res = train_run("linear", splits, task["loss"], task.get("hparams"), config)
    except FloatingPointError as err:  # a diverged grid point loses the selection, visibly
        res = {"val_map": float("nan"), "test_map": float("nan"), "error": str(err),
               "train_recovery_map": float("nan"), "best_epoch": 0, "seconds": 0.0}
    res.pop("test", None)
    return {**task, **res}


def _key(rec: dict) -> tuple:
    return (rec["method"], rec["seed"], rec["batch_size"], rec["lr"])


def run_benchmark(dataset: str = "yeast", losses=DEFAULT_LOSSES, references=("bce", "iun"),
                  seeds: int = 3, out="runs/benchmark", jobs: int | None = None,
                  epochs: int = 25, grid: dict | None = None, early_stop: str = "none",
                  hparams: dict | None = None, dataset_options: dict | None = None,
                  progress: bool = True) -> dict:
    """Run the grid for every method and seed; write grid.jsonl, results.json and table.md.

    Args:
        hparams: per-loss hyperparameter overrides, ``{"epr": {"lam": 2.0}}``.
    Returns:
        ``{"results": [...], "table": str, "seconds": float}``.
    """
    from tqdm import tqdm

    methods = parse_methods(losses, references)
    grid = {**PAPER_GRID, **(grid or {})}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    grid_file = out / "grid.jsonl"
    done = {}
    if grid_file.exists():
        for line in grid_file.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                done[_key(rec)] = rec
    tasks = []
    for m, seed, bs, lr in itertools.product(methods, range(seeds), grid["batch_size"],
                                             grid["lr"]):
        hp = dict((hparams or {}).get(m.label, (hparams or {}).get(m.loss)) or {})
        if m.reg:
            hp["reg"] = list(m.reg)
        task = {"method": m.label, "loss": m.loss, "regime": m.regime, "seed": seed,
                "batch_size": bs, "lr": lr, "epochs": epochs, "early_stop": early_stop,
                "hparams": hp}
        if _key(task) not in done:
            tasks.append(task)
    # longest first (small batches, stateful losses), for a balanced pool
    tasks.sort(key=lambda t: (t["batch_size"], t["loss"] != "role"))
    jobs = default_jobs(jobs, len(tasks))
    start = time.perf_counter()
    bar = tqdm(total=len(tasks), desc=f"benchmark {dataset}", unit="run", disable=not progress)
    if done:
        bar.write(f"resuming: {len(done)} grid point(s) already in {grid_file}")
    shared = {"dataset": dataset, "dataset_options": dict(dataset_options or {})}
    with open(grid_file, "a") as fh:
        for rec in run_tasks(_run_point, [{**t, **shared} for t in tasks], jobs):
            done[_key(rec)] = rec
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            bar.set_postfix_str(f"{rec['method']} val {rec['val_map']:.1f}")
            bar.update()
    bar.close()
    seconds = time.perf_counter() - start
    selected = select_best(done.values(), methods, seeds)
    table = format_table(selected, methods, dataset, seeds, grid, epochs, seconds)
    write_json(out / "results.json", selected)
    write_text(out / "table.md", table)
    return {"results": selected, "table": table, "seconds": seconds}


def select_best(records, methods: list[Method], seeds: int) -> list[dict]:
    """Per (method, seed), the grid point with the best val mAP (NaN = diverged, never chosen)."""
    by = {}
    for rec in records:
        by.setdefault((rec["method"], rec["seed"]), []).append(rec)
    out = []
    for m in methods:
        for seed in range(seeds):
            runs = by.get((m.label, seed), [])
            if not runs:
                continue
            best = max(runs, key=lambda r: -np.inf if np.isnan(r["val_map"]) else r["val_map"])
            out.append({"loss": m.label, "regime": m.regime, "seed": seed,
                        "batch_size": best["batch_size"], "lr": best["lr"],
                        "best_epoch": best["best_epoch"], "val_map": best["val_map"],
                        "test_map": best["test_map"],
                        "train_recovery_map": best["train_recovery_map"],
                        "seconds": best["seconds"],
                        "grid_seconds": float(sum(r["seconds"] for r in runs))})
    return out


def _mean_std(values) -> str:
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.2f} ± {v.std(ddof=1):.2f}" if v.size > 1 else f"{v.mean():.2f}"


def format_table(selected, methods, dataset, seeds, grid, epochs, seconds) -> str:
    """Markdown: test mAP mean ± std per method, then the reference rows."""
    lines = [f"Test mAP on `{dataset}` (mean ± std over {seeds} seed(s); per seed the grid point "
             f"with the best val mAP; batch {list(grid['batch_size'])} x lr {list(grid['lr'])}, "
             f"{epochs} epochs, linear head).", "",
             "| method | regime | test mAP | val mAP | train recovery mAP | selected (batch, lr) |",
             "|---|---|---|---|---|---|"]
    refs = [m for m in methods if m.label in REFERENCES]
    for m in [m for m in methods if m.label not in REFERENCES] + refs:
        rows = [r for r in selected if r["loss"] == m.label]
        if not rows:
            continue
        picks = sorted({(r["batch_size"], r["lr"]) for r in rows})
        name = m.label if m.label not in REFERENCES else f"*{m.label}* (reference)"
        lines.append(f"| {name} | {m.regime} | {_mean_std([r['test_map'] for r in rows])} | "
                     f"{_mean_std([r['val_map'] for r in rows])} | "
                     f"{_mean_std([r['train_recovery_map'] for r in rows])} | "
                     f"{', '.join(f'({b}, {lr:g})' for b, lr in picks)} |")
    lines += ["", f"Wall time: {seconds:.0f} s for the grid points run in this launch."]
    return "\n".join(lines) + "\n"
