"""The papers' figures as functions on explicit data, and thin loaders for runs and studies.

Every ``plot_*`` function takes plain arrays / rows or a result object, draws on matplotlib's Agg
canvas (`new_figure`, no pyplot), writes PNG, or SVG when the output path ends in ``.svg``,
atomically and never over an existing file unless ``force=True`` (an existing file is an
error: `spmlkit.safe_write.write_output`), and returns the path written. The numbers
behind a figure come from a pure function (``sweep_points``, ``probability_histograms``,
``loss_landscape``, ``class_activation_maps``, the analyses of `spmlkit.analysis`) so they
can be tested and printed. The ``*_from_run`` / ``*_from_study`` loaders read run folders
(`spmlkit.runs`, models through [`spmlkit.methods.load_run_model`][spmlkit.methods.load_run_model])
and study folders ([`spmlkit.experiments.study.open_study`][spmlkit.experiments.study.open_study]).
``spml figure ...`` and ``spml analyze ...`` wire them.

Modules, one concept each:

- `plotting`: the figure helper, `save_figure`, shared small helpers;
- `curves`: val mAP and train loss per epoch of runs (OPML Fig. 4); pseudo-label count
  and precision per epoch (Zhou Table 2);
- `histograms`: train probabilities of observed positives, unobserved positives and
  negatives (Cole Fig. 2, OPML Fig. 3, Zhou Fig. 4b); unobserved positives per epoch (Cole
  Fig. 2);
- `calibration`: the reliability diagram and per-class ECE of a run's test probabilities,
  before and after per-class temperatures fitted on val;
- `classwise`: per-class AP difference (Zhou Fig. 4c) and Wasserstein distance (Zhou
  Fig. 4a) bars;
- `sweeps`: selected test mAP (mean +- std over seeds) against a study's vary axis (LAC
  Figs. 3-5, Zhou Fig. 3a, Cole Fig. 1);
- `landscape`: the training loss on the plane ``theta + a d1 + b d2`` of two
  filter-normalised random directions (Li et al. 2018; Zhou Fig. 5a-b);
- `image_panels`: image panels (Zhou Fig. 6), class activation maps (OPML Fig. 7), a LAC
  model's attention maps (LAC Fig. 6).
"""
from .plotting import FIGURE_SUFFIXES, FIGURES_DIR, new_canvas, new_figure, save_figure
from .calibration import Calibration, calibration_from_run, calibration_of, plot_calibration
from .classwise import plot_ap_difference, plot_wasserstein
from .curves import curves_from_runs, plot_curves, plot_pl_precision, plot_small_curves
from .histograms import (GROUPS, ProbHistograms, histograms_from_run, plot_histograms,
                         plot_probability_histograms, probability_histograms)
from .image_panels import (MapOverlays, Panel, attention_from_run, cam_from_run,
                     class_activation_maps, panel_from_run, plot_attention, plot_cam,
                     plot_overlays, plot_panel, top_predictions, upsample_maps)
from .landscape import (Landscape, filter_normalized_direction, landscape_from_run,
                        loss_landscape, plot_landscape)
from .sweeps import (K_VALUE, TRAIN_LABELS, TRAIN_LABELS_XLABEL, SweepLine, default_x, draw_sweep,
                     metric_label,
                     plot_sweep, resolved_k, sweep_from_study, sweep_points, sweep_table,
                     train_label_count, x_layout)

__all__ = ["Calibration", "calibration_from_run", "calibration_of", "plot_calibration",
           "FIGURES_DIR", "FIGURE_SUFFIXES", "GROUPS", "K_VALUE", "Landscape", "MapOverlays",
           "Panel", "ProbHistograms", "SweepLine", "TRAIN_LABELS", "TRAIN_LABELS_XLABEL",
           "attention_from_run", "cam_from_run", "class_activation_maps", "curves_from_runs",
           "default_x", "draw_sweep", "filter_normalized_direction", "histograms_from_run",
           "landscape_from_run", "loss_landscape", "metric_label", "new_canvas", "new_figure",
           "panel_from_run", "plot_ap_difference", "plot_attention", "plot_cam", "plot_curves",
           "plot_histograms", "plot_landscape", "plot_overlays", "plot_panel",
           "plot_pl_precision", "plot_probability_histograms", "plot_small_curves",
           "plot_sweep", "plot_wasserstein", "probability_histograms", "resolved_k", "save_figure",
           "sweep_from_study", "sweep_points", "sweep_table", "top_predictions", "x_layout",
           "train_label_count", "upsample_maps"]
