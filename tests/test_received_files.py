"""Files someone hands a user (a run folder, a study spec, a config, a feature store): what an
audit of crafted and damaged files found. Each is refused with one line naming the file, before
memory is spent on it, or drawn and printed as written."""
from __future__ import annotations

import io
import json
import shutil
import zipfile

import numpy as np
import pytest
import torch
from numpy.lib import format as npy

from spmlkit.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("received")
    assert main(["train", "--epochs", "2", "--out", str(base / "runs"), "--quiet"]) == 0
    (folder,) = (base / "runs").iterdir()
    np.save(base / "x.npy", np.zeros((5, 103), dtype=np.float32))
    return folder, base / "x.npy"


def _copy(run, tmp_path):
    return shutil.copytree(run, tmp_path / "run")


def _npy_bytes(shape, dtype="<f4", version=(1, 0), data=b""):
    fh = io.BytesIO()
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    write = {(1, 0): npy.write_array_header_1_0, (2, 0): npy.write_array_header_2_0}
    if version in write:
        write[version](fh, header)
    else:  # numpy writes 3.0 for non-ASCII field names only: the 2.0 layout, its magic
        npy.write_array_header_2_0(fh, header)
        raw = bytearray(fh.getvalue())
        raw[6:8] = bytes(version)
        fh = io.BytesIO(bytes(raw))
        fh.seek(0, 2)
    fh.write(data)
    return fh.getvalue()


def test_a_version_3_header_is_checked_too(run, tmp_path, capsys):
    (tmp_path / "v3.npy").write_bytes(_npy_bytes((10 ** 12, 103), version=(3, 0),
                                                 data=b"\0" * 64))
    assert main(["predict", str(run[0]), str(tmp_path / "v3.npy")]) == 2
    assert "v3.npy: its header claims an array of shape (1000000000000, 103)" in \
        capsys.readouterr().err


def test_every_member_of_an_npz_is_checked(run, tmp_path, capsys):
    folder = _copy(run[0], tmp_path)
    with zipfile.ZipFile(folder / "predictions.npz", "a") as zf:
        zf.writestr("zzz", _npy_bytes((10 ** 12,), "<f8"))  # no .npy suffix: numpy loads it
    assert main(["figure", "calibration", str(folder), "--out", str(tmp_path / "c.png")]) == 2
    assert "predictions.npz, array 'zzz': its header claims" in capsys.readouterr().err


def test_a_compression_bomb_is_refused_by_its_expansion(run, tmp_path, capsys, monkeypatch):
    """A few MB of zeros that unpack to gigabytes: the limit is lowered for the test (a real
    bomb would need one written here)."""
    import spmlkit.safe_load as safe_load

    monkeypatch.setattr(safe_load, "BIG_MEMBER", 1 << 20)
    folder = _copy(run[0], tmp_path)
    zeros = np.zeros((600_000, 14), dtype=np.float32)          # 33.6 MB of zeros
    with zipfile.ZipFile(folder / "predictions.npz", "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("probs_test.npy", "w") as fh:
            np.lib.format.write_array(fh, zeros)
    assert main(["figure", "calibration", str(folder), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert "member 'probs_test.npy' unpacks to 32.0 MiB from" in err and "compression bomb" in err
    best = torch.load(folder / "best.pt", weights_only=True)
    best["extra"] = torch.zeros(2 ** 20)
    torch.save(best, folder / "plain.pt")
    with zipfile.ZipFile(folder / "plain.pt") as src, \
            zipfile.ZipFile(folder / "best.pt", "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert main(["predict", str(folder), str(run[1])]) == 2
    assert "best.pt: member" in capsys.readouterr().err


def test_a_config_of_aliases_is_refused_quickly(tmp_path, capsys):
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    lines.append("epochs: *a8")
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    assert main(["train", "--config", str(tmp_path / "bomb.yaml")]) == 2
    assert "holds more than" in capsys.readouterr().err


def test_a_checkpoint_whose_class_names_do_not_fit_is_refused(run, tmp_path, capsys):
    """class_names shortened in best.pt: predict wrote 14 probabilities under one name."""
    folder = _copy(run[0], tmp_path)
    best = torch.load(folder / "best.pt", weights_only=True)
    for edit, message in (({"class_names": ["a"]}, "are not a list of 14 names"),
                          ({"class_names": ["a", "b", "c"], "num_classes": 3},
                           "the model has 14 outputs but num_classes is 3"),
                          ({"head": "mlp"}, "not a checkpoint this spmlkit can read")):
        torch.save({**best, **edit}, folder / "best.pt")
        assert main(["predict", str(folder), str(run[1]), "--out",
                     str(tmp_path / "p.csv")]) == 2
        assert message in capsys.readouterr().err, edit
        assert not (tmp_path / "p.csv").exists()


def test_an_mlp_heads_outputs_are_checked_against_its_class_names(tmp_path, capsys):
    assert main(["train", "--epochs", "2", "--option", "head=mlp", "--option", "hidden=8",
                 "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (folder,) = (tmp_path / "runs").iterdir()
    np.save(tmp_path / "x.npy", np.zeros((3, 103), dtype=np.float32))
    best = torch.load(folder / "best.pt", weights_only=True)
    torch.save({**best, "class_names": best["class_names"][:3], "num_classes": 3},
               folder / "best.pt")
    capsys.readouterr()
    assert main(["predict", str(folder), str(tmp_path / "x.npy")]) == 2
    assert "best.pt: the model has 14 outputs but num_classes is 3" in capsys.readouterr().err


@pytest.mark.parametrize("k", [-3, 0, "x", None, True])
def test_the_runs_k_for_a_threshold_rule_is_checked(run, tmp_path, capsys, k):
    folder = _copy(run[0], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "k": k}))
    assert main(["predict", str(folder), str(run[1]), "--threshold-rule", "rcut"]) == 2
    err = capsys.readouterr().err
    assert "config.json" in err and ("the run's k is" in err or "'k' must be" in err), err


def test_damaged_json_names_its_file(run, tmp_path, capsys):
    folder = _copy(run[0], tmp_path)
    (folder / "config.json").write_bytes(b"\xff\xfe{}")
    assert main(["predict", str(folder), str(run[1])]) == 2
    assert "config.json: not a text file" in capsys.readouterr().err
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["predict", str(folder), str(run[1])]) == 2
    assert "config.json: nested too deeply" in capsys.readouterr().err


def test_dollar_signs_in_names_are_drawn_as_written(run, tmp_path):
    """matplotlib read "$...$" from a config's loss or class names as math: a name it could
    not parse stopped the figure."""
    folder = _copy(run[0], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "loss": r"$\bad$"}))
    assert main(["figure", "curves", str(folder), "--out", str(tmp_path / "c.png")]) == 0


def test_a_spec_with_terminal_escapes_is_refused(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text('name: s\ndatasets: [yeast]\nmethods: [an]\n'
                                     'title: "\\e[31mRED\\e]0;pwned\\a"\n')
    assert main(["study", "run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "title: holds the control character(s)" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_damaged_sklearn_reference_names_its_file(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "run", "smoke", "--out", str(out), "--jobs", "1", "--quiet",
                 "--set", "epochs=1", "methods=[an]"]) == 0
    for text in ('{"a": 1}', '[{"loss": "x"}]'):
        (out / "sklearn-reference.json").write_text(text)
        capsys.readouterr()
        assert main(["study", "table", str(out)]) == 2
        assert "sklearn-reference.json: not the JSON spml wrote" in capsys.readouterr().err


def test_a_report_reads_past_odd_launch_lines(tmp_path, capsys):
    """launches.jsonl lines whose versions or argv are not what spml wrote stopped the
    report with a traceback."""
    out = tmp_path / "study"
    assert main(["study", "run", "smoke", "--out", str(out), "--jobs", "1", "--quiet",
                 "--set", "epochs=1", "methods=[an]"]) == 0
    with open(out / "launches.jsonl", "a") as fh:
        fh.write('{"versions": [1, 2], "argv": 5}\n')
    assert main(["report", str(out), "--out", str(tmp_path / "r.html")]) == 0
    assert "5" in (tmp_path / "r.html").read_text()


def test_a_study_export_csv_does_not_hand_a_spreadsheet_a_formula(tmp_path):
    import csv

    (tmp_path / "s.yaml").write_text(
        "name: s\ndatasets: [yeast]\nmethods: [{label: '=HYPERLINK(\"http://x\",\"y\")', "
        "spec: an}]\nseeds: 1\nepochs: 1\ngrid: {batch_size: [16], lr: [1.0e-2]}\n")
    out = tmp_path / "study"
    assert main(["study", "run", str(tmp_path / "s.yaml"), "--out", str(out), "--jobs", "1",
                 "--quiet"]) == 0
    assert main(["study", "export", str(out), "--format", "csv", "--output",
                 str(tmp_path / "rows.csv")]) == 0
    (row,) = list(csv.DictReader((tmp_path / "rows.csv").open()))
    assert row["method"] == "'=HYPERLINK(\"http://x\",\"y\")" and float(row["lr"]) == 0.01
