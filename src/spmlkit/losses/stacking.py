"""The stacked engine's contract: how a loss lets `spmlkit.engine.vectorised` train R runs of it at
once, and take their gradient without autograd where it has a closed form.

Stacked runs (``stackable = True``): the linear engine may train R runs of one loss at once.
It then calls ``entries`` with a leading run dimension: logits and observed labels R x B x L,
``index`` R x B, and every parameter and buffer of the loss stacked to R x (its shape);
``entries`` must return the R x B x L matrix and a penalty of shape (R,) (or None), each run's
exactly what it would be alone. A loss written with ``dim=-1`` / ``shape[-1]`` and
`spmlkit.losses.state.take_rows` for its per-example state does this for free. Scalar state
the runs share (an epoch counter) is read from a Python number the hooks set, not from its
stacked buffer: the engine calls ``on_epoch_start`` on the stacked module too, while the
buffer's slice of a run that stopped early keeps that run's last value. One that draws
data-dependent sizes per batch or changes its state inside ``forward`` (the large-loss
methods) keeps ``stackable = False`` and its runs are trained one by one.

Closed form (``closed_form = True``): the loss is a soft BCE, its ``bce_form`` gives the target
and weight of each entry and its ``count_penalty`` EPR's count term, so one call of
`StackableLoss.closed_form_step` gives any mix of such runs their values and gradient. A loss
with a gradient of its own written out by hand sets ``manual_gradient`` and has
``stacked_step`` (ROLE, the pairwise losses).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .logspace import expected_positive_penalty_grad


class StackableLoss:
    """What the vectorised engine asks of a loss (a base of
    `spmlkit.losses.contract.SPMLLoss`; module docstring). Reads the loss's ``reduction``."""

    #: ``entries`` works on R stacked runs (module docstring); False: trained one run at a time
    stackable = False
    #: ``entries`` is exactly ``soft_bce(logits, target, eps, weight)`` with ``(target,
    #: weight) = bce_form(observed)``, plus, when ``count_penalty()`` gives ``(lam, k)``, EPR's
    #: ``lam * ((mean over rows of sum_l p - k) / L) ** 2``; the loss has no state and no
    #: ``penalty``. The vectorised engine then takes the step's gradient in closed form
    #: (``weight * (sigmoid(s) - target)``, and the count term's) instead of through autograd.
    #: A subclass that changes ``entries`` sets it back to False.
    closed_form = False
    #: the loss has `stacked_step`: its stacked runs' gradient written out by hand
    manual_gradient = False

    def bce_form(self, observed):
        """``(target, weight)`` of a `closed_form` loss for the observed labels (any
        shape): the soft BCE target in [0, 1] and the per-entry weight (None: 1)."""
        raise NotImplementedError(f"{type(self).__name__} is not a closed-form BCE loss")

    def count_penalty(self):
        """``(lam, k)`` of a `closed_form` loss's expected-positive term, or None."""
        return None

    def closed_form_step(self, logits, target, weight, count):
        """For the vectorised engine: R stacked runs' loss (R,) and the gradient of their sum
        for ``logits`` (R x B x L) in closed form, without autograd; None when the loss is not
        `closed_form`. The form is the contract's, so one call serves runs of any closed-form
        losses: ``target`` and ``weight`` (R x B x L, weight None: 1) their ``bce_form`` of
        the batch, ``count`` None or per-run ``(lam, k)`` tensors (R,) of their
        ``count_penalty`` (lam 0: none); the reduction is this loss's. The values are the
        runs' ``entries`` reduced as autograd's step reduces them; the gradient is ``weight *
        (sigmoid(s) - target) / (B L)`` plus the count term's ``2 lam (m - k) / (L^2 B) *
        p (1 - p)`` (``m``: the run's mean predicted count), what autograd computes
        (``tests/test_vectorised.py`` checks it for every closed-form loss)."""
        if not self.closed_form:
            return None
        _, batch, classes = logits.shape
        # BCE(s, t) = softplus(s) - t s (what binary_cross_entropy_with_logits computes, in
        # fewer operations: the step time here is per-operation overhead)
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
        if self.reduction == "sum":
            values = values * (batch * classes)
            g.mul_(batch * classes)
        return values, g

    def stacked_step(self, logits, observed, index):
        """For the vectorised engine (stacked runs, R x B x L; ``"mean"`` reduction, exact logs):
        each run's loss (R,) and the gradient of their sum for ``logits``, computed without
        autograd; the gradients of the loss's own parameters are left in their ``.grad``. Equal
        to autograd through `entries` (``tests/test_vectorised.py`` checks it)."""
        raise NotImplementedError(f"{type(self).__name__} has no hand-written stacked step")
