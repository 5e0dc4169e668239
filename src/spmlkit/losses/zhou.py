"""The losses of Zhou et al., "Acknowledging the Unknown for Multi-label Learning with Single
Positive Labels" (ECCV 2022): EM, EM + APL, and the baselines of their Table 1.

docs/spec.md#zhou is the specification. ``p = sigmoid(s)``; O+ / U / O- are the observed
positive, unobserved and observed negative entries; every per-entry matrix is reduced over B * L
by [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss] (so each loss here is a mean, never a sum).
``H(p) = -[p log p + (1-p) log(1-p)]`` is the binary entropy, computed from logits in log space.

Registered names: ``em``, ``em_apl`` (the paper's methods) and ``dw``, ``l1r``, ``l2r``, ``ls``,
``n_ls``, ``entmin``, ``focal``, ``asl`` (baselines that are not in the official code; defined by
docs/spec.md#zhou and built on the Cole et al. classes where one exists).

Observed negatives. The official EM code asserts there are none, and its EM+APL code reads every
negative value of the label matrix as a soft pseudo-label ``-s``, so an observed ``-1`` would be
trained towards a *positive* target of 1. Here O- always gets ``-log(1-p)`` (the paper's MLML
experiment: "EM acts like BCE with unannotated labels supervised by entropy maximisation").

APL schedule, checked against the official code (``Correr-Zhou/SPML-AckTheUnknown``,
``main.py`` / ``train.py``): the epoch loop sets ``P['epoch'] = epoch_idx + 1`` (1-based) and,
after that epoch's training phase, pseudo-labels when ``P['epoch'] >= P['warmup_epoch']``. With
our 0-based ``epoch`` that is ``epoch + 1 >= warmup``: the first ``warmup`` epochs are plain EM,
the first pseudo-labels are chosen at the end of the ``warmup``-th epoch (0-based
``warmup - 1``) and used from 0-based epoch ``warmup`` on, as the paper's Algorithm 1 says
(generate with ``f_{T_w}``, then train ``f_{T_w + 1}``). A literal ``epoch >= warmup`` on 0-based
epochs would start one epoch late. The official code also runs a round after the last epoch
(``T - warmup + 1`` rounds in all; the last one never trains anything); so does this one, which
only matters for pseudo-label statistics. Per class ``c`` and round it selects
``int(theta * U_c / (T - warmup))`` entries (``U_c`` = the class's unobserved count before
training, ``T`` = total epochs), the lowest predicted probabilities among the entries whose
*current* label is 0, i.e. unobserved and not yet pseudo-labelled, so an entry is never
revisited and its soft target (the prediction at that moment) stays frozen; when fewer remain,
all of them are taken. Two differences, both deliberate:

- the official code predicts through the *shuffled training loader with its augmentation*
  (random horizontal flip), in eval mode; we use the eval-mode predictions of the whole train
  split that the engine passes to `APLLoss.on_epoch_end` (the eval transform);
- ties in the predicted probability are broken by row order (a stable sort); the official
  ``np.argsort`` (quicksort) breaks them arbitrarily.

The pseudo-labels are the loss's own state (buffers ``pseudo_mask``, ``pseudo_target``, N x L),
not an overwrite of the observed labels, so ``state_dict()`` checkpoints them.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

from ..labels import UNOBSERVED
from ..constraints import Interval
from .contract import SPMLLoss, check_hparams
from .inputs import TrainInfo
from .logspace import as_compute, log_1mp, log_p, masks, soft_bce
from .state import take_rows
from .cole import (AssumeNegativeLoss, AssumeNegativeLSLoss, AsymmetricLSLoss,
                   WeakAssumeNegativeLoss)
from .registry import register

ZHOU = "Zhou et al. 2022"

#: Official training settings of the Zhou et al. code (``main.py``), per dataset, for EM and
#: EM + APL alike: batch size, Adam learning rate and epochs (fine-tuning ResNet-50 at 448 px,
#: early stopping at the first epoch whose validation mAP does not improve).
OFFICIAL_TRAINING = {
    "voc": {"batch_size": 8, "lr": 1e-5, "num_epochs": 10},
    "coco": {"batch_size": 16, "lr": 1e-5, "num_epochs": 10},
    "nuswide": {"batch_size": 16, "lr": 1e-5, "num_epochs": 10},
    "cub": {"batch_size": 8, "lr": 1e-4, "num_epochs": 10},
}

_OFFICIAL_ALPHA = {"voc": 0.2, "coco": 0.1, "nuswide": 0.1, "cub": 0.01}
_OFFICIAL_BETA_WARMUP = {"voc": (0.02, 5), "coco": (0.9, 5), "nuswide": (0.2, 4),
                         "cub": (0.4, 3)}


# --- functional pieces -------------------------------------------------------------------------
def binary_entropy(logits: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Per-entry binary entropy ``H(p) = -[p log p + (1-p) log(1-p)]`` of ``p = sigmoid(s)``.

    The logs come from `log_p` / `log_1mp` (log space; ``eps > 0`` gives the
    official ``log(p + eps)``); ``1 - p`` is ``sigmoid(-s)``, exact for large ``s``. The
    derivative is ``dH/ds = -s * p * (1 - p)`` (for ``eps = 0``).

    >>> round(float(binary_entropy(torch.zeros(1))), 4)  # log 2
    0.6931
    """
    logits = as_compute(logits)
    return -(torch.sigmoid(logits) * log_p(logits, eps)
             + torch.sigmoid(-logits) * log_1mp(logits, eps))


def _power(prob: torch.Tensor, gamma: float) -> torch.Tensor:
    """``prob ** gamma`` with a finite gradient everywhere (also at ``prob = 0``, ``gamma < 1``)."""
    if gamma == 0:
        return torch.ones_like(prob)
    positive = prob > 0
    safe = torch.where(positive, prob, torch.ones_like(prob))
    return torch.where(positive, safe.pow(gamma), torch.zeros_like(prob))


def focal_entries(logits: torch.Tensor, observed: torch.Tensor, gamma: float = 2.0,
                  eps: float = 0.0) -> torch.Tensor:
    """Focal loss on AN targets (B x L): ``-(1-p)^g log p`` on O+, ``-p^g log(1-p)`` elsewhere.

    No class-balancing factor (docs/spec.md#zhou). ``gamma = 0`` gives AN.
    """
    logits = as_compute(logits)
    pos, _, _ = masks(observed)
    on_pos = _power(torch.sigmoid(-logits), gamma) * log_p(logits, eps)
    on_neg = _power(torch.sigmoid(logits), gamma) * log_1mp(logits, eps)
    return -(pos * on_pos + (1 - pos) * on_neg)


def asl_entries(logits: torch.Tensor, observed: torch.Tensor, gamma_pos: float = 0.0,
                gamma_neg: float = 4.0, clip: float = 0.05, eps: float = 0.0) -> torch.Tensor:
    """Asymmetric loss (Ridnik et al. 2021) on AN targets (B x L).

    ``-(1-p)^{g+} log p`` on O+; ``-p_m^{g-} log(1 - p_m)`` on U and O-, with the shifted
    probability ``p_m = max(p - clip, 0)``. ``log(1 - p_m) = min(log(sigmoid(-s) + clip), 0)``
    (``log(1 - p_m + eps)`` with ``eps``); with ``clip = 0`` it is `log_1mp` exactly, so
    ``gamma_pos = gamma_neg = clip = 0`` gives AN.
    """
    logits = as_compute(logits)
    pos, _, _ = masks(observed)
    on_pos = _power(torch.sigmoid(-logits), gamma_pos) * log_p(logits, eps)
    if clip == 0:
        p_m, log_1m = torch.sigmoid(logits), log_1mp(logits, eps)
    else:
        p_m = torch.clamp(torch.sigmoid(logits) - clip, min=0.0)
        log_1m = torch.log(torch.clamp(torch.sigmoid(-logits) + clip, max=1.0) + eps)
    on_neg = _power(p_m, gamma_neg) * log_1m
    return -(pos * on_pos + (1 - pos) * on_neg)


#: entries (rows x classes) APL's selection sorts at once (`EMAPLLoss.on_epoch_end`)
SELECT_BLOCK = 1 << 22


def lowest_per_class(probs: torch.Tensor, candidates: torch.Tensor,
                     counts: torch.Tensor) -> torch.Tensor:
    """APL's selection: per column ``c``, the ``counts[c]`` candidates with the lowest ``probs``.

    Args:
        probs: N x L predicted probabilities.
        candidates: N x L bool, the entries that may be chosen.
        counts: L integers; a class with fewer candidates gets all of them.

    Returns:
        N x L bool mask of the chosen entries. Ties go to the lower row (stable sort).

    >>> p = torch.tensor([[0.3, 0.1], [0.2, 0.4], [0.1, 0.5]])
    >>> lowest_per_class(p, torch.ones(3, 2, dtype=torch.bool), torch.tensor([2, 1])).int().tolist()
    [[0, 1], [1, 0], [1, 0]]
    """
    if probs.shape != candidates.shape or probs.ndim != 2:
        raise ValueError(f"probs {tuple(probs.shape)} and candidates "
                         f"{tuple(candidates.shape)} must be the same N x L shape")
    counts = torch.as_tensor(counts, device=probs.device).long()
    if counts.shape != (probs.shape[1],):
        raise ValueError(f"counts must hold one number per class ({probs.shape[1]}), got shape "
                         f"{tuple(counts.shape)}")
    keyed = torch.where(candidates, probs, torch.full_like(probs, float("inf")))
    order = torch.sort(keyed, dim=0, stable=True).indices
    take = torch.minimum(counts, candidates.sum(dim=0))
    rank = torch.arange(probs.shape[0], device=probs.device).unsqueeze(1)
    chosen = torch.zeros_like(candidates)
    chosen.scatter_(0, order, rank < take.unsqueeze(0))
    return chosen


def head_weights(model: nn.Module) -> list[torch.Tensor]:
    """The weight matrices of a model's classifier head: ``model.head`` if the model has one,
    else the model itself (the linear mode's ``nn.Linear``); parameters with ``ndim >= 2``, so
    biases (and norm-layer scales) are excluded. For the vectorised engine's stacked heads
    (``stacked_runs`` set: weights R x L x D, biases R x L) the R x L x D weights."""
    head = getattr(model, "head", None)
    module = head if isinstance(head, nn.Module) else model
    if not isinstance(module, nn.Module):
        raise TypeError(f"penalty(model) needs the nn.Module that produces the logits, got "
                        f"{type(model).__name__}")
    least = 3 if getattr(module, "stacked_runs", None) else 2
    return [w for w in module.parameters() if w.ndim >= least]


# --- the paper's methods -----------------------------------------------------------------------
@register("em", "entropy maximisation: -log p on O+, -alpha*H(p) on U (negative values are "
          "expected), -log(1-p) on O-", paper=ZHOU,
          dataset_defaults={d: {"alpha": a} for d, a in _OFFICIAL_ALPHA.items()})
class EntropyMaximizationLoss(SPMLLoss):
    """EM (Zhou et al. Eq. 3-4): ``-log p`` on O+, ``-alpha * H(p)`` on U, ``-log(1-p)`` on O-.

    The loss is negative wherever the entropy term outweighs the positives: that is expected.
    Official alpha: VOC 0.2, COCO 0.1, NUS-WIDE 0.1, CUB 0.01 (the registry's dataset defaults);
    the default 0.1 is COCO's and NUS-WIDE's.

    Args:
        alpha: weight of the entropy term (>= 0).
        reduction, eps: see [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss]; ``eps=1e-5`` reproduces
            the official ``log(p + 1e-5)`` inside the entropy too.

    >>> loss = EntropyMaximizationLoss(alpha=1.0)
    >>> round(float(loss(torch.zeros(1, 2), torch.tensor([[1, 0]]))), 4)  # (log 2 - log 2) / 2
    0.0
    """

    stackable = True
    negative_entries = True
    paper_threshold = 0.75   # Zhou et al. report EM's F1 at this cut

    parameter_constraints = {"alpha": Interval(float, 0)}

    def __init__(self, alpha: float = 0.1, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.alpha = float(alpha)

    def _observed_part(self, logits, pos, neg):
        return -(pos * log_p(logits, self.eps) + neg * log_1mp(logits, self.eps))

    def entries(self, logits, observed, index):
        pos, unobs, neg = masks(observed)
        mat = self._observed_part(logits, pos, neg)
        return mat - self.alpha * unobs * binary_entropy(logits, self.eps), None


@register("em_apl", "EM + asymmetric pseudo-labelling: after each epoch from the warm-up on, "
          "the int(theta*U_c/(T-warmup)) lowest-p unobserved entries per class become soft "
          "negatives trained with beta*BCE(p, frozen prediction). Official (batch, lr): VOC "
          "8/1e-5, COCO 16/1e-5, NUS 16/1e-5, CUB 8/1e-4 (zhou.OFFICIAL_TRAINING)", paper=ZHOU,
          dataset_defaults={d: {"alpha": _OFFICIAL_ALPHA[d], "beta": b, "warmup": w}
                            for d, (b, w) in _OFFICIAL_BETA_WARMUP.items()})
class APLLoss(EntropyMaximizationLoss):
    """EM + APL (Zhou et al. Eq. 6-8, Algorithm 1).

    Per entry: ``-log p`` on O+; ``-log(1-p)`` on O-; on a pseudo-labelled entry (unobserved,
    chosen by APL) ``beta * BCE(p, s)`` with ``s`` its frozen soft target; on every other
    unobserved entry ``-alpha * H(p)``.

    Schedule (see the module docstring for how it matches the official code): at
    `on_epoch_end` of 0-based ``epoch`` with ``epoch + 1 >= warmup``, per class ``c``,
    ``int(theta * U_c / (T - warmup))`` new pseudo-labels: the lowest predicted ``p`` among
    entries still unobserved and not yet pseudo-labelled; ``s`` = that ``p``, frozen. ``U_c`` is
    counted at `on_train_start`, ``T = TrainInfo.num_epochs``. With ``T <= warmup`` no
    pseudo-label is ever made (the loss is EM; a warning says so).

    State (buffers, so ``state_dict()`` carries it and a fresh instance resizes on load):
    ``pseudo_mask`` (bool, N x L), ``pseudo_target`` (float32, N x L), ``unobserved`` (bool,
    N x L, the train split's unobserved entries), ``class_unobserved`` (L, the ``U_c``) and
    ``total_epochs`` (``T``). `on_train_start` keeps the state when it is called again with
    the same unobserved entries (resuming); other labels reset it.

    Official (beta, warmup): VOC (0.02, 5), COCO (0.9, 5), NUS-WIDE (0.2, 4), CUB (0.4, 3), with
    theta = 0.9 and the alpha of EM; the defaults are COCO's. Batch size and learning rate:
    `OFFICIAL_TRAINING`.

    Args:
        alpha: EM weight on the remaining unobserved entries.
        beta: weight of the pseudo-labels' BCE.
        theta: fraction of each class's unobserved entries pseudo-labelled over the schedule.
        warmup: epochs of plain EM before the first pseudo-labels (the official ``warmup_epoch``).
    """

    needs_index = True
    needs_train_predictions = True
    resizable_state = ("pseudo_mask", "pseudo_target", "unobserved", "class_unobserved")

    parameter_constraints = {"beta": Interval(float, 0), "theta": Interval(float, 0, 1),
                             "warmup": Interval(int, 0)}

    def __init__(self, alpha: float = 0.1, beta: float = 0.9, theta: float = 0.9,
                 warmup: int = 5, **kw):
        super().__init__(alpha=alpha, **kw)
        check_hparams(type(self), locals())
        self.beta, self.theta, self.warmup = float(beta), float(theta), int(warmup)
        self.register_buffer("pseudo_mask", torch.zeros(0, 0, dtype=torch.bool))
        self.register_buffer("pseudo_target", torch.zeros(0, 0))
        self.register_buffer("unobserved", torch.zeros(0, 0, dtype=torch.bool))
        self.register_buffer("class_unobserved", torch.zeros(0, dtype=torch.long))
        self.register_buffer("total_epochs", torch.zeros((), dtype=torch.long))

    # --- engine hooks -----------------------------------------------------------------------
    def on_train_start(self, observed, info: TrainInfo) -> None:
        obs = torch.as_tensor(observed)
        if obs.ndim != 2:
            raise ValueError(f"em_apl: the train split's observed labels must be N x L, got shape "
                             f"{tuple(obs.shape)}")
        if tuple(obs.shape) != (info.num_examples, info.num_classes):
            raise ValueError(f"em_apl: observed labels {tuple(obs.shape)} do not match TrainInfo "
                             f"({info.num_examples} examples x {info.num_classes} classes)")
        device = self.pseudo_mask.device
        unobs = obs.to(device) == UNOBSERVED
        if not (self.carries_state() and self.unobserved.shape == unobs.shape and
                torch.equal(self.unobserved, unobs)):
            self.unobserved = unobs
            self.pseudo_mask = torch.zeros_like(unobs)
            self.pseudo_target = torch.zeros(unobs.shape, device=device)
            self.class_unobserved = unobs.sum(dim=0)
        self.total_epochs.fill_(int(info.num_epochs))
        if info.num_epochs <= self.warmup:
            warnings.warn(f"em_apl: warmup ({self.warmup}) >= num_epochs ({info.num_epochs}); no "
                          f"pseudo-label will be made and the loss is plain EM", stacklevel=2)

    def per_epoch_counts(self) -> list[int]:
        """New pseudo-labels per class and round: ``int(theta * U_c / (T - warmup))``."""
        rounds = int(self.total_epochs) - self.warmup
        if rounds <= 0:
            return [0] * self.class_unobserved.numel()
        return [int(self.theta * u / rounds) for u in self.class_unobserved.tolist()]

    def on_epoch_end(self, epoch: int, train_logits: torch.Tensor | None = None) -> None:
        if epoch + 1 < self.warmup:  # the official 1-based `epoch >= warmup_epoch`
            return
        if self.unobserved.numel() == 0:
            raise RuntimeError("em_apl is not initialised: the engine calls "
                               "on_train_start(observed, info) before training")
        if int(self.total_epochs) <= self.warmup:
            return
        if train_logits is None:
            raise ValueError("em_apl needs the eval-mode logits of the whole train split at "
                             "on_epoch_end(epoch, train_logits) (needs_train_predictions=True)")
        logits = torch.as_tensor(train_logits).detach().to(self.pseudo_mask.device)
        if logits.shape != self.unobserved.shape:
            raise ValueError(f"em_apl: train_logits have shape {tuple(logits.shape)}, the train "
                             f"split's labels {tuple(self.unobserved.shape)}; pass the logits of "
                             f"every train row, in row order")
        if torch.isnan(logits).any():
            raise ValueError(f"em_apl: train_logits hold {int(torch.isnan(logits).sum())} NaN "
                             f"value(s)")
        probs = torch.sigmoid(logits.float())  # (whole: the same bits as before)
        del logits
        counts = torch.tensor(self.per_epoch_counts(), device=probs.device)
        # by blocks of classes (each class is chosen on its own): the sort's temporaries stay
        # within SELECT_BLOCK entries, not ~20 bytes for each of the N x L (GBs at 50k x 5k)
        step = max(1, SELECT_BLOCK // max(1, probs.shape[0]))
        for c0 in range(0, probs.shape[1], step):
            block = slice(c0, c0 + step)
            p = probs[:, block]
            new = lowest_per_class(p, self.unobserved[:, block] & ~self.pseudo_mask[:, block],
                                   counts[block])
            self.pseudo_target[:, block] = torch.where(new, p, self.pseudo_target[:, block])
            self.pseudo_mask[:, block] |= new

    def pseudo_labels(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mask, target)`` copies: which train entries are pseudo-negatives and their soft
        targets (0 where there is none); e.g. for the pseudo-label precision analysis."""
        return self.pseudo_mask.clone(), torch.where(self.pseudo_mask, self.pseudo_target, 0.0)

    def hard_pseudo_labels(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mask, value)``: the pseudo-labelled train entries (N x L bool) and the hard label
        each asserts (N x L uint8): 0 everywhere, APL makes only (soft) negatives. The
        optional analysis method of a loss that pseudo-labels (``pl_precision`` in a run's
        metrics, `spmlkit.metrics.pseudo_label_stats`)."""
        return self.pseudo_mask.clone(), torch.zeros_like(self.pseudo_mask, dtype=torch.uint8)

    # --- the loss ---------------------------------------------------------------------------
    def entries(self, logits, observed, index):
        pos, unobs, neg = masks(observed)
        mat = self._observed_part(logits, pos, neg)
        pseudo = torch.zeros_like(unobs)
        target = torch.zeros_like(unobs)
        if self.pseudo_mask.numel():
            if self.pseudo_mask.shape[-1] != logits.shape[-1]:
                raise ValueError(f"em_apl: the batch has {logits.shape[-1]} classes, the "
                                 f"pseudo-label state {self.pseudo_mask.shape[-1]}")
            pseudo = take_rows(self.pseudo_mask, index).to(logits.device).float() * unobs
            target = take_rows(self.pseudo_target, index).to(logits.device)
        pseudo, target = pseudo.to(logits.dtype), target.to(logits.dtype)
        mat = mat - self.alpha * (unobs - pseudo) * binary_entropy(logits, self.eps)
        return mat + self.beta * pseudo * soft_bce(logits, target, self.eps), None


# --- baselines of Table 1 ----------------------------------------------------------------------
@register("dw", "down-weighted AN: WAN with a tuned gamma on U and O- (default 0.1)",
          paper=ZHOU)
class DownWeightLoss(WeakAssumeNegativeLoss):
    """DW: `WeakAssumeNegativeLoss` with ``gamma`` tuned.

    ``-log p`` on O+, ``gamma * -log(1-p)`` on U and O-. The default 0.1 is ours (the paper's
    tuned values are in an appendix our copy lacks): a fixed, dataset-independent weight in the
    middle of a usual search grid, unlike WAN's ``1/(L-1)``; ``gamma=None`` gives WAN's.
    """

    def __init__(self, gamma: float | None = 0.1, **kw):
        super().__init__(gamma=gamma, **kw)


class _WeightPenaltyLoss(AssumeNegativeLoss):
    """AN plus ``lam`` times a norm of the head's weight matrices (the ``penalty`` hook)."""

    stackable = True
    closed_form = False  # the penalty on the head's weights

    parameter_constraints = {"lam": Interval(float, 0)}

    def __init__(self, lam: float = 1e-4, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.lam = float(lam)

    @staticmethod
    def _norm(weight: torch.Tensor) -> torch.Tensor:
        """The norm of each row of ``weight`` (a weight matrix flattened to one row, or the
        vectorised engine's R stacked runs, one row each)."""
        raise NotImplementedError

    def required_hooks(self) -> tuple[str, ...]:
        """``penalty`` (none with ``lam = 0``)."""
        return ("penalty",) if self.lam else ()

    def penalty(self, model: nn.Module):
        """``lam`` times the norm of the head's weight matrices; for the vectorised engine's
        stacked heads (``stacked_runs``) one value per run, shape (R,)."""
        weights = head_weights(model)
        if not weights or self.lam == 0:
            return 0.0
        if getattr(model, "stacked_runs", None):
            return self.lam * sum(self._norm(as_compute(w).flatten(1)) for w in weights)
        return self.lam * sum(self._norm(as_compute(w).reshape(1, -1))[0] for w in weights)


@register("l1r", "AN + lam * ||W||_1 on the classifier head's weight matrices (biases "
          "excluded; default lam 1e-5)", paper=ZHOU)
class L1RegularizedLoss(_WeightPenaltyLoss):
    """L1R: AN + ``lam * sum |W_ij|`` over the head's weight matrices (`head_weights`).

    The default ``lam = 1e-5`` is ours (the paper's tuned value is not in our copy): at a
    ResNet-50 head's initialisation (2048 x 80, uniform in +-1/sqrt(2048)) the penalty is about
    0.02, a few percent of AN's starting value.
    """

    solver_refusal = ("its L1 penalty |W| has a kink at every zero weight: a quasi-Newton "
                      "solve needs a smooth objective (l2r, or the solver's own L2 path; or "
                      "--solver adam)")

    def __init__(self, lam: float = 1e-5, **kw):
        super().__init__(lam=lam, **kw)

    @staticmethod
    def _norm(weight):
        return weight.abs().sum(dim=-1)


@register("l2r", "AN + lam * ||W||_2^2 on the classifier head's weight matrices (biases "
          "excluded; default lam 1e-4)", paper=ZHOU)
class L2RegularizedLoss(_WeightPenaltyLoss):
    """L2R: AN + ``lam * sum W_ij^2`` over the head's weight matrices (`head_weights`).

    The default ``lam = 1e-4`` is ours (the paper's tuned value is not in our copy).
    """

    def __init__(self, lam: float = 1e-4, **kw):
        super().__init__(lam=lam, **kw)

    @staticmethod
    def _norm(weight):
        return weight.pow(2).sum(dim=-1)


register("ls", "label smoothing on AN targets (= an_ls, official Cole convention: targets "
         "1-e and e, e = 0.1)", paper=ZHOU, factory=AssumeNegativeLSLoss)
register("n_ls", "label smoothing of the negatives only (= an_ls_asym(0, 0.1): target 1 on "
         "O+, 0.05 elsewhere)", paper=ZHOU, defaults={"eps_pos": 0.0, "eps_neg": 0.1},
         factory=AsymmetricLSLoss)


@register("entmin", "AN + lam * H(p) on U: entropy minimisation (collapses in SPML, as the "
          "paper shows; default lam 0.1)", paper=ZHOU)
class EntropyMinimizationLoss(AssumeNegativeLoss):
    """EntMin (Grandvalet & Bengio 2004) on AN: ``-log p`` on O+, ``-log(1-p) + lam * H(p)`` on
    U, ``-log(1-p)`` on O-.

    The entropy term is per entry, so it is reduced over B * L like the rest. The default
    ``lam = 0.1`` is ours (EM's usual alpha, with the opposite sign).
    """

    closed_form = False  # its entropy term

    parameter_constraints = {"lam": Interval(float, 0)}

    def __init__(self, lam: float = 0.1, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.lam = float(lam)

    def entries(self, logits, observed, index):
        mat, _ = super().entries(logits, observed, index)
        _, unobs, _ = masks(observed)
        return mat + self.lam * unobs * binary_entropy(logits, self.eps), None


@register("focal", "focal loss on AN targets: -(1-p)^gamma log p on O+, -p^gamma log(1-p) "
          "elsewhere (gamma 2)", paper=ZHOU)
class FocalLoss(SPMLLoss):
    """Focal loss (Lin et al. 2017) on AN targets; see `focal_entries`.

    Args:
        gamma: focusing parameter (>= 0; 0 gives AN).
    """

    stackable = True
    negative_entries = True

    parameter_constraints = {"gamma": Interval(float, 0)}

    def __init__(self, gamma: float = 2.0, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.gamma = float(gamma)

    def entries(self, logits, observed, index):
        return focal_entries(logits, observed, self.gamma, self.eps), None


@register("asl", "asymmetric loss on AN targets: gamma_pos 0, gamma_neg 4, probability shift "
          "clip 0.05; mean over B*L (not timm's sum)", paper=ZHOU)
class AsymmetricLoss(SPMLLoss):
    """ASL (Ridnik et al. 2021) on AN targets; see `asl_entries`.

    Reduced over B * L like every loss here (timm's ASL returns a sum; this one does not).

    Args:
        gamma_pos: focusing on O+ (>= 0).
        gamma_neg: focusing on U and O- (>= 0).
        clip: probability shift ``m`` in [0, 1) of the negatives.
    """

    stackable = True
    negative_entries = True

    parameter_constraints = {"gamma_pos": Interval(float, 0), "gamma_neg": Interval(float, 0),
                             "clip": Interval(float, 0, 1, closed="left")}

    def __init__(self, gamma_pos: float = 0.0, gamma_neg: float = 4.0, clip: float = 0.05,
                 **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.gamma_pos, self.gamma_neg, self.clip = float(gamma_pos), float(gamma_neg), float(clip)

    def entries(self, logits, observed, index):
        return asl_entries(logits, observed, self.gamma_pos, self.gamma_neg, self.clip,
                           self.eps), None
