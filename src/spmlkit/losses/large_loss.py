"""Large-loss methods of Kim et al., "Large Loss Matters in Weakly Supervised Multi-Label
Classification" (CVPR 2022): LL-R, LL-Ct and LL-Cp (docs/spec.md#large-loss).

Per batch, ``l`` is BCE-with-logits on assume-negative targets (1 on O+, 0 on U and O-). From
the paper's epoch 2 on (``epoch >= 1`` here: the engine counts epochs from 0, so nothing is
modified in epoch 0), with ``Delta = delta_rel / 100`` and ``t = epoch + 1``::

    k = ceil(B * L * (t - 1) * Delta)      LL-R, LL-Ct
    k = ceil(B * L * Delta)                LL-Cp

``k`` is clamped to the number of unobserved entries of the batch; the threshold is the k-th
largest ``l`` among the unobserved entries, and every unobserved entry with ``l >= threshold`` is
*selected* (ties at the threshold are all selected, as in the official code). Then

- ``ll_r``: selected entries get loss 0 (rejected);
- ``ll_ct``: selected entries use target 1 instead (temporary correction);
- ``ll_cp``: as LL-Ct, and the selected entries become observed positives for good.

The reduction is the usual one: sum over the B x L matrix divided by ``B * L`` (rejected entries
still count in the denominator).

How the official code (snu-mllab/Large-Loss-Matters, ``losses.py`` / ``train.py``) computes it,
and where we differ:

- ``k = ceil(B * L * (1 - clean_rate))`` with ``clean_rate`` starting at 1 and decreased by
  ``delta_rel / 100`` after every epoch; ``k = ceil(B * L * delta_rel / 100)`` for LL-Cp. The
  threshold is ``topk(unobserved_mask * l, k).values[-1]`` and the modified entries are those
  with ``unobserved_mask * l >= threshold``. We compute the same ``k`` from the exact product
  (rounded to 9 decimals before the ceiling): the running subtraction drifts, so that e.g.
  ``1 - clean_rate`` is 0.025000000000000022 after 5 steps of 0.005 and VOC's B = 16, L = 20,
  delta_rel = 0.5 gives k = 9 instead of 8 in epoch 6. ``k_rounding="official"`` reproduces the
  drift for parity runs.
- The official top-k runs over the whole masked matrix (observed entries count as 0 loss) and
  does not clamp ``k``: when ``k`` exceeds the unobserved entries with a positive loss, the
  threshold is 0 and observed entries are modified too (an observed positive "corrected" to
  target 0). We select among unobserved entries only and clamp ``k``.
- **Official bug:** ``train.py`` and ``losses.py`` test the scheme with
  ``P['mod_scheme'] is 'LL-Cp'`` (identity, not equality, of two strings). For a scheme read
  from the command line that is False, so LL-Cp silently ran with LL-Ct's growing ``k`` and never
  flipped a label: the published LL-Cp numbers are LL-Ct's. Ours uses the constant ``k`` and
  flips the labels (``ll_cp``).
- The official code flips ``torch.where(unobserved_loss > threshold)``: the entries strictly
  above the threshold (the top ``k - 1`` without ties), while it corrects the entries ``>=`` it.
  Ours flips exactly the entries it corrected (``flip="selected"``); ``flip="above"`` gives the
  official strict inequality.
"""
from __future__ import annotations

import math

import torch

from ..labels import POSITIVE, UNOBSERVED
from ..constraints import Interval, Options
from .contract import EpochScheduled, check_hparams
from .inputs import TrainInfo
from .logspace import log_p, masks, soft_bce
from .registry import register

KIM = "Kim et al. 2022 (Large Loss Matters)"
SCHEMES = ("r", "ct", "cp")
K_ROUNDINGS = ("exact", "official")


def large_loss_k(batch_size: int, num_classes: int, epoch: int, delta_rel: float,
                 scheme: str = "r", k_rounding: str = "exact") -> int:
    """Entries to modify in one batch, before clamping to the batch's unobserved count.

    ``epoch`` counts from 0 (the paper's epoch ``t = epoch + 1``); ``delta_rel`` is in percent.

    >>> [large_loss_k(16, 20, e, 0.2) for e in range(4)]      # LL-R / LL-Ct: grows
    [0, 1, 2, 2]
    >>> [large_loss_k(16, 20, e, 0.2, "cp") for e in range(4)]  # LL-Cp: constant from t = 2
    [0, 1, 1, 1]
    >>> large_loss_k(16, 20, 5, 0.5), large_loss_k(16, 20, 5, 0.5, k_rounding="official")
    (8, 9)
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if k_rounding not in K_ROUNDINGS:
        raise ValueError(f"k_rounding must be one of {K_ROUNDINGS}, got {k_rounding!r}")
    epoch = int(epoch)
    if epoch < 1 or delta_rel == 0:
        return 0
    entries = batch_size * num_classes
    if k_rounding == "official":
        delta = delta_rel / 100
        if scheme == "cp":
            return math.ceil(entries * delta)
        clean_rate = 1.0
        for _ in range(epoch):
            clean_rate -= delta
        return math.ceil(entries * (1 - clean_rate))
    steps = 1 if scheme == "cp" else epoch
    return math.ceil(round(entries * steps * delta_rel / 100, 9))


def select_large_losses(loss: torch.Tensor, unobserved: torch.Tensor, k: int):
    """Unobserved entries whose loss is at least the k-th largest unobserved loss.

    Args:
        loss: B x L per-entry losses (only compared, never differentiated).
        unobserved: B x L bool mask of the candidates.
        k: how many to take; clamped to the number of candidates.

    Returns:
        ``(selected, threshold)``: a B x L bool mask (more than ``k`` entries when several tie at
        the threshold) and the threshold, a 0-d tensor (``-inf`` when there is no candidate:
        nothing is selected); None when ``k <= 0``. Computed on the device without reading a
        value on the host: the top ``min(k, B * L)`` of the losses with the other entries at
        ``-inf``, and the ``min(k, candidates)``-th of them picked by a device-side index.

    >>> loss = torch.tensor([[3.0, 1.0, 2.0, 5.0]])
    >>> sel, thr = select_large_losses(loss, torch.tensor([[True, True, True, False]]), 2)
    >>> sel.tolist(), float(thr)
    ([[True, False, True, False]], 2.0)
    """
    k = int(k)
    if k <= 0:
        return torch.zeros_like(unobserved), None
    loss = loss.detach()
    masked = torch.where(unobserved, loss, torch.full_like(loss, float("-inf"))).flatten()
    top = torch.topk(masked, min(k, masked.numel())).values  # descending
    last = (unobserved.sum().clamp(max=top.numel()) - 1).clamp(min=0)  # the clamped k-th
    threshold = top.gather(0, last.view(1)).squeeze(0)
    return unobserved & (loss >= threshold), threshold


class _LargeLoss(EpochScheduled):
    """Shared part of LL-R / LL-Ct / LL-Cp: AN BCE, the schedule of ``k``, the selection."""

    scheme = "r"
    negative_entries = True  # O- is never selected: its entry is the AN term alone

    parameter_constraints = {"delta_rel": Interval(float, 0, 100),
                             "k_rounding": Options(K_ROUNDINGS)}

    def __init__(self, delta_rel: float = 0.2, k_rounding: str = "exact", **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.delta_rel = float(delta_rel)
        self.k_rounding = k_rounding
        #: the entries selected in the last batch (B x L bool, detached); for analyses
        self.last_selected: torch.Tensor | None = None

    def k_for(self, batch_size: int, num_classes: int) -> int:
        """``k`` for a batch of this size in the current epoch (before clamping)."""
        return large_loss_k(batch_size, num_classes, self._epoch, self.delta_rel,
                            self.scheme, self.k_rounding)

    def _observed(self, observed, index):
        return observed

    def entries(self, logits, observed, index):
        observed = self._observed(observed, index)
        pos, _, _ = masks(observed)
        an_loss = soft_bce(logits, pos, self.eps)
        unobserved = observed == UNOBSERVED
        k = self.k_for(*logits.shape)
        selected, threshold = select_large_losses(an_loss, unobserved, k)
        self.last_selected = selected
        if threshold is None:
            return an_loss, None
        if self.scheme == "r":
            mat = torch.where(selected, torch.zeros_like(an_loss), an_loss)
        else:
            mat = torch.where(selected, -log_p(logits, self.eps), an_loss)
        self._after_selection(an_loss.detach(), selected, threshold, index)
        return mat, None

    def _after_selection(self, an_loss, selected, threshold, index) -> None:
        pass


@register("ll_r", "large loss rejection: from epoch 2 the largest unobserved AN losses "
          "(a share growing by delta_rel % per epoch) are set to 0", paper=KIM,
          tags=("large_loss",))
class LargeLossRejection(_LargeLoss):
    """LL-R: BCE on assume-negative targets; the k largest unobserved losses get loss 0.

    ``k = ceil(B * L * (t - 1) * delta_rel / 100)`` in the paper's epoch ``t`` (the engine's
    ``epoch + 1``), taken from ``on_epoch_start``; the module docstring gives the details and
    the differences from the official code.

    Args:
        delta_rel: growth of the rejected share per epoch, in percent (default 0.2; the official
            code has no default, its README's grid is 0.1 ... 0.5).
        k_rounding: ``"exact"`` (default) or ``"official"`` (the running ``clean_rate`` of the
            official code, float drift included).
        reduction, eps: see [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss] (``"mean"`` divides by
            ``B * L``).

    >>> import torch
    >>> loss = LargeLossRejection(delta_rel=25.0)
    >>> loss.on_epoch_start(1)                   # t = 2: k = ceil(1 * 4 * 0.25) = 1
    >>> s = torch.tensor([[2.0, 3.0, -1.0, 0.0]])
    >>> v = loss(s, torch.tensor([[1, 0, 0, 0]]))
    >>> loss.last_selected.tolist()              # the largest unobserved loss: s = 3
    [[False, True, False, False]]
    """

    scheme = "r"


@register("ll_ct", "large loss temporary correction: from epoch 2 the largest unobserved AN "
          "losses (a share growing by delta_rel % per epoch) use target 1", paper=KIM,
          tags=("large_loss",))
class LargeLossCorrectionTemporary(_LargeLoss):
    """LL-Ct: as LL-R, but the selected entries use the flipped target 1 (``-log p``).

    Args: as `LargeLossRejection`.
    """

    scheme = "ct"


@register("ll_cp", "large loss permanent correction: from epoch 2 the ceil(B*L*delta_rel/100) "
          "largest unobserved AN losses of each batch use target 1 and become observed "
          "positives for good", paper=KIM, tags=("large_loss",))
class LargeLossCorrectionPermanent(_LargeLoss):
    """LL-Cp: LL-Ct with a constant ``k = ceil(B * L * delta_rel / 100)`` and permanent flips.

    The loss keeps its own copy of the train split's observed labels, the buffer
    ``observed_labels`` (N_train x L, int8), filled by ``on_train_start``. In every batch the
    rows ``index`` of that buffer replace the observed labels passed in, and at training calls
    (training mode with gradients on; not under ``torch.no_grad()``) the selected entries are
    set to ``POSITIVE`` in it after the loss is computed: from the next batch on they are
    observed positives (target 1, never selected again). ``flipped`` (bool,
    N_train x L) marks them, e.g. to measure how many were true positives. Both buffers are in
    ``state_dict()`` and are resized when a state dict of another size is loaded.

    The official code never ran this (it compared the scheme with ``is``; see the module
    docstring): LL-Cp there was LL-Ct. Ours flips.

    Args:
        delta_rel: per-batch share to correct and flip, in percent (default 0.2).
        flip: ``"selected"`` (default) flips every corrected entry; ``"above"`` only those
            strictly above the threshold, as the official code's ``correction_idx``.
        k_rounding, reduction, eps: as `LargeLossRejection`.
    """

    scheme = "cp"
    needs_index = True
    resizable_state = ("observed_labels", "flipped")
    solver_refusal = ("it flips labels inside every training call (after each step), and a "
                      "solver evaluates the loss many times a step (ll_ct corrects without "
                      "flipping; or --solver adam)")

    parameter_constraints = {"flip": Options(("selected", "above"))}

    def __init__(self, delta_rel: float = 0.2, flip: str = "selected", **kw):
        super().__init__(delta_rel=delta_rel, **kw)
        check_hparams(type(self), locals())
        self.flip = flip
        self.register_buffer("observed_labels", torch.zeros(0, 0, dtype=torch.int8))
        self.register_buffer("flipped", torch.zeros(0, 0, dtype=torch.bool))

    def on_train_start(self, observed, info: TrainInfo) -> None:
        observed = torch.as_tensor(observed).to(torch.int8)
        device = self.observed_labels.device
        if self.carries_state() and self.observed_labels.shape == observed.shape:
            # restored (resume) or carried on (linear_init): keep the flips of these labels
            same = self.observed_labels.cpu() == observed.cpu()
            if bool((same | self.flipped.cpu()).all()):
                return
        self.observed_labels = observed.clone().to(device)
        self.flipped = torch.zeros(observed.shape, dtype=torch.bool, device=device)

    def hard_pseudo_labels(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mask, value)``: the entries flipped so far (N_train x L bool) and the label each
        asserts (N_train x L uint8, all 1: flips make positives). The optional analysis method
        of a loss that pseudo-labels (``pl_precision`` in a run's metrics)."""
        return self.flipped.clone(), torch.ones_like(self.flipped, dtype=torch.uint8)

    def _rows(self, index):
        if self.observed_labels.numel() == 0:
            raise RuntimeError("ll_cp keeps its own copy of the observed labels: the engine calls "
                               "on_train_start(observed, info) before training")
        return torch.as_tensor(index, device=self.observed_labels.device).long()

    def _observed(self, observed, index):
        stored = self.observed_labels[self._rows(index)]
        if stored.shape != observed.shape:
            raise ValueError(f"ll_cp: the batch has {observed.shape[1]} classes but the stored "
                             f"observed labels have {self.observed_labels.shape[1]}")
        return stored.to(observed.device)

    def _after_selection(self, an_loss, selected, threshold, index) -> None:
        if not (self.training and torch.is_grad_enabled()):  # evaluation calls flip nothing
            return
        rows = self._rows(index)
        to_flip = selected
        if self.flip == "above":
            to_flip = selected & (an_loss > threshold)
        # without reading which (no host sync): OR the flips into their rows (a row twice in
        # the batch gets both), then the rows' labels from the flips
        self.flipped.index_put_((rows,), to_flip.to(self.flipped.device), accumulate=True)
        stored = self.observed_labels[rows]
        self.observed_labels[rows] = torch.where(self.flipped[rows],
                                                 torch.full_like(stored, POSITIVE), stored)
