"""A run trained on partial training labels, selected on partial val labels and scored on
partial test labels, end to end from CSV files through ``spml train --dataset tabular``."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from spmlkit.cli import main
from spmlkit.loading import load_dataset, load_splits
from spmlkit.labels import make_observed
from spmlkit.metrics import is_partial, map_score, partial_labels

pd = pytest.importorskip("pandas")


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    """yeast as CSVs: train rows with one observed positive each (other cells empty), test
    rows with 1 / -1 where known, half of them with 40 % of the cells empty (unknown)."""
    folder = tmp_path_factory.mktemp("partial")
    ds = load_dataset("yeast")
    z = make_observed(ds.pool.y, "1p", seed=3)
    rng = np.random.default_rng(7)
    hidden = rng.random(ds.test.y.shape) < 0.4
    hidden[rng.random(len(hidden)) < 0.5] = False  # half the rows fully known
    y_test = np.where(hidden, 0, np.where(ds.test.y == 1, 1, -1))
    features = [f"att{j}" for j in range(ds.pool.x.shape[1])]
    train, test = pd.DataFrame(ds.pool.x, columns=features), pd.DataFrame(ds.test.x,
                                                                          columns=features)
    for j, c in enumerate(ds.class_names):
        train[c] = pd.array(np.where(z[:, j] == 1, 1, None), dtype="Int64")
        test[c] = pd.array(np.where(y_test[:, j] == 0, None, y_test[:, j]), dtype="Int64")
    train.to_csv(folder / "train.csv", index=False)
    test.to_csv(folder / "test.csv", index=False)
    options = dict(path=str(folder / "train.csv"), test_path=str(folder / "test.csv"),
                   labels="Class*", train_labels="observed", eval_labels="partial")
    return {"dir": folder, "y_test": y_test, "full": ds.test.y, "options": options,
            "data": ["--dataset", "tabular",
                     *[a for k, v in options.items() for a in ("--data", f"{k}={v}")]]}


@pytest.mark.parametrize("mask", ["entry", "row"])
def test_train_select_and_score_on_partial_labels_from_csv(partial, tmp_path, capsys, mask):
    out = tmp_path / "runs"
    assert main(["train", "--solver", "adam", *partial["data"], "--data", f"eval_mask={mask}",
                 "--regime", "given", "--loss", "an", "--epochs", "4", "--quiet",
                 "--out", str(out)]) == 0
    said = "".join(capsys.readouterr())
    assert "val (145 rows carved out of the test set, fraction 0.2) partially labelled (" in said
    assert "of entries known), scored masked" in said
    (run,) = out.iterdir()
    final = json.loads((run / "final.json").read_text())
    stored = np.load(run / "predictions.npz")
    splits = load_splits("tabular", "given", **partial["options"], eval_mask=mask)
    assert is_partial(splits.val.y) and is_partial(splits.test.y)
    assert np.array_equal(stored["y_test"], splits.test.y)  # the partial labels, kept as read
    want = map_score(stored["probs_test"], partial_labels(stored["y_test"], mask))
    assert final["test_map"] == pytest.approx(want)
    assert final["test_metrics"]["mask"] == mask and "scored masked" in final["labels"]
    # selection on partial val labels: the val mAP of the kept epoch is the masked one
    assert final["val_map"] == pytest.approx(map_score(
        stored["probs_val"], partial_labels(stored["y_val"], mask)))
    # the trap the mask avoids: unknowns scored as negatives give another (lower) mAP
    as_negatives = map_score(stored["probs_test"], (stored["y_test"] == 1).astype(np.uint8))
    assert as_negatives < final["test_map"]
    if mask == "row":
        rows = (stored["y_test"] != 0).all(axis=1)
        assert final["test_metrics"]["rows_scored"] == rows.sum() > 0


def test_partial_eval_options_are_checked(partial):
    opts = {k: v for k, v in partial["options"].items() if k != "test_path"}
    with pytest.raises(ValueError, match="eval_labels=partial applies to val / test labels"):
        load_splits("tabular", "1p", **{**opts, "train_labels": "full"})
    with pytest.raises(ValueError, match="eval_mask=row applies to partial evaluation labels"):
        load_splits("tabular", "given", **{**partial["options"], "eval_labels": "full",
                                           "eval_mask": "row"})
    # a test file of full 0 / 1 labels read as partial: 0 would be unknown, no -1 at all
    full = partial["dir"] / "full.csv"
    df = pd.read_csv(partial["dir"] / "test.csv")
    cols = [c for c in df.columns if c.startswith("Class")]
    df[cols] = partial["full"]
    df.to_csv(full, index=False)
    with pytest.raises(ValueError, match="no known negative"):
        load_splits("tabular", "given", **{**partial["options"], "test_path": str(full)})


def test_runs_trained_together_on_partial_val_labels_train_alone_and_equal_single_runs(partial):
    """The stacked linear engine scores full val labels only: runs with partial val labels
    train one by one there, each as train_run trains it."""
    from spmlkit.engine import TrainConfig
    from spmlkit.methods import train_run, train_runs

    splits = load_splits("tabular", "given", **partial["options"])
    configs = [TrainConfig(epochs=2, batch_size=16, lr=lr) for lr in (1e-2, 1e-3)]
    together = train_runs("linear", splits, "an", {}, configs)
    for config, res in zip(configs, together):
        assert not isinstance(res, BaseException), res
        alone = train_run("linear", splits, "an", {}, config)
        assert res["test_map"] == alone["test_map"] and res["val_map"] == alone["val_map"]


def test_image_csv_reads_partial_test_labels_with_known_negatives(tmp_path):
    """The csv image source: in a partial test CSV a name is a positive, ``-name`` a known
    negative, every other class unknown."""
    from PIL import Image

    from spmlkit.loading import load_dataset

    for i in range(8):
        Image.new("RGB", (8, 8)).save(tmp_path / f"{i}.png")
    (tmp_path / "train.csv").write_text("path,labels\n" + "".join(
        f"{i}.png,{'cat' if i % 2 else 'dog'}\n" for i in range(6)))
    (tmp_path / "test.csv").write_text('path,labels\n6.png,"cat;-dog"\n7.png,-cat\n')
    ds = load_dataset("csv", path=str(tmp_path / "train.csv"), test_path=str(tmp_path /
                      "test.csv"), eval_labels="partial", eval_mask="entry")
    assert is_partial(ds.test.y) and ds.test.y.tolist() == [[1, -1], [-1, 0]]
    with pytest.raises(ValueError, match="unknown class name '-dog'"):
        load_dataset("csv", path=str(tmp_path / "train.csv"),
                     test_path=str(tmp_path / "test.csv"))


def test_arrays_read_partial_test_labels_with_nan_as_unknown(tmp_path):
    from spmlkit.loading import load_dataset

    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(20, 3)).astype(np.float32))
    np.save(tmp_path / "y.npy", (rng.random((20, 2)) < 0.5).astype(np.uint8))
    np.save(tmp_path / "xt.npy", rng.normal(size=(3, 3)).astype(np.float32))
    np.save(tmp_path / "yt.npy", np.array([[1, np.nan], [-1, 1], [np.nan, -1]]))
    ds = load_dataset("arrays", features=str(tmp_path / "x.npy"), labels=str(tmp_path / "y.npy"),
                      test_features=str(tmp_path / "xt.npy"),
                      test_labels=str(tmp_path / "yt.npy"), eval_labels="partial")
    assert is_partial(ds.test.y) and ds.test.y.tolist() == [[1, 0], [-1, 1], [0, -1]]


@pytest.mark.parametrize("method,loss", [("boostlu", "an"), ("smile", "an")])
def test_other_methods_select_and_score_on_partial_labels(partial, method, loss):
    from spmlkit.engine import TrainConfig
    from spmlkit.methods import train_run

    splits = load_splits("tabular", "given", **partial["options"])
    res = train_run(method, splits, loss, {}, TrainConfig(epochs=2, batch_size=16, lr=1e-2))
    assert res["test_metrics"]["mask"] == "entry"
    assert np.isfinite(res["val_map"]) and np.isfinite(res["test_map"])


def test_partial_label_thresholds_refuse_nan_scores():
    """As the full-label thresholds do: a NaN score is an error, not a NaN threshold."""
    from spmlkit.metrics import best_global_threshold, select_thresholds

    y = partial_labels([[1, -1], [-1, 1]])
    probs = np.array([[np.nan, 0.2], [0.3, 0.8]])
    for fn in (best_global_threshold, select_thresholds):
        with pytest.raises(ValueError, match="1 non-finite value"):
            fn(probs, y)
    assert select_thresholds(np.array([[0.9, 0.2], [0.3, 0.8]]), y)["per_class"] == \
        [0.9, 0.8]


def test_k_from_partial_val_labels_says_what_it_assumes_and_refuses_an_estimate(tmp_path,
                                                                              capsys):
    """Presence-only val labels (known positives, no known negative for some classes): the
    default k counts such a class as present wherever unknown, and the summary says so;
    ``--k-estimate`` failed with "full labels in estimate_k must hold only 0 and 1". With
    fewer known negatives than positives the val-chosen threshold is said to be unreliable
    (0.001 there: every species predicted)."""
    ds = load_dataset("yeast")
    z = make_observed(ds.pool.y, "1p", seed=3)
    y_test = np.where(ds.test.y == 1, 1, 0).astype(np.float32)  # positives only: no -1
    y_test[:, :3] = np.where(ds.test.y[:, :3] == 1, 1, -1)      # 3 classes fully known
    for name, arr in (("x", ds.pool.x), ("z", z), ("xt", ds.test.x), ("yt", y_test)):
        np.save(tmp_path / f"{name}.npy", arr)
    data = ["--dataset", "arrays", "--data", f"features={tmp_path / 'x.npy'}",
            "--data", f"labels={tmp_path / 'z.npy'}", "--data", "train_labels=observed",
            "--data", f"test_features={tmp_path / 'xt.npy'}", "--data",
            f"test_labels={tmp_path / 'yt.npy'}", "--data", "eval_labels=partial"]
    assert main(["train", "--solver", "adam", *data, "--loss", "epr", "--epochs", "1",
                 "--k-estimate", "50",
                 "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--k-estimate 50: estimating k needs fully labelled rows, and the val labels are " \
           "partial (unknown entries); give k directly (--k)" in err
    assert main(["train", "--solver", "adam", *data, "--loss", "an", "--epochs", "1", "--quiet",
                 "--out",
                 str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert "known negative(s) for" in err and "the threshold chosen on them" in err
    assert "from the val labels (partial: each class's positive rate among its known rows; 11 " \
           "class(es) without a known negative count as present wherever unknown: give --k " \
           "if unknown mostly means absent)" in out


def test_the_sklearn_reference_is_scored_masked_on_partial_labels(partial):
    """The scikit-learn reference row was left out whenever the val / test labels were partial
    ("full labels in metrics targets must hold only 0 and 1"); it is scored masked, as the
    runs beside it."""
    from spmlkit.experiments.reference import sklearn_reference

    splits = load_splits("tabular", "given", **partial["options"])
    res = sklearn_reference(splits, 0, grid=(0.1, 1.0))
    assert res["test_map"] > 30 and res["train_recovery_map"] is None
    assert np.isfinite(res["val_map"])


def test_a_test_class_without_a_known_negative_is_left_out_and_named(partial, tmp_path, capsys):
    """A partial test class with positives and no known negative scored AP 100 without a word
    (and raised the test mAP); it is left out of the mean and named."""
    df = pd.read_csv(partial["dir"] / "test.csv")
    name = [c for c in df.columns if c.startswith("Class")][2]
    df[name] = pd.array(np.where(df[name] == 1, 1, None), dtype="Int64")  # negatives unknown
    path = tmp_path / "test.csv"
    df.to_csv(path, index=False)
    out = tmp_path / "runs"
    data = [a for k, v in {**partial["options"], "test_path": str(path)}.items()
            for a in ("--data", f"{k}={v}")]
    assert main(["train", "--solver", "adam", "--dataset", "tabular", *data, "--regime", "given",
                 "--loss", "an",
                 "--epochs", "2", "--quiet", "--out", str(out)]) == 0
    said = "".join(capsys.readouterr())
    assert "no known negative in the partial test labels" in said and name in said
    (run,) = out.iterdir()
    final = json.loads((run / "final.json").read_text())
    assert final["test_map_left_out_without_negative"] == [name]
    assert final["test"]["classes_without_negatives"] == [2]
    stored = np.load(run / "predictions.npz")
    keep = np.arange(stored["y_test"].shape[1]) != 2
    want = map_score(stored["probs_test"][:, keep], partial_labels(stored["y_test"][:, keep]))
    assert final["test_map"] == pytest.approx(want)


def test_partial_test_labels_without_eval_labels_partial_name_that_option(partial, tmp_path):
    """The refusal said "partial training labels: train_labels=observed" of a test file and
    never named eval_labels=partial."""
    opts = {k: v for k, v in partial["options"].items() if k != "eval_labels"}
    with pytest.raises(ValueError, match=r"test.csv: label column .* has an empty cell .*"
                                         r"partial test labels.*--data eval_labels=partial\)"):
        load_dataset("tabular", **opts)
    df = pd.read_csv(partial["dir"] / "test.csv")
    cols = [c for c in df.columns if c.startswith("Class")]
    df[cols] = df[cols].fillna(-1)  # no empty cell: 1 / -1 only
    df.to_csv(tmp_path / "signed.csv", index=False)
    with pytest.raises(ValueError, match=r"signed.csv.*found \[-1.0\].*partial test labels.*"
                                         r"eval_labels=partial\)"):
        load_dataset("tabular", **{**opts, "test_path": str(tmp_path / "signed.csv")})
