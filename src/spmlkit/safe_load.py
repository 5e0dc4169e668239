"""Reading files that someone may have handed you, safely: a checkpoint loads tensors, numbers
and strings only (never pickled code: `load_torch`), and an array file's headers are checked
against the data it holds before numpy allocates what they claim (`check_array_file`,
`load_arrays`, `load_array`). Every run-folder reader and every user's array goes through these.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

__all__ = ["check_array_file", "load_array", "load_arrays", "load_torch"]


def load_torch(path, map_location="cpu", remedy: str = "train the run again") -> dict:
    """A ``torch.save`` file of a run folder, loaded with ``weights_only=True``: tensors,
    numbers, strings and containers only, never pickled code, so a run folder received from
    someone else cannot run anything. A file that needs more is refused with a clear error;
    one that is no torch file says ``remedy`` (what to do about it)."""
    import pickle

    import torch

    import zipfile

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    if zipfile.is_zipfile(path):  # torch.save's format: a zip of stored tensors
        try:
            with zipfile.ZipFile(path) as zf:
                check_zip_entries(zf, path)
        except (zipfile.BadZipFile, OSError) as err:
            raise ValueError(f"{path}: not a readable checkpoint ({err}); {remedy}") from None
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        text = str(err)
        found = re.search(r"\bGLOBAL (\S+)", text)
        if found is None:  # not a torch file at all
            raise ValueError(f"{path}: not a readable checkpoint (UnpicklingError); "
                             f"{remedy}") from None
        raise ValueError(f"{path}: refused: it refers to {found.group(1)}, which loading "
                         f"would import and could run code; a spmlkit checkpoint holds only "
                         f"tensors, numbers and strings (load a file you trust with torch.load "
                         f"yourself)") from None
    except (RuntimeError, EOFError, OSError, IndexError, KeyError, ValueError) as err:
        # (garbage read as a pickle fails in many ways: "pop from empty list", ...)
        first = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(f"{path}: not a readable checkpoint ({type(err).__name__}: "
                         f"{first[:200]}); {remedy}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a dict of tensors and values, got "
                         f"{type(obj).__name__}")
    return obj


def _human(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if nbytes < 1024:
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.3g} x 1024 EiB"


def _check_npy_header(fh, size: int, where: str) -> None:
    """The ``.npy`` header read from ``fh`` (at its start; ``size`` bytes in all) describes
    an array the file can hold: a numeric dtype, and no more data than the file has."""
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(fh)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError(f"format version {version[0]}.{version[1]}, which numpy does not "
                             f"write")
        # (3.0 is 2.0 with a UTF-8 header; numpy writes it only for non-ASCII field names)
        read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, _, dtype = read(fh, max_header_size=100_000)
    except (ValueError, EOFError, OSError, SyntaxError) as err:
        raise ValueError(f"{where}: not a readable .npy array ({err})") from None
    if dtype.hasobject:
        raise ValueError(f"{where}: holds Python objects (dtype {dtype}), which are not loaded "
                         f"(they could run code); save a numeric array")
    count = 1
    for n in shape:
        count *= int(n)
    need, have = count * dtype.itemsize, size - fh.tell()
    if need > have:
        raise ValueError(f"{where}: its header claims an array of shape {tuple(shape)} "
                         f"({dtype}, {_human(need)}) but the file holds {_human(have)} of "
                         f"data: a truncated or damaged file")


def check_array_file(path) -> None:
    """Check a ``.npy`` / ``.npz`` file before numpy loads it (a header claiming a huge shape
    would make numpy allocate it first): each array header's shape fits the data there is.
    Raises ``ValueError`` naming the file (and the array of an ``.npz``); a file that is
    neither format is named too (numpy would say only that it holds pickled data)."""
    import zipfile

    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(6)
        if head == b"\x93NUMPY":
            fh.seek(0)
            _check_npy_header(fh, os.fstat(fh.fileno()).st_size, str(path))
            return
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not a readable .npy or .npz file (it does not start as one)")
    try:
        with zipfile.ZipFile(path) as zf:
            check_zip_entries(zf, path)
            for info in zf.infolist():  # numpy loads every member, whatever its name
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                with zf.open(info) as fh:
                    if fh.read(6) != b"\x93NUMPY":
                        raise ValueError(f"{path}: member {info.filename!r} is not a .npy "
                                         f"array; an .npz of spmlkit holds arrays only")
                    fh.seek(0)
                    _check_npy_header(fh, info.file_size, f"{path}, array {name!r}")
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise ValueError(f"{path}: not a readable .npz file ({err})") from None


#: a zip member larger than this, unpacked, must not expand more than `MAX_EXPANSION` times
#: (a few MB of zeros that claim gigabytes: a compression bomb; deflate's own limit is about
#: 1,030 times)
BIG_MEMBER = 1 << 30
MAX_EXPANSION = 500


def check_zip_entries(zf, path) -> None:
    """Refuse a zip member (an ``.npz`` array, a torch checkpoint's tensor) that unpacks to
    more than `BIG_MEMBER` bytes from a `MAX_EXPANSION`-th of that or less: spmlkit's files
    store floating-point data uncompressed; their label matrices deflate about 70 times at
    1,000 classes and 165 times at 5,000 (level 1)."""
    for info in zf.infolist():
        if info.file_size > BIG_MEMBER and \
                info.file_size > MAX_EXPANSION * max(info.compress_size, 1):
            raise ValueError(f"{path}: member {info.filename!r} unpacks to "
                             f"{_human(info.file_size)} from {_human(info.compress_size)}: "
                             f"a compression bomb, or not a file spmlkit wrote; not loaded")


def load_arrays(path, keys=(), what: str = "") -> dict:
    """The arrays of the ``.npz`` file ``path`` (checked first: `check_array_file`),
    all of them loaded; ``keys`` that must be there (the message names the missing ones and
    ``what`` writes the file)."""
    path = Path(path)
    check_array_file(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, EOFError, ValueError) as err:
        raise ValueError(f"{path}: not a readable .npz file ({err})") from None
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise ValueError(f"{path} lacks the array(s) {missing}" + (f"; {what}" if what else ""))
    return arrays


def load_array(path, mmap_mode: str | None = None) -> np.ndarray:
    """The array of the ``.npy`` file ``path``, checked first (`check_array_file`)."""
    path = Path(path)
    check_array_file(path)
    try:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (OSError, EOFError, ValueError) as err:
        raise ValueError(f"{path}: not a readable .npy file ({err})") from None
