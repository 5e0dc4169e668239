"""What this machine lends a run: the cache folder and the worker counts.

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

__all__ = ["default_cache_dir", "default_workers", "loader_workers", "prefetch_factor"]


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
