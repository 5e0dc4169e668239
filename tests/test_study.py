"""Studies: spec validation, expansion and run ids, the parallel resumable runner, the SQLite
store (also under two writer processes), selection, paper-style tables, the CLI, MLflow."""
import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

from spmlkit.cli import main
from spmlkit.experiments import store as store_module
from spmlkit.experiments.store import StudyStore
from spmlkit.experiments.study import (expand, load_study, run_study, study_rows,
                                       study_status)
from spmlkit.experiments.tables import study_table

BASE = {"name": "t", "datasets": ["yeast"], "methods": ["an", "epr"], "seeds": 1, "epochs": 2,
        "grid": {"batch_size": [16], "lr": [1e-2]}}


def spec(**changes):
    return {**BASE, **changes}


# ---- spec ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, message", [
    ({"epoch": 3}, r"unknown key\(s\) \['epoch'\]"),
    ({"methods": ["an", "rolee"]}, r"methods\[1\]: unknown loss 'rolee'.*role"),
    ({"datasets": ["yeastt"]}, r"datasets\[0\]: unknown dataset 'yeastt'"),
    ({"vary": {"regime": ["1p", "2p"]}}, r"vary.regime: unknown regime '2p'"),
    ({"grid": {"lr": [1e-2, -1]}}, r"grid.lr: expected a positive number, got -1"),
    ({"grid": {"batch_size": [8.5]}}, r"grid.batch_size: expected a positive integer"),
    ({"grid": {"momentum": [0.9]}}, r"grid.momentum: expected batch_size, lr, hparams"),
    ({"hparams": {"epr": {"lamb": 2}}}, r"hparams.epr: loss 'epr' has no hyperparameter\(s\) "
                                        r"\['lamb'\]"),
    ({"hparams": {"role": {"lam": 2}}}, r"hparams.role: no method labelled 'role'"),
    ({"vary": {"k": ["estimate:ten:point"]}}, r"vary.k: expected a number, 'true'"),
    ({"vary": {"hparams.alpha": [0.1]}}, r"vary.hparams.alpha: no method's loss has"),
    ({"vary": {"seed": [1]}}, r"vary.seed: expected hparams.<name>, data.<option>, k, "
                              r"regime or lac.<field>"),
    ({"mode": "lineare"}, r"mode: expected one of linear, finetune"),
    ({"train": {"lr": 1e-3}}, r"train.lr: set lr with the spec key 'grid'"),
    ({"methods": ["an", {"label": "an", "spec": "an@full"}]}, r"labels must be unique"),
])
def test_spec_errors_name_the_key(changes, message):
    with pytest.raises(ValueError, match=message):
        load_study(spec(**changes))


def test_the_schema_table_is_what_validation_reads():
    """The spec's keys, required keys and defaults come from one table
    (``study.schema.SPEC_SCHEMA``): a spec of only the required keys resolves to the table's
    defaults, an unknown key is refused with the table's list, and every key has help text."""
    from spmlkit.experiments.study.schema import (METHOD_SCHEMA, REQUIRED_KEYS, SPEC_KEYS,
                                                  SPEC_SCHEMA, default)

    assert SPEC_KEYS == tuple(k.name for k in SPEC_SCHEMA) and REQUIRED_KEYS == ("datasets",
                                                                                  "methods")
    assert all(k.help and k.type for k in SPEC_SCHEMA + METHOD_SCHEMA)
    s = load_study({"name": "t", "datasets": ["yeast"], "methods": ["an"]})
    resolved = {**s.to_dict(), "mode_options": s.mode_options, "mlflow": s.mlflow,
                "metric": s.metric, "sklearn_reference": s.sklearn_reference}
    for key in SPEC_SCHEMA:
        if key.required or key.default is None:
            continue
        want = list(range(default("seeds"))) if key.name == "seeds" else default(key.name)
        assert resolved[key.name] == want, key.name
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['sedes'\]; a study spec has "
                                         + ", ".join(SPEC_KEYS)):
        load_study({"name": "t", "datasets": ["yeast"], "methods": ["an"], "sedes": 1})


def test_spec_files_presets_and_overrides(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("datasets: [yeast]\nmethods: [an]\ngrid: {lr: [1e-3, 2.5e-4]}\n")
    s = load_study(path)  # name from the file; 1e-3 read as a number (YAML 1.1 would not)
    assert (s.name, s.seeds, s.grid["lr"], s.grid["batch_size"]) == ("mine", [0, 1, 2],
                                                                    [1e-3, 2.5e-4], [8, 16])
    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets: [yeast]\nmethods: [an\nseeds: 1\n")
    with pytest.raises(ValueError, match=r"bad.yaml, line \d: not valid YAML"):
        load_study(bad)
    with pytest.raises(ValueError, match=r"mine.yaml: methods\[0\]: unknown loss"):
        load_study(path, ["methods=[nope]"])
    smoke = load_study("smoke", ["seeds=2", "grid.lr=[1e-3]", "vary.hparams.lam=[1, 2]"])
    assert smoke.seeds == [0, 1] and smoke.grid["lr"] == [1e-3]
    assert smoke.vary == {"hparams.lam": [1, 2]}
    with pytest.raises(FileNotFoundError, match="presets: .*smoke"):
        load_study("no-such-preset")


def test_expand_counts_and_stable_run_ids():
    s = load_study(spec(datasets=["yeast", {"name": "fmnist_mosaic",
                                            "options": {"backbone": "tiny_cnn"}}], seeds=2,
                        methods=["an", "epr", "bce@full"],
                        vary={"k": [1, 2], "regime": ["1p", "1p_1n"]},
                        grid={"batch_size": [8, 16], "lr": [1e-2, 1e-3]}))
    tasks = expand(s)
    # an: regime only (2); epr: k x regime (4); bce@full: fixed regime, no k (1); x 4 grid points
    assert len(tasks) == 2 * 2 * (2 + 4 + 1) * 4
    ids = [t.run_id for t in tasks]
    assert len(set(ids)) == len(ids)
    assert [t.run_id for t in expand(load_study(s.to_dict()))] == ids  # study.yaml round trip
    epr = [t for t in tasks if t.method == "epr" and t.variant == {"k": 2, "regime": "1p_1n"}]
    assert len(epr) == 16 and all(t.k == 2 and t.regime == "1p_1n" for t in epr)
    assert epr[0].run_id.startswith("yeast-epr-1p_1n-s0-b8-lr0.01-k2-")
    assert all(t.variant == {} and t.regime == "full" for t in tasks if t.method == "bce@full")
    longer = {t.run_id for t in expand(load_study(s.to_dict(), ["epochs=3"]))}
    assert not longer & set(ids)  # anything that changes a run changes its id


# ---- running ------------------------------------------------------------------------------------
def test_run_resume_partial_folder_and_selection(tmp_path):
    out = tmp_path / "study"
    s = load_study(spec(grid={"batch_size": [16], "lr": [1e-2, 1e-3]}))
    res = run_study(s, out=out, jobs=2, progress=False)
    assert (res["runs_total"], res["runs_run"], res["failures"], res["jobs"]) == (4, 4, 0, 2)
    store = StudyStore(out / "results.sqlite")
    rows = store.rows()
    assert [r["status"] for r in rows] == ["done"] * 4
    assert all(20 < r["test_map"] < 80 and r["best_epoch"] in (1, 2) for r in rows)
    for r in rows:
        assert (out / r["run_dir"] / "final.json").is_file()
        assert r["run_dir"] == f"runs/{r['run_id']}"
        assert json.loads(r["config"])["train"]["lr"] == r["lr"]
    # selection: per method, the lr with the best val mAP
    sel = store.selected()
    assert len(sel) == 2
    for r in sel:
        mine = [x for x in rows if x["method"] == r["method"]]
        assert r["val_map"] == max(x["val_map"] for x in mine)
    # a re-launch runs nothing
    again = run_study(s, out=out, jobs=2, progress=False)
    assert (again["runs_done_before"], again["runs_run"]) == (4, 0)
    # a killed run: row gone, half-written folder left behind -> rerun, folder replaced
    victim = rows[0]
    store.delete(victim["run_id"])
    (out / victim["run_dir"] / "final.json").unlink()
    (out / victim["run_dir"] / "junk.tmp").write_text("half")
    assert study_status(out)["missing"] == 1
    third = run_study(s, out=out, jobs=1, progress=False)
    assert (third["runs_done_before"], third["runs_run"]) == (3, 1)
    folder = out / "runs" / victim["run_id"]
    assert (folder / "final.json").is_file() and not (folder / "junk.tmp").exists()
    assert sorted(p.name for p in (out / "runs").iterdir() if not p.name.startswith(".")) == \
        sorted(r["run_id"] for r in rows)
    redo = store.rows(run_id=victim["run_id"])[0]
    assert math.isclose(redo["test_map"], victim["test_map"], abs_tol=1e-9)  # same seed
    launches = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
    assert [(x["runs_done_before"], x["runs_run"]) for x in launches] == [(0, 4), (4, 0), (3, 1)]
    assert all(x["finished"] and x["versions"]["torch"] for x in launches)
    assert study_status(out) == {"name": "t", "title": "t", "total": 4, "done": 4, "failed": 0,
                                 "missing": 0, "stale": 0}


def kill_a_busy_worker(s, out, paused, **kw):
    """``run_study(s, out, **kw)`` on a local pool of 2 worker processes, in a thread; the first
    run to log epoch 1 holds there (`_pool_tasks.pause_at_epoch`) and its worker process
    is SIGKILLed (the out-of-memory killer's signal), so the run that the killed worker held is
    known, not guessed. Returns the study's result, the worker's pid and the run's task."""
    import dataclasses

    from _pool_tasks import Pausing, kill_when_paused

    from spmlkit.experiments.pool import LocalExecutor

    paused.mkdir()
    executor = Pausing(LocalExecutor(2), {"dir": str(paused), "epoch": 1})
    result, pid, run_id = kill_when_paused(lambda: run_study(
        s, out=out, progress=False, executor=executor, **kw), paused, timeout=120)
    (task,) = [t for t in expand(s) if t.run_id == run_id]
    return result, pid, dataclasses.asdict(task)


def test_a_worker_killed_mid_study_is_retried_and_changes_nothing(tmp_path, caplog):
    """A busy worker SIGKILLed during ``run_study`` (while the run it holds waits at epoch 1,
    so the test knows which run that is): the study finishes, that run is retried and done,
    and every number equals that of the same study in one process."""
    s = load_study(spec(seeds=2, grid={"batch_size": [16], "lr": [1e-3, 1e-2]}))
    out = tmp_path / "killed"
    # one run per task: the log names the run
    result, pid, task = kill_a_busy_worker(s, out, tmp_path / "paused", vectorise=False)
    assert (result["runs_run"], result["failures"]) == (8, 0)
    assert f"worker process {pid} died while running task {task['run_id']} (killed by " \
           f"SIGKILL, e.g. out of memory); running it again alone" in caplog.text
    rows = StudyStore(out / "results.sqlite").rows()
    assert [r["status"] for r in rows] == ["done"] * 8
    assert all(r["run_dir"] == f"runs/{r['run_id']}" for r in rows)  # the retry's own folder
    run_study(s, out=tmp_path / "one", jobs=1, progress=False, vectorise=False)
    one = StudyStore(tmp_path / "one" / "results.sqlite").rows()
    numbers = ("run_id", "status", "val_map", "test_map", "train_recovery_map", "best_epoch")
    assert [[r[c] for c in numbers] for r in rows] == [[r[c] for c in numbers] for r in one]
    _, selected = study_rows(out)
    _, selected_one = study_rows(tmp_path / "one")
    assert [[r[c] for c in numbers] for r in selected] == \
        [[r[c] for c in numbers] for r in selected_one]
    assert study_table(selected) == study_table(selected_one)


RESUME = spec(grid={"batch_size": [16], "lr": [1e-2, 1e-3]}, epochs=4)
NUMBERS = ("run_id", "status", "val_map", "test_map", "train_recovery_map", "best_epoch")


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint_in_the_local_pool(tmp_path, caplog):
    """A worker SIGKILLed while its run is at epoch 3 of 4 (checkpoint after every epoch): the
    retry continues the run from its checkpoint, and every number equals the same study run
    without interruption in one process."""
    from _pool_tasks import Pausing, check_resumed, kill_when_paused

    from spmlkit.experiments.pool import LocalExecutor

    s, out, paused = load_study(RESUME), tmp_path / "killed", tmp_path / "paused"
    paused.mkdir()
    executor = Pausing(LocalExecutor(2), {"dir": str(paused), "epoch": 3})
    result, pid, run_id = kill_when_paused(lambda: run_study(
        s, out=out, progress=False, checkpoint_seconds=0, executor=executor,
        vectorise=False), paused)  # one run per task: that run is the one that resumes
    assert (result["runs_run"], result["failures"]) == (4, 0)
    assert f"worker process {pid} died while running task {run_id}" in caplog.text
    check_resumed(out, paused, pid, run_id)
    run_study(s, out=tmp_path / "one", jobs=1, progress=False, vectorise=False)
    rows = StudyStore(out / "results.sqlite").rows()
    one = StudyStore(tmp_path / "one" / "results.sqlite").rows()
    assert [[r[c] for c in NUMBERS] for r in rows] == [[r[c] for c in NUMBERS] for r in one]


def test_a_stopped_launch_resumes_its_runs_from_their_checkpoints(tmp_path):
    """A launch stopped (Ctrl-C) in the epoch-2 record of a 4-epoch run leaves its folder with
    the checkpoint of epoch 2 (the engine completes an epoch whose record raised): the next
    launch continues the run, trains epochs 3 and 4 only, and ends at the numbers of a run that
    was never stopped."""
    from _pool_tasks import Pausing, epochs_by_try

    from spmlkit.experiments.pool import InProcessExecutor

    s = load_study(spec(methods=["an"], epochs=4))
    out, paused = tmp_path / "s", tmp_path / "paused"
    paused.mkdir()
    plan = {"dir": str(paused), "epoch": 2, "interrupt": True}
    with pytest.raises(KeyboardInterrupt):
        run_study(s, out=out, progress=False, checkpoint_seconds=0, vectorise=False,
                  executor=Pausing(InProcessExecutor(), plan))
    (folder,) = (out / "runs").iterdir()
    assert (folder / "checkpoint.pt").is_file() and not (folder / "final.json").exists()
    assert study_status(out)["missing"] == 1
    plan["epoch"] = None
    again = run_study(s, out=out, progress=False, vectorise=False,
                      executor=Pausing(InProcessExecutor(), plan))
    assert (again["runs_run"], again["failures"]) == (1, 0)
    assert epochs_by_try(paused / "epochs.log", folder.name) == {os.getpid(): [1, 2, 3, 4]}
    logged = [json.loads(x)["epoch"] for x in (folder / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3, 4] and not (folder / "checkpoint.pt").exists()
    run_study(s, out=tmp_path / "one", progress=False, vectorise=False)
    rows = StudyStore(out / "results.sqlite").rows()
    one = StudyStore(tmp_path / "one" / "results.sqlite").rows()
    assert [[r[c] for c in NUMBERS] for r in rows] == [[r[c] for c in NUMBERS] for r in one]


def test_a_run_whose_worker_died_is_recorded_failed_with_the_reason(tmp_path):
    """``retries=0``: the killed worker's run is lost at once, recorded as ``failed`` (with the
    reason as its error) and counted; the other runs finish."""
    s = load_study(spec(seeds=2))
    out = tmp_path / "lost"
    result, _, task = kill_a_busy_worker(s, out, tmp_path / "paused", retries=0,
                                         vectorise=False)  # one run per task
    assert (result["runs_run"], result["failures"]) == (4, 1)
    (failed,) = StudyStore(out / "results.sqlite").rows(status="failed")
    assert failed["run_id"] == task["run_id"] and failed["val_map"] is None
    assert failed["error"] == ("the worker process died while running this task (killed by "
                               "SIGKILL, e.g. out of memory); tried 1 time")
    assert (failed["method"], failed["seed"], failed["lr"]) == (task["method"], task["seed"],
                                                                task["train"]["lr"])
    assert len(StudyStore(out / "results.sqlite").rows(status="done")) == 3
    launch = json.loads((out / "launches.jsonl").read_text().splitlines()[-1])
    assert launch["finished"] and launch["failures"] == 1


def test_failed_run_is_recorded_and_study_goes_on(tmp_path):
    out = tmp_path / "fail"
    s = load_study(spec(vary={"k": ["estimate:99999:point"]}))  # epr cannot draw 99999 rows
    res = run_study(s, out=out, jobs=1, progress=False)
    assert (res["runs_run"], res["failures"]) == (2, 1)
    (failed,) = StudyStore(out / "results.sqlite").rows(status="failed")
    assert failed["method"] == "epr" and "only 1354 rows" in failed["error"]
    assert failed["val_map"] is None and json.loads(failed["variant"]) == {
        "k": "estimate:99999:point"}
    _, selected = study_rows(out)
    assert [r["method"] for r in selected] == ["an"]  # failed runs are never selected
    # failed runs are not retried unless asked
    assert run_study(s, out=out, jobs=1, progress=False)["runs_run"] == 0
    assert run_study(s, out=out, jobs=1, progress=False, retry_failed=True)["failures"] == 1


def test_mlflow_logging_with_a_fake_module(tmp_path, monkeypatch):
    calls = []

    class Run:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            calls.append(("end",))

    fake = types.ModuleType("mlflow")
    fake.set_experiment = lambda name: calls.append(("experiment", name))
    fake.start_run = lambda run_name=None: calls.append(("start", run_name)) or Run()
    fake.log_params = lambda p: calls.append(("params", p))
    fake.log_metrics = lambda m: calls.append(("metrics", m))
    fake.set_tag = lambda k, v: calls.append(("tag", k, v))
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    s = load_study(spec(methods=["an"], epochs=1))
    run_study(s, out=tmp_path / "ml", jobs=1, progress=False, mlflow=True)
    (row,) = StudyStore(tmp_path / "ml" / "results.sqlite").rows()
    assert calls[0] == ("experiment", "t") and calls[1] == ("start", row["run_id"])
    params = dict(calls[2][1])
    assert params["method"] == "an" and params["lr"] == "0.01" and params["seed"] == "0"
    assert calls[3][1]["test_map"] == pytest.approx(row["test_map"])
    assert calls[4:] == [("tag", "status", "done"), ("end",)]
    monkeypatch.setitem(sys.modules, "mlflow", None)  # not installed
    with pytest.raises(ModuleNotFoundError, match="pip install mlflow"):
        run_study(s, out=tmp_path / "ml2", mlflow=True, progress=False)


# ---- store --------------------------------------------------------------------------------------
def _row(run_id, method="an", seed=0, val=50.0, test=40.0, status="done", variant=None, **kw):
    return {"run_id": run_id, "study": "s", "method": method, "loss": method, "dataset": "voc",
            "regime": "1p", "seed": seed, "variant": variant or {}, "batch_size": 8, "lr": 1e-3,
            "mode": "linear", "status": status, "val_map": val, "test_map": test, **kw}


def test_store_selection_and_exports(tmp_path):
    store = StudyStore(tmp_path / "r.sqlite")
    store.put(_row("a1", val=60.0, test=1.0))
    store.put(_row("a2", val=float("nan"), test=99.0))        # diverged: never chosen
    store.put(_row("a3", val=70.0, test=2.0, status="failed", error="boom"))
    store.put(_row("a4", val=60.0, test=3.0))                 # a tie: the smaller run id wins
    store.put(_row("b1", seed=1, val=10.0, test=4.0))
    store.put(_row("c1", val=5.0, test=5.0, variant={"hparams.alpha": 0.1}))
    assert [(r["run_id"], r["test_map"]) for r in store.selected()] == [
        ("a1", 1.0), ("c1", 5.0), ("b1", 4.0)]
    assert [r["run_id"] for r in store.selected(run_ids={"a4", "b1"})] == ["a4", "b1"]
    assert store.rows(run_id="a2")[0]["val_map"] is None
    assert store.counts() == {"done": 5, "failed": 1}
    with pytest.raises(ValueError, match="unknown column"):
        store.put({**_row("x"), "valmap": 1})
    with pytest.raises(ValueError, match="status 'ok'"):
        store.put(_row("x", status="ok"))
    store.export(tmp_path / "all.csv", "csv")
    lines = (tmp_path / "all.csv").read_text().splitlines()
    assert lines[0].startswith("run_id,study,method,loss,dataset") and len(lines) == 7
    data = json.loads(store.export(tmp_path / "sel.json", "json", selected=True).read_text())
    assert data[1]["variant"] == {"hparams.alpha": 0.1}
    md = store.export(tmp_path / "t.md", "md").read_text()
    assert "| a1 | an | voc | 1p | 0 | {} | 8 | 0.001 | done | 60.00 | 1.00 |" in md
    tex = store.export(tmp_path / "t.tex", "latex").read_text()
    assert r"run\_id & method" in tex and tex.strip().endswith(r"\end{tabular}")


def test_store_two_concurrent_writer_processes(tmp_path):
    db = tmp_path / "r.sqlite"
    StudyStore(db)
    script = textwrap.dedent(f"""
        import importlib.util, sys, time
        spec = importlib.util.spec_from_file_location("store", {store_module.__file__!r})
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        s = mod.StudyStore({str(db)!r})
        while time.time() < float(sys.argv[2]):
            pass
        for i in range(40):
            s.put({{"run_id": f"{{sys.argv[1]}}-{{i}}", "method": sys.argv[1], "seed": i,
                   "status": "done", "val_map": float(i)}})
    """)
    import time

    start = str(time.time() + 1.0)  # both start writing at the same moment
    procs = [subprocess.Popen([sys.executable, "-c", script, name, start]) for name in "ab"]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    store = StudyStore(db)
    assert len(store.rows()) == 80
    assert len(store.rows(method="a")) == 40 and len(store.selected()) == 80


# ---- tables -------------------------------------------------------------------------------------
ROWS = [{"method": m, "dataset": d, "regime": r, "seed": s, "variant": "{}", "status": "done",
         "test_map": v + s}
        for m, r, vals in [("an", "1p", (80, 60)), ("role", "1p", (84, 58)),
                           ("epr", "1p", (82, 58)), ("bce", "full", (90, 70)),
                           ("iun", "1p_alln", (88, 65))]
        for d, v in zip(("voc", "coco"), vals) for s in (0, 2)]


def test_table_markdown_groups_and_marks():
    text = study_table(ROWS, order=["role", "an", "epr"])
    assert text == (
        "| Method | voc | coco |\n"
        "|---|---|---|\n"
        "| *All P. & All N.* | | |\n"
        "| bce | 91.00 ± 1.41 | 71.00 ± 1.41 |\n"
        "| *1 P. & All N.* | | |\n"
        "| iun | 89.00 ± 1.41 | 66.00 ± 1.41 |\n"
        "| *1 P. & 0 N.* | | |\n"
        "| role | **85.00 ± 1.41** | <u>59.00 ± 1.41</u> |\n"
        "| an | 81.00 ± 1.41 | **61.00 ± 1.41** |\n"
        "| epr | <u>83.00 ± 1.41</u> | <u>59.00 ± 1.41</u> |\n")


def test_table_latex_html_csv_and_vary_columns():
    one_seed = [r for r in ROWS if r["seed"] == 0]
    tex = study_table(one_seed, "latex", title="T_1")
    assert tex.splitlines()[:4] == ["% T_1", r"\begin{tabular}{lcc}", r"\toprule",
                                    r"Method & voc & coco \\"]
    assert r"\multicolumn{3}{l}{\textit{All P. \& All N.}} \\" in tex
    assert r"role & \textbf{84.00} & \underline{58.00} \\" in tex
    assert r"an & 80.00 & \textbf{60.00} \\" in tex
    assert r"epr & \underline{82.00} & \underline{58.00} \\" in tex  # a tie marks both
    html = study_table(ROWS, "html", title="a<b")
    assert "<caption>a&lt;b</caption>" in html
    assert '<tr class="group"><th colspan="3">1 P. &amp; 0 N.</th></tr>' in html
    assert '<td title="2 seed(s)"><strong>85.00 ± 1.41</strong></td>' in html
    csv = study_table(one_seed, "csv").splitlines()
    assert csv[0] == "regime,method,voc mean,voc std,voc n,voc rank,coco mean,coco std,coco n," \
                     "coco rank"
    assert csv[1] == "full,bce,90.0,0.0,1,,70.0,0.0,1,"
    assert "1p,an,80.0,0.0,1,,60.0,0.0,1,1" in csv
    swept = [{"method": "em", "dataset": "voc", "regime": "1p", "seed": 0,
              "variant": json.dumps({"hparams.alpha": a, "k": 2}), "test_map": 50 + 100 * a}
             for a in (0.1, 0.01)]
    text = study_table(swept, columns="hparams.alpha", decimals=1)
    assert text.splitlines()[0] == "| Method | alpha=0.01 | alpha=0.1 |"
    assert text.splitlines()[-1] == "| em (k=2) | 51.0 | 60.0 |"  # one row: nothing to mark
    with pytest.raises(ValueError, match="no selected run has a value for 'val_map'"):
        study_table(ROWS, metric="val_map")
    with pytest.raises(ValueError, match="unknown table format"):
        study_table(ROWS, "docx")


def test_table_vary_columns_order_references_and_regime_columns():
    """Columns holding numbers sort as numbers; a method without the column axis (a reference
    such as AN in an alpha sweep) shows its value in every column; regimes as columns drop the
    regime row groups."""
    rows = [{"method": "epr", "dataset": "yeast", "regime": "1p", "seed": 0, "test_map": v,
             "variant": json.dumps({"k": k})}
            for k, v in [("estimate:10:point", 41), ("estimate:5:point", 40),
                         ("estimate:25:point", 42)]]
    rows.append({"method": "an", "dataset": "yeast", "regime": "1p", "seed": 0, "test_map": 39,
                 "variant": "{}"})
    lines = study_table(rows, columns="k", group=None).splitlines()
    assert lines[0] == ("| Method | k=estimate:5:point | k=estimate:10:point | "
                        "k=estimate:25:point |")
    assert lines[-1] == "| an | <u>39.00</u> | <u>39.00</u> | <u>39.00</u> |"  # second
    mlml = [{"method": m, "dataset": "yeast", "regime": f"mlml:{r}", "seed": 0, "variant": "{}",
             "test_map": 50 - 10 * r + (m == "em")} for m in ("an", "em") for r in (0.5, 0.1)]
    lines = study_table(mlml, columns="regime").splitlines()
    assert lines[0] == "| Method | mlml:0.1 | mlml:0.5 |" and len(lines) == 4  # no group rows
    assert lines[3] == "| em | **50.00** | **46.00** |"


# ---- CLI ----------------------------------------------------------------------------------------
def test_cli_study_commands(tmp_path, capsys):
    out = tmp_path / "smoke"
    assert main(["study", "list"]) == 0
    assert "smoke" in capsys.readouterr().out
    code = main(["study", "run", "smoke", "--out", str(out), "--jobs", "1", "--quiet",
                 "--set", "epochs=1", "methods=[an]"])
    text = capsys.readouterr().out
    assert code == 0 and "1 run(s)" in text and "| an |" in text
    launch = json.loads((out / "launches.jsonl").read_text())
    assert launch["argv"] is not None and launch["runs_run"] == 1
    assert main(["study", "status", str(out)]) == 0
    assert "1 runs: 1 done, 0 failed, 0 missing" in capsys.readouterr().out
    # `spml study PRESET` is `spml study run PRESET`: here a re-launch with nothing left to run
    assert main(["study", "smoke", "--out", str(out), "--quiet", "--set", "epochs=1",
                 "methods=[an]"]) == 0
    text = capsys.readouterr().out
    assert "0 run(s)" in text and "1 of 1 were finished before" in text
    assert main(["study", "table", str(out), "--format", "latex"]) == 0
    assert r"\begin{tabular}{lc}" in capsys.readouterr().out
    assert main(["study", "export", str(out), "--format", "json", "--output",
                 str(tmp_path / "x.json")]) == 0
    assert json.loads((tmp_path / "x.json").read_text())[0]["method"] == "an"
    # the common case from flags alone, no YAML
    assert main(["study", "run", "--datasets", "yeast", "--methods", "an,bce@full", "--seeds",
                 "1", "--name", "flags", "--out", str(tmp_path / "flags"), "--jobs", "1",
                 "--quiet", "--set", "epochs=1", "grid.lr=[1e-3]", "grid.batch_size=[16]"]) == 0
    text = capsys.readouterr().out
    assert "2 run(s)" in text and "| an |" in text and "| bce@full |" in text
    assert load_study(tmp_path / "flags").name == "flags"
    assert main(["study", "run", "--methods", "an", "--quiet"]) == 2
    assert "needs a spec" in capsys.readouterr().err
    assert main(["study", "run", "nope-preset", "--quiet"]) == 2
    assert "presets:" in capsys.readouterr().err
    assert main(["study", "status", str(tmp_path)]) == 2
    assert "not a study folder" in capsys.readouterr().err


def test_set_methods_drops_the_hparams_of_methods_left_out():
    """``--set methods=[...]`` on a preset whose ``hparams`` name other methods: those entries
    go, with a warning; the kept methods keep theirs. In a spec file the same entry is an
    error (a typo)."""
    with pytest.warns(UserWarning) as caught:
        s = load_study("yeast-papers", ["methods=[an, em]"])
    assert sorted(str(w.message).split()[2] for w in caught) == ["hparams.em_apl",
                                                                 "hparams.opml_sp"]
    assert set(s.hparams) == {"em"} and s.hparams["em"] == {"alpha": 0.1}
    with pytest.raises(ValueError, match="hparams.em_apl: no method labelled"):
        load_study({**BASE, "hparams": {"em_apl": {"alpha": 0.1}}})


def test_cli_interruption_says_how_far_it_got(tmp_path, capsys, monkeypatch):
    """Ctrl-C (or SIGTERM) during ``spml study run``: exit 130, and stderr says how many runs
    are done and that the same command runs the rest."""
    from spmlkit.experiments import study as study_module

    real = study_module.run_study

    def cut_short(spec, **kw):  # the first of two runs finishes, then the user presses Ctrl-C
        res = real(load_study(spec, ["methods=[an]"]), **kw)
        (Path(res["out"]) / "study.yaml").write_text(spec.to_yaml())  # the whole study's spec
        raise KeyboardInterrupt

    monkeypatch.setattr(study_module, "run_study", cut_short)
    out = tmp_path / "s"
    code = main(["study", "run", "smoke", "--out", str(out), "--jobs", "1", "--quiet",
                 "--set", "epochs=1"])
    err = capsys.readouterr().err
    assert code == 130
    assert "smoke: stopped with 1 of 2 runs done; the same command runs the 1 missing" in err


def test_run_ids_hash_only_what_changes_results():
    """Cache folder, progress and worker counts used to be hashed into run ids, so moving the
    cache or hiding a bar re-ran a finished study."""
    from spmlkit.experiments.study import result_config, run_id_for

    base = load_study(spec())
    ids = [t.run_id for t in expand(base)]
    assert [t.run_id for t in expand(load_study(spec(train={"num_workers": 5})))] == ids
    assert not {t.run_id for t in expand(load_study(spec(epochs=3)))} & set(ids)
    config = expand(base)[0].config()
    moved = {**config, "dataset_options": {"backbone": "b", "cache_dir": "/elsewhere",
                                           "features": {"progress": False, "num_workers": 3}},
             "mode_options": {"progress": False, "cache_dir": "/x"}}
    kept = {**config, "dataset_options": {"backbone": "b"}}
    assert result_config(moved) == result_config(kept)
    assert run_id_for(moved, 0, {}) == run_id_for(kept, 0, {})
    assert run_id_for({**kept, "dataset_options": {"backbone": "c"}}, 0, {}) != \
        run_id_for(kept, 0, {})


def test_a_damaged_results_file_is_named(tmp_path):
    """A results.sqlite that is not an SQLite database (damaged, or another file under that
    name) raised sqlite3.DatabaseError 'file is not a database' from the first read."""
    bad = tmp_path / "results.sqlite"
    bad.write_bytes(b"not an SQLite database" * 50)
    with pytest.raises(ValueError, match=r"results.sqlite is not a usable results store \(file "
                                         r"is not a database\)"):
        StudyStore(bad)


@pytest.mark.parametrize("free", [0, 1 << 40])
def test_a_disk_error_when_the_store_is_opened_is_not_called_damage(tmp_path, monkeypatch, free):
    """A full disk met when the store is opened: SQLite says "disk I/O error" (its -wal / -shm
    could not grow); this was reported as a damaged store to restore from a copy."""
    import errno

    from spmlkit.experiments import store as store_module

    path = tmp_path / "results.sqlite"
    StudyStore(path)
    before = path.read_bytes()

    class Failing:
        def execute(self, *a):
            raise sqlite3.OperationalError("disk I/O error")

        def close(self):
            pass

    monkeypatch.setattr(StudyStore, "_connect", lambda self: Failing())
    monkeypatch.setattr(store_module, "_free_bytes", lambda path: free)
    with pytest.raises(OSError) as caught:
        StudyStore(path)
    said = str(caught.value)
    assert "restore" not in said and "results.sqlite" in said
    if free == 0:
        assert caught.value.errno == errno.ENOSPC
        assert "No space left on the disk (0 bytes free" in said and "store is unchanged" in said
    else:
        assert caught.value.errno == errno.EIO and "not a sign of a damaged store" in said
    assert path.read_bytes() == before


def test_cli_study_run_passes_retries(tmp_path, monkeypatch):
    from spmlkit.experiments import study as study_module

    seen = {}

    def record(spec, **kw):
        seen.update(kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(study_module, "run_study", record)
    args = ["study", "run", "smoke", "--out", str(tmp_path / "s"), "--quiet"]
    assert main(args + ["--retries", "3"]) == 130 and seen["retries"] == 3
    assert main(args) == 130 and seen["retries"] == 1


def test_cli_study_run_options_are_in_groups():
    """``spml study run --help`` shows its options under argument groups, as train and
    benchmark do: none is left under the generic heading but --help."""
    import argparse

    from spmlkit.cli import build_parser

    def sub(parser, name):
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return action.choices[name]

    run = sub(sub(build_parser(), "study"), "run")
    titles = [g.title for g in run._action_groups if g._group_actions]
    assert titles[-4:] == ["the study", "runs", "workers", "output"]
    loose = [a.dest for g in run._action_groups if g.title in ("options", "positional arguments")
             for a in g._group_actions]
    assert loose == ["help"]
    args = run.parse_args(["x", "--dask", "local", "--retries", "2", "--quiet"])
    assert (args.spec, args.dask, args.retries, args.quiet) == ("x", "local", 2, True)


def test_a_launch_whose_runs_all_fail_alike_says_so_at_the_end(tmp_path, capsys):
    """Every run fails for one reason (a required dataset option left out): the launch ends
    with that error and how many runs share it; launches.jsonl and the report group them."""
    from spmlkit.experiments.report import write_report

    out = tmp_path / "nofeat"
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""\
        name: nofeat
        datasets: [arrays]
        methods: [an, epr]
        seeds: 1
        epochs: 1
        grid: {batch_size: [16], lr: [0.01, 0.001]}
        """))
    assert main(["study", "run", str(path), "--out", str(out), "--jobs", "1", "--quiet"]) == 1
    err = capsys.readouterr().err
    reason = "ValueError: dataset 'arrays' needs the option(s) features, labels"
    assert "every one of the 4 run(s) of this launch failed, all for the same reason:" in err
    assert f"  4 run(s): {reason}" in err and f"spml report {out}" in err
    launch = json.loads((out / "launches.jsonl").read_text().splitlines()[-1])
    assert [(r["reason"].startswith(reason), r["count"]) for r in launch["failure_reasons"]] == \
        [(True, 1 * 4)]
    text = write_report(out).read_text()
    failures = text[text.index('id="failures"'):text.index('id="runs"')]
    assert failures.count('class="failure-group"') == 1 and "<b>4 run(s)</b>" in failures
    assert failures.count("Traceback") == 1          # the shared traceback shown once


def test_failure_groups_keep_distinct_errors_apart():
    from spmlkit.experiments.study import failure_groups

    rows = [{"run_id": "a1", "status": "failed", "error": "T\n  in runs/a1/x\nValueError: x"},
            {"run_id": "a2", "status": "failed", "error": "T\n  in runs/a2/x\nValueError: x"},
            {"run_id": "b", "status": "failed", "error": "T\nRuntimeError: y"},
            {"run_id": "c", "status": "done", "error": None}]
    groups = failure_groups(rows)
    assert [(g["count"], g["reason"], g["run_ids"]) for g in groups] == [
        (2, "ValueError: x", ["a1", "a2"]), (1, "RuntimeError: y", ["b"])]


# ---- selection metric, classic-metric tables, the tabular protocol -----------------------------
def test_select_best_follows_the_metric_and_its_direction():
    from spmlkit.experiments.store import select_best, selection_value

    def row(run_id, val_map, rl, seed=0):
        return _row(run_id, seed=seed, val=val_map, variant="{}", metrics=json.dumps(
            {"val_metrics": {"ranking_loss": rl, "lrap": 1 - rl}}))

    rows = [row("a", 60.0, 0.30), row("b", 50.0, 0.20), row("c", 55.0, float("nan")),
            row("d", 40.0, 0.20), row("e", 10.0, 0.1, seed=1),
            _row("f", seed=1, val=90.0, variant="{}")]
    assert [r["run_id"] for r in select_best(rows)] == ["a", "f"]
    # lower is better; NaN never competes; a tie goes to the smaller run id; a row without
    # the classic metrics (an older run) does not compete on them
    assert [r["run_id"] for r in select_best(rows, "ranking_loss")] == ["b", "e"]
    assert [r["run_id"] for r in select_best(rows, "lrap")] == ["b", "e"]
    assert selection_value(rows[0], "ranking_loss") == 0.30
    assert selection_value(rows[-1], "ranking_loss") is None


def test_spec_metric_key_selects_epochs_and_grid_points(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"metric: unknown metric 'rankloss'"):
        load_study(spec(metric="rankloss"))
    with pytest.raises(ValueError, match=r"train.metric: set metric with the spec key"):
        load_study(spec(train={"metric": "lrap"}))
    plain = expand(load_study(spec()))
    assert all("metric" not in t.train for t in plain)  # map: the run ids they always had
    s = load_study(spec(metric="ranking_loss", methods=["an"], epochs=3,
                        grid={"batch_size": [16], "lr": [1e-2, 1e-3]}))
    assert "metric: ranking_loss" in s.to_yaml()
    tasks = expand(s)
    assert all(t.train["metric"] == "ranking_loss" for t in tasks)
    assert {t.run_id for t in tasks}.isdisjoint({t.run_id for t in plain})
    out = tmp_path / "rl"
    run_study(s, out=out, jobs=1, progress=False)
    rows = StudyStore(out / "results.sqlite").rows()
    values = {r["run_id"]: json.loads(r["metrics"]) for r in rows}
    for res in values.values():
        assert res["metric"] == "ranking_loss"
        assert set(res["val_metrics"]) >= {"lrap", "ranking_loss", "coverage_norm",
                                           "one_error", "hamming_loss", "micro_f1"}
        assert res["val_score"] == res["val_metrics"]["ranking_loss"]
    (best,) = study_rows(out)[1]
    assert best["run_id"] == min(values, key=lambda i: values[i]["val_metrics"]["ranking_loss"])
    # the tables: one metric (selected on its own val value), or several as columns
    assert main(["study", "table", str(out), "--metric", "ranking_loss"]) == 0
    text = capsys.readouterr().out
    want = f"{values[best['run_id']]['test_metrics']['ranking_loss']:.4f}"
    assert "selected on val ranking_loss" in text and f"| an | {want} |" in text
    assert main(["study", "table", str(out), "--metric", "lrap,ranking_loss,one_error",
                 "--select", "lrap"]) == 0
    text = capsys.readouterr().out
    assert "| Method | lrap | ranking_loss | one_error |" in text
    assert main(["study", "table", str(out), "--metric", "lrap,rank_loss"]) == 2
    assert "unknown metric 'rank_loss'" in capsys.readouterr().err


def test_metrics_table_marks_each_column_in_its_direction():
    from spmlkit.experiments.tables import metrics_table

    def row(method, seed, lrap, rl):
        return {"method": method, "dataset": "yeast", "regime": "1p", "seed": seed,
                "variant": "{}", "status": "done",
                "metrics": json.dumps({"test_metrics": {"lrap": lrap, "ranking_loss": rl}})}

    rows = [row("an", 0, 0.70, 0.20), row("an", 1, 0.72, 0.18), row("role", 0, 0.75, 0.25),
            row("role", 1, 0.75, 0.27), row("epr", 0, 0.60, 0.10), row("epr", 1, 0.60, 0.12)]
    text = metrics_table(rows, ["lrap", "ranking_loss"], title="T", order=["an", "role", "epr"])
    lines = text.splitlines()
    assert lines[2] == "| Method | lrap | ranking_loss |"
    assert lines[-3:] == ["| an | <u>0.7100 ± 0.0141</u> | <u>0.1900 ± 0.0141</u> |",
                          "| role | **0.7500 ± 0.0000** | 0.2600 ± 0.0141 |",
                          "| epr | 0.6000 ± 0.0000 | **0.1100 ± 0.0141** |"]
    with pytest.raises(ValueError, match="no selected run has test values of coverage"):
        metrics_table(rows, ["coverage"])
    # one of several missing: its column was left out without a word
    with pytest.raises(ValueError, match=r"no selected run has test values of coverage .*leave "
                                         r"it out of --metric"):
        metrics_table(rows, ["lrap", "coverage"])


def test_tabular_protocol_gives_each_seed_its_own_trial():
    s = load_study(spec(datasets=[{"name": "yeast", "options": {"protocol": "tabular"}}],
                        seeds=3, methods=["an"]))
    tasks = expand(s)
    assert [(t.seed, t.dataset_options) for t in tasks] == [
        (i, {"protocol": "tabular", "seed": i}) for i in range(3)]
    fixed = load_study(spec(datasets=[{"name": "yeast", "options": {"protocol": "tabular",
                                                                    "seed": 7}}], seeds=2,
                            methods=["an"]))
    assert {t.dataset_options["seed"] for t in expand(fixed)} == {7}  # an explicit one stays


def test_store_put_many_writes_a_group_in_one_transaction(tmp_path):
    """put_many: the rows as put() writes them, one commit; a bad row writes none of them."""
    store = StudyStore(tmp_path / "results.sqlite")
    rows = [{"run_id": f"r{i}", "method": "an", "dataset": "yeast", "regime": "1p", "seed": i,
             "lr": 1e-3, "val_map": 40.0 + i, "test_map": 39.0} for i in range(3)]
    store.put_many(rows)
    store.put({**rows[0], "run_id": "single"})
    got = {r["run_id"]: r for r in store.rows()}
    assert sorted(got) == ["r0", "r1", "r2", "single"]
    assert [got[f"r{i}"]["val_map"] for i in range(3)] == [40.0, 41.0, 42.0]
    assert {k: v for k, v in got["r0"].items() if k not in ("run_id", "finished_at")} == \
        {k: v for k, v in got["single"].items() if k not in ("run_id", "finished_at")}
    with pytest.raises(ValueError, match="unknown column"):
        store.put_many([{**rows[0], "run_id": "x1"}, {"run_id": "x2", "nope": 1}])
    assert "x1" not in {r["run_id"] for r in store.rows()}
    store.put_many([])
    assert len(store.rows()) == 4


# ---- per-method training modes ------------------------------------------------------------------
#: run ids of a spec with no per-method mode, as expanded before methods could name one: they
#: must not change (a finished study is found again)
OLD_SPEC = {"name": "t",
            "datasets": ["yeast", {"name": "yeast", "options": {"protocol": "tabular"}}],
            "methods": ["an", "epr", "bce@full",
                        {"label": "AN-mlp", "spec": "an", "mode_options": {"head": "mlp"}}],
            "seeds": 2, "epochs": 2, "vary": {"k": [1, 2]},
            "grid": {"batch_size": [16], "lr": [1e-2]}, "mode_options": {"head": "linear"},
            "metric": "lrap"}
OLD_IDS = """yeast-an-1p-s0-b16-lr0.01-adb23406 yeast-an-1p-s1-b16-lr0.01-5977a372
yeast-epr-1p-s0-b16-lr0.01-k1-507e4a9f yeast-epr-1p-s0-b16-lr0.01-k2-5394d8de
yeast-epr-1p-s1-b16-lr0.01-k1-102b8339 yeast-epr-1p-s1-b16-lr0.01-k2-025e45ee
yeast-bce_full-full-s0-b16-lr0.01-7a89c374 yeast-bce_full-full-s1-b16-lr0.01-970894fc
yeast-AN-mlp-1p-s0-b16-lr0.01-efbef4ee yeast-AN-mlp-1p-s1-b16-lr0.01-2dbe2b70
yeast-an-1p-s0-b16-lr0.01-f5845702 yeast-an-1p-s1-b16-lr0.01-a084c07e
yeast-epr-1p-s0-b16-lr0.01-k1-4506eb17 yeast-epr-1p-s0-b16-lr0.01-k2-8d97f0ca
yeast-epr-1p-s1-b16-lr0.01-k1-70733acc yeast-epr-1p-s1-b16-lr0.01-k2-c5c42f22
yeast-bce_full-full-s0-b16-lr0.01-1f60e6c0 yeast-bce_full-full-s1-b16-lr0.01-a20190b6
yeast-AN-mlp-1p-s0-b16-lr0.01-61bf99df yeast-AN-mlp-1p-s1-b16-lr0.01-8e3468b0""".split()


def test_a_spec_without_method_modes_keeps_its_run_ids():
    s = load_study(OLD_SPEC)
    assert [t.run_id for t in expand(s)] == OLD_IDS
    assert all(m.mode is None for m in s.methods) and "mode:" not in \
        s.to_yaml().split("methods:")[1].split("mode: linear")[0]
    # naming the study's own mode is the same row (same options merged, same ids)
    named = load_study({**OLD_SPEC, "methods": [{"spec": "an", "mode": "linear"}, "epr",
                                                "bce@full", OLD_SPEC["methods"][3]]})
    assert [t.run_id for t in expand(named)] == OLD_IDS
    assert named.row_labels()["an"] == "an"


@pytest.mark.parametrize("method, message", [
    ({"label": "x", "spec": "an", "mode": "smilee"},
     r"methods\[1\]\.mode: expected one of .*smile"),
    ({"spec": "epr", "mode": "smile"},
     r"methods\[1\]: mode 'smile' trains with the loss\(es\) \['an'\], got 'epr'"),
    ({"label": "x", "spec": "an", "mode": "smile", "mode_options": {"head": "mlp"}},
     r"methods\[1\]\.mode_options: .*method 'smile' has no option\(s\) \['head'\]"),
    ({"label": "x", "mode": "smile"}, r"methods\[1\]: expected a method spec or .*spec "
                                      r"required"),
    ({"label": "x", "spec": "an", "modes": "smile"},
     r"methods\[1\]: unknown key\(s\) \['modes'\] \(did you mean 'mode'\?\); a method "
     r"mapping takes label, spec, mode"),
    ({"spec": "an", "mode": "smile"}, r"methods: labels must be unique, got \['an', 'an'\]"),
])
def test_method_mode_errors_name_the_method(method, message):
    with pytest.raises(ValueError, match=message):
        load_study(spec(methods=["an", method], mode_options={"head": "linear"}))


def test_a_method_in_its_own_mode_runs_resumes_and_tables_beside_the_linear_ones(tmp_path,
                                                                                  capsys):
    """SMILE (mode smile) and AN (the study's linear mode) in one study: the SMILE rows train
    with their own trainer and options (not the study's linear-mode ones), a SMILE run stopped
    mid-way resumes from its checkpoint to the numbers of an uninterrupted one, and the tables
    show every row, the one in another mode with its mode."""
    from _pool_tasks import Pausing, epochs_by_try

    from spmlkit.experiments.pool import InProcessExecutor

    smile = {"label": "SMILE", "spec": "an", "mode": "smile"}
    s = load_study(spec(methods=["an", smile, {"label": "an-k2", "spec": "an", "mode": "smile",
                                               "mode_options": {"neighbours": 2}}],
                        mode_options={"head": "linear"}, epochs=3))
    assert load_study(s.to_dict()).methods == s.methods  # study.yaml round trip
    tasks = {t.method: t for t in expand(s)}
    assert (tasks["an"].mode, tasks["an"].mode_options) == ("linear", {"head": "linear"})
    assert (tasks["SMILE"].mode, tasks["SMILE"].mode_options) == ("smile", {})
    assert tasks["an-k2"].mode_options == {"neighbours": 2}
    alone = expand(load_study(spec(methods=["an"], mode_options={"head": "linear"}, epochs=3)))
    assert tasks["an"].run_id == alone[0].run_id  # the linear row is the one it always was
    assert s.row_labels() == {"an": "an", "SMILE": "SMILE", "an-k2": "an-k2 [smile]"}

    # a first launch of the SMILE row alone, stopped (Ctrl-C) in its epoch-2 record
    out, paused = tmp_path / "mixed", tmp_path / "paused"
    paused.mkdir()
    only_smile = load_study(s.to_dict(), {"methods": [smile]})
    plan = {"dir": str(paused), "epoch": 2, "interrupt": True}
    with pytest.raises(KeyboardInterrupt):
        run_study(only_smile, out=out, progress=False, checkpoint_seconds=0,
                  executor=Pausing(InProcessExecutor(), plan))
    folder = out / "runs" / tasks["SMILE"].run_id
    assert (folder / "checkpoint.pt").is_file() and not (folder / "final.json").exists()
    # the whole study: the linear and the other SMILE row run, the stopped one resumes
    plan["epoch"] = None
    res = run_study(s, out=out, progress=False, executor=Pausing(InProcessExecutor(), plan))
    assert (res["runs_done_before"], res["runs_run"], res["failures"]) == (0, 3, 0)
    assert epochs_by_try(paused / "epochs.log", folder.name) == {os.getpid(): [1, 2, 3]}
    logged = [json.loads(x)["epoch"] for x in (folder / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3]
    store = StudyStore(out / "results.sqlite")
    rows = {r["method"]: r for r in store.rows()}
    assert {m: r["mode"] for m, r in rows.items()} == {"an": "linear", "SMILE": "smile",
                                                       "an-k2": "smile"}
    assert all(r["status"] == "done" and 0 < r["test_map"] < 100 for r in rows.values())
    configs = {m: json.loads((out / r["run_dir"] / "config.json").read_text())
               for m, r in rows.items()}
    assert configs["SMILE"]["mode"] == "smile" and "head" not in configs["SMILE"]["options"]
    assert (configs["SMILE"]["options"]["neighbours"],
            configs["an-k2"]["options"]["neighbours"]) == (3, 2)
    assert (folder / "enhanced_labels.npy").is_file()
    run_study(only_smile, out=tmp_path / "one", jobs=1, progress=False)
    (one,) = StudyStore(tmp_path / "one" / "results.sqlite").rows()
    assert [rows["SMILE"][c] for c in NUMBERS] == [one[c] for c in NUMBERS]
    again = run_study(s, out=out, jobs=1, progress=False)
    assert (again["runs_done_before"], again["runs_run"]) == (3, 0)
    # tables: every row, the one in another mode marked with it
    assert main(["study", "table", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| an |" in text and "| SMILE |" in text and "| an-k2 [smile] |" in text
    assert main(["study", "table", str(out), "--metric", "lrap,one_error"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in lines[-3:]] == ["| an", "| SMILE",
                                                             "| an-k2 [smile]"]


def test_the_progress_bar_counts_planned_run_epochs(tmp_path, capsys):
    """The launch's bar counts work (each run's planned epochs), advanced by a whole group of
    runs at once, with its ETA from the launch's average rate: a stack of runs that ends at
    once no longer makes one run look like the whole stack's time (an ETA 100x too long)."""
    from spmlkit.experiments.study.launch import planned_epochs

    spec = load_study("smoke")  # two methods, one seed, one grid point, two epochs
    assert [planned_epochs(t) for t in expand(spec)] == [2, 2]
    run_study(spec, tmp_path / "s", jobs=1, progress=True)
    err = capsys.readouterr().err.replace("\r", "\n")
    assert "4/4 [" in err and "run-epoch/s" in err and "2/2 runs, failed 0" in err


# ---- method options as a study axis ------------------------------------------------------------
MODES = {"methods": ["an", {"label": "SMILE", "spec": "an", "mode": "smile"},
                     {"label": "BoostLU", "spec": "an", "mode": "boostlu"},
                     {"label": "MIME", "spec": "an", "mode": "mime"}]}


def test_every_method_option_is_a_study_axis():
    """``option.<name>`` varies the option in the methods whose mode takes it (SMILE's ``kl``,
    BoostLU's ``alpha``, MIME's ``theta``, the linear mode's ``head``), laid over their mode
    options and into their run ids; the other methods run once, as without the axis."""
    plain = {t.method: t.run_id for t in expand(load_study(spec(**MODES)))}
    s = load_study(spec(**MODES, vary={"option.kl": ["official", "exact"],
                                       "option.alpha": [2.0, 5.0], "option.theta": [0.5],
                                       "option.head": ["linear", "mlp"]}))
    tasks = expand(s)
    by = {}
    for t in tasks:
        by.setdefault(t.method, []).append(t)
    assert sorted((t.mode_options["kl"], t.variant) for t in by["SMILE"]) == \
        [("exact", {"option.kl": "exact"}), ("official", {"option.kl": "official"})]
    assert sorted(t.mode_options["alpha"] for t in by["BoostLU"]) == [2.0, 5.0]
    assert [t.mode_options["theta"] for t in by["MIME"]] == [0.5]
    assert sorted(t.mode_options["head"] for t in by["an"]) == ["linear", "mlp"]
    assert "kl" not in by["an"][0].mode_options and "head" not in by["SMILE"][0].mode_options
    ids = [t.run_id for t in tasks]
    assert len(set(ids)) == len(ids) == 2 + 2 + 1 + 2
    assert {t.run_id for t in by["BoostLU"]} & {plain["BoostLU"]} == set()  # varied: new ids
    assert "-alpha2.0-" in by["BoostLU"][0].run_id or "-alpha2.0-" in by["BoostLU"][1].run_id
    assert [t.run_id for t in expand(load_study(s.to_dict()))] == ids  # study.yaml round trip


@pytest.mark.parametrize("vary, message", [
    ({"option.kl": ["bogus"]}, r"vary.option.kl: SMILE: smile option kl must be one of"),
    ({"option.alpha": [0]}, r"vary.option.alpha: BoostLU: alpha .* must be a finite number > 0"),
    ({"option.map_dtype": ["int8"]}, r"vary.option.map_dtype: BoostLU: map_dtype must be one"),
    ({"option.head": ["tree"]}, r"vary.option.head: an: head must be one of"),
    ({"option.ablation": ["nope"]}, r"vary.option.ablation: MIME: .*nope"),
    ({"option.bogus": [1]}, r"vary.option.bogus: no method's mode takes the option 'bogus' "
                            r"\(linear: .*; smile: .*kl"),
])
def test_an_option_axis_is_checked_by_each_mode_s_own_check(vary, message):
    with pytest.raises(ValueError, match=message):
        load_study(spec(**MODES, vary=vary))


def test_lac_options_vary_in_either_spelling_with_the_same_run_ids():
    """``lac.<field>`` is LAC's spelling of ``option.<field>``: the same runs and run ids (the
    ids pinned in tests/test_presets.py); both at once are refused."""
    pytest.importorskip("spmlkit.methods.lac")
    lac = [t.run_id for t in expand(load_study("lac-ablation", [
        "vary={lac.queue_size: [64, 1024], lac.temperature: [0.1, 0.5]}"]))]
    option = [t.run_id for t in expand(load_study("lac-ablation", [
        "vary={option.queue_size: [64, 1024], option.temperature: [0.1, 0.5]}"]))]
    assert option == lac and len(lac) == 12
    assert "fmnist_mosaic-AN-1p-s0-b32-lr0.001-queue_size64-temperature0.1-ebcfcff7" in option
    with pytest.raises(ValueError, match=r"temperature must be a finite number > 0"):
        load_study("lac-ablation", ["vary={option.temperature: [0]}"])
    with pytest.raises(ValueError, match=r"varied twice \(also as lac.dim\)"):
        load_study("lac-ablation", ["vary={lac.dim: [8], option.dim: [16]}"])


# ---- run ids: every option that changes results is hashed, and nothing else ------------------
def _id_paths():
    import dataclasses

    from spmlkit.data import DATASETS, PROTOCOL_OPTIONS, source_parameters
    from spmlkit.engine import TrainConfig
    from spmlkit.features import FEATURE_OPTIONS

    kept = [("dataset_options", k) for k in ("cache_dir", "progress", "mmap")]
    kept += [("dataset_options", "features", k)
             for k in ("cache_dir", "progress", "num_workers", "batch_size", "device")]
    kept += [("mode_options", "cache_dir"), ("mode_options", "progress")]
    kept += [("mode_options", "features", k) for k in ("num_workers", "batch_size", "device")]
    kept += [("train", "num_workers"), ("train", "eval_batch_size"),
             ("train", "train_predictions")]  # a file written or not, the same numbers
    # (written out here, not read from NOT_RESULTS: a key added there fails a test below)
    source = sorted({p for e in DATASETS.entries() for p in source_parameters(e.name)})
    hashed = [("dataset_options", k) for k in (*PROTOCOL_OPTIONS, "backbone", *source)
              if ("dataset_options", k) not in kept and k != "features"]
    hashed += [("dataset_options", "features", k) for k in FEATURE_OPTIONS
               if ("dataset_options", "features", k) not in kept]
    hashed += [("train", f.name) for f in dataclasses.fields(TrainConfig)
               if ("train", f.name) not in kept]
    hashed += [("hparams", "alpha"), ("regime",), ("k",), ("mode",), ("loss",),
               ("mode_options", "head"), ("mode_options", "features", "dtype")]
    return hashed, kept


#: a value for the options a run's config leaves out at their default (weight decay 0)
ABSENT = {"weight_decay": 0.01}


def _changed(value, key=None):
    if value is None and key in ABSENT:
        return ABSENT[key]
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 1
    return "other" if value is None else f"{value}-other"


def _with(config: dict, path: tuple):
    import copy

    out = copy.deepcopy(config)
    node = out
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = _changed(node.get(path[-1]), path[-1])
    return out


ID_HASHED, ID_KEPT = _id_paths()


@pytest.mark.parametrize("path", ID_HASHED, ids=".".join)
def test_a_run_id_hashes_every_option_that_changes_results(path):
    """Every protocol option, source option, feature-extraction option, TrainConfig field,
    hyperparameter and mode option moves a run's id (a study re-runs what it changes)."""
    from spmlkit.experiments.study import run_id_for

    config = expand(load_study(spec(methods=["an"])))[0].config()
    assert run_id_for(_with(config, path), 0, {}) != run_id_for(config, 0, {})


@pytest.mark.parametrize("path", ID_KEPT, ids=".".join)
def test_a_run_id_ignores_what_cannot_change_results(path):
    """Cache folders, progress bars, worker counts, batch sizes of extraction and evaluation,
    devices of extraction and memory-mapping leave a run's id as it is."""
    from spmlkit.experiments.study import run_id_for

    config = expand(load_study(spec(methods=["an"])))[0].config()
    config["dataset_options"] = {"backbone": "b", "features": {"dtype": "float16"}}
    config["mode_options"] = {"features": {"dtype": "float16"}}
    assert run_id_for(_with(config, path), 0, {}) == run_id_for(config, 0, {})


def test_what_a_run_id_leaves_out_is_the_list_above():
    from spmlkit.experiments.study.expand import NOT_RESULTS

    assert sorted(ID_KEPT) == sorted(tuple(where.split(".")) + (key,)
                                     for where, keys in NOT_RESULTS.items() for key in keys)


def test_a_regime_axis_is_not_repeated_in_the_readable_run_id():
    """The regime stands once in a run id (its third part), not again among the vary parts;
    these ids are pinned: a study's runs are found again by them."""
    s = load_study(spec(vary={"k": [2], "regime": ["1p_1n"]}))
    assert [t.run_id for t in expand(s)] == ["yeast-an-1p_1n-s0-b16-lr0.01-e46fc90a",
                                              "yeast-epr-1p_1n-s0-b16-lr0.01-k2-fa760d98"]


def test_cache_dirs_outside_the_study_are_named_and_a_table_s_feature_columns_are_not_one(
        tmp_path):
    """A launch names the feature-store folders a spec writes outside its folder; a tabular
    source's ``features`` (its column names, a string) is no feature-store option."""
    from spmlkit.experiments.study.launch import _cache_dirs_outside

    tasks = [types.SimpleNamespace(dataset_options={"features": "f1,f2", "path": "t.csv"},
                                   mode_options={}),
             types.SimpleNamespace(dataset_options={"backbone": "b", "features": {
                 "cache_dir": str(tmp_path / "elsewhere")}}, mode_options={}),
             types.SimpleNamespace(dataset_options={"cache_dir": str(tmp_path / "s" / "c")},
                                   mode_options=None)]
    assert _cache_dirs_outside(tasks, tmp_path / "s") == [(tmp_path / "elsewhere").resolve()]


def test_a_study_folder_given_as_the_spec_continues_there(tmp_path, capsys, monkeypatch):
    """``spml study run DIR`` (DIR a study folder, no --out) continues DIR: it retrained every
    run into ./runs/studies/NAME. A relaunch names the runs that failed before (they were
    counted as finished, with nothing said) and exits 1 as the first launch did: the table
    still lacks them."""
    from spmlkit.cli import main

    spec = tmp_path / "f.yaml"
    spec.write_text("name: f\ndatasets: [yeast]\nmethods: [an, epr]\nseeds: 1\nepochs: 1\n"
                    "grid: {batch_size: [16], lr: [1.0e-2]}\n"
                    "vary: {k: [2, 'estimate:99999:point']}\n")
    out = tmp_path / "study"
    assert main(["study", "run", str(spec), "--out", str(out), "--jobs", "1", "--quiet"]) == 1
    capsys.readouterr()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["study", "run", str(out), "--jobs", "1", "--quiet"]) == 1
    captured = capsys.readouterr()
    assert "f: 0 run(s) in" in captured.out and "3 of 3 were finished before" in captured.out
    assert f"study folder: {out}" in captured.out
    assert not (tmp_path / "elsewhere" / "runs").exists()
    assert "run(s) of this spec failed in an earlier launch and are not in the table; " \
           "--retry-failed runs them again" in captured.err


def test_a_study_is_read_back_by_the_name_it_ran_under(tmp_path, capsys, monkeypatch):
    """`spml study run` writes runs/studies/NAME; `spml study table NAME` (what a preset's
    header says) said the folder does not exist. A bare name that is no folder here is read
    from runs/studies/NAME, by every command that reads a study (the scikit-learn rows and
    the figures folder too); a folder of that name here still wins."""
    from spmlkit.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub.yaml").write_text(
        "name: sub\ndatasets: [yeast]\nmethods: [an]\nseeds: 1\nepochs: 1\n"
        "grid: {batch_size: [16], lr: [1.0e-2]}\nvary: {data.subsample: [0.2, 1.0]}\n"
        "sklearn_reference: true\n")
    assert main(["study", "run", "sub.yaml", "--jobs", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["study", "status", "sub"]) == 0 and "sub" in capsys.readouterr().out
    assert main(["study", "table", "sub", "--columns", "data.subsample"]) == 0
    assert "sklearn_lr (scikit-learn reference)" in capsys.readouterr().out
    assert main(["report", "sub"]) == 0
    assert (tmp_path / "runs" / "studies" / "sub" / "report.html").is_file()
    assert main(["figure", "sweep", "sub", "--axis", "data.subsample"]) == 0
    assert (tmp_path / "runs" / "studies" / "sub" / "figures").is_dir()
    assert sorted(os.listdir(tmp_path)) == ["runs", "sub.yaml"]  # nothing made under ./sub
    (tmp_path / "sub").mkdir()  # a folder named so here: that one is meant
    capsys.readouterr()
    assert main(["study", "table", "sub"]) == 2
    assert "sub/study.yaml is missing" in capsys.readouterr().err


def test_vary_columns_keep_the_datasets_of_a_study_apart(tmp_path, capsys):
    """``spml study table --columns hparams.alpha`` of a study of two datasets: a row per
    method and dataset (the cells averaged yeast's and the other set's mAP). A source listed
    twice with other options gets a column per entry (its runs were pooled, one grid point
    selected across them), with the run ids it had."""
    import yaml

    from spmlkit.cli import main
    from spmlkit.experiments.study import load_study, open_study

    rng = np.random.default_rng(0)
    x = rng.standard_normal((120, 6)).astype(np.float32)
    y = (x[:, :4] + 0.3 * rng.standard_normal((120, 4)) > 0.3).astype(np.uint8)
    y[np.arange(120), np.argmax(x[:, :4], axis=1)] = 1
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    spec = {"name": "two", "datasets": ["yeast", {"name": "arrays", "options": {
        "features": str(tmp_path / "x.npy"), "labels": str(tmp_path / "y.npy")}}],
        "methods": ["em"], "seeds": 1, "epochs": 1, "grid": {"batch_size": [16], "lr": [1e-2]},
        "vary": {"hparams.alpha": [0.1, 0.5]}}
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "study"
    assert main(["study", "run", str(tmp_path / "two.yaml"), "--out", str(out), "--jobs", "1",
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["study", "table", str(out), "--columns", "hparams.alpha"]) == 0
    table = capsys.readouterr().out
    from spmlkit.experiments.tables import row_variant

    rows = {r["dataset"] + str(row_variant(r)["hparams.alpha"]): r["test_map"]
            for r in open_study(out).selected}
    for dataset in ("yeast", "arrays"):
        line = next(ln for ln in table.splitlines() if f"em [{dataset}]" in ln)
        for alpha in (0.1, 0.5):
            assert f"{rows[dataset + str(alpha)]:.2f}" in line, (line, rows)
    twice = {**spec, "name": "twice", "vary": {},
             "datasets": ["yeast", {"name": "yeast", "options": {"seed": 7}}]}
    (tmp_path / "twice.yaml").write_text(yaml.safe_dump(twice))
    assert main(["study", "run", str(tmp_path / "twice.yaml"), "--out", str(tmp_path / "t2"),
                 "--jobs", "1", "--quiet"]) == 0
    selected = open_study(tmp_path / "t2").selected
    assert sorted(r["dataset"] for r in selected) == ["yeast", "yeast (seed=7)"]
    assert len({r["test_map"] for r in selected}) == 2  # two splits, two grid selections
    assert [t.run_id for t in expand(load_study(twice))] == sorted(r["run_id"] for r in selected)
    capsys.readouterr()
    assert main(["study", "table", str(tmp_path / "t2")]) == 0
    assert "| Method | yeast | yeast (seed=7) |" in capsys.readouterr().out
    # the scikit-learn rows are per entry too; a data.* axis over an entry's option keeps
    # each run with its own entry
    varied = {**twice, "name": "varied", "sklearn_reference": True,
              "datasets": [{"name": "yeast", "options": {"subsample": 0.5}},
                           {"name": "yeast", "options": {"seed": 7}}],
              "vary": {"data.subsample": [0.5, 1.0]}}
    (tmp_path / "varied.yaml").write_text(yaml.safe_dump(varied))
    assert main(["study", "run", str(tmp_path / "varied.yaml"), "--out", str(tmp_path / "t3"),
                 "--jobs", "1", "--quiet"]) == 0
    study = open_study(tmp_path / "t3")
    assert sorted({r["dataset"] for r in study.rows}) == ["yeast (seed=7)",
                                                          "yeast (subsample=0.5)"]
    assert all((json.loads(r["config"])["dataset_options"].get("seed") == 7) ==
               (r["dataset"] == "yeast (seed=7)") for r in study.rows)
    capsys.readouterr()
    assert main(["study", "table", str(tmp_path / "t3")]) == 0
    table = capsys.readouterr().out
    head = next(ln for ln in table.splitlines() if ln.startswith("| Method"))
    assert sorted(c.strip() for c in head.strip("|").split("|")[1:]) == \
        ["yeast (seed=7)", "yeast (subsample=0.5)"]
    ref = next(ln for ln in table.splitlines() if ln.startswith("| sklearn_lr (scikit"))
    assert "–" not in ref and "±" not in ref, ref  # one value per entry, not pooled


def test_checkpoint_seconds_for_stacked_runs_only_is_refused(tmp_path, capsys):
    """``--checkpoint-seconds`` where every run trains stacked (the linear default) did nothing,
    silently: a killed stack trains again. Refused before anything is written; with
    ``--no-vectorise`` the runs train alone and write their checkpoints."""
    from spmlkit.cli import main

    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\ndatasets: [yeast]\nmethods: [an]\nseeds: 2\nepochs: 1\n"
                    "grid: {batch_size: [16], lr: [1.0e-2]}\n")
    out = tmp_path / "study"
    assert main(["study", "run", str(spec), "--out", str(out), "--checkpoint-seconds", "0",
                 "--jobs", "1", "--quiet"]) == 2
    assert "--checkpoint-seconds: every run this launch trains is stacked" in \
        capsys.readouterr().err
    assert not out.exists()
    assert main(["study", "run", str(spec), "--out", str(out), "--checkpoint-seconds", "0",
                 "--no-vectorise", "--jobs", "1", "--quiet"]) == 0


def test_a_data_path_that_names_nothing_is_refused_before_the_launch(tmp_path, capsys,
                                                                     monkeypatch):
    """A spec's relative ``path: train.csv`` launched from another folder: every run failed
    alone with "table file train.csv does not exist" and was stored as failed. The launch is
    refused first, naming the absolute path looked at and the folder it is relative to."""
    from spmlkit.cli import main

    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\ndatasets: [{name: tabular, options: {path: train.csv, "
                    "labels: 'c*'}}]\nmethods: [an]\nseeds: 1\nepochs: 1\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    out = tmp_path / "study"
    assert main(["study", "run", str(spec), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"dataset 'tabular': option path=train.csv names nothing at " \
           f"{tmp_path / 'elsewhere' / 'train.csv'} (a relative path is taken from the folder " \
           f"spml runs in" in err
    assert not out.exists()


def test_the_data_path_check_leaves_cache_folders_and_expands_home(tmp_path):
    """The launch's path check refused a cache folder a source makes where it is missing
    (fmnist_mosaic's cache_dir), and ``~`` (checked as a folder named '~')."""
    from spmlkit.experiments.study import load_study
    from spmlkit.experiments.study.launch import check_data_paths

    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\ndatasets: [{name: fmnist_mosaic, options: {cache_dir: "
                    f"'{tmp_path / 'new-cache'}', backbone: tiny_cnn}}}}]\nmethods: [an]\n"
                    "seeds: 1\nepochs: 1\n")
    check_data_paths(load_study(str(spec)))
    spec.write_text("name: s\ndatasets: [{name: tabular, options: {path: '~', labels: 'c*'}}]\n"
                    "methods: [an]\nseeds: 1\nepochs: 1\n")
    check_data_paths(load_study(str(spec)))  # ~ exists (a folder: the source says so later)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_spec_train_device_this_machine_lacks_is_refused_before_a_folder(tmp_path, capsys):
    # it made the study folder, then every run ended in torch's "AssertionError: Torch not
    # compiled with CUDA enabled"
    with pytest.raises(ValueError, match=r"train.device: 'cuda': this machine has 0 CUDA "
                       r"device\(s\); use cpu"):
        load_study(spec(train={"device": "cuda"}))
    with pytest.raises(ValueError, match=r"grid.device: 'cuda:1': this machine has 0 CUDA"):
        load_study(spec(grid={"batch_size": [16], "lr": [1e-2], "device": ["cpu", "cuda:1"]}))
    with pytest.raises(ValueError, match=r"train: TrainConfig.device must be a name such as cpu"):
        load_study(spec(train={"device": "gpu"}))
    path = tmp_path / "cuda.yaml"
    path.write_text(json.dumps(spec(train={"device": "cuda"})))
    out = tmp_path / "study"
    assert main(["study", "run", str(path), "--out", str(out), "--quiet"]) == 2
    assert "train.device: 'cuda': this machine has 0 CUDA device(s)" in capsys.readouterr().err
    assert not out.exists()
    assert load_study(spec(train={"device": "cpu"})).train == {"device": "cpu"}
