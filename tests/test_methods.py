"""Generated from the training-method registry: every registered method trains a tiny run into a
run folder, resumes an interrupted one to the same result, predicts new inputs as it scored
them, and draws its curves. A new method registered with ``smoke_options`` is picked up."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from _image_toy import toy_splits
from spmlkit.cli import main
from spmlkit.loading import load_dataset, load_splits
from spmlkit.engine import TrainConfig
from spmlkit.methods import list_methods, load_run_model, resume_run, train_run
from spmlkit.runs import read_run

METHODS = [m.name for m in list_methods()]
CONFIG = dict(epochs=3, batch_size=8, lr=1e-2, seed=0)


def config_of(name, **kw) -> TrainConfig:
    """CONFIG for method ``name``: without the fields it does not read (the solver's: epochs,
    batch size, learning rate), which it would refuse."""
    method = next(m for m in list_methods() if m.name == name)
    return TrainConfig(**{k: v for k, v in CONFIG.items()
                          if k not in method.unused_train_fields}, **kw)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Feature splits (yeast, a fifth of its train rows) and 16-px toy image splits."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("methods")
    images = toy_splits(root)
    return {"features": load_splits("yeast", subsample=0.2), "images": images, "root": root,
            "options": {"features": {"subsample": 0.2}, "images": {}}}


def options_of(name, root):
    method = next(m for m in list_methods() if m.name == name)
    options = dict(method.smoke_options)
    if "cache_dir" in method.options:
        options["cache_dir"] = str(root / "cache")
    return method, options


class Stop(Exception):
    pass


def train(name, data, out, **kw):
    method, options = options_of(name, data["root"])
    # the feature splits are reloaded on resume from dataset_options; the toy image splits
    # are made by the test (resume_run gets them through the `splits` argument)
    return train_run(name, data[method.inputs], "an", {}, config_of(name), out=out,
                     checkpoint_seconds=0, dataset_options=data["options"][method.inputs],
                     **options, **kw)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_trains_into_a_run_folder(name, data, tmp_path):
    res = train(name, data, tmp_path)
    run = read_run(res["run_dir"])
    assert run.status == "finished" and run.config["mode"] == name
    assert run.final["test_map"] == res["test_map"] and 0 < res["test_map"] <= 100
    method, options = options_of(name, data["root"])
    assert len(run.metrics()) == method.total_epochs(config_of(name), options) or \
        name == "solve"  # (a path that stops once val has turned solves fewer values)
    assert not (run.path / "checkpoint.pt").exists()  # dropped when the run finished
    saved = np.load(run.path / "predictions.npz")
    assert saved["probs_test"].shape == data[
        next(m for m in list_methods() if m.name == name).inputs].test.y.shape


@pytest.mark.parametrize("name", METHODS)
def test_every_method_reports_test_f1_and_hamming_at_the_val_chosen_threshold(name, data,
                                                                             tmp_path):
    """THRESHOLD_POLICY for every method: the threshold is chosen on val (max val micro-F1)
    and the test F1s and Hamming loss are taken there, never at a threshold chosen on test."""
    from spmlkit.metrics import best_global_threshold, f1_micro_macro, hamming_loss
    from spmlkit.runs import read_predictions

    res = train(name, data, tmp_path)
    p = read_predictions(res["run_dir"])
    on_val = best_global_threshold(p["probs_val"], p["y_val"])[0]
    on_test = best_global_threshold(p["probs_test"], p["y_test"])[0]
    assert res["threshold"]["value"] == on_val != on_test  # (so the two could be told apart)
    micro, macro = f1_micro_macro(p["probs_test"], p["y_test"], on_val)
    test = res["test_metrics"]
    assert (test["threshold"], test["micro_f1"], test["hamming_loss"]) == \
        (on_val, micro, hamming_loss(p["probs_test"], p["y_test"], on_val))
    assert test["macro_f1"] == pytest.approx(macro, nan_ok=True)
    assert res["val_metrics"]["threshold"] == on_val
    assert json.loads((tmp_path / os.path.basename(res["run_dir"]) / "thresholds.json")
                      .read_text())["global"] == on_val  # what spml predict applies


def test_em_records_its_papers_f1_threshold_beside_the_val_chosen_one(data, tmp_path, capsys):
    """Zhou et al. report EM's F1 with predictions cut at 0.75: an EM (and EM-APL, even
    behind a regulariser) run records the test F1s and Hamming loss there too; AN, whose
    paper names no cut, does not."""
    from spmlkit.metrics import f1_micro_macro, hamming_loss
    from spmlkit.runs import read_predictions

    for loss, hp in (("em", {}), ("em_apl", {"warmup": 1}), ("em", {"reg": "highrank:1e-3"})):
        res = train_run("linear", data["features"], loss, hp, TrainConfig(**CONFIG),
                        out=tmp_path / f"{loss}{len(hp)}", checkpoint_seconds=0,
                        dataset_options=data["options"]["features"])
        p = read_predictions(res["run_dir"])
        at = res["test_metrics_at_paper_threshold"]
        micro, macro = f1_micro_macro(p["probs_test"], p["y_test"], 0.75)
        assert (at["threshold"], at["micro_f1"], at["hamming_loss"]) == \
            (0.75, micro, hamming_loss(p["probs_test"], p["y_test"], 0.75)), loss
        assert at["macro_f1"] == pytest.approx(macro, nan_ok=True)
        assert res["test_metrics"]["threshold"] != 0.75          # the val-chosen one is kept
        assert read_run(res["run_dir"]).final["test_metrics_at_paper_threshold"] == at
    res = train_run("linear", data["features"], "an", {}, TrainConfig(**CONFIG),
                    out=tmp_path / "an", checkpoint_seconds=0,
                    dataset_options=data["options"]["features"])
    assert "test_metrics_at_paper_threshold" not in res
    assert main(["train", "--dataset", "yeast", "--data", "subsample=0.2", "--loss", "em",
                 "--epochs", "2", "--out", str(tmp_path / "cli"), "--quiet"]) == 0
    line = [t for t in capsys.readouterr().out.splitlines() if "paper's threshold" in t]
    assert line and line[0].startswith("test at the paper's threshold 0.75: ") and \
        "micro_f1" in line[0], line


@pytest.mark.parametrize("metric", ["micro_f1", "hamming_loss"])
@pytest.mark.parametrize("name", METHODS)
def test_every_method_selects_a_thresholded_metric_at_the_val_chosen_threshold(name, metric,
                                                                               data, tmp_path):
    """An epoch selected on val micro-F1 or Hamming loss is scored at the threshold chosen on
    those val rows (THRESHOLD_POLICY), so the selected epoch's score is the run's val metric."""
    method, options = options_of(name, data["root"])
    res = train_run(name, data[method.inputs], "an", {},
                    config_of(name, metric=metric), out=tmp_path, checkpoint_seconds=0,
                    dataset_options=data["options"][method.inputs], **options)
    assert res["metric"] == metric
    assert res["val_score"] == pytest.approx(res["val_metrics"][metric], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_resumes_to_the_uninterrupted_result(name, data, tmp_path):
    whole = train(name, data, tmp_path / "whole")

    def stop_after_two(record, model, loss):
        if record["epoch"] == 2:
            raise Stop

    with pytest.raises(Stop):
        train(name, data, tmp_path / "cut", on_epoch=stop_after_two)
    (cut,) = (tmp_path / "cut").iterdir()
    # it raised: marked failed, its last epoch's checkpoint kept for a resume
    assert read_run(cut).status == "failed" and (cut / "checkpoint.pt").is_file()
    method = options_of(name, data["root"])[0]
    splits = data["images"] if method.inputs == "images" else None
    resumed = resume_run(cut, splits=splits)
    for key in ("best_epoch", "val_map", "test_map", "train_recovery_map"):
        assert resumed[key] == whole[key], key
    a = torch.load(os.path.join(whole["run_dir"], "best.pt"), weights_only=True)["model"]
    b = torch.load(cut / "best.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    method, options = options_of(name, data["root"])
    assert [r["epoch"] for r in read_run(cut).metrics()] == \
        [r["epoch"] for r in read_run(whole["run_dir"]).metrics()]  # each epoch logged once
    assert read_run(cut).status == "finished"


@pytest.mark.parametrize("name", [m.name for m in list_methods() if m.inputs == "images"])
def test_every_image_method_repeats_its_result_with_a_real_backbone(name, data, tmp_path):
    """A random-init EfficientNet-Lite0 (not the tests' tiny_cnn), trained twice in one process
    with torch's global RNG moved in between: the same probabilities. Its folded convolutions
    drew their weights from that RNG, so no two fine-tuning runs were alike (finetune and
    linear_init fail here without the fix; the methods on frozen features see near-constant
    features from any random network in eval mode, so for them this checks their own parts)."""
    method, options = options_of(name, data["root"])
    options = {k: v for k, v in options.items() if k != "backbone_options"}
    options.update(backbone="efficientnet_lite0")
    probs = []
    for draws in (1, 5):
        torch.rand(draws)  # what ran before in this process
        if "cache_dir" in method.options:  # features of its own network, not the first run's
            options["cache_dir"] = str(tmp_path / f"cache{draws}")
        res = train_run(name, data["images"], "an", {},
                        TrainConfig(**{**CONFIG, "epochs": 2}, image_size=16),
                        out=tmp_path / f"after{draws}", **options)
        with np.load(os.path.join(res["run_dir"], "predictions.npz")) as z:
            probs.append({k: z[k] for k in z.files})
    assert probs[0].keys() == probs[1].keys()
    assert all(np.array_equal(probs[0][k], probs[1][k]) for k in probs[0])


@pytest.mark.parametrize("change", [{"lr": 1e-3}, {"epochs": 4}, {"batch_size": 16},
                                    {"seed": 1}], ids=lambda c: next(iter(c)))
def test_a_resume_with_another_training_config_is_refused(change, data, tmp_path):
    """A run interrupted after epoch 1 cannot be continued with another learning rate, epoch
    count, batch size or seed: the refusal names the train config and the folder is kept."""
    from spmlkit.methods import ResumeError

    def stop_after_one(record, model, loss):
        raise Stop

    with pytest.raises(Stop):
        train("linear", data, tmp_path, on_epoch=stop_after_one)
    (cut,) = tmp_path.iterdir()
    with pytest.raises(ResumeError, match=r"other settings \(train: run folder .*"
                                          + next(iter(change))):
        train_run("linear", data["features"], "an", {}, TrainConfig(**{**CONFIG, **change}),
                  resume=cut, dataset_options=data["options"]["features"])
    assert read_run(cut).status == "failed" and (cut / "checkpoint.pt").is_file()
    # the same config resumes
    assert train_run("linear", data["features"], "an", {}, TrainConfig(**CONFIG), resume=cut,
                     dataset_options=data["options"]["features"])["best_epoch"] >= 1


@pytest.mark.parametrize("name", METHODS)
def test_every_method_predicts_new_inputs_as_it_scored_them(name, data, tmp_path):
    from spmlkit.predict import predict_run

    method, _ = options_of(name, data["root"])
    res = train(name, data, tmp_path)
    if method.inputs == "features":  # new data comes raw: the run standardises it
        inputs = tmp_path / "new.npy"
        np.save(inputs, load_dataset("yeast").test.x)
        inputs = [str(inputs)]
    else:
        inputs = list(data["images"].test.x)
    pred = predict_run(res["run_dir"], inputs)
    saved = np.load(os.path.join(res["run_dir"], "predictions.npz"))
    # image methods: predict recomputes from the images what training may have read from
    # float16 feature caches (LAC's cached maps)
    atol = 1e-5 if method.inputs == "features" else 5e-4
    np.testing.assert_allclose(pred.probs, saved["probs_test"], rtol=1e-4, atol=atol)
    model, info = load_run_model(res["run_dir"])
    assert info["mode"] == name and info["inputs"] == method.inputs


@pytest.mark.parametrize("name", METHODS)
def test_every_method_draws_its_curves(name, data, tmp_path):
    res = train(name, data, tmp_path / "runs")
    out = tmp_path / "curves.png"
    assert main(["figure", "curves", res["run_dir"], "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_that_raises_is_marked_failed_not_finished(data, tmp_path):
    def boom(record, model, loss):
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        train("linear", data, tmp_path, on_epoch=boom)
    (folder,) = tmp_path.iterdir()
    run = read_run(folder)
    assert run.status == "failed" and "disk on fire" in run.failed["error"]
    assert not (folder / "final.json").exists() and not (folder / "best.pt").exists()


def test_unknown_method_option_is_named(data):
    with pytest.raises(ValueError, match=r"method 'linear' has no option\(s\) \['backbon'\]"):
        train_run("linear", data["features"], "an", backbon="x")


def test_a_method_option_of_the_wrong_kind_is_refused_before_a_run_folder(data, tmp_path):
    """A word for a number, a number for a flag: refused by name (the kind read off the
    option's default), for a registered extension's method too, before anything is written."""
    cases = [("linear", {"hidden": "wide"}, "option hidden='wide': expected an integer"),
             ("linear", {"save_train_probs": 1}, "save_train_probs=1: expected true or false"),
             ("linear", {"head": 2}, "option head=2: expected a word"),
             ("smile", {"gamma": "small"}, "option gamma='small': expected a number")]
    for name, options, message in cases:
        with pytest.raises(ValueError, match=message):
            train_run(name, data["features"], "an", {}, TrainConfig(**CONFIG),
                      out=tmp_path, **options)
    assert not list(tmp_path.iterdir())
    # an integer is a number; a float is not an integer (4.0 counts nothing)
    from spmlkit.methods import get_method

    assert get_method("smile").check_options({"gamma": 1, "neighbours": 4})["gamma"] == 1
    # numpy's scalars (a sweep over np.arange / np.logspace) count as Python's
    assert get_method("linear").check_options(
        {"hidden": np.int64(128), "save_train_probs": np.bool_(True)})["hidden"] == 128
    with pytest.raises(ValueError, match="expected a word"):
        get_method("linear").check_options({"head": np.float64(2.0)})
    assert get_method("smile").check_options({"gamma": np.float32(0.5)})["gamma"] == 0.5
    with pytest.raises(ValueError, match="neighbours=4.0: expected an integer"):
        get_method("smile").check_options({"neighbours": 4.0})
    assert main(["train", "--mode", "linear_init", "--option", "linear_epochs=abc",
                 "--out", str(tmp_path)]) == 2
    assert not list(tmp_path.iterdir())


def test_linear_init_decays_its_linear_phase_too(data, tmp_path):
    """--weight-decay with --mode linear_init decayed only the fine-tuning phase: its linear
    phase (25 epochs by default) trained without, with no word. The linear phase now takes it
    as the linear mode does (coupled L2), and config.json records it."""
    method, options = options_of("linear_init", data["root"])
    heads = {}
    for wd in (0.0, 0.5):
        res = train_run("linear_init", data["images"], "an", {}, TrainConfig(**CONFIG),
                        out=tmp_path / str(wd), checkpoint_seconds=0,
                        **{**options, "weight_decay": wd})
        config = read_run(res["run_dir"]).config
        assert config["linear_train"]["weight_decay"] == wd
        heads[wd] = [r for r in read_run(res["run_dir"]).metrics()
                     if r.get("stage", r.get("phase")) != "finetune"]
    # the linear phase's own epochs differ: it is decayed, not only the fine-tuning
    linear = options["linear_epochs"] if "linear_epochs" in options else 25
    assert heads[0.0][:linear] != heads[0.5][:linear]


def test_a_linear_init_resume_compares_its_linear_phase_as_the_run():
    """linear_train (the linear phase's TrainConfig) is compared without what a resume may
    change (device, workers), and an older folder whose linear phase trained without the
    run's weight decay is not continued with one."""
    from spmlkit.methods import ResumeError
    from spmlkit.methods.provenance import check_resume

    train = {"epochs": 2, "lr": 1e-3, "device": "cuda", "num_workers": 4}
    stored = {"mode": "linear_init", "train": train,
              "linear_train": {**train, "weight_decay": 0.0}}
    moved = {"mode": "linear_init", "train": {**train, "device": "cpu", "num_workers": 0},
             "linear_train": {**train, "weight_decay": 0.0, "device": "cpu"}}
    check_resume("run", stored, moved)
    with pytest.raises(ResumeError, match="linear_train"):
        check_resume("run", stored, {**moved, "linear_train": {**train, "weight_decay": 0.5}})


def test_predict_standardises_raw_yeast_features_like_training(tmp_path):
    """The bug: spml predict read a yeast run's new features raw although training standardised
    them (7.21 labels a row instead of 5.96 on the same rows)."""
    from spmlkit.predict import predict_run

    res = train_run("linear", load_splits("yeast"), "an", {}, TrainConfig(epochs=2, lr=1e-2),
                    out=tmp_path)
    raw = tmp_path / "raw.npy"
    np.save(raw, load_dataset("yeast").test.x)
    pred = predict_run(res["run_dir"], [str(raw)])
    saved = np.load(os.path.join(res["run_dir"], "predictions.npz"))
    np.testing.assert_allclose(pred.probs, saved["probs_test"], rtol=1e-5, atol=1e-6)
    expected = saved["probs_test"] >= pred.thresholds[None]
    assert pred.labels.sum(1).mean() == pytest.approx(expected.sum(1).mean())


def test_arrays_source_with_standardize_predicts_raw_rows(tmp_path):
    from spmlkit.predict import predict_run

    rng = np.random.default_rng(0)
    x = (rng.normal(5.0, 3.0, (300, 6))).astype(np.float32)
    y = (x[:, :3] > 5.0).astype(np.uint8)
    y[y.sum(1) == 0, 0] = 1
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    opts = {"features": str(tmp_path / "x.npy"), "labels": str(tmp_path / "y.npy"),
            "standardize": True}
    splits = load_splits("arrays", **opts)
    res = train_run("linear", splits, "an", {}, TrainConfig(epochs=2, lr=1e-2),
                    out=tmp_path / "runs", dataset_options=opts)
    raw = load_dataset("arrays", **opts).test.x
    np.save(tmp_path / "new.npy", raw)
    pred = predict_run(res["run_dir"], [str(tmp_path / "new.npy")])
    saved = np.load(os.path.join(res["run_dir"], "predictions.npz"))
    np.testing.assert_allclose(pred.probs, saved["probs_test"], rtol=1e-5, atol=1e-6)


def test_a_checkpoint_that_would_run_code_is_refused(data, tmp_path, capsys):
    """best.pt from someone else: loading must not run what it pickled (weights_only)."""
    res = train("linear", data, tmp_path / "runs")
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model": Payload(), "num_classes": 1, "class_names": ["a"]},
               os.path.join(res["run_dir"], "best.pt"))
    feats = tmp_path / "f.npy"
    np.save(feats, np.zeros((2, 103), np.float32))
    assert main(["predict", res["run_dir"], str(feats)]) == 2
    err = capsys.readouterr().err
    assert "refused" in err and "system" in err
    assert not marker.exists()


def test_spml_train_resume_continues_a_linear_run(tmp_path, capsys):
    out = tmp_path / "runs"
    args = ["train", "--dataset", "yeast", "--loss", "role", "--epochs", "3", "--lr", "1e-2",
            "--out", str(out), "--quiet"]
    assert main(args) == 0
    (whole,) = out.iterdir()
    # an interrupted copy: the state after epoch 2 (what the checkpoint writer would keep)
    from spmlkit.runs import RunDir

    cut = tmp_path / "cut"
    splits = load_splits("yeast")
    states = []

    def keep(make_state):
        states.append(make_state())

    from spmlkit.engine import fit_linear
    from spmlkit.losses import create_loss

    with pytest.raises(Stop):
        def stop(record, model, loss):
            if record["epoch"] == 2:
                raise Stop
        fit_linear(splits.train.x, splits.observed, create_loss("role"),
                   TrainConfig(epochs=3, lr=1e-2), x_val=splits.val.x, y_val=splits.val.y,
                   k=splits.k, on_epoch=stop, checkpoint=keep)
    run = RunDir.create(cut.parent, cut.name)
    config = json.loads((whole / "config.json").read_text())
    run.start(config, splits.observed)
    run.save_torch("checkpoint.pt", states[1])
    capsys.readouterr()
    assert main(["train", "--resume", str(run.path), "--quiet"]) == 0
    printed = capsys.readouterr().out
    final = json.loads((run.path / "final.json").read_text())
    assert final["test_map"] == json.loads((whole / "final.json").read_text())["test_map"]
    assert f"test mAP {final['test_map']:.2f}" in printed


def test_spml_list_methods_lists_the_registry(capsys):
    assert main(["list", "methods"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == METHODS


def test_linear_mlp_head_trains_resumes_and_predicts(data, tmp_path):
    """``head: mlp`` trains a one-hidden-layer MLP on the features: it resumes to the
    uninterrupted result and the run folder's model is that MLP; ``head: linear`` stays the
    plain ``nn.Linear`` run, bit for bit."""
    from spmlkit.models.heads import MLPHead

    splits = data["features"]
    cfg = TrainConfig(**CONFIG)
    res = train_run("linear", splits, "an", {}, cfg, out=tmp_path / "a", head="mlp", hidden=16,
                    checkpoint_seconds=0, dataset_options={"subsample": 0.2})
    model, info = load_run_model(res["run_dir"])
    assert isinstance(model, MLPHead) and model.hidden.out_features == 16
    assert read_run(res["run_dir"]).config["head"] == "mlp"
    x = torch.as_tensor(splits.test.x)
    probs = torch.sigmoid(model(x)).detach().numpy()
    from spmlkit.metrics import map_score

    assert map_score(probs, splits.test.y) == pytest.approx(res["test_map"], abs=1e-4)

    def stop(record, *_):
        if record["epoch"] == 2:
            raise Stop

    with pytest.raises(Stop):
        train_run("linear", splits, "an", {}, cfg, out=tmp_path / "b", head="mlp", hidden=16,
                  checkpoint_seconds=0, dataset_options={"subsample": 0.2}, on_epoch=stop)
    (folder,) = (tmp_path / "b").iterdir()
    again = resume_run(folder)
    assert (again["val_map"], again["test_map"]) == (res["val_map"], res["test_map"])
    plain = train_run("linear", splits, "an", {}, cfg)
    linear = train_run("linear", splits, "an", {}, cfg, head="linear", hidden=3)
    assert (plain["val_map"], plain["test_map"]) == (linear["val_map"], linear["test_map"])
    assert plain["test_map"] != res["test_map"]
    with pytest.raises(ValueError, match="head must be one of"):
        train_run("linear", splits, "an", {}, cfg, head="deep")
