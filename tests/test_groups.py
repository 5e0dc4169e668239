"""Groups of rows: splits that keep a group on one side, and the asset regulariser in training
(checkpoints, stacked runs, the CLI from a CSV with a group column and known negatives)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from spmlkit.cli import main
from spmlkit.loading import load_splits
from spmlkit.data.protocol import group_split, tabular_split
from spmlkit.engine import TrainConfig, fit_linear
from spmlkit.engine.vectorised import fit_linear_stacked
from spmlkit.labels import make_observed
from spmlkit.losses import create_loss

REC = np.repeat([f"rec{i:02d}" for i in range(40)], 5)  # 40 recordings of 5 rows


def _table(tmp_path, n_groups=40, per=5, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    rec = np.repeat(np.arange(n_groups), per)
    n = len(rec)
    centre = rng.normal(size=(n_groups, 6))[rec]  # rows of one recording look alike
    x = centre + 0.3 * rng.normal(size=(n, 6))
    y = (centre[:, :classes] > 0.5).astype(int)
    y[np.arange(n), rng.integers(0, classes, n)] = 1
    df = pd.DataFrame(x, columns=[f"f{i}" for i in range(6)])
    for j in range(classes):
        df[f"c{j}"] = y[:, j]
    df["rec"] = [f"r{r}" for r in rec]
    return df, y


def _apart(splits) -> None:
    sides = [set(getattr(splits, s).groups) for s in ("train", "val", "test")]
    assert not sides[0] & sides[1] and not sides[0] & sides[2] and not sides[1] & sides[2]


@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.3, 0.5])
def test_group_split_keeps_groups_whole_and_near_the_fraction(fraction):
    sizes = np.random.default_rng(1).integers(1, 9, 60)
    groups = np.repeat(np.arange(60), sizes)
    a, b = group_split(groups, fraction, seed=3)
    assert sorted(np.r_[a, b].tolist()) == list(range(len(groups)))
    assert not set(groups[a]) & set(groups[b])
    target = round(fraction * len(groups))
    assert target <= len(b) < target + sizes.max()  # whole groups until b holds the target
    assert np.array_equal(group_split(groups, fraction, seed=3)[1], b)  # seeded
    assert not np.array_equal(group_split(groups, fraction, seed=4)[1], b)


def test_group_split_refuses_one_group():
    with pytest.raises(ValueError, match="1 group"):
        group_split(["a"] * 5, 0.2)


def test_tabular_protocol_split_keeps_groups_apart():
    train, val, test = tabular_split(len(REC), seed=2, groups=REC)
    assert not set(REC[train]) & set(REC[val]) and not set(REC[train]) & set(REC[test])
    assert not set(REC[val]) & set(REC[test])
    assert len(val) >= 20 and len(test) >= 20


def test_group_column_splits_every_carve_out_by_group(tmp_path):
    df, _ = _table(tmp_path)
    df.to_csv(tmp_path / "t.csv", index=False)
    for options in ({}, {"protocol": "tabular", "seed": 4}):
        splits = load_splits("tabular", path=tmp_path / "t.csv", labels="c*",
                             group_column="rec", **options)
        _apart(splits)
        assert "rec" not in splits.meta["feature_columns"]
        assert sum(splits.meta["groups"].values()) == 40
    # without the group column, rows of a recording land on both sides
    plain = load_splits("tabular", path=tmp_path / "t.csv", labels="c*", features="f*")
    rec = df["rec"].to_numpy()
    train_rows = np.asarray(plain.meta["train_rows"])
    assert set(rec[train_rows]) & set(rec[np.asarray(plain.meta["val_rows"])])


def test_group_column_errors_name_the_column_and_row(tmp_path):
    df, _ = _table(tmp_path)
    df.loc[7, "rec"] = None
    df.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(ValueError, match=r"group column 'rec' is empty at data row 8"):
        load_splits("tabular", path=tmp_path / "t.csv", labels="c*", group_column="rec")
    with pytest.raises(ValueError, match="group_column 'recording' is not a column"):
        load_splits("tabular", path=tmp_path / "t.csv", labels="c*", group_column="recording")
    df.loc[7, "rec"] = "r1"
    df.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(ValueError, match="split=stratified does not keep groups"):
        load_splits("tabular", path=tmp_path / "t.csv", labels="c*", group_column="rec",
                    split="stratified")


# --- the asset regulariser in the engine ---------------------------------------------------

def _problem(seed=0):
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(20), 4)
    x = rng.normal(size=(20, 5))[groups] + 0.2 * rng.normal(size=(80, 5))
    y = (x[:, :3] > 0.3).astype(np.uint8)
    y[np.arange(80), rng.integers(0, 3, 80)] = 1
    return x.astype(np.float32), y, groups


def _asset_loss(groups, alpha=0.5):
    loss = create_loss("an", asset_alpha=alpha, asset_eps=0.05)
    loss.bind_groups(groups)
    return loss


def test_the_asset_term_changes_training_and_its_state_moves():
    x, y, groups = _problem()
    z = make_observed(y, "1p", seed=0)
    cfg = TrainConfig(epochs=3, batch_size=16, lr=1e-2, seed=0)
    loss = _asset_loss(groups)
    model, _ = fit_linear(x, z, loss, cfg, x_val=x, y_val=y)
    plain, _ = fit_linear(x, z, create_loss("an"), cfg, x_val=x, y_val=y)
    assert not torch.allclose(model.weight, plain.weight)
    mean = loss.asset_mean
    assert mean.shape == (20, 3) and not torch.all((mean - 0.5).abs() <= 0.1)


def test_the_asset_state_is_checkpointed_and_a_resumed_run_continues_it(tmp_path):
    x, y, groups = _problem()
    z = make_observed(y, "1p", seed=0)
    cfg = TrainConfig(epochs=4, batch_size=16, lr=1e-2, seed=5)
    states = []
    whole_loss = _asset_loss(groups)
    whole, ref = fit_linear(x, z, whole_loss, cfg, x_val=x, y_val=y,
                            checkpoint=lambda state: states.append(state()))
    torch.save(states[1], tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    loss = _asset_loss(groups)
    model, res = fit_linear(x, z, loss, cfg, x_val=x, y_val=y, resume=state)
    assert torch.equal(model.weight, whole.weight) and res.history == ref.history
    assert torch.equal(loss.asset_mean, whole_loss.asset_mean)


def test_stacked_runs_with_the_asset_term_equal_runs_alone():
    x, y, groups = _problem(1)
    z = make_observed(y, "1p", seed=0)
    configs = [TrainConfig(epochs=3, batch_size=16, lr=lr, seed=s)
               for lr, s in ((1e-2, 0), (3e-2, 1))]
    losses = [_asset_loss(groups) for _ in configs]
    alone = [fit_linear(x, z, loss, c, x_val=x, y_val=y) for loss, c in zip(losses, configs)]
    stacked_losses = [_asset_loss(groups) for _ in configs]
    stacked = fit_linear_stacked(x, z, stacked_losses, configs, x_val=x, y_val=y)
    for (m1, _), (m2, _), l1, l2 in zip(alone, stacked, losses, stacked_losses):
        assert torch.allclose(m1.weight, m2.weight, atol=1e-5)
        assert torch.allclose(l1.asset_mean, l2.asset_mean, atol=1e-5)
        assert not torch.equal(l2.asset_mean, stacked_losses[0].asset_mean) or l2 is \
            stacked_losses[0]  # each run keeps its own averages


def test_asset_term_without_groups_and_under_the_solver_is_refused(tmp_path):
    x, y, groups = _problem()
    z = make_observed(y, "1p", seed=0)
    with pytest.raises(ValueError, match="needs a group per training row"):
        fit_linear(x, z, create_loss("an", asset_alpha=0.1), TrainConfig(epochs=1))
    with pytest.raises(ValueError, match="off without asset_alpha"):
        create_loss("an", asset_eps=0.01)
    with pytest.raises(ValueError, match="asset_eps must be a number in"):
        create_loss("an", asset_alpha=0.1, asset_eps=2.0)
    from spmlkit.engine.solve import solve_path

    with pytest.raises(ValueError, match="running averages move after every batch"):
        solve_path(x, z, _asset_loss(groups), x_val=x, y_val=y, c=1.0)


def test_cli_run_from_a_csv_with_a_group_column_and_known_negatives(tmp_path, capsys):
    """The user's own CSV: observed training labels with known negatives (-1), a group column,
    a fully labelled test file; val carved out of the test file by group; the asset term on,
    known negatives weighted."""
    df, y = _table(tmp_path)
    rng = np.random.default_rng(3)
    rows = df["rec"].isin([f"r{i}" for i in range(30)]).to_numpy()
    train, test = df[rows].copy(), df[~rows].copy()
    obs = np.zeros_like(y[rows])
    for i, labels in enumerate(y[rows]):
        obs[i, rng.choice(np.flatnonzero(labels))] = 1
    obs[(y[rows] == 0) & (rng.random(obs.shape) < 0.4)] = -1
    for j in range(obs.shape[1]):
        train[f"c{j}"] = obs[:, j]
    train.to_csv(tmp_path / "train.csv", index=False)
    test.to_csv(tmp_path / "test.csv", index=False)
    code = main(["train", "--dataset", "tabular", "--data", f"path={tmp_path / 'train.csv'}",
                 "--data", f"test_path={tmp_path / 'test.csv'}", "--data", "labels=c*",
                 "--data", "group_column=rec", "--data", "train_labels=observed",
                 "--regime", "given", "--solver", "adam", "--loss", "an",
                 "--hp", "asset_alpha=0.2", "--hp", "neg_weight=2", "--epochs", "3",
                 "--out", str(tmp_path / "runs")])
    assert code == 0
    (run,) = (tmp_path / "runs").iterdir()
    config = json.loads((run / "config.json").read_text())
    assert config["hparams"]["asset_alpha"] == 0.2 and config["hparams"]["neg_weight"] == 2
    assert config["labels"]["negatives"] == int((obs == -1).sum())
    out = capsys.readouterr().out
    assert "groups kept apart" in out
    rec = test["rec"].to_numpy()
    val_rows = config["labels"]["summary"]  # the summary names the carve-out
    assert "carved out of the test set" in val_rows
    meta = json.loads((run / "final.json").read_text())
    assert meta["test_map"] > 0
    splits = load_splits("tabular", path=tmp_path / "train.csv",
                         test_path=tmp_path / "test.csv", labels="c*", group_column="rec",
                         train_labels="observed", regime="given")
    carved = np.asarray(splits.meta["val_rows_of_test"])
    kept = np.setdiff1d(np.arange(len(rec)), carved)
    assert not set(rec[carved]) & set(rec[kept])


def test_cli_asset_term_under_the_default_solver_is_refused_by_name(tmp_path, capsys):
    df, _ = _table(tmp_path)
    df.to_csv(tmp_path / "t.csv", index=False)
    code = main(["train", "--dataset", "tabular", "--data", f"path={tmp_path / 't.csv'}",
                 "--data", "labels=c*", "--data", "group_column=rec", "--loss", "an",
                 "--hp", "asset_alpha=0.2", "--out", str(tmp_path / "runs")])
    assert code != 0
    assert "running averages move after every batch" in capsys.readouterr().err


def test_estimator_takes_groups_for_the_asset_term_and_splitter_keeps_them_apart():
    from sklearn.model_selection import cross_val_score

    from spmlkit import SPMLClassifier
    from spmlkit.data.stratify import MultilabelFolds

    x, y, groups = _problem()
    clf = SPMLClassifier(solver="adam", epochs=2, loss_params={"asset_alpha": 0.1})
    clf.fit(x, y, groups=groups)
    assert clf.loss_.asset_mean.shape == (20, 3)
    with pytest.raises(ValueError, match="groups are the rows' groups for the asset"):
        SPMLClassifier(solver="adam", epochs=1).fit(x, y, groups=groups)
    folds = list(MultilabelFolds(4, seed=0).split(x, y, groups))
    assert all(not set(groups[a]) & set(groups[b]) for a, b in folds)
    scores = cross_val_score(SPMLClassifier(C=1.0), x, y, groups=groups,
                             cv=MultilabelFolds(4, seed=0))
    assert len(scores) == 4


# --- image sources --------------------------------------------------------------------------

def _image_tree(root, recordings=12, per=3):
    """``root/<class>/rec<k>/img*.png``: each recording's frames in a folder of their own."""
    from _image_toy import make_images

    classes = ["red", "green", "blue"]
    for k in range(recordings):
        make_images(root / classes[k % 3] / f"rec{k:02d}", per, seed=k, prefix=f"r{k}_")


def test_folder_source_groups_images_by_their_folder(tmp_path):
    _image_tree(tmp_path / "tree")
    ds_splits = load_splits("folder", root=str(tmp_path / "tree"), group_by_folder=True)
    _apart(ds_splits)
    assert set(ds_splits.train.groups) | set(ds_splits.val.groups) | \
        set(ds_splits.test.groups) == {f"{['red', 'green', 'blue'][k % 3]}/rec{k:02d}"
                                       for k in range(12)}
    plain = load_splits("folder", root=str(tmp_path / "tree"))
    assert plain.train.groups is None


def test_csv_image_list_with_a_group_column(tmp_path):
    from _image_toy import make_images

    paths, y = make_images(tmp_path / "img", 36)
    names = ["red", "green", "blue"]
    lines = ["path,labels,rec"] + [
        f"img/{p.rsplit('/', 1)[1]},\"{';'.join(names[j] for j in np.flatnonzero(row))}\","
        f"clip{i // 4}" for i, (p, row) in enumerate(zip(paths, y))]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    splits = load_splits("csv", path=str(tmp_path / "train.csv"), group_column="rec")
    _apart(splits)
    assert splits.class_names == sorted(names)  # the group column is not a class
    assert sum(splits.meta["groups"].values()) == 9
    with pytest.raises(ValueError, match="group_column 'clip' needs a header row naming it"):
        load_splits("csv", path=str(tmp_path / "train.csv"), group_column="clip")
    lines[5] = lines[5].rsplit(",", 1)[0] + ","
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"train.csv, line 6: empty 'rec' cell"):
        load_splits("csv", path=str(tmp_path / "train.csv"), group_column="rec")


def test_a_study_on_a_table_with_groups_and_the_asset_term(tmp_path):
    """A study's dataset options carry the group column; its hparams the asset term (stacked
    runs: two lrs of one loss), each run's splits keeping the groups apart."""
    from spmlkit.experiments.study import load_study, run_study
    from spmlkit.experiments.store import StudyStore

    df, _ = _table(tmp_path)
    df.to_csv(tmp_path / "t.csv", index=False)
    spec = {"name": "grouped", "title": "groups", "mode": "linear", "seeds": 1, "epochs": 2,
            "early_stop": "none", "methods": ["an"],
            "datasets": [{"name": "tabular", "options": {
                "path": str(tmp_path / "t.csv"), "labels": "c*", "group_column": "rec"}}],
            "hparams": {"an": {"asset_alpha": 0.2}},
            "grid": {"batch_size": [16], "lr": [1e-2, 3e-2]}}
    res = run_study(load_study(spec), out=tmp_path / "study", jobs=1, progress=False)
    assert (res["runs_total"], res["failures"]) == (2, 0)
    for row in StudyStore(tmp_path / "study" / "results.sqlite").rows():
        config = json.loads((tmp_path / "study" / row["run_dir"] / "config.json").read_text())
        assert config["hparams"]["asset_alpha"] == 0.2
        assert "groups kept apart" in config["labels"]["summary"]
