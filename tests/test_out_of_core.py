"""Stored features (a memory-mapped store or .npy file) train without being read whole.

The protocol's parts of a stored matrix are row views (`spmlkit.data.rows.Rows`); the
linear engine, single and stacked, reads them chunk by chunk with the in-memory path's batch
order, so the results equal it exactly; nothing reads the whole matrix.
"""
from __future__ import annotations

import numpy as np
import pytest

from spmlkit.data.protocol import Dataset, LabelledSet, make_splits
from spmlkit.data import rows as stored_rows
from spmlkit.data.rows import Rows, streaming_stats
from spmlkit.engine import TrainConfig
from spmlkit.methods import train_runs


def _store(tmp_path, n, d, classes, seed, dtype="float16"):
    """An N x D store on disk (features.npy, memory-mapped back) with planted labels."""
    rng = np.random.default_rng(seed)
    y = (rng.random((n, classes)) < 0.3).astype(np.uint8)
    y[np.arange(n), rng.integers(0, classes, n)] = 1
    protos = np.random.default_rng(99).standard_normal((classes, d))
    x = (y @ protos + rng.standard_normal((n, d))).astype(dtype)
    path = tmp_path / f"features-{seed}.npy"
    np.save(path, x)
    return np.load(path, mmap_mode="r"), y


def _dataset(tmp_path, n=600, d=16, classes=5, in_memory=False, standardize=False):
    pool_x, pool_y = _store(tmp_path, n, d, classes, 0)
    test_x, test_y = _store(tmp_path, n // 3, d, classes, 1)
    if in_memory:
        pool_x, test_x = np.asarray(pool_x), np.asarray(test_x)
    return Dataset("stored", LabelledSet(pool_x, pool_y), LabelledSet(test_x, test_y),
                   standardize=standardize)


def test_the_parts_of_a_stored_matrix_are_row_views_of_it(tmp_path):
    ds = _dataset(tmp_path)
    splits = make_splits(ds, "1p", seed=1)
    for part in (splits.train, splits.val):
        assert isinstance(part.x, Rows) and part.x.base is ds.pool.x   # no copy
    rows = np.asarray(splits.meta["train_rows"])
    np.testing.assert_array_equal(np.asarray(splits.train.x),
                                  np.asarray(ds.pool.x[rows], np.float32))
    assert splits.train.x.take([3, 0]).tolist() == \
        np.asarray(ds.pool.x[rows[[3, 0]]], np.float32).tolist()      # the order asked for


def test_streamed_standardisation_is_the_train_rows_statistics(tmp_path):
    ds = _dataset(tmp_path, standardize=True)
    splits = make_splits(ds, "1p", seed=1)
    raw = np.asarray(ds.pool.x, np.float64)[splits.meta["train_rows"]]
    mean, std = streaming_stats(Rows(ds.pool.x, splits.meta["train_rows"]), chunk=50)
    np.testing.assert_allclose(mean, raw.mean(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(std, raw.std(axis=0), rtol=1e-5)
    np.testing.assert_allclose(splits.meta["standardize"]["mean"], mean)
    train = np.asarray(splits.train.x)
    np.testing.assert_allclose(train.mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(train.std(axis=0), 1, atol=1e-3)
    test = np.asarray(splits.test.x)   # the test rows with the train rows' statistics
    np.testing.assert_allclose(test, (np.asarray(ds.test.x, np.float32) - mean) / std,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["single", "stacked", "stacked-role"])
def test_runs_on_a_store_equal_the_in_memory_runs(tmp_path, monkeypatch, case):
    lrs = [1e-3] if case == "single" else [1e-2, 1e-3, 1e-4]
    configs = [TrainConfig(epochs=3, batch_size=16, lr=lr, seed=1) for lr in lrs]
    loss = "role" if case == "stacked-role" else "an"
    monkeypatch.setattr(stored_rows, "CHUNK_ROWS", 48)   # several chunks an epoch
    stored = train_runs("linear", make_splits(_dataset(tmp_path), "1p", seed=1), loss, {},
                        configs)
    memory = train_runs("linear", make_splits(_dataset(tmp_path, in_memory=True), "1p", seed=1),
                        loss, {}, configs)
    for a, b in zip(stored, memory):
        assert not isinstance(a, BaseException), a
        assert a["vectorised"] == b["vectorised"] if len(configs) > 1 else True
        assert a["best_epoch"] == b["best_epoch"]
        for key in ("val_map", "test_map", "train_recovery_map"):   # (stacked val mAP: one
            assert a[key] == pytest.approx(b[key], rel=1e-12), key  # run at a time, no sum order)


def test_training_on_a_store_never_reads_it_whole(tmp_path, monkeypatch):
    """Every read of the store is at most one chunk; nothing converts a whole part."""
    import spmlkit.engine.vectorised as vectorised

    monkeypatch.setattr(stored_rows, "CHUNK_ROWS", 64)
    monkeypatch.setattr(vectorised, "GATHER_BYTES", 64 * 16 * 4)
    reads = []
    take = Rows.take

    def counted(self, idx):
        reads.append(len(np.atleast_1d(idx)))
        return take(self, idx)

    def refused(self, dtype=None, copy=None):
        raise AssertionError("a stored part was read whole (np.asarray)")

    monkeypatch.setattr(Rows, "take", counted)
    monkeypatch.setattr(Rows, "__array__", refused)
    splits = make_splits(_dataset(tmp_path, n=3000, standardize=True), "1p", seed=1)
    configs = [TrainConfig(epochs=1, batch_size=32, lr=lr, seed=1) for lr in (1e-2, 1e-3)]
    for batch in (configs[:1], configs):                   # single, then stacked
        out = train_runs("linear", splits, "an", {}, batch, out=tmp_path / "runs")
        assert all(not isinstance(r, BaseException) for r in out), out
    assert reads and max(reads) <= 64 < len(splits.test) < len(splits.train)


def test_metrics_in_blocks_equal_the_whole_computation(monkeypatch):
    """Per-class AP (blocks of columns) and the ranking metrics (blocks of rows) bound their
    memory on large splits; their values are those of one block (up to summation order)."""
    from spmlkit import metrics

    rng = np.random.default_rng(0)
    probs = rng.random((300, 7)).round(2)          # ties included
    y = (rng.random((300, 7)) < 0.3).astype(np.uint8)
    y[:5] = 0                                      # rows without a positive
    whole = metrics.classic_metrics(probs, y)
    ap = metrics.per_class_ap(probs, y)
    monkeypatch.setattr(metrics.ap, "BLOCK_ENTRIES", 600)   # blocks of 2 columns / 85 rows
    assert metrics.classic_metrics(probs, y) == pytest.approx(whole, rel=1e-12)
    np.testing.assert_allclose(metrics.per_class_ap(probs, y), ap, rtol=1e-12)


class _CountedBase:
    """A stored matrix that records the rows of every read."""

    def __init__(self, base):
        self.base, self.reads = base, []
        self.shape, self.dtype, self.ndim = base.shape, base.dtype, base.ndim

    def __getitem__(self, key):
        rows = np.arange(self.shape[0])[key]
        self.reads.append(rows)
        return self.base[key]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_row_asked_for_several_times_is_read_once(tmp_path, dtype):
    """The runs of a stack that draw the same batches ask for every row R times: each stored
    row is read (and cast, standardised) once, in file order, and copied to every place."""
    stored, _ = _store(tmp_path, 200, 6, 3, 0, dtype)
    base = _CountedBase(stored)
    part = Rows(base, np.arange(10, 190)[::-1]).standardized(np.full(6, 0.5), np.full(6, 2.0))
    idx = np.concatenate([np.array([5, 170, 3, 44])] * 3)       # 3 runs, the same rows
    got = part.take(idx)
    want = (np.asarray(stored, np.float32)[np.arange(10, 190)[::-1][idx]] - 0.5) / 2.0
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float32 and got.flags.writeable
    (read,) = base.reads
    assert read.tolist() == sorted(set(read.tolist())) and len(read) == 4
    got[:] = 0                                                   # a copy, never the store
    assert np.asarray(stored).any()
    chunk = Rows(base).take(np.arange(20, 30))                   # rows in order: one slice
    np.testing.assert_array_equal(chunk, np.asarray(stored[20:30], np.float32))


@pytest.mark.parametrize("in_memory", [False, True])
def test_save_train_probs_writes_each_epoch_to_a_file(tmp_path, in_memory):
    """save_train_probs: each epoch's train probabilities go to a file in the run folder as they
    come (never epochs x N x L in memory); train_probs.npy holds the epochs run (early stopping:
    fewer than asked for), the best one equal to the run's own train probabilities, and no
    temporary file stays behind."""
    from spmlkit.methods import train_run

    splits = make_splits(_dataset(tmp_path, in_memory=in_memory), "1p", seed=1)
    config = TrainConfig(epochs=30, batch_size=16, lr=5e-2, seed=1, early_stop="patience:2")
    res = train_run("linear", splits, "an", config=config, out=tmp_path / "runs",
                    save_train_probs=True)
    folder = tmp_path / "runs" / res["run_dir"].split("/")[-1]
    probs = np.load(folder / "train_probs.npy")
    epochs = len(open(folder / "metrics.jsonl").read().splitlines())
    assert epochs < 30 and probs.shape == (epochs, *splits.observed.shape)
    with np.load(folder / "predictions.npz") as pred:
        np.testing.assert_array_equal(probs[res["best_epoch"] - 1],
                                      pred["probs_train"].astype(np.float16))
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]


def test_the_tabular_protocol_joins_stored_rows_without_reading_them(tmp_path, monkeypatch):
    """protocol=tabular splits the pool and test rows together: on stored features the joined
    rows are a view of both files (nothing read whole), with the in-memory path's values."""
    def refused(self, dtype=None, copy=None):
        raise AssertionError("a stored part was read whole (np.asarray)")

    memory = make_splits(_dataset(tmp_path, in_memory=True), "1p", seed=3, protocol="tabular")
    monkeypatch.setattr(Rows, "__array__", refused)
    stored = make_splits(_dataset(tmp_path), "1p", seed=3, protocol="tabular")
    monkeypatch.undo()
    for split in ("train", "val", "test"):
        a, b = getattr(stored, split), getattr(memory, split)
        assert isinstance(a.x, Rows) and a.x.base.__class__.__name__ == "JoinedRows"
        np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x, np.float32))
        np.testing.assert_array_equal(a.y, b.y)
    assert stored.meta["test_rows"] == memory.meta["test_rows"]


def test_stored_maps_and_vectors_of_the_image_methods_are_read_per_batch(tmp_path, monkeypatch):
    """BoostLU's MapRows, MIME's vector views and LAC's cached views read a store's rows per
    batch (each distinct row once, cast to float32), never the whole store."""
    import torch

    from spmlkit.data.rows import Rows, read_rows
    from spmlkit.methods.boostlu import MapRows
    from spmlkit.methods.image_methods import CachedMapViews, predict_rows

    rng = np.random.default_rng(0)
    vectors = np.lib.format.open_memmap(tmp_path / "v.npy", "w+", np.float16, (50, 6))
    vectors[:] = rng.normal(size=(50, 6))
    maps = [np.lib.format.open_memmap(tmp_path / f"m{v}.npy", "w+", np.float16, (40, 3, 2, 2))
            for v in range(2)]
    for m in maps:
        m[:] = rng.normal(size=m.shape)

    def whole(*_, **__):
        raise AssertionError("a store was read whole")

    monkeypatch.setattr(Rows, "__array__", whole)
    idx = np.array([5, 3, 5, 49, 0])
    rows = MapRows(Rows(vectors), torch.device("cpu"))
    assert rows.shape == (6, 1, 1) and len(rows) == 50
    assert torch.equal(rows.take(torch.as_tensor(idx)),
                       torch.from_numpy(vectors[idx].astype(np.float32)))
    some = idx[:4] % 40
    assert np.array_equal(read_rows(maps[0], some), maps[0][some].astype(np.float32))
    choice = np.array([0, 1, 1, 0])
    got = CachedMapViews._gather(maps, choice, idx[:4] % 40).numpy()
    for i, (v, r) in enumerate(zip(choice, idx[:4] % 40)):
        assert np.array_equal(got[i], maps[v][r].astype(np.float32))
    head = torch.nn.Linear(6, 4)
    out = predict_rows(head, 50, lambda r: torch.from_numpy(Rows(vectors).take(r)), 16)
    assert out.shape == (50, 4) and torch.allclose(
        out, head(torch.from_numpy(vectors[:].astype(np.float32))), atol=1e-6)


def test_float16_rows_in_memory_standardise_as_stored_ones_do():
    """Float16 feature rows held in memory: the train statistics sum in float32, as the stored
    path's float64 streaming pass (in float16 the std of 84,000 rows came out about half the
    true one, and every such run trained on rows of std 2)."""
    from spmlkit.data.protocol import LabelledSet, _standardized
    from spmlkit.data.rows import streaming_stats

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((84000, 6)) * 0.5 + 3).astype(np.float16)
    s = LabelledSet(x, np.zeros((84000, 2), np.uint8), ["a", "b"])
    (train, _, _), stats = _standardized(s, s, s)
    mean, std = streaming_stats(x)
    np.testing.assert_allclose(stats["std"], std, rtol=1e-4)
    np.testing.assert_allclose(stats["mean"], mean, rtol=1e-4)
    np.testing.assert_allclose(train.x.std(axis=0), 1.0, rtol=1e-3)


def test_a_huge_finite_value_is_named_and_its_statistics_stay_finite(recwarn):
    """A float32 column holding one 1e20 (a "missing" sentinel): its squares overflowed float32,
    the std came out inf (``Infinity`` in config.json) and the column 0 for every row, with a
    numpy RuntimeWarning only. The sums are then taken in float64 (finite statistics, as the
    stored path's), and a warning names the column, the value and its row."""
    from spmlkit.data.protocol import LabelledSet, _standardized
    from spmlkit.data.rows import streaming_stats

    x = np.random.default_rng(0).standard_normal((50, 3)).astype(np.float32)
    x[7, 1] = 1e20
    s = LabelledSet(x, np.zeros((50, 2), np.uint8), ["a", "b"], where="t.csv")
    with pytest.warns(UserWarning, match=r"t.csv: feature column 'f2' holds 1e\+20 \(train "
                                         r"row 7\); standardised, its other rows are all but "
                                         r"equal"):
        (train, _, _), stats = _standardized(s, s, s, ["f1", "f2", "f3"])
    assert np.isfinite(stats["std"]).all() and np.isfinite(stats["mean"]).all()
    np.testing.assert_allclose(stats["std"], streaming_stats(x)[1], rtol=1e-5)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
