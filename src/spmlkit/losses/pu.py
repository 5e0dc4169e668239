"""Positive-unlabelled multi-label learning: the variational PU loss of PU-MLC (Yuan, Zhang,
Huang, "Positive Label Is All You Need for Multi-Label Classification", arXiv 2306.16016,
2023), read from the official code (``TAKELAMAG/PU-MLC`` at commit ``PU_MLC_COMMIT``:
``src/loss_functions/vpu_loss.py``, class ``vpuLoss``; hyperparameters from ``train.py`` and
the README's commands).

Per class ``c`` the batch is the "unlabelled" sample (every row, the observed positives
included, as vPU's whole-data distribution) and the observed positives ``P_c`` of the batch the
labelled sample. With the logits divided by a per-class temperature ``T_c``::

    T_c   = min(alpha * std_i(s_ic), 1)              (population std over the batch, detached)
    q_ic  = sigmoid(s_ic / T_c)
    w_c   = (mean_i q_ic) ** gamma                   (detached: the adaptive re-balance factor)
    l_c   = w_c * log(mean_i q_ic) - mean_{i in P_c} log q_ic

and the loss is ``mean_c l_c`` (the official code returns ``sum_c l_c``: ``L`` times ours, the
per-class mean like every spmlkit loss; a class without an observed positive in the batch has
no second term, the official ``1 / 0 -> 0``).

The loss is defined on the whole batch (a log of batch means, a temperature from the batch's
spread): there is no per-entry matrix. It offers ``reduction="mean"`` only and refuses
``"none"`` and ``"sum"`` (`SPMLLoss.reductions`). Stacked runs (the vectorised engine) each
get their own batch statistics.

Observed negatives are unlabelled here, by the method's design ("we directly discard negative
labels"): the official code sets every row unlabelled whatever its label, so ``neg_weight`` is
refused. A row without an observed positive is an unlabelled row: it moves the batch means only.

Deviations from the official code:

- logs in log space (``logsigmoid``, ``logsumexp``) where the official code takes
  ``log(sigmoid(x) + 1e-10)`` (twice, for the positives: ``log(exp(log(q + 1e-10)) + 1e-10)``)
  and ``log(mean q + 1e-10)``; ``eps > 0`` gives ``log(q + eps)`` and ``log(mean q + eps)``
  (``eps=2e-10`` is the official value to float32 rounding);
- a class whose logits have no spread in the batch (a batch of one row, or equal logits) gets
  ``T_c = 1``: the official ``T_c = 0`` divides by zero (NaN or an infinite loss);
- the official training adds a MixUp consistency term (``mixup``, ``mix_alpha = 0.3``) that
  runs the model on mixed *inputs*: a training-method feature, not a loss on the logits; it is
  not included.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..labels import POSITIVE
from ..constraints import Interval
from .contract import SPMLLoss, check_hparams
from .logspace import as_compute
from .registry import register

PU_MLC_REPO = "TAKELAMAG/PU-MLC"
PU_MLC_COMMIT = "1a4445f094012ba03cc9cb18e6e2b789c8703bf0"
PU_MLC = "Yuan, Zhang, Huang 2023 (PU-MLC, arXiv 2306.16016)"

#: the README's training commands: (alpha, gamma) per dataset (10 % of the labels kept,
#: ``--prob=0.1``); batch 35 (COCO) / 45 (VOC), Adam with OneCycle, lr 1e-4 (COCO) / 4e-5 (VOC)
_OFFICIAL = {"coco": {"alpha": 1.0, "gamma": 0.55}, "voc": {"alpha": 2.0, "gamma": 0.85}}


def vpu_temperature(logits: torch.Tensor, alpha: float) -> torch.Tensor:
    """PU-MLC's per-class temperature ``min(alpha * std, 1)`` over the batch (dim -2, population
    std), detached; 1 where it is 0 (no spread: one row, or equal logits).

    >>> vpu_temperature(torch.tensor([[0.0, 1.0], [1.0, 1.0]]), 1.0).tolist()
    [0.5, 1.0]
    """
    s = as_compute(logits).detach()
    spread = alpha * (s - s.mean(dim=-2, keepdim=True)).pow(2).mean(dim=-2).sqrt()
    spread = spread.clamp(max=1.0)
    return torch.where(spread > 0, spread, torch.ones_like(spread))


@register("vpu", "variational PU loss (PU-MLC): per class w*log(mean_batch q) - "
          "mean_{O+} log q, q = sigmoid(s / T), T = min(alpha*std_batch(s), 1), "
          "w = (mean q)^gamma; O- count as unlabelled; reduction 'mean' only",
          paper=PU_MLC, dataset_defaults=_OFFICIAL)
class VariationalPULoss(SPMLLoss):
    """The variational PU loss of PU-MLC (module docstring has the formula and the
    deviations).

    Args:
        alpha: scale of the temperature ``T = min(alpha * std, 1)`` (> 0); default 1.0 (the
            README's COCO command; VOC: 2.0).
        gamma: exponent of the re-balance factor ``(mean q) ** gamma`` (>= 0); default 0.55
            (COCO; VOC: 0.85). The official code has no defaults (``argparse`` without one).
        reduction: ``"mean"`` only (the loss is defined on the whole batch).
        eps: 0 (exact logs) or the official ``log(x + eps)`` form.

    >>> loss = VariationalPULoss(alpha=1.0, gamma=0.0)
    >>> s = torch.tensor([[2.0], [-2.0]])  # T = min(std 2, 1) = 1
    >>> q = torch.sigmoid(s)
    >>> expected = torch.log(q.mean()) - torch.log(q[0])
    >>> bool(torch.isclose(loss(s, torch.tensor([[1], [0]])), expected[0]))
    True
    """

    stackable = True
    solver_rounds = True  # its temperature and re-balance weight are computed without gradient
    reductions = ("mean",)

    parameter_constraints = {"alpha": Interval(float, 0, None, closed="right"),
                             "gamma": Interval(float, 0)}

    def __init__(self, alpha: float = 1.0, gamma: float = 0.55, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.alpha, self.gamma = float(alpha), float(gamma)

    def entries(self, logits, observed, index):
        s = as_compute(logits)
        z = s / vpu_temperature(s, self.alpha).unsqueeze(-2)
        pos = (observed == POSITIVE).to(s.dtype)
        rows = s.shape[-2]
        if self.eps:
            log_q = torch.log(torch.sigmoid(z) + self.eps)
            log_mean = torch.log(torch.sigmoid(z).mean(dim=-2) + self.eps)
        else:
            log_q = F.logsigmoid(z)
            log_mean = torch.logsumexp(log_q, dim=-2) - math.log(rows)
        with torch.no_grad():
            weight = (1.0 - torch.sigmoid(-z).mean(dim=-2)).pow(self.gamma)
        count = pos.sum(dim=-2)
        pos_mean = (pos * log_q).sum(dim=-2) / count.clamp(min=1.0)  # 0 without a positive
        per_class = weight * log_mean - pos_mean
        return torch.zeros_like(s), per_class.mean(dim=-1)
