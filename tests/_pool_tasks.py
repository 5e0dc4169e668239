"""What tests/test_pool.py runs in the pool's worker processes (importable by name there)."""
from __future__ import annotations

import os
import signal
import time


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
