"""The ``cole`` (official formatted files), ``arrays`` (your own files) and ``yeast`` sources.

The Cole fixtures are written in exactly the official forms: ``formatted_*_labels.npy`` float64
0/1 (as ``format_pascal.py`` saves them), ``formatted_train_labels_obs.npy`` float64 -1/0/1 (as
``generate_observed_labels.py`` saves them), ``formatted_*_images.npy`` string arrays and
``{train,val}_features_imagenet_resnet50.npy`` float32.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from spmlkit.data import DATASETS, make_splits
from spmlkit.loading import load_dataset, load_splits
from spmlkit.data.protocol import cole_split
from spmlkit.data.rows import Rows
from spmlkit.data.cole import VOC_CLASSES, load_cole
from spmlkit.data.arrays import load_arrays
from spmlkit.labels import NEGATIVE, POSITIVE, UNOBSERVED, sample_single_positive

N_TRAIN, N_VAL, L, D = 50, 30, 20, 8


def _labels(n, num_classes, rng):
    y = np.zeros((n, num_classes))                        # float64, as format_pascal.py saves
    for i in range(n):
        y[i, rng.choice(num_classes, size=rng.randint(1, 4), replace=False)] = 1.0
    return y


def write_cole(root, n_train=N_TRAIN, n_val=N_VAL, num_classes=L, dim=D, obs_seed=7,
               obs_name="formatted_train_labels_obs.npy"):
    """Write one dataset folder in the official layout; returns what was written."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(0)
    out = {}
    for phase, n in (("train", n_train), ("val", n_val)):
        y = _labels(n, num_classes, rng)
        x = rng.randn(n, dim).astype(np.float32)
        images = np.array([f"{phase}_{i:04d}.jpg" for i in range(n)])
        np.save(root / f"formatted_{phase}_labels.npy", y)
        np.save(root / f"formatted_{phase}_images.npy", images)
        np.save(root / f"{phase}_features_imagenet_resnet50.npy", x)
        out[phase] = (x, y, images)
    if obs_name:
        z = sample_single_positive(out["train"][1], seed=obs_seed)
        np.save(root / obs_name, z.astype(np.float64))   # -1 / 0 / 1 floats, as shipped
        out["obs"] = z
    return out


@pytest.fixture
def pascal(tmp_path):
    root = tmp_path / "pascal"
    return root, write_cole(root)


# ---------------------------------------------------------------- cole: loading
def test_cole_round_trip(pascal):
    root, data = pascal
    ds = load_cole(root)
    x, y, images = data["train"]
    xt, yt, images_t = data["val"]
    assert ds.name == "pascal"
    assert (len(ds.pool), len(ds.test)) == (N_TRAIN, N_VAL)
    np.testing.assert_array_equal(ds.pool.x, x)
    np.testing.assert_array_equal(ds.test.x, xt)
    np.testing.assert_array_equal(ds.pool.y, y)
    np.testing.assert_array_equal(ds.test.y, yt)
    assert ds.pool.x.dtype == np.float32 and ds.pool.y.dtype == np.uint8
    assert ds.pool.ids == images.tolist() and ds.test.ids == images_t.tolist()
    assert ds.pool_observed.dtype == np.int8
    np.testing.assert_array_equal(ds.pool_observed, data["obs"])
    assert ds.meta["observed_file"] == "formatted_train_labels_obs.npy"
    assert "cole" in DATASETS.names("features")


def test_voc_class_names(pascal):
    root, _ = pascal
    assert load_cole(root).class_names == list(VOC_CLASSES)
    assert VOC_CLASSES[0] == "aeroplane" and VOC_CLASSES[-1] == "tvmonitor"
    assert list(VOC_CLASSES) == sorted(VOC_CLASSES) and len(VOC_CLASSES) == 20


def test_class_names_default_file_and_name(tmp_path):
    root = tmp_path / "my_voc_feats"
    write_cole(root)
    assert load_cole(root).class_names == [f"class{j}" for j in range(L)]
    ds = load_cole(root, name="pascal")                  # the name picks the official order
    assert ds.name == "pascal" and ds.class_names == list(VOC_CLASSES)
    (root / "class_names.txt").write_text("\n".join(f"c{j}" for j in range(L)) + "\n")
    assert load_cole(root).class_names == [f"c{j}" for j in range(L)]
    (root / "class_names.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"class_names\.txt lists 2 class names"):
        load_cole(root)


def test_cole_load_splits_uses_shipped_observed(pascal):
    root, data = pascal
    splits = load_splits("cole", root=root)
    train_idx, val_idx = cole_split(N_TRAIN, 0.2, 1200)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (40, 10, N_VAL)
    np.testing.assert_array_equal(splits.observed, data["obs"][train_idx])
    np.testing.assert_array_equal(splits.val_observed, data["obs"][val_idx])
    np.testing.assert_array_equal(splits.train.x, data["train"][0][train_idx])
    fresh = sample_single_positive(data["train"][1], seed=1200)
    assert not np.array_equal(fresh, data["obs"])        # so the assertion above means something
    # another seed or regime draws its own labels instead of the shipped ones
    np.testing.assert_array_equal(load_splits("cole", seed=5, root=root).observed,
                                  sample_single_positive(data["train"][1], seed=5)[train_idx])
    assert (load_splits("cole", "1p_1n", root=root).observed == NEGATIVE).sum() == 40


def test_cole_observed_generated_when_absent(tmp_path):
    root = tmp_path / "coco"
    data = write_cole(root, num_classes=80, obs_name=None)
    ds = load_cole(root)
    assert ds.pool_observed is None and ds.class_names[0] == "person"
    splits = make_splits(ds)
    train_idx, _ = cole_split(N_TRAIN, 0.2, 1200)
    np.testing.assert_array_equal(
        splits.observed, sample_single_positive(data["train"][1], seed=1200)[train_idx])
    assert ((splits.observed == POSITIVE).sum(axis=1) == 1).all()
    assert set(np.unique(splits.observed)) <= {POSITIVE, UNOBSERVED}


def test_cole_observed_file_variants(tmp_path):
    root = tmp_path / "nuswide"
    data = write_cole(root, obs_name="formatted_train_uniform_labels_obs.npy")
    ds = load_cole(root)                                   # the follow-up's name is accepted
    np.testing.assert_array_equal(ds.pool_observed, data["obs"])
    assert ds.meta["observed_file"] == "formatted_train_uniform_labels_obs.npy"
    assert load_cole(root, observed=None).pool_observed is None
    with pytest.raises(FileNotFoundError, match="formatted_train_size_labels_obs.npy"):
        load_cole(root, observed="size")
    with pytest.raises(ValueError, match="observed must be None or one of"):
        load_cole(root, observed="biased")


def test_cole_mmap(pascal):
    root, data = pascal
    ds = load_cole(root, mmap=True)
    assert isinstance(ds.test.x, np.memmap)
    np.testing.assert_array_equal(ds.pool.x, data["train"][0])
    splits = make_splits(ds)
    np.testing.assert_array_equal(splits.test.x, data["val"][0])
    assert len(splits.train) == 40


# ---------------------------------------------------------------- cole: errors
def test_cole_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*does not exist"):
        load_cole(tmp_path / "nowhere")


def test_cole_missing_file_lists_expected_and_present(pascal):
    root, _ = pascal
    (root / "val_features_imagenet_resnet50.npy").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_cole(root)
    msg = str(err.value)
    assert "missing val_features_imagenet_resnet50.npy" in msg
    assert "train_features_imagenet_resnet50.npy" in msg          # expected
    assert "the folder holds: formatted_train_images.npy" in msg  # present


def test_cole_wrong_arch_hints(pascal):
    root, _ = pascal
    with pytest.raises(FileNotFoundError, match=r"train_features_imagenet_vit\.npy.*'resnet50'"):
        load_cole(root, arch="vit")


def test_cole_row_mismatch_names_both_files(pascal):
    root, _ = pascal
    np.save(root / "train_features_imagenet_resnet50.npy", np.zeros((N_TRAIN - 1, D), np.float32))
    with pytest.raises(ValueError, match=r"train_features_imagenet_resnet50\.npy has 49 rows but "
                                         r".*formatted_train_labels\.npy has 50"):
        load_cole(root)


def test_cole_non_binary_labels_name_the_file(pascal):
    root, data = pascal
    y = data["val"][1].copy()
    y[3, 0] = 2.0
    np.save(root / "formatted_val_labels.npy", y)
    with pytest.raises(ValueError, match=r"formatted_val_labels\.npy must hold only 0 and 1; "
                                         r"found \[2\.0\] \(first at row 3\)"):
        load_cole(root)


def test_cole_nan_features_name_file_and_rows(pascal):
    root, data = pascal
    for mmap in (False, True):
        x = data["val"][0].copy()
        x[[4, 9], 1] = np.nan
        np.save(root / "val_features_imagenet_resnet50.npy", x)
        with pytest.raises(ValueError, match=r"val_features_imagenet_resnet50\.npy: 2 row\(s\) "
                                             r"hold NaN or inf \(first rows: \[4, 9\]\)"):
            load_cole(root, mmap=mmap)


def test_cole_class_count_mismatch(pascal):
    root, _ = pascal
    np.save(root / "formatted_val_labels.npy", np.zeros((N_VAL, L + 1)))
    with pytest.raises(ValueError, match=r"formatted_val_labels\.npy has 21 classes but "
                                         r".*formatted_train_labels\.npy has 20"):
        load_cole(root)


def test_cole_bad_observed_files(pascal):
    root, data = pascal
    y = data["train"][1]
    z = data["obs"].astype(np.float64)
    bad = z.copy()
    row = int(np.flatnonzero(y.sum(axis=1) < L)[0])
    bad[row, np.flatnonzero(y[row] == 0)[0]] = 1.0          # positive where the label is 0
    np.save(root / "formatted_train_labels_obs.npy", bad)
    with pytest.raises(ValueError, match=rf"formatted_train_labels_obs\.npy: 1 row\(s\) observe "
                                         rf"labels that contradict .*first at row {row}"):
        load_cole(root)
    two = z.copy()
    row = int(np.flatnonzero(y.sum(axis=1) >= 2)[0])
    two[row] = np.where(y[row] == 1, 1.0, 0.0)
    np.save(root / "formatted_train_labels_obs.npy", two)
    with pytest.raises(ValueError, match=rf"labels_obs\.npy: 1 row\(s\) observe more than one "
                                         rf"positive .*first at row {row}"):
        load_cole(root)
    np.save(root / "formatted_train_labels_obs.npy", np.full(y.shape, 3.0))
    with pytest.raises(ValueError, match=r"formatted_train_labels_obs\.npy must hold only"):
        load_cole(root)
    assert load_cole(root, observed=None).pool_observed is None


def test_cole_images_count_mismatch(pascal):
    root, _ = pascal
    np.save(root / "formatted_train_images.npy", np.array(["a.jpg"] * 3))
    with pytest.raises(ValueError, match=r"formatted_train_images\.npy has shape \(3,\)"):
        load_cole(root)


# ---------------------------------------------------------------- arrays
@pytest.fixture
def arrays_files(tmp_path):
    rng = np.random.RandomState(1)
    x = rng.randn(40, 5).astype(np.float32)
    y = (rng.rand(40, 4) < 0.4).astype(np.uint8)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    return tmp_path, x, y


def test_arrays_npy_carve_out(arrays_files):
    d, x, y = arrays_files
    ds = load_arrays(d / "x.npy", d / "y.npy")
    pool_idx, test_idx = cole_split(40, 0.3, 1200)
    assert (len(ds.pool), len(ds.test)) == (28, 12)
    np.testing.assert_array_equal(ds.pool.x, x[pool_idx])
    np.testing.assert_array_equal(ds.test.y, y[test_idx])
    assert ds.test.ids == test_idx.tolist()
    assert ds.class_names == ["class0", "class1", "class2", "class3"]
    assert len(load_arrays(d / "x.npy", d / "y.npy", test_fraction=0.5).test) == 20
    splits = load_splits("arrays", features=d / "x.npy", labels=d / "y.npy", standardize=True)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (22, 6, 12)
    assert isinstance(splits.train.x, Rows)  # the .npy file is mapped, its rows read on demand
    np.testing.assert_allclose(np.asarray(splits.train.x).mean(axis=0), 0, atol=1e-5)


def test_arrays_npz_keys(arrays_files):
    d, x, y = arrays_files
    np.savez(d / "a.npz", features=x, other=y)
    np.savez(d / "b.npz", x=x, y=y)
    np.savez(d / "c.npz", whatever=x)
    np.savez(d / "bad.npz", a=x, b=x)
    for f in ("a.npz", "b.npz", "c.npz"):
        np.testing.assert_array_equal(load_arrays(d / f, d / "b.npz").pool.x,
                                      x[cole_split(40, 0.3)[0]])
    with pytest.raises(ValueError, match=r"bad\.npz: expected the features under key "
                                         r"'features' or 'x'.*holds keys \['a', 'b'\]"):
        load_arrays(d / "bad.npz", d / "y.npy")


def test_arrays_csv_of_names(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "y.csv").write_text('labels\ndog,cat\n"cat"; bird\n\nbird  dog\ncat\ndog\n')
    ds = load_arrays(tmp_path / "x.npy", tmp_path / "y.csv", test_fraction=0.5)
    assert ds.class_names == ["bird", "cat", "dog"]
    full = np.r_[ds.pool.y, ds.test.y][np.argsort(np.r_[ds.pool.ids, ds.test.ids])]
    np.testing.assert_array_equal(full, [[0, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 1], [0, 1, 0],
                                         [0, 0, 1]])
    ds = load_arrays(tmp_path / "x.npy", tmp_path / "y.csv", class_names=["dog", "cat", "bird",
                                                                           "fish"])
    assert ds.class_names == ["dog", "cat", "bird", "fish"]
    (tmp_path / "names.txt").write_text("cat\ndog\n")
    with pytest.raises(ValueError, match=r"y\.csv, line 3 \(example row 1\): unknown class name "
                                         r"'bird'"):
        load_arrays(tmp_path / "x.npy", tmp_path / "y.csv", class_names=tmp_path / "names.txt")


def test_arrays_explicit_test_files(tmp_path):
    rng = np.random.RandomState(2)
    np.save(tmp_path / "x.npy", rng.randn(8, 3))
    np.save(tmp_path / "xt.npy", rng.randn(5, 3))
    (tmp_path / "y.txt").write_text("a\nb\na b\nc\na\nb\nc\na\n")
    (tmp_path / "yt.txt").write_text("a\nc\nb\na\nc\n")
    ds = load_arrays(tmp_path / "x.npy", tmp_path / "y.txt", tmp_path / "xt.npy",
                     tmp_path / "yt.txt")
    assert (len(ds.pool), len(ds.test)) == (8, 5)
    assert ds.test.y[:, 2].tolist() == [0, 1, 0, 0, 1]
    (tmp_path / "yt.txt").write_text("a\nc\nb\nd\nc\n")
    with pytest.raises(ValueError, match=r"yt\.txt, line 4 \(example row 3\): unknown class "
                                         r"name 'd'"):
        load_arrays(tmp_path / "x.npy", tmp_path / "y.txt", tmp_path / "xt.npy",
                    tmp_path / "yt.txt")
    with pytest.raises(ValueError, match="give both test_features and test_labels"):
        load_arrays(tmp_path / "x.npy", tmp_path / "y.txt", tmp_path / "xt.npy")


def test_arrays_errors(arrays_files):
    d, x, y = arrays_files
    bad = x.copy()
    bad[7, 2] = np.inf
    np.save(d / "nan.npy", bad)
    with pytest.raises(ValueError, match=r"nan\.npy: 1 row\(s\) hold NaN or inf \(first rows: "
                                         r"\[7\]\)"):
        load_arrays(d / "nan.npy", d / "y.npy")
    np.save(d / "short.npy", y[:30])
    with pytest.raises(ValueError, match=r"x\.npy has 40 rows but .*short\.npy has 30"):
        load_arrays(d / "x.npy", d / "short.npy")
    with pytest.raises(FileNotFoundError, match=r"missing\.npy"):
        load_arrays(d / "missing.npy", d / "y.npy")
    with pytest.raises(FileNotFoundError, match=r"missing\.csv"):
        load_arrays(d / "x.npy", d / "missing.csv")
    np.save(d / "y3.npy", np.where(y == 1, 1, 3))
    with pytest.raises(ValueError, match=r"y3\.npy must hold only 0 and 1"):
        load_arrays(d / "x.npy", d / "y3.npy")
    with pytest.raises(ValueError, match=r"y\.npy: 4 label columns but 2 class names"):
        load_arrays(d / "x.npy", d / "y.npy", class_names=["a", "b"])
    with pytest.raises(ValueError, match=r"y\.npy: 40 example\(s\) leave an empty test set"):
        load_arrays(d / "x.npy", d / "y.npy", test_fraction=0.001)
    (d / "x.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match=r"x\.csv: features must be a \.npy or \.npz file"):
        load_arrays(d / "x.csv", d / "y.npy")


# ---------------------------------------------------------------- yeast
def test_yeast_splits():
    splits = load_splits("yeast")
    assert (len(splits.train), len(splits.val), len(splits.test)) == (1354, 338, 725)
    assert splits.k == pytest.approx(splits.train.y.sum(axis=1).mean())
    assert 4.0 < splits.k < 4.5                             # yeast: ~4.2 labels per gene
    np.testing.assert_allclose(splits.train.x.mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(splits.train.x.std(axis=0), 1, atol=1e-3)
    assert ((splits.observed == POSITIVE).sum(axis=1) == 1).all()
    assert set(np.unique(splits.observed)) == {POSITIVE, UNOBSERVED}
    assert load_dataset("yeast").pool_observed is None


# ---- source options, checked against the source's signature ----------------------------------
def test_source_options_are_checked_against_the_signature(arrays_files):
    """Misspelt, missing and mistyped options are ``ValueError``s naming the dataset, key and
    value (they were ``TypeError``s from inside the source); the message lists what the source
    takes, generated from its signature."""
    root = arrays_files[0]
    x, y = str(root / "x.npy"), str(root / "y.npy")
    with pytest.raises(ValueError, match=r"^unknown option 'subsampel' for dataset 'yeast'; did "
                                         r"you mean 'subsample'\? It takes: path, seed, "
                                         r"subsample, subsample_seed, class_order, "
                                         r"protocol, val_variant \(spml list datasets yeast "
                                         r"--details: each option's type, default and "
                                         r"meaning\)$"):
        load_splits("yeast", subsampel=0.5)
    with pytest.raises(ValueError, match="'subsample' belongs to the train / val protocol"):
        load_dataset("yeast", subsample=0.5)  # no protocol without load_splits
    with pytest.raises(ValueError, match=r"dataset 'arrays' needs the option\(s\) features, "
                                         r"labels"):
        load_dataset("arrays")
    with pytest.raises(ValueError, match=r"option standardize='yes' of dataset 'arrays': "
                                         r"expected bool, got str"):
        load_dataset("arrays", features=x, labels=y, standardize="yes")
    with pytest.raises(ValueError, match=r"option root=2012 of dataset 'cole': expected "
                                         r"str \| os.PathLike, got int \(on the command line"):
        load_dataset("cole", root=2012)
    with pytest.raises(ValueError, match="the features option .* needs a backbone"):
        load_dataset("folder", root=str(root), features={"dtype": "float16"})
    with pytest.raises(ValueError, match="observed-label seed must be a whole number"):
        load_splits("yeast", seed="1")


def test_name_option_reaches_the_source(arrays_files):
    """``name=`` is the source's option (the dataset's name), not ``load_splits``' dataset
    argument (it raised "got multiple values for argument 'name'")."""
    x, y = str(arrays_files[0] / "x.npy"), str(arrays_files[0] / "y.npy")
    assert load_splits("arrays", features=x, labels=y, name="mine").name == "mine"
    assert load_dataset("arrays", features=x, labels=y, name="mine").name == "mine"


def test_one_module_per_source():
    """Every registered source lives in a module of its own under spmlkit.data, which
    registers it when ``spmlkit.data`` imports it (no module holds two sources)."""
    import importlib

    data = importlib.import_module("spmlkit.data")
    modules = [e.factory.__module__ for e in DATASETS.entries()]
    assert len(modules) >= 13 and len(set(modules)) == len(modules), modules
    for entry, module in zip(DATASETS.entries(), modules):
        package, _, leaf = module.rpartition(".")
        assert package == "spmlkit.data", (entry.name, module)
        assert getattr(data, leaf) is importlib.import_module(module), (entry.name, module)


# ---- the tabular SPML protocol -------------------------------------------------------------
def test_tabular_protocol_splits_all_rows_80_10_10_per_trial_seed(tmp_path):
    from spmlkit.data.protocol import tabular_split

    rng = np.random.RandomState(4)
    y = (rng.rand(60, 5) < 0.4).astype(np.uint8)
    y[np.arange(60), rng.randint(0, 5, 60)] = 1  # every row has a positive
    np.save(tmp_path / "x.npy", rng.randn(60, 3).astype(np.float32))
    np.save(tmp_path / "y.npy", y)
    files = {"features": tmp_path / "x.npy", "labels": tmp_path / "y.npy"}
    ds = load_dataset("arrays", **files)
    n = len(ds.pool) + len(ds.test)
    a = make_splits(ds, "1p", seed=0, protocol="tabular")
    rows = [a.meta[k] for k in ("train_rows", "val_rows", "test_rows")]
    assert sorted(sum(rows, [])) == list(range(n))           # a partition of every row
    assert (len(a.val), len(a.test)) == (round(0.1 * n), round(0.1 * n))
    assert len(a.train) == n - 2 * round(0.1 * n)
    assert (a.meta["protocol"], a.meta["trial_seed"]) == ("tabular", 0)
    every = np.concatenate([ds.pool.y, ds.test.y])
    np.testing.assert_array_equal(a.test.y, every[rows[2]])  # full labels, as drawn
    # one observed positive per train row, drawn among its true positives; nothing else seen
    assert ((a.observed == POSITIVE).sum(1) == 1).all()
    assert (a.train.y[a.observed == POSITIVE] == 1).all()
    assert set(np.unique(a.observed)) == {POSITIVE, UNOBSERVED}
    # another trial: another split and other positives; the same trial again: the same
    b = make_splits(ds, "1p", seed=1, protocol="tabular")
    assert b.meta["test_rows"] != a.meta["test_rows"]
    again = make_splits(ds, "1p", seed=0, protocol="tabular")
    np.testing.assert_array_equal(again.observed, a.observed)
    assert again.meta["val_rows"] == a.meta["val_rows"]
    assert [len(p) for p in tabular_split(10, 3)] == [8, 1, 1]
    # through load_splits, the protocol is an option like subsample
    c = load_splits("arrays", "1p", seed=0, protocol="tabular", **files)
    assert c.meta["test_rows"] == a.meta["test_rows"]
    with pytest.raises(ValueError, match="protocol must be one of"):
        make_splits(ds, "1p", protocol="mulan")


def test_tabular_protocol_rows_are_the_documented_parts_of_the_permutation(tmp_path):
    """Pinned against rows computed here, not read back from the split: the 50 rows (40 pool +
    10 test, in that order) are permuted with RandomState(seed); train is the first 40, val
    the next 5, test the last 5, each sorted. A row's identity is checked through its
    features (row i's first feature is i)."""
    x = np.arange(50 * 2, dtype=np.float32).reshape(50, 2)
    x[:, 0] = np.arange(50)
    y = np.zeros((50, 3), np.uint8)
    y[np.arange(50), np.arange(50) % 3] = 1
    np.save(tmp_path / "x.npy", x[:40])
    np.save(tmp_path / "y.npy", y[:40])
    np.save(tmp_path / "xt.npy", x[40:])
    np.save(tmp_path / "yt.npy", y[40:])
    files = {k: str(tmp_path / f) for k, f in (("features", "x.npy"), ("labels", "y.npy"),
                                                 ("test_features", "xt.npy"),
                                                 ("test_labels", "yt.npy"))}
    perm = np.random.RandomState(7).permutation(50)
    want = {"train": sorted(perm[:40]), "val": sorted(perm[40:45]), "test": sorted(perm[45:])}
    s = load_splits("arrays", "1p", seed=7, protocol="tabular", **files)
    for part, rows in want.items():
        assert getattr(s, part).x[:, 0].astype(int).tolist() == [int(r) for r in rows], part
        np.testing.assert_array_equal(getattr(s, part).y, y[rows])
    assert s.meta["val_rows"] == [int(r) for r in want["val"]]
    assert s.meta["test_rows"] == [int(r) for r in want["test"]]


def test_tabular_protocol_on_yeast_standardises_with_its_train_rows():
    s = load_splits("yeast", "1p", seed=2, protocol="tabular")
    assert (len(s.train), len(s.val), len(s.test)) == (1933, 242, 242)
    np.testing.assert_allclose(s.train.x.mean(0), 0, atol=1e-5)
    assert abs(float(s.test.x.mean())) > 1e-4  # test rows use the train rows' statistics


def test_class_names_joined_by_commas_are_refused(tmp_path):
    """A names cell listing a row's classes with commas ("cat, dog") made every combination a
    class of its own (7 classes from 3), silently; a comma inside a name whose parts are no
    classes ("Washington, D.C.") stays a name."""
    from spmlkit.data.csv_images import read_image_csv
    from spmlkit.data.tabular import table_labels

    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"tags": ["cat", "cat, dog", "dog", "bird"]})
    with pytest.raises(ValueError, match=r"t.csv, column 'tags': class name 'cat, dog' is class "
                                         r"names joined by commas \('cat', 'dog'\); separate"):
        table_labels(df, ["tags"], "t.csv")
    y, classes = table_labels(pd.DataFrame({"tags": ["Washington, D.C.", "Paris"]}), ["tags"],
                              "t.csv")
    assert classes == ["Paris", "Washington, D.C."]
    csv = tmp_path / "images.csv"
    csv.write_text('a.jpg,cat\nb.jpg,"cat, dog"\nc.jpg,dog\n')
    with pytest.raises(ValueError, match="class name 'cat, dog' is class names joined"):
        read_image_csv(csv)


def test_a_feature_column_with_a_bad_cell_is_named_not_dropped(tmp_path):
    """One non-numeric cell ('abc', or a header line repeated mid-file) made pandas read the
    column as text, and the column was dropped from the features with a warning naming no
    row; now an error names the column, the row and the value. A text column stays out."""
    import warnings

    rng = np.random.default_rng(0)
    rows = ["f1,f2,note,cat,dog"] + [f"{rng.normal():.3f},{rng.normal():.3f},n{i},{i % 2},"
                                     f"{1 - i % 2}" for i in range(40)]
    bad = list(rows)
    bad[3] = "abc," + bad[3].split(",", 1)[1]
    (tmp_path / "bad.csv").write_text("\n".join(bad) + "\n")
    with pytest.raises(ValueError, match=r"bad.csv: column 'f1' holds numbers but for 1 "
                                         r"cell\(s\), the first at data row 3: 'abc'"):
        load_dataset("tabular", path=str(tmp_path / "bad.csv"), labels="cat,dog")
    (tmp_path / "ok.csv").write_text("\n".join(rows) + "\n")
    # a mostly empty text column with one note is a text column: left out, as before
    noted = list(rows)
    noted[0] += ",remark"
    noted[1:] = [r + ("," + ("checked by hand" if i == 3 else "")) for i, r in
                 enumerate(rows[1:])]
    (tmp_path / "noted.csv").write_text("\n".join(noted) + "\n")
    with pytest.warns(UserWarning, match="non-numeric column"):
        assert load_dataset("tabular", path=str(tmp_path / "noted.csv"),
                            labels="cat,dog").meta["feature_columns"] == ["f1", "f2"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = load_dataset("tabular", path=str(tmp_path / "ok.csv"), labels="cat,dog")
    assert ds.meta["feature_columns"] == ["f1", "f2"]
    assert any("non-numeric column(s) note are not used" in str(w.message) for w in caught)


def test_test_rows_that_are_training_rows_are_warned_about(tmp_path):
    """The same file as train and test, or ids in both files: accepted without a word, the
    model scored on rows it trained on."""
    rng = np.random.default_rng(0)
    head = "id,f1,f2,cat,dog\n"
    rows = [f"r{i},{rng.normal():.3f},{rng.normal():.3f},{i % 2},{1 - i % 2}\n"
            for i in range(60)]
    (tmp_path / "train.csv").write_text(head + "".join(rows[:40]))
    (tmp_path / "test.csv").write_text(head + "".join(rows[35:]))
    opts = dict(labels="cat,dog", id_column="id")
    with pytest.warns(UserWarning, match=r"test.csv: 5 of its 25 ids are also training rows' "
                                         r"ids in .*train.csv \(first: 'r35'\)"):
        load_dataset("tabular", path=str(tmp_path / "train.csv"),
                     test_path=str(tmp_path / "test.csv"), **opts)
    with pytest.warns(UserWarning, match="the test file is the training file"):
        load_dataset("tabular", path=str(tmp_path / "train.csv"),
                     test_path=str(tmp_path / "train.csv"), **opts)


def test_a_semicolon_table_and_a_folder_say_what_they_are(tmp_path):
    """A ';'-separated .csv said "label column 'cat' matches no column; the columns are
    id;f1;..."; a folder given as the table said it "does not exist"."""
    (tmp_path / "semi.csv").write_text("id;f1;cat\na;1,5;1\nb;2,5;0\n")
    with pytest.raises(ValueError, match=r"semi.csv: the header is one column, 'id;f1;cat': "
                                         r"the file looks ';'-separated; a .csv file is read "
                                         r"comma-separated"):
        load_dataset("tabular", path=str(tmp_path / "semi.csv"), labels="cat")
    with pytest.raises(ValueError, match=r"table file .* is a folder; give the path of a .csv"):
        load_dataset("tabular", path=str(tmp_path), labels="cat")


def test_an_image_csv_header_of_other_names_is_read_as_a_header(tmp_path):
    """``image_file,tags`` (no name of the known header list) was read as an image called
    image_file with a class 'tags': a phantom class, learnt as absent. A first row without an
    image suffix above rows that have one is the header."""
    from spmlkit.data.csv_images import read_image_csv

    csv = tmp_path / "images.csv"
    csv.write_text("image_file,tags\na.jpg,cat\nb.JPG,dog;cat\n")
    items, y, classes = read_image_csv(csv)[:3]
    assert classes == ["cat", "dog"] and [str(i).rsplit("/", 1)[-1] for i in items] == \
        ["a.jpg", "b.JPG"]


def test_an_infinite_or_too_large_feature_cell_is_named(tmp_path, recwarn):
    """1e39 (past float32) and inf said "1 row(s) hold NaN or inf" with a numpy overflow
    warning, and no column; the column, the value and the row are named."""
    for value in ("1e39", "inf"):
        (tmp_path / "t.csv").write_text("f1,f2,cat,dog\n" + "".join(
            f"{i / 7:.3f},{value if i == 4 else f'{i / 3:.3f}'},{i % 2},{1 - i % 2}\n"
            for i in range(30)))
        shown = re.escape(f"{float(value):g}")
        with pytest.raises(ValueError, match=rf"t.csv: feature column 'f2' holds {shown} at "
                                             rf"data row 5 \(1 such cell\(s\)\)"):
            load_dataset("tabular", path=str(tmp_path / "t.csv"), labels="cat,dog")
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_a_split_column_names_the_row_of_an_empty_or_unknown_cell(tmp_path):
    """An empty split cell said "split column 'split' holds [nan]", with no row."""
    rows = [f"{i / 7:.3f},{i % 2},{1 - i % 2},{'train' if i < 20 else 'test'}" for i in range(30)]
    for cell, says in (("", r"split column 'split' is empty at data row 6 \(1 empty cell"),
                       ("holdout", r"split column 'split' holds \['holdout'\] \(first at data "
                                   r"row 6\)")):
        text = list(rows)
        text[5] = text[5].rsplit(",", 1)[0] + "," + cell
        (tmp_path / "t.csv").write_text("f1,cat,dog,split\n" + "\n".join(text) + "\n")
        with pytest.raises(ValueError, match=says):
            load_dataset("tabular", path=str(tmp_path / "t.csv"), labels="cat,dog",
                         split_column="split")


def test_class_names_listed_on_the_command_line(tmp_path):
    """``--data class_names=cat,dog,bird`` failed with "class-names file cat,dog,bird does not
    exist"; text that names no file and holds commas (or semicolons) is the list itself."""
    from spmlkit.data.arrays import resolve_class_names

    assert resolve_class_names("cat, dog;bird") == ["cat", "dog", "bird"]
    with pytest.raises(ValueError, match="holds an empty name"):
        resolve_class_names("cat,,dog")
    with pytest.raises(ValueError, match="more than once"):
        resolve_class_names("cat,dog,cat")
    (tmp_path / "a,b.txt").write_text("x\ny\n")  # a file whose name has a comma stays a file
    assert resolve_class_names(str(tmp_path / "a,b.txt")) == ["x", "y"]


def test_class_names_that_differ_only_in_case_are_warned_about(tmp_path):
    """``Cat`` and ``cat`` in an image CSV became two classes without a word."""
    from spmlkit.data.csv_images import read_image_csv

    csv = tmp_path / "images.csv"
    csv.write_text("a.jpg,cat\nb.jpg,Cat\nc.jpg,dog\n")
    with pytest.warns(UserWarning, match=r"class names 'Cat', 'cat' differ only in case and "
                                         r"are 2 classes"):
        classes = read_image_csv(csv)[2]
    assert classes == ["Cat", "cat", "dog"]


def test_a_wide_image_csv_is_read_as_its_label_matrix(tmp_path):
    """``path,blue,circle,red`` with 1 / empty cells (a label matrix) became one class named
    "1": trained and scored without a word. A header of class names over 0 / 1 / -1 / empty
    cells is the wide form."""
    from spmlkit.data.csv_images import read_image_csv

    (tmp_path / "w.csv").write_text("path,blue,circle,red\na.jpg,1,,\nb.jpg,,1,1\nc.jpg,0,0,1\n")
    items, y, classes = read_image_csv(tmp_path / "w.csv")
    assert classes == ["blue", "circle", "red"] and items == ["a.jpg", "b.jpg", "c.jpg"]
    assert y.tolist() == [[1, 0, 0], [0, 1, 1], [0, 0, 1]]
    assert read_image_csv(tmp_path / "w.csv", ["red", "blue", "circle"])[1].tolist() == \
        [[0, 1, 0], [1, 0, 1], [1, 0, 0]]
    (tmp_path / "p.csv").write_text("path,blue,circle,red\na.jpg,1,-1,\n")
    assert read_image_csv(tmp_path / "p.csv", negatives=True)[1].tolist() == [[1, -1, 0]]
    with pytest.raises(ValueError, match="-1 \\(a known negative\\).*eval_labels=partial"):
        read_image_csv(tmp_path / "p.csv")
    (tmp_path / "n.csv").write_text("path,labels\na.jpg,cat\nb.jpg,1\n")  # names: as before
    assert read_image_csv(tmp_path / "n.csv")[2] == ["1", "cat"]
    # one column after the path is the names form, even of 1 / 0 (classes named so)
    (tmp_path / "one.csv").write_text("path,label\na.png,1\nb.png,0\n")
    assert read_image_csv(tmp_path / "one.csv")[1:] == (
        pytest.approx(np.array([[0, 1], [1, 0]])), ["0", "1"])
    # a trailing comma, and true / false cells (a pandas bool frame written out)
    (tmp_path / "t.csv").write_text("path,cat,dog,\na.png,1,0,\nb.png,True,False\n")
    assert read_image_csv(tmp_path / "t.csv")[1:] == (
        pytest.approx(np.array([[1, 0], [1, 0]])), ["cat", "dog"])


def _pngs(folder, names, size=12, mode="RGB"):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(names))
    for n in names:
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / n)


def test_test_images_that_are_training_images_are_warned_about(tmp_path):
    for cls in ("cat", "dog"):
        _pngs(tmp_path / "tree" / cls, [f"{i}.png" for i in range(6)])
    _pngs(tmp_path / "new", [f"{i}.png" for i in range(8)])
    rows = [f"tree/cat/{i}.png,cat" for i in range(3)] + [f"new/{i}.png,{'cat' if i % 2 else 'dog'}"
                                                          for i in range(8)]
    (tmp_path / "test.csv").write_text("path,labels\n" + "\n".join(rows) + "\n")
    with pytest.warns(UserWarning, match=r"3 of the \d+ (test|val) images are also training "
                                         r"images \(first: .*tree/cat/"):
        load_dataset("folder", root=str(tmp_path / "tree"), test_csv=str(tmp_path / "test.csv"))


def test_class_folders_follow_links_read_jfif_and_count_what_they_skip(tmp_path):
    import os

    _pngs(tmp_path / "tree" / "cat", ["a.png"])
    _pngs(tmp_path / "tree" / "dog", ["b.png"])
    _pngs(tmp_path / "more", ["c.png"])
    os.symlink(tmp_path / "more", tmp_path / "tree" / "dog" / "linked")
    os.symlink(tmp_path / "tree" / "dog", tmp_path / "tree" / "dog" / "loop")  # a cycle
    (tmp_path / "tree" / "cat" / "x.jfif").write_bytes((tmp_path / "tree" / "cat" / "a.png")
                                                      .read_bytes())
    (tmp_path / "tree" / "cat" / "notes.txt").write_text("x")
    from spmlkit.data.folder import scan_class_folders

    with pytest.warns(UserWarning, match=r"1 file\(s\) in the class folders are not read.*"
                                         r"first: .*notes.txt"):
        rel, label, classes, ignored = scan_class_folders(tmp_path / "tree")
    assert sorted(rel) == ["cat/a.png", "cat/x.jfif", "dog/b.png", "dog/linked/c.png"]


def test_16_bit_images_keep_one_scale(tmp_path):
    """A 16-bit image was divided by 65535 only when its maximum passed 255: one with maximum
    256 came out black, one with 255 at full brightness."""
    from PIL import Image

    from spmlkit.data.image_files import open_image

    out = {}
    for top in (255, 256, 65535):
        arr = np.linspace(0, top, 64 * 64).reshape(64, 64).astype(np.uint16)
        Image.fromarray(arr).save(tmp_path / f"g{top}.png")  # uint16: a 16-bit PNG
        out[top] = int(np.asarray(open_image(tmp_path / f"g{top}.png")).max())
    assert out == {255: 1, 256: 1, 65535: 255}


def test_a_tag_csv_read_as_full_labels_says_what_it_looks_like(tmp_path):
    """A CSV of at most one tag per image (some none), read with the default
    train_labels=full, trained the unnamed classes as absent without a hint."""
    import warnings

    names = ["cat", "dog", "fox"]
    _pngs(tmp_path / "img", [f"{i}.png" for i in range(12)])
    rows = [f"img/{i}.png,{names[i % 3] if i % 4 else ''}" for i in range(12)]
    (tmp_path / "tags.csv").write_text("path,labels\n" + "\n".join(rows) + "\n")
    with pytest.warns(UserWarning, match=r"tags.csv: every row names at most one class and 3 "
                                         r"name none.*train_labels=observed"):
        load_dataset("csv", path=str(tmp_path / "tags.csv"))
    full = [f"img/{i}.png,{names[i % 3]};{names[(i + 1) % 3]}" for i in range(12)]
    (tmp_path / "full.csv").write_text("path,labels\n" + "\n".join(full) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset("csv", path=str(tmp_path / "full.csv"))


def test_skipped_images_are_named_not_only_the_first():
    from spmlkit.data.image_files import ImageCheck, warn_skipped

    corrupt = [f"/x/{i}.jpg" for i in range(7)]
    with pytest.warns(UserWarning, match=r"skipped 7 item\(s\): 7 with an unreadable image: "
                                         r"/x/0.jpg, /x/1.jpg, /x/2.jpg, /x/3.jpg, /x/4.jpg, "
                                         r"and 2 more"):
        warn_skipped(ImageCheck(np.arange(0), [], corrupt), "folder pool")
