"""Resource limits and the small bad inputs of issue 30, each one line from the command line:
read-only and full disks, compressed tables that inflate past memory or end early, sizes asked
for that cannot fit, and the stores, weights and names that used to pass silently."""
from __future__ import annotations

import gzip
import io
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from spmlkit.cli import main

ROOT = os.geteuid() == 0


def _mount(path, options):
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    return path


@pytest.fixture
def tmpfs(tmp_path):
    """``make(name, size)``: a small tmpfs under tmp_path (root only), unmounted at the end."""
    if not ROOT or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mounted = []

    def make(name, size="20m"):
        mounted.append(_mount(tmp_path / name, f"size={size}"))
        return mounted[-1]
    yield make
    for m in mounted:
        subprocess.run(["umount", "-l", str(m)], check=False)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("limits") / "study"
    assert main(["study", "run", "smoke", "--out", str(out), "--jobs", "1", "--quiet", "--set",
                 "epochs=1", "methods=[an]"]) == 0
    return out


def test_a_study_on_a_read_only_disk_reads(study, tmpfs, tmp_path, capsys):
    disk = tmpfs("ro")
    shutil.copytree(study, disk / "study")
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    ro = disk / "study"
    before = sorted(os.listdir(ro))
    assert main(["study", "status", str(ro)]) == 0
    assert "1 runs: 1 done" in capsys.readouterr().out
    assert main(["study", "table", str(ro)]) == 0
    assert main(["study", "export", str(ro), "--format", "csv", "--output",
                 str(tmp_path / "x.csv")]) == 0
    assert main(["report", str(ro), "--out", str(tmp_path / "r.html")]) == 0
    assert sorted(os.listdir(ro)) == before
    capsys.readouterr()
    assert main(["report", str(ro)]) == 2  # its default page is in the read-only folder
    assert f"{ro / 'report.html'}: Read-only file system" in capsys.readouterr().err


def test_a_full_disk_names_the_file(tmpfs, capsys):
    disk = tmpfs("full", "2m")
    # --save-train-probs memory-maps its epochs (500 x 1,450 x 14 float16: 20 MiB): reserved
    # first, so an error naming the file and not a SIGBUS in the middle of training
    code = main(["train", "--epochs", "500", "--save-train-probs", "--out", str(disk),
                 "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device (this file needs" in err and \
        "train_probs.npy" in err, err
    # a smaller disk: the run's first file that does not fit is named (numpy says only
    # "N requested and M written" for an .npy cut short: said as the full disk it is)
    for size in ("40k", "80k"):
        tiny = tmpfs(f"tiny{size}", size)
        code = main(["train", "--epochs", "1", "--out", str(tiny), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and f"{tiny / 'yeast-an-1p-s0'}/" in err and \
            "No space left on device" in err, err
    assert not [n for p, _, names in os.walk(disk) for n in names if n.endswith(".tmp")]


def test_a_full_disk_under_a_study_is_not_damage(tmpfs, capsys):
    disk = tmpfs("full", "120k")
    code = main(["study", "run", "smoke", "--out", str(disk / "s"), "--jobs", "1", "--quiet",
                 "--set", "epochs=1"])
    err = capsys.readouterr().err
    assert code in (1, 2) and "damaged" not in err


def _features_and_labels(folder, n=40):
    rng = np.random.default_rng(0)
    rows = "".join(f"{a:.3f},{b:.3f},c{i % 3}\n" for i, (a, b) in enumerate(rng.random((n, 2))))
    return b"f1,f2,labels\n" + rows.encode()


def _train_table(path):
    return main(["train", "--solver", "adam", "--dataset", "tabular", "--data", f"path={path}",
                 "--data", "labels=labels", "--epochs", "1", "--out", str(path.parent / "runs"),
                 "--quiet"])


def test_a_compressed_table_that_inflates_past_memory(tmp_path, capsys, monkeypatch):
    import spmlkit.resources as resources

    path = tmp_path / "t.csv.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(_features_and_labels(tmp_path, 20000))
    monkeypatch.setattr(resources, "memory_budget", lambda: 600_000)  # as if memory were short
    assert _train_table(path) == 2
    err = capsys.readouterr().err
    assert f"{path}: inflates to more than 97.7 KiB" in err and "decompression bomb" in err
    assert not (tmp_path / "runs").exists()
    monkeypatch.undo()
    assert _train_table(path) == 0  # the same file, with the memory there is


def test_a_zipped_table_is_bounded_as_the_others(tmp_path, capsys, monkeypatch):
    """.zip went to pandas unbounded (a zip bomb filled memory); now its one file is read
    through the same bound, and an archive of several files or none is named."""
    import zipfile

    import spmlkit.resources as resources

    path = tmp_path / "t.csv.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("t.csv", _features_and_labels(tmp_path, 20000))
    monkeypatch.setattr(resources, "memory_budget", lambda: 600_000)
    assert _train_table(path) == 2
    assert f"{path}: inflates to more than 97.7 KiB" in capsys.readouterr().err
    monkeypatch.undo()
    assert _train_table(path) == 0
    two = tmp_path / "two.csv.zip"
    with zipfile.ZipFile(two, "w") as z:
        z.writestr("a.csv", "f1\n1\n")
        z.writestr("b.csv", "f1\n1\n")
    assert _train_table(two) == 2
    assert "a zipped table holds one file, this archive 2 (a.csv, b.csv)" in \
        capsys.readouterr().err


def test_a_zstd_table_names_what_reads_it(tmp_path, capsys):
    pytest.importorskip("pandas")
    try:
        import zstandard
    except ModuleNotFoundError:
        path = tmp_path / "t.csv.zst"
        path.write_bytes(b"\x28\xb5\x2f\xfd")
        assert _train_table(path) != 0
        assert "reading a .zst table needs the zstandard package" in capsys.readouterr().err
        return
    path = tmp_path / "t.csv.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(_features_and_labels(tmp_path)))
    assert _train_table(path) == 0


def test_a_truncated_compressed_table(tmp_path, capsys):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as fh:
        fh.write(_features_and_labels(tmp_path, 3000))
    path = tmp_path / "t.csv.gz"
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    assert _train_table(path) == 2
    assert f"{path}: the compressed file is truncated" in capsys.readouterr().err


def test_sizes_that_cannot_fit_are_refused_before_allocating(tmp_path, capsys):
    from PIL import Image

    (tmp_path / "tree" / "cat").mkdir(parents=True)
    (tmp_path / "tree" / "dog").mkdir(parents=True)
    for name in ("cat", "dog"):
        Image.new("RGB", (8, 8)).save(tmp_path / "tree" / name / "a.png")
    assert main(["extract", "--dataset", "folder", "--data", f"root={tmp_path / 'tree'}",
                 "--backbone", "tiny_cnn", "--random-init", "--cache-dir", str(tmp_path / "c"),
                 "--workers", "0", "--size", "1000000", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "one 1000000 x 1000000 input image" in err and "give a smaller --size" in err
    assert main(["train", "--head", "mlp", "--hidden", "100000000", "--epochs", "1", "--out",
                 str(tmp_path / "runs"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "an MLP head with hidden=100000000" in err and "give a smaller --hidden" in err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit) as stop:  # (argparse reads --epochs by TrainConfig's rule)
        main(["train", "--epochs", str(10**12), "--out", str(tmp_path / "runs"), "--quiet"])
    assert stop.value.code == 2
    assert "epochs=1000000000000 is more than 100,000" in capsys.readouterr().err
    assert main(["study", "run", "smoke", "--out", str(tmp_path / "s"), "--quiet", "--set",
                 f"epochs={10**12}"]) != 0
    assert "is more than 100,000" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--threads", "100000", "--out", str(tmp_path / "runs")])
    assert "--threads: expected a whole number >= 1 and <=" in capsys.readouterr().err


def test_a_study_store_that_is_empty_dangling_or_edited(study, tmp_path, capsys):
    zero = shutil.copytree(study, tmp_path / "zero")
    (zero / "results.sqlite").write_bytes(b"")
    assert main(["study", "status", str(zero)]) == 2
    assert f"{zero / 'results.sqlite'} is empty (0 bytes)" in capsys.readouterr().err
    dangling = shutil.copytree(study, tmp_path / "dangling")
    (dangling / "results.sqlite").unlink()
    (dangling / "results.sqlite").symlink_to(tmp_path / "nowhere.sqlite")
    assert main(["study", "status", str(dangling)]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert not (tmp_path / "nowhere.sqlite").exists()
    edited = shutil.copytree(study, tmp_path / "edited")
    con = sqlite3.connect(edited / "results.sqlite")
    con.execute("UPDATE runs SET test_map = 'abc'")
    con.commit()
    con.close()
    assert main(["study", "table", str(edited)]) == 2
    assert "test_map is 'abc', not a number" in capsys.readouterr().err


def test_nan_weights_are_refused_not_predicted(tmp_path, capsys):
    import torch

    from spmlkit.loading import load_dataset

    assert main(["train", "--epochs", "1", "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    best = torch.load(run / "best.pt", weights_only=True)
    for v in best["model"].values():
        v.fill_(float("nan"))
    torch.save(best, run / "best.pt")
    np.save(tmp_path / "x.npy", load_dataset("yeast").test.x[:3])
    capsys.readouterr()
    assert main(["predict", str(run), str(tmp_path / "x.npy")]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'best.pt'}: the model's weights hold NaN or inf" in err


def test_small_bad_inputs_each_a_line(tmp_path, capsys):
    assert main(["benchmark", "--losses", "", "--seeds", "1", "--out", str(tmp_path / "b"),
                 "--quiet"]) == 2
    assert "no loss given ('': an empty --losses" in capsys.readouterr().err
    spec = tmp_path / "s.yaml"
    spec.write_text("name: v\ndatasets: [yeast]\nmethods: [epr]\nmode: linear\nepochs: 1\n"
                    "vary: {k: [true]}\n")
    assert main(["study", "run", str(spec), "--out", str(tmp_path / "s"), "--quiet"]) == 2
    assert "write the word in quotes, k: 'true'" in capsys.readouterr().err
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((40, 3)).astype(np.float32))
    (tmp_path / "y.csv").write_text("labels\n" + "".join(("a\0b" if i % 2 else "c") + "\n"
                                                         for i in range(40)))
    assert main(["train", "--dataset", "arrays", "--data", f"features={tmp_path / 'x.npy'}",
                 "--data", f"labels={tmp_path / 'y.csv'}", "--epochs", "1", "--out",
                 str(tmp_path / "runs"), "--quiet"]) == 2
    assert "holds a NUL byte or a line break" in capsys.readouterr().err
    np.save(tmp_path / "big.npy", np.full((40, 3), 1e38, dtype=np.float32))
    (tmp_path / "y2.csv").write_text("labels\n" + "".join(f"c{i % 3}\n" for i in range(40)))
    assert main(["train", "--dataset", "arrays", "--data", f"features={tmp_path / 'big.npy'}",
                 "--data", f"labels={tmp_path / 'y2.csv'}", "--out",
                 str(tmp_path / "runs2"), "--quiet"]) == 2  # solved (the default): refused
    assert "features with huge values" in capsys.readouterr().err


def test_the_store_module_still_imports_alone(tmp_path):
    """A worker may load store.py by itself (the standard library only)."""
    from spmlkit.experiments import store

    script = textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("store", {store.__file__!r})
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        s = mod.StudyStore({str(tmp_path / 'r.sqlite')!r})
        s.put({{"run_id": "a", "status": "done"}})
        print(len(s.rows()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.stdout.strip() == "1", out.stderr


def test_save_train_probs_bounded_before_the_run_folder(tmp_path, capsys, monkeypatch):
    from spmlkit.methods import linear

    monkeypatch.setattr(linear, "MAX_TRAIN_PROBS_BYTES", 2**20)  # 1 MiB, as a small disk
    assert main(["train", "--epochs", "30", "--save-train-probs", "--out", str(tmp_path / "r"),
                 "--quiet"]) == 2
    assert "save_train_probs: 30 epochs of 1354 x 14 train probabilities are 0.0 GiB, more " \
           "than the 0 GiB" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
