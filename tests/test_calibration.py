"""Per-class ECE, reliability curves and per-class temperatures (spmlkit.calibration), and
``spml figure calibration`` on a yeast run."""
import numpy as np
import pytest
import torch

from spmlkit.calibration import apply_temperatures, class_ece, fit_class_temperatures, \
    reliability
from spmlkit.cli import main
from spmlkit.metrics import partial_labels


def test_ece_by_hand():
    p = np.array([[0.9, 0.2], [0.8, 0.2], [0.3, 0.7], [0.1, 0.6]])
    y = np.array([[1, 0], [0, 0], [1, 1], [0, 1]])
    # 2 bins. class 0: [0.5, 1]: 2 rows, mean 0.85, rate 0.5 -> 0.35 * 2; [0, 0.5): mean 0.2,
    # rate 0.5 -> 0.3 * 2; ECE = (0.7 + 0.6) / 4. class 1: low bin mean 0.2 rate 0 -> 0.4,
    # high bin mean 0.65 rate 1 -> 0.7; ECE = 1.1 / 4
    assert class_ece(p, y, bins=2) == pytest.approx([1.3 / 4, 1.1 / 4])
    r = reliability(p, y, bins=2)
    assert r["count"].tolist() == [4, 4]
    assert r["ece"] == pytest.approx((abs(1 - 1.1) + abs(3 - 2.9)) / 8)
    # partial labels: each class over its known rows (row 1 of class 0 unknown)
    part = partial_labels([[1, -1], [0, -1], [1, 1], [-1, 1]])
    assert class_ece(p, part, bins=2)[0] == pytest.approx((abs(0.9 - 1) + abs(0.4 - 1)) / 3)


def test_temperature_recovers_a_known_scale():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, size=(20000, 2))
    y = (rng.random(logits.shape) < 1 / (1 + np.exp(-logits))).astype(np.uint8)
    overconfident = 1 / (1 + np.exp(-logits * np.array([3.0, 0.5])))  # T should be 3 and 0.5
    t = fit_class_temperatures(overconfident, y)
    assert t == pytest.approx([3.0, 0.5], rel=0.05)
    fixed = apply_temperatures(overconfident, t)
    assert (class_ece(fixed, y) < class_ece(overconfident, y)).all()
    assert class_ece(fixed, y).max() < 0.02


def test_calibration_figure_of_a_yeast_run(tmp_path, capsys):
    torch.set_num_threads(1)
    assert main(["train", "--loss", "an", "--epochs", "5", "--quiet", "--out",
                 str(tmp_path / "runs")]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    capsys.readouterr()
    out = tmp_path / "cal.png"
    assert main(["figure", "calibration", str(run), "--temperature", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert out.stat().st_size > 10_000 and "T (val)" in table and "Class14" in table
    pred = np.load(run / "predictions.npz")
    raw = class_ece(pred["probs_test"], pred["y_test"])
    first = table.splitlines()[2].split()
    assert first[0] == "Class1" and float(first[1]) == pytest.approx(raw[0], abs=1e-4)


def test_a_class_without_a_val_positive_is_named_not_silently_kept_at_t_1():
    from spmlkit.calibration import unfitted_classes
    from spmlkit.experiments.figures.calibration import calibration_of

    rng = np.random.default_rng(1)
    p = rng.uniform(0.05, 0.95, size=(40, 3))
    y = (rng.random((40, 3)) < p).astype(np.uint8)
    y_val = y.copy()
    y_val[:, 1] = 0  # class 1: no val positive, so no temperature can be fitted
    assert unfitted_classes(y_val) == [1]
    with pytest.warns(UserWarning,
                      match=r"no temperature fitted for 1 class\(es\) \(columns \[1\]"):
        t = fit_class_temperatures(p, y_val)
    assert t[1] == 1.0 and t[0] != 1.0
    cal = calibration_of(p, y_val, p, y, ["a", "b", "c"], bins=5, temperature=True)
    assert cal.unfitted == ["b"]
    table = cal.table()
    assert "nan" not in table  # the pooled row printed "T (val) nan"
    assert table.splitlines()[-1].startswith("T = 1 kept (no temperature fitted) for 1 class")
    assert table.splitlines()[-1].endswith(": b")


def test_bins_are_bounded():
    # a billion bins asked numpy for gigabytes and ended in its out-of-memory traceback
    from spmlkit.calibration import MAX_BINS

    p, y = [[0.9], [0.1]], [[1], [0]]
    assert class_ece(p, y, bins=MAX_BINS)[0] == pytest.approx(0.1)
    for bins in (10**9, MAX_BINS + 1, 0):
        with pytest.raises(ValueError, match=rf"bins must be a whole number in \[1, {MAX_BINS}\]"):
            class_ece(p, y, bins=bins)
