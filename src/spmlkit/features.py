"""Backbone features computed once, stored memory-mapped, reused by the linear mode.

A *feature store* holds the pooled backbone features of one list of image items: an N x D
``.npy`` file opened with `numpy.lib.format.open_memmap` (so a store larger than memory is
written and read row by row), a done-mask (``done.npy``, one byte per row, replaced atomically
after every batch) and a JSON sidecar (``meta.json``: the key and what went into it, N, D, dtype,
rows done, whether it is complete). Its folder name is derived from a key over

- the backbone's ``cache_key`` (name and weights: ``efficientnet_lite0-imagenet``),
- the transform's spec (name, size, mean, std, and the seed for random views),
- the item list (SHA-256 over the path strings, in order) and N,
- the storage dtype and the store format version,

so changing any of them gives a new store, and asking again for the same one returns it without
building the backbone. With ``maps=True`` a store holds the backbone's last feature maps
(``forward_features``: C x h x w per row, stored flattened as N x (C*h*w) with the map shape in
the key; `extract_feature_maps` returns them as N x C x h x w) instead of pooled vectors,
for heads that look at space (LAC's label-wise embeddings, `spmlkit.methods.lac`).
The images' contents are not in the key (only their paths); the store records each row's file
size and modification time (``files.npy``), and reusing a complete store recomputes the rows
whose files changed since (a warning names them). A store of an older spmlkit (or rows of a
killed extraction) takes the files as they are when it is next reused.

Extraction runs a `torch.utils.data.DataLoader` whose worker processes decode and
transform images (`spmlkit.data.image_files.open_image`, `spmlkit.data.transforms`) while
the main process runs the backbone, so decoding overlaps the forward pass. Rows are written into
the memory map batch by batch; an interrupted extraction (an error, Ctrl-C, a killed process)
keeps the rows written so far and the next call computes only the missing ones. Two processes
asking for the same store at once take turns through a lock file; the second finds it complete.

>>> import tempfile
>>> from pathlib import Path
>>> from PIL import Image
>>> d = Path(tempfile.mkdtemp())
>>> for i in range(3):
...     Image.new("RGB", (40, 30), (80 * i, 50, 200)).save(d / f"{i}.png")
>>> items = [str(d / f"{i}.png") for i in range(3)]
>>> feats = extract_features(items, "tiny_cnn", cache_dir=d / "cache", progress=False,
...                          num_workers=0)
>>> feats.shape, feats.dtype.name
((3, 32), 'float32')
>>> again = extract_features(items, "tiny_cnn", cache_dir=d / "cache", progress=False)
>>> bool((again == feats).all())
True
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .data.protocol import Dataset, LabelledSet, Splits
from .data.rows import holds_vectors
from .accel import current_acceleration
from .accel import start as start_acceleration
from .data.image_views import (finish_view, finished_batches, gpu_decodable, image_reader,
                               load_view, raw_item, stack_views)
from .machine import default_cache_dir, default_workers, loader_worker_init, loader_workers, \
    prefetch_factor
from .safe_write import check_own_file, open_own, own_folder, preallocate, write_bytes, write_json
from .safe_load import load_array

FORMAT_VERSION = 1
#: transform names -> factory names in `spmlkit.data.transforms`
TRANSFORMS = {"eval": "eval_transform", "weak": "weak_view", "strong": "strong_view"}
DTYPES = ("float32", "float16")
FEATURES_FILE, DONE_FILE, META_FILE, LOCK_FILE = "features.npy", "done.npy", "meta.json", ".lock"
#: each row's image file as its features were computed: N x 2 int64 (size, mtime in ns)
FILES_FILE = "files.npy"
#: a row of `FILES_FILE` not known (a store of an older spmlkit; rows of a killed extraction)
_UNKNOWN = -2


# ---- transforms -------------------------------------------------------------------------------
def make_transform(name: str, size: int, mean, std):
    """The transform ``name`` (``eval``, ``weak``, ``strong``) of `spmlkit.data.transforms`
    at ``size`` with the backbone's normalisation; returns ``(transform, spec dict)``."""
    if name not in TRANSFORMS:
        raise ValueError(f"unknown transform {name!r}; known: {', '.join(TRANSFORMS)}")
    from .data import transforms

    t = getattr(transforms, TRANSFORMS[name])(int(size), tuple(mean), tuple(std))
    spec = getattr(t, "spec", None) or {"name": TRANSFORMS[name], "size": int(size),
                                        "mean": list(mean), "std": list(std)}
    return t, json.loads(json.dumps(spec, default=str))


def _open(path):
    try:
        from .data.image_files import open_image
    except ImportError:  # pragma: no cover - the readers module ships with the package
        from PIL import Image

        with Image.open(path) as img:
            return img.convert("RGB")
    return open_image(path)


class _Rows(torch.utils.data.Dataset):
    """Decodes and transforms the rows still to compute; an unreadable image comes back as an
    error message (raised cleanly in the main process), not as a traceback from a worker."""

    def __init__(self, items, rows, transform, seed: int | None, raw: bool = False, read=None):
        self.items, self.rows, self.transform, self.seed = items, rows, transform, seed
        self.raw = raw  # --gpu-decode: the file's bytes (decoded on the device)
        self.read = read or _open  # (`image_reader`'s: a reduced scale under --jpeg-draft)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k):
        i = int(self.rows[k])
        path = self.items[i]
        try:
            g = None if self.seed is None else torch.Generator().manual_seed(
                self.seed * 1_000_003 + i)
            if self.raw:
                return i, raw_item(path, self.transform, g), None
            return i, load_view(self.transform, self.read(path), g), None
        except (ValueError, OSError) as err:
            return i, None, str(err) if os.fspath(path) in str(err) else f"{path}: {err}"


def _collate(batch):
    rows = torch.tensor([b[0] for b in batch], dtype=torch.int64)
    errors = [(b[0], b[2]) for b in batch if b[2] is not None]
    if errors:
        return rows, None, errors
    xs, flips = zip(*(b[1] for b in batch))
    return rows, (stack_views(xs), torch.tensor(flips, dtype=torch.bool)), errors


# ---- keys and stores --------------------------------------------------------------------------
def items_digest(items: Sequence) -> str:
    """SHA-256 over the item path strings in order (each followed by a NUL byte)."""
    h = hashlib.sha256()
    for item in items:
        h.update(os.fspath(item).encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()


def _check_items(items) -> list:
    if isinstance(items, np.ndarray) and items.dtype.kind in "fiub":
        raise ValueError(f"extract_features takes a list of image paths; got a numeric array of "
                         f"shape {items.shape} (a source that already holds features needs no "
                         f"backbone)")
    items = list(items)
    if not items:
        raise ValueError("extract_features got an empty item list")
    for i, item in enumerate(items):
        if not isinstance(item, (str, os.PathLike)):
            raise ValueError(f"extract_features takes image paths; item {i} is "
                             f"{type(item).__name__} {str(item)[:60]!r}")
    return items


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:60]


def _describe_backbone(backbone, pretrained: bool) -> dict:
    """``cache_key``, ``input_size``, ``num_features``, ``mean``, ``std`` of a name or module."""
    if isinstance(backbone, str):
        from .models.backbones import backbone_spec

        return backbone_spec(backbone, pretrained)
    if not isinstance(backbone, torch.nn.Module):
        raise ValueError(f"backbone must be a registered name or an nn.Module, got "
                         f"{type(backbone).__name__}")
    missing = [a for a in ("cache_key", "input_size", "num_features", "mean", "std")
               if not getattr(backbone, a, None)]
    if missing:
        raise ValueError(f"a backbone module needs the attributes {missing} (see "
                         f"spmlkit.models.backbones.Backbone); cache_key names its weights in "
                         f"the feature store key")
    return {"cache_key": backbone.cache_key, "input_size": int(backbone.input_size),
            "num_features": int(backbone.num_features), "mean": tuple(backbone.mean),
            "std": tuple(backbone.std)}


@dataclasses.dataclass
class StorePlan:
    """Where a store lives and what identifies it (before anything is computed)."""

    folder: Path
    key: str
    fields: dict
    n: int
    d: int
    dtype: str

    @property
    def features_file(self) -> Path:
        return self.folder / FEATURES_FILE

    def read_meta(self) -> dict | None:
        check_own_file(self.folder / META_FILE)  # a FIFO would block, a link lead elsewhere
        try:
            meta = json.loads((self.folder / META_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if (meta.get("key") != self.key or meta.get("n") != self.n or meta.get("d") != self.d
                or meta.get("dtype") != self.dtype):
            return None
        return meta

    def complete(self) -> bool:
        meta = self.read_meta()
        return bool(meta and meta.get("complete")) and self.features_file.is_file()

    def open(self, mode: str = "r") -> np.memmap:
        check_own_file(self.features_file)  # never through a link planted in the store
        mm = np.lib.format.open_memmap(self.features_file, mode=mode)
        if mm.shape != (self.n, self.d) or mm.dtype != np.dtype(self.dtype):
            raise ValueError(f"{self.features_file}: holds {mm.shape} {mm.dtype}, expected "
                             f"{(self.n, self.d)} {self.dtype}; delete the folder "
                             f"{self.folder} (or pass recompute=True)")
        return mm


def map_shape(backbone, size: int, pretrained: bool = True) -> tuple[int, int, int]:
    """``(C, h, w)`` of ``backbone.forward_features`` on a ``size x size`` input (one zero image
    through the network; a name builds the backbone)."""
    net = _backbone_module(backbone, pretrained)
    was = net.training
    try:
        with torch.inference_mode():
            fmap = net.eval().forward_features(torch.zeros(1, 3, int(size), int(size),
                                                            device=_param_device(net)))
    finally:
        net.train(was)
    if fmap.ndim != 4:
        raise ValueError(f"backbone {getattr(net, 'cache_key', type(net).__name__)} returned a "
                         f"feature map of shape {tuple(fmap.shape)} from forward_features, "
                         f"expected 1 x C x h x w")
    return tuple(int(v) for v in fmap.shape[1:])


def _param_device(net) -> torch.device:
    p = next(iter(net.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def plan_store(items, backbone="efficientnet_lite0", transform: str = "eval",
               size: int | None = None, *, dtype: str = "float32", cache_dir=None,
               pretrained: bool = True, seed: int = 0, maps: bool = False) -> StorePlan:
    """The store `extract_features` would use for these arguments (nothing computed;
    ``maps=True`` runs one zero image through the backbone to learn the map shape)."""
    items = _check_items(items)
    if np.dtype(dtype).name not in DTYPES:
        raise ValueError(f"feature dtype must be one of {DTYPES}, got {dtype!r}")
    dtype = np.dtype(dtype).name
    spec = _describe_backbone(backbone, pretrained)
    size = int(size or spec["input_size"])
    if size < 1:
        raise ValueError(f"size must be >= 1 (the input side in pixels), got {size}")
    from .resources import check_memory

    check_memory(2 * 3 * 4 * size * size, f"one {size} x {size} input image (float32, and "
                 f"the backbone's first feature map as large)", "give a smaller --size "
                 f"(the backbone's own is {spec['input_size']})")
    _, tspec = make_transform(transform, size, spec["mean"], spec["std"])
    fields = {"format": FORMAT_VERSION, "backbone": spec["cache_key"], "transform": tspec,
              "seed": None if transform == "eval" else int(seed),
              "items_sha256": items_digest(items), "n": len(items), "dtype": dtype}
    decoder = current_acceleration().decoder
    if decoder is not None:  # --gpu-decode / --jpeg-draft: other pixels, a store of its own
        fields["decode"] = decoder
    d, tag = spec["num_features"], ""
    if maps:  # a new key field only here: the keys of pooled stores are unchanged
        shape = map_shape(backbone, size, pretrained)
        fields["maps"] = list(shape)
        d, tag = int(np.prod(shape)), "map"
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]
    name = (f"{_safe(spec['cache_key'])}__{transform}{size}{tag}__n{len(items)}__{dtype}__"
            f"{key[:12]}")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if cache.exists() and not cache.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is a file; the feature cache must be a folder",
                                 str(cache))
    return StorePlan(cache / name, key, fields, len(items), d, dtype)


@contextlib.contextmanager
def _locked(folder: Path):
    """An exclusive lock on ``folder/.lock`` (POSIX); elsewhere no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with os.fdopen(open_own(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT), "r+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _save_mask(folder: Path, mask: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, mask)
    write_bytes(folder / DONE_FILE, buf.getvalue(), durable=False)


def _load_mask(plan: StorePlan) -> np.ndarray | None:
    try:
        mask = load_array(plan.folder / DONE_FILE)  # checked: a damaged one is recomputed
    except (FileNotFoundError, ValueError, OSError):
        return None
    return mask if mask.shape == (plan.n,) and mask.dtype == np.uint8 else None


def _write_meta(plan: StorePlan, done: int, seconds: float, items: list) -> None:
    write_json(plan.folder / META_FILE, {
        "key": plan.key, "n": plan.n, "d": plan.d, "dtype": plan.dtype, "done": int(done),
        "complete": bool(done == plan.n), "key_fields": plan.fields,
        "first_item": os.fspath(items[0]) if items else None,
        "last_item": os.fspath(items[-1]) if items else None,
        "seconds": round(float(seconds), 3)})


def _device(device) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# ---- extraction -------------------------------------------------------------------------------
def extract_features(items, backbone="efficientnet_lite0", transform: str = "eval",
                     size: int | None = None, *, batch_size: int = 32,
                     num_workers: int | None = None, dtype: str = "float32", cache_dir=None,
                     pretrained: bool = True, device=None, seed: int = 0,
                     progress: bool = True, recompute: bool = False, amp: bool | None = None,
                     channels_last: bool = True, threads: int | None = None,
                     desc: str | None = None, maps: bool = False,
                     weights=None) -> np.memmap:
    """Pooled backbone features of ``items`` (image paths), from the store or computed into it.

    Args:
        items: N image paths (strings or path-likes); their order is the row order.
        backbone: a registered name (``spmlkit.models.list_backbones()``) or a backbone module
            (anything with ``cache_key``, ``input_size``, ``num_features``, ``mean``, ``std``
            whose call returns B x D features).
        transform: ``eval`` (default; deterministic), ``weak`` or ``strong``; random views draw
            from a generator seeded with ``seed`` and the row index, so a resumed store matches
            an uninterrupted one.
        size: input side (default: the backbone's ``input_size``).
        batch_size, num_workers: the DataLoader's (workers default: `default_workers`;
            0 decodes in this process).
        dtype: ``float32`` (default) or ``float16`` (half the disk and memory; values rounded).
        cache_dir: parent folder of the stores (default `default_cache_dir`).
        pretrained: for a backbone given by name (part of the key).
        weights: for a backbone given by name: a file of your own weights for it, loaded
            instead of the pretrained ones (`spmlkit.models.create_backbone`); the
            store's key names the file's content.
        device: where the backbone runs (default CUDA if available).
        amp: float16 autocast for the forward pass (default: on CUDA only).
        channels_last: run the backbone in channels-last memory format (faster for these
            convolutional networks on CPU and GPU).
        threads: torch threads while extracting (default: all cores), restored afterwards.
        recompute: delete the store and compute it again.
        maps: store ``forward_features`` (C x h x w per row, flattened to ``D = C*h*w``)
            instead of the pooled vector; `extract_feature_maps` reshapes.

    Returns:
        an N x D `numpy.memmap` of the complete store, copy-on-write (writing to it
        changes this array only, never the store).

    The backbone module (a given one, or the one built from the name) is put in eval mode for
    the extraction (its mode is restored) and moved to ``device`` in channels-last format.

    Raises:
        ValueError: items are not paths or empty, an image is missing or cannot be decoded (the
            message names the file; the rows computed before it are kept), the features are not
            finite (e.g. float16 overflow: use float32).
    """
    items = _check_items(items)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if weights is not None:
        if not isinstance(backbone, str):
            raise ValueError("weights= is for a backbone given by name; a backbone module "
                             "already holds its weights")
        from .models.backbones import create_backbone

        backbone = create_backbone(backbone, weights=weights)
    plan = plan_store(items, backbone, transform, size, dtype=dtype, cache_dir=cache_dir,
                      pretrained=pretrained, seed=seed, maps=maps)
    own_folder(plan.folder, create=False)  # a link planted at the store's name: refused
    if recompute and plan.folder.exists():  # before anything there is read or removed
        for name in (META_FILE, DONE_FILE, FEATURES_FILE):
            with contextlib.suppress(FileNotFoundError):
                (plan.folder / name).unlink()
    if plan.complete() and _fresh(plan, items, readonly=True):
        return plan.open("c")
    if plan.read_meta() is None:  # a new store: every image decoded first (a few threads),
        _check_decodable(items)      # so a bad file is named before a partial store exists
    own_folder(plan.folder)  # a link planted at the store's name: refused
    with _locked(plan.folder):
        if plan.complete():          # another process finished it while we waited
            if _fresh(plan, items, invalidate=True):
                return plan.open("c")
        _fill(plan, items, backbone, transform, batch_size, num_workers, pretrained, device,
              seed, progress, amp, channels_last, threads, desc)
    return plan.open("c")


def file_stats(items) -> np.ndarray:
    """N x 2 int64: each item's file size and modification time in ns (-1 for a file that
    cannot be read: such a row keeps the features it has)."""
    out = np.full((len(items), 2), -1, dtype=np.int64)
    for i, item in enumerate(items):
        try:
            st = os.stat(item)
        except OSError:
            continue
        out[i] = st.st_size, st.st_mtime_ns
    return out


def _load_stats(plan: StorePlan) -> np.ndarray:
    check_own_file(plan.folder / FILES_FILE)
    try:
        stats = load_array(plan.folder / FILES_FILE)
    except (FileNotFoundError, ValueError, OSError):
        stats = None
    if stats is None or stats.shape != (plan.n, 2) or stats.dtype != np.int64:
        return np.full((plan.n, 2), _UNKNOWN, dtype=np.int64)
    return stats


def _save_stats(plan: StorePlan, stats: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, stats)
    write_bytes(plan.folder / FILES_FILE, buf.getvalue(), durable=False)


def _fresh(plan: StorePlan, items, invalidate: bool = False, readonly: bool = False) -> bool:
    """Whether the complete store's rows can be used as they are: computed from the files as
    they are now. Rows of unknown files (an older store) take the files as they are (recorded
    when the store can be written). With ``readonly`` (before taking the lock) a store that
    cannot be written is used as it is, changed files or not (a warning names them: nothing
    can be recomputed there). With ``invalidate`` (holding the store's lock): rows of changed
    files are marked to do again (a warning names them)."""
    import warnings

    stored, now = _load_stats(plan), file_stats(items)
    known = (stored[:, 0] != _UNKNOWN) & (now[:, 0] >= 0)
    changed = np.flatnonzero(known & (stored != now).any(axis=1))
    unknown = (stored[:, 0] == _UNKNOWN) & (now[:, 0] >= 0)
    writable = os.access(plan.folder, os.W_OK)
    if unknown.any() and writable and (invalidate or not changed.size):
        stored[unknown] = now[unknown]
        with contextlib.suppress(OSError):  # (a record only: the store is usable without it)
            _save_stats(plan, stored)
    if not changed.size:
        return True
    if readonly and not writable:
        warnings.warn(f"{changed.size} image file(s) changed since their features were stored "
                      f"in {plan.folder} (first: {os.fspath(items[changed[0]])}); the store "
                      f"cannot be written here, so its stored features are used: copy the "
                      f"cache somewhere writable (--cache-dir) to have them computed again",
                      stacklevel=3)
        return True
    if not invalidate:
        return False
    warnings.warn(f"{changed.size} image file(s) changed since their features were stored in "
                  f"{plan.folder} (first: {os.fspath(items[changed[0]])}): computing their "
                  f"rows again", stacklevel=3)
    mask = _load_mask(plan)
    if mask is None:
        mask = np.ones(plan.n, dtype=np.uint8)
    mask[changed] = 0
    _save_mask(plan.folder, mask)
    meta = plan.read_meta() or {}
    _write_meta(plan, int(mask.sum()), float(meta.get("seconds", 0.0)), items)
    return False


def _check_decodable(items) -> None:
    from .data.image_files import check_images

    try:
        check_images(items, decode=True)
    except (ValueError, FileNotFoundError) as err:
        raise ValueError(f"feature extraction of these {len(items)} images did not start "
                         f"(nothing was written for them; stores finished before are kept): "
                         f"{err}") from None


def _fill(plan, items, backbone, transform, batch_size, num_workers, pretrained, device, seed,
          progress, amp, channels_last, threads, desc) -> None:
    from tqdm import tqdm

    mask = _load_mask(plan) if plan.read_meta() is not None else None
    if mask is not None and plan.features_file.is_file():
        mm = plan.open("r+")
    else:  # new store (or a broken one): features first, then the mask, then the sidecar
        check_own_file(plan.features_file)
        mm = np.lib.format.open_memmap(plan.features_file, mode="w+", dtype=plan.dtype,
                                       shape=(plan.n, plan.d))
        fd = open_own(plan.features_file, os.O_RDWR)
        try:  # on a full disk: an error naming the file, not a SIGBUS while it is filled
            preallocate(fd, mm.offset + mm.nbytes, plan.features_file)
        finally:
            os.close(fd)
        mask = np.zeros(plan.n, dtype=np.uint8)
        _save_mask(plan.folder, mask)
        _write_meta(plan, 0, 0.0, items)
    todo = np.flatnonzero(mask == 0)
    t0 = time.perf_counter()
    spent = float((plan.read_meta() or {}).get("seconds", 0.0))
    stats, now = _load_stats(plan), file_stats(items)  # the files as these rows read them
    if todo.size == 0:
        _write_meta(plan, plan.n, spent, items)
        return
    net = _backbone_module(backbone, pretrained)
    dev = _device(device)
    amp = dev.type == "cuda" if amp is None else bool(amp)
    size = int(plan.fields["transform"].get("size") or net.input_size)
    tf, _ = make_transform(transform, size, net.mean, net.std)
    accel = start_acceleration(dev, "this extraction")
    if accel.gpu_decode:
        gpu_decodable(tf)
    workers = loader_workers(default_workers() if num_workers is None else num_workers)
    loader = torch.utils.data.DataLoader(
        _Rows(items, todo, tf, None if transform == "eval" else seed, raw=accel.gpu_decode,
              read=image_reader(None, tf, items)),
        batch_size=batch_size, shuffle=False, num_workers=workers, collate_fn=_collate,
        pin_memory=dev.type == "cuda", worker_init_fn=loader_worker_init,
        prefetch_factor=prefetch_factor(batch_size) if workers > 0 else None)
    was_training = net.training
    old_threads = torch.get_num_threads()
    torch.set_num_threads(int(threads or os.cpu_count() or 1))
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    net.eval().to(dev, memory_format=memory_format)
    run = accel.compiled(net.forward_features if "maps" in plan.fields else net)
    bar = tqdm(total=plan.n, initial=plan.n - todo.size, unit="img", disable=not progress,
               desc=desc or f"extract {plan.fields['backbone']}", smoothing=0.1)

    def finish(batch):  # a batch with unreadable rows stays as it is: the loop stops at it
        rows, x, errors = batch
        return batch if errors else (rows, finish_view(tf, *x, dev, channels_last), errors)

    try:
        for rows, x, errors in finished_batches(loader, finish, dev, ahead=accel.gpu_decode):
            if errors:
                row, message = errors[0]
                more = f" ({len(errors) - 1} more unreadable in this batch)" if len(errors) > 1 \
                    else ""
                raise ValueError(f"feature extraction stopped at row {row}: {message}{more}; "
                                 f"the {int(mask.sum())} rows computed so far are kept: fix or "
                                 f"drop the image and run again to finish the store")
            with torch.inference_mode(), torch.autocast(dev.type, enabled=amp):
                feats = run(x)
            feats = feats.float().flatten(1).cpu().numpy()
            if feats.shape != (len(rows), plan.d):
                raise ValueError(f"backbone {plan.fields['backbone']} returned features of "
                                 f"shape {feats.shape}, expected {(len(rows), plan.d)}")
            out = feats.astype(plan.dtype)
            if not np.isfinite(out).all():
                bad = rows[torch.from_numpy(~np.isfinite(out).all(axis=1))].tolist()
                hint = " (float16 overflow: use dtype float32)" if np.isfinite(feats).all() \
                    else ""
                raise ValueError(f"non-finite features for rows {bad[:5]} (first image: "
                                 f"{items[bad[0]]}){hint}")
            idx = rows.numpy()
            mm[idx] = out
            mm.flush()                 # rows are on disk before the mask says so
            mask[idx] = 1
            _save_mask(plan.folder, mask)
            bar.update(len(idx))
    finally:
        bar.close()
        torch.set_num_threads(old_threads)
        net.train(was_training)
        mm.flush()
        done = mask.astype(bool)
        fresh = done & np.isin(np.arange(plan.n), todo)  # computed in this fill
        stats[fresh] = now[fresh]
        _save_stats(plan, stats)  # (before the sidecar: a complete store has its files' stats)
        _write_meta(plan, int(mask.sum()), spent + time.perf_counter() - t0, items)
        del mm


def _backbone_module(backbone, pretrained: bool):
    if isinstance(backbone, str):
        from .models.backbones import create_backbone

        return create_backbone(backbone, pretrained=pretrained)
    return backbone


def extract_feature_maps(items, backbone="efficientnet_lite0", transform: str = "eval",
                         size: int | None = None, *, dtype: str = "float16",
                         **options) -> np.memmap:
    """Backbone feature maps of ``items``, ``N x C x h x w``, from the store or computed into it.

    `extract_features` with ``maps=True`` (same options, same resumable memory-mapped
    store; ``dtype`` defaults to float16 here: maps are ``h * w`` times larger than pooled
    features), reshaped (a view, nothing copied). Random views (``transform`` ``weak`` /
    ``strong``) are drawn per row from ``seed``: ``seed=v`` gives the v-th cached view.

    >>> import tempfile
    >>> from pathlib import Path
    >>> from PIL import Image
    >>> d = Path(tempfile.mkdtemp())
    >>> Image.new("RGB", (20, 20), (10, 200, 30)).save(d / "a.png")
    >>> m = extract_feature_maps([str(d / "a.png")], "tiny_cnn", "weak", 16, cache_dir=d,
    ...                          progress=False, num_workers=0, seed=1)
    >>> m.shape, m.dtype.name
    ((1, 32, 2, 2), 'float16')
    """
    flat = extract_features(items, backbone, transform, size, dtype=dtype, maps=True, **options)
    meta = json.loads((Path(flat.filename).parent / META_FILE).read_text())
    return flat.reshape(len(flat), *meta["key_fields"]["maps"])


# ---- datasets and splits ----------------------------------------------------------------------
def _feature_set(ls: LabelledSet, backbone, what: str, **options) -> LabelledSet:
    feats = extract_features(ls.x, backbone, desc=f"{what} ({len(ls)} images)", **options)
    return LabelledSet(feats, ls.y, list(ls.class_names), ls.ids, ls.where, ls.groups)


def feature_dataset(ds: Dataset, backbone="efficientnet_lite0", **options) -> Dataset:
    """``ds`` with the image paths of pool and test replaced by their cached features (one store
    each, and one for a val set given apart; ``options`` as `extract_features`). The
    protocol then runs on features as on any feature source, and the pool store serves every
    regime, seed and split."""
    pool = _feature_set(ds.pool, backbone, f"{ds.name} pool", **options)
    test = _feature_set(ds.test, backbone, f"{ds.name} test", **options)
    val = None if ds.val is None else _feature_set(ds.val, backbone, f"{ds.name} val", **options)
    name = backbone if isinstance(backbone, str) else backbone.cache_key
    meta = {**ds.meta, "backbone": name, "feature_stores": [
        str(Path(s.x.filename).parent) for s in (pool, test, val) if s is not None]}
    return dataclasses.replace(ds, pool=pool, test=test, val=val, meta=meta)


def feature_splits(splits: Splits, backbone="efficientnet_lite0", **options) -> Splits:
    """The same splits with ``x`` of train, val and test replaced by their cached features (one
    store per split; ``options`` as `extract_features`), for the linear engine and the
    benchmark."""
    sets = {s: _feature_set(getattr(splits, s), backbone, f"{splits.name} {s}", **options)
            for s in ("train", "val", "test")}
    name = backbone if isinstance(backbone, str) else backbone.cache_key
    return dataclasses.replace(splits, **sets, meta={**splits.meta, "backbone": name})


#: keys of the ``features`` dataset option (``--data`` / ``dataset_options``)
FEATURE_OPTIONS = ("transform", "size", "dtype", "cache_dir", "batch_size", "num_workers",
                   "pretrained", "device", "progress", "weights")


def require_images(ds: Dataset) -> Dataset:
    """``ds`` itself when its items are images (paths); a source that already holds feature
    vectors raises ``ValueError`` naming it (a backbone applies to image sources only)."""
    if holds_vectors(ds.pool.x):
        shape = ds.pool.x.shape
        raise ValueError(f"dataset {ds.name!r} already holds feature vectors "
                         f"({shape[1] if len(shape) > 1 else '?'}-d); a backbone applies to "
                         f"image sources only (spml list datasets)")
    return ds
