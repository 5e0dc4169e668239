"""Loss registry: ``create_loss(name, **hparams)`` and ``list_losses()``.

>>> import torch
>>> loss = create_loss("an")
>>> float(loss(torch.zeros(2, 3), torch.tensor([[1, 0, 0], [0, 1, 0]]))) > 0
True
"""
from __future__ import annotations

import inspect
import numbers

import numpy as np

from . import cole  # noqa: F401  (registers the Cole et al. losses)
from . import zhou  # noqa: F401
from . import large_loss, opml  # noqa: F401
from . import robust  # noqa: F401  (GR, Hill, SPLC)
from . import scorer  # noqa: F401  (em_pl, gpr: an external scorer's pseudo-labels)
from . import crisp  # noqa: F401  (CRISP: class-prior estimation)
from . import pu  # noqa: F401  (vpu: PU-MLC's variational PU loss)
from .contract import SPMLLoss, check_hparams
from .inputs import TrainInfo, check_observed
from .logspace import log_1mp, log_p, soft_bce
from .own_loop import HOOKS, carry_state, hooks_driven, observed_validated
from .registry import LOSSES
from .asset import ASSET_HPARAMS, AssetRegularized, bind_groups
from .regularizers import REGULARIZERS, Regularized, parse_regularizers


def create_loss(name: str, reg=None, **hparams) -> SPMLLoss:
    """Build the registered loss ``name`` with ``hparams`` (unknown names raise ``ValueError``).

    ``reg`` adds regularisers on the batch logits to any loss (see
    `spmlkit.losses.regularizers`): ``"highrank:1e-3"``, a list of such specs, or one
    comma-separated string; the loss is then wrapped in `Regularized`.

    A value whose default is a number must be a number, one whose default is a bool a bool
    (``lam="abc"`` names ``lam``, instead of ``float()``'s "could not convert string").

    Every loss also takes the L48 benchmark's asset (group) regulariser,
    ``asset_alpha`` (> 0 turns it on), ``asset_eps`` and ``asset_init``
    (`spmlkit.losses.asset`); the loss is then wrapped in `AssetRegularized`, whose
    rows' groups come from the data (`bind_groups`).
    """
    check_loss_hparams(name, hparams)
    asset = {key: hparams.pop(key) for key in ASSET_HPARAMS if key in hparams}
    entry = LOSSES.get(name)
    loss = entry.factory(**{**entry.defaults, **hparams})
    specs = parse_regularizers(reg)
    if asset.get("asset_alpha"):
        return AssetRegularized(loss, specs, **asset)
    if any(asset.get(key) not in (None, ASSET_HPARAMS[key]) for key in asset):
        raise ValueError(f"loss {entry.name!r}: {sorted(asset)} set the asset regulariser, "
                         f"which is off without asset_alpha > 0 (e.g. asset_alpha=0.1)")
    return Regularized(loss, specs) if specs else loss


def check_loss_hparams(name: str, hparams: dict) -> None:
    """Refuse a hyperparameter the loss ``name`` does not take, or a value its class's
    constraints table refuses (`spmlkit.losses.contract.check_hparams`), or, for one without
    a rule (a loss of your own), a value of another kind than its default: a ValueError
    naming it. What `create_loss` checks first, for callers that check before they load data."""
    entry = LOSSES.get(name)
    known = {**loss_hparams(name), **ASSET_HPARAMS}
    unknown = sorted(set(hparams) - set(known))
    if unknown:
        raise ValueError(f"loss {entry.name!r} has no hyperparameter(s) {unknown}; it takes "
                         f"{sorted(known)}")
    check_hparams(entry.factory, hparams, entry.name)
    check_hparams(AssetRegularized, hparams, entry.name)  # the term every loss takes
    for key, value in hparams.items():
        if key in ASSET_HPARAMS:
            continue
        default = known[key]
        number = isinstance(default, numbers.Real) and not isinstance(default, bool)
        if number and (isinstance(value, bool) or not isinstance(value, numbers.Real)) or \
                isinstance(default, bool) and not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"loss {entry.name!r}: hyperparameter {key}={value!r} must be "
                             f"{'a number' if number else 'true or false'} (default {default})")


def loss_hparams(name: str) -> dict:
    """The hyperparameters of loss ``name`` with their defaults (walking the class chain)."""
    entry = LOSSES.get(name)
    out = {}
    for klass in reversed(inspect.getmro(entry.factory)):
        # spmlkit's classes and a user's own (registered from any module); not nn.Module's
        if "__init__" in vars(klass) and klass.__module__.split(".")[0] not in ("torch",
                                                                                 "builtins"):
            for n, p in inspect.signature(klass.__init__).parameters.items():
                if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                    out[n] = p.default
    out.update(entry.defaults)
    return out


def list_losses() -> list[tuple[str, str]]:
    """``(name, one-line description)`` of every registered loss."""
    return [(e.name, e.description) for e in LOSSES.entries()]


__all__ = ["ASSET_HPARAMS", "AssetRegularized", "bind_groups",
           "HOOKS", "LOSSES", "REGULARIZERS", "Regularized", "SPMLLoss", "TrainInfo",
           "carry_state", "check_loss_hparams", "check_observed", "hooks_driven",
           "create_loss", "list_losses", "loss_hparams", "observed_validated",
           "log_p", "log_1mp", "soft_bce"]
