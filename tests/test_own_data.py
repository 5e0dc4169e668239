"""A user's own partially labelled table, as a user has it: a CSV of yeast's features whose
training rows carry one observed positive each (a seeded draw; unobserved cells empty) and a
fully labelled test CSV. `spml benchmark` on it lists every method, equal to --no-vectorise's;
a run that fails inside a stack fails alone; the own-data path's traps are each a clear error
or a printed, recorded fact (identifier columns, standardisation, labels without a positive,
label columns named twice, --data without --dataset)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from spmlkit.cli import main
from spmlkit.loading import load_dataset, load_splits
from spmlkit.engine import TrainConfig
from spmlkit.labels import make_observed
from spmlkit.losses import LOSSES
from spmlkit.losses.cole import AssumeNegativeLoss
from spmlkit.methods import train_run, train_runs
from spmlkit.runs import read_run

pd = pytest.importorskip("pandas")

#: the seed of the fixture's single-positive draw (not the official 1200: a user's own labels)
DRAW_SEED = 7
GRID = ["--solver", "adam", "--seeds", "1", "--epochs", "2", "--batch-sizes", "16", "--lrs",
        "1e-2,1e-3",
        "--jobs", "1", "--quiet"]
GIVEN = "an@given,wan@given,epr@given,role@given,em@given"


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """``train.csv`` (yeast's pool rows: 103 raw feature columns, an ``id`` column, 14 label
    columns holding 1 for the one observed positive and nothing elsewhere) and ``test.csv``
    (yeast's test rows, fully labelled 0 / 1), with what they were made from."""
    folder = tmp_path_factory.mktemp("own")
    ds = load_dataset("yeast")
    z = make_observed(ds.pool.y, "1p", seed=DRAW_SEED)
    features = [f"att{j}" for j in range(ds.pool.x.shape[1])]
    train = pd.DataFrame(ds.pool.x, columns=features)
    train.insert(0, "id", np.arange(len(train)) + 1000)
    test = pd.DataFrame(ds.test.x, columns=features)
    test.insert(0, "id", np.arange(len(test)) + 5000)
    for j, c in enumerate(ds.class_names):
        train[c] = pd.array(np.where(z[:, j] == 1, 1, None), dtype="Int64")  # empty: unknown
        test[c] = ds.test.y[:, j]
    train.to_csv(folder / "train.csv", index=False)
    test.to_csv(folder / "test.csv", index=False)
    return {"dir": folder, "z": z, "x": ds.pool.x, "classes": list(ds.class_names),
            "data": ["--dataset", "tabular", "--data", f"path={folder / 'train.csv'}",
                     "--data", f"test_path={folder / 'test.csv'}", "--data", "labels=Class*",
                     "--data", "id_column=id", "--data", "train_labels=observed"]}


def _rows(folder) -> list[str]:
    """The method rows of a benchmark's table.md (not the scikit-learn reference row)."""
    return [line for line in (folder / "table.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| method")
            and "(reference, scikit-learn)" not in line]


def test_the_fixture_is_a_users_partially_labelled_table(own):
    text = (own["dir"] / "train.csv").read_text().splitlines()
    header, first = text[0].split(","), text[1].split(",")
    assert header[0] == "id" and header[-14:] == own["classes"]
    assert first[-14:].count("1") == 1 and first[-14:].count("") == 13  # one positive, 13 empty
    s = load_splits("tabular", "given", path=str(own["dir"] / "train.csv"),
                    test_path=str(own["dir"] / "test.csv"), labels="Class*", id_column="id",
                    train_labels="observed")
    assert np.array_equal(s.observed, own["z"][s.meta["train_rows"]])
    assert s.meta["feature_columns"] == [f"att{j}" for j in range(103)]


def test_benchmark_on_own_observed_labels_lists_every_method_as_no_vectorise(own, tmp_path,
                                                                              capsys):
    """The issue's command (references on, every method @given): every method in the table,
    the same table with --no-vectorise; the reference rows left out with one line saying why."""
    vec, one = tmp_path / "vec", tmp_path / "one"
    assert main(["benchmark", *own["data"], "--losses", GIVEN, *GRID, "--out", str(vec)]) == 0
    err = capsys.readouterr().err
    assert "reference row(s) bce, iun left out: they train on full labels" in err
    assert "features: 103 column(s)" in err and "att0, att1" in err and "standardised" in err
    assert main(["benchmark", *own["data"], "--losses", GIVEN, *GRID, "--out", str(one),
                 "--no-vectorise"]) == 0
    rows = _rows(vec)
    assert [r.split(" | ")[0] for r in rows] == [f"| {m}" for m in GIVEN.split(",")]
    assert all("| given |" in r and "| n/a |" in r for r in rows)  # no train recovery: unknown
    assert rows == _rows(one)
    assert "| *sklearn_lr* (reference, scikit-learn) | given |" in (vec / "table.md").read_text()
    results = json.loads((vec / "results.json").read_text())
    stacked = [json.loads((vec / r["run_dir"] / "final.json").read_text()).get("vectorised")
               for r in results]
    assert max(s or 1 for s in stacked) > 1  # the closed-form losses did train as one stack
    # no @regime: the data's labels are the observed ones, so regime given is the default
    assert main(["benchmark", *own["data"], "--losses", "an,wan", *GRID,
                 "--out", str(tmp_path / "plain")]) == 0
    assert _rows(tmp_path / "plain") == rows[:2]


def test_a_method_that_fails_in_a_stack_fails_alone_in_a_study(own, tmp_path):
    """bce@full on data without full labels cannot load its splits: it fails with that reason,
    and AN / WAN, grouped with it, finish as their single runs do."""
    from spmlkit.experiments.store import StudyStore
    from spmlkit.experiments.study import load_study, run_study

    options = {"path": str(own["dir"] / "train.csv"), "test_path": str(own["dir"] / "test.csv"),
               "labels": "Class*", "id_column": "id", "train_labels": "observed"}
    spec = {"name": "mixed", "datasets": [{"name": "tabular", "options": options}],
            "methods": ["an@given", "wan@given", "bce@full"], "seeds": [0], "epochs": 2,
            "grid": {"batch_size": [16], "lr": [1e-2, 1e-3]}}
    got = {}
    for vectorise in (True, False):
        out = tmp_path / str(vectorise)
        res = run_study(load_study(spec), out=out, jobs=1, progress=False, vectorise=vectorise)
        assert res["failures"] == 2
        (group,) = res["failure_groups"]
        assert "holds observed (partial) training labels" in group["reason"]
        rows = StudyStore(out / "results.sqlite").rows()
        assert {r["method"] for r in rows if r["status"] == "failed"} == {"bce@full"}
        got[vectorise] = {(r["method"], r["lr"]): (r["best_epoch"], round(r["test_map"], 4))
                          for r in rows if r["status"] == "done"}
        if vectorise:
            metrics = [json.loads(r["metrics"]) for r in rows if r["status"] == "done"]
            assert {m.get("vectorised") for m in metrics} == {4}
    assert len(got[True]) == 4 and got[True] == got[False]


class _RaisingLoss(AssumeNegativeLoss):
    """AN whose labels cannot be set when ``boom`` (one run of a stack raises)."""

    def __init__(self, boom: bool = True, **kw):
        super().__init__(**kw)
        self.boom = boom

    def bce_form(self, observed):
        if self.boom:
            raise ValueError("this loss raises for the test")
        return super().bce_form(observed)


class _StackBreakingLoss(AssumeNegativeLoss):
    """AN (not closed-form: autograd's stacked step) that raises from the second epoch of a
    stacked step (R x B x L logits) and never alone: the stack breaks after logging epoch 1."""

    closed_form = False

    def on_epoch_start(self, epoch):
        super().on_epoch_start(epoch)
        self._epoch = epoch

    def entries(self, logits, observed, index):
        if logits.dim() == 3 and getattr(self, "_epoch", 0) >= 1:
            raise RuntimeError("the stacked step broke")
        return super().entries(logits, observed, index)


@pytest.fixture
def test_losses():
    LOSSES.register("raising_test", "a loss of the tests", defaults={"boom": True})(_RaisingLoss)
    LOSSES.register("stack_breaking_test", "a loss of the tests")(_StackBreakingLoss)
    yield
    for name in ("raising_test", "stack_breaking_test"):
        LOSSES._entries.pop(name)


def _splits():
    return load_splits("yeast", "1p")


def _same_run(a: dict, b: dict) -> None:
    assert (a["best_epoch"], a["val_map"]) == (b["best_epoch"], pytest.approx(b["val_map"],
                                                                              abs=1e-4))
    assert a["test_map"] == pytest.approx(b["test_map"], abs=1e-4)


def test_a_loss_that_raises_for_one_run_of_a_stack_fails_alone(test_losses, tmp_path):
    splits = _splits()
    configs = [TrainConfig(epochs=3, batch_size=16, lr=lr, seed=0) for lr in (1e-2, 1e-3)]
    specs = [("an", {}), ("wan", {}), ("raising_test", {"boom": True})]
    runs = [(loss, hp, c) for loss, hp in specs for c in configs]
    names = [f"{loss}-{c.lr:g}" for loss, _, c in runs]
    results = train_runs("linear", splits, [r[0] for r in runs], [r[1] for r in runs],
                         [r[2] for r in runs], out=tmp_path, run_names=names)
    for (loss, hp, config), name, res in zip(runs, names, results):
        run = read_run(tmp_path / name)
        if loss == "raising_test":
            assert isinstance(res, ValueError) and "raises for the test" in str(res)
            assert run.status == "failed"
            continue
        assert not isinstance(res, BaseException), res
        _same_run(res, train_run("linear", splits, loss, hp, config))
        assert run.final is not None and len(run.metrics()) == 3


def test_a_stack_that_breaks_mid_training_trains_each_run_alone(test_losses, tmp_path):
    splits = _splits()
    configs = [TrainConfig(epochs=3, batch_size=16, lr=lr, seed=s)
               for lr, s in ((1e-2, 0), (1e-3, 1), (3e-3, 0))]
    names = [f"run{i}" for i in range(len(configs))]
    results = train_runs("linear", splits, "stack_breaking_test", {}, configs, out=tmp_path,
                         run_names=names)
    for config, name, res in zip(configs, names, results):
        assert not isinstance(res, BaseException), res
        _same_run(res, train_run("linear", splits, "stack_breaking_test", {}, config))
        records = read_run(tmp_path / name).metrics()  # no record left from the stacked try
        assert [r["epoch"] for r in records] == [1, 2, 3]


# ---- section 4: the own-data path's traps ------------------------------------------------------
def test_an_identifier_column_is_refused_as_a_feature_and_the_columns_are_recorded(own,
                                                                                    tmp_path,
                                                                                    capsys):
    path = str(own["dir"] / "train.csv")
    common = dict(path=path, test_path=str(own["dir"] / "test.csv"), labels="Class*",
                  train_labels="observed")
    with pytest.raises(ValueError, match=r"column\(s\) id look like row identifiers .*"
                                         r"1692 rows.*id_column=id"):
        load_dataset("tabular", **common)
    named = load_dataset("tabular", features="id,att*", **common)  # named: a feature by choice
    assert named.meta["feature_columns"][0] == "id"
    out = tmp_path / "runs"
    assert main(["train", "--solver", "adam", *own["data"], "--loss", "an", "--epochs", "1",
                 "--quiet",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "features: 103 column(s) of" in err and "att0" in err and "id," not in err
    (run_dir,) = out.iterdir()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["regime"] == "given"  # the default with train_labels=observed
    assert config["features"]["columns"] == [f"att{j}" for j in range(103)]
    i = own["data"].index("id_column=id")
    drop = own["data"][:i - 1] + own["data"][i + 1:]  # the table without id_column=id
    assert main(["train", "--solver", "adam", *drop, "--loss", "an", "--epochs", "1", "--quiet",
                 "--out", str(tmp_path / "no-id")]) == 2
    assert "look like row identifiers" in capsys.readouterr().err


def test_tables_are_standardised_by_default_in_train_and_predict(own, tmp_path, capsys):
    """z-score with the train rows' statistics, recorded in config.json; spml predict applies
    the stored statistics to raw rows; standardize=false opts out."""
    runs = {}
    for flag in ([], ["--data", "standardize=false"]):
        out = tmp_path / ("off" if flag else "on")
        assert main(["train", "--solver", "adam", *own["data"], *flag, "--loss", "an", "--epochs",
                     "2",
                     "--quiet", "--out", str(out)]) == 0
        (runs[bool(flag)],) = out.iterdir()
    err = capsys.readouterr().err
    assert "standardised with the train rows' mean and std" in err
    assert "not standardised (standardize=false)" in err
    on = json.loads((runs[False] / "config.json").read_text())["features"]
    off = json.loads((runs[True] / "config.json").read_text())["features"]
    assert off["standardized"] is False and on["standardized"]["by"] == "train rows"
    s = load_splits("tabular", "given", path=str(own["dir"] / "train.csv"),
                    test_path=str(own["dir"] / "test.csv"), labels="Class*", id_column="id",
                    train_labels="observed")
    raw = own["x"][s.meta["train_rows"]].astype(np.float64)
    assert np.allclose(on["standardized"]["mean"], raw.mean(0), atol=1e-5)
    assert np.allclose(on["standardized"]["std"], raw.std(0), atol=1e-5)
    assert np.allclose(s.train.x, (raw - raw.mean(0)) / raw.std(0), atol=1e-4)
    # predict on the raw test rows gives the probabilities the run stored for its test split
    out = tmp_path / "pred.csv"
    assert main(["predict", str(runs[False]), str(own["dir"] / "test.csv"), "--out",
                 str(out)]) == 0
    pred = pd.read_csv(out)
    stored = np.load(runs[False] / "predictions.npz")
    assert len(pred) == 725 and pred["item"].astype(str).tolist()[:2] == ["5000", "5001"]
    by_id = pred.set_index(pred["item"].astype(str))[own["classes"]]
    probs = by_id.loc[[str(i) for i in s.test.ids]].to_numpy(dtype=np.float64)  # its test rows
    assert probs.shape == stored["probs_test"].shape
    assert np.allclose(probs, stored["probs_test"], atol=1e-5)


def test_predict_reads_new_rows_as_written_or_says_what_is_wrong(own, tmp_path, capsys):
    """Ids as written (``007`` stayed ``7``, ``101`` came out ``101.0`` next to an empty id);
    an empty id, a column named twice (pandas renamed the second ``att0`` and the first was
    used), and rows with one field more than the header (pandas made the first column the
    index and read every feature one column to the left, exit 0) are refused by name."""
    assert main(["train", "--solver", "adam", *own["data"], "--loss", "an", "--epochs", "1",
                 "--quiet", "--out",
                 str(tmp_path / "r")]) == 0
    (run,) = (tmp_path / "r").iterdir()
    header = "id," + ",".join(f"att{j}" for j in range(103))
    row = ",".join(["0.1"] * 103)
    cases = {"ids": f"{header}\n007,{row}\n1e3,{row}\n",
             "empty": f"{header}\n101,{row}\n,{row}\n",
             "twice": header.replace("att1,", "att0,") + f"\n1,{row}\n",
             "extra": f"{header}\n1,{row},5\n2,{row},5\n"}
    for name, text in cases.items():
        (tmp_path / f"{name}.csv").write_text(text)
    out = tmp_path / "p.csv"
    capsys.readouterr()
    assert main(["predict", str(run), str(tmp_path / "ids.csv"), "--out", str(out)]) == 0
    assert pd.read_csv(out, dtype=str)["item"].tolist() == ["007", "1e3"]
    capsys.readouterr()
    says = {"empty": "empty.csv: id column 'id' is empty at data row 2; every row needs an id",
            "twice": "twice.csv: the header names column 'att0' twice",
            "extra": "extra.csv: the data rows have more fields than the header's 104"}
    for name, message in says.items():
        assert main(["predict", str(run), str(tmp_path / f"{name}.csv")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("spml predict: error: ") and message in err, err
        assert len(err.splitlines()) == 1


def test_observed_labels_without_a_positive_are_refused(own, tmp_path):
    df = pd.read_csv(own["dir"] / "train.csv")
    classes = own["classes"]
    for fill, said in ((0, "0 \\(unobserved\\)"), (-1, "-1 \\(negative\\)")):
        bad = df.copy()
        bad[classes] = fill
        path = tmp_path / f"all{fill}.csv"
        bad.to_csv(path, index=False)
        with pytest.raises(ValueError, match=f"hold no positive \\(every cell is {said}\\)"):
            load_splits("tabular", "given", path=str(path), labels="Class*", id_column="id",
                        test_path=str(own["dir"] / "test.csv"), train_labels="observed")


def test_label_columns_named_twice_are_refused(own, capsys):
    data = [a if a != "labels=Class*" else "labels=Class1,Class2,Class1" for a in own["data"]]
    assert main(["train", "--solver", "adam", *data, "--epochs", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "label column(s) ['Class1'] given more than once" in err


def test_data_without_dataset_is_refused(own, capsys):
    """Options for your own file without --dataset: an error that says the default is yeast
    and how to name the source (protocol options, e.g. protocol=tabular, still go to yeast:
    tests/test_cli_benchmark.py)."""
    path = f"path={own['dir'] / 'train.csv'}"
    for cmd in ("train", "benchmark"):
        assert main([cmd, "--data", path, "--data", "labels=Class*", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"spml {cmd}: error: unknown option 'labels' for dataset 'yeast'" in err
        assert "no --dataset given, so the default yeast" in err and "--dataset tabular" in err
        assert main([cmd, "--data", path, "--quiet"]) == 2  # yeast takes path=: still refused
        err = capsys.readouterr().err
        assert f"spml {cmd}: error: --data {path}: say which source" in err


def test_compressed_tables_train_and_predict_as_the_plain_ones(own, tmp_path, capsys):
    """A user's ``train.csv.gz`` / ``test.csv.bz2`` (pandas reads the compression from the
    name): the same run as from the plain files, and ``spml predict`` takes a ``.csv.gz``."""
    import shutil

    frames = {name: pd.read_csv(own["dir"] / f"{name}.csv") for name in ("train", "test")}
    frames["train"].to_csv(tmp_path / "train.csv.gz", index=False)
    frames["test"].to_csv(tmp_path / "test.csv.bz2", index=False)
    data = [str(a).replace(str(own["dir"] / "train.csv"), str(tmp_path / "train.csv.gz"))
            .replace(str(own["dir"] / "test.csv"), str(tmp_path / "test.csv.bz2"))
            for a in own["data"]]
    assert data != own["data"]
    finals = []
    for d, out in ((own["data"], tmp_path / "plain"), (data, tmp_path / "packed")):
        assert main(["train", "--solver", "adam", *d, "--loss", "an", "--epochs", "2", "--quiet",
                     "--out", str(out)]) == 0
        (run,) = out.iterdir()
        finals.append(json.loads((run / "final.json").read_text())["test_map"])
    assert finals[0] == finals[1]
    shutil.copy(own["dir"] / "test.csv", tmp_path / "new.csv")
    frames["test"].to_csv(tmp_path / "new.csv.gz", index=False)
    outs = []
    for name in ("new.csv", "new.csv.gz"):
        assert main(["predict", str(run), str(tmp_path / name), "--out",
                     str(tmp_path / f"{name}.out.csv")]) == 0
        outs.append((tmp_path / f"{name}.out.csv").read_text())
    assert outs[0] == outs[1]
    capsys.readouterr()
