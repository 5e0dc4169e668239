"""A scikit-learn estimator for the cached-feature (linear) path, and the scorer that evaluates
it on fully labelled rows (docs/guide/sklearn.md).

[`SPMLClassifier`][spmlkit.estimator.SPMLClassifier] is a scikit-learn multi-label classifier
(``BaseEstimator``, ``ClassifierMixin``, the tags of a multi-label classifier) trained from
*partially observed* labels. It passes scikit-learn's own estimator checks except those listed, each
with its reason, by `expected_failed_checks`.

The SPML catch: what ``fit`` receives are observed labels, so a cross-validation fold's ``y``
is partial too, and any score computed on it (``score``, ``scoring="average_precision"``)
counts the unobserved positives as negatives. `validation_scorer` scores every fit on
one validation set instead (through the whole Pipeline): fully labelled, or partially labelled
with its known negatives written as -1 and wrapped by `spmlkit.metrics.partial_labels`.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .engine import TrainConfig, fit_linear, predict_logits, torch_threads
from .labels import POSITIVE, label_values, observed_from_cells, validate_full_labels
from .losses import AssetRegularized, bind_groups, create_loss
from .metrics import METRICS, check_metric, higher_is_better, is_partial, map_score, metric_score


class SPMLClassifier(ClassifierMixin, BaseEstimator):
    """Linear multi-label classifier trained from partially observed labels.

    ``fit(X, y)`` takes features (N x D; dense, scipy sparse or a DataFrame) and the observed
    labels ``y`` in one of two forms:

    - **1-D** ``y`` (N class labels, any type): each row's *single observed positive* (the SPML
      setting). ``classes_`` are ``np.unique(y)``; nothing is known about the other classes of
      a row (they may be positive too). At least 2 classes.
    - **2-D** ``y`` (N x L): the observed label matrix, ``1`` positive, ``0`` unobserved, ``-1``
      observed negative; ``NaN`` (an empty cell) is unobserved too. ``classes_`` are the column
      names of a DataFrame, else ``0 .. L-1``.

    Either way the model is multi-label: ``predict`` returns an N x L 0/1 matrix whose columns
    are ``classes_`` (``classes_[row == 1]`` are a row's predicted labels) and
    ``predict_proba`` independent per-class probabilities (rows need not sum to 1).

    **Solved or trained.** By default (``solver="lbfgs"``) the head is *solved*: the whole
    training set at once, L-BFGS to the tolerance ``tol``, with an L2 penalty on the weights
    whose strength is scikit-learn's ``C`` (`spmlkit.engine.solve`): with ``loss="an"`` the
    model is ``OneVsRestClassifier(LogisticRegression(C=C))``'s, with unknown labels as
    negatives; every other smooth loss is a step beyond it at the same ``C``, and a loss whose
    terms follow the epoch runs in ``rounds``. ``C`` may be a sequence (a regularisation path,
    solved from the smallest C up, each solve warm-started): the value with the best val mAP on
    ``X_val`` / ``Y_val`` is kept (``path_`` records every one). ``solver="adam"`` trains with
    mini-batch Adam for ``epochs`` instead (the papers' protocol): then ``epochs``,
    ``batch_size``, ``lr``, ``early_stop`` and ``weight_decay`` apply, and the solver's ``C``,
    ``tol``, ``max_iter`` and ``rounds`` must stay at their defaults (each mode refuses the
    other's options rather than ignore them).

    With ``X_val`` / ``Y_val`` (full 0/1 labels, columns in ``classes_`` order, or 1-D class
    labels, or partial ones wrapped by `spmlkit.metrics.partial_labels`, scored over
    their known entries) the best value of the path (the best epoch with Adam) by val mAP is
    kept; otherwise the one C (the last epoch). They
    reach this estimator as given: in a Pipeline, earlier steps do not transform them (use
    ``standardize=True`` here rather than a scaler step when you pass them).

    Args:
        loss: a registered loss name (``spml list losses``).
        loss_params: the loss's hyperparameters.
        epochs: Adam's epochs (``solver="adam"`` only; default 25), as
            [`spmlkit.engine.TrainConfig`][spmlkit.engine.TrainConfig].
        batch_size: Adam's mini-batch rows (``solver="adam"`` only; default 8).
        lr: Adam's learning rate (``solver="adam"`` only; default 1e-3, as ``spml train``'s
            linear head: 1e-4 under-trains it).
        seed: seeds the head's initialisation, Adam's batch order, the solver's start and a
            loss's own draws (default 0).
        early_stop: Adam's early stopping, ``"none"`` (default), ``"patience:N"`` or
            ``"drop:X"`` (``solver="adam"`` only; `TrainConfig`).
        k: expected positives per example (EPR, ROLE); default: the mean number of observed
            positives per row of ``y`` (a lower bound; pass the real value if known).
        n_threads: torch intra-op threads while fitting and predicting (restored after), 1 by
            default as ``spml --threads``: a linear head on small batches gains nothing from
            more, and on a machine whose cores are busy torch's threads wait on each other
            (an order of magnitude slower was seen); ``None`` keeps torch's own setting.
        standardize: z-score the features with the statistics of the ``X`` given to ``fit``
            (``mean_``, ``scale_``: population std, 0 -> 1, as ``StandardScaler`` and the yeast
            loader), applied in every predict method and to ``X_val``. ``False`` leaves the
            features as they are (for example after a ``StandardScaler`` step of a Pipeline).
        threshold: ``predict``'s cut on the probabilities (``>=``), a number in [0, 1] or one
            per class; ``spml train`` picks thresholds on val, the estimator does not.
        weight_decay: L2 on the head's weights (not its bias), Adam's coupled decay
            (``TrainConfig.weight_decay``); 0 (default): none. A hyperparameter like any other:
            ``GridSearchCV(SPMLClassifier(solver="adam"), {"weight_decay": [0, 1e-3, 1e-2]})``.
        solver: ``"lbfgs"`` (default: solved, see above) or ``"adam"`` (trained).
        C: the inverse L2 strength of the solver (scikit-learn's; default 1.0), a number > 0
            or a sequence of them (a path, selected on ``X_val`` / ``Y_val``).
        tol: the solver's tolerance on the largest gradient entry (default 1e-5;
            `spmlkit.engine.solve`).
        max_iter: the solver's L-BFGS iterations per solve, at most (default 500).
        rounds: the solver's rounds for a loss whose terms follow the epoch (default 5).

    Fitted attributes: ``classes_``, ``n_classes_``, ``n_features_in_``,
    ``feature_names_in_`` (DataFrame input), ``mean_`` / ``scale_`` (None without
    ``standardize``), ``val_proba_`` / ``val_labels_`` (``X_val``'s probabilities and
    ``Y_val`` in ``classes_`` order, what ``predict_sets`` calibrates on; None without them),
    ``model_`` (the torch head), ``loss_``, ``fit_`` (the engine's `FitResult`: history,
    best epoch or best position on the path), ``path_`` (the solver's
    `spmlkit.engine.solve.PathResult`, None with Adam), ``C_`` (the C kept; None with
    Adam) and ``n_iter_`` (the solver's L-BFGS iterations over the path, or Adam's epochs).

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(60, 5)).astype("float32")
        >>> y = np.where(X[:, 0] > 0, "cat", "dog")       # each row's single observed positive
        >>> clf = SPMLClassifier(loss="an", C=0.1).fit(X, y)
        >>> clf.classes_.tolist(), clf.predict_proba(X[:2]).shape, clf.C_
        (['cat', 'dog'], (2, 2), 0.1)
        >>> SPMLClassifier(loss="an", solver="adam", epochs=3, lr=1e-2).fit(X, y).C_ is None
        True
    """

    def __init__(self, loss: str = "an", loss_params: dict | None = None, epochs: int = 25,
                 batch_size: int = 8, lr: float = 1e-3, seed: int = 0,
                 early_stop: str = "none", k: float | None = None,
                 n_threads: int | None = 1, standardize: bool = True, threshold=0.5,
                 weight_decay: float = 0.0, solver: str = "lbfgs", C=1.0,
                 tol: float = 1e-5, max_iter: int = 500, rounds: int = 5):
        self.loss = loss
        self.loss_params = loss_params
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.seed = seed
        self.early_stop = early_stop
        self.k = k
        self.n_threads = n_threads
        self.standardize = standardize
        self.threshold = threshold
        self.weight_decay = weight_decay
        self.solver = solver
        self.C = C
        self.tol = tol
        self.max_iter = max_iter
        self.rounds = rounds

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True    # 2-D y: the observed label matrix
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True      # 1-D y: single observed positives
        tags.input_tags.sparse = True              # densified (the engine holds dense rows)
        return tags

    # ---- fit -------------------------------------------------------------------------------

    def fit(self, X, y, X_val=None, Y_val=None, groups=None,
            **fit_params) -> "SPMLClassifier":
        """Train on features ``X`` and observed labels ``y`` (1-D single positives or the
        2-D observed matrix, see the class docstring); returns ``self``.

        ``groups`` (one label per row of ``X``, as scikit-learn's splitters name it) are the
        rows' groups for the L48 asset regulariser (``loss_params={"asset_alpha": 0.1}``,
        `spmlkit.losses.asset`; ``solver="adam"``). To keep groups apart in
        cross-validation, give them to the splitter (``GroupKFold``, or
        `spmlkit.data.stratify.MultilabelFolds`, whose ``split(X, y, groups)`` keeps them
        apart too).

        Raises:
            ValueError: ``y`` missing or not labels (continuous, NaN in a 1-D ``y``, values
                outside 1 / 0 / -1 / NaN in a 2-D one, fewer than 2 classes in a 1-D one, no
                observed positive at all); rows of ``X`` and ``y`` that differ; bad ``X``
                (NaN, inf, complex, not 2-D).
            TypeError: ``sample_weight`` (not supported: the SPML losses have no per-example
                weights; repeat rows to weight them) or another unknown argument.
        """
        _refuse_fit_params(fit_params)
        try:
            return self._fit(X, y, X_val, Y_val, groups)
        except BaseException:
            # a failed (re)fit leaves no mix of old and new fitted attributes: unfitted
            for name in [n for n in vars(self) if n.endswith("_") and not n.startswith("_")]:
                delattr(self, name)
            raise

    def _fit(self, X, y, X_val, Y_val, groups=None) -> "SPMLClassifier":
        if y is None:
            raise ValueError("SPMLClassifier requires y to be passed, but the target y is None "
                             "(the observed labels: 1-D single positives or the N x L matrix)")
        X = _dense(validate_data(self, X, accept_sparse=True, dtype=(np.float64, np.float32)))
        z, classes = _observed_from_y(y, len(X))
        if self.standardize:
            x64 = X.astype(np.float64, copy=False)
            self.mean_ = x64.mean(axis=0)
            scale = x64.std(axis=0)
            scale[scale == 0] = 1.0
            self.scale_ = scale
        else:
            self.mean_ = self.scale_ = None
        self.classes_ = classes
        self.n_classes_ = len(classes)
        x = self._features(X)
        xv = yv = None
        if X_val is not None or Y_val is not None:
            if X_val is None or Y_val is None:
                raise ValueError("fit: pass X_val and Y_val together (validation features and "
                                 "their full labels) or neither")
            xv = self._features(_dense(validate_data(self, X_val, reset=False, accept_sparse=True,
                                                     dtype=(np.float64, np.float32))))
            yv = self._eval_labels(Y_val, "Y_val")
            if len(yv) != len(xv):
                raise ValueError(f"fit: X_val has {len(xv)} rows, Y_val {len(yv)}")
        k = self.k if self.k is not None else float((z == POSITIVE).sum(axis=1).mean())
        solver = self._check_solver()
        loss = create_loss(self.loss, **(self.loss_params or {}))
        if groups is not None:
            if not isinstance(loss, AssetRegularized):
                raise ValueError("fit: groups are the rows' groups for the asset regulariser "
                                 "(loss_params asset_alpha > 0), which this loss does not "
                                 "have; to keep groups apart in cross-validation give them to "
                                 "the splitter (GroupKFold, MultilabelFolds().split(X, y, "
                                 "groups))")
            if len(groups) != len(x):
                raise ValueError(f"fit: {len(groups)} groups for {len(x)} rows of X")
            bind_groups(loss, groups)
        if solver == "lbfgs":
            from .engine.solve import solve_path

            with torch_threads(self.n_threads):
                self.model_, self.path_ = solve_path(
                    x, z, loss, x_val=xv, y_val=yv, c=self.C, k=k, seed=self.seed,
                    tol=self.tol, max_iter=self.max_iter, rounds=self.rounds)
            self.model_ = self.model_.double()  # predicts in the precision it was solved in
            self.fit_ = self.path_.fit_result()
            self.C_ = self.path_.c
            self.n_iter_ = max(1, sum(r.iterations for r in self.path_.records))
        else:
            config = TrainConfig(epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                                 seed=self.seed, early_stop=self.early_stop,
                                 weight_decay=self.weight_decay)
            with torch_threads(self.n_threads):
                self.model_, self.fit_ = fit_linear(x, z, loss, config, x_val=xv, y_val=yv,
                                                    k=k)
            self.path_ = self.C_ = None
            self.n_iter_ = len(self.fit_.history)
        self.loss_ = loss
        # what predict_sets calibrates on by default: val's probabilities and labels
        self.val_proba_ = None if xv is None else self.predict_proba(X_val)
        self.val_labels_ = yv
        return self

    def _check_solver(self) -> str:
        """The solver, its options checked: each mode refuses the other's options set away
        from their defaults (an option that does nothing is an error, not ignored)."""
        if self.solver not in ("lbfgs", "adam"):
            raise ValueError(f"solver must be 'lbfgs' (solved on the whole training set) or "
                             f"'adam' (trained in mini-batches), got {self.solver!r}")
        other = _ADAM_ONLY if self.solver == "lbfgs" else _SOLVER_ONLY
        changed = [f"{name}={getattr(self, name)!r}" for name, default in other.items()
                   if not _same_value(getattr(self, name), default)]
        if changed:
            mode, use = ("solver='lbfgs' solves the head; it does not use",
                         "solver='adam' to train with them") if self.solver == "lbfgs" else \
                ("solver='adam' trains with Adam; it does not use", "solver='lbfgs' (the "
                 "default) for the solver's options")
            raise ValueError(f"{mode} {', '.join(changed)}: pass {use} (C sets the solver's L2 "
                             f"strength, weight_decay Adam's)")
        return self.solver

    # ---- predict ---------------------------------------------------------------------------

    def _features(self, X: np.ndarray) -> np.ndarray:
        """``X`` (validated, dense) standardised as fitted, as a writable float32 array."""
        if self.mean_ is not None:
            X = (X.astype(np.float64, copy=False) - self.mean_) / self.scale_
        X = np.asarray(X, dtype=np.float32)
        return X if X.flags.writeable and X.flags.c_contiguous else np.ascontiguousarray(X).copy()

    def decision_function(self, X) -> np.ndarray:
        """Logits, N x L (float64; columns ``classes_``)."""
        check_is_fitted(self)
        X = _dense(validate_data(self, X, reset=False, accept_sparse=True,
                                 dtype=(np.float64, np.float32)))
        x = torch.from_numpy(self._features(X))
        with torch_threads(self.n_threads):
            if self.path_ is None:
                return predict_logits(self.model_, x).numpy().astype(np.float64)
            with torch.no_grad():  # the solved head in float64: each row's logits its own
                return self.model_(x.double()).numpy()

    def predict_proba(self, X) -> np.ndarray:
        """Per-class probabilities, N x L (independent sigmoids; rows need not sum to 1)."""
        return expit(self.decision_function(X))

    def predict(self, X, threshold=None) -> np.ndarray:
        """0/1 label matrix N x L (int64, columns ``classes_``): probability >= ``threshold``
        (default: the ``threshold`` parameter; a number in [0, 1] or one per class)."""
        proba = self.predict_proba(X)
        t = self._threshold(self.threshold if threshold is None else threshold)
        return (proba >= t).astype(np.int64)

    def predict_sets(self, X, coverage: float = 0.9, X_cal=None, Y_cal=None) -> np.ndarray:
        """Label sets with a stated coverage: a 0/1 matrix N x L (int64, columns ``classes_``,
        as ``predict``) whose column j holds, for rows where class j is a true positive, a share
        of at least ``coverage`` of them (per class, over the draw of the calibration and new
        rows; `spmlkit.coverage`: split-conformal thresholds, one per class, and the
        assumption the guarantee rests on).

        The thresholds are calibrated on ``X_cal`` / ``Y_cal`` (raw features as ``X``; labels
        full 0/1 N x L or 1-D class labels in ``classes_``, each row's single observed
        positive, or partial ones wrapped by `spmlkit.metrics.partial_labels`: their
        positives, known positives or observed positives calibrate), by default the
        ``X_val`` / ``Y_val`` given to ``fit``: rows the model was not trained on (the same
        rows also chose C; a separate calibration split is cleaner). Classes with fewer
        calibration positives than the coverage needs (`spmlkit.coverage.min_positives`: 9 at
        0.9) are in every set, with a warning naming them.

        Raises:
            ValueError: a coverage outside (0, 1); no calibration rows (neither given nor
                passed to ``fit``); ``X_cal`` without ``Y_cal`` or rows that differ; labels
                that do not fit ``classes_``.

        Example:
            >>> import numpy as np
            >>> rng = np.random.default_rng(0)
            >>> X = rng.normal(size=(400, 4)); Y = (X[:, :3] > 0).astype(int)
            >>> y = Y.argmax(axis=1)   # one observed positive per row
            >>> clf = SPMLClassifier(C=0.1).fit(X[:200], y[:200], X_val=X[200:300],
            ...                                 Y_val=Y[200:300])
            >>> sets = clf.predict_sets(X[300:], coverage=0.9)
            >>> sets.shape, bool((sets[Y[300:] == 1].mean() >= 0.8))
            ((100, 3), True)
        """
        import warnings

        from .coverage import check_coverage, coverage_thresholds, min_positives

        check_is_fitted(self)
        coverage = check_coverage(coverage, "predict_sets: coverage")
        if (X_cal is None) != (Y_cal is None):
            raise ValueError("predict_sets: pass X_cal and Y_cal together (calibration "
                             "features and their labels) or neither (fit's X_val / Y_val)")
        if X_cal is None:
            if getattr(self, "val_proba_", None) is None:
                raise ValueError("predict_sets needs calibration rows the model was not "
                                 "trained on: pass X_cal and Y_cal, or fit with X_val and "
                                 "Y_val")
            p_cal, y_cal = self.val_proba_, self.val_labels_
        else:
            y_cal = self._eval_labels(Y_cal, "predict_sets: Y_cal")
            p_cal = self.predict_proba(X_cal)
        if len(p_cal) != len(y_cal):
            raise ValueError(f"predict_sets: X_cal has {len(p_cal)} rows, Y_cal {len(y_cal)}")
        cal = coverage_thresholds(p_cal, np.asarray(y_cal), coverage)
        if len(cal.always):
            names = [str(self.classes_[j]) for j in cal.always[:5]]
            warnings.warn(f"predict_sets: {len(cal.always)} class(es) have fewer than "
                          f"{min_positives(coverage)} calibration positives, too few for "
                          f"coverage {coverage:g}: they are in every set ({', '.join(names)}"
                          f"{', ...' if len(cal.always) > 5 else ''})", stacklevel=2)
        return cal.apply(self.predict_proba(X)).astype(np.int64)

    def _threshold(self, value) -> np.ndarray:
        t = np.asarray(value, dtype=np.float64) if _numeric(value) else None
        if t is None or t.ndim > 1 or (t.ndim == 1 and t.shape[0] != self.n_classes_) \
                or not np.all((t >= 0) & (t <= 1)):
            raise ValueError(f"threshold must be a number in [0, 1] or {self.n_classes_} of "
                             f"them (one per class), got {value!r}")
        return t

    def score(self, X, y) -> float:
        """Mean average precision (x100, over the classes with a positive in ``y``; as
        ``spml``'s tables) of ``predict_proba(X)`` against ``y``: full labels (a 0/1 N x L
        matrix, or 1-D class labels, one true class per row), or partial ones wrapped by
        `spmlkit.metrics.partial_labels` (1 / -1 known, 0 or NaN unknown), scored
        over their known entries as ``spml`` scores a partial test set.

        In an SPML cross-validation the fold's ``y`` are the observed labels, not the full
        ones: use `validation_scorer` there.

        Raises:
            ValueError: ``y`` holds -1 or NaN without being wrapped as partial labels (it
                could be the observed encoding of ``fit``), or does not fit ``classes_``; or
                no class of ``y`` can be scored (no positive, or partial labels with no known
                negative beside their positives): the mAP would be NaN, a silent NaN score in
                a ``GridSearchCV``.
        """
        y = self._eval_labels(y, "score's y")
        value = map_score(self.predict_proba(X), y)
        if np.isnan(value):
            why = "a known positive beside a known negative" if is_partial(y) else "a positive"
            raise ValueError(f"no class of score's y ({len(y)} rows) can be scored: none holds "
                             f"{why}, so the mAP (over the classes that hold one) is undefined "
                             f"(a NaN score would pass a grid search without a word); score "
                             f"on rows that hold positives")
        return value

    def _eval_labels(self, y, where: str) -> np.ndarray:
        """Evaluation labels N x L in ``classes_`` order: full (uint8) from a 0/1 matrix or
        1-D labels, or `PartialLabels` kept partial."""
        check_is_fitted(self)
        return eval_labels(y, self.classes_, where)


def eval_labels(y, classes, where: str = "labels", columns=None) -> np.ndarray:
    """Evaluation labels whose columns are ``classes``: full 0/1 labels (N x L, uint8) from a
    0/1 matrix or 1-D class labels (each row's one true class), or
    `spmlkit.metrics.PartialLabels` (1 / -1 known, 0 unknown) kept partial, with its
    mask.

    A matrix's columns are ``columns`` (default: a DataFrame's column names), put in
    ``classes`` order; without names they must already be in ``classes`` order.

    Raises:
        ValueError: -1 or NaN in labels not wrapped as partial (the observed encoding), other
            values, columns that do not fit ``classes`` (a class the estimator never saw, or
            one it has that ``y`` lacks), 1-D labels outside ``classes`` (each named).
    """
    if columns is None and getattr(y, "columns", None) is not None:
        columns = list(y.columns)
    partial = is_partial(y)
    arr = y if partial else np.asarray(label_values(y, where))
    classes = np.asarray(classes)
    if arr.ndim == 1:
        pos = {c: j for j, c in enumerate(classes.tolist())}
        unknown = [v for v in dict.fromkeys(arr.tolist()) if v not in pos]
        if unknown:
            raise ValueError(f"{where}: 1-D labels {unknown[:5]} are not among the fitted "
                             f"classes {classes.tolist()[:10]}")
        out = np.zeros((len(arr), len(classes)), dtype=np.uint8)
        out[np.arange(len(arr)), [pos[v] for v in arr.tolist()]] = 1
        return out
    if not partial and arr.ndim == 2 and np.issubdtype(arr.dtype, np.number) and \
            ((arr == -1).any() or np.isnan(arr.astype(np.float64)).any()):
        raise ValueError(f"{where} must be full labels (1 positive, 0 negative) or partial "
                         f"ones wrapped by spmlkit.metrics.partial_labels(y) (1 / -1 "
                         f"known, 0 or NaN unknown); it holds -1 or NaN unwrapped, which is "
                         f"also fit's observed encoding (a fold's observed labels cannot score "
                         f"a model: spmlkit.estimator.validation_scorer)")
    out = arr if partial else validate_full_labels(arr, where)
    if columns is not None:
        names = list(columns)
        if len(names) != out.shape[1] or len(set(names)) != len(names):
            raise ValueError(f"{where}: {len(names)} column names (duplicates: "
                             f"{sorted({str(c) for c in names if names.count(c) > 1})}) for "
                             f"{out.shape[1]} columns")
        have, want = set(names), set(classes.tolist())
        if have != want:
            raise ValueError(f"{where}: its classes and the estimator's differ: not fitted "
                             f"{sorted(map(str, have - want))[:5]}, missing "
                             f"{sorted(map(str, want - have))[:5]} (a training fold without a "
                             f"class knows fewer classes: stratify the folds or pass a 2-D y)")
        out = out[:, [names.index(c) for c in classes.tolist()]]
    if out.shape[1] != len(classes):
        raise ValueError(f"{where} has {out.shape[1]} columns; the estimator has "
                         f"{len(classes)} classes (the columns are classes_, in that order, or "
                         f"name them: a DataFrame or columns=)")
    return out


#: the options only Adam reads, and only the solver reads, with their defaults
_ADAM_ONLY = {"epochs": 25, "batch_size": 8, "lr": 1e-3, "early_stop": "none",
              "weight_decay": 0.0}
_SOLVER_ONLY = {"C": 1.0, "tol": 1e-5, "max_iter": 500, "rounds": 5}


def _same_value(value, default) -> bool:
    try:
        return bool(value == default) and type(value) is not bool
    except (TypeError, ValueError):  # an array: not the default
        return False


def _numeric(value) -> bool:
    try:
        np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, (str, bytes, bool))


def _refuse_fit_params(fit_params: dict) -> None:
    if fit_params.get("sample_weight") is not None:
        raise TypeError("SPMLClassifier.fit does not take sample_weight: the SPML losses have "
                        "no per-example weights (repeat rows to weight them)")
    extra = sorted(k for k in fit_params if k != "sample_weight")
    if extra:
        raise TypeError(f"SPMLClassifier.fit got unexpected argument(s) {extra}; it takes X, y, "
                        f"X_val, Y_val")


def _dense(X) -> np.ndarray:
    """Validated ``X`` as a dense array (sparse input is densified: the engine holds dense
    rows in memory)."""
    return X.toarray() if sp.issparse(X) else X


def _observed_from_y(y, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(z, classes)``: the observed matrix (int8, 1 / 0 / -1) and the classes, from a 1-D
    ``y`` of single positives or a 2-D observed matrix (NaN = unobserved)."""
    columns = getattr(y, "columns", None)
    # pandas' nullable columns (Int64, boolean, Float64): pd.NA -> NaN; masked entries -> NaN
    arr = np.asarray(label_values(y, "y"))
    if arr.ndim not in (1, 2):
        raise ValueError(f"y must be 1-D (each row's observed positive) or 2-D (the observed "
                         f"label matrix), got shape {arr.shape}")
    if len(arr) != n_rows:
        raise ValueError(f"X has {n_rows} rows but y has {len(arr)}: each row of X needs its "
                         f"labels")
    if arr.ndim == 1:
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            row = int(np.flatnonzero(~np.isfinite(arr))[0])
            raise ValueError(f"Input y contains NaN or infinity (first at row {row}): a 1-D y "
                             f"holds each row's observed positive class; rows with nothing "
                             f"observed belong in a 2-D observed matrix (rows of 0 / NaN)")
        check_classification_targets(arr)   # continuous -> "Unknown label type", NaN refused
        classes, index = np.unique(arr, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(f"y holds 1 class ({classes.tolist()}): a 1-D y (each row's single "
                             f"observed positive) needs at least 2 classes")
        z = np.zeros((n_rows, len(classes)), dtype=np.int8)
        z[np.arange(n_rows), index.ravel()] = POSITIVE
        return z, classes
    where = "y (the observed label matrix: 1 positive, 0 or NaN unobserved, -1 negative)"
    z = observed_from_cells(arr, where)   # NaN: unobserved, as 0
    if not (z == POSITIVE).any():
        raise ValueError(f"{where} holds no observed positive: there is nothing to learn "
                         f"from")
    classes = np.asarray(list(columns)) if columns is not None else np.arange(z.shape[1])
    return z, classes


# ---- the validation-set scorer ----------------------------------------------------------------

class ValidationScorer:
    """A scikit-learn scorer that ignores the fold's (partial) labels and scores the fitted
    estimator (or Pipeline) on one fully labelled validation set: ``scorer(estimator, X, y)``
    returns ``metric(estimator.predict_proba(X_val), Y_val)``.

    Made by `validation_scorer`; pass it as ``scoring=`` to ``cross_val_score``,
    ``cross_validate`` or ``GridSearchCV``.
    """

    def __init__(self, X_val, Y_val, metric: str = "map", classes=None):
        self.X_val = X_val
        self.Y_val = Y_val
        self.metric = check_metric(metric)
        self.classes = None if classes is None else list(classes)

    def __call__(self, estimator, X=None, y=None, **_) -> float:
        classes = getattr(estimator, "classes_", None)
        if classes is None:
            raise ValueError("validation_scorer: the estimator has no classes_ (is it fitted?)")
        y_val = eval_labels(self.Y_val, classes, "validation_scorer's Y_val", self.classes)
        if METRICS[self.metric].needs_threshold:  # the estimator's own cut (its threshold)
            scores = np.asarray(estimator.predict(self.X_val), dtype=np.float64)
        else:
            scores = np.asarray(estimator.predict_proba(self.X_val), dtype=np.float64)
        if scores.shape != y_val.shape:
            raise ValueError(f"validation_scorer: the estimator predicts {scores.shape} for "
                             f"X_val but Y_val is {y_val.shape}")
        value = metric_score(self.metric, scores, y_val)
        if np.isnan(value):
            why = "known positive beside a known negative" if is_partial(y_val) \
                else "positive"
            raise ValueError(f"validation_scorer: {self.metric} of Y_val ({len(y_val)} rows) "
                             f"is undefined: nothing in it can be scored, it holds no {why} "
                             f"(a NaN score would pass a grid search without a word); give "
                             f"validation rows that hold positives")
        return float(value if higher_is_better(self.metric) else -value)

    def __repr__(self) -> str:
        return (f"validation_scorer(X_val: {np.shape(self.X_val)}, Y_val: "
                f"{np.shape(self.Y_val)}, metric={self.metric!r})")


def validation_scorer(X_val, Y_val, metric: str = "map", classes=None) -> ValidationScorer:
    """A scorer that evaluates on fully labelled validation rows, whatever fold was trained.

    ``X_val``: raw features (what the Pipeline or estimator takes; its ``predict_proba``
    transforms them). ``Y_val``: full 0/1 labels, N_val x L, or 1-D class labels (one true
    class per row), or partial labels wrapped by `spmlkit.metrics.partial_labels`
    (1 / -1 known, 0 or NaN unknown: each metric over the known entries, as ``spml`` scores a
    partial split). ``classes``: the names of ``Y_val``'s columns (default: a DataFrame's
    column names), matched to the fitted ``classes_`` (a 1-D ``y`` gives them sorted, as
    ``np.unique``); without names the columns must be in ``classes_`` order. ``metric``: one
    of `spmlkit.metrics.METRICS` (mAP x100 by default); lower-is-better metrics come
    back negated, as scikit-learn's ``neg_*`` scorers, and the threshold metrics (F1,
    Hamming) use the estimator's ``predict`` (its ``threshold``).

    Raises:
        ValueError: (when called) ``Y_val`` does not fit the estimator's ``classes_``, or
            nothing in it can be scored (no positive; partial labels without a known positive
            beside a known negative): the metric would be NaN, a silent NaN score in a
            ``GridSearchCV``, as `SPMLClassifier.score` says too.

    Example:
        >>> import numpy as np
        >>> from sklearn.model_selection import cross_val_score
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(90, 4)); Y = (X[:, :3] > 0).astype(int)
        >>> y = Y.argmax(axis=1)   # a single observed positive per row (rows of Y with none: 0)
        >>> scorer = validation_scorer(X[60:], Y[60:])
        >>> s = cross_val_score(SPMLClassifier(C=0.1), X[:60], y[:60], cv=3,
        ...                     scoring=scorer)
        >>> s.shape, bool(np.isfinite(s).all())
        ((3,), True)
    """
    return ValidationScorer(X_val, Y_val, metric, classes)


# ---- scikit-learn's estimator checks ----------------------------------------------------------

_ONE_D_MULTILABEL = ("a 1-D y is each row's single observed positive of a multi-label problem: "
                     "predict returns the N x L 0/1 label matrix and decision_function / "
                     "predict_proba one independent column per class, where the check expects "
                     "one class per row")

#: scikit-learn checks that cannot apply to an estimator learning from partial labels
#: (each fails at the assertion named in its reason; tests/test_estimator_checks.py runs them
#: with xfail_strict, so one that starts passing is reported)
EXPECTED_FAILED_CHECKS = {
    "check_classifiers_train": _ONE_D_MULTILABEL + " (it asserts predict's shape == (n,), then "
                               "probabilities summing to 1 over the classes)",
    "check_classifiers_classes": _ONE_D_MULTILABEL + " (it indexes classes_ with "
                                 "decision_function(X).ravel() > 0 and compares with predict)",
    "check_decision_proba_consistency": _ONE_D_MULTILABEL + " (it ranks decision_function(X) "
                                        "as one score per row against predict_proba(X)[:, 1])",
    "check_estimator_sparse_array": _ONE_D_MULTILABEL + " (it asserts predict's shape == (n,) "
                                    "after fitting sparse X; sparse input itself is accepted "
                                    "and gives the dense input's model: test_estimator.py)",
    "check_estimator_sparse_matrix": _ONE_D_MULTILABEL + " (as check_estimator_sparse_array, "
                                     "with scipy sparse matrices)",
    "check_supervised_y_2d": "a 2-D y is the observed label matrix (1 / 0 / -1, NaN unobserved), "
                             "not a column of class ids: y[:, None] with ids 0..2 is refused "
                             "(2 is no observed value), where the check expects it read as the "
                             "1-D y",
}


def expected_failed_checks(estimator) -> dict[str, str]:
    """``{check name: reason}``: the scikit-learn estimator checks that
    [`SPMLClassifier`][spmlkit.estimator.SPMLClassifier] fails by design (pass it to
    ``parametrize_with_checks`` or
    ``check_estimator`` as ``expected_failed_checks=``)."""
    return dict(EXPECTED_FAILED_CHECKS) if isinstance(estimator, SPMLClassifier) else {}


__all__ = ["SPMLClassifier", "ValidationScorer", "validation_scorer", "expected_failed_checks",
           "eval_labels", "EXPECTED_FAILED_CHECKS"]
