"""Image views for training and evaluation: our own code on PIL images and tensors, seeded.

Three factories share one call contract, ``t(img, generator=None) -> FloatTensor 3 x size x size``
(normalised with ``mean`` / ``std``, ImageNet's by default):

- `eval_transform` resizes to ``size x size`` (bilinear) and normalises; it draws nothing.
- `weak_view` is the fine-tuning view of docs/spec.md#protocol and the weak view of
  section 8: resize, then a horizontal flip with probability 0.5.
- `strong_view` is LAC's strong view (docs/spec.md#lac), in this order: resize, flip
  (p 0.5), Cutout of half the side with a random colour, RandAugment with 2 ops, colour jitter
  (brightness / contrast / saturation 0.4, hue 0.1) with p 0.8, grayscale with p 0.2.

Randomness comes only from the ``generator`` argument (a ``torch.Generator``); nothing reads or
advances a global RNG. The same image and a generator in the same state give bit-identical
outputs. ``generator=None`` draws from a fresh generator seeded from the operating system, so
the result is random and not reproducible: pass a generator (e.g. one seeded from the run seed,
the epoch and the example's index) wherever reproducibility matters.

Inputs of any PIL mode are converted to RGB first (grayscale ``L`` inputs become 3 equal
channels). Each transform has a ``spec`` (a dict of everything that changes its output) and a
stable ``repr``, usable as a cache key.

RandAugment's magnitude uses the 31-level scale of the RandAugment paper's public implementations
(torchvision, ``magnitude`` in 0..30, default 9): an op at magnitude ``m`` applies ``m / 30`` of
its maximum strength (rotate 30 degrees, shear 0.3, translate 0.45 of the side, enhance factor
1 +/- 0.9, posterize down to 4 bits, solarize threshold down to 0). Signed ops take a random sign.
The two ops are drawn uniformly with replacement from `RANDAUGMENT_OPS`.

>>> from PIL import Image
>>> img = Image.new("RGB", (40, 30), (255, 0, 0))
>>> g = torch.Generator().manual_seed(0)
>>> strong_view(32)(img, g).shape
torch.Size([3, 32, 32])
>>> float(eval_transform(8, mean=(0, 0, 0), std=(1, 1, 1))(img)[0, 0, 0])
1.0
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

MAX_MAGNITUDE = 30          # RandAugment's magnitude scale: 0..30 (31 levels)
FILL = 128                  # grey fill for the pixels geometric ops uncover


# ---------------------------------------------------------------------------------------------
# drawing from a torch.Generator (never from a global RNG)

def _generator(generator: torch.Generator | None) -> torch.Generator:
    if generator is None:
        fresh = torch.Generator()
        fresh.seed()                      # seeded from the OS; touches no global state
        return fresh
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__}")
    return generator


def _uniform(g: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand((), generator=g, dtype=torch.float64))


def _randint(g: torch.Generator, low: int, high: int) -> int:
    """An integer in [low, high)."""
    return int(torch.randint(low, high, (), generator=g))


def _coin(g: torch.Generator, p: float) -> bool:
    """True with probability ``p``; always draws one number so the stream does not depend on p."""
    return float(torch.rand((), generator=g, dtype=torch.float64)) < p


# ---------------------------------------------------------------------------------------------
# PIL helpers

def _pil():
    try:
        from PIL import Image
    except ModuleNotFoundError:
        from ..extras import install_hint

        raise ModuleNotFoundError("image transforms need Pillow: " +
                                  install_hint("images", "Pillow")) from None
    return Image


def to_rgb(img):
    """``img`` as an RGB PIL image (any mode accepted; transparency composited on white)."""
    Image = _pil()
    if not isinstance(img, Image.Image):
        raise TypeError(f"expected a PIL.Image.Image, got {type(img).__name__}; open files with "
                        f"spmlkit.data.image_files.open_image(path)")
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def _fill(img):
    return FILL if img.mode == "L" else (FILL,) * len(img.getbands())


def _check_mode(img) -> None:
    if img.mode not in ("RGB", "L"):
        raise ValueError(f"RandAugment ops take RGB or L images, got mode {img.mode!r}; convert "
                         f"with to_rgb(img) first")


def _affine(img, coeffs):
    Image = _pil()
    return img.transform(img.size, Image.Transform.AFFINE, coeffs,
                         resample=Image.Resampling.NEAREST, fillcolor=_fill(img))


def _enhance(kind: str):
    def op(img, v):
        from PIL import ImageEnhance

        return getattr(ImageEnhance, kind)(img).enhance(max(0.0, 1.0 + 0.9 * v))
    op.__name__ = kind
    return op


def _identity(img, v):
    return img


def _autocontrast(img, v):
    from PIL import ImageOps

    return ImageOps.autocontrast(img)


def _equalize(img, v):
    from PIL import ImageOps

    return ImageOps.equalize(img)


def _rotate(img, v):
    Image = _pil()
    return img.rotate(30.0 * v, resample=Image.Resampling.NEAREST, fillcolor=_fill(img))


def _solarize(img, v):
    from PIL import ImageOps

    return ImageOps.solarize(img, threshold=int(round(256 - 256 * abs(v))))


def _posterize(img, v):
    from PIL import ImageOps

    return ImageOps.posterize(img, 8 - int(round(4 * abs(v))))


def _shear_x(img, v):
    s = 0.3 * v
    return _affine(img, (1.0, s, -s * img.size[1] / 2.0, 0.0, 1.0, 0.0))   # about the centre


def _shear_y(img, v):
    s = 0.3 * v
    return _affine(img, (1.0, 0.0, 0.0, s, 1.0, -s * img.size[0] / 2.0))


def _translate_x(img, v):
    return _affine(img, (1.0, 0.0, 0.45 * v * img.size[0], 0.0, 1.0, 0.0))


def _translate_y(img, v):
    return _affine(img, (1.0, 0.0, 0.0, 0.0, 1.0, 0.45 * v * img.size[1]))


#: RandAugment's ops: name -> op(img, v) with ``v`` the signed strength in [-1, 1]
#: (unsigned ops use ``|v|``). Every op takes and returns an RGB or L image of the same size.
RANDAUGMENT_OPS: dict[str, Callable] = {
    "Identity": _identity,
    "AutoContrast": _autocontrast,
    "Equalize": _equalize,
    "Rotate": _rotate,
    "Solarize": _solarize,
    "Posterize": _posterize,
    "Color": _enhance("Color"),
    "Contrast": _enhance("Contrast"),
    "Brightness": _enhance("Brightness"),
    "Sharpness": _enhance("Sharpness"),
    "ShearX": _shear_x,
    "ShearY": _shear_y,
    "TranslateX": _translate_x,
    "TranslateY": _translate_y,
}


def apply_op(img, name: str, magnitude: float = 9, sign: int = 1):
    """Apply the RandAugment op ``name`` at ``magnitude`` (0..30) with ``sign`` (+1 / -1).

    >>> from PIL import Image
    >>> apply_op(Image.new("L", (8, 8), 200), "Solarize", 30).getpixel((0, 0))
    55
    """
    if name not in RANDAUGMENT_OPS:
        raise ValueError(f"unknown RandAugment op {name!r}; known: {', '.join(RANDAUGMENT_OPS)}")
    if not 0 <= magnitude <= MAX_MAGNITUDE:
        raise ValueError(f"RandAugment magnitude must be in [0, {MAX_MAGNITUDE}], got {magnitude}")
    if sign not in (1, -1):
        raise ValueError(f"sign must be +1 or -1, got {sign}")
    _check_mode(img)
    return RANDAUGMENT_OPS[name](img, sign * magnitude / MAX_MAGNITUDE)


# ---------------------------------------------------------------------------------------------
# random steps on PIL images: step(img, g) -> img

class RandomHorizontalFlip:
    def __init__(self, p: float = 0.5):
        self.p = _probability(p, "flip probability")

    def __call__(self, img, g):
        Image = _pil()
        return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if _coin(g, self.p) else img


class Cutout:
    """Paint one rectangle of ``factor`` times each side with one random colour.

    As in the ASL / LAC code (``CutoutPIL``), the centre is uniform over the image and the box is
    clipped at the border, so boxes near an edge are smaller than ``factor`` x the side.
    """

    def __init__(self, factor: float = 0.5):
        if not 0.0 < factor <= 1.0:
            raise ValueError(f"Cutout factor must be in (0, 1], got {factor}")
        self.factor = float(factor)

    def box(self, width: int, height: int, g) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) of the box, drawn from ``g``."""
        cw, ch = int(width * self.factor), int(height * self.factor)
        cx, cy = _randint(g, 0, width), _randint(g, 0, height)
        left, right = max(0, cx - cw // 2), min(width, cx + cw - cw // 2)
        top, bottom = max(0, cy - ch // 2), min(height, cy + ch - ch // 2)
        return left, top, right, bottom

    def __call__(self, img, g):
        Image = _pil()
        left, top, right, bottom = self.box(img.size[0], img.size[1], g)
        colour = torch.randint(0, 256, (len(img.getbands()),), generator=g).numpy()
        arr = np.array(img)
        if arr.ndim == 2:
            arr[top:bottom, left:right] = colour[0]
        else:
            arr[top:bottom, left:right, :] = colour.astype(arr.dtype)
        return Image.fromarray(arr, img.mode)


class RandAugment:
    """``num_ops`` ops drawn uniformly (with replacement) from ``ops``, each at ``magnitude``."""

    def __init__(self, num_ops: int = 2, magnitude: float = 9, ops: Sequence[str] | None = None):
        if int(num_ops) != num_ops or num_ops < 0:
            raise ValueError(f"RandAugment num_ops must be a non-negative integer, got {num_ops}")
        if not 0 <= magnitude <= MAX_MAGNITUDE:
            raise ValueError(f"RandAugment magnitude must be in [0, {MAX_MAGNITUDE}], "
                             f"got {magnitude}")
        self.ops = tuple(RANDAUGMENT_OPS if ops is None else ops)
        unknown = [o for o in self.ops if o not in RANDAUGMENT_OPS]
        if unknown or not self.ops:
            raise ValueError(f"unknown RandAugment op(s) {unknown or '(none given)'}; known: "
                             f"{', '.join(RANDAUGMENT_OPS)}")
        self.num_ops, self.magnitude = int(num_ops), float(magnitude)

    def __call__(self, img, g):
        for _ in range(self.num_ops):
            name = self.ops[_randint(g, 0, len(self.ops))]
            sign = 1 if _coin(g, 0.5) else -1
            img = apply_op(img, name, self.magnitude, sign)
        return img


class ColorJitter:
    """Brightness, contrast, saturation factors uniform in [1 - b, 1 + b] etc. and a hue shift
    uniform in [-hue, hue] (fraction of the hue circle), applied in a random order, all with
    probability ``p`` (drawn once)."""

    def __init__(self, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, p=0.8):
        for name, v in (("brightness", brightness), ("contrast", contrast),
                        ("saturation", saturation)):
            if v < 0:
                raise ValueError(f"colour jitter {name} must be >= 0, got {v}")
        if not 0 <= hue <= 0.5:
            raise ValueError(f"colour jitter hue must be in [0, 0.5], got {hue}")
        self.brightness, self.contrast, self.saturation, self.hue = \
            float(brightness), float(contrast), float(saturation), float(hue)
        self.p = _probability(p, "colour jitter probability")

    def __call__(self, img, g):
        from PIL import ImageEnhance

        if not _coin(g, self.p):
            return img
        order = torch.randperm(4, generator=g).tolist()
        b = _uniform(g, max(0.0, 1 - self.brightness), 1 + self.brightness)
        c = _uniform(g, max(0.0, 1 - self.contrast), 1 + self.contrast)
        s = _uniform(g, max(0.0, 1 - self.saturation), 1 + self.saturation)
        h = _uniform(g, -self.hue, self.hue)
        for k in order:
            if k == 0 and self.brightness:
                img = ImageEnhance.Brightness(img).enhance(b)
            elif k == 1 and self.contrast:
                img = ImageEnhance.Contrast(img).enhance(c)
            elif k == 2 and self.saturation:
                img = ImageEnhance.Color(img).enhance(s)
            elif k == 3 and self.hue:
                img = _shift_hue(img, h)
        return img


def _shift_hue(img, h: float):
    Image = _pil()
    if img.mode == "L":
        return img
    shift = int(round(h * 255))
    hue, sat, val = img.convert("HSV").split()
    hue = hue.point([(v + shift) % 256 for v in range(256)])     # hue wraps around the circle
    return Image.merge("HSV", (hue, sat, val)).convert("RGB")


class RandomGrayscale:
    def __init__(self, p: float = 0.2):
        self.p = _probability(p, "grayscale probability")

    def __call__(self, img, g):
        return img.convert("L").convert("RGB") if _coin(g, self.p) else img


def _probability(p, what: str) -> float:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{what} must be in [0, 1], got {p}")
    return float(p)


# ---------------------------------------------------------------------------------------------
# the three views

class ImageTransform:
    """Resize to ``size x size``, random ``steps`` (each ``step(img, g) -> img``), to a
    normalised float tensor. ``steps`` run after the resize."""

    name = "transform"

    def __init__(self, size: int, mean=IMAGENET_MEAN, std=IMAGENET_STD, steps=(), **spec):
        if isinstance(size, bool) or int(size) != size or size < 1:
            raise ValueError(f"image size must be a positive integer, got {size!r}")
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if len(mean) != 3 or len(std) != 3:
            raise ValueError(f"mean and std need 3 values (R, G, B), got {mean} and {std}")
        if min(std) <= 0 or not all(math.isfinite(v) for v in mean + std):
            raise ValueError(f"std must be positive and mean / std finite, got {mean} / {std}")
        self.size, self.mean, self.std, self.steps = int(size), mean, std, tuple(steps)
        # (pixel / 255 - mean) / std as one multiply-add per value
        self._scale = (1.0 / (255.0 * np.asarray(std, dtype=np.float64))).astype(np.float32)
        self._shift = (-np.asarray(mean, dtype=np.float64) / np.asarray(std, dtype=np.float64)
                       ).astype(np.float32)
        self._spec = dict(spec)

    @property
    def spec(self) -> dict:
        """Everything that determines the output (for cache keys)."""
        return {"name": self.name, "size": self.size, "mean": list(self.mean),
                "std": list(self.std), **self._spec}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.spec.items() if k != "name")
        return f"{self.name}({args})"

    def to_tensor(self, img) -> torch.Tensor:
        """An RGB image as a normalised 3 x H x W float32 tensor."""
        return self.finish(self.to_uint8(img)[None])[0]

    @staticmethod
    def to_uint8(img) -> torch.Tensor:
        """An RGB image as a 3 x H x W uint8 tensor (what a loader worker delivers)."""
        arr = np.asarray(to_rgb(img), dtype=np.uint8)
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))

    def load(self, img, generator: torch.Generator | None = None) -> tuple[torch.Tensor, bool]:
        """The part of the transform that runs where the image is decoded (a loader worker):
        RGB, the exact resize and the random steps, as a 3 x H x W **uint8** tensor, and
        whether `finish` flips it. A horizontal flip that is the last step is only drawn
        here (the same draw, so the generator's stream is unchanged) and applied by
        `finish`: a mirror commutes with the per-pixel normalisation, so the result is
        the one of ``self(img, generator)``, bit for bit."""
        Image = _pil()
        img = to_rgb(img)
        if img.size != (self.size, self.size):
            img = img.resize((self.size, self.size), Image.Resampling.BILINEAR)
        flip = False
        if self.steps:
            g = _generator(generator)
            steps, last = self.steps, None
            if isinstance(steps[-1], RandomHorizontalFlip):
                steps, last = steps[:-1], steps[-1]
            for step in steps:
                img = step(img, g)
            if last is not None:
                flip = _coin(g, last.p)
        return self.to_uint8(img), flip

    def finish(self, batch: torch.Tensor, flips: torch.Tensor | None = None) -> torch.Tensor:
        """The cheap steps on a B x 3 x H x W uint8 batch where the model runs (the training
        process, on its device): the deferred horizontal flips (``flips``: B booleans), then
        ``(pixel / 255 - mean) / std`` as one float32 multiply and one add per value (the same
        operations, in the same order, on every device)."""
        if batch.dtype != torch.uint8 or batch.ndim != 4 or batch.shape[1] != 3:
            raise ValueError(f"finish takes a B x 3 x H x W uint8 batch, got "
                             f"{tuple(batch.shape)} {batch.dtype}")
        if flips is not None and (flips.device.type != "cpu" or bool(flips.any())):
            flips = flips.to(batch.device, non_blocking=True).view(-1, 1, 1, 1)
            batch = torch.where(flips, batch.flip(-1), batch)
        scale, shift = self._device_constants(batch.device)
        return batch.float().mul_(scale).add_(shift)

    def __getstate__(self):  # what a loader worker gets: no device tensors
        state = dict(self.__dict__)
        state.pop("_constants", None)
        return state

    def _device_constants(self, device: torch.device):
        cached = getattr(self, "_constants", None)
        if cached is None or cached[0].device != device:
            cached = tuple(torch.from_numpy(v).view(1, 3, 1, 1).to(device)
                           for v in (self._scale, self._shift))
            self._constants = cached
        return cached

    def __call__(self, img, generator: torch.Generator | None = None) -> torch.Tensor:
        x, flip = self.load(img, generator)
        return self.finish(x[None], torch.tensor([flip]))[0]


class _Eval(ImageTransform):
    name = "eval_transform"


class _Weak(ImageTransform):
    name = "weak_view"


class _Strong(ImageTransform):
    name = "strong_view"


def eval_transform(size: int, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> ImageTransform:
    """Resize to ``size x size`` (bilinear), to tensor, normalise. Draws nothing."""
    return _Eval(size, mean, std)


def weak_view(size: int, mean=IMAGENET_MEAN, std=IMAGENET_STD, flip_p: float = 0.5
              ) -> ImageTransform:
    """Resize, then flip horizontally with probability ``flip_p`` (a pixel-exact mirror)."""
    return _Weak(size, mean, std, (RandomHorizontalFlip(flip_p),), flip_p=float(flip_p))


def strong_view(size: int, mean=IMAGENET_MEAN, std=IMAGENET_STD, *, flip_p: float = 0.5,
                cutout: float = 0.5, num_ops: int = 2, magnitude: float = 9,
                ops: Sequence[str] | None = None, jitter=(0.4, 0.4, 0.4, 0.1),
                jitter_p: float = 0.8, gray_p: float = 0.2) -> ImageTransform:
    """LAC's strong view (docs/spec.md#lac): resize, flip, Cutout (``cutout`` of the side,
    random colour; 0 turns it off), RandAugment (``num_ops`` ops at ``magnitude`` of 30), colour
    jitter ``jitter`` = (brightness, contrast, saturation, hue) with probability ``jitter_p``,
    grayscale with probability ``gray_p``."""
    if len(jitter) != 4:
        raise ValueError(f"jitter must be (brightness, contrast, saturation, hue), got {jitter}")
    steps = [RandomHorizontalFlip(flip_p)]
    if cutout:
        steps.append(Cutout(cutout))
    rand_augment = RandAugment(num_ops, magnitude, ops)
    steps += [rand_augment, ColorJitter(*jitter, p=jitter_p), RandomGrayscale(gray_p)]
    return _Strong(size, mean, std, steps, flip_p=float(flip_p), cutout=float(cutout),
                   num_ops=int(num_ops), magnitude=float(magnitude),
                   ops=list(rand_augment.ops), jitter=[float(v) for v in jitter],
                   jitter_p=float(jitter_p), gray_p=float(gray_p))


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "RANDAUGMENT_OPS", "ColorJitter", "Cutout",
           "ImageTransform", "RandAugment", "RandomGrayscale", "RandomHorizontalFlip",
           "apply_op", "eval_transform", "strong_view", "to_rgb", "weak_view"]
