"""Images as a user has them (issue 24): PNGs on disk in the ``folder`` and ``csv`` layouts, one
known tag per training image and a fully labelled test CSV; what the runs select on and report,
``spml extract --limit``, corrupt and empty inputs."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from spmlkit.cli import main
from spmlkit.loading import load_splits
from spmlkit.data.protocol import describe_labels
from spmlkit.metrics import f1_micro_macro, hamming_loss

NAMES = ["red", "green", "blue"]


@pytest.fixture
def tagged(tmp_path):
    """24 training PNGs with one known tag each (a random one of their positives), as a
    ``train/<tag>/`` tree and as ``tags.csv``; 16 test PNGs listed with every positive in
    ``test.csv``."""
    from _image_toy import make_images

    paths, y = make_images(tmp_path / "pool", 24, seed=1)
    test_paths, y_test = make_images(tmp_path / "test", 16, seed=2)
    rng = np.random.default_rng(0)
    rows = []
    for p, labels in zip(paths, y):
        tag = NAMES[int(rng.choice(np.flatnonzero(labels)))]
        (tmp_path / "train" / tag).mkdir(parents=True, exist_ok=True)
        shutil.copy(p, tmp_path / "train" / tag / Path(p).name)
        rows.append(f"train/{tag}/{Path(p).name},{tag}")
    (tmp_path / "tags.csv").write_text("path,labels\n" + "\n".join(rows) + "\n")
    (tmp_path / "test.csv").write_text("path,labels\n" + "".join(
        f"test/{Path(p).name},{';'.join(NAMES[j] for j in np.flatnonzero(t))}\n"
        for p, t in zip(test_paths, y_test)))
    return tmp_path, y_test


# ---- A1: a folder of tagged images is observed labels ------------------------------------------
def test_folder_with_a_test_csv_selects_on_fully_labelled_val(tagged):
    root, y_test = tagged
    s = load_splits("folder", root=str(root / "train"), test_csv=str(root / "test.csv"))
    assert s.meta["val_from"] == "test" and not s.train_labels_complete
    assert len(s.train) == 24 and len(s.val) + len(s.test) == 16
    assert (s.observed == 1).sum(1).tolist() == [1] * 24          # the folder tag, nothing more
    assert s.val.y.sum(1).max() > 1                                # val: every positive
    assert s.k == pytest.approx(s.val.y.sum(1).mean()) and s.k > 1
    summary = describe_labels(s)["summary"]
    assert summary.startswith("regime 1p: observed training labels from")
    assert "carved out of the test set" in summary and "from the val labels" in summary
    # the folder's one-tag labels everywhere, asked for: never called full
    full = load_splits("folder", root=str(root / "train"), test_csv=str(root / "test.csv"),
                       train_labels="full")
    summary = describe_labels(full)["summary"]
    assert "val (5 rows split from the training rows) labelled with the folder class only" in \
        summary and "test (16 rows) fully labelled" in summary
    alone = describe_labels(load_splits("folder", root=str(root / "train")))["summary"]
    assert "fully labelled" not in alone and "labelled with the folder class only" in alone


def test_cli_folder_run_prints_where_val_comes_from(tagged, capsys):
    root, _ = tagged
    assert main(["train", "--solver", "adam", "--dataset", "folder", "--data",
                 f"root={root / 'train'}", "--data",
                 f"test_csv={root / 'test.csv'}", "--backbone", "tiny_cnn", "--cache-dir",
                 str(root / "cache"), "--epochs", "2", "--quiet", "--lr", "1e-2"]) == 0
    labels = next(line for line in capsys.readouterr().out.splitlines()
                  if line.startswith("labels:"))
    assert "val (3 rows carved out of the test set, fraction 0.2) and test (13 rows) fully " \
           "labelled" in labels


# ---- A2: one threshold policy ----------------------------------------------------------------
def test_summary_f1_and_hamming_use_the_val_threshold_predict_uses(tagged, capsys):
    root, _ = tagged
    out = root / "runs"
    assert main(["train", "--solver", "adam", "--dataset", "csv", "--data",
                 f"path={root / 'tags.csv'}", "--data",
                 f"test_path={root / 'test.csv'}", "--data", "train_labels=observed",
                 "--regime", "given", "--backbone", "tiny_cnn", "--cache-dir",
                 str(root / "cache"), "--epochs", "3", "--lr", "1e-2", "--quiet", "--out",
                 str(out)]) == 0
    printed = capsys.readouterr().out
    (run,) = out.iterdir()
    final = json.loads((run / "final.json").read_text())
    chosen = json.loads((run / "thresholds.json").read_text())["global"]
    pred = np.load(run / "predictions.npz")
    test = final["test_metrics"]
    assert test["threshold"] == pytest.approx(chosen) and chosen != 0.5
    micro, macro = f1_micro_macro(pred["probs_test"], pred["y_test"], chosen)
    assert test["micro_f1"] == pytest.approx(micro) and test["macro_f1"] == pytest.approx(macro)
    assert test["hamming_loss"] == pytest.approx(
        hamming_loss(pred["probs_test"], pred["y_test"], chosen))
    assert final["threshold"]["value"] == pytest.approx(chosen)
    assert f"(F1 and Hamming at threshold={chosen:.4g}: chosen on val, max val micro-F1" in \
        printed
    # spml predict's default labels are the same decisions
    assert main(["predict", str(run), str(root / "test" / "img000.png"), "--format",
                 "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["threshold"]["value"] == pytest.approx(chosen)


# ---- A3: extract --limit with observed training labels ------------------------------------------
@pytest.mark.parametrize("layout", ["csv", "folder"])
def test_extract_limit_with_observed_training_labels(tagged, layout, capsys):
    root, _ = tagged
    data = [f"path={root / 'tags.csv'}", f"test_path={root / 'test.csv'}"] if layout == "csv" \
        else [f"root={root / 'train'}", f"test_csv={root / 'test.csv'}"]
    args = ["extract", "--dataset", layout, *[a for d in data for a in ("--data", d)],
            "--data", "train_labels=observed", "--backbone", "tiny_cnn", "--cache-dir",
            str(root / "cache"), "--workers", "0", "--quiet", "--limit", "5"]
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"{layout} pool: 5 x " in out and f"{layout} test: 5 x " in out


# ---- B: corrupt files ------------------------------------------------------------------------
def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _finetune(root, *extra):
    return ["train", "--dataset", "folder", "--data", f"root={root / 'train'}", "--data",
            f"test_csv={root / 'test.csv'}", *extra, "--mode", "finetune", "--backbone",
            "tiny_cnn", "--random-init", "--image-size", "16", "--epochs", "1", "--lr", "1e-2",
            "--workers", "0", "--quiet", "--out", str(root / "runs")]


def test_finetune_names_a_truncated_png_before_training(tagged, capsys):
    root, _ = tagged
    bad = sorted((root / "train").rglob("*.png"))[7]
    _truncate(bad)
    assert main(_finetune(root)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spml train: error: folder train: ")
    assert f"{bad}: not a readable image (OSError: image file is truncated" in err[0]
    assert "--data skip_corrupt=true" in err[0] and "Traceback" not in err[0]
    assert not (root / "runs").exists()                        # nothing started


def test_skip_corrupt_records_the_files_in_the_run_folder(tagged, capsys):
    root, _ = tagged
    bad = sorted((root / "train").rglob("*.png"))[7]
    _truncate(bad)
    with pytest.warns(UserWarning, match=r"folder pool: skipped 1 item\(s\): 1 with an "
                                         r"unreadable image"):
        assert main(_finetune(root, "--data", "skip_corrupt=true")) == 0
    captured = capsys.readouterr()
    (run,) = (root / "runs").iterdir()
    record = json.loads((run / "skipped_images.json").read_text())
    assert record == {"skipped": 1, "parts": {"pool": {"missing": [], "corrupt": [str(bad)]}}}
    assert f"skipped 1 unreadable or missing image(s) (listed in {run}/skipped_images.json)" \
        in captured.err
    import warnings  # the CLI shows the library's warnings as one plain line

    import spmlkit.data.image_files as where
    assert warnings.formatwarning("folder pool: skipped 1 item(s)", UserWarning, where.__file__,
                                  1) == "warning: folder pool: skipped 1 item(s)\n"
    assert json.loads((run / "final.json").read_text())["skipped_images"] == 1
    assert json.loads((run / "config.json").read_text())["sizes"]["train"] == 23


def test_predict_names_or_skips_an_unreadable_image(tagged, capsys):
    root, _ = tagged
    assert main(_finetune(root)) == 0
    (run,) = (root / "runs").iterdir()
    new = root / "new"
    new.mkdir()
    for name in ("img000.png", "img001.png", "img002.png"):
        shutil.copy(root / "test" / name, new / name)
    _truncate(new / "img001.png")
    capsys.readouterr()
    assert main(["predict", str(run), str(new)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{new / 'img001.png'}: not a readable image" in err and "--skip-corrupt" in err
    assert main(["predict", str(run), str(new), "--skip-corrupt", "--format", "json"]) == 0
    captured = capsys.readouterr()
    got = json.loads(captured.out)
    assert [r["item"] for r in got["predictions"]] == [str(new / "img000.png"),
                                                      str(new / "img002.png")]
    assert got["skipped"] == [str(new / "img001.png")]
    assert f"skipped 1 unreadable image(s): {new / 'img001.png'}" in captured.err


def test_extract_names_a_corrupt_file_and_leaves_no_partial_store(tagged, capsys):
    root, _ = tagged
    bad = sorted((root / "train").rglob("*.png"))[7]
    _truncate(bad)
    args = ["extract", "--dataset", "folder", "--data", f"root={root / 'train'}", "--backbone",
            "tiny_cnn", "--cache-dir", str(root / "cache"), "--workers", "0", "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert re.match(r"spml extract: error: feature extraction of these \d+ images did not "
                    r"start \(nothing was written for them; stores finished before are kept\): ",
                    err) and f"{bad}: not a readable image" in err
    masks = [np.load(m) for m in (root / "cache").rglob("done.npy")]
    assert all(m.all() for m in masks)            # complete stores only (the clean set's)
    with pytest.warns(UserWarning, match="1 with an unreadable image"):
        assert main(args + ["--data", "skip_corrupt=true"]) == 0


# ---- B: empty class folder, the advice the folder source gives -------------------------------
def test_empty_class_folder_is_a_clear_error(tagged):
    from spmlkit.loading import load_dataset

    root, _ = tagged
    (root / "train" / "yellow").mkdir()
    (root / "train" / "yellow" / "notes.txt").write_text("to do")
    with pytest.raises(ValueError, match=r"train/yellow: class folder 'yellow' holds no image "
                                         r"\(image files end in .jpg.*add its images or remove "
                                         r"the folder"):
        load_dataset("folder", root=str(root / "train"))


def test_folder_unknown_test_csv_class_gives_advice_the_folder_source_takes(tagged):
    from spmlkit.loading import load_dataset

    root, _ = tagged
    (root / "bad.csv").write_text("path,labels\ntest/img000.png,red;yellow\n")
    with pytest.raises(ValueError) as err:
        load_dataset("folder", root=str(root / "train"), test_csv=str(root / "bad.csv"))
    assert "unknown class name 'yellow'" in str(err.value)
    assert "add a class folder of that name" in str(err.value)
    assert "class_names=" not in str(err.value)
    with pytest.raises(ValueError, match="class_names"):  # the option it advised: not taken
        load_dataset("folder", root=str(root / "train"), class_names=["red"])


# ---- B: threads, progress --------------------------------------------------------------------
def test_threads_default_to_the_cores_for_image_modes(tmp_path):
    from spmlkit.cli import _threads, build_parser

    def threads(*argv):
        args = build_parser().parse_args(list(argv))
        return _threads(args)

    assert threads("train") == 1                                  # linear: 1
    assert threads("train", "--mode", "finetune", "--backbone", "tiny_cnn") is None  # the cores
    assert threads("train", "--mode", "lac") is None
    assert threads("train", "--mode", "finetune", "--threads", "3") == 3
    assert threads("benchmark") == 1
    assert threads("extract", "--dataset", "folder") is None      # extraction: its own default


def test_lac_bar_total_is_the_sum_of_its_stages():
    from spmlkit.engine import TrainConfig
    from spmlkit.methods import get_method

    lac = get_method("lac")
    config = TrainConfig(epochs=40)
    assert lac.total_epochs(config, {"stage1_epochs": 6, "stage2_epochs": 4}) == 10
    assert lac.total_epochs(config, {"lac": {"stage1_epochs": 6, "stage2_epochs": 4}}) == 10
    assert lac.total_epochs(config, {}) == 40


def test_image_training_reports_every_batch(tagged):
    from spmlkit.engine import TrainConfig
    from spmlkit.engine.loop import batch_progress
    from spmlkit.methods import train_run

    root, _ = tagged
    s = load_splits("folder", root=str(root / "train"), test_csv=str(root / "test.csv"))
    seen = []
    with batch_progress(lambda rows, per_epoch: seen.append((rows, per_epoch))):
        train_run("finetune", s, "an", config=TrainConfig(epochs=2, batch_size=10, lr=1e-2,
                                                          num_workers=0, image_size=16),
                  backbone="tiny_cnn", pretrained=False, progress=False)
    assert seen == [(10, 24), (10, 24), (4, 24)] * 2                # 3 batches an epoch


# ---- B: spml figure cam on LAC and BoostLU runs ----------------------------------------------
@pytest.mark.parametrize("name", ["lac", "boostlu", "mime"])
def test_figure_cam_on_lac_and_boostlu_runs(name, tagged, capsys):
    from spmlkit.engine import TrainConfig
    from spmlkit.experiments.figures import image_panels as fg
    from spmlkit.methods import get_method, train_run

    root, _ = tagged
    source = {"path": str(root / "test.csv")}  # fully labelled: a 1p run on it
    options = {**get_method(name).smoke_options, "cache_dir": str(root / "cache")}
    if name == "lac":
        options.update(stage1_epochs=1, stage2_epochs=1)
    run = train_run(name, load_splits("csv", **source), "an", {},
                    TrainConfig(epochs=2, batch_size=8, lr=1e-2), out=root / "runs",
                    dataset_options=source, **options)["run_dir"]
    capsys.readouterr()
    code = main(["figure", "cam", run, "--n", "2", "--out", str(root / "cam.png")])
    captured = capsys.readouterr()
    if name == "mime":  # (it ended in a traceback: the model has no head)
        assert code == 2 and "is a MIME run: its label-wise embedding head" in captured.err
        assert "Traceback" not in captured.err
        return
    if name == "lac":
        assert code == 2
        assert "is a LAC run: its label-wise embedding head has no linear classifier" in \
            captured.err and f"`spml figure attention {run}`" in captured.err
        assert main(["figure", "attention", run, "--n", "2", "--out",
                     str(root / "att.png")]) == 0
        return
    assert code == 0 and (root / "cam.png").is_file()
    assert "check: each logit is its map's mean (the CAM, bias included, with positive cells " \
           "x 5)" in captured.out
    err = float(captured.out.split("largest difference ")[1].split()[0])
    assert err < 1e-4                                      # the drawn maps are the logits'
    ov = fg.cam_from_run(run, n=2)
    assert ov.kind == "BoostLU CAM" and ov.maps.shape[:2] == (2, 3)


# ---- B: each backbone's normalisation is written down, and it is the one used ---------------
def test_every_backbone_states_its_input_normalisation():
    from spmlkit.models.backbones import backbone_spec, list_backbones

    rows = dict(list_backbones())
    assert all("normalised with" in desc for desc in rows.values()), rows
    lite = backbone_spec("efficientnet_lite0")
    assert lite["mean"] == lite["std"] == (0.5, 0.5, 0.5)
    assert "mean = std = 0.5" in rows["efficientnet_lite0"]
    assert "ImageNet's mean / std" in rows["tiny_cnn"]
    assert backbone_spec("tiny_cnn")["mean"] == (0.485, 0.456, 0.406)


# ---- B: fine-tuning options a timm user expects ----------------------------------------------
def test_lr_schedule_warmup_and_cosine():
    from spmlkit.engine import FinetuneOptions

    assert not FinetuneOptions().schedules                      # the default: constant lr
    warm = FinetuneOptions(warmup_epochs=2)
    assert [warm.lr_factor(s, 12, 3) for s in range(8)] == \
        [1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0, 1.0, 1.0]
    cos = FinetuneOptions(schedule="cosine")
    f = [cos.lr_factor(s, 5, 5) for s in range(5)]
    assert f[0] == 1.0 and f[-1] == pytest.approx(0.0) and f == sorted(f, reverse=True)
    with pytest.raises(ValueError, match="FinetuneOptions.schedule must be one of"):
        FinetuneOptions(schedule="step")
    with pytest.raises(ValueError, match="FinetuneOptions.weight_decay must be a finite number "
                                         ">= 0"):
        FinetuneOptions(weight_decay=-1)


def _tiny_finetune(s, out, **options):
    import torch

    from spmlkit.engine import TrainConfig
    from spmlkit.methods import train_run

    torch.manual_seed(0)
    return train_run("finetune", s, "an", config=TrainConfig(epochs=2, batch_size=8, lr=1e-2,
                                                             num_workers=0, image_size=16),
                     backbone="tiny_cnn", pretrained=False, progress=False,
                     backbone_options={"width": 4, "num_features": 8, "input_size": 16},
                     out=out, run_name=f"r{len(list(out.glob('r*')))}", **options)


def test_finetune_options_default_to_todays_run_and_each_changes_it(tagged):
    root, _ = tagged
    s = load_splits("folder", root=str(root / "train"), test_csv=str(root / "test.csv"))
    out = root / "runs"
    out.mkdir()

    def probs(res):
        return np.load(Path(res["run_dir"]) / "predictions.npz")["probs_test"]

    base = probs(_tiny_finetune(s, out))
    same = probs(_tiny_finetune(s, out, augment="weak", weight_decay=0.0, warmup_epochs=0.0,
                                lr_schedule="constant", cpu_bf16=False))
    np.testing.assert_array_equal(same, base)                   # the defaults: today's run
    for change in ({"augment": "strong"}, {"augment": "none"}, {"weight_decay": 0.5},
                   {"warmup_epochs": 1}, {"lr_schedule": "cosine"}, {"cpu_bf16": True}):
        assert np.abs(probs(_tiny_finetune(s, out, **change)) - base).max() > 1e-4, change


def test_cli_fine_tuning_flags_reach_the_run(tagged, capsys):
    root, _ = tagged
    assert main(_finetune(root, "--augment", "strong", "--weight-decay", "0.05",
                          "--warmup-epochs", "0.5", "--lr-schedule", "cosine")) == 0
    (run,) = (root / "runs").iterdir()
    options = json.loads((run / "config.json").read_text())["options"]
    assert (options["augment"], options["weight_decay"], options["warmup_epochs"],
            options["lr_schedule"], options["cpu_bf16"]) == ("strong", 0.05, 0.5, "cosine", False)
    with pytest.raises(SystemExit):
        main(_finetune(root, "--weight-decay", "-1"))
    assert "argument --weight-decay: expected a finite number >= 0" in capsys.readouterr().err


# ---- B: a run that ends near the trivial baseline says so ------------------------------------
def test_lac_run_near_the_trivial_baseline_warns_with_the_cause(tagged, monkeypatch):
    from spmlkit.engine import TrainConfig
    from spmlkit.methods import driver, get_method, train_run
    from spmlkit.methods.driver import trivial_map

    root, _ = tagged
    s = load_splits("csv", path=str(root / "test.csv"))
    options = {**get_method("lac").smoke_options, "cache_dir": str(root / "cache")}
    options.update(stage1_epochs=1, stage2_epochs=1)
    # 5 toy test images make any mAP noisy: the bar is raised so that this run counts as near
    # the baseline (the rule itself: test_mime_collapse_names_the_head_learning_rate)
    monkeypatch.setattr(driver, "BASELINE_LIFT", 1.0)
    res = train_run("lac", s, "an", config=TrainConfig(epochs=2, batch_size=8, lr=1e-5),
                    **options)
    monkeypatch.undo()
    assert res["trivial_test_map"] == pytest.approx(trivial_map(s.test.y))
    (note,) = [w for w in res["warnings"] if "trivial baseline" in w]
    assert "LAC's lr 1e-05 is the paper's OneCycle peak for 40 epochs" in note
    assert "try --lr 1e-3" in note
    good = train_run("finetune", s, "an", config=TrainConfig(epochs=2, batch_size=8, lr=1e-2,
                                                             image_size=16, num_workers=0),
                     backbone="tiny_cnn", pretrained=False, progress=False)
    assert good["test_map"] > good["trivial_test_map"] + 0.15 * (100 - good["trivial_test_map"])
    assert not any("trivial baseline" in w for w in good["warnings"])


def test_mime_collapse_names_the_head_learning_rate():
    from spmlkit.engine import TrainConfig
    from spmlkit.methods import get_method
    from spmlkit.methods.driver import baseline_warning, trivial_map

    y = np.array([[1, 0], [0, 1], [1, 1], [0, 0]])
    assert trivial_map(y) == pytest.approx(100 * (0.5 + 0.5) / 2)  # AP = prevalence
    note = baseline_warning(get_method("mime"), TrainConfig(epochs=10, lr=1e-3), {}, 36.7, 34.4)
    assert "MIME trains its head at lr x head_lr_mult = 0.001 x 10 = 0.01" in note
    assert "try --lr 0.0001" in note
    assert baseline_warning(get_method("finetune"), TrainConfig(lr=1e-3), {}, 75.5, 34.4) is None
    lac = baseline_warning(get_method("lac"), TrainConfig(epochs=10, lr=1e-4), {}, 41.0, 34.4)
    assert "LAC's lr 0.0001 is the paper's OneCycle peak" in lac and "10-epoch" in lac
    assert baseline_warning(get_method("lac"), TrainConfig(lr=1e-3), {}, 66.0, 34.4) is None


def test_a_run_records_the_opt_in_speed_ups_it_trained_with(tagged):
    """``--compile`` changes bits (fused kernels round differently): the run's config.json
    says it trained with it; a run without any has no such entry."""
    pytest.importorskip("torch._inductor")
    root, _ = tagged
    base = ["train", "--dataset", "folder", "--data", f"root={root / 'train'}", "--data",
            f"test_csv={root / 'test.csv'}", "--mode", "finetune", "--backbone", "tiny_cnn",
            "--image-size", "16", "--epochs", "1", "--batch-size", "8", "--workers", "0",
            "--quiet"]
    assert main(base + ["--out", str(root / "plain")]) == 0
    try:
        code = main(base + ["--compile", "default", "--out", str(root / "compiled")])
    except Exception as err:  # no C++ compiler: say so rather than fail
        if "compiler" in str(err).lower():
            pytest.skip(f"torch.compile cannot build here: {err}")
        raise
    assert code == 0
    (plain,) = (root / "plain").iterdir()
    (compiled,) = (root / "compiled").iterdir()
    assert "acceleration" not in json.loads((plain / "config.json").read_text())
    assert json.loads((compiled / "config.json").read_text())["acceleration"] == \
        ["--compile default"]


def test_image_modes_score_partial_test_labels_masked(tagged, capsys):
    """``eval_labels=partial`` with an image mode: the run finishes with masked scores (it
    failed after its last epoch, scoring the trivial baseline on full-label metrics), and its
    test mAP is the masked one of its own predictions."""
    from spmlkit.metrics import map_score

    root, y_test = tagged
    rows = (root / "test.csv").read_text().splitlines()[1:]
    partial = ["path,labels"]
    for i, row in enumerate(rows):
        path, labels = row.split(",")
        known = [n for n in labels.split(";") if n]
        negatives = [f"-{n}" for n in NAMES if n not in known][: i % 2]  # some known negatives
        partial.append(f"{path},{';'.join(known[: 1 + i % 2] + negatives)}")
    (root / "partial.csv").write_text("\n".join(partial) + "\n")
    assert main(["train", "--dataset", "csv", "--data",
                 f"path={root / 'tags.csv'}", "--data",
                 f"test_path={root / 'partial.csv'}", "--data", "train_labels=observed",
                 "--data", "eval_labels=partial", "--regime", "given", "--mode", "finetune",
                 "--backbone", "tiny_cnn", "--random-init", "--image-size", "16", "--epochs",
                 "1", "--workers", "0", "--out", str(root / "runs"), "--quiet"]) == 0
    (run,) = (root / "runs").iterdir()
    final = json.loads((run / "final.json").read_text())
    saved = np.load(run / "predictions.npz")
    splits = load_splits("csv", "given", path=str(root / "tags.csv"),
                         test_path=str(root / "partial.csv"), train_labels="observed",
                         eval_labels="partial")
    assert final["test_map"] == pytest.approx(map_score(saved["probs_test"], splits.test.y))
    assert np.isfinite(final["trivial_test_map"])


def test_predict_takes_a_csv_listing_image_paths(tagged, capsys):
    """An image run refused a CSV of image paths ("not from feature files"): the csv source's
    own form, paths relative to the CSV's folder, is read for its paths."""
    root, _ = tagged
    assert main(_finetune(root)) == 0
    (run,) = (root / "runs").iterdir()
    capsys.readouterr()
    assert main(["predict", str(run), str(root / "test.csv"), "--format", "json"]) == 0
    listed = [r["item"] for r in json.loads(capsys.readouterr().out)["predictions"]]
    assert listed == [str((root / "test" / f"img{i:03d}.png").resolve()) for i in range(16)]
    # a partial test CSV in the wide form (a -1 cell) lists its paths as well
    (root / "wide.csv").write_text("path,a,b,c\ntest/img000.png,1,-1,\ntest/img001.png,,,1\n")
    assert main(["predict", str(run), str(root / "wide.csv"), "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["predictions"]) == 2
    assert main(["predict", str(run), str(root / "test" / "img000.png"),
                 str(root / "x.npy")]) == 2
    assert "(files, folders, or a CSV listing image paths)" in capsys.readouterr().err
