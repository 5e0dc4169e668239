"""Image readers (``spmlkit.data.image_files``) and image sources (``spmlkit.data.voc`` ...).

Every fixture is written in ``tmp_path`` in exactly the official layout, with a few 8 x 8
JPEG / PNG images written by PIL: the VOCdevkit tree (per-class ``<class>_{train,val}.txt`` lists,
``-1`` / ``0`` / `` 1`` labels, ``JPEGImages/``), the COCO ``instances_*2014.json`` files with the
real 80 category ids, the ``CUB_200_2011`` tarball layout (``attributes.txt`` next to the folder),
the formatted ``.npy`` lists of Cole et al. (NUS-WIDE with ``Flickr/``, pascal with
``VOCdevkit/VOC2012/JPEGImages``, cub with the official double ``CUB_200_2011`` nesting), a CSV and
a class-folder tree.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from spmlkit.data import DATASETS, make_splits
from spmlkit.loading import load_dataset, load_splits
from spmlkit.data.protocol import cole_split
from spmlkit.data.cole import COCO_CLASSES, VOC_CLASSES
from spmlkit.data.coco import load_coco
from spmlkit.data.cole_images import load_cole_images
from spmlkit.data.csv_images import load_csv_images
from spmlkit.data.cub import load_cub
from spmlkit.data.folder import load_folder
from spmlkit.data.nuswide import load_nuswide
from spmlkit.data.voc import load_voc
from spmlkit.data.image_files import check_images, image_error, open_image
from spmlkit.labels import POSITIVE, UNOBSERVED, sample_single_positive


def write_image(path, seed=0, fmt=None, mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.RandomState(seed).randint(0, 256, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(arr, "RGB").convert(mode).save(path, fmt)
    return path


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# ---------------------------------------------------------------------------- images.py
def test_open_image_converts_modes_and_composites_alpha(tmp_path):
    gray = write_image(tmp_path / "g.png", mode="L")
    img = open_image(gray)
    assert img.mode == "RGB" and img.size == (8, 8)
    # a fully transparent RGBA image becomes the white background, not black
    Image.new("RGBA", (4, 4), (0, 0, 0, 0)).save(tmp_path / "t.png")
    assert np.asarray(open_image(tmp_path / "t.png")).min() == 255
    pal = Image.new("P", (4, 4), 0)
    pal.putpalette([10, 20, 30] * 256)
    pal.info["transparency"] = 0
    pal.save(tmp_path / "p.png", transparency=0)
    assert np.asarray(open_image(tmp_path / "p.png")).min() == 255
    opaque = Image.new("RGBA", (4, 4), (10, 20, 30, 255))
    opaque.save(tmp_path / "o.png")
    assert np.asarray(open_image(tmp_path / "o.png"))[0, 0].tolist() == [10, 20, 30]


def test_open_image_errors_name_the_file(tmp_path):
    bad = tmp_path / "garbage.jpg"
    bad.write_bytes(b"this is not a jpeg")
    with pytest.raises(ValueError, match=r"garbage\.jpg: not a readable image.*skip_corrupt"):
        open_image(bad)
    cut = write_image(tmp_path / "cut.jpg")
    truncate(cut)
    with pytest.raises(ValueError, match=r"cut\.jpg: not a readable image"):
        open_image(cut)
    with pytest.raises(FileNotFoundError, match=r"nothere\.png does not exist"):
        open_image(tmp_path / "nothere.png")


def test_check_images_raises_or_skips_and_counts(tmp_path):
    good = [str(write_image(tmp_path / f"{i}.jpg", i)) for i in range(3)]
    corrupt = tmp_path / "c.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff garbage")
    missing = [str(tmp_path / "gone1.jpg"), str(tmp_path / "sub" / "gone2.jpg")]
    paths = [good[0], missing[0], str(corrupt), good[1], missing[1], good[2]]
    with pytest.raises(FileNotFoundError, match=r"gone1\.jpg does not exist \(and 1 more of the "
                                                r"6 listed\).*skip_missing=True"):
        check_images(paths)
    # without decoding, the corrupt file passes the cheap check
    assert check_images(paths, skip_missing=True).keep.tolist() == [0, 2, 3, 5]
    with pytest.raises(ValueError, match=r"c\.jpg: not a readable image"):
        check_images(paths, skip_missing=True, decode=True)
    check = check_images(paths, skip_missing=True, skip_corrupt=True)
    assert check.keep.tolist() == [0, 3, 5]
    assert check.missing == missing and check.corrupt == [str(corrupt)] and check.skipped == 3
    assert image_error(good[0]) is None and image_error(missing[0]) == "file does not exist"


# ---------------------------------------------------------------------------- voc
VOC_TRAIN = {  # image id -> {class: label}; unlisted classes are -1
    "2008_000003": {"cat": 1, "dog": 1},
    "2008_000001": {"aeroplane": 1, "person": 0},        # 0 = difficult: a negative
    "2008_000010": {"tvmonitor": 1},
    "2008_000002": {"person": 1},
    "2008_000005": {"bird": 1, "boat": 1, "bottle": 1},
    "2008_000004": {"cat": 0},                           # no positive at all: dropped
    "2008_000007": {"sheep": 1},
}
VOC_VAL = {"2008_000020": {"dog": 1}, "2008_000021": {"car": 1, "person": 1},
           "2008_000022": {"train": 1}, "2008_000023": {"sofa": 1, "chair": 1}}


def write_voc(root, train=VOC_TRAIN, val=VOC_VAL):
    voc = root / "VOCdevkit" / "VOC2012"
    main = voc / "ImageSets" / "Main"
    main.mkdir(parents=True)
    for split, table in (("train", train), ("val", val)):
        for cls in VOC_CLASSES:
            lines = []
            for image, labels in table.items():       # deliberately not in sorted order
                value = labels.get(cls, -1)
                lines.append(f"{image} {value:2d}")    # "2008_000003  1", as the files pad it
            (main / f"{cls}_{split}.txt").write_text("\n".join(lines) + "\n")
        for k, image in enumerate(table):
            write_image(voc / "JPEGImages" / f"{image}.jpg", seed=k)
    return voc


@pytest.fixture
def voc_root(tmp_path):
    write_voc(tmp_path / "pascal")
    return tmp_path / "pascal"


def test_voc_layout_labels_order_and_dropping(voc_root):
    ds = load_voc(voc_root)
    assert DATASETS.get("voc").tags == ("images",)
    assert ds.class_names == list(VOC_CLASSES) and ds.pool.num_classes == 20
    kept = sorted(i for i, lab in VOC_TRAIN.items() if 1 in lab.values())
    assert ds.pool.ids == [f"{i}.jpg" for i in kept]           # sorted, no-positive image dropped
    assert len(ds.pool) == 6 and len(ds.test) == 4
    assert ds.meta["dropped_no_positive"] == {"pool": 1, "test": 0}
    for row, image in enumerate(kept):
        expected = [int(VOC_TRAIN[image].get(c, -1) == 1) for c in VOC_CLASSES]
        assert ds.pool.y[row].tolist() == expected, image
    row = kept.index("2008_000001")                              # '0' (difficult) is negative
    assert ds.pool.y[row, VOC_CLASSES.index("person")] == 0
    assert all(os.path.isabs(p) and os.path.isfile(p) for p in ds.pool.x + ds.test.x)
    assert ds.pool.x[0].endswith(os.path.join("JPEGImages", "2008_000001.jpg"))
    # the VOCdevkit folder and the VOC2012 folder are accepted as root too
    assert load_voc(voc_root / "VOCdevkit").pool.ids == ds.pool.ids
    assert load_voc(voc_root / "VOCdevkit" / "VOC2012").test.ids == ds.test.ids


def test_voc_load_splits_end_to_end(voc_root):
    splits = load_splits("voc", root=str(voc_root))
    assert (len(splits.train), len(splits.val), len(splits.test)) == (5, 1, 4)
    train_idx, val_idx = cole_split(6, 0.2)
    pool = load_voc(voc_root)
    assert splits.train.ids == [pool.pool.ids[i] for i in train_idx]
    assert splits.val.ids == [pool.pool.ids[i] for i in val_idx]
    assert ((splits.observed == POSITIVE).sum(axis=1) == 1).all()
    assert set(np.unique(splits.observed)) <= {POSITIVE, UNOBSERVED}
    assert (splits.train.y[splits.observed == POSITIVE] == 1).all()
    assert open_image(splits.train.x[0]).size == (8, 8)


def test_voc_missing_annotation_file(voc_root):
    (voc_root / "VOCdevkit/VOC2012/ImageSets/Main/cat_val.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"cat_val\.txt does not exist; expected one list "
                                                r"<class>_val\.txt per class.*found 19"):
        load_voc(voc_root)
    with pytest.raises(FileNotFoundError, match=r"no PASCAL VOC2012 tree under .*VOCdevkit/"
                                                r"VOC2012/ImageSets/Main"):
        load_voc(voc_root / "VOCdevkit" / "VOC2012" / "JPEGImages")


def test_voc_malformed_line_names_file_and_line(voc_root):
    f = voc_root / "VOCdevkit/VOC2012/ImageSets/Main/dog_train.txt"
    lines = f.read_text().splitlines()
    lines[2] = "2008_000010 yes"
    f.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=r"dog_train\.txt, line 3: the label must be an integer, "
                                         r"got 'yes'"):
        load_voc(voc_root)
    lines[2] = "2008_000010 2"
    f.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=r"dog_train\.txt, line 3: the label must be one of 1, "
                                         r"0, -1"):
        load_voc(voc_root)


def test_voc_missing_image_raises_or_is_skipped(voc_root):
    gone = voc_root / "VOCdevkit/VOC2012/JPEGImages/2008_000005.jpg"
    gone.unlink()
    with pytest.raises(FileNotFoundError, match=r"voc pool: image .*2008_000005\.jpg does not "
                                                r"exist.*skip_missing=True"):
        load_voc(voc_root)
    with pytest.warns(UserWarning, match=r"voc pool: skipped 1 item.*2008_000005\.jpg"):
        ds = load_voc(voc_root, skip_missing=True)
    assert len(ds.pool) == 5 and "2008_000005.jpg" not in ds.pool.ids
    assert ds.meta["skipped"]["pool"]["missing"] == 1 and ds.meta["skipped"]["test"]["missing"] == 0
    assert ds.meta["official_split"] is False
    row = ds.pool.ids.index("2008_000007.jpg")                # labels stay with their image
    assert ds.pool.y[row, VOC_CLASSES.index("sheep")] == 1 and ds.pool.y[row].sum() == 1


def test_voc_corrupt_image_named_or_skipped(voc_root):
    bad = voc_root / "VOCdevkit/VOC2012/JPEGImages/2008_000022.jpg"
    truncate(bad)
    ds = load_voc(voc_root)                                  # cheap check: exists
    row = ds.test.ids.index("2008_000022.jpg")
    with pytest.raises(ValueError, match=r"2008_000022\.jpg: not a readable image"):
        open_image(ds.test.x[row])
    with pytest.warns(UserWarning, match=r"voc test: skipped 1 item.*unreadable"):
        ds = load_voc(voc_root, skip_corrupt=True)
    assert len(ds.test) == 3 and ds.meta["skipped"]["test"]["corrupt"] == 1
    assert "official_split" not in ds.meta                   # only the test set lost an item


# ---------------------------------------------------------------------------- coco
COCO_IDS = sorted(set(range(1, 91)) - {12, 26, 29, 30, 45, 66, 68, 69, 71, 83})   # the real ids


def write_coco(root, train_ann, val_ann, unannotated=(), drop_key=None, bad_ann=None):
    """``*_ann``: {image id: [category ids]}."""
    assert len(COCO_IDS) == 80
    categories = [{"supercategory": "x", "id": cid, "name": name}
                  for cid, name in zip(COCO_IDS, COCO_CLASSES)]
    (root / "annotations").mkdir(parents=True)
    for split, table in (("train", train_ann), ("val", val_ann)):
        ids = list(table) + (list(unannotated) if split == "train" else [])
        images = [{"id": i, "file_name": f"COCO_{split}2014_{i:012d}.jpg", "width": 8,
                   "height": 8} for i in ids]
        anns = [{"id": 1000 * i + k, "image_id": i, "category_id": c, "iscrowd": 0,
                 "bbox": [0, 0, 1, 1], "area": 1.0}
                for i, cats in table.items() for k, c in enumerate(cats)]
        if bad_ann is not None and split == "train":
            anns.append(bad_ann)
        data = {"info": {}, "licenses": [], "images": images, "annotations": anns,
                "categories": categories}
        if drop_key is not None and split == "val":
            del data[drop_key]
        (root / "annotations" / f"instances_{split}2014.json").write_text(json.dumps(data))
        for k, i in enumerate(ids):
            write_image(root / f"{split}2014" / f"COCO_{split}2014_{i:012d}.jpg", seed=k)


COCO_TRAIN = {9: [1, 1, 90], 100: [13], 25: [1, 3], 10: [62, 63], 2: [44]}
COCO_VAL = {42: [1], 7: [90, 2], 300: [16]}


def test_coco_rows_columns_and_unannotated(tmp_path):
    write_coco(tmp_path, COCO_TRAIN, COCO_VAL, unannotated=(5, 77))
    ds = load_coco(tmp_path)
    assert ds.class_names == list(COCO_CLASSES)
    # rows: annotated images sorted by their id as a string, as format_coco.py orders them
    order = ["10", "100", "2", "25", "9"]
    assert ds.pool.ids == [f"train2014/COCO_train2014_{int(i):012d}.jpg" for i in order]
    assert ds.test.ids == [f"val2014/COCO_val2014_{i:012d}.jpg" for i in (300, 42, 7)]
    assert ds.meta["unannotated"] == {"pool": 2, "test": 0}
    col = {cid: j for j, cid in enumerate(COCO_IDS)}
    for row, image in enumerate(order):
        expected = np.zeros(80, dtype=np.uint8)
        expected[[col[c] for c in COCO_TRAIN[int(image)]]] = 1
        assert ds.pool.y[row].tolist() == expected.tolist(), image
    row9 = order.index("9")                                  # category 90 is the last column
    assert ds.pool.y[row9, 79] == 1 and ds.class_names[79] == "toothbrush"
    assert ds.pool.y[order.index("100"), COCO_CLASSES.index("stop sign")] == 1   # id 13 -> col 11
    assert all(os.path.isfile(p) for p in ds.pool.x)


def test_coco_missing_keys_and_files(tmp_path):
    write_coco(tmp_path / "a", COCO_TRAIN, COCO_VAL, drop_key="categories")
    with pytest.raises(ValueError, match=r"instances_val2014\.json: the file has no key "
                                         r"'categories'"):
        load_coco(tmp_path / "a")
    write_coco(tmp_path / "b", COCO_TRAIN, COCO_VAL, bad_ann={"id": 1, "image_id": 9})
    with pytest.raises(ValueError, match=r"instances_train2014\.json: annotations\[\d+\] has no "
                                         r"key 'category_id'"):
        load_coco(tmp_path / "b")
    write_coco(tmp_path / "c", COCO_TRAIN, COCO_VAL,
               bad_ann={"id": 1, "image_id": 9, "category_id": 12})
    with pytest.raises(ValueError, match=r"category_id 12, which 'categories' does not declare"):
        load_coco(tmp_path / "c")
    write_coco(tmp_path / "d", COCO_TRAIN, COCO_VAL)
    (tmp_path / "d" / "annotations" / "instances_val2014.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"instances_val2014\.json does not exist; "
                                                r"expected annotations/instances_"):
        load_coco(tmp_path / "d")
    (tmp_path / "d" / "annotations" / "instances_val2014.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"instances_val2014\.json: not a readable JSON file"):
        load_coco(tmp_path / "d")


def test_coco_missing_image_skipped(tmp_path):
    write_coco(tmp_path, COCO_TRAIN, COCO_VAL)
    (tmp_path / "val2014" / f"COCO_val2014_{42:012d}.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=r"COCO_val2014_000000000042\.jpg does not exist"):
        load_coco(tmp_path)
    with pytest.warns(UserWarning, match="coco test: skipped 1"):
        ds = load_coco(tmp_path, skip_missing=True)
    assert len(ds.test) == 2 and ds.meta["skipped"]["test"]["missing"] == 1


# ---------------------------------------------------------------------------- cub
N_ATTR = 312


def write_cub(base, n_images=8, extra_field_line=True, attr_names=True):
    """The CUB_200_2011.tgz layout unpacked in ``base``: base/attributes.txt and
    base/CUB_200_2011/{images.txt, train_test_split.txt, attributes/..., images/...}."""
    cub = base / "CUB_200_2011"
    (cub / "attributes").mkdir(parents=True)
    rng = np.random.RandomState(3)
    rel, train, y = [], [], np.zeros((n_images, N_ATTR), dtype=np.uint8)
    for i in range(n_images):
        rel.append(f"{i % 3 + 1:03d}.Bird_{i % 3}/Bird_{i:04d}.jpg")
        train.append(int(i % 4 != 3))
        y[i, rng.choice(N_ATTR, size=5 + i, replace=False)] = 1
        write_image(cub / "images" / rel[-1], seed=i)
    (cub / "images.txt").write_text("".join(f"{i + 1} {r}\n" for i, r in enumerate(rel)))
    (cub / "train_test_split.txt").write_text("".join(f"{i + 1} {t}\n"
                                                      for i, t in enumerate(train)))
    lines = [f"{i + 1} {j + 1} {y[i, j]} 3 12.5" for i in range(n_images) for j in range(N_ATTR)]
    if extra_field_line:
        lines[7] += " 0"                                      # a line with a sixth field
    (cub / "attributes" / "image_attribute_labels.txt").write_text("\n".join(lines) + "\n")
    if attr_names:
        (base / "attributes.txt").write_text("".join(f"{j + 1} has_part::value_{j}\n"
                                                     for j in range(N_ATTR)))
    return cub, rel, np.array(train, bool), y


def test_cub_layout_split_and_labels(tmp_path):
    cub, rel, train, y = write_cub(tmp_path / "CUB")
    ds = load_cub(tmp_path / "CUB")
    assert ds.pool.num_classes == N_ATTR and ds.class_names[0] == "has_part::value_0"
    assert ds.pool.ids == [r for r, t in zip(rel, train) if t]   # images.txt order
    assert ds.test.ids == [r for r, t in zip(rel, train) if not t]
    assert (len(ds.pool), len(ds.test)) == (6, 2)
    np.testing.assert_array_equal(ds.pool.y, y[train])
    np.testing.assert_array_equal(ds.test.y, y[~train])
    assert ds.pool.x[0] == os.path.join(str(cub.resolve()), "images", rel[0])
    # Cole et al.'s nesting data/cub/CUB_200_2011/CUB_200_2011 is found too
    write_cub(tmp_path / "data" / "cub" / "CUB_200_2011")
    assert load_cub(tmp_path / "data" / "cub").pool.ids == ds.pool.ids


def test_cub_broken_inputs(tmp_path):
    cub, *_ = write_cub(tmp_path / "x", attr_names=False)
    ds = load_cub(tmp_path / "x")                            # names optional
    assert ds.class_names[0] == "class0" and ds.meta["class_names_from"] == "default class{j}"
    labels = cub / "attributes" / "image_attribute_labels.txt"
    lines = labels.read_text().splitlines()
    lines[20] = "1 21 2 3 12.5"
    labels.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=r"image_attribute_labels\.txt, line 21: is_present must "
                                         r"be one of 0, 1"):
        load_cub(tmp_path / "x")
    labels.write_text("\n".join(lines[:20] + lines[21:]))    # one pair left out
    with pytest.raises(ValueError, match=r"image 1 has no label for attribute 21"):
        load_cub(tmp_path / "x")
    labels.unlink()
    with pytest.raises(FileNotFoundError, match=r"image_attribute_labels\.txt do not exist"):
        load_cub(tmp_path / "x")
    (cub / "train_test_split.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"no CUB-200-2011 folder .*train_test_split"):
        load_cub(tmp_path / "x")


# ---------------------------------------------------------------------------- nuswide
def write_formatted(root, image_root, n_train, n_val, num_classes, empty_rows=(), seed=0,
                    observed=True):
    """The formatted lists of Cole et al. (float64 labels, string image arrays)."""
    rng = np.random.RandomState(seed)
    out = {}
    for phase, n in (("train", n_train), ("val", n_val)):
        y = np.zeros((n, num_classes))
        for i in range(n):
            if i not in empty_rows:
                y[i, rng.choice(num_classes, size=rng.randint(1, 3), replace=False)] = 1.0
        images = np.array([f"c{i % 3}/{phase}_{i:04d}.jpg" for i in range(n)])
        np.save(root / f"formatted_{phase}_labels.npy", y)
        np.save(root / f"formatted_{phase}_images.npy", images)
        for k, name in enumerate(images):
            write_image(image_root / name, seed=k)
        out[phase] = (y, images)
    if observed:
        z = sample_single_positive(out["train"][0], seed=1200)
        np.save(root / "formatted_train_labels_obs.npy", z.astype(np.float64))
        out["obs"] = z
    return out


def test_nuswide_keeps_rows_without_positive(tmp_path):
    root = tmp_path / "nuswide"
    root.mkdir()
    data = write_formatted(root, root / "Flickr", 10, 6, 81, empty_rows=(2, 5))
    (root / "class_names.txt").write_text("".join(f"concept{j}\n" for j in range(81)))
    ds = load_nuswide(root)
    assert (len(ds.pool), len(ds.test)) == (10, 6) and ds.pool.num_classes == 81
    assert ds.class_names[80] == "concept80"
    assert ds.pool.y[[2, 5]].sum() == 0
    assert ds.meta["rows_without_positive"] == {"pool": 2, "test": 2}
    assert ds.pool.ids == data["train"][1].tolist()
    assert ds.pool.x[0] == os.path.join(str(root.resolve()), "Flickr", "c0", "train_0000.jpg")
    np.testing.assert_array_equal(ds.pool_observed, data["obs"])
    assert (ds.pool_observed[[2, 5]] == UNOBSERVED).all()   # no observed positive, as official
    splits = make_splits(ds)                                 # shipped draw used for 1p
    assert len(splits.train) + len(splits.val) == 10
    dropped = load_nuswide(root, drop_empty=True)
    assert (len(dropped.pool), len(dropped.test)) == (8, 4)
    np.testing.assert_array_equal(dropped.pool_observed, np.delete(data["obs"], [2, 5], axis=0))
    assert dropped.meta["official_split"] is False


def test_nuswide_missing_lists_and_images(tmp_path):
    root = tmp_path / "nus"
    root.mkdir()
    write_formatted(root, root / "Flickr", 6, 4, 81)
    (root / "formatted_val_images.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing formatted_val_images\.npy; the nuswide "
                                                r"source reads the formatted lists"):
        load_nuswide(root)
    write_formatted(root, root / "Flickr", 6, 4, 81)
    os.remove(root / "Flickr" / "c1" / "val_0001.jpg")
    with pytest.raises(FileNotFoundError, match=r"val_0001\.jpg does not exist"):
        load_nuswide(root)
    with pytest.warns(UserWarning, match="nuswide test: skipped 1"):
        ds = load_nuswide(root, skip_missing=True)
    assert len(ds.test) == 3 and "c1/val_0001.jpg" not in ds.test.ids
    np.save(root / "formatted_train_images.npy", np.array(["a.jpg"] * 5))
    with pytest.raises(ValueError, match=r"formatted_train_images\.npy lists 5 images but "
                                         r"formatted_train_labels\.npy has 6 label rows"):
        load_nuswide(root)


# ---------------------------------------------------------------------------- cole_images
def test_cole_images_pascal_and_cub_image_roots(tmp_path):
    pascal = tmp_path / "data" / "pascal"
    pascal.mkdir(parents=True)
    data = write_formatted(pascal, pascal / "VOCdevkit/VOC2012/JPEGImages", 10, 5, 20)
    ds = load_cole_images(pascal)
    assert ds.class_names == list(VOC_CLASSES)
    assert ds.meta["image_root"].endswith(os.path.join("VOCdevkit", "VOC2012", "JPEGImages"))
    np.testing.assert_array_equal(ds.pool.y, data["train"][0])
    np.testing.assert_array_equal(ds.pool_observed, data["obs"])
    splits = load_splits("cole_images", root=str(pascal))
    np.testing.assert_array_equal(splits.observed, data["obs"][cole_split(10, 0.2)[0]])
    cub = tmp_path / "data" / "cub"
    cub.mkdir()
    write_formatted(cub, cub / "CUB_200_2011/CUB_200_2011/images", 8, 4, 312, observed=False)
    ds = load_cole_images(cub)
    assert ds.meta["image_root"].endswith(os.path.join("CUB_200_2011", "CUB_200_2011", "images"))
    assert ds.pool_observed is None and ds.pool.num_classes == 312
    other = tmp_path / "data" / "mine"
    other.mkdir()
    write_formatted(other, other / "pictures", 6, 3, 4, observed=False)
    with pytest.raises(FileNotFoundError, match=r"none of the first listed images .*pass "
                                                r"image_root="):
        load_cole_images(other)
    assert len(load_cole_images(other, image_root="pictures").pool) == 6


# ---------------------------------------------------------------------------- csv
def _csv_images(folder, n):
    for i in range(n):
        write_image(folder / "img" / f"{i}.png", seed=i, fmt="PNG")


def test_csv_forms_classes_and_carve_out(tmp_path):
    _csv_images(tmp_path, 10)
    abs_path = write_image(tmp_path / "elsewhere" / "z.jpg")
    rows = ["path,labels", "img/0.png,cat;dog", 'img/1.png,"traffic light|cat"', "img/2.png,",
            "img/3.png,dog,cat", "img/4.png,dog", "img/4.png,traffic light",   # long form
            "img/5.png,cat", "img/6.png,dog", "img/7.png,cat", "img/8.png,dog",
            f"{abs_path},cat"]
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    ds = load_csv_images(tmp_path / "labels.csv")
    assert ds.class_names == ["cat", "dog", "traffic light"]
    ids = ["img/0.png", "img/1.png", "img/2.png", "img/3.png", "img/4.png", "img/5.png",
           "img/6.png", "img/7.png", "img/8.png", str(abs_path)]
    y = np.array([[1, 1, 0], [1, 0, 1], [0, 0, 0], [1, 1, 0], [0, 1, 1], [1, 0, 0], [0, 1, 0],
                  [1, 0, 0], [0, 1, 0], [1, 0, 0]], dtype=np.uint8)
    pool_idx, test_idx = cole_split(10, 0.3)
    assert ds.pool.ids == [ids[i] for i in pool_idx] and ds.test.ids == [ids[i] for i in test_idx]
    np.testing.assert_array_equal(ds.pool.y, y[pool_idx])
    np.testing.assert_array_equal(ds.test.y, y[test_idx])
    assert all(os.path.isabs(p) and os.path.isfile(p) for p in ds.pool.x + ds.test.x)
    assert ds.meta["test_fraction"] == 0.3 and ds.meta["split_seed"] == 1200
    # explicit test file and declared classes
    (tmp_path / "test.csv").write_text("img/9.png,dog\n")
    ds = load_csv_images(tmp_path / "labels.csv", test_path=tmp_path / "test.csv",
                         class_names=["dog", "cat", "traffic light", "bird"])
    assert (len(ds.pool), len(ds.test)) == (10, 1) and ds.test.y.tolist() == [[1, 0, 0, 0]]


def test_csv_unknown_class_names_the_line(tmp_path):
    _csv_images(tmp_path, 3)
    (tmp_path / "train.csv").write_text("img/0.png,cat\nimg/1.png,dog\nimg/2.png,cat\n")
    (tmp_path / "test.csv").write_text("path,labels\nimg/0.png,dog\nimg/1.png,cow\n")
    with pytest.raises(ValueError, match=r"test\.csv, line 3: unknown class name 'cow' \(image "
                                         r"img/1\.png\); known classes: cat, dog"):
        load_csv_images(tmp_path / "train.csv", test_path=tmp_path / "test.csv")
    with pytest.raises(ValueError, match=r"train\.csv, line 2: unknown class name 'dog'"):
        load_csv_images(tmp_path / "train.csv", class_names=["cat"])
    with pytest.raises(FileNotFoundError, match=r"image list .*nope\.csv does not exist"):
        load_csv_images(tmp_path / "nope.csv")
    (tmp_path / "train.csv").write_text("img/0.png,cat\nimg/1.png,dog\nimg/gone.png,cat\n")
    with pytest.raises(FileNotFoundError, match=r"img/gone\.png does not exist"):
        load_csv_images(tmp_path / "train.csv", test_path=tmp_path / "train.csv")


# ---------------------------------------------------------------------------- folder
def test_folder_one_hot_split_and_test_folder(tmp_path):
    root = tmp_path / "photos"
    for i in range(4):
        write_image(root / "dog" / f"d{i}.jpg", seed=i)
    for i in range(3):
        write_image(root / "cat" / f"c{i}.png", seed=10 + i, fmt="PNG")
    write_image(root / "cat" / "more" / "c9.jpg", seed=20)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "empty_class").mkdir()
    with pytest.raises(ValueError, match=r"photos/empty_class: class folder 'empty_class' holds "
                                         r"no image .*add its images or remove the folder"):
        load_folder(root)                                       # no class without images
    (root / "empty_class").rmdir()
    ds = load_folder(root)
    assert ds.class_names == ["cat", "dog"]
    ids = ["cat/c0.png", "cat/c1.png", "cat/c2.png", "cat/more/c9.jpg",
           "dog/d0.jpg", "dog/d1.jpg", "dog/d2.jpg", "dog/d3.jpg"]
    pool_idx, test_idx = cole_split(8, 0.3)
    assert ds.pool.ids == [ids[i] for i in pool_idx] and ds.test.ids == [ids[i] for i in test_idx]
    assert (ds.pool.y.sum(axis=1) == 1).all()                   # one-hot: the folder's class
    for row, i in enumerate(pool_idx):
        assert ds.pool.y[row, 0 if ids[i].startswith("cat") else 1] == 1
    assert ds.meta["labels"] == "folder_class_only" and ds.meta["ignored_files"]["pool"] == 1
    splits = load_splits("folder", root=str(root))
    np.testing.assert_array_equal(splits.observed == POSITIVE, splits.train.y == 1)
    test_root = tmp_path / "holdout"
    write_image(test_root / "dog" / "t.jpg")
    ds = load_folder(root, test_root=test_root)
    assert (len(ds.pool), len(ds.test)) == (8, 1) and ds.test.y.tolist() == [[0, 1]]
    write_image(test_root / "cow" / "u.jpg")
    with pytest.raises(ValueError, match=r"holdout/cow: class folder 'cow' is not one of the "
                                         r"training classes"):
        load_folder(root, test_root=test_root)


def test_folder_broken_trees(tmp_path):
    split_tree = tmp_path / "ds"
    write_image(split_tree / "train" / "cat" / "a.jpg")
    write_image(split_tree / "test" / "cat" / "b.jpg")
    with pytest.raises(ValueError, match=r"holds split folders \(test, train\).*root=.*train"):
        load_folder(split_tree)
    with pytest.raises(FileNotFoundError, match=r"image folder .*nowhere does not exist"):
        load_folder(tmp_path / "nowhere")
    flat = tmp_path / "flat"
    write_image(flat / "a.jpg")
    with pytest.raises(ValueError, match=r"flat: no class subfolder"):
        load_folder(flat)
    tree = tmp_path / "tree"
    for i in range(5):
        write_image(tree / "a" / f"{i}.jpg", seed=i)
    (tree / "a" / "3.jpg").write_bytes(b"\xff\xd8\xff not really")
    with pytest.warns(UserWarning, match=r"skipped 1 item.*3\.jpg"):
        ds = load_folder(tree, test_fraction=0.4, skip_corrupt=True)
    assert len(ds.pool) + len(ds.test) == 4
    assert sum(ds.meta["skipped"][p]["corrupt"] for p in ("pool", "test")) == 1


def test_sources_are_registered_with_the_images_tag():
    names = set(DATASETS.names("images"))
    assert {"voc", "coco", "cub", "nuswide", "cole_images", "csv", "folder"} <= names
    with pytest.raises(FileNotFoundError, match="no PASCAL VOC2012 tree"):
        load_dataset("voc", root="/nonexistent/pascal")
