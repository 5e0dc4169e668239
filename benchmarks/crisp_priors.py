"""CRISP's class-prior estimator on yeast: estimated priors against the true label frequencies.

The core claim of Liu et al. (NeurIPS 2025, Theorem 4.1 and Fig. 1): the priors estimated
from the classifier and the observed single positives approach the true ``p(y_j = 1)``. Here
the true prior of label ``j`` is its frequency in the *full* labels of the train split (which
the method never sees). For each seed (the observed positives and the head's init) a linear
head is trained with ``crisp`` (AN warm-up of 1 epoch, then CRISP; batch 8, lr 1e-3: the grid
point the yeast benchmark selects for most methods) and, after every epoch, the estimator runs
on the eval-mode train logits, as the loss does. Printed per epoch: the mean absolute error
over the 14 labels ``mean_j |pi_hat_j - pi_j|`` (MAE), the same for the observed-positive
frequency ``n_j / n`` (what an AN-trained model's labels imply, a floor of the estimator) and
for the model's mean prediction ``mean_i sigmoid(s_ij)`` (Fig. 1's "predicted class-prior").

``--oracle``: instead, on the tabular protocol (yeast, trials 0..4, batch 8, lr 1e-3, best
epoch on val LRAP), test LRAP and mAP of AN, CRISP, and CRISP given the *true* train-split
priors in place of its estimates (a diagnostic: how much of CRISP's result is the estimator's).

Run: ``PYTHONPATH=src python benchmarks/crisp_priors.py [--seeds 3] [--epochs 25] [--oracle]``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from spmlkit.loading import load_splits
from spmlkit.engine import TrainConfig, fit_linear
from spmlkit.losses import create_loss
from spmlkit.losses.crisp import estimate_class_priors
from spmlkit.metrics import label_ranking_average_precision, map_score


def oracle(args) -> None:
    """AN, CRISP and CRISP with the true priors on the tabular protocol (module docstring)."""
    results = {"an": [], "crisp": [], "crisp with true priors": []}
    for trial in range(5):
        s = load_splits(args.dataset, "1p", seed=trial, protocol="tabular")
        true = torch.as_tensor(s.train.y.mean(axis=0), dtype=torch.float32)
        for kind, rows in results.items():
            loss = create_loss("an" if kind == "an" else "crisp")
            if kind == "crisp with true priors":
                estimate = loss.on_epoch_end

                def on_epoch_end(epoch, logits=None, loss=loss, estimate=estimate):
                    estimate(epoch, logits)  # the schedule and checks, then the true values
                    loss.priors = true.clone().to(loss.priors.device)

                loss.on_epoch_end = on_epoch_end
            cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                              seed=trial, metric="lrap")
            model, _ = fit_linear(s.train.x, s.observed, loss, cfg, x_val=s.val.x,
                                  y_val=s.val.y, k=s.k)
            with torch.no_grad():
                probs = torch.sigmoid(model(torch.as_tensor(s.test.x, dtype=torch.float32)))
            rows.append((label_ranking_average_precision(probs.numpy(), s.test.y),
                         map_score(probs.numpy(), s.test.y)))
    for kind, rows in results.items():
        v = np.array(rows)
        print(f"{kind:24s} test LRAP {v[:, 0].mean():.4f} ± {v[:, 0].std():.4f}   test mAP "
              f"{v[:, 1].mean():.2f} ± {v[:, 1].std():.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dataset", default="yeast")
    parser.add_argument("--oracle", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.oracle:
        oracle(args)
        print(f"wall time {time.perf_counter() - start:.0f} s")
        return
    finals = []
    for seed in range(args.seeds):
        s = load_splits(args.dataset, "1p", seed=1200 + seed)
        x = torch.as_tensor(s.train.x, dtype=torch.float32)
        true = s.train.y.mean(axis=0)
        seen = (s.observed == 1).mean(axis=0)
        rows = []

        def on_epoch(record, model, loss, rows=rows):
            with torch.no_grad():
                logits = model.eval()(x)
                model.train()
            est = estimate_class_priors(logits, torch.as_tensor(s.observed) == 1,
                                        loss.delta, loss.tau).numpy()
            mean_pred = torch.sigmoid(logits).mean(dim=0).numpy()
            rows.append((record["epoch"], np.abs(est - true).mean(),
                         np.abs(mean_pred - true).mean(), record.get("val_map", float("nan")),
                         est))

        cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=seed)
        fit_linear(s.train.x, s.observed, create_loss("crisp"), cfg, x_val=s.val.x,
                   y_val=s.val.y, k=s.k, on_epoch=on_epoch)
        print(f"seed {seed}: n = {len(x)}, true priors {np.round(true, 3).tolist()}")
        print(f"  observed-positive frequency n_j/n: MAE {np.abs(seen - true).mean():.4f}")
        print("  epoch | MAE(estimated prior) | MAE(mean prediction) | val mAP")
        for epoch, mae, mae_pred, vmap, _ in rows:
            if epoch in (1, 2, 3, 5, 10, 15, 20, 25) or epoch == args.epochs:
                print(f"  {epoch:5d} | {mae:.4f} | {mae_pred:.4f} | {vmap:.2f}")
        est = rows[-1][4]
        print(f"  last epoch's estimate {np.round(est, 3).tolist()}")
        finals.append((rows[-1][1], rows[-1][2], np.abs(seen - true).mean(),
                       np.corrcoef(est, true)[0, 1]))
    f = np.array(finals)
    print(f"over {len(f)} seeds, last epoch: MAE(estimated) {f[:, 0].mean():.4f} ± "
          f"{f[:, 0].std():.4f}; MAE(mean prediction) {f[:, 1].mean():.4f} ± {f[:, 1].std():.4f};"
          f" MAE(n_j/n) {f[:, 2].mean():.4f}; Pearson r(estimated, true) "
          f"{f[:, 3].mean():.3f}")
    print(f"wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
