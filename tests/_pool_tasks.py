"""What tests/test_pool.py runs in the pool's worker processes (importable by name there)."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


def work(task: dict) -> dict:
    """Square ``task["x"]``; log each try's start and end to ``task["log"]``, and SIGKILL the own
    process on the first ``task["die"]`` tries (0 by default: never)."""
    log = task["log"]
    with open(log, "a") as fh:
        fh.write(f"start {time.time()!r}\n")
    with open(log) as fh:
        tries = sum(line.startswith("start") for line in fh)
    if tries <= task.get("die", 0):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(task.get("sleep", 0.0))
    if task.get("fail"):
        raise ValueError(f"task {task['x']} fails as asked")
    with open(log, "a") as fh:
        fh.write(f"end {time.time()!r}\n")
    return {"x": task["x"], "square": task["x"] ** 2, "pid": os.getpid()}


def pause_at_epoch(fn, plan: dict, task: dict):
    """``fn(task)`` with every epoch a run folder logs also written to ``plan["dir"]/epochs.log``
    (``run_id pid epoch``); the first run of all the workers to log epoch ``plan["epoch"]``
    (its checkpoint then holds the epochs before) publishes its process id in
    ``plan["dir"]/paused`` and sleeps, for the test to kill its worker process (or, with
    ``plan["interrupt"]``, raises KeyboardInterrupt, as Ctrl-C in a study run in one process
    does)."""

    from spmlkit import runs

    folder = Path(plan["dir"])
    original = runs.RunDir.log

    def log(self, record):
        original(self, record)
        with open(folder / "epochs.log", "a") as fh:
            fh.write(f"{self.path.name} {os.getpid()} {record['epoch']}\n")
        if record["epoch"] != plan["epoch"]:
            return
        mine = folder / f"paused.{os.getpid()}"
        mine.write_text(str(os.getpid()))
        try:
            os.link(mine, folder / "paused")  # only the first run to get here
        except FileExistsError:
            return
        if plan.get("interrupt"):
            raise KeyboardInterrupt
        time.sleep(plan.get("hold", 300))

    runs.RunDir.log = log
    try:
        return fn(task)
    finally:
        runs.RunDir.log = original


class Pausing:
    """An executor around another one (``inner``) that runs `pause_at_epoch` around the
    task function: the seam sees one more executor, the tasks are the study's."""

    def __init__(self, inner, plan: dict):
        self.inner, self.plan = inner, plan

    def describe(self) -> str:
        return self.inner.describe()

    def run(self, fn, tasks, retries=1):
        import functools

        return self.inner.run(functools.partial(pause_at_epoch, fn, self.plan), tasks, retries)


def kill_when_paused(target, folder, check_pid=None, timeout=180.0):
    """Run ``target()`` in a thread; once a task has paused (`pause_at_epoch` with
    ``dir=folder``), ``check_pid(pid)`` and SIGKILL that worker process. Returns ``(what target
    returned, the killed pid, the paused run's id)``."""
    import threading

    folder = Path(folder)
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=target()), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not (folder / "paused").exists():
        assert thread.is_alive(), "the study ended before any run paused"
        assert time.monotonic() < deadline, "no run paused"
        time.sleep(0.02)
    pid = int((folder / "paused").read_text())
    if check_pid is not None:
        check_pid(pid)
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout)
    assert not thread.is_alive(), "the study hangs after a worker was killed"
    lines = [line.split() for line in (folder / "epochs.log").read_text().splitlines()]
    run_id = [r for r, p, _ in lines if int(p) == pid][-1]  # it paused after its last epoch
    return result.get("value"), pid, run_id


def epochs_by_try(log_file, run_id) -> dict:
    """``{pid: [epochs]}`` that each try (worker process) of ``run_id`` logged."""
    out: dict = {}
    for line in Path(log_file).read_text().splitlines():
        run, pid, epoch = line.split()
        if run == run_id:
            out.setdefault(int(pid), []).append(int(epoch))
    return out


def check_resumed(out, paused, pid, run_id, epochs=4, at=3) -> None:
    """The paused run's try in ``pid`` logged epochs 1..at; the retry resumed from the
    checkpoint after epoch at - 1 (so it logged at..epochs, not 1..), and the run folder's
    ``metrics.jsonl`` has every epoch once."""
    tries = epochs_by_try(Path(paused) / "epochs.log", run_id)
    assert tries.pop(pid) == list(range(1, at + 1))
    (retry,) = tries.values()
    assert retry == list(range(at, epochs + 1))
    logged = [json.loads(x)["epoch"] for x in
              (Path(out) / "runs" / run_id / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, epochs + 1))


def heap_buffer(task: dict) -> dict:
    """Whether an 8 MiB buffer allocated in the worker comes from its heap (below the program
    break: glibc's thresholds as `spmlkit.machine.loader_worker_init` sets them)."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.sbrk.restype = ctypes.c_void_p
    buf = ctypes.create_string_buffer(8 << 20)
    return {"heap": ctypes.addressof(buf) < libc.sbrk(0)}


def sleep_and_tell(task: dict) -> dict:
    """Write this worker's pid and its parent's to ``task["pidfile"]``, then sleep
    ``task["sleep"]`` seconds (tests/test_pool.py kills the pool's process meanwhile)."""
    Path(task["pidfile"]).write_text(f"{os.getpid()} {os.getppid()}")
    time.sleep(task["sleep"])
    return {"x": task["x"]}


def collector(task: dict) -> dict:
    """The worker's cyclic garbage collector: whether it is on, and how many objects it never
    sweeps (those the fork server preloaded, frozen there)."""
    import gc

    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(), "pid": os.getpid()}
