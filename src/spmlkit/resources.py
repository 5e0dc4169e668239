"""What this machine can give a command, checked before it is taken: memory for an allocation
(`check_memory`) and the bytes a compressed file may inflate to (`bounded_reader`).

A size read from a header or asked for by an option (an ``.npz``'s declared shape, a
``.csv.gz`` that inflates, ``extract --size``, ``--hidden``) is compared with the memory this
process can still get (`memory_budget`: the machine's available memory, or less under an
address-space limit such as ``ulimit -v``) and refused with one line naming what asked for it,
instead of a MemoryError traceback or a process the kernel kills.
"""
from __future__ import annotations

import io
import os
import resource

__all__ = ["memory_budget", "check_memory", "bounded_reader", "format_bytes"]


def format_bytes(n: float) -> str:
    """``1.5 GiB``, ``300.0 MiB``, ``12 B``.

    >>> format_bytes(3 * 2**30 // 2), format_bytes(12)
    ('1.5 GiB', '12 B')
    """
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _vm_size() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory_budget() -> int | None:
    """Bytes this process may still allocate: the machine's available memory (Linux
    ``MemAvailable``, else ``sysconf``), less where an address-space limit (``RLIMIT_AS``)
    leaves less; None where neither can be read."""
    avail = _meminfo("MemAvailable")
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        left = max(0, soft - _vm_size())
        avail = left if avail is None else min(avail, left)
    return avail


def check_memory(nbytes: float, what: str, hint: str = "") -> None:
    """Raise ``ValueError`` when ``what`` needs more than `memory_budget` (``nbytes``:
    an estimate made before allocating); the message names what, both sizes and ``hint``."""
    budget = memory_budget()
    if budget is not None and nbytes > budget:
        raise ValueError(f"{what} needs about {format_bytes(nbytes)} of memory, more than the "
                         f"{format_bytes(budget)} this process can get" +
                         (f"; {hint}" if hint else ""))


#: the share of the memory budget a compressed table's text may inflate to
TEXT_SHARE = 6


class _Bounded(io.RawIOBase):
    """A readable stream that stops with a ``ValueError`` past ``limit`` bytes."""

    def __init__(self, raw, limit: int, name: str):
        self.raw, self.limit, self.name, self.count = raw, int(limit), name, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        data = self.raw.read(len(buf))
        self.count += len(data)
        if self.count > self.limit:
            raise ValueError(f"{self.name}: inflates to more than {format_bytes(self.limit)} of "
                             f"text, more than this process can parse in its memory (a "
                             f"compressed file this large, or a decompression bomb); give the "
                             f"rows as .parquet, or a smaller file")
        buf[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self.raw.close()
        super().close()


def bounded_reader(raw, name: str, limit: int | None = None):
    """A buffered binary stream over the decompressing stream ``raw`` that raises a
    ``ValueError`` naming ``name`` once more than ``limit`` bytes came out (default: a sixth of
    `memory_budget`: a parsed table of short numbers takes four times its text and
    more: ``0,0,0`` is 6 bytes of text, 24 of int64 columns, and the parser's buffers)."""
    if limit is None:
        budget = memory_budget()
        limit = budget // TEXT_SHARE if budget is not None else 1 << 62
    return io.BufferedReader(_Bounded(raw, limit, str(name)), buffer_size=1 << 20)
