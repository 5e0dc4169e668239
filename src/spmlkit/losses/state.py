"""Per-example state of a loss (sized by the train split: ROLE's estimator, pseudo-labels, stored
labels): read for a batch's rows, one run or stacked runs (`take_rows`), and resized when a
checkpoint of another size is loaded (`resize_state_on_load`).
"""
from __future__ import annotations

import torch
from torch import nn


def resize_state_on_load(module: nn.Module, state_dict, prefix: str, names) -> None:
    """Resize the parameters/buffers ``names`` of ``module`` to the shapes found in ``state_dict``.

    Call it at the top of ``_load_from_state_dict``, before ``super()._load_from_state_dict``:
    state sized by the train split (N_train x L: ROLE's estimator, pseudo-labels, stored labels)
    is empty on a fresh instance, and PyTorch only copies into tensors of the same shape. A tensor
    whose shape differs from the checkpoint's is replaced by an uninitialised one of the
    checkpoint's shape, with the current tensor's dtype, device and kind (a ``Parameter`` stays a
    ``Parameter`` with the same ``requires_grad``, a buffer stays a buffer, persistent or not);
    the load that follows fills it. Names absent from ``state_dict`` (or ``None`` on the module)
    are left alone, so ``strict`` loading still reports missing keys.

    >>> m = nn.Module(); m.register_buffer("seen", torch.zeros(0, 0, dtype=torch.bool))
    >>> resize_state_on_load(m, {"seen": torch.ones(2, 3, dtype=torch.bool)}, "", ["seen"])
    >>> tuple(m.seen.shape), m.seen.dtype
    ((2, 3), torch.bool)
    """
    for name in names:
        key = prefix + name
        current = getattr(module, name, None)
        incoming = state_dict.get(key)
        if current is None or not torch.is_tensor(incoming) or incoming.shape == current.shape:
            continue
        fresh = torch.empty(incoming.shape, dtype=current.dtype, device=current.device)
        if isinstance(current, nn.Parameter):
            fresh = nn.Parameter(fresh, requires_grad=current.requires_grad)
        setattr(module, name, fresh)  # a buffer's slot keeps its name and persistence


def take_rows(state: torch.Tensor, index) -> torch.Tensor:
    """The rows ``index`` of per-example state (N x ...): ``state[index]`` for one run; for runs
    stacked by the vectorised engine (``state`` R x N x ..., ``index`` R x B) each run's own rows,
    R x B x ....

    >>> take_rows(torch.arange(6).view(3, 2), torch.tensor([2, 0])).tolist()
    [[4, 5], [0, 1]]
    >>> take_rows(torch.arange(12).view(2, 3, 2), torch.tensor([[2], [0]])).tolist()
    [[[4, 5]], [[6, 7]]]
    """
    index = torch.as_tensor(index, device=state.device).long()
    if index.ndim == 1:
        return state[index]
    runs = torch.arange(index.shape[0], device=state.device).unsqueeze(1)
    return state[runs, index]
