"""Imported by the local pool's fork server last (`spmlkit.experiments.pool.PRELOAD`): the objects
of the modules it preloaded (torch, spmlkit), imported with the cyclic garbage collector off
(`spmlkit.experiments._server_init`), are frozen out of it (``gc.freeze``: none of them is
garbage, and the workers forked from the server then never sweep them, nor touch their pages)
and the collector is turned back on. Imported anywhere else, it does nothing."""
from __future__ import annotations

import gc

from ._server_init import IN_SERVER

if IN_SERVER:
    gc.freeze()
    gc.enable()
