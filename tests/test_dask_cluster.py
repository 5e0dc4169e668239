"""Studies on a Dask cluster started the way its users start one: ``dask scheduler
--scheduler-file F`` and ``dask worker --scheduler-file F --nworkers 2 --nthreads 1``, each a
separate process of the real ``dask`` command (as on separate machines; here all on 127.0.0.1),
then ``spml study run --scheduler-file F``. The study's table equals the local run's; and the
faults: a worker killed mid-study, the scheduler killed mid-study (then a relaunch against a new
scheduler), an address that accepts and never answers, malformed addresses.

The workers get one thing the users' do not: ``--preload tests/_dask_pause.py``, which logs the
epochs each worker trains and, when a test arms it, holds the first run to reach an epoch, so
that the test knows which task a worker holds when it kills something. Every process started
here is killed at the end of its fixture or test; every wait is bounded."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest

pytest.importorskip("distributed")

import spmlkit  # noqa: E402
from spmlkit.cli import main  # noqa: E402
from spmlkit.experiments.store import StudyStore  # noqa: E402
from spmlkit.machine import end_with_parent  # noqa: E402

BIN = Path(sys.executable).parent  # the environment's `dask` and `spml`
HERE = Path(__file__).resolve().parent
WAIT = 90.0  # seconds any one wait may take before the test fails (never hangs)
SPEC = {"name": "c", "title": "cluster", "datasets": ["yeast"], "methods": ["an", "epr"],
        "seeds": 2, "epochs": 3, "grid": {"batch_size": [16], "lr": [1e-2, 1e-3]}}
NUMBERS = ("run_id", "status", "val_map", "test_map", "train_recovery_map", "best_epoch",
           "run_dir")


def env(pause_dir) -> dict:
    """The processes' environment: this spmlkit first on the path (the workers must run the
    driver's version), the pause folder of `_dask_pause`, and the scheduler's
    ``allowed-failures`` 0 (each worker death reaches the driver, as the docs advise)."""
    src = str(Path(spmlkit.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "SPMLKIT_TEST_PAUSE_DIR": str(pause_dir),
            "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}


def wait_until(what: str, ready, timeout: float = WAIT, alive=(), poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while not ready():
        for proc in alive:
            assert proc.poll() is None, f"{what}: {proc.args[:2]} exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(poll)


class Cluster:
    """A scheduler and a worker command (``nworkers`` worker processes of ``nthreads`` threads)
    started as separate process groups; `stop` kills both groups."""

    def __init__(self, folder: Path, nworkers: int = 2, nthreads: int = 1):
        self.nworkers, self.nthreads = nworkers, nthreads
        self.folder = folder
        self.pause = folder / "pause"
        self.pause.mkdir(parents=True)
        self.file = folder / "scheduler.json"
        self.procs: list[subprocess.Popen] = []
        self.scheduler = self.workers = None

    def start(self):
        e = env(self.pause)
        logs = self.folder
        self.scheduler = self.popen(
            [BIN / "dask", "scheduler", "--scheduler-file", self.file, "--host", "127.0.0.1",
             "--port", "0", "--no-dashboard"], logs / "scheduler.log", e)
        wait_until("the scheduler file", self.file.exists, alive=[self.scheduler])
        wait_until("the scheduler address", lambda: "address" in self.read(), alive=[
            self.scheduler])
        self.workers = self.popen(
            [BIN / "dask", "worker", "--scheduler-file", self.file, "--nworkers", self.nworkers,
             "--nthreads", self.nthreads, "--host", "127.0.0.1", "--no-dashboard",
             "--preload", HERE / "_dask_pause.py"], logs / "workers.log", e)
        wait_until("the workers", lambda: self.worker_count() == self.nworkers,
                   alive=[self.scheduler, self.workers], poll=0.25)
        return self

    def popen(self, args, log, e):
        with open(log, "ab") as fh:
            # SIGTERM when the test process ends, even killed (a stopped `make test`): the
            # dask commands then close their own processes; the fixture kills them otherwise
            proc = subprocess.Popen([str(a) for a in args], stdout=fh, stderr=subprocess.STDOUT,
                                    env=e, cwd=self.folder, start_new_session=True,
                                    preexec_fn=partial(end_with_parent, parent=os.getpid()))
        self.procs.append(proc)
        return proc

    def read(self) -> dict:
        try:
            return json.loads(self.file.read_text())
        except (OSError, ValueError):
            return {}

    @property
    def address(self) -> str:
        return self.read()["address"]

    def worker_count(self) -> int:
        import asyncio

        from distributed.comm import connect

        async def ask():
            comm = await connect(self.address, timeout=5)
            try:
                await comm.write({"op": "identity", "reply": True})
                return await comm.read()
            finally:
                comm.abort()

        try:
            return len(asyncio.run(asyncio.wait_for(ask(), 10))["workers"])
        except (OSError, TimeoutError, KeyError):
            return 0

    def kill(self, proc) -> None:
        with_group(proc, signal.SIGKILL)
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        for proc in self.procs:
            self.kill(proc)

    # ---- the pause of _dask_pause -----------------------------------------------------------
    def arm(self, epoch: int) -> None:
        for name in ("paused", "epochs.log"):
            (self.pause / name).unlink(missing_ok=True)
        (self.pause / "armed").write_text(str(epoch))

    def disarm(self) -> None:
        for name in ("armed", "paused", "epochs.log"):
            (self.pause / name).unlink(missing_ok=True)

    def paused(self, alive=()) -> tuple[int, set]:
        """Wait for a paused run; its worker's pid and the run ids that its thread trained since
        armed (the task it holds: one run, or a stack)."""
        wait_until("a paused run", (self.pause / "paused").exists, alive=alive)
        pid, thread = (self.pause / "paused").read_text().split()
        return int(pid), {line.split()[0] for line in (self.pause / "epochs.log").read_text()
                          .splitlines() if line.split()[1:3] == [pid, thread]}


def with_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The same study run here, planned for 2 workers as the cluster's (so cut into the same 2
    stacks of 4) but trained in this process, one stack after the other: its folder."""
    from spmlkit.experiments.pool import InProcessExecutor
    from spmlkit.experiments.study import run_study

    out = tmp_path_factory.mktemp("local") / "study"
    result = run_study(SPEC, out=out, jobs=2, progress=False, executor=InProcessExecutor())
    assert (result["runs_run"], result["failures"]) == (8, 0)
    return out


def table(out, capsys) -> str:
    capsys.readouterr()
    assert main(["study", "table", str(out)]) == 0
    return capsys.readouterr().out


def numbers(out) -> list:
    rows = StudyStore(Path(out) / "results.sqlite").rows()
    return [[r[c] for c in NUMBERS] + [{k: v for k, v in json.loads(r["metrics"]).items()
                                        if k != "seconds"}] for r in rows]


def spec_file(tmp_path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(SPEC))
    return path


def spml(args, timeout: float = 2 * WAIT) -> int:
    """``spml ARGS`` in this process (`spmlkit.cli.main`), in a thread that must end
    within ``timeout`` seconds: a driver that hangs fails the test instead."""
    result = {}

    def run():
        try:
            result["code"] = main([str(a) for a in args])
        except BaseException as err:  # noqa: BLE001 (handed to the test)
            result["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"spml {' '.join(map(str, args[:2]))} hangs"
    if "error" in result:
        raise result["error"]
    return result["code"]


# ---- the study on the cluster ------------------------------------------------------------------
@pytest.mark.slow
def test_a_study_on_a_cluster_of_separate_processes_equals_the_local_run(
        cluster, local, tmp_path, capsys):
    """8 stacked linear runs of 2 methods (cut into 2 stacks of 4 for the 2 worker threads)
    on the cluster: every run done, in the workers' processes, and ``spml study table`` equals
    the local run's (same plan, trained in this process) to the last character."""
    out = tmp_path / "study"
    cluster.disarm()
    code = spml(["study", "run", spec_file(tmp_path), "--out", out, "--quiet",
                 "--scheduler-file", cluster.file])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "8 run(s) in " in printed and f"on Dask scheduler {cluster.address}" in printed
    launch = json.loads((out / "launches.jsonl").read_text().splitlines()[-1])
    assert launch["jobs"] == 2 and launch["finished"]  # the cluster's 2 worker threads
    trained = {int(line.split()[1]) for line in
               (cluster.pause / "epochs.log").read_text().splitlines()}
    assert os.getpid() not in trained and len(trained) == 2  # both workers had a stack
    assert table(out, capsys) == table(local, capsys)
    assert numbers(out) == numbers(local)


# ---- faults ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_worker_killed_mid_study_is_retried_and_changes_nothing(cluster, local, tmp_path,
                                                                   capsys, caplog):
    """The first stack to reach epoch 2 holds; its worker process is SIGKILLed (the nanny starts
    a fresh one). The scheduler (``allowed-failures`` 0) reports the death, the driver submits
    that stack again, and every row equals the local run's."""
    out = tmp_path / "study"
    cluster.arm(2)
    result = {}

    def kill_the_holder():
        pid, held = cluster.paused()
        assert pid != os.getpid()
        os.kill(pid, signal.SIGKILL)
        result["held"] = held

    killer = threading.Thread(target=kill_the_holder, daemon=True)
    try:
        killer.start()
        assert spml(["study", "run", spec_file(tmp_path), "--out", out, "--quiet",
                     "--scheduler-file", cluster.file]) == 0
        killer.join(WAIT)
    finally:
        cluster.disarm()
    held = result["held"]
    assert len(held) == 4  # one stack of the two
    (message,) = [r.getMessage() for r in caplog.records if "died while running" in
                  r.getMessage()]
    task = message.split("died while running task ")[1].split(" ")[0]
    assert task.split("+")[0] in held and task.endswith("+3")  # the stack it held
    assert message.endswith("(1 death(s) so far); running it again")
    assert numbers(out) == numbers(local)
    assert table(out, capsys) == table(local, capsys)
    wait_until("the nanny's fresh worker", lambda: cluster.worker_count() == 2, poll=0.25)


@pytest.mark.slow
def test_the_scheduler_killed_mid_study_ends_it_with_one_line_and_a_relaunch_finishes_it(
        cluster, local, tmp_path, capsys):
    """On a second cluster (one worker process of 2 threads: cheaper to start), one stack holds
    at epoch 2 while the other finishes; then the scheduler is SIGKILLed. ``spml study run``
    prints one error line that says so, exits 1, and the 4 finished rows are in the store. The
    same command against another scheduler (the first cluster's) runs exactly the 4 runs of the
    held stack; the 4 earlier rows are untouched."""
    doomed = Cluster(tmp_path / "doomed", nworkers=1, nthreads=2)
    out = tmp_path / "study"
    args = ["study", "run", spec_file(tmp_path), "--out", out, "--quiet"]
    driver = None
    try:
        doomed.start()
        doomed.arm(2)
        driver = subprocess.Popen([str(BIN / "spml"), *map(str, args), "--scheduler-file",
                                   str(doomed.file)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env(doomed.pause),
                                  start_new_session=True)
        _, held = doomed.paused(alive=[driver])
        assert len(held) == 4
        wait_until("the other stack's 4 rows", lambda: (out / "results.sqlite").exists() and
                   len(StudyStore(out / "results.sqlite").rows()) == 4, alive=[driver])
        doomed.kill(doomed.scheduler)
        stdout, stderr = driver.communicate(timeout=WAIT)
    finally:
        if driver is not None and driver.poll() is None:
            with_group(driver, signal.SIGKILL)
            driver.wait(WAIT)
        doomed.stop()
    assert driver.returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr  # nothing but the error line
    (line,) = lines
    assert line == (f"spml study run: error: lost the Dask scheduler "
                    f"{doomed.read()['address']} (the connection to it closed); the runs in "
                    f"flight are lost with it, the finished ones are kept; 4 of 8 runs are done "
                    f"and kept in {out}, the same command against a running scheduler runs the "
                    f"4 missing ones")
    before = StudyStore(out / "results.sqlite").rows()
    assert [r["status"] for r in before] == ["done"] * 4
    assert not held & {r["run_id"] for r in before}
    launch = json.loads((out / "launches.jsonl").read_text().splitlines()[-1])
    assert (launch["runs_run"], launch["finished"]) == (4, None)

    cluster.disarm()
    assert spml([*args, "--scheduler-file", cluster.file]) == 0
    assert "4 run(s) in " in capsys.readouterr().out
    launch = json.loads((out / "launches.jsonl").read_text().splitlines()[-1])
    assert (launch["runs_done_before"], launch["runs_run"]) == (4, 4)
    ran = {line.split()[0] for line in (cluster.pause / "epochs.log").read_text().splitlines()}
    assert ran == held  # the relaunch ran the held stack's runs, and only those
    after = StudyStore(out / "results.sqlite").rows()
    assert [r["status"] for r in after] == ["done"] * 8
    assert [r for r in after if r["run_id"] not in held] == before  # untouched
    # the relaunch cut the 4 runs into 2 stacks of 2: the same numbers up to summation order
    mine = {r["run_id"]: r for r in after}
    for r in StudyStore(local / "results.sqlite").rows():
        assert mine[r["run_id"]]["test_map"] == pytest.approx(r["test_map"], abs=1e-6)


def test_an_address_that_never_answers_is_refused_within_the_connect_timeout(tmp_path,
                                                                               capsys):
    """A plain socket server on 127.0.0.1 that accepts connections and never says a word:
    refused after ``--connect-timeout`` (1 s), one line, nothing written."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list = []
    threading.Thread(target=lambda: [accepted.append(server.accept()[0]) for _ in range(4)],
                     daemon=True).start()
    port = server.getsockname()[1]
    out = tmp_path / "s"
    try:
        start = time.monotonic()
        code = spml(["study", "run", spec_file(tmp_path), "--out", out, "--quiet",
                     "--scheduler", f"tcp://127.0.0.1:{port}", "--connect-timeout", "1"], 30)
        seconds = time.monotonic() - start
    finally:
        server.close()
        for conn in accepted:
            conn.close()
    err = capsys.readouterr().err
    assert code == 2 and accepted  # it did connect
    assert err == (f"spml study run: error: the Dask scheduler at tcp://127.0.0.1:{port} did "
                   f"not answer within 1 s (--connect-timeout): is a Dask scheduler running "
                   f"there? give the address `dask scheduler` prints, tcp://HOST:PORT (port "
                   f"8786 by default), or --scheduler-file with the file it wrote\n")
    assert seconds < 1 + 10  # the timeout, and a loaded machine's slack
    assert not out.exists()


def test_an_address_where_nothing_listens_says_so(tmp_path, capsys, caplog):
    """A port nobody listens on (connection refused): a notice at once that spml waits for a
    scheduler to start there, then, after ``--connect-timeout``, an error that says nothing
    listens (not that a scheduler 'did not answer'), nothing written."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]  # free once closed
    out = tmp_path / "s"
    code = spml(["study", "run", spec_file(tmp_path), "--out", out, "--quiet",
                 "--scheduler", f"127.0.0.1:{port}", "--connect-timeout", "1"], 30)
    err = capsys.readouterr().err
    assert code == 2
    assert err == (f"spml study run: error: nothing listens at tcp://127.0.0.1:{port}: the "
                   f"connection was refused for 1 s (--connect-timeout); start a scheduler "
                   f"with `dask scheduler` and give the address `dask scheduler` prints, "
                   f"tcp://HOST:PORT (port 8786 by default), or --scheduler-file with the "
                   f"file it wrote\n")
    assert f"nothing listens at tcp://127.0.0.1:{port} yet (connection refused); waiting up " \
           f"to 1 s" in caplog.text
    assert not out.exists()


@pytest.mark.parametrize("address, says", [
    ("nonsense", "the Dask scheduler address 'nonsense' is not HOST:PORT (missing port"),
    ("", "the Dask scheduler address is empty ('')"),
    ("http://127.0.0.1:8787/status", "the Dask scheduler address "
     "'http://127.0.0.1:8787/status' is a web address (the dashboard's?)"),
    ("tcp://127.0.0.1:99999", "is not HOST:PORT with a port in 1-65535"),
    ("udp://127.0.0.1:8786", "has the protocol 'udp'; expected one of tcp, tls"),
])
def test_a_malformed_address_is_refused_at_once(tmp_path, capsys, address, says):
    import gc

    out = tmp_path / "s"
    start = time.monotonic()
    code = spml(["study", "run", spec_file(tmp_path), "--out", out, "--quiet",
                 "--scheduler", address], 30)
    seconds = time.monotonic() - start
    gc.collect()  # a half-made client would complain here (Client.__del__)
    err = capsys.readouterr().err
    assert code == 2 and seconds < 10
    assert err.startswith("spml study run: error: ") and says in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow
def test_a_workers_address_is_refused_as_not_a_scheduler(cluster, tmp_path, capsys):
    import asyncio

    from distributed.comm import connect

    async def ask():
        comm = await connect(cluster.address, timeout=5)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    worker = next(iter(asyncio.run(asyncio.wait_for(ask(), 10))["workers"]))
    code = spml(["study", "run", spec_file(tmp_path), "--out", tmp_path / "s", "--quiet",
                 "--scheduler", worker], 30)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"spml study run: error: {worker} answered, but as Worker and not "
                          f"as a Dask scheduler")


@pytest.mark.parametrize("given, address", [
    ("tcp://127.0.0.1:8786", "tcp://127.0.0.1:8786"),
    ("127.0.0.1:8786", "tcp://127.0.0.1:8786"),  # as dask reads it
    (" tcp://host0:8786 ", "tcp://host0:8786"),
    ("tls://[::1]:8786", "tls://[::1]:8786"),
])
def test_addresses_that_name_a_scheduler(given, address):
    from spmlkit.experiments.dask_executor import check_address

    assert check_address(given) == address


def test_options_that_do_not_fit_a_running_cluster_are_refused(tmp_path, capsys):
    base = ["study", "run", str(spec_file(tmp_path)), "--out", str(tmp_path / "s"), "--quiet"]
    assert main(base + ["--scheduler", "tcp://127.0.0.1:8786", "--jobs", "4"]) == 2
    assert "jobs (4) is the size of a local pool or a Dask LocalCluster; a running Dask " \
           "cluster has the workers it has" in capsys.readouterr().err
    assert main(base + ["--dask", "local", "--connect-timeout", "5"]) == 2
    assert "connect_timeout is for a running Dask cluster" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--scheduler", "tcp://127.0.0.1:8786", "--connect-timeout", "0"])
    assert "expected a finite number > 0, got '0'" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


# ---- clusters that are not what they seem -----------------------------------------------------
def test_a_scheduler_with_no_worker_stops_after_the_timeout(tmp_path, capsys):
    """A scheduler and no worker (a re-launch after a scheduler restart: the old workers left):
    the driver says so and stops after --connect-timeout, one line, the study resumable."""
    c = Cluster(tmp_path / "c", nworkers=0)
    try:
        e = env(c.pause)
        c.scheduler = c.popen([BIN / "dask", "scheduler", "--scheduler-file", c.file, "--host",
                               "127.0.0.1", "--port", "0", "--no-dashboard"],
                              c.folder / "scheduler.log", e)
        wait_until("the scheduler address", lambda: "address" in c.read(), alive=[c.scheduler])
        out = tmp_path / "s"
        start = time.monotonic()
        code = spml(["study", "run", spec_file(tmp_path), "--out", out, "--quiet",
                     "--scheduler-file", c.file, "--connect-timeout", "3"], 60)
        seconds = time.monotonic() - start
    finally:
        c.stop()
    err = capsys.readouterr().err
    assert code == 1 and seconds < 3 + 30, (code, seconds)
    assert f"no Dask worker connected to the scheduler {c.address} in 3 s" in err
    assert "the same command against a running scheduler runs the 8 missing ones" in err
    assert StudyStore(out / "results.sqlite").rows() == []


def test_a_worker_with_another_spmlkit_is_refused(tmp_path, capsys):
    """A worker whose spmlkit is another version (here: a preload that changes it) is refused
    before any task runs on it: one line naming the worker and both versions."""
    other = tmp_path / "other_version.py"
    other.write_text("import spmlkit\nspmlkit.__version__ = '0.0.0-other'\n")
    c = Cluster(tmp_path / "c", nworkers=1)
    try:
        e = env(c.pause)
        c.scheduler = c.popen([BIN / "dask", "scheduler", "--scheduler-file", c.file, "--host",
                               "127.0.0.1", "--port", "0", "--no-dashboard"],
                              c.folder / "scheduler.log", e)
        wait_until("the scheduler address", lambda: "address" in c.read(), alive=[c.scheduler])
        c.workers = c.popen([BIN / "dask", "worker", "--scheduler-file", c.file, "--nworkers",
                             1, "--nthreads", 1, "--host", "127.0.0.1", "--no-dashboard",
                             "--preload", other], c.folder / "workers.log", e)
        wait_until("the worker", lambda: c.worker_count() == 1,
                   alive=[c.scheduler, c.workers], poll=0.25)
        out = tmp_path / "s"
        code = spml(["study", "run", spec_file(tmp_path), "--out", out, "--quiet",
                     "--scheduler-file", c.file], 120)
    finally:
        c.stop()
    err = capsys.readouterr().err
    assert code == 2, err
    assert "runs spmlkit 0.0.0-other with torch" in err and \
        f"this driver spmlkit {spmlkit.__version__}" in err
    assert [r["status"] for r in StudyStore(out / "results.sqlite").rows()] == []
