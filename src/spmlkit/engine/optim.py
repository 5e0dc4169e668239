"""Adam without ``Optimizer.step``'s overhead (`LeanAdam`) and the optimiser of the linear
and fine-tuning modes (`make_optimizer`)."""
from __future__ import annotations

import torch
from torch import nn

from ..losses import SPMLLoss


class LeanAdam:
    """Adam (coupled L2 weight decay per group, default none) that calls torch's fused Adam
    kernel directly.

    The update is exactly ``torch.optim.Adam(fused=True)``'s (same kernel; a test checks it),
    without ``Optimizer.step``'s per-call bookkeeping, which costs about as much as the whole
    forward and backward pass of a small linear head (~0.15 ms a step here). Param groups are
    ``(params, lr)`` pairs; ``state_dict()`` / ``load_state_dict()`` checkpoint the moments and
    step counts. A group may be ``(params, lr, weight_decay)``: Adam's own (coupled) L2, the
    kernel adds ``weight_decay * p`` to the gradient before the moments, as
    ``torch.optim.Adam(weight_decay=...)``. Where this torch lacks the fused CPU kernel, use
    `make_optimizer`'s fallback instead.
    """

    def __init__(self, groups, betas=(0.9, 0.999), eps=1e-8):
        self.groups = []
        for params, lr, *decay in groups:
            params = [p for p in params if p.requires_grad]
            self.groups.append({
                "params": params, "lr": float(lr),
                "weight_decay": float(decay[0]) if decay else 0.0,
                "exp_avg": [torch.zeros_like(p) for p in params],
                "exp_avg_sq": [torch.zeros_like(p) for p in params],
                "steps": [torch.zeros((), dtype=torch.float32, device=p.device)
                          for p in params]})
        self.betas, self.eps = betas, eps

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (always to None, as ``set_to_none=True``)."""
        for g in self.groups:
            for p in g["params"]:
                p.grad = None

    def state_dict(self) -> dict:
        """Learning rates, moments and step counts of every group (references to the live
        tensors; copy them to keep a snapshot), plus ``betas`` and ``eps``."""
        return {"groups": [{"lr": g["lr"], "exp_avg": list(g["exp_avg"]),
                            "exp_avg_sq": list(g["exp_avg_sq"]), "steps": list(g["steps"])}
                           for g in self.groups],
                "betas": list(self.betas), "eps": self.eps}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (copied into this optimiser's tensors, on
        their devices).

        Raises:
            ValueError: a state of other groups or other parameter shapes.
        """
        groups = state.get("groups") if isinstance(state, dict) else None
        if not isinstance(groups, list) or len(groups) != len(self.groups):
            found = len(groups) if isinstance(groups, list) else "no"
            raise ValueError(f"LeanAdam.load_state_dict: the state has {found} parameter "
                             f"groups, this optimiser {len(self.groups)} (was it saved by "
                             f"LeanAdam.state_dict() for the same model and loss?)")
        for i, (ours, theirs) in enumerate(zip(self.groups, groups)):
            for key in ("exp_avg", "exp_avg_sq", "steps"):
                saved = theirs[key]
                shapes = [tuple(t.shape) for t in ours[key]]
                if [tuple(t.shape) for t in saved] != shapes:
                    raise ValueError(f"LeanAdam.load_state_dict: group {i} {key} has shapes "
                                     f"{[tuple(t.shape) for t in saved]}, this optimiser "
                                     f"{shapes}")
        for ours, theirs in zip(self.groups, groups):
            ours["lr"] = float(theirs["lr"])
            for key in ("exp_avg", "exp_avg_sq", "steps"):
                for mine, saved in zip(ours[key], theirs[key]):
                    mine.copy_(saved)
        self.betas = tuple(float(b) for b in state.get("betas", self.betas))
        self.eps = float(state.get("eps", self.eps))

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step of every parameter that has a gradient."""
        for g in self.groups:
            live = [i for i, p in enumerate(g["params"]) if p.grad is not None]
            if not live:
                continue
            steps = [g["steps"][i] for i in live]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_([g["params"][i] for i in live],
                               [g["params"][i].grad for i in live],
                               [g["exp_avg"][i] for i in live],
                               [g["exp_avg_sq"][i] for i in live], [], steps,
                               lr=g["lr"], beta1=self.betas[0], beta2=self.betas[1],
                               weight_decay=g["weight_decay"], eps=self.eps, amsgrad=False,
                               maximize=False)


def decayed(params) -> tuple[list, list]:
    """``(weights, others)``: the parameters weight decay applies to (matrices and kernels,
    ``ndim >= 2``) and those it leaves alone (biases, norms' scales)."""
    params = list(params)
    return [p for p in params if p.ndim >= 2], [p for p in params if p.ndim < 2]


def make_optimizer(model: nn.Module, loss: SPMLLoss, lr: float, head_lr_mult: float = 1.0,
                   weight_decay: float = 0.0):
    """Adam over the model, plus the loss's own trainable state at ``lr * loss.lr_multiplier``:
    `LeanAdam` where torch has the fused kernel for these tensors, else
    ``torch.optim.Adam``. Both expose ``zero_grad()``, ``step()``, ``state_dict()`` and
    ``load_state_dict()``.

    ``weight_decay`` (0: none, the groups as they always were): Adam's coupled L2 on the
    model's weights (`decayed`: not its biases, never the loss's own state), the
    linear and MLP heads' and SMILE's classifier's regulariser (``TrainConfig.weight_decay``).

    With ``head_lr_mult != 1`` the model's ``head`` (an attribute, as in
    `spmlkit.models.heads.ImageClassifier`) trains at ``lr * head_lr_mult`` and the rest
    of the model at ``lr``."""
    if head_lr_mult == 1.0:
        groups = [(list(model.parameters()), lr)]
    else:
        head = getattr(model, "head", None)
        if not isinstance(head, nn.Module):
            raise ValueError(f"head_lr_mult={head_lr_mult} needs a model with a `head` module "
                             f"(e.g. spmlkit.models.heads.ImageClassifier); "
                             f"{type(model).__name__} has none")
        in_head = {id(p) for p in head.parameters()}
        groups = [([p for p in model.parameters() if id(p) not in in_head], lr),
                  (list(head.parameters()), lr * head_lr_mult)]
        groups = [(ps, g_lr) for ps, g_lr in groups if any(p.requires_grad for p in ps)]
    if weight_decay:
        groups = [part for params, g_lr in groups
                  for part in zip(decayed(params), (g_lr, g_lr), (weight_decay, 0.0)) if part[0]]
    own = [p for p in loss.parameters() if p.requires_grad]
    if own:
        groups.append((own, lr * loss.lr_multiplier))
    try:
        opt = LeanAdam(groups)
        probe = torch.zeros(1, device=groups[0][0][0].device, requires_grad=True)
        probe.grad = torch.zeros(1, device=probe.device)
        LeanAdam([([probe], 0.0)]).step()  # raises where the kernel is missing
        return opt
    except (AttributeError, RuntimeError, NotImplementedError):
        return torch.optim.Adam([{"params": p, "lr": g_lr, "weight_decay": d[0] if d else 0.0}
                                 for p, g_lr, *d in groups], lr=lr)

