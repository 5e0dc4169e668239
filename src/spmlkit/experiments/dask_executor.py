"""Run a study's tasks on a Dask distributed cluster (``pip install -e ".[dask]"`` in a clone).

:class:`DaskExecutor` is the :class:`spmlkit.experiments.pool.Executor` of a Dask cluster: a
scheduler at an address (``dask scheduler`` on one machine, ``dask worker ADDRESS`` on the
others), one named by a scheduler file (``dask scheduler --scheduler-file``, dask-jobqueue), or
a ``LocalCluster`` it starts on this machine. This module is imported only when one is asked
for, so spmlkit works without dask installed.

How it runs the tasks:

- each task is one ``client.submit(fn, task, pure=False)``; at most as many are in flight as the
  cluster has worker threads (re-counted as workers come and go), so a task waits on the
  driver, not in a worker's queue, and a worker holds only the task it runs;
- every worker runs :func:`spmlkit.experiments.pool.init_worker` once (a worker plugin): its
  torch threads, an empty split cache;
- results come back as they finish (``distributed.as_completed``); the driver is the only one
  that writes anything of the study's own (``results.sqlite``), the workers return rows (and
  write their run folders under the study folder, which must be visible to them);
- an exception raised by ``fn`` propagates (``execute`` turns a run's own errors into failed
  rows, so that is a bug or a broken worker environment);
- closing the generator cancels every task still in flight, and closes the client (and the
  ``LocalCluster``, with its worker processes).

A worker that dies while it runs a task: the scheduler notices (the worker's connection drops;
its nanny starts a fresh worker process) and, after ``distributed.scheduler.allowed-failures``
deaths more, fails the task with ``KilledWorker``. Each ``KilledWorker`` counts as
``allowed_failures + 1`` deaths against the task's ``retries``: while the deaths are at most
``retries``, the task is submitted again (it then resumes its run from the checkpoint, see
:func:`spmlkit.experiments.study.execute`); after that it is *lost* (``Lost(reason)``, a
``failed`` row in a study). A ``LocalCluster`` started here has ``allowed-failures`` 0 (every
death reaches the driver: exactly ``retries`` more tries, each logged) and
``worker-saturation`` 1.0. A scheduler started elsewhere keeps its own settings; its default
``allowed-failures`` of 3 means that dask itself runs a task up to 4 times before the driver
hears of it, so ``retries`` counts in steps of 4 there: start the scheduler with
``DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=0`` for the exact count. Unlike the local pool,
a retried task is not run alone: on a cluster the workers do not share one machine's memory.
"""
from __future__ import annotations

import logging
import os
import time
from collections import deque
from pathlib import Path

from ..extras import install_hint
from .pool import Executor, Lost, describe_task, init_worker

log = logging.getLogger(__name__)

#: seconds to wait for a scheduler to answer before giving up
CONNECT_TIMEOUT = 30.0
#: seconds between looks at the finished tasks (the driver only waits)
POLL_SECONDS = 0.05
#: seconds after which the workers are counted again (workers that joined or left)
RECOUNT_SECONDS = 2.0
INSTALL_HINT = install_hint("dask", "'dask[distributed]'")


def import_distributed():
    """The ``distributed`` package, or a ModuleNotFoundError that says how to install it."""
    try:
        import distributed
    except ImportError:
        raise ModuleNotFoundError(f"Dask distributed was asked for (--dask, --scheduler, "
                                  f"--scheduler-file) but is not installed: "
                                  f"{INSTALL_HINT}") from None
    return distributed


def _worker_plugin(threads: int | None):
    """A ``distributed.WorkerPlugin`` that runs :func:`init_worker` on every worker, present and
    future (``threads`` None: the worker machine's cores)."""
    distributed = import_distributed()

    class InitWorker(distributed.WorkerPlugin):
        name = "spmlkit-init-worker"

        def __init__(self, threads):
            self.threads = threads

        def setup(self, worker):
            init_worker(self.threads or os.cpu_count() or 1)

    return InitWorker(threads)


def local_cluster(n_workers: int, **options):
    """A ``distributed.LocalCluster`` on this machine as :class:`DaskExecutor` starts it:
    ``n_workers`` worker processes of one thread, no dashboard, ``allowed-failures`` 0 (every
    worker death reaches the driver, which counts the retries) and ``worker-saturation`` 1.0
    (a worker holds only the task it runs). ``options`` go to ``LocalCluster``."""
    distributed = import_distributed()
    import dask

    with dask.config.set({"distributed.scheduler.worker-saturation": 1.0}):
        return distributed.LocalCluster(**{
            "n_workers": n_workers, "threads_per_worker": 1, "processes": True,
            "host": "127.0.0.1", "dashboard_address": None,
            "scheduler_kwargs": {"allowed_failures": 0}, **options})


class DaskExecutor(Executor):
    """The tasks on a Dask distributed cluster (see the module docstring).

    Args:
        scheduler: the scheduler's address (``tcp://host:8786``); None with no
            ``scheduler_file`` and no ``client``: a ``LocalCluster`` on this machine
            (:func:`local_cluster`), started by :meth:`run` and closed when it ends.
        scheduler_file: the JSON file a scheduler wrote (``dask scheduler --scheduler-file``,
            dask-jobqueue's ``SLURMCluster(scheduler_options={"scheduler_file": ...})``).
        n_workers: the ``LocalCluster`` 's worker processes (one thread each; default: the CPU
            count).
        threads: torch threads per worker (default: 1 on a ``LocalCluster``, else the worker
            machine's cores).
        client: a ``distributed.Client`` made in Python (on a dask-jobqueue ``SLURMCluster``,
            say); it is used as it is and left open.

    Raises:
        ValueError: both a scheduler and a scheduler file, or worker counts on a cluster that
            is not started here.
        FileNotFoundError: the scheduler file does not exist.
        ModuleNotFoundError: dask distributed is not installed.
    """

    def __init__(self, scheduler: str | None = None, *, scheduler_file=None,
                 n_workers: int | None = None, threads: int | None = None, client=None):
        if sum(x is not None for x in (scheduler, scheduler_file, client)) > 1:
            raise ValueError("give the Dask scheduler's address, its scheduler file or a "
                             "client, one of them")
        if n_workers is not None and n_workers < 1:
            raise ValueError(f"n_workers (LocalCluster worker processes) must be >= 1, got "
                             f"{n_workers}")
        if scheduler_file is not None and not Path(scheduler_file).is_file():
            raise FileNotFoundError(f"Dask scheduler file {scheduler_file} does not exist (the "
                                    f"JSON file `dask scheduler --scheduler-file PATH` writes)")
        import_distributed()
        self.scheduler = scheduler
        self.scheduler_file = None if scheduler_file is None else str(scheduler_file)
        self.local = scheduler is None and scheduler_file is None and client is None
        if n_workers is not None and not self.local:
            raise ValueError("n_workers is the size of a LocalCluster started here; a running "
                             "cluster has the workers it has")
        self.n_workers = n_workers
        self.threads = threads if threads is not None else (1 if self.local else None)
        self.given = client
        self.client = None
        self.cluster = None

    def describe(self) -> str:
        """Where the tasks run, in words (for the launch record and the CLI)."""
        if self.local:
            return f"Dask LocalCluster of {self.n_workers or os.cpu_count() or 1} worker(s)"
        if self.given is not None:
            return f"Dask scheduler {self.given.scheduler.address}"
        return f"Dask scheduler {self.scheduler or 'from ' + str(self.scheduler_file)}"

    # ---- connecting -----------------------------------------------------------------------
    def connect(self):
        """Start the ``LocalCluster`` or connect to the scheduler; returns the client."""
        distributed = import_distributed()

        if self.client is not None:
            return self.client
        if self.given is not None:
            self.client = self.given
        elif self.local:
            self.cluster = local_cluster(self.n_workers or os.cpu_count() or 1)
            self.client = distributed.Client(self.cluster, set_as_default=False)
        else:
            where = self.scheduler or f"the scheduler of {self.scheduler_file}"
            try:
                self.client = distributed.Client(self.scheduler,
                                                 scheduler_file=self.scheduler_file,
                                                 timeout=CONNECT_TIMEOUT, set_as_default=False)
            except (OSError, TimeoutError) as err:
                raise ConnectionError(f"could not reach the Dask scheduler at {where} within "
                                      f"{CONNECT_TIMEOUT:g} s ({type(err).__name__}: {err}); "
                                      f"start one with `dask scheduler` and give its address "
                                      f"(tcp://host:8786)") from None
        self.client.register_plugin(_worker_plugin(self.threads))
        return self.client

    def close(self) -> None:
        """Close the client (unless it was given), and the ``LocalCluster`` if it was started
        here."""
        client, cluster, self.client, self.cluster = self.client, self.cluster, None, None
        if client is not None and client is not self.given:
            client.close()
        if cluster is not None:
            cluster.close()

    def slots(self) -> int:
        """Tasks to keep in flight: the cluster's worker threads now (at least 1)."""
        return max(1, sum(self.client.nthreads().values()))

    def worker_pids(self) -> dict:
        """``{worker address: process id}`` of the workers now."""
        return self.client.run(os.getpid)

    # ---- running ----------------------------------------------------------------------------
    def run(self, fn, tasks, retries=1):
        distributed = import_distributed()
        tasks = list(tasks)
        todo = deque(range(len(tasks)))
        deaths: dict[int, int] = {}
        pending: dict = {}  # future -> task index
        client = self.connect()
        # results are fetched as soon as a task finishes: a result left on a worker that dies
        # before it is fetched would be computed again
        done = distributed.as_completed([], loop=client.loop, with_results=True,
                                        raise_errors=False)
        counted, slots = 0.0, 1
        try:
            while todo or pending:
                if todo and time.monotonic() - counted > RECOUNT_SECONDS:
                    counted, slots = time.monotonic(), self.slots()
                while todo and len(pending) < slots:
                    i = todo.popleft()
                    future = client.submit(fn, tasks[i], pure=False)
                    pending[future] = i
                    done.add(future)
                batch = done.next_batch(block=False) if done.has_ready() else []
                if not batch:
                    time.sleep(POLL_SECONDS)
                    continue
                counted = 0.0  # a place came free: count the workers again
                for future, result in batch:
                    i = pending.pop(future)
                    status = future.status
                    future.release()
                    if status == "finished":
                        yield tasks[i], result
                        continue
                    if status != "error":
                        raise RuntimeError(f"task {describe_task(tasks[i])} ended as "
                                           f"{status!r} on the Dask cluster ({result!r})")
                    _, err, traceback = result
                    if not isinstance(err, distributed.KilledWorker):
                        raise err.with_traceback(traceback)  # the task's own exception
                    deaths[i] = deaths.get(i, 0) + err.allowed_failures + 1
                    worker = getattr(err.last_worker, "address", "?")
                    again = deaths[i] <= retries
                    log.warning("the Dask worker %s died while running task %s (%d death(s) "
                                "so far)%s", worker, describe_task(tasks[i]), deaths[i],
                                "; running it again" if again else
                                f"; lost after {deaths[i]} tries")
                    if again:
                        todo.appendleft(i)
                    else:
                        n = deaths[i]
                        yield tasks[i], Lost(
                            f"the Dask worker died while running this task (last worker "
                            f"{worker}); tried {n} time{'s' if n > 1 else ''}")
        finally:
            if pending:
                client.cancel(list(pending), force=True)
            self.close()


__all__ = ["DaskExecutor", "import_distributed", "local_cluster"]
