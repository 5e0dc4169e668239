"""Imported by the local pool's fork server (`spmlkit.experiments.pool.PRELOAD`), first: the fork
server ends with the process that started it (`spmlkit.experiments.pool.worker_context`
names that process in ``SPMLKIT_POOL_PARENT``). Imported anywhere else, it does nothing.

A fork server outlives a killed parent while a worker still holds its "alive" pipe (a worker in
a long task): an interrupted ``spml benchmark`` once left it running. Its parent's end is
watched by polling ``os.getppid()`` (the process is re-parented when its parent ends, whatever
thread started it; ``PR_SET_PDEATHSIG`` fires when the starting *thread* ends). The server then
ends at once (``os._exit`` after the exit handlers registered later), without the interpreter's
teardown of the modules it preloaded."""
from __future__ import annotations

import atexit
import gc
import os
import signal
import threading
import time

#: seconds between two looks at the parent
POLL = 0.5


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL)
    os.kill(os.getpid(), signal.SIGTERM)


_parent = os.environ.get("SPMLKIT_POOL_PARENT", "")
#: whether this process is the local pool's fork server
IN_SERVER = _parent.isdigit() and int(_parent) == os.getppid()
if IN_SERVER:
    # the preloaded modules (torch, spmlkit) imported without the collections their objects
    # would trigger; `spmlkit.experiments._server_ready`, imported last, freezes them out of
    # the collector (also in the workers forked from here) and turns it back on
    gc.disable()
    threading.Thread(target=_watch, args=(int(_parent),), daemon=True,
                     name="spmlkit-parent-watch").start()
    # the server's end (its parent gone): the exit handlers registered after this one (torch's)
    # run, then the process ends without tearing down the modules it preloaded (~0.4 s of CPU
    # with torch and spmlkit loaded); it holds no file to flush, and its workers end as they do
    atexit.register(os._exit, 0)
