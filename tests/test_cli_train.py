"""``spml train``: the learning rate a run without ``--lr`` gets (and says why), and the warning
when the selected epoch is the last one (printed and kept in final.json)."""
import json
from pathlib import Path

import pytest

from spmlkit.cli import main
from spmlkit.methods import SELECTED_LR, default_lr, get_method, train_run
from spmlkit.losses import LOSSES


def _config(out: Path) -> dict:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return json.loads((run / "config.json").read_text())


def _final(out: Path) -> dict:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return json.loads((run / "final.json").read_text())


def test_train_without_lr_uses_the_linear_default_and_says_why(tmp_path, capsys):
    assert main(["train", "--dataset", "yeast", "--epochs", "1", "--quiet", "--out",
                 str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "lr 0.001: the --mode linear default" in err and "--lr sets another" in err
    assert _final(tmp_path)["lr"] == pytest.approx(1e-3)


def test_train_with_lr_says_nothing_about_it(tmp_path, capsys):
    assert main(["train", "--dataset", "yeast", "--epochs", "1", "--quiet", "--lr", "1e-2",
                 "--out", str(tmp_path)]) == 0
    assert "lr " not in capsys.readouterr().err
    assert _final(tmp_path)["lr"] == pytest.approx(1e-2)


def test_best_epoch_last_warns_on_stderr_and_in_final_json(tmp_path, capsys):
    # lr 1e-5 for 3 epochs: val mAP still rising at the end
    assert main(["train", "--dataset", "yeast", "--epochs", "3", "--quiet", "--lr", "1e-5",
                 "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    warning = ("best epoch is the last (3); the model may be under-trained: train again with "
               "more --epochs or a larger --lr")
    assert f"warning: {warning}" in captured.err and "best epoch 3" in captured.out
    assert _final(tmp_path)["warnings"] == [warning]


def test_no_warning_when_an_earlier_epoch_is_best(tmp_path, capsys):
    # lr 1e-1 overshoots: the best val mAP comes before the last of 6 epochs
    assert main(["train", "--dataset", "yeast", "--epochs", "6", "--quiet", "--lr", "0.1",
                 "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    final = _final(tmp_path)
    assert final["best_epoch"] < 6, final["best_epoch"]
    assert "warning:" not in captured.err and final["warnings"] == []


def test_default_lr_table_names_real_methods_and_losses():
    for (mode, loss, _dataset), (lr, source) in SELECTED_LR.items():
        get_method(mode)                     # raises on an unknown method
        assert LOSSES.get(loss).name == loss and lr > 0 and source
    assert default_lr("finetune", "ll_ct", "voc")[0] == 1e-5
    lr, why = default_lr("finetune", "em_apl", "cub")
    assert lr == 1e-4 and "em_apl on cub" in why and "Zhou" in why
    assert default_lr("finetune", "em_apl", "yeast")[0] == get_method("finetune").default_lr
    assert default_lr("lac", "an", None)[0] == 1e-4


def test_python_api_result_carries_the_warnings():
    from spmlkit.loading import load_splits
    from spmlkit.engine import TrainConfig

    res = train_run("linear", load_splits("yeast"), "an", config=TrainConfig(epochs=2, lr=1e-5))
    assert res["best_epoch"] == 2 and res["warnings"] == [
        "best epoch is the last (2); the model may be under-trained: train again with more "
        "--epochs or a larger --lr"]


def test_config_file_gives_options_and_flags_override_them(tmp_path, capsys):
    """``--config FILE`` (YAML or JSON): its options as if typed, the command line's flags over
    them; ``--verbose`` prints the resolved settings and one line per epoch."""
    (tmp_path / "run.yaml").write_text("dataset: yeast\nloss: role\nepochs: 3\nlr: 1e-2\n"
                                       "hp: {lam: 2}\nbatch-size: 16\nverbose: true\n")
    assert main(["train", "--config", str(tmp_path / "run.yaml"), "--epochs", "2", "--out",
                 str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    config = _config(tmp_path / "a")
    train = config["train"]
    assert (config["loss"], config["hparams"], train["epochs"], train["lr"],
            train["batch_size"]) == ("role", {"lam": 2.0}, 2, pytest.approx(1e-2), 16)
    assert "settings: --mode linear --loss role hparams {'lam': 2}" in err
    assert "epoch 1: loss " in err and "epoch 2: loss " in err and "epoch 3:" not in err
    (tmp_path / "run.json").write_text(json.dumps({"dataset": "yeast", "epochs": 1,
                                                   "quiet": True}))
    assert main(["train", "--config", str(tmp_path / "run.json"), "--out",
                 str(tmp_path / "b")]) == 0
    assert _config(tmp_path / "b")["train"]["epochs"] == 1
    assert "epoch 1:" not in capsys.readouterr().err


@pytest.mark.parametrize(("text", "message"), [
    ("los: role\n", "unknown option 'los' for spml train; did you mean 'loss'?"),
    ("epochs: many\n", "epochs: expected a whole number >= 1, got 'many'"),
    ("quiet: 1\n", "quiet: a switch, give true or false, got 1"),
    ("metric: nope\n", "metric:"),
    ("- loss\n", "must hold a mapping of spml train options"),
    ("quiet: true\nverbose: true\n", "quiet and verbose exclude each other"),
    # a value that is no mapping was reported as a flag never typed ("--hp '5'", "--data 'a'")
    ("hp: 5\n", "hp: a mapping, e.g. 'hp: {name: value}' (or a list of KEY=VALUE strings), "
                "got 5"),
    ("data: [a, b]\n", "data: a mapping, e.g. 'data: {name: value}'"),
    ("reg: 0.5\n", "reg: a mapping, e.g. 'reg: {reg_name: 0.1}' (or a list of NAME:WEIGHT"),
])
def test_config_file_errors_name_the_key(text, message, tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text(text)
    assert main(["train", "--dataset", "yeast", "--config", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spml train: error: --config {tmp_path / 'bad.yaml'}: ")
    assert message in err and "Traceback" not in err


def test_config_with_resume_is_refused(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("epochs: 2\n")
    assert main(["train", "--resume", str(tmp_path), "--config", str(tmp_path / "c.yaml")]) == 2
    assert "--config gives the options of a new run" in capsys.readouterr().err


def test_benchmark_seeds_has_help(capsys):
    with pytest.raises(SystemExit):
        main(["benchmark", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--seeds SEEDS seeds per method (0, 1, ... N-1)" in out


@pytest.mark.parametrize("checkpointed", [True, False])
def test_ctrl_c_names_the_run_folder_and_how_to_continue_it(tmp_path, capsys, monkeypatch,
                                                           checkpointed):
    """``spml train`` makes a new folder each time, so re-running the command after Ctrl-C would
    start over: the message names the interrupted folder and ``--resume``, which finishes it.
    Stopped before its first checkpoint (a linear run writes one after 10 s) it says that the
    resume starts again (it claimed the folder kept the epochs of a checkpoint it did not
    have)."""
    from _interrupt import ctrl_c_after_epoch

    from spmlkit.methods import driver

    if checkpointed:
        monkeypatch.setattr(driver, "CHECKPOINT_SECONDS", 0.0)
    argv = ["train", "--epochs", "4", "--lr", "1e-2", "--out", str(tmp_path / "runs"),
            "--quiet"]
    with ctrl_c_after_epoch(2):
        assert main(argv) == 130
    (run,) = (tmp_path / "runs").iterdir()
    err = capsys.readouterr().err
    assert (run / "checkpoint.pt").is_file() == checkpointed
    if checkpointed:
        assert f"interrupted; {run} keeps the epochs of its last checkpoint: continue it " \
               f"with spml train --resume {run}" in err, err
    else:
        assert f"interrupted before the run's first checkpoint: {run} keeps no epoch to " \
               f"continue from; spml train --resume {run} starts it again from epoch 1" in err
    assert not (run / "failed.json").exists() and not (run / "final.json").exists()
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    said = f"{run} has no checkpoint (stopped before its first): training it again from epoch 1"
    assert (said in capsys.readouterr().err) != checkpointed
    assert json.loads((run / "final.json").read_text())["epochs_run"] == 4
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run.name]


def test_k_given_twice_is_refused_and_the_losses_own_k_is_recorded(tmp_path, capsys):
    """``--k 2 --hp k=3`` trained with 3 and recorded k 2; ``--hp k=3`` alone recorded the train
    mean (4.208) as the run's k. Both ways at once are refused; the loss's own k is the run's."""
    assert main(["train", "--loss", "role", "--epochs", "1", "--k", "2", "--hp", "k=3",
                 "--quiet", "--out", str(tmp_path)]) == 2
    assert "k is given twice: the run's k 2.0 (--k / --k-estimate, k=) and the loss's " \
           "hyperparameter k=3 (--hp k=); give one" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    assert main(["train", "--loss", "role", "--epochs", "1", "--hp", "k=3", "--quiet", "--out",
                 str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    config = json.loads((run / "config.json").read_text())
    assert config["k"] == 3 and config["hparams"]["k"] == 3


def test_a_resume_reads_the_data_it_started_with_from_any_folder(tmp_path, capsys,
                                                                 monkeypatch):
    """config.json recorded ``path=y.csv`` as given: ``--resume`` from another folder failed
    with "table file y.csv does not exist". And a data file changed since the run started was
    read as it is now, silently (test mAP 56.91 where the run gives 42.43): the paths are
    recorded absolute, with the files' size and modification time, and a changed file refuses
    the resume."""
    import numpy as np

    from _interrupt import ctrl_c_after_epoch

    from spmlkit.loading import load_dataset
    from spmlkit.methods import driver

    monkeypatch.setattr(driver, "CHECKPOINT_SECONDS", 0.0)
    ds = load_dataset("yeast")
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "x.npy", ds.pool.x)
    np.save(data / "y.npy", ds.pool.y)
    monkeypatch.chdir(data)
    argv = ["train", "--solver", "adam", "--dataset", "arrays", "--data", "features=x.npy",
            "--data", "labels=y.npy", "--epochs", "4", "--lr", "1e-2",
            "--out", str(tmp_path / "runs"),
            "--quiet"]
    with ctrl_c_after_epoch(2):
        assert main(argv) == 130
    (run,) = (tmp_path / "runs").iterdir()
    config = json.loads((run / "config.json").read_text())
    assert config["dataset_options"]["features"] == str(data / "x.npy")
    assert set(config["data_files"]) == {"features", "labels"}
    monkeypatch.chdir(tmp_path)
    y = np.load(data / "y.npy")
    y[:50] = 1
    np.save(data / "y.npy", y)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    assert f"cannot resume {run}: its data file {data / 'y.npy'} (option labels) changed " \
           f"since the run started" in capsys.readouterr().err
    np.save(data / "y.npy", ds.pool.y)  # the data restored (a new modification time)
    config["data_files"]["labels"]["mtime_ns"] = (data / "y.npy").stat().st_mtime_ns
    (run / "config.json").write_text(json.dumps(config))
    assert main(["train", "--resume", str(run), "--quiet"]) == 0  # from another folder
    assert json.loads((run / "final.json").read_text())["epochs_run"] == 4


def test_config_records_the_losses_settings_the_threads_and_the_commit(tmp_path):
    """config.json had ``hparams: {}`` for a loss trained with its defaults (which may change
    between versions, and by dataset), no thread count (image runs' bits depend on it) and a
    version number that covers many commits. It records all three."""
    import subprocess

    from spmlkit.losses import loss_hparams
    from spmlkit.methods import provenance

    provenance.source_commit.cache_clear()  # (a commit made while the suite ran)
    assert main(["train", "--loss", "em_apl", "--epochs", "1", "--threads", "2", "--quiet",
                 "--out", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    config = json.loads((run / "config.json").read_text())
    assert config["hparams"] == {}
    assert config["loss_settings"] == {**loss_hparams("em_apl")} and \
        config["loss_settings"]["warmup"] == 5
    assert config["threads"] == 2
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent)
    if head.returncode == 0:  # a checkout (not an installed wheel)
        assert config["versions"]["spmlkit_commit"].startswith(head.stdout.strip())


def test_a_class_without_a_test_positive_is_named_as_left_out_of_the_mean(tmp_path, capsys):
    """A class with no positive in the test set was left out of the test mAP's mean without a
    word (the protocol reports the classes left out); the run names it, final.json too."""
    import numpy as np

    from spmlkit.loading import load_dataset

    ds = load_dataset("yeast")
    yt = ds.test.y.copy()
    yt[:, 13] = 0
    for name, arr in (("x", ds.pool.x), ("y", ds.pool.y), ("xt", ds.test.x), ("yt", yt)):
        np.save(tmp_path / f"{name}.npy", arr)
    data = [f"{k}={tmp_path / v}.npy" for k, v in (("features", "x"), ("labels", "y"),
                                                    ("test_features", "xt"),
                                                    ("test_labels", "yt"))]
    assert main(["train", "--solver", "adam", "--dataset", "arrays",
                 *[a for d in data for a in ("--data", d)],
                 "--epochs", "1", "--quiet", "--out", str(tmp_path / "r")]) == 0
    assert "test mAP: the mean over the classes with a positive in the test set; 1 class(es) " \
           "have none and are left out: class13" in capsys.readouterr().err
    (run,) = (tmp_path / "r").iterdir()
    assert json.loads((run / "final.json").read_text())["test_map_left_out"] == ["class13"]


def test_a_misspelt_hyperparameter_is_refused_before_the_data_loads(tmp_path, capsys):
    """``--hp warmup=2`` on AN was refused only after the data had loaded (8 s and 1.8 GB at
    50k x 5k): here the data file does not even exist, and the hyperparameter is named."""
    assert main(["train", "--dataset", "tabular", "--data", f"path={tmp_path / 'no.csv'}",
                 "--data", "labels=c*", "--loss", "an", "--hp", "warmup=2", "--quiet",
                 "--out", str(tmp_path)]) == 2
    assert "loss 'an' has no hyperparameter(s) ['warmup']" in capsys.readouterr().err


def test_a_boolean_k_hyperparameter_is_refused(tmp_path, capsys):
    """``--hp k=true`` (read as the boolean True) trained EPR with k = 1 while config.json
    recorded the train mean; a k that is not a number is refused, saying that the true mean
    is the default."""
    from spmlkit.losses import create_loss

    assert main(["train", "--loss", "epr", "--hp", "k=true", "--epochs", "1", "--quiet",
                 "--out", str(tmp_path)]) == 2
    assert "loss 'epr': k must be a number > 0 of expected positives per example, or left " \
           "out: the train split's true mean (k*) is the default; got True" \
           in capsys.readouterr().err
    for name in ("epr", "role", "gpr"):
        with pytest.raises(ValueError, match="k must be a number > 0"):
            create_loss(name, k=True)


def test_a_renamed_dataset_and_a_class_names_file_are_recorded_for_the_resume(tmp_path,
                                                                           monkeypatch):
    """``--data name=mine`` recorded the display name as the dataset: its paths stayed relative,
    no data file was checked, and the resume failed with "unknown dataset 'mine'". A
    ``class_names`` file stayed relative too (a resume from another folder read another
    names.txt, or none). The registered source is recorded (``source``), and both kinds of
    path are absolute and checked."""
    import numpy as np

    from spmlkit.loading import load_dataset

    ds = load_dataset("yeast")
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "x.npy", ds.pool.x)
    np.save(data / "y.npy", ds.pool.y)
    (data / "names.txt").write_text("\n".join(f"c{j}" for j in range(14)) + "\n")
    monkeypatch.chdir(data)
    assert main(["train", "--solver", "adam", "--dataset", "arrays", "--data", "features=x.npy",
                 "--data",
                 "labels=y.npy", "--data", "class_names=names.txt", "--data", "name=mine",
                 "--epochs", "2", "--quiet", "--out", str(tmp_path / "runs")]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    config = json.loads((run / "config.json").read_text())
    assert config["dataset"] == "mine" and config["source"] == "arrays"
    assert config["dataset_options"]["class_names"] == str(data / "names.txt")
    assert set(config["data_files"]) == {"features", "labels", "class_names"}
    (run / "final.json").unlink()  # as if stopped: the resume loads the data again
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", str(run), "--quiet"]) == 0


def test_a_full_image_bar_says_the_scoring_passes_run():
    """The image modes' bar sat at 100 % for the train / val / test passes (20 s and more)
    without a word: after the last epoch it says they run."""
    from types import SimpleNamespace

    from spmlkit.cli.train import _epoch_bar

    bar, show = _epoch_bar(SimpleNamespace(quiet=False, verbose=False), 2, "x", batches=True)
    show.batch(8, 8)
    show({"train_loss": 0.5, "val_map": 50.0})
    assert "scoring" not in bar.postfix
    show({"train_loss": 0.4, "val_map": 51.0})
    assert "scoring the train, val and test images" in bar.postfix
    bar.close()
