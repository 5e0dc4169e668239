"""R linear runs at once: the linear mode's grid points trained as one stacked model.

The linear protocol trains many tiny models (yeast: ~0.4 s a run, nearly all of it per-step
overhead: Python, autograd and kernel launches for a 103 x 14 head). `fit_linear_stacked`
trains R runs that share the data, the loss (its hyperparameters) and the batch size, with
their own seeds (initialisation, batch order), learning rates and weight decays, as one model:

- weights stacked to R x L x D and R x L; a step's logits are one batched matrix product of the
  R runs' own batches (R x B x D) -> R x B x L;
- each run's batch order is drawn exactly as `spmlkit.engine.fit_linear` draws it: a
  ``torch.Generator`` seeded with the run's seed, one ``randperm`` per epoch; the rows of the
  coming steps (up to `GATHER_BYTES` of features, a whole epoch on yeast) are gathered at
  once, step-major, so a step's batch is a contiguous slice (the linear mode's step time is
  per-operation overhead: two gathers a step were ~10% of it);
- the loss's ``entries`` on R x B x L (``SPMLLoss.stackable``; its parameters and buffers
  stacked to R x ...), each run's value its own ``"mean"`` (over its B * L) plus its penalty;
  the step minimises the sum over runs, whose gradient for a run's weights is that run's own;
- a closed-form loss (`closed_form`: the BCE family, AN, AN-LS, WAN, EPR, BCE, ...)
  skips autograd: the logits' gradient is ``weight * (sigmoid(s) - target)`` (plus EPR's count
  term), with each row's targets and weights (``SPMLLoss.bce_form``) gathered with its
  features; runs of such losses stack even when their losses, hyperparameters, observed labels
  (regimes) and k differ, each run reading its own table of targets; a loss with a hand-written
  stacked gradient (``SPMLLoss.stacked_step``: ROLE, PR) skips autograd too;
- Adam: torch's fused kernel on the slices of runs that share a learning rate (the kernel is
  elementwise, so each run's update is bit for bit the single run's given the same gradient);
- per run after every epoch: the loss's hooks (on the run's own loss module, whose state is
  copied out of and back into the stack), val mAP (or the run's selection metric), the best
  epoch, early stopping, the ``on_epoch`` and ``checkpoint`` callbacks (the state in the
  single-run format, so `spmlkit.methods.resume_run` resumes such a run alone). A run
  that stopped early or diverged is left out of the records (its slice still computes, unread,
  until the others end).

The results equal single runs up to floating-point summation order (batched vs single matrix
products): weights within ~1e-6, the same best epochs (``tests/test_vectorised.py`` checks every
stackable loss of the registry).

The stack is a `StackedRuns` object that runs as `train_loop`'s single run does: `run`
trains every `epoch` (`StackedRuns.epoch`), an epoch every `step` of its `batches`; the runs' own
loss modules and the stacked loss exchange their state around the hooks (`restack` /
`unstack`); `checkpoint` is a run's state. Its parts (the stacked head and Adam, the gathers,
the tables, the val scores) are in `spmlkit.engine.stacked`; the closed-form gradient is the
loss contract's (`spmlkit.losses.SPMLLoss.closed_form_step`).

When to stack (`stack_limit`): the runs' stacked tensors must fit a memory budget, and on
a CPU, where the per-step work of one run is large enough for the matrix products to dominate,
at most `CPU_LARGE_STACK` runs (larger stacks leave the caches and lose: measured in
``benchmarks/bench_vectorised.py``).
"""
from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..data.rows import is_stored
from ..losses import SPMLLoss, TrainInfo, carry_state, observed_validated
from .config import TrainConfig, batch_starts, epoch_rows
from .linear import linear_inputs, make_linear_head
from .loop import STATE_FORMAT, FitResult, diverged
from .selection import Selection
from .stacked import (StackedAdam, StackedLinear, autograd_step, closed_form_tables, gather,
                      mean_train_loss, stacked_val_map, state_tensors, val_scores)

__all__ = [
    "CPU_LARGE_STACK",
    "CPU_STACK_WORK",
    "STACK_MEMORY_BYTES",
    "StackedLinear",
    "StackedRuns",
    "can_stack",
    "fit_linear_stacked",
    "stack_limit",
    "stacked_val_map",
]

#: memory the stacked tensors of one group may take (weights, Adam moments, gradients, batches,
#: evaluation logits, the loss's stacked state), CPU; on CUDA half the free device memory
STACK_MEMORY_BYTES = 2 * 1024 ** 3
#: on a CPU, one run's multiply-adds per step (batch x features x classes) up to which any number
#: of runs is stacked: below it the per-step overhead (~60-90 us) dominates a step (yeast,
#: 8 x 103 x 14 = 11.5k: the whole benchmark ~6.6x faster at R = 12). Above it the matrix
#: products dominate and the stack is capped at `CPU_LARGE_STACK` runs: the engine alone
#: on a COCO-shaped store (8 x 2048 x 80 = 1.3M) was 1.45x / 1.74x faster at R = 12
#: (benchmarks/bench_vectorised.py --coco-forced), while the issue's prototype lost at R = 96
#: (the stacked weights, gradients and moments, R x D x L x 16 bytes, leave the caches)
CPU_STACK_WORK = 200_000
#: the most runs stacked on a CPU above `CPU_STACK_WORK`
CPU_LARGE_STACK = 12
#: the most runs stacked in one group
MAX_STACK = 96
#: runs of one seed (same batches) from which they share their rows (StackedLinear's shared;
#: fewer lose a little: measured on yeast, 12 runs of 3 seeds 0.93x, 72 runs of 3 seeds 1.2x)
SHARE_ROWS = 8
#: bytes of features gathered at once for the coming steps of every run
GATHER_BYTES = 32 * 1024 ** 2
#: the TrainConfig fields in which stacked runs may differ
STACKED_AXES = ("seed", "lr", "weight_decay")


def _fused_adam_available(device: torch.device) -> bool:
    try:
        p = torch.zeros(1, device=device)
        z = torch.zeros(1, device=device)
        torch._fused_adam_([p], [z], [z.clone()], [z.clone()], [],
                           [torch.zeros((), device=device)], lr=0.0, beta1=0.9, beta2=0.999,
                           weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def closed_form(loss: SPMLLoss) -> bool:
    """Whether the engine takes ``loss``'s gradient in closed form: a
    `spmlkit.losses.SPMLLoss.closed_form` loss with exact logs (``eps`` 0), no state and no
    penalty on the head. Runs of such losses stack even when their losses, hyperparameters and
    observed labels differ (AN, WAN, EPR, BCE on full labels, ... in one stack). A
    ``neg_weight`` other than 1 takes the autograd path (`SPMLLoss.weighted_entries`)."""
    return bool(getattr(loss, "closed_form", False)) and loss.eps == 0 \
        and getattr(loss, "neg_weight", 1.0) == 1 \
        and type(loss).penalty is SPMLLoss.penalty \
        and not any(True for _ in loss.parameters()) and not any(True for _ in loss.buffers())


def can_stack(loss: SPMLLoss, config: TrainConfig) -> str | None:
    """None when runs of ``loss`` can be stacked on ``config.device``, else the reason they
    are trained one by one."""
    if not getattr(loss, "stackable", False):
        return f"loss {type(loss).__name__} is not stackable (its entries are not per run)"
    if loss.reduction not in ("mean", "sum"):
        return f"reduction {loss.reduction!r} (a training loss is a scalar)"
    if not _fused_adam_available(torch.device(config.device)):
        return f"no fused Adam kernel on {config.device} (the stacked update would not be " \
               f"the single run's)"
    return None


def stack_limit(n_train: int, n_val: int, features: int, classes: int, batch_size: int,
                loss: SPMLLoss | None = None, device: str = "cpu") -> int:
    """How many runs of this shape to stack at most (1: train them one by one).

    Memory per run (float32): the head's weights, gradient and two Adam moments
    (4 x (D + 1) x L), a batch (B x D) and its logits, the val logits and their sorted copies
    for mAP (~5 x N_val x L, float64 for the mAP), the train logits when the loss needs them
    (N x L), and the loss's own state (its parameters count four times: value, gradient, Adam's
    two moments). The budget is `STACK_MEMORY_BYTES` on a CPU, half the free device
    memory on CUDA. On a CPU, when one run's multiply-adds per step (B x D x L) exceed
    `CPU_STACK_WORK` (compute-bound), at most `CPU_LARGE_STACK` runs; on a GPU the
    memory alone decides.
    """
    dev = torch.device(device)
    most = MAX_STACK
    if dev.type == "cpu" and batch_size * features * classes > CPU_STACK_WORK:
        most = CPU_LARGE_STACK
    per_run = 4 * 4 * (features + 1) * classes + 4 * 2 * batch_size * (features + classes)
    per_run += 8 * 5 * n_val * classes
    state = 0
    if loss is not None:
        if loss.needs_train_predictions:
            per_run += 4 * n_train * classes
        for p in loss.parameters():
            state += 4 * p.numel() * p.element_size()
        for b in loss.buffers():
            state += b.numel() * b.element_size()
        if state == 0 and (loss.resizable_state or loss.needs_index):
            state = 16 * n_train * classes  # not initialised yet: an N x L state or so
    per_run += state
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        budget = free // 2
    else:
        budget = STACK_MEMORY_BYTES
    return int(max(1, min(most, budget // max(per_run, 1))))


def _share_rows(configs) -> tuple[int, list[int]]:
    """``(shared, order)``: runs of one seed draw the same batches; with at least `SHARE_ROWS`
    runs per seed, and as many for every seed, they share their rows (`StackedLinear`'s
    ``shared``: one product per seed; the features gathered once per seed) and are ordered by
    seed, then learning rate and weight decay; else (``shared`` 1) by learning rate and weight
    decay. ``order[r]`` is the caller's index of the stack's run ``r``."""
    per_seed = Counter(c.seed for c in configs)
    shared = per_seed[configs[0].seed] if len(set(per_seed.values())) == 1 else 1
    shared = shared if shared >= SHARE_ROWS else 1
    order = sorted(range(len(configs)), key=lambda r: (configs[r].seed, configs[r].lr,
                                                       configs[r].weight_decay) if shared > 1
                   else (configs[r].lr, configs[r].weight_decay))
    return shared, order


class StackedRuns:
    """R linear runs trained as one stacked model, the way `spmlkit.engine.train_loop` runs
    one: `run` trains every `epoch`; an epoch calls the runs' loss hooks, takes every `step` of
    its `batches`, then per run records the epoch in its own `Selection` (best epoch, early
    stopping, history), calls its ``on_epoch`` and offers its `checkpoint` (the single-run
    format). The runs' own loss modules hold their state for the hooks; the stacked copy holds
    it for the steps: `restack` / `unstack` move it between them.

    Built by `fit_linear_stacked` from checked inputs (`_check_stack`): ``observed`` and
    ``ks`` one per run. Runs are kept in the stack's order (`_share_rows`); callbacks and
    results are the callers' (``order``)."""

    def __init__(self, x_train, observed, losses, configs, *, x_val, y_val, ks, on_epoch,
                 checkpoint, start: float):
        self.start = start
        runs = self.runs = len(configs)
        self.on_epoch = list(on_epoch or [None] * runs)
        self.checkpoints = list(checkpoint or [None] * runs)
        config = self.config = configs[0]
        self.device = torch.device(config.device)
        z_of = self._inputs(x_train, observed, x_val, y_val)
        self.shared, self.order = _share_rows(configs)
        self.configs = [configs[r] for r in self.order]
        self.losses = [losses[r].to(self.device) for r in self.order]
        self.observed = [z_of[id(observed[r])] for r in self.order]
        for loss, c, z_, k_ in zip(self.losses, self.configs, self.observed,
                                   [ks[r] for r in self.order]):
            loss.on_train_start(z_, TrainInfo(self.n, self.num_classes, k_, c.seed, c.epochs))
        self.model = StackedLinear([make_linear_head(self.x.shape[1], self.num_classes,
                                                     c.seed).to(self.device)
                                    for c in self.configs], self.shared)
        # the loss's state stacked along a leading run dimension, in a copy of the first module
        self.stateful = bool(state_tensors(self.losses[0]))
        self.stacked = copy.deepcopy(self.losses[0])
        self.slots = state_tensors(self.stacked)
        self.restack(first=True)
        self._gradient_path()
        self._optimizer()
        self._batching()
        # each run's best epoch, early stopping and history, as train_loop keeps a single run's
        self.books = [Selection(config.early_stop, config.metric, validated=self.has_val)
                      for _ in range(runs)]
        self.errors: list = [None] * runs  # what ended a run (it diverged, its callback raised)
        self.views = [self.model.run_head(r) for r in range(runs)]

    # -- set-up --------------------------------------------------------------------------------
    def _inputs(self, x_train, observed, x_val, y_val) -> dict:
        """The shared inputs on the device (`linear_inputs`); returns each distinct observed
        matrix, checked once, by ``id``."""
        config = self.config
        self.x, self.z, self.xv, self.yv = linear_inputs(x_train, observed[0], x_val, y_val,
                                                         config)
        z_of = {id(observed[0]): self.z}
        for z_ in observed:
            if id(z_) not in z_of:
                z_of[id(z_)] = linear_inputs(x_train, z_, None, None, config)[1]
                if z_of[id(z_)].shape != self.z.shape:
                    raise ValueError(f"stacked runs' observed labels differ in shape: "
                                     f"{tuple(self.z.shape)} and {tuple(z_of[id(z_)].shape)}")
        self.has_val = self.xv is not None
        self.n, self.num_classes = self.z.shape
        return z_of

    def _gradient_path(self) -> None:
        """How a step takes the logits' gradient, and the tables whose rows a step gathers
        (the features first): a closed-form BCE loss (`closed_form`) without autograd, from
        the targets and weights of every train row, gathered with the features; a loss whose
        stacked gradient is written by hand (``stacked_step``: ROLE, PR), from the observed
        labels; else autograd."""
        stacked = self.stacked
        self.closed = all(closed_form(loss) for loss in self.losses)
        self.manual = not self.closed and getattr(stacked, "manual_gradient", False) and \
            stacked.reduction == "mean" and stacked.eps == 0 and \
            type(stacked).penalty is SPMLLoss.penalty
        self.offsets = self.count = None  # per run, the first row of its targets in the tables
        if self.closed:
            tables, self.offsets, self.count = closed_form_tables(
                self.losses, self.observed, torch.float32 if is_stored(self.x) else self.x.dtype)
            self.tables = [self.x, *tables]
        else:
            self.tables = [self.x, self.z]
        self.loss_params = [p for p in stacked.parameters() if p.requires_grad]
        # d(sum of the runs' losses)/d(each run's loss), autograd's seed
        self.seed = torch.ones(self.runs, device=self.device)

    def _optimizer(self) -> None:
        """`StackedAdam` over the head (its gradient computed here from the logits', into
        ``grad_w`` / ``grad_b``) and the loss's own parameters; ``run_groups``: each run's
        groups as its single run's LeanAdam has them (`make_optimizer`: with weight decay,
        the weights' group and the biases'), for its checkpoint."""
        model, cfgs = self.model, self.configs
        lrs = [c.lr for c in cfgs]
        self.grad_w, self.grad_b = torch.zeros_like(model.weight), torch.zeros_like(model.bias)
        wds = [c.weight_decay for c in cfgs]
        groups = [(list(model.parameters()), lrs, [self.grad_w, self.grad_b], wds,
                   [True, False])]
        self.run_groups = [[([model.weight], c.lr), ([model.bias], c.lr)] if c.weight_decay
                           else [(list(model.parameters()), c.lr)] for c in cfgs]
        if self.loss_params:
            mult = self.stacked.lr_multiplier
            groups.append((self.loss_params, [lr * mult for lr in lrs], None))
            for r, c in enumerate(cfgs):
                self.run_groups[r].append((self.loss_params, c.lr * mult))
        self.opt = StackedAdam(groups)

    def _batching(self) -> None:
        """Each row group's batch-order generator (seeded as the single run's), the steps'
        starts, and ``chunk``: the rows gathered at once for the coming steps (every run's, a
        multiple of the batch size), one indexing of the features and labels per chunk instead
        of two per step, within `GATHER_BYTES` of features (yeast: a whole epoch; stored
        features: read from the store in file order, as float32)."""
        config = self.config
        self.row_groups = self.runs // self.shared  # one batch order each
        self.gens = [torch.Generator().manual_seed(self.configs[g * self.shared].seed)
                     for g in range(self.row_groups)]
        self.bs = bs = config.batch_size
        self.starts = batch_starts(self.n, bs, config.drop_last)  # (drop_last: no short batch)
        self.rows_per_epoch = epoch_rows(self.n, bs, config.drop_last)
        width = self.x.shape[1] * (4 if is_stored(self.x) else self.x.element_size())
        self.chunk = max(1, GATHER_BYTES // max(1, self.row_groups * width) // bs) * bs

    # -- the loss's state: the runs' modules <-> the stack ------------------------------------
    def restack(self, first: bool = False) -> None:
        """The runs' loss modules -> the stacked loss (after their hooks)."""
        with torch.no_grad():
            for i, (owner, name, is_param) in enumerate(self.slots):
                values = [getattr(state_tensors(l_)[i][0], name) for l_ in self.losses]
                current = getattr(owner, name)
                if not first and current.shape == (self.runs, *values[0].shape):
                    for r, v in enumerate(values):
                        current[r].copy_(v)
                elif is_param:
                    owner._parameters[name] = nn.Parameter(
                        torch.stack([v.detach() for v in values]),
                        requires_grad=values[0].requires_grad)
                else:
                    owner._buffers[name] = torch.stack(values)

    def unstack(self) -> None:
        """The stacked loss -> the runs' loss modules (before their hooks, a snapshot)."""
        with torch.no_grad():
            for i, (owner, name, _) in enumerate(self.slots):
                current = getattr(owner, name)
                for r, l_ in enumerate(self.losses):
                    getattr(state_tensors(l_)[i][0], name).copy_(current[r])

    # -- the run ---------------------------------------------------------------------------
    def live(self) -> list[int]:
        """The runs still training (not done, not failed)."""
        return [r for r in range(self.runs) if not self.books[r].stage_done
                and self.errors[r] is None]

    def run(self) -> list:
        """Train every epoch; per run in the callers' order, its outcome (`outcomes`)."""
        with observed_validated(self.stacked):
            for epoch in range(self.config.epochs):
                live = self.live()
                if not live:
                    break
                self.epoch(epoch, live)
        seconds = (time.perf_counter() - self.start) / self.runs  # each run's share
        return self.outcomes(seconds)

    def epoch(self, epoch: int, live: list[int]) -> None:
        """One epoch of the ``live`` runs: the loss hooks, every step, each run's mean train
        loss, then per run the end of its epoch (`_end_epoch`)."""
        for r in live:
            self.losses[r].on_epoch_start(epoch)
        self.stacked.on_epoch_start(epoch)
        if self.stateful:
            self.restack()
        perms = torch.stack([torch.randperm(self.n, generator=g) for g in self.gens]).to(
            self.device)
        step_values = [self.step(xb, labels, idx) for xb, labels, idx in self.batches(perms)]
        # each run's mean train loss: its steps' losses weighted by their batch sizes, in
        # float64 and in step order (what a running float64 total would hold)
        train_loss = mean_train_loss(step_values, self.n, self.bs, self.rows_per_epoch)
        if self.stateful:
            self.unstack()
        self._epoch_end_hooks(epoch, live, train_loss)
        if self.stateful:
            self.restack()
        live = [r for r in live if self.errors[r] is None]
        scores = val_scores(self.model, self.views, self.xv, self.yv, live, self.config) \
            if self.has_val else {}
        for r in live:
            self._end_epoch(r, epoch, train_loss[r], scores)

    def batches(self, perms: torch.Tensor):
        """Every step of the epoch whose row orders are ``perms`` (one per row group): ``(rows'
        features S x B x D, [their labels, or targets (and weights)] R x B x L, index R x B)``.
        The features are gathered once per row group, the labels per run (its own table:
        ``offsets``); the full steps' rows a chunk at a time (`_coming`)."""
        bs, offsets = self.bs, self.offsets
        coming: list = []
        for i in self.starts:
            if i + bs > self.n:  # the last, shorter batch
                idx = perms[:, i:i + bs]  # each row group's rows
                if self.shared > 1:
                    idx = idx.repeat_interleave(self.shared, 0)
                parts = [gather(t, perms[:, i:i + bs] if j == 0 else
                                idx if offsets is None else idx + offsets)
                         for j, t in enumerate(self.tables)]
            else:
                if i % self.chunk == 0:
                    coming = self._coming(perms, i)
                step = (i % self.chunk) // bs
                parts = [c[step] for c in coming]
                idx = parts.pop()  # each run's rows (R x B)
            yield parts[0], parts[1:], idx

    def _coming(self, perms: torch.Tensor, i: int) -> list:
        """The rows of the full steps from row ``i`` on (up to ``chunk``) of every table, at
        once, step-major (a step's batch is a contiguous slice), and last each run's rows of
        every step (steps x R x B: a step's index)."""
        steps = min(self.chunk, self.n - i) // self.bs
        rows = perms[:, i:i + steps * self.bs].reshape(self.row_groups, steps, self.bs) \
            .transpose(0, 1)
        run_rows = rows.repeat_interleave(self.shared, 1) if self.shared > 1 else rows
        return [gather(t, rows if j == 0 else run_rows if self.offsets is None
                       else run_rows + self.offsets) for j, t in enumerate(self.tables)] + \
            [run_rows]

    def step(self, xb: torch.Tensor, labels: list, idx: torch.Tensor) -> torch.Tensor:
        """One training step of every run; returns the runs' losses (R,)."""
        model = self.model
        values, g = self._gradient(xb, labels, idx)
        model.head_grads(g, xb, self.grad_w, self.grad_b)
        if model.weight.grad is not None:  # a penalty on the head's weights
            self.grad_w.add_(model.weight.grad)
            model.weight.grad = None
        if model.bias.grad is not None:
            self.grad_b.add_(model.bias.grad)
            model.bias.grad = None
        self.opt.step()
        return values.detach()

    def _gradient(self, xb, labels, idx) -> tuple:
        """The runs' losses and the gradient of their sum for the logits (`_gradient_path`)."""
        if self.closed:
            with torch.no_grad():
                target = labels[0].to(xb.dtype)  # (a uint8 table: exact)
                weight = labels[1].to(xb.dtype) if len(labels) > 1 else None
                return self.stacked.closed_form_step(self.model(xb), target, weight, self.count)
        if self.manual:
            with torch.no_grad():
                return self.stacked.stacked_step(self.model(xb), labels[0], idx)
        values, g = autograd_step(self.model, self.stacked, xb, labels[0], idx,
                                  self.loss_params, self.seed)
        if self.seed.dtype != values.dtype:
            self.seed = torch.ones_like(values)
        return values, g

    def _epoch_end_hooks(self, epoch: int, live: list[int], train_loss: list) -> None:
        """Each live run's divergence check and ``on_epoch_end`` on its own loss module (with
        its train logits when the loss needs them); a run that fails is left out, the others
        go on."""
        train_all = self.model.predict(self.x) if self.stacked.needs_train_predictions else None
        for r in live:
            if not np.isfinite(train_loss[r]):
                self.errors[r] = FloatingPointError(diverged(
                    epoch + 1, train_loss[r], weight_decay=self.configs[r].weight_decay))
                continue
            try:
                self.losses[r].on_epoch_end(epoch, None if train_all is None else train_all[r])
            except Exception as err:  # noqa: BLE001 (this run fails; the others go on)
                self.errors[r] = err

    def _end_epoch(self, r: int, epoch: int, train_loss: float, scores: dict) -> None:
        """Run ``r``'s epoch record into its `Selection`, then its ``on_epoch`` and
        ``checkpoint`` callbacks (the checkpoint also when ``on_epoch`` raised)."""
        book = self.books[r]
        record = {"epoch": epoch + 1, "train_loss": train_loss}
        if self.has_val:
            record[book.key] = scores[r]
        book.end_epoch(record, epoch=epoch + 1, stage_epochs=self.configs[r].epochs,
                       value=scores.get(r), keep=lambda: self.keep(r),
                       source="model" if self.has_val else None)
        caller = self.order[r]
        try:
            if self.on_epoch[caller] is not None:
                self.on_epoch[caller](record, self.views[r], self.losses[r])
        except Exception as err:  # noqa: BLE001 (the run's own callback)
            self.errors[r] = err
        finally:
            if self.checkpoints[caller] is not None:
                self.checkpoints[caller](lambda: self.checkpoint(r))

    # -- state -------------------------------------------------------------------------------
    def keep(self, r: int) -> tuple:
        """Copies of run ``r``'s weights and loss state (a new best epoch)."""
        state = self.losses[r].state_dict()  # a new dict: deep-copied only when it holds any
        return ({"weight": self.model.weight.detach()[r].clone(),
                 "bias": self.model.bias.detach()[r].clone()},
                copy.deepcopy(state) if state else state)

    def checkpoint(self, r: int) -> dict:
        """Run ``r``'s training state in the single-run format (`train_loop`'s):
        ``fit_linear(..., resume=state)`` continues it alone."""
        model = self.model
        return self.books[r].state_dict(
            format=STATE_FORMAT, stages=[[None, int(self.configs[r].epochs)]], stage=0,
            model={"weight": model.weight.detach()[r], "bias": model.bias.detach()[r]},
            loss=self.losses[r].state_dict(),
            optimizer=self.opt.run_state(r, self.run_groups[r]), parts={},
            run={"batch_order": {"state": self.gens[r // self.shared].get_state()}},
            seconds=time.perf_counter() - self.start)

    def outcomes(self, seconds: float) -> list:
        """Per run, in the callers' order, its best epoch's ``(nn.Linear, FitResult)`` with its
        loss module set to that epoch's state, or the exception that ended it (a ValueError
        when no epoch had a finite score)."""
        out: list = [None] * self.runs
        for r, book in enumerate(self.books):
            if self.errors[r] is None:
                try:
                    weights, loss_state = book.best_weights()
                except ValueError as err:  # no epoch had a finite score
                    self.errors[r] = err
            if self.errors[r] is not None:
                out[self.order[r]] = self.errors[r]
                continue
            head = nn.Linear(self.x.shape[1], self.num_classes).to(self.device)
            head.load_state_dict(weights)
            self.losses[r].load_state_dict(loss_state)
            carry_state(self.losses[r], False)  # the run is over (as `train_loop` ends one)
            out[self.order[r]] = (head, FitResult(**book.result_fields(), seconds=seconds))
        return out


def _check_stack(observed, losses, configs, k) -> tuple[list, list]:
    """The stack's inputs checked (`fit_linear_stacked`'s ValueErrors): one observed
    matrix and k per run (``observed`` / ``k`` given once: for every run)."""
    runs = len(configs)
    if runs == 0 or len(losses) != runs:
        raise ValueError(f"fit_linear_stacked needs one loss per config, got {len(losses)} "
                         f"losses and {runs} configs")
    shared = [{k_: v for k_, v in vars(c).items() if k_ not in STACKED_AXES} for c in configs]
    if any(s != shared[0] for s in shared):
        raise ValueError("stacked runs may differ in seed, lr and weight_decay only; got configs "
                         f"{shared[0]} and {next(s for s in shared if s != shared[0])}")
    observed = list(observed) if isinstance(observed, (list, tuple)) else [observed] * runs
    ks = list(k) if isinstance(k, (list, tuple)) else [k] * runs
    if len(observed) != runs or len(ks) != runs:
        raise ValueError(f"fit_linear_stacked needs one observed matrix and k per run, or one "
                         f"for all; got {len(observed)} and {len(ks)} for {runs} runs")
    mixed = len({(type(loss), loss.extra_repr()) for loss in losses}) > 1 or \
        len({id(z_) for z_ in observed}) > 1
    if mixed and not all(closed_form(loss) for loss in losses):
        raise ValueError("stacked runs need losses of one class and hyperparameters and one "
                         "observed label matrix, unless every loss is closed-form (closed_form)")
    if len({None if k_ is None else float(k_) for k_ in ks}) > 1 and \
            hasattr(losses[0], "_k") and not all(closed_form(loss) for loss in losses):
        # the stack's one copy of such a loss (ROLE) holds one k
        raise ValueError(f"stacked runs of {type(losses[0]).__name__} need one k, got "
                         f"{sorted({k_ for k_ in ks if k_ is not None})}")
    if len({loss.reduction for loss in losses}) > 1:
        raise ValueError("stacked runs need losses of one reduction")
    for loss in losses:
        why = can_stack(loss, configs[0])
        if why is not None:
            raise ValueError(f"these runs cannot be stacked: {why}")
    return observed, ks


def fit_linear_stacked(x_train, observed, losses: Sequence[SPMLLoss],
                       configs: Sequence[TrainConfig], *, x_val=None, y_val=None,
                       k: float | None = None,
                       on_epoch: Sequence[Callable | None] | None = None,
                       checkpoint: Sequence[Callable | None] | None = None) -> list:
    """Train R linear heads at once; each run ends as `spmlkit.engine.fit_linear` would
    end it alone (up to floating-point summation order).

    Args:
        x_train, x_val, y_val: as `spmlkit.engine.fit_linear`, shared.
        observed, k: as `spmlkit.engine.fit_linear`, shared, or a list with one per run
            (closed-form losses only).
        losses: one fresh loss module per run, stackable (`can_stack`): all of one class
            and hyperparameters, or all closed-form (`closed_form`: then of any classes
            and hyperparameters, with observed labels and ``k`` of their own).
        configs: one `TrainConfig` per run; they may differ in ``seed``, ``lr`` and
            ``weight_decay`` only (`STACKED_AXES`).
        on_epoch, checkpoint: per run (None entries allowed), called as ``fit_linear`` calls
            them; a run's checkpoint state is the single-run format (``fit_linear(...,
            resume=state)`` continues it alone).

    Returns:
        per run, ``(model, FitResult)`` (the model an ``nn.Linear`` with the best epoch's
        weights, the loss module holding the best epoch's state), or the exception that ended
        that run (``FloatingPointError`` when it diverged, ``ValueError`` when no epoch had a
        finite val mAP, or what its ``on_epoch`` raised); the other runs go on.

    Raises:
        ValueError: configs that differ in more than seed, lr and weight_decay, losses of
            different classes, hyperparameters or labels that are not all closed-form, losses
            not stackable, bad inputs (as ``fit_linear``).
    """
    start = time.perf_counter()
    observed, ks = _check_stack(observed, losses, configs, k)
    return StackedRuns(x_train, observed, losses, configs, x_val=x_val, y_val=y_val, ks=ks,
                       on_epoch=on_epoch, checkpoint=checkpoint, start=start).run()
