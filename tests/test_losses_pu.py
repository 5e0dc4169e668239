"""PU-MLC's variational PU loss (``vpu``) against the authors' computation.

``_authors_vpu`` follows, operation by operation, the forward pass of ``vpuLoss`` in
``TAKELAMAG/PU-MLC`` (``src/loss_functions/vpu_loss.py`` at commit
``1a4445f094012ba03cc9cb18e6e2b789c8703bf0``), written for these tests: the temperature from
the batch's population std (times ``alpha``, clipped at 1, detached), ``log(sigmoid + 1e-10)``,
the re-balance factor ``(1 - mean(1 - sigmoid)) ** gamma`` without gradient, the reciprocal
counts with ``1/0 -> 0`` and the sum over classes. spmlkit's loss is its per-class mean.
"""
from __future__ import annotations

import math

import pytest
import torch

from spmlkit.losses import LOSSES, create_loss
from spmlkit.losses.pu import PU_MLC_COMMIT, vpu_temperature


def _authors_vpu(inp, target, gamma, alpha):
    mean = torch.mean(inp, dim=0)
    std = alpha * ((torch.sum((inp - mean).pow(2), dim=0) / inp.size(0)).pow(0.5))
    std = torch.where(std > 1.0, 1.0, std).detach()
    positive = (target == 1).float()
    unlabeled = torch.ones_like(positive)
    num_p_rec = torch.sum(positive, dim=0).pow(-1)
    num_x_rec = torch.sum(unlabeled, dim=0).pow(-1)
    num_p_rec = torch.where(torch.isinf(num_p_rec), torch.zeros_like(num_p_rec), num_p_rec)
    num_x_rec = torch.where(torch.isinf(num_x_rec), torch.zeros_like(num_x_rec), num_x_rec)
    log_all = torch.log(torch.sigmoid(inp * std.pow(-1)) + 1e-10)
    with torch.no_grad():
        sig = torch.sigmoid(inp * std.pow(-1))
        pt1 = torch.sum((1 - sig) * unlabeled, dim=0) * num_x_rec
        w = torch.pow(1 - pt1, gamma)
    p_loss = (torch.log(torch.exp(log_all * positive) + 1e-10) * num_p_rec).sum()
    u_loss = (torch.log(torch.sum(torch.exp(log_all * unlabeled), dim=0) * num_x_rec + 1e-10)
              * w).sum()
    return u_loss - p_loss


def _batch(seed, b=8, classes=5, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(b, classes, generator=g)
    target = torch.zeros(b, classes, dtype=torch.long)
    target[torch.arange(b), torch.randint(0, classes, (b,), generator=g)] = 1
    target[:, -1] = 0          # a class without an observed positive
    target[0, 1 if target[0, 1] != 1 else 2] = -1  # an observed negative (unlabelled here)
    return logits, target


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("alpha, gamma", [(1.0, 0.55), (2.0, 0.85), (0.3, 0.0)])
def test_values_and_gradients_equal_the_authors(seed, alpha, gamma):
    """The authors' sum over classes is L times ours; with ``eps=2e-10`` (their two 1e-10 in
    one log) to float32 rounding, with exact logs (default) within 1e-5 relative here; the
    gradients for the logits agree too."""
    logits, target = _batch(seed)
    classes = logits.shape[1]
    ref_in = logits.clone().requires_grad_(True)
    ref = _authors_vpu(ref_in, target, gamma, alpha)
    ref.backward()
    for eps, rtol in ((2e-10, 1e-6), (0.0, 1e-5)):
        ours_in = logits.clone().requires_grad_(True)
        value = create_loss("vpu", alpha=alpha, gamma=gamma, eps=eps)(ours_in, target)
        (classes * value).backward()
        torch.testing.assert_close(classes * value, ref, rtol=rtol, atol=1e-6)
        torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-4, atol=1e-7)


def test_a_value_computed_by_hand():
    """One class, two rows (logits 2 and -2: std 2, so T = min(1 * 2, 1) = 1), the first an
    observed positive, gamma 1: ``w = mean q = 1/2`` and
    ``l = (1/2) log(1/2) - log sigmoid(2)``."""
    value = create_loss("vpu", alpha=1.0, gamma=1.0)(torch.tensor([[2.0], [-2.0]]),
                                                      torch.tensor([[1], [0]]))
    expected = 0.5 * math.log(0.5) + math.log1p(math.exp(-2.0))
    assert value.item() == pytest.approx(expected, rel=1e-6)


def test_temperature():
    """``min(alpha * population std, 1)`` per class, detached; 1 where the batch has no spread
    (where the authors' code divides by 0)."""
    s = torch.tensor([[0.0, 3.0, 1.0], [0.4, -3.0, 1.0]], requires_grad=True)
    t = vpu_temperature(s, 2.0)
    torch.testing.assert_close(t, torch.tensor([0.4, 1.0, 1.0]))
    assert not t.requires_grad
    row = torch.tensor([[1.0, -2.0]], requires_grad=True)  # one row: no spread
    _authors_vpu(row, torch.tensor([[1, 0]]), 0.5, 1.0).backward()
    assert torch.isnan(row.grad).all()  # the authors': s / 0, a NaN gradient
    assert torch.isnan(_authors_vpu(torch.tensor([[0.0]]), torch.tensor([[1]]), 0.5, 1.0))
    row.grad = None
    one_row = create_loss("vpu")(row, torch.tensor([[1, 0]]))
    one_row.backward()
    assert torch.isfinite(one_row) and torch.isfinite(row.grad).all()


def test_official_hyperparameters():
    """Defaults: the README's COCO command (``--alpha=1.0 --gamma=0.55``); the registry's
    dataset values: COCO's and VOC's (``--alpha=2.0 --gamma=0.85``)."""
    entry = LOSSES.get("vpu")
    loss = create_loss("vpu")
    assert (loss.alpha, loss.gamma) == (1.0, 0.55)
    assert entry.hparams_for("coco") == {"alpha": 1.0, "gamma": 0.55}
    assert entry.hparams_for("voc") == {"alpha": 2.0, "gamma": 0.85}
    assert len(PU_MLC_COMMIT) == 40


def test_observed_negatives_are_unlabelled_and_refuse_a_weight():
    logits, target = _batch(4)
    as_unlabelled = torch.where(target == -1, 0, target)
    loss = create_loss("vpu")
    assert torch.equal(loss(logits, target), loss(logits, as_unlabelled))
    with pytest.raises(ValueError, match="takes no neg_weight"):
        create_loss("vpu", neg_weight=2.0)


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_only_the_mean_reduction(reduction):
    with pytest.raises(ValueError, match="reduction must be one of \\('mean',\\).*whole batch"):
        create_loss("vpu", reduction=reduction)


def test_bad_hyperparameters_raise():
    with pytest.raises(ValueError, match="alpha"):
        create_loss("vpu", alpha=0.0)
    with pytest.raises(ValueError, match="gamma"):
        create_loss("vpu", gamma=-1.0)
