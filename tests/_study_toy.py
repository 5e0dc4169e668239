"""Hand-made study folders for the tests of what reads them (report, sweep figures): the store
rows carry the run ids their spec expands to, as a real study's do (the reader keeps only the
current spec's runs)."""
from __future__ import annotations

import json
import sqlite3

from spmlkit.experiments.study import expand, load_study

COLUMNS = ("run_id TEXT PRIMARY KEY, study TEXT, method TEXT, loss TEXT, dataset TEXT, "
           "regime TEXT, seed INTEGER, variant TEXT, batch_size INTEGER, lr REAL, mode TEXT, "
           "status TEXT, val_map REAL, test_map REAL, train_recovery_map REAL, "
           "best_epoch INTEGER, seconds REAL, metrics TEXT, config TEXT, run_dir TEXT, "
           "error TEXT, finished_at TEXT")


def spec_run_ids(spec: dict) -> dict:
    """``(method label, seed, lr, variant JSON with sorted keys) -> run id`` of every run of
    ``spec`` (a dict, as written to study.yaml)."""
    return {(t.method, t.seed, t.lr, json.dumps(t.variant, sort_keys=True)): t.run_id
            for t in expand(load_study(spec))}


def real_run_id(spec: dict, row: dict) -> str:
    """The run id of the spec's run that ``row`` (method, seed, lr, variant) stands for."""
    variant = json.loads(row.get("variant") or "{}")
    key = (row["method"], row["seed"], row["lr"], json.dumps(variant, sort_keys=True))
    ids = spec_run_ids(spec)
    if key not in ids:
        raise KeyError(f"the spec has no run {key}; it has {sorted(ids)}")
    return ids[key]


def write_results(folder, rows) -> None:
    """``results.sqlite`` with ``rows`` (dicts of columns), written with plain sqlite3."""
    con = sqlite3.connect(folder / "results.sqlite")
    con.execute(f"CREATE TABLE runs ({COLUMNS})")
    for r in rows:
        cols = list(r)
        con.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [r[c] for c in cols])
    con.commit()
    con.close()
