"""What a loss is given, and its checks: the train split's `TrainInfo` (at ``on_train_start``),
the observed labels (in {1, 0, -1}) and the batch's row indices in the train split. Each check
raises a ``ValueError`` that names the loss, the value and what was expected (a loss's
hyperparameters are checked by its constraints table: `spmlkit.losses.contract.check_hparams`).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from ..constraints import Rule
from ..labels import NEGATIVE, POSITIVE, UNOBSERVED


@dataclass(frozen=True)
class TrainInfo:
    """What a loss learns about the training split before the first step
    (`spmlkit.losses.contract.SPMLLoss.on_train_start`).

    Args:
        num_examples: rows of the train split (N): per-example state is N x L; a loss with
            parameters of its own raises when an epoch's rows pass without an update of them
            (`spmlkit.losses.contract.SPMLLoss.param_groups`).
        num_classes: labels per row (L).
        k: expected positives per example (EPR, ROLE, GPR's penalty); None: the loss's own
            ``k=`` hyperparameter, or none. ``spml train`` passes the train split's mean number
            of (true) positives per row, the papers' k* (``--k`` chooses another).
        seed: the run's seed (ROLE's initial label estimates are drawn from it).
        num_epochs: the run's epochs (schedules that span the run: EM-APL, GR, GPR, CRISP).

    Raises:
        ValueError: ``k`` outside [0, num_classes].

    >>> TrainInfo(num_examples=100, num_classes=5, k=1.0, seed=0, num_epochs=10).k
    1.0
    """

    num_examples: int
    num_classes: int
    k: float | None = None          # expected positives per example (EPR, ROLE)
    seed: int = 0
    num_epochs: int = 1

    def __post_init__(self):
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, (int, float))
                                   or not math.isfinite(self.k)
                                   or not 0 <= self.k <= self.num_classes):
            raise ValueError(f"k (expected positives per example) must be a number in [0, "
                             f"{self.num_classes}] (the number of classes), got {self.k!r}")


def check_observed(observed: torch.Tensor, where: str) -> None:
    """Raise ``ValueError`` when ``observed`` holds a value outside {1, 0, -1}.

    What every loss call checks, unless its caller validated the whole matrix already
    (`spmlkit.losses.own_loop.observed_validated`): one ``aminmax`` reduction for integer labels
    (the engine's int8) and a second operation for float labels (which must also be whole
    numbers). About 4 us per call on a CPU: 4-6% of a linear-mode step on yeast
    (``benchmarks/observed_check.py``). On an accelerator reading the result waits for the
    labels' device work (a host sync), so `spmlkit.losses.contract.SPMLLoss.forward` checks
    labels on an accelerator at its first call only, and not at all inside ``torch.compile``;
    validate the whole matrix once (`spmlkit.labels.validate_observed`) and use
    `spmlkit.losses.own_loop.observed_validated`.
    Only a failing check looks further, to name the values and the first row. Boolean labels
    (True = positive) pass.

    >>> check_observed(torch.tensor([[1, 0, -1]], dtype=torch.int8), "an")  # passes
    >>> check_observed(torch.tensor([[1, 0, 3]]), "an")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: an: observed labels must be 1 (positive), ... found [3] (first at batch row 0)
    """
    if observed.dtype == torch.bool or observed.numel() == 0:
        return
    lo, hi = torch.aminmax(observed)
    ok = lo.item() >= NEGATIVE and hi.item() <= POSITIVE  # False for NaN
    if ok and observed.is_floating_point():
        ok = not bool((observed != observed.round()).any())
    if ok:
        return
    bad = (observed != POSITIVE) & (observed != UNOBSERVED) & (observed != NEGATIVE)
    row = int(bad.nonzero()[0, 0])
    values = sorted({float(v) if observed.is_floating_point() else int(v)
                     for v in observed[bad].tolist()}, key=str)[:5]
    raise ValueError(f"{where}: observed labels must be {POSITIVE} (positive), {UNOBSERVED} "
                     f"(unobserved) or {NEGATIVE} (negative); found {values} (first at batch "
                     f"row {row})")


def check_index(index, rows: int | None, where: str) -> None:
    """Raise ``ValueError`` unless ``index`` holds whole numbers, the batch's rows in the train
    split: an integer tensor (or a sequence of ints), and, on the CPU, each in ``[0, rows)``
    (``rows``: `TrainInfo.num_examples`; None: ``>= 0`` only). A boolean mask, fractions
    or negative positions would pick other rows' state silently (``state[index]`` wraps,
    truncates, or reads a mask as rows 0 / 1). On an accelerator the values are not read (a host
    sync); the dtype is checked everywhere.

    >>> check_index(torch.tensor([0, 3]), 4, "role")
    >>> check_index(torch.tensor([-1, 2]), 4, "role")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: role: index must hold the batch's rows in the train split, 0 to 3; found -1 ...
    """
    if not torch.is_tensor(index):
        index = torch.as_tensor(index)
    if index.numel() == 0:  # an empty batch (``torch.tensor([])`` is float32)
        return
    if index.dtype == torch.bool or index.is_floating_point() or index.is_complex():
        raise ValueError(f"{where}: index must hold the batch's rows in the train split as "
                         f"whole numbers (an integer tensor), not {index.dtype}; a mask selects "
                         f"rows with index.nonzero().squeeze(1)")
    if index.device.type != "cpu":
        return
    lo, hi = (int(v) for v in torch.aminmax(index))
    if lo < 0 or (rows is not None and hi >= rows):
        span = f"0 to {rows - 1}" if rows is not None else "0 or more"
        bad = lo if lo < 0 else hi
        raise ValueError(f"{where}: index must hold the batch's rows in the train split, "
                         f"{span}; found {bad} (the rows given to on_train_start are the "
                         f"ones index counts)")


def _expected_positives(k):
    """``k`` if it is None or a finite number > 0; else a refusal that says the default."""
    if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Real)
                          or not math.isfinite(k) or not k > 0):
        raise ValueError(f"k must be a number > 0 of expected positives per example, or left "
                         f"out: the train split's true mean (k*) is the default; got {k!r}")
    return k


#: the rule of a loss's ``k`` hyperparameter (EPR, ROLE, GPR) in its constraints table
K_RULE = Rule(_expected_positives, "a number > 0 (expected positives per example) or None "
              "(the train split's mean)", bad=(0, -1.0, True, "2", float("nan")))
