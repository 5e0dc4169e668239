"""Studies on Dask distributed: a real ``LocalCluster`` (worker processes on this machine) runs
a study while one of its workers is SIGKILLed mid-run; the killed run resumes from its
checkpoint and the table equals the local pool's to the last digit. Then the executor's own
contract on a shared cluster (a task whose worker dies is retried, then lost with the reason;
an exception propagates), and the command line's errors."""
import json
import os
import threading

import pytest
from _pool_tasks import Pausing, check_resumed, kill_when_paused, work

pytest.importorskip("distributed")

from spmlkit.cli import main  # noqa: E402
from spmlkit.experiments.dask_executor import DaskExecutor, local_cluster  # noqa: E402
from spmlkit.experiments.pool import run_tasks  # noqa: E402
from spmlkit.experiments.store import StudyStore  # noqa: E402
from spmlkit.experiments.study import load_study, run_study, study_rows  # noqa: E402
from spmlkit.experiments.tables import study_table  # noqa: E402

TIMEOUT = 120  # seconds: a regression that hangs fails here instead of hanging the suite
SPEC = {"name": "t", "datasets": ["yeast"], "methods": ["an", "epr"], "seeds": 1, "epochs": 4,
        "grid": {"batch_size": [16], "lr": [1e-2, 1e-3]}}
NUMBERS = ("run_id", "status", "val_map", "test_map", "train_recovery_map", "best_epoch",
           "run_dir")


def numbers(rows) -> list:
    """The rows' numbers: the columns above and every metric but the run's wall time."""
    return [[r[c] for c in NUMBERS] + [{k: v for k, v in json.loads(r["metrics"]).items()
                                        if k != "seconds"}] for r in rows]


@pytest.mark.slow
def test_a_study_on_a_local_cluster_survives_a_killed_worker_and_equals_the_local_pool(
        tmp_path, caplog):
    """2 worker processes; the first run to reach epoch 3 (checkpoint after every epoch) has its
    worker SIGKILLed from here. The study finishes with every run done, the killed run resumed
    from its checkpoint (epochs 3-4 trained again, none twice in its log), and its rows, the
    selection and the table equal those of the local pool."""
    s, out, paused = load_study(SPEC), tmp_path / "dask", tmp_path / "paused"
    paused.mkdir()
    dask = DaskExecutor(n_workers=2)
    executor = Pausing(dask, {"dir": str(paused), "epoch": 3})
    seen = {}

    def check(pid):  # the paused task runs in one of the cluster's worker processes
        seen["pids"] = dask.worker_pids()
        assert pid in seen["pids"].values() and pid != os.getpid()

    result, pid, run_id = kill_when_paused(lambda: run_study(
        s, out=out, progress=False, checkpoint_seconds=0, executor=executor, vectorise=False),
        paused, check, timeout=TIMEOUT)  # one run per task: the killed run is the one resumed
    assert len(seen["pids"]) == 2
    assert (result["runs_run"], result["failures"]) == (4, 0)
    assert result["executor"] == "Dask LocalCluster of 2 worker(s)"
    assert f"died while running task {run_id} (1 death(s) so far); running it again" in \
        caplog.text
    check_resumed(out, paused, pid, run_id)
    assert dask.client is None and dask.cluster is None  # closed with the study

    run_study(s, out=tmp_path / "pool", jobs=2, progress=False, vectorise=False)
    rows = StudyStore(out / "results.sqlite").rows()
    pool = StudyStore(tmp_path / "pool" / "results.sqlite").rows()
    assert [r["status"] for r in rows] == ["done"] * 4
    assert numbers(rows) == numbers(pool)
    (_, selected), (_, selected_pool) = study_rows(out), study_rows(tmp_path / "pool")
    assert study_table(selected) == study_table(selected_pool)


# ---- the executor on a shared cluster ---------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    import distributed

    cluster = local_cluster(2)
    c = distributed.Client(cluster, set_as_default=False)
    yield c
    c.close()
    cluster.close()


def collect(iterator):
    out = {}

    def drain():
        try:
            out["items"] = list(iterator)
        except BaseException as err:  # handed to the test
            out["error"] = err

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    thread.join(TIMEOUT)
    assert not thread.is_alive(), f"the iteration did not finish in {TIMEOUT} s"
    if "error" in out:
        raise out["error"]
    return out["items"]


def tasks(tmp_path, n, changes=None):
    return [{"x": x, "log": str(tmp_path / f"task{x}.log"), **(changes or {}).get(x, {})}
            for x in range(n)]


def starts(task) -> int:
    with open(task["log"]) as fh:
        return sum(line.startswith("start") for line in fh)


def test_a_task_whose_worker_dies_is_retried_then_lost_with_the_reason(client, tmp_path):
    """Task 1 kills its worker on its first try (retried, then done); task 2 on every try:
    ``retries=1`` gives it 2 tries, then it is lost, and ``on_lost`` names the reason; the
    cluster's nannies replace the dead workers."""
    todo = tasks(tmp_path, 4, {1: {"die": 1}, 2: {"die": 99}})
    results = collect(run_tasks(work, todo, retries=1, executor=DaskExecutor(client=client),
                                on_lost=lambda task, reason: {"lost": task["x"],
                                                              "reason": reason}))
    done = sorted(r["x"] for r in results if "x" in r)
    (lost,) = [r for r in results if "lost" in r]
    assert done == [0, 1, 3] and lost["lost"] == 2
    assert lost["reason"].startswith("the Dask worker died while running this task (last "
                                     "worker tcp://127.0.0.1:")
    assert lost["reason"].endswith("); tried 2 times")
    # task 2: one try per death counted; the others at least as often as they had to run (a
    # result still on a worker that dies is computed again by dask, counted against nothing)
    assert starts(todo[2]) == 2 and starts(todo[1]) >= 2
    assert starts(todo[0]) >= 1 and starts(todo[3]) >= 1
    assert client.status == "running"  # a client given is left open


def test_an_exception_in_a_task_propagates(client, tmp_path):
    with pytest.raises(ValueError, match="task 1 fails as asked"):
        collect(run_tasks(work, tasks(tmp_path, 3, {1: {"fail": True}}), retries=0,
                          executor=DaskExecutor(client=client)))


# ---- errors -----------------------------------------------------------------------------------
def test_cli_dask_errors_are_one_line(tmp_path, capsys):
    args = ["study", "run", "smoke", "--out", str(tmp_path / "s"), "--quiet"]
    assert main(args + ["--scheduler-file", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spml study run: error: Dask scheduler file ") and "nope.json" in err
    assert len(err.splitlines()) == 1
    with pytest.raises(SystemExit):  # argparse: one of them
        main(args + ["--dask", "local", "--scheduler", "tcp://127.0.0.1:1"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_without_dask_installed_the_message_says_how_to_install(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(ModuleNotFoundError, match=r'pip install -e "\.\[dask\]"'):
        run_study(SPEC, out=tmp_path / "s", dask="local", progress=False)
    assert not (tmp_path / "s").exists()  # nothing written


def test_executor_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="one of them"):
        DaskExecutor("tcp://127.0.0.1:8786", scheduler_file=tmp_path / "s.json")
    with pytest.raises(ValueError, match="n_workers is the size of a LocalCluster"):
        DaskExecutor("tcp://127.0.0.1:8786", n_workers=2)
    with pytest.raises(FileNotFoundError, match="s.json does not exist"):
        DaskExecutor(scheduler_file=tmp_path / "s.json")
