"""Seeded draws from torch's global random number generator, one thread at a time.

PyTorch's default initialisers and dropout draw from the process-wide generator. spmlkit seeds
it for such draws inside `global_rng`, which forks it (the caller's state comes back
afterwards) and holds a process-wide lock, so that runs trained at once in threads of one
process (a ``dask worker --nthreads 2``) each draw from their own seed.
"""
from __future__ import annotations

import contextlib
import threading

import torch

#: held while torch's global RNG is forked and seeded: threads of one process (a Dask worker's
#: ``--nthreads``) share that RNG, and two runs seeding it at once would draw each other's numbers
_GLOBAL_RNG = threading.RLock()


@contextlib.contextmanager
def global_rng(seed: int | None = None, devices=()):
    """torch's global RNG forked (CPU and the CUDA ``devices``) and, when ``seed`` is given,
    seeded with it; restored afterwards. Only one thread of the process is inside at a time, so
    what is drawn inside (PyTorch's default inits, dropout) depends on ``seed`` alone, whatever
    other threads do.

    >>> with global_rng(3):
    ...     a = torch.rand(2)
    >>> with global_rng(3):
    ...     bool((torch.rand(2) == a).all())
    True
    """
    with _GLOBAL_RNG, torch.random.fork_rng(devices=list(devices)):
        if seed is not None:
            torch.manual_seed(seed)
        yield
