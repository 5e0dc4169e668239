"""Image items for the fine-tuning modes: seeded global batches (one process or many), a dataset
of transformed images with per-row seeds, DataLoaders, eval-mode predictions of every item, and
the default transforms at a backbone's size, mean and std."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from .. import distributed as dist_utils
from ..accel import current_acceleration
from ..data.image_views import (finish_view, finished_batches, gpu_decodable, image_reader,
                                load_view, raw_item, stack_views)
from ..machine import loader_worker_init, loader_workers, prefetch_factor
from .amp import amp_dtype, run_model
from .config import TrainConfig, epoch_rows


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return value ^ (value >> 31)


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (seed, epoch, row, ...), the same in every process.

    >>> mix_seed(0, 1) == mix_seed(0, 1) != mix_seed(1, 0)
    True
    """
    value = 0
    for part in parts:
        value = _splitmix64(value ^ (int(part) & 0xFFFFFFFFFFFFFFFF))
    return value >> 1


def shares(size: int, world_size: int) -> list[int]:
    """``size`` rows shared among ``world_size`` processes in contiguous chunks, the first
    ones one row longer when it does not divide.

    >>> shares(5, 2), shares(1, 3)
    ([3, 2], [1, 0, 0])
    """
    base, extra = divmod(int(size), int(world_size))
    return [base + (r < extra) for r in range(int(world_size))]


class GlobalBatchSampler(torch.utils.data.Sampler):
    """Batches of one process's share of seeded global batches (a distributed sampler).

    Epoch ``e``'s order is ``torch.randperm(n)`` drawn from a generator seeded with
    ``mix_seed(seed, e)`` (the same in every process), cut into global batches of
    ``batch_size`` rows (the last one shorter). Process ``rank`` of ``world_size`` takes a
    contiguous chunk of every global batch: sizes differ by at most one, and the ranks' chunks
    concatenated in rank order are exactly the single-process batch, rows in the same order.
    Unlike ``torch.utils.data.DistributedSampler`` nothing is padded or dropped (a chunk of the
    last batch may be empty when it has fewer rows than processes), so N processes see the same
    examples as one.

    Items are ``(row, epoch)`` pairs, so a dataset can seed each row's augmentation from
    ``(seed, epoch, row)`` whatever process or worker loads it.

    ``drop_last`` (``TrainConfig.drop_last``; training only) leaves out the last, shorter
    global batch of every epoch (an error when ``n < batch_size``: no batch would be left).

    >>> s = GlobalBatchSampler(5, 4, seed=0, rank=1, world_size=2)
    >>> [len(b) for b in s], s.chunk_sizes(1)
    ([2, 0], [1, 0])
    """

    def __init__(self, n: int, batch_size: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1, shuffle: bool = True, drop_last: bool = False):
        if n < 1 or batch_size < 1:
            raise ValueError(f"GlobalBatchSampler needs n >= 1 and batch_size >= 1, got n={n}, "
                             f"batch_size={batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world_size, self.shuffle = rank, world_size, shuffle
        self.drop_last = bool(drop_last)
        self.rows_per_epoch = epoch_rows(n, batch_size, self.drop_last)  # (checks n, too)
        self.epoch = 0
        self._cache = (None, None)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def global_batches(self, epoch: int | None = None) -> list[torch.Tensor]:
        """The global batches (row indices) of ``epoch`` (default: the current one)."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self._cache[0] != epoch:
            if self.shuffle:
                gen = torch.Generator().manual_seed(mix_seed(self.seed, epoch))
                order = torch.randperm(self.n, generator=gen)
            else:
                order = torch.arange(self.n)
            batches = list(torch.split(order[:self.rows_per_epoch], self.batch_size))
            self._cache = (epoch, batches)
        return self._cache[1]

    def chunk_sizes(self, size: int) -> list[int]:
        """How a global batch of ``size`` rows is shared among the processes."""
        return shares(size, self.world_size)

    def local_slice(self, size: int) -> slice:
        sizes = self.chunk_sizes(size)
        begin = sum(sizes[:self.rank])
        return slice(begin, begin + sizes[self.rank])

    def __len__(self) -> int:
        return math.ceil(self.rows_per_epoch / self.batch_size)

    def __iter__(self):
        epoch = self.epoch
        for batch in self.global_batches(epoch):
            yield [(int(r), epoch) for r in batch[self.local_slice(len(batch))]]


def default_image_reader() -> Callable:
    """`spmlkit.data.image_files.open_image`: an RGB PIL image, ``FileNotFoundError`` /
    ``ValueError`` naming a missing or corrupt file."""
    from ..data.image_files import open_image

    return open_image


class ImageItems(torch.utils.data.Dataset):
    """Image items (paths) through a transform; a key is a row or a ``(row, epoch)`` pair.

    With ``(row, epoch)`` the transform gets a ``torch.Generator`` seeded with
    ``mix_seed(seed, epoch, row)``: a row's augmentation depends on the seed, the epoch and the
    row only (not on the worker, the process or the batch it lands in). With a bare row the
    transform gets ``None`` (deterministic eval transforms). Returns ``(image, flip, row)``
    (`load_view`): a uint8 image for the transforms of `spmlkit.data.transforms`,
    whose cheap steps `finish_view` runs in the training process. ``raw=True``
    (``--gpu-decode``): the file's bytes, decoded on the device by `finish_view`.
    """

    def __init__(self, items: Sequence, transform: Callable, read: Callable | None = None,
                 seed: int = 0, raw: bool = False):
        self.items = items
        self.transform = transform
        self.read = image_reader(read, transform, items)
        self.seed = int(seed)
        self.raw = bool(raw)
        if self.raw:
            gpu_decodable(transform)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key):
        row, epoch = key if isinstance(key, tuple) else (key, None)
        item = self.items[row]
        gen = None if epoch is None else \
            torch.Generator().manual_seed(mix_seed(self.seed, epoch, row))
        if self.raw:
            return raw_item(item, self.transform, gen), row
        img = self.read(item) if isinstance(item, (str, bytes)) or hasattr(item, "__fspath__") \
            else item
        return load_view(self.transform, img, gen), row


class _Collate:
    """Stacks ``((image, flip), row)`` items into ``(images, flips, rows)`` (raw files: one
    `spmlkit.data.image_views.RawFiles`). An empty chunk (many processes, a short last
    batch) becomes an empty ``0 x C x H x W`` batch so that every process still runs its
    step."""

    def __init__(self, shape: tuple):
        self.shape = tuple(shape)

    def __call__(self, batch):
        if not batch:
            return (torch.empty((0, *self.shape)), torch.empty(0, dtype=torch.bool),
                    torch.empty(0, dtype=torch.long))
        views, rows = zip(*batch)
        xs, flips = zip(*views)
        return stack_views(xs), torch.tensor(flips, dtype=torch.bool), \
            torch.tensor(rows, dtype=torch.long)


def make_loader(dataset, batch_sampler, config: TrainConfig, shape, device,
                persistent: bool = True, batch_size: int | None = None
                ) -> torch.utils.data.DataLoader:
    """A DataLoader over ``batch_sampler``'s batches: persistent workers (started once per run),
    pinned memory on CUDA, `prefetch_factor` batches per worker. It has a generator of
    its own: the base seed that a DataLoader draws for its workers comes from it, not from (and
    without advancing) torch's global RNG, so training draws the same global random numbers
    (dropout) whether the loader is new or persistent (a resumed run builds a new one)."""
    workers = loader_workers(config.num_workers)
    more = {"prefetch_factor": prefetch_factor(batch_size or config.batch_size)} \
        if workers else {}
    return torch.utils.data.DataLoader(dataset, batch_sampler=batch_sampler, num_workers=workers,
                                       collate_fn=_Collate(shape),
                                       pin_memory=device.type == "cuda",
                                       persistent_workers=persistent and workers > 0,
                                       worker_init_fn=loader_worker_init,
                                       generator=torch.Generator(), **more)


class _Rows(torch.utils.data.Sampler):
    """Consecutive batches of a fixed list of rows (prediction passes)."""

    def __init__(self, rows: Sequence[int], batch_size: int):
        self.rows, self.batch_size = list(rows), batch_size

    def __len__(self) -> int:
        return math.ceil(len(self.rows) / self.batch_size)

    def __iter__(self):
        for i in range(0, len(self.rows), self.batch_size):
            yield self.rows[i:i + self.batch_size]


class ItemPredictor:
    """Eval-mode outputs of a module on every item, in row order, gathered across processes.

    Each process predicts a contiguous share of the rows (eval transform, no randomness,
    ``config.num_workers`` persistent workers: started at the first pass, kept for the next
    ones); the shares are all-gathered, so
    every process gets the full ``N x ...`` output. AMP on CUDA as in training; outputs are
    float32, written batch by batch into one N x ... tensor (no list of batches joined at the
    end: the output exists once), or into ``out`` (`__call__`).
    """

    def __init__(self, items: Sequence, transform: Callable, config: TrainConfig,
                 shape: tuple, device: torch.device, read: Callable | None = None,
                 ctx: "dist_utils.DistContext | None" = None):
        self.ctx = ctx or dist_utils.DistContext()
        self.n = len(items)
        self.sizes = shares(self.n, self.ctx.world_size)
        begin = sum(self.sizes[:self.ctx.rank])
        rows = range(begin, begin + self.sizes[self.ctx.rank])
        batch = config.eval_batch_size or max(64, config.batch_size)
        self.device = device
        self.amp = amp_dtype(config.amp, device)
        self.channels_last = device.type == "cuda" and config.channels_last
        self.transform = transform
        accel = current_acceleration()
        accel.check(device, "this prediction pass")
        raw = self.ahead = accel.gpu_decode
        self.loader = make_loader(ImageItems(items, transform, read, raw=raw), _Rows(rows, batch),
                                  config, shape, device, batch_size=batch) if len(rows) else None

    @torch.no_grad()
    def __call__(self, module: nn.Module, out=None):
        """The outputs of ``module`` on every item: an N x ... float32 tensor on the device, or,
        with ``out`` (a writable N x ... numpy array, e.g. a memory map of a file; one process
        only), written into ``out`` on the CPU batch by batch and ``out`` returned, so the
        outputs of a large set never sit in memory."""
        if out is not None and self.ctx.world_size > 1:
            raise ValueError("ItemPredictor: out= is for one process (under torchrun every "
                             "process gets every row)")
        if out is not None and len(out) != self.n:
            raise ValueError(f"ItemPredictor: out has {len(out)} rows for {self.n} items")
        was = module.training
        module.eval()
        local, start = out, 0
        for inputs in finished_batches(self.loader or (), self._finish, self.device,
                                       ahead=self.ahead):
            part = run_model(module, inputs, self.device, self.amp, self.channels_last).float()
            if local is None:
                local = torch.empty((self.sizes[self.ctx.rank], *part.shape[1:]),
                                    dtype=torch.float32, device=part.device)
            if tuple(part.shape[1:]) != tuple(local.shape[1:]):
                raise ValueError(f"the module gives outputs of shape {tuple(part.shape[1:])} "
                                 f"per item; they are written into an array of "
                                 f"{tuple(local.shape[1:])} per row")
            if out is None:
                local[start:start + len(part)] = part
            else:
                local[start:start + len(part)] = part.cpu().numpy()
            start += len(part)
        module.train(was)
        if self.ctx.world_size == 1:
            return local
        return dist_utils.all_gather_rows(local, self.sizes, device=self.device)

    def _finish(self, batch) -> torch.Tensor:
        inputs, flips, _ = batch
        return finish_view(self.transform, inputs, flips, self.device)


def _image_geometry(model: nn.Module, config: TrainConfig) -> tuple[int, tuple, tuple]:
    """``(size, mean, std)`` of the model's input: ``config.image_size`` or the backbone's."""
    backbone = getattr(model, "backbone", model)
    size = config.image_size or getattr(backbone, "input_size", None)
    if isinstance(size, (tuple, list)):
        size = int(size[-1])
    if not size:
        raise ValueError(f"the image size is unknown: {type(backbone).__name__} has no "
                         f"input_size; set TrainConfig(image_size=...) (spml train "
                         f"--image-size)")
    mean = tuple(getattr(backbone, "mean", (0.485, 0.456, 0.406)))
    std = tuple(getattr(backbone, "std", (0.229, 0.224, 0.225)))
    return int(size), mean, std


def _transforms(model, config, train_transform, eval_transform, train: bool = True):
    """The (train, eval) transforms, defaults from `spmlkit.data.transforms` at the
    backbone's size, mean and std; and the input shape. ``train=False``: eval only."""
    size, mean, std = _image_geometry(model, config)
    if (train and train_transform is None) or eval_transform is None:
        from ..data import transforms as T

        if train and train_transform is None:
            train_transform = T.weak_view(size, mean, std)
        if eval_transform is None:
            eval_transform = T.eval_transform(size, mean, std)
    return train_transform, eval_transform, (3, size, size)


def check_items(items, name: str) -> Sequence:
    """``items`` when they are a non-empty sequence of image items (not a feature matrix)."""
    if isinstance(items, np.ndarray) and items.dtype.kind == "f":
        raise ValueError(f"{name} are a feature matrix {items.shape}; fine-tuning takes image "
                         f"items (paths). Train on features with mode 'linear'")
    if len(items) == 0:
        raise ValueError(f"{name} are empty")
    return items

