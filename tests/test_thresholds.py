"""The threshold rules (rcut, lcard, pcut, mcut) against hand-computed examples, and through
``spml predict --threshold-rule``."""
import json

import numpy as np
import pytest
import torch

from spmlkit.cli import main
from spmlkit.thresholds import apply_rule, lcard_threshold, mcut, pcut, rcut

P = np.array([[0.90, 0.80, 0.10, 0.05],
              [0.20, 0.70, 0.65, 0.10],
              [0.50, 0.50, 0.45, 0.40],
              [0.30, 0.20, 0.95, 0.90]])


def test_rcut_by_hand():
    assert rcut(P, 2).astype(int).tolist() == [[1, 1, 0, 0], [0, 1, 1, 0], [1, 1, 0, 0],
                                               [0, 0, 1, 1]]
    # k rounds, at least 1; the tie in row 2 goes to the lower column
    assert apply_rule("rcut", P, k=0.6).astype(int).tolist()[2] == [1, 0, 0, 0]
    # a run's k is fractional (EPR / ROLE's expected labels per row, 4.229 on yeast): 2.7 takes
    # 3 labels a row, not 2 (truncated)
    assert apply_rule("rcut", P, k=2.7).astype(int).tolist() == [[1, 1, 1, 0], [1, 1, 1, 0],
                                                                [1, 1, 1, 0], [1, 0, 1, 1]]
    with pytest.raises(ValueError, match="k must be a whole number in 1..4"):
        rcut(P, 5)


def test_lcard_by_hand():
    # mean labels per row at t: 0.65 -> 6/4 = 1.5, 0.5 -> 8/4 = 2.0, 0.45 -> 9/4 = 2.25
    assert lcard_threshold(P, 2.0) == 0.5
    assert lcard_threshold(P, 1.6) == 0.65  # |1.5 - 1.6| < |2.0 - 1.6|
    assert lcard_threshold(P, 1.75) == 0.65  # a tie (1.5 and 2.0): the higher threshold
    assert apply_rule("lcard", P, k=2.0).sum() == 8


def test_lcard_refuses_a_k_above_the_number_of_classes():
    # k = 100 on a few classes matched "every row every class" without a word; rcut refuses it
    assert apply_rule("lcard", P, k=float(P.shape[1])).all()
    for rule in ("lcard", "rcut"):
        with pytest.raises(ValueError, match=f"at most {P.shape[1]}|1..{P.shape[1]}"):
            apply_rule(rule, P, k=P.shape[1] + 1)


def test_pcut_by_hand():
    # priors x 4 rows: 1, 2, 0.4 -> 0, 0.5 -> 2 (round half to even: 0.5 * 4 = 2 exactly)
    got = pcut(P, [0.25, 0.5, 0.1, 0.5]).astype(int)
    assert got[:, 0].tolist() == [1, 0, 0, 0]
    assert got[:, 1].tolist() == [1, 1, 0, 0]
    assert got[:, 2].tolist() == [0, 0, 0, 0]
    assert got[:, 3].tolist() == [0, 0, 1, 1]
    # products with a fractional part of 0.5 and more round up: 0.4 x 4 = 1.6 -> 2, 2.6 -> 3,
    # 3.6 -> 4 (truncated: 1, 2, 3), 0.4 -> 0
    got = pcut(P, [0.4, 0.65, 0.9, 0.1]).astype(int)
    assert got.T.tolist() == [[1, 0, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="priors must be 4 rates"):
        pcut(P, [0.5, 0.5])


def test_mcut_by_hand():
    # row 0: gaps .1 .7 .05 -> above (0.8 + 0.1) / 2; row 1: .05 .55 .1 -> above 0.4;
    # row 2: 0 .05 .05 -> the first largest gap (0.5 | 0.45); row 3: .05 .6 .1 -> above 0.55
    assert mcut(P).astype(int).tolist() == [[1, 1, 0, 0], [0, 1, 1, 0], [1, 1, 0, 0],
                                            [0, 0, 1, 1]]


def test_rule_arguments_are_checked():
    with pytest.raises(ValueError, match="unknown threshold rule 'top'"):
        apply_rule("top", P)
    with pytest.raises(ValueError, match="rcut needs k"):
        apply_rule("rcut", P)
    with pytest.raises(ValueError, match="mcut does not use k"):
        apply_rule("mcut", P, k=2)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("rules")
    assert main(["train", "--loss", "an", "--epochs", "3", "--quiet", "--out",
                 str(out / "runs")]) == 0
    (folder,) = (out / "runs").iterdir()
    return folder, out


def test_predict_threshold_rules_on_a_yeast_run(run, tmp_path):
    """spml predict --threshold-rule on 50 new yeast rows, against values worked out from the
    run by hand (its k, the train labels' mean count, 4.208; its val labels' class rates), not
    against the library's own rules (a bug in a rule was the CLI's too)."""
    from spmlkit.loading import load_dataset

    folder, _ = run
    feats = tmp_path / "test.npy"  # raw rows, as new ones come (predict standardises them)
    np.save(feats, np.asarray(load_dataset("yeast").test.x[:50], dtype=np.float32))
    k = json.loads((folder / "config.json").read_text())["k"]
    assert k == pytest.approx(4.2083, abs=1e-4)
    stored = np.load(folder / "predictions.npz")
    for rule, extra in (("rcut", []), ("lcard", []), ("pcut", []), ("mcut", []),
                        ("rcut", ["--threshold-k", "3"])):
        out = tmp_path / f"{rule}{len(extra)}.json"
        assert main(["predict", str(folder), str(feats), "--threshold-rule", rule, *extra,
                     "--out", str(out)]) == 0
        got = json.loads(out.read_text())
        assert got["threshold"]["kind"] == "rule" and got["threshold"]["rule"] == rule
        probs = np.array([[r["scores"][c] for c in got["class_names"]]
                          for r in got["predictions"]])
        labels = np.array([[c in r["labels"] for c in got["class_names"]]
                           for r in got["predictions"]])
        given, left = np.where(labels, probs, np.inf), np.where(labels, -np.inf, probs)
        if rule == "rcut":  # each row's n highest scores: --threshold-k 3, or k 4.208 -> 4
            assert (labels.sum(axis=1) == (3 if extra else 4)).all()
            assert (given.min(axis=1) >= left.max(axis=1)).all()
        elif rule == "pcut":  # class j to its round(50 x val rate) highest-scored rows
            assert got["threshold"]["priors"] == pytest.approx(stored["y_val"].mean(axis=0))
            # 50 x rate: 17.46, 21.45, 20.56, 19.08, 14.05, 11.98, 9.02, 10.36, 3.25, 6.07,
            # 6.95, 38.61, 38.46, 0.59
            assert labels.sum(axis=0).tolist() == [17, 21, 21, 19, 14, 12, 9, 10, 3, 6, 7, 39,
                                                   38, 1]
            assert (given.min(axis=0) >= left.max(axis=0)).all()
        elif rule == "lcard":  # one threshold; the mean count closest to 4.208 that 50 rows
            assert labels.sum() == 210  # can have: 4.20 a row
            assert given.min() >= left.max()
        else:  # mcut: per row, the labels above its largest gap between sorted scores
            ranked = -np.sort(-probs, axis=1)
            assert (labels.sum(axis=1) == np.argmax(ranked[:, :-1] - ranked[:, 1:], axis=1)
                    + 1).all()
            assert (given.min(axis=1) > left.max(axis=1)).all()
    assert main(["predict", str(folder), str(feats), "--threshold-rule", "mcut",
                 "--threshold-k", "2"]) == 2
    for rule, bad in (("rcut", "-5"), ("rcut", "0"), ("rcut", "1.5"), ("rcut", "inf"),
                      ("lcard", "0"), ("lcard", "inf"), ("lcard", "100"), ("rcut", "100")):
        assert main(["predict", str(folder), str(feats), "--threshold-rule", rule,
                     "--threshold-k", bad]) == 2  # (a negative k gave one label a row)
    assert main(["predict", str(folder), str(feats), "--threshold-rule", "mcut",
                 "--threshold", "0.5"]) == 2
