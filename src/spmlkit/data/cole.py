"""The formatted files of Cole et al. (CVPR 2021) as a dataset source (``cole``).

Someone who holds the authors' published files runs the linear protocol on them with no
conversion. The official pipeline (github.com/elijahcole/single-positive-multi-label:
``preproc/format_{pascal,coco,cub}.py``, ``preproc/generate_observed_labels.py``, ``datasets.py``,
``train.py`` and ``data/<dataset>/README.md``) keeps one folder per dataset (``data/pascal``,
``data/coco``, ``data/nuswide``, ``data/cub``) holding::

    formatted_train_labels.npy            official train set, N x L full labels 0/1 (float64 from
                                          format_pascal / format_coco, int from format_cub)
    formatted_val_labels.npy              official evaluation set: our *test*
    formatted_train_labels_obs.npy        observed labels of the train file, same shape, values
                                          -1 / 0 / 1 (our encoding; float64)
    formatted_val_labels_obs.npy          (not read: the test set is always clean)
    formatted_{train,val}_images.npy      image paths (strings), read as ``ids`` when present
    {train,val}_features_imagenet_{arch}.npy
                                          the published frozen features (arch ``resnet50``,
                                          2048-d), one row per label row

The label-bias follow-up (Arroyo et al., ICLR 2023; same repository) writes the observed labels as
``formatted_{train,val}_{bias}_labels_obs.npy`` with ``bias`` in ``uniform`` (the default of
``generate_observed_labels.py``), ``size``, ``loc``, ``semantic``, while its ``datasets.py`` still
reads ``formatted_{phase}_labels_obs.npy`` for every dataset but COCO. Both names are accepted:
for ``observed="uniform"`` the plain name first, then ``..._uniform_labels_obs.npy``.

The shipped observed labels are the official single-positive draw (seed 1200, one positive per
row, no negative; rows without a positive stay empty): `make_splits`
uses them as they are for regime ``1p`` with the official seed, and draws its own otherwise.
When the file is absent the same draw is generated, so the splits do not depend on having it.

Class names: ``class_names=``, else ``class_names.txt`` in the folder (one per line), else CUB's
``CUB_200_2011/attributes.txt`` (the file ``format_cub.py`` reads), else the official order for a
folder (or ``name``) called ``pascal`` (20 VOC classes, alphabetical as in ``format_pascal.py``)
or ``coco`` (80 classes in category-id order, as ``format_coco.py`` writes them), else
``class{j}``.

Memory: ``mmap=True`` maps the feature files (``np.load(mmap_mode="r")``) instead of reading
them, and checks them for NaN block by block; the pool's features are still copied into memory by
the protocol's train / val split, and [`LabelledSet`][spmlkit.data.protocol.LabelledSet] checks
finiteness again with an N x D boolean temporary (a quarter of a float32 matrix). For NUS-WIDE
(150,000 x 2048 float32, 1.2 GB) that is about 1.2 GB for the pool plus 0.3 GB of temporaries;
only the test features stay mapped. Without ``mmap`` the features are read and kept as float32.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..labels import NEGATIVE, POSITIVE, validate_full_labels, validate_observed
from .arrays import check_features, check_rows, load_matrix, read_class_names, \
    resolve_class_names
from .protocol import Dataset, LabelledSet
from .registry import register

LABELS = "formatted_{phase}_labels.npy"
OBSERVED = "formatted_{phase}_labels_obs.npy"
OBSERVED_BIASED = "formatted_{phase}_{bias}_labels_obs.npy"
IMAGES = "formatted_{phase}_images.npy"
FEATURES = "{phase}_features_imagenet_{arch}.npy"
CLASS_NAMES = "class_names.txt"
CUB_ATTRIBUTES = ("CUB_200_2011", "attributes.txt")
#: The official files call our pool "train" and our test "val".
PHASES = {"pool": "train", "test": "val"}
BIASES = ("uniform", "size", "loc", "semantic")

#: PASCAL VOC 2012, in the column order of the official ``format_pascal.py`` (alphabetical).
VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
    "tvmonitor",
)
#: COCO 2014, in the column order of the official ``format_coco.py`` (category-id order).
COCO_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich",
    "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote",
    "keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book",
    "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)
KNOWN_CLASSES = {"pascal": VOC_CLASSES, "voc": VOC_CLASSES, "voc2012": VOC_CLASSES,
                 "coco": COCO_CLASSES, "coco2014": COCO_CLASSES}


def _listing(root: Path, n: int = 20) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())
    if not names:
        return "the folder is empty"
    shown = ", ".join(names[:n])
    return f"the folder holds: {shown}" + (f", ... ({len(names)} in all)" if len(names) > n else "")


def expected_files(arch: str = "resnet50") -> list[str]:
    """The files the ``cole`` source cannot do without, in the official names.

    >>> expected_files()[2]
    'train_features_imagenet_resnet50.npy'
    """
    return [LABELS.format(phase="train"), LABELS.format(phase="val"),
            FEATURES.format(phase="train", arch=arch), FEATURES.format(phase="val", arch=arch)]


def _check_folder(root: Path, arch: str) -> None:
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        raise FileNotFoundError(f"Cole et al. data folder {root} {what}; expected a folder for "
                                f"one dataset (e.g. .../data/pascal) holding "
                                f"{', '.join(expected_files(arch))}")
    missing = [f for f in expected_files(arch) if not (root / f).is_file()]
    if missing:
        other = sorted({p.name[len("train_features_imagenet_"):-len(".npy")]
                        for p in root.glob("train_features_imagenet_*.npy")})
        hint = f" (features found for arch {', '.join(map(repr, other))}: pass arch=)" \
            if other and any("features" in m for m in missing) else ""
        raise FileNotFoundError(f"{root}: missing {', '.join(missing)}{hint}; expected the "
                                f"official formatted files {', '.join(expected_files(arch))} "
                                f"(plus optionally {OBSERVED.format(phase='train')}, "
                                f"{IMAGES.format(phase='train')}, {CLASS_NAMES}); "
                                f"{_listing(root)}")


def observed_file(root: Path, observed: str | None) -> Path | None:
    if observed is None:
        return None
    if observed not in BIASES:
        raise ValueError(f"observed must be None or one of {', '.join(BIASES)}, got {observed!r}")
    biased = root / OBSERVED_BIASED.format(phase="train", bias=observed)
    if observed == "uniform":
        plain = root / OBSERVED.format(phase="train")
        return plain if plain.is_file() else biased if biased.is_file() else None
    if not biased.is_file():
        raise FileNotFoundError(f"{root}: observed={observed!r} needs {biased.name} (written by "
                                f"the official generate_observed_labels.py --bias_type "
                                f"{observed}); {_listing(root)}")
    return biased


def read_observed(path: Path, y: np.ndarray, labels_path: Path,
                  single_positive: bool = True) -> np.ndarray:
    """Read shipped observed labels and check them against the full labels they came from.

    The official files are in our encoding already (-1 / 0 / 1, float64); they become int8.

    Raises:
        ValueError: values outside {1, 0, -1}, a shape other than the full labels', an observed
            positive that is not a true positive or an observed negative that is not a true
            negative (a file drawn from other labels), or, with ``single_positive``, a row with
            more than one observed positive or any observed negative (not the ``1p`` draw).
            Every message names the file and the first offending row.
    """
    z = validate_observed(load_matrix(path, what="observed labels"), str(path))
    if z.shape != y.shape:
        raise ValueError(f"{path} has shape {z.shape} but {labels_path.name} has {y.shape}; the "
                         f"observed labels must be drawn from these full labels")
    wrong = ((z == POSITIVE) & (y != 1)) | ((z == NEGATIVE) & (y != 0))
    if wrong.any():
        row = int(np.argwhere(wrong)[0][0])
        raise ValueError(f"{path}: {int(wrong.any(axis=1).sum())} row(s) observe labels that "
                         f"contradict {labels_path.name} (first at row {row}); the file was drawn "
                         f"from other labels: delete it or pass observed=None to draw them anew")
    if single_positive:
        many = np.flatnonzero(((z == POSITIVE).sum(axis=1) > 1) | (z == NEGATIVE).any(axis=1))
        if many.size:
            raise ValueError(f"{path}: {many.size} row(s) observe more than one positive or a "
                             f"negative (first at row {int(many[0])}); the shipped file must be "
                             f"the single-positive draw (regime 1p). Pass observed=None to "
                             f"ignore it")
    return z


def cole_class_names(root: Path, name: str, num_classes: int, class_names) -> tuple[list, str]:
    """The column names and where they came from."""
    given = resolve_class_names(class_names)
    if given is not None:
        return given, "class_names argument"
    sources = [(root / CLASS_NAMES, read_class_names), (root.joinpath(*CUB_ATTRIBUTES),
                                                        _read_cub_attributes)]
    for path, reader in sources:
        if path.is_file():
            names = reader(path)
            if len(names) != num_classes:
                raise ValueError(f"{path} lists {len(names)} class names but "
                                 f"{LABELS.format(phase='train')} has {num_classes} columns")
            return names, str(path)
    known = KNOWN_CLASSES.get(name.lower()) or KNOWN_CLASSES.get(root.name.lower())
    if known is not None and len(known) == num_classes:
        return list(known), "official class order"
    return [], "default class{j}"


def _read_cub_attributes(path: Path) -> list[str]:
    """CUB's ``attributes.txt``: lines ``<1-based id> <name>``."""
    names = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or not parts[0].isdigit():
            raise ValueError(f"{path}, line {lineno}: expected '<id> <attribute name>', got "
                             f"{line!r}")
        names.append(parts[1].strip())
    return names


def _read_phase(root: Path, phase: str, arch: str, mmap: bool):
    labels_path = root / LABELS.format(phase=phase)
    y = validate_full_labels(load_matrix(labels_path, what="labels"), str(labels_path))
    feats_path = root / FEATURES.format(phase=phase, arch=arch)
    x = load_matrix(feats_path, what="features", mmap_mode="r" if mmap else None)
    x = check_features(x, str(feats_path), to_float32=not mmap)
    check_rows(x, str(feats_path), y, str(labels_path))
    ids = None
    images_path = root / IMAGES.format(phase=phase)
    if images_path.is_file():
        images = load_matrix(images_path, what="image list")
        if images.ndim != 1 or len(images) != len(y):
            raise ValueError(f"{images_path} has shape {images.shape} but {labels_path} has "
                             f"{len(y)} rows; expected one image path per label row")
        ids = [str(s) for s in images.tolist()]
    return x, y, ids, labels_path, feats_path


@register("cole", "the formatted files of Cole et al. (formatted_*_labels.npy, "
          "{train,val}_features_imagenet_resnet50.npy) for VOC / COCO / NUS-WIDE / CUB: "
          "the paper's linear protocol with the published features",
          paper="Cole et al. 2021", tags=("features",))
def load_cole(root: str | os.PathLike, name: str | None = None, arch: str = "resnet50",
              observed: str | None = "uniform", class_names=None, mmap: bool = False,
              standardize: bool = False) -> Dataset:
    """Load one dataset folder in the official formatted layout (module docstring).

    Args:
        root: the folder of one dataset, e.g. ``.../data/pascal``.
        name: the dataset's name (default: the folder's name); also picks the official class
            names (``pascal``, ``coco``).
        arch: the backbone in the feature files' names,
            ``{train,val}_features_imagenet_{arch}.npy``.
        observed: which shipped observed labels of the train file to use: ``"uniform"`` (the
            single-positive draw, ``formatted_train_labels_obs.npy`` or
            ``formatted_train_uniform_labels_obs.npy``; absent = drawn by the protocol), a bias of
            the label-bias follow-up (``"size"``, ``"loc"``, ``"semantic"``: COCO's
            ``formatted_train_{bias}_labels_obs.npy``, required), or ``None`` (ignore the files).
        class_names: the column names (a list or a text file); default as the module says.
        mmap: map the feature files instead of reading them (see the module's note on memory).
        standardize: standardise features with the train rows' statistics (the official linear
            protocol does not).

    Returns:
        a [`Dataset`][spmlkit.data.protocol.Dataset]: ``pool`` = the official train file, ``test`` =
        the official val file, ``pool_observed`` = the shipped observed labels (int8) or ``None``;
        ``meta`` names the files read.

    Raises:
        FileNotFoundError: no such folder, or a required file is missing (the message lists the
            expected files and what the folder holds).
        ValueError: labels other than 0 / 1, NaN / inf features, row counts that differ between
            features and labels, or class counts between the two label files, observed labels
            that are not the single-positive draw of these labels (messages name the files and
            rows).
    """
    root = Path(root)
    _check_folder(root, arch)
    name = name or root.resolve().name
    x, y, ids, y_path, x_path = _read_phase(root, PHASES["pool"], arch, mmap)
    xt, yt, ids_t, yt_path, xt_path = _read_phase(root, PHASES["test"], arch, mmap)
    if yt.shape[1] != y.shape[1]:
        raise ValueError(f"{yt_path} has {yt.shape[1]} classes but {y_path} has {y.shape[1]}")
    if xt.shape[1] != x.shape[1]:
        raise ValueError(f"{xt_path} has {xt.shape[1]} feature columns but {x_path} has "
                         f"{x.shape[1]}")
    obs_path = observed_file(root, observed)
    z = None if obs_path is None else read_observed(obs_path, y, y_path)
    names, names_from = cole_class_names(root, name, y.shape[1], class_names)
    pool = LabelledSet(x, y, list(names), ids, where=f"{name} train ({y_path.name})")
    test = LabelledSet(xt, yt, list(names), ids_t, where=f"{name} test ({yt_path.name})")
    meta = {"source": "cole", "root": str(root), "arch": arch, "features": [x_path.name,
            xt_path.name], "observed_file": None if obs_path is None else obs_path.name,
            "observed_bias": observed if obs_path is not None else None,
            "class_names_from": names_from, "mmap": bool(mmap)}
    return Dataset(name, pool, test, pool_observed=z, standardize=standardize, meta=meta)
