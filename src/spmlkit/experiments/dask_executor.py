"""Run a study's tasks on a Dask distributed cluster (``pip install -e ".[dask]"`` in a clone).

`DaskExecutor` is the `spmlkit.experiments.pool.Executor` of a Dask cluster: a
scheduler at an address (``dask scheduler`` on one machine, ``dask worker ADDRESS`` on the
others), one named by a scheduler file (``dask scheduler --scheduler-file``, dask-jobqueue), or
a ``LocalCluster`` it starts on this machine. This module is imported only when one is asked
for, so spmlkit works without dask installed.

How it runs the tasks:

- each task is one ``client.submit(fn, task, pure=False)``; at most as many are in flight as the
  cluster has worker threads (re-counted as workers come and go), so a task waits on the
  driver, not in a worker's queue, and a worker holds only the task it runs;
- every worker runs `spmlkit.experiments.pool.init_worker` once (a worker plugin): its
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
`spmlkit.experiments.study.execute`); after that it is *lost* (``Lost(reason)``, a
``failed`` row in a study). A ``LocalCluster`` started here has ``allowed-failures`` 0 (every
death reaches the driver: exactly ``retries`` more tries, each logged) and
``worker-saturation`` 1.0. A scheduler started elsewhere keeps its own settings; its default
``allowed-failures`` of 3 means that dask itself runs a task up to 4 times before the driver
hears of it, so ``retries`` counts in steps of 4 there: start the scheduler with
``DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=0`` for the exact count. Unlike the local pool,
a retried task is not run alone: on a cluster the workers do not share one machine's memory.

Connecting and losing the scheduler:

- an address is checked before anything connects (`check_address`: ``tcp://HOST:PORT``,
  or another Dask protocol; a web address or a missing port is refused at once), and a
  scheduler file must hold one;
- the scheduler must answer Dask's handshake and say that it is a scheduler within
  ``connect_timeout`` seconds (a port that accepts the connection and then says nothing, or a
  worker's address, is refused with the reason, not waited on for ever);
- a scheduler lost while the tasks run (it was killed, its machine went away) ends the run with
  `SchedulerLost` at once: the results already yielded are the caller's (a study has
  stored them), the tasks in flight are lost with the scheduler, and a new launch against a
  new scheduler runs what is missing.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
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
ADDRESS_HINT = ("give the address `dask scheduler` prints, tcp://HOST:PORT (port 8786 by "
                "default), or --scheduler-file with the file it wrote")


class NoWorkers(ConnectionError):
    """The scheduler had no worker for ``connect_timeout`` seconds while tasks waited."""


def worker_versions() -> dict:
    """What a worker runs (called on each worker through ``client.run``): spmlkit's and
    torch's versions; the driver refuses a worker whose differ from its own (results of two
    code versions in one store)."""
    import torch

    import spmlkit

    return {"spmlkit": spmlkit.__version__, "torch": torch.__version__.split("+")[0]}


class SchedulerLost(ConnectionError):
    """The Dask scheduler went away while the tasks ran (the connection to it closed)."""


def check_address(address) -> str:
    """``address`` if it names a Dask scheduler as a client can reach it
    (``PROTOCOL://HOST:PORT`` with a Dask protocol: tcp, tls, ws, wss, ucx; ``HOST:PORT`` means
    tcp; returned as ``tcp://HOST:PORT``), else a ValueError that says what is wrong with it.
    """
    import_distributed()
    from distributed.comm import registry
    from distributed.comm.addressing import parse_host_port

    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"the Dask scheduler address is empty ({address!r}): {ADDRESS_HINT}")
    text = address.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "tcp", text
    scheme = scheme.lower()
    if scheme in ("http", "https"):
        raise ValueError(f"the Dask scheduler address {address!r} is a web address (the "
                         f"dashboard's?); the scheduler speaks its own protocol: "
                         f"{ADDRESS_HINT}")
    schemes = sorted(set(registry.backends) - {"inproc"})
    if scheme not in schemes:
        raise ValueError(f"the Dask scheduler address {address!r} has the protocol "
                         f"{scheme!r}; expected one of {', '.join(schemes)}: {ADDRESS_HINT}")
    try:
        host, port = parse_host_port(rest)
    except (ValueError, TypeError) as err:
        raise ValueError(f"the Dask scheduler address {address!r} is not HOST:PORT ({err}): "
                         f"{ADDRESS_HINT}") from None
    if not host or not 0 < int(port) < 65536:
        raise ValueError(f"the Dask scheduler address {address!r} is not HOST:PORT with a port "
                         f"in 1-65535: {ADDRESS_HINT}")
    return f"{scheme}://{rest}"


def address_from_file(path) -> str:
    """The scheduler address a scheduler file (``dask scheduler --scheduler-file PATH``)
    holds; a ValueError naming the file when it holds none."""
    try:
        with open(path, encoding="utf-8") as fh:
            info = json.load(fh)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"Dask scheduler file {path} is not the JSON file `dask scheduler "
                         f"--scheduler-file` writes ({err})") from None
    address = info.get("address") if isinstance(info, dict) else None
    if not isinstance(address, str):
        raise ValueError(f"Dask scheduler file {path} has no 'address' (the JSON file `dask "
                         f"scheduler --scheduler-file` writes)")
    try:
        return check_address(address)
    except ValueError as err:
        raise ValueError(f"Dask scheduler file {path}: {err}") from None


def _refused(address: str) -> bool:
    """Whether a TCP connection to a ``tcp://HOST:PORT`` address is refused at once (nothing
    listens there); False for other protocols and for any other outcome."""
    import socket

    from distributed.comm.addressing import parse_host_port

    scheme, _, rest = address.partition("://")
    if scheme != "tcp":
        return False
    try:
        with socket.create_connection(parse_host_port(rest), timeout=2.0):
            return False
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError):
        return False


def probe_scheduler(address: str, timeout: float) -> None:
    """Connect to ``address``, do Dask's handshake and ask who is there, all within
    ``timeout`` seconds (Dask's own connect bounds the TCP connect, not the handshake: a port
    that accepts and never answers would hold a client for ever). Raises ConnectionError
    saying why when nothing answers in time, the connection fails, or what answers is not a
    Dask scheduler."""
    import asyncio

    distributed = import_distributed()
    from distributed.comm import connect

    async def ask():
        args = distributed.Security().get_connection_args("client")
        comm = await connect(address, timeout=timeout, **args)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    refused = _refused(address)
    if refused:
        log.warning("nothing listens at %s yet (connection refused); waiting up to %g s "
                    "(--connect-timeout) for a Dask scheduler to start there", address, timeout)
    answer: dict = {}

    def run():
        try:
            answer["identity"] = asyncio.run(asyncio.wait_for(ask(), timeout))
        except BaseException as err:  # noqa: BLE001 (handed to the caller)
            answer["error"] = err

    thread = threading.Thread(target=run, name="spmlkit-dask-probe", daemon=True)
    thread.start()
    thread.join(timeout + 5.0)  # the wait_for above ends it; this only bounds the unforeseen
    err = answer.get("error")
    if (thread.is_alive() or err is not None) and refused and _refused(address):
        raise ConnectionError(f"nothing listens at {address}: the connection was refused for "
                              f"{timeout:g} s (--connect-timeout); start a scheduler with `dask "
                              f"scheduler` and {ADDRESS_HINT}")
    if thread.is_alive() or isinstance(err, (TimeoutError, asyncio.TimeoutError)):
        raise ConnectionError(f"the Dask scheduler at {address} did not answer within "
                              f"{timeout:g} s (--connect-timeout): is a Dask scheduler "
                              f"running there? {ADDRESS_HINT}")
    if err is not None:
        raise ConnectionError(f"could not reach the Dask scheduler at {address} "
                              f"({type(err).__name__}: {err}); start one with `dask "
                              f"scheduler` and {ADDRESS_HINT}")
    identity = answer.get("identity")
    kind = identity.get("type") if isinstance(identity, dict) else None
    if kind != "Scheduler":
        raise ConnectionError(f"{address} answered, but as {kind or 'something'} and not as a "
                              f"Dask scheduler: {ADDRESS_HINT}")


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
    """A ``distributed.WorkerPlugin`` that runs `init_worker` on every worker, present and
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
    """A ``distributed.LocalCluster`` on this machine as `DaskExecutor` starts it:
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
            (`local_cluster`), started by `run` and closed when it ends.
        scheduler_file: the JSON file a scheduler wrote (``dask scheduler --scheduler-file``,
            dask-jobqueue's ``SLURMCluster(scheduler_options={"scheduler_file": ...})``).
        n_workers: the ``LocalCluster`` 's worker processes (one thread each; default: the CPU
            count).
        threads: torch threads per worker (default: 1 on a ``LocalCluster``, else the worker
            machine's cores).
        client: a ``distributed.Client`` made in Python (on a dask-jobqueue ``SLURMCluster``,
            say); it is used as it is and left open.
        connect_timeout: seconds the scheduler gets to answer (default
            `CONNECT_TIMEOUT`).

    Raises:
        ValueError: both a scheduler and a scheduler file, worker counts on a cluster that
            is not started here, or an address that is not one (`check_address`).
        FileNotFoundError: the scheduler file does not exist.
        ModuleNotFoundError: dask distributed is not installed.
    """

    def __init__(self, scheduler: str | None = None, *, scheduler_file=None,
                 n_workers: int | None = None, threads: int | None = None, client=None,
                 connect_timeout: float = CONNECT_TIMEOUT):
        if sum(x is not None for x in (scheduler, scheduler_file, client)) > 1:
            raise ValueError("give the Dask scheduler's address, its scheduler file or a "
                             "client, one of them")
        if n_workers is not None and n_workers < 1:
            raise ValueError(f"n_workers (LocalCluster worker processes) must be >= 1, got "
                             f"{n_workers}")
        if scheduler_file is not None and not Path(scheduler_file).is_file():
            raise FileNotFoundError(f"Dask scheduler file {scheduler_file} does not exist (the "
                                    f"JSON file `dask scheduler --scheduler-file PATH` writes)")
        if isinstance(connect_timeout, bool) or not (
                isinstance(connect_timeout, (int, float)) and 0 < connect_timeout < 1e6):
            raise ValueError(f"connect_timeout (seconds the Dask scheduler gets to answer) must "
                             f"be a positive number, got {connect_timeout!r}")
        import_distributed()
        if scheduler is not None:
            scheduler = check_address(scheduler)
        self.connect_timeout = float(connect_timeout)
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
        if self.client is not None:
            return f"Dask scheduler {self.address()}" + (
                f" (from {self.scheduler_file})" if self.scheduler_file else "")
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
            address = self.scheduler or address_from_file(self.scheduler_file)
            probe_scheduler(address, self.connect_timeout)
            try:
                self.client = distributed.Client(address, timeout=self.connect_timeout,
                                                 set_as_default=False)
            except (OSError, TimeoutError) as err:
                raise ConnectionError(f"could not connect to the Dask scheduler at {address} "
                                      f"within {self.connect_timeout:g} s "
                                      f"({type(err).__name__}: {err}); {ADDRESS_HINT}") from None
        return self.client

    def close(self) -> None:
        """Close the client (unless it was given), and the ``LocalCluster`` if it was started
        here."""
        client, cluster, self.client, self.cluster = self.client, self.cluster, None, None
        if client is not None and client is not self.given:
            lost = client.status not in ("running", "newly-created")
            # a client that lost its scheduler tries to reconnect; closing it cancels that, and
            # dask logs the cancelled attempt as an error with two tracebacks: the loss was
            # reported already (SchedulerLost), so that log is held back while it closes
            quiet = logging.getLogger("distributed.client")
            level = quiet.level
            if lost:
                quiet.setLevel(logging.CRITICAL + 1)
            try:
                client.close(timeout=self.connect_timeout)
            except (OSError, TimeoutError, RuntimeError):  # a lost scheduler: nothing to tell
                pass
            finally:
                if lost:
                    quiet.setLevel(level)
        if cluster is not None:
            cluster.close()

    def slots(self) -> int:
        """Tasks to keep in flight: the cluster's worker threads now (at least 1)."""
        self.check_connected()
        try:
            return max(1, sum(self.client.nthreads().values()))
        except (OSError, TimeoutError) as err:
            raise self.lost(f"{type(err).__name__}: {err}") from None

    def address(self) -> str:
        """The scheduler's address (of the client, once connected)."""
        client = self.client or self.given
        with contextlib.suppress(Exception):
            return client.scheduler.address
        return self.scheduler or f"the scheduler of {self.scheduler_file}"

    def lost(self, why: str) -> SchedulerLost:
        """The `SchedulerLost` of this cluster, with ``why``."""
        return SchedulerLost(f"lost the Dask scheduler {self.address()} ({why}); the runs "
                             f"in flight are lost with it, the finished ones are kept")

    def _lost_by(self, err: BaseException) -> SchedulerLost:
        """`lost` for an error of a call to the scheduler: a closed connection (Dask's
        ``CommClosedError``, an ``OSError``) said as `check_connected` says it, whichever
        call met it first; a time-out with its text."""
        if isinstance(err, OSError):
            return self.lost("the connection to it closed")
        return self.lost(f"{type(err).__name__}: {err}")

    def check_connected(self) -> None:
        """Raise `SchedulerLost` if the client lost its scheduler."""
        status = getattr(self.client, "status", "running")
        if status not in ("running", "newly-created"):
            raise self.lost("the connection to it closed")

    def check_workers(self, checked: set) -> int:
        """The worker threads connected now, every new worker's versions checked against this
        process's first (`worker_versions`; ``checked``: the worker addresses already
        checked, updated). A worker that runs another spmlkit or torch version, or cannot
        import spmlkit, is refused (``ValueError`` naming it)."""
        try:
            threads = self.client.nthreads()
        except (OSError, TimeoutError) as err:
            raise self._lost_by(err) from None
        new = sorted(set(threads) - checked)
        if new:
            mine = worker_versions()
            try:
                theirs = self.client.run(worker_versions, workers=new, on_error="return")
            except (OSError, TimeoutError) as err:
                raise self._lost_by(err) from None
            for worker, got in theirs.items():
                if isinstance(got, BaseException):
                    raise ValueError(f"the Dask worker {worker} cannot run spmlkit's tasks "
                                       f"({type(got).__name__}: {got}): install spmlkit "
                                       f"{mine['spmlkit']} there (the driver's version)")
                if got != mine:
                    raise ValueError(f"the Dask worker {worker} runs spmlkit "
                                       f"{got.get('spmlkit')} with torch {got.get('torch')}, "
                                       f"this driver spmlkit {mine['spmlkit']} with torch "
                                       f"{mine['torch']}: one study's results must come from "
                                       f"one version; install the same versions on every "
                                       f"worker")
            checked.update(theirs)
        return sum(threads.values())

    def _no_worker(self, threads: int, since, waiting: int):
        """``None`` while workers are there; else when they were last seen, said once, and
        `NoWorkers` once that is ``connect_timeout`` seconds ago."""
        if threads:
            return None
        now = time.monotonic()
        if since is None:
            log.warning("no Dask worker is connected to the scheduler %s; %d task(s) wait for "
                        "one (start `dask worker %s`); giving up after %g s",
                        self.address(), waiting, self.address(), self.connect_timeout)
            return now
        if now - since > self.connect_timeout:
            raise NoWorkers(f"no Dask worker connected to the scheduler {self.address()} in "
                            f"{self.connect_timeout:g} s (--connect-timeout): start workers "
                            f"(dask worker {self.address()}) and run the same command again; "
                            f"finished runs are kept")
        return since

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
        try:  # every worker, present and future, sets its torch threads first
            client.register_plugin(_worker_plugin(self.threads))
        except (OSError, TimeoutError) as err:
            self.close()
            raise self.lost(f"{type(err).__name__}: {err}") from None
        # results are fetched as soon as a task finishes: a result left on a worker that dies
        # before it is fetched would be computed again
        done = distributed.as_completed([], loop=client.loop, with_results=True,
                                        raise_errors=False)
        counted, slots = 0.0, 1
        lost = False
        checked: set = set()  # the workers whose versions were checked
        idle_since = None  # when the cluster was last seen without a worker
        try:
            while todo or pending:
                try:
                    self.check_connected()
                except SchedulerLost:
                    lost = True
                    raise
                if time.monotonic() - counted > RECOUNT_SECONDS:
                    counted = time.monotonic()
                    slots = self.check_workers(checked)
                    idle_since = self._no_worker(slots, idle_since, len(todo) + len(pending))
                    slots = max(1, slots)
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
                    reason = getattr(result, "reason", None)
                    if status == "cancelled" and (reason == "scheduler-connection-lost" or
                                                  client.status != "running"):
                        lost = True  # the client cancels every task when it loses its scheduler
                        raise self.lost("the connection to it closed")
                    if status != "error":
                        raise RuntimeError(f"task {describe_task(tasks[i])} ended as "
                                           f"{status!r} on the Dask cluster ({result})")
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
            if pending and not lost and client.status == "running":
                with contextlib.suppress(OSError, TimeoutError):
                    client.cancel(list(pending), force=True)
            self.close()


__all__ = ["DaskExecutor", "NoWorkers", "SchedulerLost", "address_from_file", "check_address",
           "import_distributed", "local_cluster", "probe_scheduler"]
