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
import torch.nn.functional as F
from torch import nn

from ..losses import SPMLLoss, TrainInfo
from ..losses.contract import observed_validated
from ..losses.cole import expected_positive_penalty_grad
from ..metrics import BLOCK_ENTRIES, check_convention, map_from_ap, per_class_ap, ranked_ap
from ..data import rows as stored_rows
from ..data.rows import as_rows, is_stored
from .config import TrainConfig, batch_starts, epoch_rows
from .linear import linear_inputs, make_linear_head, predict_logits, to_device, val_map
from .loop import STATE_FORMAT, FitResult, diverged
from .selection import Selection

__all__ = [
    "CPU_LARGE_STACK",
    "CPU_STACK_WORK",
    "STACK_MEMORY_BYTES",
    "StackedLinear",
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
#: stored val rows: every run's val logits (R x N x L float32) from one read of the rows up to
#: this size, else one run's at a time (`_stored_val_logits`)
STORED_VAL_BYTES = 64 * 1024 ** 2
#: the TrainConfig fields in which stacked runs may differ
STACKED_AXES = ("seed", "lr", "weight_decay")
#: rows of the closed-form BCE tables built at once (`_closed_form_tables`)
TABLE_ROWS = 65536


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


class StackedLinear(nn.Module):
    """R linear heads as one module: ``weight`` R x L x D, ``bias`` R x L (``stacked_runs``:
    losses with a penalty on the head's weights give one value per run).

    ``shared``: runs ``r`` with the same ``r // shared`` see the same rows (the runs of one seed
    draw the same batch order): a step's input is S x B x D (S = R / shared row groups) and the
    logits of a row group's runs are one matrix product of its rows with their weights side by
    side (B x D times D x shared*L), not ``shared`` products of B x D times D x L."""

    stacked_runs = True

    def __init__(self, heads: Sequence[nn.Linear], shared: int = 1):
        super().__init__()
        if shared < 1 or len(heads) % shared:
            raise ValueError(f"{len(heads)} runs cannot share rows in groups of {shared}")
        self.shared = shared
        self.weight = nn.Parameter(torch.stack([h.weight.detach() for h in heads]).contiguous())
        self.bias = nn.Parameter(torch.stack([h.bias.detach() for h in heads]).contiguous())

    def _grouped(self):
        runs, classes, features = self.weight.shape
        groups = runs // self.shared
        return (self.weight.view(groups, self.shared * classes, features),
                self.bias.view(groups, 1, self.shared * classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` S x B x D (each row group its own rows) -> R x B x L."""
        weight, bias = self._grouped()
        out = torch.baddbmm(bias, x, weight.transpose(1, 2))  # S x B x shared*L
        if self.shared == 1:
            return out
        groups, batch = out.shape[:2]
        return out.view(groups, batch, self.shared, -1).transpose(1, 2).reshape(
            groups * self.shared, batch, -1)

    def head_grads(self, g: torch.Tensor, x: torch.Tensor, grad_w: torch.Tensor,
                   grad_b: torch.Tensor) -> None:
        """The gradients of the weights and biases (into ``grad_w``, ``grad_b``) from the
        logits' ``g`` (R x B x L) and the rows ``x`` (S x B x D) of `forward`."""
        torch.sum(g, dim=1, out=grad_b)
        runs, batch, classes = g.shape
        groups = runs // self.shared
        if self.shared > 1:  # S x B x shared*L, the layout of forward's product
            g = g.view(groups, self.shared, batch, classes).transpose(1, 2).reshape(
                groups, batch, self.shared * classes)
        torch.bmm(g.transpose(1, 2), x, out=grad_w.view(groups, self.shared * classes, -1))

    @torch.no_grad()
    def predict(self, x: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """Every run's logits of the shared rows ``x`` (N x D, a tensor or stored features read
        chunk by chunk) -> R x N x L, in row chunks (one matrix product of a chunk with every
        run's weights; ``chunk`` defaults to `CHUNK_ROWS`)."""
        chunk = chunk or stored_rows.CHUNK_ROWS
        runs, classes, features = self.weight.shape
        w = self.weight.view(runs * classes, features)
        b = self.bias.view(runs * classes)
        parts = [torch.addmm(b, _rows_on(x[i:i + chunk], w.device), w.T).view(
            -1, runs, classes).transpose(0, 1) for i in range(0, max(len(x), 1), chunk)]
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0].contiguous()

    def run_head(self, r: int) -> nn.Linear:
        """Run ``r``'s head as an ``nn.Linear`` whose parameters are views of the stack (they
        follow the training; not to be modified)."""
        head = nn.Linear(self.weight.shape[2], self.weight.shape[1], device="meta")
        head.weight = nn.Parameter(self.weight.detach()[r], requires_grad=False)
        head.bias = nn.Parameter(self.bias.detach()[r], requires_grad=False)
        return head


def stacked_val_map(scores: torch.Tensor, y, convention: str) -> list[float]:
    """Val mAP (x100) of each of R score matrices (R x N x L logits) against the same full
    labels ``y`` (N x L, 0/1): `spmlkit.engine.val_map` of each (sigmoid in float32, then
    the AP core `spmlkit.metrics.ranked_ap`), for all runs and classes at once; equal
    to it bit for bit. On a CPU the scores are sorted by `spmlkit.metrics.per_class_ap`
    (numpy); on a device there, in blocks of runs, and only the sorted labels and tie ends
    come back. A run with a non-finite score gets NaN (no score for the epoch), as ``val_map``.
    """
    check_convention(convention)
    probs = torch.sigmoid(scores.float())  # the single run's scores (their ties are its ties)
    runs, n, classes = probs.shape
    finite = torch.isfinite(probs).flatten(1).all(dim=1).tolist()
    ok = [r for r in range(runs) if finite[r]]
    out = [float("nan")] * runs
    if not ok:
        return out
    probs = probs[ok] if len(ok) < runs else probs
    if probs.device.type == "cpu":
        ap = per_class_ap(probs.numpy(), y)
    else:
        ap = _device_ap(probs, torch.as_tensor(np.asarray(y), device=probs.device))
    for r, a in zip(ok, ap):
        out[r] = map_from_ap(a, convention)
    return out


def _device_ap(probs: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Per-class AP x100 (R x L) of ``probs`` (R x N x L) against ``y`` (N x L): sorted on
    their device in blocks of runs (`spmlkit.metrics.BLOCK_ENTRIES` entries), each
    block's sorted labels and tie ends scored by `spmlkit.metrics.ranked_ap`."""
    runs, n, classes = probs.shape
    hits_all = (y > 0).T.unsqueeze(0)  # 1 x L x N
    per = 1 if classes == 1 else max(1, BLOCK_ENTRIES // max(n * classes, 1))
    parts = []
    for r in range(0, runs, per):
        s, order = torch.sort(probs[r:r + per].transpose(1, 2), dim=-1, descending=True)
        hits = torch.gather(hits_all.expand(len(s), -1, -1), -1, order)
        end = torch.ones_like(hits)  # the last entry of every group of tied scores
        end[..., :-1] = s[..., 1:] != s[..., :-1]
        parts.append(ranked_ap(hits.cpu().numpy(), end.cpu().numpy()))
    return np.concatenate(parts) * 100.0


class _StackedAdam:
    """Adam over the stacked parameters: for each (learning rate, weight decay), one call of
    torch's fused kernel on the slices of the runs that train with it (each maximal block of
    consecutive runs with that pair is one slice; runs ordered by them give one slice per
    pair). ``groups``: ``(stacked params, lr per run, gradient buffers or None[, weight decay
    per run, which params it decays])``: a parameter with a buffer takes its gradient from it
    (the head, whose gradient the engine computes itself), else from ``.grad``; weight decay is
    Adam's coupled L2 (the single run's `spmlkit.engine.LeanAdam` group), on the
    params marked (the head's weights, not its biases), in a call of their own when it is not 0.
    Every run takes the same steps (one count)."""

    def __init__(self, groups, betas=(0.9, 0.999), eps=1e-8):
        self.betas, self.eps = betas, eps
        self.calls = []  # (params, [(param, slice)], grad slices or None, m, v, steps, lr, wd)
        self.params = []
        self.moments = {}
        self.count = 0
        self.steps: list = []
        for params, lrs, grads, *decay in groups:
            wds, marked = decay if decay else ([0.0] * len(lrs), [False] * len(params))
            keep = [i for i, p in enumerate(params) if p.requires_grad]
            params = [params[i] for i in keep]
            marked = [marked[i] for i in keep]
            grads = None if grads is None else [grads[i] for i in keep]
            steps = [torch.zeros((), device=p.device) for p in params]
            self.steps += steps
            for p in params:
                self.params.append(p)
                self.moments[id(p)] = (torch.zeros_like(p), torch.zeros_like(p))
            slices: dict = {}  # (lr, wd) -> its blocks of consecutive runs
            start = 0
            key = [(float(lr), float(wd)) for lr, wd in zip(lrs, wds)]
            while start < len(key):
                stop = start
                while stop < len(key) and key[stop] == key[start]:
                    stop += 1
                slices.setdefault(key[start], []).append(slice(start, stop))
                start = stop
            for (lr, wd), sls in slices.items():
                parts = [[i for i in range(len(params)) if marked[i]],
                         [i for i in range(len(params)) if not marked[i]]] if wd else \
                    [list(range(len(params)))]
                for j, which in enumerate(parts):
                    if not which:
                        continue
                    pairs = [(params[i], sl) for sl in sls for i in which]
                    self.calls.append((
                        pairs, [p.detach()[sl] for p, sl in pairs],
                        None if grads is None else [grads[i][sl] for sl in sls for i in which],
                        [self.moments[id(p)][0][sl] for p, sl in pairs],
                        [self.moments[id(p)][1][sl] for p, sl in pairs],
                        [steps[i] for _ in sls for i in which], lr,
                        wd if wd and j == 0 else 0.0))

    @torch.no_grad()
    def step(self) -> None:
        self.count += 1
        torch._foreach_add_(self.steps, 1)
        for pairs, views, grads, m, v, steps, lr, wd in self.calls:
            if grads is None:
                grads = [p.grad[sl] for p, sl in pairs]
            torch._fused_adam_(views, grads, m, v, [], steps, lr=lr, beta1=self.betas[0],
                               beta2=self.betas[1], weight_decay=wd, eps=self.eps,
                               amsgrad=False, maximize=False)

    def run_state(self, r: int, groups_of_run) -> dict:
        """Run ``r``'s optimiser state in `spmlkit.engine.LeanAdam`'s format:
        ``groups_of_run``: its ``[(stacked params, lr)]`` in LeanAdam's group order."""
        groups = []
        for params, lr, *_ in groups_of_run:
            params = [p for p in params if p.requires_grad]
            groups.append({"lr": float(lr),
                           "exp_avg": [self.moments[id(p)][0][r] for p in params],
                           "exp_avg_sq": [self.moments[id(p)][1][r] for p in params],
                           "steps": [torch.tensor(float(self.count), device=p.device)
                                     for p in params]})
        return {"groups": groups, "betas": list(self.betas), "eps": self.eps}


def gather(t, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` (rows of ``t`` for an index of any shape), contiguous, through one
    ``index_select`` of whole rows (faster than advanced indexing with a 2-d index); from
    stored features (`Rows`), one read of those rows in file order."""
    if is_stored(t):
        block = as_rows(t).take(index.reshape(-1).cpu().numpy())
        return to_device(block, index.device).view(*index.shape, t.shape[1])
    return t.index_select(0, index.reshape(-1)).view(*index.shape, *t.shape[1:])


def _stored_val_logits(model: StackedLinear, views, xv) -> Callable[[int], torch.Tensor]:
    """Run ``r``'s val logits of stored val rows ``xv``, as a function of ``r``: every run's
    from one read of the rows (one product per chunk) when R x N x L float32 take at most
    `STORED_VAL_BYTES`, else each run's from its own read (one run's N x L at a time)."""
    runs, classes, _ = model.weight.shape
    if runs * len(xv) * classes * 4 <= STORED_VAL_BYTES:
        logits = model.predict(xv)
        return lambda r: logits[r]
    return lambda r: predict_logits(views[r], xv)


def _rows_on(block, device: torch.device) -> torch.Tensor:
    """A block of rows as a tensor on ``device`` (stored features are read as numpy)."""
    return block if torch.is_tensor(block) else to_device(block, device)


def _state_tensors(module: nn.Module) -> list[tuple[nn.Module, str, bool]]:
    """``(owner module, name, is_parameter)`` of every parameter and buffer of ``module``."""
    out = []
    for _, sub in module.named_modules():
        out += [(sub, n, True) for n, p in sub._parameters.items() if p is not None]
        out += [(sub, n, False) for n, b in sub._buffers.items() if b is not None]
    return out


def _closed_form_tables(losses, observed, dtype):
    """The closed-form runs' BCE targets and weights of every train row (``bce_form``), each
    distinct table once: ``([targets, weights (if any)], offsets, count)`` with the tables
    stacked to G*N x L, ``offsets`` R x 1 (run r's rows start at its offset; None with one
    table) and ``count`` None or the per-run ``(lam, k)`` tensors of the count term (lam 0:
    none).

    A table of 0 / 1 only (AN's targets, weights of 1) is held as uint8 and cast back per
    gathered chunk (exact): a quarter of the memory of N x L float32 per table. The tables are
    built over blocks of `TABLE_ROWS` rows (``bce_form`` is entry-wise), so no N x L
    float32 (or bool) temporary of a large train split is made."""
    n = observed[0].shape[0]
    index: dict = {}
    sources, offsets, lams, ks = [], [], [], []  # per distinct table: (loss, observed)
    for loss, z in zip(losses, observed):
        key = (type(loss), loss.extra_repr(), id(z))
        if key not in index:
            index[key] = len(sources)
            sources.append((loss, z))
        offsets.append(index[key] * n)
        count = loss.count_penalty()
        lams.append(0.0 if count is None else float(count[0]))
        ks.append(0.0 if count is None else float(count[1]))
    device = sources[0][1].device
    with torch.no_grad():
        weighted = [loss.bce_form(z[:1])[1] is not None for loss, z in sources]

        def blocks(kind: int):  # (table's first row, block of that table in ``dtype``)
            for g, (loss, z) in enumerate(sources):
                for i in range(0, n, TABLE_ROWS):
                    t, w = loss.bce_form(z[i:i + TABLE_ROWS])
                    block = t if kind == 0 else torch.ones_like(t, dtype=dtype) if w is None \
                        else w
                    yield g * n + i, block.to(dtype)

        tables = []
        for kind in ([0, 1] if any(weighted) else [0]):
            exact = all(torch.equal(b, b.to(torch.uint8).to(dtype)) for _, b in blocks(kind))
            table = torch.empty((len(sources) * n, *observed[0].shape[1:]),
                                dtype=torch.uint8 if exact else dtype, device=device)
            for start, b in blocks(kind):
                table[start:start + len(b)] = b
            tables.append(table)
        offsets = torch.tensor(offsets, device=device).view(-1, 1) if len(sources) > 1 else None
    count = None
    if any(lams):
        count = (torch.tensor(lams, dtype=dtype, device=device).view(-1),
                 torch.tensor(ks, dtype=dtype, device=device).view(-1))
    return tables, offsets, count


def _closed_form_step(logits, target, weight, count, reduction):
    """Each run's loss and the gradient of their sum for the logits (R x B x L) of a
    closed-form BCE loss (`spmlkit.losses.SPMLLoss.closed_form`): the values of its
    ``entries`` reduced as the autograd step reduces them, and ``weight * (sigmoid(s) - target)
    / (B L)`` plus the count term's ``2 lam (m - k) / (L^2 B) * p (1 - p)`` (``m``: the run's
    mean predicted count), what autograd computes."""
    _, batch, classes = logits.shape
    # BCE(s, t) = softplus(s) - t s (what binary_cross_entropy_with_logits computes, in fewer
    # operations: the step time here is per-operation overhead)
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
    if reduction == "sum":
        values = values * (batch * classes)
        g.mul_(batch * classes)
    return values, g


def _autograd_step(model, stacked, xb, zb, idx, loss_params, seed):
    """Each run's loss and the gradient of their sum for the logits, through autograd (the
    loss's own parameters get theirs in ``.grad``; a penalty on the head's in the head's)."""
    with torch.no_grad():
        logits = model(xb)
    logits.requires_grad_(True)
    mat, pen = stacked.weighted_entries(logits, zb, idx)
    values = mat.mean(dim=(1, 2))
    if pen is not None:
        values = values + pen
    extra = stacked.penalty(model)
    if torch.is_tensor(extra):
        values = values + extra
    if stacked.reduction == "sum":
        values = values * mat[0].numel()
    for p in loss_params:
        p.grad = None
    # d(sum of the runs' losses)/d(each run's loss) = 1: seeded directly (what the sum's
    # backward would pass on), one node less per step
    values.backward(seed if seed.dtype == values.dtype else torch.ones_like(values))
    return values, logits.grad


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


def _mean_train_loss(step_values, n: int, bs: int, rows_per_epoch: int) -> list[float]:
    """Each run's mean train loss of an epoch from its steps' losses (one R-vector a step):
    weighted by the batch sizes, in float64 and in step order (what a running float64 total
    would hold)."""
    out = []
    for per_step in torch.stack(step_values).double().T.tolist():
        total = 0.0
        for j, v in enumerate(per_step):
            total += v * (min(n, (j + 1) * bs) - j * bs)
        out.append(total / rows_per_epoch)
    return out


def _val_scores(model: StackedLinear, views, xv, yv, live: list, config: TrainConfig) -> dict:
    """``{run: val score}`` of the live runs (``config.metric``; ``{}`` when none is live)."""
    if not live:
        return {}
    conv, metric = config.map_convention, config.metric
    if is_stored(xv):
        # stored val rows: the runs' val logits from one read, or one run's at a time
        # (`_stored_val_logits`); each run scored alone (no R x N x L float64)
        logits_of = _stored_val_logits(model, views, xv)
        return {r: val_map(logits_of(r), yv, conv, metric) for r in live}
    logits_v = model.predict(xv)[live]
    if metric == "map":
        vals = stacked_val_map(logits_v, yv, conv)
    else:  # another metric: each run's own (the single run's val_map)
        vals = [val_map(s_, yv, conv, metric) for s_ in logits_v]
    return dict(zip(live, vals))


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
    runs = len(configs)
    observed, ks = _check_stack(observed, losses, configs, k)
    on_epoch = list(on_epoch or [None] * runs)
    checkpoint = list(checkpoint or [None] * runs)
    config = configs[0]
    device = torch.device(config.device)
    x, z, xv, yv = linear_inputs(x_train, observed[0], x_val, y_val, config)
    z_of = {id(observed[0]): z}  # each distinct observed matrix, checked once
    for z_ in observed:
        if id(z_) not in z_of:
            z_of[id(z_)] = linear_inputs(x_train, z_, None, None, config)[1]
            if z_of[id(z_)].shape != z.shape:
                raise ValueError(f"stacked runs' observed labels differ in shape: "
                                 f"{tuple(z.shape)} and {tuple(z_of[id(z_)].shape)}")
    has_val = xv is not None
    n, num_classes = z.shape
    # runs of one seed draw the same batches: with at least SHARE_ROWS runs per seed, and as
    # many for every seed, they share their rows (StackedLinear's ``shared``: one product per
    # seed; the features gathered once per seed) and are ordered by seed, then learning rate;
    # else by learning rate. Results are handed back in the callers' order.
    per_seed = Counter(c.seed for c in configs)
    shared = per_seed[configs[0].seed] if len(set(per_seed.values())) == 1 else 1
    shared = shared if shared >= SHARE_ROWS else 1
    order = sorted(range(runs), key=lambda r: (configs[r].seed, configs[r].lr,
                                               configs[r].weight_decay) if shared > 1
                   else (configs[r].lr, configs[r].weight_decay))
    cfgs = [configs[r] for r in order]
    loss_list = [losses[r].to(device) for r in order]
    z_list = [z_of[id(observed[r])] for r in order]
    for loss, c, z_, k_ in zip(loss_list, cfgs, z_list, [ks[r] for r in order]):
        loss.on_train_start(z_, TrainInfo(n, num_classes, k_, c.seed, c.epochs))
    heads = [make_linear_head(x.shape[1], num_classes, c.seed).to(device) for c in cfgs]
    model = StackedLinear(heads, shared)
    # the loss's state stacked along a leading run dimension, in a copy of the first module
    slots = _state_tensors(loss_list[0])
    stacked = copy.deepcopy(loss_list[0])
    stacked_slots = _state_tensors(stacked)

    def restack(first: bool = False):  # the runs' loss modules -> the stack (after hooks)
        with torch.no_grad():
            for i, (owner, name, is_param) in enumerate(stacked_slots):
                values = [getattr(_state_tensors(l_)[i][0], name) for l_ in loss_list]
                current = getattr(owner, name)
                if not first and current.shape == (runs, *values[0].shape):
                    for r, v in enumerate(values):
                        current[r].copy_(v)
                elif is_param:
                    owner._parameters[name] = nn.Parameter(
                        torch.stack([v.detach() for v in values]),
                        requires_grad=values[0].requires_grad)
                else:
                    owner._buffers[name] = torch.stack(values)

    def unstack():  # the stack -> the runs' loss modules (before their hooks, a snapshot)
        with torch.no_grad():
            for i, (owner, name, _) in enumerate(stacked_slots):
                current = getattr(owner, name)
                for r, l_ in enumerate(loss_list):
                    getattr(_state_tensors(l_)[i][0], name).copy_(current[r])

    restack(first=True)
    stateful = bool(slots)
    # a closed-form BCE loss (SPMLLoss.closed_form): the step's gradient without autograd, from
    # the targets and weights of every train row, gathered with the features
    closed = all(closed_form(loss) for loss in loss_list)
    # a loss whose stacked gradient is written by hand (ROLE, PR): no autograd either
    manual = not closed and getattr(stacked, "manual_gradient", False) and \
        stacked.reduction == "mean" and stacked.eps == 0 and \
        type(stacked).penalty is SPMLLoss.penalty
    offsets = None  # per run, the first row of its targets in the stacked tables
    if closed:
        tables, offsets, count = _closed_form_tables(loss_list, z_list, torch.float32
                                                     if is_stored(x) else x.dtype)
        tables = [x, *tables]
    else:
        tables = [x, z]
    lrs = [c.lr for c in cfgs]
    loss_params = [p for p in stacked.parameters() if p.requires_grad]
    # the head's gradient is computed here from the logits' (one batched product), into these
    grad_w, grad_b = torch.zeros_like(model.weight), torch.zeros_like(model.bias)
    wds = [c.weight_decay for c in cfgs]
    groups = [(list(model.parameters()), lrs, [grad_w, grad_b], wds, [True, False])]
    # each run's groups as its single run's LeanAdam has them (make_optimizer: with weight
    # decay, the weights' group and the biases')
    run_groups = [[([model.weight], c.lr), ([model.bias], c.lr)] if c.weight_decay else
                  [(list(model.parameters()), c.lr)] for c in cfgs]
    if loss_params:
        groups.append((loss_params, [lr * stacked.lr_multiplier for lr in lrs], None))
        for r, c in enumerate(cfgs):
            run_groups[r].append((loss_params, c.lr * stacked.lr_multiplier))
    opt = _StackedAdam(groups)
    row_groups = runs // shared  # one batch order each
    gens = [torch.Generator().manual_seed(cfgs[g * shared].seed) for g in range(row_groups)]
    bs = config.batch_size
    starts = batch_starts(n, bs, config.drop_last)  # (train.drop_last: no last short batch)
    rows_per_epoch = epoch_rows(n, bs, config.drop_last)
    metric = config.metric
    # rows gathered at once for the coming steps (every run's, a multiple of the batch size):
    # one indexing of the features and labels per chunk instead of two per step, within
    # GATHER_BYTES of features (yeast: a whole epoch)
    # (stored features: read from the store in file order, as float32)
    width = x.shape[1] * (4 if is_stored(x) else x.element_size())
    chunk = max(1, GATHER_BYTES // max(1, row_groups * width) // bs) * bs
    # each run's best epoch, early stopping and history, as train_loop keeps a single run's
    books = [Selection(config.early_stop, metric, validated=has_val) for _ in range(runs)]
    errors: list = [None] * runs  # what ended a run (it diverged, its callback raised)
    views = [model.run_head(r) for r in range(runs)]

    def run_checkpoint_state(r: int) -> dict:  # the single-run format (train_loop's)
        return books[r].state_dict(
            format=STATE_FORMAT, stages=[[None, int(cfgs[r].epochs)]], stage=0,
            model={"weight": model.weight.detach()[r], "bias": model.bias.detach()[r]},
            loss=loss_list[r].state_dict(), optimizer=opt.run_state(r, run_groups[r]),
            parts={}, run={"batch_order": {"state": gens[r // shared].get_state()}},
            seconds=time.perf_counter() - start)

    def keep(r: int) -> tuple:  # copies of run r's weights and loss state (a new best)
        return ({"weight": model.weight.detach()[r].clone(),
                 "bias": model.bias.detach()[r].clone()},
                copy.deepcopy(loss_list[r].state_dict()))

    with observed_validated(stacked):
        for epoch in range(config.epochs):
            live = [r for r in range(runs) if not books[r].stage_done and errors[r] is None]
            if not live:
                break
            for r in live:
                loss_list[r].on_epoch_start(epoch)
            stacked.on_epoch_start(epoch)
            if stateful:
                restack()
            perms = torch.stack([torch.randperm(n, generator=g) for g in gens]).to(device)
            step_values = []  # R losses per step, summed once the epoch is over
            seed = torch.ones(runs, device=device)
            for i in starts:
                idx = perms[:, i:i + bs]  # each row group's rows; the features are gathered
                # once per group, the labels per run (its own table: offsets)
                if shared > 1:
                    idx = idx.repeat_interleave(shared, 0)
                if i + bs > n:  # the last, shorter batch
                    parts = [gather(t, perms[:, i:i + bs] if j == 0 else
                                    idx if offsets is None else idx + offsets)
                             for j, t in enumerate(tables)]
                else:
                    if i % chunk == 0:  # the coming full steps' rows of every run, at once
                        steps = min(chunk, n - i) // bs
                        rows = perms[:, i:i + steps * bs].reshape(
                            row_groups, steps, bs).transpose(0, 1)
                        run_rows = rows.repeat_interleave(shared, 1) if shared > 1 else rows
                        coming = [gather(t, rows if j == 0 else run_rows if offsets is None
                                         else run_rows + offsets) for j, t in enumerate(tables)]
                    parts = [c[(i % chunk) // bs] for c in coming]
                xb = parts[0]
                if closed:
                    with torch.no_grad():
                        target = parts[1].to(xb.dtype)  # (a uint8 table: exact)
                        weight = parts[2].to(xb.dtype) if len(parts) > 2 else None
                        values, g = _closed_form_step(model(xb), target, weight, count,
                                                      stacked.reduction)
                elif manual:
                    with torch.no_grad():
                        values, g = stacked.stacked_step(model(xb), parts[1], idx)
                else:
                    values, g = _autograd_step(model, stacked, xb, parts[1], idx, loss_params,
                                               seed)
                    if seed.dtype != values.dtype:
                        seed = torch.ones_like(values)
                model.head_grads(g, xb, grad_w, grad_b)
                if model.weight.grad is not None:  # a penalty on the head's weights
                    grad_w.add_(model.weight.grad)
                    model.weight.grad = None
                if model.bias.grad is not None:
                    grad_b.add_(model.bias.grad)
                    model.bias.grad = None
                opt.step()
                step_values.append(values.detach())
            # each run's mean train loss: its steps' losses weighted by their batch sizes, in
            # float64 and in step order (what a running float64 total would hold)
            train_loss = _mean_train_loss(step_values, n, bs, rows_per_epoch)
            if stateful:
                unstack()
            train_all = model.predict(x) if stacked.needs_train_predictions else None
            for r in live:
                if not np.isfinite(train_loss[r]):
                    errors[r] = FloatingPointError(diverged(epoch + 1, train_loss[r]))
                    continue
                try:
                    loss_list[r].on_epoch_end(epoch, None if train_all is None else train_all[r])
                except Exception as err:  # noqa: BLE001 (this run fails; the others go on)
                    errors[r] = err
            if stateful:
                restack()
            live = [r for r in live if errors[r] is None]
            scores = _val_scores(model, views, xv, yv, live, config) if has_val else {}
            for r in live:
                record = {"epoch": epoch + 1, "train_loss": train_loss[r]}
                if has_val:
                    record[books[r].key] = scores[r]
                books[r].end_epoch(record, epoch=epoch + 1, stage_epochs=cfgs[r].epochs,
                                   value=scores.get(r), keep=lambda r=r: keep(r),
                                   source="model" if has_val else None)
                try:
                    if on_epoch[order[r]] is not None:
                        on_epoch[order[r]](record, views[r], loss_list[r])
                except Exception as err:  # noqa: BLE001 (the run's own callback)
                    errors[r] = err
                finally:
                    if checkpoint[order[r]] is not None:
                        checkpoint[order[r]](lambda r=r: run_checkpoint_state(r))
    seconds = (time.perf_counter() - start) / runs  # each run's share of the group's time
    return _outcomes(books, errors, order, loss_list, (x.shape[1], num_classes, device), seconds)


def _outcomes(books, errors, order, loss_list, head_shape, seconds: float) -> list:
    """Per run, in the callers' order (``order``: the stack's run -> the caller's), its best
    epoch's ``(nn.Linear, FitResult)`` with its loss module set to that epoch's state, or the
    exception that ended it (a ValueError when no epoch had a finite score)."""
    in_features, num_classes, device = head_shape
    out: list = [None] * len(books)
    for r, book in enumerate(books):
        if errors[r] is None:
            try:
                weights, loss_state = book.best_weights()
            except ValueError as err:  # no epoch had a finite score
                errors[r] = err
        if errors[r] is not None:
            out[order[r]] = errors[r]
            continue
        head = nn.Linear(in_features, num_classes).to(device)
        head.load_state_dict(weights)
        loss_list[r].load_state_dict(loss_state)
        out[order[r]] = (head, FitResult(**book.result_fields(), seconds=seconds))
    return out
