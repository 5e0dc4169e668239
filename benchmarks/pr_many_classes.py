"""PR's step against the every-pair form it replaced, as the number of classes grows.

PR pairs each observed positive i of a row with the row's other labels j. The form before
pairs every (i, j) of a row (a B x L x L tensor, masked to the pairs); spmlkit now takes the K
observed positives' rows of hinges (K x L, K about B in the single-positive regime). For each
L the two run on the same random logits (3 stacked runs, batch 16, one positive a row); the
table gives the best of ``--repeats`` times of each and checks that their gradients are equal
(bit for bit) and their loss values equal to float rounding.

    python benchmarks/pr_many_classes.py [--classes 14,100,1000,2000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import time

import torch

from spmlkit.labels import NEGATIVE, POSITIVE, UNOBSERVED
from spmlkit.losses import create_loss


def every_pair(logits, observed):
    """The B x L x L form: the hinge of every (i, j), masked to positive i and other j."""
    runs, batch, classes = logits.shape
    p = torch.sigmoid(logits)
    pos = (observed == POSITIVE).to(p.dtype)
    other = ((observed == UNOBSERVED) | (observed == NEGATIVE)).to(p.dtype)
    hinge = (1.0 - p.unsqueeze(-1) + p.unsqueeze(-2)).mul_(pos.unsqueeze(-1) * other.unsqueeze(-2))
    active = (hinge > 0).to(p.dtype)
    values = hinge.clamp_(min=0.0).sum(dim=(1, 2, 3)) / (batch * classes)
    grad_p = active.sum(dim=-2) - active.sum(dim=-1)
    return values, grad_p.mul_(p * (1.0 - p)).div_(batch * classes)


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", default="14,100,1000,2000")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    loss = create_loss("pr")
    print("| classes | every pair (ms) | spmlkit (ms) | speed-up | gradients equal "
          "| max loss diff |")
    print("|---|---|---|---|---|---|")
    for classes in (int(c) for c in args.classes.split(",")):
        g = torch.Generator().manual_seed(classes)
        logits = torch.randn(3, 16, classes, generator=g)
        observed = torch.zeros(16, classes, dtype=torch.int8)
        observed[torch.arange(16), torch.randint(0, classes, (16,), generator=g)] = POSITIVE
        t_old, (v_old, g_old) = best_of(lambda: every_pair(logits, observed), args.repeats)
        t_new, (v_new, g_new) = best_of(lambda: loss.stacked_step(logits, observed, None),
                                        args.repeats)
        print(f"| {classes} | {t_old * 1e3:.2f} | {t_new * 1e3:.2f} | {t_old / t_new:.0f}x | "
              f"{torch.equal(g_old, g_new)} | {(v_old - v_new).abs().max().item():.1e} |")


if __name__ == "__main__":
    main()
