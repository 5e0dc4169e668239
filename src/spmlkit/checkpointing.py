"""The resumable checkpoint of a run, written while the next epoch trains (`Checkpointer`)."""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Callable

__all__ = ["Checkpointer", "on_host"]


class Checkpointer:
    """Saves a run's resumable state after an epoch through ``save(state)``
    (`spmlkit.runs.RunDir.checkpointer`: its ``checkpoint.pt``).

    A fine-tuned ResNet-50's state (weights, best weights, Adam's two moments: about 400 MB)
    took 0.35-0.42 s to write and sync on spmlkit's test machine, a seventh of an epoch of the
    GPU benchmark's 2,400 images (`benchmarks/gpu_throughput.py`). With ``background`` the
    training loop pays only for the copy to host memory: the state is built in the calling
    thread (so it is the epoch's, whatever the next one changes), its device tensors copied to
    the CPU, and a thread serialises, writes and syncs it while the next epoch trains. One
    write at a time: the next checkpoint, and `wait`, wait for the one in flight and raise
    its error (a full disk) there. The file is still published atomically: a process killed
    meanwhile leaves the previous epoch's checkpoint. The price is a host copy of the state
    while it is written.

    A fork (a DataLoader starting its workers: the val, test and prediction loaders start at
    their first pass, which can fall while the last epoch's state is written) first waits for
    the writes in flight, so no child is forked from a process whose writer thread holds a
    lock halfway through ``torch.save`` (`os.register_at_fork`; Python 3.12 and later warn of
    such forks).
    """

    def __init__(self, save: Callable[[dict], None], every_seconds: float = 0.0,
                 background: bool = True):
        self.save, self.every, self.background = save, float(every_seconds), bool(background)
        self.last = time.monotonic()
        self._thread = None
        self._error: BaseException | None = None

    def __call__(self, make_state) -> None:
        if time.monotonic() - self.last < self.every:
            return
        self.wait()
        state = make_state()
        if not self.background:
            self.save(state)
        else:
            state = on_host(state)
            self._thread = threading.Thread(target=self._write, args=(state,),
                                            name=WRITER_NAME)
            self._thread.start()
        self.last = time.monotonic()

    def _write(self, state) -> None:
        try:
            self.save(state)
        except BaseException as err:  # raised in the training thread, by wait()
            self._error = err

    def wait(self, raise_error: bool = True) -> None:
        """Return when no write is in flight; raise the error of a write that failed (with
        ``raise_error=False``, when the run already failed of its own error, it is dropped:
        the previous checkpoint stays)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        err, self._error = self._error, None
        if err is not None and raise_error:
            raise err


#: the name of the threads that write checkpoints (a fork waits for them: `_before_fork`)
WRITER_NAME = "spmlkit-checkpoint"


def _before_fork() -> None:
    for thread in threading.enumerate():
        if thread.name == WRITER_NAME and thread is not threading.current_thread():
            thread.join()


if hasattr(os, "register_at_fork"):  # (not on Windows, which does not fork)
    os.register_at_fork(before=_before_fork)


def on_host(obj):
    """``obj`` (a training state: dicts, lists, tuples, tensors, plain values) with every
    tensor on a device other than the CPU copied to the CPU (CPU tensors as they are: the
    state holds copies already). An ``OrderedDict`` keeps its type and ``_metadata``."""
    import torch  # (lazily: run folders are read by commands that never load torch)

    if isinstance(obj, torch.Tensor):
        return obj.cpu() if obj.device.type != "cpu" else obj
    if isinstance(obj, dict):
        items = [(k, on_host(v)) for k, v in obj.items()]
        out = OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata
        return out
    if isinstance(obj, (list, tuple)):
        items = [on_host(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj
