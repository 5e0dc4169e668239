"""The one parallel runner of the experiments: a spawn pool of worker processes, and a per-worker
cache of loaded splits.

:func:`run_tasks` maps a top-level function over task dicts in ``jobs`` worker processes
(``multiprocessing`` spawn context: no fork of a process that holds torch threads), yielding each
result as it completes (unordered); with ``jobs=1`` it runs in this process, without a pool.
Stopping the iteration (an exception, ``KeyboardInterrupt``, closing the generator) terminates
the workers, so an interrupted benchmark or study leaves no process behind.

A worker loads each dataset split once (:func:`cached_splits`), keyed by dataset, regime and
options, and reuses it for every grid point it runs; the cache keeps the few most recent ones.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
from collections import OrderedDict
from typing import Callable, Iterable, Iterator

#: how many (dataset, regime, options) splits a worker keeps loaded
CACHE_SIZE = 8
_CACHE: OrderedDict = OrderedDict()


def init_worker(threads: int = 1) -> None:
    """Worker initializer: torch's intra-op threads (1 by default: many small processes beat
    one process with many threads on a linear head), and an empty split cache."""
    import torch

    torch.set_num_threads(max(1, int(threads)))
    _CACHE.clear()


def cached_splits(dataset: str, regime: str, options: dict | None = None):
    """``spmlkit.data.load_splits(dataset, regime, **options)``, loaded once per worker."""
    from ..data import load_splits

    key = (dataset, regime, json.dumps(options or {}, sort_keys=True, default=str))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    splits = load_splits(dataset, regime, **(options or {}))
    _CACHE[key] = splits
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return splits


def default_jobs(jobs: int | None, tasks: int) -> int:
    """``jobs`` (default: the CPU count), at least 1 and at most the number of tasks."""
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs (worker processes) must be >= 1, got {jobs}")
    return max(1, min(jobs or os.cpu_count() or 1, tasks or 1))


def run_tasks(fn: Callable[[dict], dict], tasks: Iterable[dict], jobs: int = 1,
              threads: int = 1) -> Iterator[dict]:
    """Yield ``fn(task)`` for every task, as each completes.

    Args:
        fn: a module-level function (picklable by name), run in the workers.
        tasks: picklable task dicts, dispatched in order (put the longest first).
        jobs: worker processes; 1 runs the tasks here, one after the other.
        threads: torch threads per worker (see :func:`init_worker`).
    """
    tasks = list(tasks)
    if not tasks:
        return
    if jobs <= 1:
        init_worker(threads)
        for task in tasks:
            yield fn(task)
        return
    pool = mp.get_context("spawn").Pool(jobs, initializer=init_worker, initargs=(threads,))
    try:
        yield from pool.imap_unordered(fn, tasks)
        pool.close()
        pool.join()
    finally:
        pool.terminate()
