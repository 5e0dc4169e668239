"""benchmarks/gpu_throughput.py in its CPU smoke mode: the synthetic COCO layout, every path's
child process, the CSV (the GPU figures come from a run on a GPU)."""
import csv
import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_mode_writes_every_path(tmp_path):
    out = tmp_path / "gpu.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    paths = ("ceiling,bare,spmlkit,spmlkit+gpu-decode,spmlkit+sync-checkpoint,spmlkit+no-folder,"
             "spmlkit+float-workers,spmlkit+gpu-decode-inline,spmlkit+gpu-decode+compile,"
             "spmlkit+glibc-malloc")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_throughput.py"),
                           "--smoke", "--device", "cpu", "--out", str(out),
                           "--workdir", str(tmp_path / "work"), "--paths", paths],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(out.open()))
    got = {(r["path"], r["batch"]): r for r in rows}
    for batch in ("8", "4"):
        for path in ("ceiling", "bare", "spmlkit"):
            row = got[(path, batch)]
            assert float(row["epoch_s"]) > 0 and float(row["train_img_s"]) > 0, row
            assert row["train_rows"] == "40" and row["val_rows"] == "10", row
        assert float(got[("bare", batch)]["vs_bare"]) == 1.0
        # the training thread's time in the checkpoint: spmlkit's paths with a run folder
        assert got[("bare", batch)]["checkpoint_s"] == ""
        assert got[("spmlkit+no-folder", batch)]["checkpoint_s"] == "0.0"
        for path in ("spmlkit", "spmlkit+sync-checkpoint"):
            assert float(got[(path, batch)]["checkpoint_s"]) > 0, got[(path, batch)]
            assert got[(path, batch)]["decode_s"] == ""  # (--gpu-decode's paths only)
        # the CPU seconds of the thread that queues the steps, and of the whole process
        for path in ("ceiling", "bare", "spmlkit"):
            row = got[(path, batch)]
            assert float(row["host_cpu_s"]) >= float(row["train_cpu_s"]) >= 0, row
        # the training thread's waits for its next batch: the loops with a loader
        assert got[("ceiling", batch)]["wait_s"] == ""
        for path in ("bare", "spmlkit", "spmlkit+float-workers", "spmlkit+glibc-malloc"):
            assert float(got[(path, batch)]["wait_s"]) >= 0, got[(path, batch)]
        # on a CPU the uint8 loader + finish in the training process gives the float32 workers'
        # bits: the seeded runs' scores are equal (on a GPU: within bfloat16 noise)
        ours, before = got[("spmlkit", batch)], got[("spmlkit+float-workers", batch)]
        assert ours["val_map"] != "" and (ours["val_map"], ours["test_map"]) == \
            (before["val_map"], before["test_map"]), (ours, before)
        glibc = got[("spmlkit+glibc-malloc", batch)]  # the allocator changes no bit
        assert (glibc["val_map"], glibc["test_map"]) == (ours["val_map"], ours["test_map"])
    for path in ("spmlkit+gpu-decode", "spmlkit+gpu-decode-inline", "spmlkit+gpu-decode+compile"):
        assert got[(path, "8")]["note"] == "skipped: --gpu-decode needs CUDA"
        assert (path, "4") not in got  # --gpu-decode's paths: the first batch only
    layout = tmp_path / "work" / "coco"
    assert len(list((layout / "train2014").glob("*.jpg"))) == 50
    assert (layout / "annotations" / "instances_val2014.json").is_file()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads Linux's /proc")
def test_thread_cpu_charges_each_thread_to_its_role():
    """The benchmark's per-thread CPU columns: a decode thread's and the main thread's CPU
    seconds, each burnt in turn, are charged to ``decode`` and ``train``; the process total
    holds both."""
    from spmlkit.data.image_views import AHEAD_NAME

    spec = importlib.util.spec_from_file_location("gpu_throughput",
                                                  ROOT / "benchmarks" / "gpu_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    cpu = bench.ThreadCPU()

    def read_after(moment):  # until the sampler has read every thread after ``moment``
        deadline = time.perf_counter() + 10
        while not any(t > moment for t, _ in list(cpu.samples)):
            assert time.perf_counter() < deadline, "no reading"
            time.sleep(0.01)

    def burn(seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
        read_after(time.perf_counter())  # alive and idle until read once more

    read_after(time.perf_counter())
    t0 = time.perf_counter()
    other = threading.Thread(target=burn, args=(0.4,), name=AHEAD_NAME)
    other.start()
    other.join()
    burn(0.3)
    used = cpu.used(t0, time.perf_counter())
    cpu.stop.set()
    assert used["decode"] == pytest.approx(0.4, abs=0.05)
    assert used["train"] == pytest.approx(0.3, abs=0.05)
    assert used["host"] >= used["decode"] + used["train"] - 1e-9  # (sums of ticks)
