"""Exponential moving average of a model's weights (LAC evaluates it alongside the model).

Xie, Xiao, Huang, NeurIPS 2022, section 4.1: "we apply exponential moving average (EMA) to model
parameters with a decay of 0.9997" (the authors' code: Query2Label's ``ModelEma``, constant
decay, updated after every optimiser step). docs/spec.md#lac.

After each update ``n`` (counted from 0)::

    d = decay                                   (warmup=False, the official constant decay)
    d = min(decay, (1 + n) / (10 + n))          (warmup=True)
    ema = d * ema + (1 - d) * value             every floating parameter AND floating buffer
    ema = value                                 integer buffers (e.g. BatchNorm's counter)
"""
from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["ModelEMA"]


class ModelEMA:
    """A deep copy of ``model`` (``.module``, eval mode, no gradients) that tracks its weights.

    Args:
        model: the model being trained; its state at construction is the EMA's start.
        decay: the EMA decay in [0, 1] (official 0.9997).
        warmup: use ``min(decay, (1 + n) / (10 + n))`` for update ``n`` (so the first updates
            follow the model closely); off by default (the official constant decay).

    Evaluate with ``ema.module(x)``. ``state_dict()`` / ``load_state_dict()`` hold the decay, the
    warm-up flag, the number of updates and the copy's weights, for checkpoints.

    Raises:
        ValueError: ``decay`` outside [0, 1]; at ``update``, a model whose state keys or shapes
            differ from the copy's.

    >>> lin = nn.Linear(1, 1, bias=False)
    >>> _ = lin.weight.data.fill_(0.0)
    >>> ema = ModelEMA(lin, decay=0.5)
    >>> _ = lin.weight.data.fill_(1.0)
    >>> ema.update(lin)
    >>> ema.module.weight.item(), ema.updates
    (0.5, 1)
    """

    def __init__(self, model: nn.Module, decay: float = 0.9997, warmup: bool = False):
        if not 0.0 <= float(decay) <= 1.0:
            raise ValueError(f"ModelEMA: decay must be in [0, 1], got {decay}")
        self.decay = float(decay)
        self.warmup = bool(warmup)
        self.updates = 0
        self.module = copy.deepcopy(model)
        self.module.eval()
        for p in self.module.parameters():
            p.requires_grad_(False)

    def current_decay(self) -> float:
        """The decay the next `update` uses."""
        if self.warmup:
            n = self.updates
            return min(self.decay, (1 + n) / (10 + n))
        return self.decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One EMA step towards ``model``'s current parameters and buffers."""
        d = self.current_decay()
        ours = self.module.state_dict()
        theirs = model.state_dict()
        if ours.keys() != theirs.keys():
            missing = sorted(set(ours) - set(theirs))[:5]
            extra = sorted(set(theirs) - set(ours))[:5]
            raise ValueError(f"ModelEMA.update: the model's state does not match the EMA copy "
                             f"(missing {missing}, unexpected {extra}); update with the model "
                             f"the EMA was made from")
        for key, ema_value in ours.items():
            value = theirs[key].detach()
            if value.shape != ema_value.shape:
                raise ValueError(f"ModelEMA.update: {key} has shape {tuple(value.shape)} in "
                                 f"the model, {tuple(ema_value.shape)} in the EMA copy")
            value = value.to(device=ema_value.device)
            if ema_value.is_floating_point():
                ema_value.mul_(d).add_(value.to(ema_value.dtype), alpha=1.0 - d)
            else:
                ema_value.copy_(value)
        self.updates += 1

    def state_dict(self) -> dict:
        """``{"decay", "warmup", "updates", "module"}`` (the copy's ``state_dict``)."""
        return {"decay": self.decay, "warmup": self.warmup, "updates": self.updates,
                "module": self.module.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned.

        Raises:
            ValueError: a key of ``{"decay", "updates", "module"}`` is missing.
        """
        missing = [k for k in ("decay", "updates", "module") if k not in state]
        if missing:
            raise ValueError(f"ModelEMA.load_state_dict: the state lacks {missing}; was it "
                             f"saved by ModelEMA.state_dict()?")
        self.module.load_state_dict(state["module"])
        self.decay = float(state["decay"])
        self.warmup = bool(state.get("warmup", self.warmup))
        self.updates = int(state["updates"])

    def __repr__(self) -> str:
        return (f"ModelEMA(decay={self.decay}, warmup={self.warmup}, updates={self.updates}, "
                f"module={type(self.module).__name__})")
