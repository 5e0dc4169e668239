"""Linear-mode epoch time: the engine's indexed pre-loaded tensors vs a plain DataLoader loop.

Both train the same head (same init, same seeded permutation, same loss, Adam) on the yeast
train split, so they must end with the same weights; the script checks that and prints the
per-epoch times and their ratio.

    python benchmarks/linear_epoch.py [--loss an] [--batch-size 8] [--epochs 5]
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from spmlkit.loading import load_splits
from spmlkit.engine import TrainConfig, fit_linear, make_linear_head, make_optimizer
from spmlkit.losses import TrainInfo, create_loss


class Shuffle(Sampler):
    """One seeded permutation per epoch, as the engine draws it (torch's RandomSampler draws an
    extra, empty-sliced permutation each epoch, which would desynchronise the two loops)."""

    def __init__(self, n, generator):
        self.n, self.generator = n, generator

    def __len__(self):
        return self.n

    def __iter__(self):
        yield from torch.randperm(self.n, generator=self.generator).tolist()


class Rows(Dataset):
    def __init__(self, x, z):
        self.x, self.z = x, z

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.z[i], i


def dataloader_fit(x, z, loss_name, config, k):
    model = make_linear_head(x.shape[1], z.shape[1], config.seed)
    loss = create_loss(loss_name)
    loss.on_train_start(z, TrainInfo(len(x), z.shape[1], k, config.seed, config.epochs))
    opt = make_optimizer(model, loss, config.lr)
    gen = torch.Generator().manual_seed(config.seed)
    # the sampler owns the generator (a DataLoader given one draws a worker seed from it first)
    loader = DataLoader(Rows(x, z), batch_size=config.batch_size,
                        sampler=Shuffle(len(x), gen))
    for epoch in range(config.epochs):
        loss.on_epoch_start(epoch)
        for xb, zb, idx in loader:
            value = loss(model(xb), zb, index=idx)
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
        loss.on_epoch_end(epoch, None)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loss", default="an")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    splits = load_splits("yeast")
    x = torch.as_tensor(splits.train.x)
    z = torch.as_tensor(splits.observed)
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr)
    # warm-up: the first optimiser step of a process pays one-time imports (seconds)
    fit_linear(x[:16], z[:16], create_loss(args.loss), TrainConfig(epochs=1), k=splits.k)

    t0 = time.perf_counter()
    engine_model, _ = fit_linear(x, z, create_loss(args.loss), config, k=splits.k)
    t_engine = (time.perf_counter() - t0) / args.epochs
    t0 = time.perf_counter()
    loader_model = dataloader_fit(x, z, args.loss, config, splits.k)
    t_loader = (time.perf_counter() - t0) / args.epochs

    diff = (engine_model.weight - loader_model.weight).abs().max().item()
    print(f"yeast train split: {len(x)} rows, loss {args.loss}, batch {args.batch_size}, "
          f"{args.epochs} epochs")
    print(f"engine (indexed tensors): {t_engine * 1e3:8.1f} ms/epoch")
    print(f"DataLoader over rows:     {t_loader * 1e3:8.1f} ms/epoch")
    print(f"speed-up: {t_loader / t_engine:.2f}x; max |weight difference| = {diff:.2e} "
          f"({'same result' if diff < 1e-5 else 'RESULTS DIFFER'})")


if __name__ == "__main__":
    main()
