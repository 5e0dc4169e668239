"""The feature store: values, reuse, resume after an interruption, float16, keys, errors, and the
paths that reuse it (datasets, splits, the CLI)."""
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from spmlkit import features as F
from spmlkit.cli import main
from spmlkit.loading import load_dataset, load_splits
from spmlkit.data.protocol import Dataset, LabelledSet, make_splits
from spmlkit.data.image_files import open_image
from spmlkit.data.transforms import eval_transform
from spmlkit.models.backbones import TinyCNN


def _images(folder, n, size=(40, 30), seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        arr = (rng.random((size[1], size[0], 3)) * 255).astype(np.uint8)
        p = folder / f"img{i:03d}.{'png' if i % 2 else 'jpg'}"
        Image.fromarray(arr).save(p)
        paths.append(str(p))
    return paths


class Counting(TinyCNN):
    """tiny_cnn that counts the rows it computes and can crash after some batches."""

    def __init__(self, crash_after=None):
        super().__init__()
        self.rows, self.batches, self.crash_after = 0, 0, crash_after

    def forward(self, x):
        if self.crash_after is not None and self.batches >= self.crash_after:
            raise RuntimeError("simulated crash")
        self.batches += 1
        self.rows += x.shape[0]
        return super().forward(x)


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    return _images(tmp_path_factory.mktemp("imgs"), 11)


def _direct(items, net=None):
    net = (net or TinyCNN()).eval()
    t = eval_transform(net.input_size, net.mean, net.std)
    with torch.inference_mode():
        return net(torch.stack([t(open_image(p)) for p in items])).numpy()


def test_values_equal_a_direct_forward_pass_with_worker_processes(items, tmp_path):
    feats = F.extract_features(items, "tiny_cnn", cache_dir=tmp_path, batch_size=4,
                               num_workers=2, progress=False)
    assert isinstance(feats, np.memmap) and feats.shape == (11, 32)
    assert feats.dtype == np.float32
    np.testing.assert_allclose(feats, _direct(items), rtol=1e-5, atol=1e-6)
    feats[0] = -1.0                                    # copy-on-write: the store is untouched
    again = F.extract_features(items, "tiny_cnn", cache_dir=tmp_path, progress=False)
    np.testing.assert_allclose(again[0], _direct(items[:1])[0], rtol=1e-5, atol=1e-6)
    (store,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    meta = json.loads((store / "meta.json").read_text())
    assert (meta["n"], meta["d"], meta["done"], meta["complete"]) == (11, 32, 11, True)
    assert np.load(store / "done.npy").tolist() == [1] * 11
    assert meta["key_fields"]["backbone"] == "tiny_cnn-s0-w16-f32"
    assert meta["key_fields"]["transform"]["size"] == 32


def test_second_call_reuses_the_store_without_the_backbone(items, tmp_path, monkeypatch):
    net = Counting()
    first = np.array(F.extract_features(items, net, cache_dir=tmp_path, batch_size=4,
                                        num_workers=0, progress=False))
    assert (net.rows, net.batches) == (11, 3)
    again = F.extract_features(items, net, cache_dir=tmp_path, num_workers=0, progress=False)
    assert (net.rows, net.batches) == (11, 3)          # not called again
    np.testing.assert_array_equal(again, first)
    # by name: a complete store is returned without even building the backbone
    F.extract_features(items, "tiny_cnn", cache_dir=tmp_path, num_workers=0, progress=False)

    def no_backbone(*a, **k):
        raise AssertionError("the backbone was built for a complete store")
    monkeypatch.setattr(F, "_backbone_module", no_backbone)
    by_name = F.extract_features(items, "tiny_cnn", cache_dir=tmp_path, progress=False)
    np.testing.assert_array_equal(by_name, first)


def test_resume_after_interruption_computes_only_missing_rows(items, tmp_path):
    crashing = Counting(crash_after=2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        F.extract_features(items, crashing, cache_dir=tmp_path, batch_size=3, num_workers=0,
                           progress=False)
    plan = F.plan_store(items, crashing, cache_dir=tmp_path)
    mask = np.load(plan.folder / "done.npy")
    assert mask.tolist() == [1] * 6 + [0] * 5
    meta = plan.read_meta()
    assert (meta["done"], meta["complete"]) == (6, False)

    resumed = Counting()
    feats = F.extract_features(items, resumed, cache_dir=tmp_path, batch_size=3, num_workers=0,
                               progress=False)
    assert resumed.rows == 5                           # only rows 6..10
    np.testing.assert_allclose(feats, _direct(items), rtol=1e-5, atol=1e-6)
    assert plan.read_meta()["complete"] is True


def test_float16_store(items, tmp_path):
    f32 = F.extract_features(items, "tiny_cnn", cache_dir=tmp_path, num_workers=0,
                             progress=False)
    f16 = F.extract_features(items, "tiny_cnn", cache_dir=tmp_path, num_workers=0,
                             progress=False, dtype="float16")
    assert f16.dtype == np.float16 and f16.shape == f32.shape
    np.testing.assert_allclose(f16.astype(np.float32), f32, rtol=2e-3, atol=1e-3)
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2   # two stores
    assert f16.nbytes * 2 == f32.nbytes
    with pytest.raises(ValueError, match="feature dtype must be one of"):
        F.plan_store(items, "tiny_cnn", dtype="int8")


def test_key_changes_with_backbone_transform_size_items_dtype(items, tmp_path):
    def folder(it=items, backbone="tiny_cnn", **kw):
        return F.plan_store(it, backbone, cache_dir=tmp_path, **kw).folder

    base = folder()
    assert folder([__import__("pathlib").Path(p) for p in items]) == base   # str or Path
    assert folder(backbone=TinyCNN()) == base                                # same weights
    others = [folder(backbone=TinyCNN(seed=1)), folder(transform="weak"), folder(size=48),
              folder(items[::-1]), folder(items[:-1]), folder(items[:-1] + [items[0]]),
              folder(dtype="float16"), folder(transform="weak", seed=1),
              folder(backbone="efficientnet_lite0"),
              folder(backbone="efficientnet_lite0", pretrained=False)]
    assert len({base, *others}) == len(others) + 1
    assert "efficientnet_lite0-imagenet__eval224" in folder(backbone="efficientnet_lite0").name


def test_unreadable_image_is_named_before_a_store_exists(items, tmp_path):
    bad_items = list(items[:7])
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg at all")
    bad_items[5] = str(broken)
    with pytest.raises(ValueError, match=r"did not start \(nothing was written for them; "
                                         r"stores finished before are kept\): "
                                         r".*broken\.jpg: not a readable image"):
        F.extract_features(bad_items, "tiny_cnn", cache_dir=tmp_path / "c", batch_size=2,
                           num_workers=0, progress=False)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*.npy"))  # no orphan


def test_an_image_broken_mid_extraction_keeps_done_rows(items, tmp_path, monkeypatch):
    """A file that breaks after the check (or a store resumed after an interruption) stops at
    its row; the rows before are kept and a repair in place resumes the store."""
    bad_items = list(items[:7])
    broken = tmp_path / "broken.jpg"
    shutil.copyfile(items[0], broken)
    bad_items[5] = str(broken)
    real = F._Rows.__getitem__

    def breaks(self, i):                                 # the file breaks once extraction runs
        broken.write_bytes(b"not a jpeg at all")
        return real(self, i)

    monkeypatch.setattr(F._Rows, "__getitem__", breaks)
    with pytest.raises(ValueError, match=r"row 5: .*broken\.jpg.*run again"):
        F.extract_features(bad_items, "tiny_cnn", cache_dir=tmp_path / "c", batch_size=2,
                           num_workers=0, progress=False)
    monkeypatch.undo()
    plan = F.plan_store(bad_items, "tiny_cnn", cache_dir=tmp_path / "c")
    assert np.load(plan.folder / "done.npy").tolist() == [1, 1, 1, 1, 0, 0, 0]
    shutil.copyfile(items[0], broken)                  # repaired in place
    net = Counting()
    feats = F.extract_features(bad_items, net, cache_dir=tmp_path / "c", batch_size=2,
                               num_workers=0, progress=False)
    assert net.rows == 3
    np.testing.assert_array_equal(feats[5], feats[0])


def test_items_must_be_paths(tmp_path):
    with pytest.raises(ValueError, match="numeric array of shape"):
        F.extract_features(np.zeros((3, 4)), "tiny_cnn", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="item 1 is int"):
        F.extract_features(["a.png", 3], "tiny_cnn", cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"did not start .*nowhere\.png does not exist"):
        F.extract_features([str(tmp_path / "nowhere.png")], "tiny_cnn", cache_dir=tmp_path,
                           num_workers=0, progress=False)
    with pytest.raises(ValueError, match="empty item list"):
        F.extract_features([], "tiny_cnn", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown transform 'blurry'"):
        F.extract_features(["a.png"], "tiny_cnn", transform="blurry", cache_dir=tmp_path)


def test_feature_dataset_and_splits(items, tmp_path):
    y = np.eye(3, dtype=np.uint8)[np.arange(11) % 3]
    y[0, 1] = 1
    ds = Dataset("toy", LabelledSet(list(items[:8]), y[:8]), LabelledSet(list(items[8:]), y[8:]))
    fds = F.feature_dataset(ds, "tiny_cnn", cache_dir=tmp_path, num_workers=0, progress=False)
    direct = _direct(items)
    np.testing.assert_allclose(fds.pool.x, direct[:8], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fds.test.x, direct[8:], rtol=1e-5, atol=1e-6)
    assert fds.meta["backbone"] == "tiny_cnn" and len(fds.meta["feature_stores"]) == 2
    splits = make_splits(fds, "1p")
    rows = splits.meta["train_rows"]
    np.testing.assert_allclose(splits.train.x, direct[:8][rows], rtol=1e-5, atol=1e-6)

    image_splits = make_splits(ds, "1p")
    fs = F.feature_splits(image_splits, "tiny_cnn", cache_dir=tmp_path, num_workers=0,
                          progress=False)
    np.testing.assert_allclose(fs.val.x, direct[:8][splits.meta["val_rows"]], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_array_equal(fs.observed, image_splits.observed)
    assert fs.meta["backbone"] == "tiny_cnn"


@pytest.fixture(scope="module")
def folder_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    for c, name in enumerate(("cat", "dog", "fox")):
        _images(root / name, 4, size=(24, 20), seed=c)
    return root


def test_load_dataset_with_backbone_and_cli(folder_root, tmp_path, capsys):
    cache = tmp_path / "cache"
    ds = load_dataset("folder", root=str(folder_root), backbone="tiny_cnn",
                      features={"cache_dir": str(cache), "num_workers": 0, "progress": False})
    assert ds.pool.x.shape[1] == 32 and isinstance(ds.pool.x, np.memmap)
    with pytest.raises(ValueError, match="unknown feature option"):
        load_dataset("folder", root=str(folder_root), backbone="tiny_cnn",
                     features={"colour": 1})
    with pytest.raises(ValueError, match="already holds feature vectors"):
        load_splits("yeast", backbone="tiny_cnn")
    from spmlkit import data
    with pytest.raises(ValueError, match="spmlkit.data does not compute"):
        data.load_source("folder", root=str(folder_root), backbone="tiny_cnn")
    with pytest.raises(AttributeError, match="spmlkit.loading.load_splits"):
        data.load_splits  # noqa: B018  (moved up: one loader, features included)

    assert main(["extract", "--dataset", "folder", "--data", f"root={folder_root}",
                 "--backbone", "tiny_cnn", "--cache-dir", str(cache), "--workers", "0",
                 "--float16", "--limit", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "folder pool: 3 x 32 float16" in out and "folder test: 3 x 32 float16" in out
    assert main(["train", "--solver", "adam", "--dataset", "folder", "--data",
                 f"root={folder_root}", "--backbone", "tiny_cnn", "--cache-dir", str(cache),
                 "--epochs", "1", "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    config = json.loads((run / "config.json").read_text())
    assert config["dataset_options"]["backbone"] == "tiny_cnn"
    assert "progress" not in config["dataset_options"]["features"]  # not part of the run
    capsys.readouterr()
    assert main(["train", "--solver", "adam", "--dataset", "folder", "--data",
                 f"root={folder_root}", "--backbone", "tiny_cnn", "--cache-dir",
                 str(tmp_path / "fresh"), "--epochs", "1", "--out", str(tmp_path / "runs2"),
                 "--quiet"]) == 0
    assert "img/s" not in capsys.readouterr().err  # extracted here, and --quiet hid that bar too
    assert config["dataset_options"]["features"]["cache_dir"] == str(cache)
    stores = [p for p in cache.iterdir() if p.is_dir()]
    assert len(stores) == 4            # 2 float16 (--limit 3) + 2 float32 (full) stores


def test_a_changed_image_is_computed_again_and_only_it(tmp_path):
    """The store's key holds the images' paths, not their pixels: an image replaced in place
    (same path) has its row computed again at the next reuse, with a warning naming it; the
    other rows are not computed again. A removed image keeps its row; a store without
    ``files.npy`` (an older spmlkit's) takes the files as they are."""
    import os

    paths = _images(tmp_path / "imgs", 6, seed=1)
    cache = tmp_path / "cache"
    net = Counting()
    F.extract_features(paths, net, cache_dir=cache, batch_size=4, num_workers=0, progress=False)
    plan = F.plan_store(paths, net, cache_dir=cache)
    stats = np.load(plan.folder / "files.npy")
    np.testing.assert_array_equal(stats, F.file_stats(paths))
    other = _images(tmp_path / "other", 6, seed=9)
    shutil.copyfile(other[2], paths[2])            # new pixels, the same path
    os.utime(paths[2], ns=(1, 2_000_000_000_000))  # and a time of its own
    rows = net.rows
    with pytest.warns(UserWarning, match=r"1 image file\(s\) changed since their features.*"
                                         r"img002\.jpg.*computing their rows again"):
        feats = F.extract_features(paths, net, cache_dir=cache, num_workers=0, progress=False)
    assert net.rows == rows + 1
    np.testing.assert_allclose(feats, _direct(paths), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.load(plan.folder / "files.npy"), F.file_stats(paths))
    again = F.extract_features(paths, net, cache_dir=cache, num_workers=0, progress=False)
    assert net.rows == rows + 1  # nothing changed since
    os.unlink(paths[5])          # features kept, images deleted: the store stays as it is
    (plan.folder / "files.npy").unlink()  # an older store: trusted, its stats written
    kept = F.extract_features(paths, net, cache_dir=cache, num_workers=0, progress=False)
    assert net.rows == rows + 1
    np.testing.assert_array_equal(kept, again)
    assert (np.load(plan.folder / "files.npy")[5] == -2).all()  # (unknown: no file to read)


def test_a_complete_store_that_cannot_be_written_is_read_as_it_is(tmp_path, monkeypatch):
    """A complete store on a read-only disk (an older store without files.npy, and an image
    touched since): read without the lock and without writing (it failed on .lock), its
    stored features used with a warning naming the changed file."""
    import os

    paths = _images(tmp_path / "imgs", 4, seed=3)
    cache = tmp_path / "cache"
    first = np.array(F.extract_features(paths, "tiny_cnn", cache_dir=cache, num_workers=0,
                                        progress=False))
    plan = F.plan_store(paths, "tiny_cnn", cache_dir=cache)
    (plan.folder / "files.npy").unlink()
    F.extract_features(paths, "tiny_cnn", cache_dir=cache, num_workers=0, progress=False)
    assert (plan.folder / "files.npy").is_file()  # recorded where the store can be written
    os.utime(paths[1], ns=(1, 3_000_000_000_000))
    real_access = os.access
    monkeypatch.setattr(F.os, "access", lambda p, mode: False if mode == os.W_OK
                        else real_access(p, mode))

    def no_write(*a, **k):
        raise AssertionError("wrote to a read-only store")
    monkeypatch.setattr(F, "_locked", no_write)
    monkeypatch.setattr(F, "_save_stats", no_write)
    with pytest.warns(UserWarning, match=r"1 image file\(s\) changed .*img001.*cannot be "
                                         r"written here"):
        again = F.extract_features(paths, "tiny_cnn", cache_dir=cache, num_workers=0,
                                   progress=False)
    np.testing.assert_array_equal(again, first)


def test_a_backbone_dataset_name_is_a_slug_too(folder_root):
    """``name=`` names run folders with or without a backbone: a path is refused on both."""
    with pytest.raises(ValueError, match="name='../x'.*slug"):
        load_dataset("folder", root=str(folder_root), name="../x", backbone="tiny_cnn")
