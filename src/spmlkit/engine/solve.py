"""Heads on fixed features solved, not trained: full-batch L-BFGS to a stated tolerance along a
regularisation path, warm-started and selected on val (as scikit-learn's `LogisticRegressionCV`
and glmnet do).

The objective of a head ``f`` (linear, or the MLP head) with loss ``l`` on the whole train
split at once (B = N) is::

    J(W) = L * l(f(X), Z) + lam / 2 * ||W||^2

``l`` is the loss's ``"mean"`` value (over N x L entries, plus its own penalties), so ``L * l``
is the per-class mean summed over the classes; ``||W||^2`` sums the squares of the head's weight
matrices (not its biases, nor a loss's own state). For AN this is scikit-learn's one-vs-rest
``LogisticRegression`` exactly: per class ``mean_i logloss + ||w||^2 / (2 C N)``, so
``lam = 1 / (C N)`` (`lam_from_c`): the same C gives the same model (``tests/test_solve.py``
checks probabilities to 1e-4 and coefficients to 1e-3 on yeast and a random problem).

The solver is SciPy's L-BFGS-B (the one scikit-learn's ``lbfgs`` uses) on a float64 copy of the
features (float32 from `FLOAT32_ENTRIES` entries on: the same iterations, a third of the CPU),
with the value and gradient from autograd through the loss itself (any loss of the registry, no
second formula; the BCE family's closed form, the same function, skips autograd), stopped when
the largest gradient entry is below ``tol`` or the value stops decreasing (relative ``ftol``),
or at ``max_iter`` iterations; each solve records its iterations, evaluations, final gradient
norm and whether it converged. One solve per head over every class at once: stacking several
runs' heads into one L-BFGS problem (one line search for all) cost 1.3 to 1.9x the CPU of
solving them one after another on yeast (benchmarks/solver_stacking.py), so they are solved one
after another.

How each loss is solved (`solver_form`):

- ``"solved"``: a smooth loss without epoch hooks (AN, AN-LS, WAN, EPR, EM, BCE, focal, ASL,
  Hill, ZLPR, OPML, L2R, ...): one solve per value of the path.
- ``"rounds"``: a loss whose terms change between epochs (hooks ``on_epoch_start`` /
  ``on_epoch_end``: LL-R / LL-Ct, EM+APL, GR, SPLC, soft OPML, CRISP, ...) or that computes part
  of its value without gradient (``SPMLLoss.solver_rounds``: VPU): ``rounds`` warm-started
  solves, round ``r`` playing epoch ``r`` (``on_epoch_start(r)``, the solve, then
  ``on_epoch_end(r, train logits)``); the schedules span ``rounds`` epochs
  (``TrainInfo.num_epochs``). The analogy and its limits: an epoch of many small steps becomes
  one solve to convergence, so a pseudo-label or correction that the papers add gradually is
  added from a converged model; a term that is recomputed from the logits inside ``forward``
  (the large-loss selection, GR's weights) moves during a round's solve, whose line search then
  minimises a piecewise objective and may stop before ``tol`` (the record says so). A loss with
  its own trainable state (ROLE's label estimates) alternates: the head with the estimates held,
  then the estimates with the head held (``solver_objectives``: the two halves of its loss,
  whose stop-gradients make it no single objective), ``rounds`` times.
- ``"refused"``: a loss the solver cannot minimise says why (``SPMLLoss.solver_refusal``: PR's
  hinge, L1R's kink, LL-Cp's flips inside ``forward``); train it with Adam.

The path (`solve_path`): ``C`` from small to large (strong regularisation to weak, as
``LogisticRegressionCV`` and glmnet go), each solve warm-started from the previous one's
weights (a round loss's state is rebuilt for each value; ROLE's estimates carry over), val
scored after each (full or partial val labels, `spmlkit.engine.val_map`), the best kept (the
first of equal scores), and the path stopped once val has clearly turned: ``patience`` values
in a row more than `TURN` below the best (a flat stretch at strong regularisation, where the
weights are small and rank alike, does not stop it).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..losses import SPMLLoss, TrainInfo, hooks_driven, observed_validated
from .linear import linear_inputs, predict_logits, val_map
from .loop import FitResult

__all__ = ["C_PATH", "FORMS", "PathResult", "SolveRecord", "lam_from_c", "solve_head",
           "solve_path", "solver_form", "turned_since"]

#: the default path of C: 10^-4 ... 10^4 in half decades (17 values; the scikit-learn reference
#: rows' grid, so the two search the same models)
C_PATH = tuple(float(c) for c in np.logspace(-4, 4, 17))
#: the ``format`` of a path's resumable state
STATE_FORMAT = "spmlkit-solve-state/1"
#: how a loss runs under the solver (`solver_form`)
FORMS = ("solved", "rounds", "refused")
#: the solver's defaults: the largest gradient entry at convergence (1e-4: scikit-learn's
#: ``LogisticRegression`` default ``tol``, on the same per-class scale; 1e-5 took 3.8x the
#: iterations on yeast's path for val mAPs equal to 0.01), the relative decrease of the value
#: below which it stops, the iterations of one solve, the rounds of a round loss
TOL = 1e-4
FTOL = 1e-10
MAX_ITER = 500
ROUNDS = 5
#: train entries (rows x features) from which `solve_path` evaluates in float32
FLOAT32_ENTRIES = 1_000_000
#: the largest gradient entry a solve may end with before the problem is called badly scaled
#: (a solve that merely stops short of the tolerance is recorded as such; one that ends with a
#: gradient this large was given features of 1e38 or the like)
BADLY_SCALED = 1e8
#: val scores in a row clearly below the best (by more than `TURN`) after which the path stops
PATIENCE = 3
#: how far below the best a val score (mAP points, or the metric's own units) counts as turned
TURN = 0.1


def turned_since(since: int, score: float, best: float) -> int:
    """How many val scores in a row have been clearly below the best, after ``score`` (higher is
    better; ``best`` the best so far, this one included): ``since + 1`` where ``score`` is more
    than `TURN` below ``best`` (or not finite), else 0. A path stops once this reaches its
    patience (`PATIENCE`): a flat stretch at strong regularisation, where the weights are small
    and rank alike, does not stop it. The solver's path and the scikit-learn reference rows
    (`spmlkit.experiments.reference`) stop by this one rule.

    >>> [turned_since(s, v, 45.0) for s, v in ((0, 44.95), (0, 44.5), (1, float("nan")))]
    [0, 1, 2]
    """
    return since + 1 if not (math.isfinite(score) and score >= best - TURN) else 0


def lam_from_c(c: float, n: int) -> float:
    """The L2 strength ``lam`` of `solve_head` that gives scikit-learn's ``C`` on ``n`` train rows:
    ``1 / (C n)`` (its objective per class is ``C * sum_i logloss + ||w||^2 / 2``, ours the
    mean over rows plus ``lam / 2 * ||w||^2``).

    >>> lam_from_c(0.5, 1000)
    0.002
    """
    if not (isinstance(c, (int, float, np.floating)) and math.isfinite(c) and c > 0):
        raise ValueError(f"C (the inverse L2 strength, scikit-learn's) must be a number > 0, "
                         f"got {c!r}")
    return 1.0 / (float(c) * int(n))


def _spml_parts(loss: nn.Module):
    return [m for m in loss.modules() if isinstance(m, SPMLLoss)]


def solver_form(loss: SPMLLoss) -> tuple[str, str]:
    """``(form, why)``: how the solver runs ``loss`` (one of `FORMS`; module docstring).

    >>> from spmlkit.losses import create_loss
    >>> [solver_form(create_loss(n))[0] for n in ("an", "ll_r", "role", "pr")]
    ['solved', 'rounds', 'rounds', 'refused']
    """
    parts = _spml_parts(loss)
    for part in parts:
        if part.solver_refusal:
            return "refused", f"{type(part).__name__}: {part.solver_refusal}"
    own = [p for p in loss.parameters() if p.requires_grad]
    if own:
        if not callable(getattr(loss, "solver_objectives", None)):
            return "refused", (f"{type(loss).__name__} has trainable state of its own and no "
                               f"solver_objectives (its two halves) to alternate on")
        return "rounds", "its own trainable state alternates with the head (solver_objectives)"
    hooks = set(loss.required_hooks())
    if hooks & {"on_epoch_start", "on_epoch_end"}:
        return "rounds", f"its terms follow the epoch ({', '.join(sorted(hooks))})"
    if any(part.solver_rounds for part in parts):
        return "rounds", "it computes part of its value from the logits without gradient"
    return "solved", "a smooth objective of the head's weights"


@dataclass
class SolveRecord:
    """One solve of the path: its ``C`` and ``lam``, the val score after it (NaN without
    val), the L-BFGS iterations and evaluations (summed over rounds and blocks), the objective
    and the largest gradient entry at its end, whether every solve in it met its tolerance,
    and its seconds."""

    c: float
    lam: float
    val_score: float
    iterations: int
    evaluations: int
    objective: float
    grad_max: float
    converged: bool
    seconds: float
    message: str = ""

    def to_dict(self) -> dict:
        return dict(vars(self))


@dataclass
class PathResult:
    """What `solve_path` returns beside the model: the path's records, the index of the
    selected one (``best``), the loss's form, and the fit as a `FitResult` (``best_epoch`` the
    1-based position of the selected C; a history record per C) for run folders."""

    records: list = field(default_factory=list)
    best: int = 0
    form: str = "solved"
    metric: str = "map"
    seconds: float = 0.0
    stopped_early: bool = False

    @property
    def c(self) -> float:
        return self.records[self.best].c

    @property
    def lam(self) -> float:
        return self.records[self.best].lam

    def fit_result(self) -> FitResult:
        history = [{"epoch": i + 1, "C": r.c, "lambda": r.lam, "val_score": r.val_score,
                    **({"val_map": r.val_score} if self.metric == "map" else {}),
                    "train_loss": r.objective, "iterations": r.iterations,
                    "evaluations": r.evaluations, "grad_max": r.grad_max,
                    "converged": r.converged, "seconds": r.seconds}
                   for i, r in enumerate(self.records)]
        score = self.records[self.best].val_score
        return FitResult(best_epoch=self.best + 1,
                         val_map=score if self.metric == "map" else float("nan"),
                         history=history, seconds=self.seconds,
                         stopped_early=self.stopped_early, metric=self.metric,
                         val_score=score, best_source="model" if math.isfinite(score) else None)


def _weights(model: nn.Module) -> list[torch.Tensor]:
    """The head's weight matrices (what the L2 term covers): parameters of 2 or more dims."""
    return [p for p in model.parameters() if p.ndim >= 2]


class _Flat:
    """Parameters as one float64 vector for SciPy, and back."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params

    def get(self) -> np.ndarray:
        return torch.cat([p.detach().reshape(-1) for p in self.params]).double().numpy().copy()

    def set(self, w: np.ndarray) -> None:
        flat = torch.from_numpy(w)
        i = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[i:i + n].view_as(p))
                i += n

    def grad(self) -> np.ndarray:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params]).double().numpy()


def _lbfgs(params: list[torch.Tensor], objective: Callable[[], torch.Tensor], tol: float,
           max_iter: int, ftol: float = FTOL):
    """Minimise ``objective()`` over ``params`` (L-BFGS-B, SciPy): ``(iterations, evaluations,
    value, largest gradient entry, converged, message)``; the parameters hold the solution.

    SciPy's BLAS runs single-threaded here (`threadpoolctl`, SciPy imported first so that its
    library is limited): L-BFGS-B's own vectors are a few thousand entries, where a second
    thread only waits, and on busy cores its spinning made an iteration 20x slower (0.86 ms
    against 0.04 ms on movies' 105 weights)."""
    from scipy.optimize import minimize
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        return _minimize(minimize, params, objective, tol, max_iter, ftol)


def _minimize(minimize, params, objective, tol, max_iter, ftol):
    flat = _Flat(params)
    last = {}

    def fun(w):
        flat.set(w)
        for p in params:
            p.grad = None
        with torch.enable_grad():
            value = objective()
            if value.requires_grad:  # (a closed-form objective wrote its gradients itself)
                value.backward()
        v = float(value.detach())
        g = flat.grad()
        if not (math.isfinite(v) and np.isfinite(g).all()):
            # a step into overflow: SciPy's line search backs off from an infinite value
            return float("inf"), np.zeros_like(g)
        last["v"], last["g"] = v, g
        return v, g

    res = minimize(fun, flat.get(), jac=True, method="L-BFGS-B",
                   options={"maxiter": int(max_iter), "gtol": float(tol), "ftol": float(ftol),
                            "maxcor": 20, "maxls": 40})
    flat.set(res.x)
    g = last.get("g")
    grad_max = float(np.abs(g).max()) if g is not None and g.size else 0.0
    message = res.message if isinstance(res.message, str) else str(res.message)
    return (int(res.nit), int(res.nfev), float(res.fun), grad_max,
            bool(grad_max <= tol or res.success), message)


def solve_head(model: nn.Module, x: torch.Tensor, z: torch.Tensor, loss: SPMLLoss, lam: float,
               *, rounds: int = ROUNDS, tol: float = TOL, max_iter: int = MAX_ITER,
               form: str | None = None) -> dict:
    """Minimise ``L * loss(model(x), z) + lam / 2 * ||W||^2`` over ``model``'s parameters
    (module docstring) from where they are (a warm start), the loss's hooks already started
    (``on_train_start``). A round loss runs ``rounds`` rounds. Returns the solve's record
    fields (iterations, evaluations, objective, grad_max, converged, message).

    ``x`` and the model in float64 give results to the tolerance; ``z`` the validated
    observed labels (N x L)."""
    form = form or solver_form(loss)[0]
    if form == "refused":
        raise ValueError(f"the solver cannot minimise this loss: {solver_form(loss)[1]}")
    n, classes = z.shape
    index = torch.arange(n, device=z.device)
    weights = _weights(model)
    head_params = [p for p in model.parameters() if p.requires_grad]
    own = [p for p in loss.parameters() if p.requires_grad]
    wants_penalty = "penalty" in loss.required_hooks()

    def l2():
        return 0.5 * lam * sum((w * w).sum() for w in weights) if lam else 0.0

    def head_value():
        out = classes * loss(model(x), z, index=index)
        if wants_penalty:
            out = out + classes * loss.penalty(model)
        return out + l2()

    split = getattr(loss, "solver_objectives", None) if own else None
    fast = _closed_form_value(model, x, z, loss, lam, classes)
    if fast is not None:  # the BCE family on a linear head: value and gradient by hand
        head_value = fast
    total = {"iterations": 0, "evaluations": 0, "converged": True, "message": ""}

    def add(out):
        it, ev, value, gmax, ok, msg = out
        total["iterations"] += it
        total["evaluations"] += ev
        total["converged"] &= ok
        total.update(objective=value, grad_max=gmax)
        if not ok:
            total["message"] = msg

    count = rounds if form == "rounds" else 1
    with observed_validated(loss), hooks_driven(loss):
        loss.train()
        for r in range(count):
            loss.on_epoch_start(r)
            if split is None:
                add(_lbfgs(head_params + own, head_value, tol, max_iter))
            else:  # the head with the estimates held, then the estimates with the head held
                for p in own:
                    p.requires_grad_(False)
                add(_lbfgs(head_params, lambda: classes * split(model(x), z, index)[0] + l2(),
                           tol, max_iter))
                for p in own:
                    p.requires_grad_(True)
                with torch.no_grad():
                    logits = model(x)
                add(_lbfgs(own, lambda: classes * split(logits, z, index)[1], tol, max_iter))
            with torch.no_grad():
                train_logits = model(x) if loss.needs_train_predictions else None
            loss.on_epoch_end(r, train_logits)
    if split is not None:  # the record's objective: the whole loss at the end
        with torch.no_grad():
            total["objective"] = float(head_value())
    return total


def _closed_form_value(model, x, z, loss, lam, classes):
    """For a `spmlkit.engine.vectorised.closed_form` loss (AN, AN-LS, WAN, EPR, BCE, ...) on a
    linear head: the objective as a function whose gradients are written by hand (the loss
    contract's `spmlkit.losses.SPMLLoss.closed_form_step`, the logits' gradient
    ``weight * (sigmoid(s) - target) / (N L)`` plus EPR's count term; then ``X^T G``), without
    autograd: a solve's evaluation costs about half as much (benchmarks/solver_tables.py). The
    value is the same function (``tests/test_solve.py`` compares the two)."""
    from .vectorised import closed_form

    if not isinstance(model, nn.Linear) or not closed_form(loss) or loss.reduction != "mean":
        return None
    with torch.no_grad():
        target, weight = loss.bce_form(z)
        target = target.to(x.dtype).unsqueeze(0)
        weight = None if weight is None else weight.to(x.dtype).unsqueeze(0)
        count = loss.count_penalty()
        if count is not None:
            count = (torch.tensor([float(count[0])], dtype=x.dtype),
                     torch.tensor([float(count[1])], dtype=x.dtype))

    def value():
        with torch.no_grad():
            s = torch.addmm(model.bias, x, model.weight.t()).unsqueeze(0)
            values, g = loss.closed_form_step(s, target, weight, count)
            g = g[0].mul_(classes)
            model.weight.grad = g.t() @ x
            model.bias.grad = g.sum(dim=0)
            out = classes * values[0]
            if lam:
                model.weight.grad.add_(model.weight, alpha=lam)
                out = out + 0.5 * lam * (model.weight * model.weight).sum()
        return out  # no graph: the gradients are written above

    return value


def _fresh_state(loss: SPMLLoss, z: torch.Tensor, info: TrainInfo, keep_own: bool) -> None:
    """Start the loss's state for the next value of the path: its buffers afresh
    (``on_train_start``), its own trainable state (ROLE's estimates) kept when ``keep_own``."""
    saved = [(p, p.detach().clone()) for p in loss.parameters() if p.requires_grad] \
        if keep_own else []
    loss.on_train_start(z, info)
    with torch.no_grad():
        for p, value in saved:
            if p.shape == value.shape:
                p.copy_(value)


def solve_path(x_train, observed, loss: SPMLLoss, *, x_val=None, y_val=None, c=C_PATH,
               k: float | None = None, seed: int = 0, model: nn.Module | None = None,
               head: str = "linear", hidden: int = 256, rounds: int = ROUNDS, tol: float = TOL,
               max_iter: int = MAX_ITER, patience: int = PATIENCE, metric: str = "map",
               map_convention: str = "present",
               on_solve: Callable[[SolveRecord], None] | None = None,
               checkpoint: Callable[[Callable[[], dict]], None] | None = None,
               resume: dict | None = None, dtype: torch.dtype | None = None
               ) -> tuple[nn.Module, PathResult]:
    """Solve the head for each ``C`` of ``c`` (one number, or the path; increasing order is
    used) and keep the best on val.

    Args:
        x_train: N x D train features (the solver holds them in memory as float64: stored
            features are read whole when that fits the memory budget).
        observed: N x L observed labels (1 / 0 / -1).
        loss: a registered loss (`solver_form` must not refuse it).
        x_val, y_val: validation features and labels (full 0/1, or partial wrapped by
            `spmlkit.metrics.partial_labels`); required for a path of more than one C.
        c: scikit-learn's ``C`` (`lam_from_c`), a number or a sequence (default `C_PATH`).
        k: expected positives per example (`TrainInfo`).
        seed: the head's initial weights (the first solve's start; a convex loss ends at the
            same optimum from any start) and a loss's own draws (ROLE's initial estimates).
        model: start from this head (float32 or float64; returned in float32).
        head: ``"linear"`` or ``"mlp"`` (`spmlkit.models.heads`, ``hidden`` units).
        rounds, tol, max_iter: module docstring.
        patience: val scores in a row more than `TURN` below the best after which the path
            stops.
        metric, map_convention: the val score (`spmlkit.engine.val_map`).
        on_solve: called with each `SolveRecord` as it finishes (progress).
        checkpoint: called after each solve (after ``on_solve``) as ``checkpoint(state_fn)``,
            ``state_fn()`` the resumable state of the path (`STATE_FORMAT`: the records so far,
            the head and the loss's state, the best so far), as the engine's fits call theirs.
        resume: such a state: the path continues after its last solve, with the same
            arguments, and ends as the uninterrupted path (the solves are deterministic).
        dtype: what the objective is evaluated in (L-BFGS's own vectors are float64 always):
            None picks float64 below `FLOAT32_ENTRIES` train entries (rows x features) and
            float32 from there (the 20,000 x 150 table of benchmarks/solver_scale.py: the same
            iterations and val mAPs, 1.6 to 3x less CPU).

    Returns:
        ``(model, result)``: the head at the selected C (float32, eval mode) and a
        `PathResult`.

    Raises:
        ValueError: a refused loss (naming why), stored features whose float64 copy does not
            fit in memory, a path without val, a bad C, mismatched inputs.
    """
    from .config import TrainConfig

    start = time.perf_counter()
    cs, form = _path_settings(c, loss, rounds, tol, max_iter, patience)
    x_train, x_val = _in_memory(x_train, "train"), _in_memory(x_val, "val")
    config = TrainConfig(seed=seed, metric=metric, map_convention=map_convention)
    x, z, xv, yv = linear_inputs(x_train, observed, x_val, y_val, config)
    if len(cs) > 1 and xv is None:
        raise ValueError(f"a path of {len(cs)} values of C is selected on val: give x_val and "
                         f"y_val, or one C")
    for value in cs:
        lam_from_c(value, len(x))
    n, classes = z.shape
    model, dtype = _start_head(model, head, hidden, seed, x, classes, dtype)
    loss = loss.to(dtype)
    x = x.to(dtype)
    xv = None if xv is None else xv.to(dtype)
    info = TrainInfo(n, classes, k, seed, rounds if form == "rounds" else 1)
    result = PathResult(form=form, metric=metric)
    best_score, best_state, since = -math.inf, None, 0
    lower = metric != "map" and _lower_is_better(metric)
    done = 0
    if resume is not None:
        best_score, best_state, since = _resumed(resume, cs, result, model, loss)
        done = len(result.records)

    def state():
        return {"format": STATE_FORMAT, "c": list(cs),
                "records": [r.to_dict() for r in result.records], "best": result.best,
                "best_score": best_score, "since": since,
                "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                "loss": {k: v.detach().cpu().clone() for k, v in loss.state_dict().items()},
                "best_model": best_state[0], "best_loss": best_state[1]}

    for i, value in enumerate(cs):
        if i < done:
            continue
        t0 = time.perf_counter()
        _fresh_state(loss, z, info, keep_own=i > 0)
        loss.to(dtype)  # state built by on_train_start (float32) joins the solve's dtype
        lam = lam_from_c(value, n)
        out = solve_head(model, x, z, loss, lam, rounds=rounds, tol=tol, max_iter=max_iter,
                         form=form)
        score = float("nan")
        if xv is not None:
            score = val_map(predict_logits(model, xv), yv, map_convention, metric)
        record = _checked_record(SolveRecord(
            value, lam, score, out["iterations"], out["evaluations"], out["objective"],
            out["grad_max"], out["converged"], time.perf_counter() - t0, out["message"]), tol)
        result.records.append(record)
        key = -score if lower else score
        if best_state is None or (math.isfinite(key) and key > best_score):
            best_score, best_state = key, _snapshot(model, loss)
            result.best = i
        since = turned_since(since, key, best_score)
        if on_solve is not None:
            on_solve(record)
        if checkpoint is not None:
            checkpoint(state)
        if since >= patience and i + 1 < len(cs):
            result.stopped_early = True
            break
    if xv is not None and not math.isfinite(best_score):
        raise ValueError(f"no value of C gave a finite val {metric} (the solves diverged)")
    model.load_state_dict(best_state[0])
    loss.load_state_dict(best_state[1])
    model = model.float().eval()
    loss.float()
    result.seconds = time.perf_counter() - start
    return model, result


def _path_settings(c, loss: SPMLLoss, rounds, tol, max_iter, patience) -> tuple[list, str]:
    """``(the values of C in increasing order, the loss's solver form)`` of a path, its
    settings checked; an option that does nothing for this loss or path is refused, not
    ignored."""
    values = list(c) if isinstance(c, (list, tuple, np.ndarray)) else [c]
    for value in values:  # a word or a flag is no C (numpy would read "1" and True as 1.0)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float,
                                                                          np.number)):
            raise ValueError(f"C (the inverse L2 strength, scikit-learn's) must be a number > 0 "
                             f"or a sequence of them, got {value!r}")
    cs = sorted(float(v) for v in values)
    if not cs:
        raise ValueError("c: give at least one value of C")
    form, why = solver_form(loss)
    if form == "refused":
        raise ValueError(f"the solver cannot minimise loss {type(loss).__name__}: {why}")
    for name, value in (("rounds", rounds), ("max_iter", max_iter), ("patience", patience)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a number > 0, got {tol!r}")
    if rounds != ROUNDS and form != "rounds":
        raise ValueError(f"rounds={rounds}: loss {type(loss).__name__} is solved in one solve "
                         f"per C ({form}); rounds are for the losses whose terms follow the "
                         f"epoch (spmlkit.engine.solve.solver_form)")
    if patience != PATIENCE and len(cs) == 1:
        raise ValueError(f"patience={patience}: it stops a path of several C, and one C was "
                         f"given")
    return cs, form


def _start_head(model, head: str, hidden: int, seed: int, x, classes: int, dtype):
    """``(the head the path starts from, in training mode, the dtype the objective is
    evaluated in)``: ``model``, or a new ``head`` drawn with ``seed``; ``dtype`` None picks
    float64 below `FLOAT32_ENTRIES` train entries and float32 from there."""
    if model is None:
        from ..models.heads import make_head

        model = make_head(head, x.shape[1], classes, seed, hidden)
    if dtype is None:
        dtype = torch.float64 if x.numel() < FLOAT32_ENTRIES else torch.float32
    return model.to(dtype).train(), dtype


def _resumed(resume, cs: list, result: PathResult, model: nn.Module, loss: SPMLLoss) -> tuple:
    """Load a path's state (`STATE_FORMAT`) into ``result``, ``model`` and ``loss``; returns
    ``(best score, best state, solves since the best)``."""
    if not isinstance(resume, dict) or resume.get("format") != STATE_FORMAT or \
            [float(v) for v in resume.get("c", ())] != cs:
        raise ValueError(f"resume: not a state of this path ({STATE_FORMAT}, C "
                         f"{cs[0]:g} .. {cs[-1]:g})")
    result.records = [SolveRecord(**r) for r in resume["records"]]
    result.best = int(resume["best"])
    model.load_state_dict(resume["model"])
    loss.load_state_dict(resume["loss"])
    return float(resume["best_score"]), (resume["best_model"], resume["best_loss"]), \
        int(resume["since"])


def _checked_record(record: SolveRecord, tol: float) -> SolveRecord:
    """``record`` of a solve that ended finite and not badly scaled; otherwise a
    ``FloatingPointError`` that names what to look at."""
    if not (math.isfinite(record.objective) and record.grad_max <= BADLY_SCALED):
        raise FloatingPointError(
            f"the solve at C={record.c:g} ended with objective {record.objective:.4g} and a "
            f"gradient entry of {record.grad_max:.4g} (tolerance {tol:g}): the problem is "
            f"not solvable as given; look at what the run was given: features with huge "
            f"values (e.g. 1e38: standardise them), a loss's eps or a regulariser's weight")
    return record


def _in_memory(x, split: str):
    """Features as an in-memory array: stored ones (a feature store, a memory map) read whole,
    when their float64 copy fits the memory budget (the solver evaluates every row at once);
    otherwise a ValueError that says to train them with Adam, which reads them chunk by
    chunk."""
    from ..data.rows import as_rows, is_stored
    from ..resources import check_memory

    if x is None or not is_stored(x):
        return x
    rows = as_rows(x)
    check_memory(8.0 * len(rows) * rows.shape[1] * (2 if split == "train" else 1),
                 f"the solver's float64 copy of {len(rows):,} x {rows.shape[1]:,} {split} "
                 f"features", "train them with Adam (--solver adam), which reads stored "
                 "features chunk by chunk")
    out = np.empty(rows.shape, dtype=np.float32)
    for start, block in rows.chunks():
        out[start:start + len(block)] = block
    return out


def _snapshot(model: nn.Module, loss: nn.Module):
    return ({k: v.detach().clone() for k, v in model.state_dict().items()},
            {k: v.detach().clone() for k, v in loss.state_dict().items()})


def _lower_is_better(metric: str) -> bool:
    from ..metrics import higher_is_better

    return not higher_is_better(metric)
