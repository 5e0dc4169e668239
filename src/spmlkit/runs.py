"""Run folders: the one writer and the one reader.

A run folder is created once (never overwritten: a taken name gets ``-2``, ``-3``, ...) and
every file in it is written atomically. Every training method writes the same files through
`RunDir`:

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
import errno
import json
import os
import re
import stat
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .checkpointing import Checkpointer
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


#: the files of spmlkit's own folders (a run's, a study's, a feature store's): an output never
#: replaces one of them, even with ``force`` (the folder would be broken)
OWN_FILES = frozenset({CONFIG_FILE, OBSERVED_FILE, METRICS_FILE, CHECKPOINT_FILE, BEST_FILE,
                       THRESHOLDS_FILE, FINAL_FILE, FAILED_FILE, PREDICTIONS_FILE,
                       TRAIN_PROBS_FILE, "skipped_images.json", "enhanced_labels.npy",
                       "results.sqlite", "results.sqlite-wal", "results.sqlite-shm",
                       "results.sqlite-journal", "study.yaml", "launches.jsonl",
                       "sklearn-reference.json", ".lock", "meta.json", "features.npy",
                       "done.npy", "files.npy"})
#: a file that marks a folder as spmlkit's own: a run's, a study's, a feature store's
_OWN_MARKERS = (CONFIG_FILE, "results.sqlite", "meta.json")


def _kind(mode: int) -> str:
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def _lstat(path: Path):
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def check_own_file(path) -> None:
    """The writer rule for a file inside one of spmlkit's own folders (a run's, a study's, a
    feature store's): whatever is there must be a regular file (then it is replaced); a link,
    a device, a FIFO, a folder at that name is refused with an ``OSError`` naming it, never
    written through or over (a folder someone handed you may hold planted links)."""
    st = _lstat(Path(path))
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise FileExistsError(errno.EEXIST, f"is {_kind(st.st_mode)} where spmlkit keeps its "
                              f"own file; spmlkit never writes through or over it (was this "
                              f"folder handed to you? remove it, or start a new folder)",
                              str(path))


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path, *, force: bool = False, protect=()) -> None:
    """The writer rule for an output the user names (``predict --out``, a report, a figure,
    an export): a new name is written; an existing regular file only with ``force``; never a
    link, a device, a FIFO, a folder, a file of spmlkit's own folders (`OWN_FILES` next to
    a run's ``config.json``, a study's ``results.sqlite``, a store's ``meta.json``) or one of
    ``protect`` (the command's inputs), ``force`` or not. Raises ``OSError`` naming ``path``."""
    path = Path(path)
    st = _lstat(path)
    if st is None:
        return
    if not stat.S_ISREG(st.st_mode):
        err = IsADirectoryError if stat.S_ISDIR(st.st_mode) else FileExistsError
        raise err(errno.EEXIST, f"is {_kind(st.st_mode)}, not a regular file: an output is "
                  f"never written through or over it, even with --force; choose another name",
                  str(path))
    if path.name in OWN_FILES and any((path.parent / m).is_file() for m in _OWN_MARKERS):
        raise FileExistsError(errno.EEXIST, f"is a file of spmlkit's own folder "
                              f"{path.parent}: an output never replaces it, even with --force; "
                              f"choose another name", str(path))
    if any(_same_file(path, other) for other in protect):
        raise FileExistsError(errno.EEXIST, "is an input of this command: an output never "
                              "replaces it, even with --force; choose another name", str(path))
    if not force:
        raise FileExistsError(errno.EEXIST, "exists; pass --force to replace it, or choose "
                              "another name", str(path))


def _atomic(path: Path, write, durable: bool = True, output: bool = False,
            force: bool = False, protect=()) -> Path:
    """Write through ``write(fh)`` into a temporary file next to ``path``, then publish it under
    ``path``: the one writer of every file spmlkit writes, so the one place of its rule.
    Without ``output`` the file is one of spmlkit's own (`check_own_file`: a regular file
    there is replaced, anything else refused); with ``output`` it is an output the user named
    (`check_output`: never over an existing file unless ``force``; with ``force``
    still never over a link, a device, a FIFO, a folder, a folder's own files, ``protect``).
    A new output is published with a hard link, which fails when the name was taken meanwhile.
    With ``durable`` the file's data is on disk (``fsync``) before it is published; without,
    the file is still never seen half written (a process killed at any moment leaves the old
    file or the new one), but a machine crash soon after may lose its content (a run folder's
    files: `RunDir.finish` syncs the folder before its ``final.json``). An ``OSError``
    names ``path`` (not the temporary file). Returns ``path``."""
    if output:
        check_output(path, force=force, protect=protect)
    else:
        check_own_file(path)
    make_folder(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:  # e.g. a read-only folder: name the file the caller asked for
        raise type(err)(err.errno, err.strerror, str(path)) from None
    try:
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                if durable:
                    os.fsync(fh.fileno())
        except OSError as err:  # e.g. a full disk: name the file, not the temporary one
            if err.filename is not None:
                raise
            if err.errno is None:  # numpy's short write ("N requested and M written")
                raise _short_write(err, path) from None
            raise type(err)(err.errno, err.strerror, str(path)) from None
        # a replaced file keeps its permissions (a private 0600 file stays private)
        old = _lstat(path)
        os.chmod(tmp, stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode)
                 else _FILE_MODE)
        if output and not force:
            _publish_new(tmp, path)
        else:
            os.replace(tmp, path)
        return path
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _short_write(err: OSError, path: Path) -> OSError:
    """A write that stopped short with no reason given (numpy says only "N requested and M
    written"): said as a full disk when the disk has no free block left."""
    try:
        full = os.statvfs(path.parent).f_bavail == 0
    except OSError:
        full = False
    if full:
        return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (the file was cut short: "
                       f"{err})", str(path))
    return OSError(errno.EIO, f"the file was cut short ({err})", str(path))


_NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV)


def _publish_new(tmp: str, path: Path) -> None:
    """Give the finished file ``tmp`` the name ``path``, which must not exist: a hard link fails
    when the name exists, so two writers never take the same one (where the file system has no
    hard links: checked, then renamed)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        check_output(path)  # taken meanwhile: raises what the name is
        raise
    except OSError as err:
        if err.errno not in _NO_HARD_LINKS:
            raise
        check_output(path)
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def open_own(path, flags: int) -> int:
    """``os.open`` of a file inside spmlkit's own folders (a lock, an appended log), never
    through a link: ``O_NOFOLLOW``, and what is opened must be a regular file (a FIFO or a
    device there is refused, not waited on). Returns the descriptor; an ``OSError`` names
    ``path``."""
    path = Path(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                     0o666)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENXIO, errno.EMLINK):
            check_own_file(path)
        raise type(err)(err.errno, err.strerror, str(path)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            check_own_file(path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_own(path, text: str) -> None:
    """Append ``text`` to a log file of spmlkit's own folders (``metrics.jsonl``,
    ``launches.jsonl``), created if missing, never through a link (`open_own`)."""
    fd = open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()


def preallocate(fd: int, nbytes: int, name) -> None:
    """Reserve ``nbytes`` of disk for the file open on ``fd`` before it is memory-mapped
    (``posix_fallocate``): on a full disk this is an ``OSError`` naming ``name`` and the size,
    where writing into a map of a sparse file would die by SIGBUS with no message. A file
    system that cannot reserve (no ``fallocate``) is left as it is."""
    if not hasattr(os, "posix_fallocate") or nbytes <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, int(nbytes))
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL):
            return
        raise type(err)(err.errno, f"{err.strerror} (this file needs "
                        f"{nbytes / 2**20:.1f} MiB)", str(name)) from None


def own_folder(path, create: bool = True) -> Path:
    """``mkdir -p path`` for a folder spmlkit owns inside a folder the user gave (a study's
    ``runs``, a run's folder, a feature store, a run's ``figures``): a link at that name is
    refused (an ``OSError`` naming it), so nothing is written through a link someone planted.
    ``create=False``: the check only (before work whose output goes there)."""
    path = Path(path)
    st = _lstat(path)
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise FileExistsError(errno.EEXIST, "is a symbolic link where spmlkit keeps its own "
                              "folder; spmlkit never writes through it (was this folder "
                              "handed to you? remove the link)", str(path))
    return make_folder(path) if create else path


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


def sync_files() -> None:
    """Everything written so far on disk (``os.sync``; a no-op where the platform has none):
    one flush for the many run folders a stacked group finishes, instead of two ``fsync`` s a
    run (each a journal commit)."""
    if hasattr(os, "sync"):
        os.sync()


def _sync_folder(path: Path) -> None:
    """``fsync`` a folder (its entries: names created or renamed in it), where the platform
    allows opening a folder."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a reader never sees half a file)."""
    data = (json.dumps(obj, indent=2, default=_jsonable) + "\n").encode()
    _atomic(Path(path), lambda fh: fh.write(data))


def write_text(path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically, replacing the file if it exists."""
    write_bytes(path, text.encode())


def write_bytes(path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically, replacing the file if it exists (a file of
    spmlkit's own folders: `check_own_file`)."""
    _atomic(Path(path), lambda fh: fh.write(data), durable=durable)


def write_output(path, data, *, force: bool = False, protect=()) -> Path:
    """Write an output file (a prediction table, a figure, a report, an export) atomically,
    by the one writer rule (`check_output`).

    Args:
        path: the file to write. When it exists the write is refused (``FileExistsError``:
            "exists; pass --force to replace it, or choose another name"); ``force=True``
            replaces a regular file, never a link, a device, a FIFO, a folder, a file of
            spmlkit's own folders (a run's ``best.pt``, a study's ``results.sqlite``, ...).
        data: ``bytes``, ``str`` (written as UTF-8) or a function ``write(fh)`` that writes to
            a binary file handle (``lambda fh: fig.savefig(fh, format="png")``).
        protect: files the output must not replace either (the command's inputs).

    Returns:
        the path written, for the caller to print.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> write_output(d / "t.csv", "a\\n").name
    't.csv'
    >>> write_output(d / "t.csv", "b\\n")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    FileExistsError: [Errno 17] exists; pass --force to replace it, or choose another name: ...
    >>> write_output(d / "t.csv", "b\\n", force=True).read_text()
    'b\\n'
    """
    if isinstance(data, str):
        data = data.encode()
    write = (lambda fh: fh.write(data)) if isinstance(data, (bytes, bytearray)) else data
    if not callable(write):
        raise TypeError(f"data must be bytes, str or a function of a file handle, got "
                        f"{type(data).__name__}")
    return _atomic(Path(path), write, output=True, force=force, protect=protect)


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


def _jsonable(obj):
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


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
        data = (json.dumps(obj, indent=2, default=_jsonable) + "\n").encode()
        _atomic(self.path / name, lambda fh: fh.write(data), durable=durable)

    def append_jsonl(self, name: str, obj) -> None:
        append_own(self.path / name, json.dumps(obj, default=_jsonable) + "\n")

    def save_array(self, name: str, arr) -> None:
        _atomic(self.path / name, lambda fh: np.save(fh, np.asarray(arr)), durable=False)

    def save_npz(self, name: str, **arrays) -> None:
        """Several arrays in one ``.npz`` (read back with ``np.load``): labels deflated,
        floating-point arrays stored (`_savez_fast`)."""
        _atomic(self.path / name, lambda fh: _savez_fast(fh, arrays), durable=False)

    def save_torch(self, name: str, obj, durable: bool = True) -> None:
        import torch

        _atomic(self.path / name, lambda fh: torch.save(obj, fh), durable=durable)

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
                kept = "".join(json.dumps(_strict_json(h), default=_jsonable) + "\n"
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
            _sync_folder(self.path)  # the renames, final.json's included
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


def read_predictions(run_dir) -> dict:
    """The arrays of ``predictions.npz``: ``probs_{train,val,test}``, ``y_{train,val,test}``,
    ``observed`` and ``best_epoch``; shapes checked (N x L, ``observed`` as ``y_train``)."""
    path = run_file(run_dir, PREDICTIONS_FILE)
    expected = sorted({f"{p}_{s}" for p in ("probs", "y") for s in SPLITS} | {"observed"})
    arrays = load_arrays(path, expected, PRODUCERS[PREDICTIONS_FILE])
    for s in SPLITS:  # what the analyses index: N x L, probabilities and labels alike
        probs, y = arrays[f"probs_{s}"], arrays[f"y_{s}"]
        if probs.ndim != 2 or probs.shape != y.shape:
            raise ValueError(f"{path}: probs_{s} has shape {probs.shape} and y_{s} "
                             f"{y.shape}; expected the same N x L shape")
    if arrays["observed"].shape != arrays["y_train"].shape:
        raise ValueError(f"{path}: observed has shape {arrays['observed'].shape}, y_train "
                         f"{arrays['y_train'].shape}; expected the same shape")
    return arrays
