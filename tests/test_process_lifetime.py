"""Processes the test suite starts end with their parent (issue 46): what tests/conftest.py
asks for under make."""
from __future__ import annotations

import pytest


def test_a_process_that_make_starts_ends_when_make_is_killed(tmp_path):
    """What tests/conftest.py does under make: make runs a recipe of one command itself, the
    command asks to end with its parent, and a SIGKILL of make alone (no cleanup) ends it
    (the suite's Dask processes then get their teardown)."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    if not sys.platform.startswith("linux") or shutil.which("make") is None:
        pytest.skip("needs Linux and make")
    (tmp_path / "child.py").write_text(
        "import os, sys, time\n"
        "from spmlkit.machine import end_with_parent\n"
        "assert end_with_parent(parent=os.getppid())\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "time.sleep(120)\n")
    (tmp_path / "Makefile").write_text(f"run:\n\t{sys.executable} child.py pid.txt\n")
    make = subprocess.Popen(["make", "-s", "run"], cwd=tmp_path)
    try:
        for _ in range(200):
            if (tmp_path / "pid.txt").exists() and (tmp_path / "pid.txt").read_text():
                break
            time.sleep(0.05)
        child = int((tmp_path / "pid.txt").read_text())
        make.send_signal(signal.SIGKILL)  # (SIGTERM: make ends its command itself)
        make.wait(timeout=30)
        for _ in range(100):
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the command make started outlived make")
    finally:
        if make.poll() is None:
            make.kill()
