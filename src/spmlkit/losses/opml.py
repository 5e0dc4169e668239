"""OPML of Li, Wang, Chen, "Pushing One Pair of Labels Apart Each Time in Multi-Label Learning:
From Single Positive to Full Labels", and ZLPR (Su et al. 2022), its special case.

docs/spec.md#opml gives the equations (the paper's copy lost them). For one row with
positives ``P`` (its observed positives) and negatives ``N`` (every other label: in the
single-positive regime the unobserved labels are assumed negative, in the full regime they are the
observed negatives)::

    l = log(alpha + sum_{j in N} exp(s_j)) + log(beta + sum_{i in P} exp(-s_i))      (Eq. 3 / 6)

computed with ``logsumexp`` (``log(alpha + sum exp(x)) = logsumexp([log alpha, x...])``), never
with a raw ``exp``. ``alpha = a / (1 - a)`` and ``beta = b / (1 - b)`` with ``a, b in (0, 1)``
(the paper's mechanism for choosing the two constants; the exact map is ours, docs/spec.md#opml), so
``a = b = 0.5`` gives ``alpha = beta = 1``: ZLPR. With ``beta = 1`` the gradient on a positive
equals BCE's, ``sigmoid(s_i) - 1`` when ``|P| = 1``.

OPML is a loss per row. To fit the per-entry contract
([`SPMLLoss`][spmlkit.losses.contract.SPMLLoss]) the row loss ``l_i`` is put in every entry of row
``i``: ``reduction="mean"`` is then the mean over rows, ``"none"`` the B x L matrix whose mean that
is, and ``"sum"`` ``L`` times the sum over rows. OPML works on logits directly, so ``eps`` has no
effect.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..labels import POSITIVE, UNOBSERVED
from ..metrics import per_class_ap
from ..constraints import Interval
from .contract import SPMLLoss, check_hparams
from .inputs import TrainInfo
from .logspace import as_compute
from .state import take_rows
from .registry import register
from .regularizers import high_rank_penalty

OPML = "Li, Wang, Chen (OPML)"


def constant_from_ratio(a: float, name: str = "a") -> float:
    """``a / (1 - a)``: maps ``a in (0, 1)`` onto ``(0, inf)``; ``0.5 -> 1``.

    >>> constant_from_ratio(0.5), round(constant_from_ratio(0.2), 4)
    (1.0, 0.25)
    """
    if not 0.0 < a < 1.0:
        raise ValueError(f"{name} must be in (0, 1) (it sets the constant {name}/(1-{name}) "
                         f"in (0, inf); 0.5 gives 1, i.e. ZLPR), got {a}")
    return a / (1.0 - a)


def opml_row_loss(logits: torch.Tensor, positive: torch.Tensor, alpha: float = 1.0,
                  beta: float = 1.0, soft_targets: torch.Tensor | None = None, *,
                  log_targets: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The (soft) OPML loss of every row, shape ``(B,)``.

    Hard form (Eq. 6; Eq. 3 when a row has one positive), with ``N`` = every entry not in ``P``::

        l = log(alpha + sum_{j in N} e^{s_j}) + log(beta + sum_{i in P} e^{-s_i})

    Soft form (Eq. 11), with targets ``t_j in [0, 1]`` on the entries of ``N`` (0 = a hard
    negative)::

        l = log(alpha + sum_{j in N} (1 - t_j) e^{s_j})
            + log(beta + sum_{i in P} e^{-s_i} + sum_{j in N} t_j e^{-s_j})

    A row without a positive contributes ``log beta`` to its second term; a row whose labels are
    all positive contributes ``log alpha`` to its first. Both terms are log-sum-exps of finite
    logits and ``log alpha`` / ``log beta``, so the loss and its gradient are finite for any
    finite logits. Computed in float32 (float64 kept).

    Args:
        logits: B x L scores ``s``.
        positive: B x L bool mask of ``P``.
        alpha, beta: the constants (> 0).
        soft_targets: optional B x L targets ``t`` (detached; values on ``P`` are ignored).
        log_targets: instead of ``soft_targets``, ``(log t, log(1 - t))`` (detached): exact
            where ``t`` rounds to 0 or 1 (`soft_log_targets_from_ap`).

    >>> import torch, math
    >>> s = torch.tensor([[2.0, 0.0, -1.0]])
    >>> l = opml_row_loss(s, torch.tensor([[True, False, False]]))   # ZLPR
    >>> round(l.item(), 5) == round(math.log(1 + 1 + math.exp(-1)) + math.log(1 + math.exp(-2)), 5)
    True
    """
    if alpha <= 0 or beta <= 0:
        raise ValueError(f"alpha and beta must be > 0, got alpha={alpha}, beta={beta}")
    s = as_compute(logits)
    positive = positive.to(torch.bool)
    negative = ~positive
    ninf = torch.full_like(s, -math.inf)
    if soft_targets is not None:
        t = soft_targets.detach().to(s.dtype).clamp(0.0, 1.0)
        log_targets = torch.log(t), torch.log1p(-t)
    if log_targets is None:
        neg_terms = torch.where(negative, s, ninf)
        pos_terms = torch.where(positive, -s, ninf)
    else:
        log_t, log_1mt = (x.detach().to(s.dtype) for x in log_targets)
        neg_terms = torch.where(negative, s + log_1mt, ninf)
        pos_terms = torch.where(positive, -s, torch.where(negative, log_t - s, ninf))
    lead = (*s.shape[:-1], 1)  # B x 1 (R x B x 1 for the vectorised engine's stacked runs)
    log_a = torch.full(lead, math.log(alpha), dtype=s.dtype, device=s.device)
    log_b = torch.full(lead, math.log(beta), dtype=s.dtype, device=s.device)
    return (torch.logsumexp(torch.cat([log_a, neg_terms], dim=-1), dim=-1)
            + torch.logsumexp(torch.cat([log_b, pos_terms], dim=-1), dim=-1))


def soft_targets_from_ap(logits: torch.Tensor, ap: torch.Tensor, gamma: float) -> torch.Tensor:
    """``t_ij = AP_j ** gamma * sigmoid(s_ij)`` (detached), AP in [0, 1] per class (``ap`` L;
    R x L with R x B x L logits of stacked runs)."""
    p = torch.sigmoid(as_compute(logits).detach())
    return ap.to(p.dtype).clamp(0.0, 1.0).pow(gamma).unsqueeze(-2) * p


def soft_log_targets_from_ap(logits: torch.Tensor, ap: torch.Tensor,
                             gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log t, log(1 - t))`` of `soft_targets_from_ap`'s ``t = a * sigmoid(s)``,
    ``a = AP ** gamma``, in log space (detached): ``log a + logsigmoid(s)`` and
    ``log((1 - a) + a * sigmoid(-s))``, exact where ``t`` itself rounds to 1 (``a = 1`` and a
    confident logit: then ``log(1 - t) = logsigmoid(-s)``) or to 0."""
    s = as_compute(logits).detach()
    a = ap.to(s.dtype).clamp(0.0, 1.0).pow(gamma).unsqueeze(-2)
    log_a = torch.log(a)
    log_t = log_a + F.logsigmoid(s)
    log_1mt = torch.logaddexp(torch.log1p(-a).expand_as(s), log_a + F.logsigmoid(-s))
    return log_t, log_1mt


class _OPMLBase(SPMLLoss):
    """Per-row OPML placed in every entry of its row (see the module docstring)."""

    stackable = True

    alpha = 1.0
    beta = 1.0

    def _row_loss(self, logits, observed, index):
        return opml_row_loss(logits, observed == POSITIVE, self.alpha, self.beta)

    def entries(self, logits, observed, index):
        rows = self._row_loss(logits, observed, index)
        mat = as_compute(rows).unsqueeze(-1).expand(*rows.shape, logits.shape[-1]).contiguous()
        return mat, self._batch_penalty(logits)

    def _batch_penalty(self, logits):
        return None


@register("zlpr", "ZLPR: log(1 + sum_neg e^s) + log(1 + sum_pos e^-s) per row (unobserved "
          "labels are negatives); OPML with alpha = beta = 1", paper="Su et al. 2022; " + OPML)
class ZLPRLoss(_OPMLBase):
    """ZLPR (Su et al. 2022): ``log(1 + sum_{j in N} e^{s_j}) + log(1 + sum_{i in P} e^{-s_i})``.

    OPML with ``alpha = beta = 1``. Row loss in every entry of its row, so ``"mean"`` is the mean
    over rows.

    >>> import torch, math
    >>> v = ZLPRLoss()(torch.zeros(1, 3), torch.tensor([[1, 0, 0]]))
    >>> round(v.item(), 5) == round(math.log(3) + math.log(2), 5)
    True
    """


@register("opml", "OPML: log(alpha + sum_neg e^s) + log(beta + sum_pos e^-s) per row, "
          "alpha = a/(1-a), beta = b/(1-b); single positive and full labels", paper=OPML)
class OPMLLoss(_OPMLBase):
    """OPML (Eq. 3 / Eq. 6): one formula for single-positive and full labels.

    Per row, ``P`` = the observed positives and ``N`` = every other label (unobserved labels are
    assumed negative; observed negatives are negatives)::

        l = log(alpha + sum_{j in N} e^{s_j}) + log(beta + sum_{i in P} e^{-s_i})

    ``l >= log alpha + log beta``. The row loss fills every entry of its row (``"mean"`` = mean
    over rows).

    Args:
        a: ``alpha = a / (1 - a)``, in (0, 1); default 0.5 (alpha = 1). The paper tunes it per
            dataset (its values are in its supplement, not recoverable); grid e.g. 0.1 ... 0.9.
        b: ``beta = b / (1 - b)``, in (0, 1); default 0.5 (beta = 1: the positive's gradient is
            BCE's). ``a = b = 0.5`` is ZLPR.
        reduction, eps: see [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss] (``eps`` has no effect:
            no log of a probability).
    """

    parameter_constraints = {"a": Interval(float, 0, 1, closed="neither"),
                             "b": Interval(float, 0, 1, closed="neither")}

    def __init__(self, a: float = 0.5, b: float = 0.5, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.a, self.b = float(a), float(b)
        self.alpha = constant_from_ratio(self.a, "a")
        self.beta = constant_from_ratio(self.b, "b")


@register("soft_opml", "soft OPML: unobserved labels get soft targets AP_j^gamma * p_ij "
          "(AP on the train split, refreshed each epoch); optional AP-based label correction",
          paper=OPML + ", Eq. 11", tags=("opml",))
class SoftOPMLLoss(OPMLLoss):
    """Soft OPML (Eq. 11) with optional AP-based label correction.

    Soft targets on the unobserved entries: ``t_ij = AP_j ** gamma * p_ij``, where ``p_ij`` is
    the model's current prediction for the batch (``sigmoid(s_ij)``, detached: a target, not a
    path for gradients) and ``AP_j`` (in [0, 1]) the class's average precision on the training
    split against the *originally* observed positives, from the eval-mode train logits the
    engine passes to ``on_epoch_end`` (``needs_train_predictions``). A class without an observed
    positive gets AP 0 (``metrics.per_class_ap / 100``, NaN -> 0). The buffer ``ap`` starts at 0,
    so (for ``gamma > 0``) the first epoch is plain OPML. Observed negatives keep hard targets
    (t = 0). Then::

        l = log(alpha + sum_{j in N} (1 - t_j) e^{s_j})
            + log(beta + sum_{i in P} e^{-s_i} + sum_{j in N} t_j e^{-s_j})

    Label correction (``correction_ratio = r > 0``): in ``on_epoch_end(epoch)`` for every
    ``epoch >= warmup`` (epochs count from 0), after AP is refreshed, per class ``j`` the
    ``floor(r * AP_j * n_j)`` highest-scoring still-unobserved train entries become observed
    positives for good, where ``n_j`` is the number of originally observed positives of class
    ``j`` (capped at the class's unobserved count; ties broken by row order). The loss keeps its
    own copy of the train split's observed labels (``observed_labels``, int8, N_train x L; the
    mask ``corrected`` marks the flips) and, when correcting, uses its rows ``index`` instead of
    the observed labels passed in (``needs_index``). AP is always measured against the original
    observed positives: the corrected entries are by construction the top-scored unobserved
    ones and would inflate it.

    All state (``ap``, ``observed_labels``, ``corrected``) is in buffers, resized on load.

    Args:
        a, b: as `OPMLLoss`.
        gamma: power on AP (default 1.0).
        correction_ratio: ``r`` (default 0: no correction, soft targets only).
        warmup: first epoch (from 0) after which labels are corrected (default 1).
        reduction, eps: see [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss].
    """

    needs_train_predictions = True
    resizable_state = ("ap", "observed_labels", "corrected")

    parameter_constraints = {"gamma": Interval(float, 0), "correction_ratio": Interval(float, 0),
                             "warmup": Interval(int, 0)}

    def __init__(self, a: float = 0.5, b: float = 0.5, gamma: float = 1.0,
                 correction_ratio: float = 0.0, warmup: int = 1, **kw):
        super().__init__(a=a, b=b, **kw)
        check_hparams(type(self), locals())
        self.gamma = float(gamma)
        self.correction_ratio = float(correction_ratio)
        self.warmup = int(warmup)
        self.register_buffer("ap", torch.zeros(0))
        self.register_buffer("observed_labels", torch.zeros(0, 0, dtype=torch.int8))
        self.register_buffer("corrected", torch.zeros(0, 0, dtype=torch.bool))

    @property
    def needs_index(self) -> bool:  # the stored (corrected) labels are read by row
        return self.correction_ratio > 0

    # --- state --------------------------------------------------------------------------------
    def on_train_start(self, observed, info: TrainInfo) -> None:
        observed = torch.as_tensor(observed).to(torch.int8)
        device = self.observed_labels.device
        if self.carries_state() and self.observed_labels.shape == observed.shape and \
                self.ap.numel() == observed.shape[1]:
            same = self.observed_labels.cpu() == observed.cpu()
            if bool((same | self.corrected.cpu()).all()):
                return  # carried over (resume, linear_init): keep AP and corrections
        self.observed_labels = observed.clone().to(device)
        self.corrected = torch.zeros(observed.shape, dtype=torch.bool, device=device)
        self.ap = torch.zeros(observed.shape[1], device=self.ap.device)

    def hard_pseudo_labels(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mask, value)``: the entries corrected so far (N_train x L bool; none without
        ``correction_ratio``) and the label each asserts (N_train x L uint8, all 1). The
        optional analysis method of a loss that pseudo-labels (``pl_precision`` in a run's
        metrics)."""
        return self.corrected.clone(), torch.ones_like(self.corrected, dtype=torch.uint8)

    def original_positives(self) -> torch.Tensor:
        """The originally observed positives (N_train x L bool): corrections removed."""
        return (self.observed_labels == POSITIVE) & ~self.corrected

    def on_epoch_end(self, epoch: int, train_logits=None) -> None:
        if train_logits is None:
            raise ValueError(f"{type(self).__name__} needs the eval-mode logits of the whole "
                             f"train split in on_epoch_end (needs_train_predictions)")
        if self.observed_labels.numel() == 0:
            raise RuntimeError(f"{type(self).__name__}: on_train_start(observed, info) must be "
                               f"called before on_epoch_end")
        scores = torch.as_tensor(train_logits).detach()
        if scores.shape != self.observed_labels.shape:
            raise ValueError(f"train_logits have shape {tuple(scores.shape)}; the train split's "
                             f"observed labels are {tuple(self.observed_labels.shape)}")
        self.refresh_ap(scores)
        if self.correction_ratio > 0 and epoch >= self.warmup:
            self.correct_labels(scores)

    def refresh_ap(self, train_logits: torch.Tensor) -> torch.Tensor:
        """Recompute ``ap`` (per class, in [0, 1]) against the original observed positives."""
        scores = train_logits.detach().float().cpu().numpy()
        targets = self.original_positives().cpu().numpy().astype(np.uint8)
        ap = np.nan_to_num(per_class_ap(scores, targets) / 100.0, nan=0.0)
        self.ap = torch.as_tensor(ap, dtype=torch.float32, device=self.ap.device)
        return self.ap

    def correction_counts(self) -> torch.Tensor:
        """``floor(r * AP_j * n_j)`` per class (before capping at the unobserved count)."""
        n_obs = self.original_positives().sum(dim=0).double().cpu()
        ap = self.ap.double().cpu()
        return torch.floor(self.correction_ratio * ap * n_obs + 1e-9).long()

    def correct_labels(self, train_logits: torch.Tensor) -> torch.Tensor:
        """Turn the top-scored unobserved entries of every class into observed positives.

        Returns:
            the number corrected per class (L,).
        """
        scores = train_logits.detach().float().cpu()
        counts = self.correction_counts()
        labels = self.observed_labels.cpu()
        done = torch.zeros(labels.shape[1], dtype=torch.long)
        for j in range(labels.shape[1]):
            rows = torch.nonzero(labels[:, j] == UNOBSERVED, as_tuple=True)[0]
            n = min(int(counts[j]), rows.numel())
            if n <= 0:
                continue
            order = torch.argsort(scores[rows, j], descending=True, stable=True)[:n]
            chosen = rows[order].to(self.observed_labels.device)
            self.observed_labels[chosen, j] = POSITIVE
            self.corrected[chosen, j] = True
            done[j] = n
        return done

    # --- the loss -----------------------------------------------------------------------------
    def _current_ap(self, num_classes: int, device) -> torch.Tensor:
        if self.ap.numel() == 0:
            return torch.zeros(num_classes, device=device)
        if self.ap.shape[-1] != num_classes:
            raise ValueError(f"{type(self).__name__}: the batch has {num_classes} classes, the "
                             f"stored AP {self.ap.shape[-1]}")
        return self.ap.to(device)

    def _row_loss(self, logits, observed, index):
        if self.needs_index:
            if self.observed_labels.numel() == 0:
                raise RuntimeError(f"{type(self).__name__} with label correction keeps its own "
                                   f"copy of the observed labels: the engine calls "
                                   f"on_train_start(observed, info) before training")
            observed = take_rows(self.observed_labels, index).to(logits.device)
        log_t, log_1mt = soft_log_targets_from_ap(
            logits, self._current_ap(logits.shape[-1], logits.device), self.gamma)
        soft = observed == UNOBSERVED  # observed negatives keep hard targets: t = 0
        log_t = torch.where(soft, log_t, torch.full_like(log_t, -math.inf))
        log_1mt = torch.where(soft, log_1mt, torch.zeros_like(log_1mt))
        return opml_row_loss(logits, observed == POSITIVE, self.alpha, self.beta,
                             log_targets=(log_t, log_1mt))


@register("opml_sp", "OPML-SP: soft OPML + high-rank regulariser + AP-based label correction",
          paper=OPML, tags=("opml",))
class OPMLSPLoss(SoftOPMLLoss):
    """OPML-SP = soft OPML + ``highrank_weight`` x high-rank regulariser + label correction.

    The high-rank term ``-log det(Q^T Q / B + eps I)`` (`high_rank_penalty`, the B x B
    Gram when ``B < L``) is added after the reduction, like every penalty.

    Defaults (ours: the paper's values are in its lost tables): ``a = b = 0.5``, ``gamma = 1``,
    ``highrank_weight = 1e-3`` (the paper finds the weight insensitive below a threshold; its
    grid is 1e-4 ... 1e-1),
    ``correction_ratio = 0.1``, ``warmup = 1`` (labels corrected from the end of the second epoch).
    """

    parameter_constraints = {"highrank_weight": Interval(float, 0),
                             "highrank_eps": Interval(float, 0)}

    def __init__(self, a: float = 0.5, b: float = 0.5, gamma: float = 1.0,
                 correction_ratio: float = 0.1, warmup: int = 1, highrank_weight: float = 1e-3,
                 highrank_eps: float = 1e-4, **kw):
        super().__init__(a=a, b=b, gamma=gamma, correction_ratio=correction_ratio,
                         warmup=warmup, **kw)
        check_hparams(type(self), locals())
        self.highrank_weight = float(highrank_weight)
        self.highrank_eps = float(highrank_eps)

    def _batch_penalty(self, logits):
        if not self.highrank_weight:
            return None
        return self.highrank_weight * high_rank_penalty(logits, self.highrank_eps)
