"""What a loader worker delivers of an image and what the training process finishes.

Workers deliver uint8 images (`load_view`: RGB, the exact PIL resize and any PIL
augmentation of the transform), or with ``--gpu-decode`` the JPEG file's bytes (`raw_item`);
`finish_view` runs the cheap steps (deferred flips, normalisation; nvJPEG decoding and resize
for raw bytes) where the model runs. The feature cache, the engine and the image methods all
load images through these, so every image path has one loader's steps.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

__all__ = ["finish_view", "gpu_decodable", "load_view", "raw_item"]


def load_view(transform: Callable, img, generator) -> tuple[torch.Tensor, bool]:
    """What a loader worker delivers of ``img``: ``(uint8 image, flip)`` from a transform with
    ``load`` / ``finish`` (`spmlkit.data.transforms.ImageTransform`), else
    ``(transform(img, generator), False)`` (a user's transform, finished as it is)."""
    if hasattr(transform, "load") and hasattr(transform, "finish"):
        return transform.load(img, generator)
    return transform(img, generator), False


def finish_view(transform: Callable, inputs, flips, device: torch.device,
                channels_last: bool = False) -> torch.Tensor:
    """A batch of `load_view` on ``device``: copied there (asynchronously from pinned
    memory), then the transform's cheap steps (flips, normalisation) run there; a list of raw
    files (``--gpu-decode``) is decoded and resized there first."""
    if isinstance(inputs, list):
        inputs = _decode_jpegs(inputs, transform.size, device)
    else:
        inputs = inputs.to(device, non_blocking=True)
    if inputs.dtype == torch.uint8:
        inputs = transform.finish(inputs, flips)
    if channels_last:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    return inputs


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

    if not (isinstance(item, (str, bytes)) or hasattr(item, "__fspath__")):
        raise ValueError(f"--gpu-decode reads image files; got a {type(item).__name__} item")
    data = torch.from_numpy(np.fromfile(item, dtype=np.uint8))
    steps = transform.steps
    flip = bool(steps) and _coin(gen if gen is not None else torch.Generator(), steps[0].p)
    return data, flip


def _decode_jpegs(files: list, size: int, device: torch.device) -> torch.Tensor:
    """JPEG files' bytes -> B x 3 x size x size uint8 on ``device`` (nvJPEG, then a bilinear
    antialiased resize there)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    # nvJPEG's hardware decoder writes its outputs before the work already queued on the stream
    # has run, and those outputs come from torch's caching allocator: memory that queued kernels
    # may still read (freed, then handed out again). Without this wait, runs on an H200 went NaN
    # in their first or second epoch (pytorch/vision#9606, meta-pytorch/torchcodec#1634). One
    # host wait per batch.
    torch.cuda.current_stream(device).synchronize()
    try:
        images = decode_jpeg(files, mode=ImageReadMode.RGB, device=device)
    except RuntimeError as err:
        raise ValueError(f"--gpu-decode: nvJPEG could not decode a file of the batch ("
                         f"{str(err).splitlines()[0]}); it takes JPEG files only") from None
    out = torch.empty((len(images), 3, size, size), dtype=torch.uint8, device=device)
    for i, img in enumerate(images):
        if tuple(img.shape[1:]) == (size, size):
            out[i] = img
            continue
        resized = torch.nn.functional.interpolate(img[None].float(), size=(size, size),
                                                  mode="bilinear", align_corners=False,
                                                  antialias=True)
        out[i] = resized[0].round_().clamp_(0, 255)
    return out
