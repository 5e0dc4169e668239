"""The one loss registry (filled by the family modules as they are imported)."""
from __future__ import annotations

from ..registry import Registry

LOSSES = Registry("loss", reserved={
    "reg": "create_loss's own (the regularisers on the logits: --reg, a study's reg)"})
register = LOSSES.register
