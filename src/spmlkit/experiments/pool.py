"""The one parallel runner of the experiments: an executor seam, a local pool of worker processes
that notices when one of them dies, and a per-worker cache of loaded splits.

`run_tasks` maps a top-level function over task dicts and yields each result as it
completes (unordered). Where the tasks run is an `Executor`:

- `InProcessExecutor` (``jobs=1``): in this process, one after the other;
- `LocalExecutor` (``jobs > 1``): ``jobs`` daemonic worker processes, each running one
  task at a time, forked by ``multiprocessing``'s fork server (`worker_context`: a
  single-threaded process that imported torch and spmlkit once, so a worker starts in
  milliseconds, not the ~1.5 s of an import; never a fork of a process that holds torch
  threads), or spawned where the platform has no fork server.

A worker that dies while it runs a task (SIGKILL from the out-of-memory killer, a crash in native
code) is noticed at once: each worker has one task in flight, so the task that killed it is known
exactly and no other worker is disturbed. A fresh worker replaces it, and the task is run again
*alone* (once the others have finished their current task, before any new one starts), so that a
task killed by the memory the others were using gets its chance; after ``retries`` more deaths it
is *lost*: ``run_tasks`` yields ``on_lost(task, reason)`` in its place, or raises a RuntimeError
that names it. Stopping the iteration (an exception, ``KeyboardInterrupt``, closing the generator)
terminates the workers, so an interrupted benchmark or study leaves no process behind.

Adding an executor is one subclass of `Executor`, handed to ``run_tasks(...,
executor=...)``: its `Executor.run` yields ``(task, fn(task))`` as each task finishes, and
``(task, Lost(reason))`` for a task whose worker died on every one of its ``retries + 1`` tries;
it raises the exception of a task that raised, and stops its work when the generator is closed.
It knows nothing of what ``fn`` does (one run, or a group of runs trained together).
`spmlkit.experiments.dask_executor.DaskExecutor` runs the tasks on a Dask distributed
cluster (imported only when asked for: dask is an optional extra).

A worker loads each dataset split once (`cached_splits`), keyed by dataset, regime and
options, and reuses it for every grid point it runs; the cache keeps the few most recent ones.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator

from ..machine import end_with_parent, loader_worker_init

#: how many (dataset, regime, options) splits a worker keeps loaded
CACHE_SIZE = 8
_CACHE: OrderedDict = OrderedDict()
#: seconds a worker gets to exit after it was asked to (or terminated), before it is killed
STOP_TIMEOUT = 10.0

log = logging.getLogger(__name__)


def init_worker(threads: int = 1) -> None:
    """Worker initializer: torch's intra-op threads (1 by default: many small processes beat
    one process with many threads on a linear head), and an empty split cache."""
    import torch

    torch.set_num_threads(max(1, int(threads)))
    _CACHE.clear()


def cached_splits(dataset: str, regime: str, options: dict | None = None):
    """``spmlkit.loading.load_splits(dataset, regime, **options)``, loaded once per worker."""
    from ..loading import load_splits

    key = (dataset, regime, json.dumps(options or {}, sort_keys=True, default=str))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    splits = load_splits(dataset, regime, **(options or {}))
    _CACHE[key] = splits
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return splits


#: what the worker server imports once, before it forks the workers (they start with these
#: modules loaded instead of importing them each)
PRELOAD = ("spmlkit.experiments._server_init", "torch", "spmlkit.experiments.study",
           "spmlkit.methods", "spmlkit.losses", "spmlkit.data", "spmlkit.engine.vectorised",
           "spmlkit.experiments._server_ready")


def worker_context():
    """The ``multiprocessing`` context of the local pool: a fork server where the platform has
    one (Linux, macOS: a single-threaded process that imported `PRELOAD` once and forks
    each worker; no fork of a process that holds torch threads), else spawn.

    The fork server ends with this process (`spmlkit.experiments._server_init`, told this
    process's id in ``SPMLKIT_POOL_PARENT``), and each worker with its parent (`_serve`):
    a killed ``spml benchmark`` or study leaves no process behind."""
    if "forkserver" in mp.get_all_start_methods():
        os.environ["SPMLKIT_POOL_PARENT"] = str(os.getpid())
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        return ctx
    return mp.get_context("spawn")


def start_worker_server() -> None:
    """Start the fork server of `worker_context` now, so that its imports run while the
    caller does other work (``spml benchmark`` and ``spml study run`` call it first thing); a
    no-op where workers are spawned."""
    ctx = worker_context()
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def default_jobs(jobs: int | None, tasks: int) -> int:
    """``jobs`` (default: the CPU count), at least 1 and at most the number of tasks."""
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs (worker processes) must be >= 1, got {jobs}")
    return max(1, min(jobs or os.cpu_count() or 1, tasks or 1))


# ---- the executor seam -------------------------------------------------------------------------
class Lost:
    """What an executor yields for a task whose worker process died on every try."""

    def __init__(self, reason: str):
        self.reason = reason

    def __repr__(self) -> str:
        return f"Lost({self.reason!r})"


class Executor:
    """Where `run_tasks` runs its tasks (see the module docstring for adding one)."""

    def run(self, fn: Callable[[dict], object], tasks: list[dict],
            retries: int = 1) -> Iterator[tuple[dict, object]]:
        """Yield ``(task, fn(task))`` for every task as it finishes, or ``(task, Lost(reason))``
        for a task whose worker died ``retries + 1`` times. An exception raised by ``fn``
        propagates; closing the generator stops every task still running."""
        raise NotImplementedError

    def describe(self) -> str:
        """Where the tasks run, in words (a study's launch record, the CLI's summary)."""
        return type(self).__name__


class InProcessExecutor(Executor):
    """The tasks in this process, one after the other (a worker death is this process's)."""

    def __init__(self, threads: int = 1):
        self.threads = threads

    def describe(self) -> str:
        return "this process"

    def run(self, fn, tasks, retries=1):
        init_worker(self.threads)
        for task in tasks:
            yield task, fn(task)


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process (its ``__cause__``)."""

    def __str__(self) -> str:
        return "\n" + self.args[0]


def _serve(conn, threads: int) -> None:
    """A worker's main loop: ``(fn, task)`` in, ``("ok", result)`` or ``("error", exception,
    traceback)`` out, until ``None`` or the parent's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it stops the workers
    end_with_parent()  # the fork server (or, spawned, the pool's process): none left behind
    init_worker(threads)
    # a pool worker may start no loader workers (`loader_workers`): it decodes a study's images
    # itself, so it keeps their memory as a loader worker does
    loader_worker_init()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if message is None:
            return
        fn, task = message
        try:
            reply = ("ok", fn(task))
        except Exception as err:
            reply = ("error", err, traceback.format_exc())
        try:
            conn.send(reply)
        except Exception as err:  # a result or an exception that does not pickle
            conn.send(("error", RuntimeError(f"the worker could not send its reply back: "
                                             f"{type(err).__name__}: {err}"),
                       traceback.format_exc()))


def _death(exitcode: int | None) -> str:
    """How a worker process ended, in words."""
    if exitcode is None:
        return "it stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if -exitcode == getattr(signal, "SIGKILL", None):
            return f"killed by {name}, e.g. out of memory"
        return f"killed by {name}"
    return f"exit code {exitcode}"


def describe_task(task, width: int = 300) -> str:
    """A task for a message: its ``run_id`` when it has one, else its repr (shortened)."""
    if isinstance(task, dict) and isinstance(task.get("run_id"), str):
        return task["run_id"]
    text = repr(task)
    return text if len(text) <= width else text[:width - 3] + "..."


class WorkerServerLost(RuntimeError):
    """The fork server that starts the local pool's worker processes (`worker_context`)
    ended while it started one: no worker could be started, and the launch stops. What
    finished is kept; the same command starts a new fork server and goes on."""


class _Worker:
    """One worker process, the pipe its tasks and replies go through, and the index of
    the task it runs (None while idle)."""

    def __init__(self, ctx, threads: int):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, threads), daemon=True,
                                   name="spmlkit-worker")
        try:
            self.process.start()
        except (EOFError, ConnectionError) as err:  # the fork server died (killed) meanwhile
            self.conn.close()
            child.close()
            raise WorkerServerLost(
                f"the fork server that starts the worker processes ended while it started one "
                f"(killed? multiprocessing: {type(err).__name__}: {err})") from err
        child.close()
        self.task: int | None = None

    def reply(self):
        """The worker's reply, or None if it died (its exit code is then known)."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):  # closed pipe, or a reply cut short by the death
            self.process.join(STOP_TIMEOUT)
            if self.process.exitcode is None:  # closed its pipe yet runs: no use to anyone
                self.process.kill()
                self.process.join()
            return None

    def close(self) -> None:
        self.conn.close()


class LocalExecutor(Executor):
    """``jobs`` worker processes on this machine (`worker_context`, daemonic,
    ``init_worker``), one task in flight each; a dead worker is replaced and its task retried
    alone (module docstring)."""

    def __init__(self, jobs: int, threads: int = 1):
        if jobs < 1:
            raise ValueError(f"jobs (worker processes) must be >= 1, got {jobs}")
        self.jobs = jobs
        self.threads = threads
        self._workers: list[_Worker] = []
        self._tasks: list = []

    def describe(self) -> str:
        return f"a local pool of {self.jobs} worker process{'es' if self.jobs > 1 else ''}"

    def running(self) -> dict[int, dict]:
        """``{pid: task}`` of the workers that have a task in flight now."""
        running = {}
        for w in list(self._workers):  # may be read from another thread while run() goes on
            i = w.task
            if i is not None:
                running[w.process.pid] = self._tasks[i]
        return running

    def run(self, fn, tasks, retries=1):
        ctx = worker_context()
        tasks = self._tasks = list(tasks)
        todo = deque(range(len(tasks)))
        again: deque[int] = deque()  # tasks whose worker died: each runs alone
        deaths: dict[int, list[str]] = {}
        workers = self._workers = []
        jobs = min(self.jobs, len(tasks))

        def idle():
            for w in workers:
                if w.task is None:
                    return w
            if len(workers) < jobs:
                workers.append(_Worker(ctx, self.threads))
                return workers[-1]
            return None

        def send(w: _Worker, i: int) -> bool:
            try:
                w.conn.send((fn, tasks[i]))
            except OSError:  # it died while idle: no task to charge, the next worker takes it
                w.process.join(STOP_TIMEOUT)
                w.close()
                workers.remove(w)
                return False
            w.task = i
            return True

        def dispatch() -> None:
            if again:  # the retry waits until nothing else runs, and runs alone
                while again and not any(w.task is not None for w in workers):
                    send(idle(), again[0]) and again.popleft()
                return
            while todo and (w := idle()) is not None:
                send(w, todo[0]) and todo.popleft()

        try:
            dispatch()
            while any(w.task is not None for w in workers):
                busy = [w for w in workers if w.task is not None]
                ready = set(mp.connection.wait([w.conn for w in busy]
                                               + [w.process.sentinel for w in busy]))
                finished = []
                for w in busy:
                    if w.conn not in ready and w.process.sentinel not in ready:
                        continue
                    i, reply = w.task, w.reply()
                    w.task = None
                    if reply is not None:
                        finished.append((i, reply))
                        continue
                    how = _death(w.process.exitcode)
                    w.close()
                    workers.remove(w)
                    deaths.setdefault(i, []).append(how)
                    tries = len(deaths[i])
                    if tries > retries:
                        finished.append((i, ("lost", self._reason(deaths[i]))))
                    else:
                        again.append(i)
                    log.warning("worker process %s died while running task %s (%s)%s",
                                w.process.pid, describe_task(tasks[i]), how,
                                "; running it again alone" if tries <= retries else
                                f"; lost after {tries} tries")
                dispatch()  # the workers go on while the caller takes the results
                for i, reply in finished:
                    if reply[0] == "ok":
                        yield tasks[i], reply[1]
                    elif reply[0] == "lost":
                        yield tasks[i], Lost(reply[1])
                    else:
                        raise reply[1] from RemoteTraceback(reply[2])
            self._stop(gently=True)
        finally:
            self._stop(gently=False)
            self._tasks = []

    @staticmethod
    def _reason(deaths: list[str]) -> str:
        hows = list(dict.fromkeys(deaths))
        tries = len(deaths)
        return (f"the worker process died while running this task ({'; '.join(hows)}); "
                f"tried {tries} time{'s' if tries > 1 else ''}"
                + (", alone after the first" if tries > 1 else ""))

    def _stop(self, gently: bool) -> None:
        """End every worker: asked to exit (``gently``), else terminated; killed if it lingers."""
        workers, self._workers = self._workers, []
        for w in workers:
            if w.process.is_alive():
                if gently:
                    try:
                        w.conn.send(None)
                    except OSError:
                        pass
                else:
                    w.process.terminate()
        for w in workers:
            w.process.join(STOP_TIMEOUT)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.close()


def run_tasks(fn: Callable[[dict], dict], tasks: Iterable[dict], jobs: int = 1,
              threads: int = 1, *, retries: int = 1,
              on_lost: Callable[[dict, str], dict] | None = None,
              executor: Executor | None = None) -> Iterator[dict]:
    """Yield ``fn(task)`` for every task, as each completes.

    Args:
        fn: a module-level function (picklable by name), run in the workers.
        tasks: picklable task dicts, dispatched in order (put the longest first).
        jobs: worker processes; 1 runs the tasks here, one after the other.
        threads: torch threads per worker (see `init_worker`).
        retries: how many more times a task whose worker process died is run (alone) before
            it is lost.
        on_lost: ``on_lost(task, reason)`` gives what to yield for a lost task (``reason``
            says that its worker died, how, and how many times it was tried).
        executor: where to run (default: `InProcessExecutor` for ``jobs=1``, else
            `LocalExecutor`); ``jobs`` and ``threads`` are then its business.

    Raises:
        RuntimeError: a task was lost and there is no ``on_lost``.
    """
    if retries < 0:
        raise ValueError(f"retries (runs of a task whose worker died) must be >= 0, got "
                         f"{retries}")
    tasks = list(tasks)
    if not tasks:
        return
    if executor is None:
        executor = InProcessExecutor(threads) if jobs <= 1 else LocalExecutor(jobs, threads)
    for task, result in executor.run(fn, tasks, retries):
        if isinstance(result, Lost):
            if on_lost is None:
                raise RuntimeError(f"task {describe_task(task)}: {result.reason}")
            result = on_lost(task, result.reason)
        yield result
