"""The parallel runner: results of every task, a worker killed by SIGKILL (its task retried
alone, then lost: ``on_lost`` or a RuntimeError), no worker left behind however it stops."""
import contextlib
import multiprocessing as mp
import os
import signal
import threading
from pathlib import Path

import pytest
from _pool_tasks import collector, work

from spmlkit.experiments.pool import run_tasks

TIMEOUT = 60  # seconds; the runs take a few: a regression that hangs fails here instead


def collect(iterator, timeout=TIMEOUT):
    """Everything ``iterator`` yields, or its exception, run in a thread; fails after
    ``timeout`` seconds instead of hanging the suite."""
    out = {"items": [], "error": None}

    def drain():
        try:
            out["items"].extend(iterator)
        except BaseException as err:  # handed to the test
            out["error"] = err

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        for child in mp.active_children():  # do not leave the hung pool's workers running
            child.kill()
        pytest.fail(f"the iteration did not finish in {timeout} s")
    if out["error"] is not None:
        raise out["error"]
    return out["items"]


def make_tasks(tmp_path, n, changes=None, sleep=0.2):
    """``n`` tasks ``x = 0..n-1``, each with its own try log; ``changes[x]`` updates task x."""
    return [{"x": x, "sleep": sleep, "log": str(tmp_path / f"task{x}.log"),
             **(changes or {}).get(x, {})} for x in range(n)]


def tries(task) -> list[tuple[float, float | None]]:
    """(start, end) of each try of a task, end None for a try whose process died."""
    out = []
    for line in Path(task["log"]).read_text().splitlines():
        what, t = line.split()
        if what == "start":
            out.append((float(t), None))
        else:
            out[-1] = (out[-1][0], float(t))
    return out


def lost(task, reason):
    return {"lost": task["x"], "reason": reason}


def test_jobs_1_runs_in_this_process(tmp_path):
    results = collect(run_tasks(work, make_tasks(tmp_path, 3, sleep=0), jobs=1))
    assert [r["square"] for r in results] == [0, 1, 4]
    assert {r["pid"] for r in results} == {os.getpid()}


def test_a_task_that_kills_its_worker_is_lost_and_the_others_finish(tmp_path):
    tasks = make_tasks(tmp_path, 6, {2: {"die": 99}})
    results = collect(run_tasks(work, tasks, jobs=2, on_lost=lost))
    assert len(results) == 6
    (gone,) = [r for r in results if "lost" in r]
    assert gone["lost"] == 2
    assert gone["reason"] == ("the worker process died while running this task (killed by "
                              "SIGKILL, e.g. out of memory); tried 2 times, alone after the "
                              "first")
    done = sorted((r for r in results if "lost" not in r), key=lambda r: r["x"])
    assert [(r["x"], r["square"]) for r in done] == [(0, 0), (1, 1), (3, 9), (4, 16), (5, 25)]
    assert len(tries(tasks[2])) == 2  # retries=1: once more, then lost
    for t in tasks[:2] + tasks[3:]:  # the other workers were never disturbed: one try each
        assert len(tries(t)) == 1 and tries(t)[0][1] is not None
    assert mp.active_children() == []


def test_without_on_lost_a_lost_task_raises_naming_it(tmp_path):
    tasks = make_tasks(tmp_path, 4, {1: {"die": 99, "run_id": "yeast-an-s1"}})
    with pytest.raises(RuntimeError, match=r"task yeast-an-s1: the worker process died while "
                                           r"running this task \(killed by SIGKILL"):
        collect(run_tasks(work, tasks, jobs=2))
    assert mp.active_children() == []


def test_a_task_that_dies_once_is_retried_alone_and_succeeds(tmp_path):
    tasks = make_tasks(tmp_path, 5, {1: {"die": 1}})
    seen = []
    results = collect(run_tasks(work, tasks, jobs=2,
                                on_lost=lambda t, r: seen.append(t) or lost(t, r)))
    assert seen == []
    assert sorted((r["x"], r["square"]) for r in results) == [(x, x * x) for x in range(5)]
    first, second = tries(tasks[1])
    assert first[1] is None and second[1] is not None  # died, then finished
    for t in tasks[:1] + tasks[2:]:  # nothing else ran while the retry did
        ((start, end),) = tries(t)
        assert end <= second[0] or start >= second[1]


def test_retries_0_loses_a_dead_task_at_once(tmp_path):
    tasks = make_tasks(tmp_path, 1, {0: {"die": 1}})  # alone in flight: it did kill its worker
    (result,) = collect(run_tasks(work, tasks, jobs=2, retries=0, on_lost=lost))
    assert result["lost"] == 0 and result["reason"].endswith("tried 1 time")
    assert len(tries(tasks[0])) == 1  # it would have succeeded on a second try


def test_retries_must_not_be_negative(tmp_path):
    with pytest.raises(ValueError, match="retries .* must be >= 0, got -1"):
        collect(run_tasks(work, make_tasks(tmp_path, 2), jobs=2, retries=-1))


def test_an_exception_in_a_task_propagates_with_its_traceback_and_stops_the_workers(tmp_path):
    tasks = make_tasks(tmp_path, 4, {0: {"fail": True, "sleep": 0}})
    with pytest.raises(ValueError, match="task 0 fails as asked") as info:
        collect(run_tasks(work, tasks, jobs=2))
    assert "_pool_tasks.py" in str(info.value.__cause__)  # the worker's traceback
    assert mp.active_children() == []


def test_closing_the_iteration_early_terminates_the_workers(tmp_path):
    it = run_tasks(work, make_tasks(tmp_path, 6, sleep=0.5), jobs=2)
    first = next(it)
    assert first["square"] == first["x"] ** 2
    busy = mp.active_children()
    assert len(busy) == 2
    it.close()
    assert mp.active_children() == []
    assert all(p.exitcode == -signal.SIGTERM for p in busy)


def test_workers_collect_garbage_but_never_sweep_what_the_fork_server_preloaded():
    # the server imports torch and spmlkit with the collector off, then freezes those objects
    # and turns it back on (_server_init, _server_ready): its workers start with it on
    if "forkserver" not in mp.get_all_start_methods():
        pytest.skip("no fork server here")
    results = collect(run_tasks(collector, [{}, {}], jobs=2))
    assert all(r["enabled"] for r in results)
    assert all(r["frozen"] > 100_000 for r in results), results  # torch's objects
    assert all(r["pid"] != os.getpid() for r in results)


def test_a_fork_server_killed_while_it_starts_a_worker_ends_the_study_in_one_line(
        tmp_path, capsys, monkeypatch):
    """It ended the launch with multiprocessing's raw ``EOFError: unexpected EOF``; the store
    is intact and the same command runs every run."""
    import json
    from multiprocessing import forkserver

    from spmlkit.cli import main
    from spmlkit.experiments.study import study_status

    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"name": "s", "datasets": ["yeast"], "methods": ["an", "epr"],
                                "seeds": 1, "epochs": 1,
                                "grid": {"batch_size": [16], "lr": [1e-2]}}))
    out = tmp_path / "study"
    command = ["study", "run", str(spec), "--out", str(out), "--jobs", "2", "--quiet"]
    connect = getattr(forkserver, "connect_to_new_process", None)
    if connect is None or "forkserver" not in mp.get_all_start_methods():
        pytest.skip("no fork server, or one this test cannot reach")
    killed = []

    def connect_then_kill(*args, **kwargs):
        """The first worker's request reaches the fork server, stopped (SIGSTOP) so that it
        cannot answer, which is then killed (SIGKILL) while the worker waits for it."""
        server = forkserver._forkserver._forkserver_pid
        if not killed:
            os.kill(server, signal.SIGSTOP)
        conn = connect(*args, **kwargs)
        if not killed:
            os.kill(server, signal.SIGKILL)
            killed.append(server)
        return conn

    monkeypatch.setattr(forkserver, "connect_to_new_process", connect_then_kill)
    assert main(command) == 1
    assert killed
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("spml study run: error: the fork server that starts the worker "
                           "processes ended while it started one (killed? multiprocessing: "
                           "EOFError: unexpected EOF); 0 of 2 runs are done and kept in ")
    assert line.endswith(", the same command runs the 2 missing ones")
    assert study_status(out)["total"] == 2  # the store is intact
    assert main(command) == 0  # a new fork server
    assert study_status(out)["done"] == 2


def _gone(pid: int, timeout: float = 20.0) -> bool:
    """Whether process ``pid`` ended (or is a zombie) within ``timeout`` seconds."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_the_pools_processes_end_when_its_process_is_killed(tmp_path):
    """SIGKILL of a benchmark's or a study's process runs none of its cleanup: its fork server
    and workers kept running (an interrupted ``spml benchmark`` left its fork server)."""
    import subprocess
    import sys
    import time

    tasks = [{"x": x, "sleep": 300, "pidfile": str(tmp_path / f"{x}.pid")} for x in range(2)]
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import json\n"
            "from _pool_tasks import sleep_and_tell\n"
            "from spmlkit.experiments.pool import run_tasks\n"
            "list(run_tasks(sleep_and_tell, json.loads(sys.argv[2]), jobs=2))\n")
    import json

    parent = subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).parent),
                               json.dumps(tasks)], env={**os.environ, "PYTHONPATH": str(
                                   Path(__file__).parents[1] / "src")})
    try:
        end = time.monotonic() + TIMEOUT
        while not all(Path(t["pidfile"]).exists() and Path(t["pidfile"]).read_text()
                      for t in tasks):
            assert parent.poll() is None and time.monotonic() < end, "the workers never started"
            time.sleep(0.1)
        pids = [tuple(map(int, Path(t["pidfile"]).read_text().split())) for t in tasks]
        workers = [w for w, _ in pids]
        servers = {p for _, p in pids} - {parent.pid}  # the fork server (none when spawned)
        parent.kill()
        parent.wait()
        left = [p for p in [*servers, *workers] if not _gone(p)]
        assert not left, f"still running after their parent was killed: {left}"
    finally:
        if parent.poll() is None:
            parent.kill()
        for t in tasks:  # never leave them behind, whatever failed
            with contextlib.suppress(OSError, ValueError):
                for pid in map(int, Path(t["pidfile"]).read_text().split()):
                    if pid != os.getpid():
                        os.kill(pid, signal.SIGKILL)
