"""Regime ``given``: your own partially observed training labels with fully labelled val / test,
on every source that takes your data (arrays, tabular, csv, folder); k from the val labels; the
run's summary; and image sources used without a backbone."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from spmlkit.loading import load_dataset, load_splits
from spmlkit.data.protocol import describe_labels
from spmlkit.labels import REGIMES, make_observed, observed_counts, parse_regime
from spmlkit.methods import resolve_k, train_run

pd = pytest.importorskip("pandas")


@pytest.fixture(autouse=True)
def _threads():
    import torch

    torch.set_num_threads(1)


def _data(n=60, nt=40, d=5, seed=0):
    rng = np.random.RandomState(seed)
    w = rng.normal(size=(d, 3)) * 2
    x, xt = rng.normal(size=(n, d)).astype(np.float32), rng.normal(size=(nt, d)).astype(
        np.float32)
    y = (x @ w > 0).astype(np.uint8)
    yt = (xt @ w > 0).astype(np.uint8)
    z = make_observed(y, "1p_1n", seed=3)  # one positive (where any) and one negative per row
    return x, y, z, xt, yt


@pytest.fixture
def arrays_given(tmp_path):
    x, y, z, xt, yt = _data()
    for name, arr in (("x", x), ("z", z), ("xt", xt), ("yt", yt)):
        np.save(tmp_path / f"{name}.npy", arr)
    opts = dict(features=str(tmp_path / "x.npy"), labels=str(tmp_path / "z.npy"),
                test_features=str(tmp_path / "xt.npy"), test_labels=str(tmp_path / "yt.npy"),
                train_labels="observed")
    return tmp_path, opts, (x, y, z, xt, yt)


# ---- the regime and the protocol ---------------------------------------------------------------
def test_given_is_a_regime_that_draws_nothing():
    assert "given" in REGIMES and parse_regime("given") == ("given", None)
    with pytest.raises(ValueError, match="regime 'given' draws no labels"):
        make_observed([[1, 0]], "given")
    counts = observed_counts([[1, 0, -1], [0, 0, 0], [1, 1, 0]])
    assert counts == {"rows": 3, "positives": 3, "negatives": 1, "unobserved": 5,
                      "rows_without_positive": 1, "rows_without_label": 1}


def test_arrays_given_uses_the_observed_matrix_as_is(arrays_given):
    folder, opts, (x, y, z, xt, yt) = arrays_given
    s = load_splits("arrays", "given", **opts)
    assert np.array_equal(s.observed, z)                      # every pool row trains, untouched
    assert np.array_equal(s.train.x, x)
    assert np.array_equal(s.train.y, (z == 1).astype(np.uint8))  # all that is known
    assert not s.train_labels_complete
    # val carved out of the fully labelled test file (0.2, seed 1200), the rest is the test set
    assert len(s.val) == 8 and len(s.test) == 32
    rows = s.meta["val_rows_of_test"]
    assert np.array_equal(s.val.y, yt[rows]) and np.array_equal(s.val_observed,
                                                                np.where(yt[rows], 1, -1))
    assert s.k == pytest.approx(yt[rows].sum(1).mean())     # k from the val labels
    assert s.k != pytest.approx((z == 1).sum(1).mean())
    assert s.meta["train_labels"] == "observed" and s.meta["k_from"] == "val"
    assert s.meta["observed_from"] == opts["labels"]


def test_given_and_other_regimes_refuse_the_wrong_labels(arrays_given):
    folder, opts, _ = arrays_given
    with pytest.raises(ValueError, match=r"holds observed \(partial\) training labels .*z\.npy"
                                         r".*regime '1p' would draw .* use regime 'given'"):
        load_splits("arrays", "1p", **opts)
    full = {**opts, "labels": opts["test_labels"], "features": opts["test_features"],
            "train_labels": "full"}
    with pytest.raises(ValueError, match="regime 'given' uses observed training labels .* "
                                         "train_labels=observed"):
        load_splits("arrays", "given", **full)
    with pytest.raises(ValueError, match="train_labels must be 'full' .* or 'observed'"):
        load_dataset("arrays", **{**opts, "train_labels": "partial"})


def test_observed_labels_are_validated(arrays_given):
    folder, opts, (x, y, z, xt, yt) = arrays_given
    bad = z.copy()
    bad[4, 1] = 2
    np.save(folder / "bad.npy", bad)
    with pytest.raises(ValueError, match=r"bad\.npy must hold only 1 .* found \[2\.0\] "
                                         r"\(first at row 4\)"):
        load_dataset("arrays", **{**opts, "labels": str(folder / "bad.npy")})
    np.save(folder / "short.npy", z[:-1])
    with pytest.raises(ValueError, match="x.npy has 60 rows but .*short.npy has 59"):
        load_dataset("arrays", **{**opts, "labels": str(folder / "short.npy")})
    np.save(folder / "wide.npy", np.c_[z, z[:, :1]])
    with pytest.raises(ValueError, match="yt.npy: 3 label columns but 4 class names"):
        load_dataset("arrays", **{**opts, "labels": str(folder / "wide.npy")})
    # observed labels need a fully labelled test set given apart
    no_test = {k: v for k, v in opts.items() if not k.startswith("test_")}
    with pytest.raises(ValueError, match="need a fully labelled test set given apart"):
        load_dataset("arrays", **no_test)


def test_arrays_given_names_file_and_val_files(arrays_given):
    folder, opts, (x, y, z, xt, yt) = arrays_given
    names = ["a", "b", "c"]
    lines = [",".join(names[j] for j in np.flatnonzero(row == 1)) for row in z]
    (folder / "tags.csv").write_text("labels\n" + "\n".join(lines) + "\n")
    np.save(folder / "xv.npy", xt[:10])
    np.save(folder / "yv.npy", yt[:10])
    s = load_splits("arrays", "given", **{**opts, "labels": str(folder / "tags.csv"),
                                          "class_names": names,
                                          "val_features": str(folder / "xv.npy"),
                                          "val_labels": str(folder / "yv.npy")})
    assert np.array_equal(s.observed, np.where(z == 1, 1, 0))  # names = the known positives
    assert len(s.val) == 10 and len(s.test) == 40              # the test file stays whole
    assert s.meta["val_from"] == "given" and s.k == pytest.approx(yt[:10].sum(1).mean())
    # a val file with full labels under a sampling regime: the whole pool trains
    full = load_splits("arrays", "1p", **{**opts, "labels": str(folder / "yt.npy"),
                                          "features": str(folder / "xt.npy"),
                                          "train_labels": "full",
                                          "val_features": str(folder / "xv.npy"),
                                          "val_labels": str(folder / "yv.npy")})
    assert len(full.train) == 40 and len(full.val) == 10 and full.train_labels_complete


def test_a_tiny_test_set_cannot_give_a_val_set(arrays_given):
    folder, opts, (x, y, z, xt, yt) = arrays_given
    np.save(folder / "xt2.npy", xt[:2])
    np.save(folder / "yt2.npy", yt[:2])
    with pytest.raises(ValueError, match="leaves an empty val set; give more test rows or a "
                                         "fully labelled val set"):
        load_splits("arrays", "given", **{**opts, "test_features": str(folder / "xt2.npy"),
                                          "test_labels": str(folder / "yt2.npy")})


# ---- k ------------------------------------------------------------------------------------------
def test_k_estimate_uses_val_rows_when_training_labels_are_partial(arrays_given, capsys):
    folder, opts, _ = arrays_given
    s = load_splits("arrays", "given", **opts)
    k = resolve_k("estimate:8:point", s, seed=0, report=True)
    assert k == pytest.approx(s.val.y.sum(1).mean())  # all 8 val rows: their mean
    assert "from 8 fully labelled val rows" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"the val split has only 8 rows \(the training labels "
                                         r"are partial.*--k"):
        resolve_k("estimate:9:point", s, seed=0)


def test_k_estimate_bounds_are_the_ends_of_the_95_interval(arrays_given):
    """``estimate:M:lower|upper`` (the cole-appb preset's k axis): the ends of the normal 95%
    interval mean -+ 1.959964 sd / sqrt(M) of the M rows' positive counts (sample sd), computed
    here from the val labels (all 8 rows, so the draw does not matter)."""
    folder, opts, _ = arrays_given
    s = load_splits("arrays", "given", **opts)
    counts = s.val.y.sum(1).astype(float)
    assert len(counts) == 8 and counts.std() > 0
    half = 1.959963984540054 * counts.std(ddof=1) / np.sqrt(8)
    lower, point, upper = (resolve_k(f"estimate:8:{b}", s, seed=0)
                           for b in ("lower", "point", "upper"))
    assert point == pytest.approx(counts.mean())
    assert lower == pytest.approx(max(0.0, counts.mean() - half))
    assert upper == pytest.approx(counts.mean() + half)
    assert lower < point < upper


# ---- a run: summary, k, what is not measurable -----------------------------------------------
def test_train_run_on_given_labels_records_the_summary(arrays_given, tmp_path):
    folder, opts, (x, y, z, xt, yt) = arrays_given
    from spmlkit.engine import TrainConfig

    s = load_splits("arrays", "given", **opts)
    res = train_run("linear", s, "role", config=TrainConfig(epochs=2, lr=1e-2),
                    out=tmp_path / "runs")
    assert res["train_recovery_map"] is None and "estimator_recovery_map" not in res
    assert np.isfinite(res["test_map"])
    config = json.loads((Path(res["run_dir"]) / "config.json").read_text())
    assert config["k"] == pytest.approx(s.k)                   # the val labels' mean
    labels = config["labels"]
    c = observed_counts(z)
    assert labels["positives"] == c["positives"] and labels["negatives"] == c["negatives"]
    assert res["labels"] == labels["summary"] == (
        f"regime given: observed training labels from {opts['labels']} (60 rows: "
        f"{c['positives']} positives, {c['negatives']} negatives, {c['unobserved']} "
        f"unobserved; {c['rows_without_positive']} row(s) without an observed positive); val "
        f"(8 rows carved out of the test set, fraction 0.2) and test (32 rows) fully labelled; "
        f"default k {s.k:.3f} from the val labels")


@pytest.mark.filterwarnings("ignore:em_apl. warmup")
def test_an_undefined_pseudo_label_precision_is_null_in_metrics_jsonl(arrays_given, tmp_path):
    """EM-APL on given labels: the pseudo-labels' precision is undefined (no full training
    labels). metrics.jsonl wrote it as a bare ``NaN``, which strict JSON readers refuse
    (final.json had None); it is ``null`` now, and read back as None."""
    folder, opts, _ = arrays_given
    from spmlkit.engine import TrainConfig
    from spmlkit.runs import read_metrics

    s = load_splits("arrays", "given", **opts)
    res = train_run("linear", s, "em_apl", {"warmup": 0},
                    config=TrainConfig(epochs=2, lr=1e-2), out=tmp_path / "runs")

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    lines = (Path(res["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=refuse) for line in lines]
    assert [r["pl_precision"] for r in records] == [None, None]
    assert [r["pl_precision"] for r in read_metrics(res["run_dir"])] == [None, None]


def test_summary_of_a_sampled_regime():
    s = load_splits("yeast")
    text = describe_labels(s)["summary"]
    assert text.startswith("regime 1p: observed training labels drawn from full labels (1354 "
                           "rows: 1354 positives, 0 negatives")
    assert "val (338 rows split from the training rows) and test (725 rows) fully labelled; " \
           f"default k {s.k:.3f} from the train labels" in text


@pytest.mark.filterwarnings("ignore:em_apl. warmup")
def test_rows_without_a_positive_train_with_every_loss(arrays_given):
    """A given training row may have no observed positive (or nothing observed at all): every
    registered loss trains on such data with finite results."""
    from spmlkit.engine import TrainConfig
    from spmlkit.losses import list_losses

    folder, opts, (x, y, z, xt, yt) = arrays_given
    z = z.copy()
    z[:10] = 0          # nothing observed
    z[10:20][z[10:20] == 1] = 0  # negatives only
    np.save(folder / "z2.npy", z)
    s = load_splits("arrays", "given", **{**opts, "labels": str(folder / "z2.npy")})
    assert describe_labels(s)["rows_without_positive"] >= 20
    names = [name for name, _ in list_losses()]
    assert len(names) > 10
    seen_pl = False
    from spmlkit.losses import LOSSES
    from spmlkit.losses.scorer import simulated_scores

    scores = simulated_scores((s.observed == 1).astype(np.float32), flip=0.1, seed=0)
    for name in names:
        hp = {"scores": scores} if getattr(LOSSES.get(name).factory, "needs_scores", False) \
            else None
        res = train_run("linear", s, name, hp,
                        config=TrainConfig(epochs=1, batch_size=16, lr=1e-2))
        assert np.isfinite(res["val_map"]) and np.isfinite(res["test_map"]), name
        if "pl_count" in res:  # pseudo-labels' precision needs full training labels
            assert res["pl_precision"] is None, name
            seen_pl = True
    assert seen_pl


# ---- tabular ------------------------------------------------------------------------------------
def _frames(seed=0):
    x, y, z, xt, yt = _data(seed=seed)
    cols = [f"f{j}" for j in range(x.shape[1])]
    train = pd.DataFrame(x, columns=cols)
    train.insert(0, "note", "text")
    test = pd.DataFrame(xt, columns=cols)
    for j, c in enumerate(["label_a", "label_b", "label_c"]):
        train[c] = pd.array(np.where(z[:, j] == 0, np.nan, z[:, j]), dtype="Int64")
        test[c] = yt[:, j]
    return train, test, (x, y, z, xt, yt)


def test_tabular_given_with_a_split_column_in_parquet(tmp_path):
    train, test, (x, y, z, xt, yt) = _frames()
    train["split"], test["split"] = "train", ["Val"] * 10 + ["test"] * 30
    pd.concat([train, test]).to_parquet(tmp_path / "all.parquet")
    with pytest.warns(UserWarning, match="non-numeric column.*note"):
        s = load_splits("tabular", "given", path=str(tmp_path / "all.parquet"),
                        labels="label_*", split_column="split", train_labels="observed",
                        standardize=True)
    assert s.class_names == ["label_a", "label_b", "label_c"]
    assert s.meta["feature_columns"] == [f"f{j}" for j in range(5)]
    assert np.array_equal(s.observed, z)                   # empty cells = unobserved
    assert len(s.val) == 10 and len(s.test) == 30 and s.meta["val_from"] == "given"
    mean, std = x.mean(0), x.std(0)
    assert np.allclose(s.train.x, (x - mean) / std, atol=1e-5)       # train rows' statistics
    assert np.allclose(s.test.x, (xt[10:] - mean) / std, atol=1e-5)
    assert s.meta["standardize"]["mean"] == pytest.approx(mean.tolist(), abs=1e-6)


def test_tabular_full_labels_carve_out_like_arrays(tmp_path):
    """Without test / val files, the same rows as arrays give the same splits (the carve-out,
    the protocol's train / val split and the observed draw are the shared code)."""
    train, test, (x, y, z, xt, yt) = _frames()
    test.to_csv(tmp_path / "rows.csv", index=False)
    np.save(tmp_path / "xt.npy", xt)
    np.save(tmp_path / "yt.npy", yt)
    a = load_splits("arrays", features=str(tmp_path / "xt.npy"), labels=str(tmp_path / "yt.npy"),
                    standardize=True)  # a table's features are standardised by default
    t = load_splits("tabular", path=str(tmp_path / "rows.csv"), labels="label_a,label_b,label_c",
                    features="f*")
    # (a .npy file is standardised as a memory map, with statistics streamed in float64; the
    # table in memory: equal up to float32 rounding)
    same = dict(rtol=1e-5, atol=1e-6)
    assert np.allclose(a.train.x, t.train.x, **same) and np.array_equal(a.train.y, t.train.y)
    assert np.array_equal(a.observed, t.observed) and np.allclose(a.test.x, t.test.x, **same)


def test_tabular_names_column_and_errors(tmp_path, monkeypatch):
    df = pd.DataFrame({"f1": [0.1, 0.2, 0.3, 0.4], "tags": ["cat", "dog;cat", "", "dog"]})
    df.to_csv(tmp_path / "tr.csv", index=False)
    pd.DataFrame({"f1": [0.5, 0.6, 0.7, 0.8, 0.9], "tags": ["cat", "dog", "cat|dog", "cat",
                                                            "dog"]}).to_csv(
        tmp_path / "te.csv", index=False)
    ds = load_dataset("tabular", path=str(tmp_path / "tr.csv"), labels="tags",
                      test_path=str(tmp_path / "te.csv"), train_labels="observed")
    assert ds.class_names == ["cat", "dog"]
    assert ds.observed.tolist() == [[1, 0], [1, 1], [0, 0], [0, 1]]
    assert ds.test.y.tolist() == [[1, 0], [0, 1], [1, 1], [1, 0], [0, 1]]
    with pytest.raises(ValueError, match="label column 'label_\\*' matches no column; the "
                                         "columns are f1, tags"):
        load_dataset("tabular", path=str(tmp_path / "tr.csv"), labels="label_*")
    pd.DataFrame({"f1": [0.5], "tags": ["cow"]}).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match="bad.csv, row 0: unknown class name 'cow'"):
        load_dataset("tabular", path=str(tmp_path / "tr.csv"), labels="tags",
                     test_path=str(tmp_path / "bad.csv"))
    pd.DataFrame({"g": [0.5], "tags": ["cat"]}).to_csv(tmp_path / "nof.csv", index=False)
    with pytest.raises(ValueError, match=r"nof.csv: feature column\(s\) f1 missing"):
        load_dataset("tabular", path=str(tmp_path / "tr.csv"), labels="tags",
                     test_path=str(tmp_path / "nof.csv"))
    pd.DataFrame({"f1": [0.1, 0.2], "y": [1, None]}).to_csv(tmp_path / "hole.csv", index=False)
    with pytest.raises(ValueError, match="label column 'y' has an empty cell \\(row 1\\).*"
                                         "train_labels=observed"):
        load_dataset("tabular", path=str(tmp_path / "hole.csv"), labels="y")
    pd.DataFrame({"f1": [0.1, 0.2], "y": [1, 2]}).to_csv(tmp_path / "two.csv", index=False)
    with pytest.raises(ValueError, match=r"two.csv \(columns y\) must hold only 1 .* found "
                                         r"\[2.0\]"):
        load_dataset("tabular", path=str(tmp_path / "two.csv"), labels="y",
                     train_labels="observed", test_path=str(tmp_path / "te.csv"))
    # the option that gave it, and for a relative path the folder it was looked for in
    with pytest.raises(FileNotFoundError, match=r"nowhere.csv \(given as --data path=.*\) does "
                                                r"not exist$"):
        load_dataset("tabular", path=str(tmp_path / "nowhere.csv"), labels="y")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"test table file gone.csv \(given as --data "
                                                rf"test_path=gone.csv\) does not exist; a relative "
                                                rf"path is read from the current folder, "
                                                rf"{re.escape(str(tmp_path))}"):
        load_dataset("tabular", path="hole.csv", labels="y", test_path="gone.csv",
                     train_labels="observed")
    for name in ("x.npy", "vx.npy"):
        np.save(tmp_path / name, np.zeros((4, 2), dtype=np.float32))
    np.save(tmp_path / "y.npy", np.eye(2, dtype=np.uint8)[[0, 1, 0, 1]])
    with pytest.raises(FileNotFoundError, match=r"val labels file vy.npy \(given as --data "
                                                r"val_labels=vy.npy\) does not exist; a relative"):
        load_dataset("arrays", features="x.npy", labels="y.npy", val_features="vx.npy",
                     val_labels="vy.npy")


# ---- image sources ------------------------------------------------------------------------------
@pytest.fixture
def images(tmp_path):
    """12 toy images (3 colours) with full labels, in a one-folder-per-class tree of each
    image's first positive, and CSV files."""
    from _image_toy import make_images

    paths, y = make_images(tmp_path / "all", 12)
    names = ["red", "green", "blue"]
    tree = tmp_path / "tree"
    rows = []
    for p, labels in zip(paths, y):
        first = names[int(np.flatnonzero(labels)[0])]
        (tree / first).mkdir(parents=True, exist_ok=True)
        shutil.copy(p, tree / first / Path(p).name)
        rows.append((f"all/{Path(p).name}", [names[j] for j in np.flatnonzero(labels)], first))
    (tmp_path / "tags.csv").write_text("path,labels\n" + "".join(
        f"{r},{first}\n" for r, _, first in rows[:8]))
    (tmp_path / "test.csv").write_text("path,labels\n" + "".join(
        f"{r},{';'.join(full)}\n" for r, full, _ in rows[8:]))
    return tmp_path, y, names


def test_csv_images_given(images):
    root, y, names = images
    s = load_splits("csv", "given", path=str(root / "tags.csv"),
                    test_path=str(root / "test.csv"), train_labels="observed",
                    class_names=names)
    assert (s.observed == 1).sum(1).tolist() == [1] * 8 and (s.observed == -1).sum() == 0
    assert len(s.val) + len(s.test) == 4 and s.meta["k_from"] == "val"
    assert s.k == pytest.approx(s.val.y.sum(1).mean())
    with pytest.raises(ValueError, match="need a fully labelled test CSV"):
        load_dataset("csv", path=str(root / "tags.csv"), train_labels="observed")


def test_folder_given_with_a_test_csv(images):
    root, y, names = images
    (root / "tree_test.csv").write_text((root / "test.csv").read_text())
    s = load_splits("folder", "given", root=str(root / "tree"), train_labels="observed",
                    test_csv=str(root / "test.csv"))
    assert (s.observed == 1).sum(1).tolist() == [1] * len(s.train)  # the folder class
    full = np.array([[int(c in row) for c in sorted(names)] for row in
                     [line.split(",")[1].split(";") for line in
                      (root / "test.csv").read_text().splitlines()[1:]]])
    both = np.concatenate([s.val.y, s.test.y])
    assert both.sum() == full.sum()                                # the CSV's full labels
    assert "regime given: observed training labels from" in describe_labels(s)["summary"]
    with pytest.raises(ValueError, match="need a fully labelled test set: test_csv=FILE"):
        load_dataset("folder", root=str(root / "tree"), train_labels="observed")
    # the folder's full-label mode also takes a fully labelled test CSV, when asked for
    s1 = load_splits("folder", root=str(root / "tree"), test_csv=str(root / "test.csv"),
                     train_labels="full")
    assert len(s1.test) == 4
    # ... its training labels are still one folder tag per image, not full ones: no train
    # recovery is scored against them, and the summary does not call them full
    assert not s1.train_labels_complete
    assert "drawn from full labels" not in describe_labels(s1)["summary"]
    # by default a test CSV makes the folder tags observed labels (val from the test CSV)
    s2 = load_splits("folder", root=str(root / "tree"), test_csv=str(root / "test.csv"))
    assert not s2.train_labels_complete and s2.meta["val_from"] == "test"


# ---- an image source without a backbone --------------------------------------------------------
def test_image_source_without_a_backbone_says_what_to_add(images, capsys):
    from spmlkit.cli import main

    root, _, _ = images
    msg = ("dataset 'folder' holds images, not feature vectors, and --mode linear trains on "
           "feature vectors: an image source needs a backbone (--backbone NAME")
    assert main(["train", "--solver", "adam", "--dataset", "folder", "--data",
                 f"root={root / 'tree'}",
                 "--epochs", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert msg in err and "--mode finetune" in err and "could not convert" not in err
    # the Python API says the same, before any run folder is made
    s = load_splits("folder", root=str(root / "tree"))
    with pytest.raises(ValueError, match="image source needs a backbone"):
        train_run("linear", s, "an", out=root / "runs")
    assert not (root / "runs").exists()
    # a study / benchmark refuses it when the spec is read, not once per grid point
    assert main(["benchmark", "--solver", "adam", "--dataset", "csv", "--data",
                 f"path={root / 'tags.csv'}", "--losses", "an", "--epochs", "1",
                 "--out", str(root / "bench")]) == 2
    err = capsys.readouterr().err
    assert "dataset 'csv' holds images and mode 'linear' trains on feature vectors: give the " \
           "dataset a backbone" in err
    assert not (root / "bench" / "runs").exists()


def test_cli_regime_given_on_full_labels_is_one_clear_line(capsys):
    from spmlkit.cli import main

    assert main(["train", "--regime", "given", "--epochs", "1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["spml train: error: regime 'given' uses observed training labels given with "
                   "the data, and dataset 'yeast' was given full labels only; pass the source "
                   "train_labels=observed (--data train_labels=observed: its training labels "
                   "are then read as observed ones, with a fully labelled test set), or use a "
                   "regime that draws from full labels, e.g. 1p"]


def test_predict_refuses_a_table_for_a_run_not_trained_on_columns(arrays_given, tmp_path):
    from spmlkit.engine import TrainConfig
    from spmlkit.predict import predict_run

    folder, opts, (x, y, z, xt, yt) = arrays_given
    res = train_run("linear", load_splits("arrays", "given", **opts), "an",
                    config=TrainConfig(epochs=1), out=tmp_path / "runs")
    pd.DataFrame(xt, columns=[f"f{j}" for j in range(5)]).to_csv(tmp_path / "new.csv",
                                                                 index=False)
    with pytest.raises(ValueError, match="not trained on a table's columns"):
        predict_run(res["run_dir"], tmp_path / "new.csv")


def test_folder_given_on_backbone_features_keeps_the_observed_labels_and_val(images):
    """With a backbone the image items become cached features; the observed labels and a val
    set given apart come along, and a linear run trains on them."""
    from spmlkit.engine import TrainConfig

    root, _, names = images
    (root / "val.csv").write_text((root / "test.csv").read_text())
    feats = {"cache_dir": str(root / "cache"), "progress": False, "num_workers": 0}
    s = load_splits("folder", "given", root=str(root / "tree"), train_labels="observed",
                    test_csv=str(root / "test.csv"), val_csv=str(root / "val.csv"),
                    backbone="tiny_cnn", features=feats)
    assert s.train.x.dtype.kind == "f" and s.val.x.shape == (4, s.train.x.shape[1])
    assert (s.observed == 1).sum(1).tolist() == [1] * 12 and s.meta["val_from"] == "given"
    res = train_run("linear", s, "epr", config=TrainConfig(epochs=1))
    assert np.isfinite(res["test_map"]) and res["train_recovery_map"] is None


def test_a_class_without_an_observed_positive_is_named(arrays_given):
    """A class that no training row observes as positive can only be learnt as absent: the
    summary names it (it said nothing)."""
    folder, opts, (x, y, z, xt, yt) = arrays_given
    z = z.copy()
    z[:, 1][z[:, 1] == 1] = 0
    np.save(folder / "z3.npy", z)
    s = load_splits("arrays", "given", **{**opts, "labels": str(folder / "z3.npy")})
    labels = describe_labels(s)
    name = str(s.class_names[1])
    assert labels["classes_without_positive"] == [name]
    assert f"; 1 class(es) without an observed positive, learnt as absent: {name})" in \
        labels["summary"]
    assert describe_labels(load_splits("yeast"))["classes_without_positive"] == []


def test_observed_cells_empty_beside_zeros_without_minus_one_are_refused(tmp_path):
    """A presence / absence table with gaps (1, 0, empty, no -1) read as observed labels:
    its 0s would silently count as unknown; refused, in a table and in an array. Partial
    test labels given without eval_labels=partial are refused with that hint."""
    train, test, (x, y, z, xt, yt) = _frames()
    cols = ["label_a", "label_b", "label_c"]
    zeros = train.copy()
    zeros[cols] = zeros[cols].replace(-1, 0)                     # negatives written as 0
    assert zeros[cols].isna().any().any() and (zeros[cols] == 0).any().any()
    zeros.to_csv(tmp_path / "train.csv", index=False)
    test.to_csv(tmp_path / "test.csv", index=False)
    with pytest.raises(ValueError, match="train.csv.*0s and empty \\(NaN\\) cells but no -1"):
        load_splits("tabular", "given", path=str(tmp_path / "train.csv"),
                    test_path=str(tmp_path / "test.csv"), labels="label_*",
                    train_labels="observed")
    gaps = np.where(z == 0, np.nan, np.where(z == -1, 0.0, z))    # the same as an array
    with pytest.raises(ValueError, match="labels array.*no -1"):
        load_splits("arrays", "given", features=x, labels=gaps, test_features=xt,
                    test_labels=yt, train_labels="observed")
    partial = np.where(yt == 1, 1, -1)
    with pytest.raises(ValueError, match="test labels array.*give eval_labels=partial"):
        load_splits("arrays", features=x, labels=y, test_features=xt, test_labels=partial)
