"""The loss contract shared by every method, and the log-space helpers they are built from.

Contract (docs/spec.md#notation; docs/extending/loss.md#contract)::

    loss = create_loss(name, **hparams)           # an nn.Module
    value = loss(logits, observed, index=None)    # logits B x L, observed B x L in {1, 0, -1}

A loss computes a per-entry matrix ``l`` (B x L) and, optionally, a scalar penalty.
``reduction="mean"`` returns ``l.sum() / (B * L) + penalty`` (the official convention: entries a
loss ignores still count in the denominator); ``"sum"`` returns ``B * L`` times that;
``"none"`` returns the B x L matrix ``l + penalty`` whose mean is the ``"mean"`` value.

Everything is computed in float32 log space from logits (float64 input stays float64, see
`as_compute`). ``eps`` (default 0) switches the logs of probabilities to the official
``log(p + eps)`` form; ``eps=1e-5`` reproduces the official values.

Methods that need more than ``(logits, observed)`` say so with class attributes and receive it
through hooks the engine calls (and nothing else):

- ``needs_index``: ``forward`` gets ``index``, the rows of the batch in the train split;
- ``on_train_start(observed, info)``: the whole train split's observed labels and a
  `TrainInfo` (sizes, k, seed, epochs) once, before the first step;
- ``on_epoch_start(epoch)`` / ``on_epoch_end(epoch, train_logits)``: ``epoch`` counts from 0;
  ``train_logits`` are the eval-mode logits of the whole train split when
  ``needs_train_predictions`` is True, else None;
- ``penalty(model)``: a term on the model's own parameters (0 by default);
- ``lr_multiplier``: learning-rate factor for the loss's own trainable parameters (ROLE: 10).

State lives in parameters and buffers so ``state_dict()`` carries it; state sized by the train
split is listed in ``resizable_state`` and resized when a state dict of another size is loaded.

Stacked runs (``stackable = True``): the linear engine may train R runs of one loss at once
(`spmlkit.engine.vectorised`). It then calls ``entries`` with a leading run dimension:
logits and observed labels R x B x L, ``index`` R x B, and every parameter and buffer of the loss
stacked to R x (its shape); ``entries`` must return the R x B x L matrix and a penalty of shape
(R,) (or None), each run's exactly what it would be alone. A loss written with ``dim=-1`` /
``shape[-1]`` and `take_rows` for its per-example state does this for free. Scalar
state the runs share (an epoch counter) is read from a Python number the hooks set, not from
its stacked buffer: the engine calls ``on_epoch_start`` on the stacked module too, while the
buffer's slice of a run that stopped early keeps that run's last value. One that draws
data-dependent sizes per batch or changes its state inside ``forward`` (the large-loss
methods) keeps ``stackable = False`` and its runs are trained one by one.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..labels import NEGATIVE, POSITIVE, UNOBSERVED

REDUCTIONS = ("mean", "sum", "none")


@dataclass(frozen=True)
class TrainInfo:
    """What the engine tells a loss about the training split before the first step."""

    num_examples: int
    num_classes: int
    k: float | None = None          # expected positives per example (EPR, ROLE)
    seed: int = 0
    num_epochs: int = 1

    def __post_init__(self):
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, (int, float))
                                   or not math.isfinite(self.k)
                                   or not 0 <= self.k <= self.num_classes):
            raise ValueError(f"k (expected positives per example) must be a number in [0, "
                             f"{self.num_classes}] (the number of classes), got {self.k!r}")


def as_compute(x: torch.Tensor) -> torch.Tensor:
    """Losses compute in float32 (half precision is promoted); float64 stays float64, so that
    ``torch.autograd.gradcheck`` can check every loss directly."""
    return x if x.dtype == torch.float64 else x.float()


def log_p(logits: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """``log(sigmoid(s))`` in `as_compute`'s dtype; with ``eps > 0``, the official
    ``log(sigmoid(s) + eps)``."""
    logits = as_compute(logits)
    if eps:
        return torch.log(torch.sigmoid(logits) + eps)
    return F.logsigmoid(logits)


def log_1mp(logits: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """``log(1 - sigmoid(s))`` in `as_compute`'s dtype; with ``eps > 0``,
    ``log(1 - sigmoid(s) + eps)``."""
    logits = as_compute(logits)
    if eps:
        return torch.log(1.0 - torch.sigmoid(logits) + eps)
    return F.logsigmoid(-logits)


def soft_bce(logits: torch.Tensor, target, eps: float = 0.0, weight=None) -> torch.Tensor:
    """Per-entry BCE of ``sigmoid(logits)`` against a (soft) target in [0, 1], times ``weight``.

    With ``eps = 0`` this is one fused ``binary_cross_entropy_with_logits`` (exact log space,
    and the fewest operations: the linear mode's step time is dominated by per-op overhead).
    """
    logits = as_compute(logits)
    target = target.to(logits.dtype) if torch.is_tensor(target) else \
        torch.full_like(logits, target)
    if not eps:
        return F.binary_cross_entropy_with_logits(logits, target, weight=weight,
                                                  reduction="none")
    out = -(target * log_p(logits, eps) + (1.0 - target) * log_1mp(logits, eps))
    return out if weight is None else out * weight


def resize_state_on_load(module: nn.Module, state_dict, prefix: str, names) -> None:
    """Resize the parameters/buffers ``names`` of ``module`` to the shapes found in ``state_dict``.

    Call it at the top of ``_load_from_state_dict``, before ``super()._load_from_state_dict``:
    state sized by the train split (N_train x L: ROLE's estimator, pseudo-labels, stored labels)
    is empty on a fresh instance, and PyTorch only copies into tensors of the same shape. A tensor
    whose shape differs from the checkpoint's is replaced by an uninitialised one of the
    checkpoint's shape, with the current tensor's dtype, device and kind (a ``Parameter`` stays a
    ``Parameter`` with the same ``requires_grad``, a buffer stays a buffer, persistent or not);
    the load that follows fills it. Names absent from ``state_dict`` (or ``None`` on the module)
    are left alone, so ``strict`` loading still reports missing keys.

    >>> m = nn.Module(); m.register_buffer("seen", torch.zeros(0, 0, dtype=torch.bool))
    >>> resize_state_on_load(m, {"seen": torch.ones(2, 3, dtype=torch.bool)}, "", ["seen"])
    >>> tuple(m.seen.shape), m.seen.dtype
    ((2, 3), torch.bool)
    """
    for name in names:
        key = prefix + name
        current = getattr(module, name, None)
        incoming = state_dict.get(key)
        if current is None or not torch.is_tensor(incoming) or incoming.shape == current.shape:
            continue
        fresh = torch.empty(incoming.shape, dtype=current.dtype, device=current.device)
        if isinstance(current, nn.Parameter):
            fresh = nn.Parameter(fresh, requires_grad=current.requires_grad)
        setattr(module, name, fresh)  # a buffer's slot keeps its name and persistence


def take_rows(state: torch.Tensor, index) -> torch.Tensor:
    """The rows ``index`` of per-example state (N x ...): ``state[index]`` for one run; for runs
    stacked by the vectorised engine (``state`` R x N x ..., ``index`` R x B) each run's own rows,
    R x B x ....

    >>> take_rows(torch.arange(6).view(3, 2), torch.tensor([2, 0])).tolist()
    [[4, 5], [0, 1]]
    >>> take_rows(torch.arange(12).view(2, 3, 2), torch.tensor([[2], [0]])).tolist()
    [[[4, 5]], [[6, 7]]]
    """
    index = torch.as_tensor(index, device=state.device).long()
    if index.ndim == 1:
        return state[index]
    runs = torch.arange(index.shape[0], device=state.device).unsqueeze(1)
    return state[runs, index]


def check_observed(observed: torch.Tensor, where: str) -> None:
    """Raise ``ValueError`` when ``observed`` holds a value outside {1, 0, -1}.

    What every loss call checks, unless its caller validated the whole matrix already
    (`observed_validated`): one ``aminmax`` reduction for integer labels (the engine's
    int8) and a second operation for float labels (which must also be whole numbers). About 4 us
    per call on a CPU: 4-6% of a linear-mode step on yeast (``benchmarks/observed_check.py``).
    On CUDA reading the result waits for the labels' device work (a host sync before the
    backward pass), one more reason for the training loop to use `observed_validated`.
    Only a failing check looks further, to name the values and the first row. Boolean labels
    (True = positive) pass.

    >>> check_observed(torch.tensor([[1, 0, -1]], dtype=torch.int8), "an")  # passes
    >>> check_observed(torch.tensor([[1, 0, 3]]), "an")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: an: observed labels must be 1 (positive), ... found [3] (first at batch row 0)
    """
    if observed.dtype == torch.bool or observed.numel() == 0:
        return
    lo, hi = torch.aminmax(observed)
    ok = lo.item() >= NEGATIVE and hi.item() <= POSITIVE  # False for NaN
    if ok and observed.is_floating_point():
        ok = not bool((observed != observed.round()).any())
    if ok:
        return
    bad = (observed != POSITIVE) & (observed != UNOBSERVED) & (observed != NEGATIVE)
    row = int(bad.nonzero()[0, 0])
    values = sorted({float(v) if observed.is_floating_point() else int(v)
                     for v in observed[bad].tolist()}, key=str)[:5]
    raise ValueError(f"{where}: observed labels must be {POSITIVE} (positive), {UNOBSERVED} "
                     f"(unobserved) or {NEGATIVE} (negative); found {values} (first at batch "
                     f"row {row})")


def masks(observed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float masks (positive, unobserved, negative) of an observed-label matrix."""
    return ((observed == POSITIVE).float(), (observed == UNOBSERVED).float(),
            (observed == NEGATIVE).float())


@contextlib.contextmanager
def observed_validated(loss: nn.Module):
    """Within the block, ``loss`` (and every [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss] inside
    it, e.g. the base of a `Regularized`) skips `check_observed` on each call.

    For a caller that validated the whole observed matrix once
    (`spmlkit.labels.validate_observed`) and passes batches of its rows, as the training
    loop does: the per-step check would only repeat that work. Calls outside the block check
    again.

    >>> from spmlkit.losses import create_loss
    >>> loss = create_loss("an")
    >>> with observed_validated(loss):
    ...     value = loss(torch.zeros(1, 2), torch.tensor([[1, 3]]))  # not checked: trusted
    >>> loss._observed_validated
    False
    """
    parts = [m for m in loss.modules() if isinstance(m, SPMLLoss)]
    before = [m._observed_validated for m in parts]
    for m in parts:
        m._observed_validated = True
    try:
        yield loss
    finally:
        for m, flag in zip(parts, before):
            m._observed_validated = flag


class SPMLLoss(nn.Module):
    """Base class: shape checks, float32, the reduction, and no-op engine hooks."""

    #: set within `observed_validated`: the caller has checked the labels already
    _observed_validated = False
    needs_index = False
    needs_train_predictions = False
    lr_multiplier = 1.0
    #: ``entries`` works on R stacked runs (module docstring); False: trained one run at a time
    stackable = False
    #: parameters/buffers sized by the train split, resized to a loaded state dict's shapes
    #: (see `resize_state_on_load`)
    resizable_state: tuple[str, ...] = ()
    #: ``entries`` is exactly ``soft_bce(logits, target, eps, weight)`` with ``(target,
    #: weight) = bce_form(observed)``, plus, when ``count_penalty()`` gives ``(lam, k)``, EPR's
    #: ``lam * ((mean over rows of sum_l p - k) / L) ** 2``; the loss has no state and no
    #: ``penalty``. The vectorised engine then takes the step's gradient in closed form
    #: (``weight * (sigmoid(s) - target)``, and the count term's) instead of through autograd.
    #: A subclass that changes ``entries`` sets it back to False.
    closed_form = False

    def __init__(self, reduction: str = "mean", eps: float = 0.0):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.reduction = reduction
        self.eps = float(eps)

    # --- to implement -----------------------------------------------------------------------
    def entries(self, logits, observed, index):
        """Return ``(l, penalty)``: the B x L per-entry loss and a scalar (or None)."""
        raise NotImplementedError

    def bce_form(self, observed):
        """``(target, weight)`` of a `closed_form` loss for the observed labels (any
        shape): the soft BCE target in [0, 1] and the per-entry weight (None: 1)."""
        raise NotImplementedError(f"{type(self).__name__} is not a closed-form BCE loss")

    def count_penalty(self):
        """``(lam, k)`` of a `closed_form` loss's expected-positive term, or None."""
        return None

    #: the loss has `stacked_step`: its stacked runs' gradient written out by hand
    manual_gradient = False

    def stacked_step(self, logits, observed, index):
        """For the vectorised engine (stacked runs, R x B x L; ``"mean"`` reduction, exact logs):
        each run's loss (R,) and the gradient of their sum for ``logits``, computed without
        autograd; the gradients of the loss's own parameters are left in their ``.grad``. Equal
        to autograd through `entries` (``tests/test_vectorised.py`` checks it)."""
        raise NotImplementedError(f"{type(self).__name__} has no hand-written stacked step")

    # --- engine hooks (no-ops by default) ---------------------------------------------------
    def on_train_start(self, observed: torch.Tensor, info: TrainInfo) -> None:
        pass

    def on_epoch_start(self, epoch: int) -> None:
        pass

    def on_epoch_end(self, epoch: int, train_logits: torch.Tensor | None = None) -> None:
        pass

    def penalty(self, model: nn.Module):
        return 0.0

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        resize_state_on_load(self, state_dict, prefix, self.resizable_state)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # --- the contract -----------------------------------------------------------------------
    def forward(self, logits: torch.Tensor, observed: torch.Tensor, index=None) -> torch.Tensor:
        """The loss of a batch (module docstring); ``observed`` values outside {1, 0, -1}
        raise ``ValueError`` (`check_observed`, skipped within
        `observed_validated`)."""
        if logits.ndim != 2 or observed.shape != logits.shape:
            raise ValueError(f"{type(self).__name__}: logits and observed labels must both be "
                             f"B x L; got {tuple(logits.shape)} and {tuple(observed.shape)}")
        if not self._observed_validated:
            check_observed(observed, type(self).__name__)
        if self.needs_index:
            if index is None:
                raise ValueError(f"{type(self).__name__} needs the batch's row indices in the "
                                 f"train split: call loss(logits, observed, index=idx)")
            if len(index) != logits.shape[0]:
                raise ValueError(f"index has {len(index)} entries for a batch of "
                                 f"{logits.shape[0]}")
        logits = as_compute(logits)
        if logits.shape[0] == 0:
            zero = logits.sum() * 0.0  # on the graph, never NaN
            return zero if self.reduction != "none" else logits * 0.0
        mat, pen = self.entries(logits, observed, index)
        if self.reduction == "none":
            return mat if pen is None else mat + pen
        value = mat.mean() if pen is None else mat.mean() + pen
        return value if self.reduction == "mean" else value * mat.numel()

    def extra_repr(self) -> str:
        hp = {k: v for k, v in vars(self).items()
              if not k.startswith("_") and k != "training" and isinstance(v, (int, float, str))}
        return ", ".join(f"{k}={v}" for k, v in hp.items())
