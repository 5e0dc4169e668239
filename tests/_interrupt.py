"""Ctrl-C in ``spml train`` at a chosen epoch, in-process (what tests of interrupted runs use)."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def ctrl_c_after_epoch(epoch: int | None = None):
    """Within the block, ``spml train`` raises ``KeyboardInterrupt`` once epoch ``epoch`` (its
    ``metrics.jsonl`` number; None: the first one) is logged, as Ctrl-C there would."""
    import spmlkit.cli.train as cli_train

    epoch_bar = cli_train._epoch_bar

    def interrupting(args, total, desc, batches=False):
        bar, show = epoch_bar(args, total, desc, batches)

        def on_epoch(record, *rest):
            show(record, *rest)
            if epoch is None or record["epoch"] == epoch:
                raise KeyboardInterrupt
        on_epoch.batch = show.batch
        return bar, on_epoch

    cli_train._epoch_bar = interrupting
    try:
        yield
    finally:
        cli_train._epoch_bar = epoch_bar
