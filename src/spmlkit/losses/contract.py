"""The loss contract shared by every method, and the log-space helpers they are built from.

Contract (docs/spec.md#notation; docs/extending/loss.md#contract)::

    loss = create_loss(name, **hparams)           # an nn.Module
    value = loss(logits, observed, index=None)    # logits B x L, observed B x L in {1, 0, -1}

A loss computes a per-entry matrix ``l`` (B x L) and, optionally, a scalar penalty.
``reduction="mean"`` returns ``l.sum() / (B * L) + penalty`` (the official convention: entries a
loss ignores still count in the denominator); ``"sum"`` returns ``B * L`` times that;
``"none"`` returns the B x L matrix ``l + penalty`` whose mean is the ``"mean"`` value.

Observed negatives: ``neg_weight`` (default 1, no change) multiplies the O- entries of a loss
whose per-entry matrix holds a known-negative term of its own there (``negative_entries``;
`weigh_negatives`, `SPMLLoss.weighted_entries`); other losses refuse it. A loss defined on the
whole batch (no per-entry matrix) offers ``reductions = ("mean",)`` and refuses the others.

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
import functools
import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..labels import NEGATIVE, POSITIVE, UNOBSERVED

REDUCTIONS = ("mean", "sum", "none")
#: True while torch.compile traces (torch >= 2.3; older torch: never, the checks then break the
#: graph instead)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


@dataclass(frozen=True)
class TrainInfo:
    """What a loss learns about the training split before the first step
    (`SPMLLoss.on_train_start`).

    Args:
        num_examples: rows of the train split (N): per-example state is N x L; a loss with
            parameters of its own raises when an epoch's rows pass without an update of them
            (`SPMLLoss.param_groups`).
        num_classes: labels per row (L).
        k: expected positives per example (EPR, ROLE, GPR's penalty); None: the loss's own
            ``k=`` hyperparameter, or none. ``spml train`` passes the train split's mean number
            of (true) positives per row, the papers' k* (``--k`` chooses another).
        seed: the run's seed (ROLE's initial label estimates are drawn from it).
        num_epochs: the run's epochs (schedules that span the run: EM-APL, GR, GPR, CRISP).

    Raises:
        ValueError: ``k`` outside [0, num_classes].

    >>> TrainInfo(num_examples=100, num_classes=5, k=1.0, seed=0, num_epochs=10).k
    1.0
    """

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


#: the hooks the engine calls (module docstring), in the order it calls them
HOOKS = ("on_train_start", "on_epoch_start", "on_epoch_end", "penalty")

#: per hook: why a loss that overrides it depends on it, and how a training loop calls it
_HOW = {
    "on_train_start": ("it builds state from the whole train split (or takes k or the run's "
                       "epochs from it)",
                       "call loss.on_train_start(observed, TrainInfo(num_examples=N, "
                       "num_classes=L, k=..., seed=..., num_epochs=...)) once before training, "
                       "with the whole train split's observed labels (N x L)"),
    "on_epoch_start": ("its behaviour follows the epoch: without the hook every epoch is "
                       "epoch 0",
                       "call loss.on_epoch_start(epoch) before each epoch's first batch "
                       "(epoch counts from 0)"),
    "on_epoch_end": ("it updates its state after each epoch",
                     "call loss.on_epoch_end(epoch, train_logits) after each epoch's last step"),
    "penalty": ("its penalty is on the model's weights, which forward does not see",
                "add loss.penalty(model) to every step's loss: value = loss(logits, observed) "
                "+ loss.penalty(model)"),
}
_GUIDE = "docs/guide/own-loop.md shows a loop that calls every hook"


class _HookLog:
    """What a loss has seen of its hooks and training calls (for `SPMLLoss.forward`'s
    checks; not state: never in ``state_dict()``)."""

    __slots__ = ("info", "started", "epoch", "open", "ended", "unended", "calls", "penalties",
                 "penalties_seen", "params", "since_update", "arrived", "depth", "snapshot",
                 "checked", "carry")

    def __init__(self):
        self.info: TrainInfo | None = None
        self.started = False
        self.carry = False              # the next on_train_start keeps the state (carry_state)
        self.depth = 0                  # hooks running (a hook calling its parent's records once)
        self._new_run()
        self.calls = 0                  # training calls
        self.penalties = 0              # penalty(model) calls
        self.penalties_seen = 0         # ... at the last training call

    def _new_run(self) -> None:
        self.epoch: int | None = None   # the last on_epoch_start's epoch
        self.open = False               # between on_epoch_start and on_epoch_end
        self.ended: int | None = None   # the last on_epoch_end's epoch
        self.unended: int | None = None  # an epoch that began and got no on_epoch_end
        self.params: dict = {}          # id(parameter) -> its gradient's (id, version)
        self.snapshot = None            # [(parameter, a copy of its values)] at the first call
        self.since_update = 0           # training rows since the snapshot
        self.arrived = False            # gradients reached the parameters since then
        self.checked = False            # the parameters' check is done for this run

    def record(self, hook: str, args, kwargs) -> None:
        if hook == "on_train_start":
            info = args[1] if len(args) > 1 else kwargs.get("info")
            self.info = info if isinstance(info, TrainInfo) else self.info
            self.started = True
            self.carry = False
            self._new_run()
        elif hook == "on_epoch_start":
            if self.open:
                self.unended = self.epoch
            self.epoch, self.open = int(args[0] if args else kwargs["epoch"]), True
        elif hook == "on_epoch_end":
            self.ended, self.open = int(args[0] if args else kwargs["epoch"]), False
        else:
            self.penalties += 1


def _hook_log(loss: nn.Module) -> _HookLog:
    log = loss.__dict__.get("_hook_log")
    if log is None:
        log = _HookLog()
        loss.__dict__["_hook_log"] = log
    return log


def carry_state(loss: nn.Module, keep: bool = True) -> None:
    """Whether the next ``on_train_start`` of ``loss`` (and of the spmlkit losses inside it)
    keeps the per-run state it holds, where that state fits the labels it is given.

    ``on_train_start`` starts a run: ROLE's estimates, pseudo-labels, flips, corrections and
    priors are built afresh, so one loss object serves run after run (seeds, learning rates,
    other labels) as a new one would. Two cases continue a run instead, and set this: a state
    restored with ``load_state_dict`` (resuming in a loop of your own: load, then
    ``on_train_start``), and linear_init's fine-tuning phase, which continues the linear
    phase's loss. ``on_train_start`` clears it; ``keep=False`` clears it (the engine, after it
    loads the best epoch's state at the end of a run)."""
    for module in loss.modules():
        if isinstance(module, SPMLLoss):
            _hook_log(module).carry = bool(keep)


def _recorded(hook: str, fn):
    """``fn`` (a loss class's own ``hook``) that also notes the call in the loss's
    `_HookLog` (after it returns)."""

    @functools.wraps(fn)
    def recorded(self, *args, **kwargs):
        log = _hook_log(self)
        log.depth += 1
        try:
            out = fn(self, *args, **kwargs)
        finally:
            log.depth -= 1
        if log.depth == 0:  # once per call (not again in a parent's hook that it calls)
            log.record(hook, args, kwargs)
        return out

    recorded._spml_recorded = True
    return recorded


def check_k(k, where: str) -> None:
    """Refuse a loss's ``k`` (expected positives per example) that is given and is not a
    number > 0 (``True`` from ``--hp k=true``: the train mean is the default already)."""
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, numbers.Real):
        hint = " (the train split's true mean, k*, is the default: leave k out)" \
            if k is True else ""
        raise ValueError(f"{where}: hyperparameter k={k!r} must be a number of expected "
                         f"positives per example{hint}")
    if not k > 0:
        raise ValueError(f"{where}: k (expected positives per example) must be > 0, got {k}")


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


def expected_positive_penalty(probs: torch.Tensor, k: float) -> torch.Tensor:
    """EPR: ``((mean_n sum_i p_ni - k) / L) ** 2`` (Cole et al. Eq. 6, the official scaling): the
    count term of a `SPMLLoss.closed_form` loss (``count_penalty``).

    ``probs`` B x L gives a scalar; R x B x L (stacked runs) one value per run."""
    return ((probs.sum(dim=-1).mean(dim=-1) - k) / probs.shape[-1]) ** 2


def expected_positive_penalty_grad(probs: torch.Tensor, k, lam):
    """EPR's penalty of R x B x L probabilities (R,) times ``lam`` (``k`` and ``lam`` numbers or
    per-run tensors), and its gradient for the logits: ``2 lam (m - k) / (L^2 B) * p (1 - p)``
    (``m``: the run's mean predicted count); for hand-written stacked gradients
    (`SPMLLoss.closed_form_step`, ROLE's ``stacked_step``)."""
    runs, batch, classes = probs.shape
    excess = probs.sum(dim=-1).mean(dim=-1) - k
    coef = excess * (2.0 * lam / (classes * classes * batch))
    return lam * (excess / classes) ** 2, probs * (1.0 - probs) * coef.view(runs, 1, 1)


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


def check_index(index, rows: int | None, where: str) -> None:
    """Raise ``ValueError`` unless ``index`` holds whole numbers, the batch's rows in the train
    split: an integer tensor (or a sequence of ints), and, on the CPU, each in ``[0, rows)``
    (``rows``: `TrainInfo.num_examples`; None: ``>= 0`` only). A boolean mask, fractions
    or negative positions would pick other rows' state silently (``state[index]`` wraps,
    truncates, or reads a mask as rows 0 / 1). On an accelerator the values are not read (a host
    sync); the dtype is checked everywhere.

    >>> check_index(torch.tensor([0, 3]), 4, "role")
    >>> check_index(torch.tensor([-1, 2]), 4, "role")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: role: index must hold the batch's rows in the train split, 0 to 3; found -1 ...
    """
    if not torch.is_tensor(index):
        index = torch.as_tensor(index)
    if index.numel() == 0:  # an empty batch (``torch.tensor([])`` is float32)
        return
    if index.dtype == torch.bool or index.is_floating_point() or index.is_complex():
        raise ValueError(f"{where}: index must hold the batch's rows in the train split as "
                         f"whole numbers (an integer tensor), not {index.dtype}; a mask selects "
                         f"rows with index.nonzero().squeeze(1)")
    if index.device.type != "cpu":
        return
    lo, hi = (int(v) for v in torch.aminmax(index))
    if lo < 0 or (rows is not None and hi >= rows):
        span = f"0 to {rows - 1}" if rows is not None else "0 or more"
        bad = lo if lo < 0 else hi
        raise ValueError(f"{where}: index must hold the batch's rows in the train split, "
                         f"{span}; found {bad} (the rows given to on_train_start are the "
                         f"ones index counts)")


def check_observed(observed: torch.Tensor, where: str) -> None:
    """Raise ``ValueError`` when ``observed`` holds a value outside {1, 0, -1}.

    What every loss call checks, unless its caller validated the whole matrix already
    (`observed_validated`): one ``aminmax`` reduction for integer labels (the engine's
    int8) and a second operation for float labels (which must also be whole numbers). About 4 us
    per call on a CPU: 4-6% of a linear-mode step on yeast (``benchmarks/observed_check.py``).
    On an accelerator reading the result waits for the labels' device work (a host sync), so
    `SPMLLoss.forward` checks labels on an accelerator at its first call only, and not
    at all inside ``torch.compile``; validate the whole matrix once
    (`spmlkit.labels.validate_observed`) and use `observed_validated`.
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


def weigh_negatives(mat: torch.Tensor, observed: torch.Tensor, neg_weight: float) -> torch.Tensor:
    """The per-entry loss ``mat`` with its observed-negative entries (``observed == -1``) times
    ``neg_weight``: an extra weight on the known negatives, the L48 benchmark's
    ``--neg-prior-a`` (Sun, Maji, Van Horn 2025: its ``train.py`` multiplies the known
    negatives' entries of the loss matrix; ``tests/test_l48_official.py`` pins it), for a loss
    whose O- entries hold their own term alone (`SPMLLoss.negative_entries`).
    ``neg_weight = 1`` returns ``mat`` itself (no operation, so existing results stay
    bit-identical).

    >>> weigh_negatives(torch.ones(1, 3), torch.tensor([[1, 0, -1]]), 2.0).tolist()
    [[1.0, 1.0, 2.0]]
    """
    if neg_weight == 1:
        return mat
    scale = torch.where(observed == NEGATIVE, neg_weight, 1.0).to(device=mat.device,
                                                                 dtype=mat.dtype)
    return mat * scale


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
    with _flagged(loss, "_observed_validated"):
        yield loss


@contextlib.contextmanager
def hooks_driven(loss: nn.Module):
    """Within the block, ``loss`` (and every `SPMLLoss` inside it) skips the checks of
    its hooks (`SPMLLoss.required_hooks`) at each training call: for a caller that calls
    every hook itself, as the engine's training loop does (the checks would cost each step a
    few microseconds for nothing).

    >>> from spmlkit.losses import create_loss
    >>> loss = create_loss("ll_r")
    >>> with hooks_driven(loss):  # no on_epoch_start: trusted to come from the caller
    ...     value = loss(torch.zeros(1, 2, requires_grad=True), torch.tensor([[1, 0]]))
    """
    with _flagged(loss, "_hooks_driven"):
        yield loss


@contextlib.contextmanager
def _flagged(loss: nn.Module, flag: str):
    parts = [m for m in loss.modules() if isinstance(m, SPMLLoss)]
    before = [getattr(m, flag) for m in parts]
    for m in parts:
        setattr(m, flag, True)
    try:
        yield loss
    finally:
        for m, value in zip(parts, before):
            setattr(m, flag, value)


class SPMLLoss(nn.Module):
    """Base class: shape checks, float32, the reduction, and no-op engine hooks.

    In your own training loop (docs/guide/own-loop.md) a loss whose values depend on a hook
    (`required_hooks`) checks at its training calls (training mode, gradients on, outside
    ``torch.compile``) that the hook was called, and raises ``RuntimeError`` naming the hook
    and the call to add: at the first call for ``on_train_start`` and ``on_epoch_start``;
    ``penalty`` at the second call (it must be called between two calls); a training call
    after ``on_epoch_end`` without a new ``on_epoch_start``; an ``on_epoch_start`` without the
    previous epoch's ``on_epoch_end`` (at the next call); the loss's own parameters (ROLE's
    label estimates) when gradients reached them for a whole epoch's rows
    (``TrainInfo.num_examples``) and no optimiser step changed them (`param_groups`).
    A hook called once where it is due every epoch is not noticed. Losses without
    required hooks (AN, EM, ...) need nothing but ``loss(logits, observed)``.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for hook in HOOKS:  # a class's own hooks note their calls (the checks above)
            fn = cls.__dict__.get(hook)
            if callable(fn) and not getattr(fn, "_spml_recorded", False):
                setattr(cls, hook, _recorded(hook, fn))

    #: set within `observed_validated`: the caller has checked the labels already
    _observed_validated = False
    #: set within `hooks_driven`: the caller calls every hook (the engine)
    _hooks_driven = False
    needs_index = False
    needs_train_predictions = False
    lr_multiplier = 1.0
    #: the probability its paper cuts predictions at for F1 (EM: 0.75, Zhou et al.'s
    #: analyses); a run then records the test F1s and Hamming loss there too, beside those at
    #: the threshold chosen on val (None: the paper names none)
    paper_threshold: float | None = None
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
    #: the reductions the loss offers (a loss computed over the whole batch, with no per-entry
    #: matrix, offers ``("mean",)`` only and refuses the others)
    reductions: tuple[str, ...] = REDUCTIONS
    #: why the full-batch solver (`spmlkit.engine.solve`) cannot minimise this loss (a
    #: non-smooth term, state changed inside ``forward``), or None: it can
    solver_refusal: str | None = None
    #: ``forward`` computes part of its value from the logits without gradient (weights,
    #: temperatures, targets): the solver then runs it in rounds, each a warm-started solve
    #: (`spmlkit.engine.solve.solver_form`), as it runs the losses with epoch hooks
    solver_rounds = False
    #: ``entries`` holds on each observed-negative entry (O-) that entry's own known-negative
    #: term and nothing else, so ``neg_weight`` multiplies it (`weigh_negatives`); False: the
    #: loss has no such term (it ignores O-, or mixes it into a row's or the batch's loss) and
    #: refuses a ``neg_weight`` other than 1
    negative_entries = False

    def __init__(self, reduction: str = "mean", eps: float = 0.0, neg_weight: float = 1.0):
        super().__init__()
        name = type(self).__name__
        if reduction not in type(self).reductions:
            offered = type(self).reductions
            why = "" if offered == REDUCTIONS else (
                f" ({name} is computed over the whole batch: it has no per-entry matrix to "
                f"return or sum)")
            raise ValueError(f"reduction must be one of {offered}, got {reduction!r}{why}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if isinstance(neg_weight, bool) or not math.isfinite(neg_weight) or neg_weight < 0:
            raise ValueError(f"neg_weight (the weight of the observed negatives' loss terms) "
                             f"must be a number >= 0, got {neg_weight!r}")
        if neg_weight != 1 and not type(self).negative_entries:
            raise ValueError(f"{name} takes no neg_weight (got {neg_weight}): it has no loss "
                             f"term of its own on each observed negative to weigh (the methods "
                             f"catalogue says what it does with observed negatives); leave "
                             f"neg_weight at 1")
        self.reduction = reduction
        self.eps = float(eps)
        self.neg_weight = float(neg_weight)

    # --- to implement -----------------------------------------------------------------------
    def entries(self, logits, observed, index):
        """Return ``(l, penalty)``: the B x L per-entry loss and a scalar (or None)."""
        raise NotImplementedError

    def weighted_entries(self, logits, observed, index):
        """`entries` with the observed negatives' entries times ``neg_weight``
        (`weigh_negatives`): what ``forward`` and the vectorised engine reduce."""
        mat, pen = self.entries(logits, observed, index)
        return weigh_negatives(mat, observed, self.neg_weight), pen

    def bce_form(self, observed):
        """``(target, weight)`` of a `closed_form` loss for the observed labels (any
        shape): the soft BCE target in [0, 1] and the per-entry weight (None: 1)."""
        raise NotImplementedError(f"{type(self).__name__} is not a closed-form BCE loss")

    def count_penalty(self):
        """``(lam, k)`` of a `closed_form` loss's expected-positive term, or None."""
        return None

    def closed_form_step(self, logits, target, weight, count):
        """For the vectorised engine: R stacked runs' loss (R,) and the gradient of their sum
        for ``logits`` (R x B x L) in closed form, without autograd; None when the loss is not
        `closed_form`. The form is the contract's, so one call serves runs of any closed-form
        losses: ``target`` and ``weight`` (R x B x L, weight None: 1) their ``bce_form`` of
        the batch, ``count`` None or per-run ``(lam, k)`` tensors (R,) of their
        ``count_penalty`` (lam 0: none); the reduction is this loss's. The values are the
        runs' ``entries`` reduced as autograd's step reduces them; the gradient is ``weight *
        (sigmoid(s) - target) / (B L)`` plus the count term's ``2 lam (m - k) / (L^2 B) *
        p (1 - p)`` (``m``: the run's mean predicted count), what autograd computes
        (``tests/test_vectorised.py`` checks it for every closed-form loss)."""
        if not self.closed_form:
            return None
        _, batch, classes = logits.shape
        # BCE(s, t) = softplus(s) - t s (what binary_cross_entropy_with_logits computes, in
        # fewer operations: the step time here is per-operation overhead)
        entries = torch.addcmul(F.softplus(logits), target, logits, value=-1.0)
        p = torch.sigmoid(logits)
        g = p - target
        if weight is not None:
            entries.mul_(weight)
            g.mul_(weight)
        values = entries.mean(dim=(1, 2))
        g.mul_(1.0 / (batch * classes))
        if count is not None:
            lam, k = count
            penalty, grad = expected_positive_penalty_grad(p, k, lam)
            values = values + penalty
            g.add_(grad)
        if self.reduction == "sum":
            values = values * (batch * classes)
            g.mul_(batch * classes)
        return values, g

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
        """Once before the first step: the whole train split's observed labels (N x L, the
        rows ``index`` refers to) and a `TrainInfo`. Builds per-example state (ROLE's
        label estimates, stored labels), takes ``k`` or the run's epochs: a new run at each
        call, whatever the loss held, unless its state was restored (``load_state_dict``) or
        carried on (`carry_state`) and fits these labels: then it continues (a resumed
        run)."""

    def on_epoch_start(self, epoch: int) -> None:
        """Before the first batch of ``epoch`` (from 0): schedules (LL-R's rejected share, GR's
        weights, SPLC's correction, CRISP's priors from its warm-up on)."""

    def on_epoch_end(self, epoch: int, train_logits: torch.Tensor | None = None) -> None:
        """After the last step of ``epoch``; ``train_logits``: the eval-mode logits (N x L) of
        every train row in row order when `needs_train_predictions` (EM-APL's
        pseudo-labels, soft OPML's per-class AP, CRISP's priors), else None."""

    def penalty(self, model: nn.Module):
        """A term on ``model``'s own weights added to every step's loss (L1R / L2R on the
        head's weights); 0 (a number) by default."""
        return 0.0

    def required_hooks(self) -> tuple[str, ...]:
        """The hooks (names in `HOOKS`) this loss's values depend on, with its current
        hyperparameters: by default every hook its class overrides, and ``on_epoch_start``
        with ``on_epoch_end`` (epochs are bracketed, so that a missed end shows at the next
        start). A loop that does not call them gets a ``RuntimeError`` naming them (class
        docstring); an empty tuple: the loss is a drop-in, ``loss(logits, observed)`` is all it
        needs.

        >>> from spmlkit.losses import create_loss
        >>> create_loss("em").required_hooks(), create_loss("ll_r").required_hooks()
        ((), ('on_epoch_start',))
        """
        own = {h for h in HOOKS if getattr(type(self), h) is not getattr(SPMLLoss, h)}
        if "on_epoch_end" in own:
            own.add("on_epoch_start")
        return tuple(h for h in HOOKS if h in own)

    def param_groups(self, lr: float) -> list[dict]:
        """The optimiser parameter groups of the loss's own trainable state (ROLE's label
        estimates), at ``lr * lr_multiplier`` as the engine trains them; ``[]`` for a loss
        without any. Add them to your optimiser:
        ``torch.optim.Adam([{"params": model.parameters()}, *loss.param_groups(lr)], lr=lr)``.

        >>> from spmlkit.losses import create_loss
        >>> create_loss("an").param_groups(1e-3)
        []
        """
        own = [p for p in self.parameters() if p.requires_grad]
        return [{"params": own, "lr": lr * self.lr_multiplier}] if own else []

    def _check_hooks(self, rows: int) -> None:
        """The checks of a training call (class docstring); ``rows``: the batch's."""
        log = _hook_log(self)
        needed = self.required_hooks()
        name = type(self).__name__
        missing = [h for h in needed if (h == "on_train_start" and not log.started)
                   or (h == "on_epoch_start" and log.epoch is None)]
        if missing:
            verb = "were" if len(missing) > 1 else "was"
            raise RuntimeError(f"{name} depends on the hook(s) {', '.join(needed)}; "
                               f"{' and '.join(missing)} {verb} not called. "
                               + " ".join(self._how(h) for h in needed) + f" ({_GUIDE})")
        if "on_epoch_start" in needed and not log.open:
            raise RuntimeError(f"{name}: epoch {log.ended} ended (on_epoch_end) and no "
                               f"on_epoch_start followed: call loss.on_epoch_start("
                               f"{log.ended + 1}) before the next epoch's first batch; {_GUIDE}")
        if "on_epoch_end" in needed and log.unended is not None:
            raise RuntimeError(f"{name}: epoch {log.unended} began (on_epoch_start) and the next "
                               f"one began without on_epoch_end({log.unended}, ...). "
                               f"{self._how('on_epoch_end')} ({_GUIDE})")
        n = log.info.num_examples if log.info is not None else 0
        if "penalty" in needed:
            if log.calls and log.penalties == log.penalties_seen:
                raise RuntimeError(f"{name} depends on penalty(model), which was not called "
                                   f"since the previous step ({_HOW['penalty'][0]}): "
                                   f"{_HOW['penalty'][1]}; {_GUIDE}")
            log.penalties_seen = log.penalties
        self._check_own_parameters(log, n)
        log.since_update += rows
        log.calls += 1

    def _how(self, hook: str) -> str:
        """What ``hook`` does for this loss and how a loop calls it (one sentence)."""
        why, how = _HOW[hook]
        if hook == "on_epoch_start" and type(self).on_epoch_start is SPMLLoss.on_epoch_start:
            why = ("it marks where each epoch begins (a no-op here, so that a missed "
                   "on_epoch_end shows)")
        if hook == "on_epoch_end" and self.needs_train_predictions:
            how += (", with train_logits the eval-mode logits of every train row in row order "
                    "(N x L: model.eval(), torch.no_grad())")
        return f"{hook}: {why}; {how}."

    def _check_own_parameters(self, log: _HookLog, n: int) -> None:
        """Once a run: the loss's own trainable parameters (ROLE's label estimates), copied at
        the run's first training call, are compared with their values at the first call an
        epoch's rows (``n``) later; gradients reached them meanwhile and no value changed: they
        are not in the optimiser. (A copy of them held for an epoch, one host read a run;
        gradient accumulation over less than an epoch passes.)"""
        if log.checked or not n:
            return
        own = [p for p in self.parameters() if p.requires_grad]
        if not own:
            log.checked = True
            return
        for p in own:  # a gradient that appeared or grew since the previous call
            grad = p.grad
            mark = None if grad is None else (id(grad), grad._version)
            before = log.params.get(id(p), None)
            log.arrived = log.arrived or (mark is not None and mark != before)
            log.params[id(p)] = mark
        if log.snapshot is None or [id(p) for p in own] != [id(p) for p, _ in log.snapshot]:
            log.snapshot, log.since_update, log.arrived = \
                [(p, p.detach().clone()) for p in own], 0, False
            return
        if log.since_update < n:
            return
        log.checked = True
        stale = log.arrived and all(torch.equal(p.detach(), copy) for p, copy in log.snapshot)
        log.snapshot = None
        if stale:
            names = [k for k, p in self.named_parameters() if p.requires_grad]
            raise RuntimeError(f"{type(self).__name__}'s own parameters {names} received "
                               f"gradients for {log.since_update} rows (an epoch) and no step "
                               f"changed them: they are not in the optimiser. Add their group: "
                               f"torch.optim.Adam([{{'params': model.parameters()}}, "
                               f"*loss.param_groups(lr)], lr=lr) (lr x {self.lr_multiplier}, as "
                               f"the engine trains them); {_GUIDE}")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        resize_state_on_load(self, state_dict, prefix, self.resizable_state)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        _hook_log(self).carry = True  # a restore: on_train_start continues it (carry_state)

    def carries_state(self) -> bool:
        """Whether this ``on_train_start`` continues the run whose state the loss holds
        (`carry_state`): a loss keeps its per-run state only then, and only where it fits the
        labels given; otherwise it builds it afresh."""
        return _hook_log(self).carry

    # --- the contract -----------------------------------------------------------------------
    def forward(self, logits: torch.Tensor, observed: torch.Tensor, index=None) -> torch.Tensor:
        """The loss of a batch (module docstring).

        ``observed`` values outside {1, 0, -1} raise ``ValueError`` (`check_observed`):
        at every call on CPU tensors, at the first call on an accelerator (reading the check's
        result there is a host sync), never within `observed_validated` or inside
        ``torch.compile``; nothing else in ``forward`` reads a tensor's value on the host, so a
        loss without state compiles with ``fullgraph=True``. A training call (training mode,
        gradients on) of a loss with `required_hooks` checks that they were called
        (class docstring).
        """
        for what, value in (("logits", logits), ("observed labels", observed)):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{type(self).__name__}: {what} must be a torch.Tensor, got "
                                f"{type(value).__module__}.{type(value).__name__}: convert "
                                f"with torch.as_tensor(...) (on the logits' device)")
        if logits.ndim != 2 or observed.shape != logits.shape:
            raise ValueError(f"{type(self).__name__}: logits and observed labels must both be "
                             f"B x L; got {tuple(logits.shape)} and {tuple(observed.shape)}")
        if not _is_compiling():  # Python-side checks (a graph break inside)
            if not self._observed_validated and (observed.device.type == "cpu" or
                                                 not self.__dict__.get("_labels_checked")):
                check_observed(observed, type(self).__name__)
                self.__dict__["_labels_checked"] = True
            if not self._hooks_driven and self.training and torch.is_grad_enabled() and \
                    logits.requires_grad and logits.shape[0]:
                self._check_hooks(logits.shape[0])
        if self.needs_index:
            if index is None:
                raise ValueError(f"{type(self).__name__} needs the batch's row indices in the "
                                 f"train split: call loss(logits, observed, index=idx)")
            if len(index) != logits.shape[0]:
                raise ValueError(f"index has {len(index)} entries for a batch of "
                                 f"{logits.shape[0]}")
            if not (self._hooks_driven or _is_compiling()):  # (the engine's rows are its own)
                info = _hook_log(self).info
                check_index(index, None if info is None else info.num_examples,
                            type(self).__name__)
        logits = as_compute(logits)
        if logits.shape[0] == 0:
            zero = logits.sum() * 0.0  # on the graph, never NaN
            return zero if self.reduction != "none" else logits * 0.0
        mat, pen = self.weighted_entries(logits, observed, index)
        if self.reduction == "none":
            return mat if pen is None else mat + pen
        value = mat.mean() if pen is None else mat.mean() + pen
        return value if self.reduction == "mean" else value * mat.numel()

    def extra_repr(self) -> str:
        hp = {k: v for k, v in vars(self).items()
              if not k.startswith("_") and k != "training" and isinstance(v, (int, float, str))}
        return ", ".join(f"{k}={v}" for k, v in hp.items())


for _hook in HOOKS:  # the base's own (no-op) hooks note their calls too
    setattr(SPMLLoss, _hook, _recorded(_hook, SPMLLoss.__dict__[_hook]))
del _hook


class EpochScheduled(SPMLLoss):
    """An `SPMLLoss` whose terms follow the epoch (LL-R's rejected share, GR's weights,
    SPLC's correction): the buffer ``current_epoch``, which `on_epoch_start` sets (a
    checkpoint holds it: a resumed run continues its schedule), and the same number as the
    Python int ``_epoch`` that the steps read (no device read per step: no host sync)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.register_buffer("current_epoch", torch.zeros((), dtype=torch.long))
        self._epoch = 0

    def on_epoch_start(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch counts from 0, got {epoch}")
        self.current_epoch.fill_(int(epoch))
        self._epoch = int(epoch)

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._epoch = int(self.current_epoch)
