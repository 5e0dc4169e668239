"""The scikit-learn-style estimator: torch threads (as the CLI's) while it fits and predicts."""
import numpy as np
import pytest
import torch

import spmlkit.estimator as estimator_module
from spmlkit import SPMLClassifier
from spmlkit.labels import make_observed


def _toy(n=80, d=5, classes=3):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (x[:, :classes] > 0).astype(np.uint8)
    y[y.sum(1) == 0, 0] = 1
    return x, y


@pytest.fixture
def two_threads():
    """torch set to 2 threads, as a user's session would have it (all cores); restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_fit_and_predict_run_with_n_threads_and_restore_the_setting(two_threads, monkeypatch):
    seen = []
    real_fit, real_predict = estimator_module.fit_linear, estimator_module.predict_logits

    def fit(*a, **kw):
        seen.append(("fit", torch.get_num_threads()))
        return real_fit(*a, **kw)

    def predict(*a, **kw):
        seen.append(("predict", torch.get_num_threads()))
        return real_predict(*a, **kw)

    monkeypatch.setattr(estimator_module, "fit_linear", fit)
    monkeypatch.setattr(estimator_module, "predict_logits", predict)
    x, y = _toy()
    clf = SPMLClassifier(solver="adam", epochs=1, lr=1e-2)
    assert clf.get_params()["n_threads"] == 1          # the CLI's default (--threads 1)
    clf.fit(x, make_observed(y, "1p")).predict_proba(x)
    assert seen == [("fit", 1), ("predict", 1)]
    assert torch.get_num_threads() == 2                 # the caller's setting is back
    seen.clear()
    SPMLClassifier(solver="adam", epochs=1, lr=1e-2, n_threads=None).fit(x, make_observed(y, "1p"))
    assert seen == [("fit", 2)]                          # None: torch's own setting


def test_n_threads_is_checked_and_settable(two_threads):
    x, y = _toy()
    clf = SPMLClassifier(solver="adam", epochs=1).set_params(n_threads=0)
    with pytest.raises(ValueError, match="n_threads must be a whole number >= 1 or None, got 0"):
        clf.fit(x, make_observed(y, "1p"))
    assert torch.get_num_threads() == 2


# ---- a scikit-learn estimator (issue 19, section 2) --------------------------------------------

from scipy import sparse  # noqa: E402
from sklearn.base import clone, is_classifier  # noqa: E402
from sklearn.exceptions import NotFittedError  # noqa: E402
from sklearn.model_selection import (GridSearchCV, ParameterGrid, StratifiedKFold,  # noqa: E402
                                     cross_val_score)
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils import get_tags  # noqa: E402

from spmlkit.estimator import validation_scorer  # noqa: E402
from spmlkit.metrics import map_score, ranking_loss  # noqa: E402

FAST = dict(solver="adam", epochs=3, batch_size=16, lr=1e-2)


def _single_positive(y, seed=0):
    """One observed positive per row of the full labels ``y``: (1-D class index, matrix)."""
    z = make_observed(y, "1p", seed=seed)
    return z.argmax(axis=1), z


def test_is_a_multilabel_classifier_with_params_repr_and_clone():
    clf = SPMLClassifier(solver="adam", loss="epr", epochs=2)
    assert is_classifier(clf)
    tags = get_tags(clf)
    assert tags.classifier_tags.multi_label and tags.target_tags.multi_output
    assert tags.input_tags.sparse and not tags.input_tags.allow_nan
    assert repr(clf) == "SPMLClassifier(epochs=2, loss='epr', solver='adam')"
    x, y = _toy()
    clf.fit(x, _single_positive(y)[1])
    twin = clone(clf)
    assert twin.get_params() == clf.get_params() and not hasattr(twin, "model_")
    with pytest.raises(NotFittedError, match="not fitted yet"):
        twin.predict(x)


def test_a_1d_y_is_each_rows_single_observed_positive():
    x, y = _toy()
    index, z = _single_positive(y)
    names = np.array(["cat", "dog", "emu"])
    by_name = SPMLClassifier(**FAST).fit(x, names[index])
    by_matrix = SPMLClassifier(**FAST).fit(x, z)
    assert by_name.classes_.tolist() == ["cat", "dog", "emu"]
    assert by_matrix.classes_.tolist() == [0, 1, 2]
    # the same observed labels: the same model, multi-label output (N x L, int)
    np.testing.assert_array_equal(by_name.predict_proba(x), by_matrix.predict_proba(x))
    pred = by_name.predict(x)
    assert pred.shape == (len(x), 3) and pred.dtype == np.int64
    assert (pred.sum(axis=1) > 1).any()        # a row may get several labels
    assert len(by_name.fit_.history) == FAST["epochs"]
    # k (expected positives per row) defaults to the observed mean: 1 for single positives
    assert SPMLClassifier(loss="epr", **FAST).fit(x, names[index]).loss_.k == pytest.approx(1.0)


def test_nan_in_the_observed_matrix_is_unobserved():
    x, y = _toy()
    z = make_observed(y, "1p_1n", seed=0).astype(float)   # 1, -1 and 0
    with_nan = np.where(z == 0, np.nan, z)
    a = SPMLClassifier(**FAST).fit(x, z).predict_proba(x)
    b = SPMLClassifier(**FAST).fit(x, with_nan).predict_proba(x)
    np.testing.assert_array_equal(a, b)
    assert (z == -1).any()


@pytest.mark.parametrize("loss", ["epr", "bce"])
def test_nan_is_unobserved_under_a_loss_that_tells_unknown_from_negative(loss):
    """``an`` reads unobserved entries as negatives, so it cannot tell NaN read as unobserved
    from NaN read as negative; EPR and BCE on the observed entries can: NaN must train as 0."""
    x, y = _toy()
    z = make_observed(y, "1p_1n", seed=0).astype(float)   # 1, -1 and 0
    fit = lambda labels: SPMLClassifier(loss=loss, **FAST).fit(x, labels).predict_proba(x)  # noqa: E731
    unobserved, nan = fit(z), fit(np.where(z == 0, np.nan, z))
    negative = fit(np.where(z == 0, -1.0, z))
    np.testing.assert_array_equal(nan, unobserved)
    assert np.abs(negative - unobserved).max() > 1e-3  # the loss tells them apart


@pytest.mark.parametrize("y, match", [
    (np.linspace(0, 1, 80), "Unknown label type"),
    (np.r_[np.full(79, 1.0), np.nan], r"Input y contains NaN or infinity \(first at row 79"),
    (np.r_[np.inf, np.full(79, 1.0)], r"Input y contains NaN or infinity \(first at row 0"),
    (np.zeros(80, int), "1 class"),
    (np.full((80, 3), 0), "no observed positive"),
    (np.full((80, 3), 2), r"observed label matrix.*found \[2.0\]"),
    (np.zeros(79, int), "X has 80 rows but y has 79"),
    (None, "requires y to be passed"),
])
def test_bad_y_is_refused_with_a_message_naming_it(y, match):
    x, _ = _toy()
    with pytest.raises(ValueError, match=match):
        SPMLClassifier(**FAST).fit(x, y)


def test_a_failed_refit_leaves_the_estimator_unfitted_not_half_updated():
    x, y = _toy()
    clf = SPMLClassifier(**FAST).fit(x, _single_positive(y)[1])
    with pytest.raises(ValueError, match="1 class"):
        clf.fit(x[:, :2], np.zeros(len(x), int))
    assert not [n for n in vars(clf) if n.endswith("_")]
    with pytest.raises(NotFittedError):
        clf.predict(x)


def test_sample_weight_and_unknown_arguments_are_refused():
    x, y = _toy()
    z = _single_positive(y)[1]
    with pytest.raises(TypeError, match="does not take sample_weight"):
        SPMLClassifier(**FAST).fit(x, z, sample_weight=np.ones(len(x)))
    with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['x_val'\]"):
        SPMLClassifier(**FAST).fit(x, z, x_val=x)
    SPMLClassifier(**FAST).fit(x, z, sample_weight=None)   # no weights: nothing to refuse


def test_sparse_input_gives_the_dense_inputs_model():
    x, y = _toy()
    x[x < 0.3] = 0
    z = _single_positive(y)[1]
    dense = SPMLClassifier(**FAST).fit(x, z)
    for fmt in ("csr", "csc", "coo"):
        sp_clf = SPMLClassifier(**FAST).fit(getattr(sparse, fmt + "_matrix")(x), z)
        np.testing.assert_array_equal(sp_clf.predict_proba(sparse.csr_matrix(x)),
                                      dense.predict_proba(x))


def test_standardize_uses_fit_statistics_and_equals_a_scaler_pipeline():
    x, y = _toy()
    raw = x * np.array([1, 10, 100, 0.1, 5], dtype=np.float32) + 50
    z = _single_positive(y)[1]
    own = SPMLClassifier(**FAST).fit(raw, z)
    np.testing.assert_allclose(own.mean_, raw.astype(np.float64).mean(axis=0))
    np.testing.assert_allclose(own.scale_, raw.astype(np.float64).std(axis=0))
    pipe = make_pipeline(StandardScaler(), SPMLClassifier(standardize=False, **FAST)).fit(raw, z)
    np.testing.assert_allclose(own.predict_proba(raw), pipe.predict_proba(raw), atol=1e-4)
    off = SPMLClassifier(standardize=False, **FAST).fit(raw, z)
    assert off.mean_ is None and off.scale_ is None
    # a constant column has scale 1, not a division by zero
    const = np.c_[x, np.full(len(x), 3.0)]
    clf = SPMLClassifier(**FAST).fit(const, z)
    assert clf.scale_[-1] == 1.0 and np.isfinite(clf.predict_proba(const)).all()


def test_threshold_is_a_parameter_and_is_checked():
    x, y = _toy()
    z = _single_positive(y)[1]
    clf = SPMLClassifier(**FAST).fit(x, z)
    proba = clf.predict_proba(x)
    t = float(np.median(proba))
    clf.set_params(threshold=t)
    np.testing.assert_array_equal(clf.predict(x), (proba >= t).astype(int))
    clf.set_params(threshold=[0.2, 0.5, 0.8])
    np.testing.assert_array_equal(clf.predict(x), (proba >= [0.2, 0.5, 0.8]).astype(int))
    for bad in (1.5, [0.5, 0.5], "high"):
        with pytest.raises(ValueError, match="threshold must be a number in"):
            clf.set_params(threshold=bad).predict(x)


def test_feature_names_and_dataframe_labels():
    pd = pytest.importorskip("pandas")
    x, y = _toy()
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])])
    labels = pd.DataFrame(_single_positive(y)[1], columns=["red", "green", "blue"])
    clf = SPMLClassifier(**FAST).fit(frame, labels)
    assert clf.feature_names_in_.tolist() == list(frame.columns) and clf.n_features_in_ == 5
    assert clf.classes_.tolist() == ["red", "green", "blue"]
    with pytest.raises(ValueError, match="feature names"):
        clf.predict(frame[frame.columns[::-1]])


def test_score_is_map_against_full_labels_and_refuses_observed_ones():
    x, y = _toy()
    index, z = _single_positive(y)
    clf = SPMLClassifier(**FAST).fit(x, z)
    assert clf.score(x, y) == pytest.approx(map_score(clf.predict_proba(x), y))
    # 1-D labels: one true class per row
    one_hot = np.eye(3, dtype=np.uint8)[index]
    assert clf.score(x, index) == pytest.approx(map_score(clf.predict_proba(x), one_hot))
    with pytest.raises(ValueError, match="observed encoding.*validation_scorer"):
        clf.score(x, make_observed(y, "1p_1n", seed=0))
    # a DataFrame's columns are matched to classes_ by name (a 1-D y sorts classes_)
    pd = pytest.importorskip("pandas")
    named = SPMLClassifier(**FAST).fit(x, np.array(["c", "a", "b"])[index])
    frame = pd.DataFrame(y, columns=["c", "a", "b"])
    assert named.score(x, frame) == pytest.approx(
        map_score(named.predict_proba(x), y[:, [1, 2, 0]]))


def _masked_map_by_hand(proba, partial):
    """mAP x100 over each class's known rows (sklearn's AP), classes with a known positive."""
    from sklearn.metrics import average_precision_score

    aps = [average_precision_score(partial[known, j] == 1, proba[known, j])
           for j in range(partial.shape[1])
           for known in [partial[:, j] != 0] if (partial[known, j] == 1).any()]
    return 100 * float(np.mean(aps))


def test_partial_evaluation_labels_are_scored_over_their_known_entries():
    from spmlkit.metrics import partial_labels

    x, y = _toy(n=160)
    index, z = _single_positive(y)
    rng = np.random.default_rng(3)
    partial = np.where(y == 1, 1, -1).astype(np.float64)
    partial[rng.random(y.shape) < 0.4] = np.nan         # 40 % unknown, as an empty cell
    clf = SPMLClassifier(**FAST).fit(x[:100], z[:100])
    proba = clf.predict_proba(x[100:])
    wrapped = partial_labels(partial[100:])
    by_hand = _masked_map_by_hand(proba, np.asarray(wrapped))
    assert clf.score(x[100:], wrapped) == pytest.approx(by_hand, abs=1e-9)
    assert validation_scorer(x[100:], wrapped)(clf, None, None) == pytest.approx(by_hand)
    # unknowns read as negatives would give another number: the mask is what is scored
    as_negative = np.where(np.isnan(partial[100:]), 0, partial[100:] == 1).astype(np.uint8)
    assert abs(clf.score(x[100:], as_negative) - by_hand) > 0.01
    # columns named in another order keep the mask and follow classes_
    names = np.array(["c", "a", "b"])
    by_name = SPMLClassifier(**FAST).fit(x[:100], names[index[:100]])
    named = validation_scorer(x[100:], wrapped, classes=["c", "a", "b"])
    assert named(by_name, None, None) == pytest.approx(_masked_map_by_hand(
        by_name.predict_proba(x[100:]), np.asarray(wrapped)[:, [1, 2, 0]]))
    # partial labels wrapped from a DataFrame keep its column names: matched by name, also
    # after a pickle (GridSearchCV's worker processes get the scorer so)
    import pickle

    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(np.asarray(wrapped), columns=["c", "a", "b"])
    shuffled = partial_labels(frame[["b", "c", "a"]])
    assert pickle.loads(pickle.dumps(shuffled)).columns == ["b", "c", "a"]
    assert by_name.score(x[100:], shuffled) == pytest.approx(named(by_name, None, None))
    assert validation_scorer(x[100:], pickle.loads(pickle.dumps(shuffled)))(
        by_name, None, None) == pytest.approx(named(by_name, None, None))
    # a threshold metric goes through predict, scored on the known entries
    clf.set_params(threshold=1.0)
    assert validation_scorer(x[100:], wrapped, "micro_f1")(clf, None, None) == 0.0
    # unwrapped -1 / NaN is still refused, and says how to mean partial labels
    with pytest.raises(ValueError, match="partial_labels"):
        clf.score(x[100:], partial[100:])
    # partial val labels select the epoch on their masked mAP
    sel = SPMLClassifier(solver="adam", epochs=4, batch_size=16, lr=1e-2).fit(
        x[:100], z[:100], X_val=x[100:], Y_val=wrapped)
    best = sel.fit_.history[sel.fit_.best_epoch - 1]["val_map"]
    assert sel.score(x[100:], wrapped) == pytest.approx(best, abs=1e-6)


def test_score_without_a_known_positive_raises_naming_the_cause():
    # it returned NaN: in a GridSearchCV, a silent NaN score
    from spmlkit.metrics import partial_labels

    x, y = _toy(n=120)
    _, z = _single_positive(y)
    clf = SPMLClassifier(**FAST).fit(x[:100], z[:100])
    no_positive = -np.ones((20, y.shape[1]))
    no_positive[::2] = 0  # unknown
    with pytest.raises(ValueError, match=r"no class of score's y \(20 rows\) can be scored: none "
                       r"holds a known positive beside a known negative"):
        clf.score(x[100:], partial_labels(no_positive))
    with pytest.raises(ValueError, match="none holds a positive, so the mAP"):
        clf.score(x[100:], np.zeros((20, y.shape[1]), dtype=np.uint8))
    assert np.isfinite(clf.score(x[100:], y[100:]))


def test_validation_scorer_without_anything_to_score_raises_naming_the_cause():
    # as score: it returned NaN (mAP of no positive; ranking metrics of partial labels
    # without a known positive beside a known negative), silent in a GridSearchCV
    from spmlkit.metrics import partial_labels

    x, y = _toy(n=120)
    _, z = _single_positive(y)
    clf = SPMLClassifier(**FAST).fit(x[:100], z[:100])
    with pytest.raises(ValueError, match=r"validation_scorer: map of Y_val \(20 rows\) is "
                       r"undefined: nothing in it can be scored, it holds no positive"):
        validation_scorer(x[100:], np.zeros((20, y.shape[1]), dtype=np.uint8))(clf)
    no_positive = -np.ones((20, y.shape[1]))
    no_positive[::2] = 0
    with pytest.raises(ValueError, match="lrap of Y_val .* holds no known positive beside"):
        validation_scorer(x[100:], partial_labels(no_positive), metric="lrap")(clf)
    assert np.isfinite(validation_scorer(x[100:], y[100:])(clf))


def test_validation_scorer_scores_on_the_validation_rows_whatever_the_fold():
    x, y = _toy(n=120)
    index, z = _single_positive(y)
    clf = SPMLClassifier(**FAST).fit(x[:80], index[:80])
    scorer = validation_scorer(x[80:], y[80:])
    proba = clf.predict_proba(x[80:])
    assert scorer(clf, x[:5], index[:5]) == pytest.approx(map_score(proba, y[80:]))
    # lower-is-better metrics come back negated; threshold metrics use predict (threshold)
    assert validation_scorer(x[80:], y[80:], "ranking_loss")(clf, None, None) == \
        pytest.approx(-ranking_loss(proba, y[80:]))
    clf.set_params(threshold=1.0)                  # nothing predicted: micro F1 0
    assert validation_scorer(x[80:], y[80:], "micro_f1")(clf, None, None) == 0.0
    # columns named in another order are matched to classes_
    names = np.array(["c", "a", "b"])
    by_name = SPMLClassifier(**FAST).fit(x[:80], names[index[:80]])   # classes_ a, b, c
    named = validation_scorer(x[80:], y[80:], classes=["c", "a", "b"])
    assert by_name.classes_.tolist() == ["a", "b", "c"]
    assert named(by_name, None, None) == pytest.approx(map_score(
        by_name.predict_proba(x[80:]), y[80:][:, [1, 2, 0]]))
    with pytest.raises(ValueError, match="not fitted \\['d'\\], missing \\['c'\\]"):
        validation_scorer(x[80:], y[80:], classes=["d", "a", "b"])(by_name, None, None)
    with pytest.raises(ValueError, match="observed encoding"):
        validation_scorer(x[80:], make_observed(y[80:], "1p_1n"))(clf, None, None)
    with pytest.raises(ValueError, match="unknown metric"):
        validation_scorer(x[80:], y[80:], "accuracy")


@pytest.fixture(scope="module")
def yeast():
    """Yeast's train rows (features put back on other scales, so that standardising matters),
    each row's single observed positive as a class name (1-D y), and the fully labelled val
    rows."""
    pytest.importorskip("river")
    from spmlkit.loading import load_splits

    s = load_splits("yeast")
    scale = np.random.default_rng(0).uniform(0.1, 20, size=s.train.x.shape[1])
    names = np.array(s.train.class_names)
    return {"x": s.train.x * scale + 3, "y": names[s.observed.argmax(axis=1)],
            "x_val": s.val.x * scale + 3, "y_val": s.val.y, "classes": list(names)}


def test_yeast_grid_search_with_validation_scorer_selects_what_a_hand_loop_selects(yeast):
    x, y = yeast["x"], yeast["y"]
    scorer = validation_scorer(yeast["x_val"], yeast["y_val"], classes=yeast["classes"])
    pipe = make_pipeline(StandardScaler(),
                         SPMLClassifier(solver="adam", standardize=False, epochs=3, batch_size=64))
    grid = {"spmlclassifier__loss": ["an", "epr"], "spmlclassifier__lr": [1e-4, 1e-2]}
    cv = StratifiedKFold(3, shuffle=True, random_state=0)
    search = GridSearchCV(pipe, grid, scoring=scorer, cv=cv, error_score="raise").fit(x, y)

    # the same grid by hand: fit each fold's training rows, score on the val rows, mean
    y_val = yeast["y_val"][:, [yeast["classes"].index(c) for c in search.classes_]]
    hand = []
    for params in ParameterGrid(grid):
        scores = [map_score(clone(pipe).set_params(**params).fit(x[tr], y[tr])
                            .predict_proba(yeast["x_val"]), y_val)
                  for tr, _ in cv.split(x, y)]
        hand.append((float(np.mean(scores)), params))
    best_score, best_params = max(hand, key=lambda t: t[0])  # first of equals, as GridSearchCV
    np.testing.assert_allclose(search.cv_results_["mean_test_score"], [s for s, _ in hand],
                               rtol=1e-10)
    assert search.best_params_ == best_params
    print("hand loop:", [(round(s, 2), p) for s, p in hand])
    assert best_params == {"spmlclassifier__loss": "epr", "spmlclassifier__lr": 0.01}
    assert search.best_score_ == pytest.approx(best_score)
    assert len({round(s, 6) for s, _ in hand}) == len(hand)   # the grid points differ
    # the refitted best pipeline is scored like any fit
    assert scorer(search.best_estimator_, None, None) > hand[0][0]


def test_yeast_cross_val_score_and_the_standardize_parameter(yeast):
    x, y = yeast["x"], yeast["y"]
    scorer = validation_scorer(yeast["x_val"], yeast["y_val"], classes=yeast["classes"])
    cv = StratifiedKFold(3, shuffle=True, random_state=0)
    est = dict(solver="adam", epochs=3, batch_size=64, lr=1e-2)
    own = cross_val_score(SPMLClassifier(**est), x, y, cv=cv, scoring=scorer)
    piped = cross_val_score(make_pipeline(StandardScaler(), SPMLClassifier(standardize=False,
                                                                             **est)),
                            x, y, cv=cv, scoring=scorer)
    raw = cross_val_score(SPMLClassifier(standardize=False, **est), x, y, cv=cv, scoring=scorer)
    assert np.isfinite(own).all() and own.shape == (3,)
    np.testing.assert_allclose(own, piped, atol=1e-3)    # standardize=True == a scaler step
    assert own.mean() > raw.mean() + 1                   # unscaled features train worse
    # scored on the fold's own labels, the same fits look different: the partial-label catch
    observed = cross_val_score(SPMLClassifier(**est), x, y, cv=cv)
    assert np.isfinite(observed).all() and abs(observed.mean() - own.mean()) > 1


def test_weight_decay_is_a_searched_parameter_that_changes_the_head(yeast):
    """weight_decay (Adam's coupled L2 on the weights, not the bias) is a constructor
    parameter GridSearchCV searches; it shrinks the weights and changes the scores."""
    x, y = yeast["x"], yeast["y"]
    fits = {wd: SPMLClassifier(solver="adam", epochs=3, batch_size=64, lr=1e-2,
                               weight_decay=wd).fit(x, y)
            for wd in (0.0, 0.5)}
    norm = {wd: float(f.model_.weight.detach().norm()) for wd, f in fits.items()}
    assert norm[0.5] < 0.9 * norm[0.0]
    assert not np.allclose(fits[0.0].predict_proba(x), fits[0.5].predict_proba(x))
    scorer = validation_scorer(yeast["x_val"], yeast["y_val"], classes=yeast["classes"])
    search = GridSearchCV(SPMLClassifier(solver="adam", epochs=3, batch_size=64, lr=1e-2),
                          {"weight_decay": [0.0, 1e-2, 0.5]}, scoring=scorer, cv=2,
                          error_score="raise").fit(x, y)
    scores = search.cv_results_["mean_test_score"]
    assert len({round(s, 6) for s in scores}) == 3
    assert search.best_params_["weight_decay"] == [0.0, 1e-2, 0.5][int(np.argmax(scores))]
    with pytest.raises(ValueError, match="weight_decay must be a finite number >= 0"):
        SPMLClassifier(solver="adam", weight_decay=-1.0).fit(x, y)


def test_predict_counts_a_probability_exactly_on_the_threshold_as_a_label():
    x, y = _toy()
    index, _ = _single_positive(y)
    clf = SPMLClassifier(**FAST).fit(x, index)
    proba = clf.predict_proba(x)
    cut = float(proba[0, 0])
    pred = clf.predict(x, threshold=cut)
    assert pred[0, 0] == 1
    np.testing.assert_array_equal(pred, (proba >= cut).astype(np.int64))
    per_class = proba[0].tolist()  # one threshold per class: row 0 is positive everywhere
    assert clf.predict(x, threshold=per_class)[0].tolist() == [1] * len(per_class)


def test_pandas_nullable_labels_with_pd_na_are_unobserved():
    """An observed-label table of pandas' nullable dtypes (``read_csv(dtype_backend=
    "numpy_nullable")``): ``pd.NA`` is an empty cell, unobserved, as NaN is."""
    pd = pytest.importorskip("pandas")
    x = np.random.default_rng(0).normal(size=(30, 4))
    nullable = pd.DataFrame({"a": [1, pd.NA, pd.NA] * 10, "b": [pd.NA, 1, pd.NA] * 10,
                             "c": [pd.NA, pd.NA, 1] * 10}, dtype="Int64")
    a = SPMLClassifier(solver="adam", epochs=1).fit(x, nullable)
    b = SPMLClassifier(solver="adam", epochs=1).fit(x, nullable.astype("float64"))
    assert list(a.classes_) == ["a", "b", "c"]
    np.testing.assert_array_equal(a.predict_proba(x), b.predict_proba(x))


def test_label_frames_and_masked_arrays_and_the_ambiguous_zero():
    """fit reads a masked array's masked entries as unobserved; a matrix with 0s and NaN
    but no -1 is refused (its 0s would silently train as unknowns); a text or category
    column is a ValueError naming it; score takes nullable Int64 full labels."""
    pd = pytest.importorskip("pandas")
    x, y = _toy()
    index, z = _single_positive(y)
    nan_coded = np.where(z == 1, 1.0, np.nan)
    base = SPMLClassifier(**FAST).fit(x, nan_coded).predict_proba(x)
    masked = np.ma.masked_array(np.ones_like(nan_coded), mask=np.isnan(nan_coded))
    assert np.array_equal(SPMLClassifier(**FAST).fit(x, masked).predict_proba(x), base)
    ambiguous = nan_coded.copy()
    ambiguous[:10, 0] = np.where(ambiguous[:10, 0] == 1, 1, 0)
    with pytest.raises(ValueError, match="0s and empty \\(NaN\\) cells but no -1"):
        SPMLClassifier(**FAST).fit(x, ambiguous)
    with_negatives = ambiguous.copy()
    with_negatives[0, 1] = -1                                     # -1 present: 0 is unobserved
    SPMLClassifier(**FAST).fit(x, with_negatives)
    frame = pd.DataFrame(z, columns=["a", "b", "c"])
    with pytest.raises(ValueError, match="column 'b' holds category"):
        SPMLClassifier(**FAST).fit(x, frame.astype({"b": "category"}))
    clf = SPMLClassifier(**FAST).fit(x, frame)
    assert clf.score(x, pd.DataFrame(y, columns=["a", "b", "c"]).astype("Int64")) == \
        pytest.approx(map_score(clf.predict_proba(x), y))
    # a pandas sparse frame is read as a scipy sparse matrix is (densified), by name
    sparse_frame = pd.DataFrame.sparse.from_spmatrix(sparse.csr_matrix(y[:, ::-1]),
                                                     columns=["c", "b", "a"])
    assert clf.score(x, sparse_frame) == pytest.approx(map_score(clf.predict_proba(x), y))
