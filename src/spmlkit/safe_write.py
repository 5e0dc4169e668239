"""The one writer rule (docs: DESIGN 13): spmlkit writes inside its own folders without
following links, and never replaces a file it did not create without an explicit ``force``.

Every file spmlkit writes goes through `write_atomic` (a temporary file, then a rename: a
killed process leaves the old file or the new one, never half of one). A file of spmlkit's own
folders (a run's, a study's, a feature store's) is checked by `check_own_file` (a link, a device,
a FIFO there is refused, never written through); an output the user names (a prediction table,
a figure, a report) by `check_output` (an existing file only with ``force``, and never one of
`OWN_FILES`). `open_own` / `append_own` open a lock or a log the same way; `own_folder` makes a
folder without following a link planted at its name. The counterpart for reading is
`spmlkit.safe_load`.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path

import numpy as np


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


#: the files of spmlkit's own folders (a run's: `spmlkit.runs`; a study's; a feature store's:
#: `spmlkit.features`): an output never replaces one of them, even with ``force`` (the folder
#: would be broken). tests/test_writer_rule.py checks that it names each folder's files.
OWN_FILES = frozenset({
    # a run's
    "config.json", "observed.npy", "metrics.jsonl", "checkpoint.pt", "best.pt",
    "thresholds.json", "final.json", "failed.json", "predictions.npz", "train_probs.npy",
    "skipped_images.json", "enhanced_labels.npy",
    # a study's
    "results.sqlite", "results.sqlite-wal", "results.sqlite-shm", "results.sqlite-journal",
    "study.yaml", "launches.jsonl", "sklearn-reference.json",
    # a feature store's
    ".lock", "meta.json", "features.npy", "done.npy", "files.npy"})

#: a file that marks a folder as spmlkit's own: a run's, a study's, a feature store's
_OWN_MARKERS = ("config.json", "results.sqlite", "meta.json")


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


def write_atomic(path: Path, write, durable: bool = True, output: bool = False,
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
    data = memoryview(text.encode("utf-8"))
    fd = open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:  # written straight to the descriptor (a text wrapper around it cost 3x the write)
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


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


def sync_files() -> None:
    """Everything written so far on disk (``os.sync``; a no-op where the platform has none):
    one flush for the many run folders a stacked group finishes, instead of two ``fsync`` s a
    run (each a journal commit)."""
    if hasattr(os, "sync"):
        os.sync()


def sync_folder(path: Path) -> None:
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


def write_json(path, obj, durable: bool = True) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a reader never sees half a file;
    ``durable``: as `write_atomic`)."""
    data = (json.dumps(obj, indent=2, default=json_default) + "\n").encode()
    write_atomic(Path(path), lambda fh: fh.write(data), durable=durable)


def write_text(path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically, replacing the file if it exists."""
    write_bytes(path, text.encode())


def write_bytes(path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically, replacing the file if it exists (a file of
    spmlkit's own folders: `check_own_file`)."""
    write_atomic(Path(path), lambda fh: fh.write(data), durable=durable)


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
    return write_atomic(Path(path), write, output=True, force=force, protect=protect)


def json_default(obj):
    """The ``default`` of ``json.dumps`` for what spmlkit writes: numpy numbers and arrays,
    paths."""
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")
