"""Label-wise embedding model of LAC (Xie, Xiao, Huang, NeurIPS 2022; docs/spec.md#lac).

A backbone feature map ``B x C x H x W`` becomes one embedding per label (``B x L x d``):

1. a 1x1 convolution ``C -> d`` and a fixed 2-D sine positional encoding
   (`sine_position_encoding`, DETR style);
2. ``encoder_layers`` transformer encoder layers (post-norm, DETR) over the ``H * W`` tokens,
   the positional encoding added to queries and keys;
3. ``decoder_layers`` decoder layers **without self-attention** (Query2Label style, the
   structure of the authors' ``lib/models``; read from it, not checked value by value): the
   queries start at zero and a learnable per-label embedding ``E`` (L x d)
   is added to the query at every layer. A layer is
   ``t = LN(t + CrossAttn(q=t + E, k=memory + pos, v=memory)); t = LN(t + FFN(t))``;
4. a final LayerNorm gives the label-wise embeddings ``h`` (B x L x d).

Classifier: one linear map per label, ``logit_k = <W_k, h_k> + b_k`` (``W``: L x d, ``b``: L).
Projection head (LAC's stage 2): ``Linear(d, d) -> ReLU -> Linear(d, proj_dim)``, then L2
normalisation, so every projected label-wise embedding has unit norm.

Size: the official model uses ``d = 2048`` (ResNet-50's channels), 4 heads, FFN 8192, dropout
0.1, on 448 px images (a 14 x 14 map). A small ``d`` (64-128, FFN 4d) trains on a CPU.

Randomness: the initial weights come from ``torch.Generator().manual_seed(seed)`` (the global
RNG is neither read nor advanced). Dropout during training draws from torch's global RNG, as
``nn.Dropout`` always does; seed it in the trainer.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .rng import global_rng

__all__ = ["sine_position_encoding", "LabelEmbeddingHead", "LabelEmbeddingModel"]


def sine_position_encoding(height: int, width: int, dim: int,
                           temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2-D sine positional encoding (Carion et al., DETR, ECCV 2020): ``dim x H x W``.

    The first ``dim / 2`` channels encode the row, the last ``dim / 2`` the column. With
    ``n = dim / 2``, row ``i`` (0-based) has the normalised coordinate
    ``y = (i + 1) / H * 2 pi`` (columns alike with ``W``), and for ``m = 0 .. n/2 - 1``::

        pe[2m,     i, j] = sin(y / T^(2m / n))      pe[n + 2m,     i, j] = sin(x / T^(2m / n))
        pe[2m + 1, i, j] = cos(y / T^(2m / n))      pe[n + 2m + 1, i, j] = cos(x / T^(2m / n))

    Args:
        height, width: the feature map's size (>= 1).
        dim: number of channels; a positive multiple of 4.
        temperature: ``T``.

    Returns:
        float32 tensor ``dim x height x width``.

    Raises:
        ValueError: a size < 1, ``dim`` not a positive multiple of 4, ``temperature <= 0``.

    >>> pe = sine_position_encoding(2, 3, 8)
    >>> tuple(pe.shape), round(pe[1, 0, 0].item(), 4)  # cos(1/2 * 2 pi)
    ((8, 2, 3), -1.0)
    """
    if height < 1 or width < 1:
        raise ValueError(f"sine_position_encoding: height and width must be >= 1, got "
                         f"{height} x {width}")
    if dim < 4 or dim % 4:
        raise ValueError(f"sine_position_encoding: dim must be a positive multiple of 4 (half "
                         f"the channels per axis, sin/cos pairs), got {dim}")
    if not temperature > 0:
        raise ValueError(f"sine_position_encoding: temperature must be > 0, got {temperature}")
    n = dim // 2
    y = torch.arange(1, height + 1, dtype=torch.float64) / height * (2 * math.pi)
    x = torch.arange(1, width + 1, dtype=torch.float64) / width * (2 * math.pi)
    m = torch.arange(n // 2, dtype=torch.float64)
    freq = float(temperature) ** (2 * m / n)                         # n/2

    def axis(coord: torch.Tensor) -> torch.Tensor:                  # len -> n x len
        arg = coord[None, :] / freq[:, None]
        return torch.stack([arg.sin(), arg.cos()], dim=1).reshape(n, -1)

    pe_y = axis(y)[:, :, None].expand(n, height, width)
    pe_x = axis(x)[:, None, :].expand(n, height, width)
    return torch.cat([pe_y, pe_x], dim=0).to(torch.float32).contiguous()


class _Attention(nn.Module):
    """Multi-head attention with separate q / k / v projections, batch first.

    ``forward(query B x Lq x d, key B x Lk x d, value B x Lk x d, need_weights)`` returns the
    output ``B x Lq x d`` and, if asked, the softmax weights ``B x heads x Lq x Lk`` (before
    attention dropout, so each row sums to 1). Without weights it runs
    ``F.scaled_dot_product_attention``; with them it computes the same thing explicitly.
    """

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, n, d = t.shape
        return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, query, key, value, need_weights: bool = False):
        q = self._split(self.q_proj(query))
        k = self._split(self.k_proj(key))
        v = self._split(self.v_proj(value))
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            weights = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]), dim=-1)
            out = F.dropout(weights, p, training=self.training) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        b, _, n, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, n, -1)), weights


class _FFN(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.linear1 = nn.Linear(dim, hidden)
        self.linear2 = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(F.relu(self.linear1(x))))


class _EncoderLayer(nn.Module):
    """DETR post-norm encoder layer: self-attention (pos on q, k) + FFN, each residual + LN."""

    def __init__(self, dim, heads, ffn, dropout):
        super().__init__()
        self.attn = _Attention(dim, heads, dropout)
        self.ffn = _FFN(dim, ffn, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, src, pos):
        qk = src + pos
        src = self.norm1(src + self.drop1(self.attn(qk, qk, src)[0]))
        return self.norm2(src + self.drop2(self.ffn(src)))


class _DecoderLayer(nn.Module):
    """Decoder layer without self-attention: cross-attention + FFN, each residual + LN."""

    def __init__(self, dim, heads, ffn, dropout):
        super().__init__()
        self.attn = _Attention(dim, heads, dropout)
        self.ffn = _FFN(dim, ffn, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, tgt, memory, pos, query_pos, need_weights: bool = False):
        out, weights = self.attn(tgt + query_pos, memory + pos, memory, need_weights)
        tgt = self.norm1(tgt + self.drop1(out))
        return self.norm2(tgt + self.drop2(self.ffn(tgt))), weights


class LabelEmbeddingHead(nn.Module):
    """Label-wise embedding decoder + per-label classifier + projection head (LAC).

    Xie, Xiao, Huang, "Label-Aware Global Consistency for Multi-Label Learning with Single
    Positive Labels", NeurIPS 2022 (section 4.1, "Implementation"; the authors' code). See the
    module docstring for the architecture.

    Args:
        in_channels: ``C``, channels of the feature map.
        num_classes: ``L``.
        dim: ``d``, the embedding size (official 2048); a multiple of 4 and of ``heads``.
        heads: attention heads (official 4).
        ffn: hidden size of the feed-forward blocks; default ``4 * dim`` (official 8192).
        dropout: dropout of attention weights, residual branches and FFN (official 0.1).
        encoder_layers: transformer encoder layers over the spatial tokens (official 1; 0
            allowed).
        decoder_layers: decoder layers (official 2; >= 1).
        proj_dim: output size of the projection head (official 128).
        seed: seeds the initialisation (``torch.Generator``; the global RNG is untouched).

    Shapes: ``fmap`` is ``B x C x H x W``; logits ``B x L``; embeddings ``B x L x d``;
    projections ``B x L x proj_dim``; attention maps ``B x L x H x W``.

    Raises:
        ValueError: a size < 1, ``dim`` not a multiple of 4 or of ``heads``, dropout outside
            [0, 1); at call time, a feature map that is not 4-D or has the wrong channels.

    >>> head = LabelEmbeddingHead(16, 5, dim=32, heads=4).eval()
    >>> fmap = torch.randn(2, 16, 3, 4, generator=torch.Generator().manual_seed(0))
    >>> logits, emb = head.forward_all(fmap)
    >>> tuple(logits.shape), tuple(emb.shape), tuple(head.project(emb).shape)
    ((2, 5), (2, 5, 32), (2, 5, 128))
    >>> head.attention_maps(fmap).sum(dim=(2, 3)).allclose(torch.ones(2, 5))
    True
    """

    def __init__(self, in_channels: int, num_classes: int, dim: int = 256, heads: int = 4,
                 ffn: int | None = None, dropout: float = 0.1, encoder_layers: int = 1,
                 decoder_layers: int = 2, proj_dim: int = 128, seed: int = 0):
        super().__init__()
        ffn = 4 * dim if ffn is None else ffn
        for name, value, low in (("in_channels", in_channels, 1), ("num_classes", num_classes, 1),
                                 ("dim", dim, 1), ("heads", heads, 1), ("ffn", ffn, 1),
                                 ("encoder_layers", encoder_layers, 0),
                                 ("decoder_layers", decoder_layers, 1),
                                 ("proj_dim", proj_dim, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"LabelEmbeddingHead: {name} must be an integer >= {low}, "
                                 f"got {value!r}")
        if dim % 4:
            raise ValueError(f"LabelEmbeddingHead: dim must be a multiple of 4 (the 2-D sine "
                             f"positional encoding), got {dim}")
        if dim % heads:
            raise ValueError(f"LabelEmbeddingHead: dim ({dim}) must be divisible by heads "
                             f"({heads})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"LabelEmbeddingHead: dropout must be in [0, 1), got {dropout}")
        self.in_channels, self.num_classes, self.dim = in_channels, num_classes, dim
        self.heads, self.ffn_dim, self.proj_dim, self.seed = heads, ffn, proj_dim, seed
        with global_rng():  # default inits draw; all are overwritten below
            self.input_proj = nn.Conv2d(in_channels, dim, kernel_size=1)
            self.encoder = nn.ModuleList(_EncoderLayer(dim, heads, ffn, dropout)
                                         for _ in range(encoder_layers))
            self.decoder = nn.ModuleList(_DecoderLayer(dim, heads, ffn, dropout)
                                         for _ in range(decoder_layers))
            self.decoder_norm = nn.LayerNorm(dim)
            self.projector = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(),
                                           nn.Linear(dim, proj_dim))
        self.label_embed = nn.Parameter(torch.empty(num_classes, dim))
        self.weight = nn.Parameter(torch.empty(num_classes, dim))
        self.bias = nn.Parameter(torch.empty(num_classes))
        self._pos_cache: dict = {}
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Seeded init from ``self.seed``: Xavier-uniform matrices (as DETR / the authors'
        code), zero attention biases, ``U(+-1/sqrt(fan_in))`` other biases, N(0, 1) label
        embeddings, ``U(+-1/sqrt(d))`` classifier (Query2Label's GroupWiseLinear), LayerNorms
        at 1 / 0."""
        g = torch.Generator().manual_seed(int(self.seed))

        def linear(mod: nn.Module, zero_bias: bool = False) -> None:
            nn.init.xavier_uniform_(mod.weight, generator=g)
            if zero_bias:
                mod.bias.zero_()
            else:
                fan_in = mod.weight[0].numel()
                nn.init.uniform_(mod.bias, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in),
                                 generator=g)

        linear(self.input_proj)
        for layer in [*self.encoder, *self.decoder]:
            for proj in (layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj,
                         layer.attn.out_proj):
                linear(proj, zero_bias=True)
            linear(layer.ffn.linear1)
            linear(layer.ffn.linear2)
        for mod in self.modules():
            if isinstance(mod, nn.LayerNorm):
                nn.init.ones_(mod.weight)
                nn.init.zeros_(mod.bias)
        linear(self.projector[0])
        linear(self.projector[2])
        nn.init.normal_(self.label_embed, generator=g)
        bound = 1 / math.sqrt(self.dim)
        nn.init.uniform_(self.weight, -bound, bound, generator=g)
        nn.init.uniform_(self.bias, -bound, bound, generator=g)

    # ---- pieces --------------------------------------------------------------------------
    def _check(self, fmap: torch.Tensor) -> None:
        if not isinstance(fmap, torch.Tensor) or fmap.ndim != 4:
            shape = tuple(fmap.shape) if isinstance(fmap, torch.Tensor) else type(fmap).__name__
            raise ValueError(f"LabelEmbeddingHead expects a feature map B x C x H x W, got "
                             f"{shape}")
        if fmap.shape[1] != self.in_channels:
            raise ValueError(f"LabelEmbeddingHead was built for {self.in_channels} input "
                             f"channels, the feature map has {fmap.shape[1]} (shape "
                             f"{tuple(fmap.shape)}); was it made by another backbone?")

    def _pos(self, h: int, w: int, like: torch.Tensor) -> torch.Tensor:
        """``1 x HW x d`` positional encoding on ``like``'s device / dtype (cached per size)."""
        key = (h, w, like.device, like.dtype)
        pos = self._pos_cache.get(key)
        if pos is None:
            pe = sine_position_encoding(h, w, self.dim).flatten(1).t()[None]
            pos = self._pos_cache[key] = pe.to(device=like.device, dtype=like.dtype)
        return pos

    def _run(self, fmap: torch.Tensor, need_weights: bool = False):
        self._check(fmap)
        b, _, h, w = fmap.shape
        src = self.input_proj(fmap).flatten(2).transpose(1, 2)        # B x HW x d
        pos = self._pos(h, w, src)
        for layer in self.encoder:
            src = layer(src, pos)
        tgt = src.new_zeros(b, self.num_classes, self.dim)
        query_pos = self.label_embed[None].to(src.dtype)
        weights = None
        for i, layer in enumerate(self.decoder):
            last = i == len(self.decoder) - 1
            tgt, weights = layer(tgt, src, pos, query_pos, need_weights and last)
        return self.decoder_norm(tgt), weights

    # ---- public --------------------------------------------------------------------------
    def embed(self, fmap: torch.Tensor) -> torch.Tensor:
        """Label-wise embeddings ``B x L x d`` of a feature map ``B x C x H x W``."""
        return self._run(fmap)[0]

    def classify(self, emb: torch.Tensor) -> torch.Tensor:
        """Per-label linear classifier: ``logit[b, k] = <W_k, emb[b, k]> + b_k`` (B x L)."""
        if emb.ndim != 3 or tuple(emb.shape[1:]) != (self.num_classes, self.dim):
            raise ValueError(f"classify expects label-wise embeddings B x {self.num_classes} x "
                             f"{self.dim}, got {tuple(emb.shape)}")
        return (emb * self.weight).sum(-1) + self.bias

    def project(self, emb: torch.Tensor) -> torch.Tensor:
        """Projection head, L2-normalised: ``B x L x d -> B x L x proj_dim`` (unit norm)."""
        if emb.shape[-1] != self.dim:
            raise ValueError(f"project expects embeddings with last size {self.dim}, got "
                             f"{tuple(emb.shape)}")
        return F.normalize(self.projector(emb), dim=-1)

    def forward_all(self, fmap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits B x L, label-wise embeddings B x L x d)`` in one pass."""
        emb = self.embed(fmap)
        return self.classify(emb), emb

    def forward(self, fmap: torch.Tensor) -> torch.Tensor:
        """Logits ``B x L``."""
        return self.classify(self.embed(fmap))

    def attention_maps(self, fmap: torch.Tensor) -> torch.Tensor:
        """Cross-attention weights of the last decoder layer, averaged over heads: where each
        label looks, ``B x L x H x W``; every map sums to 1 (softmax weights, before attention
        dropout). Runs in the module's current mode (call ``.eval()`` for deterministic maps).
        """
        _, weights = self._run(fmap, need_weights=True)
        b, _, h, w = fmap.shape
        return weights.mean(dim=1).reshape(b, self.num_classes, h, w)

    def extra_repr(self) -> str:
        return (f"in_channels={self.in_channels}, num_classes={self.num_classes}, "
                f"dim={self.dim}, heads={self.heads}, ffn={self.ffn_dim}, "
                f"proj_dim={self.proj_dim}, seed={self.seed}")


class LabelEmbeddingModel(nn.Module):
    """A backbone's feature map through a `LabelEmbeddingHead`.

    Args:
        backbone: a `spmlkit.models.backbones.Backbone` (``forward_features(x) ->
            B x C x h x w``, ``num_features``), or ``None`` for the cached feature-map path:
            then ``forward`` takes feature maps ``B x C x H x W`` directly and
            ``head_kwargs["in_channels"]`` gives ``C``.
        num_classes: ``L``.
        freeze_backbone: no gradients into the backbone (its parameters get
            ``requires_grad=False``, ``features`` runs under ``no_grad``), and the backbone
            stays in eval mode even under ``.train()``.
        freeze_batchnorm: keep only the backbone's BatchNorm layers frozen (eval mode, no
            gradients), as the authors' ResNet-50; implied by ``freeze_backbone``.
        **head_kwargs: passed to `LabelEmbeddingHead` (``dim``, ``heads``, ``seed`` ...).

    Attributes: ``backbone`` (or None), ``head``.

    Raises:
        ValueError: no backbone and no ``in_channels``; ``in_channels`` that contradicts the
            backbone's ``num_features``; a backbone without an integer ``num_features``.

    >>> model = LabelEmbeddingModel(None, 3, in_channels=8, dim=16, heads=2).eval()
    >>> logits, emb = model.forward_all(torch.zeros(2, 8, 2, 2))
    >>> tuple(logits.shape), tuple(emb.shape)
    ((2, 3), (2, 3, 16))
    """

    def __init__(self, backbone: nn.Module | None, num_classes: int, *,
                 freeze_backbone: bool = False, freeze_batchnorm: bool = False,
                 **head_kwargs):
        super().__init__()
        if backbone is None:
            if "in_channels" not in head_kwargs:
                raise ValueError("LabelEmbeddingModel without a backbone takes feature maps "
                                 "directly: pass in_channels= (their channel count)")
        else:
            features = getattr(backbone, "num_features", None)
            if not isinstance(features, int) or features < 1:
                raise ValueError(f"LabelEmbeddingModel needs a backbone with an integer "
                                 f"num_features, {type(backbone).__name__} has {features!r}")
            given = head_kwargs.pop("in_channels", features)
            if given != features:
                raise ValueError(f"in_channels={given} contradicts the backbone's "
                                 f"num_features={features}; leave in_channels out")
            head_kwargs["in_channels"] = features
        self.backbone = backbone
        self.freeze_backbone = bool(freeze_backbone) and backbone is not None
        self.freeze_batchnorm = bool(freeze_batchnorm) and backbone is not None
        self.head = LabelEmbeddingHead(num_classes=num_classes, **head_kwargs)
        if self.freeze_backbone:
            for p in backbone.parameters():
                p.requires_grad_(False)
        elif self.freeze_batchnorm:
            for mod in self._batchnorms():
                for p in mod.parameters():
                    p.requires_grad_(False)
        self.train(self.training)

    def _batchnorms(self):
        return [m for m in self.backbone.modules()
                if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    @property
    def num_classes(self) -> int:
        return self.head.num_classes

    def train(self, mode: bool = True) -> "LabelEmbeddingModel":
        """As ``nn.Module.train``, but a frozen backbone (or its frozen BatchNorms) stays in
        eval mode."""
        super().train(mode)
        if self.freeze_backbone:
            self.backbone.eval()
        elif self.freeze_batchnorm:
            for mod in self._batchnorms():
                mod.eval()
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The feature map ``B x C x H x W``: ``backbone.forward_features(x)`` (under
        ``no_grad`` when frozen), or ``x`` itself without a backbone."""
        if self.backbone is None:
            return x
        if self.freeze_backbone:
            with torch.no_grad():
                return self.backbone.forward_features(x)
        return self.backbone.forward_features(x)

    def forward_all(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits B x L, label-wise embeddings B x L x d)``."""
        return self.head.forward_all(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``B x L``."""
        return self.head(self.features(x))

    def attention_maps(self, x: torch.Tensor) -> torch.Tensor:
        """The head's `LabelEmbeddingHead.attention_maps` on ``features(x)``."""
        return self.head.attention_maps(self.features(x))
