"""Opt-in speed-ups of the image paths that change bits (off by default, so a run's results stay
what they were): cudnn's autotuner, ``torch.compile`` of the model, GPU JPEG decoding and
JPEG decoding at a reduced scale.

They are set for a block with `acceleration` (``spml train`` / ``spml extract``:
``--cudnn-benchmark``, ``--compile [MODE]``, ``--gpu-decode``, ``--jpeg-draft``) and read by
every image path
(fine-tuning, linear_init, LAC / MIME on images, feature extraction):

- ``cudnn_benchmark``: ``torch.backends.cudnn.benchmark = True`` for the run. cudnn times its
  convolution algorithms on each new input shape and keeps the fastest: seconds at the start
  (and at the first batch of each new shape, e.g. a last short batch); the algorithm chosen may
  differ between runs, so results are no longer bit-reproducible. CUDA only.
- ``compile``: the model runs through ``torch.compile(model, mode=...)``; ``"default"``,
  ``"reduce-overhead"`` (CUDA graphs: the step's kernels replayed as one graph, what pays at
  small batches such as the Cole protocol's 8) or ``"max-autotune"``. Costs a compilation of
  tens of seconds to minutes at the start and again for each new batch shape (the last short
  batch, train / eval mode); the fused kernels round differently from eager ones. Needs a C++
  compiler on a CPU, Triton on CUDA.
- ``gpu_decode``: loader workers only read the files' bytes; the training process decodes the
  JPEGs on the GPU with torchvision's nvJPEG (``torchvision.io.decode_jpeg(device="cuda")``),
  resizes them there (bilinear with antialiasing: not PIL's resize, so the pixels differ by a
  few levels from the CPU path) and flips / normalises as the CPU path, on a CUDA stream of its
  own (`spmlkit.data.image_views`: nvJPEG must not be handed memory that queued kernels still
  read). Needs torchvision and a CUDA device; JPEG files only; the eval and weak views only
  (LAC's strong view runs PIL operations).
- ``jpeg_draft``: the loader workers decode a JPEG at the smallest of libjpeg's scales (1/2,
  1/4, 1/8) whose image is still at least the view's size, then resize it with PIL as before
  (``PIL.Image.draft``): a photo much larger than the view decodes several times faster (a
  4000 x 3000 JPEG to 224 px: 33 ms against 141 ms, ``results/jpeg-draft.csv``), and the
  pixels differ from the full decode's by a fraction of a level on average (the scaled DCT is
  not PIL's resize; EfficientNet-Lite0's features: cosine 0.996-0.998 to the full decode's).
  Other files, and JPEGs not twice the view's size, decode as before. spmlkit's image reader
  only (not an ``image_reader`` of your own), JPEG files (refused where none is one), not
  with ``gpu_decode``; feature stores
  extracted with it (or with ``gpu_decode``) are stores of their own (a key field
  ``decode``).
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch

__all__ = ["COMPILE_MODES", "Acceleration", "acceleration", "current_acceleration"]

#: the modes of ``torch.compile`` that ``--compile`` takes
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")

_CURRENT: contextvars.ContextVar = contextvars.ContextVar("spmlkit_acceleration", default=None)


@dataclass(frozen=True)
class Acceleration:
    """The opt-in speed-ups (module docstring); the default is none of them."""

    cudnn_benchmark: bool = False
    compile: str | None = None
    gpu_decode: bool = False
    jpeg_draft: bool = False

    def __post_init__(self):
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got "
                             f"{self.compile!r}")
        if self.gpu_decode and self.jpeg_draft:
            raise ValueError("--gpu-decode and --jpeg-draft: nvJPEG decodes on the GPU, "
                             "--jpeg-draft is for the loader workers' decoder: choose one")

    @property
    def decoder(self) -> str | None:
        """How images are decoded when not as by default (PIL, full scale): ``"nvjpeg"``
        (``gpu_decode``), ``"pil-draft"`` (``jpeg_draft``) or ``None``."""
        return "nvjpeg" if self.gpu_decode else "pil-draft" if self.jpeg_draft else None

    @property
    def any(self) -> bool:
        return self.cudnn_benchmark or self.compile is not None or self.gpu_decode or \
            self.jpeg_draft

    def flags(self) -> list[str]:
        """The ``spml`` flags that set this (for messages)."""
        out = ["--cudnn-benchmark"] if self.cudnn_benchmark else []
        out += [f"--compile {self.compile}"] if self.compile else []
        out += ["--gpu-decode"] if self.gpu_decode else []
        return out + (["--jpeg-draft"] if self.jpeg_draft else [])

    def check(self, device: torch.device, where: str) -> None:
        """Refuse what cannot apply on ``device`` (``where``: the run, for the message)."""
        device = torch.device(device)
        if self.cudnn_benchmark and device.type != "cuda":
            raise ValueError(f"--cudnn-benchmark: cudnn's autotuner is CUDA's; {where} runs on "
                             f"{device.type}")
        if self.gpu_decode:
            if device.type != "cuda":
                raise ValueError(f"--gpu-decode decodes JPEGs with nvJPEG on a CUDA device; "
                                 f"{where} runs on {device.type}")
            try:
                import torchvision.io  # noqa: F401
            except ModuleNotFoundError:
                raise ModuleNotFoundError("--gpu-decode needs torchvision "
                                          "(torchvision.io.decode_jpeg); install it or leave "
                                          "the flag off") from None

    def compiled(self, module):
        """``module`` through ``torch.compile`` when asked, else ``module`` itself."""
        if self.compile is None:
            return module
        return torch.compile(module, mode=self.compile)


@contextlib.contextmanager
def acceleration(accel: Acceleration | None = None, **options):
    """Within the block the image paths use ``accel`` (or ``Acceleration(**options)``); the
    cudnn autotuner's setting is restored at the end."""
    accel = accel or Acceleration(**options)
    token = _CURRENT.set(accel)
    before = torch.backends.cudnn.benchmark
    try:
        yield accel
    finally:
        torch.backends.cudnn.benchmark = before
        _CURRENT.reset(token)


def current_acceleration() -> Acceleration:
    """What `acceleration` set for this block (none of them outside one)."""
    return _CURRENT.get() or Acceleration()


def start(device: torch.device, where: str) -> Acceleration:
    """The block's acceleration, checked for ``device``; turns cudnn's autotuner on."""
    accel = current_acceleration()
    accel.check(device, where)
    if accel.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    return accel
