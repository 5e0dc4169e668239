"""Reading image files, checking image lists, and the small parsers the image sources share.

An *image item* is a path string to an image file. Image sources
(`spmlkit.data.image_common` lists them) return [`LabelledSet`][spmlkit.data.protocol.LabelledSet]
objects whose ``x`` is a list of absolute path strings; everything that decodes pixels goes
through `open_image`, so a corrupt file always fails with a ``ValueError`` that names it,
never with a decoder error deep inside a data loader.

Checking a list of paths (`check_images`) is cheap by default (one directory listing per
folder, no decoding); with ``skip_corrupt`` (or ``decode=True``) every image is also decoded once,
at reduced size for JPEGs (PIL's draft mode), which still catches truncated and garbled files.

>>> import tempfile
>>> from pathlib import Path
>>> from PIL import Image
>>> d = Path(tempfile.mkdtemp())
>>> Image.new("L", (8, 8), 128).save(d / "a.png")
>>> _ = (d / "b.jpg").write_bytes(b"not an image")
>>> open_image(d / "a.png").mode
'RGB'
>>> check = check_images([str(d / "a.png"), str(d / "b.jpg"), str(d / "c.jpg")],
...                      skip_missing=True, skip_corrupt=True)
>>> check.keep.tolist(), len(check.missing), len(check.corrupt)
([0], 1, 1)
"""
from __future__ import annotations

import os
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

#: File name endings treated as images when a folder is scanned (compared in lower case).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".jfif", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff",
                  ".ppm", ".pgm", ".pbm")

def _decode_errors() -> tuple:
    """Everything PIL raises on a file it cannot decode: ``UnidentifiedImageError`` and
    truncated-file errors are ``OSError``; some plugins raise ``SyntaxError``, ``ValueError``,
    ``EOFError``, ``struct.error`` or ``IndexError`` on garbled headers; oversized images raise
    ``DecompressionBombError``."""
    import struct

    from PIL import Image

    return (OSError, SyntaxError, ValueError, EOFError, struct.error, IndexError,
            Image.DecompressionBombError)


def open_image(path, background: tuple = (255, 255, 255), draft: int | None = None):
    """Open an image file as an RGB `PIL.Image.Image` (fully decoded, file closed).

    Grayscale, CMYK, 16-bit and palette images are converted to RGB; images with transparency
    (RGBA, LA, palette with a transparent colour) are composited over ``background`` (default
    white), so a transparent icon does not turn into a black square. EXIF orientation is not
    applied (as in the official pipelines, which call ``Image.open(p).convert("RGB")``).

    Args:
        path: the image file.
        background: RGB colour under transparent pixels.
        draft: a JPEG is decoded at the smallest of libjpeg's scales (1/2, 1/4, 1/8) whose
            image is still at least ``draft`` x ``draft`` pixels (``PIL.Image.draft``; other
            files as they are): ``--jpeg-draft`` (`spmlkit.accel`).

    Returns:
        an RGB image of the file's size.

    Raises:
        FileNotFoundError: the file does not exist (the message names it).
        ValueError: the file exists but is not a readable image (corrupt, truncated, not an
            image, too large for PIL's decompression-bomb limit); the message names the file and
            PIL's reason.

    >>> import tempfile
    >>> from pathlib import Path
    >>> f = Path(tempfile.mkdtemp()) / "broken.png"
    >>> _ = f.write_bytes(b"\\x89PNG garbage")
    >>> try:
    ...     open_image(f)
    ... except ValueError as err:
    ...     message = str(err)
    >>> message.startswith(f"{f}: not a readable image"), "skip_corrupt=True" in message
    (True, True)
    """
    from PIL import Image

    path = os.fspath(path)
    if not os.path.isfile(path):
        what = "is a folder, not an image file" if os.path.isdir(path) else "does not exist"
        raise FileNotFoundError(f"image {path} {what}")
    try:
        with Image.open(path) as img:
            if draft is not None and img.format == "JPEG":
                img.draft("RGB", (int(draft), int(draft)))
            img.load()
            return _to_rgb(img, background)
    except _decode_errors() as err:
        raise ValueError(f"{path}: not a readable image ({type(err).__name__}: {err}); replace "
                         f"or delete the file, or load the dataset with skip_corrupt=True") \
            from None


class DraftReader:
    """``open_image(path, draft=size)`` as a reader (picklable: loader workers get it)."""

    def __init__(self, size: int):
        self.size = int(size)

    def __call__(self, path):
        return open_image(path, draft=self.size)


def _to_rgb(img, background):
    from PIL import Image

    if img.mode == "RGB":
        return img.copy()
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        base = Image.new("RGBA", rgba.size, tuple(background) + (255,))
        return Image.alpha_composite(base, rgba).convert("RGB")
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16-bit grayscale (PIL opens a 16-bit PNG as "I;16" or "I"): its full range, 0 ..
        # 65535, to 8 bits, the same scale for every image (as torchvision's and OpenCV's
        # 16 -> 8 bit conversions), never by the image's own maximum: the brightness of two
        # images compares. 32-bit values beyond 65535 are clipped.
        arr = np.asarray(img, dtype=np.float64) * (255.0 / 65535.0)
        return Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), "L") \
            .convert("RGB")
    return img.convert("RGB")


def image_error(path) -> str | None:
    """Why ``path`` cannot be decoded, or ``None`` when it can (JPEGs decoded at reduced size).

    Used to screen a list of images quickly; `open_image` remains the reader.
    """
    from PIL import Image

    path = os.fspath(path)
    try:
        with Image.open(path) as img:
            if img.format == "JPEG":
                img.draft("RGB", (64, 64))    # decode at 1/8 scale: fast, still reads every byte
            img.load()
    except FileNotFoundError:
        return "file does not exist"
    except _decode_errors() as err:
        return f"{type(err).__name__}: {err}"
    return None


def decode_errors(paths: Sequence[str], threads: int | None = None) -> Iterator[str | None]:
    """`image_error` of each path, in order, decoded by a few threads (PIL releases the
    GIL while it decodes: about 2x faster on 2 cores than one after the other)."""
    if len(paths) < 16:
        yield from map(image_error, paths)
        return
    from concurrent.futures import ThreadPoolExecutor

    threads = threads or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(threads) as pool:
        yield from pool.map(image_error, paths, chunksize=16)


@dataclass
class ImageCheck:
    """What `check_images` found: rows kept, and the paths dropped for each reason."""

    keep: np.ndarray                           # indices into the checked list, ascending
    missing: list = field(default_factory=list)
    corrupt: list = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return len(self.missing) + len(self.corrupt)


def existing_files(paths: Sequence[str]) -> np.ndarray:
    """A boolean mask: which ``paths`` are regular files (each folder is listed once, so a list
    of 100,000 images in a few folders costs a few directory reads, not 100,000 stats)."""
    by_dir: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(paths):
        by_dir[os.path.dirname(os.fspath(p))].append(i)
    found = np.zeros(len(paths), dtype=bool)
    for folder, rows in by_dir.items():
        try:
            with os.scandir(folder or ".") as it:
                files = {e.name for e in it if e.is_file()}
        except (FileNotFoundError, NotADirectoryError):
            continue
        except PermissionError as err:
            raise PermissionError(f"cannot list image folder {folder}: {err}") from None
        for i in rows:
            found[i] = os.path.basename(os.fspath(paths[i])) in files
    return found


def check_images(paths: Sequence[str], *, skip_missing: bool = False,
                 skip_corrupt: bool = False, decode: bool | None = None,
                 where: str = "") -> ImageCheck:
    """Check that every path is an image file; raise on the first bad one or drop and count.

    Args:
        paths: image paths (strings or path-likes).
        skip_missing: drop files that do not exist instead of raising.
        skip_corrupt: decode every image and drop those that cannot be decoded instead of
            raising (implies ``decode``). Decoding costs a few milliseconds per image (about
            4 ms for a 500 x 375 JPEG on a 2-core machine), so several minutes for COCO's
            123,000 images; the cheap existence check takes about 1 s per 100,000 paths.
        decode: decode every image (default: only with ``skip_corrupt``). With ``decode=True``
            and ``skip_corrupt=False`` the first corrupt image raises.
        where: what the list is (e.g. ``"voc train"``), for messages.

    Returns:
        an `ImageCheck`: ``keep`` (indices of the usable paths, in order), ``missing`` and
        ``corrupt`` (the paths dropped).

    Raises:
        FileNotFoundError: a path does not exist and ``skip_missing`` is off; the message names
            the first such file, how many there are, and the option.
        ValueError: with ``decode``, an image cannot be decoded and ``skip_corrupt`` is off (the
            message names the file and the reason).
    """
    paths = [os.fspath(p) for p in paths]
    decode = skip_corrupt if decode is None else (decode or skip_corrupt)
    label = f"{where}: " if where else ""
    present = existing_files(paths)
    missing = [paths[i] for i in np.flatnonzero(~present)]
    if missing and not skip_missing:
        more = f" (and {len(missing) - 1} more of the {len(paths)} listed)" \
            if len(missing) > 1 else ""
        raise FileNotFoundError(f"{label}image {missing[0]} does not exist{more}; restore the "
                                f"file(s), or pass skip_missing=True to drop the items whose image "
                                f"is missing (they are counted in the dataset's meta)")
    keep = np.flatnonzero(present)
    corrupt = []
    if decode:
        good = []
        for i, reason in zip(keep, decode_errors([paths[i] for i in keep])):
            if reason is None:
                good.append(i)
                continue
            if not skip_corrupt:
                raise ValueError(f"{label}{paths[i]}: not a readable image ({reason}); replace "
                                 f"or delete the file, or pass skip_corrupt=True to drop such "
                                 f"items (spml: --data skip_corrupt=true)")
            corrupt.append(paths[i])
        keep = np.asarray(good, dtype=np.int64)
    return ImageCheck(keep.astype(np.int64), missing, corrupt)


def _named(paths, shown: int = 5) -> str:
    """The first ``shown`` of ``paths``, and how many more there are."""
    more = f", and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(map(str, paths[:shown])) + more


def warn_skipped(check: ImageCheck, where: str) -> None:
    """One warning that says how many items were dropped and names them (the first five)."""
    if not check.skipped:
        return
    parts = []
    if check.missing:
        parts.append(f"{len(check.missing)} with a missing image: {_named(check.missing)}")
    if check.corrupt:
        parts.append(f"{len(check.corrupt)} with an unreadable image: {_named(check.corrupt)}")
    warnings.warn(f"{where}: skipped {check.skipped} item(s): {'; '.join(parts)}",
                  stacklevel=3)


# ------------------------------------------------------------------ shared small parsers
def read_text_lines(path, what: str) -> list[str]:
    """The lines of a UTF-8 text file (BOM dropped).

    Raises:
        FileNotFoundError: no such file (the message says what the file is).
        ValueError: not UTF-8 text.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        return path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: {what} is not a UTF-8 text file ({err})") from None


def read_fields(path, what: str, form: str, min_fields: int,
                max_fields: int | None = None) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(line number, fields)`` of a whitespace-separated text file, blank lines skipped.

    Args:
        path: the file.
        what: what the file is (for messages).
        form: the expected form of a line, e.g. ``"<image id> <label>"`` (for messages).
        min_fields, max_fields: the allowed number of fields per line.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line with too few or too many fields (the message names the file, the line
            number, the line and the expected form).
    """
    for lineno, line in enumerate(read_text_lines(path, what), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < min_fields or (max_fields is not None and len(fields) > max_fields):
            raise ValueError(f"{path}, line {lineno}: expected '{form}', got {line.strip()!r}")
        yield lineno, fields


def parse_int(text: str, path, lineno: int, what: str, allowed=None) -> int:
    """``int(text)``, with an error that names the file, line and field."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{path}, line {lineno}: {what} must be an integer, got {text!r}") \
            from None
    if allowed is not None and value not in allowed:
        raise ValueError(f"{path}, line {lineno}: {what} must be one of "
                         f"{', '.join(map(str, allowed))}, got {text!r}")
    return value


def listing(folder, n: int = 15) -> str:
    """A short description of what a folder holds, for 'file not found' messages."""
    folder = Path(folder)
    if not folder.is_dir():
        return f"{folder} does not exist" if not folder.exists() else f"{folder} is a file"
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    if not names:
        return f"{folder} is empty"
    shown = ", ".join(names[:n])
    return f"{folder} holds: {shown}" + (f", ... ({len(names)} in all)" if len(names) > n else "")


def locate(root, relative: str, max_depth: int = 3) -> Path | None:
    """The shallowest folder ``d`` at or below ``root`` (breadth first, at most ``max_depth``
    levels down, hidden folders skipped) such that ``d / relative`` exists; ``None`` if none.

    Lets a reader accept a dataset however deep its archive was unpacked (``CUB_200_2011/`` or
    ``CUB_200_2011/CUB_200_2011/``) without walking a whole image tree.
    """
    level = [Path(root)]
    for _depth in range(max_depth + 1):
        for d in level:
            if (d / relative).exists():
                return d
        nxt = []
        for d in level:
            try:
                nxt.extend(sorted(p for p in d.iterdir()
                                  if p.is_dir() and not p.name.startswith(".")))
            except (PermissionError, NotADirectoryError, FileNotFoundError):
                continue
        if not nxt:
            break
        level = nxt
    return None


def is_image_name(name: str) -> bool:
    """Whether a file name ends with one of `IMAGE_SUFFIXES` (any case)."""
    return name.lower().endswith(IMAGE_SUFFIXES) and not name.startswith(".")
