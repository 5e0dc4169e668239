"""Malformed inputs of the kinds issue 19 found left (sizes, damaged run folders, spec files,
names, refused or killed launches): each is one clear ``spml <cmd>: error:`` line, exit 2,
nothing allocated first and no folder left behind.

The commands run in-process (`spmlkit.cli.main`) on a one-epoch yeast run folder and
damaged copies of its files; the sizes are refused before anything is allocated, so each case
takes about as long as reading a run folder.
"""
from __future__ import annotations

import json
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from numpy.lib import format as npy

from spmlkit.cli import main

SPEC = "datasets: [yeast]\nmethods: [an]\nepochs: 1\nseeds: 1\n" \
       "grid: {lr: [1.0e-3], batch_size: [16]}\n"


def _npy_claiming(path, shape, dtype="<f4"):
    """A .npy file whose header claims ``shape`` and which holds 64 bytes of data."""
    with open(path, "wb") as fh:
        npy.write_array_header_1_0(fh, {"descr": dtype, "fortran_order": False,
                                        "shape": shape})
        fh.write(b"\0" * 64)


def _edit_json(path, **changes):
    config = json.loads(path.read_text())
    for key, value in changes.items():
        node = config
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    path.write_text(json.dumps(config))


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad_input")
    assert main(["train", "--epochs", "1", "--quiet", "--save-train-probs", "--out",
                 str(d / "runs")]) == 0
    run = d / "runs" / "yeast-an-1p-s0"
    rng = np.random.RandomState(0)
    np.save(d / "x103.npy", rng.rand(4, 103).astype(np.float32))
    np.save(d / "x.npy", rng.rand(20, 5).astype(np.float32))
    y = np.zeros((20, 3), np.uint8)
    y[np.arange(20), np.arange(20) % 3] = 1
    np.save(d / "y.npy", y)
    _npy_claiming(d / "huge.npy", (10**12, 103))
    _npy_claiming(d / "hugey.npy", (10**11, 3), "|u1")
    _npy_claiming(d / "member.npy", (10**12, 103))
    import zipfile

    with zipfile.ZipFile(d / "hugez.npz", "w") as z:
        z.write(d / "member.npy", "features.npy")
    specs = d / "specs"
    specs.mkdir()
    (specs / "seeds.yaml").write_text(SPEC.replace("seeds: 1", "seeds: 1000000000"))
    lrs = ", ".join(f"{1e-4 * (1 + i / 3000):.8g}" for i in range(3000))
    bss = ", ".join(str(i + 1) for i in range(3000))
    (specs / "grid.yaml").write_text("datasets: [yeast]\nmethods: [an]\nepochs: 1\nseeds: 1\n"
                                     f"grid: {{lr: [{lrs}], batch_size: [{bss}]}}\n")
    (specs / "utf16.yaml").write_bytes(SPEC.encode("utf-16-le"))  # no byte-order mark
    (specs / "latin1.yaml").write_bytes(("title: caf\xe9\n" + SPEC).encode("latin-1"))
    (specs / "dup.yaml").write_text(SPEC + "epochs: 2\n")
    (specs / "dup2.yaml").write_text(SPEC.replace("grid: {lr: [1.0e-3], batch_size: [16]}",
                                                  "grid:\n  lr: [1.0e-3]\n  lr: [1.0e-2]"))
    levels = "".join(f"{c}: &{c} [{','.join(['*' + p] * 9)}], "
                     for p, c in zip("abcdefgh", "bcdefghi"))
    (specs / "bomb.yaml").write_text(SPEC + "description: {a: &a [x,x,x,x,x,x,x,x,x], "
                                     + levels + "}\n")
    (specs / "deep.yaml").write_text("datasets: " + "[" * 5000 + "]" * 5000 + "\n")
    (specs / "label.yaml").write_text(SPEC.replace("methods: [an]",
                                                   "methods: [{label: ../../lab, spec: an}]"))
    broken = {
        "pgarb": lambda f: (f / "predictions.npz").write_bytes(b"garbage" * 30),
        "pkey": lambda f: (np.savez(f / "predictions.npz", y_test=np.zeros((3, 14))),
                           (f / "thresholds.json").unlink()),
        "pshape": lambda f: np.savez(f / "predictions.npz", **{
            k: np.zeros(3) for k in np.load(run / "predictions.npz").files}),
        "tgarb": lambda f: (f / "thresholds.json").write_text("{not json"),
        "tlist": lambda f: (f / "thresholds.json").write_text("[0.5]"),
        "tstr": lambda f: (f / "thresholds.json").write_text('{"global": "abc"}'),
        "t7": lambda f: (f / "thresholds.json").write_text('{"global": 7}'),
        "tnone": lambda f: (f / "thresholds.json").write_text('{"per_class": []}'),
        "tnan": lambda f: (f / "thresholds.json").write_text(
            '{"global": 0.5, "per_class": ' + json.dumps([float("nan")] * 14) + "}"),
        "cmode": lambda f: _edit_json(f / "config.json", mode=5),
        "ctrain": lambda f: (_edit_json(f / "config.json", train="abc"),
                             (f / "final.json").unlink()),
        "cepochs": lambda f: (_edit_json(f / "config.json", **{"train.epochs": "abc"}),
                              (f / "final.json").unlink()),
        "ccls": lambda f: _edit_json(f / "config.json", class_names=3),
        "chp": lambda f: (_edit_json(f / "config.json", hparams=[1]),
                          (f / "final.json").unlink()),
        "clist": lambda f: (f / "config.json").write_text("[1]"),
        "mstr": lambda f: (f / "metrics.jsonl").write_text(
            '{"epoch": 1, "val_map": "x", "train_loss": 1}\n'),
        "tphuge": lambda f: _npy_claiming(f / "train_probs.npy", (10**6, 10**6, 14), "<f2"),
        "obgarb": lambda f: (f / "observed.npy").write_bytes(b"garbage" * 30),
    }
    for name, edit in broken.items():
        shutil.copytree(run, d / name)
        edit(d / name)
    return {"d": str(d), "run": str(run)}


STUDY = "study run --jobs 1 --quiet "
FLAGS = "--datasets yeast --methods an --set epochs=1 grid.lr=[1e-3] grid.batch_size=[16] "


def case(argv, prog, expect, left=None, cid=None):
    cid = cid or argv.replace("{d}/", "").replace("{run}", "RUN").replace(" --quiet", "")
    return pytest.param(argv, prog, expect, left, id=cid[:70])


CASES = [
    # ---- sizes: refused before anything is allocated
    case(STUDY + "{d}/specs/seeds.yaml --out {d}/o/s1", "spml study run",
         "seeds: 1000000000 seeds: a study has at most 100000 runs", "o/s1", "spec seeds 1e9"),
    case(STUDY + "--datasets yeast --methods an --set seeds=100000000 --out {d}/o/s2",
         "spml study run", "seeds: 100000000 seeds: a study has at most", "o/s2", "--set seeds"),
    case(STUDY + "{d}/specs/grid.yaml --out {d}/o/s3", "spml study run",
         "the study expands to 9000000 runs (1 dataset(s), 1 method(s), 1 seed(s), "
         "grid.lr: 3000, grid.batch_size: 3000)", "o/s3", "grid 3000x3000"),
    case("benchmark --epochs 1 --seeds 1000000000 --losses an --no-references --jobs 1 --quiet "
         "--out {d}/o/b1", "spml benchmark", "a study has at most 100000 runs", "o/b1",
         "benchmark seeds 1e9"),
    case("predict {run} {d}/huge.npy", "spml predict", "huge.npy: its header claims an array of "
         "shape (1000000000000, 103) (float32, 374.7 TiB) but the file holds 64 bytes"),
    case("predict {run} {d}/hugez.npz", "spml predict",
         "hugez.npz, array 'features': its header claims an array of shape"),
    case("train --epochs 1 --quiet --out {d}/o/t1 --dataset arrays --data features={d}/x.npy "
         "--data labels={d}/hugey.npy", "spml train", "hugey.npy: its header claims", None,
         "train labels header 1e11"),
    case("analyze histograms {d}/tphuge --out {d}/o/h.png", "spml analyze histograms",
         "train_probs.npy: its header claims an array of shape (1000000, 1000000, 14)"),
    case("figure histograms {run} --bins 10000000000 --out {d}/o/h.png",
         "spml figure histograms", "argument --bins: expected a whole number >= 1 and <= 100000"),
    case("analyze histograms {run} --bins 10000000000 --out {d}/o/h.png",
         "spml analyze histograms",
         "argument --bins: expected a whole number >= 1 and <= 100000", cid="analyze bins 1e10"),
    case("figure landscape {run} --steps 100000 --out {d}/o/l.png", "spml figure landscape",
         "steps must be a whole number in [2, 1001]"),
    case("train --epochs 1000000000 --save-train-probs --quiet --out {d}/o/tp", "spml train",
         "epochs=1000000000 is more than 100,000: a run that long never finishes",
         "o/tp/yeast-an-1p-s0", cid="save-train-probs 1e9 epochs"),
    # ---- a received run folder with a damaged file: the file and the key are named
    case("analyze ap-diff {run} {d}/pgarb --out {d}/o/a.png", "spml analyze ap-diff",
         "pgarb/predictions.npz: not a readable .npy or .npz file"),
    case("predict {d}/pkey {d}/x103.npy", "spml predict",
         "pkey/predictions.npz lacks the array(s) ['probs_val', 'y_val']"),
    case("analyze ap-diff {run} {d}/pshape --out {d}/o/a.png", "spml analyze ap-diff",
         "pshape/predictions.npz: probs_test has shape (3,)"),
    case("predict {d}/tgarb {d}/x103.npy", "spml predict", "tgarb/thresholds.json: not valid JSON"),
    case("predict {d}/tlist {d}/x103.npy", "spml predict",
         "tlist/thresholds.json: expected a JSON object with 'global' and 'per_class', got list"),
    case("predict {d}/tstr {d}/x103.npy", "spml predict",
         "tstr/thresholds.json: 'global' must be a number in [0, 1], got 'abc'"),
    case("predict {d}/t7 {d}/x103.npy", "spml predict",
         "t7/thresholds.json: 'global' must be a number in [0, 1], got 7"),
    case("predict {d}/tnone {d}/x103.npy", "spml predict",
         "tnone/thresholds.json: 'global' must be a number in [0, 1], got None"),
    case("predict {d}/tnan {d}/x103.npy --threshold per-class", "spml predict",
         "tnan/thresholds.json: 'per_class' must be a list of numbers (one per class) in "
         "[0, 1], got [nan"),
    case("predict {d}/cmode {d}/x103.npy", "spml predict",
         "cmode/config.json: 'mode' must be a string, got 5"),
    case("train --resume {d}/ctrain --quiet", "spml train",
         "ctrain/config.json: 'train' must be an object, got 'abc'"),
    case("train --resume {d}/cepochs --quiet", "spml train",
         "cepochs/config.json: 'train.epochs' must be a whole number, got 'abc'"),
    case("predict {d}/ccls {d}/x103.npy", "spml predict",
         "ccls/config.json: 'class_names' must be a list, got 3"),
    case("train --resume {d}/chp --quiet", "spml train",
         "chp/config.json: 'hparams' must be an object, got [1]"),
    case("figure curves {d}/clist --out {d}/o/c.png", "spml figure curves",
         "clist/config.json: expected a JSON object, got list"),
    case("figure curves {d}/mstr --out {d}/o/c.png", "spml figure curves",
         "mstr/metrics.jsonl, line 1: 'val_map' must be a number, got 'x'"),
    case("figure landscape {d}/obgarb --out {d}/o/l.png", "spml figure landscape",
         "obgarb/observed.npy: not a readable .npy or .npz file"),
    # ---- spec files
    case(STUDY + "{d}/specs/utf16.yaml --out {d}/o/e1", "spml study run",
         "utf16.yaml: holds NUL characters, not a text file (UTF-16 without a byte-order mark?)",
         "o/e1"),
    case(STUDY + "{d}/specs/latin1.yaml --out {d}/o/e2", "spml study run",
         "latin1.yaml: not UTF-8 text (byte b'\\xe9' at offset 10)", "o/e2"),
    case(STUDY + "{d}/specs/dup.yaml --out {d}/o/e3", "spml study run",
         "dup.yaml, line 6: not valid YAML (the key 'epochs' is given twice (lines 3 and 6)",
         "o/e3"),
    case(STUDY + "{d}/specs/dup2.yaml --out {d}/o/e4", "spml study run",
         "the key 'lr' is given twice (lines 6 and 7)", "o/e4"),
    case(STUDY + "{d}/specs/bomb.yaml --out {d}/o/e5", "spml study run",
         "bomb.yaml: holds more than 1000000 values", "o/e5"),
    case(STUDY + "{d}/specs/deep.yaml --out {d}/o/e6", "spml study run",
         "deep.yaml: nested too deeply", "o/e6"),
    # ---- names are slugs: no run folder outside --out
    case("train --epochs 1 --quiet --out {d}/o/n1/runs --dataset arrays --data "
         "features={d}/x.npy --data labels={d}/y.npy --data name=../../escaped", "spml train",
         "option name='../../escaped': a dataset's name names its run folders, so it is a slug",
         "o/escaped-an-1p-s0", "--data name=../../x"),
    case("train --epochs 1 --quiet --out {d}/o/n2 --dataset arrays --data features={d}/x.npy "
         "--data labels={d}/y.npy --data name={d}/o/abs", "spml train", "is a slug",
         "o/abs-an-1p-s0", "--data name=/abs"),
    case(STUDY + FLAGS + "--name ../../esc --out {d}/o/n3", "spml study run",
         "name: expected a folder-safe name", "o/n3", "study --name ../x"),
    # ---- a refused launch leaves no study folder
    case(STUDY.replace("--jobs 1", "--jobs 0") + FLAGS + "--out {d}/o/j0", "spml study run",
         "jobs (worker processes) must be >= 1, got 0", "o/j0", "--jobs 0"),
    case(STUDY + FLAGS + "--scheduler-file {d}/nofile.json --out {d}/o/j1", "spml study run",
         "nofile.json", "o/j1", "--scheduler-file missing"),
]


@pytest.mark.parametrize("argv, prog, expect, left", CASES)
def test_bad_input_is_one_clear_line_and_leaves_nothing(argv, prog, expect, left, ws, capsys,
                                                        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    try:
        code = main(shlex.split(argv.format(**ws)))
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("usage: "):  # argparse's own refusal: its usage
        lines = [line for line in lines if ": error: " in line]  # lines, then the one error
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    assert expect.format(**ws) in lines[0], err
    assert time.perf_counter() - t0 < 60  # refused, not computed
    if left is not None:
        assert not (Path(ws["d"]) / left).exists(), f"{left} left behind"


def test_a_utf16_spec_with_a_byte_order_mark_reads_as_its_utf8_text(tmp_path):
    from spmlkit.experiments.study import load_study

    (tmp_path / "a.yaml").write_text(SPEC, encoding="utf-8")
    (tmp_path / "b.yaml").write_bytes(SPEC.encode("utf-16"))
    (tmp_path / "c.yaml").write_bytes(SPEC.encode("utf-8-sig"))
    a, b, c = (load_study(tmp_path / f"{n}.yaml") for n in "abc")
    same = {"name": "x", "title": "x"}
    assert a.to_dict() | same == b.to_dict() | same == c.to_dict() | same


def test_a_results_store_that_is_a_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(shlex.split(STUDY + FLAGS + f"--seeds 1 --out {out}")) == 0
    (out / "results.sqlite").unlink()
    for extra in ("results.sqlite-wal", "results.sqlite-shm"):
        (out / extra).unlink(missing_ok=True)
    (out / "results.sqlite").mkdir()
    capsys.readouterr()
    for action in ("status", "table"):  # was: "0 done", exit 0
        assert main(["study", action, str(out)]) == 2
        assert "results.sqlite is a folder, not a results store" in capsys.readouterr().err
    assert main(shlex.split(STUDY + f"{out} --out {out}")) == 2
    assert "results.sqlite is a folder" in capsys.readouterr().err


@pytest.mark.slow
def test_a_killed_launch_leaves_a_true_record_and_no_empty_stale_folder(tmp_path):
    """A study killed (SIGKILL) after some runs are stored: ``launches.jsonl`` counts the runs
    stored (it said ``runs_run: 0``); the next launch removes the killed run's folder and
    leaves no empty ``runs/.stale/`` (it did)."""
    out = tmp_path / "study"
    spec = tmp_path / "kill.yaml"
    # runs of a second or so (30 epochs took 0.25 s: the kill could land between two runs)
    spec.write_text("datasets: [yeast]\nmethods: [an, bce]\nepochs: 150\nseeds: 3\n"
                    "grid: {lr: [1.0e-3], batch_size: [16]}\n")
    proc = subprocess.Popen([sys.executable, "-m", "spmlkit", "study", "run", str(spec),
                             "--out", str(out), "--jobs", "1", "--quiet", "--no-vectorise"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stored():
        try:
            with sqlite3.connect(f"file:{out / 'results.sqlite'}?mode=ro", uri=True) as con:
                return con.execute("select count(*) from runs").fetchone()[0]
        except sqlite3.Error:
            return 0
    def training():  # a run folder with an epoch logged and no final.json
        return [p for p in (out / "runs").glob("*/metrics.jsonl")
                if p.stat().st_size and not (p.parent / "final.json").exists()]
    try:
        deadline = time.monotonic() + 240
        while (stored() < 2 or not training()) and proc.poll() is None and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the study finished before it could be killed"
        time.sleep(0.1)  # the launch record is written right after each stored row
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    n = stored()
    assert 2 <= n < 6
    launch = [json.loads(line) for line in (out / "launches.jsonl").read_text().splitlines()]
    assert launch[-1]["runs_run"] >= n - 1 and launch[-1]["runs_run"] >= 1
    assert launch[-1]["finished"] is None
    killed = [p.name for p in (out / "runs").iterdir()
              if p.is_dir() and not (p / "final.json").exists()]
    assert killed  # the run it was training
    assert main(["study", "run", str(out), "--out", str(out), "--jobs", "1", "--quiet",
                 "--no-vectorise"]) == 0
    assert stored() == 6
    assert not (out / "runs" / ".stale").exists()
    assert all((out / "runs" / name / "final.json").is_file() for name in killed)


def test_a_study_whose_runs_folder_is_a_file_is_refused_before_any_run(tmp_path, capsys):
    out = tmp_path / "study"
    out.mkdir()
    (out / "launches.jsonl").write_text("")  # a study folder (one of other files is refused)
    (out / "runs").write_text("not a folder\n")
    assert main(shlex.split(STUDY + FLAGS + f"--seeds 1 --out {out}")) == 2
    (line,) = capsys.readouterr().err.splitlines()  # was: every run failed with that reason
    assert line == f"spml study run: error: {out / 'runs'}: is a file, where a folder is needed"
