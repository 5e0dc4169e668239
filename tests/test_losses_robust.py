"""GR (Chen et al. 2024) and Hill / SPLC (Zhang et al. 2021): parity with the official functions,
hand-computed values, gradients, schedules and state (spmlkit.losses.robust).

Where the pinned numbers come from: the official functions, copied unchanged into a throw-away
script (not in this repository) and run in float64 on ``LOGITS`` below (``2 * torch.randn(4, 5)``
from ``torch.Generator().manual_seed(0)``) with the single-positive targets ``TARGETS``
(official encoding: 1 = observed positive, 0 = unobserved; the same matrix in ours):

- GR: ``yan4xi1/GRLoss`` at commit 5e13f7f9d8e40a804698860fd621bb272c1ad0a3, ``losses.py``
  (``GR_loss``, ``neg_log`` with ``LOG_EPSILON = 1e-7``, ``loss1``, ``loss2``), ``models.py``
  (``KFunction``, ``VFunction``) and the schedule lines of ``train.py`` (``run_train``), called as
  ``train.py`` does: ``K = KFunction(w, b)(preds.detach())``,
  ``V = VFunction(preds.detach(), mu, sigma)``, ``GR_loss(preds, label_vec_obs, K, V, Q, epoch)``.
  ``gr_epoch{t}``: ``config.py`` defaults (beta [0, 2, -2, -2], alpha [0.5, 2, 0.8, 0.5],
  q2q3 [0.01, 1], num_epochs 8, linear_init 0) in the official 1-based epoch ``t``;
  ``gr2_epoch{t}``: beta [0, 10, -2, -8], q2q3 [0.01, 1.5], num_epochs 10, linear_init 2.
- Hill / SPLC: ``xinyu1205/robust-loss-mlml`` at commit
  e8d4effec5f3a81cc330158fa421daee8b32b066, ``src/loss_functions/losses.py`` (classes ``Hill``,
  ``SPLC``; the one change to run on a CPU: ``torch.tensor(1).cuda()`` -> ``torch.tensor(1)``).
  ``hill_sum`` / ``hill_mean``: ``Hill()`` with reduction ``"sum"`` (its default) / ``"mean"``;
  ``hill_custom_mean``: ``Hill(lamb=2.0, margin=0.5, gamma=1.0, reduction="mean")``;
  ``splc_epoch{e}_sum``: ``SPLC()(logits, targets, e)``; ``splc_epoch1_mean`` with "mean".

Gradients are d loss / d logits.
"""
from __future__ import annotations

import math

import pytest
import torch

from spmlkit.losses import TrainInfo, create_loss, loss_hparams
from spmlkit.losses.robust import (
    GRLoss,
    HillLoss,
    SPLCLoss,
    gr_schedule,
    gr_unobserved,
    gr_weights,
)

LOGITS = torch.tensor([
    [-4.620823600468352, -0.7465017225155286, -2.1216333570925725,
     1.9990187095623522, -0.039929501815525306],
    [0.4205997802033894, 0.3543787027873317, -1.661020102016898,
     0.47743611633634125, 1.4670567370545682],
    [-2.6437636582842754, 2.6296227303942468, -1.3740073880870927,
     2.976148631621345, -0.8968316094229022],
    [-1.782006070341475, 1.3497150871880077, 2.093730753962931,
     0.30859035729317896, -1.4997830456783883],
], dtype=torch.float64)
OFFICIAL = {
    "gr_epoch1": 0.845576612025311,
    "gr_epoch3": 0.835490301957851,
    "gr_epoch8": 0.726453080551841,
    "gr2_epoch5": 0.714105950156421,
    "hill_sum": 13.802893826472,
    "hill_custom_mean": 0.784010697974413,
    "splc_epoch0_sum": 20.7099875260571,
    "splc_epoch1_sum": 10.5739140749082,
    "gr2_epoch2": 0.768872756397026,
    "hill_mean": 0.690144691323602,
    "splc_epoch1_mean": 0.52869570374541,
}
OFFICIAL_GRAD = {
    "gr_epoch1": [
        [-0.0495120565347859, 0.00557056439579951, -0.000968543567483884,
         0.00384758499840695, 0.00798487869508053],
        [0.00818104782087211, 0.00822378553793553, -0.0420187182811842,
         0.00812688463787079, 0.00552757807221662],
        [-0.00259729756058613, 0.00230666187517207, 0.00237639676441998,
         0.00169902612347224, -0.0355148858640175],
        [0.000416678603403493, -0.0102958464765469, 0.00357988065708986,
         0.00824002650401403, 0.00174501485969176],
    ],
    "gr_epoch3": [
        [-0.0495120565347859, 0.004715214253754, -0.00119759215983692,
         0.00324919116699039, 0.00689561905776986],
        [0.00706167206630343, 0.00710172977771229, -0.0420187182811842,
         0.00701168588865759, 0.00470337187821518],
        [-0.00265881678042666, 0.00193501975694088, 0.00182028653658408,
         0.00142162729663724, -0.0355148858640175],
        [4.97338144923855e-05, -0.0102958464765469, 0.00301958543758913,
         0.00711750530872102, 0.0012491887689407],
    ],
    "gr_epoch8": [
        [-0.0495120565347859, 0.00150313950979648, -0.000772557354224536,
         0.000899950686596922, 0.00276372495923573],
        [0.00285783336779464, 0.00288620455765353, -0.0420187182811842,
         0.00282350428352261, 0.00151632742284173],
        [-0.00112641631342879, 0.000462113381057078, 0.0002015216381901,
         0.000319340158480995, -0.0355148858640175],
        [-0.000412251381207923, -0.0102958464765469, 0.000815637153142573,
         0.00289807261265444, -1.03545365505105e-05],
    ],
    "gr2_epoch5": [
        [-0.0495120565347859, 0.00616939698170422, 0.00252516200133283,
         0.000145243767775006, 0.00571040604413191],
        [0.00425726999343013, 0.00449762249882472, -0.0420187182811842,
         0.00404705601439146, 0.000919929860802461],
        [0.00123459344915038, -0.000172239880260863, 0.00478595564198988,
         -0.000206628470392953, -0.0355148858640175],
        [0.00353283972686193, -0.0102958464765469, 6.55232667009091e-05,
         0.00465984357910175, 0.00440739302730578],
    ],
    "hill_sum": [
        [-1.02951338386243, 0.142791492960578, 0.027395337082903,
         0.0331204200249722, 0.187350597753467],
        [0.171738187493073, 0.176145887682744, -1.12796368206687,
         0.167481438865397, 0.0695632372834469],
        [0.011520419084522, 0.0118061858718273, 0.0779369821308616,
         0.00639262151915233, -1.05924796604036],
        [0.0456113224877881, -0.177659955279052, 0.0286193910002085,
         0.178815147151262, 0.0667523857555864],
    ],
    "hill_custom_mean": [
        [-0.0509207045962585, 0.010647537814896, 0.00188107147766389,
         0.00628283815997675, 0.0154903259531722],
        [0.0158081414315452, 0.0159273896139884, -0.0507172315190636,
         0.0156649193903158, 0.00966517765682719],
        [0.000781678328958513, 0.00351598776637071, 0.00552455088772167,
         0.00251572429833192, -0.044995804227166],
        [0.00316869473378364, -0.00821865422779563, 0.00577879610620777,
         0.0159786370123772, 0.0046984540886098],
    ],
    "splc_epoch0_sum": [
        [-1.02951338386243, 0.0876998677326866, 0.00354027066726106,
         1.07656192497798, 0.282581806552742],
        [0.487241463260631, 0.4552875195469, -1.12796368206687,
         0.515042949517533, 0.951015530625914],
        [0.000857397127355272, 1.12738278246089, 0.0229283541442396,
         1.12720623310601, -1.05924796604036],
        [0.00851537545373927, -0.177659955279052, 1.09000069319733,
         0.433547797441297, 0.017039945895607],
    ],
    "splc_epoch1_sum": [
        [-1.02951338386243, 0.0876998677326866, 0.00354027066726106,
         -0.00488339564310752, 0.282581806552742],
        [-0.158022027636336, 0.4552875195469, -1.12796368206687,
         -0.143442086275556, -0.0184224873503277],
        [0.000857397127355272, -0.00089174006329681, 0.0229283541442396,
         -0.000336940433359047, -1.05924796604036],
        [0.00851537545373927, -0.177659955279052, -0.00381077964193703,
         0.433547797441297, 0.017039945895607],
    ],
}
TARGETS = torch.tensor([[1, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 1], [0, 1, 0, 0, 0]])


def _gr(epoch, num_epochs=8, **hp):
    """Our GR in 0-based ``epoch`` (the official ``t = epoch + 1``), official epsilon."""
    loss = create_loss("gr", eps=1e-7, **hp)
    loss.on_train_start(TARGETS, TrainInfo(4, 5, num_epochs=num_epochs))
    loss.on_epoch_start(epoch)
    return loss


def _value_and_grad(loss, logits=LOGITS, observed=TARGETS):
    x = logits.clone().requires_grad_(True)
    value = loss(x, observed)
    value.backward()
    return value.detach(), x.grad


GR2 = {"wT": 10.0, "bT": -8.0, "q3": 1.5, "linear_init": 2}
CASES = {
    "gr_epoch1": lambda: _gr(0),
    "gr_epoch3": lambda: _gr(2),
    "gr_epoch8": lambda: _gr(7),
    "gr2_epoch2": lambda: _gr(1, 10, **GR2),
    "gr2_epoch5": lambda: _gr(4, 10, **GR2),
    "hill_sum": lambda: create_loss("hill", reduction="sum"),
    "hill_mean": lambda: create_loss("hill"),
    "hill_custom_mean": lambda: create_loss("hill", lamb=2.0, margin=0.5, gamma=1.0),
    "splc_epoch0_sum": lambda: _epoch(create_loss("splc", reduction="sum"), 0),
    "splc_epoch1_sum": lambda: _epoch(create_loss("splc", reduction="sum"), 1),
    "splc_epoch1_mean": lambda: _epoch(create_loss("splc"), 1),
}


def _epoch(loss, epoch):
    loss.on_epoch_start(epoch)
    return loss


# ------------------------------------------------------------------ parity with the official code
@pytest.mark.parametrize("case", sorted(OFFICIAL))
def test_values_equal_the_official_functions(case):
    value, grad = _value_and_grad(CASES[case]())
    assert value.dtype == torch.float64
    torch.testing.assert_close(value, torch.tensor(OFFICIAL[case], dtype=torch.float64),
                               rtol=1e-12, atol=1e-13)
    if case in OFFICIAL_GRAD:
        official = torch.tensor(OFFICIAL_GRAD[case], dtype=torch.float64)
        torch.testing.assert_close(grad, official, rtol=1e-11, atol=1e-14)


def test_float32_values_close_to_the_official_ones():
    """The training dtype: float32 logits give the official float64 numbers to float32
    precision."""
    for case in ("gr_epoch3", "hill_sum", "splc_epoch1_sum"):
        value, grad = _value_and_grad(CASES[case](), LOGITS.float())
        assert value.dtype == torch.float32
        assert value.item() == pytest.approx(OFFICIAL[case], rel=1e-5)
        official = torch.tensor(OFFICIAL_GRAD[case], dtype=torch.float64)
        torch.testing.assert_close(grad.double(), official,
                                   rtol=1e-4, atol=1e-6)


def test_gr_schedule_is_the_official_one():
    """(w, b, mu, sigma) printed by the official schedule lines of train.py (1-based epoch t)."""
    beta, alpha = ((0, 2), (-2, -2)), ((0.5, 0.8), (2, 0.5))
    official = {1: (0.0, -2.0, 0.5375, 1.8125), 3: (0.5, -2.0, 0.6125, 1.4375),
                8: (1.75, -2.0, 0.8, 0.5)}
    for t, expected in official.items():
        assert gr_schedule(t - 1, 8, *beta, *alpha) == pytest.approx(expected, abs=1e-15)
    # with linear_init = 2 of 10 epochs: held in t = 1, 2 (w, b also in t = 3)
    beta2 = ((0, 10), (-2, -8))
    assert gr_schedule(1, 10, *beta2, *alpha, linear_init=2) == pytest.approx((0, -2, 0.5, 2))
    assert gr_schedule(2, 10, *beta2, *alpha, linear_init=2) == \
        pytest.approx((0, -2, 0.5375, 1.8125))
    assert gr_schedule(4, 10, *beta2, *alpha, linear_init=2) == \
        pytest.approx((2.5, -3.5, 0.6125, 1.4375))


# ------------------------------------------------------------------ hand-computed values
def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_gr_by_hand():
    """Logits 0 and 1 in the first epoch of 8 (w = 0, b = -2, mu = 0.5375, sigma = 1.8125)."""
    loss = GRLoss(reduction="none")
    loss.on_train_start(torch.zeros(1, 4), TrainInfo(1, 4, num_epochs=8))
    loss.on_epoch_start(0)
    s = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    out = loss(s, torch.tensor([[1, 0, 0, -1]]))[0].tolist()
    k = _sig(-2.0)

    def unobserved(p):
        v = math.exp(-0.5 * ((p - 0.5375) / 1.8125) ** 2)
        return v * (k * (1 - p ** 0.01) / 0.01 + (1 - k) * (1 - (1 - p) ** 1.0))

    assert out == pytest.approx([math.log(2), unobserved(0.5), unobserved(_sig(1.0)),
                                 math.log(2)], rel=1e-12)


def test_hill_by_hand():
    s = torch.tensor([[2.0, 0.0, 3.0, -1.0]], dtype=torch.float64)
    out = HillLoss(reduction="none")(s, torch.tensor([[1, 0, 0, -1]]))[0].tolist()
    pm = _sig(1.0)  # margin 1
    expected = [-(1 - pm) ** 2 * math.log(pm)] + \
        [(1.5 - _sig(x)) * _sig(x) ** 2 for x in (0.0, 3.0, -1.0)]
    assert out == pytest.approx(expected, rel=1e-12)
    # the hill: the negative loss peaks at p = 1 (value 0.5) and is below BCE's growth
    assert expected[2] < -math.log(1 - _sig(3.0))


def test_splc_by_hand_and_correction_from_change_epoch():
    s = torch.tensor([[2.0, 1.0, 0.0, 1.0]], dtype=torch.float64)  # p(1) = 0.731 > tau
    obs = torch.tensor([[1, 0, 0, -1]])
    loss = SPLCLoss(reduction="none")
    pm, p1, p0 = _sig(1.0), _sig(1.0), 0.5
    pos = -(1 - pm) ** 2 * math.log(pm)

    def neg(p):
        return -(p ** 2) * math.log(1 - p)

    loss.on_epoch_start(0)
    assert loss(s, obs)[0].tolist() == pytest.approx([pos, neg(p1), neg(p0), neg(p1)], rel=1e-12)
    assert not loss.last_corrected.any()
    loss.on_epoch_start(1)
    corrected = -(1 - p1) ** 2 * math.log(p1)  # target 1, no margin
    assert loss(s, obs)[0].tolist() == pytest.approx([pos, corrected, neg(p0), neg(p1)],
                                                     rel=1e-12)
    # only the unobserved entry above tau: never the observed negative with the same logit
    assert loss.last_corrected.tolist() == [[False, True, False, False]]
    assert SPLCLoss(change_epoch=3).change_epoch == 3


def test_gr_observed_negatives_get_bce():
    """The official GR gives O- loss 0; ours gives -log(1 - p) (documented deviation)."""
    s = torch.tensor([[0.5, -1.5]], dtype=torch.float64)
    loss = _gr(0)
    loss.reduction = "none"
    out = loss(s, torch.tensor([[-1, -1]]))
    torch.testing.assert_close(out, -torch.nn.functional.logsigmoid(-s), rtol=1e-6, atol=0)


# ------------------------------------------------------------------ gradients
@pytest.mark.parametrize("name, epoch, hp", [("hill", 0, {}), ("hill", 0, {"gamma": 0.5}),
                                             ("splc", 0, {}), ("splc", 2, {})])
def test_gradcheck_float64(name, epoch, hp):
    loss = create_loss(name, **hp)
    obs = torch.tensor([[1, 0, 0, -1, 0], [0, 1, 0, 0, -1], [0, 0, 1, 0, 0]])
    loss.on_train_start(obs, TrainInfo(3, 5, num_epochs=8))
    loss.on_epoch_start(epoch)
    g = torch.Generator().manual_seed(4)
    x = (2 * torch.randn(3, 5, generator=g, dtype=torch.float64))
    if name == "splc":  # keep every entry away from the correction threshold
        p = torch.sigmoid(x)
        x = torch.where((p - 0.6).abs() < 0.05, x + 1.0, x)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: loss(t, obs), (x,), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("q2, q3", [(0.01, 1.0), (0.5, 1.5), (1.0, 0.3)])
def test_gradcheck_float64_gr(q2, q3):
    """GR's gradient treats K and V as constants (the official code detaches them), which a
    numerical gradcheck of the whole loss would not: gradcheck the unobserved term with K, V
    fixed at their values, and the whole loss on observed entries (no K, V there)."""
    g = torch.Generator().manual_seed(5)
    x = (2 * torch.randn(3, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    k, v = gr_weights(x, 1.2, -2.0, 0.6, 1.4)
    assert not k.requires_grad and not v.requires_grad
    assert torch.autograd.gradcheck(lambda t: gr_unobserved(t, k, v, q2, q3), (x,), eps=1e-6,
                                    atol=1e-8)
    loss = _gr(3, q2=q2, q3=q3)
    observed = torch.tensor([[1, -1, 1, -1, 1]] * 3)
    assert torch.autograd.gradcheck(lambda t: loss(t, observed), (x,), eps=1e-6, atol=1e-8)


def test_k_and_v_carry_no_gradient():
    """d/ds of GR on an unobserved entry is V * (K dL1/ds + (1 - K) dL2/ds): K and V are
    constants (the official code computes them from preds.detach())."""
    loss = _gr(3)
    w, b, mu, sigma = loss.schedule()
    s = torch.tensor([[0.7]], dtype=torch.float64, requires_grad=True)
    loss(s, torch.tensor([[0]])).backward()
    p = _sig(0.7)
    k, v = _sig(w * p + b), math.exp(-0.5 * ((p - mu) / sigma) ** 2)
    dp = p * (1 - p)
    expected = v * (k * -(p ** (0.01 - 1)) * dp + (1 - k) * (1 - p) ** 0.0 * dp)
    assert s.grad.item() == pytest.approx(expected, rel=1e-10)


def test_official_nan_cases_are_finite_here():
    """Official Hill: 0 * log(sigmoid(-111)) = NaN on a negative entry at logit -110; official
    GR: d pow(p, 0.01) / dp = inf at p = 0, a NaN gradient at logit -110 (both checked by
    running the official functions in float32). Ours: finite values and gradients."""
    for name in ("hill", "gr", "splc"):
        loss = _gr(2) if name == "gr" else create_loss(name)
        loss.on_epoch_start(0)
        x = torch.tensor([[3.0, -110.0, 20.0]], requires_grad=True)
        value = loss(x, torch.tensor([[1, 0, 0]]))
        value.backward()
        assert torch.isfinite(value) and torch.isfinite(x.grad).all(), name


# ------------------------------------------------------------------ state and schedule hooks
def test_gr_state_survives_a_checkpoint_mid_schedule():
    loss = _gr(4, 8)
    before = loss.schedule()
    value = loss(LOGITS, TARGETS)
    fresh = create_loss("gr", eps=1e-7)
    fresh.load_state_dict(loss.state_dict())  # no hook called on the fresh one
    assert fresh.schedule() == before
    torch.testing.assert_close(fresh(LOGITS, TARGETS), value, rtol=0, atol=0)
    assert int(fresh.current_epoch) == 4 and int(fresh.total_epochs) == 8
    # and the schedule moves on from there
    fresh.on_epoch_start(5)
    assert fresh.schedule() == _gr(5, 8).schedule() != before


def test_splc_epoch_survives_a_checkpoint():
    loss = _epoch(create_loss("splc"), 1)
    fresh = create_loss("splc")
    fresh.load_state_dict(loss.state_dict())
    torch.testing.assert_close(fresh(LOGITS, TARGETS), loss(LOGITS, TARGETS), rtol=0, atol=0)
    assert fresh(LOGITS, TARGETS) != create_loss("splc")(LOGITS, TARGETS)  # epoch 0: no change


def test_gr_num_epochs_hparam_and_errors():
    loss = create_loss("gr", num_epochs=8)
    loss.on_train_start(TARGETS, TrainInfo(4, 5, num_epochs=25))  # the hparam wins
    loss.on_epoch_start(2)
    assert loss.schedule() == _gr(2, 8).schedule()
    with pytest.raises(RuntimeError, match="on_train_start"):
        create_loss("gr")(LOGITS, TARGETS)
    with pytest.raises(ValueError, match="linear_init"):
        create_loss("gr", linear_init=3).on_train_start(TARGETS, TrainInfo(4, 5, num_epochs=3))
    for bad in ({"q2": 0.0}, {"q3": -1.0}, {"sigmaT": 0.0}, {"linear_init": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            create_loss("gr", **bad)
    with pytest.raises(ValueError, match="tau"):
        create_loss("splc", tau=1.5)
    with pytest.raises(ValueError, match="lamb"):
        create_loss("hill", lamb=0.0)


def test_registered_defaults_are_the_official_ones():
    gr = loss_hparams("gr")
    assert (gr["w0"], gr["wT"], gr["b0"], gr["bT"]) == (0.0, 2.0, -2.0, -2.0)
    assert (gr["mu0"], gr["sigma0"], gr["muT"], gr["sigmaT"]) == (0.5, 2.0, 0.8, 0.5)
    assert (gr["q2"], gr["q3"], gr["linear_init"]) == (0.01, 1.0, 0)
    hill = loss_hparams("hill")
    assert (hill["lamb"], hill["margin"], hill["gamma"]) == (1.5, 1.0, 2.0)
    splc = loss_hparams("splc")
    assert (splc["tau"], splc["change_epoch"], splc["margin"], splc["gamma"]) == \
        (0.6, 1, 1.0, 2.0)
