"""A battery of bad inputs around the files spmlkit writes and the resources it takes (issue 30).

Each case plants something where a command writes or hands it a hostile input, runs the real
``spml`` command line in a fresh process (``python -m spmlkit``, with ``--src`` first on the
path), and sorts the outcome into one kind:

- ``clear``: what should fail failed (exit status != 0) with a message holding the case's key
  words, and nothing planted was harmed; or what should work worked;
- ``unclear``: it failed without saying what is wrong (the key words missing), or failed where
  it should have worked;
- ``silent``: a bad input accepted (exit 0), or a planted file harmed, whatever the exit status;
- ``traceback``: a Python traceback, or a death by a signal (SIGBUS, ...);
- ``memory``: a MemoryError, or killed under the address-space cap (``--mem-gib``);
- ``hang``: still running at the case's time limit.

``files left`` is counted apart: a case that left files it should not have (a temporary file, a
numbered copy, a folder a refused command made).

Usage (about 10 minutes on two busy cores; the outcomes before and after issue 30 are
results/bad-inputs.csv)::

    python benchmarks/bad_inputs.py --src /work/main/src     # before
    python benchmarks/bad_inputs.py --src src                 # after
    python benchmarks/bad_inputs.py --only 1.predict          # the cases whose name starts so

Needs root for the device-node cases (``os.mknod``) and the tmpfs cases (full disk, read-only
disk: ``mount``); they are skipped otherwise.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import io
import json
import os
import resource
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

ROOT = os.geteuid() == 0
KINDS = ("clear", "unclear", "silent", "traceback", "memory", "hang")
CASES = []


def case(name, expect_ok=False, keys=(), root=False, timeout=90):
    """Register ``fn(w) -> (argv, check)``; ``check(rc, out) -> (harmed, files_left)``."""
    def wrap(fn):
        CASES.append(dict(name=name, fn=fn, expect_ok=expect_ok, keys=keys, root=root,
                          timeout=timeout))
        return fn
    return wrap


class World:
    """The fixtures every case copies from: a trained run, a finished study, image folders."""

    def __init__(self, base: Path, src: Path, mem_gib: float):
        self.base, self.src, self.mem = base, src, mem_gib

    def spml(self, argv, timeout=90, cwd=None, mem=True, env=None):
        e = dict(os.environ, PYTHONPATH=str(self.src), PYTHONWARNINGS="ignore",
                 SPMLKIT_CACHE=str(self.base / "spmlcache"), **(env or {}))
        limit = int(self.mem * 2**30) if mem else None

        def pre():
            os.setsid()
            if limit:
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        p = subprocess.Popen([sys.executable, "-m", "spmlkit", *map(str, argv)], cwd=cwd or
                             self.base, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             preexec_fn=pre)
        try:
            out, _ = p.communicate(timeout=timeout)
            return p.returncode, out.decode(errors="replace")
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            return None, out.decode(errors="replace")

    def build(self):
        b = self.base
        rc, out = self.spml(["train", "--epochs", "1", "--out", b / "runs", "--quiet"], 300)
        assert rc == 0, out
        (self.run,) = (b / "runs").iterdir()
        rc, out = self.spml(["study", "run", "smoke", "--out", b / "study", "--jobs", "1",
                             "--quiet", "--set", "epochs=1", "methods=[an]"], 300)
        assert rc == 0, out
        self.study = b / "study"
        sys.path.insert(0, str(self.src))
        from spmlkit.loading import load_dataset

        self.x = load_dataset("yeast").test.x[:20].astype(np.float32)
        np.save(b / "new.npy", self.x)
        self.images = b / "tree"
        from PIL import Image

        rng = np.random.default_rng(0)
        for name in ("cat", "dog", "fox"):
            (self.images / name).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(
                    self.images / name / f"{i}.png")

    def copy_run(self, w: Path) -> Path:
        return Path(shutil.copytree(self.run, w / "run"))

    def copy_study(self, w: Path) -> Path:
        return Path(shutil.copytree(self.study, w / "study"))


# ---- what gets planted ------------------------------------------------------------------------
def plant(path: Path, kind: str, target: Path | None = None) -> Path:
    """A ``device`` (a null char device), ``fifo``, ``folder``, ``link`` (to ``target``, made
    with content) or ``file`` at ``path``; returns the file whose harm the check looks for."""
    if kind == "device":
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "link":
        target = target or path.parent / "victim.txt"
        if not target.exists():
            target.write_text("victim\n")
        path.symlink_to(target)
        return target
    elif kind == "file":
        path.write_text("mine\n")
    return path


def snapshot(path: Path):
    st = os.lstat(path)
    body = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
    return stat.S_IFMT(st.st_mode), body


def unharmed(path: Path, before) -> bool:
    try:
        return snapshot(path) == before
    except FileNotFoundError:
        return False


def watch(*paths: Path):
    """``check(rc, out)``: harmed when a watched path changed, files left when a numbered or
    temporary sibling appeared."""
    before = {p: snapshot(p) for p in paths}
    folders = {p.parent for p in paths}
    names = {f: set(os.listdir(f)) for f in folders}

    def check(rc, out):
        harmed = not all(unharmed(p, s) for p, s in before.items())
        left = any(n.endswith(".tmp") or "-2" in n for f in folders
                   for n in set(os.listdir(f)) - names[f])
        return harmed, left
    return check


KIND_KEYS = {"device": "device", "fifo": "fifo", "folder": "folder", "link": "link",
             "file": "--force"}

# ---- 1. the files a user owns ------------------------------------------------------------------
for _kind in ("file", "device", "fifo", "folder", "link"):
    def _predict_out(w, kind=_kind):
        run = w.world.copy_run(w)
        victim = plant(w / "out.csv", kind)
        return ["predict", run, w.world.base / "new.npy", "--out", w / "out.csv"], watch(victim)
    case(f"1.predict --out onto a {_kind}", keys=(KIND_KEYS[_kind],),
         root=_kind == "device")(_predict_out)

for _own in ("best.pt", "config.json", "thresholds.json"):
    def _predict_own(w, own=_own):
        run = w.world.copy_run(w)
        return (["predict", run, w.world.base / "new.npy", "--out", run / own],
                watch(run / own))
    case(f"1.predict --out onto the run's {_own}", keys=(_own,))(_predict_own)


@case("1.predict --out onto its own input", keys=("input",))
def _predict_input(w):
    run = w.world.copy_run(w)
    inp = Path(shutil.copy(w.world.base / "new.npy", w / "new.npy"))
    return ["predict", run, inp, "--out", inp], watch(inp)


@case("1.predict --out onto a hard link of best.pt", keys=("out.csv",))
def _predict_hardlink(w):
    run = w.world.copy_run(w)
    os.link(run / "best.pt", w / "out.csv")
    return (["predict", run, w.world.base / "new.npy", "--out", w / "out.csv"],
            watch(run / "best.pt"))


for _kind in ("file", "device", "fifo"):
    def _report(w, kind=_kind):
        study = w.world.copy_study(w)
        victim = plant(w / "r.html", kind)
        force = [] if kind == "file" else ["--force"]
        return ["report", study, "--out", w / "r.html", *force], watch(victim)
    case(f"1.report --out onto a {_kind}", keys=(KIND_KEYS[_kind],),
         root=_kind == "device")(_report)

    def _export(w, kind=_kind):
        study = w.world.copy_study(w)
        victim = plant(w / "x.csv", kind)
        force = [] if kind == "file" else ["--force"]
        return (["study", "export", study, "--format", "csv", "--output", w / "x.csv", *force],
                watch(victim))
    case(f"1.study export --output onto a {_kind}", keys=(KIND_KEYS[_kind],),
         root=_kind == "device")(_export)

    def _figure(w, kind=_kind):
        run = w.world.copy_run(w)
        victim = plant(w / "c.png", kind)
        force = [] if kind == "file" else ["--force"]
        return ["figure", "curves", run, "--out", w / "c.png", *force], watch(victim)
    case(f"1.figure curves --out onto a {_kind}", keys=(KIND_KEYS[_kind],),
         root=_kind == "device")(_figure)


@case("1.study export --output onto the study's results.sqlite (--force)",
      keys=("results.sqlite",))
def _export_store(w):
    study = w.world.copy_study(w)
    return (["study", "export", study, "--format", "csv", "--output", study / "results.sqlite",
             "--force"], watch(study / "results.sqlite"))


@case("1.figure --out onto the run's metrics.jsonl (--force)", keys=("metrics.jsonl",))
def _figure_own(w):
    run = w.world.copy_run(w)
    return (["figure", "curves", run, "--out", run / "metrics.jsonl", "--force"],
            watch(run / "metrics.jsonl"))


for _kind in ("link", "fifo"):
    def _bench(w, kind=_kind):
        out = w / "bench"
        out.mkdir()
        victim = plant(out / "table.md", kind)
        return (["benchmark", "--losses", "an", "--seeds", "1", "--epochs", "1",
                 "--batch-sizes", "16", "--lrs", "1e-2", "--no-references", "--out", out,
                 "--quiet"], watch(victim))
    case(f"1.benchmark --out DIR with table.md a {_kind}", keys=("table.md",))(_bench)

# ---- 2. folders someone handed you -------------------------------------------------------------
for _name in (".lock", "launches.jsonl", "study.yaml"):
    def _study_link(w, name=_name):
        study = w.world.copy_study(w)
        if (study / name).exists():  # the link points to a copy of the file
            shutil.move(study / name, w / "victim.txt")
        victim = plant(study / name, "link", w / "victim.txt")
        return (["study", "run", study, "--out", study, "--jobs", "1", "--quiet", "--set",
                 "epochs=1", "methods=[an,epr]"], watch(victim))
    case(f"2.study run on a folder whose {_name} is a link", keys=(_name, "link"))(_study_link)


@case("2.study run on a folder whose results.sqlite is a link", keys=("results.sqlite", "link"))
def _study_store_link(w):
    study = w.world.copy_study(w)
    shutil.move(study / "results.sqlite", w / "victim.sqlite")
    (study / "results.sqlite").symlink_to(w / "victim.sqlite")
    return (["study", "run", study, "--out", study, "--jobs", "1", "--quiet", "--set",
             "epochs=1", "methods=[an,epr]"], watch(w / "victim.sqlite"))


@case("2.study run on a folder whose runs/ is a link", keys=("runs", "link"))
def _study_runs_link(w):
    study = w.world.copy_study(w)
    shutil.move(study / "runs", w / "elsewhere")
    (study / "runs").symlink_to(w / "elsewhere")
    before = set(os.listdir(w / "elsewhere"))
    return (["study", "run", study, "--out", study, "--jobs", "1", "--quiet", "--set",
             "epochs=1", "methods=[an,epr]"],
            lambda rc, out: (set(os.listdir(w / "elsewhere")) != before, False))


def _cache_fixture(w):
    """A feature cache with one store extracted, and its store folder."""
    cache = w / "cache"
    args = ["extract", "--dataset", "folder", "--data", f"root={w.world.images}", "--backbone",
            "tiny_cnn", "--random-init", "--cache-dir", cache, "--workers", "0", "--quiet"]
    rc, out = w.world.spml(args, 300)
    assert rc == 0, out
    return cache, args


for _name in (".done.npy.tmp", "features.npy", ".lock", "meta.json"):
    def _cache_link(w, name=_name):
        cache, args = _cache_fixture(w)
        stores = sorted(p for p in cache.iterdir() if p.is_dir())
        victims = []
        for s in stores:
            (s / "meta.json").unlink()  # an unfinished store: extraction resumes into it
            (s / name).unlink(missing_ok=True)
            victims.append(plant(s / name, "link", w / f"victim-{s.name}.txt"))
        return args, watch(*victims)
    # a leftover temporary name spmlkit no longer uses: the right outcome is a finished
    # extraction with the link's target untouched
    case(f"2.extract resuming a cache whose {_name} is a link", keys=(_name, "link"),
         expect_ok=_name == ".done.npy.tmp")(_cache_link)


@case("2.train --resume on a run whose metrics.jsonl is a link", keys=("metrics.jsonl", "link"))
def _resume_link(w):
    run = w.world.copy_run(w)
    (run / "final.json").unlink()
    (run / "metrics.jsonl").unlink()
    victim = plant(run / "metrics.jsonl", "link", w / "victim.txt")
    return ["train", "--resume", run, "--quiet"], watch(victim)


# ---- 3. resource limits ------------------------------------------------------------------------
@contextlib.contextmanager
def tmpfs(path: Path, size: str, ro=False):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


MOUNTS = []


def _ro_study(w):
    mnt = w / "ro"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)], check=True)
    MOUNTS.append(mnt)
    shutil.copytree(w.world.study, mnt / "study")
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    return mnt / "study"


for _cmd in (["study", "status"], ["study", "table"], ["report"]):
    def _ro(w, cmd=_cmd):
        study = _ro_study(w)
        extra = ["--out", w / "r.html"] if cmd == ["report"] else []
        return [*cmd, study, *extra], lambda rc, out: (False, False)
    case(f"3.{' '.join(_cmd)} on a read-only study folder", expect_ok=True,
         root=True)(_ro)


def _full(w, size="300k"):
    mnt = w / "full"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    MOUNTS.append(mnt)
    return mnt


@case("3.train --save-train-probs on a full disk", keys=("space", "train_probs"), root=True)
def _full_probs(w):
    mnt = _full(w, "200k")
    return (["train", "--epochs", "3", "--save-train-probs", "--out", mnt, "--quiet"],
            lambda rc, out: (False, False))


@case("3.predict --out on a full disk", keys=("space", "p.csv"), root=True)
def _full_predict(w):
    mnt = _full(w, "4k")
    (mnt / "fill").write_bytes(b"x" * 4096)
    return (["predict", w.world.run, w.world.base / "new.npy", "--out", mnt / "p.csv"],
            lambda rc, out: (False, any(n.endswith(".tmp") for n in os.listdir(mnt))))


@case("3.study run on a full disk", keys=("space",), root=True)
def _full_study(w):
    mnt = _full(w, "200k")
    return (["study", "run", "smoke", "--out", mnt / "s", "--jobs", "1", "--quiet", "--set",
             "epochs=1"], lambda rc, out: (False, False))


@case("3.extract on a full disk", keys=("No space left on device", "/full/"), root=True)
def _full_extract(w):
    mnt = _full(w, "8k")
    return (["extract", "--dataset", "folder", "--data", f"root={w.world.images}", "--backbone",
             "tiny_cnn", "--random-init", "--cache-dir", mnt, "--workers", "0", "--quiet"],
            lambda rc, out: (False, False))


def _arrays_train(w, x_file, y_text="a\n" * 30):
    (w / "y.csv").write_text("labels\n" + y_text)
    return ["train", "--solver", "adam", "--dataset", "tabular", "--data", f"path={x_file}",
            "--data",
            "labels=labels", "--epochs", "1", "--out", w / "runs", "--quiet"]


@case("3.a .csv.gz bomb (4 MiB inflating to 4 GiB) as a table", keys=("csv.gz",),
      timeout=180)
def _gz_bomb(w):
    f = w / "t.csv.gz"
    member = gzip.compress(b"0,0,0\n" * (64 * 2**20 // 6), compresslevel=9)
    with open(f, "wb") as fh:  # gzip members concatenate: one header, 64 x 64 MiB of rows
        fh.write(gzip.compress(b"a,b,labels\n"))
        for _ in range(64):
            fh.write(member)
    return (["train", "--solver", "adam", "--dataset", "tabular", "--data", f"path={f}", "--data",
             "labels=labels", "--epochs", "1", "--out", w / "runs", "--quiet"],
            lambda rc, out: (False, (w / "runs").exists()))


@case("3.a truncated .csv.gz table", keys=("t.csv.gz",))
def _gz_trunc(w):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as fh:
        fh.write(b"a,b,labels\n" + b"".join(f"{i},{i},c{i % 3}\n".encode() for i in range(3000)))
    (w / "t.csv.gz").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    return (["train", "--solver", "adam", "--dataset", "tabular", "--data",
             f"path={w / 't.csv.gz'}", "--data",
             "labels=labels", "--epochs", "1", "--out", w / "runs", "--quiet"],
            lambda rc, out: (False, (w / "runs").exists()))


def _npz_bomb(path: Path, shape):
    """An .npz whose member declares ``shape`` float32 but holds a few bytes."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": shape})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("features.npy", header.getvalue() + b"\0" * 64)


@case("3.predict on an .npz declaring 40000 x 40000 features", keys=("f.npz",))
def _npz(w):
    _npz_bomb(w / "f.npz", (40000, 40000))
    return ["predict", w.world.run, w / "f.npz"], lambda rc, out: (False, False)


@case("3.predict on an .npy declaring 40000 x 40000 features", keys=("f.npy",))
def _npy(w):
    with open(w / "f.npy", "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (40000, 40000)})
        fh.write(b"\0" * 64)
    return ["predict", w.world.run, w / "f.npy"], lambda rc, out: (False, False)


@case("3.extract --size 100000", keys=("size",))
def _extract_size(w):
    return (["extract", "--dataset", "folder", "--data", f"root={w.world.images}", "--backbone",
             "tiny_cnn", "--random-init", "--cache-dir", w / "cache", "--workers", "0",
             "--size", "100000", "--quiet"], lambda rc, out: (False, False))


@case("3.train --head mlp --hidden 2000000", keys=("hidden",), timeout=60)
def _hidden(w):
    return (["train", "--head", "mlp", "--hidden", "2000000", "--epochs", "1", "--out",
             w / "runs", "--quiet"], lambda rc, out: (False, False))


@case("3.train --epochs 10**12", keys=("epochs",), timeout=60)
def _epochs(w):
    return (["train", "--epochs", str(10**12), "--out", w / "runs", "--quiet"],
            lambda rc, out: (False, False))


@case("3.study run with epochs: 10**12", keys=("epochs",), timeout=60)
def _study_epochs(w):
    return (["study", "run", "smoke", "--out", w / "s", "--jobs", "1", "--quiet", "--set",
             f"epochs={10**12}"], lambda rc, out: (False, False))


# ---- 5. the smaller ones -----------------------------------------------------------------------
@case("5.study status on a 0-byte results.sqlite", keys=("results.sqlite",))
def _zero_store(w):
    study = w.world.copy_study(w)
    (study / "results.sqlite").write_bytes(b"")
    return ["study", "status", study], lambda rc, out: (False, False)


@case("5.study status on a dangling results.sqlite link", keys=("results.sqlite",))
def _dangling_store(w):
    study = w.world.copy_study(w)
    (study / "results.sqlite").unlink()
    (study / "results.sqlite").symlink_to(w / "nowhere.sqlite")
    return ["study", "status", study], lambda rc, out: (False, (w / "nowhere.sqlite").exists())


@case("5.study table with a test_map that is not a number", keys=("test_map",))
def _text_map(w):
    study = w.world.copy_study(w)
    con = sqlite3.connect(study / "results.sqlite")
    con.execute("UPDATE runs SET test_map = 'abc'")
    con.commit()
    con.close()
    return ["study", "table", study], lambda rc, out: (False, False)


@case("5.predict with NaN weights in best.pt", keys=("best.pt",))
def _nan_weights(w):
    import torch

    run = w.world.copy_run(w)
    ck = torch.load(run / "best.pt", weights_only=True)
    sd = ck.get("state_dict", ck.get("model", ck))
    for v in sd.values():
        if torch.is_tensor(v) and v.is_floating_point():
            v.fill_(float("nan"))
    torch.save(ck, run / "best.pt")
    return ["predict", run, w.world.base / "new.npy"], lambda rc, out: (False, False)


@case("5.benchmark --losses ''", keys=("--losses",))
def _empty_losses(w):
    return (["benchmark", "--losses", "", "--seeds", "1", "--epochs", "1", "--out", w / "b",
             "--quiet"], lambda rc, out: (False, False))


@case("5.train on features of 1e38", keys=("feature",))
def _huge_features(w):
    np.save(w / "x.npy", np.full((40, 3), 1e38, dtype=np.float32))
    (w / "y.csv").write_text("labels\n" + "".join(f"c{i % 3}\n" for i in range(40)))
    return (["train", "--solver", "adam", "--dataset", "arrays", "--data",
             f"features={w / 'x.npy'}", "--data",
             f"labels={w / 'y.csv'}", "--epochs", "2", "--out", w / "runs", "--quiet"],
            lambda rc, out: (False, False))


@case("5.train --threads 1000", keys=("--threads",))
def _threads(w):
    return (["train", "--threads", "1000", "--epochs", "1", "--out", w / "runs", "--quiet"],
            lambda rc, out: (False, False))


@case("5.study spec with vary: {k: [true]}", keys=("quote",))
def _vary_bool(w):
    (w / "s.yaml").write_text("name: v\ndatasets: [yeast]\nmethods: [epr]\nmode: linear\n"
                              "epochs: 1\nvary: {k: [true]}\n")
    return ["study", "run", w / "s.yaml", "--out", w / "s", "--quiet"], \
        lambda rc, out: (False, False)


@case("5.a class name with a NUL byte", keys=("NUL",))
def _nul(w):
    np.save(w / "x.npy", np.random.default_rng(0).random((40, 3)).astype(np.float32))
    (w / "y.csv").write_text("labels\n" + "".join(("a\0b" if i % 2 else "c") + "\n"
                                                  for i in range(40)))
    return (["train", "--solver", "adam", "--dataset", "arrays", "--data",
             f"features={w / 'x.npy'}", "--data",
             f"labels={w / 'y.csv'}", "--epochs", "1", "--out", w / "runs", "--quiet"],
            lambda rc, out: (False, False))


@case("5.two train --resume on one run folder at once", keys=("another",))
def _two_resumes(w):
    run = w.world.copy_run(w)
    (run / "final.json").unlink()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(run / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE)
    holder.stdout.readline()
    w.cleanup.append(holder.kill)
    return ["train", "--resume", run, "--quiet"], lambda rc, out: (False, False)


# ---- the run -----------------------------------------------------------------------------------
class Workdir(type(Path())):
    pass


def run_case(c, world, base):
    w = Workdir(tempfile.mkdtemp(dir=base, prefix="case-"))
    w.world, w.cleanup = world, []
    try:
        argv, check = c["fn"](w)
    except Exception as err:  # noqa: BLE001 - a fixture that could not be made
        return "skipped", False, f"setup failed: {err!r}", 0.0
    t0 = time.perf_counter()
    rc, out = world.spml(argv, c["timeout"], cwd=w)
    seconds = time.perf_counter() - t0
    harmed, left = check(rc, out)
    for f in w.cleanup:
        f()
    low = out.lower()
    if rc is None:
        kind = "hang"
    elif "memoryerror" in low or "cannot allocate memory" in low or rc == -signal.SIGKILL:
        kind = "memory"
    elif "traceback (most recent call last)" in low or rc < 0:
        kind = "traceback"
    elif harmed:
        kind = "silent"
    elif c["expect_ok"]:
        kind = "clear" if rc == 0 else "unclear"
    elif rc == 0:
        kind = "silent"
    else:
        kind = "clear" if all(k.lower() in low for k in c["keys"]) else "unclear"
    last = [ln for ln in out.strip().splitlines() if ln.strip()]
    return kind, left, (last[-1] if last else f"(no output, exit {rc})")[:200], seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--only", default="")
    ap.add_argument("--mem-gib", type=float, default=3.0)
    ap.add_argument("--json", help="write the outcomes here")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bad-inputs-"))
    world = World(base, Path(args.src).resolve(), args.mem_gib)
    world.build()
    counts, left_n, rows = collections.Counter(), 0, []
    for c in CASES:
        if not c["name"].startswith(args.only):
            continue
        if c["root"] and not ROOT:
            continue
        kind, left, last, seconds = run_case(c, world, base)
        while MOUNTS:
            subprocess.run(["umount", "-l", str(MOUNTS.pop())], check=False)
        counts[kind] += 1
        left_n += left
        rows.append(dict(case=c["name"], kind=kind, files_left=left, last_line=last,
                         seconds=round(seconds, 1)))
        print(f"{kind:9s} {'LEFT ' if left else '     '}{c['name']}\n            {last}",
              flush=True)
    print("\n" + " | ".join(f"{k} {counts[k]}" for k in (*KINDS, "skipped") if counts[k] or
                            k in KINDS) + f" | files left {left_n} | cases {len(rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
