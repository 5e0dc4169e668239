"""``solve``: the linear (or MLP) head on feature vectors solved along a regularisation path
(`spmlkit.engine.solve`), not trained: ``spml train --solver lbfgs`` (``--mode solve``), a
study's ``mode: solve``.

The run's "epochs" are the path's values of C, strong to weak: ``metrics.jsonl`` holds one
record per C (its val score, the solver's iterations, whether it converged), ``best_epoch`` is
the selected C's position and ``final.json`` says its C. Mini-batch settings (epochs, batch
size, learning rate, weight decay, early stopping, drop_last) are Adam's and refused here;
the L2 strength is the path's C (scikit-learn's). The checkpoint after each solve holds the
path so far (`spmlkit.engine.solve.STATE_FORMAT`, with the logged records as its
``history``): a resumed run continues the path and ends as the uninterrupted one.

Options: ``c`` (a number, or the path: default `spmlkit.engine.solve.C_PATH`), ``tol``,
``max_iter``, ``rounds``, ``patience`` (`spmlkit.engine.solve.solve_path`), ``head`` and
``hidden`` (as the linear mode).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..engine.solve import C_PATH, MAX_ITER, PATIENCE, ROUNDS, TOL, solve_path, solver_form
from .contract import Fitted, RunContext, TrainingMethod, feature_preprocess, register_method
from .linear import _features, _probs, load_model

#: the TrainConfig fields Adam reads and the solver does not (refused away from their defaults)
ADAM_FIELDS = ("epochs", "batch_size", "lr", "early_stop", "drop_last", "weight_decay")


def _path(options: dict) -> list[float]:
    c = options["c"]
    return sorted(float(v) for v in (c if isinstance(c, (list, tuple)) else [c]))


def check_values(options: dict) -> None:
    """The solve mode's option check: ``c`` a number > 0 or a list of them, ``tol`` > 0,
    ``max_iter``, ``rounds`` and ``patience`` whole numbers >= 1, the head as the linear
    mode's."""
    from .linear import check_values as linear_check

    c = options["c"]
    values = c if isinstance(c, (list, tuple)) else [c]
    if not values or any(isinstance(v, bool) or not isinstance(v, numbers.Real)
                         or not math.isfinite(v) or v <= 0 for v in values):
        raise ValueError(f"c (the solver's inverse L2 strength, scikit-learn's C) must be a "
                         f"number > 0 or a list of them, got {c!r}")
    tol = options["tol"]
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not tol > 0:
        raise ValueError(f"tol (the solver's tolerance) must be a number > 0, got {tol!r}")
    for key in ("max_iter", "rounds", "patience"):
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{key} must be a whole number >= 1, got {value!r}")
    linear_check(options)


def check_run(splits, config, options: dict, resume=None) -> None:
    """Refused before the run folder is made: a path of several C without val rows."""
    if len(_path(options)) > 1 and splits.val.x is None:
        raise ValueError("a path of several C is selected on val, and these splits have no "
                         "val rows: give one c")


def check_loss(loss, name: str) -> None:
    """Refused before the run folder is made: a loss the solver cannot minimise
    (`spmlkit.engine.solve.solver_form`), named with why."""
    form, why = solver_form(loss)
    if form == "refused":
        raise ValueError(f"--loss {name}: the solver cannot minimise it ({why}); train it "
                         f"with --solver adam")


def fit(ctx: RunContext) -> Fitted:
    splits, options, config = ctx.splits, ctx.options, ctx.config
    check_loss(ctx.loss, ctx.loss_name)
    head = None
    if options["head"] != "linear":
        from ..models.heads import make_head

        head = make_head(options["head"], np.shape(splits.train.x)[1],
                         splits.observed.shape[1], config.seed, options["hidden"])
    logged = list((ctx.resume or {}).get("history") or [])

    def on_solve(record):
        entry = {"epoch": len(logged) + 1, "C": record.c, "lambda": record.lam,
                 "val_score": record.val_score,
                 **({"val_map": record.val_score} if config.metric == "map" else {}),
                 "train_loss": record.objective, "iterations": record.iterations,
                 "evaluations": record.evaluations, "grad_max": record.grad_max,
                 "converged": record.converged, "seconds": record.seconds}
        logged.append(entry)
        ctx.on_epoch(entry, None, ctx.loss)

    def checkpoint(state_fn):
        if ctx.checkpoint is not None:
            ctx.checkpoint(lambda: {**state_fn(), "history": [dict(e) for e in logged]})

    model, path = solve_path(
        _features(splits.train.x), splits.observed, ctx.loss, x_val=splits.val.x,
        y_val=splits.val.y, c=_path(options), k=ctx.k, seed=config.seed, model=head,
        head=options["head"], hidden=options["hidden"], rounds=options["rounds"],
        tol=options["tol"], max_iter=options["max_iter"], patience=options["patience"],
        metric=config.metric, map_convention=config.map_convention, on_solve=on_solve,
        checkpoint=checkpoint, resume=ctx.resume)
    sets = {"train": splits.train.x, "val": splits.val.x, "test": splits.test.x}
    probs = {split: _probs(model, x) for split, x in sets.items()}
    best = {"model": model.state_dict(), "in_features": int(np.shape(splits.train.x)[1]),
            "preprocess": feature_preprocess(splits)}
    if head is not None:
        best.update(head=options["head"], hidden=int(options["hidden"]))
    result = {"C": path.c, "solver": {"form": path.form, "solves": len(path.records),
                                      "iterations": sum(r.iterations for r in path.records),
                                      "converged": all(r.converged for r in path.records),
                                      "stopped_early": path.stopped_early}}
    return Fitted(path.fit_result(), probs, best, result=result)


SOLVE = register_method(TrainingMethod(
    name="solve", description="the linear (or MLP) head on feature vectors solved to a "
    "tolerance along a C path (full-batch L-BFGS, warm starts, C picked on val): AN is "
    "scikit-learn's tuned logistic regression, every smooth loss a step beyond it",
    paper="spmlkit (the solver; AN = one-vs-rest LogisticRegression)", inputs="features",
    fit=fit, load_model=load_model,
    options={"c": list(C_PATH), "tol": TOL, "max_iter": MAX_ITER, "rounds": ROUNDS,
             "patience": PATIENCE, "head": "linear", "hidden": 256},
    check_run=check_run, check_loss=check_loss, check_values=check_values,
    unused_train_fields=ADAM_FIELDS,
    count_epochs=lambda config, options: len(_path(options)),
    default_lr_source="no learning rate: the head is solved, not trained"))
