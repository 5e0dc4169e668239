"""Smoke runs of every CLI command, and the benchmark (a front of the study runner): selection,
files, resume, lock."""
import json

import numpy as np
import pytest

from spmlkit.cli import main
from spmlkit.experiments.benchmark import benchmark_study, run_benchmark
from spmlkit.experiments.study import Method, parse_methods
from spmlkit.experiments.store import StudyStore


def test_parse_methods_adds_references_and_regimes():
    ms = parse_methods("an,epr@1p_1n")
    assert ms == [Method("an", "an", "1p"), Method("epr@1p_1n", "epr", "1p_1n"),
                  Method("bce", "bce", "full"), Method("iun", "bce", "1p_alln")]
    assert parse_methods(["iun"], references=()) == [Method("iun", "bce", "1p_alln")]
    with pytest.raises(ValueError, match="unknown loss 'rolee'.*role"):
        parse_methods("rolee")
    assert {m.loss for m in parse_methods("all", ())} >= {"an", "role", "pr"}
    # losses that need an external scorer's file are named, never part of "all"
    assert not {m.loss for m in parse_methods("all", ())} & {"em_pl", "gpr"}
    assert parse_methods("em_pl", ()) == [Method("em_pl", "em_pl", "1p")]
    assert parse_methods("all,opml@full", ())[-1] == Method("opml@full", "opml", "full")
    (m,) = parse_methods("an+highrank:1e-3@full", ())
    assert (m.loss, m.regime, m.reg) == ("an", "full", ("highrank:1e-3",))
    with pytest.raises(ValueError, match="nope"):
        parse_methods("an+nope:1", ())


def test_benchmark_study_spec():
    spec = benchmark_study("yeast", "an,epr@1p_1n", seeds=2, epochs=5, grid={"lr": (1e-3,)},
                           hparams={"epr": {"lam": 2.0}})
    assert spec["methods"] == ["an", "epr@1p_1n", "bce", "iun"]
    assert spec["seeds"] == [0, 1] and spec["epochs"] == 5 and spec["mode"] == "linear"
    assert spec["grid"] == {"batch_size": [8, 16], "lr": (1e-3,)}
    assert spec["datasets"] == [{"name": "yeast", "options": {}}]
    assert spec["hparams"] == {"epr": {"lam": 2.0}}
    with pytest.raises(ValueError, match="seeds must be an integer >= 1, got 0"):
        benchmark_study(seeds=0)


def test_benchmark_runs_in_two_processes_and_resumes(tmp_path):
    out = tmp_path / "bench"
    kw = dict(dataset="yeast", losses="an,role", references=("iun",), seeds=2, out=out,
              jobs=2, epochs=1, grid={"batch_size": (16,), "lr": (1e-2, 1e-3)}, progress=False)
    res = run_benchmark(**kw)
    assert res["study"]["runs_run"] == 3 * 2 * 2 and res["study"]["failures"] == 0
    store = StudyStore(out / "results.sqlite")
    assert len(store.rows(status="done")) == 3 * 2 * 2
    results = json.loads((out / "results.json").read_text())
    assert len(results) == 3 * 2 and results == res["results"]
    keys = {"loss", "seed", "batch_size", "lr", "best_epoch", "val_map", "test_map",
            "train_recovery_map", "seconds", "grid_seconds", "run_id"}
    assert all(keys <= set(r) for r in results)
    assert all(20 < r["test_map"] < 80 for r in results)
    # the selection: the best val mAP among the method x seed's grid points
    for r in results:
        points = store.rows(method=r["loss"], seed=r["seed"])
        assert len(points) == 2
        best = max(points, key=lambda p: p["val_map"])
        assert (r["run_id"], r["lr"], r["test_map"]) == (best["run_id"], best["lr"],
                                                         best["test_map"])
        assert r["grid_seconds"] == pytest.approx(sum(p["seconds"] for p in points))
        assert (out / r["run_dir"] / "best.pt").is_file()
    table = (out / "table.md").read_text()
    assert "| an | 1p |" in table and "*iun* (reference)" in table
    # re-launch: nothing is run again, same results
    again = run_benchmark(**kw)
    assert again["study"]["runs_run"] == 0 and again["results"] == results
    assert len(store.rows()) == 3 * 2 * 2
    # same config and seed in a single process gives the same numbers
    one = run_benchmark(**{**kw, "out": tmp_path / "one", "jobs": 1})
    got = sorted((r["loss"], r["seed"], round(r["test_map"], 6)) for r in one["results"])
    assert got == sorted((r["loss"], r["seed"], round(r["test_map"], 6)) for r in results)


SMALL = ["benchmark", "--dataset", "yeast", "--losses", "an,epr", "--no-references",
         "--seeds", "1", "--batch-sizes", "16", "--lrs", "1e-2,1e-3", "--jobs", "1", "--quiet"]


def _table_rows(folder) -> list[str]:
    """The method rows of a benchmark's table.md (numbers and selections)."""
    return [line for line in (folder / "table.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| method")]


def test_benchmark_rerun_with_other_epochs_reuses_nothing(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main([*SMALL, "--epochs", "1", "--out", str(out)]) == 0
    first = _table_rows(out)
    assert main([*SMALL, "--epochs", "2", "--out", str(out)]) == 0
    second = _table_rows(out)
    assert "2 epochs" in (out / "table.md").read_text()
    assert main([*SMALL, "--epochs", "2", "--out", str(tmp_path / "fresh")]) == 0
    fresh = _table_rows(tmp_path / "fresh")
    assert len(first) == len(second) == 2
    assert second == fresh  # the 2-epoch numbers, not the 1-epoch ones under the new header
    assert second != first
    records = json.loads((out / "results.json").read_text())
    fresh_records = json.loads((tmp_path / "fresh" / "results.json").read_text())
    assert [r["test_map"] for r in records] == [r["test_map"] for r in fresh_records]


def test_benchmark_in_an_old_folder_says_its_results_are_not_reused(tmp_path, capsys):
    out = tmp_path / "old"
    out.mkdir()
    stale = {"method": "an", "loss": "an", "regime": "1p", "seed": 0, "batch_size": 16,
             "lr": 0.01, "epochs": 1, "early_stop": "none", "hparams": {}, "val_map": 99.0,
             "test_map": 99.0, "train_recovery_map": 99.0, "best_epoch": 1, "seconds": 1.0}
    (out / "grid.jsonl").write_text(json.dumps(stale) + "\n")
    assert main([*SMALL, "--epochs", "1", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "grid.jsonl" in err and "not reused" in err
    rows = _table_rows(out)
    assert len(rows) == 2 and not any("99.00" in row for row in rows)
    assert (out / "study.yaml").is_file()
    # a study folder now: no note the second time
    assert main([*SMALL, "--epochs", "1", "--out", str(out)]) == 0
    assert "not reused" not in capsys.readouterr().err


def test_benchmark_refuses_a_second_launch_on_the_same_folder(tmp_path, capsys):
    from spmlkit.experiments.study.launch import _study_lock

    out = tmp_path / "bench"
    out.mkdir()
    with _study_lock(out):  # what a first launch holds while it runs
        code = main([*SMALL, "--epochs", "1", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("spml benchmark: error: ") and str(out) in err
    assert "another launch" in err
    assert not (out / "table.md").exists()


@pytest.mark.parametrize("seeds", ["0", "-2"])
def test_benchmark_seeds_below_one_is_an_error(tmp_path, capsys, seeds):
    assert main([*SMALL, "--seeds", seeds, "--out", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.strip() == \
        f"spml benchmark: error: --seeds must be >= 1, got {seeds}"
    assert not (tmp_path / "b").exists()


def test_cli_train_list_and_errors(tmp_path, capsys):
    assert main(["list", "losses"]) == 0
    out = capsys.readouterr().out
    assert "role" in out and "bce (iu)" in out
    assert main(["list", "datasets"]) == 0 and "yeast" in capsys.readouterr().out
    assert main(["list", "regimes"]) == 0 and "mlml" in capsys.readouterr().out
    code = main(["train", "--loss", "epr", "--epochs", "2", "--lr", "1e-3", "--quiet",
                 "--hp", "lam=2", "--k-estimate", "50", "--out", str(tmp_path)])
    assert code == 0
    text = capsys.readouterr()
    assert "test mAP" in text.out and "k estimated from 50" in text.err
    (run,) = list(tmp_path.iterdir())
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["hparams"] == {"lam": 2} and cfg["regime"] == "1p"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert np.load(run / "observed.npy").shape == (1354, 14)
    assert main(["train", "--loss", "nope", "--quiet", "--out", str(tmp_path)]) == 2
    assert "unknown loss 'nope'" in capsys.readouterr().err
    assert main(["train", "--dataset", "cole", "--data", f"root={tmp_path}/missing",
                 "--quiet", "--out", str(tmp_path)]) == 2
    assert "missing" in capsys.readouterr().err


def test_benchmark_without_epochs_runs_the_papers_25(tmp_path):
    """`make demo` runs `spml benchmark` with no --epochs: the paper's 25 epochs."""
    import yaml

    out = tmp_path / "b"
    assert main(["benchmark", "--losses", "an", "--no-references", "--seeds", "1",
                 "--batch-sizes", "16", "--lrs", "1e-2", "--out", str(out), "--quiet"]) == 0
    assert yaml.safe_load((out / "study.yaml").read_text())["epochs"] == 25


def test_cli_train_selects_on_a_top_k_metric(tmp_path):
    """``--metric ndcg@3`` (a record with '@' in its name): the run's epochs carry
    ``val_ndcg@3``, the best epoch has the highest, and the test metrics have every top-k
    record."""
    assert main(["train", "--dataset", "yeast", "--loss", "an", "--epochs", "4", "--lr", "1e-2",
                 "--quiet", "--metric", "ndcg@3", "--out", str(tmp_path)]) == 0
    (run,) = list(tmp_path.iterdir())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    final = json.loads((run / "final.json").read_text())
    scores = [r["val_ndcg@3"] for r in records]
    assert final["best_epoch"] == scores.index(max(scores)) + 1
    assert {"ndcg@3", "ndcg@5", "rp@3", "rp@5", "micro_ap", "weighted_ap"} <= \
        set(final["test_metrics"])


def test_cli_train_and_benchmark_select_on_a_metric(tmp_path, capsys):
    """``--metric``: spml train selects its epoch on that val metric and prints the classic
    test metrics; spml benchmark selects epochs and grid points on it and adds its columns;
    the tabular protocol and the MLP head from the command line."""
    assert main(["train", "--loss", "an", "--epochs", "3", "--lr", "1e-2", "--quiet",
                 "--metric", "one_error", "--data", "protocol=tabular", "--seed", "2",
                 "--head", "mlp", "--hidden", "8", "--out", str(tmp_path / "t")]) == 0
    text = capsys.readouterr().out
    assert "selected on val one_error:" in text and "test: lrap " in text
    (run,) = list((tmp_path / "t").iterdir())
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["train"]["metric"] == "one_error" and cfg["head"] == "mlp"
    assert cfg["dataset_options"] == {"protocol": "tabular", "seed": 2}
    assert cfg["sizes"] == {"train": 1933, "val": 242, "test": 242}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    final = json.loads((run / "final.json").read_text())
    errors = [r["val_one_error"] for r in records]
    assert final["best_epoch"] == errors.index(min(errors)) + 1
    assert main(["list", "metrics"]) == 0
    assert "ranking_loss   share of (positive, negative) label pairs ordered wrongly (lower is " \
        "better)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "--metric", "f1", "--quiet"])
    assert "unknown metric 'f1'; choose one of map, lrap" in capsys.readouterr().err
    out = tmp_path / "bench"
    assert main(["benchmark", "--losses", "an", "--no-references", "--seeds", "1",
                 "--epochs", "2", "--batch-sizes", "16", "--lrs", "1e-2,1e-3", "--jobs", "1",
                 "--quiet", "--metric", "hamming_loss", "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "best val hamming_loss" in table and "test hamming_loss | val hamming_loss |" in table
    (rec,) = json.loads((out / "results.json").read_text())
    assert rec["metric"] == "hamming_loss"
    assert f"{rec['test_metrics']['hamming_loss']:.4f}" in table


def test_benchmark_on_a_tagged_folder_with_a_test_csv_trains_given(tmp_path, capsys):
    """The folder source reads a tree with a test_csv as observed labels by default, which
    spml train honoured; spml benchmark asked for --data train_labels=observed, or started the
    full-label reference rows and half its runs failed."""
    from PIL import Image

    rng = np.random.default_rng(0)
    names = ("cat", "dog")
    for cls in names:
        (tmp_path / "tree" / cls).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(
                tmp_path / "tree" / cls / f"{i}.png")
    (tmp_path / "test").mkdir()
    rows = []
    for i in range(12):
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(
            tmp_path / "test" / f"{i}.png")
        rows.append(f"test/{i}.png,{'cat;dog' if i % 3 == 0 else names[i % 2]}")
    (tmp_path / "test.csv").write_text("path,labels\n" + "\n".join(rows) + "\n")
    assert main(["benchmark", "--solver", "adam", "--dataset", "folder", "--data",
                 f"root={tmp_path / 'tree'}",
                 "--data", f"test_csv={tmp_path / 'test.csv'}", "--backbone", "tiny_cnn",
                 "--cache-dir", str(tmp_path / "cache"), "--losses", "an",
                 "--seeds", "1", "--epochs", "1", "--lrs", "1e-2", "--batch-sizes", "8",
                 "--no-references", "--jobs", "1", "--out", str(tmp_path / "b"),
                 "--quiet"]) == 0
    assert "| an@given | given |" in (tmp_path / "b" / "table.md").read_text()


def test_benchmark_runs_keep_train_probabilities_only_on_request(tmp_path, capsys):
    """``predictions.npz`` of a benchmark's runs holds val and test probabilities; train's on
    request (--train-predictions), with the same run ids and numbers either way."""
    from spmlkit.runs import read_predictions

    assert main([*SMALL, "--epochs", "1", "--out", str(tmp_path / "a")]) == 0
    assert main([*SMALL, "--epochs", "1", "--out", str(tmp_path / "b"),
                 "--train-predictions"]) == 0
    runs_a = sorted(p.name for p in (tmp_path / "a" / "runs").iterdir())
    assert runs_a == sorted(p.name for p in (tmp_path / "b" / "runs").iterdir())
    for name in runs_a:
        a = np.load(tmp_path / "a" / "runs" / name / "predictions.npz")
        b = np.load(tmp_path / "b" / "runs" / name / "predictions.npz")
        assert "probs_train" not in a.files and "probs_train" in b.files
        for key in ("probs_val", "probs_test", "y_train", "observed"):
            assert np.array_equal(a[key], b[key])
        with pytest.raises(ValueError, match="kept no train probabilities.*--train-predictions"):
            read_predictions(tmp_path / "a" / "runs" / name)
        assert read_predictions(tmp_path / "a" / "runs" / name, ("val", "test"))["probs_val"] \
            .shape == b["probs_val"].shape
    assert _table_rows(tmp_path / "a") == _table_rows(tmp_path / "b")
