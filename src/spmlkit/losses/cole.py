"""The losses of Cole et al., "Multi-Label Learning from Single Positive Labels" (CVPR 2021).

Per-entry losses (docs/spec.md#cole-losses); every one is reduced over B * L by
[`SPMLLoss`][spmlkit.losses.contract.SPMLLoss]. ``p = sigmoid(s)``; O+ / U / O- are the
observed-positive, unobserved and observed-negative entries.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..labels import NEGATIVE, POSITIVE, UNOBSERVED
from ..constraints import Interval, Options
from .contract import SPMLLoss, check_hparams
from .inputs import K_RULE, TrainInfo
from .logspace import expected_positive_penalty, expected_positive_penalty_grad, soft_bce
from .state import take_rows
from .registry import register

COLE = "Cole et al. 2021"


class _BCEForm(SPMLLoss):
    """A loss that is one weighted soft BCE (``bce_form``) plus, optionally, EPR's count term
    (``count_penalty``): `SPMLLoss.closed_form`."""

    stackable = True
    closed_form = True
    negative_entries = True

    def entries(self, logits, observed, index):
        target, weight = self.bce_form(observed)
        mat = soft_bce(logits, target, self.eps, weight)
        count = self.count_penalty()
        if count is None:
            return mat, None
        lam, k = count
        return mat, lam * expected_positive_penalty(torch.sigmoid(logits), k)


@register("bce", "binary cross-entropy on observed entries: -log p on O+, -log(1-p) on O-, "
          "0 on U (BCE with regime full, IUN with 1p_alln, IU with 1p_1n)", paper=COLE,
          aliases=("iu",))
class BCELoss(_BCEForm):
    """Ignore unobserved entries: ``l = -log p`` on O+, ``-log(1-p)`` on O-, 0 on U.

    >>> import torch
    >>> loss = BCELoss()
    >>> round(loss(torch.zeros(1, 2), torch.tensor([[1, -1]])).item(), 4)  # log 2
    0.6931
    """

    def bce_form(self, observed):
        return observed == POSITIVE, observed != UNOBSERVED


@register("an", "assume negative: every unobserved label is a negative", paper=COLE)
class AssumeNegativeLoss(_BCEForm):
    """AN: ``-log p`` on O+, ``-log(1-p)`` on U and O-."""

    def bce_form(self, observed):
        return observed == POSITIVE, None


@register("an_ls", "assume negative with label smoothing (official: targets 1-e and e)",
          paper=COLE)
class AssumeNegativeLSLoss(_BCEForm):
    """AN-LS: BCE against smoothed AN targets.

    Args:
        smoothing: epsilon. ``convention="official"`` uses targets ``1 - e`` / ``e`` (the
            official code, e = 0.1 gives 0.9 / 0.1); ``"paper"`` uses ``1 - e/2`` / ``e/2``.
    """

    parameter_constraints = {"smoothing": Interval(float, 0, 1, closed="left"),
                             "convention": Options(("official", "paper"))}

    def __init__(self, smoothing: float = 0.1, convention: str = "official", **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.smoothing = float(smoothing)
        self.convention = convention

    def bce_form(self, observed):
        e = self.smoothing if self.convention == "official" else self.smoothing / 2
        return torch.where(observed == POSITIVE, 1.0 - e, e), None


@register("an_ls_asym", "assume negative with asymmetric label smoothing: targets 1-ep/2 on "
          "O+, en/2 elsewhere ((0, 0.1) is Zhou's N-LS)", paper=COLE + ", App. A")
class AsymmetricLSLoss(_BCEForm):
    """AN with separate smoothing of positives (``eps_pos``) and negatives (``eps_neg``)."""

    parameter_constraints = {"eps_pos": Interval(float, 0, 1), "eps_neg": Interval(float, 0, 1)}

    def __init__(self, eps_pos: float = 0.0, eps_neg: float = 0.1, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.eps_pos, self.eps_neg = float(eps_pos), float(eps_neg)

    def bce_form(self, observed):
        return torch.where(observed == POSITIVE, 1.0 - self.eps_pos / 2, self.eps_neg / 2), None


@register("wan", "weak assume negative: unobserved negatives down-weighted by gamma "
          "(default 1/(L-1))", paper=COLE)
class WeakAssumeNegativeLoss(_BCEForm):
    """WAN: ``-log p`` on O+, ``gamma * -log(1-p)`` on U and O-; ``gamma=None`` -> 1/(L-1)."""

    parameter_constraints = {"gamma": [Interval(float, 0), None]}

    def __init__(self, gamma: float | None = None, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.gamma = gamma

    def bce_form(self, observed):
        num_classes = observed.shape[-1]
        gamma = self.gamma if self.gamma is not None else 1.0 / max(num_classes - 1, 1)
        pos = observed == POSITIVE
        return pos, torch.where(pos, 1.0, gamma)


class _NeedsK(SPMLLoss):
    """A loss with an expected-positive count ``k``, taken from the data when not given."""

    parameter_constraints = {"k": K_RULE, "lam": Interval(float, 0)}

    def __init__(self, k: float | None = None, lam: float = 1.0, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.k = k
        self._k_given = k is not None  # else each run's k is its TrainInfo's
        self.lam = float(lam)

    def on_train_start(self, observed, info: TrainInfo) -> None:
        if not self._k_given:
            if info.k is not None and info.k <= 0:
                raise ValueError(f"{type(self).__name__} needs k > 0 expected positives per "
                                 f"example; the train split's mean is {info.k}: pass k=...")
            self.k = info.k

    def _k(self) -> float:
        if self.k is None:
            raise ValueError(f"{type(self).__name__} needs k, the expected number of positives "
                             f"per example: pass k=..., or train through the engine, which "
                             f"takes it from the dataset")
        return float(self.k)


@register("epr", "expected positive regularisation: observed entries only, plus "
          "lam*((mean positives predicted - k)/L)^2", paper=COLE)
class EPRLoss(_NeedsK, _BCEForm):
    """EPR: ``-log p`` on O+, ``-log(1-p)`` on O-, 0 on U; penalty on the predicted count."""

    def bce_form(self, observed):
        return observed == POSITIVE, observed != UNOBSERVED

    def count_penalty(self):
        return self.lam, self._k()

    def required_hooks(self) -> tuple[str, ...]:
        """``on_train_start`` (for ``k``) unless ``k=`` was given: then none."""
        return () if self._k_given else ("on_train_start",)


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


@register("role", "regularised online label estimation: a trainable N_train x L label "
          "estimator and the classifier teach each other, with EPR on both", paper=COLE)
class ROLELoss(_NeedsK):
    """ROLE (Cole et al. Eq. 7-8).

    The label estimator is the parameter ``label_logits`` (N_train x L), ``q = sigmoid(theta)``.
    Init: observed positives ``logit(0.995)``, observed negatives ``logit(0.005)``, unobserved
    uniform in ``[logit(0.4), logit(0.6)]`` (seeded by ``TrainInfo.seed``). The loss is
    ``(l'(p | sg q) + l'(q | sg p)) / 2`` with ``l'(a | b) = -log a`` on O+ (and ``-log(1-a)`` on
    O-, for regimes that observe negatives) ``+ BCE(a, b)`` on every entry, plus ``lam`` times
    the EPR penalty on ``a``. The engine trains ``label_logits`` at ``lr_multiplier`` (10) times
    the classifier's learning rate. Memory: 4 bytes per entry plus Adam's two moments (COCO:
    65,665 x 80 -> 63 MB in all).

    Args:
        k: expected positives per example (None: the train split's, from `TrainInfo`).
        lam: the weight of the EPR penalty on each side.
        estimator_update: how Adam steps the estimator (the full-batch solver solves every
            row of it each round, and refuses ``"rows"``, which would do nothing there):

            - ``"dense"`` (default; the official code, which the papers' tables and the
              presets use): every step's Adam update moves the whole estimator, the rows
              outside the batch too (by their moments), so a step costs O(N L) and an epoch
              O(N^2 L / B): 52 s an epoch at 10,000 rows x 1,000 classes on a 2-core CPU,
              where AN takes 1 s; `on_train_start` warns from `DENSE_WARN` entries.
            - ``"rows"``: a step reads, differentiates and updates only the batch's rows
              (the gradient is sparse, ``F.embedding(..., sparse=True)``), with lazy Adam as
              ``torch.optim.SparseAdam``: a row's moments move only when the row is in the
              batch, bias correction from the global step, ``eps`` added to ``sqrt(v)``. A
              step costs O(B L), an epoch O(N L) as AN's (results/role-epoch.csv: both
              epochs beside AN's, and their test mAP on yeast). A row moves once an epoch,
              where "dense" carries it on by its moments at every step: not the official
              algorithm, and not its numbers (docs/provenance.yaml). The
              engine's `spmlkit.engine.LeanAdam` (linear, fine-tune, linear_init, BoostLU)
              steps it; such runs train one by one, not stacked (the stacked engine's
              update is dense); ``--mode lac`` (AdamW with a OneCycle schedule) refuses it.
              In a loop of your own, give ``loss.param_groups(lr)`` to
              ``torch.optim.SparseAdam`` (`row_parameters`).
    """

    #: N x L entries from which `on_train_start` warns of the dense estimator's cost
    DENSE_WARN = 1 << 23
    #: the values of ``estimator_update``
    ESTIMATOR_UPDATES = ("dense", "rows")
    parameter_constraints = {"estimator_update": Options(ESTIMATOR_UPDATES)}

    needs_index = True
    lr_multiplier = 10.0
    resizable_state = ("label_logits",)

    def __init__(self, k: float | None = None, lam: float = 1.0,
                 estimator_update: str = "dense", **kw):
        super().__init__(k=k, lam=lam, **kw)
        check_hparams(type(self), {"estimator_update": estimator_update})
        self.estimator_update = estimator_update
        self.label_logits = torch.nn.Parameter(torch.empty(0, 0))
        if estimator_update == "rows":  # an option that does nothing under the solver
            self.solver_refusal = (
                "estimator_update='rows' chooses which rows of the estimator each Adam step "
                "moves, and the solver solves every row in each round, so it would do nothing "
                "there: leave it at 'dense' (the default), or train with Adam (spml train "
                "--solver adam, SPMLClassifier(solver='adam'))")

    @property
    def stackable(self) -> bool:
        """Runs of ``"dense"`` stack (`stacked_step`); ``"rows"`` trains one run at a time."""
        return self.estimator_update == "dense"

    def row_parameters(self) -> list[torch.nn.Parameter]:
        """``[label_logits]`` with ``estimator_update="rows"``, else ``[]``
        ([`SPMLLoss.row_parameters`][spmlkit.losses.contract.SPMLLoss.row_parameters])."""
        return [self.label_logits] if self.estimator_update == "rows" else []

    def on_train_start(self, observed, info: TrainInfo) -> None:
        super().on_train_start(observed, info)
        if self.carries_state() and self.label_logits.shape == tuple(observed.shape):
            return  # restored (resume) or carried on (linear_init): keep the estimates
        if observed.numel() >= self.DENSE_WARN and self.estimator_update == "dense":
            import warnings

            warnings.warn(f"ROLE: its label estimator holds {observed.shape[0]:,} x "
                          f"{observed.shape[1]:,} entries, and every step's Adam update moves "
                          f"all of them (as the official code): an epoch costs about "
                          f"{observed.shape[0]:,} / batch size times that; "
                          f"estimator_update='rows' steps the batch's rows only (lazy Adam), "
                          f"at about the cost of an AN step", stacklevel=2)
        gen = torch.Generator().manual_seed(int(info.seed))
        hi = _logit(0.6)
        theta = hi * (2 * torch.rand(observed.shape, generator=gen) - 1)
        theta[observed == POSITIVE] = _logit(0.995)
        theta[observed == NEGATIVE] = _logit(0.005)
        self.label_logits = torch.nn.Parameter(theta.to(self.label_logits.device))

    def estimated_labels(self) -> torch.Tensor:
        """The estimator's current label probabilities (N_train x L), detached."""
        return torch.sigmoid(self.label_logits.detach())

    def _one_side(self, a_logits, a_probs, b_probs, pos, weight, k):
        # -log a on O+ (-log(1-a) on O-) plus BCE(a, b) everywhere is c1*(-log a) +
        # c2*(-log(1-a)) with c1 = pos + b, c2 = neg + 1 - b: one weighted BCE with weight
        # c1 + c2 = 1 + [observed] and target c1 / (c1 + c2) (fewer operations per step)
        mat = soft_bce(a_logits, (pos + b_probs) / weight, self.eps, weight)
        return mat, self.lam * expected_positive_penalty(a_probs, k)

    manual_gradient = True

    def stacked_step(self, logits, observed, index):
        """Both sides' soft BCE and EPR terms by hand
        ([`StackableLoss.stacked_step`][spmlkit.losses.stacking.StackableLoss.stacked_step]): the
        classifier's logits get ``(w p - pos - q) / (2 B L)`` plus half EPR's term of ``p``, the
        estimator's rows ``(w q - pos - p) / (2 B L)`` plus half EPR's term of ``q`` (``w``:
        ``1 + [observed]``, ``pos``: the observed positives), written into
        ``label_logits.grad`` (zeros elsewhere)."""
        runs, batch, classes = logits.shape
        rows = torch.arange(runs, device=logits.device).unsqueeze(1)
        est = self.label_logits.detach()[rows, index]
        pos = (observed == POSITIVE).to(logits.dtype)
        weight = 1.0 + (observed != UNOBSERVED).to(logits.dtype)
        p, q = torch.sigmoid(logits), torch.sigmoid(est)
        scale = 0.5 / (batch * classes)
        # w BCE(s, (pos + q) / w) = w softplus(s) - (pos + q) s; its gradient w p - pos - q
        value_f = (weight * F.softplus(logits) - (pos + q) * logits).sum(dim=(1, 2))
        value_g = (weight * F.softplus(est) - (pos + p) * est).sum(dim=(1, 2))
        pen_f, dpen_f = expected_positive_penalty_grad(p, self._k(), self.lam)
        pen_g, dpen_g = expected_positive_penalty_grad(q, self._k(), self.lam)
        values = scale * (value_f + value_g) + 0.5 * (pen_f + pen_g)
        grad = (weight * p - pos - q).mul_(scale).add_(dpen_f, alpha=0.5)
        grad_est = (weight * q - pos - p).mul_(scale).add_(dpen_g, alpha=0.5)
        full = self.label_logits.grad
        last = getattr(self, "_grad_entries", None)
        if full is None or full.shape != self.label_logits.shape:
            full = torch.zeros_like(self.label_logits)
        elif last is not None and last[0] is full:  # zero only the last step's rows (B of N)
            full[last[1], last[2]] = 0.0
        else:
            full.zero_()
        full[rows, index] = grad_est
        self.label_logits.grad = full
        self._grad_entries = (full, rows, index)  # (not state: the next step's to clear)
        return values, grad

    def solver_objectives(self, logits, observed, index):
        """For the full-batch solver (`spmlkit.engine.solve`): ``(classifier's, estimator's)``,
        the two halves of the ``"mean"`` loss, each with the other side held fixed (the
        stop-gradients of the loss made explicit): the first is a function of ``logits`` alone
        for the estimates as they are, the second of ``label_logits`` alone for the logits as
        they are. Their sum is the loss's value; the solver minimises them in turn."""
        est_logits = take_rows(self.label_logits, index)
        pos = (observed == POSITIVE).to(logits.dtype)
        weight = 1.0 + (observed != UNOBSERVED).to(logits.dtype)
        k = self._k()
        p, q = torch.sigmoid(logits), torch.sigmoid(est_logits)
        mat_f, pen_f = self._one_side(logits, p, q.detach(), pos, weight, k)
        mat_g, pen_g = self._one_side(est_logits, q, p.detach(), pos, weight, k)
        return 0.5 * (mat_f.mean() + pen_f), 0.5 * (mat_g.mean() + pen_g)

    def entries(self, logits, observed, index):
        if self.label_logits.numel() == 0:
            raise RuntimeError("ROLE's label estimator is not initialised: the engine calls "
                               "on_train_start(observed, info) before training")
        if self.estimator_update == "rows":  # the batch's rows, with a sparse gradient
            rows = torch.as_tensor(index, device=self.label_logits.device).long()
            est_logits = F.embedding(rows, self.label_logits, sparse=True)
        else:
            est_logits = take_rows(self.label_logits, index)
        pos = (observed == POSITIVE).to(logits.dtype)
        weight = 1.0 + (observed != UNOBSERVED).to(logits.dtype)
        p, q = torch.sigmoid(logits), torch.sigmoid(est_logits)
        k = self._k()
        mat_f, pen_f = self._one_side(logits, p, q.detach(), pos, weight, k)
        mat_g, pen_g = self._one_side(est_logits, q, p.detach(), pos, weight, k)
        return 0.5 * (mat_f + mat_g), 0.5 * (pen_f + pen_g)


@register("pr", "pairwise ranking: sum over (observed positive i, unobserved or known "
          "negative j) of max(0, 1 - p_i + p_j)", paper=COLE + ", App. A")
class PairwiseRankingLoss(SPMLLoss):
    """PR: for each observed positive i and each other label j of a row, unobserved or a
    known negative, ``max(0, 1 - p_i + p_j)``.

    Cole et al. pair each positive with the unobserved labels (App. A), which in their
    single-positive protocol are all the others. A regime that observes negatives (``1p_1n``,
    a partial-label table) pairs the positive with those too: a known negative is surely
    ranked below it (spmlkit 0.1.0 left it out, so it taught PR nothing). On one-positive
    labels the loss is the paper's, unchanged. The pairs' sum is placed on the positive's entry,
    so the reduction is the usual one over B * L. Works on probabilities (no logs, so ``eps``
    has no effect).
    """

    stackable = True

    manual_gradient = True
    solver_refusal = ("its hinge max(0, 1 - p_i + p_j) has a kink at every pair's margin: a "
                      "quasi-Newton solve needs a smooth objective (train it with --solver "
                      "adam)")

    @staticmethod
    def _pairs(p, observed):
        """The pairs of ``p`` (... x B x L): ``(rows, cols, hinge)`` for the positive entries
        (``rows`` index the flattened leading dimensions, ``cols`` the label) and each one's
        K x L hinges ``1 - p_i + p_j`` on the labels it pairs with (0 elsewhere). K is the
        number of observed positives: about B, not B x L (the B x L x L of every (i, j) pair
        took minutes an epoch with 1,000 classes, and memory that grew with L^2)."""
        classes = p.shape[-1]
        flat = p.reshape(-1, classes)
        obs = observed.expand(p.shape).reshape(-1, classes)
        rows, cols = (obs == POSITIVE).nonzero(as_tuple=True)
        other = ((obs == UNOBSERVED) | (obs == NEGATIVE)).to(p.dtype)[rows]  # K x L
        hinge = (1.0 - flat[rows, cols].unsqueeze(-1) + flat[rows]) * other
        return rows, cols, hinge

    def entries(self, logits, observed, index):
        p = torch.sigmoid(logits)
        rows, cols, hinge = self._pairs(p, observed)
        sums = torch.relu(hinge).sum(dim=-1)  # each positive's pairs, on its own entry
        mat = torch.zeros(p.numel() // p.shape[-1], p.shape[-1], dtype=p.dtype, device=p.device)
        return mat.index_put((rows, cols), sums).reshape(p.shape), None

    def stacked_step(self, logits, observed, index):
        """The hinges and their gradient by hand
        ([`StackableLoss.stacked_step`][spmlkit.losses.stacking.StackableLoss.stacked_step]): an
        active pair (i, j) (``1 - p_i + p_j > 0``) adds ``-1`` to ``dL/dp_i`` and ``+1`` to
        ``dL/dp_j``, over ``B L``, times ``p (1 - p)`` for the logits (relu's gradient at 0 is
        0, as autograd's)."""
        runs, batch, classes = logits.shape
        p = torch.sigmoid(logits)
        rows, cols, hinge = self._pairs(p, observed)
        active = (hinge > 0).to(p.dtype)
        values = torch.zeros(runs, dtype=p.dtype, device=p.device).index_add_(
            0, rows // batch, hinge.clamp_(min=0.0).sum(dim=-1)) / (batch * classes)
        grad_p = torch.zeros(runs * batch, classes, dtype=p.dtype, device=p.device)
        grad_p.index_add_(0, rows, active)             # +1 for each j of an active pair
        grad_p.index_put_((rows, cols), -active.sum(dim=-1), accumulate=True)  # -1 for its i
        grad_p = grad_p.reshape(runs, batch, classes)
        return values, grad_p.mul_(p * (1.0 - p)).div_(batch * classes)
