"""The full-batch solver (`spmlkit.engine.solve`): AN under the solver is scikit-learn's
one-vs-rest LogisticRegression at the same C; every registered loss is solved, solved in rounds,
or refused by name; the path selects on full and partial val labels."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from spmlkit.engine.solve import (C_PATH, FORMS, lam_from_c, solve_path, solver_form)
from spmlkit.losses import LOSSES, create_loss
from spmlkit.metrics import partial_labels

pytestmark = pytest.mark.filterwarnings("ignore:.*warmup.*:UserWarning")


def _sklearn(x, targets, c, sets):
    """Per-class LogisticRegression (lbfgs, L2, intercept unpenalised) solved tightly."""
    coefs, probs = [], [np.zeros((len(s), targets.shape[1])) for s in sets]
    for j in range(targets.shape[1]):
        clf = LogisticRegression(C=c, tol=1e-10, max_iter=10_000).fit(x, targets[:, j])
        coefs.append(np.r_[clf.coef_[0], clf.intercept_])
        for out, s in zip(probs, sets):
            out[:, j] = clf.predict_proba(s)[:, 1]
    return np.array(coefs), probs


def _random_problem(n=300, d=12, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = (x[:, :classes] + 0.7 * rng.normal(size=(n, classes)) > 0.4).astype(np.int8)
    z = np.zeros_like(y)
    for i in range(n):  # one observed positive per row that has one
        pos = np.flatnonzero(y[i])
        if len(pos):
            z[i, rng.choice(pos)] = 1
    return x, y, z


@pytest.mark.parametrize("c", [0.01, 1.0])
def test_an_equals_sklearn_on_a_random_problem(c):
    x, _, z = _random_problem()
    xt = np.random.default_rng(1).normal(size=(50, x.shape[1]))
    model, result = solve_path(x, z, create_loss("an"), c=c, tol=1e-9)
    coefs, (probs,) = _sklearn(x, (z > 0).astype(int), c, [xt])
    ours = torch.sigmoid(model(torch.as_tensor(xt, dtype=torch.float32))).detach().numpy()
    assert np.abs(ours - probs).max() < 1e-4
    w = torch.cat([model.weight, model.bias[:, None]], dim=1).detach().numpy()
    assert np.abs(w - coefs).max() < 1e-3
    assert result.records[0].lam == pytest.approx(1.0 / (c * len(x)))
    assert result.records[0].converged


def test_an_equals_sklearn_on_yeast():
    from spmlkit.loading import load_splits

    sp = load_splits("yeast", "1p")
    c = 10 ** -2.5  # what the yeast reference row selects
    model, _ = solve_path(sp.train.x, sp.observed, create_loss("an"), c=c, tol=1e-9)
    x = np.asarray(sp.train.x, np.float64)
    coefs, (probs,) = _sklearn(x, (sp.observed > 0).astype(int), c, [sp.test.x])
    ours = torch.sigmoid(model(torch.as_tensor(sp.test.x))).detach().numpy()
    assert np.abs(ours - probs).max() < 1e-4
    w = torch.cat([model.weight, model.bias[:, None]], dim=1).detach().numpy()
    assert np.abs(w - coefs).max() < 1e-3


def test_lam_from_c_refuses_bad_values():
    for bad in (0, -1.0, float("nan"), "1"):
        with pytest.raises(ValueError, match="C"):
            lam_from_c(bad, 10)


# ---- every registered loss: solved, solved in rounds, or refused by name ----------------------

def _hparams(name):
    if getattr(LOSSES.get(name).factory, "needs_scores", False):
        _, y, _ = _random_problem(n=120, d=6, classes=4, seed=3)
        rng = np.random.default_rng(5)
        return {"scores": 1 / (1 + np.exp(-(3 * (2 * y - 1) + rng.normal(size=y.shape))))}
    return {}


@pytest.mark.parametrize("name", LOSSES.names())
def test_every_loss_runs_under_the_solver_or_is_refused(name):
    x, y, z = _random_problem(n=120, d=6, classes=4, seed=3)
    loss = create_loss(name, **_hparams(name))
    form, why = solver_form(loss)
    assert form in FORMS and why
    if form == "refused":
        with pytest.raises(ValueError, match=type(loss).__name__):
            solve_path(x, z, loss, c=1.0)
        return
    xv, yv = x[:40], y[:40]
    model, result = solve_path(x, z, loss, x_val=xv, y_val=yv, c=(0.1, 1.0), k=1.5,
                               max_iter=200, **({"rounds": 2} if form == "rounds" else {}))
    assert result.form == form
    assert [r.c for r in result.records] == [0.1, 1.0]
    assert all(math.isfinite(r.val_score) and math.isfinite(r.objective)
               for r in result.records)
    probs = torch.sigmoid(model(torch.as_tensor(x, dtype=torch.float32))).detach()
    assert torch.isfinite(probs).all() and probs.dtype == torch.float32
    if form == "solved":  # converged: the gradient at the end is below the tolerance
        assert all(r.converged for r in result.records), result.records


@pytest.mark.parametrize("name", [n for n in LOSSES.names()
                                  if solver_form(create_loss(n, **_hparams(n)))[0] == "solved"])
def test_a_solved_loss_is_a_function_of_the_weights(name):
    """What L-BFGS's line search relies on: the gradient autograd gives is the derivative of
    the value (a loss that computes part of its value without gradient must be a round
    loss)."""
    x, _, z = _random_problem(n=60, d=5, classes=4, seed=4)
    loss = create_loss(name, **_hparams(name)).double()
    from spmlkit.losses import TrainInfo

    zt = torch.as_tensor(z)
    loss.on_train_start(zt, TrainInfo(60, 4, 1.5, 0, 1))
    loss.on_epoch_start(0)
    xt = torch.as_tensor(x)
    head = torch.nn.Linear(5, 4).double()
    idx = torch.arange(60)

    def value():
        out = loss(head(xt), zt, index=idx)
        if "penalty" in loss.required_hooks():
            out = out + loss.penalty(head)
        return out

    for p in head.parameters():
        p.grad = None
    value().backward()
    direction = [torch.randn_like(p) for p in head.parameters()]
    slope = sum((p.grad * d).sum() for p, d in zip(head.parameters(), direction))
    h = 1e-6
    with torch.no_grad():
        for p, d in zip(head.parameters(), direction):
            p.add_(h * d)
        up = value()
        for p, d in zip(head.parameters(), direction):
            p.sub_(2 * h * d)
        down = value()
    assert float((up - down) / (2 * h)) == pytest.approx(float(slope), rel=1e-4, abs=1e-7)


def test_refusals_name_the_reason():
    assert "hinge" in solver_form(create_loss("pr"))[1]
    assert "L1" in solver_form(create_loss("l1r"))[1]
    assert "flips" in solver_form(create_loss("ll_cp"))[1]


def test_a_refused_loss_leaves_no_run_folder(tmp_path, capsys):
    """The solver's refusal comes before the run folder is made (the method's check_loss), as
    the contract promises for every refusal: nothing left behind, exit status 2, the reason
    and the way out named."""
    from spmlkit.cli import main

    out = tmp_path / "runs"
    assert main(["train", "--dataset", "yeast", "--solver", "lbfgs", "--loss", "pr", "--out",
                 str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--loss pr: the solver cannot minimise it" in err and "--solver adam" in err
    assert not out.exists()


def test_role_rows_is_refused_by_the_solver_and_trains_with_adam():
    """ROLE's estimator_update chooses which rows an Adam step moves: under the solver, which
    solves every row each round, "rows" would do nothing, so it is refused by name (the
    estimator, whose default solver is L-BFGS, too); with Adam it trains."""
    from spmlkit import SPMLClassifier

    assert solver_form(create_loss("role"))[0] == "rounds"
    form, why = solver_form(create_loss("role", estimator_update="rows"))
    assert form == "refused" and "estimator_update='rows'" in why and "--solver adam" in why
    x, y, z = _random_problem(n=120, seed=31)
    with pytest.raises(ValueError, match="estimator_update='rows'.*would do nothing"):
        solve_path(x, z, create_loss("role", estimator_update="rows"), c=1.0)
    rows = {"estimator_update": "rows"}
    with pytest.raises(ValueError, match="estimator_update='rows'"):
        SPMLClassifier(loss="role", loss_params=rows, k=1.5).fit(x, z)
    fitted = SPMLClassifier(loss="role", loss_params=rows, k=1.5, solver="adam",
                            epochs=2).fit(x, z)
    assert fitted.predict_proba(x).shape == y.shape


# ---- the path ---------------------------------------------------------------------------------

def test_path_goes_strong_to_weak_warm_started_and_selects_on_val():
    x, y, z = _random_problem(n=400, seed=7)
    xv, yv = x[300:], y[300:]
    model, result = solve_path(x[:300], z[:300], create_loss("an"), x_val=xv, y_val=yv)
    cs = [r.c for r in result.records]
    assert cs == sorted(cs) and cs[0] == C_PATH[0]
    scores = [r.val_score for r in result.records]
    assert result.best == int(np.argmax(scores))
    # the path stops once val has turned: the last `patience` values clearly below the best
    if result.stopped_early:
        assert all(s < scores[result.best] - 0.1 for s in scores[-3:])
    # warm starts: a later solve of the path takes fewer iterations than the same C from cold
    i = min(result.best + 1, len(cs) - 1)
    _, cold = solve_path(x[:300], z[:300], create_loss("an"), c=cs[i])
    assert result.records[i].iterations < cold.records[0].iterations


def test_path_selects_on_partial_val_labels():
    x, y, z = _random_problem(n=400, seed=8)
    q = y[300:].astype(np.int8) * 2 - 1
    q[np.random.default_rng(0).random(q.shape) < 0.5] = 0  # half of val's entries unknown
    _, result = solve_path(x[:300], z[:300], create_loss("an"), x_val=x[300:],
                           y_val=partial_labels(q))
    assert all(math.isfinite(r.val_score) for r in result.records)


def test_path_without_val_is_refused_and_one_c_is_not():
    x, _, z = _random_problem(n=100)
    with pytest.raises(ValueError, match="selected on val"):
        solve_path(x, z, create_loss("an"))
    _, result = solve_path(x, z, create_loss("an"), c=1.0)
    assert len(result.records) == 1 and math.isnan(result.records[0].val_score)


def test_role_alternates_and_keeps_its_estimates_across_the_path():
    x, y, z = _random_problem(n=200, seed=9)
    loss = create_loss("role")
    _, result = solve_path(x[:150], z[:150], loss, x_val=x[150:], y_val=y[150:],
                           c=(0.1, 1.0), k=1.5, rounds=3)
    assert result.form == "rounds"
    est = loss.estimated_labels()
    assert est.shape == (150, 5)
    # the estimates moved from their initial uniform (0.4, 0.6) on unobserved entries
    assert float((est[torch.as_tensor(z[:150]) == 0] - 0.5).abs().max()) > 0.2


# ---- the estimator: solved by default ---------------------------------------------------------

def test_estimator_default_is_the_tuned_logistic_regression():
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from spmlkit.estimator import SPMLClassifier

    x, _, z = _random_problem(n=250, seed=11)
    clf = SPMLClassifier(C=0.3, tol=1e-9).fit(x, z)
    ref = make_pipeline(StandardScaler(), OneVsRestClassifier(
        LogisticRegression(C=0.3, tol=1e-10, max_iter=10_000))).fit(x, (z > 0).astype(int))
    assert np.abs(clf.predict_proba(x) - ref.predict_proba(x)).max() < 1e-4
    assert clf.C_ == 0.3 and clf.n_iter_ >= 1 and clf.path_.form == "solved"


def test_estimator_path_selects_c_on_val_and_each_mode_refuses_the_others_options():
    from spmlkit.estimator import SPMLClassifier

    x, y, z = _random_problem(n=400, seed=12)
    clf = SPMLClassifier(C=list(C_PATH)).fit(x[:300], z[:300], X_val=x[300:], Y_val=y[300:])
    scores = [r.val_score for r in clf.path_.records]
    assert clf.C_ == clf.path_.records[int(np.argmax(scores))].c
    with pytest.raises(ValueError, match="does not use epochs=3"):
        SPMLClassifier(epochs=3).fit(x, z)
    with pytest.raises(ValueError, match="does not use C=0.5"):
        SPMLClassifier(solver="adam", C=0.5).fit(x, z)
    with pytest.raises(ValueError, match="solver must be"):
        SPMLClassifier(solver="sgd").fit(x, z)
    with pytest.raises(ValueError, match="selected on val"):
        SPMLClassifier(C=[0.1, 1.0]).fit(x, z)
    with pytest.raises(ValueError, match="must be a number > 0"):
        SPMLClassifier(C="1").fit(x, z)


def test_the_scikit_learn_reference_rows_fit_single_threaded():
    """The reference rows fit under threadpool_limits(1); scikit-learn first imported inside the
    limit escaped it (its BLAS loaded after the limit was set): a fresh interpreter, where
    nothing imported scikit-learn before, reads the thread pools while each fit runs."""
    import subprocess
    import sys

    code = ("import threadpoolctl\n"
            "from spmlkit.loading import load_splits\n"
            "from spmlkit.experiments import reference\n"
            "seen = []\n"
            "def spy(grid):\n"
            "    import sklearn.linear_model as lm\n"
            "    fit = lm.LogisticRegression.fit\n"
            "    def wrapped(self, *a, **k):\n"
            "        seen.extend(p['num_threads'] for p in threadpoolctl.threadpool_info()\n"
            "                    if p['user_api'] == 'blas')\n"
            "        return fit(self, *a, **k)\n"
            "    lm.LogisticRegression.fit = wrapped\n"
            "    return grid\n"
            "orig = reference._reference\n"
            "reference._reference = lambda s, seed, labels, grid, *rest: orig(\n"
            "    s, seed, labels, spy(grid), *rest)\n"
            "reference.sklearn_reference(load_splits('yeast', '1p'), 0, grid=(0.1,))\n"
            "print(sorted(set(seen)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**__import__("os").environ, "OMP_NUM_THREADS": "2",
                                           "OPENBLAS_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[1]", out.stdout


@pytest.mark.parametrize("name", ["an", "an_ls", "wan", "epr", "bce"])
def test_the_closed_form_objective_is_the_autograd_one(name):
    """The BCE family's hand-written value and gradient (what the solver evaluates for them)
    equal autograd's through the loss itself."""
    from spmlkit.engine import solve as solve_module
    from spmlkit.losses import TrainInfo

    x, _, z = _random_problem(n=80, d=7, classes=5, seed=13)
    xt, zt = torch.as_tensor(x), torch.as_tensor(z)
    loss = create_loss(name).double()
    loss.on_train_start(zt, TrainInfo(80, 5, 1.5, 0, 1))
    head = torch.nn.Linear(7, 5).double()
    fast = solve_module._closed_form_value(head, xt, zt, loss, 0.3, 5)
    assert fast is not None
    value = float(fast())
    grads = [head.weight.grad.clone(), head.bias.grad.clone()]
    head.weight.grad = head.bias.grad = None
    slow = 5 * loss(head(xt), zt, index=torch.arange(80)) + 0.15 * (head.weight ** 2).sum()
    slow.backward()
    assert value == pytest.approx(float(slow.detach()), rel=1e-10)
    assert torch.allclose(grads[0], head.weight.grad, atol=1e-10)
    assert torch.allclose(grads[1], head.bias.grad, atol=1e-10)


# ---- where it is used: spml train, spml benchmark, studies -------------------------------------

def _own_csv(tmp_path):
    """A user's table: train.csv with one tagged label per row (the rest empty), a fully
    labelled test.csv."""
    x, y, z = _random_problem(n=360, d=5, classes=3, seed=21)
    head = "id,f1,f2,f3,f4,f5,cat,dog,bird\n"
    rows = [f"r{i}," + ",".join(f"{v:.4f}" for v in x[i]) + "," +
            ",".join("1" if z[i, j] else "" for j in range(3)) for i in range(260)]
    (tmp_path / "train.csv").write_text(head + "\n".join(rows) + "\n")
    rows = [f"t{i}," + ",".join(f"{v:.4f}" for v in x[i]) + "," +
            ",".join(str(int(v)) for v in y[i]) for i in range(260, 360)]
    (tmp_path / "test.csv").write_text(head + "\n".join(rows) + "\n")
    return ["--dataset", "tabular", "--data", f"path={tmp_path / 'train.csv'}",
            "--data", f"test_path={tmp_path / 'test.csv'}", "--data", "labels=cat,dog,bird",
            "--data", "id_column=id", "--data", "train_labels=observed"]


def test_spml_train_solves_by_default_on_your_own_data_and_refuses_adams_flags(tmp_path,
                                                                              capsys):
    from spmlkit.cli import main
    from spmlkit.runs import read_run

    data = _own_csv(tmp_path)
    assert main(["train", *data, "--loss", "epr", "--quiet", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "epr solve (given): C " in out and "value " in out
    (run,) = (tmp_path / "r").iterdir()
    done = read_run(run)
    assert done.config["mode"] == "solve" and done.final["C"] in C_PATH
    assert [r["C"] for r in done.metrics()] == sorted(r["C"] for r in done.metrics())
    assert main(["predict", str(run), str(tmp_path / "test.csv"), "--out",
                 str(tmp_path / "p.csv")]) == 0
    # Adam's flags on your own data without --solver: refused, naming --solver adam
    assert main(["train", *data, "--epochs", "3", "--quiet", "--out", str(tmp_path / "x")]) == 2
    assert "give --solver adam" in capsys.readouterr().err
    assert main(["train", *data, "--solver", "adam", "--epochs", "2", "--quiet", "--out",
                 str(tmp_path / "a")]) == 0
    assert read_run(next((tmp_path / "a").iterdir())).config["mode"] == "linear"
    # the built-in sets keep the papers' protocol (Adam) by default
    assert main(["train", "--dataset", "yeast", "--data", "subsample=0.2", "--epochs", "1",
                 "--quiet", "--out", str(tmp_path / "y")]) == 0
    assert read_run(next((tmp_path / "y").iterdir())).config["mode"] == "linear"
    assert main(["train", "--mode", "finetune", "--solver", "lbfgs", "--quiet"]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_spml_benchmark_solves_your_own_data_beside_scikit_learn(tmp_path, capsys):
    from spmlkit.cli import main

    data = _own_csv(tmp_path)
    out = tmp_path / "bench"
    assert main(["benchmark", *data, "--losses", "an,epr,role", "--seeds", "2", "--quiet",
                 "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    printed = capsys.readouterr()
    assert "seed 0 only" in printed.err  # your own labels are one draw
    assert {r["loss"] for r in res["records"]} == {"an", "epr", "role"}
    ref = res["sklearn"][0]
    an = next(r for r in res["records"] if r["loss"] == "an")
    assert an["C"] == ref["C"] and abs(an["test_map"] - ref["test_map"]) < 0.1
    assert res["picked"][0]["baseline"] == "sklearn_lr"
    assert sorted(p.name for p in (out / "predictions").iterdir()) == \
        ["an-s0.npz", "epr-s0.npz", "role-s0.npz"]
    with np.load(out / "predictions" / "an-s0.npz") as f:
        assert set(f.files) == {"val", "test"}  # train probabilities only on request
    # a second launch reuses every solve
    assert main(["benchmark", *data, "--losses", "an,epr,role", "--quiet",
                 "--out", str(out)]) == 0
    assert "Wall time" in capsys.readouterr().out
    assert main(["benchmark", *data, "--lrs", "1e-2", "--quiet", "--out", str(out)]) == 2
    assert "--solver adam" in capsys.readouterr().err
    assert main(["benchmark", *data, "--losses", "pr", "--quiet", "--out", str(out)]) == 2
    assert "hinge" in capsys.readouterr().err


def test_a_study_row_in_mode_solve_ignores_the_batch_grid_and_equals_scikit_learn(tmp_path):
    from spmlkit.experiments.study import load_study, run_study, study_rows

    spec = load_study({"name": "solve-rows", "datasets": [{"name": "yeast", "options":
                                                          {"subsample": 0.3}}],
                       "methods": ["an", {"label": "an-adam", "spec": "an", "mode": "linear"}],
                       "mode": "solve", "seeds": [0], "epochs": 2, "sklearn_reference": True})
    run_study(spec, out=tmp_path / "s", jobs=1, progress=False)
    _, rows = study_rows(tmp_path / "s")
    solved = [r for r in rows if r["method"] == "an"]
    assert len(solved) == 1 and solved[0]["batch_size"] is None  # one run: no batch x lr grid
    assert len([r for r in rows if r["method"] == "an-adam"]) == 1  # its best grid point
    ref = json.loads((tmp_path / "s" / "sklearn-reference.json").read_text())[0]
    assert abs(solved[0]["test_map"] - ref["test_map"]) < 0.05


def test_spml_benchmark_takes_a_protocol_option_as_spml_train_does(tmp_path, capsys):
    """``--data subsample=F`` (the splits' option, not the table source's) was refused by
    spml benchmark when it described the table's columns; spml train took it."""
    from spmlkit.cli import main

    data = _own_csv(tmp_path)
    assert main(["benchmark", *data, "--data", "subsample=0.5", "--losses", "an", "--quiet",
                 "--out", str(tmp_path / "b")]) == 0, capsys.readouterr().err
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    assert res["records"][0]["loss"] == "an"



def test_the_solvers_options_that_would_do_nothing_are_refused():
    x, y, z = _random_problem(n=120, seed=31)
    with pytest.raises(ValueError, match="rounds=3: loss AssumeNegativeLoss is solved"):
        solve_path(x, z, create_loss("an"), c=1.0, rounds=3)
    with pytest.raises(ValueError, match="patience=2: it stops a path"):
        solve_path(x, z, create_loss("an"), c=1.0, patience=2)
    _, result = solve_path(x, z, create_loss("ll_r"), c=1.0, rounds=3)  # a round loss: used
    assert result.form == "rounds"
