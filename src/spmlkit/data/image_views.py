"""What a loader worker delivers of an image and what the training process finishes.

Workers deliver uint8 images (`load_view`: RGB, the exact PIL resize and any PIL
augmentation of the transform), or with ``--gpu-decode`` the JPEG file's bytes (`raw_item`);
`finish_view` runs the cheap steps (deferred flips, normalisation; nvJPEG decoding and resize
for raw bytes) where the model runs, and `finished_batches` runs it over a loader's batches
(with ``--gpu-decode``, a few batches ahead in a thread of its own). The feature cache, the
engine and the image methods all load images through these, so every image path has one
loader's steps.
"""
from __future__ import annotations

import os
import queue
import threading
from typing import Callable, Iterable, Iterator, NamedTuple

import numpy as np
import torch

__all__ = ["RawFiles", "finish_view", "finished_batches", "gpu_decodable", "image_reader",
           "load_view", "raw_item", "stack_views"]


def image_reader(read: Callable | None, transform, items=()) -> Callable:
    """What a dataset of image files opens them with: ``read`` (a reader of your own), else
    `spmlkit.data.image_files.open_image`; under ``--jpeg-draft`` (the block's
    `spmlkit.accel.acceleration`) JPEGs decoded at the smallest scale still at least the
    ``transform``'s size (`spmlkit.data.image_files.DraftReader`).

    Raises:
        ValueError: ``--jpeg-draft`` with a reader of your own, a transform without a
            ``size``, ``items`` that are images in memory, not files, or no JPEG file among
            them (it would change nothing).
    """
    from ..accel import current_acceleration
    from .image_files import DraftReader, open_image

    if not current_acceleration().jpeg_draft:
        return read or open_image
    if isinstance(read, DraftReader):  # (passed on: the prediction passes of a run)
        return read
    if read is not None:
        raise ValueError("--jpeg-draft decodes with spmlkit's image reader; this run opens its "
                         "images with a reader of its own (image_reader=): leave --jpeg-draft "
                         "off")
    if len(items) and not _is_path(items[0]):
        raise ValueError(f"--jpeg-draft decodes image files; these items are "
                         f"{type(items[0]).__name__} objects in memory: leave --jpeg-draft off")
    if len(items) and not any(os.fsdecode(i).lower().endswith((".jpg", ".jpeg")) for i in items):
        raise ValueError(f"--jpeg-draft decodes JPEG files at a reduced scale; none of these "
                         f"{len(items)} files is a .jpg / .jpeg (e.g. {os.fsdecode(items[0])}): "
                         f"leave --jpeg-draft off")
    size = getattr(transform, "size", None)
    if not size:
        raise ValueError(f"--jpeg-draft decodes at a scale no smaller than the view's size; "
                         f"the transform {type(transform).__name__} has no size: leave "
                         f"--jpeg-draft off")
    return DraftReader(int(size))


def _is_path(item) -> bool:
    return isinstance(item, (str, bytes)) or hasattr(item, "__fspath__")


def load_view(transform: Callable, img, generator) -> tuple[torch.Tensor, bool]:
    """What a loader worker delivers of ``img``: ``(uint8 image, flip)`` from a transform with
    ``load`` / ``finish`` (`spmlkit.data.transforms.ImageTransform`), else
    ``(transform(img, generator), False)`` (a user's transform, finished as it is)."""
    if hasattr(transform, "load") and hasattr(transform, "finish"):
        return transform.load(img, generator)
    return transform(img, generator), False


class RawFiles(NamedTuple):
    """A batch of files' bytes (``--gpu-decode``) as one tensor: ``data`` holds the files one
    after another, ``sizes`` their lengths. A loader worker hands it over as one shared-memory
    block; a list of the files' tensors took one block (a file descriptor, a memory map) per
    file: about 7 ms of the receiving thread per batch of 32 against 1 ms (2-core machine),
    in the thread that pins the batches, which holds the interpreter's lock for much of it."""
    data: torch.Tensor
    sizes: torch.Tensor

    def files(self) -> list[torch.Tensor]:
        """Each file's bytes (views of ``data``)."""
        return list(torch.split(self.data, self.sizes.tolist()))


def stack_views(views) -> "torch.Tensor | RawFiles":
    """A batch of `load_view` images (stacked: B x 3 x H x W uint8) or of `raw_item` files'
    bytes (`RawFiles`)."""
    if views[0].ndim == 1:
        return RawFiles(torch.cat(list(views)),
                        torch.tensor([len(v) for v in views], dtype=torch.int64))
    return torch.stack(list(views))


def finish_view(transform: Callable, inputs, flips, device: torch.device,
                channels_last: bool = False) -> torch.Tensor:
    """A batch of `load_view` on ``device``: copied there (asynchronously from pinned
    memory), then the transform's cheap steps (flips, normalisation) run there; raw files
    (``--gpu-decode``: `RawFiles` or a list of each file's bytes) are decoded and resized there
    first."""
    if isinstance(inputs, (RawFiles, list)):
        inputs = _decode_jpegs(inputs, transform.size, device)
    else:
        inputs = inputs.to(device, non_blocking=True)
    if inputs.dtype == torch.uint8:
        inputs = transform.finish(inputs, flips)
    if channels_last:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    return inputs


#: the name of the thread that `finished_batches` finishes batches ahead in
AHEAD_NAME = "spmlkit-decode-ahead"


def finished_batches(batches: Iterable, finish: Callable, device: torch.device,
                     ahead: bool = False, depth: int = 2) -> Iterator:
    """``finish(batch)`` of every batch of ``batches`` (a loader), in order.

    ``ahead`` (``--gpu-decode``): a thread of its own takes the loader's next batches and
    finishes up to ``depth`` of them ahead of the one in use, on the decode stream (CUDA), while
    this thread queues the model's steps. nvJPEG's host work (header parsing, its wait for the
    decoder: 0.5-0.7 s of a 4 s epoch at batch 32 on an H100, where the host, not the GPU, sets
    the pace) then no longer sits between two training steps (that H100: 613 -> 644 training
    images a second, ``results/gpu-throughput.csv``). This thread's stream waits for each
    batch's event before using it, and its tensors are recorded on this stream so the allocator
    does not hand their memory to the decode stream again while this one still reads them. An
    error in the loader or in ``finish`` is raised here, at its batch; leaving the loop early
    (``break``, an error in the step) stops the thread and waits for it, so the loader is free
    for its next pass. Without ``ahead``: the same batches, finished in this thread.
    """
    if not ahead:
        for batch in batches:
            yield finish(batch)
        return
    cuda = device.type == "cuda"
    if cuda:
        index = device.index if device.index is not None else torch.cuda.current_device()
        device = torch.device("cuda", index)
        side = _decode_stream(device)
    done: queue.Queue = queue.Queue(maxsize=max(1, int(depth)))
    stop = threading.Event()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                done.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work():
        try:
            for batch in batches:
                if not cuda:
                    entry = (finish(batch), None)
                else:
                    with torch.cuda.device(device), torch.cuda.stream(side):
                        out = finish(batch)
                        event = torch.cuda.Event()
                        event.record(side)
                    entry = (out, event)
                if not put(("batch", entry)):
                    return
            put(("end", None))
        except BaseException as err:  # raised in the consuming thread
            put(("error", err))

    thread = threading.Thread(target=work, name=AHEAD_NAME, daemon=True)
    thread.start()
    try:
        while True:
            kind, value = done.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            out, event = value
            if event is not None:
                here = torch.cuda.current_stream(device)
                here.wait_event(event)
                _record_on(out, here)
            yield out
    finally:
        stop.set()
        thread.join()


def _record_on(value, stream) -> None:
    """``record_stream(stream)`` for every CUDA tensor in ``value`` (a tensor, or tuples and
    lists of them: what the callers' ``finish`` returns)."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            value.record_stream(stream)
    elif isinstance(value, (tuple, list)):
        for part in value:
            _record_on(part, stream)


def gpu_decodable(transform) -> None:
    """Refuse a transform that GPU decoding cannot run (PIL steps beyond a flip)."""
    from .transforms import ImageTransform, RandomHorizontalFlip

    steps = getattr(transform, "steps", None)
    if not isinstance(transform, ImageTransform) or len(steps) > 1 or \
            any(not isinstance(step, RandomHorizontalFlip) for step in steps):
        name = getattr(transform, "name", type(transform).__name__)
        raise ValueError(f"--gpu-decode runs the eval and weak views (resize, flip, normalise) "
                         f"on the GPU; the {name} has PIL steps that need the decoded image on "
                         f"the CPU: leave --gpu-decode off")


def raw_item(item, transform, gen) -> tuple[torch.Tensor, bool]:
    from .transforms import _coin

    if not _is_path(item):
        raise ValueError(f"--gpu-decode reads image files; got a {type(item).__name__} item")
    data = torch.from_numpy(np.fromfile(item, dtype=np.uint8))
    steps = transform.steps
    flip = bool(steps) and _coin(gen if gen is not None else torch.Generator(), steps[0].p)
    return data, flip


#: device index -> the CUDA stream that `_decode_jpegs` decodes and resizes on
_DECODE_STREAMS: dict = {}


def _decode_jpegs(files, size: int, device: torch.device) -> torch.Tensor:
    """JPEG files' bytes (`RawFiles`, or a list of each file's) -> B x 3 x size x size uint8 on
    ``device`` (nvJPEG, then a bilinear antialiased resize there), on a stream of their own
    that the caller's stream then waits for.

    nvJPEG's hardware decoder writes its outputs before the work queued on the stream has run,
    and those outputs come from torch's caching allocator, which hands out again memory that
    queued kernels may still read (freed on that stream: pytorch/vision#9606,
    meta-pytorch/torchcodec#1634; runs on an H200 went NaN in their first or second epoch).
    Waiting for the caller's stream before each decode avoided it, but kept the host from
    queueing the next step while the GPU trained (measured: 56 % of the compute ceiling). Here
    the decode allocates from a stream that runs only the decode steps (these decodes and
    resizes; with `finished_batches` ahead, the batches' finish too), so the wait before it is
    for the previous batch's steps only; the result is handed to the caller's stream with
    ``record_stream``, so the allocator does not reuse it before the caller's kernels have
    read it."""
    from torchvision.io import ImageReadMode, decode_jpeg

    if isinstance(files, RawFiles):
        files = files.files()
    caller = torch.cuda.current_stream(device)
    side = _decode_stream(caller.device)
    side.synchronize()  # this stream's queued work: the last batch's resizes
    with torch.cuda.stream(side):
        try:
            images = decode_jpeg(files, mode=ImageReadMode.RGB, device=device)
        except RuntimeError as err:
            raise ValueError(f"--gpu-decode: nvJPEG could not decode a file of the batch ("
                             f"{str(err).splitlines()[0]}); it takes JPEG files only") from None
        out = resize_all(images, size)
    caller.wait_stream(side)
    out.record_stream(caller)
    return out


def _decode_stream(device: torch.device):
    """The device's decode stream (made at its first use; high priority, so that its few
    kernels are not queued behind the training steps' on the GPU)."""
    index = device.index
    side = _DECODE_STREAMS.get(index)
    if side is None:
        # -1: CUDA's highest priority on this hardware (torch maps it into the device's range)
        side = _DECODE_STREAMS[index] = torch.cuda.Stream(device=device, priority=-1)
    return side


def resize_all(images: list, size: int) -> torch.Tensor:
    """Decoded 3 x H x W uint8 images -> B x 3 x size x size uint8 (bilinear, antialiased,
    rounded), the images of one shape resized as one batch (a few kernels, not a few per
    image; each image's pixels as if resized alone)."""
    if not images:
        raise ValueError("resize_all: no images")
    first = images[0]
    out = torch.empty((len(images), 3, size, size), dtype=torch.uint8, device=first.device)
    shapes: dict = {}
    for i, img in enumerate(images):
        shapes.setdefault(tuple(img.shape[1:]), []).append(i)
    for shape, rows in shapes.items():
        batch = torch.stack([images[i] for i in rows])
        if shape != (size, size):
            batch = torch.nn.functional.interpolate(batch.float(), size=(size, size),
                                                    mode="bilinear", align_corners=False,
                                                    antialias=True).round_().clamp_(0, 255)
        if len(rows) == len(images):
            out.copy_(batch)
        else:  # one copy per image: an index tensor would be a copy to the device, and a wait
            for k, i in enumerate(rows):
                out[i].copy_(batch[k])
    return out
