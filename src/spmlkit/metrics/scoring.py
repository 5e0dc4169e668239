"""Scoring one split with the metric records: one pipeline for full and partial labels.

Full 0 / 1 labels go to each record's function as they are. Partial labels (`PartialLabels`)
first go through the formatting step (`spmlkit.metrics.partial.format_labels`), as the
record's ``partial`` rule says (torchmetrics applies its ``ignore_index`` the same way, in one
formatting step for every metric); a record without a rule is refused there by name. So a
metric registered with `register_metric` is scored on partial labels, or refused by name,
with nothing else to add.
"""
from __future__ import annotations

import numpy as np

from .ap import _as_scores, map_from_ap, per_class_ap, precision_recall_at_k
from .ap import mean_average_precision as _mean_average_precision
from .partial import (classes_without_negatives, format_labels, is_partial, known_entries,
                      mask_of, partial_labels)
from .records import METRIC_SETTINGS, METRICS, check_metric, partial_refusal


def _scored(probs, y, names, settings: dict) -> tuple[dict, dict]:
    """``({name: value}, {name: why refused})`` of the records ``names`` on one split:
    each record's ``fn``, or its ``joint`` once for its siblings, on the inputs its rule
    formats (full labels: the labels themselves)."""
    partial = is_partial(y)
    if not partial:  # validated once for several records (each fn validates its own inputs)
        full = (*_as_scores(probs, y), None) if len(names) > 1 else (probs, y, None)
    entry = partial and mask_of(y) == "entry"
    formatted, shared, out, refused = {}, {}, {}, {}
    for name in names:
        metric = METRICS[name]
        if entry and metric.partial is None:
            refused[name] = partial_refusal(name)
            continue
        rule = metric.partial or "full_rows"
        if rule not in formatted:
            formatted[rule] = format_labels(probs, y, rule, settings["threshold"]) if partial \
                else full
        s, t, known = formatted[rule]
        setting = settings.get(metric.takes)
        if metric.joint is None or (known is None and len(names) == 1):
            out[name] = metric.fn(s, t, setting)
            continue
        key = (metric.joint, rule)
        if key not in shared:
            shared[key] = metric.joint(s, t, setting, known)
        out[name] = shared[key][name]
    return out, refused


def _settings(y, convention: str, threshold, no_positive: str) -> dict:
    """The records' settings; on partial labels under mask ``"entry"`` rows without a known
    positive are left out (``no_positive="exclude"``), whatever was asked."""
    if is_partial(y) and mask_of(y) == "entry":
        no_positive = "exclude"
    return {"convention": convention, "threshold": threshold, "no_positive": no_positive}


def metric_score(name: str, probs, y, *, convention: str = "present",
                 threshold: float | str = 0.5, no_positive: str = "sklearn") -> float:
    """One metric of `METRICS` of ``probs`` (N x L probabilities) against the full labels
    ``y``, or partial ones (`PartialLabels`, scored as the metric's record says): what an
    epoch is selected on.

    ``threshold`` (for the F1s and Hamming loss): a probability, or ``"chosen"``: the global
    micro-F1 threshold of these same rows (`best_global_threshold`; of partial labels, their
    known entries), the policy a run applies on its val split (`THRESHOLD_POLICY`).

    Raises:
        ValueError: an unknown metric (listing them), bad shapes or non-finite scores, a
            metric whose record gives no rule for partial labels (naming it).
    """
    from .thresholds import best_global_threshold

    metric = METRICS[check_metric(name)]
    if threshold == "chosen":  # (a metric without a threshold: the default, never read)
        threshold = best_global_threshold(probs, y)[0] if metric.needs_threshold else \
            METRIC_SETTINGS["threshold"]
    values, refused = _scored(probs, y, [name], _settings(y, convention, threshold, no_positive))
    if refused:
        raise ValueError(refused[name])
    return values[name]


def classic_metrics(probs, y, *, convention: str = "present", threshold: float = 0.5,
                    no_positive: str = "sklearn") -> dict:
    """Every metric of `METRICS` of one split (``probs`` N x L probabilities, ``y`` the
    full labels), plus ``threshold`` and ``rows_without_positives`` (how many rows the
    ``no_positive`` convention applied to).

    Partial labels (`PartialLabels`): each metric as its record's rule says (mask
    ``"entry"``; rows without a known positive left out of the ranking metrics,
    ``no_positive="exclude"`` whatever was asked) or of the fully known rows (mask ``"row"``),
    plus ``rows_scored``, ``mask`` and ``known_entries`` (their share); a metric whose record
    gives no rule is left out and named, with why, in ``not_scored``.

    >>> m = classic_metrics([[0.9, 0.2], [0.3, 0.8]], [[1, 0], [0, 1]])
    >>> m["map"], m["lrap"], m["ranking_loss"], m["hamming_loss"], m["one_error"]
    (100.0, 1.0, 0.0, 0.0, 0.0)
    """
    if is_partial(y) and mask_of(y) == "row" and not (np.asarray(y) != 0).all(axis=1).any():
        raise ValueError("mask 'row': no row of the partial labels is fully known")
    out, refused = _scored(probs, y, list(METRICS),
                           _settings(y, convention, threshold, no_positive))
    out["threshold"] = float(threshold)
    if not is_partial(y):
        out["rows_without_positives"] = int((np.asarray(y).sum(axis=1) == 0).sum())
        return out
    pos, known = known_entries(y)
    if mask_of(y) == "row":
        rows = known.all(axis=1)
        out["rows_without_positives"] = int((~pos[rows].any(axis=1)).sum())
        out["rows_scored"] = int(rows.sum())
    else:
        out["rows_without_positives"] = int((~pos.any(axis=1)).sum())  # left out of ranking
        out["rows_scored"] = int(pos.any(axis=1).sum())
    if refused:
        out["not_scored"] = refused
    out["mask"] = mask_of(y)
    out["known_entries"] = float(known.mean()) if known.size else float("nan")
    return out


def masked_metrics(probs, y, *, convention: str = "present", threshold: float = 0.5,
                   mask: str | None = None) -> dict:
    """`classic_metrics` of partial labels ``y`` (any form `partial_labels` reads), under
    ``mask`` (default: the one ``y`` carries, else ``"entry"``)."""
    labels = partial_labels(y, mask_of(y, mask))
    return classic_metrics(probs, labels, convention=convention, threshold=threshold)


def evaluate(scores, y, convention: str = "present") -> dict:
    """The standard report of one split: mAP, the classes left out, P@1, P@3, R@3.

    Partial labels (`PartialLabels`): the mAP of their rule (`map_score`), the classes
    without a known positive, those without a known negative (left out of the mAP), P@k / R@k
    ranking each row's known labels (mask ``"entry"``) or of the fully known rows (``"row"``),
    and the mask.
    """
    if is_partial(y):
        s, labels, _ = format_labels(scores, y, "per_row")  # every class, each row's known labels
        ap = per_class_ap(s, labels)
        left_out = classes_without_negatives(y)
        scored = np.ones(len(ap), dtype=bool)
        scored[left_out] = False
        out = {"map": map_from_ap(ap[scored], convention),
               "classes_without_positives": np.flatnonzero(np.isnan(ap)).tolist(),
               "classes_without_negatives": left_out, "mask": mask_of(y)}
        if not len(labels):
            return out
    else:
        res = _mean_average_precision(scores, y, convention)
        out = {"map": res.value, "classes_without_positives": res.missing}
        s, labels = scores, y
    for k in (1, 3):
        if k <= np.shape(labels)[1]:
            out[f"p@{k}"], out[f"r@{k}"] = precision_recall_at_k(s, labels, k)
    return out


def runs_scores(probs, y, thresholds, *, convention: str = "present",
                no_positive: str = "sklearn", report: bool = False) -> list:
    """`classic_metrics` of R runs' probabilities (R x N x L) against the same full labels
    ``y`` (N x L), each at its own threshold (``thresholds``, one per run), and with
    ``report`` its `evaluate` too: per run ``metrics`` or ``(metrics, report)``, equal to
    those functions' values on each run alone, bit for bit (``tests/test_metrics_runs.py``).

    A stacked benchmark finishes some hundred small runs on the same val and test labels; run
    by run, each metric's passes over a few thousand entries were mostly call overhead. Here
    the per-class AP (mAP, weighted AP, the report's mAP) and the row-wise rankings (LRAP,
    ranking loss, coverage, one-error, the top-k records, P@k / R@k) are computed once for
    all runs' rows, stacked (rows are independent, so each row's values are its run's own),
    and then averaged per run by the same means; the other records (the thresholded ones,
    micro AP) are scored run by run. Partial labels, or one run: run by run.

    Raises:
        ValueError: as `classic_metrics` (any run's non-finite scores, bad shapes).
    """
    from .ap import (per_class_ap, precision_recall_means, top_k_counts, validate_full_labels,
                     weighted_ap)
    from .ranking import (_ranking_metrics, _top_k_metrics, one_error_mean, one_error_rows,
                          ranking_means, ranking_rows, rows_of, top_k_ks, top_k_records,
                          top_k_row_means, top_k_rows_of)

    probs = np.asarray(probs)
    thresholds = list(thresholds)
    if probs.ndim != 3 or len(thresholds) != len(probs):
        raise ValueError(f"runs_scores: R x N x L probabilities and one threshold per run, got "
                         f"{probs.shape} and {len(thresholds)} threshold(s)")
    if is_partial(y) or len(probs) < 2:
        return [_one_run(p, y, t, convention, no_positive, report)
                for p, t in zip(probs, thresholds)]
    runs, n, classes = probs.shape
    y = validate_full_labels(y, "metrics targets", copy=False)
    s, tiled = _as_scores(probs.reshape(runs * n, classes), np.tile(y, (runs, 1)))
    ap = per_class_ap(s.reshape(runs, n, classes), y)
    ranking, one_error = ranking_rows(s, tiled), one_error_rows(s, tiled)
    ks = top_k_ks(classes)
    top = top_k_rows_of(s, tiled > 0, ks)
    counts = {k: top_k_counts(s, tiled, k) for k in (1, 3) if k <= classes}
    positives = y.sum(axis=0)
    empty_rows = int((y.sum(axis=1) == 0).sum())
    # the records computed above from all runs' rows (their values the records' own: a record
    # changed without this is caught by the test of every record); the others run by run
    stacked = {name for name, m in METRICS.items()
               if m.joint in (_ranking_metrics, _top_k_metrics)} | \
        {"map", "weighted_ap", "one_error"}
    rest = [name for name in METRICS if name not in stacked]
    out = []
    for r in range(runs):
        part = slice(r * n, (r + 1) * n)
        settings = _settings(y, convention, thresholds[r], no_positive)
        values = {"map": map_from_ap(ap[r], convention),
                  "weighted_ap": weighted_ap(ap[r], positives),
                  "one_error": one_error_mean(rows_of(one_error, part), no_positive),
                  **ranking_means(rows_of(ranking, part), no_positive),
                  **top_k_records(top_k_row_means(rows_of(top, part), ks, no_positive),
                                  classes)}
        values.update(_scored(probs[r], y, rest, settings)[0])
        metrics = {name: values[name] for name in METRICS}
        metrics["threshold"] = float(thresholds[r])
        metrics["rows_without_positives"] = empty_rows
        if not report:
            out.append(metrics)
            continue
        rep = {"map": metrics["map"],
               "classes_without_positives": np.flatnonzero(np.isnan(ap[r])).tolist()}
        for k, rows in counts.items():
            rep[f"p@{k}"], rep[f"r@{k}"] = precision_recall_means(rows_of(rows, part), k)
        out.append((metrics, rep))
    return out


def _one_run(p, y, threshold, convention: str, no_positive: str, report: bool):
    metrics = classic_metrics(p, y, convention=convention, threshold=threshold,
                              no_positive=no_positive)
    return (metrics, evaluate(p, y, convention)) if report else metrics
