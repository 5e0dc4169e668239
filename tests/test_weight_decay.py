"""Issue 29: weight decay of the heads on feature vectors (single, stacked, MLP, SMILE, CLI,
studies), and the scikit-learn reference row of ``spml benchmark``."""
import csv
import json

import numpy as np
import pytest
import torch

from spmlkit.cli import main
from spmlkit.loading import load_splits
from spmlkit.engine import TrainConfig, fit_linear
from spmlkit.engine.vectorised import fit_linear_stacked
from spmlkit.losses import create_loss


@pytest.fixture(scope="module")
def yeast():
    return load_splits("yeast", "1p")


def _train(tmp_path, capsys, *extra):
    out = tmp_path / "runs"
    assert main(["train", "--mode", "linear", "--epochs", "4", "--lr", "1e-2", "--quiet",
                 "--out", str(out), *extra]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "test mAP" in x)
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    config = json.loads((folder / "config.json").read_text())
    return float(line.split("test mAP ")[1].split(",")[0]), config, folder


def test_spml_train_weight_decay_changes_the_linear_run_and_is_recorded(tmp_path, capsys):
    """The issue's symptom: identical results at 0, 1e-2 and 0.5, nothing in config.json."""
    got = {wd: _train(tmp_path / wd, capsys, "--weight-decay", wd) for wd in ("0", "1e-2", "0.5")}
    plain = _train(tmp_path / "plain", capsys)
    assert len({test for test, _, _ in got.values()}) == 3
    assert [c["train"]["weight_decay"] for _, c, _ in got.values()] == [0.0, 0.01, 0.5]
    # weight decay 0 is the run without the flag, bit for bit
    final = [json.loads((f / "final.json").read_text()) for f in (got["0"][2], plain[2])]
    assert final[0]["test_map"] == final[1]["test_map"]
    assert final[0]["val_map"] == final[1]["val_map"]


def test_weight_decay_is_refused_by_a_mode_that_does_not_read_it(tmp_path, capsys):
    assert main(["train", "--mode", "boostlu", "--weight-decay", "0.01", "--out",
                 str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--mode boostlu does not use it" in err and "linear" in err and "smile" in err
    assert main(["train", "--mode", "smile", "--head", "mlp", "--out", str(tmp_path)]) == 2
    assert "--head: --mode smile does not use it; it is for --mode linear" in \
        capsys.readouterr().err
    assert main(["train", "--amp", "bf16", "--out", str(tmp_path)]) == 2
    assert "--mode linear does not use it" in capsys.readouterr().err
    assert main(["train", "--float16", "--out", str(tmp_path)]) == 2
    assert "--float16: for the features a --backbone extracts" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_weight_decay_shrinks_the_weights_not_the_bias(yeast):
    runs = {wd: fit_linear(yeast.train.x, yeast.observed, create_loss("an"),
                           TrainConfig(epochs=3, lr=1e-2, weight_decay=wd))[0]
            for wd in (0.0, 0.1)}
    assert runs[0.1].weight.norm() < 0.8 * runs[0.0].weight.norm()
    # the bias: one step (one batch of every row) from the same start, single and stacked; the
    # bias's gradient is the same with or without decay, so its step is the same unless it is
    # decayed too (a decay of 1e3 would turn the step of every bias entry toward 0)
    n = len(yeast.train.x)
    cfgs = [TrainConfig(epochs=1, batch_size=n, lr=1e-2, weight_decay=wd) for wd in (0.0, 1e3)]
    single = [fit_linear(yeast.train.x, yeast.observed, create_loss("an"), c)[0] for c in cfgs]
    stacked = [model for model, _ in fit_linear_stacked(
        yeast.train.x, yeast.observed, [create_loss("an") for _ in cfgs], cfgs)]
    for plain, decayed in (single, stacked):
        assert torch.equal(plain.bias, decayed.bias)
        assert (plain.weight - decayed.weight).abs().max() > 1e-3  # the weights: decayed
    with pytest.raises(ValueError, match="weight_decay must be a finite number >= 0"):
        TrainConfig(weight_decay=-0.1)


def test_fine_tunings_decoupled_decay_scales_each_groups_weights_by_its_lr():
    """FinetuneOptions.weight_decay, one step on known tensors: ``w <- w * (1 - lr * wd)`` with
    each group's own learning rate (the head's is ``lr * head_lr_mult``), the biases left as
    they are. (Moved here from tests/test_images_user.py, with a second group of another lr.)"""
    from spmlkit.engine.finetune import WeightDecay
    from spmlkit.engine.optim import make_optimizer

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)

    net = Net()
    with torch.no_grad():
        for i, p in enumerate(net.parameters()):
            p.copy_(torch.linspace(-1.0, 1.0, p.numel()).reshape(p.shape) + i)
    before = {name: p.detach().clone() for name, p in net.named_parameters()}
    opt = make_optimizer(net, create_loss("an"), 0.1, head_lr_mult=10.0)
    WeightDecay(net, opt, 0.5).after_step(None)
    after = dict(net.named_parameters())
    torch.testing.assert_close(after["body.weight"], before["body.weight"] * 0.95)  # 1 - .1 * .5
    torch.testing.assert_close(after["head.weight"], before["head.weight"] * 0.5)   # 1 - 1 * .5
    for bias in ("body.bias", "head.bias"):
        assert torch.equal(after[bias], before[bias])


def test_the_mlp_head_and_smile_take_weight_decay(yeast, tmp_path):
    from spmlkit.methods import train_run

    def run(mode, wd, **options):
        cfg = TrainConfig(epochs=2, batch_size=16, lr=1e-3, weight_decay=wd)
        return train_run(mode, yeast, "an", config=cfg, **options)

    for mode, options in (("linear", {"head": "mlp", "hidden": 16}), ("smile", {})):
        a, b = run(mode, 0.0, **options), run(mode, 0.5, **options)
        assert a["test_map"] != b["test_map"], mode


def test_runs_of_different_weight_decays_stack_and_equal_single_runs(yeast):
    configs = [TrainConfig(epochs=3, batch_size=8, lr=lr, seed=seed, weight_decay=wd)
               for seed in (0, 1) for lr in (1e-3, 1e-2) for wd in (0.0, 1e-2)]
    stacked = fit_linear_stacked(yeast.train.x, yeast.observed,
                                 [create_loss("an") for _ in configs], configs,
                                 x_val=yeast.val.x, y_val=yeast.val.y)
    for cfg, (model, res) in zip(configs, stacked):
        alone, ref = fit_linear(yeast.train.x, yeast.observed, create_loss("an"), cfg,
                                x_val=yeast.val.x, y_val=yeast.val.y)
        torch.testing.assert_close(model.weight, alone.weight, atol=2e-6, rtol=0)
        assert res.best_epoch == ref.best_epoch


def test_a_stacked_weight_decay_run_resumes_as_a_single_run(yeast):
    cfg = [TrainConfig(epochs=4, lr=1e-2, seed=s, weight_decay=0.05) for s in (0, 1)]
    states = [[], []]
    fit_linear_stacked(yeast.train.x, yeast.observed, [create_loss("an") for _ in cfg], cfg,
                       x_val=yeast.val.x, y_val=yeast.val.y,
                       checkpoint=[lambda f, i=i: states[i].append(f()) for i in range(2)])
    full, _ = fit_linear(yeast.train.x, yeast.observed, create_loss("an"), cfg[1],
                         x_val=yeast.val.x, y_val=yeast.val.y)
    resumed, _ = fit_linear(yeast.train.x, yeast.observed, create_loss("an"), cfg[1],
                            x_val=yeast.val.x, y_val=yeast.val.y, resume=states[1][1])
    torch.testing.assert_close(resumed.weight, full.weight, atol=2e-6, rtol=0)


def test_a_study_grid_of_weight_decays_keeps_the_ids_of_weight_decay_0():
    from spmlkit.experiments.study import expand, load_study

    base = {"name": "wd", "datasets": ["yeast"], "methods": ["an"], "seeds": [0],
            "grid": {"batch_size": [8], "lr": [1e-3]}}
    plain = expand(load_study(base))
    with_wd = expand(load_study({**base, "grid": {**base["grid"],
                                                  "weight_decay": [0.0, 1e-3]}}))
    assert len(with_wd) == 2 and plain[0].run_id == with_wd[0].run_id
    assert "-wd0.001-" in with_wd[1].run_id and with_wd[1].train["weight_decay"] == 1e-3
    with pytest.raises(ValueError, match="grid.weight_decay.*>= 0"):
        load_study({**base, "grid": {"weight_decay": [-1.0]}})


def test_the_sklearn_reference_is_one_vs_rest_logistic_regression_with_c_on_val(yeast):
    """Per class a LogisticRegression along the C grid, each fit warm-started from the class's
    previous one (as LogisticRegressionCV's path), C picked on val mAP; within scikit-learn's
    tolerance of cold fits."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    from spmlkit.experiments.reference import sklearn_reference
    from spmlkit.metrics import map_score

    grid = (1e-3, 1.0)
    res = sklearn_reference(yeast, 0, grid=grid)
    targets = (yeast.observed > 0).astype(int)
    x, xv, xt = (s.x.astype(np.float64) for s in (yeast.train, yeast.val, yeast.test))
    clfs = [LogisticRegression(max_iter=500, warm_start=True) for _ in range(targets.shape[1])]
    by_hand, cold = [], []
    for c in grid:
        for j, clf in enumerate(clfs):
            clf.set_params(C=c).fit(x, targets[:, j])
        pv, pt = (np.stack([clf.predict_proba(s)[:, 1] for clf in clfs], 1) for s in (xv, xt))
        by_hand.append((map_score(pv, yeast.val.y), map_score(pt, yeast.test.y)))
        ovr = OneVsRestClassifier(LogisticRegression(C=c, max_iter=500)).fit(x, targets)
        cold.append(map_score(ovr.predict_proba(xv), yeast.val.y))
    np.testing.assert_allclose(res["val_maps"], [v for v, _ in by_hand], atol=1e-6)
    np.testing.assert_allclose(res["val_maps"], cold, atol=0.05)  # scikit-learn's tol
    best = int(np.argmax([v for v, _ in by_hand]))
    assert res["C"] == grid[best]
    assert res["test_map"] == pytest.approx(by_hand[best][1], abs=1e-6)
    assert sklearn_reference(yeast, 0, grid=grid[::-1])["val_maps"] == res["val_maps"]
    full = sklearn_reference(yeast, 0, "full", grid=grid)
    assert full["test_map"] > res["test_map"]


def test_the_sklearn_reference_stops_its_path_once_val_turned(yeast):
    """The path stops as the solver's does (`turned_since`: 3 values in a row more than 0.1
    below the best): on yeast's single positives after 7 of the 17 values, with the C that the
    whole grid picks (10^-2.5: the weak end only falls further)."""
    from spmlkit.engine.solve import PATIENCE, TURN
    from spmlkit.experiments.reference import C_GRID, sklearn_reference

    res = sklearn_reference(yeast, 0)
    scores = res["val_maps"]
    assert len(scores) < len(C_GRID)
    best = int(np.argmax(scores))
    assert len(scores) == best + 1 + PATIENCE
    assert all(v < scores[best] - TURN for v in scores[best + 1:])
    assert res["C"] == C_GRID[best] == pytest.approx(10 ** -2.5)
    whole = sklearn_reference(yeast, 0, grid=C_GRID[:best + 1] + C_GRID[-2:])
    assert whole["C"] == res["C"]  # the weakest values score below the best too


def test_benchmark_table_has_the_sklearn_rows_marked_as_references(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["benchmark", "--losses", "an", "--no-vectorise", "--seeds", "2",
                 "--batch-sizes", "16", "--lrs", "1e-2", "--epochs", "2", "--jobs", "1",
                 "--quiet", "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "| *sklearn_lr* (reference, scikit-learn) | 1p |" in table
    assert "| *sklearn_lr@full* (reference, scikit-learn) | full |" in table
    refs = json.loads((out / "sklearn-reference.json").read_text())
    assert [(r["loss"], r["seed"]) for r in refs] == [
        ("sklearn_lr", 0), ("sklearn_lr", 1), ("sklearn_lr@full", 0), ("sklearn_lr@full", 1)]
    assert "weight decay" not in table  # the built-in yeast keeps the papers' grid


def test_a_tabular_protocol_benchmarks_sklearn_rows_fit_each_seeds_own_split(tmp_path):
    """Under ``protocol=tabular`` each seed is a trial with its own split; a benchmark's
    scikit-learn row of seed s is the fit on seed s's split (each row must not be seed 0's)."""
    from spmlkit.experiments.reference import sklearn_reference

    out = tmp_path / "bench"
    assert main(["benchmark", "--losses", "an", "--no-vectorise", "--seeds", "2", "--data",
                 "protocol=tabular", "--batch-sizes", "16", "--lrs", "1e-2", "--epochs", "1",
                 "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    refs = json.loads((out / "sklearn-reference.json").read_text())
    assert [(r["loss"], r["seed"]) for r in refs] == [
        ("sklearn_lr", 0), ("sklearn_lr", 1), ("sklearn_lr@full", 0), ("sklearn_lr@full", 1)]
    for r in refs[:2]:
        own = sklearn_reference(load_splits("yeast", "1p", protocol="tabular", seed=r["seed"]),
                                r["seed"])
        assert (r["C"], r["val_map"], r["test_map"]) == (own["C"], own["val_map"],
                                                         own["test_map"]), r
    assert refs[0]["test_map"] != refs[1]["test_map"] and \
        refs[2]["test_map"] != refs[3]["test_map"]


def test_own_data_benchmark_searches_weight_decay_and_has_no_full_label_rows(tmp_path,
                                                                             capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(160, 4)).round(3)
    y = (x[:, :3] + 0.5 * rng.normal(size=(160, 3)) > 0.3).astype(int)
    head = "f1,f2,f3,f4,a,b,c\n"
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    with open(train, "w") as f, open(test, "w") as g:
        f.write(head), g.write(head)
        for i in range(160):
            feats = ",".join(map(str, x[i]))
            if i < 110:
                tags = [""] * 3
                if y[i].any():
                    tags[rng.choice(np.flatnonzero(y[i]))] = "1"
                f.write(f"{feats},{','.join(tags)}\n")
            else:
                g.write(f"{feats},{','.join(map(str, y[i]))}\n")
    out = tmp_path / "bench"
    assert main(["benchmark", "--solver", "adam", "--dataset", "tabular", "--data",
                 f"path={train}", "--data", f"test_path={test}", "--data", "labels=a,b,c", "--data",
                 "train_labels=observed", "--losses", "an", "--seeds", "1", "--lrs", "1e-2",
                 "--batch-sizes", "16", "--epochs", "2", "--jobs", "1", "--quiet",
                 "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "x weight decay [0.0, 0.001, 0.01, 0.1]" in table
    assert "| *sklearn_lr* (reference, scikit-learn) | given |" in table
    assert "sklearn_lr@full" not in table


def test_a_study_with_sklearn_reference_has_its_rows_in_the_table(tmp_path, capsys):
    from spmlkit.experiments.study import load_study, run_study

    spec = {"name": "ref", "datasets": ["yeast"], "methods": ["an", "bce@full"], "seeds": [0],
            "epochs": 1, "grid": {"batch_size": [16], "lr": [1e-2]},
            "sklearn_reference": True}
    out = tmp_path / "study"
    run_study(spec, out=out, jobs=1, progress=False)
    refs = json.loads((out / "sklearn-reference.json").read_text())
    assert [(r["loss"], r["regime"]) for r in refs] == [("sklearn_lr", "1p"),
                                                          ("sklearn_lr@full", "full")]
    assert main(["study", "table", str(out)]) == 0
    table = capsys.readouterr().out
    assert "sklearn_lr (scikit-learn reference)" in table
    assert "sklearn_lr@full (scikit-learn reference)" in table
    assert f"{refs[0]['test_map']:.2f}" in table
    # the report's mAP tables and the selected rows' export have them too (the same table)
    report = tmp_path / "report.html"
    assert main(["report", str(out), "--out", str(report)]) == 0
    page = report.read_text()
    test_table = page[page.index('id="table-test_map"'):page.index('id="table-train_recovery')]
    assert "sklearn_lr (scikit-learn reference)" in test_table
    assert f"{refs[0]['test_map']:.2f}" in test_table
    for selected, has in ((["--selected"], True), ([], False)):
        dump = tmp_path / f"rows{len(selected)}.csv"
        assert main(["study", "export", str(out), "--format", "csv", "--output", str(dump),
                     *selected]) == 0
        rows = list(csv.DictReader(dump.open()))
        ours = [r for r in rows if r["method"] == "sklearn_lr (scikit-learn reference)"]
        assert bool(ours) == has
        if has:
            assert float(ours[0]["test_map"]) == refs[0]["test_map"] and ours[0]["run_id"] == ""
    (out / "sklearn-reference.json").write_text("{")  # a damaged file is named
    from spmlkit.experiments.reference import reference_rows

    with pytest.raises(ValueError, match="sklearn-reference.json: not the JSON"):
        reference_rows(out)
    for bad, match in (({"sklearn_reference": "yes"}, "true or false"),
                       ({"sklearn_reference": True, "mode": "finetune"}, "mode linear")):
        with pytest.raises(ValueError, match=match):
            load_study({**spec, **bad})


def test_the_sklearn_row_is_left_out_with_a_note_where_it_cannot_run(yeast, monkeypatch,
                                                                      capsys):
    import spmlkit.experiments.reference as ref

    monkeypatch.setattr(ref, "MAX_ENTRIES", 1000)
    with pytest.raises(ValueError, match="more than the 1,000 entries"):
        ref.sklearn_reference(yeast, 0)
    assert ref.reference_records("yeast", {}, ["1p"], [0, 1]) == []
    assert "note: sklearn_lr left out on yeast" in capsys.readouterr().err


def test_a_launch_without_references_drops_an_earlier_launchs_rows(tmp_path, capsys):
    """A benchmark with the scikit-learn rows, then one of other data into the same folder with
    --no-references: the folder's tables no longer show the first launch's rows (they were
    marked best beside methods trained on other data)."""
    out = tmp_path / "bench"
    common = ["benchmark", "--losses", "an", "--seeds", "1", "--batch-sizes", "16", "--lrs",
              "1e-2", "--epochs", "1", "--jobs", "1", "--quiet", "--out", str(out)]
    assert main(common) == 0
    assert (out / "sklearn-reference.json").is_file()
    assert main([*common, "--no-references", "--data", "subsample=0.3"]) == 0
    assert not (out / "sklearn-reference.json").exists()
    capsys.readouterr()
    assert main(["study", "table", str(out)]) == 0
    assert "sklearn_lr" not in capsys.readouterr().out


def test_a_studys_sklearn_rows_follow_its_vary_axes_over_the_data(tmp_path, capsys):
    """A study varying the data (data.subsample) has one scikit-learn fit per value, each in
    its own column; one fit on the entry's options stood under every column (a fit on every
    training row beside methods that saw 20 % of them)."""
    from spmlkit.loading import load_splits
    from spmlkit.experiments.reference import sklearn_reference
    from spmlkit.experiments.study import run_study

    spec = {"name": "sub", "datasets": ["yeast"], "methods": ["an"], "seeds": [0],
            "epochs": 1, "grid": {"batch_size": [16], "lr": [1e-2]},
            "vary": {"data.subsample": [0.2, 1.0]}, "sklearn_reference": True}
    out = tmp_path / "study"
    run_study(spec, out=out, jobs=1, progress=False)
    refs = json.loads((out / "sklearn-reference.json").read_text())
    assert [r["variant"] for r in refs] == [{"data.subsample": 0.2}, {"data.subsample": 1.0}]
    alone = sklearn_reference(load_splits("yeast", subsample=0.2), 0)
    assert refs[0]["test_map"] == alone["test_map"] != refs[1]["test_map"]
    assert main(["study", "table", str(out), "--columns", "data.subsample"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines()
                if ln.startswith("| sklearn_lr"))
    cells = [c.strip().strip("*") for c in line.strip("|").split("|")[1:]]
    assert cells == [f"{refs[0]['test_map']:.2f}", f"{refs[1]['test_map']:.2f}"], line
