"""The papers' protocols as the presets run them: Cole et al. App. B's k interval and its
stacked runs, Zhou et al.'s early stopping for EM, Cole Fig. 1's axis."""
import numpy as np
import pytest

from spmlkit.loading import load_splits
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


def test_grouping_asks_the_method_whether_its_runs_stack():
    """group_tasks asks ``TrainingMethod.can_stack(options)``: linear heads stack, an MLP head or
    ``save_train_probs`` keeps a linear run alone, a method without ``fit_many`` never stacks."""
    from spmlkit.methods import get_method, list_methods

    linear = get_method("linear")
    assert linear.can_stack({}) is None and linear.can_stack({"head": "linear"}) is None
    assert "head 'mlp'" in linear.can_stack({"head": "mlp"})
    assert "save_train_probs" in linear.can_stack({"save_train_probs": True})
    for method in list_methods():
        if method.fit_many is None:
            assert "one run at a time" in method.can_stack({})
    rows = [{"label": label, "spec": "role", "mode_options": options}
            for label, options in [("lin", {}), ("mlp", {"head": "mlp"}),
                                   ("probs", {"save_train_probs": True})]]
    spec = load_study({"datasets": ["yeast"], "methods": rows, "seeds": 2, "epochs": 1,
                       "grid": {"batch_size": [16], "lr": [1e-2, 1e-3]}, "name": "g"})
    units = group_tasks(expand(spec))
    stacked = [u for u in units if isinstance(u, list)]
    assert [sorted(t.method for t in u) for u in stacked] == [["lin"] * 4]
    assert sorted(u.method for u in units if not isinstance(u, list)) == ["mlp"] * 4 + \
        ["probs"] * 4


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
    # Fig. A1's x axis: the value of k the runs trained with (one per k for every seed)
    from spmlkit.experiments import figures as fg

    assert fg.default_x("k") == fg.K_VALUE
    lines, _ = fg.sweep_from_study(tmp_path / "True", "k", x=fg.K_VALUE)
    splits = load_splits("yeast", "1p")
    low = resolve_k("interval:5:lower", splits, 0)
    assert [ln.x for ln in lines] == [[round(low, 6), round(splits.k, 6)]] * 2
    assert all(ln.n.tolist() == [2, 2] for ln in lines)



@pytest.fixture(scope="module")
def fig1_study(tmp_path_factory):
    """cole-fig1 shrunk: AN and BCE on full labels at 10% and 100% of the train images."""
    spec = load_study("cole-fig1", {"seeds": 1, "epochs": 2, "grid.batch_size": [16],
                                    "grid.lr": [1e-2], "vary.data.subsample": [0.1, 1.0],
                                    "methods": ["an", {"label": "BCE", "spec": "bce@full"}]})
    out = tmp_path_factory.mktemp("fig1") / "study"
    assert run_study(spec, out=out, jobs=1, progress=False)["failures"] == 0
    return out


def test_cole_fig1_is_drawn_against_training_labels_on_a_log_axis(fig1_study):
    from spmlkit.experiments import figures as fg

    assert fg.default_x("data.subsample") == fg.TRAIN_LABELS
    lines, _ = fg.sweep_from_study(fig1_study, "data.subsample", x=fg.TRAIN_LABELS)
    xs = {ln.method: ln.x for ln in lines}
    assert xs == {"an": [135.0, 1354.0], "BCE": [135.0 * 14, 1354.0 * 14]}  # 1 vs L labels
    fig = fg.draw_sweep(lines, "data.subsample", logx=True, xlabel=fg.TRAIN_LABELS_XLABEL)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert "training labels" in ax.get_xlabel() and ax.get_ylabel().startswith("test mAP")


def test_report_pivots_the_vary_axis_and_draws_small_multiples(fig1_study, monkeypatch):
    from spmlkit.experiments import report
    from spmlkit.experiments.study import open_study

    monkeypatch.setattr(report, "CURVES_IN_ONE_PANEL", 2)   # 4 curves: small multiples
    study = open_study(fig1_study)
    with __import__("tempfile").TemporaryDirectory() as tmp:
        figures = report.build_figures(study, tmp)
        page = report.render_html(study, figures)
    captions = [c for c, _ in figures]
    assert captions[0].startswith("Validation mAP per epoch") and "one panel per method" \
        in captions[0]
    assert "number of observed training labels (log axis)" in captions[1]
    start = page.index('id="table-test_map"')
    main = page[start:page.index("</table>", start)]
    assert "data.subsample=" not in main            # no row per (method, value)
    assert main.count("<tr") <= 1 + 2 + 1            # header, an, BCE (and a caption row)


def test_curve_axes_say_map(tmp_path):
    from spmlkit.experiments import figures as fg

    assert fg.metric_label("val_map") == "val mAP" and fg.metric_label("test_map") == "test mAP"
    records = [{"epoch": e, "val_map": 40.0 + e} for e in (1, 2, 3)]
    path = fg.plot_small_curves({"AN": {"AN": records}, "EM": {"EM": records}},
                                tmp_path / "c.png")
    assert path.is_file()


def test_yeast_papers_zhou_rows_use_zhous_early_stopping():
    spec = load_study("yeast-papers")
    stops = {t.method: t.train["early_stop"] for t in expand(spec)}
    zhou = {"DW (ES)", "L1R (ES)", "L2R (ES)", "N-LS (ES)", "EntMin (ES)", "Focal (ES)",
            "ASL (ES)", "EM (ES)", "EM+APL (ES)"}
    assert {m for m, s in stops.items() if s == "patience:1"} == zhou
    assert all(stops[m] == "none" for m in stops if m not in zhou)      # Cole's, OPML's rows
    assert "(ES)" in spec.description and "early stopping" in spec.description
    zt = load_study("zhou-table1")
    assert zt.early_stop == "patience:1" and zt.hparams["em"] == {"alpha": 0.1}


def test_method_early_stop_is_checked():
    with pytest.raises(ValueError, match=r"methods\[0\]\.early_stop"):
        load_study("smoke", {"methods": [{"spec": "an", "early_stop": "sometimes"}]})
    spec = load_study("smoke", {"methods": [{"spec": "an", "early_stop": "patience:2"}, "epr"]})
    assert [t.train["early_stop"] for t in expand(spec)] == ["patience:2", "none"]
    assert load_study(spec.to_dict()).methods[0].early_stop == "patience:2"   # round trip
