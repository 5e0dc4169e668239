"""LAC as a recipe (spmlkit.methods.lac): stages, ablations, checkpoints, resume, schedule, views.

Tiny: 24 / 12 / 12 toy images of 16 px, tiny_cnn (8 channels, 2 x 2 maps), a d = 8 head.
"""
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _image_toy import toy_splits

from spmlkit.data import LabelledSet, Splits
from spmlkit.engine import TrainConfig
from spmlkit.methods import lac as lac_mod
from spmlkit.methods import load_run_model, train_run
from spmlkit.methods.lac import (ABLATIONS, CHECKPOINT_FILE, LACConfig, ablation_config,
                                 config_of, id_options, resolve_train_config)
from spmlkit.runs import load_torch

BACKBONE = {"width": 4, "num_features": 8, "input_size": 16}
SMALL = {"dim": 8, "heads": 2, "ffn": 16, "proj_dim": 8, "queue_size": 16, "weak_views": 2,
         "strong_views": 2, "ema_decay": 0.9}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lac")
    return {"splits": toy_splits(root), "cache": root / "cache", "root": root}


def run(toy, lac=None, out=None, epochs=4, on_epoch=None, resume=None, **kw):
    return train_run("lac", toy["splits"], "an", None,
                     TrainConfig(epochs=epochs, batch_size=8, lr=1e-2, seed=0),
                     **{**SMALL, **(lac or {})}, backbone="tiny_cnn",
                     backbone_options=BACKBONE, pretrained=False, cache_dir=toy["cache"],
                     progress=False, out=out, on_epoch=on_epoch, resume=resume,
                     features={"num_workers": 0}, **kw)


def records(run_dir):
    return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


class Stop(Exception):
    pass


def stop_at(stage, stage_epoch):
    def hook(record, model, loss):
        if (record["stage"], record["stage_epoch"]) == (stage, stage_epoch):
            raise Stop
    return hook


# ---- configuration ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad, field", [
    ({"delta1": 0.4}, "delta1"), ({"delta2": 1.2}, "delta2"), ({"temperature": 0}, "temperature"),
    ({"queue_size": -1}, "queue_size"), ({"dim": 10, "heads": 4}, "dim"),
    ({"pct_start": 1.0}, "pct_start"), ({"views": "video"}, "views"), ({"plc": 1}, "plc"),
    ({"lac": False, "stage2_epochs": 3}, "stage2_epochs"),
    ({"train_backbone": True}, "train_backbone"), ({"ema_decay": 1.5}, "ema_decay"),
])
def test_bad_config_names_the_field(bad, field):
    with pytest.raises(ValueError, match=f"LACConfig.{field}"):
        LACConfig(**bad)


def test_config_dicts_stages_and_train_config():
    with pytest.raises(ValueError, match="unknown LAC option.*'dimm'"):
        LACConfig.from_dict({"dimm": 8})
    with pytest.raises(ValueError, match="unknown LAC ablation"):
        ablation_config("an_lac")
    with pytest.raises(ValueError, match="at least one epoch each"):
        LACConfig().stages(1)
    assert LACConfig().stages(5) == [(1, 3, 0.6), (2, 2, 0.9)]
    assert LACConfig(stage1_epochs=4).stages(10) == [(1, 4, 0.6), (2, 6, 0.9)]
    assert LACConfig(lac=True, two_stage=False).stages(7) == [(1, 7, 0.6)]
    assert [ablation_config(a).num_stages for a in ABLATIONS] == [1, 1, 2, 1, 2]
    official = resolve_train_config(None, LACConfig())  # the paper's 40 epochs, 32, 1e-4
    assert (official.epochs, official.batch_size, official.lr) == (40, 32, 1e-4)
    grid = resolve_train_config(TrainConfig(epochs=9, batch_size=16, lr=1e-3),
                                LACConfig(stage1_epochs=2, stage2_epochs=3, batch_size=8))
    assert (grid.epochs, grid.batch_size, grid.lr) == (5, 8, 1e-3)


def test_options_are_flat_and_the_nested_form_reads_the_same():
    """LAC's options are flat, as every method's (``--option dim=64``, ``mode_options: {dim:
    64}``); the nested ``lac={...}`` of earlier versions reads into the same config, and a
    study's run id hashes both as it always did (nested), so ids stay."""
    assert config_of({"dim": 64, "lac": False}) == LACConfig(dim=64, lac=False)
    assert config_of({"lac": {"dim": 64, "lac": False}}) == LACConfig(dim=64, lac=False)
    assert config_of({"lac": {"queue_size": 512}, "queue_size": 64}).queue_size == 64  # flat wins
    assert config_of({"ablation": "an", "dim": 8}) == LACConfig(plc=False, lac=False, dim=8)
    assert config_of({"dim": None}) == LACConfig()  # None: the default
    with pytest.raises(ValueError, match=r"unknown LAC option\(s\) \['dimm'\] in lac="):
        config_of({"lac": {"dimm": 8}})
    with pytest.raises(ValueError, match="unknown LAC option.*'dimm'"):
        config_of({}, dimm=8)
    flat = {"backbone": "tiny_cnn", "dim": 8, "lac": False}
    nested = {"backbone": "tiny_cnn", "lac": {"dim": 8, "lac": False}}
    assert id_options(flat) == id_options(nested) == nested
    assert id_options({"backbone": "tiny_cnn"}) == {"backbone": "tiny_cnn"}


def test_feature_splits_and_mismatched_resume_are_refused(toy, tmp_path):
    s = toy["splits"]
    feats = Splits("f", LabelledSet(np.zeros((24, 5), np.float32), s.train.y, s.class_names),
                   s.val, s.test, s.observed, s.val_observed, "1p", s.k)
    with pytest.raises(ValueError, match="feature vectors"):
        train_run("lac", feats, "an", **SMALL)
    res = run(toy, {"plc": False, "lac": False}, out=tmp_path, epochs=1)
    with pytest.raises(ValueError, match="other settings.*lac"):
        run(toy, {"plc": True, "lac": False}, epochs=1, resume=res["run_dir"])


# ---- stages and ablations --------------------------------------------------------------------
def test_ablation_switches(toy, tmp_path):
    an = run(toy, ABLATIONS["an"], out=tmp_path, epochs=2)
    plc = run(toy, ABLATIONS["an_plc"], out=tmp_path, epochs=2)
    full = run(toy, ABLATIONS["an_plc_lac"], out=tmp_path, epochs=4)
    r_an, r_plc, r_full = (records(r["run_dir"]) for r in (an, plc, full))
    assert [r["stage"] for r in r_an] == [1, 1] and an["stage_epochs"] == [2]
    for r in r_an:  # AN alone: the loss is the base loss, nothing else is computed
        assert r["train_loss"] == pytest.approx(r["base_loss"])
        assert "plc_loss" not in r and "lac_loss" not in r
    for r in r_plc:
        assert r["train_loss"] == pytest.approx(r["base_loss"] + r["plc_loss"])
        assert r["plc_loss"] > 0 and "lac_loss" not in r
    assert [r["stage"] for r in r_full] == [1, 1, 2, 2] and full["stage_epochs"] == [2, 2]
    assert [r["delta"] for r in r_full] == [0.6, 0.6, 0.9, 0.9]
    assert all("lac_loss" not in r for r in r_full[:2])
    for r in r_full[2:]:
        assert r["lac_loss"] > 0 and 0 < r["queue"] <= 16  # valid items of the 16-slot queue
        assert r["train_loss"] == pytest.approx(r["base_loss"] + r["plc_loss"] + r["lac_loss"])
    # the same stage-1 training with or without a later stage 2: identical first epochs
    assert r_full[0]["val_map_model"] == r_plc[0]["val_map_model"]
    assert an["val_map"] != plc["val_map"]
    for r in r_full:
        assert r["val_map"] == max(r["val_map_model"], r["val_map_ema"])
        assert r["val_source"] == ("ema" if r["val_map_ema"] > r["val_map_model"] else "model")
    best = max(r_full, key=lambda r: r["val_map"])
    assert (full["best_epoch"], full["best_stage"], full["best_source"]) == \
        (best["epoch"], best["stage"], best["val_source"])


def test_stage_two_starts_from_stage_one_best_and_adds_the_projection_head(toy, monkeypatch):
    seen = {"projector_trained": [], "projector": [], "start": [], "ema_updates": []}
    setup = lac_mod._LACRecipe.setup

    def spy_setup(self, index):  # each stage's set-up, after the hand-over of weights
        parts = setup(self, index)
        seen["recipe"] = self
        trained = {id(p) for g in parts.optimizer.param_groups for p in g["params"]}
        seen["projector_trained"].append(
            all(id(p) in trained for p in self.model.head.projector.parameters()))
        seen["projector"].append(lac_mod._state(self.model.head.projector))
        seen["start"].append(lac_mod._state(self.model))
        seen["ema_updates"].append(self.ema.updates)
        return parts

    best = {}

    def hook(record, model, loss):  # the weights that won each better stage-1 epoch
        if record["stage"] == 1 and record["best"]:
            best.update(stage=record["stage"], source=record["val_source"],
                        model=seen["recipe"].weights(record["val_source"]))

    monkeypatch.setattr(lac_mod._LACRecipe, "setup", spy_setup)
    # lr 1e-2 with an EMA of 0.9: stage 1's best may be either; the start must be that one
    res = run(toy, {"stage1_epochs": 3, "stage2_epochs": 1}, on_epoch=hook)
    assert seen["projector_trained"] == [False, True]
    assert best["stage"] == 1 and best["source"] in ("model", "ema")
    for key, value in best["model"].items():
        assert torch.equal(seen["start"][1][key], value), key
    assert seen["ema_updates"] == [0, 0]  # a fresh EMA of each stage's start
    # the projection head was not trained (nor decayed) in stage 1
    for key, value in seen["projector"][0].items():
        assert torch.equal(seen["projector"][1][key], value)
    assert res["stage_epochs"] == [3, 1]


def test_stage_two_starts_from_the_best_epoch_not_the_last(toy, monkeypatch):
    """Stage 1's best epoch is its first (the val scores are scripted), so its last weights
    differ from its best: stage 2 must start from the best (a start from the last weights, a
    mutation the test above cannot see when stage 1's last epoch is also its best, fails
    here)."""
    scores = iter([90.0, 10.0, 10.0, 5.0])
    monkeypatch.setattr(lac_mod._LACRecipe, "evaluators",
                        lambda self: {"model": lambda: next(scores)})
    seen, setup = {}, lac_mod._LACRecipe.setup

    def spy_setup(self, index):
        parts = setup(self, index)
        seen["recipe"], seen[f"start{index}"] = self, lac_mod._state(self.model)
        return parts

    def hook(record, model, loss):
        if record["stage"] == 1:
            seen[record["stage_epoch"]] = seen["recipe"].weights("model")

    monkeypatch.setattr(lac_mod._LACRecipe, "setup", spy_setup)
    res = run(toy, {"stage1_epochs": 3, "stage2_epochs": 1}, on_epoch=hook)
    assert res["best_epoch"] == 1 and res["stage_epochs"] == [3, 1]
    moved = [k for k in seen[1] if not torch.equal(seen[1][k], seen[3][k])]
    assert moved  # stage 1 trained on: its last weights are not its best
    for key, value in seen[1].items():
        assert torch.equal(seen["start1"][key], value), key


# ---- schedule ---------------------------------------------------------------------------------
def test_one_cycle_lr_trace_per_stage(toy):
    lrs = []

    def hook(record, model, loss):
        lrs.append(record["lr"])

    run(toy, {"stage1_epochs": 3, "stage2_epochs": 2}, on_epoch=hook)

    def reference(total, after):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=1e-2)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=total,
                                                    pct_start=0.2)
        for _ in range(after):
            opt.step()
            sched.step()
        return sched.get_last_lr()[0]

    # the lr of each epoch's last step (after 3e - 1 scheduler steps), 9 then 6 steps a cycle
    expected = [reference(9, 3 * e - 1) for e in (1, 2, 3)] + \
        [reference(6, 3 * e - 1) for e in (1, 2)]
    assert lrs == pytest.approx(expected, rel=1e-9)
    assert lrs[0] > lrs[1] > lrs[2] and lrs[3] > lrs[4]  # stage 2 restarts the cycle
    assert lrs[2] == pytest.approx(1e-2 / 25 / 1e4) == lrs[4]  # OneCycle's floor at the end
    assert reference(9, 0) == pytest.approx(1e-2 / 25)  # warm-up starts at max_lr / 25


# ---- checkpoints and resume -------------------------------------------------------------------
def test_checkpoint_round_trip_of_the_whole_state(toy, tmp_path, monkeypatch):
    captured = {}

    def hook(record, model, loss):
        if record["stage"] == 2:
            recipe = captured["recipe"]
            captured.update(model=lac_mod._state(model),
                            ema=lac_mod._state(recipe.ema.module),
                            queue=lac_mod._state(recipe.queue), updates=recipe.ema.updates)
            raise Stop

    setup, start = lac_mod._LACRecipe.setup, lac_mod._LACStep.on_epoch_start

    def spy_setup(self, index):
        captured["recipe"] = self
        return setup(self, index)

    def spy_start(self, epoch):  # the first epoch after the resume: the state as loaded
        if captured.get("resumed") and "reloaded" not in captured:
            r = self.recipe
            captured["reloaded"] = copy.deepcopy({
                "model": lac_mod._state(r.model), "loss": lac_mod._state(r.loss),
                "queue": lac_mod._state(r.queue), "ema": self.ema.state_dict(),
                "scheduler": self.sched.state_dict(), "optimizer": self.opt.state_dict()})
        start(self, epoch)

    monkeypatch.setattr(lac_mod._LACRecipe, "setup", spy_setup)
    monkeypatch.setattr(lac_mod._LACStep, "on_epoch_start", spy_start)
    with pytest.raises(Stop):
        run(toy, {"stage1_epochs": 2, "stage2_epochs": 2}, out=tmp_path, on_epoch=hook)
    run_dir = next(tmp_path.iterdir())
    ckpt = load_torch(run_dir / CHECKPOINT_FILE)  # weights_only=True: no pickled code
    parts = ckpt["parts"]
    assert (ckpt["stage"], ckpt["stage_epoch"], ckpt["stage_done"]) == (1, 1, False)
    assert parts["ema"]["updates"] == captured["updates"] == 3
    valid = (parts["queue"]["labels"] >= 0).tolist()   # the filled slots are a prefix
    assert 0 < int(parts["queue"]["ptr"]) <= sum(valid) and valid == sorted(valid, reverse=True)
    for key, value in captured["model"].items():
        assert torch.equal(ckpt["model"][key], value), key
    for key, value in captured["queue"].items():
        assert torch.equal(parts["queue"][key], value), key
    for key, value in captured["ema"].items():
        assert torch.equal(parts["ema"]["module"][key], value), key
    assert ckpt["best"]["stage"] in (1, 2) and len(ckpt["history"]) == 3
    captured["resumed"] = True
    run(toy, {"stage1_epochs": 2, "stage2_epochs": 2}, resume=run_dir)
    back = captured["reloaded"]  # the state right after loading the checkpoint
    for name, saved in (("model", ckpt["model"]), ("queue", parts["queue"]),
                        ("loss", ckpt["loss"])):
        assert back[name].keys() == saved.keys()
        assert all(torch.equal(back[name][k], saved[k]) for k in saved), name
    assert all(torch.equal(back["ema"]["module"][k], v)
               for k, v in parts["ema"]["module"].items())
    assert back["scheduler"]["last_epoch"] == parts["scheduler"]["last_epoch"] == 3
    opt_a, opt_b = back["optimizer"]["state"], ckpt["optimizer"]["state"]
    assert opt_a.keys() == opt_b.keys() and all(
        torch.equal(opt_a[i]["exp_avg"], opt_b[i]["exp_avg"]) for i in opt_b)


@pytest.mark.parametrize("stage", [1, 2])
def test_resume_gives_the_uninterrupted_result(toy, tmp_path, stage):
    lac = {"stage1_epochs": 2, "stage2_epochs": 2}
    whole = run(toy, lac, out=tmp_path / "whole")
    with pytest.raises(Stop):
        run(toy, lac, out=tmp_path / "cut", on_epoch=stop_at(stage, 1))
    cut_dir = next((tmp_path / "cut").iterdir())
    assert len(records(cut_dir)) == 1 + 2 * (stage == 2)
    resumed = run(toy, lac, resume=cut_dir)
    for key in ("val_map", "test_map", "train_recovery_map", "best_epoch", "best_source",
                "epochs_run"):
        assert resumed[key] == whole[key], key
    strip = [{k: v for k, v in r.items()} for r in records(whole["run_dir"])]
    assert json.dumps(records(cut_dir)) == json.dumps(strip)
    a = load_torch(f"{whole['run_dir']}/best.pt")["model"]
    b = load_torch(cut_dir / "best.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    again = run(toy, lac, resume=cut_dir)  # a finished run: its final.json
    assert again["test_map"] == whole["test_map"]


class Payload:
    """Unpickling this calls ``open(marker, "w")``: creates the marker file (harmless code that
    shows whether a load ran pickled code)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoints_holding_pickled_code_are_refused(toy, tmp_path):
    """A run folder received from someone else: resume and load_run_model load checkpoint.pt /
    best.pt with weights_only=True, refuse pickled code with a ValueError and run nothing."""
    lac = {"plc": False, "lac": False}
    with pytest.raises(Stop):
        run(toy, lac, out=tmp_path / "cut", epochs=2, on_epoch=stop_at(1, 1))
    cut = next((tmp_path / "cut").iterdir())
    marker = tmp_path / "marker"
    torch.save({"model": Payload(marker)}, cut / CHECKPOINT_FILE)
    # (runs.load_torch names the refused global on the torch versions whose message it parses)
    with pytest.raises(ValueError, match=f"{CHECKPOINT_FILE}: (refused|not a readable)"):
        run(toy, lac, epochs=2, resume=cut)
    assert not marker.exists()
    torch.save({"format": 1, "stage_index": 0}, cut / CHECKPOINT_FILE)  # an older spmlkit's
    with pytest.raises(ValueError, match="format is 1.*not a training state of this spmlkit"):
        run(toy, lac, epochs=2, resume=cut)
    done = run(toy, lac, out=tmp_path / "done", epochs=1)["run_dir"]
    torch.save({"mode": "lac", "model": Payload(marker)}, f"{done}/best.pt")
    with pytest.raises(ValueError, match="best.pt: (refused|not a readable)"):
        load_run_model(done)
    assert not marker.exists()
    torch.load(f"{done}/best.pt", weights_only=False)  # the payload is real: it runs when
    assert marker.exists()                              # loaded the unsafe way


def test_pl_precision_is_a_fraction_as_every_other_trainer(toy):
    """PLC's pseudo-label precision is the fraction of the pseudo-positives that are true
    positives, in [0, 1] (spmlkit.metrics.pseudo_label_stats), not a percentage."""
    records = []
    run(toy, {"lac": False, "delta1": 0.5}, epochs=2,
        on_epoch=lambda record, model, loss: records.append(record))
    counted = [r for r in records if r["pl_count"] > 0]
    assert counted and any(r["pl_precision"] > 0 for r in counted)
    for r in counted:
        hits = r["pl_precision"] * r["pl_count"]  # the true pseudo-positives: a whole number
        assert 0 < r["pl_precision"] <= 1 or r["pl_precision"] == 0
        assert hits == pytest.approx(round(hits), abs=1e-9) and round(hits) <= r["pl_count"]


# ---- outputs and the end-to-end path ----------------------------------------------------------
def test_run_folder_and_model_loader(toy, tmp_path):
    res = run(toy, {"stage1_epochs": 1, "stage2_epochs": 1}, out=tmp_path)
    folder = res["run_dir"]
    pred = np.load(f"{folder}/predictions.npz")
    assert pred["probs_test"].shape == (12, 3) and int(pred["best_epoch"]) == res["best_epoch"]
    final = json.load(open(f"{folder}/final.json"))
    assert final["test_map"] == res["test_map"] and final["mode"] == "lac"
    model, info = load_run_model(folder)
    from spmlkit.metrics import map_score
    from spmlkit.data.transforms import eval_transform
    from spmlkit.data.image_files import open_image
    t = eval_transform(16, info["mean"], info["std"])
    x = torch.stack([t(open_image(p)) for p in toy["splits"].test.x])
    with torch.no_grad():
        probs = torch.sigmoid(model(x)).numpy()
    # the loaded model (backbone + head) reproduces the run's float16-map predictions closely
    assert np.abs(probs - pred["probs_test"]).max() < 2e-2
    assert map_score(probs, toy["splits"].test.y) == pytest.approx(res["test_map"], abs=2.0)
    assert model.attention_maps(x).shape == (12, 3, 2, 2)


@pytest.mark.parametrize("train_backbone", [True, False])
def test_end_to_end_image_views_run_and_train_the_backbone_or_not(toy, train_backbone):
    from spmlkit.models.backbones import create_backbone

    net = create_backbone("tiny_cnn", pretrained=False, **BACKBONE)
    start = lac_mod._state(net)
    res = train_run("lac", toy["splits"], "an", None,
                    TrainConfig(epochs=2, batch_size=8, lr=1e-2),
                    **{**SMALL, "views": "images", "train_backbone": train_backbone},
                    backbone=net, progress=False)
    assert res["views"] == "images" and res["stage_epochs"] == [1, 1]
    assert 0 <= res["test_map"] <= 100
    moved = max(float((net.state_dict()[k] - v).abs().max()) for k, v in start.items())
    assert (moved > 0) == train_backbone


def test_cli_train_mode_lac_and_resume(toy, tmp_path, capsys):
    import shutil

    from spmlkit.cli import main

    tree = tmp_path / "tree"  # a folder source: each image in the folder of its first class
    s = toy["splits"]
    for i, (path, y) in enumerate(zip(s.train.x + s.val.x, np.r_[s.train.y, s.val.y])):
        (tree / s.class_names[int(np.argmax(y))]).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, tree / s.class_names[int(np.argmax(y))] / f"{i}.png")
    args = ["train", "--mode", "lac", "--dataset", "folder", "--data", f"root={tree}",
            "--backbone", "tiny_cnn", "--random-init", "--image-size", "16", "--epochs", "2",
            "--batch-size", "8", "--lr", "0.01", "--workers", "0", "--quiet",
            "--cache-dir", str(toy["cache"]), "--out", str(tmp_path / "runs")]
    lac = [f"--option={k}={v}" for k, v in {**SMALL, "plc": "false"}.items()]
    assert main(args + lac) == 0
    out = capsys.readouterr().out
    run_dir = out.split("run folder: ")[1].strip()
    cfg = json.load(open(f"{run_dir}/config.json"))
    assert cfg["mode"] == "lac" and cfg["lac"]["plc"] is False and cfg["lac"]["dim"] == 8
    assert cfg["stages"] == [[1, 1, 0.6], [2, 1, 0.9]] and cfg["train"]["batch_size"] == 8
    final = json.load(open(f"{run_dir}/final.json"))
    assert f"test mAP {final['test_map']:.2f}" in out
    assert main(["train", "--resume", run_dir, "--quiet"]) == 0  # finished: its result
    assert f"test mAP {final['test_map']:.2f}" in capsys.readouterr().out
    from spmlkit.experiments.figures import attention_from_run

    ov = attention_from_run(run_dir, split="val", n=3)  # LAC Fig. 6 on the run's own images
    assert ov.maps.shape == (3, 3, 2, 2) and ov.kind == "attention"
    assert np.allclose(ov.maps.sum(axis=(2, 3)), 1, atol=1e-5)  # softmax weights per label
    png = tmp_path / "att.png"
    assert main(["figure", "attention", run_dir, "--split", "val", "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # spml predict on the LAC run: the loaded label-wise model on new images, val thresholds
    from spmlkit.predict import predict_run

    pred = predict_run(run_dir, s.test.x[:4])
    model, info = load_run_model(run_dir)
    from spmlkit.data.image_files import open_image
    from spmlkit.data.transforms import eval_transform

    t = eval_transform(info["image_size"], info["mean"], info["std"])
    with torch.no_grad():
        direct = torch.sigmoid(model(torch.stack([t(open_image(p)) for p in s.test.x[:4]])))
    assert pred.probs.shape == (4, 3) and pred.class_names == info["class_names"]
    assert np.allclose(pred.probs, direct.numpy(), atol=1e-5)
    assert main(["predict", run_dir, *s.test.x[:2], "--format", "json"]) == 0
    assert '"labels"' in capsys.readouterr().out
    assert main(args + ["--option", "dimm=8"]) == 2
    assert "no option(s) ['dimm'] (did you mean 'dim'?)" in capsys.readouterr().err
    assert main(args + ["--lac", "dim=10"]) == 2  # the deprecated flag: --option's
    assert "LACConfig.dim must be a multiple of 4" in capsys.readouterr().err


def test_cached_maps_average_to_the_pooled_features(toy):
    from spmlkit.features import extract_feature_maps, extract_features
    from spmlkit.models.backbones import create_backbone

    net = create_backbone("tiny_cnn", pretrained=False, **BACKBONE)
    items = toy["splits"].test.x
    opts = {"cache_dir": toy["cache"], "progress": False, "num_workers": 0}
    maps = extract_feature_maps(items, net, "eval", 16, **opts)
    pooled = extract_features(items, net, "eval", 16, **opts)
    assert maps.shape == (12, 8, 2, 2) and maps.dtype == np.float16
    assert np.abs(maps.astype(np.float32).mean(axis=(2, 3)) - pooled).max() < 1e-2
    weak0 = extract_feature_maps(items, net, "weak", 16, seed=0, **opts)
    weak1 = extract_feature_maps(items, net, "weak", 16, seed=1, **opts)  # another flip draw
    assert Path(weak0.filename).parent != Path(weak1.filename).parent
    assert not np.array_equal(weak0, weak1)


def test_every_registered_loss_trains_on_the_label_wise_model(toy):
    """The paper's "LEM" columns: any registered loss (per-example state included: ROLE's
    estimator, EM+APL's pseudo-labels, LL-Cp's corrections) as the base loss of the label-wise
    embedding model, without PLC / LAC."""
    from spmlkit.losses import LOSSES

    from spmlkit.losses.scorer import simulated_scores

    for name in LOSSES.names():
        hp = {"warmup": 1} if name == "em_apl" else None  # pseudo-labels from epoch 1 on
        if getattr(LOSSES.get(name).factory, "needs_scores", False):  # an external scorer's
            hp = {"scores": simulated_scores(toy["splits"].train.y, flip=0.1)}
        res = train_run("lac", toy["splits"], name, hp,
                        TrainConfig(epochs=2, batch_size=8, lr=1e-2),
                        **{**SMALL, "plc": False, "lac": False},
                        backbone="tiny_cnn", backbone_options=BACKBONE, pretrained=False,
                        cache_dir=toy["cache"], progress=False, features={"num_workers": 0})
        assert np.isfinite(res["val_map"]) and np.isfinite(res["test_map"]), name
        assert res["loss"] == name and res["best_stage"] == 1, name


def test_role_rows_is_refused_by_lacs_adamw(toy):
    """ROLE's estimator_update="rows" gives its estimator row-wise (sparse) gradients, which
    LAC's AdamW with its OneCycle schedule does not step: refused by name, not trained wrong."""
    with pytest.raises(ValueError, match=r"--mode lac: ROLELoss.*estimator_update='rows'.*"
                                         r"leave estimator_update at 'dense'"):
        train_run("lac", toy["splits"], "role", {"estimator_update": "rows"},
                  TrainConfig(epochs=1, batch_size=8, lr=1e-2),
                  **{**SMALL, "plc": False, "lac": False}, backbone="tiny_cnn",
                  backbone_options=BACKBONE, pretrained=False, cache_dir=toy["cache"],
                  progress=False, features={"num_workers": 0})
