"""Analyses (spmlkit.analysis), the run-folder files they read, and `spml analyze`."""
import json
import shutil

import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

from spmlkit import analysis as an
from spmlkit.cli import main
from spmlkit.data import Dataset, LabelledSet, make_splits
from spmlkit.engine import TrainConfig
from spmlkit.methods import pseudo_label_record, train_run
from spmlkit.losses import TrainInfo, create_loss
from spmlkit.metrics import map_score, per_class_ap, pseudo_label_stats

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CLASSES = ["cat", "dog", "car", "tree"]


def toy_data(n=330, d=8, seed=0):
    """Features whose label j is on when x @ w_j > 0.4 (every row has a positive)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (x @ rng.normal(size=(d, len(CLASSES))) > 0.4).astype(np.uint8)
    y[y.sum(1) == 0, 0] = 1
    return x, y


def toy_splits():
    x, y = toy_data()
    ds = Dataset("toy", LabelledSet(x[:250], y[:250], CLASSES),
                 LabelledSet(x[250:], y[250:], CLASSES))
    return make_splits(ds, "1p", seed=3)


CFG = dict(batch_size=16, lr=1e-2, seed=0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three tiny runs: AN (with per-epoch train probabilities), EM + APL (pseudo-negatives from
    epoch 1 on; the loss state captured after every epoch) and LL-Cp (flips)."""
    out = tmp_path_factory.mktemp("runs")
    splits = toy_splits()
    an_res = train_run("linear", splits, "an", config=TrainConfig(epochs=3, **CFG), out=out,
                       save_train_probs=True)
    seen = []

    def capture(record, model, loss):
        seen.append((dict(record), loss.pseudo_mask.clone().numpy()))

    apl_res = train_run("linear", splits, "em_apl", {"warmup": 1, "beta": 0.5},
                        TrainConfig(epochs=3, **CFG), out=out, on_epoch=capture)
    cp_res = train_run("linear", splits, "ll_cp", {"delta_rel": 2.0}, TrainConfig(epochs=3, **CFG),
                       out=out)
    return {"splits": splits, "an": an_res, "apl": apl_res, "cp": cp_res, "apl_seen": seen,
            "out": out}


def _npz(run_dir):
    with np.load(f"{run_dir}/predictions.npz") as f:
        return {k: f[k] for k in f.files}


# --- run-folder files --------------------------------------------------------------------------
def test_predictions_npz_holds_best_epoch_probs_and_labels(runs):
    splits, res = runs["splits"], runs["an"]
    pred = _npz(res["run_dir"])
    assert set(pred) == {"probs_train", "probs_val", "probs_test", "y_train", "y_val", "y_test",
                         "observed", "best_epoch"}
    for split in ("train", "val", "test"):
        y = getattr(splits, split).y
        assert pred[f"probs_{split}"].shape == y.shape and pred[f"probs_{split}"].dtype == \
            np.float32
        assert ((pred[f"probs_{split}"] >= 0) & (pred[f"probs_{split}"] <= 1)).all()
        assert np.array_equal(pred[f"y_{split}"], y) and pred[f"y_{split}"].dtype == np.uint8
    assert np.array_equal(pred["observed"], splits.observed)
    assert int(pred["best_epoch"]) == res["best_epoch"]
    # float32 probabilities reproduce the reported numbers exactly (the best epoch's model)
    assert map_score(pred["probs_test"], pred["y_test"]) == res["test_map"]
    assert map_score(pred["probs_train"], pred["y_train"]) == res["train_recovery_map"]
    # per-epoch train probabilities: epochs x N x L float16; the best epoch's row is probs_train
    tp = np.load(f"{res['run_dir']}/train_probs.npy")
    assert tp.shape == (3, *splits.observed.shape) and tp.dtype == np.float16
    assert np.allclose(tp[res["best_epoch"] - 1], pred["probs_train"], atol=1e-3)
    assert not np.allclose(tp[0], tp[2], atol=1e-3)  # the epochs really differ
    config = json.loads(open(f"{res['run_dir']}/config.json").read())
    assert config["save_train_probs"] is True
    # AN does not pseudo-label: no diagnostics in its records
    lines = open(f"{res['run_dir']}/metrics.jsonl").read().splitlines()
    assert len(lines) == 3 and all("pl_count" not in json.loads(li) for li in lines)
    # without the flag there is no train_probs.npy
    assert not (runs["out"] / "toy-em_apl-1p-s0" / "train_probs.npy").exists()
    assert (runs["out"] / "toy-em_apl-1p-s0" / "predictions.npz").exists()


def test_save_train_probs_needs_a_run_folder():
    with pytest.raises(ValueError, match="save_train_probs.*out="):
        train_run("linear", toy_splits(), "an", config=TrainConfig(epochs=1), save_train_probs=True)


# --- pseudo-label precision --------------------------------------------------------------------
def test_pseudo_label_stats_by_hand_and_on_every_pseudo_labelling_loss():
    y = np.array([[1, 0], [0, 0], [1, 1]], dtype=np.uint8)
    mask = np.array([[1, 1], [0, 1], [1, 0]], dtype=bool)
    # asserted negatives: (0,0) wrong, (0,1) right, (1,1) right, (2,0) wrong
    assert pseudo_label_stats(mask, np.zeros((3, 2)), y) == (4, 0.5)
    # asserted positives: only (0,0) and (2,0) are right
    assert pseudo_label_stats(mask, np.ones((3, 2)), y) == (4, 0.5)
    count, prec = pseudo_label_stats(np.zeros((3, 2), bool), np.zeros((3, 2)), y)
    assert count == 0 and np.isnan(prec)
    with pytest.raises(ValueError, match="same N x L shape"):
        pseudo_label_stats(mask[:2], np.zeros((2, 2)), y)

    z = torch.tensor([[1, 0], [0, 1], [1, 0]])
    info = TrainInfo(3, 2, num_epochs=4)
    tmask = torch.as_tensor(mask)
    apl = create_loss("em_apl", warmup=1)
    apl.on_train_start(z, info)
    apl.pseudo_mask = tmask.clone()                 # a known pseudo-label state
    cp = create_loss("ll_cp")
    cp.on_train_start(z, info)
    cp.flipped = tmask.clone()
    opml = create_loss("opml_sp")
    opml.on_train_start(z, info)
    opml.corrected = tmask.clone()
    for loss, value in ((apl, 0), (cp, 1), (opml, 1)):
        got_mask, got_value = loss.hard_pseudo_labels()
        assert torch.equal(got_mask, tmask) and (got_value == value).all()
        assert pseudo_label_record(loss, y) == {"pl_count": 4, "pl_precision": 0.5}
    # also through the regulariser wrapper; a loss without pseudo-labels logs nothing
    wrapped = create_loss("em_apl", reg="highrank:1e-3", warmup=1)
    wrapped.on_train_start(z, info)
    assert pseudo_label_record(wrapped, y) == {"pl_count": 0, "pl_precision": pytest.approx(
        float("nan"), nan_ok=True)}
    assert pseudo_label_record(create_loss("an"), y) == {}


def test_pl_precision_logged_per_epoch_matches_the_loss_state(runs):
    y = runs["splits"].train.y
    seen = runs["apl_seen"]
    assert len(seen) == 3
    for record, mask in seen:       # state after the epoch, recomputed by hand
        assert record["pl_count"] == mask.sum() > 0
        assert record["pl_precision"] == pytest.approx((y[mask] == 0).mean(), abs=1e-12)
    assert seen[0][0]["pl_count"] < seen[2][0]["pl_count"]
    best = seen[runs["apl"]["best_epoch"] - 1][0]  # the result carries the selected epoch's
    assert (runs["apl"]["pl_count"], runs["apl"]["pl_precision"]) == (best["pl_count"],
                                                                       best["pl_precision"])
    assert "pl_precision" not in runs["an"]
    res = an.pseudo_label_precision(runs["apl"]["run_dir"])
    assert res.loss == "em_apl" and res.epoch.tolist() == [1, 2, 3]
    assert res.count.tolist() == [r["pl_count"] for r, _ in seen]
    assert np.allclose(res.precision, [r["pl_precision"] for r, _ in seen])
    # LL-Cp flips nothing in epoch 1 (NaN precision, read back from JSON) and some later
    cp = an.pseudo_label_precision(runs["cp"]["run_dir"])
    assert cp.count[0] == 0 and np.isnan(cp.precision[0]) and cp.count[-1] > 0
    assert 0 <= cp.precision[-1] <= 1
    with pytest.raises(ValueError, match="'an' does not pseudo-label"):
        an.pseudo_label_precision(runs["an"]["run_dir"])


# --- class-wise AP difference ------------------------------------------------------------------
def test_classwise_ap_difference(runs):
    a, b = runs["an"]["run_dir"], runs["apl"]["run_dir"]
    same = an.classwise_ap_difference(a, a)
    present = ~np.isnan(same.ap_a)
    assert present.sum() >= 3 and np.all(same.diff[present] == 0)
    assert np.array_equal(np.isnan(same.diff), ~present)
    res = an.classwise_ap_difference(a, b, "test")
    pa, pb = _npz(a), _npz(b)
    expected = per_class_ap(pb["probs_test"], pb["y_test"]) - per_class_ap(pa["probs_test"],
                                                                           pa["y_test"])
    assert np.allclose(res.diff, expected, equal_nan=True) and np.any(res.diff[present] != 0)
    assert res.class_names == CLASSES
    assert np.nanmean(res.diff) == pytest.approx(runs["apl"]["test_map"]
                                                 - runs["an"]["test_map"], abs=1e-9)
    d = res.diff[res.order()]
    assert np.all(np.diff(d) <= 0)                              # sorted, largest gain first
    val = an.classwise_ap_difference(a, b, "val")
    assert np.allclose(val.ap_b, per_class_ap(pb["probs_val"], pb["y_val"]), equal_nan=True)
    with pytest.raises(ValueError, match="split"):
        an.classwise_ap_difference(a, b, "dev")


# --- Wasserstein -------------------------------------------------------------------------------
def test_wasserstein_1d_equals_scipy():
    rng = np.random.default_rng(1)
    for n, m in [(1, 1), (1, 7), (5, 3), (40, 60), (97, 13), (200, 200)]:
        u, v = rng.random(n), rng.beta(2, 5, m)
        assert an.wasserstein_1d(u, v) == pytest.approx(wasserstein_distance(u, v), abs=1e-12)
    ties = np.array([0.1, 0.1, 0.5, 0.5, 0.5]), np.array([0.1, 0.5, 0.9])
    assert an.wasserstein_1d(*ties) == pytest.approx(wasserstein_distance(*ties), abs=1e-12)
    assert an.wasserstein_1d([0.3, 0.7], [0.7, 0.3]) == 0.0
    with pytest.raises(ValueError, match="at least one"):
        an.wasserstein_1d([], [0.5])


def test_wasserstein_per_class_groups_and_nan():
    rng = np.random.default_rng(2)
    n, L = 300, 3
    y = (rng.random((n, L)) < 0.3).astype(np.uint8)
    z = np.where(rng.random((n, L)) < 0.1, np.where(y == 1, 1, -1), 0).astype(np.int8)
    z[:, 2] = np.where(y[:, 2] == 1, 1, 0)   # class 2: every positive observed
    p = rng.random((n, L))
    got = an.wasserstein_per_class(p, z, y)
    for j in range(2):
        u = (z[:, j] == 0)
        assert got[j] == pytest.approx(wasserstein_distance(p[u & (y[:, j] == 1), j],
                                                            p[u & (y[:, j] == 0), j]), abs=1e-12)
    assert np.isnan(got[2])
    with pytest.raises(ValueError, match="same N x L shape"):
        an.wasserstein_per_class(p[:, :2], z, y)


def test_run_wasserstein_reads_train_predictions(runs):
    res = an.run_wasserstein(runs["apl"]["run_dir"])
    pred = _npz(runs["apl"]["run_dir"])
    assert np.allclose(res.distance, an.wasserstein_per_class(pred["probs_train"],
                                                               pred["observed"],
                                                               pred["y_train"]), equal_nan=True)
    unobs = pred["observed"] == 0
    assert res.n_pos.tolist() == (unobs & (pred["y_train"] == 1)).sum(0).tolist()
    assert "mean" in an.wasserstein_table([res])


# --- histograms --------------------------------------------------------------------------------
def test_histograms_count_every_unobserved_positive(runs):
    run = runs["an"]["run_dir"]
    splits = runs["splits"]
    n = int(((splits.observed == 0) & (splits.train.y == 1)).sum())
    h = an.unobserved_positive_histograms(run, epochs=[1, 3], bins=10)
    assert h.epochs == [1, 3] and h.counts.shape == (2, 10) and h.n == n > 0
    assert h.counts.sum(axis=1).tolist() == [n, n]
    tp = np.load(f"{run}/train_probs.npy")
    pos = (splits.observed == 0) & (splits.train.y == 1)
    assert h.mean[1] == pytest.approx(tp[2][pos].astype(np.float64).mean())
    assert an.unobserved_positive_histograms(run).epochs == [1, 2, 3]
    with pytest.raises(ValueError, match=r"epochs \[4\] are not in the run.*1\.\.3"):
        an.unobserved_positive_histograms(run, epochs=[1, 4])


# --- missing files -----------------------------------------------------------------------------
def test_missing_files_are_named_with_the_command_that_writes_them(runs, tmp_path, capsys):
    no_probs = runs["apl"]["run_dir"]
    with pytest.raises(FileNotFoundError, match=r"train_probs\.npy is missing.*--save-train-probs"):
        an.unobserved_positive_histograms(no_probs)
    assert main(["analyze", "histograms", no_probs, "--out", str(tmp_path / "h.png")]) == 2
    err = capsys.readouterr().err
    assert "train_probs.npy" in err and "spml train --save-train-probs" in err
    assert not (tmp_path / "h.png").exists()

    old = tmp_path / "old-run"
    shutil.copytree(runs["an"]["run_dir"], old)
    (old / "predictions.npz").unlink()
    with pytest.raises(FileNotFoundError, match=r"predictions\.npz is missing.*spml train"):
        an.classwise_ap_difference(old, runs["an"]["run_dir"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        an.run_wasserstein(tmp_path / "nowhere")


def test_one_reader_of_a_run_folder(runs, tmp_path):
    """The analyses, the figures and `spmlkit.runs.Run` read through spmlkit.runs: one
    check of metrics.jsonl, whichever path reads it."""
    from spmlkit.experiments.figures import curves, histograms, image_panels, landscape
    from spmlkit.runs import read_metrics, read_run

    for module in (an, curves, histograms, image_panels, landscape):
        for name in ("run_file", "read_config", "read_metrics", "read_predictions"):
            reader = getattr(module, name, None)
            assert reader is None or reader.__module__ == "spmlkit.runs", (module, name)
    run = tmp_path / "damaged"
    shutil.copytree(runs["an"]["run_dir"], run)
    assert read_run(run).metrics() == read_metrics(run) and len(read_metrics(run)) == 3
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"epoch": "four"}\n')
    for read in (read_metrics, lambda r: read_run(r).metrics()):
        with pytest.raises(ValueError, match=r"metrics\.jsonl, line 4: 'epoch' must be a number"):
            read(run)


def test_a_run_being_written_is_read_to_its_last_whole_line(runs, tmp_path):
    """The study report reads runs that may still train: with ``growing`` a half-written last
    line is left out, anywhere else (or without ``growing``) it is named."""
    from spmlkit.experiments import report
    from spmlkit.runs import read_metrics

    run = tmp_path / "growing"
    shutil.copytree(runs["an"]["run_dir"], run)
    whole = read_metrics(run)
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"epoch": 4, "val_m')
    assert read_metrics(run, growing=True) == whole == report._epochs(run)
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 4: not a JSON record"):
        read_metrics(run)
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text('{"epoch": 0, "val_m\n' + text)  # damaged, not growing
    with pytest.raises(ValueError, match=r"line 1: not a JSON record"):
        read_metrics(run, growing=True)
    assert report._epochs(run) == []  # the report leaves a damaged run out of its curves


# --- command line ------------------------------------------------------------------------------
def test_every_analyze_subcommand_prints_a_table_and_writes_a_png(runs, tmp_path, capsys):
    a, b, cp = runs["an"]["run_dir"], runs["apl"]["run_dir"], runs["cp"]["run_dir"]
    commands = {
        "pl.png": (["pl-precision", b, cp], "pl_precision"),
        "ap.png": (["ap-diff", a, b, "--split", "test"], "mean (mAP)"),
        "w.png": (["wasserstein", a, b], "unobs. pos."),
        "h.png": (["histograms", a, "--epochs", "1,3", "--bins", "5"], "share p>=0.5"),
    }
    for name, (args, header) in commands.items():
        out = tmp_path / "figs" / name
        assert main(["analyze", *args, "--out", str(out)]) == 0, name
        printed = capsys.readouterr().out
        assert header in printed and f"wrote {out}" in printed
        data = out.read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC), name
    assert main(["analyze", "ap-diff", a, b, "--out", str(tmp_path / "x.pdf")]) == 2
    assert "ending in .png" in capsys.readouterr().err


def test_train_command_saves_train_probs(tmp_path, capsys):
    x, y = toy_data(n=120)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    common = ["train", "--solver", "adam", "--dataset", "arrays", "--data",
              f"features={tmp_path / 'x.npy'}",
              "--data", f"labels={tmp_path / 'y.npy'}", "--epochs", "2", "--batch-size", "32",
              "--lr", "1e-2", "--quiet", "--out", str(tmp_path / "runs")]
    assert main(common + ["--save-train-probs"]) == 0
    assert main(common) == 0
    capsys.readouterr()
    with_probs, without = sorted((tmp_path / "runs").iterdir())
    assert np.load(with_probs / "train_probs.npy").shape[0] == 2
    assert (without / "predictions.npz").exists() and not (without / "train_probs.npy").exists()


def test_analyses_of_unobserved_positives_refuse_runs_on_observed_labels(tmp_path):
    """On a run trained on observed labels only (regime given) the Wasserstein table printed
    NaN rows and the histograms empty ones, and wrote their figures: the train rows' full
    labels are unknown there. Both say so."""
    from spmlkit.loading import load_splits

    rng = np.random.default_rng(0)
    x, xt = rng.normal(size=(60, 4)).astype(np.float32), rng.normal(size=(40, 4))
    z = np.zeros((60, 3), np.int8)
    z[np.arange(60), np.arange(60) % 3] = 1
    yt = (rng.random((40, 3)) < 0.5).astype(np.uint8)
    for name, arr in (("x", x), ("z", z), ("xt", xt.astype(np.float32)), ("yt", yt)):
        np.save(tmp_path / f"{name}.npy", arr)
    s = load_splits("arrays", "given", features=str(tmp_path / "x.npy"),
                    labels=str(tmp_path / "z.npy"), test_features=str(tmp_path / "xt.npy"),
                    test_labels=str(tmp_path / "yt.npy"), train_labels="observed")
    res = train_run("linear", s, "an", config=TrainConfig(epochs=1), out=tmp_path / "r",
                    save_train_probs=True)
    for fn in (an.run_wasserstein, an.unobserved_positive_histograms):
        with pytest.raises(ValueError, match="this run trained on observed labels only"):
            fn(res["run_dir"])
