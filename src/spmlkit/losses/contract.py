"""The loss contract shared by every method: what a loss of your own implements.

Contract (docs/spec.md#notation; docs/extending/loss.md#contract)::

    loss = create_loss(name, **hparams)           # an nn.Module
    value = loss(logits, observed, index=None)    # logits B x L, observed B x L in {1, 0, -1}

A loss computes a per-entry matrix ``l`` (B x L) and, optionally, a scalar penalty.
``reduction="mean"`` returns ``l.sum() / (B * L) + penalty`` (the official convention: entries a
loss ignores still count in the denominator); ``"sum"`` returns ``B * L`` times that;
``"none"`` returns the B x L matrix ``l + penalty`` whose mean is the ``"mean"`` value.

Observed negatives: ``neg_weight`` (default 1, no change) multiplies the O- entries of a loss
whose per-entry matrix holds a known-negative term of its own there (``negative_entries``;
`spmlkit.losses.logspace.weigh_negatives`, `SPMLLoss.weighted_entries`); other losses refuse
it. A loss defined on the whole batch (no per-entry matrix) offers ``reductions = ("mean",)``
and refuses the others.

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

Stacked runs and closed forms (``stackable``, ``closed_form``: what the vectorised engine
asks of a loss) are `spmlkit.losses.stacking`'s; the checks a loss makes of a training loop of
your own are `spmlkit.losses.own_loop`'s; the log-space helpers are `spmlkit.losses.logspace`'s
(all importable from here, as a loss of your own imports them).
"""
from __future__ import annotations

import torch
from torch import nn

from ..constraints import Interval, Options, check_fields, declared
from .inputs import TrainInfo, check_observed
from .logspace import (as_compute, expected_positive_penalty, log_1mp, log_p, masks, soft_bce,
                       weigh_negatives)
from .own_loop import HOOKS, HookRecorder, carry_state, hooks_driven, observed_validated
from .registry import LOSSES
from .stacking import StackableLoss
from .state import resize_state_on_load, take_rows

#: what a loss of your own imports from here: the base classes, what its hooks are given, and
#: the helpers it is built from (each defined in the module named above)
__all__ = ["EpochScheduled", "HOOKS", "REDUCTIONS", "SPMLLoss", "TrainInfo", "as_compute",
           "carry_state", "check_hparams", "check_observed", "expected_positive_penalty",
           "hooks_driven", "log_1mp", "log_p", "masks", "observed_validated",
           "resize_state_on_load", "soft_bce", "take_rows", "weigh_negatives"]

REDUCTIONS = ("mean", "sum", "none")
#: True while torch.compile traces (torch >= 2.3; older torch: never, the checks then break the
#: graph instead)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def check_hparams(cls, given: dict, name: str | None = None) -> None:
    """Check the hyperparameters in ``given`` (a loss's ``__init__`` arguments, or what
    `spmlkit.losses.create_loss` is given) against the rules the loss class ``cls`` declares
    for them (``parameter_constraints``, merged along its class chain: `spmlkit.constraints`);
    a refusal names the loss (``name``, default: the first registered name of ``cls``) and the
    hyperparameter (``loss 'epr': lam must be a finite number >= 0, got -1``). Names without a
    rule are left to the caller."""
    table = declared(cls)
    rules = {key: rule for key, rule in table.items() if key in given}
    if rules:
        name = name or next((e.name for e in LOSSES.entries() if e.factory is cls),
                            cls.__name__)
        check_fields(f"loss {name!r}:", given, rules)


class SPMLLoss(StackableLoss, HookRecorder):
    """Base class: shape checks, float32, the reduction, and no-op engine hooks.

    What a loss implements is `entries` (and, if it needs them, the hooks); ``forward`` checks
    the inputs and reduces. Its bases add what two callers ask of it: `StackableLoss`
    (`spmlkit.losses.stacking`: the vectorised engine's stacked runs and closed forms) and
    `HookRecorder` (`spmlkit.losses.own_loop`: in a training loop of your own, a loss whose
    values depend on a hook (`required_hooks`) raises ``RuntimeError`` naming the hook it missed
    and the call to add). Losses without required hooks (AN, EM, ...) need nothing but
    ``loss(logits, observed)``.
    """

    needs_index = False
    needs_train_predictions = False
    lr_multiplier = 1.0
    #: the probability its paper cuts predictions at for F1 (EM: 0.75, Zhou et al.'s
    #: analyses); a run then records the test F1s and Hamming loss there too, beside those at
    #: the threshold chosen on val (None: the paper names none)
    paper_threshold: float | None = None
    #: parameters/buffers sized by the train split, resized to a loaded state dict's shapes
    #: (see `resize_state_on_load`)
    resizable_state: tuple[str, ...] = ()
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
    #: what each hyperparameter accepts (`spmlkit.constraints`): the base's here, a loss's own
    #: in its class (merged along the class chain); each ``__init__`` checks those it takes
    #: (`check_hparams`), and so does `spmlkit.losses.create_loss` before it builds the loss
    parameter_constraints = {"reduction": Options(REDUCTIONS), "eps": Interval(float, 0),
                             "neg_weight": Interval(float, 0)}

    def __init__(self, reduction: str = "mean", eps: float = 0.0, neg_weight: float = 1.0):
        super().__init__()
        check_hparams(type(self), locals())
        name = type(self).__name__
        if reduction not in type(self).reductions:  # (a loss over the whole batch)
            raise ValueError(f"reduction must be one of {type(self).reductions}, got "
                             f"{reduction!r} ({name} is computed over the whole batch: it has "
                             f"no per-entry matrix to return or sum)")
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
        own = {h for h in HOOKS if self.defines_hook(h)}
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

    def row_parameters(self) -> list[nn.Parameter]:
        """The loss's own parameters of which a step reads and moves only the batch's rows
        (ROLE with ``estimator_update="rows"``): their gradient is sparse (a
        ``torch.sparse_coo`` tensor over their first dimension, as
        ``F.embedding(..., sparse=True)`` gives), and an optimiser steps them lazily, as
        ``torch.optim.SparseAdam`` (the engine's `spmlkit.engine.LeanAdam` does; in a loop of
        your own, give them to ``SparseAdam``: ``torch.optim.Adam`` refuses sparse
        gradients). Those of the spmlkit losses inside this one (a regulariser's base) count;
        ``[]`` by default.

        >>> from spmlkit.losses import create_loss
        >>> create_loss("role").row_parameters(), create_loss("an").row_parameters()
        ([], [])
        """
        return [p for m in self.children() if isinstance(m, SPMLLoss)
                for p in m.row_parameters()]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        resize_state_on_load(self, state_dict, prefix, self.resizable_state)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)  # (a restore: carried)

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
                self._check_index(index)
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
