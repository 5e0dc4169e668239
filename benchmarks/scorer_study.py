"""em_pl (VLPL) and gpr (AEVLP) against AN and EM with a simulated external scorer.

Writes the simulated scorer's N_train x L score file for one dataset
(``spmlkit.losses.scorer.simulated_scores``: the train split's full labels flipped with
probability ``--flip``, scores ``sigmoid(2 (2y' - 1) + N(0, 1))``, numpy seed ``--scorer-seed``),
a study YAML that passes it to ``em_pl`` and ``gpr`` (``hparams: {em_pl: {scores: FILE}}``), and
runs that study (the papers' grid: batch {8, 16} x lr {1e-2 .. 1e-5}, 25 epochs, best val mAP,
``--seeds`` seeds, linear head). Prints the scorer's own train-split mAP, the study's table and
the wall time; re-running with the same ``--out`` resumes the study.

    python benchmarks/scorer_study.py --dataset yeast --out runs/scorer-yeast
    python benchmarks/scorer_study.py --dataset fmnist_mosaic --backbone efficientnet_lite0 \\
        --out runs/scorer-fmnist
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import yaml

from spmlkit.cli import main as spml
from spmlkit.loading import load_splits
from spmlkit.losses.scorer import simulated_scores
from spmlkit.metrics import map_score


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    options = {"backbone": args.backbone} if args.backbone else {}
    splits = load_splits(args.dataset, "1p", **options)
    scores = simulated_scores(splits.train.y, flip=args.flip, seed=args.scorer_seed)
    path = (out / f"{args.dataset}-scores-flip{args.flip}.npy").resolve()
    np.save(path, scores)
    print(f"scorer: {path} ({scores.shape[0]} x {scores.shape[1]}), its train-split mAP "
          f"{map_score(scores, splits.train.y):.2f}")
    spec = {
        "name": f"scorer-{args.dataset}",
        "title": f"External-scorer pseudo-labels on {args.dataset} (simulated scorer, "
                 f"{args.flip:.0%} flipped labels)",
        "datasets": [{"name": args.dataset, "options": options} if options else args.dataset],
        "methods": [{"label": "AN", "spec": "an"}, {"label": "EM", "spec": "em"},
                    {"label": "EM_PL", "spec": "em_pl"}, {"label": "GPR", "spec": "gpr"}],
        "mode": "linear", "seeds": args.seeds, "epochs": 25, "early_stop": "none",
        "grid": {"batch_size": [8, 16], "lr": [1e-2, 1e-3, 1e-4, 1e-5]},
        "hparams": {"em_pl": {"scores": str(path)}, "gpr": {"scores": str(path)}},
    }
    spec_path = out / "study.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    t0 = time.perf_counter()
    code = spml(["study", "run", str(spec_path), "--out", str(out / "study"), "--jobs",
                 str(args.jobs), "--quiet"])
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    raise SystemExit(code)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="yeast")
    parser.add_argument("--backbone", default=None, help="image sets: cached features of it")
    parser.add_argument("--flip", type=float, default=0.1)
    parser.add_argument("--scorer-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", required=True)
    run(parser.parse_args())
