"""Classifier heads on top of a backbone, for fine-tuning.

`ImageClassifier` is the fine-tuning model: a backbone (any module mapping
``B x 3 x S x S`` images to ``B x num_features`` pooled features, e.g.
`spmlkit.models.backbones.create_backbone`) and a linear head ``num_features -> L``. The
head is the attribute ``head``, which the engine's ``head_lr_mult`` and the losses'
``penalty(model)`` hook (L1R / L2R on the head's weights) look for; ``linear_init`` copies the
linear phase's ``nn.Linear`` into it.
"""
from __future__ import annotations

import torch
from torch import nn

from .rng import global_rng


def seeded_linear(in_features: int, out_features: int, seed: int) -> nn.Linear:
    """``nn.Linear`` with PyTorch's default init drawn from ``seed`` (the global RNG is left as
    it was, and other threads do not change the draw: `spmlkit.models.rng.global_rng`);
    `spmlkit.engine.make_linear_head`."""
    with global_rng(seed):
        return nn.Linear(in_features, out_features)


HEADS = ("linear", "mlp")


class MLPHead(nn.Module):
    """A one-hidden-layer perceptron on feature vectors: ``Linear(D, hidden) -> ReLU ->
    Linear(hidden, L)``, the MLP option of the tabular SPML protocol (SMILE / CRISP on MULAN
    sets) besides the linear head. PyTorch's default init, drawn from ``seed`` (the global RNG
    is left as it was). Both weight matrices are the classifier head's (the L1R / L2R penalties
    apply to both).

    >>> MLPHead(5, 3, hidden=4)(torch.zeros(2, 5)).shape
    torch.Size([2, 3])
    """

    def __init__(self, in_features: int, num_classes: int, hidden: int = 256, seed: int = 0):
        super().__init__()
        if min(in_features, num_classes, hidden) < 1:
            raise ValueError(f"MLPHead needs in_features, num_classes and hidden >= 1, got "
                             f"{in_features}, {num_classes}, {hidden}")
        with global_rng(seed):
            self.hidden = nn.Linear(in_features, hidden)
            self.out = nn.Linear(hidden, num_classes)

    @property
    def in_features(self) -> int:
        return self.hidden.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def make_head(kind: str, in_features: int, num_classes: int, seed: int,
              hidden: int = 256) -> nn.Module:
    """A head on feature vectors: ``"linear"`` (``nn.Linear``, as
    `spmlkit.engine.make_linear_head`) or ``"mlp"`` (`MLPHead` with ``hidden``
    units).

    Raises:
        ValueError: another kind, or a hidden size < 1 (naming the value).
    """
    if kind not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {kind!r}")
    if kind == "linear":
        return seeded_linear(in_features, num_classes, seed)
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"hidden (the MLP head's width) must be a whole number >= 1, got "
                         f"{hidden!r}")
    return MLPHead(in_features, num_classes, hidden, seed)


class ImageClassifier(nn.Module):
    """``head(backbone(x))``: pooled backbone features, then one linear map to ``L`` logits.

    Args:
        backbone: a module with ``num_features`` whose ``forward`` returns
            ``B x num_features``; its ``input_size`` / ``mean`` / ``std`` (if any) set the
            engine's default transforms.
        num_classes: ``L``.
        seed: the head's initialisation (as the linear mode's head with the same seed).

    >>> class Flat(nn.Module):
    ...     num_features, input_size = 12, 2
    ...     def forward(self, x):
    ...         return x.flatten(1)
    >>> model = ImageClassifier(Flat(), num_classes=3)
    >>> model(torch.zeros(5, 3, 2, 2)).shape
    torch.Size([5, 3])
    """

    def __init__(self, backbone: nn.Module, num_classes: int, seed: int = 0):
        super().__init__()
        features = getattr(backbone, "num_features", None)
        if not isinstance(features, int) or features < 1:
            raise ValueError(f"ImageClassifier needs a backbone with an integer num_features, "
                             f"{type(backbone).__name__} has {features!r}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.backbone = backbone
        self.head = seeded_linear(features, num_classes, seed)

    @property
    def num_classes(self) -> int:
        return self.head.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    @torch.no_grad()
    def load_linear_head(self, linear: nn.Linear) -> "ImageClassifier":
        """Copy a trained ``nn.Linear`` (linear mode, ``linear_init``) into ``head``."""
        if (linear.in_features, linear.out_features) != (self.head.in_features,
                                                           self.head.out_features):
            raise ValueError(f"the linear head maps {linear.in_features} -> "
                             f"{linear.out_features}, this model's head "
                             f"{self.head.in_features} -> {self.head.out_features}; were the "
                             f"features computed with this backbone?")
        self.head.weight.copy_(linear.weight.to(self.head.weight))
        self.head.bias.copy_(linear.bias.to(self.head.bias))
        return self


def build_image_classifier(backbone: str, num_classes: int, *, pretrained: bool = True,
                           seed: int = 0, **backbone_options) -> ImageClassifier:
    """A registered backbone (``spml list backbones``) plus a seeded linear head."""
    from .backbones import create_backbone

    return ImageClassifier(create_backbone(backbone, pretrained=pretrained, **backbone_options),
                           num_classes, seed)


# ---- BoostLU (Kim et al., CVPR 2023) ------------------------------------------------------------
def boostlu(cam: torch.Tensor, alpha: float) -> torch.Tensor:
    """BoostLU: the positive part of a class activation map scaled by ``alpha``.

    ``BoostLU(x) = alpha * x`` where ``x > 0``, else ``x`` (a leaky ReLU whose *positive* slope is
    ``alpha``; at ``x = 0`` the value is 0 either way and the gradient is 1, as the official
    ``torch.where(CAM > 0, CAM * alpha, CAM)``). Kim et al., "Bridging the Gap between Model
    Explanations in Partially Annotated Multi-label Classification" (CVPR 2023), Eq. 3.

    >>> boostlu(torch.tensor([-2.0, 0.0, 1.5]), 5.0).tolist()
    [-2.0, 0.0, 7.5]
    """
    return torch.where(cam > 0, cam * alpha, cam)


def boosted_logits(cam: torch.Tensor, alpha: float) -> torch.Tensor:
    """Logits ``B x L`` of a class activation map ``B x L x h x w``: `boostlu`, then
    global average pooling over ``h x w`` (the official ``F.adaptive_avg_pool2d(CAM, 1)``).

    >>> cam = torch.tensor([[[[1.0, -1.0], [2.0, -4.0]]]])   # B = L = 1, a 2 x 2 map
    >>> boosted_logits(cam, 5.0).tolist()                     # (5 - 1 + 10 - 4) / 4
    [[2.5]]
    """
    if cam.ndim != 4:
        raise ValueError(f"a class activation map is B x L x h x w, got shape "
                         f"{tuple(cam.shape)}")
    return boostlu(cam, alpha).mean(dim=(2, 3))


class BoostLUHead(nn.Module):
    """A CAM head with BoostLU: a 1 x 1 convolution ``C -> L`` on a feature map, BoostLU on the
    class activation map, global average pooling (Kim et al. 2023, the official
    ``ImageClassifier.forward``).

    ``forward(x)`` takes a feature map ``B x C x h x w`` (``cam(x)`` is the map ``B x L x h x w``
    before BoostLU) or feature vectors ``B x C``, read as ``1 x 1`` maps: then the logits are
    ``boostlu(W x + b, alpha)``, the linear head's logits with their positive part scaled
    (with ``alpha = 1`` exactly `torch.nn.Linear`'s). Without BoostLU (``alpha = 1``) on
    a map, the head is a linear head on the average-pooled features.

    The convolution's weight is kept as ``weight`` (``L x C``, as ``nn.Linear``'s; the L1R / L2R
    penalties see it) and ``bias`` (``L``), initialised as PyTorch initialises both
    ``nn.Linear(C, L)`` and ``nn.Conv2d(C, L, 1)`` (the same draws), from ``seed``: the same
    weights as the linear mode's head with that seed.

    Args:
        in_channels: ``C``; num_classes: ``L``.
        alpha: BoostLU's factor on the positive part (official default 5; 1 switches it off).
        seed: the initialisation's seed (the global RNG is left as it was).
        eval_alpha: the factor in eval mode (validation, test, prediction); default ``alpha``,
            as the official model, whose ``forward`` boosts in both modes. Another value
            separates the boost in training from the boost at inference (an ablation: e.g.
            ``alpha=1, eval_alpha=5`` trains a plain CAM head and boosts only its predictions).

    >>> head = BoostLUHead(4, 3, alpha=5.0)
    >>> head(torch.zeros(2, 4, 7, 7)).shape, head(torch.zeros(2, 4)).shape
    (torch.Size([2, 3]), torch.Size([2, 3]))
    """

    def __init__(self, in_channels: int, num_classes: int, alpha: float = 5.0, seed: int = 0,
                 eval_alpha: float | None = None):
        super().__init__()
        if min(in_channels, num_classes) < 1:
            raise ValueError(f"BoostLUHead needs in_channels and num_classes >= 1, got "
                             f"{in_channels}, {num_classes}")
        self.alpha = check_alpha(alpha)
        self.eval_alpha = None if eval_alpha is None else check_alpha(eval_alpha)
        linear = seeded_linear(in_channels, num_classes, seed)
        self.weight = nn.Parameter(linear.weight.detach().clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    @property
    def in_channels(self) -> int:
        return self.weight.shape[1]

    @property
    def num_classes(self) -> int:
        return self.weight.shape[0]

    def cam(self, x: torch.Tensor) -> torch.Tensor:
        """The class activation map ``B x L x h x w`` of a feature map (before BoostLU)."""
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"BoostLUHead.cam expects a B x {self.in_channels} x h x w "
                             f"feature map, got shape {tuple(x.shape)}")
        return nn.functional.conv2d(x, self.weight[:, :, None, None], self.bias)

    @property
    def current_alpha(self) -> float:
        """The factor ``forward`` applies now: ``alpha`` in training mode, ``eval_alpha`` (if
        set) in eval mode."""
        return self.alpha if self.training or self.eval_alpha is None else self.eval_alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.current_alpha
        if x.ndim == 2:  # feature vectors: 1 x 1 maps (pooling one cell is the identity)
            return boostlu(nn.functional.linear(x, self.weight, self.bias), alpha)
        return boosted_logits(self.cam(x), alpha)

    def extra_repr(self) -> str:
        extra = "" if self.eval_alpha is None else f", eval_alpha={self.eval_alpha}"
        return f"in_channels={self.in_channels}, num_classes={self.num_classes}, " \
               f"alpha={self.alpha}{extra}"


def check_alpha(alpha) -> float:
    """BoostLU's ``alpha`` as a float; a ValueError unless it is a finite number > 0."""
    import math

    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or \
            not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha (BoostLU's factor on the positive part of the class "
                         f"activation map) must be a finite number > 0 (official 5; 1: no "
                         f"boost), got {alpha!r}")
    return float(alpha)


class BoostLUClassifier(nn.Module):
    """A backbone's last feature map through a `BoostLUHead`: images ``B x 3 x S x S``
    to logits (the model of a ``boostlu`` run on an image source; the attribute ``head`` is the
    head)."""

    def __init__(self, backbone: nn.Module, head: BoostLUHead):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone.forward_features(x))
