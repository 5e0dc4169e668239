"""Robust losses for missing labels: GR loss (Chen et al., IJCAI 2024) and Hill / SPLC (Zhang et
al., "Simple and Robust Loss Design for Multi-Label Learning with Missing Labels", 2021).

Registered names: ``gr``, ``hill``, ``splc``. ``p = sigmoid(s)``; O+ / U / O- are the observed
positive, unobserved and observed negative entries (our encoding 1 / 0 / -1). Every per-entry
matrix is reduced by [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss] (``"mean"``: sum / (B * L)).

Label encodings of the official code, and how they map to ours:

- GRLoss (built on Cole et al.'s code) reads the same ``labels_obs`` matrix as we do: 1 = O+,
  0 = U, -1 = O-. Its loss only has branches for 1 and 0: an O- entry gets loss 0.
- robust-loss-mlml trains on a 0/1 ``targets`` matrix in which a dropped (missing) positive is
  0, i.e. target 1 = O+ and target 0 = U (it has no observed negatives). Our O- entries take the
  target-0 branch too, except where noted (SPLC never corrects an observed negative).

Both repositories were read at a fixed commit (``GR_COMMIT`` / ``HILL_SPLC_COMMIT``); the
tests pin values and gradients computed by their functions on fixed inputs
(``tests/test_losses_robust.py``).
"""
from __future__ import annotations

import torch

from ..labels import NEGATIVE, POSITIVE, UNOBSERVED
from ..constraints import Interval
from .contract import EpochScheduled, SPMLLoss, check_hparams
from .inputs import TrainInfo
from .logspace import as_compute, log_1mp, log_p
from .registry import register
from .zhou import _power

GR_REPO = "yan4xi1/GRLoss"
GR_COMMIT = "5e13f7f9d8e40a804698860fd621bb272c1ad0a3"
HILL_SPLC_REPO = "xinyu1205/robust-loss-mlml"
HILL_SPLC_COMMIT = "e8d4effec5f3a81cc330158fa421daee8b32b066"

#: "Boosting Single Positive Multi-label Classification with Generalized Robust Loss"
GR_PAPER = "Chen et al. 2024 (GR loss, IJCAI)"
#: "Simple and Robust Loss Design for Multi-Label Learning with Missing Labels" (arXiv 2112.07368)
ZHANG_PAPER = "Zhang et al. 2021 (Hill, SPLC)"

#: Official GR training settings (``config.py`` defaults): ResNet-50 fine-tuned end to end, Adam,
#: batch 8, lr 1e-5 with the classifier at 10x (``lr_mult``), 8 epochs, ``linear_init`` 0,
#: selection on val mAP, stop when val mAP falls more than 2 points below the best.
GR_OFFICIAL_TRAINING = {"batch_size": 8, "lr": 1e-5, "lr_mult": 10, "num_epochs": 8,
                        "linear_init": 0}

#: Official Hill / SPLC training (``train.py``, COCO): ResNet-50 at 448 px, Adam lr 1e-4 with a
#: OneCycle schedule over 80 planned epochs (stopped after epoch 30), batch 128, weight decay
#: 1e-4, model EMA 0.9997, RandAugment + Cutout, mixed precision, loss reduction "sum".
HILL_SPLC_OFFICIAL_TRAINING = {"batch_size": 128, "lr": 1e-4, "num_epochs": 31,
                               "weight_decay": 1e-4, "ema": 0.9997, "reduction": "sum"}


# --- GR loss -----------------------------------------------------------------------------------
def gr_schedule(epoch: int, num_epochs: int, w: tuple, b: tuple, mu: tuple, sigma: tuple,
                linear_init: int = 0) -> tuple[float, float, float, float]:
    """GR's ``(w, b, mu, sigma)`` in 0-based ``epoch`` of a run of ``num_epochs`` epochs.

    Each pair is ``(value at the start, value at T)``. The official ``train.py`` loops over
    1-based ``t = epoch + 1`` and, with ``n = linear_init`` and ``T = num_epochs``, sets::

        w, b       = start + (end - start) * max(t - n - 1, 0) / (T - n)
        mu, sigma  = start + (end - start) * max(t - n, 0) / (T - n)

    so ``w``/``b`` hold their start values in the first epoch after the linear phase and never
    reach their end values (``(T - n - 1) / (T - n)`` of the way in the last epoch), while
    ``mu``/``sigma`` move one step in that first epoch and reach their end values in epoch
    ``T``. We reproduce this as it is.

    >>> gr_schedule(0, 8, (0, 2), (-2, -2), (0.5, 0.8), (2, 0.5))
    (0.0, -2.0, 0.5375, 1.8125)
    >>> gr_schedule(7, 8, (0, 2), (-2, -2), (0.5, 0.8), (2, 0.5))
    (1.75, -2.0, 0.8, 0.5)

    Raises:
        ValueError: ``num_epochs <= linear_init`` (the official code divides by ``T - n``).
    """
    n, total = int(linear_init), int(num_epochs)
    if total <= n:
        raise ValueError(f"gr: the schedule needs num_epochs > linear_init, got num_epochs="
                         f"{total}, linear_init={n}")
    t = int(epoch) + 1
    late, early = max(t - n - 1, 0) / (total - n), max(t - n, 0) / (total - n)

    def at(pair, frac):
        return float(pair[0] + (pair[1] - pair[0]) * frac)

    return at(w, late), at(b, late), at(mu, early), at(sigma, early)


def gr_weights(logits: torch.Tensor, w: float, b: float, mu: float, sigma: float):
    """GR's soft pseudo-label ``K = sigmoid(w p + b)`` and weight
    ``V = exp(-(p - mu)^2 / (2 sigma^2))`` of the *detached* ``p = sigmoid(s)`` (no gradient
    flows through them, as in the official code, which computes them from ``preds.detach()``)."""
    p = torch.sigmoid(as_compute(logits).detach())
    k = torch.sigmoid(w * p + b)
    v = torch.exp(-0.5 * ((p - mu) / sigma) ** 2)
    return k, v


def gr_unobserved(logits: torch.Tensor, k, v, q2: float, q3: float) -> torch.Tensor:
    """GR's per-entry loss of the unobserved entries:
    ``V * (K * (1 - p^q2) / q2 + (1 - K) * (1 - (1 - p)^q3) / q3)``.

    ``p^q`` is ``exp(q log p)`` with ``log p = logsigmoid(s)`` and ``1 - p^q`` is
    ``-expm1(q log p)``: exact where the official ``torch.pow`` of a probability is not (for
    ``s < -104`` float32 ``p`` is 0 and the official gradient is ``inf * 0 = NaN``; for ``q2 =
    0.01`` and ``p`` near 1, ``1 - p^q2`` cancels).
    """
    logits = as_compute(logits)
    toward_pos = -torch.expm1(q2 * log_p(logits)) / q2
    toward_neg = -torch.expm1(q3 * log_1mp(logits)) / q3
    return v * (k * toward_pos + (1.0 - k) * toward_neg)


@register("gr", "generalized robust loss: -log p on O+; on U, V*(K*(1-p^q2)/q2 + "
          "(1-K)*(1-(1-p)^q3)/q3) with K = sigmoid(w p + b), V = Gaussian(p; mu, sigma) of the "
          "detached p and (w, b, mu, sigma) moved linearly over the run's epochs",
          paper=GR_PAPER, tags=("robust",))
class GRLoss(EpochScheduled):
    """GR loss (Chen et al., IJCAI 2024), from the official code (``yan4xi1/GRLoss`` at commit
    ``5e13f7f9d8e40a804698860fd621bb272c1ad0a3``: ``losses.GR_loss``, ``models.KFunction``,
    ``models.VFunction`` and the schedule in ``train.run_train``).

    Per entry, with ``p = sigmoid(s)`` and ``p'`` the same value detached from the graph:

    - O+: ``-log p``;
    - U: ``V * (K * L1 + (1 - K) * L2)`` with ``L1 = (1 - p^q2) / q2`` (a generalised
      cross-entropy towards target 1), ``L2 = (1 - (1 - p)^q3) / q3`` (towards target 0), the
      soft pseudo-label ``K = sigmoid(w p' + b)`` and the weight
      ``V = exp(-(p' - mu)^2 / (2 sigma^2))`` (`gr_weights`, `gr_unobserved`);
    - O-: ``-log(1 - p)``.

    Schedule: ``(w, b)`` go from ``(w0, b0)`` towards ``(wT, bT)`` and ``(mu, sigma)`` from
    ``(mu0, sigma0)`` to ``(muT, sigmaT)`` over the run, as the official ``train.py`` does
    (`gr_schedule`, off-by-one between the two pairs included). The epoch comes from
    `on_epoch_start` (0-based: the official epoch ``t`` is ``epoch + 1``), ``T`` from
    ``TrainInfo.num_epochs`` at `on_train_start` (or the ``num_epochs`` hyperparameter,
    when > 0). Both are buffers (``current_epoch``, ``total_epochs``), so a checkpoint resumes
    the schedule where it was.

    Stackable (the vectorised linear engine): the terms are elementwise, and stacked runs
    share their epochs, so one schedule serves them all; it is computed from the epoch and
    ``T`` as Python numbers the hooks set (on the stacked module too), not from the stacked
    buffers, whose slice of a run that stopped early lags behind.

    Defaults: the official ``config.py`` values, ``beta = [w0, wT, b0, bT] = [0, 2, -2, -2]``,
    ``alpha = [mu0, sigma0, muT, sigmaT] = [0.5, 2, 0.8, 0.5]``, ``q2q3 = [0.01, 1]``, the
    example of the official README. The repository publishes no other set (no per-dataset
    configuration files or scripts); its ``argparse`` declares these options ``type=list``, so
    the README's ``--beta [...]`` command line splits the string into characters and cannot
    set them: the published runs must have edited ``config.py``. The per-dataset values of the
    paper are therefore not registered as dataset defaults here. Official training settings:
    `GR_OFFICIAL_TRAINING`.

    Deviations from the official code, and official bugs fixed:

    - O- entries get ``-log(1 - p)``; the official code gives them loss 0 (it only has branches
      for 1 and 0; single-positive data has no O-, so parity there is unaffected).
    - Log space: ``-log p`` is ``-logsigmoid(s)`` (``eps=1e-7`` gives the official
      ``-log(p + 1e-7)``, its ``LOG_EPSILON``); ``p^q`` and ``(1 - p)^q`` are computed from
      ``logsigmoid(+-s)``. **Official bug:** on an unobserved entry with ``s < -104`` (float32
      ``p = 0``) the official ``torch.pow(p, q2)`` has gradient ``inf`` and the entry's gradient
      is NaN (checked: logits ``(3, -110, 20)``, labels ``(1, 0, 0)`` give a NaN gradient);
      ours is finite.
    - The optional learned label estimator (``is_train=True``: a per-class logistic regression
      for ``K``, trained with its own SGD) is not implemented; the official default, the fixed
      ``KFunction``, is.
    - ``linear_init`` only shifts the schedule (the official code also freezes the backbone for
      those epochs: in spmlkit that is ``--mode linear_init``, whose two phases each run the
      schedule over their own epochs).

    Args:
        w0, wT, b0, bT: ``K``'s slope and offset at the start and towards the end.
        mu0, sigma0, muT, sigmaT: ``V``'s centre and width at the start and at the end
            (``sigma`` must stay > 0).
        q2, q3: the exponents of ``L1`` and ``L2`` (> 0; ``q -> 0`` gives ``-log``).
        linear_init: epochs at the start during which the schedule holds its start values
            (the official option of that name).
        num_epochs: ``T``; 0 (default) takes the run's ``TrainInfo.num_epochs``.
        reduction, eps: see [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss].

    >>> loss = GRLoss()
    >>> loss.on_train_start(torch.tensor([[1, 0]]), TrainInfo(1, 2, num_epochs=8))
    >>> loss.on_epoch_start(2)
    >>> loss.schedule()
    (0.5, -2.0, 0.6125, 1.4375)
    """

    stackable = True
    negative_entries = True

    parameter_constraints = {
        **{name: Interval(float) for name in ("w0", "wT", "b0", "bT", "mu0", "muT")},
        **{name: Interval(float, 0, None, closed="right")
           for name in ("sigma0", "sigmaT", "q2", "q3")},
        "linear_init": Interval(int, 0), "num_epochs": Interval(int, 0)}

    def __init__(self, w0: float = 0.0, wT: float = 2.0, b0: float = -2.0, bT: float = -2.0,
                 mu0: float = 0.5, sigma0: float = 2.0, muT: float = 0.8, sigmaT: float = 0.5,
                 q2: float = 0.01, q3: float = 1.0, linear_init: int = 0, num_epochs: int = 0,
                 **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.w0, self.wT, self.b0, self.bT = float(w0), float(wT), float(b0), float(bT)
        self.mu0, self.sigma0, self.muT, self.sigmaT = (float(mu0), float(sigma0), float(muT),
                                                        float(sigmaT))
        self.q2, self.q3 = float(q2), float(q3)
        self.linear_init, self.num_epochs = int(linear_init), int(num_epochs)
        if self.num_epochs and self.num_epochs <= self.linear_init:
            raise ValueError(f"gr: num_epochs ({self.num_epochs}) must exceed linear_init "
                             f"({self.linear_init})")
        self.register_buffer("total_epochs", torch.tensor(self.num_epochs, dtype=torch.long))
        #: the buffer as a Python int, and the current (w, b, mu, sigma) as Python floats,
        #: recomputed when they change (so a step reads no device tensor: no host sync on CUDA)
        self._total = self.num_epochs
        self._schedule = None

    def on_train_start(self, observed, info: TrainInfo) -> None:
        total = self.num_epochs or int(info.num_epochs)
        if total <= self.linear_init:
            raise ValueError(f"gr: the run has {total} epoch(s) but linear_init is "
                             f"{self.linear_init}: the schedule needs more epochs than that")
        self.total_epochs.fill_(total)
        self._total = total
        self._schedule = None

    def on_epoch_start(self, epoch: int) -> None:
        super().on_epoch_start(epoch)
        self._schedule = None

    def required_hooks(self) -> tuple[str, ...]:
        """``on_epoch_start``, and ``on_train_start`` (the run's epochs) unless
        ``num_epochs=`` was given."""
        return ("on_epoch_start",) if self.num_epochs else ("on_train_start", "on_epoch_start")

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._total = int(self.total_epochs)
        self._schedule = None

    def schedule(self) -> tuple[float, float, float, float]:
        """``(w, b, mu, sigma)`` of the current epoch (`gr_schedule`).

        Raises:
            RuntimeError: the number of epochs is unknown (neither ``on_train_start`` nor
                ``num_epochs=``).
        """
        if self._schedule is None:
            total = self._total
            if total == 0:
                raise RuntimeError("gr: the schedule needs the run's number of epochs: call "
                                   "on_train_start(observed, TrainInfo(...)) first, or pass "
                                   "num_epochs=")
            self._schedule = gr_schedule(self._epoch, total, (self.w0, self.wT),
                                         (self.b0, self.bT), (self.mu0, self.muT),
                                         (self.sigma0, self.sigmaT), self.linear_init)
        return self._schedule

    def entries(self, logits, observed, index):
        w, b, mu, sigma = self.schedule()
        k, v = gr_weights(logits, w, b, mu, sigma)
        pos = observed == POSITIVE
        neg = observed == NEGATIVE
        unobs = observed == UNOBSERVED
        zero = torch.zeros_like(logits)
        mat = torch.where(unobs, gr_unobserved(logits, k, v, self.q2, self.q3), zero)
        mat = torch.where(pos, -log_p(logits, self.eps), mat)
        return torch.where(neg, -log_1mp(logits, self.eps), mat), None


# --- Hill and SPLC -----------------------------------------------------------------------------
def focal_margin_positive(logits: torch.Tensor, margin: float, gamma: float,
                          eps: float = 0.0) -> torch.Tensor:
    """Focal-margin loss of a positive: ``-(1 - p_m)^gamma log p_m`` with
    ``p_m = sigmoid(s - margin)``, in log space (``1 - p_m = sigmoid(margin - s)``)."""
    shifted = as_compute(logits) - margin
    return -_power(torch.sigmoid(-shifted), gamma) * log_p(shifted, eps)


def hill_negative(logits: torch.Tensor, lamb: float) -> torch.Tensor:
    """Hill's loss of a negative: ``(lamb - p) * p^2`` with ``p = sigmoid(s)``."""
    p = torch.sigmoid(as_compute(logits))
    return (lamb - p) * p * p


@register("hill", "Hill loss: focal-margin -(1-p_m)^gamma log p_m (p_m = sigmoid(s - margin)) "
          "on O+, the hill-shaped (lamb - p) p^2 on U and O-", paper=ZHANG_PAPER,
          tags=("robust",))
class HillLoss(SPMLLoss):
    """Hill (Zhang et al.), from the official ``Hill`` class (``xinyu1205/robust-loss-mlml`` at
    commit ``e8d4effec5f3a81cc330158fa421daee8b32b066``, ``src/loss_functions/losses.py``).

    - O+ (official target 1): ``-(1 - p_m)^gamma log p_m`` with ``p_m = sigmoid(s - margin)``;
    - U and O- (official target 0): ``(lamb - p) p^2``, ``p = sigmoid(s)``, which down-weights
      confident "negatives" (possibly missing positives).

    The focal weight is not detached (as in the official code). Defaults are the official ones
    (``lamb = 1.5``, "we did not change the value of lambda"; ``margin = 1``, recommended in
    [0.5, 1]; ``gamma = 2``); the official ``train.py`` uses them for every setting.

    Deviations / official bugs fixed:

    - Reduction: the official default is ``"sum"`` (used by ``train.py``); ours is ``"mean"`` over
      ``B * L`` like every spmlkit loss (``reduction="sum"`` gives the official value).
    - **Official bug:** ``targets * torch.log(sigmoid(s - margin))`` is evaluated on every entry;
      when a *negative* entry has ``s - margin < -103`` (float32 ``sigmoid = 0``) it is
      ``0 * -inf = NaN`` and the whole loss is NaN (checked: logits ``(3, -110)``, targets
      ``(1, 0)``). We take ``logsigmoid`` on O+ entries only: finite everywhere.
    - ``eps > 0`` gives ``log(p_m + eps)`` on O+ (the official code has no epsilon: ``eps = 0``
      is its value).

    Official training settings (COCO, any missing-label rate): `HILL_SPLC_OFFICIAL_TRAINING`.

    Args:
        lamb: the hill's ``lambda`` (> 0).
        margin: logit margin of the positives (>= 0).
        gamma: focusing exponent of the positives (>= 0).
        reduction, eps: see [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss].

    Stackable (the vectorised linear engine): elementwise, no state.

    >>> loss = HillLoss(reduction="none")
    >>> loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[1, 0]])).tolist()  # log(2)/4; (1.5-1/2)/4
    [[0.1732867956161499, 0.25]]
    """

    stackable = True
    negative_entries = True

    parameter_constraints = {"lamb": Interval(float, 0, None, closed="right"),
                             "margin": Interval(float, 0), "gamma": Interval(float, 0)}

    def __init__(self, lamb: float = 1.5, margin: float = 1.0, gamma: float = 2.0, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.lamb, self.margin, self.gamma = float(lamb), float(margin), float(gamma)

    def entries(self, logits, observed, index):
        pos = observed == POSITIVE
        return torch.where(pos, focal_margin_positive(logits, self.margin, self.gamma, self.eps),
                           hill_negative(logits, self.lamb)), None


@register("splc", "self-paced loss correction: focal-margin loss on O+, focal loss on U and O-; "
          "from epoch change_epoch (0-based) on, every unobserved entry with p > tau is trained "
          "as a positive (re-decided in every batch)", paper=ZHANG_PAPER, tags=("robust",))
class SPLCLoss(EpochScheduled):
    """SPLC (Zhang et al.) with the focal-margin loss, from the official ``SPLC`` class
    (``xinyu1205/robust-loss-mlml`` at commit ``e8d4effec5f3a81cc330158fa421daee8b32b066``,
    ``src/loss_functions/losses.py``).

    With ``p = sigmoid(s)`` and ``p_m = sigmoid(s - margin)``:

    - O+: ``-(1 - p_m)^gamma log p_m`` (the margin applies to the observed positives only);
    - U: ``-p^gamma log(1 - p)``, except from 0-based epoch ``change_epoch`` on, where an entry
      with ``p > tau`` (strictly; the check does not carry gradient) is *corrected*: it gets
      ``-(1 - p)^gamma log p`` (target 1, without the margin, as in the official code);
    - O-: ``-p^gamma log(1 - p)``, never corrected.

    The correction is decided afresh in every batch from the current prediction (no state but
    the epoch, the buffer ``current_epoch`` set by `on_epoch_start`); ``last_corrected``
    keeps the last batch's corrected entries for analyses. The official loop passes its 0-based
    ``epoch`` (``for epoch in range(Epochs)``), so ``change_epoch = 1`` (default) starts the
    correction in the second epoch, here as there. Defaults are the official ones
    (``tau = 0.6``, ``change_epoch = 1``, ``margin = 1``, ``gamma = 2``); the README sets
    ``tau = 0.65`` for its COCO 75%-labels-left setting only, and keeps the defaults for the
    single-label one.

    Deviations / official bugs fixed:

    - Reduction ``"mean"`` over ``B * L`` (official default and ``train.py``: ``"sum"``).
    - The official correction is ``torch.where(..., torch.tensor(1).cuda(), targets)``: a CUDA
      constant, so the loss fails on a CPU; ours runs on any device.
    - Our O- entries are never corrected (the official code has no observed negatives: every
      target-0 entry is a candidate).
    - Focal weights use ``sigmoid(-x)`` for ``1 - sigmoid(x)`` (exact for large ``x``); values
      agree with the official ones to float rounding.

    Args:
        tau: probability above which an unobserved entry is corrected, in [0, 1].
        change_epoch: first 0-based epoch of the correction.
        margin: logit margin of the observed positives (>= 0).
        gamma: focusing exponent (>= 0).
        reduction, eps: see [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss].

    Stackable (the vectorised linear engine): the correction is decided per entry and the
    epoch is a Python number the hooks set (on the stacked module too: stacked runs share
    it); ``last_corrected`` is then R x B x L.
    """

    stackable = True
    negative_entries = True

    parameter_constraints = {"tau": Interval(float, 0, 1), "change_epoch": Interval(int, 0),
                             "margin": Interval(float, 0), "gamma": Interval(float, 0)}

    def __init__(self, tau: float = 0.6, change_epoch: int = 1, margin: float = 1.0,
                 gamma: float = 2.0, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.tau, self.margin, self.gamma = float(tau), float(margin), float(gamma)
        self.change_epoch = int(change_epoch)
        #: the unobserved entries corrected in the last batch (B x L bool); for analyses
        self.last_corrected: torch.Tensor | None = None

    def entries(self, logits, observed, index):
        pos = observed == POSITIVE
        corrected = torch.zeros_like(pos)
        if self._epoch >= self.change_epoch:
            corrected = (observed == UNOBSERVED) & (torch.sigmoid(logits.detach()) > self.tau)
        self.last_corrected = corrected
        negative = -_power(torch.sigmoid(logits), self.gamma) * log_1mp(logits, self.eps)
        mat = torch.where(pos, focal_margin_positive(logits, self.margin, self.gamma, self.eps),
                          negative)
        mat = torch.where(corrected, focal_margin_positive(logits, 0.0, self.gamma, self.eps), mat)
        return mat, None
