"""One loss object, run after run: ``on_train_start`` starts a run afresh (ROLE's estimates,
pseudo-labels, flips, corrections, priors, a k taken from the data), so a loop over seeds,
learning rates or label draws with one loss trains what a new loss would; a state restored
with ``load_state_dict`` (then ``on_train_start``) or carried on by linear_init continues.
Before, a second run with labels of the same shape kept the first run's state silently."""
from __future__ import annotations

import copy

import pytest
import torch

from spmlkit.engine import TrainConfig, fit_linear
from spmlkit.losses import LOSSES, TrainInfo, carry_state, create_loss

from test_losses_own_loop import HPARAMS, K, X, Z, _head, _loss

#: every registered loss whose on_train_start builds state (em_pl / gpr: from their scores)
STATEFUL = [n for n in LOSSES.names() if "on_train_start" in type(_loss(n)).__dict__ or
            "on_train_start" in create_loss(n).required_hooks()]
pytestmark = pytest.mark.filterwarnings("ignore:.*warmup.*num_epochs:UserWarning")


def _fit(loss, seed, z=Z, k=K):
    head, _ = fit_linear(X, z, loss, TrainConfig(epochs=3, batch_size=8, lr=0.05, seed=seed),
                         k=k, model=_head())
    return head


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_stateful_losses_are_covered():
    assert {"role", "epr", "em_apl", "ll_cp", "opml_sp", "crisp", "gpr"} <= set(STATEFUL)


@pytest.mark.parametrize("name", STATEFUL)
def test_a_second_run_of_one_loss_is_a_new_losss_run(name):
    """Seed 0, then seed 1 with the same loss object: the second head and the loss's state are
    those of a new loss trained with seed 1, bit for bit."""
    loss = _loss(name)
    _fit(loss, seed=0)
    again = _fit(loss, seed=1)
    fresh_loss = _loss(name)
    fresh = _fit(fresh_loss, seed=1)
    assert _equal(_state(again), _state(fresh)), name
    assert _equal(_state(loss), _state(fresh_loss)), name


def test_role_starts_afresh_on_other_labels_and_k():
    """The audit's case: same shape, other positives, other k and seed."""
    n, c = Z.shape
    other = torch.roll(Z, 1, dims=1)
    role = create_loss("role")
    role.on_train_start(Z, TrainInfo(n, c, k=1.5, seed=0))
    role.on_train_start(other, TrainInfo(n, c, k=3.0, seed=1))
    q = role.estimated_labels()
    assert torch.allclose(q[other == 1], torch.tensor(0.995))
    unknown = q[(other == 0)]
    assert bool(((unknown > 0.4) & (unknown < 0.6)).all()) and role.k == 3.0
    fresh = create_loss("role")
    fresh.on_train_start(other, TrainInfo(n, c, k=3.0, seed=1))
    assert torch.equal(role.label_logits, fresh.label_logits)
    assert create_loss("epr", k=2.0).k == 2.0  # a k given stays, run after run
    epr = create_loss("epr", k=2.0)
    epr.on_train_start(Z, TrainInfo(n, c, k=3.0))
    assert epr.k == 2.0 and epr.required_hooks() == ()


@pytest.mark.parametrize("name", ["role", "em_apl", "ll_cp", "opml_sp", "crisp"])
def test_a_restored_state_continues(name):
    """A loop of your own resumes: a new loss, ``load_state_dict``, then ``on_train_start``
    with the same labels keeps the state (in either order)."""
    loss = _loss(name)
    _fit(loss, seed=0)
    saved = _state(loss)
    n, c = Z.shape
    info = TrainInfo(n, c, k=K, seed=0, num_epochs=3)
    for order in ("load first", "start first"):
        other = _loss(name)
        if order == "start first":  # as the engine resumes: start, load, train
            other.on_train_start(Z, info)
        other.load_state_dict(copy.deepcopy(saved))
        assert _equal(_state(other), saved), (name, order)
        other.on_train_start(Z, info)  # the start after a load continues the restored state
        assert _equal(_state(other), saved), (name, order)
        other.on_train_start(Z, info)  # a further start: a new run (epoch counters at its
        fresh = _loss(name)            # first on_epoch_start)
        fresh.on_train_start(Z, info)
        other.on_epoch_start(0)
        fresh.on_epoch_start(0)
        assert _equal(_state(other), _state(fresh)), (name, order)


def test_carry_state_continues_a_run_and_is_cleared_by_the_next_start():
    loss = create_loss("role")
    _fit(loss, seed=0)
    trained = loss.label_logits.detach().clone()
    n, c = Z.shape
    carry_state(loss)
    loss.on_train_start(Z, TrainInfo(n, c, k=K, seed=0))
    assert torch.equal(loss.label_logits, trained)
    loss.on_train_start(Z, TrainInfo(n, c, k=K, seed=0))
    assert not torch.equal(loss.label_logits, trained)
    wrapped = create_loss("role", reg="highrank")  # the base loss inside a regulariser
    _fit(wrapped, seed=0)
    before = _state(wrapped)
    carry_state(wrapped)
    wrapped.on_train_start(Z, TrainInfo(n, c, k=K, seed=0))
    assert _equal(_state(wrapped), before)
    assert HPARAMS  # (the shared toy's hyperparameters are in use)
