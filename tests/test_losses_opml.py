"""OPML family (spmlkit.losses.opml): ZLPR, OPML, soft OPML, OPML-SP.

Expected values are computed here with ``math`` / numpy from docs/spec.md#opml, not with the
code under test. ``opml_row_loss`` keeps float64 (it promotes only below float32), so the
gradchecks run on it directly; the modules compute in float32, float64 input staying float64
(``spmlkit.losses.contract.as_compute``).
"""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from spmlkit.labels import NEGATIVE, POSITIVE, UNOBSERVED
from spmlkit.losses import TrainInfo, create_loss
from spmlkit.losses.opml import opml_row_loss

P, U, N = POSITIVE, UNOBSERVED, NEGATIVE


def sig(x):
    return 1 / (1 + math.exp(-x))


def hand_opml(s, z, alpha=1.0, beta=1.0, t=None):
    """One row: log(alpha + sum_N (1-t) e^s) + log(beta + sum_P e^-s + sum_N t e^-s)."""
    t = t or [0.0] * len(s)
    neg = alpha + sum((1 - tj) * math.exp(sj) for sj, zj, tj in zip(s, z, t) if zj != P)
    pos = beta + sum(math.exp(-sj) for sj, zj in zip(s, z) if zj == P)
    pos += sum(tj * math.exp(-sj) for sj, zj, tj in zip(s, z, t) if zj != P)
    return math.log(neg) + math.log(pos)


def _info(n, num_classes):
    return TrainInfo(num_examples=n, num_classes=num_classes, k=1.0, seed=0, num_epochs=10)


S = [[2.0, 0.0, -1.0, 0.5], [-0.3, 1.2, 0.4, -2.0]]
Z = [[P, U, U, U], [U, P, U, U]]


# --- values ------------------------------------------------------------------------------------
def test_opml_value_by_hand_with_alpha_and_beta():
    loss = create_loss("opml", a=0.25, b=0.8)  # alpha = 1/3, beta = 4
    v = loss(torch.tensor(S), torch.tensor(Z))
    rows = [hand_opml(s, z, 1 / 3, 4.0) for s, z in zip(S, Z)]
    assert v.item() == pytest.approx(sum(rows) / 2, rel=1e-6)
    # the first row written out: log(1/3 + e^0 + e^-1 + e^0.5) + log(4 + e^-2)
    first = math.log(1 / 3 + 1 + math.exp(-1) + math.exp(0.5)) + math.log(4 + math.exp(-2))
    assert rows[0] == pytest.approx(first)


def test_a_half_is_zlpr():
    gen = torch.Generator().manual_seed(0)
    s = 3 * torch.randn(5, 6, generator=gen)
    z = torch.full((5, 6), U)
    z[torch.arange(5), torch.tensor([0, 3, 5, 1, 1])] = P
    z[2, 4] = P
    zlpr = create_loss("zlpr")(s, z)
    assert create_loss("opml", a=0.5, b=0.5)(s, z).item() == pytest.approx(zlpr.item(), rel=1e-6)
    assert create_loss("opml")(s, z).item() == pytest.approx(zlpr.item(), rel=1e-6)
    hand = np.mean([math.log(1 + sum(math.exp(x) for x, y in zip(r, q) if y != P))
                    + math.log(1 + sum(math.exp(-x) for x, y in zip(r, q) if y == P))
                    for r, q in zip(s.tolist(), z.tolist())])
    assert zlpr.item() == pytest.approx(hand, rel=1e-6)
    assert create_loss("opml", a=0.3)(s, z).item() != pytest.approx(zlpr.item(), rel=1e-3)


def test_full_label_form_equals_single_positive_form_with_one_positive():
    s = torch.tensor([[0.7, -0.4, 1.9, 0.0]])
    loss = create_loss("opml", a=0.3, b=0.6)
    one_p = loss(s, torch.tensor([[P, U, U, U]]))
    full = loss(s, torch.tensor([[P, N, N, N]]))
    mixed = loss(s, torch.tensor([[P, N, U, N]]))
    assert one_p.item() == full.item() == mixed.item()


def test_opml_in_the_full_regime():
    s = [[0.3, -0.2, 0.5, -1.0], [1.0, 2.0, -0.5, 0.1]]
    z = [[P, P, N, N], [N, P, N, P]]
    v = create_loss("opml", a=0.7, b=0.4)(torch.tensor(s), torch.tensor(z))
    alpha, beta = 0.7 / 0.3, 0.4 / 0.6
    r0 = math.log(alpha + math.exp(0.5) + math.exp(-1.0)) + math.log(beta + math.exp(-0.3)
                                                                      + math.exp(0.2))
    r1 = math.log(alpha + math.exp(1.0) + math.exp(-0.5)) + math.log(beta + math.exp(-2.0)
                                                                      + math.exp(-0.1))
    assert v.item() == pytest.approx((r0 + r1) / 2, rel=1e-6)


def test_row_loss_fills_its_row_for_every_reduction():
    s, z = torch.tensor(S), torch.tensor(Z)
    rows = [hand_opml(a, b) for a, b in zip(S, Z)]
    mat = create_loss("zlpr", reduction="none")(s, z)
    assert mat.shape == (2, 4)
    assert torch.allclose(mat, torch.tensor(rows).unsqueeze(1).expand(2, 4), atol=1e-6)
    assert create_loss("zlpr", reduction="sum")(s, z).item() == pytest.approx(4 * sum(rows),
                                                                              rel=1e-6)


def test_rows_without_positive_or_without_negative():
    alpha, beta = 0.25 / 0.75, 0.3 / 0.7
    loss = create_loss("opml", a=0.25, b=0.3, reduction="none")
    v = loss(torch.tensor([[1.0, -1.0], [0.5, 2.0]]), torch.tensor([[U, U], [P, P]]))
    assert v[0, 0].item() == pytest.approx(math.log(alpha + math.e + math.exp(-1)) + math.log(beta),
                                           rel=1e-6)
    assert v[1, 0].item() == pytest.approx(math.log(alpha) + math.log(beta + math.exp(-0.5)
                                                                      + math.exp(-2.0)), rel=1e-6)


# --- gradients ---------------------------------------------------------------------------------
def test_gradients_in_closed_form():
    # beta = 1: d l / d s_p = sigmoid(s_p) - 1 (BCE's); negatives: e^{s_j} / (alpha + sum e^{s_k})
    s = torch.tensor([[0.8, -0.5, 1.5, 0.2]], requires_grad=True)
    create_loss("opml", a=0.2)(s, torch.tensor([[P, U, U, N]])).backward()
    alpha = 0.25
    denom = alpha + math.exp(-0.5) + math.exp(1.5) + math.exp(0.2)
    assert s.grad[0, 0].item() == pytest.approx(sig(0.8) - 1, rel=1e-6)
    for j, x in ((1, -0.5), (2, 1.5), (3, 0.2)):
        assert s.grad[0, j].item() == pytest.approx(math.exp(x) / denom, rel=1e-6)
        assert s.grad[0, j].item() < sig(x)  # negatives cannot dominate


def test_gradcheck_float64_hard_and_soft():
    gen = torch.Generator().manual_seed(1)
    s = torch.randn(3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([[1, 0, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    t = torch.rand(3, 5, generator=gen, dtype=torch.float64)
    t[0, 1], t[1, 4] = 0.0, 1.0  # the edges: log t = -inf, log(1 - t) = -inf
    assert opml_row_loss(s, pos, 0.5, 2.0).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda x: opml_row_loss(x, pos, 0.5, 2.0), (s,))
    assert torch.autograd.gradcheck(lambda x: opml_row_loss(x, pos, 0.5, 2.0, t), (s,))


@pytest.mark.parametrize("name", ["zlpr", "opml", "soft_opml", "opml_sp"])
def test_finite_at_saturated_logits_and_zero_for_empty_batch(name):
    loss = create_loss(name)
    z = torch.tensor([[P, U, U], [U, P, N]], dtype=torch.int8)
    loss.on_train_start(z, _info(2, 3))
    s = torch.tensor([[100.0, -100.0, 100.0], [-100.0, 100.0, 100.0]], requires_grad=True)
    loss.on_epoch_start(0)
    if loss.needs_train_predictions:
        loss.on_epoch_end(0, s.detach())
        loss.on_epoch_start(1)
    v = loss(s, z, index=torch.arange(2))
    v.backward()
    assert torch.isfinite(v) and torch.isfinite(s.grad).all()
    empty = loss(s[:0], z[:0], index=torch.arange(0))
    assert empty.item() == 0.0 and empty.requires_grad


def test_invalid_constants():
    for bad in (0.0, 1.0, -0.2, 1.5):
        with pytest.raises(ValueError, match="in \\(0, 1\\)"):
            create_loss("opml", a=bad)
    with pytest.raises(ValueError, match="b must be"):
        create_loss("opml", b=1.0)
    with pytest.raises(ValueError, match="gamma"):
        create_loss("soft_opml", gamma=-1.0)


# --- soft OPML ---------------------------------------------------------------------------------
TRAIN_Z = torch.tensor([[P, U], [U, P], [P, U], [U, U]], dtype=torch.int8)
# class 0: scores 0.9 0.8 0.7 0.1 vs labels 1 0 1 0 -> AP = (1 + 2/3) / 2 = 5/6
# class 1: scores 0.1 0.2 0.3 0.4 vs labels 0 1 0 0 -> the positive is 3rd -> AP = 1/3
TRAIN_S = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.1, 0.4]])


def test_soft_targets_from_a_known_ap():
    loss = create_loss("soft_opml", a=0.25, gamma=2.0)
    assert loss.needs_train_predictions and not loss.needs_index
    loss.on_train_start(TRAIN_Z, _info(4, 2))
    loss.on_epoch_end(0, TRAIN_S)
    assert loss.ap.tolist() == pytest.approx([5 / 6, 1 / 3])
    s = [[1.0, -0.5], [0.2, 0.7]]
    z = [[P, U], [U, P]]
    alpha = 1 / 3
    t01 = (1 / 3) ** 2 * sig(-0.5)
    t10 = (5 / 6) ** 2 * sig(0.2)
    r0 = math.log(alpha + (1 - t01) * math.exp(-0.5)) + math.log(1 + math.exp(-1.0)
                                                                 + t01 * math.exp(0.5))
    r1 = math.log(alpha + (1 - t10) * math.exp(0.2)) + math.log(1 + math.exp(-0.7)
                                                                + t10 * math.exp(-0.2))
    assert r0 == pytest.approx(hand_opml(s[0], z[0], alpha, 1.0, [0.0, t01]))
    v = loss(torch.tensor(s), torch.tensor(z))
    assert v.item() == pytest.approx((r0 + r1) / 2, rel=1e-6)
    # observed negatives keep hard targets: [P, N] is plain OPML
    hard = create_loss("opml", a=0.25)(torch.tensor(s), torch.tensor([[P, N], [N, P]]))
    assert loss(torch.tensor(s), torch.tensor([[P, N], [N, P]])).item() == pytest.approx(
        hard.item(), rel=1e-6)


def test_soft_opml_before_any_ap_is_plain_opml():
    s, z = torch.tensor(S), torch.tensor(Z)
    assert create_loss("soft_opml", a=0.3)(s, z).item() == pytest.approx(
        create_loss("opml", a=0.3)(s, z).item(), rel=1e-6)


def test_class_without_observed_positive_gets_ap_zero():
    loss = create_loss("soft_opml")
    z = torch.tensor([[P, U, U], [U, P, U]], dtype=torch.int8)
    loss.on_train_start(z, _info(2, 3))
    loss.on_epoch_end(0, torch.tensor([[2.0, 0.0, 1.0], [0.0, 1.0, 3.0]]))
    assert loss.ap.tolist() == [1.0, 1.0, 0.0]


# --- label correction --------------------------------------------------------------------------
CORR_Z = torch.tensor([[P, U]] * 4 + [[U, P]] * 2 + [[U, U]] * 2, dtype=torch.int8)
# class 0: the 4 observed positives score highest -> AP 1; unobserved rows 4..7 score
#   0.1, 0.5, 0.3, -1 -> order 5, 6, 4, 7
# class 1: positives rows 4, 5; ranking 0 (3.0), 4 (2.0), 1 (1.0), 5 (0.5), ...
#   -> AP = (1/2 + 2/4) / 2
CORR_S = torch.tensor([[5.0, 3.0], [4.0, 1.0], [3.0, -1.0], [2.0, -2.0],
                       [0.1, 2.0], [0.5, 0.5], [0.3, -3.0], [-1.0, -4.0]])


def _corrected(loss):
    return [sorted(torch.nonzero(loss.corrected[:, j]).flatten().tolist()) for j in range(2)]


def test_label_correction_counts_per_class():
    loss = create_loss("soft_opml", correction_ratio=0.5, warmup=1)
    assert loss.needs_index
    loss.on_train_start(CORR_Z, _info(8, 2))
    loss.on_epoch_end(0, CORR_S)  # warm-up: AP only
    assert loss.ap.tolist() == pytest.approx([1.0, 0.5])
    assert not loss.corrected.any()
    # n_0 = floor(0.5 * 1 * 4) = 2 -> rows 5, 6; n_1 = floor(0.5 * 0.5 * 2) = 0
    assert loss.correction_counts().tolist() == [2, 0]
    loss.on_epoch_end(1, CORR_S)
    assert _corrected(loss) == [[5, 6], []]
    assert loss.observed_labels[5].tolist() == [P, P] and loss.observed_labels[6].tolist() == [P, U]
    # the next epoch: AP still against the original positives, 2 more (rows 4, 7)
    loss.on_epoch_end(2, CORR_S)
    assert loss.ap.tolist() == pytest.approx([1.0, 0.5])
    assert _corrected(loss) == [[4, 5, 6, 7], []]
    # r = 1: n_0 = 4 (all four unobserved), n_1 = floor(1 * 0.5 * 2) = 1 -> row 0
    big = create_loss("soft_opml", correction_ratio=1.0, warmup=0)
    big.on_train_start(CORR_Z, _info(8, 2))
    big.on_epoch_end(0, CORR_S)
    assert _corrected(big) == [[4, 5, 6, 7], [0]]
    # AP and n_j stay measured on the ORIGINAL positives (with row 0 counted, class 1's AP
    # would be (1 + 1 + 3/4) / 3 and n_1 = floor(3 * 0.92) = 2): one more, row 1
    big.on_epoch_end(1, CORR_S)
    assert big.ap.tolist() == pytest.approx([1.0, 0.5])
    assert _corrected(big) == [[4, 5, 6, 7], [0, 1]]


def test_corrected_labels_override_the_batch_labels():
    loss = create_loss("soft_opml", a=0.25, correction_ratio=0.5, warmup=0, gamma=1.0)
    loss.on_train_start(CORR_Z, _info(8, 2))
    loss.on_epoch_end(0, CORR_S)  # rows 5, 6 of class 0 become positives; AP = [1, 0.5]
    s = torch.tensor([[0.4, -0.6], [1.2, 0.3]])
    rows = torch.tensor([5, 6])
    v = loss(s, CORR_Z[rows], index=rows)
    alpha = 1 / 3
    r5 = math.log(alpha) + math.log(1 + math.exp(-0.4) + math.exp(0.6))  # [P, P]
    t = 0.5 * sig(0.3)  # row 6 = [P, U]: class 1 soft target AP_1 * p
    r6 = math.log(alpha + (1 - t) * math.exp(0.3)) + math.log(1 + math.exp(-1.2)
                                                              + t * math.exp(-0.3))
    assert v.item() == pytest.approx((r5 + r6) / 2, rel=1e-6)


def test_opml_sp_is_soft_opml_plus_high_rank_and_corrects():
    sp = create_loss("opml_sp", a=0.4, correction_ratio=0.5, warmup=0, highrank_weight=0.05)
    soft = create_loss("soft_opml", a=0.4, correction_ratio=0.5, warmup=0)
    assert sp.needs_index and sp.needs_train_predictions
    for loss in (sp, soft):
        loss.on_train_start(CORR_Z, _info(8, 2))
        loss.on_epoch_end(0, CORR_S)
    assert _corrected(sp) == [[5, 6], []]
    rows = torch.tensor([0, 5, 6])
    s = torch.tensor([[0.4, -0.6], [1.2, 0.3], [-0.7, 2.0]])
    q = 1 / (1 + np.exp(-s.double().numpy()))
    gram = q.T @ q / 3 + 1e-4 * np.eye(2)  # B = 3 >= L = 2
    highrank = -math.log(np.linalg.det(gram))
    expected = soft(s, CORR_Z[rows], index=rows).item() + 0.05 * highrank
    assert sp(s, CORR_Z[rows], index=rows).item() == pytest.approx(expected, rel=1e-5)


def test_opml_sp_state_round_trip_into_a_fresh_instance():
    loss = create_loss("opml_sp", correction_ratio=0.5, warmup=0)
    loss.on_train_start(CORR_Z, _info(8, 2))
    loss.on_epoch_end(0, CORR_S)
    buf = io.BytesIO()
    torch.save(loss.state_dict(), buf)
    buf.seek(0)
    fresh = create_loss("opml_sp", correction_ratio=0.5, warmup=0)
    fresh.load_state_dict(torch.load(buf))
    for name in ("ap", "observed_labels", "corrected"):
        assert torch.equal(getattr(fresh, name), getattr(loss, name)), name
    rows = torch.tensor([5, 6, 7])
    s = torch.tensor([[0.4, -0.6], [1.2, 0.3], [0.0, 1.0]])
    assert fresh(s, CORR_Z[rows], index=rows).item() == loss(s, CORR_Z[rows], index=rows).item()
    # resuming: on_train_start with the same labels keeps the corrections and AP
    fresh.on_train_start(CORR_Z, _info(8, 2))
    assert _corrected(fresh) == [[5, 6], []] and fresh.ap.tolist() == pytest.approx([1.0, 0.5])


def test_correction_needs_train_start_and_logits():
    loss = create_loss("opml_sp")
    with pytest.raises(RuntimeError, match="on_train_start"):
        loss(torch.zeros(2, 2), CORR_Z[:2], index=torch.arange(2))
    with pytest.raises(RuntimeError, match="on_train_start"):
        loss.on_epoch_end(0, CORR_S)
    loss.on_train_start(CORR_Z, _info(8, 2))
    with pytest.raises(ValueError, match="logits of the whole train split"):
        loss.on_epoch_end(0, None)
    with pytest.raises(ValueError, match="shape"):
        loss.on_epoch_end(0, CORR_S[:3])


@pytest.mark.parametrize("name", ["soft_opml", "opml_sp"])
def test_soft_targets_keep_float32_precision_on_confident_logits_of_a_perfect_class(name):
    """AP = 1 (every class's observed positives above all other train rows) and confident
    logits: the soft target t = sigmoid(s) rounds to 1 in float32, and log(1 - t) was computed
    from it: the loss fell to 0 at s = 17 (exact: log 3) and the unobserved entries' gradient to
    ~1e-8. In log space float32 equals float64."""
    z = torch.zeros(6, 3, dtype=torch.long)
    z[torch.arange(6), torch.arange(6) % 3] = P
    loss = create_loss(name)
    loss.on_train_start(z, TrainInfo(6, 3, seed=0, num_epochs=3))
    loss.on_epoch_start(0)
    loss.on_epoch_end(0, (z == P).float() * 20 - 10)
    assert loss.ap.tolist() == [1.0, 1.0, 1.0]
    loss.on_epoch_start(1)
    for v in (12.0, 17.0, 20.0, 60.0, -100.0):
        s = torch.full((3, 3), v)
        s[range(3), range(3)] = v + 2
        s32, s64 = s.clone().requires_grad_(), s.double().requires_grad_()
        idx = torch.arange(3)
        l32, l64 = loss(s32, z[:3], idx), loss(s64, z[:3], idx)
        (l32 + l64).backward()
        assert l32.item() == pytest.approx(l64.item(), rel=1e-6), v
        assert torch.allclose(s32.grad.double(), s64.grad, rtol=1e-5, atol=1e-7), v
        assert torch.isfinite(s32.grad).all()
