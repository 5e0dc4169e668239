"""The data-side options that studies vary: the biased single-positive regimes
(``1p_biased:size|loc|semantic``), the per-label instance metadata behind them (COCO boxes,
fmnist_mosaic tiles) and the train subsample of Cole et al. Fig. 1."""
from __future__ import annotations

import json

import numpy as np
import pytest

from spmlkit.data import make_splits
from spmlkit.loading import load_splits
from spmlkit.data.protocol import Dataset, LabelledSet
from spmlkit.data.fmnist_mosaic import FOREGROUND_LEVEL, mosaic_instances
from spmlkit.labels import NEGATIVE, POSITIVE, UNOBSERVED, make_observed, parse_regime, \
    sample_biased_positive

NAN = np.nan


# ---------------------------------------------------------------------------- the regimes
def test_parse_biased_regimes():
    assert parse_regime("1p_biased:size") == ("1p_biased", "size")
    assert parse_regime("1p_biased:loc") == ("1p_biased", "loc")
    assert parse_regime("1p_biased:semantic") == ("1p_biased", "semantic")
    for bad in ("1p_biased", "1p_biased:", "1p_biased:colour", "1p_biased:Size"):
        with pytest.raises(ValueError, match="1p_biased:size, 1p_biased:loc"):
            parse_regime(bad)


Y = np.array([[1, 1, 0, 1],
              [0, 1, 1, 0],
              [0, 0, 0, 0],          # no positive: nothing observed
              [1, 0, 0, 1]], dtype=np.uint8)
SIZE = np.array([[0.10, 0.40, NAN, 0.30],
                 [NAN, 0.05, 0.50, NAN],
                 [NAN, NAN, NAN, NAN],
                 [0.20, NAN, NAN, 0.20]])   # a tie in row 3
LOC = np.array([[0.9, 0.1, NAN, 0.5],
                [NAN, NAN, 0.3, NAN],       # column 1 has no box: ranks last
                [NAN, NAN, NAN, NAN],
                [0.4, NAN, NAN, 0.2]])


def test_size_picks_the_largest_object():
    z = make_observed(Y, "1p_biased:size", seed=0, instances={"size": SIZE})
    assert z.dtype == np.int8
    assert z[0].tolist() == [0, 1, 0, 0]
    assert z[1].tolist() == [0, 0, 1, 0]
    assert z[2].tolist() == [0, 0, 0, 0]
    assert (z[3] == POSITIVE).sum() == 1 and z[3, 1] == z[3, 2] == UNOBSERVED
    assert not (z == NEGATIVE).any()


def test_loc_picks_the_most_central_object_and_nan_ranks_last():
    z = make_observed(Y, "1p_biased:loc", seed=3, instances={"loc": LOC})
    assert np.flatnonzero(z[0] == POSITIVE).tolist() == [1]
    assert np.flatnonzero(z[1] == POSITIVE).tolist() == [2]     # not the unknown column 1
    assert np.flatnonzero(z[3] == POSITIVE).tolist() == [3]
    assert (z[2] == UNOBSERVED).all()


def test_ties_are_broken_by_the_seed_only():
    y = np.ones((200, 2), dtype=np.uint8)
    size = np.full((200, 2), 0.5)
    picks = {s: np.argmax(make_observed(y, "1p_biased:size", s, instances={"size": size}), 1)
             for s in (1, 1, 2)}
    again = np.argmax(make_observed(y, "1p_biased:size", 1, instances={"size": size}), 1)
    np.testing.assert_array_equal(picks[1], again)
    assert 60 < picks[1].sum() < 140                    # ties: about half each way
    assert not np.array_equal(picks[1], picks[2])


def test_semantic_prefers_frequent_classes_or_a_given_order():
    # column frequencies: 2, 2, 1, 2 -> order 0, 1, 3, 2
    z = sample_biased_positive(Y, "semantic")
    assert [np.flatnonzero(r == POSITIVE).tolist() for r in z] == [[0], [1], [], [0]]
    z = sample_biased_positive(Y, "semantic", class_order=[3, 2])
    assert [np.flatnonzero(r == POSITIVE).tolist() for r in z] == [[3], [2], [], [3]]
    with pytest.raises(ValueError, match="distinct column indices in 0..3"):
        sample_biased_positive(Y, "semantic", class_order=[0, 0])
    with pytest.raises(ValueError, match="distinct column indices"):
        sample_biased_positive(Y, "semantic", class_order=[7])


def test_biased_regimes_need_matching_metadata():
    with pytest.raises(ValueError, match=r"needs per-label instance metadata \(instances"):
        make_observed(Y, "1p_biased:size")
    with pytest.raises(ValueError, match=r"instances\['loc'\] has shape \(1, 4\)"):
        make_observed(Y, "1p_biased:loc", instances={"loc": LOC[:1]})


# ---------------------------------------------------------------------------- the protocol
def _toy(n=50, with_instances=True):
    rng = np.random.RandomState(0)
    y = (rng.rand(n, 3) < 0.5).astype(np.uint8)
    y[:, 0] = 1                                         # every row has a positive
    x = rng.randn(n, 4).astype(np.float32)
    size = np.where(y == 1, np.array([0.1, 0.9, 0.5]), np.nan)   # column 1 is always largest
    meta = {"instances": lambda: {"size": size, "loc": size}} if with_instances else {}
    return Dataset("toy", LabelledSet(x, y, where="toy pool"),
                   LabelledSet(x[:10], y[:10], where="toy test"), meta=meta)


def test_make_splits_biased_uses_the_sources_metadata():
    s = make_splits(_toy(), "1p_biased:size", seed=5)
    tr = s.meta["train_rows"]
    y = _toy().pool.y[tr]
    expected = np.where(y[:, 1] == 1, 1, 2 * (y[:, 2] == 1))   # largest present, else 0.5, 0.1
    assert np.argmax(s.observed, axis=1).tolist() == expected.tolist()
    assert "instances" not in s.meta                     # the function stays out of the splits
    json.dumps({k: v for k, v in s.meta.items()})        # the splits' meta is plain data


def test_make_splits_names_a_dataset_without_metadata():
    with pytest.raises(ValueError, match=r"dataset 'toy' does not provide.*coco.*fmnist_mosaic"):
        make_splits(_toy(with_instances=False), "1p_biased:loc")
    with pytest.raises(ValueError, match=r"regime '1p_biased:size'.*dataset 'yeast'"):
        load_splits("yeast", "1p_biased:size")
    s = load_splits("yeast", "1p_biased:semantic")       # semantic works everywhere
    assert ((s.observed == POSITIVE).sum(axis=1) <= 1).all()
    top = int(np.argmax(s.train.y.sum(axis=0)))
    has_top = s.train.y[:, top] == 1
    assert (s.observed[has_top, top] == POSITIVE).all()


def test_semantic_class_order_by_name():
    ds = _toy(with_instances=False)
    s = make_splits(ds, "1p_biased:semantic", class_order=["class2"])
    has2 = s.train.y[:, 2] == 1
    assert (s.observed[has2, 2] == POSITIVE).all() and has2.any()
    with pytest.raises(ValueError, match="'dog' is neither a class of dataset 'toy'"):
        make_splits(ds, "1p_biased:semantic", class_order=["dog"])


# ---------------------------------------------------------------------------- subsample
def test_subsample_keeps_a_seeded_nested_fraction_of_train_only():
    full = load_splits("yeast")
    half = load_splits("yeast", subsample=0.5)
    tenth = load_splits("yeast", subsample=0.1)
    assert (len(full.train), len(half.train), len(tenth.train)) == (1354, 677, 135)
    assert len(half.val) == len(full.val) and len(half.test) == len(full.test)
    np.testing.assert_array_equal(half.val.y, full.val.y)
    rows_full, rows_half, rows_tenth = (s.meta["train_rows"] for s in (full, half, tenth))
    assert set(rows_tenth) < set(rows_half) < set(rows_full)          # nested, for one seed
    assert rows_half == sorted(rows_half)
    pos = {r: i for i, r in enumerate(rows_full)}                        # same observed labels
    np.testing.assert_array_equal(half.observed, full.observed[[pos[r] for r in rows_half]])
    other = load_splits("yeast", subsample=0.5, subsample_seed=7)
    assert other.meta["train_rows"] != rows_half and len(other.train) == 677
    assert half.meta["subsample"] == 0.5 and full.meta["subsample"] == 1.0
    assert half.meta["observed_labels"] == 677                            # one positive each
    assert load_splits("yeast", "full", subsample=0.5).meta["observed_labels"] == 677 * 14
    assert load_splits("yeast", subsample=1.0).meta["train_rows"] == rows_full


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, "half"])
def test_subsample_out_of_range(bad):
    with pytest.raises(ValueError, match=r"yeast: subsample must be a fraction in \(0, 1\]"):
        load_splits("yeast", subsample=bad)


# ---------------------------------------------------------------------------- the sources
def test_mosaic_instances_by_hand():
    img = np.zeros((3, 4, 4), dtype=np.uint8)
    img[0, :2, :2] = 255                     # class 0: 4 pixels in the top-left corner of a tile
    img[1] = 255                             # class 1: the whole tile (16 pixels)
    img[2, 1:3, 1:3] = FOREGROUND_LEVEL      # class 2: at the threshold, not foreground
    labels = np.array([0, 1, 2])
    tiles = np.array([[0, 1, 2, 1],          # tl: class 0, tr: class 1, bl: class 2, br: 1
                      [1, 1, 1, 1]])
    inst = mosaic_instances(img, labels, tiles, num_classes=3)
    assert inst["size"].dtype == np.float32 and inst["size"].shape == (2, 3)
    np.testing.assert_allclose(inst["size"][0], [4 / 64, 16 / 64, 0.0])
    assert np.isnan(inst["size"][1, [0, 2]]).all() and inst["size"][1, 1] == 0.25
    # mosaic 8 x 8, centre (4, 4), half diagonal sqrt(32); class 0's centroid is (1, 1)
    np.testing.assert_allclose(inst["loc"][0, 0], np.hypot(3, 3) / np.hypot(4, 4), rtol=1e-6)
    np.testing.assert_allclose(inst["loc"][0, 1], np.hypot(2, 2) / np.hypot(4, 4), rtol=1e-6)
    np.testing.assert_allclose(inst["loc"][0, 2], np.hypot(2, 2) / np.hypot(4, 4), rtol=1e-6)
    first = {k: v[:1] for k, v in inst.items()}
    assert make_observed([[1, 1, 1]], "1p_biased:size", instances=first).tolist() == [[0, 1, 0]]


def test_coco_boxes_become_instances(tmp_path):
    from test_image_sources import COCO_IDS, write_coco

    write_coco(tmp_path, {9: [1, 3], 25: [1], 10: [62]}, {42: [1]})
    ann = tmp_path / "annotations" / "instances_train2014.json"
    data = json.loads(ann.read_text())
    boxes = {(9, 1): [0, 0, 2, 2], (9, 3): [3, 3, 2, 2], (25, 1): [1, 1, 6, 4],
             (10, 62): [0, 0, 8, 8]}                       # images are 8 x 8
    for a in data["annotations"]:
        a["bbox"] = boxes[(a["image_id"], a["category_id"])]
    data["annotations"].append({"id": 1, "image_id": 9, "category_id": 1, "iscrowd": 0,
                                "bbox": [0, 0, 4, 4]})     # a second, larger person
    ann.write_text(json.dumps(data))
    from spmlkit.data.coco import load_coco

    ds = load_coco(tmp_path)
    inst = ds.meta["instances"]
    col = {cid: j for j, cid in enumerate(COCO_IDS)}
    row = {int(i.split("_")[-1][:-4]): r for r, i in enumerate(ds.pool.ids)}
    assert inst["size"].shape == (3, 80)
    assert inst["size"][row[9], col[1]] == pytest.approx(16 / 64)      # the larger person
    assert inst["size"][row[9], col[3]] == pytest.approx(4 / 64)
    assert inst["loc"][row[9], col[3]] == pytest.approx(0.0)           # box centre (4, 4)
    assert inst["loc"][row[9], col[1]] == pytest.approx(np.hypot(2, 2) / np.hypot(4, 4))
    assert np.isnan(inst["size"][row[25], col[3]])
    z = make_observed(ds.pool.y, "1p_biased:size", instances=inst)
    assert z[row[9], col[1]] == POSITIVE
    z = make_observed(ds.pool.y, "1p_biased:loc", instances=inst)
    assert z[row[9], col[3]] == POSITIVE
