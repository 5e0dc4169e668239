"""The papers' protocols as the presets run them: Cole et al. App. B's k interval and its
stacked runs, Zhou et al.'s early stopping for EM, Cole Fig. 1's axis."""
import numpy as np
import pytest

from spmlkit.data import load_splits
from spmlkit.experiments.store import StudyStore
from spmlkit.experiments.study import expand, group_tasks, load_study, run_study
from spmlkit.labels import k_interval, sample_subsets
from spmlkit.methods import resolve_k


def test_sample_subsets_is_uniform_without_replacement():
    idx = sample_subsets(6, 2, 60_000, np.random.default_rng(1))
    pairs = np.sort(idx, axis=1)
    assert (pairs[:, 0] < pairs[:, 1]).all()            # no row drawn twice
    _, counts = np.unique(pairs[:, 0] * 6 + pairs[:, 1], return_counts=True)
    assert len(counts) == 15 and np.abs(counts / 60_000 - 1 / 15).max() < 0.005


def test_k_interval_is_the_percentiles_of_resampled_estimates():
    """Table A2's construction: the 5th / 95th percentiles of the mean positives of 10^5
    draws of M rows; checked against the exact distribution of a tiny set (M = 2 of 6 rows:
    15 equally likely pairs)."""
    y = np.zeros((6, 6), dtype=np.int64)
    for i, c in enumerate([1, 1, 2, 3, 5, 6]):
        y[i, :c] = 1
    exact = sorted((a + b) / 2 for i, a in enumerate([1, 1, 2, 3, 5, 6])
                   for b in [1, 1, 2, 3, 5, 6][i + 1:])
    iv = k_interval(y, 2)
    assert iv.k == pytest.approx(3.0) and iv.trials == 100_000
    assert iv.low == np.percentile(exact, 5, method="lower") == 1.0
    assert iv.high == np.percentile(exact, 95, method="higher") == 5.5
    assert k_interval(y, 2) == iv                            # one interval, seed fixed


def test_resolve_k_interval_same_for_every_seed_and_positions():
    splits = load_splits("yeast", "1p")
    lo, hi = (resolve_k(f"interval:5:{b}", splits, 0) for b in ("lower", "upper"))
    assert lo < splits.k < hi
    assert resolve_k("interval:5:lower", splits, 7) == lo
    assert resolve_k("interval:5:0/9", splits, 3) == lo and \
        resolve_k("interval:5:9/9", splits, 3) == hi
    assert resolve_k("interval:5:3/9", splits, 0) == pytest.approx(lo + (hi - lo) / 3)
    assert resolve_k("true", splits, 0) == splits.k
    with pytest.raises(ValueError, match="interval:M:lower"):
        resolve_k("interval:5:10/9", splits, 0)


def test_cole_appb_tasks_stack():
    """Before, an ``estimate:`` k kept every run alone (432 single runs); now k is resolved
    before grouping: EPR (closed-form) stacks across k, ROLE per resolved k."""
    tasks = expand(load_study("cole-appb"))
    groups = group_tasks(tasks, jobs=2)
    assert all(isinstance(g, list) for g in groups)
    assert sum(len(g) for g in groups) == len(tasks) == 720
    splits = load_splits("yeast", "1p")
    for g in groups:
        if g[0].loss == "role":
            assert len({resolve_k(t.k, splits, t.seed) for t in g}) == 1
            assert len(g) == 12                              # 3 seeds x 4 lrs of one k


def test_estimate_k_runs_stack_per_seed():
    """A single-sample estimate differs per seed: ROLE stacks its lrs of one seed."""
    spec = load_study("cole-appb", {"vary.k": ["estimate:5:point"], "methods": ["role"]})
    groups = group_tasks(expand(spec))
    assert all(isinstance(g, list) and len({t.seed for t in g}) == 1 for g in groups)
    assert sum(len(g) for g in groups) == 3 * 8


def test_stacked_role_refuses_two_k():
    import torch

    from spmlkit.engine import TrainConfig
    from spmlkit.engine.vectorised import fit_linear_stacked
    from spmlkit.losses import create_loss

    splits = load_splits("yeast", "1p")
    cfgs = [TrainConfig(epochs=1, batch_size=16, lr=1e-3, seed=s, early_stop="none")
            for s in (0, 1)]
    with pytest.raises(ValueError, match="need one k"):
        fit_linear_stacked(torch.as_tensor(splits.train.x, dtype=torch.float32),
                           splits.observed, [create_loss("role"), create_loss("role")], cfgs,
                           x_val=splits.val.x, y_val=splits.val.y, k=[3.0, 4.0])


def test_cole_appb_stacked_equals_single_runs(tmp_path):
    over = {"seeds": 2, "epochs": 2, "grid.batch_size": [16], "grid.lr": [1e-2, 1e-3],
            "vary.k": ["true", "interval:5:lower"]}
    maps = {}
    for vec in (True, False):
        out = tmp_path / str(vec)
        res = run_study(load_study("cole-appb", over), out=out, jobs=1, progress=False,
                        vectorise=vec)
        assert res["failures"] == 0 and res["runs_total"] == 16
        maps[vec] = {r["run_id"]: r["test_map"] for r in StudyStore(out / "results.sqlite").rows()}
    assert maps[True].keys() == maps[False].keys()
    for key, value in maps[True].items():
        assert value == pytest.approx(maps[False][key], abs=1e-3)

