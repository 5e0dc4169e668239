"""The training loop, shared by every mode.

:func:`train_loop` is the one loop: epochs, the loss's hooks, the optimiser step, val selection,
early stopping. The modes differ only in where batches come from and how a batch becomes logits:

- :func:`fit_linear` (linear mode): a linear head on features held in memory. One epoch = a
  seeded permutation of the train rows, cut into batches that index pre-loaded tensors (no
  per-row ``DataLoader``).
- :func:`fit_finetune` (end to end from image items): a ``torch`` ``DataLoader`` with worker
  processes and a seeded sampler; the weak view for training, the eval transform for val and
  train predictions; AMP and channels-last on CUDA; one process or many under ``torchrun``
  (:mod:`spmlkit.distributed`).
- :func:`fit_linear_init` (Cole et al.): the linear phase on cached features, then fine-tuning
  from that head, with the loss (ROLE's label estimator) carried over.

Adam with no weight decay and no schedule (Cole et al.); the loss's own trainable state (ROLE's
label estimator) at ``loss.lr_multiplier`` times the learning rate, the head of a fine-tuned
model at ``config.head_lr_mult`` times. After every epoch the model is scored on the validation
split; the best epoch (val mAP) is kept, with optional early stopping. The engine knows a method
only through the hooks of :class:`spmlkit.losses.SPMLLoss`.
"""
from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from . import distributed as dist_utils
from .labels import validate_full_labels, validate_observed
from .losses import SPMLLoss, TrainInfo
from .metrics import map_score

AMP_MODES = ("auto", "none", "bf16", "fp16")


@dataclass
class TrainConfig:
    """Hyperparameters of one training run (Cole et al.'s linear protocol by default).

    ``early_stop``: ``"none"`` (fixed epochs, Cole), ``"patience:N"`` (stop after N epochs
    without a better val mAP; ``patience:1`` is Zhou et al.'s rule) or ``"drop:X"`` (stop when
    val mAP falls more than X points below the best, Kim et al.).

    Fine-tuning only (the linear mode ignores them):

    - ``head_lr_mult``: the head's learning rate is ``lr * head_lr_mult`` (Kim et al.: 10);
    - ``amp``: ``"auto"`` (bfloat16 where the GPU supports it, else float16), ``"bf16"``,
      ``"fp16"`` or ``"none"``; autocast runs the model only, the loss is always float32. AMP
      and ``channels_last`` apply on CUDA only (on a CPU the run is float32, contiguous);
    - ``num_workers``: ``DataLoader`` worker processes per process (0: load in the main one);
    - ``image_size``: side of the square input (default: the backbone's ``input_size``);
    - ``eval_batch_size``: batch of the prediction passes (default ``max(64, batch_size)``).

    ``batch_size`` is the global batch: under ``torchrun`` each of the N processes takes its
    share of every batch (see :class:`GlobalBatchSampler`).
    """

    epochs: int = 25
    batch_size: int = 8
    lr: float = 1e-4
    seed: int = 0
    early_stop: str = "none"
    map_convention: str = "present"
    device: str = "cpu"
    head_lr_mult: float = 1.0
    amp: str = "auto"
    channels_last: bool = True
    num_workers: int = 0
    image_size: int | None = None
    eval_batch_size: int | None = None

    def __post_init__(self):
        if self.epochs < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(f"epochs and batch_size must be >= 1 and lr > 0, got epochs="
                             f"{self.epochs}, batch_size={self.batch_size}, lr={self.lr}")
        parse_early_stop(self.early_stop)
        if not self.head_lr_mult > 0:
            raise ValueError(f"head_lr_mult must be > 0, got {self.head_lr_mult}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"amp must be one of {AMP_MODES}, got {self.amp!r}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        for name in ("image_size", "eval_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or None for the default), got {value}")


def parse_early_stop(spec: str) -> tuple[str, float]:
    kind, _, arg = str(spec).partition(":")
    try:
        if kind == "none" and not arg:
            return kind, 0.0
        if kind == "patience" and int(arg) >= 1:
            return kind, float(int(arg))
        if kind == "drop" and float(arg) >= 0:
            return kind, float(arg)
    except ValueError:
        pass
    raise ValueError(f"early_stop must be 'none', 'patience:N' (N >= 1) or 'drop:X', got {spec!r}")


@dataclass
class FitResult:
    best_epoch: int                  # 1-based
    val_map: float
    history: list = field(default_factory=list)
    seconds: float = 0.0
    stopped_early: bool = False
    linear: "FitResult | None" = None  # linear_init: the linear phase's own result


def _as_tensor(x, where: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x, dtype=np.float32))
    if t.ndim != 2:
        raise ValueError(f"{where} must be an N x D matrix, got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        rows = torch.nonzero(~torch.isfinite(t).all(dim=1)).flatten()[:5].tolist()
        raise ValueError(f"{where} hold NaN or inf (first rows: {rows})")
    return t


def make_linear_head(in_features: int, num_classes: int, seed: int) -> nn.Linear:
    """``nn.Linear`` with PyTorch's default init, drawn from ``seed`` (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(in_features, num_classes)


class LeanAdam:
    """Adam (no weight decay) that calls torch's fused Adam kernel directly.

    The update is exactly ``torch.optim.Adam(fused=True)``'s (same kernel; a test checks it),
    without ``Optimizer.step``'s per-call bookkeeping, which costs about as much as the whole
    forward and backward pass of a small linear head (~0.15 ms a step here). Param groups are
    ``(params, lr)`` pairs. Where this torch lacks the fused CPU kernel, use
    :func:`make_optimizer`'s fallback instead.
    """

    def __init__(self, groups, betas=(0.9, 0.999), eps=1e-8):
        self.groups = []
        for params, lr in groups:
            params = [p for p in params if p.requires_grad]
            self.groups.append({
                "params": params, "lr": float(lr),
                "exp_avg": [torch.zeros_like(p) for p in params],
                "exp_avg_sq": [torch.zeros_like(p) for p in params],
                "steps": [torch.zeros((), dtype=torch.float32, device=p.device)
                          for p in params]})
        self.betas, self.eps = betas, eps

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.groups:
            for p in g["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for g in self.groups:
            live = [i for i, p in enumerate(g["params"]) if p.grad is not None]
            if not live:
                continue
            steps = [g["steps"][i] for i in live]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_([g["params"][i] for i in live],
                               [g["params"][i].grad for i in live],
                               [g["exp_avg"][i] for i in live],
                               [g["exp_avg_sq"][i] for i in live], [], steps,
                               lr=g["lr"], beta1=self.betas[0], beta2=self.betas[1],
                               weight_decay=0.0, eps=self.eps, amsgrad=False, maximize=False)


def make_optimizer(model: nn.Module, loss: SPMLLoss, lr: float, head_lr_mult: float = 1.0):
    """Adam (no weight decay) over the model, plus the loss's own trainable state at
    ``lr * loss.lr_multiplier``: :class:`LeanAdam` where torch has the fused kernel for these
    tensors, else ``torch.optim.Adam``. Both expose ``zero_grad()`` and ``step()``.

    With ``head_lr_mult != 1`` the model's ``head`` (an attribute, as in
    :class:`spmlkit.models.heads.ImageClassifier`) trains at ``lr * head_lr_mult`` and the rest
    of the model at ``lr``."""
    if head_lr_mult == 1.0:
        groups = [(list(model.parameters()), lr)]
    else:
        head = getattr(model, "head", None)
        if not isinstance(head, nn.Module):
            raise ValueError(f"head_lr_mult={head_lr_mult} needs a model with a `head` module "
                             f"(e.g. spmlkit.models.heads.ImageClassifier); "
                             f"{type(model).__name__} has none")
        in_head = {id(p) for p in head.parameters()}
        groups = [([p for p in model.parameters() if id(p) not in in_head], lr),
                  (list(head.parameters()), lr * head_lr_mult)]
        groups = [(ps, g_lr) for ps, g_lr in groups if any(p.requires_grad for p in ps)]
    own = [p for p in loss.parameters() if p.requires_grad]
    if own:
        groups.append((own, lr * loss.lr_multiplier))
    try:
        opt = LeanAdam(groups)
        probe = torch.zeros(1, device=groups[0][0][0].device, requires_grad=True)
        probe.grad = torch.zeros(1, device=probe.device)
        LeanAdam([([probe], 0.0)]).step()  # raises where the kernel is missing
        return opt
    except (AttributeError, RuntimeError, NotImplementedError):
        return torch.optim.Adam([{"params": p, "lr": g_lr} for p, g_lr in groups], lr=lr)


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """Eval-mode logits of ``x`` in chunks (the mode is restored afterwards)."""
    was = model.training
    model.eval()
    out = torch.cat([model(x[i:i + chunk]) for i in range(0, len(x), chunk)]) if len(x) else \
        model(x)
    model.train(was)
    return out.float()


# ---- the loop ----------------------------------------------------------------------------------
Batch = tuple  # (inputs, observed B x L, index B): what a batch source yields


def train_loop(model: nn.Module, loss: SPMLLoss, optimizer, config: TrainConfig, *,
               num_examples: int, batches: Callable[[int], Iterable[Batch]],
               forward: Callable | None = None, step: Callable | None = None,
               evaluate: Callable[[], float] | None = None,
               train_logits: Callable[[], torch.Tensor] | None = None,
               after_epoch: Callable[[], None] | None = None,
               on_epoch: Callable[..., None] | None = None,
               start: float | None = None) -> FitResult:
    """The training loop of every mode: epochs, hooks, steps, selection, early stopping.

    The caller has already called ``loss.on_train_start`` and built ``optimizer``.

    Args:
        model: the module whose weights are selected (and handed to ``loss.penalty``).
        loss: the loss; its hooks are called here.
        optimizer: anything with ``zero_grad(set_to_none=True)`` and ``step()``.
        config: epochs, early stopping (the rest is the caller's business).
        num_examples: train rows (the per-epoch ``train_loss`` is a mean over them).
        batches: ``batches(epoch)`` yields ``(inputs, observed, index)`` for one epoch.
        forward: ``forward(inputs, observed, index) -> (logits, observed, index)``; default
            ``(model(inputs), observed, index)``. (Fine-tuning: autocast, many processes.)
        step: ``step(value)`` does backward and the optimiser step; default
            ``zero_grad(); value.backward(); optimizer.step()``.
        evaluate: returns the val mAP of the current weights (without it the last epoch is
            kept and ``val_map`` is NaN).
        train_logits: eval-mode logits of every train row in row order, called after each epoch
            when ``loss.needs_train_predictions``.
        after_epoch: called after ``loss.on_epoch_end`` (many processes: state sync).
        on_epoch: ``on_epoch(record, model, loss)`` after each epoch.
        start: ``time.perf_counter()`` of the run's start (default: now).

    Returns:
        the :class:`FitResult`; ``model`` and ``loss`` hold the best epoch's state.
    """
    start = time.perf_counter() if start is None else start
    stop_kind, stop_arg = parse_early_stop(config.early_stop)
    has_val = evaluate is not None
    best = FitResult(best_epoch=0, val_map=float("-inf"))
    best_states = None
    history = []
    for epoch in range(config.epochs):
        model.train()
        loss.on_epoch_start(epoch)
        total = 0.0
        for inputs, obs, idx in batches(epoch):
            if forward is None:
                logits = model(inputs)
            else:
                logits, obs, idx = forward(inputs, obs, idx)
            value = loss(logits, obs, index=idx)
            extra = loss.penalty(model)
            if torch.is_tensor(extra):
                value = value + extra
            if step is None:
                optimizer.zero_grad(set_to_none=True)
                value.backward()
                optimizer.step()
            else:
                step(value)
            total += float(value.detach()) * len(idx)
        logits_all = train_logits() if loss.needs_train_predictions else None
        loss.on_epoch_end(epoch, logits_all)
        if after_epoch is not None:
            after_epoch()
        record = {"epoch": epoch + 1, "train_loss": total / num_examples}
        if has_val:
            record["val_map"] = evaluate()
        score = record.get("val_map", float(epoch))
        if not np.isfinite(record["train_loss"]):
            raise FloatingPointError(f"training diverged at epoch {epoch + 1} (loss "
                                     f"{record['train_loss']}); try a smaller learning rate")
        improved = score > best.val_map
        if improved:
            best.best_epoch, best.val_map = epoch + 1, score
            best_states = (copy.deepcopy(model.state_dict()), copy.deepcopy(loss.state_dict()))
        record["best"] = improved
        history.append(record)
        if on_epoch is not None:
            on_epoch(record, model, loss)
        if has_val and _should_stop(stop_kind, stop_arg, history, best):
            best.stopped_early = epoch + 1 < config.epochs
            break
    model.load_state_dict(best_states[0])
    loss.load_state_dict(best_states[1])
    if not has_val:
        best.val_map = float("nan")
    best.history = history
    best.seconds = time.perf_counter() - start
    return best


# ---- linear mode -------------------------------------------------------------------------------
def fit_linear(x_train, observed, loss: SPMLLoss, config: TrainConfig, *, x_val=None,
               y_val=None, k: float | None = None, model: nn.Module | None = None,
               on_epoch: Callable[..., None] | None = None) -> tuple[nn.Module, FitResult]:
    """Train a linear head on in-memory features with ``loss``; select the best epoch on val.

    Args:
        x_train: N x D features of the train split.
        observed: N x L observed labels (1 / 0 / -1).
        loss: a loss from :func:`spmlkit.losses.create_loss`; its hooks are called here.
        config: :class:`TrainConfig`.
        x_val, y_val: validation features and full 0/1 labels for selection (without them the
            last epoch is kept).
        k: expected positives per example, handed to the loss through :class:`TrainInfo`.
        model: start from this head instead of a fresh ``nn.Linear``.
        on_epoch: called as ``on_epoch(record, model, loss)`` after each epoch (progress display,
            logging, diagnostics); ``model`` is in train mode and must not be modified.

    Returns:
        ``(model, result)``: the model holds the best epoch's weights, and ``loss`` the best
        epoch's state.
    """
    start = time.perf_counter()
    device = torch.device(config.device)
    x = _as_tensor(x_train, "train features").to(device)
    z = torch.as_tensor(validate_observed(observed, "train observed labels")).to(device)
    if z.shape[0] != x.shape[0]:
        raise ValueError(f"train features have {x.shape[0]} rows, observed labels "
                         f"{z.shape[0]}")
    has_val = x_val is not None and y_val is not None
    if has_val:
        xv = _as_tensor(x_val, "validation features").to(device)
        yv = validate_full_labels(y_val, "validation labels")
        if len(xv) != len(yv) or yv.shape[1] != z.shape[1]:
            raise ValueError(f"validation features {tuple(xv.shape)} and labels {yv.shape} do "
                             f"not match each other or the {z.shape[1]} train classes")
    n, num_classes = z.shape
    model = (model or make_linear_head(x.shape[1], num_classes, config.seed)).to(device)
    loss = loss.to(device)
    loss.on_train_start(z, TrainInfo(n, num_classes, k, config.seed, config.epochs))
    opt = make_optimizer(model, loss, config.lr)
    gen = torch.Generator().manual_seed(config.seed)
    bs = config.batch_size

    def batches(epoch):  # indexes the pre-loaded tensors: no per-row DataLoader
        perm = torch.randperm(n, generator=gen).to(device)
        for i in range(0, n, bs):
            idx = perm[i:i + bs]
            yield x[idx], z[idx], idx

    def evaluate():
        return map_score(torch.sigmoid(predict_logits(model, xv)).cpu().numpy(), yv,
                         config.map_convention)

    result = train_loop(model, loss, opt, config, num_examples=n, batches=batches,
                        evaluate=evaluate if has_val else None,
                        train_logits=lambda: predict_logits(model, x), on_epoch=on_epoch,
                        start=start)
    return model, result


# ---- fine-tuning ------------------------------------------------------------------------------
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

    >>> s = GlobalBatchSampler(5, 4, seed=0, rank=1, world_size=2)
    >>> [len(b) for b in s], s.chunk_sizes(1)
    ([2, 0], [1, 0])
    """

    def __init__(self, n: int, batch_size: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1, shuffle: bool = True):
        if n < 1 or batch_size < 1:
            raise ValueError(f"GlobalBatchSampler needs n >= 1 and batch_size >= 1, got n={n}, "
                             f"batch_size={batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world_size, self.shuffle = rank, world_size, shuffle
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
            self._cache = (epoch, list(torch.split(order, self.batch_size)))
        return self._cache[1]

    def chunk_sizes(self, size: int) -> list[int]:
        """How a global batch of ``size`` rows is shared among the processes."""
        return shares(size, self.world_size)

    def local_slice(self, size: int) -> slice:
        sizes = self.chunk_sizes(size)
        begin = sum(sizes[:self.rank])
        return slice(begin, begin + sizes[self.rank])

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)

    def __iter__(self):
        epoch = self.epoch
        for batch in self.global_batches(epoch):
            yield [(int(r), epoch) for r in batch[self.local_slice(len(batch))]]


def default_image_reader() -> Callable:
    """:func:`spmlkit.data.images.open_image`: an RGB PIL image, ``FileNotFoundError`` /
    ``ValueError`` naming a missing or corrupt file."""
    from .data.images import open_image

    return open_image


class ImageItems(torch.utils.data.Dataset):
    """Image items (paths) through a transform; a key is a row or a ``(row, epoch)`` pair.

    With ``(row, epoch)`` the transform gets a ``torch.Generator`` seeded with
    ``mix_seed(seed, epoch, row)``: a row's augmentation depends on the seed, the epoch and the
    row only (not on the worker, the process or the batch it lands in). With a bare row the
    transform gets ``None`` (deterministic eval transforms). Returns ``(image tensor, row)``.
    """

    def __init__(self, items: Sequence, transform: Callable, read: Callable | None = None,
                 seed: int = 0):
        self.items = items
        self.transform = transform
        self.read = read or default_image_reader()
        self.seed = int(seed)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key):
        row, epoch = key if isinstance(key, tuple) else (key, None)
        item = self.items[row]
        img = self.read(item) if isinstance(item, (str, bytes)) or hasattr(item, "__fspath__") \
            else item
        gen = None if epoch is None else \
            torch.Generator().manual_seed(mix_seed(self.seed, epoch, row))
        return self.transform(img, gen), row


class _Collate:
    """Stacks ``(tensor, row)`` pairs; an empty chunk (many processes, a short last batch)
    becomes an empty ``0 x C x H x W`` batch so that every process still runs its step."""

    def __init__(self, shape: tuple):
        self.shape = tuple(shape)

    def __call__(self, batch):
        if not batch:
            return torch.empty((0, *self.shape)), torch.empty(0, dtype=torch.long)
        xs, rows = zip(*batch)
        return torch.stack(xs), torch.tensor(rows, dtype=torch.long)


def loader_workers(n: int) -> int:
    """``n`` DataLoader workers, or 0 inside a daemonic process (a study's or benchmark's pool
    worker), which may not start children of its own."""
    import multiprocessing

    return 0 if multiprocessing.current_process().daemon else int(n)


def _loader(dataset, batch_sampler, config: TrainConfig, shape, device,
            persistent: bool = True) -> torch.utils.data.DataLoader:
    workers = loader_workers(config.num_workers)
    return torch.utils.data.DataLoader(dataset, batch_sampler=batch_sampler, num_workers=workers,
                                       collate_fn=_Collate(shape),
                                       pin_memory=device.type == "cuda",
                                       persistent_workers=persistent and workers > 0)


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
    ``config.num_workers`` workers started for each pass); the shares are all-gathered, so
    every process gets the full ``N x ...`` output. AMP on CUDA as in training; outputs are
    float32.
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
        self.amp = _amp_dtype(config.amp, device)
        self.channels_last = device.type == "cuda" and config.channels_last
        self.loader = _loader(ImageItems(items, transform, read), _Rows(rows, batch), config,
                              shape, device, persistent=False) if len(rows) else None

    @torch.no_grad()
    def __call__(self, module: nn.Module) -> torch.Tensor:
        was = module.training
        module.eval()
        outs = []
        for inputs, _ in (self.loader or ()):
            outs.append(_run(module, inputs, self.device, self.amp, self.channels_last).float())
        module.train(was)
        local = torch.cat(outs) if outs else None
        if self.ctx.world_size == 1:
            return local
        return dist_utils.all_gather_rows(local, self.sizes, device=self.device)


def _amp_dtype(amp: str, device: torch.device):
    """The autocast dtype, or None (AMP off): CUDA only."""
    if device.type != "cuda" or amp == "none":
        return None
    if amp == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if amp == "bf16" else torch.float16


def _run(module, inputs, device, amp, channels_last):
    inputs = inputs.to(device, non_blocking=True)
    if channels_last:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    if amp is None:
        return module(inputs)
    with torch.autocast(device.type, dtype=amp):
        return module(inputs)


class LossScaler:
    """Dynamic loss scaling for float16 autocast, for any optimiser with ``zero_grad``/``step``.

    The loss is multiplied by ``scale`` before backward and the gradients divided by it after;
    a step whose gradients are not all finite is skipped and the scale halved; after
    ``growth_interval`` good steps in a row the scale doubles (``torch.amp.GradScaler``'s
    policy, which needs a ``torch.optim.Optimizer``; :class:`LeanAdam` is not one). In many
    processes the gradients are already averaged when they are checked, so every process takes
    the same decision.
    """

    def __init__(self, params, init_scale: float = 2.0 ** 16, growth_interval: int = 2000):
        self.params = [p for p in params if p.requires_grad]
        self.scale, self.growth_interval, self.good = float(init_scale), growth_interval, 0
        self.skipped = 0

    def step(self, value: torch.Tensor, optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)
        (value * self.scale).backward()
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, 1.0 / self.scale)
            finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
        else:
            finite = True
        if finite:
            optimizer.step()
            self.good += 1
            if self.good >= self.growth_interval:
                self.scale, self.good = self.scale * 2.0, 0
        else:
            self.scale, self.good, self.skipped = self.scale / 2.0, 0, self.skipped + 1


def _image_geometry(model: nn.Module, config: TrainConfig) -> tuple[int, tuple, tuple]:
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
    """The (train, eval) transforms, defaults from :mod:`spmlkit.data.transforms` at the
    backbone's size, mean and std; and the input shape. ``train=False``: eval only."""
    size, mean, std = _image_geometry(model, config)
    if (train and train_transform is None) or eval_transform is None:
        from .data import transforms as T

        if train and train_transform is None:
            train_transform = T.weak_view(size, mean, std)
        if eval_transform is None:
            eval_transform = T.eval_transform(size, mean, std)
    return train_transform, eval_transform, (3, size, size)


def _check_items(items, name: str) -> Sequence:
    if isinstance(items, np.ndarray) and items.dtype.kind == "f":
        raise ValueError(f"{name} are a feature matrix {items.shape}; fine-tuning takes image "
                         f"items (paths). Train on features with mode 'linear'")
    if len(items) == 0:
        raise ValueError(f"{name} are empty")
    return items


def fit_finetune(model: nn.Module, train_items: Sequence, observed, loss: SPMLLoss,
                 config: TrainConfig, *, val_items: Sequence | None = None, y_val=None,
                 k: float | None = None, on_epoch: Callable[..., None] | None = None,
                 train_transform: Callable | None = None,
                 eval_transform: Callable | None = None,
                 image_reader: Callable | None = None) -> tuple[nn.Module, FitResult]:
    """Train ``model`` end to end on image items with ``loss``; select the best epoch on val.

    The loop is :func:`train_loop`'s; batches come from a ``DataLoader`` (``config.num_workers``
    worker processes) over a :class:`GlobalBatchSampler` seeded with ``config.seed``. Training
    images go through ``train_transform`` (default: the weak view of
    :mod:`spmlkit.data.transforms` at the backbone's size, mean and std), seeded per
    ``(seed, epoch, row)``; val and train predictions through ``eval_transform``. On CUDA the
    model runs under autocast (``config.amp``) in channels-last memory format; the loss always
    gets float32 logits. The head trains at ``config.lr * config.head_lr_mult`` (the model must
    then have a ``head``, as :class:`spmlkit.models.heads.ImageClassifier`), the loss's own
    state at ``config.lr * loss.lr_multiplier``.

    Many processes (``torchrun --nproc_per_node=N``, after
    :func:`spmlkit.distributed.init_distributed`): ``config.batch_size`` is the global batch and
    every process trains on its share under ``DistributedDataParallel``; each process's logits
    are all-gathered (differentiably) and every process evaluates the loss on the whole global
    batch, so per-example state (ROLE's estimator, pseudo-labels, LL-Cp's flips) and batch-level
    terms (EPR, the high-rank regulariser) see what one process would. ``on_epoch_end`` gets the
    gathered train logits of every row, in row order, in every process; val mAP is computed in
    every process from the gathered predictions (so early stopping agrees); ``on_epoch`` is
    called in process 0 only. See :mod:`spmlkit.distributed` for what is synchronised and why.

    Args:
        model: maps ``B x 3 x S x S`` images to ``B x L`` logits.
        train_items: N image paths (``LabelledSet.x`` of an image source) or PIL images.
        observed: N x L observed labels (1 / 0 / -1).
        loss, config, k, on_epoch: as :func:`fit_linear`.
        val_items, y_val: validation items and full 0/1 labels for selection.
        train_transform, eval_transform: ``t(img, generator) -> 3 x S x S`` tensors.
        image_reader: ``path -> PIL image`` (default ``spmlkit.data.images.open_image``).

    Returns:
        ``(model, result)``: the model (unwrapped, on ``config.device``) holds the best
        epoch's weights and ``loss`` the best epoch's state, in every process.
    """
    start = time.perf_counter()
    ctx = dist_utils.current_context(config.device)
    device = ctx.device
    train_items = _check_items(train_items, "train items")
    z = torch.as_tensor(validate_observed(observed, "train observed labels"))
    if z.shape[0] != len(train_items):
        raise ValueError(f"{len(train_items)} train items but {z.shape[0]} rows of observed "
                         f"labels")
    has_val = val_items is not None and y_val is not None
    if has_val:
        val_items = _check_items(val_items, "validation items")
        yv = validate_full_labels(y_val, "validation labels")
        if len(val_items) != len(yv) or yv.shape[1] != z.shape[1]:
            raise ValueError(f"{len(val_items)} validation items and labels {yv.shape} do not "
                             f"match each other or the {z.shape[1]} train classes")
    n, num_classes = z.shape
    train_t, eval_t, shape = _transforms(model, config, train_transform, eval_transform)
    amp = _amp_dtype(config.amp, device)
    if config.amp in ("bf16", "fp16") and device.type != "cuda":
        warnings.warn(f"amp={config.amp!r} applies on CUDA only; this {device.type} run is "
                      f"float32", stacklevel=2)
    channels_last = device.type == "cuda" and config.channels_last
    # one memory format in every process (DDP compares strides), whatever touched the model
    # before (e.g. a feature extraction that ran it channels-last in one process only)
    model = model.to(device, memory_format=torch.channels_last if channels_last
                     else torch.contiguous_format)
    loss = loss.to(device)
    z = z.to(device)
    loss.on_train_start(z, TrainInfo(n, num_classes, k, config.seed, config.epochs))
    if ctx.world_size > 1:
        dist_utils.broadcast_state(loss)  # one start in every process, whatever it drew
    opt = make_optimizer(model, loss, config.lr, config.head_lr_mult)
    net = dist_utils.wrap_model(model, ctx)
    sampler = GlobalBatchSampler(n, config.batch_size, config.seed, ctx.rank, ctx.world_size)
    loader = _loader(ImageItems(train_items, train_t, image_reader, config.seed), sampler,
                     config, shape, device)
    predict_train = ItemPredictor(train_items, eval_t, config, shape, device, image_reader, ctx)
    predict_val = ItemPredictor(val_items, eval_t, config, shape, device, image_reader, ctx) \
        if has_val else None

    def batches(epoch):
        sampler.set_epoch(epoch)
        for (inputs, _), rows in zip(loader, sampler.global_batches(epoch)):
            rows = rows.to(device)
            yield inputs, z[rows], rows  # observed labels and index of the global batch

    def forward(inputs, obs, idx):
        logits = _run(net, inputs, device, amp, channels_last).float()
        if ctx.world_size > 1:
            logits = dist_utils.gather_rows(logits, sampler.chunk_sizes(len(idx)))
        return logits, obs, idx

    scaler = LossScaler(list(model.parameters()) + list(loss.parameters())) \
        if amp == torch.float16 else None

    def evaluate():
        probs = torch.sigmoid(predict_val(model)).cpu().numpy()
        return map_score(probs, yv, config.map_convention)

    def after_epoch():
        if ctx.world_size > 1:
            dist_utils.broadcast_state(loss)

    def report(record, m, lo):
        if on_epoch is not None and ctx.is_main:
            on_epoch(record, m, lo)

    result = train_loop(model, loss, opt, config, num_examples=n, batches=batches,
                        forward=forward,
                        step=(lambda value: scaler.step(value, opt)) if scaler else None,
                        evaluate=evaluate if has_val else None,
                        train_logits=lambda: predict_train(model), after_epoch=after_epoch,
                        on_epoch=report, start=start)
    return model, result


def predict_items(model: nn.Module, items: Sequence, config: TrainConfig, *,
                  transform: Callable | None = None,
                  image_reader: Callable | None = None) -> torch.Tensor:
    """Eval-mode outputs (float32, on ``config.device``) of ``model`` on every image item, in
    row order; gathered across processes when running under ``torchrun``. ``transform``
    defaults to the eval transform at the model's size, mean and std."""
    ctx = dist_utils.current_context(config.device)
    _, eval_t, shape = _transforms(model, config, None, transform, train=False)
    model = model.to(ctx.device)
    return ItemPredictor(_check_items(items, "items"), eval_t, config, shape, ctx.device,
                         image_reader, ctx)(model)


# ---- linear_init ------------------------------------------------------------------------------
def fit_linear_init(model: nn.Module, train_items: Sequence, observed, loss: SPMLLoss,
                    config: TrainConfig, *, linear_config: TrainConfig | None = None,
                    train_features=None, val_features=None, val_items: Sequence | None = None,
                    y_val=None, k: float | None = None,
                    on_epoch: Callable[..., None] | None = None,
                    train_transform: Callable | None = None,
                    eval_transform: Callable | None = None,
                    image_reader: Callable | None = None) -> tuple[nn.Module, FitResult]:
    """Cole et al.'s ``linear_init``: a linear phase on cached features, then fine-tuning from
    that head, with the same loss object (ROLE's label estimator continues).

    Phase 1 is :func:`fit_linear` on ``train_features`` / ``val_features`` (the frozen
    backbone's pooled features of the eval-transformed images, e.g. from the feature store;
    computed here with ``model.backbone`` when not given) with ``linear_config`` (default
    ``config`` with Cole's 25 linear epochs). Its best head is copied into ``model.head`` and
    phase 2 is :func:`fit_finetune` with ``config``. ``loss`` goes from one phase to the next
    as it is: a loss whose ``on_train_start`` keeps state that fits the same labels (ROLE's
    ``label_logits``, LL-Cp's flips, soft OPML's AP and corrections, em_apl's pseudo-labels)
    continues from the linear phase's best epoch. The optimiser starts afresh (Adam moments are
    not carried over).

    ``on_epoch`` records carry ``"phase": "linear"`` or ``"finetune"``.

    Returns:
        ``(model, result)``: the fine-tuning phase's :class:`FitResult`, with the linear
        phase's in ``result.linear``.
    """
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear):
        raise ValueError(f"linear_init copies a linear head into model.head; "
                         f"{type(model).__name__} has no nn.Linear `head` (use "
                         f"spmlkit.models.heads.ImageClassifier)")
    has_val = val_items is not None and y_val is not None
    if train_features is None or (has_val and val_features is None):
        backbone = getattr(model, "backbone", None)
        if not isinstance(backbone, nn.Module):
            raise ValueError("linear_init without features needs model.backbone to compute them")
        _, eval_t, _ = _transforms(model, config, None, eval_transform, train=False)
        if train_features is None:
            train_features = predict_items(backbone, train_items, config, transform=eval_t,
                                           image_reader=image_reader).cpu()
        if has_val and val_features is None:
            val_features = predict_items(backbone, val_items, config, transform=eval_t,
                                         image_reader=image_reader).cpu()
    width = int(np.shape(train_features)[1]) if np.ndim(train_features) == 2 else -1
    if width != head.in_features:
        raise ValueError(f"train features of shape {tuple(np.shape(train_features))} do not fit "
                         f"model.head ({head.in_features} inputs): compute them with this "
                         f"model's backbone")
    linear_config = linear_config or TrainConfig(**{**asdict(config), "epochs": 25})
    lin_config = TrainConfig(**{**asdict(linear_config), "device": config.device})

    def tagged(phase):
        def call(record, m, lo):
            if on_epoch is not None:
                on_epoch({**record, "phase": phase}, m, lo)
        return call

    is_main = dist_utils.current_context(config.device).is_main
    linear_head, lin_result = fit_linear(
        train_features, observed, loss, lin_config, x_val=val_features if has_val else None,
        y_val=y_val if has_val else None, k=k, on_epoch=tagged("linear") if is_main else None)
    with torch.no_grad():
        head.weight.copy_(linear_head.weight.to(head.weight))
        head.bias.copy_(linear_head.bias.to(head.bias))
    model, result = fit_finetune(model, train_items, observed, loss, config, val_items=val_items,
                                 y_val=y_val, k=k, on_epoch=tagged("finetune"),
                                 train_transform=train_transform, eval_transform=eval_transform,
                                 image_reader=image_reader)
    result.linear = lin_result
    return model, result


def _should_stop(kind: str, arg: float, history: list, best: FitResult) -> bool:
    if kind == "patience":
        return history[-1]["epoch"] - best.best_epoch >= arg
    if kind == "drop":
        return history[-1]["val_map"] < best.val_map - arg
    return False


def config_dict(config: TrainConfig) -> dict:
    return asdict(config)
