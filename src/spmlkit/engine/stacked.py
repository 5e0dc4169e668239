"""The stacked engine's parts: R linear heads as one module (`StackedLinear`), Adam over
their slices (`StackedAdam`), the rows of every run's batches (`gather`), the closed-form
losses' tables of targets and weights (`closed_form_tables`), the autograd step, each run's mean
train loss and val scores (`stacked_val_map`). `spmlkit.engine.vectorised` trains with them
(`fit_linear_stacked`, its `StackedRuns`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..data import rows as stored_rows
from ..data.rows import as_rows, is_stored
from ..metrics import BLOCK_ENTRIES, check_convention, map_from_ap, per_class_ap, ranked_ap
from .config import TrainConfig
from .linear import predict_logits, to_device, val_map

__all__ = ["StackedAdam", "StackedLinear", "autograd_step", "closed_form_tables", "gather",
           "mean_train_loss", "stacked_val_map", "state_tensors", "val_scores"]

#: stored val rows: every run's val logits (R x N x L float32) from one read of the rows up to
#: this size, else one run's at a time (`_stored_val_logits`)
STORED_VAL_BYTES = 64 * 1024 ** 2
#: rows of the closed-form BCE tables built at once (`closed_form_tables`)
TABLE_ROWS = 65536

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


class StackedAdam:
    """Adam over the stacked parameters: for each (learning rate, weight decay), one call of
    torch's fused kernel on the slices of the runs that train with it (each maximal block of
    consecutive runs with that pair is one slice; runs ordered by them give one slice per
    pair). ``groups``: ``(stacked params, lr per run, gradient buffers or None[, weight decay
    per run, which params it decays])``: a parameter with a buffer takes its gradient from it
    (the head, whose gradient the engine computes itself), else from ``.grad``; weight decay is
    Adam's coupled L2 (the single run's `spmlkit.engine.LeanAdam` group), on the
    params marked (the head's weights, not its biases), in a call of their own when it is not 0.
    Every run takes the same steps: one count, one step tensor per device that every call
    reads (the kernel reads the step; it is counted once a step, not once per parameter)."""

    def __init__(self, groups, betas=(0.9, 0.999), eps=1e-8):
        self.betas, self.eps = betas, eps
        self.calls = []  # (params, [(param, slice)], grad slices or None, m, v, steps, lr, wd)
        self.params = []
        self.moments = {}
        self.count = 0
        self.steps: dict = {}  # device -> the step count the kernel reads
        self._grad_views: dict = {}  # call -> (the .grad tensors sliced, their slices)
        for params, lrs, grads, *decay in groups:
            wds, marked = decay if decay else ([0.0] * len(lrs), [False] * len(params))
            keep = [i for i, p in enumerate(params) if p.requires_grad]
            params = [params[i] for i in keep]
            marked = [marked[i] for i in keep]
            grads = None if grads is None else [grads[i] for i in keep]
            steps = [self.steps.setdefault(p.device, torch.zeros((), device=p.device))
                     for p in params]
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

    def step(self) -> None:
        # (no torch.no_grad: the kernel updates detached views of the parameters, and the
        # moments, steps and gradients are plain tensors; the context cost ~5 us a step)
        self.count += 1
        for step in self.steps.values():
            step.add_(1)
        for c, (pairs, views, grads, m, v, steps, lr, wd) in enumerate(self.calls):
            if grads is None:  # from .grad: its slices, again only when .grad is a new tensor
                held = self._grad_views.get(c)
                if held is None or any(p.grad is not g for (p, _), g in zip(pairs, held[0])):
                    held = ([p.grad for p, _ in pairs], [p.grad[sl] for p, sl in pairs])
                    self._grad_views[c] = held
                grads = held[1]
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


def state_tensors(module: nn.Module) -> list[tuple[nn.Module, str, bool]]:
    """``(owner module, name, is_parameter)`` of every parameter and buffer of ``module``."""
    out = []
    for _, sub in module.named_modules():
        out += [(sub, n, True) for n, p in sub._parameters.items() if p is not None]
        out += [(sub, n, False) for n, b in sub._buffers.items() if b is not None]
    return out


def closed_form_tables(losses, observed, dtype):
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


def autograd_step(model, stacked, xb, zb, idx, loss_params, seed):
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


def mean_train_loss(step_values, n: int, bs: int, rows_per_epoch: int) -> list[float]:
    """Each run's mean train loss of an epoch from its steps' losses (one R-vector a step):
    weighted by the batch sizes, in float64 and in step order (what a running float64 total
    would hold)."""
    values = torch.stack(step_values).double().T.cpu().numpy()  # R x steps
    rows = np.minimum(n, np.arange(1, values.shape[1] + 1) * bs) - np.arange(values.shape[1]) * bs
    # a cumulative sum adds one step after the other: the running total's numbers
    totals = np.cumsum(values * rows, axis=1)[:, -1] if values.shape[1] else np.zeros(len(values))
    return (totals / rows_per_epoch).tolist()


def val_scores(model: StackedLinear, views, xv, yv, live: list, config: TrainConfig) -> dict:
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
