"""benchmarks/gpu_throughput.py in its CPU smoke mode: the synthetic COCO layout, every path's
child process, the CSV (the GPU figures come from a run on a GPU)."""
import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_mode_writes_every_path(tmp_path):
    out = tmp_path / "gpu.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_throughput.py"),
                           "--smoke", "--device", "cpu", "--out", str(out),
                           "--workdir", str(tmp_path / "work")],
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
    assert got[("spmlkit+gpu-decode", "8")]["note"] == "skipped: --gpu-decode needs CUDA"
    layout = tmp_path / "work" / "coco"
    assert len(list((layout / "train2014").glob("*.jpg"))) == 50
    assert (layout / "annotations" / "instances_val2014.json").is_file()
