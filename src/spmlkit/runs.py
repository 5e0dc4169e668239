"""Run folders: the one writer and the one reader.

A run folder is created once (never overwritten: a taken name gets ``-2``, ``-3``, ...) and
every file in it is written atomically (`spmlkit.safe_write`). Every training method writes the
same files through `RunDir`:

- ``config.json``: the resolved configuration (`RunDir.start`);
- ``observed.npy``: the observed train labels;
- ``metrics.jsonl``: one JSON line per epoch (`RunDir.log`);
- ``checkpoint.pt``: the resumable state while the run trains (`RunDir.checkpointer`),
  removed when it finishes;
- ``best.pt``: the best epoch's weights, what rebuilds the model, and the preprocessing its
  inputs need (``preprocess``: the train statistics that standardised the features);
- ``predictions.npz``: the best epoch's probabilities and the labels (for the analyses);
- ``thresholds.json``: decision thresholds chosen on val (for ``spml predict``);
- ``final.json``: the result, written last: a folder without it is not finished;
- ``failed.json``: written instead when the run raised (the error and its traceback);
- ``train_probs.npy``: train probabilities after every epoch, when asked for.

`read_run` reads a folder back (`Run`); `read_config`, `read_metrics`,
`read_predictions` read one file each, checked (a missing file is named with the command
that writes it: `run_file`); every checkpoint load goes through `load_torch`
(``weights_only=True``).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .checkpointing import Checkpointer
from .safe_write import append_own, check_own_file, json_default, make_folder, open_own, \
    sync_folder, write_atomic, write_json, write_text
# the checked readers every run-folder read uses (spmlkit.safe_load), importable from here too
from .safe_load import check_array_file, load_array, load_arrays, load_torch  # noqa: F401

#: a name that is one folder inside its parent: what run, study and dataset names must be
SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
CONFIG_FILE = "config.json"
OBSERVED_FILE = "observed.npy"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
BEST_FILE = "best.pt"
THRESHOLDS_FILE = "thresholds.json"
FINAL_FILE = "final.json"
FAILED_FILE = "failed.json"
#: the best epoch's probabilities (float32, so their AP is the reported one) and the labels,
#: written at the end of ``train_run(out=...)`` for `spmlkit.analysis`
PREDICTIONS_FILE = "predictions.npz"
#: eval-mode train probabilities after every epoch (epochs x N x L, float16), written with
#: ``train_run(..., save_train_probs=True)`` (``spml train --save-train-probs``)
TRAIN_PROBS_FILE = "train_probs.npy"


def _savez_fast(fh, arrays: dict) -> None:
    """An ``.npz`` as ``np.savez_compressed(fh, **arrays)`` writes it (``np.load`` reads it
    the same), but its floating-point members stored as they are and the others deflated at
    level 1: a run's probabilities shrink by ~12% at numpy's level 6, for most of the time
    the file takes (yeast: 0.5 ms instead of 6.6 ms, 146 KB instead of 125 KB)."""
    import zipfile

    with zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for key, value in arrays.items():
            value = np.asanyarray(value)
            member = f"{key}.npy"
            if value.dtype.kind in "fc":
                member = zipfile.ZipInfo(member, date_time=time.localtime()[:6])
                member.compress_type = zipfile.ZIP_STORED
            with zf.open(member, "w", force_zip64=True) as out:
                np.lib.format.write_array(out, value, allow_pickle=False)


def _epochs_of(lines: list[str]) -> list:
    """The ``epoch`` of each JSON line (None for one that is not a record)."""
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        out.append(record.get("epoch") if isinstance(record, dict) else None)
    return out


def checkpoint_history(state) -> list | None:
    """The epoch records a resumable state holds, in the order they were logged: a train
    loop's ``history``; for linear_init's ``{"phase", "state"}`` the linear phase's epochs
    (from ``linear_result`` once fine-tuning started) and then the phase's own. None when
    the state holds none."""
    if not isinstance(state, dict):
        return None
    if "phase" in state and isinstance(state.get("state"), dict):
        own = state["state"].get("history")
        linear = (state.get("linear_result") or {}).get("history") or []
        phase = state["phase"]
        if not isinstance(own, list):
            return None
        return [{**h, "phase": "linear"} for h in linear] + [{**h, "phase": phase} for h in own]
    history = state.get("history")
    return history if isinstance(history, list) else None


def _strict_json(record: dict) -> dict:
    """``record`` with its NaN / infinite float values as None (``null`` in JSON)."""
    return {k: None if isinstance(v, (float, np.floating)) and not np.isfinite(v) else v
            for k, v in record.items()}


class RunDir:
    """One run's folder. ``RunDir.create(root, name)`` never reuses an existing folder: if
    ``root/name`` exists it takes ``name-2``, ``name-3``, ... (``os.mkdir`` is atomic).

    Every file is written atomically (a temporary file, then a rename: a killed process leaves
    no half-written file). Only the files a later step relies on after a machine crash are
    synced to disk one by one: ``checkpoint.pt`` (a resume reads it), ``failed.json`` and, last,
    ``final.json`` with the folder itself; the others (``config.json``, ``observed.npy``,
    ``best.pt``, ``predictions.npz``, ``thresholds.json``) are published without a sync of
    their own, which saves five of the six disk syncs of a run (~0.4-3.5 ms each here, a
    good part of a stacked linear run's time). A machine crash (not a killed process) soon
    after a run finished may therefore leave a folder whose ``final.json`` is there while the
    content of one of those files is lost.
    """

    def __init__(self, path):
        self.path = Path(path)

    @classmethod
    def create(cls, root, name: str) -> "RunDir":
        if not SLUG.fullmatch(name):  # never a folder outside root
            raise ValueError(f"run name {name!r}: expected a slug (letters, digits, . _ -, "
                             f"starting with a letter or digit), not a path")
        root = make_folder(root)
        for i in range(1, 10_000):
            path = root / (name if i == 1 else f"{name}-{i}")
            try:
                os.mkdir(path)
                return cls(path)
            except FileExistsError:
                continue
        raise RuntimeError(f"could not find a free run name under {root} for {name!r}")

    def write_json(self, name: str, obj, durable: bool = False) -> None:
        write_json(self.path / name, obj, durable=durable)

    def append_jsonl(self, name: str, obj) -> None:
        append_own(self.path / name, json.dumps(obj, default=json_default) + "\n")

    def save_array(self, name: str, arr) -> None:
        write_atomic(self.path / name, lambda fh: np.save(fh, np.asarray(arr)), durable=False)

    def save_npz(self, name: str, **arrays) -> None:
        """Several arrays in one ``.npz`` (read back with ``np.load``): labels deflated,
        floating-point arrays stored (`_savez_fast`)."""
        write_atomic(self.path / name, lambda fh: _savez_fast(fh, arrays), durable=False)

    def save_torch(self, name: str, obj, durable: bool = True) -> None:
        import torch

        write_atomic(self.path / name, lambda fh: torch.save(obj, fh), durable=durable)

    @contextlib.contextmanager
    def locked(self):
        """This process alone trains in the folder while the block runs (an exclusive
        ``flock`` on ``.lock``, never through a link; removed at the end): a second
        ``spml train --resume`` of the same folder is refused at once instead of interleaving
        its epochs into ``metrics.jsonl``. Not POSIX: no lock."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            yield
            return
        path = self.path / ".lock"
        fd = open_own(path, os.O_RDWR | os.O_CREAT)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise ValueError(f"{self.path} is being trained by another process (it holds "
                                 f"{path}); wait for it to end, or stop it first") from None
            try:
                yield
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        finally:
            os.close(fd)

    # ---- the run's life: start, epochs, checkpoints, finish or fail ---------------------------
    def start(self, config: dict, observed) -> None:
        """``config.json`` and ``observed.npy`` of a new run."""
        self.write_json(CONFIG_FILE, config)
        self.save_array(OBSERVED_FILE, observed)

    def log(self, record: dict) -> None:
        """One epoch's record, appended to ``metrics.jsonl``: a NaN or infinite number is
        written as ``null`` (strict JSON, as final.json: an undefined pseudo-label precision)."""
        self.append_jsonl(METRICS_FILE, _strict_json(record))

    def checkpointer(self, every_seconds: float = 0.0,
                     background: bool = True) -> "Checkpointer":
        """The ``checkpoint`` callable of the engine's fit functions
        (`spmlkit.checkpointing.Checkpointer`): called after every epoch with a function that
        builds the resumable state; writes ``checkpoint.pt`` when at least ``every_seconds``
        have passed since the last write (0: every epoch), so short runs do not pay for states
        they will never resume from. With ``background`` the state is copied to host memory at
        once and written (and synced) by a thread while the next epoch trains; call its
        ``wait()`` before the run's folder is finished or failed."""
        return Checkpointer(lambda state: self.save_torch(CHECKPOINT_FILE, state),
                            every_seconds, background)

    def resume_state(self, trim_metrics: bool = True):
        """The state in ``checkpoint.pt`` (None without one); with ``trim_metrics``,
        ``metrics.jsonl`` is cut back to the epochs it holds (an epoch logged after its
        checkpoint must not appear twice)."""
        path = self.path / CHECKPOINT_FILE
        if not path.is_file():  # killed before its first checkpoint: start again
            if trim_metrics:
                write_text(self.path / METRICS_FILE, "")
            return None
        state = load_torch(path)
        history = checkpoint_history(state)
        if trim_metrics and history is not None:
            lines = (self.path / METRICS_FILE).read_text().splitlines(keepends=True) \
                if (self.path / METRICS_FILE).is_file() else []
            if _epochs_of(lines[:len(history)]) == [h.get("epoch") for h in history]:
                kept = "".join(lines[:len(history)])  # as logged, up to the checkpoint's epochs
            else:
                kept = "".join(json.dumps(_strict_json(h), default=json_default) + "\n"
                               for h in history)
            write_text(self.path / METRICS_FILE, kept)
        return state

    def finish(self, result: dict, best: dict, predictions: dict,
               thresholds: dict | None = None, durable: bool = True) -> None:
        """Write ``best.pt``, ``predictions.npz``, ``thresholds.json`` and, last,
        ``final.json``; then drop the resumable checkpoint. ``durable=False``: the caller
        syncs (`sync_files` once for many runs finished together) instead of an
        ``fsync`` of ``final.json`` and the folder here."""
        self.save_torch(BEST_FILE, best, durable=False)
        self.save_npz(PREDICTIONS_FILE, **predictions)
        if thresholds is not None:
            self.write_json(THRESHOLDS_FILE, thresholds)
        self.write_json(FINAL_FILE, result, durable=durable)
        if durable:
            sync_folder(self.path)  # the renames, final.json's included
        (self.path / CHECKPOINT_FILE).unlink(missing_ok=True)

    def clear_failure(self) -> None:
        """A resumed run is no longer failed (``failed.json`` removed)."""
        (self.path / FAILED_FILE).unlink(missing_ok=True)

    def fail(self, err: BaseException) -> None:
        """Record that the run raised ``err`` (``failed.json``): the folder then says so
        instead of looking like a run that is still going."""
        self.write_json(FAILED_FILE, {
            "error": f"{type(err).__name__}: {err}",
            "traceback": "".join(traceback.format_exception(type(err), err,
                                                            err.__traceback__))[-6000:]},
            durable=True)


@dataclass
class Run:
    """A run folder read back (`read_run`)."""

    path: Path
    config: dict
    final: dict | None        # None while the run is unfinished
    failed: dict | None       # failed.json, if the run raised

    @property
    def status(self) -> str:
        """``finished``, ``failed`` or ``unfinished`` (running, or killed)."""
        if self.final is not None:
            return "finished"
        return "failed" if self.failed is not None else "unfinished"

    @property
    def method(self) -> str:
        return str(self.config.get("mode", "linear"))

    def best(self) -> dict:
        """``best.pt`` (weights_only load); errors that name what is missing."""
        path = self.path / BEST_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: the run did not finish ({BEST_FILE}"
                                    f" is written at the end of spml train)")
        best = load_torch(path)
        for key in ("model", "num_classes", "class_names"):
            if key not in best:
                raise ValueError(f"{path} has no {key!r} entry: not a spmlkit run checkpoint")
        return best

    def metrics(self) -> list[dict]:
        """The per-epoch records of ``metrics.jsonl`` (``[]`` without the file; checked as
        `read_metrics`)."""
        path = self.path / METRICS_FILE
        return _parse_metrics(path) if path.is_file() else []


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err}); is the run folder complete?") \
            from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a text file ({err.reason} at byte {err.start}); the "
                         f"file is damaged or is not spmlkit's") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a file spmlkit wrote") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


#: the types of the config.json entries that readers use (a received folder may be damaged)
_CONFIG_TYPES = {"mode": str, "dataset": str, "regime": str, "loss": str, "hparams": dict,
                 "train": dict, "options": dict, "dataset_options": (dict, type(None)),
                 "class_names": list, "k": (int, float, str, type(None))}
#: TrainConfig entries of ``train`` and their types
_TRAIN_TYPES = {"epochs": int, "batch_size": int, "lr": (int, float), "seed": int}


def _check_config(path: Path, config: dict) -> None:
    """``config.json``'s entries have the types spmlkit wrote (``ValueError`` naming the key)."""
    def name(types):
        types = types if isinstance(types, tuple) else (types,)
        return " or ".join({"NoneType": "null", "dict": "an object", "list": "a list",
                            "str": "a string", "int": "a whole number",
                            "float": "a number"}[t.__name__] for t in types)

    def bad(value, types):
        return not isinstance(value, types) or (isinstance(value, bool) and bool not in (
            types if isinstance(types, tuple) else (types,)))

    for key, types in _CONFIG_TYPES.items():
        if key in config and bad(config[key], types):
            raise ValueError(f"{path}: {key!r} must be {name(types)}, got "
                             f"{config[key]!r:.100}; the run folder is damaged")
    train = config.get("train") or {}
    for key, types in _TRAIN_TYPES.items():
        if key in train and bad(train[key], types):
            raise ValueError(f"{path}: 'train.{key}' must be {name(types)}, got "
                             f"{train[key]!r:.100}; the run folder is damaged")
    names = config.get("class_names") or []
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: 'class_names' must be a list of strings; the run folder is "
                         f"damaged")


def read_run(path) -> Run:
    """Read the run folder ``path``: its config, and its result or failure if any.

    Raises:
        FileNotFoundError: ``path`` is not a folder, or has no ``config.json``.
        FileExistsError: its ``config.json`` is a link, a device, a FIFO (`check_own_file`).
        ValueError: a file in it is not valid JSON (named).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"run folder {path} does not exist (give the folder spml train "
                                f"printed as 'run folder: ...')")
    check_own_file(path / CONFIG_FILE)  # a link, a device, a FIFO there: named
    if not (path / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{path / CONFIG_FILE} does not exist: {path} is not a run "
                                f"folder")
    final, failed = path / FINAL_FILE, path / FAILED_FILE
    config = _read_json(path / CONFIG_FILE)
    _check_config(path / CONFIG_FILE, config)
    return Run(path, config,
               _read_json(final) if final.is_file() else None,
               _read_json(failed) if failed.is_file() else None)


# ---- one file of a run folder, checked ---------------------------------------------------------
#: the splits of ``predictions.npz`` (``probs_<split>``, ``y_<split>``)
SPLITS = ("train", "val", "test")

#: which command writes each run-folder file (quoted by the errors for a missing file)
PRODUCERS = {
    CONFIG_FILE: "every run folder has it; it is written by `spml train` "
                 "(spmlkit.methods.train_run(out=...))",
    METRICS_FILE: "it is written during training by `spml train` (train_run(out=...))",
    PREDICTIONS_FILE: "it is written at the end of `spml train` (train_run(out=...)); a run "
                      "trained before this file existed, or one that did not finish, has to "
                      "be trained again",
    TRAIN_PROBS_FILE: "it is written only by `spml train --save-train-probs` "
                      "(train_run(..., save_train_probs=True)); train the run again with that "
                      "flag",
}


def run_file(run_dir, name: str) -> Path:
    """Path of ``name`` in a run folder; ``FileNotFoundError`` naming the file and the command
    that writes it when it is missing."""
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"run folder {run} does not exist (give the folder that "
                                f"`spml train` printed as 'run folder: ...')")
    path = run / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {PRODUCERS.get(name, 'no command writes it')}")
    return path


def read_config(run_dir) -> dict:
    """``config.json``, read and checked (`read_run`: damaged entries are named)."""
    run_file(run_dir, CONFIG_FILE)  # missing: says which command writes it
    return read_run(run_dir).config


def json_lines(path: Path, growing: bool = False):
    """``(line number, record)`` of each non-blank line of a JSON-lines file; a ValueError
    names a line that is not JSON. ``growing``: the file may be being written (a run that
    trains now, one killed mid-write), so a last line that is not JSON is left out."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a text file ({err.reason} at byte {err.start})") \
            from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as err:
            if growing and i == len(lines):
                return
            raise ValueError(f"{path}, line {i}: not a JSON record ({err.msg})") from None
        except RecursionError:
            raise ValueError(f"{path}, line {i}: nested too deeply to be a record spmlkit "
                             f"wrote") from None


def _parse_metrics(path: Path, growing: bool = False) -> list[dict]:
    records = []
    for i, record in json_lines(path, growing):
        if not isinstance(record, dict):
            raise ValueError(f"{path}, line {i}: expected a JSON object, got "
                             f"{type(record).__name__}")
        for key in ("epoch", "train_loss", "val_map", "test_map"):
            value = record.get(key)
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, float))):
                raise ValueError(f"{path}, line {i}: {key!r} must be a number, got "
                                 f"{value!r:.100}")
        records.append(record)
    return records


def read_metrics(run_dir, growing: bool = False) -> list[dict]:
    """The per-epoch records of ``metrics.jsonl`` (an undefined number is None; files of
    earlier versions may hold ``NaN``, read back as float NaN); a
    line that is not a JSON object, or whose epoch / loss / mAP is not a number, is named.
    ``growing``: the run may be training now (a half-written last line is left out,
    `json_lines`)."""
    return _parse_metrics(run_file(run_dir, METRICS_FILE), growing)


def read_predictions(run_dir, probs=SPLITS) -> dict:
    """The arrays of ``predictions.npz``: ``probs_{train,val,test}``, ``y_{train,val,test}``,
    ``observed`` and ``best_epoch``; shapes checked (N x L, ``observed`` as ``y_train``).

    ``probs``: the splits whose probabilities the caller reads. A run trained with
    ``TrainConfig(train_predictions=False)`` (``spml benchmark``'s default) kept val's and
    test's only: asking for train's then raises a ``ValueError`` that says how to keep them."""
    path = run_file(run_dir, PREDICTIONS_FILE)
    expected = sorted({f"y_{s}" for s in SPLITS} | {f"probs_{s}" for s in probs if s != "train"}
                      | {"observed"})
    arrays = load_arrays(path, expected, PRODUCERS[PREDICTIONS_FILE])
    if "train" in probs and "probs_train" not in arrays:
        raise ValueError(f"{path}: this run kept no train probabilities (trained with "
                         f"train_predictions=False, spml benchmark's default); spml benchmark "
                         f"--train-predictions or spml train keep them")
    for s in probs:  # what the analyses index: N x L, probabilities and labels alike
        probs, y = arrays[f"probs_{s}"], arrays[f"y_{s}"]
        if probs.ndim != 2 or probs.shape != y.shape:
            raise ValueError(f"{path}: probs_{s} has shape {probs.shape} and y_{s} "
                             f"{y.shape}; expected the same N x L shape")
    if arrays["observed"].shape != arrays["y_train"].shape:
        raise ValueError(f"{path}: observed has shape {arrays['observed'].shape}, y_train "
                         f"{arrays['y_train'].shape}; expected the same shape")
    return arrays
