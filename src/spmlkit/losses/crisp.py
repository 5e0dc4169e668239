"""CRISP: Liu, Xu, Wang, Geng, "Can Class-Priors Help Single-Positive Multi-Label Learning?"
(NeurIPS 2025; arXiv 2309.13886). No official code has been published.

The method alternates two steps (the paper's Algorithm 1): after every epoch it *estimates the
class priors* ``pi_j = p(y_j = 1)`` from the current classifier and the observed positives, and
it trains the classifier on a *risk estimator that uses those priors*.

What the paper states (Sec. 4.1, Theorem 4.1, Appendix A.2, A.4, A.6), with
``f_j(x) = sigmoid(g_j(x))``, ``S_j`` the training rows whose observed positive is ``j``,
``n = |train split|`` and ``n_j = |S_j|``:

1. Class-prior estimator (Eq. 2; the "top bin" estimator of Garg et al., NeurIPS 2021, applied
   per label). For every threshold ``z`` taken from the classifier's outputs on the training
   rows (an exhaustive search, A.2)::

       q_j(z)  = (1/n)   #{i : f_j(x_i) >= z}          (all training rows)
       qp_j(z) = (1/n_j) #{x in S_j : f_j(x) >= z}     (the observed positives of j)
       z_hat   = argmin_z  q_j(z)/qp_j(z) + (1 + tau)/qp_j(z) * b_j,
       b_j     = sqrt(log(4/delta)/(2n)) + sqrt(log(4/delta)/(2 n_j))
       pi_j    = q_j(z_hat) / qp_j(z_hat)

   with ``delta = tau = 0.01`` in all the paper's experiments (A.6).
2. The risk with the absolute loss ``|f_j(x) - y_j|`` rewritten with the priors (Eq. 5, from
   the terms of Theorem 4.2 / Lemma A.1), and an absolute value on its second term (Eq. 6)::

       R_sp(f) = sum_j  2 pi_j E_{x ~ p(x|y_j=1)}[1 - f_j(x)]  +  | E_{x ~ p(x)}[f_j(x)] - pi_j |

   The first expectation is taken over the observed positives ``S_j`` (Eq. 7, the empirical
   estimator that the algorithm minimises), the second over all training rows. The copy of
   the text we could retrieve lost the typeset equations (Eq. 2 survives in Theorem 4.1's
   statement); this form of Eq. 5-7 is the one the paper states term by term in Theorem 4.2
   and Lemma A.1 (``L^L_sp = sum_j 2 pi_j l_j (1 - f_j(x))``, ``L^U_sp = sum_j (f_j(x) -
   pi_j)``, ``R^L_sp = sum_j 2 pi_j E_{p(x|y_j=1)}[1 - f_j(x)]``), with the absolute value that
   the text says is added to the second term; it is also what rewriting the absolute loss
   with ``p(x) = pi_j p(x|y_j=1) + (1 - pi_j) p(x|y_j=0)`` gives.
3. Warm-up with AN (every unobserved label a negative) before the first estimate, and the
   priors re-estimated after each epoch from the trained model (A.6).

What is our reading (the paper leaves it open, or its formula could not be retrieved):

- *Mini-batches.* Eq. 7 is a sum over the whole training set. Per batch of ``B`` rows we use
  the unbiased estimate of its first term, ``2 pi_j (n / (B n_j)) sum_{i in batch, i in S_j}
  (1 - f_j(x_i))``, and ``| mean_{i in batch} f_j(x_i) - pi_j |`` for the second (the batch
  mean inside the absolute value, as any mini-batch implementation must). Like every loss in
  spmlkit the value is the per-class average (the sum over ``j`` divided by ``L``): the per-
  entry matrix holds ``2 pi_j (n / n_j) (1 - p_ij)`` on the observed positives (0 elsewhere)
  and its mean over ``B * L`` plus ``(1/L) sum_j |mean_i p_ij - pi_j|``.
- *Eq. 8 is not implemented.* The NeurIPS text proposes "a modification of Eq. (7)" with a
  hyperparameter ``lambda`` acting on the logits ``g_j`` against the bias of the decision
  boundary towards rare classes' positives, but its formula is not in any copy we could read
  (the equations of the published text were not extracted); Algorithm 1 minimises Eq. 7, and
  this is Eq. 7.
- *Warm-up length.* The paper warms up with AN but does not say for how long: ``warmup``
  epochs of AN (default 1; at least 1, since the first estimate needs a trained model), the
  first estimate at the end of epoch ``warmup - 1`` (0-based), CRISP from epoch ``warmup``.
- *Scores for the estimator.* The eval-mode logits of the train split (the engine's
  ``needs_train_predictions``); the threshold search runs on the logits, which orders the rows
  exactly as ``f_j = sigmoid(g_j)`` does (a monotone map) without float32 sigmoid saturation
  merging distinct scores. Ties in the objective go to the lowest threshold.
- *A label with no observed positive* (``n_j = 0``): Eq. 2 is undefined; its prior is 0, so it
  only gets the second term, which pulls its mean prediction to 0.
- *Observed negatives* (regimes other than the paper's single positive): treated as unlabelled
  rows, i.e. as the paper treats every non-annotated label.
- ``update_every``: re-estimate every that many epochs (the paper's CRISP-3EP variant, Table 5,
  is ``update_every=3``; default 1 = the paper's method).

The estimator's guarantee (Theorem 4.1, whose bound's formula is among the lost equations; its
proof shows the shape): with probability ``1 - delta`` the estimate is within terms of order
``sqrt(log(4/delta)/n) + sqrt(log(4/delta)/n_j)`` of ``pi*_j = min_z q_j(z)/qp_j(z) >= pi_j``,
which equals the true prior when the classifier has a "top bin" holding positives only. It
assumes the observed positive of a row is drawn from the class-conditional ``p(x | y_j = 1)``;
under SPML's one-positive-per-row draw that holds only approximately (rows with many labels
are less likely to show any given one).
"""
from __future__ import annotations

import math
import warnings

import torch

from ..labels import POSITIVE
from ..constraints import Interval
from .contract import SPMLLoss, check_hparams
from .inputs import TrainInfo
from .logspace import soft_bce
from .registry import register

CRISP = "Liu, Xu, Wang, Geng 2025 (CRISP, NeurIPS'25)"


def _check_delta_tau(delta: float, tau: float) -> None:
    if not 0.0 < float(delta) < 1.0:
        raise ValueError(f"crisp: delta (the estimator's confidence level) must be in (0, 1), "
                         f"got {delta}")
    if not 0.0 <= float(tau) <= 1.0:
        raise ValueError(f"crisp: tau (the estimator's slack) must be in [0, 1], got {tau}")


def estimate_class_priors(scores, positives, delta: float = 0.01, tau: float = 0.01,
                          return_thresholds: bool = False):
    """CRISP's class-prior estimator (Liu et al. 2025, Eq. 2 / Theorem 4.1 / App. A.2).

    For each label ``j``, over every distinct score ``z`` of the column (the exhaustive search of
    App. A.2), with ``q(z)`` the share of all ``n`` rows scoring ``>= z`` and ``qp(z)`` the
    share of the label's ``n_j`` observed positives scoring ``>= z``::

        z_hat = argmin_z  q(z)/qp(z) + (1 + tau)/qp(z) * (sqrt(log(4/delta)/(2n))
                                                          + sqrt(log(4/delta)/(2 n_j)))
        pi_j  = q(z_hat) / qp(z_hat)

    Thresholds above the highest positive's score (``qp = 0``) are not candidates; ties in the
    objective go to the lowest threshold. The estimate lies in ``[n_j / n, 1]`` (at the lowest
    score the ratio is 1 and the bound term is smallest, so no ratio above 1 can win). A label
    without an observed positive gets 0.

    >>> s = torch.tensor([[3.0], [2.0], [1.0], [0.0]]); pos = torch.tensor([[1], [0], [0], [0]])
    >>> round(float(estimate_class_priors(s, pos, delta=0.5, tau=0.0)[0]), 4)  # z_hat = 3: 1/4
    0.25

    Args:
        scores: N x L scores (logits or probabilities: only their order matters).
        positives: N x L, true (or 1) where the label is an observed positive.
        delta: the confidence level of Theorem 4.1, in (0, 1) (paper: 0.01).
        tau: the slack of Theorem 4.1, in [0, 1] (paper: 0.01).
        return_thresholds: also return the chosen threshold per label (NaN where none).

    Returns:
        the L estimated priors (float64), and the L thresholds when asked.

    Raises:
        ValueError: shapes differ, or ``delta`` / ``tau`` out of range.
    """
    _check_delta_tau(delta, tau)
    scores = torch.as_tensor(scores).detach().double().cpu()
    positives = torch.as_tensor(positives).detach().cpu()
    if scores.ndim != 2 or positives.shape != scores.shape:
        raise ValueError(f"crisp: scores and positives must both be N x L; got "
                         f"{tuple(scores.shape)} and {tuple(positives.shape)}")
    positives = positives.bool() if positives.dtype == torch.bool else positives == POSITIVE
    n, num_labels = scores.shape
    priors = torch.zeros(num_labels, dtype=torch.float64)
    thresholds = torch.full((num_labels,), float("nan"), dtype=torch.float64)
    log_term = math.log(4.0 / delta)
    for j in range(num_labels):
        col = scores[:, j]
        pos = col[positives[:, j]]
        n_j = pos.numel()
        if n_j == 0 or n == 0:
            continue
        everyone, _ = torch.sort(col)
        positive_scores, _ = torch.sort(pos)
        candidates = torch.unique(col)  # sorted ascending
        at_least = n - torch.searchsorted(everyone, candidates, side="left")
        pos_at_least = n_j - torch.searchsorted(positive_scores, candidates, side="left")
        keep = pos_at_least > 0
        q = at_least[keep].double() / n
        qp = pos_at_least[keep].double() / n_j
        bound = (1.0 + tau) * (math.sqrt(log_term / (2 * n)) + math.sqrt(log_term / (2 * n_j)))
        objective = (q + bound) / qp
        best = int(torch.argmin(objective))  # the first minimum: the lowest threshold
        priors[j] = q[best] / qp[best]
        thresholds[j] = candidates[keep][best]
    return (priors, thresholds) if return_thresholds else priors


@register("crisp", "CRISP: AN warm-up, then per epoch the class priors pi_j estimated from "
          "the train split's scores (top-bin threshold, Eq. 2) and the loss 2 pi_j (n/n_j)(1-p) "
          "on observed positives + |mean_batch p_j - pi_j| per class (Eq. 7)", paper=CRISP)
class CRISPLoss(SPMLLoss):
    """CRISP (module docstring: what is the paper's and what is our reading).

    During the first ``warmup`` epochs the loss is AN (``-log p`` on O+, ``-log(1-p)``
    elsewhere). At the end of epoch ``warmup - 1`` and then every ``update_every`` epochs the
    priors are estimated (`estimate_class_priors`) from the eval-mode train logits the
    engine passes to ``on_epoch_end``; from epoch ``warmup`` on, with ``p = sigmoid(s)``::

        l_ij    = 2 pi_j (n / n_j) (1 - p_ij)   on O+ (0 elsewhere; 0 for a label with n_j = 0)
        penalty = (1/L) sum_j | mean_i p_ij - pi_j |

    and the value is ``mean(l) + penalty`` (``reduction="mean"``), i.e. the batch estimate of
    the paper's Eq. 7 divided by ``L``.

    State (buffers, in ``state_dict``): ``priors`` (L; -1 until the first estimate),
    ``pos_weight`` (L, ``n / n_j``), ``positives`` (N_train x L, the observed positives the
    estimator counts). Stackable (the linear engine trains several grid points at once).

    Args:
        delta, tau: the estimator's confidence level and slack (paper: 0.01 and 0.01).
        warmup: epochs of AN before CRISP (>= 1; the paper's length is not stated).
        update_every: epochs between estimates (1: every epoch, the paper's CRISP).
        reduction, eps: see [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss] (``eps`` only changes the
            AN warm-up's logs).

    Raises:
        ValueError: a hyperparameter out of range.
    """

    needs_train_predictions = True
    stackable = True
    resizable_state = ("priors", "pos_weight", "positives")

    parameter_constraints = {"delta": Interval(float, 0, 1, closed="neither"),
                             "tau": Interval(float, 0, 1), "warmup": Interval(int, 1),
                             "update_every": Interval(int, 1)}

    def __init__(self, delta: float = 0.01, tau: float = 0.01, warmup: int = 1,
                 update_every: int = 1, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.delta, self.tau = float(delta), float(tau)
        self.warmup, self.update_every = int(warmup), int(update_every)
        self._epoch = 0
        self.register_buffer("priors", torch.zeros(0))
        self.register_buffer("pos_weight", torch.zeros(0))
        self.register_buffer("positives", torch.zeros(0, 0, dtype=torch.bool))

    # --- hooks --------------------------------------------------------------------------------
    def on_train_start(self, observed, info: TrainInfo) -> None:
        observed = torch.as_tensor(observed)
        positives = (observed == POSITIVE).to(self.positives.device)
        if self.carries_state() and self.positives.shape == positives.shape and \
                bool((self.positives == positives).all()) and \
                self.priors.numel() == positives.shape[1]:
            return  # restored (resume) or carried on (linear_init): keep the estimates
        counts = positives.sum(dim=0).double()
        weight = torch.where(counts > 0, positives.shape[0] / counts.clamp(min=1),
                             torch.zeros_like(counts))
        self.positives = positives
        self.pos_weight = weight.float().to(self.pos_weight.device)
        self.priors = torch.full((positives.shape[1],), -1.0, device=self.priors.device)
        if info.num_epochs <= self.warmup:
            warnings.warn(f"crisp: warmup ({self.warmup}) >= num_epochs ({info.num_epochs}); "
                          f"the estimated priors are never used and the loss is plain AN",
                          stacklevel=2)

    def on_epoch_start(self, epoch: int) -> None:
        self._epoch = int(epoch)
        if self._epoch >= self.warmup and self.priors.numel() and bool((self.priors < 0).any()):
            raise RuntimeError(f"crisp: epoch {epoch} uses the class priors, but none were "
                               f"estimated (on_epoch_end with the train split's logits at the "
                               f"end of epoch {self.warmup - 1})")

    def on_epoch_end(self, epoch: int, train_logits=None) -> None:
        if train_logits is None:
            raise ValueError("crisp needs the eval-mode logits of the whole train split in "
                             "on_epoch_end (needs_train_predictions)")
        if self.positives.numel() == 0 and self.priors.numel() == 0:
            raise RuntimeError("crisp: on_train_start(observed, info) must be called before "
                               "on_epoch_end")
        first = self.warmup - 1
        if epoch < first or (epoch - first) % self.update_every:
            return
        scores = torch.as_tensor(train_logits).detach()
        if scores.shape != self.positives.shape:
            raise ValueError(f"crisp: train_logits have shape {tuple(scores.shape)}; the train "
                             f"split's observed labels are {tuple(self.positives.shape)}")
        if torch.isnan(scores).any():  # (the priors' search would fail or drift silently)
            raise ValueError(f"crisp: train_logits hold {int(torch.isnan(scores).sum())} NaN "
                             f"value(s)")
        priors = estimate_class_priors(scores, self.positives, self.delta, self.tau)
        self.priors = priors.float().to(self.priors.device)

    # --- the loss -----------------------------------------------------------------------------
    def in_warmup(self) -> bool:
        """True while the loss is AN (before epoch ``warmup``)."""
        return self._epoch < self.warmup

    def entries(self, logits, observed, index):
        pos = observed == POSITIVE
        if self.in_warmup():
            return soft_bce(logits, pos, self.eps), None
        if self.priors.ndim == 0 or self.priors.shape[-1] != logits.shape[-1]:
            raise RuntimeError("crisp: no class priors for these labels: the engine calls "
                               "on_train_start and on_epoch_end before CRISP's epochs")
        p = torch.sigmoid(logits)
        priors = self.priors.to(logits.dtype)
        weight = (2.0 * priors * self.pos_weight.to(logits.dtype)).unsqueeze(-2)
        mat = pos.to(logits.dtype) * weight * torch.sigmoid(-logits)  # 1 - p, exact near 1
        penalty = (p.mean(dim=-2) - priors).abs().mean(dim=-1)
        return mat, penalty
