"""spmlkit's loader workers keep the memory of the images they decode (glibc's malloc
thresholds, `spmlkit.machine.loader_worker_init`); benchmarks/loader_malloc.py measures what
it saves."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLIBC = hasattr(os, "confstr") and bool(os.confstr("CS_GNU_LIBC_VERSION") or "")

# in a fresh interpreter (no history of frees that would have raised glibc's thresholds): where
# an 8 MiB buffer comes from, below the program break (the heap) or above it (a mapping)
WHERE = """
import ctypes, sys
from spmlkit.machine import loader_worker_init
applied = loader_worker_init() if sys.argv[1] == "init" else None
libc = ctypes.CDLL(None)
libc.sbrk.restype = ctypes.c_void_p
buf = ctypes.create_string_buffer(8 << 20)
print(applied, ctypes.addressof(buf) < libc.sbrk(0))
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc")
def test_a_worker_takes_image_sized_buffers_from_its_heap():
    """With the settings an 8 MiB buffer comes from the heap (kept for the next image);
    with glibc's defaults it is a mapping of its own (unmapped again when freed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = {how: subprocess.run([sys.executable, "-c", WHERE, how], capture_output=True,
                               text=True, env=env, check=True).stdout.split()
           for how in ("init", "default")}
    assert out == {"init": ["True", "True"], "default": ["None", "False"]}


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc")
def test_a_study_pool_worker_keeps_image_memory_too():
    """A study's pool worker starts no loader workers of its own (it is daemonic) and decodes
    the images itself: it runs with the same settings."""
    from _pool_tasks import heap_buffer

    from spmlkit.experiments.pool import run_tasks

    assert list(run_tasks(heap_buffer, [{}, {}], jobs=2)) == [{"heap": True}, {"heap": True}]


def test_every_dataloader_of_the_package_starts_its_workers_with_it():
    """Each ``DataLoader(...)`` call in src/spmlkit passes
    ``worker_init_fn=loader_worker_init``."""
    calls = []
    for path in sorted((ROOT / "src" / "spmlkit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "DataLoader":
                init = {k.arg: k.value for k in node.keywords}.get("worker_init_fn")
                calls.append((path.name, getattr(init, "id", None)))
    assert len(calls) >= 3
    assert all(init == "loader_worker_init" for _, init in calls), calls


def test_spmlkit_loaders_deliver_the_same_images_with_it(tmp_path):
    """Two workers with the settings deliver what the loader delivers in-process (the pixels
    do not depend on the allocator)."""
    import numpy as np
    import torch
    from PIL import Image

    from spmlkit.data.transforms import weak_view
    from spmlkit.engine import TrainConfig
    from spmlkit.engine.image_batches import GlobalBatchSampler, ImageItems, make_loader
    from spmlkit.machine import loader_worker_init

    rng = np.random.default_rng(0)
    paths = []
    for i in range(12):
        path = tmp_path / f"{i}.jpg"
        Image.fromarray(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    batches = {}
    for workers in (0, 2):
        sampler = GlobalBatchSampler(len(paths), 4, 0, 0, 1)
        loader = make_loader(ImageItems(paths, weak_view(32), seed=0), sampler,
                             TrainConfig(batch_size=4, num_workers=workers), (3, 32, 32),
                             torch.device("cpu"))
        assert loader.worker_init_fn is loader_worker_init
        sampler.set_epoch(1)
        batches[workers] = list(loader)
    for (x0, f0, r0), (x2, f2, r2) in zip(batches[0], batches[2]):
        assert torch.equal(x0, x2) and torch.equal(f0, f2) and torch.equal(r0, r2)


def test_loader_malloc_benchmark_writes_every_row(tmp_path):
    """benchmarks/loader_malloc.py on a few images: both mallocs and histories of a loader,
    each in its own interpreter, in the CSV."""
    import csv

    out = tmp_path / "malloc.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "loader_malloc.py"),
                           "--out", str(out), "--workdir", str(tmp_path / "work"),
                           "--images", "16", "--sizes", "32", "--passes", "2",
                           "--loaders", "bare"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(out.open()))
    assert [(r["malloc"], r["history"]) for r in rows] == [
        ("defaults", "fresh"), ("loader_worker_init", "fresh"),
        ("defaults", "freed 16 MiB"), ("loader_worker_init", "freed 16 MiB")]
    assert all(r["images"] == "16" and float(r["ms_per_image"]) > 0 for r in rows), rows
