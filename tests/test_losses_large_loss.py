"""Large-loss methods (spmlkit.losses.large_loss): k per batch and epoch, which entries are
rejected / corrected, LL-Cp's permanent flips, state, gradients.

Expected values are computed here with ``math`` from docs/spec.md#large-loss (BCE on assume-negative
targets = softplus(s) for target 0, softplus(-s) for target 1), not with the code under test.
The gradcheck runs directly on float64 logits: the computation keeps float64 input in float64
(``spmlkit.losses.contract.as_compute``), and the check calls ``entries()``.
"""
from __future__ import annotations

import io
import math

import pytest
import torch

from spmlkit.labels import NEGATIVE, POSITIVE, UNOBSERVED
from spmlkit.losses import TrainInfo, create_loss
from spmlkit.losses.large_loss import large_loss_k, select_large_losses

P, U, N = POSITIVE, UNOBSERVED, NEGATIVE


def softplus(x: float) -> float:
    return math.log1p(math.exp(-abs(x))) + max(x, 0.0)


def _info(n, num_classes):
    return TrainInfo(num_examples=n, num_classes=num_classes, k=1.0, seed=0, num_epochs=10)


# the 2 x 3 example: unobserved AN losses softplus(s) = 2.127 (0,1), 0.313 (0,2),
# 1.701 (1,0), 0.693 (1,2): the two largest are (0,1) and (1,0)
S = [[0.5, 2.0, -1.0], [1.5, 0.3, 0.0]]
Z = [[P, U, U], [U, P, U]]
TOP2 = [[False, True, False], [True, False, False]]


def _logits(requires_grad=False, dtype=torch.float32):
    return torch.tensor(S, dtype=dtype, requires_grad=requires_grad)


def _obs():
    return torch.tensor(Z, dtype=torch.int8)


# --- the schedule of k -------------------------------------------------------------------------
def test_k_grows_per_epoch_for_r_and_ct_and_is_constant_for_cp():
    # B * L = 20, Delta = 10 % -> 2 more entries per epoch; nothing in epoch 0 (the paper's t = 1)
    assert [large_loss_k(4, 5, e, 10.0, "r") for e in range(5)] == [0, 2, 4, 6, 8]
    assert [large_loss_k(4, 5, e, 10.0, "ct") for e in range(5)] == [0, 2, 4, 6, 8]
    assert [large_loss_k(4, 5, e, 10.0, "cp") for e in range(5)] == [0, 2, 2, 2, 2]
    # the ceiling: 16 * 20 * 0.002 = 0.64 -> 1, 1.28 -> 2, 1.92 -> 2, 2.56 -> 3
    assert [large_loss_k(16, 20, e, 0.2) for e in range(1, 5)] == [1, 2, 2, 3]
    assert large_loss_k(16, 20, 3, 0.0) == 0


def test_k_official_rounding_reproduces_the_running_clean_rate_drift():
    # VOC, B = 16, delta_rel = 0.5, paper epoch 6: 320 * 5 * 0.005 = 8 exactly, but the official
    # clean_rate after five subtractions of 0.005 leaves 1 - clean_rate = 0.025000000000000022
    clean = 1.0
    for _ in range(5):
        clean -= 0.005
    assert math.ceil(320 * (1 - clean)) == 9
    assert large_loss_k(16, 20, 5, 0.5) == 8
    assert large_loss_k(16, 20, 5, 0.5, k_rounding="official") == 9
    loss = create_loss("ll_r", delta_rel=0.5, k_rounding="official")
    loss.on_epoch_start(5)
    assert loss.k_for(16, 20) == 9


def test_k_comes_from_on_epoch_start():
    loss = create_loss("ll_ct", delta_rel=10.0)
    assert loss.k_for(4, 5) == 0
    loss.on_epoch_start(3)
    assert int(loss.current_epoch) == 3 and loss.k_for(4, 5) == 6
    loss.on_epoch_start(1)
    assert loss.k_for(4, 5) == 2 and loss.k_for(2, 5) == 1  # a smaller last batch


# --- selection ---------------------------------------------------------------------------------
def test_epoch_zero_is_plain_assume_negative_bce():
    loss = create_loss("ll_r", delta_rel=50.0)
    loss.on_epoch_start(0)
    expected = sum(softplus(-s) if z == P else softplus(s)
                   for row_s, row_z in zip(S, Z) for s, z in zip(row_s, row_z)) / 6
    assert loss(_logits(), _obs()).item() == pytest.approx(expected, rel=1e-6)
    assert not loss.last_selected.any()


@pytest.mark.parametrize("name", ["ll_r", "ll_ct"])
def test_rejected_and_corrected_values_by_hand(name):
    loss = create_loss(name, delta_rel=30.0)  # epoch 1: k = ceil(6 * 0.3) = 2
    loss.on_epoch_start(1)
    value = loss(_logits(), _obs())
    assert loss.last_selected.tolist() == TOP2
    kept = softplus(-0.5) + softplus(-1.0) + softplus(-0.3) + softplus(0.0)
    changed = 0.0 if name == "ll_r" else softplus(-2.0) + softplus(-1.5)
    assert value.item() == pytest.approx((kept + changed) / 6, rel=1e-6)
    # per entry: the rejected entries are 0, the corrected ones -log p
    mat = create_loss(name, delta_rel=30.0, reduction="none")
    mat.on_epoch_start(1)
    m = mat(_logits(), _obs())
    assert m[0, 1].item() == pytest.approx(0.0 if name == "ll_r" else softplus(-2.0), abs=1e-6)
    assert m[1, 2].item() == pytest.approx(softplus(0.0), rel=1e-6)


def test_k_is_clamped_to_the_unobserved_entries_and_observed_are_never_selected():
    loss = create_loss("ll_r", delta_rel=100.0)  # k = 6 * 2 = 12 > 4 unobserved entries
    loss.on_epoch_start(2)
    s = torch.tensor([[-100.0, 2.0, -1.0], [1.5, -100.0, 0.0]])  # observed positives at -100
    value = loss(s, _obs())
    assert loss.last_selected.tolist() == [[False, True, True], [True, False, True]]
    # only the two observed positives keep a loss: softplus(100) each
    assert value.item() == pytest.approx(200.0 / 6, rel=1e-6)
    # an observed negative with a huge loss is not a candidate either
    loss2 = create_loss("ll_r", delta_rel=20.0)
    loss2.on_epoch_start(1)  # k = ceil(3 * 0.2) = 1
    loss2(torch.tensor([[0.0, 50.0, 1.0]]), torch.tensor([[P, N, U]]))
    assert loss2.last_selected.tolist() == [[False, False, True]]


def test_ties_at_the_threshold_are_all_selected():
    loss = create_loss("ll_r", delta_rel=10.0)  # k = ceil(6 * 0.1) = 1
    loss.on_epoch_start(1)
    s = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, -2.0]])
    loss(s, torch.tensor([[P, U, U], [U, P, U]]))
    assert loss.last_selected.tolist() == [[False, True, True], [False, False, False]]


def test_select_large_losses_threshold():
    loss = torch.tensor([[3.0, 1.0, 2.0, 5.0]])
    unobs = torch.tensor([[True, True, True, False]])
    sel, thr = select_large_losses(loss, unobs, 2)
    assert sel.tolist() == [[True, False, True, False]] and thr.item() == 2.0
    sel, thr = select_large_losses(loss, torch.zeros_like(unobs), 3)
    assert not sel.any() and thr.item() == float("-inf")  # no candidate
    sel, thr = select_large_losses(loss, unobs, 5)  # k clamped to the 3 candidates
    assert sel.tolist() == [[True, True, True, False]] and thr.item() == 1.0
    sel, thr = select_large_losses(loss, unobs, 0)
    assert not sel.any() and thr is None


def test_gradient_is_zero_on_rejected_entries_and_bce_elsewhere():
    for name, target_of_selected in (("ll_r", None), ("ll_ct", 1.0)):
        loss = create_loss(name, delta_rel=30.0)
        loss.on_epoch_start(1)
        s = _logits(requires_grad=True)
        loss(s, _obs()).backward()
        for i in range(2):
            for j in range(3):
                p = 1 / (1 + math.exp(-S[i][j]))
                y = 1.0 if Z[i][j] == P else 0.0
                if TOP2[i][j]:
                    expect = 0.0 if target_of_selected is None else (p - target_of_selected) / 6
                else:
                    expect = (p - y) / 6
                assert s.grad[i, j].item() == pytest.approx(expect, abs=1e-7)


@pytest.mark.parametrize("name", ["ll_r", "ll_ct", "ll_cp"])
def test_gradcheck_float64(name):
    loss = create_loss(name, delta_rel=30.0)
    loss.on_train_start(_obs(), _info(2, 3))
    loss.on_epoch_start(1)
    loss.eval()  # ll_cp: no flips while gradcheck evaluates many times
    idx = torch.tensor([0, 1])

    def f(s):
        mat, _ = loss.entries(s, _obs(), idx)
        assert mat.dtype == torch.float64
        return mat.sum() / mat.numel()

    assert torch.autograd.gradcheck(f, (_logits(True, torch.float64),))


# --- LL-Cp: permanent flips --------------------------------------------------------------------
def _cp_setup(**kw):
    observed = torch.tensor([[P, U, U], [U, P, U], [U, U, P], [P, U, U]], dtype=torch.int8)
    loss = create_loss("ll_cp", delta_rel=10.0, **kw)  # k = ceil(B * 3 * 0.1) = 1 for B = 2
    loss.on_train_start(observed, _info(4, 3))
    return loss, observed


def test_ll_cp_flip_persists_into_the_next_batch_and_epoch():
    loss, observed = _cp_setup()
    assert loss.needs_index
    rows = torch.tensor([2, 0])
    s = torch.tensor([[0.1, 3.0, 2.0], [1.0, -1.0, 0.5]])  # largest unobserved loss: row 2, class 1
    loss.on_epoch_start(0)
    loss(s, observed[rows], index=rows)
    assert not loss.flipped.any()  # epoch 0: nothing
    loss.on_epoch_start(1)
    v = loss(s, observed[rows], index=rows)
    assert loss.last_selected.tolist() == [[False, True, False], [False, False, False]]
    # temporary correction in this batch: target 1 on the selected entry
    expected = (softplus(0.1) + softplus(-3.0) + softplus(-2.0)
                + softplus(-1.0) + softplus(-1.0) + softplus(0.5)) / 6
    assert v.item() == pytest.approx(expected, rel=1e-6)
    assert loss.observed_labels[2].tolist() == [U, P, P]
    assert loss.flipped.nonzero().tolist() == [[2, 1]]
    # next batch, same row, the ORIGINAL observed labels passed in: the stored flip wins
    rows2 = torch.tensor([2, 3])
    s2 = torch.tensor([[0.0, -2.0, 1.0], [2.0, -3.0, -4.0]])
    v2 = loss(s2, observed[rows2], index=rows2)
    # (2, 1) is now an observed positive (target 1, not a candidate); the largest unobserved
    # loss is (2, 0) = softplus(0) vs (3, 1) softplus(-3), (3, 2) softplus(-4) -> (2, 0) flipped
    assert loss.last_selected.tolist() == [[True, False, False], [False, False, False]]
    expected2 = (softplus(-0.0) + softplus(2.0) + softplus(-1.0)
                 + softplus(-2.0) + softplus(-3.0) + softplus(-4.0)) / 6
    assert v2.item() == pytest.approx(expected2, rel=1e-6)
    assert loss.observed_labels[2].tolist() == [P, P, P]
    # next epoch: k stays ceil(B * L * Delta); the flips stay
    loss.on_epoch_start(5)
    assert loss.k_for(2, 3) == 1
    loss(s2, observed[rows2], index=rows2)  # row 2 has nothing unobserved left: (3, 1) next
    assert loss.flipped.nonzero().tolist() == [[2, 0], [2, 1], [3, 1]]
    # ll_ct at the same step keeps nothing
    ct = create_loss("ll_ct", delta_rel=10.0)
    ct.on_epoch_start(1)
    ct(s, observed[rows])
    assert not hasattr(ct, "observed_labels")


def test_ll_cp_does_not_flip_in_eval_mode_and_above_flips_strictly():
    loss, observed = _cp_setup()
    loss.on_epoch_start(1)
    rows = torch.tensor([0, 1])
    s = torch.tensor([[0.0, 3.0, 2.0], [1.0, 0.0, 0.5]])
    loss.eval()
    loss(s, observed[rows], index=rows)
    assert loss.last_selected.sum() == 1 and not loss.flipped.any()
    loss.train()
    strict, _ = _cp_setup(flip="above")  # the official correction_idx: > threshold (top k-1)
    strict.on_epoch_start(1)
    v_strict = strict(s, observed[rows], index=rows)
    v_default = loss(s, observed[rows], index=rows)
    assert v_strict.item() == pytest.approx(v_default.item())  # same temporary correction
    assert strict.last_selected.sum() == 1 and not strict.flipped.any()
    assert loss.flipped.nonzero().tolist() == [[0, 1]]


def test_ll_cp_state_round_trip_into_a_fresh_instance():
    loss, observed = _cp_setup()
    loss.on_epoch_start(1)
    rows = torch.tensor([0, 1])
    loss(torch.tensor([[0.0, 3.0, 2.0], [1.0, 0.0, 0.5]]), observed[rows], index=rows)
    buf = io.BytesIO()
    torch.save(loss.state_dict(), buf)
    buf.seek(0)
    fresh = create_loss("ll_cp", delta_rel=10.0)
    fresh.load_state_dict(torch.load(buf))
    assert torch.equal(fresh.observed_labels, loss.observed_labels)
    assert torch.equal(fresh.flipped, loss.flipped)
    assert int(fresh.current_epoch) == 1
    fresh.eval(), loss.eval()
    s = torch.tensor([[0.3, -1.0, 0.2], [0.4, 0.1, -0.3]])
    rows = torch.tensor([0, 3])
    assert fresh(s, observed[rows], index=rows).item() == loss(s, observed[rows], index=rows).item()
    # on_train_start with the same labels keeps the flips (resume); other labels reset them
    fresh.on_train_start(observed, _info(4, 3))
    assert fresh.flipped.sum() == 1
    fresh.on_train_start(torch.full((4, 3), U, dtype=torch.int8), _info(4, 3))
    assert not fresh.flipped.any()


def test_ll_r_epoch_survives_state_dict():
    loss = create_loss("ll_r", delta_rel=10.0)
    loss.on_epoch_start(4)
    fresh = create_loss("ll_r", delta_rel=10.0)
    fresh.load_state_dict(loss.state_dict())
    assert fresh.k_for(4, 5) == 8


# --- contract ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ll_r", "ll_ct", "ll_cp"])
def test_finite_at_saturated_logits_and_zero_for_empty_batch(name):
    loss = create_loss(name, delta_rel=30.0)
    obs = torch.tensor([[P, U, U], [U, P, N]], dtype=torch.int8)
    loss.on_train_start(obs, _info(2, 3))
    loss.on_epoch_start(2)
    s = torch.tensor([[100.0, -100.0, 100.0], [-100.0, 100.0, 100.0]], requires_grad=True)
    v = loss(s, obs, index=torch.arange(2))
    v.backward()
    assert torch.isfinite(v) and torch.isfinite(s.grad).all()
    empty = loss(s[:0], obs[:0], index=torch.arange(0))
    assert empty.item() == 0.0 and empty.requires_grad


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="delta_rel"):
        create_loss("ll_r", delta_rel=-1.0)
    with pytest.raises(ValueError, match="flip"):
        create_loss("ll_cp", flip="strict")
    with pytest.raises(ValueError, match="k_rounding"):
        create_loss("ll_ct", k_rounding="floor")
    with pytest.raises(RuntimeError, match="on_train_start"):
        create_loss("ll_cp")(_logits(), _obs(), index=torch.arange(2))
    with pytest.raises(ValueError, match="index"):
        create_loss("ll_cp")(_logits(), _obs())


def test_ll_cp_flips_nothing_at_evaluation_calls():
    """A train-loss pass under ``torch.no_grad()`` (the loss left in training mode, as a
    researcher's logging does) flips no label; a training call does."""
    torch.manual_seed(0)
    n, c = 40, 5
    obs = torch.zeros(n, c, dtype=torch.long)
    obs[torch.arange(n), torch.randint(0, c, (n,))] = POSITIVE
    loss = create_loss("ll_cp", delta_rel=10.0)
    loss.on_train_start(obs, TrainInfo(n, c))
    loss.on_epoch_start(1)
    logits = torch.randn(8, c)
    with torch.no_grad():
        loss(logits, obs[:8], index=torch.arange(8))
    assert int(loss.flipped.sum()) == 0
    loss(logits.requires_grad_(), obs[:8], index=torch.arange(8))
    assert int(loss.flipped.sum()) > 0
