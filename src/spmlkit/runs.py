"""Run folders: created once, files written atomically, never overwritten.

A run folder holds ``config.json`` (the resolved configuration), ``observed.npy`` (the observed
train labels), ``metrics.jsonl`` (one JSON line per epoch), ``final.json``, ``best.pt``,
``predictions.npz`` (the best epoch's probabilities and the labels, for the analyses) and, when
asked for, ``train_probs.npy`` (train probabilities after every epoch).
"""
from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np

#: the best epoch's probabilities (float32, so their AP is the reported one) and the labels,
#: written at the end of ``train_one(out=...)`` for :mod:`spmlkit.analysis`
PREDICTIONS_FILE = "predictions.npz"
#: eval-mode train probabilities after every epoch (epochs x N x L, float16), written with
#: ``train_one(..., save_train_probs=True)`` (``spml train --save-train-probs``)
TRAIN_PROBS_FILE = "train_probs.npy"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # what open() would give (mkstemp makes 0600 files)


def make_folder(path) -> Path:
    """``mkdir -p path``; a file in the way raises ``NotADirectoryError`` naming that file
    (``mkdir`` itself says only "File exists")."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise NotADirectoryError(errno.ENOTDIR, "is a file, where a folder is needed",
                                 str(blocker)) from None
    return path


def _atomic(path: Path, write) -> None:
    """Write ``path`` through a temporary file renamed over it; an ``OSError`` names ``path``
    (not the temporary file)."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    make_folder(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:  # e.g. a read-only folder: name the file the caller asked for
        raise type(err)(err.errno, err.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a reader never sees half a file)."""
    data = (json.dumps(obj, indent=2, default=_jsonable) + "\n").encode()
    _atomic(Path(path), lambda fh: fh.write(data))


def write_text(path, text: str) -> None:
    _atomic(Path(path), lambda fh: fh.write(text.encode()))


def _jsonable(obj):
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


def load_torch(path, map_location="cpu") -> dict:
    """A ``torch.save`` file of a run folder, loaded with ``weights_only=True``: tensors,
    numbers, strings and containers only, never pickled code, so a run folder received from
    someone else cannot run anything. A file that needs more is refused with a clear error."""
    import pickle

    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        text = str(err)
        found = re.search(r"unsupported GLOBAL (\S+)", text)
        if found is None:  # not a torch file at all
            raise ValueError(f"{path}: not a readable checkpoint (UnpicklingError); train the "
                             f"run again") from None
        raise ValueError(f"{path}: refused: it refers to {found.group(1)}, which loading "
                         f"would import and could run code; a spmlkit checkpoint holds only "
                         f"tensors, numbers and strings (load a file you trust with torch.load "
                         f"yourself)") from None
    except (RuntimeError, EOFError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(f"{path}: not a readable checkpoint ({type(err).__name__}: "
                         f"{first[:200]}); train the run again") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a dict of tensors and values, got "
                         f"{type(obj).__name__}")
    return obj


class RunDir:
    """One run's folder. ``RunDir.create(root, name)`` never reuses an existing folder: if
    ``root/name`` exists it takes ``name-2``, ``name-3``, ... (``os.mkdir`` is atomic)."""

    def __init__(self, path):
        self.path = Path(path)

    @classmethod
    def create(cls, root, name: str) -> "RunDir":
        root = make_folder(root)
        for i in range(1, 10_000):
            path = root / (name if i == 1 else f"{name}-{i}")
            try:
                os.mkdir(path)
                return cls(path)
            except FileExistsError:
                continue
        raise RuntimeError(f"could not find a free run name under {root} for {name!r}")

    def write_json(self, name: str, obj) -> None:
        write_json(self.path / name, obj)

    def append_jsonl(self, name: str, obj) -> None:
        with open(self.path / name, "a") as fh:
            fh.write(json.dumps(obj, default=_jsonable) + "\n")
            fh.flush()

    def save_array(self, name: str, arr) -> None:
        _atomic(self.path / name, lambda fh: np.save(fh, np.asarray(arr)))

    def save_npz(self, name: str, **arrays) -> None:
        """Several arrays in one compressed ``.npz`` (read back with ``np.load``)."""
        _atomic(self.path / name, lambda fh: np.savez_compressed(fh, **arrays))

    def save_torch(self, name: str, obj) -> None:
        import torch

        _atomic(self.path / name, lambda fh: torch.save(obj, fh))
