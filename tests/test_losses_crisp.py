"""CRISP (Liu et al., NeurIPS 2025): the class-prior estimator (Eq. 2) and the loss (Eq. 7)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spmlkit.engine import TrainConfig, fit_linear
from spmlkit.labels import make_observed
from spmlkit.losses import LOSSES, TrainInfo, create_loss, list_losses
from spmlkit.losses.crisp import CRISPLoss, estimate_class_priors


def _started(observed, epochs=5, **hp):
    loss = create_loss("crisp", **hp)
    observed = torch.as_tensor(observed)
    loss.on_train_start(observed, TrainInfo(observed.shape[0], observed.shape[1], k=1.0,
                                            num_epochs=epochs))
    return loss


# ------------------------------------------------------------------ the estimator ------------
def test_estimator_hand_computed():
    """n = 10 rows with scores 9..0, the label's observed positives score 9, 8 and 5 (n_j = 3).
    delta = 0.5, tau = 0: c = sqrt(log 8 / 20) + sqrt(log 8 / 6) = 0.9111. Objective
    (q + c) / qp per threshold z: z=9 (q .1, qp 1/3) 3.033; z=8 (.2, 2/3) 1.667; z=7 (.3, 2/3)
    1.817; z=6 (.4, 2/3) 1.967; z=5 (.5, 1) 1.411; z<=4: (q + c) with q >= .6, larger. So
    z_hat = 5 and pi = .5 / 1 = 0.5."""
    scores = torch.arange(9, -1, -1, dtype=torch.float64).unsqueeze(1)
    pos = torch.zeros(10, 1, dtype=torch.bool)
    pos[[0, 1, 4]] = True
    c = math.sqrt(math.log(8) / 20) + math.sqrt(math.log(8) / 6)
    assert c == pytest.approx(0.9111, abs=1e-4)
    priors, thresholds = estimate_class_priors(scores, pos, delta=0.5, tau=0.0,
                                               return_thresholds=True)
    assert float(thresholds[0]) == 5.0
    assert float(priors[0]) == pytest.approx(0.5)
    # a smaller bound term (tiny c would need a huge n): with tau the bound grows, and the
    # choice stays (z = 5 is already the largest-qp candidate among the competitive ones)
    assert float(estimate_class_priors(scores, pos, delta=0.5, tau=1.0)[0]) == pytest.approx(0.5)


def test_estimator_bound_uses_the_label_s_positive_count():
    """The bound term has two parts, one with the n rows and one with the label's n_j observed
    positives. n = 10 rows scoring 9..0, the positives score 9 and 1 (n_j = 2); delta = 0.5,
    tau = 0. By hand: c = sqrt(log 8 / 20) + sqrt(log 8 / 4) = 0.32245 + 0.72101 = 1.04346.
    Objective (q + c) / qp: z = 9 (q .1, qp 1/2) 2.2869; z = 8..2 (qp 1/2) larger; z = 1
    (q .9, qp 1) 1.9435; z = 0 (1, 1) 2.0435. So z_hat = 1 and pi = 0.9. (With n in place of
    n_j, c = 0.6449 and the top bin would win: z_hat = 9, pi = 0.2.)"""
    scores = torch.arange(9, -1, -1, dtype=torch.float64).unsqueeze(1)
    pos = torch.zeros(10, 1, dtype=torch.bool)
    pos[[0, 8]] = True
    priors, thresholds = estimate_class_priors(scores, pos, delta=0.5, tau=0.0,
                                               return_thresholds=True)
    assert float(thresholds[0]) == 1.0
    assert float(priors[0]) == pytest.approx(0.9)


def test_estimator_top_bin_recovers_the_prior():
    """Positives drawn at random from a class with prior 0.3 (10% of them observed), and a
    score whose top region holds positives only: the estimate is the true prior (Theorem 4.1),
    while the observed-positive share n_j / n is 0.03."""
    rng = np.random.RandomState(0)
    n = 20000
    y = rng.random_sample(n) < 0.3
    scores = np.where(y, rng.normal(2.0, 1.0, n), rng.normal(-2.0, 1.0, n))
    scores[~y] = np.minimum(scores[~y], 1.0)  # a top bin (scores > 1) of positives only
    observed = y & (rng.random_sample(n) < 0.1)
    est = float(estimate_class_priors(scores[:, None], observed[:, None])[0])
    assert abs(est - y.mean()) < 0.03, est
    assert observed.mean() < 0.04


def test_estimator_bounds_and_unobserved_label():
    rng = np.random.RandomState(1)
    scores = rng.standard_normal((50, 3))
    pos = np.zeros((50, 3), dtype=np.int8)
    pos[:5, 0] = 1
    pos[10:40, 1] = 1
    est = estimate_class_priors(scores, pos)
    assert est.dtype == torch.float64 and est.shape == (3,)
    assert 5 / 50 <= est[0] <= 1 and 30 / 50 <= est[1] <= 1
    assert est[2] == 0.0  # no observed positive: prior 0
    # only the order of the scores matters: probabilities give the logits' estimate
    torch.testing.assert_close(estimate_class_priors(1 / (1 + np.exp(-scores)), pos), est)


def test_estimator_ties_count_as_at_least():
    """Tied scores are all ">= z": 4 rows at 1.0, two of them observed; 4 rows at 0.0."""
    scores = torch.tensor([[1.0]] * 4 + [[0.0]] * 4)
    pos = torch.tensor([[1], [1], [0], [0], [0], [0], [0], [0]])
    est, thr = estimate_class_priors(scores, pos, delta=0.5, tau=0.0, return_thresholds=True)
    assert float(thr[0]) == 1.0 and float(est[0]) == pytest.approx(0.5)  # (4/8) / (2/2)


@pytest.mark.parametrize("bad", [{"delta": 0.0}, {"delta": 1.0}, {"tau": -0.1}, {"tau": 2.0}])
def test_estimator_rejects_bad_hparams(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        estimate_class_priors(np.zeros((3, 1)), np.ones((3, 1)), **bad)


def test_estimator_shape_mismatch():
    with pytest.raises(ValueError, match=r"\(3, 2\) and \(3, 1\)"):
        estimate_class_priors(np.zeros((3, 2)), np.ones((3, 1)))


# ------------------------------------------------------------------ the loss -----------------
def test_registered_and_listed():
    assert "crisp" in LOSSES.names() and "crisp" in dict(list_losses())
    assert "CRISP" in LOSSES.get("crisp").paper
    loss = create_loss("crisp")
    assert isinstance(loss, CRISPLoss) and loss.needs_train_predictions and loss.stackable
    assert (loss.delta, loss.tau, loss.warmup, loss.update_every) == (0.01, 0.01, 1, 1)


def test_warmup_is_an():
    obs = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]])
    loss = _started(obs, warmup=2)
    an = create_loss("an")
    logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    for epoch in (0, 1):
        loss.on_epoch_start(epoch)
        torch.testing.assert_close(loss(logits, obs), an(logits, obs))
        loss.on_epoch_end(epoch, logits)
    loss.on_epoch_start(2)
    assert not torch.allclose(loss(logits, obs), an(logits, obs))


def test_crisp_value_hand_computed():
    """Train split of N = 4: label 0 observed positive in 2 rows (n/n_0 = 2), label 1 in 1
    (n/n_1 = 4), label 2 in 1. Priors set to (0.5, 0.25, 0.1); logits 0 (p = 0.5). Batch:
    rows 0 (positive on 0) and 2 (positive on 1). Entries: 2 * 0.5 * 2 * 0.5 = 1 on (0, 0);
    2 * 0.25 * 4 * 0.5 = 1 on (1, 1); 0 elsewhere -> mean 2 / 6. Penalty: (|0.5 - 0.5| +
    |0.5 - 0.25| + |0.5 - 0.1|) / 3 = 0.65 / 3. Value 1/3 + 0.65/3 = 0.55."""
    obs = torch.tensor([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    loss = _started(obs)
    torch.testing.assert_close(loss.pos_weight, torch.tensor([2.0, 4.0, 4.0]))
    loss.priors = torch.tensor([0.5, 0.25, 0.1])
    loss.on_epoch_start(1)
    batch = obs[[0, 2]]
    value = loss(torch.zeros(2, 3), batch)
    assert float(value) == pytest.approx(0.55, abs=1e-6)
    none = create_loss("crisp", reduction="none")
    none.load_state_dict(loss.state_dict())
    none.on_epoch_start(1)
    mat = none(torch.zeros(2, 3), batch)
    penalty = 0.65 / 3
    torch.testing.assert_close(mat, torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]) + penalty)
    # gradient: d/ds of 1/6 * [w (1 - p)] on (0, 0) = -w p (1 - p) / 6 = -2 * 0.25 / 6, plus the
    # penalty's sign(mean p - pi) * p (1 - p) / (B * L) = 0 * ... (mean p = pi exactly: the
    # absolute value's subgradient 0) on label 0
    logits = torch.zeros(2, 3, requires_grad=True)
    loss(logits, batch).backward()
    assert float(logits.grad[0, 0]) == pytest.approx(-2 * 0.25 / 6)
    assert float(logits.grad[1, 2]) == pytest.approx(0.25 / 6)  # penalty only: +p(1-p)/(2*3)


def test_gradcheck_float64():
    obs = torch.as_tensor(make_observed(
        (np.random.RandomState(0).random_sample((12, 4)) < 0.4).astype(np.uint8) |
        np.eye(4, dtype=np.uint8)[np.arange(12) % 4], "1p", seed=3)).long()
    loss = _started(obs)
    loss.priors = torch.tensor([0.3, 0.6, 0.2, 0.45])
    loss.on_epoch_start(1)
    logits = torch.randn(6, 4, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(2)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: loss(s, obs[:6]), (logits,))
    loss = _started(obs)
    loss.on_epoch_start(0)  # the AN warm-up, too
    assert torch.autograd.gradcheck(lambda s: loss(s, obs[:6]), (logits,))


def test_schedule_warmup_and_update_every():
    rng = np.random.RandomState(0)
    obs = torch.as_tensor(make_observed((rng.random_sample((30, 3)) < 0.4).astype(np.uint8) |
                                        np.eye(3, dtype=np.uint8)[np.arange(30) % 3], "1p"))
    loss = _started(obs, epochs=8, warmup=2, update_every=2)
    seen = []
    for epoch in range(7):
        loss.on_epoch_start(epoch)
        logits = torch.as_tensor(rng.standard_normal((30, 3)), dtype=torch.float32)
        before = loss.priors.clone()
        loss.priors = torch.full_like(before, 7.0)  # a value no estimate can take
        loss.on_epoch_end(epoch, logits)
        if (loss.priors == 7.0).all():
            loss.priors = before  # not re-estimated this epoch
        else:
            seen.append(epoch)
            torch.testing.assert_close(
                loss.priors, estimate_class_priors(logits, obs == 1, 0.01, 0.01).float())
    assert seen == [1, 3, 5]  # the first at the end of epoch warmup - 1, then every 2 epochs


def test_priors_survive_a_checkpoint(tmp_path):
    obs = torch.tensor([[1, 0], [0, 1], [1, 0], [0, 1], [1, 0]])
    loss = _started(obs)
    loss.on_epoch_end(0, torch.tensor([[2.0, -1], [0, 1], [1, 0], [-1, 2], [0.5, 0]]))
    assert (loss.priors >= 0).all()
    path = tmp_path / "loss.pt"
    torch.save(loss.state_dict(), path)
    fresh = create_loss("crisp")
    fresh.load_state_dict(torch.load(path, weights_only=True))
    for key in ("priors", "pos_weight", "positives"):
        assert torch.equal(getattr(fresh, key), getattr(loss, key)), key
    fresh.on_train_start(obs, TrainInfo(5, 2, num_epochs=5))  # resume: the estimate is kept
    assert torch.equal(fresh.priors, loss.priors)
    for module in (fresh, loss):
        module.on_epoch_start(1)
    logits = torch.randn(3, 2, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(fresh(logits, obs[:3]), loss(logits, obs[:3]))


def test_resumed_training_equals_the_uninterrupted_run():
    rng = np.random.RandomState(0)
    y = (rng.random_sample((80, 4)) < 0.35).astype(np.uint8)
    y[np.arange(80), rng.randint(0, 4, 80)] = 1
    x = (y @ rng.standard_normal((4, 6)) + rng.standard_normal((80, 6))).astype(np.float32)
    z = make_observed(y, "1p")
    cfg = TrainConfig(epochs=5, batch_size=16, lr=2e-2, seed=1)
    states, priors = [], []
    whole, ref = fit_linear(x, z, create_loss("crisp"), cfg, x_val=x[:40], y_val=y[:40],
                            checkpoint=lambda state: states.append(state()),
                            on_epoch=lambda rec, m, loss: priors.append(loss.priors.clone()))
    assert (priors[-1] >= 0).all() and not torch.equal(priors[1], priors[-1])
    model, res = fit_linear(x, z, create_loss("crisp"), cfg, x_val=x[:40], y_val=y[:40],
                            resume=states[2])
    assert torch.equal(model.weight, whole.weight) and res.history == ref.history


def test_errors():
    obs = torch.tensor([[1, 0], [0, 1]])
    for bad in ({"warmup": 0}, {"warmup": 1.5}, {"update_every": 0}, {"delta": 0.0},
                {"tau": 3.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            create_loss("crisp", **bad)
    loss = _started(obs)
    with pytest.raises(ValueError, match="train split"):
        loss.on_epoch_end(0, None)
    with pytest.raises(ValueError, match=r"\(3, 2\)"):
        loss.on_epoch_end(0, torch.zeros(3, 2))
    with pytest.raises(RuntimeError, match="no.*estimated|none were estimated"):
        loss.on_epoch_start(1)  # CRISP's first epoch, but on_epoch_end(0) never estimated
    with pytest.warns(UserWarning, match="warmup"):
        _started(obs, epochs=1)


def test_crisp_phase_contract():
    """The generic contract of tests/test_losses_contract.py meets the loss in its warm-up;
    here its CRISP phase: reductions, extreme logits, empty batch, nothing observed, float64."""
    rng = np.random.RandomState(4)
    obs = torch.as_tensor(make_observed((rng.random_sample((20, 5)) < 0.4).astype(np.uint8) |
                                        np.eye(5, dtype=np.uint8)[np.arange(20) % 5], "1p"))
    losses = {r: _started(obs, reduction=r) for r in ("mean", "sum", "none")}
    logits_all = torch.as_tensor(rng.standard_normal((20, 5)), dtype=torch.float32)
    for loss in losses.values():
        loss.on_epoch_end(0, logits_all)
        loss.on_epoch_start(1)
    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    m, s, n = (losses[r](logits, obs[:6]) for r in ("mean", "sum", "none"))
    assert n.shape == (6, 5)
    torch.testing.assert_close(n.mean(), m)
    torch.testing.assert_close(s, 30 * m)
    for big in (100.0, -100.0):
        x = torch.full((6, 5), big, requires_grad=True)
        out = losses["mean"](x, obs[:6])
        out.backward()
        assert torch.isfinite(out) and torch.isfinite(x.grad).all()
    empty = losses["mean"](torch.zeros(0, 5, requires_grad=True), obs[:0])
    assert float(empty.detach()) == 0.0 and empty.requires_grad
    assert torch.isfinite(losses["mean"](logits, torch.zeros(6, 5, dtype=torch.long)))
    out64 = losses["mean"](logits.double(), obs[:6])
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.float(), m)


def test_nan_train_logits_are_an_error():
    n, c = 20, 3
    obs = torch.zeros(n, c, dtype=torch.long)
    obs[torch.arange(n), torch.arange(n) % c] = 1
    loss = create_loss("crisp")
    loss.on_train_start(obs, TrainInfo(n, c, num_epochs=5))
    loss.on_epoch_start(0)
    logits = torch.zeros(n, c)
    logits[3, 1] = float("nan")
    with pytest.raises(ValueError, match="train_logits hold 1 NaN value"):
        loss.on_epoch_end(0, logits)
