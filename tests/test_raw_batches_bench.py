"""benchmarks/raw_batches.py on a few images: both forms measured, the CSV written."""
import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_raw_batches_benchmark_measures_both_forms(tmp_path):
    out = tmp_path / "raw.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "raw_batches.py"),
                           "--out", str(out), "--workdir", str(tmp_path / "work"),
                           "--images", "24", "--batch", "8", "--workers", "1", "--epochs", "1",
                           "--repeats", "1"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(out.open()))
    assert [r["form"] for r in rows] == ["list of tensors", "RawFiles"]
    for row in rows:
        assert row["batches"] == "3" and float(row["receiver_cpu_ms"]) > 0, row
