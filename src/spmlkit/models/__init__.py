"""Models: image backbones behind one registry (`spmlkit.models.backbones`)."""
from __future__ import annotations

from .backbones import BACKBONES, Backbone, backbone_spec, create_backbone, list_backbones
from .ema import ModelEMA
from .label_embedding import LabelEmbeddingHead, LabelEmbeddingModel, sine_position_encoding

__all__ = ["BACKBONES", "Backbone", "backbone_spec", "create_backbone", "list_backbones",
           "LabelEmbeddingHead", "LabelEmbeddingModel", "ModelEMA", "sine_position_encoding"]
