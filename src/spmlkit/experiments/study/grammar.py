"""The method grammar of a study: ``loss[+reg...][@regime]`` specs and the reference rows."""
from __future__ import annotations

from dataclasses import dataclass


#: the reference rows of Cole et al. Table 1: name -> (loss, regime, description)
REFERENCES = {"bce": ("bce", "full", "BCE, all labels (All P. & All N.)"),
              "iun": ("bce", "1p_alln", "IUN, one positive + all negatives (1 P. & All N.)")}


# ---- method specs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Method:
    """One benchmark row: its label (the spec as given), loss, regime and regularisers."""

    label: str
    loss: str
    regime: str
    reg: tuple = ()


def parse_methods(losses, references=("bce", "iun"), regime: str = "1p") -> list[Method]:
    """``["an", "bce@full"]`` -> methods; ``"all"`` stands for every registered loss (but bce,
    a reference row, and the losses that need an external scorer's file, ``em_pl`` and ``gpr``:
    name them, with their ``scores`` in the hyperparameters) and may be combined with more specs
    (``"all,opml@full"``). ``regime``: the regime of a spec without ``@regime`` (another than
    ``1p`` is then written into its label: ``an@given``)."""
    from ...losses import LOSSES
    from ...losses.regularizers import parse_regularizers

    if isinstance(losses, str):
        given = losses
        losses = [s.strip() for s in losses.split(",") if s.strip()]
        if not losses:
            raise ValueError(f"no loss given ({given!r}: an empty --losses or methods list): "
                             f"name them, comma-separated (an,epr), or 'all'")
    every = [n for n in LOSSES.names()
             if n != "bce" and not getattr(LOSSES.get(n).factory, "needs_scores", False)]
    losses = [name for spec in losses for name in (every if spec == "all" else [spec])]
    default = regime
    out = []
    for spec in losses:
        name, _, regime = spec.partition("@")
        if name in REFERENCES and not regime:
            loss, regime, _ = REFERENCES[name]
            out.append(Method(name, loss, regime))
            continue
        name, *reg = name.split("+")
        LOSSES.get(name)  # unknown names fail here, with suggestions
        if reg:
            parse_regularizers(reg)  # so does a bad regulariser spec
        if not regime and default != "1p":
            spec, regime = f"{spec}@{default}", default
        out.append(Method(spec, name, regime or "1p", tuple(reg)))
    for ref in references or ():
        if ref not in REFERENCES:
            raise ValueError(f"unknown reference {ref!r}; known: {', '.join(REFERENCES)}")
        if all(m.label != ref for m in out):
            out.append(Method(ref, *REFERENCES[ref][:2]))
    return out



def accepted_hparams(loss: str) -> set:
    """The loss's own hyperparameters, the batch regularisers (``reg``) and the asset term's
    (``asset_alpha``, ...), which every loss takes."""
    from ...losses import ASSET_HPARAMS, loss_hparams

    return set(loss_hparams(loss)) | {"reg"} | set(ASSET_HPARAMS)

