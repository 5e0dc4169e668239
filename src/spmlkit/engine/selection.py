"""Which epoch is best, when to stop, what to record: the one model-selection record of a run.

`Selection` is what both training loops keep per run: `spmlkit.engine.train_loop`
(one run, any mode) and `spmlkit.engine.vectorised.fit_linear_stacked` (one
`Selection` per stacked run). It holds the best epoch (its score, epoch, stage, evaluator
and a copy of its weights and loss state), the current stage's best (early stopping compares
against it), the history of epoch records, whether the run stopped early, and where the run is
in its stage; it writes and reads its part of a training state (the keys ``stage_epoch``,
``stage_done``, ``stopped_early``, ``best``, ``stage_best`` and ``history`` of
`spmlkit.engine.loop.STATE_FORMAT`).

A module of its own rather than `spmlkit.engine.config` (which holds a run's
hyperparameters and parses ``early_stop``, stateless): this is per-run state with weights and a
checkpoint format, used by both loops, and the early-stopping rule (``patience:N``,
``drop:X``) is applied here and nowhere else (`Selection.should_stop`).
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Callable

import numpy as np
import torch

from .config import parse_early_stop

__all__ = ["Selection", "no_finite_val_map", "snapshot"]


def snapshot(obj, where: str = "state"):
    """A copy of ``obj`` that ``torch.load(weights_only=True)`` loads: tensors cloned (detached,
    same device), dicts (OrderedDicts keep their ``_metadata``), lists, tuples, numbers,
    strings, bools and None as they are, numpy scalars as Python numbers and numpy arrays as
    tensors.

    Raises:
        TypeError: any other object (the message names where it is).
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, dict):
        items = [(k, snapshot(v, f"{where}[{k!r}]")) for k, v in obj.items()]
        if isinstance(obj, OrderedDict):
            out = OrderedDict(items)
            if hasattr(obj, "_metadata"):
                out._metadata = copy.deepcopy(obj._metadata)
            return out
        return dict(items)
    if isinstance(obj, (list, tuple)):
        items = [snapshot(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    raise TypeError(f"{where} is a {type(obj).__name__}, which a training state cannot hold "
                    f"(torch.load(weights_only=True) loads tensors, numbers, strings, lists and "
                    f"dicts only); convert it in its state_dict()")


def no_finite_val_map(history: list) -> ValueError:
    """The error of a run in which no epoch got a finite val mAP."""
    scores = [h.get("val_map") for h in history]
    return ValueError(
        f"no epoch got a finite validation mAP (val_map of the {len(scores)} epoch(s): "
        f"{scores[:5]}{' ...' if len(scores) > 5 else ''}), so there is no best epoch to keep. "
        f"Either the validation labels have no positive in any class (mAP is undefined under "
        f"map_convention 'present': use a validation split with positives, "
        f"map_convention='official', or train without validation to keep the last epoch) or "
        f"the model's validation scores are not finite (NaN / inf: lower the learning rate)")


def _unset_best() -> dict:
    return {"score": float("-inf"), "epoch": 0, "stage": None, "source": None, "model": None,
            "loss": None}


def _unset_stage_best() -> dict:
    return {"score": float("-inf"), "epoch": 0}


class Selection:
    """One run's model selection: best epoch, early stopping, history, and their checkpoint.

    Scores are compared "higher is better": a lower-is-better ``metric`` (``ranking_loss``,
    ...) has its sign flipped (``score = sign * value``); without validation (``validated``
    False) an epoch's score is its 0-based index, so the last epoch is the best and the run
    never stops early. An epoch is the new best when its score is strictly higher (a NaN
    never is); within a stage, early stopping compares against the stage's best.

    Args:
        early_stop: ``"none"``, ``"patience:N"`` or ``"drop:X"``
            (`spmlkit.engine.config.parse_early_stop`).
        metric: the selection metric, a name of `spmlkit.metrics.METRICS`.
        validated: whether epochs are scored on a validation set.
    """

    def __init__(self, early_stop: str = "none", metric: str = "map", validated: bool = True):
        from ..metrics import higher_is_better

        self.stop_kind, self.stop_arg = parse_early_stop(early_stop)
        self.metric = metric
        self.sign = 1.0 if higher_is_better(metric) else -1.0
        self.validated = bool(validated)
        self.best = _unset_best()
        self.stage_best = _unset_stage_best()
        self.history: list = []
        self.stopped_early = False
        self.stage_epoch = 0      # epochs done in the current stage
        self.stage_done = False

    @property
    def key(self) -> str:
        """The record's field of the val score: ``val_map`` or ``val_<metric>``."""
        return "val_map" if self.metric == "map" else f"val_{self.metric}"

    def new_stage(self) -> None:
        """A new stage starts: its own best (for early stopping) and epoch count."""
        self.stage_best = _unset_stage_best()
        self.stage_epoch, self.stage_done = 0, False

    def should_stop(self, score: float) -> bool:
        """The early-stopping rule, after an epoch of score ``score`` (higher is better) was
        recorded: ``patience:N`` stops after N epochs of the stage without a better score,
        ``drop:X`` when the score falls more than X below the stage's best."""
        if not self.validated:
            return False
        if self.stop_kind == "patience":
            return self.stage_epoch - self.stage_best["epoch"] >= self.stop_arg
        if self.stop_kind == "drop":
            return score < self.stage_best["score"] - self.stop_arg
        return False

    def end_epoch(self, record: dict, *, epoch: int, stage_epochs: int,
                  value: float | None = None, keep: Callable[[], tuple] | None = None,
                  stage=None, source: str | None = None) -> bool:
        """Record an epoch; return whether the stage is done.

        Args:
            record: the epoch's record (``"best"`` is set here; it is appended to the history).
            epoch: the epoch, 1-based over the run.
            stage_epochs: the current stage's number of epochs.
            value: the epoch's val score in the metric's own direction (ignored without
                validation).
            keep: ``keep() -> (model state, loss state)``, copies of the weights and loss state
                to keep, called only when the epoch is the new best.
            stage, source: the stage's name and the evaluator that scored the epoch, kept with
                the best epoch.
        """
        score = self.sign * float(value) if self.validated else float(epoch - 1)
        improved = score > self.best["score"]
        if improved:
            model, loss = keep() if keep is not None else (None, None)
            self.best = {"score": score, "epoch": epoch, "stage": stage, "source": source,
                         "model": model, "loss": loss}
        self.stage_epoch += 1
        if score > self.stage_best["score"]:
            self.stage_best = {"score": score, "epoch": self.stage_epoch}
        record["best"] = improved
        self.history.append(record)
        stop = self.should_stop(score)
        self.stage_done = self.stage_epoch >= stage_epochs or stop
        self.stopped_early = self.stopped_early or (stop and self.stage_epoch < stage_epochs)
        return self.stage_done

    def best_weights(self) -> tuple:
        """``(model state, loss state)`` of the best epoch.

        Raises:
            ValueError: no epoch got a finite score (`no_finite_val_map`).
        """
        if self.best["model"] is None:
            raise no_finite_val_map(self.history)
        return self.best["model"], self.best["loss"]

    def result_fields(self) -> dict:
        """The `spmlkit.engine.FitResult` fields of the selection (all but
        ``seconds`` and ``linear``)."""
        value = self.sign * float(self.best["score"]) if self.validated else float("nan")
        return {"best_epoch": int(self.best["epoch"]),
                "val_map": value if self.metric == "map" else float("nan"),
                "metric": self.metric, "val_score": value, "history": self.history,
                "stopped_early": self.stopped_early, "best_stage": self.best["stage"],
                "best_source": self.best["source"]}

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self, **more) -> dict:
        """A training state: ``more`` (the loop's own entries) and the selection's
        (``stage_epoch``, ``stage_done``, ``stopped_early``, ``best``, ``stage_best``,
        ``history``), copied by `snapshot`; the best weights are shared, not cloned (the
        loops never change them in place)."""
        best = {k: v for k, v in self.best.items() if k not in ("model", "loss")}
        state = snapshot({**more, "stage_epoch": self.stage_epoch, "stage_done": self.stage_done,
                          "stopped_early": self.stopped_early, "best": best,
                          "stage_best": self.stage_best, "history": self.history})
        state["best"].update(model=self.best["model"], loss=self.best["loss"])
        return state

    def load_state_dict(self, state: dict) -> None:
        """Take the selection's entries of a training state (`state_dict`)."""
        self.stage_epoch = int(state["stage_epoch"])
        self.stage_done = bool(state["stage_done"])
        self.stopped_early = bool(state["stopped_early"])
        self.best = {**_unset_best(), **dict(state["best"])}
        self.stage_best = dict(state["stage_best"])
        self.history = [dict(h) for h in state["history"]]
