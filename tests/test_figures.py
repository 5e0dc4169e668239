"""The papers' figures: numbers on hand-made data, valid PNG/SVG files, CLI on tiny runs."""
import json

import numpy as np
import pytest
import torch
from _image_toy import make_images
from _study_toy import real_run_id, write_results

from spmlkit.cli import main
from spmlkit.experiments import figures as fg

PNG = b"\x89PNG\r\n\x1a\n"


def is_png(path):
    data = open(path, "rb").read()
    return data[:8] == PNG and len(data) > 1000


# --- runs shared by the CLI tests --------------------------------------------------------------
@pytest.fixture(scope="module")
def yeast_run(tmp_path_factory):
    from spmlkit.loading import load_splits
    from spmlkit.engine import TrainConfig
    from spmlkit.methods import train_run

    out = tmp_path_factory.mktemp("yeast")
    splits = load_splits("yeast")
    res = train_run("linear", splits, "an", {}, TrainConfig(epochs=2, lr=1e-2), out=out)
    return res["run_dir"]


@pytest.fixture(scope="module")
def image_runs(tmp_path_factory):
    """A toy CSV image source; a linear run on tiny_cnn's cached features and a 1-epoch
    fine-tuning run of tiny_cnn."""
    from spmlkit.loading import load_splits
    from spmlkit.engine import TrainConfig
    from spmlkit.methods import train_run

    root = tmp_path_factory.mktemp("toy")
    paths, y = make_images(root / "img", 40, seed=0)
    names = ["red", "green", "blue"]
    (root / "labels.csv").write_text("path,labels\n" + "".join(
        f"{p},{';'.join(names[j] for j in range(3) if y[i, j])}\n" for i, p in enumerate(paths)))
    source = {"path": str(root / "labels.csv")}
    feats = {**source, "backbone": "tiny_cnn",
             "features": {"cache_dir": str(root / "cache"), "progress": False}}
    linear = train_run("linear", load_splits("csv", "1p", **feats), "an", {},
                       TrainConfig(epochs=2, lr=1e-2), out=root / "runs",
                       dataset_options=feats)["run_dir"]
    tuned = train_run("finetune", load_splits("csv", "1p", **source), "an", {},
                      TrainConfig(epochs=1, lr=1e-2, batch_size=8), backbone="tiny_cnn",
                      pretrained=False, out=root / "runs", dataset_options=source,
                      backbone_options={"width": 4, "num_features": 8, "input_size": 16})
    return {"linear": linear, "finetune": tuned["run_dir"]}


# --- 1. curves ---------------------------------------------------------------------------------
def test_curves_png_svg_and_errors(tmp_path):
    curves = {"opml": [{"epoch": e, "val_map": 50 + e, "train_loss": 1 / e} for e in (1, 2, 3)],
              "opml w/o high-rank": [{"epoch": e, "val_map": 48 + e} for e in (1, 2, 3)]}
    out = fg.plot_curves(curves, tmp_path / "c.png")
    assert out == tmp_path / "c.png" and is_png(out)
    svg = fg.plot_curves(curves, tmp_path / "c.svg")
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()
    with pytest.raises(ValueError, match="pl_precision"):
        fg.plot_curves(curves, tmp_path / "d.png", metric="pl_precision")
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        fg.plot_curves(curves, tmp_path / "c.pdf")
    (tmp_path / "run").mkdir()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        fg.curves_from_runs([tmp_path / "run"])


# --- 2. sweeps ---------------------------------------------------------------------------------
def sweep_rows():
    rows = []
    for method, base in (("an", 40.0), ("epr", 45.0)):
        for alpha in (0.01, 0.1, 1.0):
            for seed, noise in enumerate((-1.0, 1.0, 3.0)):
                rows.append({"run_id": f"{method}-{alpha}-{seed}", "method": method,
                             "dataset": "yeast", "regime": "1p", "seed": seed,
                             "variant": json.dumps({"hparams.alpha": alpha}),
                             "status": "done", "val_map": 1.0,
                             "test_map": base + 10 * alpha + noise})
    rows += [{"run_id": f"full-{s}", "method": "bce@full", "dataset": "yeast", "regime": "full",
              "seed": s, "variant": "{}", "status": "done", "val_map": 1.0,
              "test_map": 60.0 + s} for s in range(2)]
    return rows


def test_sweep_points_means_stds_and_reference(tmp_path):
    lines = fg.sweep_points(sweep_rows(), "hparams.alpha")
    by = {ln.method: ln for ln in lines}
    assert by["an"].x == [0.01, 0.1, 1.0] and not by["an"].reference
    # noise -1, 1, 3: mean +1, sample std 2
    np.testing.assert_allclose(by["an"].mean, [40.1 + 1, 41 + 1, 50 + 1])
    np.testing.assert_allclose(by["epr"].std, [2.0, 2.0, 2.0])
    assert by["an"].n.tolist() == [3, 3, 3]
    ref = by["bce@full"]
    assert ref.reference and ref.mean.tolist() == [60.5] and ref.std[0] == pytest.approx(
        np.std([60, 61], ddof=1))
    assert is_png(fg.plot_sweep(lines, "hparams.alpha", tmp_path / "s.png"))
    assert "epr" in fg.sweep_table(lines, "hparams.alpha")
    with pytest.raises(ValueError, match=r"'hparams\.beta'.*hparams\.alpha"):
        fg.sweep_points(sweep_rows(), "hparams.beta")
    # a categorical axis (k estimates are strings) keeps its values as labels
    cat = [{**r, "variant": json.dumps({"k": "estimate:50:lower" if r["seed"] else 2.5})}
           for r in sweep_rows() if r["method"] == "an"]
    (line,) = fg.sweep_points(cat, "k")
    assert line.x == ["2.5", "estimate:50:lower"] and line.n.tolist() == [3, 6]
    assert is_png(fg.plot_sweep([line], "k", tmp_path / "k.png"))


#: the methods of sweep_rows as a study runs them: losses with the swept alpha, and a reference
STUDY_METHODS = {"an": "em", "epr": "em_apl", "bce@full": "bce@full"}


def write_study(folder, rows):
    """A study folder whose spec sweeps alpha; every row at two grid points (the second worse on
    val), under the run ids the spec gives those runs."""
    folder.mkdir()
    spec = {"name": "toy", "title": "Toy sweep", "datasets": ["yeast"],
            "methods": list(STUDY_METHODS.values()), "seeds": 3,
            "grid": {"batch_size": [8], "lr": [1e-3, 1e-2]},
            "vary": {"hparams.alpha": [0.01, 0.1, 1.0]}}
    (folder / "study.yaml").write_text(json.dumps(spec))  # JSON is YAML
    stored = []
    for r in rows:
        for lr, shift in ((1e-3, 0.0), (1e-2, -5.0)):  # the second grid point: worse val
            method = STUDY_METHODS[r["method"]]
            row = {**r, "method": method, "loss": method.split("@")[0], "lr": lr,
                   "batch_size": 8, "mode": "linear", "study": "toy",
                   "val_map": r["val_map"] + shift, "test_map": r["test_map"] + shift}
            stored.append({**row, "run_id": real_run_id(spec, row)})
    write_results(folder, stored)


def test_sweep_cli_on_a_study_folder(tmp_path, capsys):
    study = tmp_path / "toy"
    write_study(study, sweep_rows())
    assert main(["figure", "sweep", str(study), "--axis", "hparams.alpha"]) == 0
    text = capsys.readouterr().out
    assert "51.00" in text and "wrote" in text  # an at alpha 1: the best-val grid point
    assert is_png(study / "figures" / "sweep-hparams.alpha.png")
    assert main(["figure", "sweep", str(study), "--axis", "nope"]) == 2
    assert "'nope'" in capsys.readouterr().err
    assert main(["figure", "sweep", str(tmp_path / "missing"), "--axis", "k"]) == 2
    assert "missing" in capsys.readouterr().err


# --- 3. histograms -----------------------------------------------------------------------------
def test_probability_histograms_counts(tmp_path):
    probs = np.array([[0.95, 0.3, 0.05], [0.55, 0.7, 0.45]])
    z = np.array([[1, 0, 0], [0, 1, -1]])
    y = np.array([[1, 1, 0], [1, 1, 0]])
    h = fg.probability_histograms(probs, z, y, bins=4)
    # observed positives .95 .7; unobserved positives .3 .55; negatives .05 .45
    assert h.counts.tolist() == [[0, 0, 1, 1], [0, 1, 1, 0], [1, 1, 0, 0]]
    assert h.n.tolist() == [2, 2, 2]
    np.testing.assert_allclose(h.mean, [0.825, 0.425, 0.25])
    np.testing.assert_allclose(h.above_half, [1.0, 0.5, 0.0])
    assert is_png(fg.plot_probability_histograms(h, tmp_path / "h.png"))
    with pytest.raises(ValueError, match="same N x L"):
        fg.probability_histograms(probs, z[:1], y)


# --- 4. landscape ------------------------------------------------------------------------------
def test_landscape_converged_least_squares(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 5, generator=g, dtype=torch.float64)
    target = x @ torch.randn(5, 3, generator=g, dtype=torch.float64) \
        + 0.1 * torch.randn(64, 3, generator=g, dtype=torch.float64)
    model = torch.nn.Linear(5, 3, bias=True).double()
    with torch.no_grad():  # the exact least-squares solution: the objective's minimum
        xa = torch.cat([x, torch.ones(64, 1, dtype=torch.float64)], 1)
        sol = torch.linalg.lstsq(xa, target).solution
        model.weight.copy_(sol[:5].T)
        model.bias.copy_(sol[5])
    before = [p.clone() for p in model.parameters()]

    def objective(m):
        with torch.no_grad():
            return float(((m(x) - target) ** 2).mean())

    ls = fg.loss_landscape(model, objective, steps=7, span=0.5, seed=3)
    assert ls.values.shape == (7, 7) and np.isfinite(ls.values).all()
    assert ls.argmin == (0.0, 0.0) and ls.centre == pytest.approx(objective(model))
    assert ls.values.min() == ls.values[3, 3] and (ls.values[3, 3] < np.delete(
        ls.values.ravel(), 24)).all()
    for p, b in zip(model.parameters(), before):  # weights restored
        assert torch.equal(p, b)
    again = fg.loss_landscape(model, objective, steps=7, span=0.5, seed=3)
    assert np.array_equal(again.values, ls.values)  # seeded
    d = fg.filter_normalized_direction(model, torch.Generator().manual_seed(1))
    torch.testing.assert_close(d[0].norm(dim=1), model.weight.norm(dim=1))  # per row
    assert torch.count_nonzero(d[1]) == 0  # bias zeroed (Li et al.)
    assert is_png(fg.plot_landscape(ls, tmp_path / "l.png"))
    with pytest.raises(ValueError, match="steps"):
        fg.loss_landscape(model, objective, steps=1)


# --- 5. / 6. panels, CAMs, attention on hand-made data ------------------------------------------
def test_cam_is_the_weighted_sum_and_plots(tmp_path):
    rng = np.random.default_rng(0)
    fmap = rng.random((2, 4, 3, 3))
    w = rng.normal(size=(5, 4))
    cam = fg.class_activation_maps(fmap, w)
    assert cam.shape == (2, 5, 3, 3)
    assert cam[1, 2, 0, 1] == pytest.approx(sum(w[2, c] * fmap[1, c, 0, 1] for c in range(4)))
    # GAP + linear: the map's mean is the logit without bias
    np.testing.assert_allclose(cam.mean(axis=(2, 3)), fmap.mean(axis=(2, 3)) @ w.T)
    assert fg.upsample_maps(cam, (12, 9)).shape == (2, 5, 12, 9)
    with pytest.raises(ValueError, match="same C"):
        fg.class_activation_maps(fmap, w[:, :3])
    images = [rng.integers(0, 255, (12, 12, 3), dtype=np.uint8) for _ in range(2)]
    probs = rng.random((2, 5))
    names = [f"c{j}" for j in range(5)]
    assert is_png(fg.plot_cam(images, fmap, w, probs, names, tmp_path / "cam.png", top=2))
    att = rng.random((2, 5, 3, 3))
    att /= att.sum(axis=(2, 3), keepdims=True)  # attention rows sum to 1
    assert is_png(fg.plot_attention(images, att, probs, names, tmp_path / "att.png"))
    with pytest.raises(ValueError, match="n x L x h x w"):
        fg.plot_attention(images, att[:1], probs, names, tmp_path / "bad.png")


def test_panel_plot(tmp_path):
    rng = np.random.default_rng(1)
    panel = fg.Panel([rng.integers(0, 255, (10, 10, 3), dtype=np.uint8) for _ in range(3)],
                     ["a.png", "b.png", "c.png"], [["x"], ["y"], ["x", "z"]],
                     np.array([[0.9, 0.1, 0.2], [0.3, 0.8, 0.1], [0.6, 0.2, 0.7]]),
                     ["x", "y", "z"])
    assert is_png(fg.plot_panel(panel, tmp_path / "p.png", top=2, ncols=2))
    assert fg.top_predictions(panel.probs, panel.class_names, 2)[2] == [("z", 0.7), ("x", 0.6)]


# --- CLI on tiny runs --------------------------------------------------------------------------
def test_cli_linear_run_figures(yeast_run, tmp_path, capsys):
    run = yeast_run
    assert main(["figure", "curves", run, run, "--labels", "a,b",
                 "--out", str(tmp_path / "c.png")]) == 0
    assert is_png(tmp_path / "c.png")
    assert main(["figure", "histograms", run]) == 0
    assert is_png(f"{run}/figures/histograms.png")
    capsys.readouterr()
    assert main(["figure", "landscape", run, "--steps", "3", "--span", "0.5",
                 "--out", str(tmp_path / "l.svg")]) == 0
    text = capsys.readouterr().out
    assert "3 x 3 grid" in text and (tmp_path / "l.svg").read_text().count("<svg") == 1
    centre = float(text.split("trained weights ")[1].split(",")[0])
    final = json.load(open(f"{run}/final.json"))
    records = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    # the centre is the AN loss of the best weights on all train rows (an epoch's mean loss is
    # of the same order: measured while the weights moved)
    assert 0.5 * records[final["best_epoch"] - 1]["train_loss"] < centre < \
        1.5 * records[0]["train_loss"]
    assert main(["figure", "panel", run]) == 2  # yeast has no images
    assert "feature vectors, not images" in capsys.readouterr().err
    assert main(["figure", "curves", str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_cli_image_run_figures(image_runs, tmp_path, capsys):
    for (kind, run), split in zip(image_runs.items(), ("test", "train")):
        assert main(["figure", "panel", run, "--split", split, "--n", "3", "--out",
                     str(tmp_path / f"{kind}-p.png")]) == 0
        assert main(["figure", "cam", run, "--n", "2", "--top", "2", "--out",
                     str(tmp_path / f"{kind}-cam.png")]) == 0
        for name in ("p", "cam"):
            assert is_png(tmp_path / f"{kind}-{name}.png")
        ov = fg.cam_from_run(run, n=2)
        assert ov.maps.shape[:2] == (2, 3) and "e-0" in ov.note  # GAP check: ~1e-7
        err = float(ov.note.rsplit(" ", 1)[1])
        assert err < 1e-4
        # the CAM figure shows each image's true labels next to the predicted classes: the
        # labels of the same images the panel draws (same seeded choice)
        same = fg.panel_from_run(run, "test", n=2, seed=0)
        assert same.label_kind == "true" and ov.items == same.items
        assert ov.true_labels == [list(t) for t in same.labels]
        assert all(ov.true_labels)
        assert main(["figure", "attention", run]) == 2
        assert "LAC" in capsys.readouterr().err
    panel = fg.panel_from_run(image_runs["finetune"], "train", n=4, seed=0)
    assert panel.label_kind == "observed" and all(len(lab) == 1 for lab in panel.labels)
    assert all(set(o) <= set(t) for o, t in zip(panel.labels, panel.true_labels))
    assert main(["figure", "landscape", image_runs["finetune"], "--steps", "3",
                 "--max-examples", "8", "--out", str(tmp_path / "ft-l.png")]) == 0
    assert is_png(tmp_path / "ft-l.png")
