"""Decision thresholds chosen on val, and `spml predict` round trips (CSV and JSON)."""
import csv
import io
import json

import numpy as np
import pytest
from _image_toy import make_images

from spmlkit.cli import main
from spmlkit.metrics import best_class_thresholds, best_global_threshold, select_thresholds


def test_thresholds_by_hand():
    probs = np.array([[0.9, 0.8], [0.7, 0.3], [0.4, 0.6], [0.2, 0.1]])
    y = np.array([[1, 1], [0, 0], [1, 1], [0, 0]])
    # all entries sorted: .9(1) .8(1) .7(0) .6(1) .4(1) .3(0) .2(0) .1(0); 4 positives
    # t=.9: 2/(1+4)=.4  .8: 4/6  .7: 4/7  .6: 6/8  .4: 8/9  .3: 8/10  .2: 8/11  .1: 8/12
    t, f1 = best_global_threshold(probs, y)
    assert (t, f1) == (0.4, pytest.approx(8 / 9))
    # class 0: .9(1) .7(0) .4(1) .2(0): t=.9 2/3, .7 2/4, .4 4/5 -> .4
    # class 1: .8(1) .6(1) .3(0) .1(0): t=.6 gives 1.0
    tc, f1c = best_class_thresholds(probs, y)
    assert tc.tolist() == [0.4, 0.6] and f1c.tolist() == [pytest.approx(0.8), 1.0]
    # equal F1 at two thresholds: the highest wins (fewest positive predictions)
    t_eq, f_eq = best_global_threshold([[0.8], [0.6], [0.4], [0.2]], [[1], [0], [0], [1]])
    # .8: 2/3, .6: 2/4, .4: 2/5, .2: 4/6 = 2/3 -> a tie between .8 and .2
    assert (t_eq, f_eq) == (0.8, pytest.approx(2 / 3))
    # a class without val positives falls back to the global threshold, F1 undefined
    tc, f1c = best_class_thresholds([[0.9, 0.3], [0.2, 0.7]], [[1, 0], [0, 0]])
    assert tc.tolist() == [0.9, 0.9] and f1c[0] == 1.0 and np.isnan(f1c[1])
    assert best_global_threshold([[0.3]], [[0]])[0] == 0.5
    sel = select_thresholds(probs, y, ["a", "b"])
    assert sel["global"] == 0.4 and sel["per_class"] == [0.4, 0.6]
    assert sel["class_names"] == ["a", "b"]


def test_global_threshold_maximises_sklearn_micro_f1():
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(0)
    probs = rng.random((30, 4)).round(2)  # rounding makes ties
    y = (rng.random((30, 4)) < probs).astype(int)
    t, f1 = best_global_threshold(probs, y)
    assert f1 == pytest.approx(f1_score(y, probs >= t, average="micro"))
    for cand in np.unique(probs):
        assert f1_score(y, probs >= cand, average="micro") <= f1 + 1e-12
    tc, f1c = best_class_thresholds(probs, y)
    for j in range(4):
        assert f1c[j] == pytest.approx(f1_score(y[:, j], probs[:, j] >= tc[j]))
        assert max(f1_score(y[:, j], probs[:, j] >= c) for c in np.unique(probs[:, j])) <= \
            f1c[j] + 1e-12


def _csv_rows(text):
    rows = list(csv.reader(io.StringIO(text)))
    return rows[0], rows[1:]


def test_linear_run_round_trip_csv_and_json(tmp_path, capsys):
    from spmlkit.loading import load_splits

    assert main(["train", "--dataset", "yeast", "--epochs", "2", "--lr", "1e-2", "--out",
                 str(tmp_path / "runs"), "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    thresholds = json.loads((run / "thresholds.json").read_text())
    saved = np.load(run / "predictions.npz")
    # the stored thresholds are the ones chosen from the stored val probabilities
    again = select_thresholds(saved["probs_val"], saved["y_val"])
    assert thresholds["global"] == again["global"] and thresholds["per_class"] == \
        again["per_class"]
    from spmlkit.loading import load_dataset

    splits = load_splits("yeast")
    feats = tmp_path / "test.npy"
    # new data comes raw: the run standardises it with its train statistics, as in training
    # (before, predict read raw features as if standardised: 7.21 labels a row, not 5.96)
    np.save(feats, load_dataset("yeast").test.x[:25])
    capsys.readouterr()
    assert main(["predict", str(run), str(feats)]) == 0  # CSV on stdout
    header, rows = _csv_rows(capsys.readouterr().out)
    assert header == ["item", "labels", *splits.class_names] and len(rows) == 25
    probs = np.array([[float(v) for v in r[2:]] for r in rows])
    np.testing.assert_allclose(probs, saved["probs_test"][:25], rtol=1e-5, atol=1e-7)
    t = thresholds["global"]
    for i, (r, p) in enumerate(zip(rows, probs)):
        assert r[0] == f"{feats}#{i}"
        names = [c for c, v in zip(splits.class_names, p) if v >= t]
        assert r[1].split(";") == names or (r[1] == "" and not names)
    # JSON with per-class thresholds, written to a file
    out = tmp_path / "pred.json"
    assert main(["predict", str(run), str(feats), "--threshold", "per-class", "--out",
                 str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["threshold"]["kind"] == "per-class"
    per_class = np.array([doc["threshold"]["values"][c] for c in splits.class_names])
    np.testing.assert_allclose(per_class, thresholds["per_class"])
    first = doc["predictions"][0]
    assert first["labels"] == [c for c, v in zip(splits.class_names, saved["probs_test"][0])
                               if v >= thresholds["per_class"][splits.class_names.index(c)]]
    assert first["scores"][splits.class_names[0]] == pytest.approx(probs[0, 0], rel=1e-5)
    # a fixed threshold, .npz input
    np.savez(tmp_path / "f.npz", features=load_dataset("yeast").test.x[:3], ids=np.arange(3))
    assert main(["predict", str(run), str(tmp_path / "f.npz"), "--threshold", "1.0",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["threshold"] == {"kind": "value", "value": 1.0}
    assert all(p["labels"] == [] for p in doc["predictions"])
    # errors: clear messages, exit code 2
    np.save(tmp_path / "narrow.npy", splits.test.x[:2, :5])
    for args, message in [
            ([str(tmp_path / "narrow.npy")], "5-d.*103-d"),
            ([str(tmp_path / "nope.npy")], "nope.npy does not exist"),
            ([str(feats), "--threshold", "best"], "global.*per-class.*number"),
            ([str(feats), "--threshold", "1.5"], r"\[0, 1\]")]:
        assert main(["predict", str(run), *args]) == 2
        assert __import__("re").search(message, capsys.readouterr().err), message
    assert main(["predict", str(tmp_path / "missing-run"), str(feats)]) == 2
    assert "does not exist" in capsys.readouterr().err
    # a linear run on plain feature vectors cannot read images
    make_images(tmp_path / "imgs", 2)
    assert main(["predict", str(run), str(tmp_path / "imgs")]) == 2
    assert "feature files" in capsys.readouterr().err


def test_finetune_run_round_trip_on_images(tmp_path, capsys):
    names = ["blue", "green", "red"]
    paths, y = make_images(tmp_path / "imgs", 40, seed=0)
    (tmp_path / "list.csv").write_text("".join(
        f"{p},{';'.join(n for n, f in zip(names, r) if f)}\n" for p, r in zip(paths, y)))
    assert main(["train", "--dataset", "csv", "--data", f"path={tmp_path / 'list.csv'}",
                 "--mode", "finetune", "--backbone", "tiny_cnn", "--random-init",
                 "--image-size", "16", "--epochs", "2", "--lr", "1e-2", "--workers", "0",
                 "--head-lr-mult", "10", "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    config = json.loads((run / "config.json").read_text())
    assert config["mode"] == "finetune" and config["train"]["head_lr_mult"] == 10.0
    saved = np.load(run / "predictions.npz")
    from spmlkit.loading import load_splits

    test_paths = load_splits("csv", path=str(tmp_path / "list.csv")).test.x
    capsys.readouterr()
    out = tmp_path / "pred.csv"
    assert main(["predict", str(run), str(tmp_path / "imgs"), "--out", str(out)]) == 0
    header, rows = _csv_rows(out.read_text())
    assert header[:2] == ["item", "labels"] and header[2:] == names and len(rows) == 40
    by_path = {r[0]: np.array([float(v) for v in r[2:]]) for r in rows}
    np.testing.assert_allclose(np.stack([by_path[p] for p in test_paths]), saved["probs_test"],
                               rtol=1e-4, atol=1e-6)
    assert main(["predict", str(run), str(tmp_path / "f.npy")]) == 2
    assert "from images" in capsys.readouterr().err


def test_linear_run_on_backbone_features_predicts_from_images(tmp_path):
    """A linear run trained with --backbone (cached features of images) rebuilds the backbone
    and predicts from image files as it did from the stored features."""
    from spmlkit.loading import load_splits
    from spmlkit.predict import predict_run

    names = ["blue", "green", "red"]
    paths, y = make_images(tmp_path / "imgs", 30, seed=2)
    (tmp_path / "list.csv").write_text("".join(
        f"{p},{';'.join(n for n, f in zip(names, r) if f)}\n" for p, r in zip(paths, y)))
    assert main(["train", "--solver", "adam", "--dataset", "csv", "--data",
                 f"path={tmp_path / 'list.csv'}",
                 "--backbone", "tiny_cnn", "--cache-dir", str(tmp_path / "cache"), "--epochs",
                 "2", "--lr", "1e-2", "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    test_paths = load_splits("csv", path=str(tmp_path / "list.csv")).test.x
    pred = predict_run(run, test_paths, "per-class")
    saved = np.load(run / "predictions.npz")
    np.testing.assert_allclose(pred.probs, saved["probs_test"], rtol=1e-4, atol=1e-6)
    assert pred.threshold_kind == "per-class" and pred.labels.shape == (len(test_paths), 3)


def test_broken_run_folders_name_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    assert main(["predict", str(run), "x.npy"]) == 2
    assert "config.json does not exist" in capsys.readouterr().err  # not a run folder
    (run / "config.json").write_text("{}")
    assert main(["predict", str(run), "x.npy"]) == 2
    assert "best.pt does not exist" in capsys.readouterr().err
    (run / "best.pt").write_bytes(b"not a checkpoint")
    assert main(["predict", str(run), "x.npy"]) == 2
    assert "best.pt: not a readable checkpoint" in capsys.readouterr().err
    np.savez(tmp_path / "two.npz", a=np.zeros((2, 3)), b=np.zeros((2, 3)))
    from spmlkit.predict import read_feature_file

    with pytest.raises(ValueError, match=r"two.npz: expected the features under key "
                       r"'features' or 'x'.*holds keys \['a', 'b'\]"):
        read_feature_file(tmp_path / "two.npz")


def test_a_score_exactly_on_the_threshold_is_a_label(tmp_path, capsys):
    """``spml predict`` labels a class when its score is ``>=`` the threshold: a numeric
    threshold equal to a row's score, and per-class thresholds equal to a row's scores, label
    that row with exactly those classes (a strict ``>`` would label none)."""
    import shutil

    from spmlkit.loading import load_dataset

    assert main(["train", "--epochs", "1", "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    feats = tmp_path / "x.npy"
    np.save(feats, load_dataset("yeast").test.x[:4])
    capsys.readouterr()
    assert main(["predict", str(run), str(feats), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = doc["class_names"]
    scores = np.array([[p["scores"][c] for c in names] for p in doc["predictions"]])
    top = int(np.argmax(scores[0]))
    assert main(["predict", str(run), str(feats), "--format", "json", "--threshold",
                 repr(float(scores[0, top]))]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["predictions"][0]["labels"] == [names[top]]
    # per class: thresholds.json holds row 0's own scores -> row 0 has every class
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    chosen = json.loads((copy / "thresholds.json").read_text())
    chosen["per_class"] = scores[0].tolist()
    (copy / "thresholds.json").write_text(json.dumps(chosen))
    assert main(["predict", str(copy), str(feats), "--format", "json", "--threshold",
                 "per-class"]) == 0
    rows = json.loads(capsys.readouterr().out)["predictions"]
    assert rows[0]["labels"] == names
    for row, s in zip(rows[1:], scores[1:]):
        assert row["labels"] == [c for c, v, t in zip(names, s, scores[0]) if v >= t]


def test_features_standardised_already_are_warned_about(tmp_path, recwarn):
    """The yeast run standardises raw features: its own raw test rows give its test
    probabilities exactly; ``load_splits(...).test.x`` (the model's inputs, standardised) would
    be standardised twice, and predict says so."""
    from spmlkit.loading import load_dataset, load_splits
    from spmlkit.predict import predict_run

    assert main(["train", "--epochs", "2", "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    np.save(tmp_path / "raw.npy", np.asarray(load_dataset("yeast").test.x, np.float32))
    np.save(tmp_path / "std.npy", np.asarray(load_splits("yeast", "1p").test.x, np.float32))
    saved = np.load(run / "predictions.npz")["probs_test"]
    np.testing.assert_array_equal(predict_run(run, tmp_path / "raw.npy").probs, saved)
    assert not [w for w in recwarn if "standardised already" in str(w.message)]
    with pytest.warns(UserWarning, match="look standardised already .* standardised twice"):
        predict_run(run, tmp_path / "std.npy")
