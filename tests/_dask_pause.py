"""A ``dask worker --preload`` module for tests/test_dask_cluster.py: every worker process of a
cluster started with it logs each epoch a run folder records to ``$SPMLKIT_TEST_PAUSE_DIR/
epochs.log`` (``run_id pid thread epoch``) and, while the test has *armed* it (a file ``armed``
there holding an epoch), the first run of all the workers to record that epoch publishes its
process and thread ids in ``paused`` and sleeps, for the test to kill its worker or the
scheduler. Tasks reach the workers by name, as in a user's cluster; only the workers' start
differs."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

HOLD = 300.0  # seconds a paused run sleeps (the test kills it long before)


def dask_setup(worker=None):  # called by `dask worker --preload` in every worker process
    from spmlkit import runs

    folder = Path(os.environ["SPMLKIT_TEST_PAUSE_DIR"])
    original = runs.RunDir.log

    def log(self, record):
        original(self, record)
        with open(folder / "epochs.log", "a") as fh:
            fh.write(f"{self.path.name} {os.getpid()} {threading.get_ident()} "
                     f"{record['epoch']}\n")
        try:
            epoch = int((folder / "armed").read_text())
        except (OSError, ValueError):
            return
        if record["epoch"] != epoch:
            return
        mine = folder / f"paused.{os.getpid()}.{threading.get_ident()}"
        mine.write_text(f"{os.getpid()} {threading.get_ident()}")
        try:
            os.link(mine, folder / "paused")  # only the first run to get here
        except FileExistsError:
            return
        time.sleep(HOLD)

    runs.RunDir.log = log
