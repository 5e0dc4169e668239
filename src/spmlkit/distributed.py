"""Many processes: ``torchrun --nproc_per_node=N`` for fine-tuning.

``spml train --mode finetune`` (or ``linear_init``) under ``torchrun`` calls
`init_distributed`, which reads torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and starts the process group: ``nccl`` on CUDA,
``gloo`` on a CPU. `spmlkit.engine.fit_finetune` then trains under
``DistributedDataParallel`` (DDP). What is synchronised, and how:

- **Batches.** ``TrainConfig.batch_size`` is the global batch. Every process draws the same
  seeded permutation and takes a contiguous share of each global batch
  (`spmlkit.engine.GlobalBatchSampler`); the shares, concatenated in rank order, are the
  single-process batch. Augmentations are seeded per ``(seed, epoch, row)``.
- **The loss sees the global batch.** Each process's logits are all-gathered with
  `gather_rows` (differentiable: its backward sums the processes' gradients and returns
  this process's rows), and every process evaluates the loss on the whole global batch, with
  the global rows as ``index``. So a loss's batch-level terms (EPR's expected positive count,
  the high-rank regulariser, LL's top-k selection) and its per-example state see exactly what
  one process would. The model's gradient is then this process's share times N, and DDP's
  average over the N processes makes it the single-process gradient.
- **The loss's own parameters (ROLE's ``label_logits``, N_train x L) are not handed to DDP,
  and their gradients are not all-reduced.** Every process computes the same loss on the same
  gathered batch, so every process already holds the global gradient of the estimator; an
  all-reduce would only average N equal copies, at the price of a dense N_train x L tensor per
  step (COCO: 65,665 x 80 floats = 21 MB, as much as the backbone's own gradients). Each
  process steps its own copy; `broadcast_state` copies process 0's loss state (parameters
  and buffers) to the others after ``on_train_start`` and after every epoch, so that rounding
  differences of non-deterministic GPU kernels cannot make the copies drift apart.
- **Per-example buffers updated from predictions** (em_apl's pseudo-labels, soft OPML's AP and
  corrections): the train predictions are gathered (`all_gather_rows`) into the logits of
  every row, in row order, in every process, before ``on_epoch_end``.
- **Evaluation**: val predictions are gathered the same way and every process computes the same
  val mAP (so early stopping and best-epoch selection agree without a broadcast); files (the
  run folder, ``best.pt``) are written by process 0 only.

Not synchronised: BatchNorm statistics are those of each process's share of the batch, as in
any DDP run (the running averages are DDP's, broadcast from process 0 at every forward).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class DistContext:
    """This process's place: ``rank`` of ``world_size``, its ``device``."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer (torchrun "
                         f"sets it; unset it to run in one process)") from None


def init_distributed(device: str = "cpu", timeout_s: float | None = None) -> DistContext:
    """Start the process group from torchrun's environment (no-op in a single process).

    Backend ``nccl`` when ``device`` is CUDA (each process then uses ``cuda:LOCAL_RANK``),
    ``gloo`` otherwise. Calling it again once the group exists returns the context.
    """
    world = _env_int("WORLD_SIZE", 1)
    if world > 1 and not dist.is_initialized():
        cuda = str(device).startswith("cuda")
        if cuda:
            if not torch.cuda.is_available():
                raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")
            torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
        for var in ("MASTER_ADDR", "MASTER_PORT", "RANK"):
            if var not in os.environ:
                raise ValueError(f"WORLD_SIZE={world} but {var} is not set: start many processes "
                                 f"with `torchrun --nproc_per_node=N ...`")
        kwargs = {}
        if timeout_s is not None:
            from datetime import timedelta

            kwargs["timeout"] = timedelta(seconds=timeout_s)
        dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", **kwargs)
    return current_context(device)


def current_context(device: str = "cpu") -> DistContext:
    """The running process group's rank and size (1 process when there is none) and the device
    this process trains on (``cuda:LOCAL_RANK`` for CUDA with many processes)."""
    if dist.is_available() and dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
    else:
        world, rank = 1, 0
    local = _env_int("LOCAL_RANK", rank) if world > 1 else 0
    dev = torch.device(device)
    if dev.type == "cuda" and world > 1 and dev.index is None:
        dev = torch.device("cuda", local)
    return DistContext(world, rank, local, dev)


def wrap_model(model: nn.Module, ctx: DistContext) -> nn.Module:
    """``DistributedDataParallel(model)`` with many processes, else ``model`` itself."""
    if ctx.world_size == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DDP(model, device_ids=ids)


def _padded(local: torch.Tensor, width: int) -> torch.Tensor:
    out = local.new_zeros((width, *local.shape[1:]))
    out[:len(local)] = local
    return out


def _gather(local: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    width = max(sizes)
    parts = [local.new_empty((width, *local.shape[1:])) for _ in sizes]
    dist.all_gather(parts, _padded(local, width).contiguous())
    return torch.cat([p[:s] for p, s in zip(parts, sizes)])


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, sizes, rank):
        ctx.sizes, ctx.rank = sizes, rank
        return _gather(local, sizes)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)  # sum of every process's gradient of its (global) loss
        begin = sum(ctx.sizes[:ctx.rank])
        return grad[begin:begin + ctx.sizes[ctx.rank]], None, None


def gather_rows(local: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Concatenate every process's rows (``sizes[r]`` from process ``r``), differentiably.

    Forward: an all-gather (padded to the largest share). Backward: the gradients of all
    processes are summed (all-reduce) and each process keeps its own rows, so that with every
    process computing the same loss on the gathered batch, a process's parameters receive N
    times its share of the gradient and DDP's average over N processes is the full gradient.
    """
    if len(sizes) == 1:
        return local
    return _GatherRows.apply(local, list(sizes), dist.get_rank())


@torch.no_grad()
def all_gather_rows(local: torch.Tensor | None, sizes: list[int],
                    device: torch.device | None = None) -> torch.Tensor:
    """Concatenate every process's rows (no gradient). ``local`` may be None in a process with
    no rows; the others tell it the trailing shape and dtype."""
    meta = None if local is None else (tuple(local.shape[1:]), str(local.dtype).split(".")[-1])
    metas = [None] * dist.get_world_size()
    dist.all_gather_object(metas, meta)
    known = next((m for m in metas if m is not None), None)
    if known is None:
        raise ValueError("all_gather_rows: no process has any row")
    if local is None:
        local = torch.empty((0, *known[0]), dtype=getattr(torch, known[1]), device=device)
    return _gather(local, list(sizes))


@torch.no_grad()
def broadcast_state(module: nn.Module, src: int = 0) -> None:
    """Copy process ``src``'s parameters and buffers of ``module`` to every process (in place;
    tensors must already have the same shapes everywhere)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.numel() == 0:
            continue
        data = tensor.data
        if data.dtype == torch.bool:  # gloo has no bool: same bytes as uint8
            data = data.view(torch.uint8)
        dist.broadcast(data, src)
