"""Every ``spml`` command ends a bad input with one line ``spml <cmd>: error: ...`` and exit 2.

Each case runs `spmlkit.cli.main` in-process on a bad input (a missing or wrong file, a
wrong type, a bad option value, an empty input, an unknown name) and checks: exit status 2,
no traceback, exactly one ``error:`` line on stderr that starts with the command's name and
names the offending value. The inputs are tiny (yeast with 1 epoch, a 12-image folder, arrays
of a few rows), so the whole file runs in well under a minute.
"""
from __future__ import annotations

import errno
import os
import shlex
import shutil

import numpy as np
import pytest

from spmlkit.cli import main

# ---- the shared workspace ---------------------------------------------------------------------
def _png_tree(root, classes=("cat", "dog", "fox"), per_class=4, seed=0):
    from PIL import Image

    rng = np.random.RandomState(seed)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            arr = rng.randint(0, 255, size=(20, 24, 3)).astype(np.uint8)
            Image.fromarray(arr).save(root / c / f"{c}{i}.png")


def make_workspace(d):
    """Files, a finished linear run (with train probabilities), a run without them, a finished
    study and a study whose results.sqlite is corrupt, in folder ``d``; returns the format
    fields of the cases."""
    rng = np.random.RandomState(0)
    (d / "notes.txt").write_text("not an array\n")
    (d / "empty.csv").write_text("")
    (d / "garbage.npy").write_bytes(b"\x00\x01garbage" * 20)
    (d / "long-field.csv").write_text("Att1,Class1\n" + "x" * 200_000 + ",1\n")
    (d / "garbage.png").write_bytes(b"\x00\x01not an image" * 20)
    (d / "garbage.yaml").write_text("datasets: [yeast\nmethods: [an\n")
    (d / "list.yaml").write_text("- yeast\n- an\n")
    (d / "empty.yaml").write_text("")
    np.save(d / "rows0.npy", np.zeros((0, 5), np.float32))
    np.save(d / "cols0.npy", np.zeros((10, 0), np.float32))
    np.save(d / "x.npy", rng.rand(20, 5).astype(np.float32))
    y = np.zeros((20, 3), np.uint8)
    y[np.arange(20), np.arange(20) % 3] = 1
    np.save(d / "y.npy", y)
    np.save(d / "y_bad.npy", y * 3)
    np.save(d / "y0.npy", np.zeros((0, 3), np.uint8))
    np.save(d / "x_nan.npy", np.full((4, 103), np.nan, np.float32))
    np.save(d / "x103.npy", rng.rand(4, 103).astype(np.float32))
    np.save(d / "x_wide.npy", rng.rand(4, 7).astype(np.float32))
    np.save(d / "x_empty.npy", np.zeros((0, 103), np.float32))
    np.save(d / "x3d.npy", rng.rand(2, 3, 4))
    np.save(d / "strings.npy", np.array(["a", "b"]))
    (d / "afile").write_text("an ordinary file\n")
    (d / "emptydir").mkdir()
    _png_tree(d / "img")
    _png_tree(d / "badimg", per_class=2)
    (d / "badimg" / "cat" / "broken.png").write_bytes(b"\x00not a png" * 10)
    (d / "noimg" / "cat").mkdir(parents=True)
    (d / "noimg" / "cat" / "readme.txt").write_text("no image here\n")

    fields = {"d": str(d)}
    assert main(["train", "--epochs", "1", "--quiet", "--save-train-probs",
                 "--out", str(d / "runs")]) == 0
    fields["run"] = str(d / "runs" / "yeast-an-1p-s0")
    assert main(["train", "--epochs", "1", "--quiet", "--seed", "1",
                 "--out", str(d / "runs")]) == 0
    fields["run1"] = str(d / "runs" / "yeast-an-1p-s1")
    study = d / "study"
    assert main(["study", "run", "--datasets", "yeast", "--methods", "an", "--seeds", "1",
                 "--name", "tiny", "--out", str(study), "--jobs", "1", "--quiet", "--set",
                 "epochs=1", "grid.lr=[1e-3]", "grid.batch_size=[16]"]) == 0
    fields["study"] = str(study)
    bad = d / "badstudy"
    shutil.copytree(study, bad)
    for extra in ("results.sqlite-wal", "results.sqlite-shm"):
        (bad / extra).unlink(missing_ok=True)
    (bad / "results.sqlite").write_bytes(b"this is not an SQLite database" * 40)
    fields["badstudy"] = str(bad)
    empty_study = d / "notrun"
    empty_study.mkdir()
    shutil.copy(study / "study.yaml", empty_study / "study.yaml")
    fields["notrun"] = str(empty_study)
    return fields


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("cli_errors"))


# ---- the cases --------------------------------------------------------------------------------
TRAIN = "train --epochs 1 --quiet --out {d}/runs-x "
ARRAYS = TRAIN + "--dataset arrays "
EXTRACT = "extract --dataset folder --data root={d}/img --backbone tiny_cnn --workers 0 " \
          "--quiet --cache-dir {d}/cache "
BENCH = "benchmark --epochs 1 --seeds 1 --batch-sizes 16 --lrs 1e-3 --losses an " \
        "--no-references --jobs 1 --quiet --out {d}/bench "
STUDY = "study run --datasets yeast --methods an --seeds 1 --jobs 1 --quiet " \
        "--set epochs=1 grid.lr=[1e-3] grid.batch_size=[16] --out {d}/study-x "

PREFIXES = {"train": TRAIN, "train-arrays": ARRAYS, "extract": EXTRACT, "benchmark": BENCH,
            "study-run": STUDY}


def case(argv, prog, expect, *, cid=None):
    if cid is None:
        cid = argv
        for name, prefix in PREFIXES.items():
            if argv.startswith(prefix):
                cid = f"{name} {argv[len(prefix):]}"
        cid = cid.replace("{d}/", "").replace(" --quiet", "").replace("{", "").replace("}", "")
    return pytest.param(argv, prog, expect, id=cid.strip())


CASES = [
    # -------------------------------------------------------------------- no / unknown command
    case("", "spml", "required", cid="no-command"),
    case("nope", "spml", "'nope'", cid="unknown-command"),
    case("list", "spml list", "required", cid="list-no-arg"),
    case("list nope", "spml list", "'nope'"),
    case("list datasets --bogus", "spml", "--bogus"),
    # -------------------------------------------------------------------- train: names
    case(TRAIN + "--dataset nope", "spml train", "unknown dataset 'nope'"),
    case(TRAIN + "--dataset yeastt", "spml train", "did you mean yeast"),
    case(TRAIN + "--loss nope", "spml train", "unknown loss 'nope'"),
    case(TRAIN + "--regime 2p", "spml train", "'2p'"),
    case(TRAIN + "--regime mlml:abc", "spml train", "mlml:abc"),
    case(TRAIN + "--regime mlml:1.5", "spml train", "got 1.5"),
    case(TRAIN + "--regime 1p_biased:nope", "spml train", "got '1p_biased:nope'"),
    case(TRAIN + "--regime 1p_biased:size", "spml train", "'yeast'"),
    case(TRAIN + "--regime 1p_biased:semantic --data 'class_order=[\"nope\"]'", "spml train",
         "'nope'"),
    # -------------------------------------------------------------------- train: --data
    case(TRAIN + "--data subsampel=0.5", "spml train",
         "unknown option 'subsampel' for dataset 'yeast'; did you mean 'subsample'?"),
    case(TRAIN + "--data name=x", "spml train", "unknown option 'name' for dataset 'yeast'"),
    case(TRAIN + "--data regime=full", "spml train", "--data regime=full: the label regime"),
    case(TRAIN + "--data novalue", "spml train", "--data 'novalue': expected key=value"),
    case(TRAIN + "--data =3", "spml train", "'=3'"),
    case(TRAIN + "--data subsample=2", "spml train", "subsample"),
    case(TRAIN + "--data subsample=abc", "spml train",
         "subsample must be a fraction in (0, 1], got 'abc'"),
    case(TRAIN + "--data subsample=0", "spml train", "subsample"),
    case(TRAIN + "--dataset yeast --data seed=abc", "spml train",
         "seed must be a whole number >= 0, got 'abc'"),
    case(TRAIN + "--dataset yeast --data path=[1]", "spml train",
         "option path=[1] of dataset 'yeast': expected str | os.PathLike | None, got list"),
    case(TRAIN + "--dataset yeast --data features=1", "spml train", "backbone"),
    case(TRAIN + "--dataset yeast --data path={d}/garbage.npy", "spml train",
         "garbage.npy"),
    # csv.Error (a field over csv's limit; NUL bytes on Python 3.10) is not a ValueError
    case(TRAIN + "--dataset yeast --data path={d}/long-field.csv", "spml train",
         "long-field.csv: not a readable CSV file"),
    case(TRAIN + "--dataset yeast --data path={d}/missing.csv", "spml train",
         "missing.csv"),
    case(TRAIN + "--dataset yeast --data path={d}/notes.txt", "spml train", "notes.txt"),
    case(TRAIN + "--dataset yeast --data backbone=tiny_cnn", "spml train", "'yeast'"),
    case(TRAIN + "--data path={d}/missing.csv", "spml train",
         "say which source the options are for with --dataset", cid="data-without-dataset"),
    case(TRAIN + "--dataset cole --data root={d}/missing", "spml train", "missing"),
    case(TRAIN + "--dataset cole", "spml train", "dataset 'cole' needs the option(s) root"),
    case(TRAIN + "--dataset cole --data root={d}/afile", "spml train", "afile"),
    case(TRAIN + "--dataset cole --data root=2012", "spml train",
         "option root=2012 of dataset 'cole'"),
    case(TRAIN + "--dataset folder --data root={d}/afile", "spml train", "afile"),
    case(TRAIN + "--dataset folder --data root={d}/emptydir", "spml train", "emptydir"),
    case(TRAIN + "--dataset folder --data root={d}/noimg", "spml train", "noimg"),
    case(TRAIN + "--dataset folder --data root={d}/img --data test_fraction=2", "spml train",
         "fraction must be in (0, 1), got 2"),
    case(TRAIN + "--dataset folder --data root={d}/img --data skip_missing=maybe",
         "spml train", "'maybe'"),
    case(TRAIN + "--dataset folder --data root={d}/img", "spml train",
         "dataset 'folder' holds images"),
    case(TRAIN + "--dataset folder --data root={d}/img --data colour=1", "spml train",
         "unknown option 'colour' for dataset 'folder'"),
    case(TRAIN + "--dataset folder --data root={d}/img --backbone tiny_cnn --data "
         "'features={{\"colour\": 1}}'", "spml train", "unknown feature option(s) ['colour']"),
    case(TRAIN + "--dataset folder --data root={d}/img --backbone tiny_cnn --data features=3",
         "spml train", "--data features=3: with --backbone"),
    case(TRAIN + "--dataset csv --data path={d}/empty.csv", "spml train", "empty.csv"),
    case(TRAIN + "--dataset csv --data path={d}/garbage.png", "spml train", "garbage.png"),
    case(TRAIN + "--dataset voc --data root={d}/emptydir", "spml train", "emptydir"),
    case(TRAIN + "--dataset coco --data root={d}/emptydir", "spml train", "emptydir"),
    case(TRAIN + "--dataset cub --data root={d}/emptydir", "spml train", "emptydir"),
    case(TRAIN + "--dataset nuswide --data root={d}/emptydir", "spml train", "emptydir"),
    case(TRAIN + "--dataset cole_images --data root={d}/emptydir", "spml train", "emptydir"),
    case(TRAIN + "--dataset fmnist_mosaic --data n_pool=-5 --data cache_dir={d}/fm",
         "spml train", "n_pool and n_test must be positive, got -5"),
    case(TRAIN + "--dataset mdi_icons --data size=0 --data cache_dir={d}/mdi", "spml train",
         "size must be an integer >= 8 pixels, got 0"),
    # -------------------------------------------------------------------- train: arrays source
    case(ARRAYS, "spml train", "dataset 'arrays' needs the option(s) features, labels",
         cid="arrays-no-options"),
    case(ARRAYS + "--data features={d}/x.npy", "spml train", "needs the option(s) labels"),
    case(ARRAYS + "--data features={d}/rows0.npy --data labels={d}/y.npy", "spml train",
         "rows0.npy: the feature matrix is empty (0 rows x 5 columns)"),
    case(ARRAYS + "--data features={d}/cols0.npy --data labels={d}/y.npy", "spml train",
         "cols0.npy: the feature matrix is empty (10 rows x 0 columns)"),
    case(ARRAYS + "--data features={d}/x.npy --data labels={d}/y0.npy", "spml train",
         "y0.npy has 0 label rows"),
    case(ARRAYS + "--data features={d}/notes.txt --data labels={d}/y.npy", "spml train",
         "notes.txt"),
    case(ARRAYS + "--data features={d}/garbage.npy --data labels={d}/y.npy", "spml train",
         "garbage.npy"),
    case(ARRAYS + "--data features={d}/x3d.npy --data labels={d}/y.npy", "spml train",
         "x3d.npy"),
    case(ARRAYS + "--data features={d}/strings.npy --data labels={d}/y.npy", "spml train",
         "strings.npy"),
    case(ARRAYS + "--data features={d}/x.npy --data labels={d}/y_bad.npy", "spml train",
         "y_bad.npy"),
    case(ARRAYS + "--data features={d}/x_wide.npy --data labels={d}/y.npy", "spml train",
         "x_wide.npy"),
    case(ARRAYS + "--data features={d}/x.npy --data labels={d}/y.npy --data test_fraction=0",
         "spml train", "fraction must be in (0, 1), got 0"),
    case(ARRAYS + "--data features={d}/x.npy --data labels={d}/y.npy --data standardize=maybe",
         "spml train", "'maybe'"),
    case(ARRAYS + "--data features={d}/x.npy --data labels={d}/y.npy "
         "--data test_features={d}/x.npy", "spml train", "test_labels"),
    # -------------------------------------------------------------------- train: numbers
    case(TRAIN + "--epochs abc", "spml train", "'abc'"),
    case("train --quiet --out {d}/runs-x --epochs 0", "spml train",
         "argument --epochs: expected a whole number >= 1, got 0", cid="epochs-0"),
    case("train --quiet --out {d}/runs-x --epochs -1", "spml train", "--epochs: expected a whole "
         "number >= 1, got -1", cid="epochs-neg"),
    case(TRAIN + "--batch-size 0", "spml train", "argument --batch-size: expected a whole "
         "number >= 1, got 0"),
    case(TRAIN + "--batch-size -4", "spml train", "got -4"),
    case(TRAIN + "--lr -1", "spml train", "argument --lr: expected a finite number > 0, got '-1'"),
    case(TRAIN + "--lr nan", "spml train", "got 'nan'"),
    case(TRAIN + "--lr inf", "spml train", "'inf'"),
    case(TRAIN + "--lr 0", "spml train", "argument --lr"),
    case(TRAIN + "--k -1", "spml train", "argument --k: expected a finite number > 0, got '-1'"),
    case(TRAIN + "--loss epr --k 0", "spml train", "argument --k"),
    case(TRAIN + "--loss role --k -2", "spml train", "'-2'"),
    case(TRAIN + "--loss epr --k 20", "spml train", "must be a number in [0, 14] (the number of "
         "classes), got 20"),
    case(TRAIN + "--loss epr --hp k=-1", "spml train", "loss 'epr': k must be a number > 0 of "
         "expected positives per example, or left out: the train split's true mean (k*) is the "
         "default; got -1"),
    case(TRAIN + "--k-estimate 0", "spml train", "argument --k-estimate: expected a whole number "
         ">= 1, got 0"),
    case(TRAIN + "--k-estimate -5", "spml train", "got -5"),
    case(TRAIN + "--k-estimate 100000", "spml train",
         "--k-estimate 100000: estimating k from 100000 fully labelled rows needs that many, "
         "and the train split has only"),
    case(TRAIN + "--seed -1", "spml train", "argument --seed: expected a whole number >= 0 and "
         "<= 4294967295, got -1"),
    case(TRAIN + "--seed abc", "spml train", "'abc'"),
    case(TRAIN + "--threads 0", "spml train", "argument --threads: expected a whole number >= 1 "
         "and <="),
    case(TRAIN + "--threads 100000", "spml train", "got 100000"),
    case(TRAIN + "--threads -2", "spml train", "got -2"),
    case(TRAIN + "--early-stop bogus", "spml train", "got 'bogus'"),
    case(TRAIN + "--early-stop patience:abc", "spml train", "patience:abc"),
    case(TRAIN + "--early-stop patience:0", "spml train", "patience:0"),
    # -------------------------------------------------------------------- train: loss options
    case(TRAIN + "--hp lam=2", "spml train", "'lam'"),
    case(TRAIN + "--loss epr --hp lam=abc", "spml train", "loss 'epr': lam must be a finite "
         "number >= 0, got 'abc'"),
    case(TRAIN + "--loss epr --hp lam=-1", "spml train",
         "loss 'epr': lam must be a finite number >= 0, got -1"),
    case(TRAIN + "--hp novalue", "spml train", "--hp 'novalue': expected key=value"),
    case(TRAIN + "--hp =2", "spml train", "'=2'"),
    case(TRAIN + "--reg nope:1", "spml train", "unknown regulariser 'nope'"),
    case(TRAIN + "--reg highrank:abc", "spml train", "weight 'abc' is not a number"),
    case(TRAIN + "--loss ls --hp smoothing=2", "spml train",
         "loss 'ls': smoothing must be a number in [0, 1), got 2"),
    case(TRAIN + "--loss ll_r --hp delta_rel=-1", "spml train",
         "loss 'll_r': delta_rel must be a number in [0, 100], got -1"),
    # -------------------------------------------------------------------- train: modes, files
    case(TRAIN + "--mode finetune", "spml train", "--backbone"),
    case(TRAIN + "--mode nope", "spml train", "'nope'"),
    case(TRAIN + "--backbone nope", "spml train", "'yeast'"),
    case(TRAIN + "--dataset folder --data root={d}/img --backbone nope", "spml train",
         "'nope'"),
    case(TRAIN + "--dataset folder --data root={d}/img --backbone tiny_cnn "
         "--cache-dir {d}/afile", "spml train", "afile"),
    case(TRAIN + "--dataset folder --data root={d}/img --mode finetune --backbone tiny_cnn "
         "--random-init --image-size 0 --workers 0", "spml train",
         "argument --image-size: expected a whole number >= 1, got 0"),
    case(TRAIN + "--dataset folder --data root={d}/img --mode finetune --backbone tiny_cnn "
         "--random-init --workers -1", "spml train", "argument --workers: expected a whole "
         "number >= 0, got -1"),
    case(TRAIN + "--dataset folder --data root={d}/img --mode finetune --backbone tiny_cnn "
         "--random-init --workers 0 --device nope", "spml train", "'nope'"),
    case(TRAIN + "--dataset folder --data root={d}/img --mode linear_init --backbone tiny_cnn "
         "--random-init --workers 0 --linear-epochs -1", "spml train",
         "argument --linear-epochs: expected a whole number >= 1, got -1"),
    case(TRAIN + "--mode lac --option nope=1", "spml train", "'nope'"),
    case(TRAIN + "--mode lac --lac novalue", "spml train", "--lac 'novalue'"),
    case(TRAIN + "--mode lac --option dim=abc", "spml train",
         "LACConfig.dim must be a whole number >= 4, got 'abc'"),
    case(TRAIN + "--resume {d}/missing", "spml train", "missing"),
    case(TRAIN + "--resume {d}/afile", "spml train", "afile"),
    case("train --epochs 1 --quiet --out {d}/afile", "spml train", "afile",
         cid="train-out-is-a-file"),
    case("train --epochs 1 --quiet --out /sys/spml-runs", "spml train", "/sys/spml-runs",
         cid="train-out-not-writable"),
    # -------------------------------------------------------------------- predict
    case("predict {d}/missing {d}/x103.npy", "spml predict", "missing"),
    case("predict {d}/afile {d}/x103.npy", "spml predict", "afile"),
    case("predict {d}/emptydir {d}/x103.npy", "spml predict", "emptydir"),
    case("predict {run} {d}/missing.npy", "spml predict", "missing.npy"),
    case("predict {run} {d}/x_wide.npy", "spml predict", "x_wide.npy"),
    case("predict {run} {d}/notes.txt", "spml predict", "notes.txt"),
    case("predict {run} {d}/garbage.npy", "spml predict", "garbage.npy: not a readable"),
    case("predict {run} {d}/x_nan.npy", "spml predict", "x_nan.npy"),
    case("predict {run} {d}/x_empty.npy", "spml predict", "x_empty.npy"),
    case("predict {run} {d}/x3d.npy", "spml predict", "x3d.npy"),
    case("predict {run} {d}/img", "spml predict", "{d}/img"),
    case("predict {run} {d}/x103.npy --threshold abc", "spml predict", "'abc'"),
    case("predict {run} {d}/x103.npy --threshold 1.5", "spml predict", "got 1.5"),
    case("predict {run} {d}/x103.npy --threshold -0.1", "spml predict", "got -0.1"),
    case("predict {run} {d}/x103.npy --batch-size 0", "spml predict", "argument --batch-size"),
    case("predict {run} {d}/x103.npy --workers -1", "spml predict", "argument --workers"),
    case("predict {run} {d}/x103.npy --device nope", "spml predict", "'nope'"),
    case("predict {run} {d}/x103.npy --device cuda:99", "spml predict", "cuda:99"),
    case("predict {run} {d}/x103.npy --format xml", "spml predict", "'xml'"),
    case("predict {run} {d}/x103.npy --out {d}/emptydir", "spml predict", "emptydir"),
    case("predict {run} {d}/x103.npy --out /sys/spml-pred.csv", "spml predict",
         "/sys/spml-pred.csv"),
    case("predict {run} {d}/x103.npy --out {d}/afile/p.csv", "spml predict", "afile"),
    case("predict {run}", "spml predict", "INPUTS"),
    # -------------------------------------------------------------------- benchmark
    case(BENCH + "--losses nope", "spml benchmark", "'nope'"),
    case(BENCH + "--seeds 0", "spml benchmark", "--seeds"),
    case(BENCH + "--seeds -1", "spml benchmark", "--seeds"),
    case(BENCH + "--batch-sizes abc", "spml benchmark", "'abc'"),
    case(BENCH + "--batch-sizes 0", "spml benchmark", "--batch-sizes: expected a positive integer"),
    case(BENCH + "--lrs -1", "spml benchmark", "--lrs: expected a positive number"),
    case(BENCH + "--jobs 0", "spml benchmark", "must be >= 1, got 0"),
    case(BENCH + "--dataset nope", "spml benchmark", "'nope'"),
    case(BENCH + "--data subsampel=0.5", "spml benchmark", "'subsampel'"),
    case(BENCH + "--epochs 0", "spml benchmark", "--epochs"),
    case("benchmark --epochs 1 --seeds 1 --quiet --out {d}/afile", "spml benchmark",
         "afile", cid="benchmark-out-is-a-file"),
    # -------------------------------------------------------------------- extract
    case("extract --dataset nope --quiet", "spml extract", "'nope'"),
    case("extract --quiet", "spml extract", "--dataset", cid="extract-no-dataset"),
    case("extract --dataset yeast --quiet --backbone tiny_cnn --cache-dir {d}/cache",
         "spml extract", "'yeast'"),
    case("extract --dataset folder --data root={d}/missing --quiet", "spml extract",
         "missing"),
    case(EXTRACT + "--data subsampel=0.5", "spml extract", "unknown option 'subsampel' for "
         "dataset 'folder'; did you mean 'subsample'?"),
    case(EXTRACT + "--data subsample=0.5", "spml extract",
         "option 'subsample' belongs to the train / val protocol"),
    case(EXTRACT + "--data regime=full", "spml extract", "--regime"),
    case(EXTRACT.replace("tiny_cnn", "nope"), "spml extract", "'nope'",
         cid="extract --backbone nope"),
    case(EXTRACT + "--limit 0", "spml extract", "argument --limit"),
    case(EXTRACT + "--size 0", "spml extract", "argument --size"),
    case(EXTRACT + "--size -3", "spml extract", "argument --size: expected a whole number >= 1, "
         "got -3"),
    case(EXTRACT + "--batch-size 0", "spml extract", "argument --batch-size"),
    case(EXTRACT + "--device nope", "spml extract", "'nope'"),
    case(EXTRACT.replace("--workers 0", "--workers -1"), "spml extract",
         "argument --workers: expected a whole number >= 0, got -1",
         cid="extract --workers -1"),
    case(EXTRACT.replace("{d}/cache", "{d}/afile"), "spml extract", "afile",
         cid="extract --cache-dir afile"),
    case(EXTRACT.replace("{d}/cache", "/sys/spml-cache"), "spml extract", "/sys/spml-cache",
         cid="extract --cache-dir not-writable"),
    case(EXTRACT.replace("{d}/img", "{d}/badimg"), "spml extract", "broken.png",
         cid="extract corrupt image"),
    case(EXTRACT + "--transform nope", "spml extract", "'nope'"),
    # -------------------------------------------------------------------- study run
    case("study run nope-preset --quiet", "spml study run", "nope-preset"),
    case("study run {d}/garbage.yaml --quiet", "spml study run", "garbage.yaml"),
    case("study run {d}/list.yaml --quiet", "spml study run", "list.yaml"),
    case("study run {d}/empty.yaml --quiet", "spml study run", "empty.yaml"),
    case("study run {d}/emptydir --quiet", "spml study run", "emptydir"),
    case("study run {d}/notes.txt --quiet", "spml study run", "notes.txt"),
    case("study run --methods an --quiet", "spml study run", "--datasets"),
    case(STUDY.replace("yeast", "nope"), "spml study run", "'nope'",
         cid="study-run --datasets nope"),
    case(STUDY.replace("--methods an", "--methods nope"), "spml study run", "'nope'",
         cid="study-run --methods nope"),
    case(STUDY.replace("--seeds 1", "--seeds 0"), "spml study run",
         "argument --seeds: expected a whole number >= 1, got 0",
         cid="study-run --seeds 0"),
    case(STUDY.replace("--seeds 1", "--seeds -1"), "spml study run", "got -1",
         cid="study-run --seeds -1"),
    case(STUDY.replace("--jobs 1", "--jobs 0"), "spml study run", "must be >= 1, got 0",
         cid="study-run --jobs 0"),
    case(STUDY + "--set epochs", "spml study run", "'epochs'"),
    case(STUDY + "--set nope=1", "spml study run", "'nope'"),
    case(STUDY + "--set epochs=abc", "spml study run", "epochs: expected a positive integer, "
         "got 'abc'"),
    case(STUDY + "--set grid.lr=[-1]", "spml study run", "grid.lr: expected a positive number, "
         "got -1"),
    case(STUDY + "--set data.subsampel=[0.5]", "spml study run", "'data'"),
    case(STUDY + "--set vary.data.subsampel=[0.5]", "spml study run", "subsampel"),
    case(STUDY.replace("{d}/study-x", "{d}/afile"), "spml study run", "afile",
         cid="study-run --out afile"),
    case(STUDY.replace("{d}/study-x", "/sys/spml-study"), "spml study run", "/sys/spml-study",
         cid="study-run --out not-writable"),
    case("study run {badstudy} --quiet --jobs 1 --out {badstudy}", "spml study run",
         "results.sqlite is not a usable results store"),
    case("study nope-preset --quiet", "spml study run", "nope-preset",
         cid="study-implicit-run"),
    case("study", "spml study", "required", cid="study-no-action"),
    # -------------------------------------------------------------------- study status/table
    case("study status {d}/missing", "spml study status", "missing"),
    case("study status {d}/emptydir", "spml study status", "emptydir"),
    case("study status {d}/afile", "spml study status", "afile"),
    case("study status {badstudy}", "spml study status", "results.sqlite"),
    case("study table {d}/missing", "spml study table", "missing"),
    case("study table {badstudy}", "spml study table", "results.sqlite"),
    case("study table {notrun}", "spml study table", "notrun"),
    case("study table {study} --metric nope", "spml study table", "'nope'"),
    case("study table {study} --columns nope", "spml study table", "no selected run has 'nope'"),
    case("study table {study} --format xml", "spml study table", "'xml'"),
    # -------------------------------------------------------------------- study export
    case("study export {d}/missing --format csv --output {d}/x.csv", "spml study export",
         "missing"),
    case("study export {badstudy} --format csv --output {d}/x.csv", "spml study export",
         "results.sqlite"),
    case("study export {notrun} --format csv --output {d}/x.csv", "spml study export",
         "results.sqlite"),
    case("study export {study} --format csv --output {d}/emptydir", "spml study export",
         "emptydir"),
    case("study export {study} --format csv --output /sys/spml.csv", "spml study export",
         "/sys/spml.csv"),
    case("study export {study} --format csv --output {d}/afile/x.csv", "spml study export",
         "afile"),
    case("study export {study} --format xml --output {d}/x.xml", "spml study export",
         "'xml'"),
    case("study export {study} --format csv", "spml study export", "--output"),
    # -------------------------------------------------------------------- report
    case("report {d}/missing", "spml report", "missing"),
    case("report {d}/emptydir", "spml report", "emptydir"),
    case("report {badstudy} --out {d}/r.html", "spml report", "results.sqlite"),
    case("report {study} --out {d}/emptydir", "spml report", "emptydir"),
    case("report {study} --out /sys/spml-report.html", "spml report", "/sys/spml-report.html"),
    # -------------------------------------------------------------------- figure
    case("figure curves {d}/missing --out {d}/f.png", "spml figure curves", "missing"),
    case("figure curves {d}/emptydir --out {d}/f.png", "spml figure curves", "emptydir"),
    case("figure curves {run} --metric nope --out {d}/f.png", "spml figure curves", "'nope'"),
    case("figure curves {run} --labels a,b --out {d}/f.png", "spml figure curves", "2 labels"),
    case("figure curves {run} --out {d}/f.txt", "spml figure curves", "f.txt"),
    case("figure curves {run} --out {d}/emptydir", "spml figure curves", "emptydir"),
    case("figure curves {run} --out /sys/spml-f.png", "spml figure curves", "/sys/spml-f.png"),
    case("figure sweep {d}/missing --axis k --out {d}/f.png", "spml figure sweep", "missing"),
    case("figure sweep {study} --axis nope --out {d}/f.png", "spml figure sweep", "'nope'"),
    case("figure sweep {badstudy} --axis k --out {d}/f.png", "spml figure sweep",
         "results.sqlite"),
    case("figure sweep {study} --out {d}/f.png", "spml figure sweep", "--axis"),
    case("figure histograms {run} --bins 0 --out {d}/f.png", "spml figure histograms",
         "argument --bins: expected a whole number >= 1 and <= 100000, got 0"),
    case("figure histograms {d}/missing --out {d}/f.png", "spml figure histograms",
         "missing"),
    case("figure landscape {run} --steps 1 --out {d}/f.png", "spml figure landscape",
         "steps must be a whole number in [2, 1001] (steps^2 loss evaluations), got 1"),
    case("figure landscape {run} --span -1 --out {d}/f.png", "spml figure landscape",
         "span must be a positive number, got -1"),
    case("figure landscape {run} --max-examples 0 --out {d}/f.png", "spml figure landscape",
         "max_examples"),
    case("figure landscape {d}/afile --out {d}/f.png", "spml figure landscape", "afile"),
    case("figure panel {run} --out {d}/f.png", "spml figure panel", "dataset 'yeast', which holds "
         "feature vectors"),
    case("figure cam {run} --out {d}/f.png", "spml figure cam", "linear run on feature vectors"),
    case("figure attention {run} --out {d}/f.png", "spml figure attention", "is a linear run"),
    case("figure nope {run}", "spml figure", "'nope'"),
    # -------------------------------------------------------------------- analyze
    case("analyze pl-precision {run} --out {d}/a.png", "spml analyze pl-precision",
         "the run's loss 'an'"),
    case("analyze pl-precision {d}/missing --out {d}/a.png", "spml analyze pl-precision",
         "missing"),
    case("analyze ap-diff {run} {d}/missing --out {d}/a.png", "spml analyze ap-diff",
         "missing"),
    case("analyze ap-diff {run} {d}/emptydir --out {d}/a.png", "spml analyze ap-diff",
         "emptydir"),
    case("analyze wasserstein {d}/afile --out {d}/a.png", "spml analyze wasserstein", "afile"),
    case("analyze histograms {run1} --out {d}/a.png", "spml analyze histograms",
         "train_probs"),
    case("analyze histograms {run} --epochs 0 --out {d}/a.png", "spml analyze histograms",
         "epochs [0] are not in the run"),
    case("analyze histograms {run} --epochs 99 --out {d}/a.png", "spml analyze histograms",
         "epochs [99] are not in the run"),
    case("analyze histograms {run} --bins 0 --out {d}/a.png", "spml analyze histograms",
         "argument --bins: expected a whole number >= 1 and <= 100000, got 0"),
    # counts that sized an allocation or a figure: bounded where they are parsed (a billion
    # calibration bins ended in numpy's out-of-memory traceback)
    case("figure calibration {run} --bins 1000000000", "spml figure calibration",
         "argument --bins: expected a whole number >= 1 and <= 100000, got 1000000000"),
    case("figure histograms {run} --bins 1000000000", "spml figure histograms",
         "argument --bins: expected a whole number >= 1 and <= 100000"),
    case("figure landscape {run} --steps 100000", "spml figure landscape",
         "steps must be a whole number in [2, 1001] (steps^2 loss evaluations), got 100000"),
    case("figure panel {run} --n 1000000", "spml figure panel",
         "argument --n: expected a whole number >= 1 and <= 64, got 1000000"),
    case("figure cam {run} --top 0", "spml figure cam",
         "argument --top: expected a whole number >= 1, got 0"),
    case("analyze histograms {run} --epochs x --out {d}/a.png", "spml analyze histograms",
         "'x'"),
    case("analyze histograms {run} --out {d}/a.txt", "spml analyze histograms", "a.txt"),
    case("analyze histograms {run}", "spml analyze histograms", "--out"),
]


def _run(argv, capsys):
    """``(exit status, stderr, whether argparse itself refused the command line)``."""
    try:
        code, by_parser = main(argv), False
    except SystemExit as stop:  # argparse's own errors: its usage lines, then the error line
        code, by_parser = stop.code, True
    return code, capsys.readouterr().err, by_parser


@pytest.mark.parametrize("argv, prog, expect", CASES)
def test_bad_input_ends_in_one_clear_line(argv, prog, expect, ws, capsys, tmp_path, monkeypatch):
    """Exit status 2; stderr is the one line ``<prog>: error: ...`` naming the value (after
    the usage lines when argparse refused the command line); no traceback."""
    monkeypatch.chdir(tmp_path)  # a command that falls back on ./runs writes here
    code, err, by_parser = _run(shlex.split(argv.format(**ws)), capsys)
    assert "Traceback" not in err, err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if ": error:" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert by_parser or lines == errors, err
    assert errors[0].startswith(f"{prog}: error: "), err
    assert expect.format(**ws) in errors[0], err


@pytest.mark.parametrize("argv, prog, where", [
    (TRAIN + "--seed 7", "spml train", "runs-x"),
    (STUDY.replace("study-x", "study-full"), "spml study run", "study-full"),
    (EXTRACT.replace("{d}/cache", "{d}/cache-full"), "spml extract", "cache-full"),
], ids=["train", "study-run", "extract"])
def test_a_full_disk_is_a_clear_error(argv, prog, where, ws, capsys, monkeypatch):
    """Writing the output fails with ENOSPC (simulated: every atomic write raises it): one line
    naming the file and the reason, exit 2."""
    from spmlkit import safe_write

    def full(path, write, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(safe_write, "write_atomic", full)
    code, err, _ = _run(shlex.split(argv.format(**ws)), capsys)
    assert code == 2 and "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.strip()]
    assert line.startswith(f"{prog}: error: ") and "No space left on device" in line, line
    assert where in line, line


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into read-only folders")
def test_a_read_only_out_folder_is_a_clear_error(ws, capsys, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        code, err, _ = _run(shlex.split((TRAIN + "--out {ro}").format(**ws, ro=ro)), capsys)
    finally:
        ro.chmod(0o755)
    assert code == 2 and "Traceback" not in err
    assert err.strip().startswith("spml train: error: ") and str(ro) in err


def test_the_options_that_used_to_collide_now_work(ws, capsys):
    """``--data name=...`` names an ``arrays`` dataset (it collided with load_splits' own
    argument); ``--data features={...}`` with ``--backbone`` reaches the extraction (it was
    silently replaced by the flags' settings)."""
    import json
    from pathlib import Path

    d = Path(ws["d"])
    out = d / "runs-ok"
    assert main(shlex.split(f"train --solver adam --epochs 1 --quiet --out {out} --dataset "
                            f"arrays --data "
                            f"features={d}/x.npy --data labels={d}/y.npy --data name=mine")) == 0
    assert (out / "mine-an-1p-s0" / "config.json").is_file()
    assert main(shlex.split(f"train --solver adam --epochs 1 --quiet --out {out} --dataset "
                            f"folder --data "
                            f"root={d}/img --backbone tiny_cnn --cache-dir {d}/cache --data "
                            f"'features={{\"num_workers\": 0}}'")) == 0
    config = json.loads((out / "folder-an-1p-s0" / "config.json").read_text())
    assert config["dataset_options"]["features"] == {"dtype": "float32",
                                                     "cache_dir": f"{d}/cache", "num_workers": 0}
    capsys.readouterr()


@pytest.mark.parametrize("argv,says", [
    (["--lrs", "-1"], "spml benchmark: error: --lrs: expected a positive number, got -1.0"),
    (["--losses", "an,an"], "spml benchmark: error: --losses (with the reference rows): labels "
                            "must be unique")])
def test_benchmark_errors_name_the_option_not_the_spec_key(argv, says, tmp_path, capsys):
    """The study spec spml benchmark builds is an inner detail: its errors name the option
    (they began ``<dict>: grid.lr:``)."""
    assert main(["benchmark", *argv, "--seeds", "1", "--epochs", "1", "--out",
                 str(tmp_path / "b"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and "<dict>" not in err, err
    assert not (tmp_path / "b").exists()


def test_list_without_what_names_only_what_is_required(capsys):
    with pytest.raises(SystemExit):
        main(["list"])
    assert capsys.readouterr().err.rstrip().endswith("the following arguments are required: what")


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """``spml ... | head``: the reader closes the pipe; the command stops with 141 (128 +
    SIGPIPE, as a shell reports it) and says nothing (it printed ``error: [Errno 32] Broken
    pipe``, exit 2)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "spmlkit", "list", "losses", "--details"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait() == 141 and err == "", err
