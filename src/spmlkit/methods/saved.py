"""A finished run's model, rebuilt from its folder (`load_run_model`): what ``spml predict``,
the figures and the analyses load."""
from __future__ import annotations

import torch

from ..runs import BEST_FILE, read_run
from .contract import get_method


def _head_outputs(model, info: dict) -> int | None:
    """How many outputs ``model`` gives: one forward pass of a zero row for a head on feature
    vectors, the head's weight rows for an image model with a linear ``head``; None when it
    cannot be told cheaply."""
    width = info.get("in_features")
    if info.get("inputs") == "features" and isinstance(width, int) and width > 0:
        try:
            with torch.no_grad():
                return int(model.eval()(torch.zeros(1, width)).shape[-1])
        except (RuntimeError, ValueError, TypeError):
            return None
    weight = getattr(getattr(model, "head", None), "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) and weight.ndim == 2 \
        else None


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def load_run_model(run, device: str = "cpu") -> tuple[torch.nn.Module, dict]:
    """The best model of a finished run folder, in eval mode, and what is needed to feed it.

    Returns ``(model, info)``: ``model`` maps inputs to logits; ``info["inputs"]`` says which
    inputs: ``"features"`` (a linear head on feature vectors: apply ``info["preprocess"]``
    first, see `preprocess_features`) or ``"images"`` (3 x S x S tensors normalised with
    ``info["mean"]`` / ``info["std"]`` at side ``info["image_size"]``). ``info`` also holds
    ``mode``, ``class_names``, ``num_classes``, ``config`` (config.json) and ``checkpoint``
    (best.pt without the weights). Checkpoints load with ``weights_only=True``.
    """
    run = read_run(run)
    best = run.best()
    where = run.path / BEST_FILE
    names, count = best.get("class_names"), best.get("num_classes")
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, (str, int)) for n in names) \
            or not isinstance(count, int) or len(names) != count:
        raise ValueError(f"{where}: its class_names ({_short(names)}) are not a list of "
                         f"{count!r} names (num_classes): the file is damaged or was edited; "
                         f"train the run again")
    mode = best.get("mode", run.config.get("mode", "linear"))
    try:
        model, info = get_method(str(mode)).load_model(best, run.config)
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        raise ValueError(f"{where}: not a checkpoint this spmlkit can read ({type(err).__name__}: "
                         f"{str(err)[:200]}); the file is damaged or was edited, or was written "
                         f"by another version: train the run again") from None
    outputs = _head_outputs(model, info)
    if outputs is not None and outputs != count:
        raise ValueError(f"{where}: the model has {outputs} outputs but num_classes is "
                         f"{count}: the file is damaged or was edited; train the run again")
    bad = [name for name, t in model.state_dict().items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:  # its predictions would be NaN, every one
        raise ValueError(f"{run.path / 'best.pt'}: the model's weights hold NaN or inf "
                         f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); the file is "
                         f"damaged or was edited: train the run again")
    info = {"mode": mode, "class_names": list(best["class_names"]),
            "num_classes": int(best["num_classes"]), "config": run.config,
            "checkpoint": {k: v for k, v in best.items() if k != "model"},
            "preprocess": best.get("preprocess") or {},
            "feature_columns": best.get("feature_columns"), "id_column": best.get("id_column"),
            **info}
    return model.to(device).eval(), info
