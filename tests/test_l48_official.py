"""The L48 benchmark's masked losses and asset regulariser against its authors' own code.

``tests/fixtures/l48_official.npz`` was made by ``tests/fixtures/make_l48_official.py`` from
cvl-umass/l48-benchmarking at commit 58252e9 (their ``losses/*.py`` run unchanged, and
``train.py``'s known-negative weighting ``--neg-prior-a 2``). Their mask marks the annotated
entries: an annotated 1 is our observed positive (1), an annotated 0 our known negative (-1), an
unannotated entry our unobserved 0. Where our loss computes another thing, the test says what,
and so does the methods catalogue (``neg_weight`` and the L48 losses).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from spmlkit.losses import TrainInfo, create_loss

FIXTURE = Path(__file__).parent / "fixtures" / "l48_official.npz"
TOL = 1e-6
NEG_A = 2.0  # their --neg-prior-a in the fixture


@pytest.fixture(scope="module")
def pins():
    return dict(np.load(FIXTURE))


def _observed(labels, mask) -> np.ndarray:
    return np.where((labels == 1) & (mask == 1), 1, np.where(mask == 1, -1, 0)).astype(np.int8)


def _ours(pins, name, dtype=torch.float64, epoch=None, **hp):
    obs = torch.tensor(_observed(pins["labels"], pins["mask"]))
    x = torch.tensor(pins["logits"], dtype=dtype, requires_grad=True)
    loss = create_loss(name, reduction="none", **hp)
    if epoch is not None:
        loss.on_train_start(obs, TrainInfo(obs.shape[0], obs.shape[1]))
        loss.on_epoch_start(epoch)
    mat = loss(x, obs)
    mat.mean().backward()
    return mat.detach().numpy(), x.grad.numpy(), obs.numpy()


def test_the_fixture_names_its_commit(pins):
    assert str(pins["meta"][0]) == "cvl-umass/l48-benchmarking@58252e9"
    assert f"neg_prior_a={NEG_A}" in pins["meta"].tolist()


@pytest.mark.parametrize("theirs, ours, hp, rtol", [
    # AssumeNegativeLoss: -(y log(p + 1e-5) + (1 - y) log(1 - p + 1e-5)), mask unused
    ("BCE", "an", {"eps": 1e-5}, 0.0),
    # IgnoreLargeLoss('rejection', delta=0.2) at their epoch 3: frac = 0.2 * (3 - 1) of the
    # batch's entries, ceil; our delta_rel is a percentage a epoch and our epoch counts from 0
    ("LL", "ll_r", {"delta_rel": 20.0, "k_rounding": "official", "epoch": 2}, 0.0),
    # LabelSmoothingLoss(0.1): targets 1 - e/2 and e/2, our "paper" convention; theirs takes
    # log(sigmoid) in float32, so relative 1e-6
    ("LSL", "an_ls", {"smoothing": 0.1, "convention": "paper"}, TOL),
])
def test_masked_loss_with_known_negatives_weighted_equals_theirs(pins, theirs, ours, hp, rtol):
    """Their matrix after ``loss[known_negs] *= neg_prior_a`` is our ``neg_weight`` on O-."""
    hp = dict(hp)
    epoch = hp.pop("epoch", None)
    mat, grad, _ = _ours(pins, ours, epoch=epoch, neg_weight=NEG_A, **hp)
    np.testing.assert_allclose(mat, pins[f"{theirs}_matrix"], rtol=rtol, atol=TOL)
    np.testing.assert_allclose(grad, pins[f"{theirs}_grad"], rtol=rtol, atol=TOL)
    assert abs(mat.mean() - float(pins[f"{theirs}_value"])) <= TOL * max(1.0, abs(mat.mean()))


def test_weak_negatives_give_known_negatives_weight_one_where_our_wan_gives_gamma(pins):
    """WeakNegativesLoss down-weights only the unannotated entries; Cole's WAN (ours) weighs
    O- by gamma too. ``neg_weight = a / gamma`` reproduces theirs; ``neg_weight = a`` does
    not."""
    gamma = 1 / (pins["labels"].shape[1] - 1)
    mat, grad, obs = _ours(pins, "wan", gamma=gamma, neg_weight=NEG_A / gamma)
    np.testing.assert_allclose(mat, pins["WNL_matrix"], rtol=0, atol=TOL)
    np.testing.assert_allclose(grad, pins["WNL_grad"], rtol=0, atol=TOL)
    plain, _, _ = _ours(pins, "wan", gamma=gamma, neg_weight=NEG_A)
    assert np.abs(plain - pins["WNL_matrix"])[obs == -1].min() > 0.01
    np.testing.assert_allclose(plain[obs != -1], pins["WNL_matrix"][obs != -1], atol=TOL)


def test_entropy_maximisation_mixes_exact_and_official_logs(pins):
    """EntropyMaximizationLoss computes the annotated entries' BCE exactly and the entropy with
    ``log(p + 1e-5)``; our ``eps`` sets both: each part equals ours with its own ``eps``."""
    exact, _, obs = _ours(pins, "em", alpha=0.1, neg_weight=NEG_A)
    official, _, _ = _ours(pins, "em", alpha=0.1, eps=1e-5, neg_weight=NEG_A)
    theirs = pins["EML_matrix"]
    np.testing.assert_allclose(exact[obs != 0], theirs[obs != 0], rtol=0, atol=TOL)
    np.testing.assert_allclose(official[obs == 0], theirs[obs == 0], rtol=0, atol=TOL)
    assert np.abs(exact[obs == 0] - theirs[obs == 0]).max() > TOL  # the logs differ there


def test_role_differs_on_known_negatives_and_in_its_count_term(pins):
    """Their ROLELoss (train.py's: ``criterion(output, target, mask, g[idx])``) has no term of
    its own on a known negative (its expected-positive part keeps y == 1 only), and divides the
    count term by B * L once more. On the positive and unobserved entries, with their count
    term taken out, it equals ours with ``lam = 0`` and the same label estimates."""
    logits = torch.tensor(pins["logits"])
    pseudo = torch.tensor(pins["pseudo"])
    obs = torch.tensor(_observed(pins["labels"], pins["mask"]))
    batch, classes = obs.shape
    loss = create_loss("role", reduction="none", lam=0.0, k=1.5)
    loss.on_train_start(obs, TrainInfo(batch, classes, k=1.5))
    with torch.no_grad():
        loss.label_logits.copy_(pseudo)
    loss.on_epoch_start(0)
    ours = loss(logits, obs, index=torch.arange(batch)).detach().numpy()

    def count(s):
        return ((torch.sigmoid(s).sum() / batch - 1.5) / classes) ** 2 / (batch * classes)

    theirs = pins["ROLE_matrix"] - float(0.5 * (count(logits) + count(pseudo)))
    kept = obs.numpy() != -1
    np.testing.assert_allclose(ours[kept], theirs[kept], rtol=0, atol=TOL)
    assert np.abs(ours - theirs)[~kept].min() > 0.01


# --- the asset regulariser ----------------------------------------------------------------

def _asset(pins):
    loss = create_loss("an", asset_alpha=0.3, asset_eps=0.1, asset_init=0.5)
    obs = torch.tensor(_observed(pins["asset_labels"], pins["asset_mask"]))
    loss.bind_groups(pins["asset_groups"])
    loss.on_train_start(obs, TrainInfo(obs.shape[0], obs.shape[1]))
    return loss


def test_asset_regulariser_starts_as_theirs(pins):
    loss = _asset(pins)
    assert tuple(loss.asset_mean.shape) == (4, 100)
    np.testing.assert_array_equal(loss.asset_mean.numpy(), pins["asset_init"])


def test_asset_regulariser_value_gradient_and_update_equal_theirs(pins):
    """Three batches; the second holds two rows of one group (the later row's update stays)."""
    loss = _asset(pins)
    for t in range(3):
        x = torch.tensor(pins[f"asset_logits_{t}"], requires_grad=True)
        idx = torch.tensor(pins[f"asset_idx_{t}"])
        term = loss.asset_alpha * loss.asset_term(x, idx).mean()
        term.backward()
        assert abs(float(term.detach()) - float(pins[f"asset_value_{t}"])) <= TOL
        np.testing.assert_allclose(x.grad.numpy(), pins[f"asset_grad_{t}"], rtol=0, atol=TOL)
        np.testing.assert_allclose(loss.asset_mean.numpy(), pins[f"asset_state_{t}"], rtol=0,
                                   atol=TOL)


def test_asset_term_is_added_to_the_loss_as_their_train_loop_adds_it(pins):
    """``loss.mean() + reg(output, idx)``: our wrapped loss is the base loss plus the term."""
    loss = _asset(pins)
    base = create_loss("an")
    x = torch.tensor(pins["asset_logits_0"])
    idx = torch.tensor(pins["asset_idx_0"])
    obs = torch.tensor(_observed(pins["asset_labels"], pins["asset_mask"]))[idx]
    with torch.no_grad():
        value = loss(x, obs, index=idx)
    assert abs(float(value) - float(base(x, obs)) - float(pins["asset_value_0"])) <= TOL
    np.testing.assert_array_equal(loss.asset_mean.numpy(), pins["asset_init"])  # no update
