"""The one training loop of every mode and method: stages, step hooks, evaluators, early
stopping, checkpoint and resume.

A run is a list of `Stage` s. A stage has its number of epochs and a ``setup()`` that
builds what the stage trains with (`StageParts`): the optimiser, an optional ``step``
(backward + optimiser step, e.g. with an AMP loss scaler), per-step `StepHook` s (extra
loss terms, a scheduler or EMA step after the optimiser step, fields of the epoch record), and
the extra state to checkpoint (a scheduler, an EMA, a queue). A stage may start from the best
weights so far (LAC's stage 2 starts from stage 1's best). One stage is the linear and
fine-tuning modes; LAC (`spmlkit.methods.lac`) is two.

Every epoch::

    loss.on_epoch_start(epoch); hooks.on_epoch_start(epoch)
    for each batch:   value = loss(logits, observed, index=index) + loss.penalty(model)
                      value += w * term for every (w, term) of every hook's terms(...)
                      step(value); hooks.after_step(...)
    loss.on_epoch_end(epoch, train logits when loss.needs_train_predictions)
    score = the best of the evaluators' val scores (the record says which won): val mAP, or
            the run's selection ``metric`` (lower is better for the losses: their sign is
            flipped for every comparison)
    best epoch kept (weights of the winning evaluator, loss state); early stopping per stage
    on_epoch(record, model, loss); checkpoint(state function)

``epoch`` counts from 0 over the whole run (stage 2's first epoch follows stage 1's last).

Checkpoint and resume: ``checkpoint(state_fn)`` is called after every epoch (after
``on_epoch``, and also when ``on_epoch`` raises, so an interrupted run keeps its last complete
epoch); ``state_fn()`` builds the whole state (model, loss, optimiser, the stage's extra state,
the run's extra state, best weights, history, elapsed time) as a dict of tensors, numbers,
strings, lists and dicts only: it loads with ``torch.load(weights_only=True)``
(`spmlkit.runs.load_torch`). Nothing is built unless the caller calls ``state_fn``, so a
caller can throttle its writes (every N epochs, every N minutes). ``train_loop(...,
resume=state)`` continues from such a state and ends with the same weights, history and best
epoch as the uninterrupted run (bit for bit on the same machine), provided everything that
draws random numbers is seeded per epoch (``epoch_seed``) or kept in the run's state.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import math
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..losses import SPMLLoss, carry_state
from ..models.rng import global_rng
from .selection import Selection, snapshot

__all__ = ["Batch", "FitResult", "GeneratorState", "STATE_FORMAT", "Stage", "StageParts",
           "StepBatch", "StepHook", "batch_progress", "check_val_labels", "snapshot",
           "train_loop"]

_BATCH_PROGRESS: contextvars.ContextVar = contextvars.ContextVar("spmlkit_batch_progress",
                                                                 default=None)


@contextlib.contextmanager
def batch_progress(report: Callable[[int, int], None] | None):
    """Within the block, every training step of `train_loop` calls ``report(rows,
    rows_per_epoch)`` (the rows of the global batch just trained, the epoch's rows): what
    ``spml train`` turns into a per-batch progress bar with an ETA for the image modes."""
    token = _BATCH_PROGRESS.set(report)
    try:
        yield
    finally:
        _BATCH_PROGRESS.reset(token)

#: the ``format`` of a training state (a state of another format is refused at resume)
STATE_FORMAT = "spmlkit-train-state/1"

Batch = tuple  # (inputs, observed B x L, index B): what a batch source yields


def diverged(epoch: int, loss: float, where: str = "", weight_decay: float = 0.0) -> str:
    """The one line of a run whose mean train loss is not finite: what to try, and what else
    does it when a smaller learning rate does not; a weight decay of 1 or more (Adam's coupled
    L2 multiplies the weights by it) is named first, any other one beside the rate."""
    if weight_decay >= 1.0:
        return (f"training diverged at epoch {epoch}{where} (loss {loss}) with a weight decay "
                f"of {weight_decay:g} (--weight-decay; usual values are 1e-5 ... 1e-2): "
                f"give a smaller one")
    rate = "learning rate" if not weight_decay else \
        f"learning rate or weight decay (--weight-decay, now {weight_decay:g})"
    return (f"training diverged at epoch {epoch}{where} (loss {loss}); try a smaller {rate}. "
            f"If it diverges at every rate, look at what the run was given: features "
            f"with huge values (e.g. 1e38: standardise them), a loss's eps or a regulariser's "
            f"weight")


@dataclass
class FitResult:
    """What a training run returns (the model and loss hold the best epoch's state).

    ``best_epoch`` is 1-based over the whole run; ``metric`` the selection metric
    (`spmlkit.metrics.METRICS`, ``"map"`` by default) and ``val_score`` its value at the
    best epoch; ``val_map`` is that value when the metric is mAP (NaN otherwise, and without
    validation); ``best_stage`` the name of its stage (None for an unnamed stage) and
    ``best_source`` the evaluator that scored it (``"model"``, LAC's ``"ema"``; None without
    validation); ``seconds`` the training time, over every session of a resumed run.
    """

    best_epoch: int                  # 1-based
    val_map: float
    history: list = field(default_factory=list)
    seconds: float = 0.0
    stopped_early: bool = False
    linear: "FitResult | None" = None  # linear_init: the linear phase's own result
    best_stage: int | str | None = None
    best_source: str | None = None
    metric: str = "map"
    val_score: float = float("nan")

    def to_dict(self) -> dict:
        """A plain dict (``linear`` nested), e.g. to keep in a training state."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "linear"}
        out["history"] = [dict(h) for h in self.history]
        out["linear"] = None if self.linear is None else self.linear.to_dict()
        return out

    @classmethod
    def from_dict(cls, values: Mapping) -> "FitResult":
        """The inverse of `to_dict`."""
        values = dict(values)
        linear = values.pop("linear", None)
        known = {f.name for f in fields(cls)}
        result = cls(**{k: v for k, v in values.items() if k in known})
        result.history = [dict(h) for h in result.history]
        result.linear = None if linear is None else cls.from_dict(linear)
        return result


@dataclass
class StepBatch:
    """One training step as the hooks see it: the loss's inputs, the base loss value (with the
    loss's penalty) and what ``forward`` returned besides the logits (``extras``)."""

    logits: torch.Tensor
    observed: torch.Tensor
    index: torch.Tensor
    value: torch.Tensor
    extras: Any = None


class StepHook:
    """What a method adds to every training step; every method is a no-op by default.

    - ``on_epoch_start(epoch)``: before the epoch's first batch (reset per-epoch sums);
    - ``terms(batch)``: extra loss terms ``[(weight, tensor), ...]``, added to the step's loss
      in order as ``value = value + weight * tensor`` (LAC's PLC and LAC terms);
    - ``after_step(batch)``: after the optimiser step (a scheduler step, an EMA update);
    - ``epoch_record()``: fields added to the epoch's record after ``train_loss``.

    State that must survive a resume goes in `StageParts.state`, not in the hook.
    """

    def on_epoch_start(self, epoch: int) -> None:
        pass

    def terms(self, batch: StepBatch) -> Sequence[tuple[float, torch.Tensor]]:
        return ()

    def after_step(self, batch: StepBatch) -> None:
        pass

    def epoch_record(self) -> dict:
        return {}


@dataclass
class StageParts:
    """What a stage trains with, built by `Stage.setup` when the stage starts.

    Args:
        optimizer: ``zero_grad(set_to_none=True)``, ``step()``, ``state_dict()``,
            ``load_state_dict()``.
        step: ``step(value)``: backward and optimiser step (default ``zero_grad();
            value.backward(); optimizer.step()``), e.g. through an AMP loss scaler.
        hooks: `StepHook` s, called in order.
        state: more resumable parts of the stage, ``name -> object`` with ``state_dict()`` and
            ``load_state_dict()`` (a scheduler, an EMA, a queue, a loss scaler).
        batches, forward: this stage's own (default: the run's, see `train_loop`).
    """

    optimizer: Any
    step: Callable[[torch.Tensor], None] | None = None
    hooks: Sequence[StepHook] = ()
    state: dict = field(default_factory=dict)
    batches: Callable[[int], Iterable[Batch]] | None = None
    forward: Callable | None = None


@dataclass
class Stage:
    """One stage of a run.

    Args:
        epochs: the stage's epochs (>= 1).
        setup: ``setup() -> StageParts``, called when the stage starts (after the hand-over of
            weights) and when a run is resumed inside it (then the parts' state is loaded).
        name: recorded as ``"stage"`` in every record, with ``"stage_epoch"`` (1-based in the
            stage) and ``"stage_done"``; None (one-stage modes): no such fields.
        info: more fields of every record of the stage (LAC: ``{"delta": 0.6}``).
        from_best: start from the best weights and loss state so far (instead of the last).
    """

    epochs: int
    setup: Callable[[], StageParts]
    name: int | str | None = None
    info: dict = field(default_factory=dict)
    from_best: bool = False

    def __post_init__(self):
        if not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f"a stage needs epochs >= 1, got {self.epochs!r}")


class GeneratorState:
    """A ``torch.Generator`` as a resumable part: ``state_dict()`` holds its state (a uint8
    tensor), ``load_state_dict()`` sets it back."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"])


def check_val_labels(y, convention: str, where: str = "validation labels") -> None:
    """Refuse validation labels under which val mAP is undefined at every epoch: no positive
    in any class with ``convention="present"`` (the official convention scores them 0).

    Raises:
        ValueError: naming the labels' shape and what to do.
    """
    y = np.asarray(y)
    if convention == "present" and y.size and not (y > 0).any():
        raise ValueError(f"the {where} ({y.shape[0]} x {y.shape[1]}) have no positive in any "
                         f"class: val mAP is undefined (map_convention 'present' leaves out "
                         f"classes without positives), so no epoch could be selected; use a "
                         f"validation split with positives, map_convention='official', or no "
                         f"validation set (the last epoch is kept)")


def _cuda_devices(model: nn.Module) -> list[int]:
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})


def _pick(scores: dict) -> str:
    """The evaluator with the best score: the first one unless a later one is strictly better,
    a finite score always better than NaN."""
    best = None
    for name, score in scores.items():
        if best is None or score > scores[best] or (math.isnan(scores[best])
                                                    and not math.isnan(score)):
            best = name
    return best


class _Run:
    """The loop's state and its steps (see `train_loop`)."""

    def __init__(self, model, loss, stages, *, num_examples, batches, forward, evaluators,
                 weights, early_stop, train_logits, after_epoch, on_epoch, checkpoint,
                 state, epoch_seed, start, metric="map"):
        self.model, self.loss, self.stages = model, loss, stages
        self.num_examples = num_examples
        self.batches, self.forward = batches, forward
        self.evaluators, self.weights = evaluators, weights
        # the best epoch, early stopping, the history (and their part of the state)
        self.selection = Selection(early_stop, metric, validated=bool(evaluators))
        self.train_logits, self.after_epoch = train_logits, after_epoch
        self.on_epoch, self.checkpoint = on_epoch, checkpoint
        self.run_state, self.epoch_seed, self.start = state, epoch_seed, start
        self.signature = [[s.name, int(s.epochs)] for s in stages]
        self.rng_devices = _cuda_devices(model) if epoch_seed is not None else []
        self.stage = 0  # progress within the stage: self.selection
        self.seconds_before = 0.0
        self.parts: StageParts | None = None

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        parts = self.parts
        return self.selection.state_dict(
            format=STATE_FORMAT, stages=self.signature, stage=self.stage,
            model=self.model.state_dict(), loss=self.loss.state_dict(),
            optimizer=parts.optimizer.state_dict(),
            parts={name: obj.state_dict() for name, obj in parts.state.items()},
            run={name: obj.state_dict() for name, obj in self.run_state.items()},
            seconds=self.seconds_before + time.perf_counter() - self.start)

    def load_state_dict(self, state) -> None:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        if found != STATE_FORMAT:
            raise ValueError(f"resume: the state's format is {found!r}, not {STATE_FORMAT!r}: "
                             f"it is not a training state of this spmlkit version (pass what "
                             f"the checkpoint callback's state function returned)")
        if state["stages"] != self.signature:
            raise ValueError(f"resume: the state's stages [[name, epochs], ...] "
                             f"{state['stages']} differ from this run's {self.signature}: "
                             f"resume with the settings the run started with")
        missing = sorted(set(self.run_state) - set(state.get("run", {})))
        if missing:
            raise ValueError(f"resume: the state lacks {missing} (the run's own state); was it "
                             f"saved by the same kind of run?")
        try:
            self.model.load_state_dict(state["model"])
            self.loss.load_state_dict(state["loss"])
        except RuntimeError as err:
            first = str(err).splitlines()[0]
            raise ValueError(f"resume: the state does not fit this model or loss ({first}); "
                             f"resume with the model, loss and data the run started with") \
                from None
        for name, obj in self.run_state.items():
            obj.load_state_dict(state["run"][name])
        self.stage = int(state["stage"])
        self.selection.load_state_dict(state)
        self.seconds_before = float(state["seconds"])
        if not self.selection.stage_done:  # the stage goes on: its optimiser ... as they were
            self.parts = self.stages[self.stage].setup()
            self.parts.optimizer.load_state_dict(state["optimizer"])
            for name, obj in self.parts.state.items():
                if name not in state["parts"]:
                    raise ValueError(f"resume: the state lacks the stage's {name!r}")
                obj.load_state_dict(state["parts"][name])

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> FitResult:
        selection = self.selection
        if self.parts is None and not selection.stage_done:
            self.parts = self.stages[self.stage].setup()
        while True:
            if selection.stage_done:
                if self.stage + 1 >= len(self.stages):
                    break
                self._next_stage()
            stage = self.stages[self.stage]
            offset = sum(s.epochs for s in self.stages[:self.stage])
            while not selection.stage_done:
                self._epoch(stage, offset)
        return self._finish()

    def _next_stage(self) -> None:
        self.stage += 1
        self.selection.new_stage()
        if self.stages[self.stage].from_best:
            model, loss = self.selection.best_weights()
            self.model.load_state_dict(model)
            self.loss.load_state_dict(loss)
        self.parts = self.stages[self.stage].setup()

    def _rng(self, epoch: int):
        if self.epoch_seed is None:
            return contextlib.nullcontext()
        return _seeded(self.epoch_seed(epoch), self.rng_devices)

    def _epoch(self, stage: Stage, offset: int) -> None:
        selection = self.selection
        e = selection.stage_epoch
        g = offset + e  # 0-based over the run
        model, loss, parts = self.model, self.loss, self.parts
        hooks = parts.hooks
        batches = parts.batches or self.batches
        forward = parts.forward or self.forward
        opt = parts.optimizer
        model.train()
        total = None  # the epoch's loss sum, on the device: read once, after the epoch
        progress = _BATCH_PROGRESS.get()
        with self._rng(g):
            loss.on_epoch_start(g)
            for hook in hooks:
                hook.on_epoch_start(g)
            for inputs, obs, idx in batches(g):
                extras = None
                if forward is None:
                    logits = model(inputs)
                else:
                    out = forward(inputs, obs, idx)
                    logits, obs, idx = out[0], out[1], out[2]
                    extras = out[3] if len(out) > 3 else None
                value = loss(logits, obs, index=idx)
                extra = loss.penalty(model)
                if torch.is_tensor(extra):
                    value = value + extra
                seen = None
                if hooks:
                    seen = StepBatch(logits, obs, idx, value, extras)
                    for hook in hooks:
                        for weight, term in hook.terms(seen):
                            value = value + weight * term
                if parts.step is None:
                    opt.zero_grad(set_to_none=True)
                    value.backward()
                    opt.step()
                else:
                    parts.step(value)
                for hook in hooks:
                    hook.after_step(seen)
                total = _accumulate(total, value, len(idx))
                if progress is not None:
                    progress(len(idx), self.num_examples)
        train_loss = (0.0 if total is None else float(total)) / self.num_examples
        if not np.isfinite(train_loss):
            where = f" (stage {stage.name}, its epoch {e + 1})" if stage.name is not None else ""
            groups = getattr(opt, "param_groups", None) or getattr(opt, "groups", ())
            decay = max((float(group.get("weight_decay", 0.0)) for group in groups
                         if isinstance(group, dict)), default=0.0)  # Adam's, or LeanAdam's
            raise FloatingPointError(diverged(g + 1, train_loss, where, decay))
        logits_all = self.train_logits() if loss.needs_train_predictions else None
        loss.on_epoch_end(g, logits_all)
        if self.after_epoch is not None:
            self.after_epoch()

        record = {"epoch": g + 1}
        if stage.name is not None:
            record.update(stage=stage.name, stage_epoch=e + 1)
        record["train_loss"] = train_loss
        for hook in hooks:
            record.update(hook.epoch_record())
        record.update(stage.info)
        source = value = None
        if self.evaluators:
            scores = {name: float(ev()) for name, ev in self.evaluators.items()}
            source = _pick({name: selection.sign * s for name, s in scores.items()})
            key = selection.key
            record[key] = value = scores[source]
            if len(scores) > 1:
                record.update({f"{key}_{name}": s for name, s in scores.items()})
                record["val_source"] = source
        done = selection.end_epoch(
            record, epoch=g + 1, stage_epochs=stage.epochs, value=value, stage=stage.name,
            source=source,
            keep=lambda: (self._weights(source), copy.deepcopy(loss.state_dict())))
        if stage.name is not None:
            record["stage_done"] = done
        try:
            if self.on_epoch is not None:
                self.on_epoch(record, model, loss)
        finally:  # the epoch is complete even when on_epoch raises (an interrupted run)
            if self.checkpoint is not None:
                self.checkpoint(self.state_dict)

    def _weights(self, source):
        if self.weights is not None and source is not None:
            return self.weights(source)
        return copy.deepcopy(self.model.state_dict())

    def _finish(self) -> FitResult:
        model, loss = self.selection.best_weights()
        self.model.load_state_dict(model)
        self.loss.load_state_dict(loss)
        carry_state(self.loss, False)  # the run is over: a next on_train_start starts afresh
        return FitResult(**self.selection.result_fields(),
                         seconds=self.seconds_before + time.perf_counter() - self.start)


def _accumulate(total, value: torch.Tensor, rows: int):
    """``total + value * rows`` without reading ``value`` back to the host (no synchronisation
    inside the training step): float64 where the device has it, which adds exactly what
    ``float(value) * rows`` added before (a float32 value is exact in float64), so the epoch's
    mean is the same to the bit."""
    value = value.detach()
    if value.device.type != "mps":
        value = value.double()
    part = value * rows
    return part if total is None else total.add_(part)


def _seeded(seed: int, devices: list[int]):
    return global_rng(seed, devices)


def train_loop(model: nn.Module, loss: SPMLLoss, stages: Sequence[Stage], *, num_examples: int,
               batches: Callable[[int], Iterable[Batch]] | None = None,
               forward: Callable | None = None,
               evaluators: Mapping[str, Callable[[], float]] | None = None,
               weights: Callable[[str], dict] | None = None, early_stop: str = "none",
               train_logits: Callable[[], torch.Tensor] | None = None,
               after_epoch: Callable[[], None] | None = None,
               on_epoch: Callable[..., None] | None = None,
               checkpoint: Callable[[Callable[[], dict]], None] | None = None,
               resume: dict | None = None, state: Mapping[str, Any] | None = None,
               epoch_seed: Callable[[int], int] | None = None,
               start: float | None = None, metric: str = "map") -> FitResult:
    """Train ``model`` with ``loss`` through ``stages``; keep the best epoch.

    The caller has already called ``loss.on_train_start``. See the module docstring for the
    order of the calls.

    Args:
        model: the module whose weights are selected (and handed to ``loss.penalty``).
        loss: the loss; its hooks are called here.
        stages: the run's `Stage` s, in order.
        num_examples: train rows (an epoch's ``train_loss`` is a mean over them).
        batches: ``batches(epoch)`` yields ``(inputs, observed, index)`` for one epoch
            (a stage's ``StageParts.batches`` takes precedence).
        forward: ``forward(inputs, observed, index) -> (logits, observed, index[, extras])``;
            default ``(model(inputs), observed, index)``. ``extras`` reach the hooks
            (`StepBatch.extras`).
        evaluators: ``name -> callable`` returning the val score (``metric``) of the current
            weights. The epoch's ``val_map`` (``val_<metric>`` for another metric) is the best
            of them; with more than one the record also has ``val_map_<name>``
            (``val_<metric>_<name>``) of each and ``val_source``, the winner. None: no
            validation, the last epoch is kept and ``val_map`` is NaN.
        weights: ``weights(name)``: a copy of the model state dict that evaluator ``name``
            scored (default: the model's own), kept when that evaluator wins the best epoch.
        early_stop: ``"none"``, ``"patience:N"`` or ``"drop:X"`` (`TrainConfig`),
            applied within each stage against the stage's best (with evaluators only).
        train_logits: eval-mode logits of every train row in row order, called after each epoch
            when ``loss.needs_train_predictions``.
        after_epoch: called after ``loss.on_epoch_end`` (many processes: state sync).
        on_epoch: ``on_epoch(record, model, loss)`` after each epoch; what it adds to
            ``record`` is in the history and in the state of that epoch's checkpoint.
        checkpoint: ``checkpoint(state_fn)`` after every epoch, after ``on_epoch`` (also when
            ``on_epoch`` raises). ``state_fn()`` returns the resumable state (a new dict of
            copies, loadable with ``torch.load(weights_only=True)``); call it before returning,
            or not at all (nothing is built then).
        resume: a state returned by ``state_fn``: continue from the end of its epoch. The run
            must be set up as the one that saved it (same model, loss, data, stages; the
            caller calls ``loss.on_train_start`` as for a new run, the state then replaces
            what it drew). A state of a finished run returns the result at once.
        state: the run's own resumable parts, ``name -> object`` with ``state_dict()`` /
            ``load_state_dict()`` (the linear mode's batch-order generator).
        epoch_seed: ``epoch_seed(epoch) -> int``: each epoch's training steps run with torch's
            global RNG (CPU and the model's CUDA devices) forked and seeded with it (dropout),
            leaving the caller's RNG as it was; None: the global RNG is used as it is (the
            linear mode, which draws nothing from it).
        start: ``time.perf_counter()`` of the run's start (default: now).
        metric: what the evaluators return, a name of `spmlkit.metrics.METRICS`
            (default ``"map"``); its direction decides "best" (``ranking_loss``, ``coverage``,
            ``one_error``, ``hamming_loss``: lower is better) for the best epoch, the evaluator
            that wins an epoch and early stopping (``drop:X``: X in the metric's own units).

    Returns:
        the `FitResult`; ``model`` and ``loss`` hold the best epoch's state.

    The batches' observed labels must already be valid (1 / 0 / -1: the ``fit_*`` functions
    check the whole matrix once): the loss skips its per-call check inside the loop.

    Raises:
        FloatingPointError: an epoch's train loss is not finite.
        ValueError: no epoch got a finite val mAP (val labels without positives, non-finite
            scores); a ``resume`` state of another format, stages or model.
    """
    stages = list(stages)
    if not stages:
        raise ValueError("train_loop needs at least one stage")
    run = _Run(model, loss, stages, num_examples=num_examples, batches=batches,
               forward=forward, evaluators=dict(evaluators or {}), weights=weights,
               early_stop=early_stop, train_logits=train_logits, after_epoch=after_epoch,
               on_epoch=on_epoch, checkpoint=checkpoint, state=dict(state or {}),
               epoch_seed=epoch_seed,
               start=time.perf_counter() if start is None else start, metric=metric)
    if resume is not None:
        run.load_state_dict(resume)
    from ..losses.contract import hooks_driven, observed_validated

    # the fit functions validated the observed matrix once; the loop calls every hook
    with observed_validated(loss), hooks_driven(loss):
        return run.run()
