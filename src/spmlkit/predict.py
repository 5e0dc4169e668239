"""``spml predict``: a finished run folder's best model on new inputs, thresholded.

A run folder holds ``best.pt`` (the best epoch's weights and what is needed to rebuild the
model) and ``thresholds.json`` (chosen on the validation split at training time:
`spmlkit.metrics.select_thresholds`). Inputs:

- linear runs: feature files (``.npy`` with an N x D matrix, or ``.npz`` holding one array or
  one named ``features`` / ``x``); for a run of the ``tabular`` source, also tables (``.csv``,
  ``.tsv``, ``.parquet``) of new rows whose feature columns carry the names the run trained on
  (other columns are ignored; the run's id column, when present, names the rows); when the run
  trained on a backbone's cached features (``spml train --backbone``), image files and folders
  work too (the backbone is rebuilt);
- fine-tuned runs (``finetune``, ``linear_init``): image files and folders (searched
  recursively, sorted), decoded as the run decoded its val and test images: a run trained with
  ``--jpeg-draft`` decodes JPEGs at libjpeg's reduced scale here too (`run_decoder`).

Thresholds: ``"global"`` (the one maximising val micro-F1), ``"per-class"`` (each class's
val-F1 maximiser) or a number in [0, 1]. A label is predicted where ``p >= threshold``. Or
``coverage``: per-class conformal thresholds calibrated on the run's val rows (their known
positives in ``predictions.npz``) so that each class's sets hold that share of its true
positives (`spmlkit.coverage`, `run_coverage`).
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .data.tabular import table_kind
from .methods import load_run_model, preprocess_features
from .runs import PREDICTIONS_FILE, THRESHOLDS_FILE
from .safe_write import write_output

FEATURE_SUFFIXES = (".npy", ".npz")


@dataclass
class Predictions:
    """Probabilities of N inputs, the thresholds applied and the labels they give."""

    items: list
    probs: np.ndarray            # N x L float32
    class_names: list
    thresholds: np.ndarray       # L (the global threshold repeated, or per class)
    threshold_kind: str          # "global" | "per-class" | "value" | "rule"
    skipped: list = field(default_factory=list)  # unreadable images left out (skip_corrupt)
    rule: dict | None = None     # a threshold rule (spmlkit.thresholds): name and what it used
    decided: np.ndarray | None = None  # N x L bool: the rule's labels
    conformal: object = None     # spmlkit.coverage.CoverageThresholds (a --coverage run)

    @property
    def labels(self) -> np.ndarray:
        """N x L bool: ``probs >= thresholds``, or the threshold rule's labels."""
        if self.decided is not None:
            return self.decided
        return self.probs >= self.thresholds[None, :]

    def rows(self) -> list[dict]:
        on = self.labels
        return [{"item": item,
                 "labels": [c for c, flag in zip(self.class_names, on[i]) if flag],
                 "scores": {c: float(p) for c, p in zip(self.class_names, self.probs[i])}}
                for i, item in enumerate(self.items)]

    def to_csv(self) -> str:
        """``item,labels,<class>...``: labels joined with ``;``, then one probability column
        per class (6 significant digits)."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["item", "labels", *self.class_names])
        on = self.labels
        for i, item in enumerate(self.items):
            w.writerow([item, ";".join(c for c, f in zip(self.class_names, on[i]) if f),
                        *(f"{p:.6g}" for p in self.probs[i])])
        return buf.getvalue()

    def to_json(self, run=None) -> str:
        if self.rule is not None:
            thr = {"kind": "rule", **self.rule}
        elif self.conformal is not None:
            thr = self.conformal.to_dict(self.class_names)
        elif self.threshold_kind == "per-class":
            thr = {"kind": "per-class", "values": dict(zip(self.class_names,
                                                           map(float, self.thresholds)))}
        else:
            thr = {"kind": self.threshold_kind, "value": float(self.thresholds[0])}
        return json.dumps({"run": None if run is None else str(run), "threshold": thr,
                           "class_names": list(self.class_names), "predictions": self.rows(),
                           **({"skipped": list(self.skipped)} if self.skipped else {})},
                          indent=2) + "\n"


def run_thresholds(run, kind: str = "global") -> tuple[np.ndarray | None, str]:
    """The run's thresholds for ``kind`` (``"global"``, ``"per-class"`` or a number) as an
    array of L values (None for a number: the caller knows L), and the kind."""
    run = Path(run)
    try:
        value = float(kind)
    except (TypeError, ValueError):
        value = None
    if value is not None:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"a numeric threshold is a probability in [0, 1], got {kind}")
        return None, "value"
    if kind not in ("global", "per-class"):
        raise ValueError(f"threshold must be 'global', 'per-class' or a number in [0, 1], got "
                         f"{kind!r}")
    path = run / THRESHOLDS_FILE
    if path.is_file():
        try:
            chosen = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not valid JSON ({err}); give a numeric --threshold, "
                             f"e.g. 0.5") from None
        if not isinstance(chosen, dict):
            raise ValueError(f"{path}: expected a JSON object with 'global' and 'per_class', "
                             f"got {type(chosen).__name__}")
    elif (run / PREDICTIONS_FILE).is_file():  # runs from before thresholds.json: from val
        from .metrics import select_thresholds
        from .runs import load_arrays

        f = load_arrays(run / PREDICTIONS_FILE, ("probs_val", "y_val"))
        chosen = select_thresholds(f["probs_val"], f["y_val"])
    else:
        raise FileNotFoundError(f"{path} does not exist (nor {run / PREDICTIONS_FILE}, to choose "
                                f"thresholds from): give a numeric --threshold, e.g. 0.5")
    key = "global" if kind == "global" else "per_class"
    value = chosen.get(key)
    values = [value] if key == "global" else value
    if not isinstance(values, list) or not values or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0
            for v in values):
        want = "a number" if key == "global" else "a list of numbers (one per class)"
        raise ValueError(f"{path}: {key!r} must be {want} in [0, 1], got {value!r:.200}")
    return np.asarray(values, dtype=np.float64), kind


def run_coverage(run, coverage: float):
    """Per-class conformal thresholds at ``coverage`` (`spmlkit.coverage.coverage_thresholds`)
    from the run's val probabilities and val labels (``predictions.npz``: ``probs_val``,
    ``y_val``, full or partial; their positives, or known positives, calibrate).

    Raises:
        FileNotFoundError: the run has no ``predictions.npz``.
        ValueError: a coverage outside (0, 1), val arrays that do not fit each other.
    """
    from .coverage import check_coverage, coverage_thresholds
    from .runs import load_arrays

    coverage = check_coverage(coverage, "coverage (--coverage)")
    path = Path(run) / PREDICTIONS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: --coverage calibrates on the run's val "
                                f"probabilities and labels, which spml train writes there")
    f = load_arrays(path, ("probs_val", "y_val"))
    return coverage_thresholds(np.clip(np.asarray(f["probs_val"], np.float64), 0.0, 1.0),
                               np.asarray(f["y_val"]), coverage)


def folder_images(folder) -> list[str]:
    """The image files under ``folder`` (searched recursively), sorted."""
    from .data.image_files import is_image_name

    return sorted(str(p) for p in Path(folder).rglob("*") if p.is_file()
                  and is_image_name(p.name))


def _image_lists(inputs, lists, source: dict | None = None) -> list[str]:
    """``inputs`` with each CSV of ``lists`` replaced by the image paths it lists (its first
    column, in the `csv` source's form; its labels are not used): relative to the CSV's folder,
    or, for the run's own training or test CSV (``source``: its dataset options), to the
    ``image_root`` / ``test_image_root`` and with the ``delimiter`` it was read with."""
    from .data.csv_images import read_image_csv
    from .data.image_common import join_paths

    source = source or {}

    def same(a, b) -> bool:
        return b is not None and Path(a).resolve() == Path(str(b)).expanduser().resolve()

    out = []
    for raw in inputs:
        if raw not in lists:
            out.append(raw)
            continue
        root = Path(raw).parent
        if same(raw, source.get("path")) and source.get("image_root"):
            root = Path(source["image_root"])
        elif same(raw, source.get("test_path")) and source.get("test_image_root"):
            root = Path(source["test_image_root"])
        paths = read_image_csv(raw, delimiter=source.get("delimiter"), negatives=True)[0]
        out += join_paths(root.expanduser().resolve(), paths)
    return out


def _expand_images(inputs) -> list[str]:
    out = []
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            found = folder_images(path)
            if not found:
                raise FileNotFoundError(f"folder {path} holds no image file (searched "
                                        f"recursively)")
            out += found
        elif path.is_file():
            out.append(str(path))
        else:
            raise FileNotFoundError(f"input {path} does not exist")
    return out


def read_feature_file(path) -> np.ndarray:
    """An N x D float32 matrix from a ``.npy`` file or an ``.npz`` file (its only array, or
    the one named ``features`` or ``x``): the data layer's reader and checks
    (`spmlkit.data.arrays.load_matrix`, `check_features`)."""
    from .data.arrays import check_features, load_matrix

    return check_features(load_matrix(path, ("features", "x"), "features"), str(path))


def read_feature_table(path, columns, id_column: str | None = None) -> tuple[np.ndarray, list]:
    """The feature columns ``columns`` (by name) of a CSV / Parquet table of new rows, as the
    ``tabular`` source reads them (`spmlkit.data.tabular.table_features`), and the
    rows' names: the ``id_column`` values when the table has that column, else ``FILE#ROW``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a missing feature column (named), non-numeric or empty cells.
    """
    from .data.tabular import read_table, table_features, table_ids

    df = read_table(path, "table of new rows", [id_column] if id_column else ())
    x = table_features(df, list(columns), str(path))
    if id_column and id_column in df.columns:
        return x, table_ids(df, id_column, str(path))
    return x, [f"{path}#{r}" for r in range(len(df))]


def _readable(items: list, skip_corrupt: bool) -> tuple[list, list]:
    """``(readable items, unreadable ones)``: every image decoded once before any is predicted,
    so one bad file neither aborts a batch late nor goes unnamed."""
    from .data.image_files import decode_errors

    good, bad = [], []
    for item, reason in zip(items, decode_errors(items)):
        if reason is None:
            good.append(item)
        elif not skip_corrupt:
            raise ValueError(f"{item}: not a readable image ({reason}); replace or remove it, "
                             f"or pass --skip-corrupt (skip_corrupt=True) to predict the other "
                             f"images and list the unreadable ones")
        else:
            bad.append(item)
    if not good:
        raise ValueError(f"none of the {len(items)} input image(s) is readable (first: "
                         f"{bad[0]})")
    return good, bad


def standardized_already(x: np.ndarray, preprocess: dict, where) -> bool:
    """Warn (and return True) when a run standardises its raw features and ``x`` (N x D, at
    least 20 rows) looks standardised already: its columns' spreads are closer to 1 than to
    the train rows' raw spreads, which differ from 1 by 2x or more. Predicting from such
    features standardises them twice (``load_splits(...).test.x`` are the model's inputs, not
    raw rows: ``load_dataset(...).test.x`` are)."""
    import warnings

    if not preprocess or len(x) < 20:
        return False
    run_std = np.asarray(preprocess["std"], dtype=np.float64).ravel()
    sample = x[:: max(1, len(x) // 5000)]  # ~5000 rows: enough to tell, no copy of them all
    given = np.asarray(sample, dtype=np.float64).std(axis=0)
    ok = (run_std > 0) & (given > 0) & np.isfinite(given)
    if not ok.any():
        return False
    to_raw = np.median(np.abs(np.log(given[ok] / run_std[ok])))
    to_unit = np.median(np.abs(np.log(given[ok])))
    far = np.median(np.abs(np.log(run_std[ok])))
    if far < np.log(2) or to_unit >= to_raw:
        return False
    warnings.warn(f"{where}: these features look standardised already (column spreads about "
                  f"{np.median(given[ok]):.3g}; the train rows' raw features: about "
                  f"{np.median(run_std[ok]):.3g}): spml predict standardises raw features "
                  f"with the train rows' statistics, so these would be standardised twice; "
                  f"give raw feature rows (spmlkit.loading.load_dataset(...), not load_splits)",
                  stacklevel=3)
    return True


def run_decoder(config: dict, size: int):
    """The image reader that decodes new images as the run (``config.json``) decoded its val
    and test images: ``--jpeg-draft`` runs JPEGs at the smallest libjpeg scale still at least
    ``size`` (`spmlkit.data.image_files.DraftReader`; other files as they are), else ``None``
    (the full decode). A ``--gpu-decode`` run's images are decoded in full on the CPU: nvJPEG's
    pixels differ from PIL's by a few levels, as its val pixels did."""
    from .data.image_files import DraftReader

    return DraftReader(size) if "--jpeg-draft" in (config.get("acceleration") or []) else None


def rule_settings(run, rule: str, k: float | None = None) -> dict:
    """What threshold rule ``rule`` (`spmlkit.thresholds.RULES`) uses for run ``run``:
    ``k`` given, or the run's ``k`` (config.json: the expected positives per row, EPR / ROLE's
    k) for ``rcut`` / ``lcard``; for ``pcut`` the priors the run's loss estimated (CRISP's
    ``priors``), else the positive rates of the val labels (``predictions.npz``; partial ones
    over the known rows), with where they came from.

    Raises:
        ValueError: an unknown rule, ``k`` for a rule without one, a given ``k`` that is not
            a whole number >= 1 (rcut) or not > 0 (lcard).
    """
    from .thresholds import RULES

    run = Path(run)
    if rule not in RULES:
        raise ValueError(f"unknown threshold rule {rule!r}; choose one of {', '.join(RULES)}")
    if rule in ("rcut", "lcard"):
        if k is None:
            from .runs import read_run

            k = read_run(run).config.get("k")
            if isinstance(k, bool) or not isinstance(k, (int, float)) or \
                    not (np.isfinite(k) and k > 0):
                raise ValueError(f"{run / 'config.json'}: the run's k is {k!r}, not a number "
                                 f"> 0 (damaged or edited?); give --threshold-k")
            return {"rule": rule, "k": float(k), "k_from": "the run's k (config.json)"}
        k = float(k)
        if rule == "rcut" and not (np.isfinite(k) and k >= 1 and k == int(k)):
            raise ValueError(f"rcut takes each row's k highest-scored labels: k "
                             f"(--threshold-k) must be a whole number >= 1, got {k:g}")
        if not (np.isfinite(k) and k > 0):
            raise ValueError(f"lcard matches a mean of k labels per row: k (--threshold-k) "
                             f"must be > 0, got {k:g}")
        return {"rule": rule, "k": k, "k_from": "given"}
    if k is not None:
        raise ValueError(f"threshold rule {rule} does not use k (--threshold-k): rcut and "
                         f"lcard do")
    if rule == "mcut":
        return {"rule": rule}
    from .safe_load import load_torch

    state = load_torch(run / "best.pt").get("loss") or {}
    priors = state.get("priors") if isinstance(state, dict) else None
    if isinstance(priors, torch.Tensor) and priors.numel() and bool((priors >= 0).all()):
        return {"rule": rule, "priors": priors.double().tolist(),
                "priors_from": "the run's loss (estimated class priors)"}
    from .runs import load_arrays

    y = np.asarray(load_arrays(run / PREDICTIONS_FILE, ("y_val",))["y_val"])
    known = y != 0 if (y < 0).any() else np.ones(y.shape, dtype=bool)  # partial: 1 / -1 known
    rates = ((y == 1) & known).sum(axis=0) / np.maximum(known.sum(axis=0), 1)
    return {"rule": rule, "priors": rates.tolist(), "priors_from": "the val labels' rates"}


def predict_run(run, inputs, threshold: str = "global", *, device: str = "cpu",
                batch_size: int = 64, num_workers: int = 0,
                skip_corrupt: bool = False, rule: str | None = None,
                rule_k: float | None = None, coverage: float | None = None) -> Predictions:
    """Probabilities and thresholded labels of ``inputs`` from the run folder ``run``.

    Args:
        run: a run folder (``spml train`` output).
        inputs: feature files (linear runs) or image files / folders.
        threshold: ``"global"``, ``"per-class"`` or a number in [0, 1].
        rule, rule_k: a threshold rule of `spmlkit.thresholds` instead of ``threshold``
            (``rcut``, ``lcard``, ``pcut``, ``mcut``; `rule_settings`), its ``k``.
        coverage: instead of ``threshold`` and ``rule``: per-class thresholds calibrated on the
            run's val rows so that each class's sets hold this share (in (0, 1)) of its true
            positives (`run_coverage`; the guarantee and its assumption: `spmlkit.coverage`).
        device, batch_size, num_workers: for image inputs.
        skip_corrupt: image inputs are decoded once before any is predicted; an unreadable one
            raises (named), or with ``skip_corrupt`` is left out and listed in
            ``Predictions.skipped``.

    Raises:
        FileNotFoundError: the run folder, its checkpoint or an input is missing.
        ValueError: inputs of the wrong kind or width, an unreadable image (named), a bad
            threshold.
    """
    from .engine import TrainConfig, predict_items

    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    inputs = [str(i) for i in inputs]
    if not inputs:
        raise ValueError("no input given")
    if rule is not None and threshold != "global":
        raise ValueError("give a threshold (--threshold) or a threshold rule (--threshold-rule), "
                         "not both")
    if coverage is not None and (rule is not None or threshold != "global"):
        raise ValueError("give a coverage (--coverage) or a threshold (--threshold / "
                         "--threshold-rule), not both: the coverage sets the thresholds")
    if rule is None and rule_k is not None:
        raise ValueError("k (--threshold-k) is for the threshold rules rcut and lcard; give "
                         "--threshold-rule")
    conformal = run_coverage(run, coverage) if coverage is not None else None
    model, info = load_run_model(run)
    names, num_classes = info["class_names"], info["num_classes"]
    thresholds, kind = run_thresholds(run, threshold) if conformal is None else \
        (conformal.thresholds, "per-class")
    if conformal is not None and len(conformal.thresholds) != num_classes:
        raise ValueError(f"{Path(run) / PREDICTIONS_FILE}: its val arrays have "
                         f"{len(conformal.thresholds)} classes, the run's model {num_classes}")
    if thresholds is None:
        thresholds = np.array([float(threshold)])
    if kind != "per-class":
        thresholds = np.full(num_classes, float(thresholds[0]))
    elif len(thresholds) != num_classes:
        raise ValueError(f"{Path(run) / THRESHOLDS_FILE} has {len(thresholds)} per-class "
                         f"thresholds for {num_classes} classes")
    features = [i for i in inputs if i.lower().endswith(FEATURE_SUFFIXES) or table_kind(i)]
    if info["inputs"] == "features" and features and len(features) != len(inputs):
        raise ValueError("give either feature files (.npy/.npz) or tables (.csv/.parquet), or "
                         "images, not both")
    if info["inputs"] == "features":
        if not features:
            tables = " or .csv/.parquet tables" if info.get("feature_columns") else ""
            raise ValueError(f"{inputs[0]}: this linear run was trained on feature vectors, "
                             f"not on a backbone's features of images: give .npy/.npz feature "
                             f"files{tables} as inputs")
        mats, items = [], []
        for f in features:
            if table_kind(f):
                if not info.get("feature_columns"):
                    raise ValueError(f"{f}: this run was not trained on a table's columns (the "
                                     f"tabular source), so it cannot pick features from a "
                                     f"table by name: give .npy/.npz feature files")
                m, rows = read_feature_table(f, info["feature_columns"], info.get("id_column"))
            else:
                m = read_feature_file(f)
                rows = [f"{f}#{r}" for r in range(len(m))]
            if m.shape[1] != info["in_features"]:
                raise ValueError(f"{f}: features are {m.shape[1]}-d, the run's head takes "
                                 f"{info['in_features']}-d features")
            mats.append(m)
            items += rows
        raw = np.concatenate(mats)
        standardized_already(raw, info["preprocess"], inputs[0])
        x = preprocess_features(torch.from_numpy(raw), info["preprocess"])
        with torch.no_grad():
            probs = torch.sigmoid(model(x)).numpy()
    else:
        lists = [f for f in features if Path(f).suffix.lower() in (".csv", ".tsv")]
        if len(lists) != len(features):
            raise ValueError(f"this is a {info['mode']} run: it predicts from images (files, "
                             f"folders, or a CSV listing image paths), not from feature files "
                             f"or tables ({[f for f in features if f not in lists][0]})")
        from .data.transforms import eval_transform

        items, skipped = _readable(_expand_images(_image_lists(
            inputs, lists, info["config"].get("dataset_options"))), skip_corrupt)
        size, mean, std = info["image_size"], info["mean"], info["std"]
        cfg = TrainConfig(epochs=1, device=device, eval_batch_size=batch_size,
                          num_workers=num_workers, image_size=size)
        logits = predict_items(model, items, cfg, transform=eval_transform(size, mean, std),
                               image_reader=run_decoder(info["config"], size))
        probs = torch.sigmoid(logits).cpu().numpy()
    pred = Predictions(items, probs.astype(np.float32), names, thresholds, kind,
                       skipped if info["inputs"] != "features" else [])
    if conformal is not None:
        pred.threshold_kind, pred.conformal = f"coverage {conformal.coverage:g}", conformal
    if rule is not None:
        from .thresholds import apply_rule

        settings = rule_settings(run, rule, rule_k)
        pred.rule, pred.threshold_kind = settings, f"rule {rule}"
        pred.decided = apply_rule(rule, pred.probs, k=settings.get("k"),
                                  priors=settings.get("priors"))
    return pred


def write_predictions(pred: Predictions, fmt: str = "csv", out=None, run=None, *,
                      force: bool = False, protect=()) -> str:
    """The predictions as CSV or JSON text, written atomically to ``out`` when given (never over
    an existing file unless ``force``, never over ``protect`` nor a run's own files:
    `spmlkit.safe_write.write_output`)."""
    if fmt not in ("csv", "json"):
        raise ValueError(f"format must be 'csv' or 'json', got {fmt!r}")
    text = pred.to_csv() if fmt == "csv" else pred.to_json(run)
    if out is not None:
        write_output(out, text, force=force, protect=protect)
    return text
