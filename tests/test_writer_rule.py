"""The one writer rule (DESIGN convention 13), per command that writes, from the command line.

An output the user names (``predict --out``, ``report --out``, ``figure --out``, ``study export
--output``, ``analyze --out``) never replaces an existing file without ``--force``, and never,
``--force`` or not, a device, a FIFO, a link, a folder, a run's or study's own file or the
command's input. Inside spmlkit's own folders (a study's ``.lock`` / ``launches.jsonl`` /
``results.sqlite`` / ``runs``, a feature store's files, a run folder's files) nothing is written
through a link or into a device or FIFO someone planted: the command stops and names it.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat

import numpy as np
import pytest

from spmlkit.cli import main

KINDS = ("device", "fifo", "link", "file")


def plant(path, kind):
    """Put a ``kind`` at ``path``; returns ``(watched path, its state)`` to compare after."""
    if kind == "device":
        if os.geteuid() != 0:
            pytest.skip("a device node needs root (os.mknod)")
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
        except PermissionError:
            pytest.skip("no permission to make a device node here")
        watched = path
    elif kind == "fifo":
        os.mkfifo(path)
        watched = path
    elif kind == "link":
        watched = path.parent.parent / f"victim-{path.name}"
        watched.write_text("the user's file\n")
        os.symlink(watched, path)
    elif kind == "folder":
        path.mkdir()
        watched = path
    else:
        path.write_text("the user's file\n")
        watched = path
    return watched, state(watched)


def state(path):
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), path.read_bytes() if stat.S_ISREG(st.st_mode) else None


def no_temporary_files(folder):
    return not [n for n in os.listdir(folder) if n.endswith(".tmp")]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A finished run, a finished study, new features to predict."""
    from spmlkit.loading import load_dataset

    base = tmp_path_factory.mktemp("writers")
    assert main(["train", "--epochs", "1", "--out", str(base / "runs"), "--quiet"]) == 0
    (run,) = (base / "runs").iterdir()
    assert main(["study", "run", "smoke", "--out", str(base / "study"), "--jobs", "1",
                 "--quiet", "--set", "epochs=1", "methods=[an]"]) == 0
    np.save(base / "new.npy", load_dataset("yeast").test.x[:5])
    return {"run": run, "study": base / "study", "new": base / "new.npy"}


# ---- outputs the user names --------------------------------------------------------------------
def _output_argv(command, w, out):
    return {"predict": ["predict", str(w["run"]), str(w["new"]), "--out", str(out)],
            "report": ["report", str(w["study"]), "--out", str(out)],
            "export": ["study", "export", str(w["study"]), "--format", "csv", "--output",
                       str(out)],
            "figure": ["figure", "curves", str(w["run"]), "--out", str(out)],
            "analyze": ["analyze", "ap-diff", str(w["run"]), str(w["run"]), "--out", str(out)],
            }[command]


SUFFIX = {"predict": ".csv", "report": ".html", "export": ".csv", "figure": ".png",
          "analyze": ".png"}
SAYS = {"device": "is a device, not a regular file", "fifo": "is a FIFO (named pipe)",
        "link": "is a symbolic link", "folder": "is a folder",
        "file": "exists; pass --force to replace it, or choose another name"}


@pytest.mark.parametrize("command", list(SUFFIX))
@pytest.mark.parametrize("kind", [*KINDS, "folder"])
def test_an_output_never_replaces_what_is_there(world, tmp_path, capsys, command, kind):
    out = tmp_path / "sub" / f"out{SUFFIX[command]}"
    out.parent.mkdir()
    watched, before = plant(out, kind)
    force = [] if kind == "file" else ["--force"]  # --force does not open the others
    capsys.readouterr()
    assert main([*_output_argv(command, world, out), *force]) == 2
    err = capsys.readouterr().err
    assert f"{out}: {SAYS[kind]}" in err and err.count("\n") == 1, err
    assert state(watched) == before
    assert sorted(os.listdir(out.parent)) == [out.name]  # no numbered copy, no temporary file
    if kind == "file":  # the user says so: replaced
        assert main([*_output_argv(command, world, out), "--force"]) == 0
        assert out.read_bytes() != before[1]


@pytest.mark.parametrize("own", ["best.pt", "config.json", "metrics.jsonl", "thresholds.json"])
def test_predict_never_replaces_the_runs_own_files(world, tmp_path, capsys, own):
    run = shutil.copytree(world["run"], tmp_path / "run")
    before = (run / own).read_bytes()
    assert main(["predict", str(run), str(world["new"]), "--out", str(run / own),
                 "--force"]) == 2
    err = capsys.readouterr().err
    assert f"{run / own}: is a file of spmlkit's own folder {run}" in err
    assert (run / own).read_bytes() == before
    assert main(["predict", str(run), str(world["new"])]) == 0  # the run still works


def test_predict_never_replaces_its_input(world, tmp_path, capsys):
    inp = str(shutil.copy(world["new"], tmp_path / "new.npy"))
    before = open(inp, "rb").read()
    assert main(["predict", str(world["run"]), inp, "--out", inp, "--force"]) == 2
    assert f"{inp}: is an input of this command" in capsys.readouterr().err
    assert open(inp, "rb").read() == before


@pytest.mark.parametrize("how", ["dot-relative", "input-dot-relative", "absolute",
                                 "through-a-linked-folder", "input-named-by-a-link"])
def test_predict_never_replaces_its_input_named_another_way(world, tmp_path, capsys,
                                                            monkeypatch, how):
    """The output is compared with the inputs as files, not as path strings: the input
    ``data/new.npy`` is not replaced through ``--out ./data/new.npy --force`` (or the input
    named ``./data/new.npy``), its absolute path, a linked folder on the way, or when the input
    was named through a link."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(world["new"], data / "new.npy")
    before = (data / "new.npy").read_bytes()
    monkeypatch.chdir(tmp_path)
    inp, out = "data/new.npy", {"dot-relative": "./data/new.npy",
                                "input-dot-relative": "data/new.npy",
                                "absolute": str(data / "new.npy"),
                                "through-a-linked-folder": "alias/new.npy",
                                "input-named-by-a-link": "data/new.npy"}[how]
    if how == "input-dot-relative":
        inp = "./data/new.npy"
    if how == "through-a-linked-folder":
        os.symlink(data, tmp_path / "alias")
    if how == "input-named-by-a-link":
        os.symlink(data / "new.npy", tmp_path / "link.npy")
        inp = "link.npy"
    assert main(["predict", str(world["run"]), inp, "--out", out, "--force"]) == 2
    assert "new.npy: is an input of this command" in capsys.readouterr().err
    assert (data / "new.npy").read_bytes() == before


def test_predict_never_replaces_an_image_of_an_input_folder(world, tmp_path, capsys):
    from PIL import Image

    (tmp_path / "imgs" / "sub").mkdir(parents=True)
    for name in ("a.png", "sub/b.jpg"):
        Image.new("RGB", (8, 8), (200, 10, 10)).save(tmp_path / "imgs" / name)
    image = tmp_path / "imgs" / "sub" / "b.jpg"
    before = image.read_bytes()
    assert main(["predict", str(world["run"]), str(tmp_path / "imgs"), "--out", str(image),
                 "--force"]) == 2
    assert f"{image}: is an input of this command" in capsys.readouterr().err
    assert image.read_bytes() == before


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_figure_is_never_written_through_a_planted_figures_link(world, tmp_path, capsys,
                                                                  force):
    """``spml figure`` without --out writes into the folder's own ``figures/``: a link planted
    there is refused, and the folder it points to gets nothing."""
    run = shutil.copytree(world["run"], tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "curves.png").write_text("the user's file\n")
    os.symlink(elsewhere, run / "figures")
    capsys.readouterr()
    assert main(["figure", "curves", str(run), *force]) == 2
    assert f"{run / 'figures'}: is a symbolic link where spmlkit keeps its own folder" in \
        capsys.readouterr().err
    assert os.listdir(elsewhere) == ["curves.png"]
    assert (elsewhere / "curves.png").read_text() == "the user's file\n"
    os.unlink(run / "figures")
    assert main(["figure", "curves", str(run)]) == 0 and (run / "figures" / "curves.png").is_file()


@pytest.mark.parametrize("name", ["results.sqlite", "results.sqlite-wal", "results.sqlite-shm",
                                  "sklearn-reference.json"])
def test_export_never_replaces_the_studys_store(world, tmp_path, capsys, name):
    study = shutil.copytree(world["study"], tmp_path / "study")
    if not (study / name).exists():  # a side file of the store, as SQLite leaves it
        (study / name).write_bytes(b"\0" * 32)
    before = (study / name).read_bytes()
    assert main(["study", "export", str(study), "--format", "csv", "--output",
                 str(study / name), "--force"]) == 2
    assert "is a file of spmlkit's own folder" in capsys.readouterr().err
    assert (study / name).read_bytes() == before
    assert main(["study", "status", str(study)]) == 0


def test_force_keeps_a_replaced_files_permissions(world, tmp_path):
    """--force replaced a private (0600) file with a world-readable one."""
    out = tmp_path / "private.csv"
    out.write_text("mine\n")
    os.chmod(out, 0o600)
    assert main(["predict", str(world["run"]), str(world["new"]), "--out", str(out),
                 "--force"]) == 0
    assert stat.S_IMODE(os.lstat(out).st_mode) == 0o600 and out.read_text() != "mine\n"


# ---- spmlkit's own folders, handed over with something planted ---------------------------------
@pytest.mark.parametrize("name", [".lock", "launches.jsonl", "results.sqlite",
                                  "results.sqlite-wal"])
@pytest.mark.parametrize("kind", ["device", "fifo", "link"])
def test_a_study_folder_with_something_planted(world, tmp_path, capsys, name, kind):
    study = shutil.copytree(world["study"], tmp_path / "f" / "study")
    if (study / name).exists():
        (study / name).unlink()
    watched, before = plant(study / name, kind)
    code = main(["study", "run", str(study), "--out", str(study), "--jobs", "1", "--quiet",
                 "--set", "epochs=1", "methods=[an,epr]"])
    err = capsys.readouterr().err
    assert code == 2 and f"{study / name}: is " in err and "never writes through" in err, err
    assert state(watched) == before
    assert not (study / "runs").exists() or len(os.listdir(study / "runs")) == 1  # no new run


def test_a_study_whose_runs_folder_is_a_link(world, tmp_path, capsys):
    study = shutil.copytree(world["study"], tmp_path / "study")
    shutil.move(study / "runs", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", study / "runs")
    before = sorted(os.listdir(tmp_path / "elsewhere"))
    assert main(["study", "run", str(study), "--out", str(study), "--jobs", "1", "--quiet",
                 "--set", "epochs=1", "methods=[an,epr]"]) == 2
    assert f"{study / 'runs'}: is a symbolic link" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "elsewhere")) == before


def test_a_study_run_folder_that_is_a_link_is_never_resumed_through(world, tmp_path, capsys):
    """A link planted at a study's runs/<run_id>: the run resumed through it, writing into
    the folder it leads to. It fails, naming the link; the folder there is untouched."""
    study = shutil.copytree(world["study"], tmp_path / "study")
    (run,) = [p for p in (study / "runs").iterdir() if p.is_dir()]
    (run / "final.json").unlink()
    with sqlite3.connect(study / "results.sqlite") as db:  # as if the launch had died
        db.execute("DELETE FROM runs")
    shutil.move(run, tmp_path / "victim")
    os.symlink(tmp_path / "victim", run)
    before = {p.name: p.read_bytes() for p in (tmp_path / "victim").iterdir()}
    assert main(["study", "run", str(study), "--out", str(study), "--jobs", "1", "--quiet",
                 "--no-vectorise"]) == 1
    assert f"{run}: is a symbolic link" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (tmp_path / "victim").iterdir()} == before


def test_a_users_study_yaml_is_never_taken_for_a_study_folder(tmp_path, capsys):
    """`spml study run study.yaml --out .`: the folder of the user's spec was taken for a
    study folder (its study.yaml), and the spec replaced by the resolved one."""
    spec = tmp_path / "study.yaml"
    text = ("# my spec: keep epochs at 25!\nname: mine\ndatasets: [yeast]\nmethods: [an]\n"
            "seeds: 1\nepochs: 25\ngrid: {batch_size: [16], lr: [1.0e-2]}\n")
    spec.write_text(text)
    assert main(["study", "run", str(spec), "--out", str(tmp_path), "--set", "epochs=1",
                 "--jobs", "1", "--quiet"]) == 2
    assert "holds files (study.yaml) and is not a study folder" in capsys.readouterr().err
    assert spec.read_text() == text and sorted(os.listdir(tmp_path)) == ["study.yaml"]


def test_a_new_run_holds_its_folder_against_a_resume(tmp_path, capsys):
    """A fresh `spml train` did not lock its run folder: a `--resume` of it at the same time
    trained in it too, interleaving the epochs of metrics.jsonl."""
    seen = {}

    def resume_meanwhile(record, model, loss):
        if record["epoch"] == 1:
            (folder,) = (tmp_path / "runs").iterdir()
            seen["code"] = main(["train", "--resume", str(folder), "--quiet"])
            seen["err"] = capsys.readouterr().err

    from spmlkit.loading import load_splits
    from spmlkit.engine import TrainConfig
    from spmlkit.methods import train_run

    res = train_run("linear", load_splits("yeast", subsample=0.2), "an", {},
                    TrainConfig(epochs=3, lr=1e-2), out=tmp_path / "runs",
                    on_epoch=resume_meanwhile)
    assert seen["code"] == 2 and "is being trained by another process" in seen["err"]
    lines = (tmp_path / "runs" / os.path.basename(res["run_dir"]) / "metrics.jsonl") \
        .read_text().splitlines()
    assert [json.loads(ln)["epoch"] for ln in lines] == [1, 2, 3]
    assert not (tmp_path / "runs" / os.path.basename(res["run_dir"]) / ".lock").exists()


def test_stacked_runs_hold_their_folders_while_the_stack_trains(tmp_path):
    """The linear mode's stacked runs (studies, spml benchmark) keep no checkpoint: a resume
    of one of their folders would start it again in the same folder while the stack trains.
    Each folder is locked until the stack is done."""
    import dataclasses

    from spmlkit.loading import load_splits
    from spmlkit.engine import TrainConfig
    from spmlkit.methods import get_method, train_runs
    from spmlkit.runs import RunDir

    linear = get_method("linear")
    refused = []

    def fit_many(ctxs):
        for ctx in ctxs:
            try:
                with RunDir(ctx.run_dir).locked():
                    pass
            except ValueError as err:
                refused.append(str(err))
        return linear.fit_many(ctxs)

    configs = [TrainConfig(epochs=1, lr=lr) for lr in (1e-2, 1e-3)]
    results = train_runs(dataclasses.replace(linear, fit_many=fit_many),
                         load_splits("yeast", subsample=0.2), "an", {}, configs,
                         out=tmp_path / "runs")
    assert len(refused) == 2 and "is being trained by another process" in refused[0]
    assert all(not os.path.exists(os.path.join(r["run_dir"], ".lock")) for r in results)


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.json", ".lock"])
@pytest.mark.parametrize("kind", ["device", "fifo", "link"])
def test_a_run_folder_resumed_with_something_planted(world, tmp_path, capsys, name, kind):
    run = shutil.copytree(world["run"], tmp_path / "f" / "run")
    (run / "final.json").unlink()
    content = (run / name).read_bytes() if (run / name).exists() else None
    if content is not None:
        (run / name).unlink()
    watched, before = plant(run / name, kind)
    if kind == "link" and content is not None:  # the link leads to a copy of the real file
        watched.write_bytes(content)
        before = state(watched)
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{run / name}: is " in err, err
    assert state(watched) == before and no_temporary_files(run)


def test_two_resumes_of_one_run_folder(world, tmp_path, capsys):
    import fcntl

    from spmlkit.runs import RunDir

    run = shutil.copytree(world["run"], tmp_path / "run")
    (run / "final.json").unlink()
    with RunDir(run).locked():  # another process resuming it, as far as the lock can tell
        assert main(["train", "--resume", str(run), "--quiet"]) == 2
        assert f"{run} is being trained by another process" in capsys.readouterr().err
        fd = os.open(run / ".lock", os.O_RDWR)
        with pytest.raises(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    assert not (run / ".lock").exists()
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert (run / "final.json").is_file() and not (run / ".lock").exists()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A feature cache holding the stores of a tiny image folder, and the command making it."""
    from PIL import Image

    base = tmp_path_factory.mktemp("cache")
    rng = np.random.default_rng(0)
    for name in ("cat", "dog", "fox"):
        (base / "tree" / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(
                base / "tree" / name / f"{i}.png")
    argv = ["extract", "--dataset", "folder", "--data", f"root={base / 'tree'}", "--backbone",
            "tiny_cnn", "--random-init", "--cache-dir", str(base / "cache"), "--workers", "0",
            "--quiet"]
    assert main(argv) == 0
    return base / "cache", argv


@pytest.mark.parametrize("name", ["features.npy", "done.npy", "meta.json", "files.npy", ".lock"])
@pytest.mark.parametrize("kind", ["device", "fifo", "link"])
def test_a_feature_cache_with_something_planted(cache, tmp_path, capsys, name, kind):
    folder, argv = cache
    mine = shutil.copytree(folder, tmp_path / "f" / "cache")
    argv = [a if a != str(folder) else str(mine) for a in argv]
    (store,) = [p for p in mine.iterdir() if "__n6__" in p.name]  # the pool's store
    (store / "meta.json").write_text("{}")  # unfinished: extraction resumes into the store
    (store / name).unlink(missing_ok=True)
    watched, before = plant(store / name, kind)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{store / name}: is " in err and "never writes through" in err, err
    assert state(watched) == before and no_temporary_files(store)


def test_recompute_never_removes_files_through_a_link_at_the_store(cache, tmp_path, capsys):
    """`spml extract --recompute` removed the store's files before it checked the store's
    folder for a link: a link planted there cost the folder it leads to its files."""
    folder, argv = cache
    mine = shutil.copytree(folder, tmp_path / "f" / "cache")
    argv = [a if a != str(folder) else str(mine) for a in argv]
    (store,) = [p for p in mine.iterdir() if "__n6__" in p.name]
    shutil.rmtree(store)
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("features.npy", "meta.json", "done.npy", "other.txt"):
        (victim / name).write_text("mine\n")
    os.symlink(victim, store)
    assert main([*argv, "--recompute"]) == 2
    assert f"{store}: is a symbolic link" in capsys.readouterr().err
    assert sorted(os.listdir(victim)) == ["done.npy", "features.npy", "meta.json", "other.txt"]


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_benchmark_folder_with_something_planted(tmp_path, capsys, kind):
    out = tmp_path / "f" / "bench"
    out.mkdir(parents=True)
    (out / "launches.jsonl").write_text("")  # a study folder (its table is written again)
    watched, before = plant(out / "table.md", kind)
    assert main(["benchmark", "--losses", "an", "--seeds", "1", "--epochs", "1", "--batch-sizes",
                 "16", "--lrs", "1e-2", "--no-references", "--out", str(out), "--quiet"]) == 2
    assert f"{out / 'table.md'}: is " in capsys.readouterr().err
    assert state(watched) == before


@pytest.mark.parametrize("command", ["benchmark", "study"])
def test_a_launch_never_takes_over_a_folder_of_other_files(tmp_path, capsys, command):
    """A study or benchmark ``--out`` that holds files and is not a study folder is refused
    before anything is written: the launch would replace its ``study.yaml``, ``table.md``,
    ``results.json``."""
    out = tmp_path / "mine"
    out.mkdir()
    mine = {"table.md": "MY TABLE\n", "results.json": '{"mine": 1}\n', "study.yml": "x: 1\n"}
    for name, text in mine.items():
        (out / name).write_text(text)
    argv = {"benchmark": ["benchmark", "--losses", "an", "--seeds", "1", "--epochs", "1",
                          "--batch-sizes", "16", "--lrs", "1e-2", "--no-references"],
            "study": ["study", "run", "smoke", "--jobs", "1", "--set", "epochs=1",
                      "methods=[an]"]}[command]
    assert main([*argv, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{out}: holds files (results.json, study.yml, table.md) and is not a study " \
        f"folder" in err and err.count("\n") == 1, err
    assert {p.name: p.read_text() for p in out.iterdir()} == mine


def test_the_writer_rule_protects_every_file_of_spmlkits_own_folders():
    """`OWN_FILES` (the ground floor's list, written out as names) holds each file name that
    the run folder, the study folder and the feature store define for themselves."""
    from spmlkit import features, runs
    from spmlkit.experiments import reference
    from spmlkit.experiments.study import layout
    from spmlkit.methods import provenance, smile
    from spmlkit.safe_write import OWN_FILES

    named = {v for module in (runs, features, layout) for k, v in vars(module).items()
             if k.endswith("_FILE") and isinstance(v, str)}
    named |= {provenance.SKIPPED_FILE, smile.ENHANCED_LABELS_FILE, reference.SKLEARN_FILE,
              f"{layout.RESULTS_FILE}-wal", f"{layout.RESULTS_FILE}-shm"}
    assert len(named) > 20 and named <= OWN_FILES, sorted(named - OWN_FILES)
