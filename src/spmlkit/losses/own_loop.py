"""What a loss checks of a training loop it does not know: the hook recorder.

The engine calls every hook of a loss (`spmlkit.losses.contract.SPMLLoss`) itself. In your own
loop (docs/guide/own-loop.md) a loss whose values depend on a hook (``required_hooks``) checks,
at its training calls (training mode, gradients on, outside ``torch.compile``), that the hook
was called, and raises ``RuntimeError`` naming the hook and the call to add: at the first call
for ``on_train_start`` and ``on_epoch_start``; ``penalty`` at the second call (it must be called
between two calls); a training call after ``on_epoch_end`` without a new ``on_epoch_start``; an
``on_epoch_start`` without the previous epoch's ``on_epoch_end`` (at the next call); the loss's
own parameters (ROLE's label estimates) when gradients reached them for a whole epoch's rows
(``TrainInfo.num_examples``) and no optimiser step changed them (``param_groups``). A hook
called once where it is due every epoch is not noticed. Losses without required hooks (AN, EM,
...) need nothing but ``loss(logits, observed)``.

`HookRecorder`, a base of ``SPMLLoss``, wraps each class's own hooks so that a call is noted in
the loss's `_HookLog` (never in ``state_dict()``). A caller that drives every hook itself, or
validated the labels once, says so with `hooks_driven` / `observed_validated`; `carry_state`
says whether the next ``on_train_start`` continues a run.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn

from .inputs import TrainInfo, check_index

#: the hooks a training loop calls (the engine, or yours), in the order it calls them
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
    """What a loss has seen of its hooks and training calls (for `HookRecorder`'s
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
        if isinstance(module, HookRecorder):
            _hook_log(module).carry = bool(keep)


def _recorded(hook: str, fn, default: bool = False):
    """``fn`` (a loss class's own ``hook``) that also notes the call in the loss's
    `_HookLog` (after it returns); ``default``: ``fn`` is the contract's no-op."""

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
    recorded._spml_default = default
    return recorded


@contextlib.contextmanager
def observed_validated(loss: nn.Module):
    """Within the block, ``loss`` (and every [`SPMLLoss`][spmlkit.losses.contract.SPMLLoss] inside
    it, e.g. the base of a ``Regularized``) skips ``check_observed`` on each call.

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
    """Within the block, ``loss`` (and every ``SPMLLoss`` inside it) skips the checks of
    its hooks (``SPMLLoss.required_hooks``) at each training call: for a caller that calls
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
    parts = [m for m in loss.modules() if isinstance(m, HookRecorder)]
    before = [getattr(m, flag) for m in parts]
    for m in parts:
        setattr(m, flag, True)
    try:
        yield loss
    finally:
        for m, value in zip(parts, before):
            setattr(m, flag, value)


class HookRecorder(nn.Module):
    """The own-loop checks of an `spmlkit.losses.contract.SPMLLoss` (its base; module
    docstring): every class's own hooks note their calls in the loss's `_HookLog`, and a
    training call checks them (`_check_hooks`). What it reads of the loss: ``required_hooks()``,
    ``needs_train_predictions``, ``lr_multiplier``, its parameters and ``row_parameters()``."""

    #: set within `observed_validated`: the caller has checked the labels already
    _observed_validated = False
    #: set within `hooks_driven`: the caller calls every hook (the engine)
    _hooks_driven = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        default = HookRecorder in cls.__bases__  # the contract's own no-op hooks
        for hook in HOOKS:  # a class's own hooks note their calls (the checks above)
            fn = cls.__dict__.get(hook)
            if callable(fn) and not getattr(fn, "_spml_recorded", False):
                setattr(cls, hook, _recorded(hook, fn, default))

    @classmethod
    def defines_hook(cls, hook: str) -> bool:
        """Whether ``hook`` (a name in `HOOKS`) is the loss's own, not the contract's no-op."""
        return not getattr(getattr(cls, hook), "_spml_default", False)

    def _check_hooks(self, rows: int) -> None:
        """The checks of a training call (module docstring); ``rows``: the batch's."""
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
        if hook == "on_epoch_start" and not self.defines_hook("on_epoch_start"):
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
            if self.row_parameters():  # sparse gradients: torch.optim.Adam refuses them
                add = ("give them to a second optimiser, torch.optim.SparseAdam("
                       "loss.param_groups(lr)) (their gradients are sparse, row-wise: "
                       "torch.optim.Adam refuses them)")
            else:
                add = ("add their group: torch.optim.Adam([{'params': model.parameters()}, "
                       "*loss.param_groups(lr)], lr=lr)")
            raise RuntimeError(f"{type(self).__name__}'s own parameters {names} received "
                               f"gradients for {log.since_update} rows (an epoch) and no step "
                               f"changed them: they are not in the optimiser. {add[0].upper()}"
                               f"{add[1:]} (lr x {self.lr_multiplier}, as the engine trains "
                               f"them); {_GUIDE}")

    def _check_index(self, index) -> None:
        """``index`` holds rows of the train split that ``on_train_start`` was given
        (`spmlkit.losses.inputs.check_index`; any rows >= 0 before it was called)."""
        info = _hook_log(self).info
        check_index(index, None if info is None else info.num_examples, type(self).__name__)

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        _hook_log(self).carry = True  # a restore: on_train_start continues it (carry_state)

    def carries_state(self) -> bool:
        """Whether this ``on_train_start`` continues the run whose state the loss holds
        (`carry_state`): a loss keeps its per-run state only then, and only where it fits the
        labels given; otherwise it builds it afresh."""
        return _hook_log(self).carry
