"""Regularisers on the batch logits, composable with any loss.

A regulariser is a function ``fn(logits) -> scalar`` (logits B x L) registered in
`REGULARIZERS` with a default weight. `Regularized` wraps any
[`SPMLLoss`][spmlkit.losses.contract.SPMLLoss] and adds ``sum_r weight_r * fn_r(logits)`` after the
base loss's reduction (docs/spec.md#notation: regularisers are added after the reduction).
``create_loss(name, reg=...)`` builds the wrapper::

    create_loss("an", reg="highrank:1e-3")              # one spec
    create_loss("an", reg=["highrank:1e-3"])            # a list of specs
    create_loss("an", reg="highrank")                   # the registered default weight

A spec is ``"name"`` or ``"name:weight"``, or a ``(name, weight)`` pair; several specs may be given
as a list or as one comma-separated string.
"""
from __future__ import annotations

import torch

from ..registry import Registry
from .contract import SPMLLoss
from .logspace import as_compute
REGULARIZERS = Registry("regulariser")

OPML_PAPER = "Li, Wang, Chen, 'Pushing One Pair of Labels Apart Each Time' (OPML)"


@REGULARIZERS.register("highrank", "high-rank regulariser on the batch prediction matrix: "
                       "-log det(Q^T Q / B + eps I), Q = sigmoid(S)", paper=OPML_PAPER + ", Eq. 10",
                       defaults={"weight": 1e-3})
def high_rank_penalty(logits: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """High-rank regulariser of OPML (Eq. 10), without its weight: ``-log det(G + eps I)``.

    ``Q = sigmoid(S)`` is the B x L prediction matrix of the batch. The Gram matrix is

    - ``G = Q^T Q / B`` (L x L) when ``B >= L``;
    - ``G = Q Q^T / B`` (B x B) when ``B < L``.

    Both are divided by ``B``. The non-zero eigenvalues of ``Q Q^T`` and ``Q^T Q`` are the same
    (the squared singular values of ``Q``), so for ``B < L`` the B x B form equals the L x L form
    minus the constant ``(L - B) * log(1 / eps)``: the same gradient, at a fraction of the cost,
    and without the ``L - B`` eigenvalues that are exactly ``eps``. ``G + eps I`` is symmetric
    positive definite, so ``slogdet`` returns its log-determinant (computed in float32; a float64
    input stays float64). The value decreases as the rows of ``Q`` become more diverse.

    Args:
        logits: B x L (or R x B x L: the vectorised engine's stacked runs, one value each).
        eps: ridge added to the diagonal (1e-4).

    Returns:
        a scalar (shape (R,) for stacked runs); 0 on the autograd graph for an empty batch.

    >>> import torch
    >>> s = torch.tensor([[3.0, -3.0], [-3.0, 3.0]])      # diverse rows
    >>> bool(high_rank_penalty(s) < high_rank_penalty(torch.zeros(2, 2)))
    True
    """
    if logits.ndim not in (2, 3):
        raise ValueError(f"high_rank_penalty expects B x L logits, got shape {tuple(logits.shape)}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0 (it keeps the Gram matrix invertible), got {eps}")
    s = as_compute(logits)
    batch, num_classes = s.shape[-2:]
    if batch == 0 or num_classes == 0:
        return s.sum(dim=(-2, -1)) * 0.0
    q = torch.sigmoid(s)
    qt = q.transpose(-2, -1)
    gram = (qt @ q if batch >= num_classes else q @ qt) / batch
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    return -torch.linalg.slogdet(gram + eps * eye).logabsdet


def parse_regularizers(spec) -> list[tuple[str, float]]:
    """Turn a regulariser spec into ``[(name, weight), ...]``.

    ``spec`` is None, ``"name"``, ``"name:weight"``, a comma-separated string of those, a
    ``(name, weight)`` pair, or a list of any of these. A missing weight is the registered default.

    Raises:
        ValueError: unknown name, a weight that is not a number or is negative.

    >>> parse_regularizers("highrank:1e-2")
    [('highrank', 0.01)]
    >>> parse_regularizers(["highrank", ("highrank", 0.5)])
    [('highrank', 0.001), ('highrank', 0.5)]
    """
    if spec is None:
        return []
    if isinstance(spec, str):
        items = [part.strip() for part in spec.split(",") if part.strip()]
    elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str) \
            and not isinstance(spec[1], str):
        items = [spec]
    else:
        items = list(spec)
    out = []
    for item in items:
        if isinstance(item, str) and "," in item:
            out.extend(parse_regularizers(item))
            continue
        if isinstance(item, str):
            name, sep, weight = item.partition(":")
            name = name.strip()
            weight = weight.strip() if sep else None
            if sep and not weight:
                raise ValueError(f"regulariser spec {item!r} has an empty weight; write "
                                 f"'{name}' or '{name}:<weight>', e.g. '{name}:1e-3'")
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            name, weight = item
        else:
            raise ValueError(f"cannot read regulariser spec {item!r}: use 'name', 'name:weight' "
                             f"or a (name, weight) pair")
        entry = REGULARIZERS.get(name)
        if weight is None:
            weight = entry.defaults.get("weight", 1.0)
        try:
            weight = float(weight)
        except (TypeError, ValueError):
            raise ValueError(f"regulariser {name!r}: weight {weight!r} is not a number") from None
        if not weight >= 0:
            raise ValueError(f"regulariser {name!r}: weight must be >= 0, got {weight}")
        out.append((entry.name, weight))
    return out


def list_regularizers() -> list[tuple[str, str]]:
    """``(name, one-line description)`` of every registered regulariser."""
    return [(e.name, e.description) for e in REGULARIZERS.entries()]


class Regularized(SPMLLoss):
    """A base loss plus weighted regularisers on the batch logits.

    ``value = base(logits, observed, index) + sum_r w_r * fn_r(logits)`` for ``"mean"``; for
    ``"sum"`` the regularisers are multiplied by ``B * L`` like every penalty (so ``"sum"`` stays
    ``B * L`` times ``"mean"``); for ``"none"`` they are added to every entry (so the matrix's
    mean is the ``"mean"`` value). The reduction is the base loss's.

    Everything else is the base loss's: the engine hooks (``on_train_start``,
    ``on_epoch_start``, ``on_epoch_end``, ``penalty``), ``needs_index``,
    ``needs_train_predictions``, ``lr_multiplier``, and its parameters and buffers (the base is
    the submodule ``base``; a state dict of the plain base loss also loads, its keys are mapped to
    ``base.*``). Other attributes are looked up on the base loss too
    (``wrapped.estimated_labels()`` for ROLE).

    Args:
        base: the loss to wrap.
        regularizers: ``[(name, weight), ...]`` or any spec `parse_regularizers` reads.
    """

    def __init__(self, base: SPMLLoss, regularizers=()):
        if not isinstance(base, SPMLLoss):
            raise ValueError(f"Regularized wraps an SPMLLoss, got {type(base).__name__}")
        super().__init__(reduction=base.reduction, eps=base.eps)
        self.base = base
        self.regularizers = parse_regularizers(regularizers)
        self._fns = [REGULARIZERS.get(name).factory for name, _ in self.regularizers]

    # --- delegation ---------------------------------------------------------------------------
    @property
    def needs_index(self):
        return self.base.needs_index

    @property
    def needs_train_predictions(self):
        return self.base.needs_train_predictions

    @property
    def lr_multiplier(self):
        return self.base.lr_multiplier

    @property
    def paper_threshold(self):
        return self.base.paper_threshold

    @property
    def stackable(self):
        return self.base.stackable

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            base = self.__dict__.get("_modules", {}).get("base")
            if base is None or name.startswith("__"):
                raise
            return getattr(base, name)

    def on_train_start(self, observed, info) -> None:
        self.base.on_train_start(observed, info)

    def on_epoch_start(self, epoch: int) -> None:
        self.base.on_epoch_start(epoch)

    def on_epoch_end(self, epoch: int, train_logits=None) -> None:
        self.base.on_epoch_end(epoch, train_logits)

    def penalty(self, model):
        return self.base.penalty(model)

    def required_hooks(self) -> tuple[str, ...]:
        return self.base.required_hooks()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # accept a checkpoint of the unwrapped loss: its keys lack the "base." level
        own = set(self.base.state_dict().keys())
        for key in [k for k in state_dict if k.startswith(prefix)]:
            rest = key[len(prefix):]
            if rest in own and prefix + "base." + rest not in state_dict:
                state_dict[prefix + "base." + rest] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # --- the loss -------------------------------------------------------------------------------
    def regularization(self, logits: torch.Tensor) -> torch.Tensor:
        """``sum_r w_r * fn_r(logits)`` (a scalar on the graph, in `as_compute`'s dtype)."""
        total = as_compute(logits).sum(dim=(-2, -1)) * 0.0
        for (_, weight), fn in zip(self.regularizers, self._fns):
            if weight:
                total = total + weight * fn(logits)
        return total

    def entries(self, logits, observed, index):
        mat, pen = self.base.weighted_entries(logits, observed, index)
        extra = self.regularization(logits)
        return mat, extra if pen is None else pen + extra

    def forward(self, logits: torch.Tensor, observed: torch.Tensor, index=None) -> torch.Tensor:
        value = self.base(logits, observed, index=index)
        if logits.shape[0] == 0 or not self.regularizers:
            return value
        extra = self.regularization(logits)
        if self.base.reduction == "sum":
            extra = extra * logits.numel()
        return value + extra

    def extra_repr(self) -> str:
        return "regularizers=" + ", ".join(f"{n}:{w:g}" for n, w in self.regularizers)


__all__ = ["REGULARIZERS", "Regularized", "high_rank_penalty", "list_regularizers",
           "parse_regularizers"]
