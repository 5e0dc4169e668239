"""Which runs of a study train together (stacked) and how the tasks are cut for the workers."""
from __future__ import annotations

import json

from .expand import RunTask


def group_tasks(tasks: list[RunTask], jobs: int = 1) -> list:
    """The tasks of a study as the workers get them: single `RunTask` s, and lists of
    tasks that train together (the linear mode's stacked runs,
    `spmlkit.engine.vectorised`).

    Runs group when they differ only in seed, learning rate and weight decay (same dataset and
    options, regime, method, loss and hyperparameters, ``k`` as resolved for the run (an
    ``estimate:`` / ``interval:`` k is resolved here, with the run's seed), batch size and the
    rest of the train config, mode options), their mode can train several at once
    with their options (``TrainingMethod.can_stack``) and their loss can be stacked
    (`spmlkit.engine.vectorised.can_stack`). Runs of closed-form losses
    (`spmlkit.engine.vectorised.closed_form`: AN, AN-LS, WAN, EPR, BCE, ...) group across
    losses, hyperparameters, regimes and ``k`` too (one stack for the BCE family of a batch
    size). A group is cut into chunks of at most
    `spmlkit.engine.vectorised.stack_limit` runs (memory, and on a CPU whether the
    per-step work is small enough to gain: 1 means the runs stay single), and the largest
    groups are halved until there are at least ``jobs`` tasks, so every worker has work.
    """
    groups: dict = {}
    closed: dict = {}  # (loss, hparams) -> closed_form
    out: list = []
    for t in tasks:
        key = _stack_key(t, closed)
        if key is None:  # trains alone
            out.append(t)
        else:
            groups.setdefault(key, []).append(t)
    shapes: dict = {}  # (dataset, regime, options) -> the shape stack_limit needs, or None
    for members in groups.values():
        out.extend(_cut(members, shapes))
    _spread(out, jobs)
    return [t[0] if isinstance(t, list) and len(t) == 1 else t for t in out]


def _stack_key(t: RunTask, closed: dict) -> str | None:
    """What runs stacked with ``t`` share (its group's key), or None when ``t`` trains alone:
    its method does not stack it (``TrainingMethod.can_stack``), or its k cannot be resolved.
    ``closed`` caches whether a (loss, hyperparameters) is closed-form."""
    from ...engine.vectorised import closed_form
    from ...losses import create_loss
    from ...methods import get_method, resolve_k
    from ..pool import cached_splits

    if get_method(t.mode).can_stack(t.mode_options) is not None:
        return None
    k = t.k
    if isinstance(k, str):  # the value the run will train with (a stack shares one k)
        try:
            k = resolve_k(k, cached_splits(t.dataset, t.regime, t.dataset_options), t.seed)
        except Exception:  # noqa: BLE001 (the run itself will say what is wrong)
            return None
    from ...engine.vectorised import STACKED_AXES

    rest = {k_: v for k_, v in t.train.items() if k_ not in STACKED_AXES}
    own = [t.regime, t.method, t.loss, t.hparams, k]
    spec = json.dumps([t.loss, t.hparams], sort_keys=True, default=str)
    if spec not in closed:
        try:
            closed[spec] = closed_form(create_loss(t.loss, **t.hparams))
        except (TypeError, ValueError):  # the run itself will say what is wrong
            closed[spec] = False
    if closed[spec]:
        own = ["closed-form"]
    return json.dumps([t.dataset, t.dataset_options, *own, t.mode, rest, t.mode_options],
                      sort_keys=True, default=str)


def _cut(members: list, shapes: dict) -> list:
    """The units of one group: its runs single (its loss cannot be stacked on the device, its
    data cannot be loaded, or `stack_limit` says 1), or
    chunks of equal size of at most the stack limit. ``shapes`` caches the data's shapes."""
    import numpy as np

    from ...loading import load_splits
    from ...engine import TrainConfig
    from ...engine.vectorised import can_stack, stack_limit
    from ...losses import create_loss

    first = members[0]
    try:
        loss = create_loss(first.loss, **first.hparams)
        config = TrainConfig(**first.train)
    except (TypeError, ValueError):  # the run itself will say what is wrong
        return list(members)
    if len(members) < 2 or can_stack(loss, config) is not None:
        return list(members)
    data = (first.dataset, first.regime, json.dumps(first.dataset_options, sort_keys=True,
                                                    default=str))
    if data not in shapes:
        try:
            splits = load_splits(first.dataset, first.regime, **first.dataset_options)
            shapes[data] = (len(splits.train), len(splits.val),
                            int(np.shape(splits.train.x)[1]), len(splits.class_names))
            del splits
        except Exception:  # noqa: BLE001 (the runs report it)
            shapes[data] = None
    if shapes[data] is None:
        return list(members)
    limit = stack_limit(*shapes[data], config.batch_size, loss, config.device)
    if limit < 2:
        return list(members)
    chunks = -(-len(members) // limit)
    size = -(-len(members) // chunks)
    return [members[i:i + size] for i in range(0, len(members), size)]


def _spread(out: list, jobs: int) -> None:
    """Halve the largest group of ``out`` (in place) until every one of ``jobs`` workers has a
    task, or no group of 4 or more is left."""
    while len(out) < jobs:
        big = max((i for i, t in enumerate(out) if isinstance(t, list)),
                  key=lambda i: len(out[i]), default=None)
        if big is None or len(out[big]) < 4:
            break
        members = out.pop(big)
        half = len(members) // 2
        out += [members[:half], members[half:]]
