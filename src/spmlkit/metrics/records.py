"""The metric records: every metric a run reports and a selection can use, one `Metric` each in
`METRICS`, registered with `register_metric` (the CLI, the tables, the docs' metric reference,
the generated tests and the scoring of full and partial labels all read the record).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .ap import map_score, micro_average_precision, weighted_average_precision
from .partial import PARTIAL_RULES
from .ranking import (_ranking_metrics, _top_k_metrics, _top_k_record, coverage_error,
                      label_ranking_average_precision, normalised_coverage, one_error,
                      ranking_loss)
from .thresholded import _f1_pair, hamming_loss, macro_f1, micro_f1

#: the one threshold policy of a run's thresholded numbers (F1s, Hamming loss): at every epoch
#: and in the result, the global threshold that maximises micro-F1 on the val split
#: (`best_global_threshold`), the threshold ``spml predict`` applies by default
THRESHOLD_POLICY = "the global threshold chosen on val (max val micro-F1), as spml predict uses"


def _no_setting(fn: Callable) -> Callable:
    """``fn(probs, y)`` as a record's ``fn(probs, y, setting)`` (a metric no setting changes)."""
    def record(probs, y, _setting=None) -> float:
        return fn(probs, y)
    record.__doc__ = f"`{fn.__name__}`"
    return record


# ---- the metric records: every metric one record ------------------------------------------------
def _sklearn_map(y, x) -> float:
    """100 * mean(average_precision_score(y[:, j], x[:, j]) for the classes j with a positive)"""
    from sklearn.metrics import average_precision_score

    has = np.asarray(y).sum(axis=0) > 0
    if not has.any():
        return float("nan")
    return 100.0 * float(np.mean([average_precision_score(y[:, j], x[:, j])
                                  for j in np.flatnonzero(has)]))


def _sklearn(name: str, after: Callable | None = None, **kwargs) -> Callable:
    """``sklearn.metrics.<name>(y, x, **kwargs)`` (then ``after(value, L)``), imported on call."""
    def counterpart(y, x) -> float:
        import sklearn.metrics

        value = float(getattr(sklearn.metrics, name)(y, x, **kwargs))
        return value if after is None else after(value, np.shape(y)[1])

    shown = ", ".join(["y", "x", *(f"{k}={v!r}" for k, v in kwargs.items())])
    counterpart.__doc__ = f"{name}({shown})" + ("" if after is None else after.__doc__)
    return counterpart


def _per_label_minus_one(value: float, num_labels: int) -> float:
    """, minus 1, over L"""
    return (value - 1.0) / num_labels


def _times_100(value: float, num_labels: int) -> float:
    """, x100"""
    return value * 100.0


#: the top-k records' example: row 0 ranks 0.9 (-), 0.8 (+), 0.7 (-), 0.1 (+); row 1 has no
#: positive (0 at the default setting); L = 4, so k = 5 ranks all four labels
_TOP_K_CASE = ([[0.9, 0.8, 0.1, 0.7], [0.2, 0.3, 0.4, 0.1]], [[0, 1, 1, 0], [0, 0, 0, 0]])
_IDEAL_2 = 1 + 1 / np.log2(3)  # two positives on top


#: the settings a metric's function takes as its third argument, and their defaults
METRIC_SETTINGS = {"convention": "present", "threshold": 0.5, "no_positive": "sklearn"}


@dataclass(frozen=True)
class Metric:
    """One metric, as everything that reports, selects on, tabulates or documents it reads it
    (`metric_score`, `classic_metrics`, ``--metric``, ``spml list metrics``, the
    study and benchmark tables, the docs' metric reference and the generated value tests),
    on full and on partial labels.

    Args:
        name: the metric's name (``--metric NAME``, ``val_NAME`` / ``test_NAME``).
        fn: ``fn(probs, y, setting) -> float``: ``probs`` N x L, ``y`` the full labels N x L;
            ``setting`` is the one of `METRIC_SETTINGS` named by ``takes``.
        higher_is_better: the selection direction.
        decimals: decimals shown in tables and the CLI.
        description: one line (``spml list metrics``).
        takes: ``"convention"`` (mAP's classes without positives), ``"threshold"`` (the
            metric scores 0/1 predictions ``probs >= threshold``), ``"no_positive"`` (rows
            without a positive, `NO_POSITIVE`) or ``None`` (no setting changes it; ``fn``
            gets ``None``).
        sklearn: ``(y, x) -> float``, scikit-learn's value of the metric at the default
            setting, ``x`` the scores (a thresholded metric: the 0/1 predictions at 0.5);
            ``None`` where scikit-learn has none.
        example: ``(probs, y, value)`` computed by hand, at the default setting; required
            where ``sklearn`` is ``None``.
        joint: ``(p, y, setting, known) -> {name: value}``: this metric computed with its
            siblings from one pass (the ranking metrics share one ranking); `classic_metrics`
            calls it once for all of them. ``known``: None, or for partial labels the N x L
            known entries of what ``partial``'s rule formatted (`format_labels`).
        partial: how it scores partial labels (mask ``"entry"``): a rule of `PARTIAL_RULES`
            (``"per_class"``, ``"per_row"``, ``"entries"``, ``"full_rows"``); its ``fn`` then
            reads the full 0 / 1 labels `format_labels` makes of them. ``None`` (default):
            refused there, by name (`partial_refusal`); the fully known rows of mask
            ``"row"`` are full labels, scored as such.
    """
    name: str
    fn: Callable[..., float]
    higher_is_better: bool
    decimals: int
    description: str
    takes: str | None
    sklearn: Callable[..., float] | None = None
    example: tuple | None = None
    joint: Callable[..., dict] | None = None
    partial: str | None = None

    @property
    def needs_threshold(self) -> bool:
        """Whether it scores predictions at a threshold (F1s, Hamming loss)."""
        return self.takes == "threshold"


#: every metric a run reports and a selection can use, name -> `Metric`, in the order
#: of the tables. mAP is x100 (as everywhere in spmlkit); the others are as the multi-label
#: literature writes them (fractions in [0, 1]; ``coverage`` in [0, L]).
METRICS: dict[str, Metric] = {}


def register_metric(metric: Metric) -> Metric:
    """Add ``metric`` to `METRICS` (the CLI, tables, docs and value tests pick it up).

    Raises:
        ValueError: a name taken, a setting not in `METRIC_SETTINGS`, a rule not in
            `PARTIAL_RULES`, or no reference value (neither ``sklearn`` nor ``example``).
    """
    if metric.name in METRICS:
        raise ValueError(f"metric {metric.name!r} is registered twice")
    if metric.takes is not None and metric.takes not in METRIC_SETTINGS:
        raise ValueError(f"metric {metric.name!r}: takes={metric.takes!r}; one of "
                         f"{', '.join(METRIC_SETTINGS)}")
    if metric.partial is not None and metric.partial not in PARTIAL_RULES:
        raise ValueError(f"metric {metric.name!r}: partial={metric.partial!r}; one of "
                         f"{', '.join(PARTIAL_RULES)}, or None (refused on partial labels)")
    if metric.sklearn is None and metric.example is None:
        raise ValueError(f"metric {metric.name!r} needs a reference value: its scikit-learn "
                         f"counterpart (sklearn=) or an example computed by hand (example=)")
    METRICS[metric.name] = metric
    return metric


for _metric in (
    Metric("map", map_score, True, 2, "mean average precision over classes, x100",
           "convention", sklearn=_sklearn_map, partial="per_class"),
    Metric("lrap", label_ranking_average_precision, True, 4,
           "label-ranking average precision (the literature's 'average precision')",
           "no_positive", sklearn=_sklearn("label_ranking_average_precision_score"),
           joint=_ranking_metrics, partial="per_row"),
    Metric("ranking_loss", ranking_loss, False, 4,
           "share of (positive, negative) label pairs ordered wrongly", "no_positive",
           sklearn=_sklearn("label_ranking_loss"), joint=_ranking_metrics, partial="per_row"),
    Metric("coverage", coverage_error, False, 3,
           "coverage error: how far down the ranking all positives are covered "
           "(scikit-learn's coverage_error, in 1..L)", "no_positive",
           sklearn=_sklearn("coverage_error"), joint=_ranking_metrics, partial="per_row"),
    Metric("coverage_norm", normalised_coverage, False, 4,
           "normalised coverage (coverage - 1) / L, in [0, 1)", "no_positive",
           sklearn=_sklearn("coverage_error", _per_label_minus_one), joint=_ranking_metrics,
           partial="per_row"),
    # row 0's top (0.8) is a positive; row 1's (0.6) a negative; row 2's tie for the top goes
    # to column 0, a negative; row 3 has no positive: an error -> 3 of 4
    Metric("one_error", one_error, False, 4,
           "share of rows whose top-ranked label is not a positive", "no_positive",
           example=([[0.1, 0.8, 0.3], [0.6, 0.2, 0.1], [0.5, 0.5, 0.0], [0.4, 0.3, 0.2]],
                    [[0, 1, 0], [0, 1, 1], [0, 1, 0], [0, 0, 0]], 0.75), partial="per_row"),
    Metric("hamming_loss", hamming_loss, False, 4,
           "share of label entries predicted wrongly at the threshold", "threshold",
           sklearn=_sklearn("hamming_loss"), partial="entries"),
    Metric("micro_f1", micro_f1, True, 4, "F1 over all label entries at the threshold",
           "threshold", sklearn=_sklearn("f1_score", average="micro", zero_division=0),
           joint=_f1_pair, partial="entries"),
    Metric("macro_f1", macro_f1, True, 4, "mean of the per-class F1 at the threshold",
           "threshold", sklearn=_sklearn("f1_score", average="macro", zero_division=np.nan),
           joint=_f1_pair, partial="per_class"),
    Metric("micro_ap", _no_setting(micro_average_precision), True, 2,
           "micro-averaged AP, x100: one AP over every label entry", None,
           sklearn=_sklearn("average_precision_score", _times_100, average="micro"),
           partial="entries"),
    Metric("weighted_ap", _no_setting(weighted_average_precision), True, 2,
           "per-class AP weighted by the classes' positive counts, x100", None,
           sklearn=_sklearn("average_precision_score", _times_100, average="weighted"),
           partial="per_class"),
    Metric("ndcg@3", _top_k_record("ndcg", 3), True, 4,
           "nDCG of each row's 3 top-ranked labels (LibMultiLabel's)", "no_positive",
           example=(*_TOP_K_CASE, (1 / np.log2(3)) / _IDEAL_2 / 2), joint=_top_k_metrics,
           partial="per_row"),
    Metric("ndcg@5", _top_k_record("ndcg", 5), True, 4,
           "nDCG of each row's 5 top-ranked labels", "no_positive",
           example=(*_TOP_K_CASE, (1 / np.log2(3) + 1 / np.log2(5)) / _IDEAL_2 / 2),
           joint=_top_k_metrics, partial="per_row"),
    Metric("rp@3", _top_k_record("rp", 3), True, 4,
           "R-precision at 3: positives among the row's top 3 / min(3, its positives)",
           "no_positive", example=(*_TOP_K_CASE, 0.25), joint=_top_k_metrics, partial="per_row"),
    Metric("rp@5", _top_k_record("rp", 5), True, 4, "R-precision at 5", "no_positive",
           example=(*_TOP_K_CASE, 0.5), joint=_top_k_metrics, partial="per_row"),
):
    register_metric(_metric)


def check_metric(name: str) -> str:
    """``name`` if it is one of `METRICS`, else a ``ValueError`` listing them."""
    if name not in METRICS:
        import difflib

        close = difflib.get_close_matches(str(name), list(METRICS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown metric {name!r}{hint}; choose one of {', '.join(METRICS)}")
    return name


def higher_is_better(name: str) -> bool:
    """The selection direction of metric ``name`` (``ranking_loss``, ``coverage``,
    ``coverage_norm``, ``one_error``, ``hamming_loss``: lower is better).

    >>> higher_is_better("map"), higher_is_better("ranking_loss")
    (True, False)
    """
    return METRICS[check_metric(name)].higher_is_better


def partial_refusal(name: str) -> str | None:
    """Why metric ``name`` is not scored on partial labels (mask ``"entry"``), or None when its
    record gives a rule (`PARTIAL_RULES`)."""
    if METRICS[check_metric(name)].partial is not None:
        return None
    return (f"metric {name!r} does not score partial labels: its record gives no rule "
            f"(Metric(partial=...): one of {', '.join(PARTIAL_RULES)}); select on another "
            f"metric, or score the fully known rows (eval_mask=row) or full labels")
