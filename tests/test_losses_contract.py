"""Contract tests generated from the loss registry (docs/extending/loss.md#contract).

Every name in ``spmlkit.losses.LOSSES.names()`` is built the same generic way (see
`build`): ``create_loss(name, reduction=...)``, ``on_train_start(observed, TrainInfo(N, L,
k=1.5, seed=0, num_epochs=3))``, and called as ``loss(logits, observed, index=idx)`` with the
batch's rows in the train split. A loss that declares a need this helper cannot give (a
``needs_*`` flag other than ``needs_index`` / ``needs_train_predictions`` / ``needs_scores``, or
a ``forward`` with further required arguments) is skipped with a reason that names it, so the gap
is visible. A loss with ``needs_scores`` (an external scorer's N x L matrix, ``em_pl``, ``gpr``)
gets ``scores=`` a matrix made here: scores in [0, 1] that mostly agree with the labels the
observed ones were drawn from, so it has positive and negative pseudo-labels to use.
"""
from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch

from spmlkit.labels import make_observed
from spmlkit.losses import LOSSES, TrainInfo, create_loss, list_losses, loss_hparams

NAMES = LOSSES.names()
pytestmark = pytest.mark.filterwarnings("ignore:.*warmup.*num_epochs:UserWarning")
N, L, B = 24, 6, 8
KNOWN_NEEDS = {"needs_index", "needs_train_predictions", "needs_scores"}


def _train_full(seed=0):
    rng = np.random.RandomState(seed)
    y = (rng.random_sample((N, L)) < 0.35).astype(np.uint8)
    y[np.arange(N), rng.randint(0, L, N)] = 1  # every row has a positive
    return y


def _train_observed(seed=0, regime="1p"):
    return torch.as_tensor(make_observed(_train_full(seed), regime, seed=1200 + seed)).long()


def _given(name) -> dict:
    """What the helper gives a loss beyond its defaults: an external scorer's matrix."""
    if getattr(LOSSES.get(name).factory, "needs_scores", False):
        rng = np.random.RandomState(99)
        logits = 3.0 * (2.0 * _train_full() - 1.0) + rng.standard_normal((N, L))
        return {"scores": 1.0 / (1.0 + np.exp(-logits))}
    return {}


def _unsupported(name, loss):
    extra = sorted(a for a in dir(type(loss))
                   if a.startswith("needs_") and a not in KNOWN_NEEDS and getattr(loss, a))
    sig = inspect.signature(loss.forward)
    required = [p for p in list(sig.parameters)[2:]
                if sig.parameters[p].default is inspect.Parameter.empty
                and sig.parameters[p].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                   inspect.Parameter.VAR_KEYWORD)]
    if extra or required:
        return (f"loss {name!r} needs {extra + required}, which the generic contract helper "
                f"cannot give")
    return None


def build(name, reduction="mean", observed=None, **hparams):
    """A ready-to-call loss and the train split's observed labels."""
    observed = _train_observed() if observed is None else observed
    if "reduction" not in loss_hparams(name):
        pytest.skip(f"loss {name!r} takes no 'reduction' hyperparameter")
    loss = create_loss(name, reduction=reduction, **{**_given(name), **hparams})
    why = _unsupported(name, loss)
    if why:
        pytest.skip(why)
    loss.on_train_start(observed, TrainInfo(num_examples=N, num_classes=L, k=1.5, seed=0,
                                            num_epochs=3))
    loss.on_epoch_start(0)  # a training loop's first epoch (the hook a schedule needs)
    return loss, observed


def batch(observed, seed=0, b=B, scale=2.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(N, generator=g)[:b]
    logits = (scale * torch.randn(b, L, generator=g)).to(dtype)
    return logits, observed[idx], idx


_HEAD = torch.nn.Linear(3, L)


def call(loss, logits, obs, idx):
    """The loss of a batch; a loss with a penalty on the model's weights gets its
    ``penalty(model)`` call as in a training step (the value is not added: these tests are about
    ``forward``)."""
    if "penalty" in loss.required_hooks():
        loss.penalty(_HEAD)
    return loss(logits, obs, index=idx)


@pytest.fixture(params=NAMES)
def name(request):
    return request.param


# ------------------------------------------------------------------ the registry -------------
def test_registry_not_empty_and_unique():
    assert len(NAMES) >= 8 and len(set(NAMES)) == len(NAMES)


def test_list_losses_descriptions():
    listed = dict(list_losses())
    assert list(listed) == NAMES
    for n, desc in listed.items():
        assert isinstance(desc, str) and len(desc.strip()) >= 10, n


def test_every_entry_has_a_paper(name):
    assert LOSSES.get(name).paper.strip(), f"loss {name!r} names no paper"


# ------------------------------------------------------------------ values -------------------
def test_scalar_finite_float32(name):
    loss, obs_all = build(name)
    for seed in range(3):
        logits, obs, idx = batch(obs_all, seed)
        out = call(loss, logits, obs, idx)
        assert isinstance(out, torch.Tensor)
        assert out.shape == () and out.dtype == torch.float32
        assert torch.isfinite(out), f"{name}: {out}"


def test_official_eps_option(name):
    """eps=1e-5 (the official log(p + eps) form, docs/spec.md#notation) works for every loss and,
    away from saturation, stays close to the exact log-space value."""
    exact, obs_all = build(name)
    official, _ = build(name, eps=1e-5)
    logits, obs, idx = batch(obs_all, 12, scale=1.0)
    logits.requires_grad_(True)
    out = call(official, logits, obs, idx)
    assert out.dtype == torch.float32 and torch.isfinite(out)
    out.backward()
    assert torch.isfinite(logits.grad).all()
    torch.testing.assert_close(out, call(exact, logits, obs, idx), rtol=1e-2, atol=1e-3)


def _offers(name, reduction) -> bool:
    return reduction in LOSSES.get(name).factory.reductions


def test_reductions_not_offered_are_refused(name):
    """A loss defined on the whole batch (no per-entry matrix: ``vpu``) declares the
    reductions it offers; the others raise a ValueError that says why, at construction."""
    refused = [r for r in ("mean", "sum", "none") if not _offers(name, r)]
    assert _offers(name, "mean"), f"{name}: every loss offers 'mean'"
    for reduction in refused:
        with pytest.raises(ValueError, match="whole batch"):
            create_loss(name, reduction=reduction, **_given(name))


def test_none_reduction_shape_and_mean(name):
    if not _offers(name, "none"):
        pytest.skip(f"{name} offers {LOSSES.get(name).factory.reductions} only")
    mean_loss, obs_all = build(name, "mean")
    none_loss, _ = build(name, "none")
    sum_loss, _ = build(name, "sum")
    logits, obs, idx = batch(obs_all, 1)
    m = call(mean_loss, logits, obs, idx)
    nn_ = call(none_loss, logits, obs, idx)
    s = call(sum_loss, logits, obs, idx)
    assert nn_.shape == (B, L), f"{name}: 'none' gives {tuple(nn_.shape)}"
    assert nn_.dtype == torch.float32
    torch.testing.assert_close(nn_.mean(), m, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s, B * L * m, rtol=1e-5, atol=1e-5)


def test_backward_finite(name):
    loss, obs_all = build(name)
    logits, obs, idx = batch(obs_all, 2)
    logits.requires_grad_(True)
    call(loss, logits, obs, idx).backward()
    assert logits.grad is not None, f"{name}: no gradient reaches the logits"
    assert torch.isfinite(logits.grad).all()
    assert logits.grad.abs().sum() > 0, f"{name}: gradient is identically zero"
    for pname, p in loss.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), f"{name}.{pname}"


def test_finite_at_extreme_logits(name):
    loss, obs_all = build(name)
    _, obs, idx = batch(obs_all, 3)
    sign = torch.where(torch.arange(B * L).reshape(B, L) % 2 == 0, 1.0, -1.0)
    for label, logits in (("+100", torch.full((B, L), 100.0)),
                          ("-100", torch.full((B, L), -100.0)), ("+-100", 100.0 * sign)):
        logits.requires_grad_(True)
        out = call(loss, logits, obs, idx)
        assert torch.isfinite(out), f"{name} at logits {label}: {out}"
        out.backward()
        assert torch.isfinite(logits.grad).all(), f"{name} at logits {label}: non-finite grad"


def test_empty_batch(name):
    for reduction in [r for r in ("mean", "sum", "none") if _offers(name, r)]:
        loss, obs_all = build(name, reduction)
        logits = torch.zeros(0, L, requires_grad=True)
        idx = torch.zeros(0, dtype=torch.long)
        out = call(loss, logits, obs_all[idx], idx)
        if reduction == "none":
            assert out.shape == (0, L)
        else:
            assert out.shape == ()
            assert out.item() == 0.0
        assert not torch.isnan(out).any()
        assert out.requires_grad and out.grad_fn is not None, \
            f"{name} ({reduction}): empty-batch value is off the autograd graph"
        out.sum().backward()  # does not raise


def test_all_unobserved_batch(name):
    zeros = torch.zeros(N, L, dtype=torch.long)
    loss, _ = build(name, observed=zeros)
    logits, obs, idx = batch(zeros, 4)
    logits.requires_grad_(True)
    out = call(loss, logits, obs, idx)
    assert torch.isfinite(out), f"{name}: {out} on a batch with nothing observed"
    out.backward()
    assert torch.isfinite(logits.grad).all()


def test_all_unobserved_rows_in_a_batch(name):
    loss, obs_all = build(name)
    logits, obs, idx = batch(obs_all, 5)
    obs = obs.clone()
    obs[:3] = 0
    assert torch.isfinite(call(loss, logits, obs, idx))


def test_half_precision_input_computes_in_float32(name):
    """bfloat16 / float16 logits (mixed precision) give a float32 value equal to the float32
    computation on the same rounded logits: no half-precision arithmetic inside."""
    loss, obs_all = build(name)
    logits, obs, idx = batch(obs_all, 6)
    for dtype in (torch.bfloat16, torch.float16):
        low = logits.to(dtype)
        out = call(build(name)[0], low, obs, idx)
        assert out.dtype == torch.float32, f"{name}: {dtype} input gives {out.dtype}"
        assert torch.isfinite(out)
        torch.testing.assert_close(out, call(build(name)[0], low.float(), obs, idx),
                                   rtol=1e-5, atol=1e-6)


def test_float64_input_stays_float64(name):
    """float64 stays float64 (so gradcheck checks every loss directly) and agrees with the
    float32 computation."""
    loss, obs_all = build(name)
    logits, obs, idx = batch(obs_all, 6)
    ref = call(loss, logits, obs, idx)
    out = call(build(name)[0], logits.double(), obs, idx)
    assert out.dtype == torch.float64, f"{name}: torch.float64 input gives {out.dtype}"
    torch.testing.assert_close(out.float(), ref, rtol=1e-5, atol=1e-6)


def test_batch_permutation_invariance(name):
    for seed in (0, 1):
        loss_a, obs_all = build(name)
        loss_b, _ = build(name)
        logits, obs, idx = batch(obs_all, 10 + seed, scale=3.0)
        perm = torch.randperm(B, generator=torch.Generator().manual_seed(seed))
        assert not torch.equal(perm, torch.arange(B))
        a = call(loss_a, logits, obs, idx)
        b = call(loss_b, logits[perm], obs[perm], idx[perm])
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_epoch_hooks_cycle(name):
    """on_epoch_start / forward / backward / on_epoch_end over the TrainInfo's 3 epochs, with the
    whole split's eval logits when the loss asks for them; values stay finite throughout."""
    loss, obs_all = build(name)
    g = torch.Generator().manual_seed(7)
    own = loss.param_groups(0.01)  # the loss's own parameters (ROLE) are trained too
    opt = torch.optim.SGD(own, lr=0.01) if own else None
    for epoch in range(3):
        if epoch:
            loss.on_epoch_start(epoch)
        for step in range(3):
            idx = torch.randperm(N, generator=g)[:B]
            logits = torch.randn(B, L, generator=g, requires_grad=True)
            out = call(loss, logits, obs_all[idx], idx)
            assert torch.isfinite(out), f"{name}: epoch {epoch} step {step}: {out}"
            out.backward()
            assert torch.isfinite(logits.grad).all()
            if opt is not None:
                opt.step()
                opt.zero_grad()
        train_logits = torch.randn(N, L, generator=g) if loss.needs_train_predictions else None
        loss.on_epoch_end(epoch, train_logits)


def test_state_dict_round_trip(name):
    loss, obs_all = build(name)
    sd = loss.state_dict()
    fresh = create_loss(name)
    fresh.load_state_dict(sd)
    fresh.on_train_start(obs_all, TrainInfo(num_examples=N, num_classes=L, k=1.5, seed=0,
                                            num_epochs=3))
    for key, val in sd.items():
        torch.testing.assert_close(fresh.state_dict()[key], val, rtol=0, atol=0)
    logits, obs, idx = batch(obs_all, 8)
    torch.testing.assert_close(call(fresh, logits, obs, idx), call(loss, logits, obs, idx))


# ------------------------------------------------------------------ errors -------------------
def _shapes_named(msg, *shapes):
    return all(re.search(re.escape(str(tuple(s))), msg) for s in shapes)


def test_wrong_shapes_raise(name):
    loss, obs_all = build(name)
    logits, obs, idx = batch(obs_all, 9)
    bad_obs = torch.zeros(B, L + 1, dtype=torch.long)
    with pytest.raises(ValueError) as err:
        call(loss, logits, bad_obs, idx)
    assert _shapes_named(str(err.value), (B, L), (B, L + 1)), str(err.value)
    with pytest.raises(ValueError) as err:
        call(loss, logits[0], obs[0], idx[:1])
    assert _shapes_named(str(err.value), (L,)), str(err.value)
    with pytest.raises(ValueError) as err:
        call(loss, logits, obs[:-1], idx)
    assert _shapes_named(str(err.value), (B, L), (B - 1, L)), str(err.value)


def _declares_index(n):
    try:
        return bool(create_loss(n).needs_index)
    except Exception:  # reported by the other contract tests
        return False


@pytest.mark.parametrize("name", [n for n in NAMES if _declares_index(n)])
def test_index_required_when_declared(name):
    loss, obs_all = build(name)
    logits, obs, idx = batch(obs_all, 11)
    with pytest.raises(ValueError, match="index"):
        loss(logits, obs)
    with pytest.raises(ValueError, match="index"):
        loss(logits, obs, index=idx[:-1])


def test_unknown_hparam_rejected(name):
    with pytest.raises(ValueError, match="no hyperparameter"):
        create_loss(name, not_a_real_hparam=1)


@pytest.mark.parametrize("bad, dtype", [(3, torch.int64), (3, torch.int8), (-2, torch.int8),
                                        (0.5, torch.float32), (float("nan"), torch.float32)])
def test_observed_values_outside_the_encoding_raise(name, bad, dtype):
    """A label outside {1, 0, -1} is an error naming the value and the batch row, whatever the
    dtype (it used to be computed with silently)."""
    loss, obs_all = build(name)
    logits, obs, idx = batch(obs_all, 13)
    obs = obs.to(dtype)
    call(loss, logits, obs, idx)  # the valid batch passes in this dtype
    broken = obs.clone()
    broken[2, 1] = bad
    with pytest.raises(ValueError, match=rf"found \[{'nan' if bad != bad else bad}\] "
                                         rf"\(first at batch row 2\)"):
        call(loss, logits, broken, idx)


# ------------------------------------------------------------------ known negatives ----------
def _with_negatives(seed=0):
    """Observed labels with known negatives: one positive and one negative per row
    (``1p_1n``), and rows without a positive (section "rows without a positive" below)."""
    obs = torch.as_tensor(make_observed(_train_full(seed), "1p_1n", seed=1200 + seed)).long()
    obs[0] = -1          # a "none of these" row: every label a known negative
    obs[1] = 0           # a background row: nothing observed
    obs[2, obs[2] == 1] = 0  # a row with its one negative only
    return obs


def test_neg_weight_scales_the_observed_negatives_terms(name):
    """``neg_weight=w`` multiplies the entries of the observed negatives (and nothing else)
    for a loss whose O- entries hold their own term (``negative_entries``); the others refuse
    it by name. ``neg_weight=1`` (the default) is the loss unchanged, bit for bit."""
    factory = LOSSES.get(name).factory
    obs_all = _with_negatives()
    if not factory.negative_entries:
        with pytest.raises(ValueError, match="takes no neg_weight"):
            create_loss(name, neg_weight=2.5, **_given(name))
        return
    base, _ = build(name, observed=obs_all)
    one, _ = build(name, observed=obs_all, neg_weight=1.0)
    heavy, _ = build(name, observed=obs_all, neg_weight=2.5)
    logits, obs, idx = batch(obs_all, 7)
    assert (obs == -1).any() and (obs == 0).any()
    mat, pen = base.entries(logits, obs, idx)
    wmat, wpen = heavy.weighted_entries(logits, obs, idx)
    torch.testing.assert_close(wmat, torch.where(obs == -1, 2.5 * mat, mat), rtol=1e-6, atol=0)
    assert (pen is None) == (wpen is None)
    expected = wmat.mean() + (0.0 if wpen is None else wpen)
    torch.testing.assert_close(call(heavy, logits, obs, idx), expected, rtol=1e-6, atol=1e-7)
    assert torch.equal(call(one, logits, obs, idx), call(base, logits, obs, idx))


def test_neg_weight_must_be_a_number_at_least_zero(name):
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="neg_weight"):
            create_loss(name, neg_weight=bad, **_given(name))


# ------------------------------------------------------------------ rows without a positive --
def test_rows_without_a_positive_give_a_finite_loss_and_gradient(name):
    """Background rows (nothing observed), "none of these" rows (every label a known negative)
    and rows with known negatives only are accepted by every loss, in the train split and in a
    batch, alone or beside rows with a positive: a finite value and gradient
    (docs/methods/catalogue.md says per loss what they do)."""
    obs_all = _with_negatives()
    loss, _ = build(name, observed=obs_all)
    logits, obs, idx = batch(obs_all, 8)
    for rows in (torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([0, 1, 2])):
        s = logits[: len(rows)].clone().requires_grad_(True)
        out = call(loss, s, obs_all[rows], rows)
        assert torch.isfinite(out), f"{name}: {out} on rows {rows.tolist()}"
        out.backward()
        assert torch.isfinite(s.grad).all(), f"{name}: non-finite gradient"


@pytest.mark.parametrize("name", ["role", "em_apl", "ll_cp", "opml_sp"])
def test_an_index_that_is_not_the_batchs_rows_is_refused(name):
    """Negative positions (wrapped), fractions (truncated), a boolean mask (read as rows 0 / 1)
    and rows past the train split: a clear error, not other rows' state."""
    from spmlkit.losses import TrainInfo, create_loss

    torch.manual_seed(0)
    n, c = 40, 5
    obs = torch.zeros(n, c, dtype=torch.long)
    obs[torch.arange(n), torch.randint(0, c, (n,))] = 1
    loss = create_loss(name)
    loss.on_train_start(obs, TrainInfo(n, c, k=1.5, num_epochs=3))
    loss.on_epoch_start(0)
    cases = {"0 to 39; found -1": torch.tensor([-1, 2]), "found 40": torch.tensor([39, 40]),
             "not torch.float32": torch.tensor([3.9, 7.2]),
             "not torch.bool": torch.tensor([True, False])}
    with torch.no_grad():
        for says, index in cases.items():
            with pytest.raises(ValueError, match=re.escape(says)):
                loss(torch.randn(2, c), obs[:2], index=index)
        assert torch.isfinite(loss(torch.randn(2, c), obs[:2], index=[38, 39]))


def test_numpy_labels_are_refused_with_a_message_that_says_so():
    """The numpy labels `make_observed` returns, handed to a loss as they are: an
    AttributeError from deep inside (numpy 2's ``ndarray.device`` is the string 'cpu') became
    a TypeError that names the argument and the conversion."""
    obs = make_observed(np.array([[1, 0, 1], [0, 1, 0]], np.uint8), "1p", seed=0)
    says = r"AssumeNegativeLoss: {} must be a torch.Tensor, got numpy.ndarray: convert with"
    with pytest.raises(TypeError, match=says.format("observed labels")):
        create_loss("an")(torch.zeros(2, 3, requires_grad=True), obs)
    with pytest.raises(TypeError, match=says.format("logits")):
        create_loss("an")(np.zeros((2, 3)), torch.as_tensor(obs))


def test_a_loss_or_source_that_takes_a_reserved_name_is_refused_at_registration():
    """A loss with a hyperparameter named ``reg`` crashed every entry point ("'int' object is
    not iterable": create_loss takes ``reg`` as its regularisers); a source taking a protocol
    option (``subsample``) never received it. Both are refused where they are registered, and
    a name registered twice names both places."""
    from spmlkit.data import DATASETS
    from spmlkit.losses.contract import SPMLLoss

    class Mine(SPMLLoss):
        def __init__(self, reg: float = 1.0, **kw):
            super().__init__(**kw)

    with pytest.raises(ValueError, match=r"loss 'mine_reg' .* takes a parameter named 'reg', "
                                         r"which is create_loss's own"):
        LOSSES.register("mine_reg", "test")(Mine)
    assert "mine_reg" not in LOSSES

    def source(path: str, subsample: float = 1.0):
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="takes a parameter named 'subsample', which is a "
                                         "protocol option"):
        DATASETS.register("mine_sub", "test")(source)
    with pytest.raises(ValueError, match=r"loss 'an' is registered twice: by "
                                         r"spmlkit.losses.cole.AssumeNegativeLoss and by"):
        LOSSES.register("an", "test")(type("Other", (SPMLLoss,), {}))
