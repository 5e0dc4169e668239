"""What this machine lends a run: the cache folder, the worker counts and how a loader worker
starts.

The ground floor: it imports nothing of spmlkit, so the feature cache, the engine and the data
floor all read the machine's resources from here without reaching up to one another.

>>> default_cache_dir().name
'features'
>>> loader_workers(3)  # in a daemonic process (a study's pool worker): 0
3
"""
from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

__all__ = ["default_cache_dir", "default_workers", "loader_worker_init", "loader_workers",
           "prefetch_factor"]


def default_cache_dir() -> Path:
    """``$SPMLKIT_CACHE/features`` if set, else ``~/.cache/spmlkit/features``."""
    root = os.environ.get("SPMLKIT_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "spmlkit") / "features"


def default_workers() -> int:
    """Decoding worker processes: one per core beyond the one that runs the backbone, at most
    8 (at least 1)."""
    return max(1, min(8, (os.cpu_count() or 2) - 1))


def loader_workers(n: int) -> int:
    """``n`` DataLoader workers, or 0 inside a daemonic process (a study's or benchmark's pool
    worker), which may not start children of its own."""
    return 0 if multiprocessing.current_process().daemon else int(n)


def prefetch_factor(batch_size: int) -> int:
    """Batches each loader worker keeps ready: about 64 images, 2 to 8 batches.

    >>> prefetch_factor(32), prefetch_factor(8), prefetch_factor(256)
    (2, 8, 2)
    """
    return max(2, min(8, 64 // max(1, int(batch_size))))


#: glibc's ``mallopt`` parameters (``malloc.h``) and what an image loader worker sets them to:
#: buffers up to 32 MiB come from the heap, and up to 64 MiB of freed heap stay with the worker
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
WORKER_MALLOC = {_M_MMAP_THRESHOLD: 32 << 20, _M_TRIM_THRESHOLD: 64 << 20}


def loader_worker_init(worker_id: int = 0) -> bool:
    """The ``worker_init_fn`` of spmlkit's DataLoaders: the worker keeps the memory of the
    images it decodes for the next ones (glibc's malloc: `WORKER_MALLOC`); elsewhere (macOS,
    musl) nothing. Returns whether the settings were taken.

    A decoded photo takes a few MiB (640 x 480 RGB: 1.2 MiB, again for its resize and its
    array). With glibc's defaults the worker mapped and unmapped those buffers, or grew and
    trimmed its heap, for every image, depending on what the process had freed before it
    forked: page faults that took a third of a worker's time on a 640 x 480 JPEG
    (``results/loader-malloc.csv``). The price: up to 64 MiB of freed memory kept per worker.
    The decoded pixels are the same.
    """
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, ValueError):  # no confstr name / no glibc / no symbol
        return False
    return all(mallopt(param, value) == 1 for param, value in WORKER_MALLOC.items())


#: prctl's option that asks for a signal when the parent ends (linux/prctl.h)
_PR_SET_PDEATHSIG = 1


def end_with_parent(sig: int | None = None, parent: int | None = None) -> bool:
    """Ask the kernel to send this process ``sig`` (default SIGTERM) when its parent process
    ends (Linux's ``prctl(PR_SET_PDEATHSIG)``, through ctypes), so that a child does not
    outlive a parent that was killed (SIGKILL runs no cleanup of the parent's). ``parent``: the
    pid the caller's parent should be; one already gone (the child was re-parented before the
    call) ends this process at once. Call it in the child, as its first thing (a ``preexec_fn``
    of ``subprocess.Popen``, a worker's start).

    The kernel sends it when the *thread* that made this process ends: make children from a
    thread that lives as long as they should. Returns whether the request was taken (False
    elsewhere than Linux: nothing is done).
    """
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    sig = signal.SIGTERM if sig is None else sig
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:  # it ended before the request was made
        os.kill(os.getpid(), sig)
    return True
