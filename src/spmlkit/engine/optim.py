"""Adam without ``Optimizer.step``'s overhead (`LeanAdam`) and the optimiser of the linear
and fine-tuning modes (`make_optimizer`)."""
from __future__ import annotations

import math

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

    A parameter whose gradient is sparse over its first dimension (rows: ROLE's estimator with
    ``estimator_update="rows"``, an embedding with ``sparse=True``) is stepped lazily, exactly
    as ``torch.optim.SparseAdam`` steps it (`row_adam_`: only the gradient's rows, their
    moments included; bias correction from the parameter's step count), so a step costs the
    rows', not the whole tensor's; such a group takes no weight decay.
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
                          for p in params],
                # the step counts as numbers too, for the lazy steps' bias correction (no
                # device read a step)
                "counts": [0] * len(params)})
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
            ours["counts"] = [int(t) for t in ours["steps"]]
        self.betas = tuple(float(b) for b in state.get("betas", self.betas))
        self.eps = float(state.get("eps", self.eps))

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step of every parameter that has a gradient (a sparse one: `row_adam_`)."""
        beta1, beta2 = self.betas
        for g in self.groups:
            live = [i for i, p in enumerate(g["params"]) if p.grad is not None]
            rows = [i for i in live if g["params"][i].grad.is_sparse]
            if rows:
                live = [i for i in live if i not in rows]
                if g["weight_decay"]:
                    raise ValueError(f"LeanAdam: a parameter with a sparse (row-wise) gradient "
                                     f"takes no weight decay (torch.optim.SparseAdam has "
                                     f"none); its group has {g['weight_decay']:g}")
                for i in rows:
                    g["steps"][i].add_(1)
                    g["counts"][i] += 1
                    row_adam_(g["params"][i], g["params"][i].grad, g["exp_avg"][i],
                              g["exp_avg_sq"][i], g["counts"][i], lr=g["lr"], beta1=beta1,
                              beta2=beta2, eps=self.eps)
            if not live:
                continue
            steps = [g["steps"][i] for i in live]
            torch._foreach_add_(steps, 1)
            for i in live:
                g["counts"][i] += 1
            torch._fused_adam_([g["params"][i] for i in live],
                               [g["params"][i].grad for i in live],
                               [g["exp_avg"][i] for i in live],
                               [g["exp_avg_sq"][i] for i in live], [], steps,
                               lr=g["lr"], beta1=beta1, beta2=beta2,
                               weight_decay=g["weight_decay"], eps=self.eps, amsgrad=False,
                               maximize=False)


@torch.no_grad()
def row_adam_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
              exp_avg_sq: torch.Tensor, step: int, *, lr: float, beta1: float, beta2: float,
              eps: float) -> None:
    """One lazy Adam step of the rows of ``param`` that the sparse ``grad`` holds, in place:
    ``torch.optim.SparseAdam``'s update, value for value (a test checks it), with index
    operations on the rows (O(rows x row size); its sparse additions cost the same).

    A row's moments move only when it has a gradient: ``m += (1 - beta1) (g - m)``,
    ``v += (1 - beta2) (g^2 - v)``; the row moves by ``-lr sqrt(1 - beta2^t) / (1 - beta1^t)
    m / (sqrt(v) + eps)`` with ``t`` = ``step``, the parameter's step count (this one
    included).

    Raises:
        ValueError: a gradient sparse over other than the first dimension alone.
    """
    if grad.sparse_dim() != 1:
        raise ValueError(f"a row-wise Adam step needs a gradient sparse over the first "
                         f"dimension (as F.embedding(..., sparse=True) gives); this one is "
                         f"sparse over {grad.sparse_dim()} dimensions")
    grad = grad.coalesce()  # the update is not linear: each row once
    rows, values = grad._indices()[0], grad._values()
    if not values.numel():
        return
    old_m = exp_avg.index_select(0, rows)
    new_m = values.sub(old_m).mul_(1 - beta1)
    exp_avg.index_add_(0, rows, new_m)
    old_v = exp_avg_sq.index_select(0, rows)
    new_v = values.pow(2).sub_(old_v).mul_(1 - beta2)
    exp_avg_sq.index_add_(0, rows, new_v)
    new_m.add_(old_m)
    denom = new_v.add_(old_v).sqrt_().add_(eps)
    step_size = lr * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
    param.index_add_(0, rows, new_m.div_(denom).mul_(-step_size))


def decayed(params) -> tuple[list, list]:
    """``(weights, others)``: the parameters weight decay applies to (matrices and kernels,
    ``ndim >= 2``) and those it leaves alone (biases, norms' scales)."""
    params = list(params)
    return [p for p in params if p.ndim >= 2], [p for p in params if p.ndim < 2]


def make_optimizer(model: nn.Module, loss: SPMLLoss, lr: float, head_lr_mult: float = 1.0,
                   weight_decay: float = 0.0):
    """Adam over the model, plus the loss's own trainable state at ``lr * loss.lr_multiplier``:
    `LeanAdam` where torch has the fused kernel for these tensors, else
    ``torch.optim.Adam`` (with ``torch.optim.SparseAdam`` for the loss's
    `spmlkit.losses.SPMLLoss.row_parameters`: `AdamAndSparseAdam`). Each exposes
    ``zero_grad()``, ``step()``, ``state_dict()`` and ``load_state_dict()``.

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
        pass
    rows = {id(p) for p in loss.row_parameters()}
    dense = [(ps, g_lr, *d) for params, g_lr, *d in groups
             if (ps := [p for p in params if id(p) not in rows])]
    adam = torch.optim.Adam([{"params": p, "lr": g_lr, "weight_decay": d[0] if d else 0.0}
                             for p, g_lr, *d in dense], lr=lr)
    if not rows:
        return adam
    return AdamAndSparseAdam(adam, torch.optim.SparseAdam(
        [p for p in own if id(p) in rows], lr=lr * loss.lr_multiplier))


class AdamAndSparseAdam:
    """``torch.optim.Adam`` over the dense parameters and ``torch.optim.SparseAdam`` over
    the loss's `spmlkit.losses.SPMLLoss.row_parameters` as one optimiser (`make_optimizer`
    where torch lacks the fused kernel): ``zero_grad``, ``step``, ``state_dict``,
    ``load_state_dict`` and ``param_groups`` (both optimisers' groups, Adam's first)."""

    def __init__(self, adam: torch.optim.Optimizer, sparse: torch.optim.Optimizer):
        self.parts = (adam, sparse)
        self.param_groups = adam.param_groups + sparse.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for part in self.parts:
            part.step()

    def state_dict(self) -> dict:
        return {"adam": self.parts[0].state_dict(), "sparse_adam": self.parts[1].state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned.

        Raises:
            ValueError: a state of another optimiser."""
        if not isinstance(state, dict) or set(state) != {"adam", "sparse_adam"}:
            raise ValueError("AdamAndSparseAdam.load_state_dict: the state is not one of "
                             "AdamAndSparseAdam.state_dict() (was it saved with the fused "
                             "kernel, by LeanAdam? resume where it was saved)")
        self.parts[0].load_state_dict(state["adam"])
        self.parts[1].load_state_dict(state["sparse_adam"])

