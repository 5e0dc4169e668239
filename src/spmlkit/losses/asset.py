"""The L48 benchmark's asset (group) regulariser, as a term any loss can take.

Rows of one group (the frames of one recording, the images of one asset) share a running
average of the model's predicted probabilities, ``A`` (groups x L). Each training step adds
``alpha * mean_{b,l} BCE(s_bl, A[g(b), l])`` (the batch's logits ``s`` against their groups'
averages, mean over B x L), then moves the averages of the batch's groups towards the batch's
probabilities: ``A[g] <- (1 - eps) A[g] + eps * sigmoid(s_b)`` (no gradient). When two rows of
one group are in one batch, the later row's update is the one kept (what the official
``running_avg_pred[asset_idx] = ...`` leaves on a CPU tensor).

``A`` starts uniform in (0.4, 0.6) (like ROLE's estimator; drawn from the run's seed) or at a
given value ``init``; the first train row of each group (in row order) sets its observed
positives to 1 in its group's average. That is the official ``AssetReg`` of
cvl-umass/l48-benchmarking at 58252e9 (``losses/AssetReg.py``); ``tests/test_l48_official.py``
pins the values of its functions. Differences, on purpose: the initial draw is seeded (theirs
reads the global RNG), and the state is sized by the groups present (theirs: a fixed 10000 x
100).

Build it with ``create_loss(name, asset_alpha=..., asset_eps=..., asset_init=...)`` (``spml
train --hp asset_alpha=0.1``); the rows' groups come from the data (``--data group_column=``,
``SPMLClassifier.fit(..., groups=)``) through `bind_groups`.
"""
from __future__ import annotations

import numpy as np
import torch

from ..labels import POSITIVE
from ..constraints import Interval
from .contract import SPMLLoss, TrainInfo, as_compute, check_hparams, soft_bce, take_rows
from .regularizers import Regularized

#: the hyperparameters every loss takes for the asset term, with their defaults (the official
#: ``--asset-reg-alpha`` 0 (off), ``--asset-reg-eps`` 0.001, ``--asset-reg-init-val`` None)
ASSET_HPARAMS = {"asset_alpha": 0.0, "asset_eps": 0.001, "asset_init": None}


def group_codes(groups, where: str = "groups") -> np.ndarray:
    """Group labels (any hashable values, one per row) as codes 0..G-1 in order of first
    appearance (int64).

    >>> group_codes(["b", "a", "b", "c"]).tolist()
    [0, 1, 0, 2]
    """
    arr = np.asarray(groups)
    if arr.ndim != 1:
        raise ValueError(f"{where}: one group per row, got an array of shape {arr.shape}")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ValueError(f"{where}: a group is missing (NaN) at row "
                         f"{int(np.flatnonzero(~np.isfinite(arr))[0])}")
    _, first, inverse = np.unique(arr, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))  # unique's sorted order -> first-appearance order
    return order[inverse.reshape(-1)].astype(np.int64)


class AssetRegularized(Regularized):
    """A base loss (plus any batch regularisers, `Regularized`) plus the asset term (module
    docstring).

    Args:
        base: the loss to wrap.
        regularizers: batch regularisers, as `Regularized` takes them.
        asset_alpha: the term's weight (> 0).
        asset_eps: the running average's rate, in (0, 1].
        asset_init: the averages' initial value in [0, 1], or None: uniform in (0.4, 0.6).

    The rows' groups are given with `bind_groups` (N train rows) before ``on_train_start``;
    ``forward`` needs ``index`` (the batch's rows in the train split). The averages and the
    row -> group codes are buffers: a checkpoint carries them and a resumed run continues them.
    The full-batch solver refuses the term: the averages move after every batch.
    """

    resizable_state = ("asset_mean", "asset_group")
    #: what each hyperparameter of the term accepts (`spmlkit.constraints`; asset_alpha 0
    #: is the term off, `spmlkit.losses.create_loss` then leaves it out)
    parameter_constraints = {"asset_alpha": Interval(float, 0),
                             "asset_eps": Interval(float, 0, 1, closed="right"),
                             "asset_init": [Interval(float, 0, 1), None]}
    solver_refusal = ("the asset regulariser's running averages move after every batch; "
                      "train it with Adam (spml train --solver adam, "
                      "SPMLClassifier(solver='adam'))")

    def __init__(self, base: SPMLLoss, regularizers=(), *, asset_alpha: float,
                 asset_eps: float = 0.001, asset_init: float | None = None):
        super().__init__(base, regularizers)
        check_hparams(type(self), {"asset_alpha": asset_alpha, "asset_eps": asset_eps,
                                   "asset_init": asset_init}, "asset regulariser")
        if not asset_alpha:
            raise ValueError("asset_alpha=0 is the asset term off: leave the wrapper out "
                             "(create_loss does)")
        self.asset_alpha = float(asset_alpha)
        self.asset_eps = float(asset_eps)
        self.asset_init = None if asset_init is None else float(asset_init)
        self.register_buffer("asset_mean", torch.empty(0, 0))
        self.register_buffer("asset_group", torch.empty(0, dtype=torch.int64))
        self._groups: np.ndarray | None = None

    needs_index = True

    @property
    def stackable(self):
        return self.base.stackable

    def bind_groups(self, groups) -> None:
        """The train rows' groups (one per row, any labels), in train-row order."""
        self._groups = group_codes(groups, "asset regulariser groups")

    def required_hooks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(("on_train_start", *self.base.required_hooks())))

    def on_train_start(self, observed, info: TrainInfo) -> None:
        super().on_train_start(observed, info)
        if self._groups is None:
            raise ValueError("the asset regulariser (asset_alpha) needs a group per training "
                             "row: give the data a group column (--data group_column=NAME, "
                             "SPMLClassifier.fit(..., groups=)) or leave asset_alpha out")
        codes = self._groups
        if len(codes) != observed.shape[0]:
            raise ValueError(f"the asset regulariser was given {len(codes)} groups for "
                             f"{observed.shape[0]} training rows")
        num_groups, classes = int(codes.max()) + 1 if len(codes) else 0, observed.shape[1]
        if self.carries_state() and tuple(self.asset_mean.shape) == (num_groups, classes) \
                and torch.equal(self.asset_group.cpu(), torch.from_numpy(codes)):
            return  # a resumed run: its averages go on
        if self.asset_init is None:
            gen = torch.Generator().manual_seed(int(info.seed))
            mean = torch.rand((num_groups, classes), generator=gen) * 0.2 + 0.4
        else:
            mean = torch.full((num_groups, classes), self.asset_init)
        first = np.unique(codes, return_index=True)[1]  # each group's first row
        pos = torch.as_tensor(np.asarray(observed.cpu())[first] == POSITIVE)
        mean[pos] = 1.0
        device = self.asset_mean.device
        self.asset_mean = mean.to(device)
        self.asset_group = torch.from_numpy(codes).to(device)

    def asset_term(self, logits: torch.Tensor, index) -> torch.Tensor:
        """The B x L (R x B x L for stacked runs) BCE entries against the batch's group
        averages, not yet weighted; in a training call (gradients on) the averages then move
        towards the batch's probabilities."""
        if index is None:
            raise ValueError("the asset regulariser needs index= (the batch's rows in the "
                             "train split) to find their groups")
        if self.asset_group.numel() == 0:
            raise RuntimeError("the asset regulariser has no groups yet: call "
                               "loss.on_train_start(observed, TrainInfo(...)) before training "
                               "(after loss.bind_groups(groups))")
        s = as_compute(logits)
        groups = take_rows(self.asset_group, index)                  # B (R x B)
        target = take_rows(self.asset_mean, groups) if groups.ndim == 1 else \
            self.asset_mean[torch.arange(groups.shape[0]).unsqueeze(1), groups]
        term = soft_bce(s, target.to(s.dtype))
        if torch.is_grad_enabled() and logits.requires_grad:
            self._move(groups, torch.sigmoid(s.detach()))
        return term

    def _move(self, groups: torch.Tensor, probs: torch.Tensor) -> None:
        """``A[g] <- (1 - eps) A[g] + eps p`` for the batch's rows, the last row of a group
        in the batch kept (module docstring)."""
        with torch.no_grad():
            mean, eps = self.asset_mean, self.asset_eps
            if groups.ndim == 1:
                groups, probs, mean = groups[None], probs[None], mean[None]
            for r in range(groups.shape[0]):  # runs (one unless stacked)
                g = groups[r]
                order = torch.arange(len(g), device=g.device)
                latest = torch.full((int(g.max()) + 1,), -1, dtype=torch.long, device=g.device)
                latest.scatter_reduce_(0, g, order, reduce="amax")
                last = latest[g] == order
                rows = g[last]
                mean[r, rows] = mean[r, rows] * (1 - eps) + \
                    probs[r][last].to(mean.dtype) * eps

    def entries(self, logits, observed, index):
        mat, pen = super().entries(logits, observed, index)
        return mat + self.asset_alpha * self.asset_term(logits, index).to(mat.dtype), pen

    def forward(self, logits: torch.Tensor, observed: torch.Tensor, index=None) -> torch.Tensor:
        value = super().forward(logits, observed, index=index)
        if logits.shape[0] == 0:
            return value
        term = self.asset_alpha * self.asset_term(logits, index)
        if self.base.reduction == "none":
            return value + term.to(value.dtype)
        extra = term.mean()
        if self.base.reduction == "sum":
            extra = extra * logits.numel()
        return value + extra.to(value.dtype)

    def extra_repr(self) -> str:
        init = "U(0.4, 0.6)" if self.asset_init is None else f"{self.asset_init:g}"
        return f"asset_alpha={self.asset_alpha:g}, asset_eps={self.asset_eps:g}, " \
               f"asset_init={init}" + (f", {super().extra_repr()}" if self.regularizers else "")


def bind_groups(loss, groups) -> None:
    """Give ``loss`` the train rows' groups when it has the asset term; a loss without it
    ignores them (groups also keep splits apart, `spmlkit.data.protocol`). A loss with the
    term and no groups raises at ``on_train_start``."""
    if isinstance(loss, AssetRegularized) and groups is not None:
        loss.bind_groups(groups)


__all__ = ["ASSET_HPARAMS", "AssetRegularized", "bind_groups", "group_codes"]
