"""Many solves at once or one after another? (issue 44, item 5)

R solves of the same shape (the benchmark's seeds: one draw of the observed labels each, the
same features) either one after another (what `spmlkit.engine.solve.solve_path` does) or
stacked into ONE L-BFGS problem: the R heads' weights concatenated, the objective their sum (so
each head's gradient is its own), one batched matrix product per evaluation, one line search
for all. The stacked form shares the line search: every iteration moves every head, so it runs
as many iterations as the slowest head needs (and its curvature pairs mix the heads'). This
script measures both on yeast (AN, its closed-form gradient in both, the whole 17-value path
with warm starts, single-threaded), and says which is faster.

    python benchmarks/solver_stacking.py --runs 3,6,12

Writes ``OUT/solver-stacking.csv``.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch


def stacked_path(x, targets, cs, tol=1e-4):
    """The R heads of AN (targets R x N x L, 0/1) solved together at each C of ``cs``,
    warm-started: (CPU seconds, iterations per C)."""
    from scipy.optimize import minimize
    from threadpoolctl import threadpool_limits

    runs, n, classes = targets.shape
    d = x.shape[1]
    w = np.zeros(runs * classes * (d + 1))
    its = []

    def fun(flat, lam):
        params = torch.from_numpy(flat).view(runs, classes, d + 1)
        weight, bias = params[..., :d], params[..., d]
        s = torch.einsum("nd,rld->rnl", x, weight) + bias[:, None, :]
        p = torch.sigmoid(s)
        value = (torch.nn.functional.softplus(s) - targets * s).mean(dim=1).sum() + \
            0.5 * lam * (weight * weight).sum()
        g = (p - targets) / n
        grad_w = torch.einsum("rnl,nd->rld", g, x) + lam * weight
        grad_b = g.sum(dim=1)
        return float(value), torch.cat([grad_w, grad_b[..., None]], dim=-1).reshape(-1).numpy()

    start = time.process_time()
    with threadpool_limits(1, user_api="blas"):
        for c in cs:
            res = minimize(fun, w, args=(1.0 / (c * n),), jac=True, method="L-BFGS-B",
                           options={"gtol": tol, "ftol": 1e-10, "maxcor": 20, "maxls": 40,
                                    "maxiter": 500})
            w = res.x
            its.append(int(res.nit))
    return time.process_time() - start, its


def sequential_path(x, targets, cs):
    """The same R paths one after another with the solver (its closed-form AN)."""
    from spmlkit.engine.solve import solve_path
    from spmlkit.losses import create_loss

    start = time.process_time()
    its = []
    for z in targets:
        _, path = solve_path(x.numpy().astype(np.float32), z.numpy().astype(np.int8),
                             create_loss("an"), c=list(cs) if len(cs) == 1 else cs,
                             x_val=x.numpy()[:50].astype(np.float32),
                             y_val=np.ones((50, z.shape[1]), np.uint8) * 0 + 1, patience=10**6)
        its.append([r.iterations for r in path.records])
    return time.process_time() - start, its


def main(argv=None) -> int:
    from spmlkit.loading import load_splits
    from spmlkit.engine.solve import C_PATH

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="3,6,12")
    p.add_argument("--out", default="runs/solver-stacking")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for r in [int(v) for v in args.runs.split(",")]:
        draws = [load_splits("yeast", "1p", 1200 + s) for s in range(r)]
        x = torch.as_tensor(np.asarray(draws[0].train.x, np.float64))
        targets = torch.as_tensor(np.stack([(d.observed > 0) for d in draws]).astype(np.float64))
        seq, seq_its = sequential_path(x, targets, C_PATH)
        stk, stk_its = stacked_path(x, targets, C_PATH)
        rows.append({"runs": r, "sequential_cpu_s": round(seq, 2), "stacked_cpu_s": round(stk, 2),
                     "stacked_over_sequential": round(stk / seq, 2),
                     "sequential_iterations": int(sum(sum(i) for i in seq_its)),
                     "stacked_iterations": int(sum(stk_its)),
                     "faster": "sequential" if seq <= stk else "stacked"})
        print(rows[-1], flush=True)
    with open(out / "solver-stacking.csv", "w", newline="", encoding="utf-8") as f:
        f.write(f"# python benchmarks/solver_stacking.py --runs {args.runs}; "
                f"{platform.machine()}, {os.cpu_count()} cores\n")
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
