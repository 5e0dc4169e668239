"""Multilabel-stratified splits and folds (iterative-stratification) for your own data."""
import numpy as np
import pytest

from spmlkit.loading import load_splits
from spmlkit.data.protocol import cole_split

pytest.importorskip("iterstrat")
from spmlkit.data.stratify import MultilabelFolds, stratified_split, stratified_test  # noqa: E402


def _rare_labels(seed=0, n=600, classes=12):
    rng = np.random.default_rng(seed)
    rates = np.geomspace(0.4, 0.01, classes)  # some classes with a handful of positives
    return (rng.random((n, classes)) < rates).astype(np.uint8)


def _worst_share_gap(y, idx):
    """The largest |class's share of positives in idx - idx's share of rows| over classes."""
    return float(np.max(np.abs(y[idx].sum(0) / np.maximum(y.sum(0), 1) - len(idx) / len(y))))


def test_stratified_split_spreads_rare_classes_better_than_a_random_one():
    y = _rare_labels()
    tr, va, te = stratified_split(y, (0.7, 0.1, 0.2), seed=0)
    assert sorted(np.r_[tr, va, te].tolist()) == list(range(len(y)))
    assert abs(len(te) - 120) <= 3 and abs(len(va) - 60) <= 3
    random_gaps = [_worst_share_gap(y, cole_split(len(y), 0.2, s)[1]) for s in range(10)]
    assert _worst_share_gap(y, te) < min(random_gaps)
    with pytest.raises(ValueError, match="summing to 1"):
        stratified_split(y, (0.7, 0.2, 0.2))


def test_folds_stratify_single_positives_and_observed_matrices_for_the_estimator():
    from sklearn.model_selection import cross_val_score

    from spmlkit.estimator import SPMLClassifier

    rng = np.random.default_rng(1)
    x = rng.normal(size=(90, 5)).astype(np.float32)
    single = np.arange(90) % 3
    for _, test in MultilabelFolds(3, seed=0).split(x, single):
        assert np.bincount(single[test]).tolist() == [10, 10, 10]
    observed = np.where(np.eye(3, dtype=np.int8)[single] == 1, 1, 0)
    for _, test in MultilabelFolds(3, seed=0).split(x, observed):
        assert (observed[test] == 1).sum(0).tolist() == [10, 10, 10]
    scores = cross_val_score(SPMLClassifier(solver="adam", epochs=2), x, single,
                             cv=MultilabelFolds(3, seed=0))
    assert len(scores) == 3 and np.isfinite(scores).all()


def test_tabular_split_stratified_carves_test_and_val_stratified(tmp_path):
    pd = pytest.importorskip("pandas")
    y = _rare_labels(2, n=400, classes=8)
    rng = np.random.default_rng(3)
    df = pd.DataFrame(rng.normal(size=(400, 4)), columns=[f"f{j}" for j in range(4)])
    for j in range(8):
        df[f"label_{j}"] = y[:, j]
    df.to_csv(tmp_path / "rows.csv", index=False)
    s = load_splits("tabular", "1p", path=str(tmp_path / "rows.csv"), labels="label_*",
                    split="stratified")
    want_test = stratified_test(y, 0.3, 1200)[1]
    assert s.meta["split"] == "stratified" and len(s.test) == len(want_test)
    assert np.array_equal(s.test.y, y[want_test])
    rest = stratified_test(y, 0.3, 1200)[0]
    assert np.array_equal(s.val.y, y[rest][stratified_test(y[rest], 0.2, 1200)[1]])
    with pytest.raises(ValueError, match="split must be one of"):
        load_splits("tabular", "1p", path=str(tmp_path / "rows.csv"), labels="label_*",
                    split="iterative")


@pytest.mark.parametrize("rows, part", [(1, "the test set carved out"),
                                        (3, "the val set split from the training rows")])
def test_stratified_split_of_too_few_rows_names_the_file_and_option(tmp_path, rows, part):
    """1 or 3 rows: "a fraction of 0.3 of 1 rows leaves an empty part", naming no file or
    option (and one label column ended in the stratifier's own "Got 'binary'" error)."""
    pd = pytest.importorskip("pandas")
    pd.DataFrame({"f1": np.arange(rows) / 10, "y": np.arange(rows) % 2}).to_csv(
        tmp_path / "few.csv", index=False)
    with pytest.raises(ValueError, match=rf"few.csv: {part} \(--data split=stratified, .*\): "
                                         rf"a fraction of .* leaves an empty part"):
        load_splits("tabular", "1p", path=str(tmp_path / "few.csv"), labels="y",
                    split="stratified")


def test_one_label_column_stratifies():
    y = (np.arange(40) % 4 == 0).astype(np.uint8)[:, None]  # 10 positives of 40
    rest, test = stratified_test(y, 0.3, 0)
    assert len(test) == 12 and y[test].sum() == 3 and len(rest) == 28
