"""The calibration of a run's test probabilities: a reliability diagram (all entries pooled) and
the ECE of every class, before and after per-class temperatures fitted on val
(`spmlkit.calibration`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...analysis import format_table, run_label
from ...calibration import _fit_temperatures, apply_temperatures, class_ece, reliability
from ...runs import read_predictions
from .plotting import new_figure, save_figure


@dataclass
class Calibration:
    """A run's test calibration: ``raw`` and (with temperatures) ``scaled`` reliability
    curves (`spmlkit.calibration.reliability`), the per-class ECE of each, the temperatures."""

    run: str
    class_names: list
    raw: dict
    ece: np.ndarray
    temperatures: np.ndarray | None = None
    scaled: dict | None = None
    scaled_ece: np.ndarray | None = None
    #: the classes whose val rows hold no positive or no negative: no temperature fitted (T = 1)
    unfitted: list | None = None

    def table(self) -> str:
        head = ["class", "test ECE"] + (["T (val)", "test ECE after T"]
                                        if self.temperatures is not None else [])
        rows = [[c, float(e)] + ([float(t), float(s)] if self.temperatures is not None else [])
                for c, e, t, s in zip(self.class_names, self.ece,
                                      *(([self.temperatures, self.scaled_ece])
                                        if self.temperatures is not None
                                        else ([self.ece, self.ece])))]
        rows.append(["(all entries)", self.raw["ece"]] + (
            ["", self.scaled["ece"]] if self.scaled is not None else []))  # no pooled T
        text = format_table(head, rows, ".4f")
        if self.unfitted:
            text += (f"\nT = 1 kept (no temperature fitted) for {len(self.unfitted)} class(es) "
                     f"whose val rows hold no positive or no negative: "
                     f"{', '.join(map(str, self.unfitted[:8]))}"
                     f"{', ...' if len(self.unfitted) > 8 else ''}")
        return text


def calibration_of(probs_val, y_val, probs_test, y_test, class_names, bins: int = 15,
                   temperature: bool = False, run: str = "") -> Calibration:
    """`Calibration` of test probabilities, with per-class temperatures fitted on val when
    ``temperature``."""
    cal = Calibration(run, list(class_names), reliability(probs_test, y_test, bins),
                      class_ece(probs_test, y_test, bins))
    if temperature:
        cal.temperatures, unfitted = _fit_temperatures(probs_val, y_val)
        cal.unfitted = [cal.class_names[j] for j in unfitted]
        scaled = apply_temperatures(probs_test, cal.temperatures)
        cal.scaled, cal.scaled_ece = reliability(scaled, y_test, bins), class_ece(scaled, y_test,
                                                                                   bins)
    return cal


def calibration_from_run(run, bins: int = 15, temperature: bool = False) -> Calibration:
    """`calibration_of` a run's best-epoch val / test probabilities (``predictions.npz``;
    partial evaluation labels, 1 / -1 known and 0 unknown, scored over the known entries)."""
    import json

    from ...metrics import partial_labels

    pred = read_predictions(run, probs=("val", "test"))
    names = json.loads((Path(run) / "config.json").read_text()).get("class_names") or \
        [f"class{j}" for j in range(pred["y_test"].shape[1])]
    y = {s: partial_labels(pred[f"y_{s}"]) if (pred[f"y_{s}"] < 0).any() else pred[f"y_{s}"]
         for s in ("val", "test")}
    return calibration_of(pred["probs_val"], y["val"], pred["probs_test"], y["test"], names,
                          bins, temperature, run_label(run))


def plot_calibration(cal: Calibration, out, *, force: bool = False) -> Path:
    """Left: the reliability diagram (positive rate against mean score per bin, the diagonal
    is perfect calibration); right: the test ECE per class. Returns the path written."""
    fig, axes = new_figure((11, 4.2), 1, 2)
    ax = axes[0, 0]
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfectly calibrated")
    curves = [("raw", cal.raw, "tab:blue")]
    if cal.scaled is not None:
        curves.append(("per-class temperature (val)", cal.scaled, "tab:orange"))
    for label, r, colour in curves:
        ok = r["count"] > 0
        ax.plot(r["confidence"][ok], r["positive_rate"][ok], marker="o", color=colour,
                label=f"{label}: ECE {r['ece']:.3f}")
    ax.set(xlabel="mean predicted probability (bin)", ylabel="share of positives (bin)",
           xlim=(0, 1), ylim=(0, 1), title="reliability, test entries pooled")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax = axes[0, 1]
    x = np.arange(len(cal.class_names))
    width = 0.4 if cal.scaled_ece is not None else 0.8
    ax.bar(x - (width / 2 if cal.scaled_ece is not None else 0), cal.ece, width,
           color="tab:blue", label="raw")
    if cal.scaled_ece is not None:
        ax.bar(x + width / 2, cal.scaled_ece, width, color="tab:orange",
               label="per-class temperature")
    ax.set_xticks(x, cal.class_names, rotation=60, ha="right", fontsize="small")
    ax.set(ylabel="ECE (test)", title="expected calibration error per class")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    fig.suptitle(f"Calibration of the test probabilities, {cal.run}")
    return save_figure(fig, out, force=force)
