"""The test tiers: ``make test-fast`` runs ``pytest -m "not slow"`` (under 3 minutes on 2 cores),
``make test`` everything.

A test is slow when it is marked ``@pytest.mark.slow`` or lives in one of the files below, whose
tests train real jobs (runs, studies, clusters, image models, the docs' code blocks) or render
figures in a browser. A new file of such tests belongs in this list.
"""
from __future__ import annotations

from pathlib import Path

import pytest

SLOW_FILES = {
    "test_analysis.py", "test_backbones.py", "test_boostlu.py", "test_cli_benchmark.py",
    "test_cli_train.py", "test_dask_cluster.py", "test_dask_executor.py", "test_distributed.py",
    "test_docs.py", "test_estimator_checks.py", "test_extending_pages.py", "test_figures.py",
    "test_finetune.py", "test_given.py", "test_images_user.py", "test_lac_method.py",
    "test_lac_official.py", "test_label_bias.py", "test_mime.py", "test_methods.py",
    "test_offline_sets.py", "test_out_of_core.py", "test_own_data.py", "test_paper_protocols.py",
    "test_pool.py", "test_predict.py", "test_report.py", "test_smile.py", "test_study.py",
    "test_walkthrough.py",
}


def pytest_configure(config):
    """Under make (``make test``, ``make test-fast``: MAKELEVEL is set), the test process ends
    when make does: a kill of make alone left pytest running, and with it the suite's Dask
    scheduler and worker until its teardown. make starts the recipe's one command itself (no
    shell between), so make is the parent here."""
    import os

    if os.environ.get("MAKELEVEL") and not os.environ.get("SPMLKIT_KEEP_WITHOUT_MAKE"):
        from spmlkit.machine import end_with_parent

        end_with_parent(parent=os.getppid())


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        if Path(str(item.fspath)).name in SLOW_FILES:
            item.add_marker(slow)
