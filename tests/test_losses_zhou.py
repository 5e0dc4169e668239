"""Zhou et al. 2022 losses (spmlkit.losses.zhou): values, gradients, the APL schedule and state.

Expected numbers are computed here from the formulas of docs/spec.md#zhou with numpy, not with
the code under test. Gradchecks run in float64, directly on the losses: the computation keeps
float64 input in float64 (``spmlkit.losses.contract.as_compute``).
"""
from __future__ import annotations

import io
import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from spmlkit.labels import NEGATIVE, POSITIVE, UNOBSERVED
from spmlkit.losses import LOSSES, TrainInfo, create_loss
from spmlkit.losses import contract, zhou

P, U, N = POSITIVE, UNOBSERVED, NEGATIVE
NAMES = ["em", "em_apl", "dw", "l1r", "l2r", "ls", "n_ls", "entmin", "focal", "asl"]

S = np.array([[1.2, -0.7, 0.3], [-1.5, 2.0, 0.1]])
Z = np.array([[P, U, U], [U, P, N]])


def _logits(dtype=torch.float32, requires_grad=False):
    return torch.tensor(S, dtype=dtype, requires_grad=requires_grad)


def _obs():
    return torch.tensor(Z, dtype=torch.int8)


def _sig(s):
    return 1.0 / (1.0 + np.exp(-s))


def _ent(p):
    return -(p * np.log(p) + (1 - p) * np.log(1 - p))


def _bce(p, t):
    return -(t * np.log(p) + (1 - t) * np.log(1 - p))


def _reduce(per_entry_fn):
    """Mean over B*L of a per-entry function f(p, z) of the 2 x 3 example."""
    p = _sig(S)
    return float(np.mean([[per_entry_fn(p[i, j], Z[i, j]) for j in range(3)] for i in range(2)]))


# --- hand-computed values on the 2 x 3 example ------------------------------------------------
def _an(p, z):
    return -math.log(p) if z == P else -math.log(1 - p)


def _focal(g):
    return lambda p, z: -(1 - p) ** g * math.log(p) if z == P else -p ** g * math.log(1 - p)


def _asl(gp, gn, m):
    def f(p, z):
        if z == P:
            return -(1 - p) ** gp * math.log(p)
        pm = max(p - m, 0.0)
        return -pm ** gn * math.log(1 - pm)
    return f


CASES = {
    "em": ({"alpha": 0.3}, lambda p, z: {P: -math.log(p), U: -0.3 * _ent(p),
                                          N: -math.log(1 - p)}[z]),
    "dw": ({"gamma": 0.2}, lambda p, z: -math.log(p) if z == P else -0.2 * math.log(1 - p)),
    "dw_default": ({}, lambda p, z: -math.log(p) if z == P else -0.1 * math.log(1 - p)),
    "l1r": ({"lam": 0.5}, _an),
    "l2r": ({"lam": 0.5}, _an),
    "ls": ({}, lambda p, z: _bce(p, 0.9 if z == P else 0.1)),
    "n_ls": ({}, lambda p, z: _bce(p, 1.0 if z == P else 0.05)),
    "entmin": ({"lam": 0.5}, lambda p, z: _an(p, z) + (0.5 * _ent(p) if z == U else 0.0)),
    "focal": ({}, _focal(2.0)),
    "focal_g1": ({"gamma": 1.0}, _focal(1.0)),
    "asl": ({}, _asl(0.0, 4.0, 0.05)),
    "asl_other": ({"gamma_pos": 1.0, "gamma_neg": 2.0, "clip": 0.3}, _asl(1.0, 2.0, 0.3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hand_computed_value(case):
    hparams, fn = CASES[case]
    loss = create_loss(case.split("_default")[0].split("_g1")[0].split("_other")[0], **hparams)
    value = loss(_logits(), _obs(), index=[0, 1])
    assert value.item() == pytest.approx(_reduce(fn), rel=1e-6)
    assert loss(_logits(), _obs(), index=[0, 1]).dtype == torch.float32


def test_asl_shift_zeroes_easy_negatives():
    # p = sigmoid(-3.5) = 0.029 < clip: the negative entry's loss is exactly 0
    loss = create_loss("asl", reduction="none")
    out = loss(torch.tensor([[2.0, -3.5]]), torch.tensor([[P, U]]))
    assert out[0, 1].item() == 0.0
    assert out[0, 0].item() == pytest.approx(-math.log(_sig(2.0)), rel=1e-6)


def test_em_official_eps_form():
    # the official code: -log(p + 1e-5) on O+, -alpha*[p*(-log(p+1e-5)) + (1-p)*(-log(1-p+1e-5))]
    e = 1e-5

    def official(p, z):
        if z == P:
            return -math.log(p + e)
        if z == U:
            return -0.2 * (p * -math.log(p + e) + (1 - p) * -math.log(1 - p + e))
        return -math.log(1 - p + e)

    value = create_loss("em", alpha=0.2, eps=e)(_logits(), _obs())
    assert value.item() == pytest.approx(_reduce(official), rel=1e-6)


def test_em_is_negative_when_entropy_dominates():
    # all unobserved at p = 0.5: every entry is -alpha*log 2
    value = create_loss("em", alpha=0.5)(torch.zeros(2, 3), torch.full((2, 3), U))
    assert value.item() == pytest.approx(-0.5 * math.log(2), rel=1e-6)
    assert value.item() < 0


def test_em_apl_value_with_a_pseudo_label():
    loss = create_loss("em_apl", alpha=0.3, beta=0.7)
    loss.on_train_start(_obs(), TrainInfo(2, 3, num_epochs=10))
    loss.pseudo_mask[0, 1] = True
    loss.pseudo_target[0, 1] = 0.2
    p = _sig(S)
    expected = np.mean([-math.log(p[0, 0]), 0.7 * _bce(p[0, 1], 0.2), -0.3 * _ent(p[0, 2]),
                        -0.3 * _ent(p[1, 0]), -math.log(p[1, 1]), -math.log(1 - p[1, 2])])
    assert loss(_logits(), _obs(), index=[0, 1]).item() == pytest.approx(expected, rel=1e-6)
    # the state is looked up by train row, whatever the batch order
    swapped = loss(_logits().flip(0), _obs().flip(0), index=torch.tensor([1, 0]))
    assert swapped.item() == pytest.approx(expected, rel=1e-6)
    # rows without pseudo-labels, and a loss with no state yet, are EM
    em = create_loss("em", alpha=0.3)
    assert torch.equal(loss(_logits()[1:], _obs()[1:], index=[1]), em(_logits()[1:], _obs()[1:]))
    em = em(_logits(), _obs())
    fresh = create_loss("em_apl", alpha=0.3, beta=0.7)
    assert fresh(_logits(), _obs(), index=[0, 1]).item() == pytest.approx(em.item(), rel=1e-7)


# --- gradients --------------------------------------------------------------------------------
GRAD_HPARAMS = {"em": {"alpha": 0.3}, "em_apl": {"alpha": 0.3, "beta": 0.7},
                "dw": {}, "l1r": {}, "l2r": {}, "ls": {}, "n_ls": {}, "entmin": {"lam": 0.5},
                "focal": {}, "asl": {}}


@pytest.mark.parametrize("eps", [0.0, 1e-5])
@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_float64(name, eps):
    loss = create_loss(name, eps=eps, **GRAD_HPARAMS[name])
    if name == "em_apl":
        loss.on_train_start(_obs(), TrainInfo(2, 3, num_epochs=10))
        loss.pseudo_mask[0, 2] = True
        loss.pseudo_target[0, 2] = 0.3
    x = _logits(torch.float64, requires_grad=True)
    mat, pen = loss.entries(x, _obs(), torch.tensor([0, 1]))
    assert mat.dtype == torch.float64 and pen is None
    assert torch.autograd.gradcheck(lambda s: loss.entries(s, _obs(), torch.tensor([0, 1]))[0],
                                    (x,))


@pytest.mark.parametrize("name", ["l1r", "l2r"])
def test_gradcheck_weight_norms_float64(name):
    w = torch.tensor([[0.3, -1.2], [2.0, -0.4]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(LOSSES.get(name).factory._norm, (w,))


def test_entropy_derivative_closed_form():
    x = torch.linspace(-6, 6, 13, dtype=torch.float64, requires_grad=True)
    zhou.binary_entropy(x).sum().backward()
    p = torch.sigmoid(x.detach())
    assert torch.allclose(x.grad, -x.detach() * p * (1 - p), atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("eps", [0.0, 1e-5])
def test_finite_at_saturated_logits(name, eps):
    loss = create_loss(name, eps=eps)
    obs = torch.tensor([[P, U, N, U], [U, P, U, N]])
    if name == "em_apl":
        loss.on_train_start(obs, TrainInfo(2, 4, num_epochs=10))
        loss.on_epoch_start(0)
        loss.pseudo_mask[0, 1] = loss.pseudo_mask[1, 0] = True
    x = torch.tensor([[100.0, -100.0, 100.0, 100.0], [-100.0, -100.0, 100.0, -100.0]],
                     requires_grad=True)
    value = loss(x, obs, index=[0, 1])
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", NAMES)
def test_empty_batch_is_a_zero_on_the_graph(name):
    x = torch.zeros(0, 3, requires_grad=True)
    value = create_loss(name)(x, torch.zeros(0, 3, dtype=torch.int8), index=[])
    assert value.item() == 0.0 and value.requires_grad


# --- EntMin's sign, Focal/ASL's reduction to AN ----------------------------------------------
def _entropy_after_one_step(name, **hparams):
    x = torch.full((1, 4), 0.5, requires_grad=True)
    obs = torch.full((1, 4), U)
    create_loss(name, **hparams)(x, obs).backward()
    with torch.no_grad():
        stepped = x - 1.0 * x.grad
    return zhou.binary_entropy(x.detach()).sum().item(), zhou.binary_entropy(stepped).sum().item()


def test_entmin_lowers_entropy_em_raises_it():
    before, after = _entropy_after_one_step("entmin", lam=10.0)
    assert after < before
    before, after = _entropy_after_one_step("em", alpha=10.0)
    assert after > before


def test_entmin_is_an_plus_entropy_on_unobserved_only():
    x, obs = _logits(), _obs()
    diff = create_loss("entmin", lam=2.0)(x, obs) - create_loss("an")(x, obs)
    h = _ent(_sig(S))
    assert diff.item() == pytest.approx(2.0 * (h[0, 1] + h[0, 2] + h[1, 0]) / 6, rel=1e-6)


@pytest.mark.parametrize("eps", [0.0, 1e-5])
@pytest.mark.parametrize("name, hparams", [("focal", {"gamma": 0.0}),
                                           ("asl", {"gamma_pos": 0.0, "gamma_neg": 0.0,
                                                    "clip": 0.0})])
def test_focal_and_asl_reduce_to_an(name, hparams, eps):
    gen = torch.Generator().manual_seed(3)
    x1 = (4 * torch.randn(5, 7, generator=gen)).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    obs = torch.randint(-1, 2, (5, 7), generator=gen)
    a = create_loss(name, eps=eps, **hparams)(x1, obs)
    b = create_loss("an", eps=eps)(x2, obs)
    a.backward()
    b.backward()
    torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    # AN runs through the fused BCE kernel: the gradients agree to float32 rounding (1 ulp)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-6, atol=1e-8)


# --- L1R / L2R penalties ----------------------------------------------------------------------
def _linear():
    lin = nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.5, -1.5, 2.0], [-0.25, 0.0, 1.0]]))
        lin.bias.copy_(torch.tensor([10.0, -20.0]))  # large: any inclusion would show
    return lin


def test_l1r_l2r_penalty_values_exclude_bias():
    w = np.array([[0.5, -1.5, 2.0], [-0.25, 0.0, 1.0]])
    lin = _linear()
    l1 = create_loss("l1r", lam=0.01).penalty(lin)
    l2 = create_loss("l2r", lam=0.01).penalty(lin)
    assert l1.item() == pytest.approx(0.01 * np.abs(w).sum(), rel=1e-6)   # 0.0525
    assert l2.item() == pytest.approx(0.01 * (w ** 2).sum(), rel=1e-6)    # 0.078125
    (l1 + l2).backward()
    assert lin.bias.grad is None
    expected = 0.01 * np.sign(w) + 0.02 * w
    assert np.allclose(lin.weight.grad.numpy(), expected, atol=1e-7)


def test_penalty_uses_the_head_when_there_is_one():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Linear(3, 3)
            self.head = _linear()

    net = Net()
    with torch.no_grad():
        net.backbone.weight.fill_(100.0)
    assert create_loss("l1r", lam=1.0).penalty(net).item() == pytest.approx(5.25, rel=1e-6)
    assert create_loss("l2r", lam=0.0).penalty(net) == 0.0
    # the loss part is AN
    x, obs = _logits(), _obs()
    assert create_loss("l1r")(x, obs).item() == create_loss("an")(x, obs).item()


# --- APL schedule -----------------------------------------------------------------------------
def _apl_setup():
    """30 rows x 3 classes; U = (20, 20, 14): per-round counts int(0.9*U/4) = (4, 4, 3)."""
    obs = np.zeros((30, 3), dtype=np.int8)
    obs[np.arange(30), np.arange(30) % 3] = P
    obs[[1, 4, 7, 10, 13, 16], 2] = N
    return torch.tensor(obs)


def test_apl_schedule_matches_the_official_rule():
    T, warmup, theta = 6, 2, 0.9
    obs = _apl_setup()
    z = obs.numpy()
    unobs0 = z == U
    u_c = unobs0.sum(axis=0)
    assert u_c.tolist() == [20, 20, 14]
    per_round = [int(theta * u / (T - warmup)) for u in u_c]
    assert per_round == [4, 4, 3]

    loss = create_loss("em_apl", theta=theta, warmup=warmup)
    loss.on_train_start(obs, TrainInfo(30, 3, num_epochs=T))
    assert loss.per_epoch_counts() == per_round
    rng = np.random.RandomState(0)
    mask = np.zeros((30, 3), dtype=bool)
    target = np.zeros((30, 3))
    for epoch in range(T):
        logits = rng.randn(30, 3).astype(np.float32)
        loss.on_epoch_start(epoch)
        loss.on_epoch_end(epoch, torch.from_numpy(logits))
        p = torch.sigmoid(torch.from_numpy(logits)).double().numpy()
        if epoch + 1 >= warmup:  # official: 1-based epoch >= warmup_epoch
            for c in range(3):
                cand = np.flatnonzero(unobs0[:, c] & ~mask[:, c])
                pick = cand[np.argsort(p[cand, c], kind="stable")[:per_round[c]]]
                assert len(pick) == min(per_round[c], len(cand))
                mask[pick, c] = True
                target[pick, c] = p[pick, c]
        got_mask, got_target = loss.pseudo_labels()
        assert np.array_equal(got_mask.numpy(), mask), f"epoch {epoch}"
        assert np.allclose(got_target.numpy(), target, rtol=0, atol=1e-7), f"epoch {epoch}"
        if epoch == 0:
            assert not got_mask.any()  # nothing before the warm-up ends

    # 5 rounds (0-based epochs 1..5): class 0/1 exactly exhausted, class 2 capped at its 14
    assert mask.sum(axis=0).tolist() == [20, 20, 14]
    assert not (mask & (z != U)).any()  # observed entries are never pseudo-labelled


def test_apl_selects_lowest_never_revisits_and_freezes_targets():
    obs = torch.tensor([[P, U], [U, P], [U, U], [U, U]])
    loss = create_loss("em_apl", theta=1.0, warmup=1)
    loss.on_train_start(obs, TrainInfo(4, 2, num_epochs=3))   # per round: int(U_c / 2) = (1, 1)
    first = torch.tensor([[9.0, -1.0], [-2.0, 9.0], [-1.0, -3.0], [0.0, 0.5]])
    loss.on_epoch_end(0, first)
    mask, target = loss.pseudo_labels()
    assert mask.int().tolist() == [[0, 0], [1, 0], [0, 1], [0, 0]]
    assert target[1, 0].item() == pytest.approx(_sig(-2.0), rel=1e-6)
    assert target[2, 1].item() == pytest.approx(_sig(-3.0), rel=1e-6)
    # the already chosen entries now look the most negative: they must not be chosen again,
    # nor their targets change; the next lowest of the rest is taken instead
    second = torch.tensor([[9.0, -1.0], [-50.0, 9.0], [4.0, -50.0], [3.0, 2.0]])
    loss.on_epoch_end(1, second)
    mask, target2 = loss.pseudo_labels()
    assert mask.int().tolist() == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert target2[1, 0] == target[1, 0] and target2[2, 1] == target[2, 1]
    assert target2[3, 0].item() == pytest.approx(_sig(3.0), rel=1e-6)
    assert target2[0, 1].item() == pytest.approx(_sig(-1.0), rel=1e-6)


def test_lowest_per_class_ties_go_to_lower_rows():
    p = torch.tensor([[0.2, 0.5], [0.1, 0.5], [0.1, 0.5], [0.3, 0.5]])
    cand = torch.tensor([[1, 1], [0, 1], [1, 1], [1, 1]], dtype=torch.bool)
    got = zhou.lowest_per_class(p, cand, torch.tensor([2, 3]))
    assert got.int().tolist() == [[1, 1], [0, 1], [1, 1], [0, 0]]


def test_apl_without_epochs_after_warmup_is_em():
    obs = torch.tensor([[P, U, U], [U, P, U]])
    loss = create_loss("em_apl", warmup=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss.on_train_start(obs, TrainInfo(2, 3, num_epochs=5))
    assert any("no pseudo-label" in str(w.message) for w in caught)
    for epoch in range(5):
        loss.on_epoch_end(epoch, torch.zeros(2, 3))
    assert not loss.pseudo_mask.any()


def test_apl_errors_name_the_problem():
    loss = create_loss("em_apl", warmup=0)
    with pytest.raises(RuntimeError, match="on_train_start"):
        loss.on_epoch_end(0, torch.zeros(2, 3))
    loss.on_train_start(torch.tensor([[P, U, U], [U, P, U]]), TrainInfo(2, 3, num_epochs=4))
    with pytest.raises(ValueError, match="train_logits"):
        loss.on_epoch_end(0, None)
    with pytest.raises(ValueError, match="every train row"):
        loss.on_epoch_end(0, torch.zeros(3, 3))
    with pytest.raises(ValueError, match="index"):
        loss(torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="TrainInfo"):
        loss.on_train_start(torch.zeros(2, 3), TrainInfo(5, 3, num_epochs=4))


def test_apl_state_round_trip_into_a_fresh_instance():
    obs = _apl_setup()
    info = TrainInfo(30, 3, num_epochs=6)
    rng = np.random.RandomState(1)
    seq = [torch.from_numpy(rng.randn(30, 3).astype(np.float32)) for _ in range(6)]
    loss = create_loss("em_apl", warmup=2)
    loss.on_train_start(obs, info)
    for epoch in range(3):
        loss.on_epoch_end(epoch, seq[epoch])
    assert loss.pseudo_mask.sum().item() == 2 * (4 + 4 + 3)

    buf = io.BytesIO()
    torch.save(loss.state_dict(), buf)
    buf.seek(0)
    fresh = create_loss("em_apl", warmup=2)
    fresh.load_state_dict(torch.load(buf))
    for name in ("pseudo_mask", "pseudo_target", "unobserved", "class_unobserved",
                 "total_epochs"):
        assert torch.equal(getattr(fresh, name), getattr(loss, name)), name
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(2))
    rows = torch.tensor([3, 0, 7, 29])
    assert torch.equal(fresh(x, obs[rows], index=rows), loss(x, obs[rows], index=rows))

    # resuming: on_train_start with the same labels keeps the state; the schedule continues
    fresh.on_train_start(obs, info)
    for epoch in range(3, 6):
        loss.on_epoch_end(epoch, seq[epoch])
        fresh.on_epoch_end(epoch, seq[epoch])
    assert torch.equal(fresh.pseudo_mask, loss.pseudo_mask)
    assert torch.equal(fresh.pseudo_target, loss.pseudo_target)
    # other labels reset it
    other = obs.clone()
    other[0, 1] = N
    fresh.on_train_start(other, info)
    assert not fresh.pseudo_mask.any()
    assert fresh.class_unobserved.tolist() == [20, 19, 14]


# --- registry ---------------------------------------------------------------------------------
def test_registry_official_defaults():
    em = LOSSES.get("em").dataset_defaults
    assert {d: v["alpha"] for d, v in em.items()} == {"voc": 0.2, "coco": 0.1, "nuswide": 0.1,
                                                       "cub": 0.01}
    apl = LOSSES.get("em_apl").dataset_defaults
    assert {d: (v["alpha"], v["beta"], v["warmup"]) for d, v in apl.items()} == {
        "voc": (0.2, 0.02, 5), "coco": (0.1, 0.9, 5), "nuswide": (0.1, 0.2, 4),
        "cub": (0.01, 0.4, 3)}
    assert {d: (v["batch_size"], v["lr"]) for d, v in zhou.OFFICIAL_TRAINING.items()} == {
        "voc": (8, 1e-5), "coco": (16, 1e-5), "nuswide": (16, 1e-5), "cub": (8, 1e-4)}
    loss = create_loss("em_apl", **LOSSES.get("em_apl").hparams_for("cub"))
    assert (loss.alpha, loss.beta, loss.theta, loss.warmup) == (0.01, 0.4, 0.9, 3)
    for name in NAMES:
        assert isinstance(create_loss(name), contract.SPMLLoss)
    flags = create_loss("em_apl")
    assert flags.needs_index and flags.needs_train_predictions


def test_apl_selects_the_same_pseudo_labels_class_block_by_class_block(monkeypatch):
    """APL's selection sorted the whole N x L matrix at once (~36 bytes an entry at the epoch
    end: 10.9 GB at 50k rows x 5k classes); it goes by blocks of classes, each class chosen
    on its own, so the pseudo-labels are the same whatever the block."""
    from spmlkit.losses import zhou

    g = torch.Generator().manual_seed(0)
    observed = torch.zeros(50, 9, dtype=torch.int8)
    observed[torch.arange(50), torch.randint(0, 9, (50,), generator=g)] = 1
    logits = [torch.randn(50, 9, generator=g) for _ in range(3)]

    def pseudo(block):
        monkeypatch.setattr(zhou, "SELECT_BLOCK", block)
        loss = create_loss("em_apl", warmup=1)
        loss.on_train_start(observed, TrainInfo(50, 9, seed=0, num_epochs=4))
        for epoch, lo in enumerate(logits):
            loss.on_epoch_start(epoch)
            loss.on_epoch_end(epoch, lo)
        return loss.pseudo_labels()

    whole, by_two = pseudo(1 << 22), pseudo(100)  # all 9 classes at once; 2 at a time
    assert whole[0].sum() > 0
    assert torch.equal(whole[0], by_two[0]) and torch.equal(whole[1], by_two[1])
