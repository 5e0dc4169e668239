"""The vectorised linear engine (spmlkit.engine.vectorised): R stacked runs equal R single runs
for every stackable loss of the registry; the rest fall back; a study gives the same table with
and without it."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from spmlkit.engine import TrainConfig, fit_linear
from spmlkit.engine.vectorised import (
    CPU_LARGE_STACK,
    CPU_STACK_WORK,
    can_stack,
    closed_form,
    fit_linear_stacked,
    stack_limit,
    stacked_val_map,
)
from spmlkit.losses import LOSSES, create_loss
from spmlkit.losses.scorer import simulated_scores


def _data(n=60, d=7, classes=5, seed=0):
    g = np.random.RandomState(seed)
    y = (g.rand(n, classes) < 0.35).astype(np.uint8)
    y[np.arange(n), g.randint(0, classes, n)] = 1
    x = (y @ g.randn(classes, d) + 0.5 * g.randn(n, d)).astype(np.float32)
    z = np.zeros_like(y, dtype=np.int8)  # one observed positive per row
    for i in range(n):
        z[i, g.choice(np.flatnonzero(y[i]))] = 1
    return x, y, z


X, Y, Z = _data()
XV, YV, _ = _data(30, seed=1)
#: an external scorer's N x L matrix (em_pl, gpr): a noisy one, so pseudo-labels are wrong too
SCORES = simulated_scores(Y, flip=0.1, margin=2.0, noise=1.0, seed=0)
#: hyperparameters that make a loss's state matter within a few epochs (SPLC corrects from the
#: second epoch at a threshold it reaches; EM_PL's pseudo-labels follow a warm-up epoch)
HPARAMS = {"em_apl": {"warmup": 1}, "soft_opml": {"correction_ratio": 0.2, "warmup": 0},
           "opml_sp": {"warmup": 0}, "epr": {"k": 1.5}, "role": {"k": 1.5},
           "splc": {"tau": 0.3}, "em_pl": {"scores": SCORES, "warmup": 1, "beta_neg": 0.5,
                                           "neg_ratio": 0.2},
           "gpr": {"scores": SCORES}}
STACKABLE = [n for n in LOSSES.names() if create_loss(n, **HPARAMS.get(n, {})).stackable]
CONFIGS = [TrainConfig(epochs=4, batch_size=8, lr=lr, seed=s, early_stop="patience:2")
           for lr, s in ((1e-2, 0), (1e-3, 1), (1e-2, 2))]


NOT_STACKABLE = [n for n in LOSSES.names() if n not in STACKABLE]


def test_the_registry_is_mostly_stackable():
    """Each loss declares whether its runs stack (``SPMLLoss.stackable``); the tests below
    check the declaration against what stacking does, in both directions."""
    assert {"an", "role", "epr", "pr", "em_apl", "soft_opml", "l2r", "gr", "hill", "splc",
            "em_pl", "gpr"} <= set(STACKABLE)
    assert len(STACKABLE) > 2 * len(NOT_STACKABLE)


@pytest.mark.parametrize("name", NOT_STACKABLE)
def test_a_loss_declared_not_stackable_does_not_stack(name):
    """A loss that declares ``stackable = False`` is refused by the engine (its runs train one
    by one), and the declaration is needed: stacking it anyway does not give its single runs
    (the large-loss methods draw batch-sized rejections and change state inside ``forward``)."""
    hp = HPARAMS.get(name, {})
    assert "not stackable" in can_stack(create_loss(name, **hp), CONFIGS[0])
    with pytest.raises(ValueError, match="cannot be stacked.*not stackable"):
        fit_linear_stacked(X, Z, [create_loss(name, **hp) for _ in CONFIGS], CONFIGS,
                           x_val=XV, y_val=YV, k=1.5)
    cls = type(create_loss(name, **hp))
    flipped = type(f"Stacked{cls.__name__}", (cls,), {"stackable": True})  # declaration flipped
    forced = [create_loss(name, **hp) for _ in CONFIGS]
    for loss in forced:
        loss.__class__ = flipped
    single = [fit_linear(X, Z, create_loss(name, **hp), c, x_val=XV, y_val=YV, k=1.5)
              for c in CONFIGS]
    try:
        stacked = fit_linear_stacked(X, Z, forced, CONFIGS, x_val=XV, y_val=YV, k=1.5)
    except (TypeError, IndexError, RuntimeError):
        return  # it cannot run stacked at all
    assert any(isinstance(out, BaseException)
               or not torch.allclose(out[0].weight, m1.weight, atol=2e-6, rtol=0)
               for (m1, _), out in zip(single, stacked)), \
        f"{name} stacks exactly: declare stackable = True"


@pytest.mark.parametrize("name", STACKABLE)
def test_stacked_runs_equal_single_runs(name):
    hp = HPARAMS.get(name, {})
    single = [fit_linear(X, Z, create_loss(name, **hp), c, x_val=XV, y_val=YV, k=1.5)
              for c in CONFIGS]
    records = [[] for _ in CONFIGS]
    stacked = fit_linear_stacked(
        X, Z, [create_loss(name, **hp) for _ in CONFIGS], CONFIGS, x_val=XV, y_val=YV, k=1.5,
        on_epoch=[lambda rec, m, l, r=r: records[r].append(dict(rec))
                  for r in range(len(CONFIGS))])
    for (m1, r1), out, rec in zip(single, stacked, records):
        assert not isinstance(out, BaseException), out
        m2, r2 = out
        assert r2.best_epoch == r1.best_epoch
        assert len(r2.history) == len(r1.history) and r2.stopped_early == r1.stopped_early
        assert r2.val_map == pytest.approx(r1.val_map, abs=1e-6)
        torch.testing.assert_close(m2.weight, m1.weight, atol=2e-6, rtol=0)
        torch.testing.assert_close(m2.bias, m1.bias, atol=2e-6, rtol=0)
        for h1, h2 in zip(r1.history, r2.history):
            assert list(h1) == list(h2) and h1["best"] == h2["best"]
            assert h2["train_loss"] == pytest.approx(h1["train_loss"], rel=1e-5, abs=1e-6)
        assert [h["epoch"] for h in rec] == [h["epoch"] for h in r1.history]


CLOSED = [n for n in STACKABLE if closed_form(create_loss(n, **HPARAMS.get(n, {})))]


def test_closed_form_losses_are_the_bce_family():
    assert {"an", "an_ls", "wan", "bce", "epr", "dw", "an_ls_asym"} <= set(CLOSED)
    # a penalty on the head, an entropy term, state or the official log(p + eps): autograd
    assert {"l1r", "l2r", "entmin", "role", "em", "pr"}.isdisjoint(CLOSED)
    assert not closed_form(create_loss("an", eps=1e-5))


@pytest.mark.parametrize("name", CLOSED)
def test_the_closed_form_step_is_the_autograd_step(name):
    """The engine's gradient without autograd equals autograd's through the loss's own
    ``entries`` (a subclass that changes ``entries`` without clearing ``closed_form`` fails
    here)."""
    from spmlkit.engine.stacked import closed_form_tables
    from spmlkit.losses import TrainInfo

    g = torch.Generator().manual_seed(3)
    z = torch.as_tensor(Z[:8]).repeat(2, 1)
    z[:4, 0] = -1  # some observed negatives
    losses = [create_loss(name, **HPARAMS.get(name, {})) for _ in range(2)]
    for loss in losses:
        loss.on_train_start(z, TrainInfo(len(z), z.shape[1], 1.5, 0, 1))
    logits = torch.randn(2, 16, z.shape[1], generator=g)
    tables, offsets, count = closed_form_tables(losses, [z, z], torch.float32)
    assert offsets is None
    values, grad = losses[0].closed_form_step(
        logits, tables[0].expand(2, -1, -1),
        tables[1].expand(2, -1, -1) if len(tables) > 1 else None, count)
    want = torch.stack([losses[0](s.clone().requires_grad_(True), z) for s in logits])
    leaf = logits.clone().requires_grad_(True)
    torch.stack([losses[0](leaf[r], z) for r in range(2)]).sum().backward()
    torch.testing.assert_close(values, want.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad, leaf.grad, atol=1e-7, rtol=1e-5)


def test_a_loss_that_is_not_closed_form_has_no_closed_form_step():
    """``closed_form_step`` is the contract's answer for closed-form losses only: None for a
    loss whose ``entries`` are not one weighted BCE (ROLE's label estimates, L2R's penalty)."""
    logits, target = torch.zeros(2, 4, 3), torch.ones(2, 4, 3)
    for name in ("role", "l2r", "entmin"):
        assert create_loss(name).closed_form_step(logits, target, None, None) is None
    values, grad = create_loss("an").closed_form_step(logits, target, None, None)
    assert values.shape == (2,) and grad.shape == logits.shape


MANUAL = [n for n in STACKABLE if create_loss(n, **HPARAMS.get(n, {})).manual_gradient]


@pytest.mark.parametrize("name", MANUAL)
def test_a_hand_written_stacked_step_is_the_autograd_step(name):
    """``stacked_step`` (ROLE, PR) equals autograd through the loss's own stacked ``entries``:
    each run's value, the logits' gradient and the loss parameters' gradients."""
    import copy

    from spmlkit.losses import TrainInfo

    g = torch.Generator().manual_seed(5)
    z = torch.as_tensor(Z[:12])
    z[:3, -1] = -1  # some observed negatives
    loss = create_loss(name, **HPARAMS.get(name, {}))
    loss.on_train_start(z, TrainInfo(len(z), z.shape[1], 1.5, 0, 1))
    runs = 3
    for p_ in loss.parameters():  # stacked state as the engine keeps it, runs apart
        p_.data = torch.stack([p_.data + 0.3 * r for r in range(runs)])
    index = torch.stack([torch.randperm(len(z), generator=g)[:8] for _ in range(runs)])
    observed = torch.stack([z[i] for i in index])
    logits = torch.randn(runs, 8, z.shape[1], generator=g)
    manual = copy.deepcopy(loss)
    with torch.no_grad():
        values, grad = manual.stacked_step(logits, observed, index)
    leaf = logits.clone().requires_grad_(True)
    mat, pen = loss.entries(leaf, observed, index)
    want = mat.mean(dim=(1, 2)) + (0 if pen is None else pen)
    want.sum().backward()
    torch.testing.assert_close(values, want.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad, leaf.grad, atol=1e-7, rtol=1e-5)
    for p1, p2 in zip(loss.parameters(), manual.parameters()):
        torch.testing.assert_close(p2.grad, p1.grad, atol=1e-7, rtol=1e-5)
    assert {"role", "pr"} <= set(MANUAL)


def test_closed_form_runs_of_different_losses_and_labels_stack_and_equal_single_runs():
    """AN, AN-LS, WAN and EPR on one positive, BCE on full labels and on one positive plus all
    negatives (Cole's IUN) in one stack: each run equals its single run."""
    full = Y.astype(np.int8) * 2 - 1
    alln = np.where(Z == 1, 1, -1).astype(np.int8)
    specs = [("an", Z, {}), ("an_ls", Z, {}), ("wan", Z, {}), ("epr", Z, {"k": 1.5}),
             ("bce", full, {}), ("bce", alln, {}), ("an_ls", Z, {"smoothing": 0.2})]
    configs = [TrainConfig(epochs=4, batch_size=8, lr=lr, seed=s)
               for lr, s in ((1e-2, 0), (1e-3, 1))]
    runs = [(name, z, hp, c) for name, z, hp in specs for c in configs]
    stacked = fit_linear_stacked(X, [z for _, z, _, _ in runs],
                                 [create_loss(name, **hp) for name, _, hp, _ in runs],
                                 [c for *_, c in runs], x_val=XV, y_val=YV, k=1.5)
    for (name, z, hp, c), out in zip(runs, stacked):
        m1, r1 = fit_linear(X, z, create_loss(name, **hp), c, x_val=XV, y_val=YV, k=1.5)
        assert not isinstance(out, BaseException), out
        m2, r2 = out
        assert r2.best_epoch == r1.best_epoch, name
        torch.testing.assert_close(m2.weight, m1.weight, atol=2e-6, rtol=0)
        torch.testing.assert_close(m2.bias, m1.bias, atol=2e-6, rtol=0)
        for h1, h2 in zip(r1.history, r2.history):
            assert h2["train_loss"] == pytest.approx(h1["train_loss"], rel=1e-5, abs=1e-6)
    with pytest.raises(ValueError, match="closed-form"):
        fit_linear_stacked(X, Z, [create_loss("an"), create_loss("role", k=1.5)], configs)
    with pytest.raises(ValueError, match="closed-form"):
        fit_linear_stacked(X, [Z, full], [create_loss("pr"), create_loss("pr")], configs)


@pytest.mark.parametrize("metric", ["lrap", "ranking_loss"])
def test_stacked_runs_select_on_another_metric_as_single_runs(metric):
    """A non-mAP selection metric (higher or lower is better): the same best epochs, scores and
    history keys as single runs, and val_map NaN as there."""
    configs = [TrainConfig(epochs=5, batch_size=8, lr=lr, seed=s, metric=metric)
               for lr, s in ((1e-2, 0), (3e-3, 1))]
    stacked = fit_linear_stacked(X, Z, [create_loss("role", k=1.5) for _ in configs], configs,
                                 x_val=XV, y_val=YV, k=1.5)
    for c, out in zip(configs, stacked):
        m1, r1 = fit_linear(X, Z, create_loss("role", k=1.5), c, x_val=XV, y_val=YV, k=1.5)
        m2, r2 = out
        assert (r2.best_epoch, r2.metric) == (r1.best_epoch, metric)
        assert r2.val_score == pytest.approx(r1.val_score, abs=1e-6) and np.isnan(r2.val_map)
        assert [list(h) for h in r2.history] == [list(h) for h in r1.history]
        torch.testing.assert_close(m2.weight, m1.weight, atol=2e-6, rtol=0)


@pytest.mark.parametrize("name", ["role", "pr", "em", "an"])
def test_runs_of_one_seed_share_their_rows_and_equal_single_runs(name):
    """Eight runs per seed (SHARE_ROWS): one product per seed on shared rows (StackedLinear's
    shared), each run still its single run (autograd, hand-written and closed-form steps)."""
    from spmlkit.engine.vectorised import SHARE_ROWS

    lrs = [1e-2 * 0.7 ** i for i in range(SHARE_ROWS)]
    configs = [TrainConfig(epochs=3, batch_size=8, lr=lr, seed=s) for s in (0, 1) for lr in lrs]
    hp = HPARAMS.get(name, {})
    stacked = fit_linear_stacked(X, Z, [create_loss(name, **hp) for _ in configs], configs,
                                 x_val=XV, y_val=YV, k=1.5)
    for c, out in zip(configs, stacked):
        m1, r1 = fit_linear(X, Z, create_loss(name, **hp), c, x_val=XV, y_val=YV, k=1.5)
        m2, r2 = out
        assert r2.best_epoch == r1.best_epoch
        torch.testing.assert_close(m2.weight, m1.weight, atol=2e-6, rtol=0)
        torch.testing.assert_close(m2.bias, m1.bias, atol=2e-6, rtol=0)


def test_a_diverging_run_fails_alone():
    configs = [TrainConfig(epochs=3, batch_size=8, lr=1e-3, seed=0),
               TrainConfig(epochs=3, batch_size=8, lr=1e38, seed=1)]
    with pytest.raises(FloatingPointError):
        fit_linear(X, Z, create_loss("an"), configs[1], x_val=XV, y_val=YV)
    ok, bad = fit_linear_stacked(X, Z, [create_loss("an"), create_loss("an")], configs,
                                 x_val=XV, y_val=YV)
    assert isinstance(bad, FloatingPointError) and "diverged" in str(bad)
    _, heavy = fit_linear_stacked(X, Z, [create_loss("an"), create_loss("an")],
                                  [configs[0], TrainConfig(epochs=3, batch_size=8, lr=1e-3, seed=1,
                                                           weight_decay=1e308)],
                                  x_val=XV, y_val=YV)
    assert isinstance(heavy, FloatingPointError) and "weight decay of 1e+308" in str(heavy)
    single, _ = fit_linear(X, Z, create_loss("an"), configs[0], x_val=XV, y_val=YV)
    torch.testing.assert_close(ok[0].weight, single.weight, atol=2e-6, rtol=0)


def test_non_stackable_losses_and_configs_are_refused():
    assert "not stackable" in can_stack(create_loss("ll_r"), TrainConfig())
    assert can_stack(create_loss("an"), TrainConfig()) is None
    with pytest.raises(ValueError, match="seed, lr and weight_decay only"):
        fit_linear_stacked(X, Z, [create_loss("an"), create_loss("an")],
                           [TrainConfig(batch_size=8), TrainConfig(batch_size=16)])
    with pytest.raises(ValueError, match="cannot be stacked"):
        fit_linear_stacked(X, Z, [create_loss("ll_r"), create_loss("ll_r")],
                           [TrainConfig(seed=0), TrainConfig(seed=1)])


def test_role_rows_trains_one_run_at_a_time():
    """ROLE with estimator_update="rows" does not stack (the stacked engine's estimator update
    is dense, `stacked_step`): `can_stack` says so and the stacked engine refuses it, so its
    runs train one by one (train_runs' fallback); dense ROLE stacks."""
    rows = {"k": 1.5, "estimator_update": "rows"}
    assert "not stackable" in can_stack(create_loss("role", **rows), CONFIGS[0])
    assert can_stack(create_loss("role", k=1.5), CONFIGS[0]) is None
    with pytest.raises(ValueError, match="cannot be stacked.*not stackable"):
        fit_linear_stacked(X, Z, [create_loss("role", **rows) for _ in CONFIGS], CONFIGS,
                           x_val=XV, y_val=YV, k=1.5)


def test_stack_limit_rule():
    assert stack_limit(1354, 338, 103, 14, 8, create_loss("an")) >= 12   # yeast: stack
    # COCO-shaped on a CPU: compute-bound, a small stack; on a GPU memory alone decides
    assert stack_limit(82_000, 40_000, 2048, 80, 8, create_loss("an")) == CPU_LARGE_STACK
    assert 8 * 2048 * 80 > CPU_STACK_WORK >= 8 * 103 * 14


def test_stacked_val_map_is_val_map_of_each_run_bit_for_bit():
    """One AP core (metrics.ranked_ap): the stacked scoring (numpy's sort on a CPU, the
    device's sort elsewhere: run here on CPU tensors) gives each run's own val_map exactly."""
    from spmlkit.engine import val_map
    from spmlkit.engine.stacked import _device_ap
    from spmlkit.metrics import map_from_ap, per_class_ap

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 30, 5, generator=g)
    logits[1, :10] = 20.0  # saturated sigmoid: ties
    y = YV.copy()
    y[:, 4] = 0  # a class without positive: left out ("present") or scored 0 ("official")
    for conv in ("present", "official"):
        want = [val_map(s, y, conv) for s in logits]
        assert stacked_val_map(logits, y, conv) == want
        ap = _device_ap(torch.sigmoid(logits), torch.as_tensor(y))
        assert [map_from_ap(a, conv) for a in ap] == want
    probs = torch.sigmoid(logits).numpy()
    np.testing.assert_array_equal(per_class_ap(probs, y), [per_class_ap(p, y) for p in probs])
    logits[2, 0, 0] = float("nan")
    got = stacked_val_map(logits, y, "present")
    assert np.isnan(got[2]) and got[:2] == [val_map(s, y, "present") for s in logits[:2]]
    with pytest.raises(ValueError, match="same rows and classes"):
        per_class_ap(probs, y[:, :4])


def test_checkpoint_state_resumes_as_a_single_run():
    config = [TrainConfig(epochs=4, batch_size=8, lr=1e-2, seed=s) for s in (0, 1)]
    states = [[], []]
    fit_linear_stacked(X, Z, [create_loss("role", k=1.5) for _ in config], config,
                       x_val=XV, y_val=YV,
                       checkpoint=[lambda fn, r=r: states[r].append(fn()) for r in (0, 1)])
    full, res = fit_linear(X, Z, create_loss("role", k=1.5), config[1], x_val=XV, y_val=YV)
    resumed, res2 = fit_linear(X, Z, create_loss("role", k=1.5), config[1], x_val=XV,
                               y_val=YV, resume=states[1][1])
    assert res2.best_epoch == res.best_epoch
    torch.testing.assert_close(resumed.weight, full.weight, atol=2e-6, rtol=0)


@pytest.mark.slow
def test_a_study_gives_the_same_table_vectorised_or_not(tmp_path):
    from spmlkit.experiments.benchmark import run_benchmark
    from spmlkit.experiments.store import StudyStore
    from spmlkit.runs import read_run

    kw = {"losses": "an,role,ll_r", "references": (), "seeds": 2, "epochs": 2, "jobs": 1,
          "progress": False, "grid": {"batch_size": [16], "lr": [1e-2, 1e-3]}}
    vec = run_benchmark("yeast", out=tmp_path / "vec", **kw)
    one = run_benchmark("yeast", out=tmp_path / "one", vectorise=False, **kw)
    assert vec["table"].split("Wall time")[0] == one["table"].split("Wall time")[0]
    rows = {r["run_id"]: r for r in StudyStore(tmp_path / "vec" / "results.sqlite").rows()}
    metrics = {k: json.loads(r["metrics"]) for k, r in rows.items()}
    assert {m.get("vectorised") for k, m in metrics.items() if "-an-" in k} == {4}
    assert {m.get("vectorised") for k, m in metrics.items() if "-ll_r-" in k} == {None}
    for r in rows.values():  # every run has its complete folder
        run = read_run(tmp_path / "vec" / r["run_dir"])
        assert run.final is not None and run.best()["model"]["weight"].shape == (14, 103)
        lines = (run.path / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 2
