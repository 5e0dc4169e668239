"""Tests of the Cole et al. losses (spmlkit.losses.cole).

Three tiers:
1. hand-computed values on a 2 x 3 input, written with ``math`` only (no library helper);
2. parity with the official formulas (elijahcole/single-positive-multi-label, losses.py),
   re-written here in their probability form: ``-log(p + 1e-5)``, the EPR penalty
   ``(mean_n sum_i p_ni - k)**2 / L**2``, ``loss_mtx.sum() / (B*L) + reg``; the library is run
   with ``eps=1e-5`` and must match to float32 precision;
3. gradients: ``torch.autograd.gradcheck`` on float64 logits. The losses compute in float32
   internally, so the finite differences carry float32 rounding (~1e-7 / eps); we use
   ``eps=1e-3, atol=1e-3, rtol=1e-2``, loose enough for float32 and still far tighter than any
   wrong-formula gradient. ROLE's gradient is *not* the derivative of its value (stop-gradients),
   so for ROLE autograd is compared with the gradient derived by hand instead.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spmlkit.labels import make_observed
from spmlkit.losses import LOSSES, TrainInfo, create_loss, loss_hparams

# ------------------------------------------------------------------ the 2 x 3 input ----------
S = [[1.0, -0.5, 2.0],
     [0.3, -1.2, 0.0]]
Z = [[1, 0, -1],
     [0, 1, 0]]
B, L = 2, 3


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def lp(x):            # log p
    return math.log(sig(x))


def l1mp(x):          # log (1 - p)
    return math.log(1.0 - sig(x))


def entries_mean(fn):
    """sum over the 2 x 3 entries of fn(s, z) divided by B * L."""
    return sum(fn(S[i][j], Z[i][j]) for i in range(B) for j in range(L)) / (B * L)


def bce_target(s, t):
    return -(t * lp(s) + (1 - t) * l1mp(s))


def epr_penalty(probs_rows, k):
    m = sum(sum(r) for r in probs_rows) / len(probs_rows)
    return ((m - k) / len(probs_rows[0])) ** 2


def hand_bce():
    return entries_mean(lambda s, z: -lp(s) if z == 1 else (-l1mp(s) if z == -1 else 0.0))


def hand_an():
    return entries_mean(lambda s, z: -lp(s) if z == 1 else -l1mp(s))


def hand_an_ls(e):
    return entries_mean(lambda s, z: bce_target(s, 1 - e if z == 1 else e))


def hand_an_ls_asym(ep, en):
    return entries_mean(lambda s, z: bce_target(s, 1 - ep / 2 if z == 1 else en / 2))


def hand_wan(gamma):
    return entries_mean(lambda s, z: -lp(s) if z == 1 else -gamma * l1mp(s))


def hand_epr(k, lam=1.0):
    probs = [[sig(s) for s in row] for row in S]
    return hand_bce() + lam * epr_penalty(probs, k)


def hand_pr():
    total = 0.0
    for i in range(B):
        for a in range(L):
            if Z[i][a] != 1:
                continue
            for b in range(L):
                if Z[i][b] != 1:  # unobserved or a known negative (Z[0][2] = -1)
                    total += max(0.0, 1 - sig(S[i][a]) + sig(S[i][b]))
    return total / (B * L)


THETA = [[0.7, -0.3, -2.0],     # estimator logits for the batch rows
         [-0.1, 1.5, 0.25]]


def hand_role(k, lam=1.0):
    """(l'(p | q) + l'(q | p)) / 2; l'(a | b) = -log a on O+, -log(1-a) on O- (see ROLELoss
    docstring), + BCE(a, target b) on every entry; + lam * EPR(a)."""
    def side(a, b):
        tot = 0.0
        for i in range(B):
            for j in range(L):
                if Z[i][j] == 1:
                    tot += -lp(a[i][j])
                elif Z[i][j] == -1:
                    tot += -l1mp(a[i][j])
                tot += bce_target(a[i][j], sig(b[i][j]))
        probs = [[sig(v) for v in row] for row in a]
        return tot / (B * L) + lam * epr_penalty(probs, k)
    return 0.5 * (side(S, THETA) + side(THETA, S))


def _x(dtype=torch.float32):
    return torch.tensor(S, dtype=dtype)


def _z():
    return torch.tensor(Z)


def _role(k=1.5, n=4, seed=0, **kw):
    loss = create_loss("role", k=k, **kw)
    obs = torch.zeros(n, L, dtype=torch.long)
    obs[2] = torch.tensor(Z[0])
    obs[0] = torch.tensor(Z[1])
    loss.on_train_start(obs, TrainInfo(num_examples=n, num_classes=L, k=k, seed=seed))
    with torch.no_grad():
        loss.label_logits[2] = torch.tensor(THETA[0])
        loss.label_logits[0] = torch.tensor(THETA[1])
    return loss, torch.tensor([2, 0])


# ------------------------------------------------------------------ 1. hand-computed ---------
@pytest.mark.parametrize("name, kwargs, expected", [
    ("bce", {}, hand_bce()),
    ("iu", {}, hand_bce()),
    ("an", {}, hand_an()),
    ("an_ls", {}, hand_an_ls(0.1)),
    ("an_ls", {"convention": "official", "smoothing": 0.2}, hand_an_ls(0.2)),
    ("an_ls", {"convention": "paper"}, hand_an_ls(0.05)),
    ("an_ls", {"convention": "paper", "smoothing": 0.3}, hand_an_ls(0.15)),
    ("an_ls_asym", {}, hand_an_ls_asym(0.0, 0.1)),
    ("an_ls_asym", {"eps_pos": 0.2, "eps_neg": 0.4}, hand_an_ls_asym(0.2, 0.4)),
    ("wan", {}, hand_wan(1 / (L - 1))),
    ("wan", {"gamma": 0.2}, hand_wan(0.2)),
    ("epr", {"k": 1.5}, hand_epr(1.5)),
    ("epr", {"k": 2.5, "lam": 3.0}, hand_epr(2.5, 3.0)),
    ("pr", {}, hand_pr()),
])
def test_hand_values(name, kwargs, expected):
    loss = create_loss(name, **kwargs)
    out = loss(_x(), _z())
    assert out.dtype == torch.float32 and out.ndim == 0
    assert out.item() == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_hand_values_are_distinct():
    """The hand references differ from each other, so the parametrised test can tell them apart."""
    vals = [hand_bce(), hand_an(), hand_an_ls(0.1), hand_an_ls(0.05), hand_an_ls_asym(0, 0.1),
            hand_wan(0.5), hand_epr(1.5), hand_pr(), hand_role(1.5)]
    assert len({round(v, 6) for v in vals}) == len(vals)


def test_hand_value_role():
    loss, idx = _role(k=1.5)
    out = loss(_x(), _z(), index=idx)
    assert out.item() == pytest.approx(hand_role(1.5), rel=1e-6)
    loss2, idx = _role(k=0.5, lam=2.0)
    assert loss2(_x(), _z(), index=idx).item() == pytest.approx(hand_role(0.5, 2.0), rel=1e-6)


def test_role_rows_is_the_same_loss_with_a_sparse_gradient_of_the_batch_rows():
    """estimator_update="rows" changes how the estimator is stepped, not the loss: the value
    (the hand reference), the logits' gradient and the estimator's gradient are the dense
    one's, the latter sparse, holding the batch's rows only."""
    grads = {}
    for update in ("dense", "rows"):
        loss, idx = _role(k=1.5, estimator_update=update)
        x = _x().requires_grad_()
        out = loss(x, _z(), index=idx)
        assert out.item() == pytest.approx(hand_role(1.5), rel=1e-6)
        out.backward()
        grads[update] = (x.grad, loss.label_logits.grad)
    sparse = grads["rows"][1]
    assert sparse.is_sparse and sorted(sparse.coalesce().indices()[0].tolist()) == [0, 2]
    assert torch.equal(grads["rows"][0], grads["dense"][0])
    assert torch.equal(sparse.to_dense(), grads["dense"][1])
    assert grads["dense"][1][[1, 3]].abs().sum() == 0 and grads["dense"][1].abs().sum() > 0
    with pytest.raises(ValueError, match=r"estimator_update must be one of 'dense', "
                                         r"'rows', got 'sparse'"):
        create_loss("role", estimator_update="sparse")


def test_epr_k_from_train_info():
    loss = create_loss("epr")
    loss.on_train_start(_z(), TrainInfo(num_examples=2, num_classes=3, k=2.5))
    assert loss(_x(), _z()).item() == pytest.approx(hand_epr(2.5), rel=1e-6)
    given = create_loss("epr", k=1.5)  # an explicit k wins over the data's
    given.on_train_start(_z(), TrainInfo(num_examples=2, num_classes=3, k=2.5))
    assert given(_x(), _z()).item() == pytest.approx(hand_epr(1.5), rel=1e-6)


def test_epr_without_k_raises():
    with pytest.raises(ValueError, match="needs k"):
        create_loss("epr")(_x(), _z())


def test_eps_zero_is_exact_log_space():
    # a saturated wrong prediction: -log sigmoid(-12) = 12 + log(1 + e^-12)
    x, z = torch.tensor([[-12.0]]), torch.tensor([[1]])
    exact = 12.0 + math.log1p(math.exp(-12.0))
    assert create_loss("an")(x, z).item() == pytest.approx(exact, rel=1e-6)
    official = -math.log(sig(-12.0) + 1e-5)
    assert create_loss("an", eps=1e-5)(x, z).item() == pytest.approx(official, rel=1e-5)
    assert official < 0.95 * exact  # the documented difference (several percent)


# ------------------------------------------------------------------ 2. official parity -------
OFFICIAL_EPS = 1e-5


def off_neg_log(x):
    return -torch.log(x + OFFICIAL_EPS)


def off_epr_reg(preds, k):
    return (preds.sum(1).mean(0) - k) ** 2 / (preds.shape[1] ** 2)


def official_loss(name, preds, obs, k=None, est=None, clean=None, ls=0.1):
    """The official loss functions (their probability form), re-written from losses.py."""
    b, l = preds.shape
    mtx = torch.zeros_like(preds)
    reg = None
    pos, unk, neg = obs == 1, obs == 0, obs == -1
    if name == "bce":        # on clean 0/1 labels
        mtx[clean == 1] = off_neg_log(preds[clean == 1])
        mtx[clean == 0] = off_neg_log(1 - preds[clean == 0])
    elif name == "iu":
        mtx[pos] = off_neg_log(preds[pos])
        mtx[neg] = off_neg_log(1 - preds[neg])
    elif name == "an":
        mtx[pos] = off_neg_log(preds[pos])
        mtx[unk] = off_neg_log(1 - preds[unk])
    elif name == "an_ls":
        mtx[pos] = (1 - ls) * off_neg_log(preds[pos]) + ls * off_neg_log(1 - preds[pos])
        mtx[unk] = (1 - ls) * off_neg_log(1 - preds[unk]) + ls * off_neg_log(preds[unk])
    elif name == "wan":
        mtx[pos] = off_neg_log(preds[pos])
        mtx[unk] = off_neg_log(1 - preds[unk]) / float(l - 1)
    elif name == "epr":
        mtx[pos] = off_neg_log(preds[pos])
        reg = off_epr_reg(preds, k)
    elif name == "pr":
        for n in range(b):
            others = preds[n][unk[n]]
            for i in range(l):
                if pos[n, i]:
                    mtx[n, i] = torch.clamp(1.0 - preds[n, i] + others, min=0).sum()
    elif name == "role":
        m1 = torch.zeros_like(preds)
        m1[pos] = off_neg_log(preds[pos])
        e = est.detach()
        c1 = e * off_neg_log(preds) + (1 - e) * off_neg_log(1 - preds)
        r1 = off_epr_reg(preds, k)
        m2 = torch.zeros_like(preds)
        m2[pos] = off_neg_log(est[pos])
        p = preds.detach()
        c2 = p * off_neg_log(est) + (1 - p) * off_neg_log(1 - est)
        r2 = off_epr_reg(est, k)
        reg = 0.5 * (r1 + r2)
        mtx = 0.5 * (m1 + m2) + 0.5 * (c1 + c2)
    else:
        raise KeyError(name)
    main = (mtx / (b * l)).sum()
    return main if reg is None else main + reg


def _parity_batch(seed, b=8, l=6):
    g = torch.Generator().manual_seed(seed)
    logits = 5.0 * torch.randn(b, l, generator=g)
    logits[0, :2] = torch.tensor([9.5, -9.5])   # saturated entries, where eps matters
    logits[1, :2] = torch.tensor([-9.2, 9.2])
    rng = np.random.RandomState(seed)
    y = (rng.random_sample((b, l)) < 0.4).astype(np.uint8)
    y[:, 0] = 1  # every row has a positive
    return logits, y


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name, regime", [("bce", "full"), ("iu", "1p_1n"), ("an", "1p"),
                                          ("an_ls", "1p"), ("wan", "1p"), ("epr", "1p"),
                                          ("pr", "1p")])
def test_official_parity(name, regime, seed):
    logits, y = _parity_batch(seed)
    obs = torch.as_tensor(make_observed(y, regime, seed=1200 + seed)).long()
    ref = official_loss(name, torch.sigmoid(logits), obs, k=1.7,
                        clean=torch.as_tensor(y).long())
    kw = {"k": 1.7} if name == "epr" else {}
    ours = create_loss(name, eps=OFFICIAL_EPS, **kw)(logits, obs)
    torch.testing.assert_close(ours, ref, rtol=2e-6, atol=1e-6)
    if name in ("bce", "an", "an_ls", "wan"):  # every entry counts, the saturated ones too
        exact = create_loss(name, **kw)(logits, obs)
        assert not torch.allclose(exact, ref, rtol=1e-4, atol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_official_parity_role(seed):
    logits, y = _parity_batch(seed)
    n = 20
    obs_all = torch.zeros(n, logits.shape[1], dtype=torch.long)
    idx = torch.tensor([3, 17, 0, 9, 12, 5, 19, 8])
    obs_all[idx] = torch.as_tensor(make_observed(y, "1p", seed=1200)).long()
    loss = create_loss("role", k=1.7, eps=OFFICIAL_EPS)
    loss.on_train_start(obs_all, TrainInfo(num_examples=n, num_classes=logits.shape[1],
                                           k=1.7, seed=seed))
    with torch.no_grad():  # move some estimates far from their init, including saturated ones
        loss.label_logits.add_(3.0 * torch.randn(loss.label_logits.shape,
                                                 generator=torch.Generator().manual_seed(seed)))
    obs = obs_all[idx]
    est = torch.sigmoid(loss.label_logits[idx])
    ref = official_loss("role", torch.sigmoid(logits), obs, k=1.7, est=est)
    ours = loss(logits, obs, index=idx)
    torch.testing.assert_close(ours, ref, rtol=2e-6, atol=1e-6)


# ------------------------------------------------------------------ ROLE specifics -----------
class TestROLE:
    n, l = 12, 5

    def _setup(self, seed=0):
        rng = np.random.RandomState(seed)
        y = (rng.random_sample((self.n, self.l)) < 0.4).astype(np.uint8)
        y[:, 1] = 1
        obs = torch.as_tensor(make_observed(y, "1p_1n", seed=4)).long()
        loss = create_loss("role")
        loss.on_train_start(obs, TrainInfo(num_examples=self.n, num_classes=self.l, k=1.5,
                                           seed=seed, num_epochs=3))
        return loss, obs

    def test_shape_and_init(self):
        loss, obs = self._setup()
        theta = loss.label_logits.detach()
        assert tuple(theta.shape) == (self.n, self.l)
        assert isinstance(loss.label_logits, torch.nn.Parameter)
        assert any(p is loss.label_logits for p in loss.parameters())
        logit = lambda p: math.log(p / (1 - p))  # noqa: E731
        pos, unk, neg = obs == 1, obs == 0, obs == -1
        assert pos.any() and unk.any() and neg.any()
        torch.testing.assert_close(theta[pos], torch.full_like(theta[pos], logit(0.995)))
        torch.testing.assert_close(theta[neg], torch.full_like(theta[neg], logit(0.005)))
        u = theta[unk]
        assert (u >= logit(0.4) - 1e-6).all() and (u <= logit(0.6) + 1e-6).all()
        assert u.std() > 0.05  # actually random, not a constant
        assert loss.k == 1.5
        q = loss.estimated_labels()
        assert not q.requires_grad
        torch.testing.assert_close(q, torch.sigmoid(theta))

    def test_init_seeded(self):
        a, _ = self._setup(seed=0)
        b, _ = self._setup(seed=0)
        c, _ = self._setup(seed=1)
        torch.testing.assert_close(a.label_logits, b.label_logits, rtol=0, atol=0)
        assert not torch.equal(a.label_logits, c.label_logits)

    def test_lr_multiplier_and_needs_index(self):
        loss = create_loss("role")
        assert loss.lr_multiplier == 10
        assert loss.needs_index is True

    def test_needs_index_and_init(self):
        with pytest.raises(RuntimeError, match="on_train_start"):
            create_loss("role", k=1.0)(_x(), _z(), index=[0, 1])
        loss, obs = self._setup()
        with pytest.raises(ValueError, match="index"):
            loss(torch.zeros(2, self.l), obs[:2])
        with pytest.raises(ValueError, match="3 entries for a batch of 2"):
            loss(torch.zeros(2, self.l), obs[:2], index=[0, 1, 2])

    def test_gradients_reach_indexed_rows_only(self):
        loss, obs = self._setup()
        idx = torch.tensor([7, 2, 10])
        logits = torch.randn(3, self.l, requires_grad=True)
        loss(logits, obs[idx], index=idx).backward()
        assert logits.grad is not None and torch.isfinite(logits.grad).all()
        assert (logits.grad.abs() > 0).all()
        g = loss.label_logits.grad
        assert g is not None and torch.isfinite(g).all()
        rows = torch.zeros(self.n, dtype=torch.bool)
        rows[idx] = True
        assert (g[rows].abs() > 0).all()
        assert (g[~rows] == 0).all()

    def test_gradient_by_hand(self):
        """Autograd vs the gradient derived by hand (stop-gradients make gradcheck unusable).

        d/ds_nj = 0.5 * [(-pos (1-p) + neg p + (p - q)) / (B L) + lam * 2 (m_p - k) / L^2 *
        p (1-p) / B], with m_p = mean_n sum_j p_nj; symmetric for theta with p and q swapped."""
        loss, obs = self._setup()
        idx = torch.tensor([1, 5, 6, 11])
        o = obs[idx]
        logits = torch.randn(4, self.l, generator=torch.Generator().manual_seed(3),
                             dtype=torch.float64).requires_grad_(True)
        loss(logits, o, index=idx).backward()
        p = torch.sigmoid(logits.detach())
        q = torch.sigmoid(loss.label_logits.detach()[idx]).double()
        pos, neg = (o == 1).double(), (o == -1).double()
        b, l, k = 4, self.l, 1.5

        def grad(a, other):
            m = a.sum(1).mean()
            return 0.5 * ((-pos * (1 - a) + neg * a + (a - other)) / (b * l)
                          + 2 * (m - k) / l ** 2 * a * (1 - a) / b)

        torch.testing.assert_close(logits.grad, grad(p, q), rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(loss.label_logits.grad[idx].double(), grad(q, p),
                                   rtol=1e-4, atol=1e-7)

    def test_state_dict_round_trip(self):
        loss, obs = self._setup(seed=5)
        with torch.no_grad():
            loss.label_logits.mul_(1.7)
        sd = loss.state_dict()
        assert "label_logits" in sd
        fresh = create_loss("role")
        assert fresh.label_logits.numel() == 0
        fresh.load_state_dict(sd)
        torch.testing.assert_close(fresh.label_logits, loss.label_logits, rtol=0, atol=0)
        assert isinstance(fresh.label_logits, torch.nn.Parameter)
        # on_train_start after a resume keeps the loaded estimates (carry-over)
        fresh.on_train_start(obs, TrainInfo(num_examples=self.n, num_classes=self.l, k=1.5,
                                            seed=0))
        torch.testing.assert_close(fresh.label_logits, loss.label_logits, rtol=0, atol=0)
        idx = torch.arange(4)
        x = torch.randn(4, self.l)
        torch.testing.assert_close(fresh(x, obs[idx], index=idx), loss(x, obs[idx], index=idx))


# ------------------------------------------------------------------ reductions ---------------
COLE_NAMES = ["bce", "an", "an_ls", "an_ls_asym", "wan", "epr", "role", "pr"]


def _build(name, reduction, n=10, l=4, seed=0):
    rng = np.random.RandomState(seed)
    y = (rng.random_sample((n, l)) < 0.5).astype(np.uint8)
    y[:, 0] = 1
    obs = torch.as_tensor(make_observed(y, "1p_1n", seed=seed)).long()
    kw = {"k": 1.5} if name in ("epr", "role") else {}
    loss = create_loss(name, reduction=reduction, **kw)
    loss.on_train_start(obs, TrainInfo(num_examples=n, num_classes=l, k=1.5, seed=0))
    return loss, obs


def test_cole_losses_registered():
    names = LOSSES.names()
    for name in COLE_NAMES:
        assert name in names
    assert "iu" in LOSSES and LOSSES.get("iu").name == "bce"


@pytest.mark.parametrize("name", COLE_NAMES)
def test_reductions(name):
    idx = torch.tensor([0, 3, 4, 9, 6])
    x = 2 * torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    out = {}
    for red in ("mean", "sum", "none"):
        loss, obs = _build(name, red)
        out[red] = loss(x, obs[idx], index=idx)
    assert out["none"].shape == (5, 4)
    assert out["mean"].shape == () and out["sum"].shape == ()
    torch.testing.assert_close(out["sum"], 5 * 4 * out["mean"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["none"].mean(), out["mean"], rtol=1e-5, atol=1e-6)
    assert out["mean"].item() > 0


def test_bad_reduction_and_hparams():
    with pytest.raises(ValueError, match="reduction"):
        create_loss("an", reduction="avg")
    with pytest.raises(ValueError, match="eps"):
        create_loss("an", eps=-1.0)
    with pytest.raises(ValueError, match="no hyperparameter"):
        create_loss("an", gamma=0.3)
    with pytest.raises(ValueError, match="unknown loss"):
        create_loss("ann")
    with pytest.raises(ValueError, match="convention"):
        create_loss("an_ls", convention="both")
    with pytest.raises(ValueError, match="smoothing"):
        create_loss("an_ls", smoothing=1.0)
    with pytest.raises(ValueError, match="eps_neg"):
        create_loss("an_ls_asym", eps_neg=1.5)
    with pytest.raises(ValueError, match="gamma"):
        create_loss("wan", gamma=-0.1)
    with pytest.raises(ValueError, match="k"):
        create_loss("epr", k=0)
    assert loss_hparams("wan")["gamma"] is None
    assert loss_hparams("an_ls")["smoothing"] == 0.1
    assert loss_hparams("an_ls")["convention"] == "official"


# ------------------------------------------------------------------ 3. gradients -------------
GRADCHECK = {"eps": 1e-3, "atol": 1e-3, "rtol": 1e-2}


@pytest.mark.parametrize("name, kwargs", [("bce", {}), ("an", {}), ("an_ls", {}),
                                          ("an_ls", {"convention": "paper"}),
                                          ("an_ls_asym", {"eps_pos": 0.1}), ("wan", {}),
                                          ("epr", {"k": 1.5}), ("pr", {}),
                                          ("an", {"eps": 1e-5}), ("epr", {"k": 2.0,
                                                                          "eps": 1e-5})])
def test_gradcheck(name, kwargs):
    loss = create_loss(name, **kwargs)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64).requires_grad_(True)
    z = torch.tensor([[1, 0, -1, 0, 0], [0, 0, 1, 0, -1], [0, 1, 1, 0, 0], [1, -1, -1, -1, 0]])
    assert torch.autograd.gradcheck(lambda a: loss(a, z), (x,), **GRADCHECK)
    # the tolerance still catches a wrong gradient: gradcheck of a deliberately wrong backward
    wrong = lambda a: loss(a, z) + (_Scale.apply(a) - a.detach()).sum() * 0.05  # noqa: E731
    with pytest.raises(RuntimeError, match="Jacobian mismatch"):
        torch.autograd.gradcheck(wrong, (x,), **GRADCHECK)


class _Scale(torch.autograd.Function):
    """Identity in the forward pass, gradient doubled in the backward pass (a planted bug)."""

    @staticmethod
    def forward(ctx, a):
        return a.clone()

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


def test_pr_pairs_each_positive_without_a_pair_tensor_per_label_pair():
    """PR took a B x L x L tensor of every (i, j) pair, masked to positive i and other j:
    minutes an epoch at 1,000 classes (benchmarks/pr_many_classes.py). It now takes the K x L
    hinges of the K observed positives; the stacked step's gradient equals the every-pair
    form's bit for bit, the loss to float rounding, autograd's through ``entries`` too."""
    from spmlkit.labels import NEGATIVE, POSITIVE, UNOBSERVED

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 40, generator=g, dtype=torch.float64)
    observed = torch.where(torch.rand(6, 40, generator=g) < 0.2, NEGATIVE, UNOBSERVED).to(
        torch.int8)
    observed[torch.arange(6), torch.randint(0, 40, (6,), generator=g)] = POSITIVE
    observed[2, :5] = POSITIVE
    observed[4] = UNOBSERVED  # a row without a positive
    p = torch.sigmoid(logits)
    pos = (observed == POSITIVE).double()
    other = ((observed == UNOBSERVED) | (observed == NEGATIVE)).double()
    hinge = (1.0 - p.unsqueeze(-1) + p.unsqueeze(-2)) * pos.unsqueeze(-1) * other.unsqueeze(-2)
    active = (hinge > 0).double()
    want_grad = (active.sum(dim=-2) - active.sum(dim=-1)).mul(p * (1 - p)).div(6 * 40)
    values, grad = create_loss("pr").stacked_step(logits, observed, None)
    assert torch.equal(grad, want_grad)
    assert torch.allclose(values, hinge.clamp(min=0).sum(dim=(1, 2, 3)) / (6 * 40))
    x = logits[0].clone().requires_grad_()
    create_loss("pr")(x, observed).backward()
    assert torch.allclose(x.grad, want_grad[0], rtol=0, atol=1e-15)


def test_role_warns_of_its_dense_estimator_at_scale(monkeypatch):
    """ROLE's every step moves the whole N x L estimator (dense Adam, as the official code):
    minutes an epoch at 10k x 1k where AN takes a second; past ``DENSE_WARN`` entries it says
    so once, at the start of the run, and not below."""
    from spmlkit.losses.cole import ROLELoss

    monkeypatch.setattr(ROLELoss, "DENSE_WARN", 100)
    observed = torch.zeros(20, 5, dtype=torch.int8)
    observed[:, 0] = 1
    with pytest.warns(UserWarning, match=r"ROLE: its label estimator holds 20 x 5 entries, and "
                                         r"every step's Adam update moves all of them"):
        create_loss("role").on_train_start(observed, TrainInfo(20, 5, seed=0))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        create_loss("role").on_train_start(observed[:10], TrainInfo(10, 5, seed=0))
        # stepped row by row, its cost is the batch's: no warning
        create_loss("role", estimator_update="rows").on_train_start(observed,
                                                                   TrainInfo(20, 5, seed=0))
