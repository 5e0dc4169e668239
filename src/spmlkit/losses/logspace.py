"""The log-space arithmetic the losses are built from: logs of probabilities from logits in
float32 (float64 stays float64), soft BCE, the label masks, the weight of the observed negatives
(``neg_weight``) and EPR's expected-positive count term with its hand-written gradient.

Everything takes logits: ``log(sigmoid(s))`` is ``logsigmoid(s)``, exact where the probability
underflows (a clamped ``log(p + 1e-8)`` is 0 in float16). ``eps > 0`` switches to the official
``log(p + eps)`` form (``eps=1e-5`` reproduces the papers' values).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..labels import NEGATIVE, POSITIVE, UNOBSERVED


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


def masks(observed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float masks (positive, unobserved, negative) of an observed-label matrix."""
    return ((observed == POSITIVE).float(), (observed == UNOBSERVED).float(),
            (observed == NEGATIVE).float())


def weigh_negatives(mat: torch.Tensor, observed: torch.Tensor, neg_weight: float) -> torch.Tensor:
    """The per-entry loss ``mat`` with its observed-negative entries (``observed == -1``) times
    ``neg_weight``: an extra weight on the known negatives, the L48 benchmark's
    ``--neg-prior-a`` (Sun, Maji, Van Horn 2025: its ``train.py`` multiplies the known
    negatives' entries of the loss matrix; ``tests/test_l48_official.py`` pins it), for a loss
    whose O- entries hold their own term alone
    (`spmlkit.losses.contract.SPMLLoss.negative_entries`). ``neg_weight = 1`` returns ``mat``
    itself (no operation, so existing results stay bit-identical).

    >>> weigh_negatives(torch.ones(1, 3), torch.tensor([[1, 0, -1]]), 2.0).tolist()
    [[1.0, 1.0, 2.0]]
    """
    if neg_weight == 1:
        return mat
    scale = torch.where(observed == NEGATIVE, neg_weight, 1.0).to(device=mat.device,
                                                                 dtype=mat.dtype)
    return mat * scale


def expected_positive_penalty(probs: torch.Tensor, k: float) -> torch.Tensor:
    """EPR: ``((mean_n sum_i p_ni - k) / L) ** 2`` (Cole et al. Eq. 6, the official scaling): the
    count term of a ``closed_form`` loss (``count_penalty``,
    `spmlkit.losses.stacking.StackableLoss`).

    ``probs`` B x L gives a scalar; R x B x L (stacked runs) one value per run."""
    return ((probs.sum(dim=-1).mean(dim=-1) - k) / probs.shape[-1]) ** 2


def expected_positive_penalty_grad(probs: torch.Tensor, k, lam):
    """EPR's penalty of R x B x L probabilities (R,) times ``lam`` (``k`` and ``lam`` numbers or
    per-run tensors), and its gradient for the logits: ``2 lam (m - k) / (L^2 B) * p (1 - p)``
    (``m``: the run's mean predicted count); for hand-written stacked gradients
    (`spmlkit.losses.stacking.StackableLoss.closed_form_step`, ROLE's ``stacked_step``)."""
    runs, batch, classes = probs.shape
    excess = probs.sum(dim=-1).mean(dim=-1) - k
    coef = excess * (2.0 * lam / (classes * classes * batch))
    return lam * (excess / classes) ** 2, probs * (1.0 - probs) * coef.view(runs, 1, 1)
