"""Multi-label metrics with explicit edge cases, on full or partial evaluation labels.

mAP is the mean over classes of non-interpolated average precision (scikit-learn's
``average_precision_score``), times 100. A class without any positive has no AP: by default it is
left out of the mean and reported (``MAPResult.missing``); ``convention="official"`` scores it 0
and keeps it in the mean, as the official code does.

Every metric a run reports and a selection can use is one record (`Metric`) of `METRICS`;
`metric_score` and `classic_metrics` score a split with the records, whether its labels are
full (0 / 1) or partial (`PartialLabels`: 1 / -1 known, 0 unknown; each record says how it
scores them, `PARTIAL_RULES`). The parts, one module each:

* `spmlkit.metrics.ap`: average precision (per class, mAP, micro, weighted) and P@k / R@k;
* `spmlkit.metrics.ranking`: LRAP, ranking loss, coverage, one-error, nDCG@k, RP@k;
* `spmlkit.metrics.thresholded`: Hamming loss and F1 at a threshold, pseudo-label precision;
* `spmlkit.metrics.records`: the records and their registry;
* `spmlkit.metrics.partial`: partial labels and the formatting step that scores them;
* `spmlkit.metrics.scoring`: one split scored with the records;
* `spmlkit.metrics.thresholds`: the decision thresholds chosen on val by F1.

Every public name is importable from ``spmlkit.metrics``.
"""
from __future__ import annotations

from .ap import (BLOCK_ENTRIES, MAPResult, average_precision, check_convention, map_from_ap,
                 map_score, mean_average_precision, micro_average_precision, per_class_ap,
                 precision_recall_at_k, ranked_ap, weighted_ap, weighted_average_precision)
from .partial import (MASKS, PARTIAL_RULES, PartialLabels, classes_without_negatives,
                      format_labels, is_partial, known_entries, partial_labels)
from .ranking import (NO_POSITIVE, TOP_K, coverage_error, label_ranking_average_precision,
                      ndcg_at_k, normalised_coverage, one_error, ranking_loss, rprecision_at_k,
                      top_k_hits, top_k_means, top_k_rows)
from .records import (METRIC_SETTINGS, METRICS, THRESHOLD_POLICY, Metric, check_metric,
                      higher_is_better, partial_refusal, register_metric)
from .scoring import classic_metrics, evaluate, masked_metrics, metric_score
from .thresholded import (f1_micro_macro, f1_scores, hamming_loss, macro_f1, micro_f1,
                          pseudo_label_stats)
from .thresholds import best_class_thresholds, best_global_threshold, select_thresholds

__all__ = [
    "BLOCK_ENTRIES", "MAPResult", "average_precision", "check_convention", "map_from_ap",
    "map_score", "mean_average_precision", "micro_average_precision", "per_class_ap",
    "precision_recall_at_k", "ranked_ap", "weighted_ap", "weighted_average_precision",
    "MASKS", "PARTIAL_RULES", "PartialLabels", "classes_without_negatives", "format_labels",
    "is_partial", "known_entries", "partial_labels",
    "NO_POSITIVE", "TOP_K", "coverage_error", "label_ranking_average_precision", "ndcg_at_k",
    "normalised_coverage", "one_error", "ranking_loss", "rprecision_at_k", "top_k_hits",
    "top_k_means", "top_k_rows",
    "METRIC_SETTINGS", "METRICS", "THRESHOLD_POLICY", "Metric", "check_metric",
    "higher_is_better", "partial_refusal", "register_metric",
    "classic_metrics", "evaluate", "masked_metrics", "metric_score",
    "f1_micro_macro", "f1_scores", "hamming_loss", "macro_f1", "micro_f1", "pseudo_label_stats",
    "best_class_thresholds", "best_global_threshold", "select_thresholds",
]
