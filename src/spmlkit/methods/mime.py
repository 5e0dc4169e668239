"""MIME (Liu, Xu, Lv, Geng, ICML 2023) on LAC's label-wise embedding head.

"Revisiting Pseudo-Label for Single-Positive Multi-Label Learning" (PMLR 202:22249-22265);
MIME = "Mutual label enhancement for sIngle-positive Multi-label lEarning". Reimplemented from
the authors' code, ``palm-biaoliu/mime`` at commit
``62a0f6616216648cf8973fdbfeb914458f1affcd`` (62a0f66):

- the model, ``lib_lagc/models/LEModel.py`` (``LEModel_VIB``): the label-wise embeddings ``h``
  (B x L x d) of the LAC / Query2Label head (``lib_lagc`` is LAC's library; here
  `spmlkit.models.LabelEmbeddingHead`) go through a projector ``Linear(d, d) -> ReLU ->
  Linear(d, 2 k)`` (k = ``z_dim``, official 256); the first k outputs are the mean ``mu``, the
  last k give ``sigma = exp(clamp(s / 2, -6, 6))`` of a Gaussian per (example, label); ``z`` is
  the mean of ``samples`` (official 10) reparameterised draws ``mu + sigma * eps`` and the
  logit of label j is ``<W_j, z_j> + b_j`` (a per-label linear map on k, Query2Label's
  ``GroupWiseLinear``);
- the loss, ``utils/losses.py`` (``loss_VIB`` through ``compute_batch_loss``): with ``p =
  sigmoid(logit / T)`` (T = 1) and the current targets ``y`` (observed positives and the
  pseudo-positives so far; every other entry a negative, "assume negative")::

      L = 1/(B L) sum_{b,j} [ y -log(p + 1e-5) + (1 - y) -log(1 - p + 1e-5) ]
          + beta * mean_{b,j,k}( -1/2 (1 + 2 log sigma - mu^2 - sigma^2) )

  the second term is the KL divergence of ``N(mu, sigma^2)`` from ``N(0, 1)`` per latent
  coordinate, averaged (the variational information bottleneck; official ``beta`` 1e-4);
- the pseudo-label generator, ``losses.py`` (``pseudo_labeling_vib``): after an epoch's
  training, from the ``warmup_epoch``-th epoch on (1-based; official 2), the model predicts
  every train row in eval mode and each entry whose probability exceeds ``theta`` (official
  0.95) becomes a positive target from then on; pseudo-positives accumulate over the epochs
  and are never withdrawn (the observed matrix is overwritten with ``min(obs + [p > theta],
  1)``).

So MIME alternates, EM style, between fitting the model to the current targets (the
"M-step", an epoch of the loss above) and re-estimating the targets from the model (the
"E-step", the threshold rule); the paper's "mutual label enhancement" is this loop, in which
the classifier and the pseudo-labels improve each other.

Hyperparameters (`MIMEConfig`): the 62a0f66 tree holds the functions above but not the
driver script its README names (``train_vib.py``); the stored ``train_mime.py`` (commit
06e15de8bf35bf44b6046be5c3bd838c2b92630e), whose pseudo-labelling is the same rule, gives the
schedule: 10 epochs, batch 32, Adamax (no weight decay, no schedule) at lr 1e-4 for the
backbone and 10 x lr for the head, ``theta`` 0.95, ``beta`` 1e-4, ``z_dim`` 256, ``T`` 1,
``warmup_epoch`` 2 (5 on CUB), 448 px ResNet-50 fine-tuned end to end, best epoch on val mAP.
A later commit by another author (9000abf) replaces the threshold rule with a class-prior
ranking; it is not what is reproduced here.

Views (``MIMEConfig.views``; the backbone is ``efficientnet_lite0`` unless ``backbone=``):

- ``"cached"`` (default for images; a CPU): the backbone is frozen and LAC's cached feature maps
  of ``weak_views`` weak draws (flip + resize, the official training transform) of every train
  image are reused (`spmlkit.methods.image_methods.CachedMapViews`, no strong views);
- ``"eval"``: the frozen backbone's eval-view maps only (no augmentation), the store every
  other method on the same backbone and size shares (fmnist_mosaic at 224 px: 1280 x 7 x 7);
- ``"images"`` (a GPU): the weak view computed at every step (LAC's
  `ImageViews`), ``train_backbone=true`` fine-tunes the
  backbone (BatchNorm frozen) at ``lr`` while the head trains at ``head_lr_mult * lr``;
- feature vectors (yeast, or an image source with a dataset backbone): each vector is a
  ``D x 1 x 1`` map. With one spatial token the head's cross-attention has a single key, so all
  label-wise embeddings of an example coincide: the head is then a shared transformer-block
  encoder, the per-label Gaussian ``(mu, sigma)`` is the same for every label, and the labels
  differ by their classifiers ``(W_j, b_j)`` only (LAC refuses feature vectors; MIME takes
  them so that it runs on the tabular benchmark).

Ablations (`ABLATIONS`): ``an`` (no noise and no KL term, ``z = mu``; no pseudo-labels:
assume-negative on the same head), ``vib`` (the information bottleneck without pseudo-labels),
``an_pl`` (pseudo-labels without it) and ``mime`` (both).

Deviations from the official code (deliberate, each named):

- **Deterministic evaluation**: the official forward draws ``z`` in eval mode too (validation,
  test and the pseudo-labelling pass are the mean of 10 random draws); here eval mode uses
  ``z = mu``, the draws' expectation, so predictions, pseudo-labels and a resumed run repeat.
  Training draws come from torch's RNG forked and seeded per epoch from ``config.seed``.
- **Every train row is pseudo-labelled**: the official pass iterates the shuffled train loader
  with ``drop_last=True``, so the rows of the last partial batch (a random few each epoch) are
  skipped; here every row is scored, in the eval view (the official pass sees the training
  transform's random flip).
- **Observed negatives** (regimes other than single-positive): ``loss_VIB`` gives entries
  labelled -1 zero loss and ``pseudo_labeling_vib`` would turn a -1 into 0 (``-1 + 1``); here
  an observed negative is a negative target and is never pseudo-labelled. Single-positive
  labels have no -1, so nothing changes there.
- **Optimiser on a frozen backbone**: Adamax at ``head_lr_mult * lr`` for the head (the
  official head rate) and nothing else; the official ``weight_decay`` argument is parsed but
  never passed to Adamax, so there is none here either.
- **Size**: ``dim`` (official 2048, ResNet-50's channels with an identity input projection)
  and ``z_dim`` are options; the head's own linear classifier on ``d`` (LAC's) is not used and
  its parameters do not train.
- **Selection**: the best epoch on val mAP as the official logger, and as every spmlkit method.

Resuming: the loop's checkpoint holds the model, Adamax, the pseudo-label matrix (the
objective's buffer), the best epoch and history; ``spml train --resume RUN_DIR`` ends with the
uninterrupted run's weights, targets and metrics.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from ..constraints import Boolean, Interval
from ..engine import (Stage, StageParts, StepHook, TrainConfig, check_val_labels, mix_seed,
                      train_loop, val_map)
from ..data.rows import as_rows, holds_vectors, is_stored
from ..labels import POSITIVE, validate_observed
from ..losses import SPMLLoss
from ..models.label_embedding import LabelEmbeddingModel
from .contract import (IMAGE_TRAIN_FIELDS, Fitted, RunContext, TrainingMethod, feature_preprocess,
                       register_method)
from .image_methods import (CachedMapViews, EvalMapViews, ImageViews, backbone_record,
                            check_head_config, config_fields, config_from_dict,
                            config_from_options, head_constraints, image_model_info, image_options,
                            predict_rows, rebuild_backbone, run_backbone, run_device,
                            run_geometry, smoke_image_options)
from .smile import LOG_EPSILON, neg_log

__all__ = ["ABLATIONS", "MIMEConfig", "MIMEModel", "MIMEObjective", "VectorViews",
           "config_of", "mime_an_loss", "vib_kl", "vib_statistics",
           "pseudo_positives"]

#: the official schedule (train_mime.py at 06e15de; see the module docstring)
OFFICIAL_EPOCHS, OFFICIAL_BATCH_SIZE, OFFICIAL_LR = 10, 32, 1e-4
VIEWS = ("cached", "eval", "images")
ABLATIONS = {
    "an": {"vib": False, "pseudo_labels": False},
    "vib": {"vib": True, "pseudo_labels": False},
    "an_pl": {"vib": False, "pseudo_labels": True},
    "mime": {"vib": True, "pseudo_labels": True},
}


# ---- the loss parts (pure functions) -------------------------------------------------------------
def vib_statistics(s: torch.Tensor, z_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mu, sigma)`` from the projector's output ``s`` (... x 2 k): ``mu = s[..., :k]``,
    ``sigma = exp(clamp(s[..., k:] / 2, -6, 6))`` (``LEModel_VIB.forward``)."""
    if s.shape[-1] != 2 * z_dim:
        raise ValueError(f"vib_statistics: the last size must be 2 * z_dim = {2 * z_dim}, got "
                         f"{tuple(s.shape)}")
    return s[..., :z_dim], torch.exp(torch.clamp(s[..., z_dim:] / 2, min=-6, max=6))


def vib_kl(mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """KL(N(mu, sigma^2) || N(0, 1)) per coordinate, averaged over every entry:
    ``mean(-1/2 (1 + 2 log sigma - mu^2 - sigma^2))`` (the official ``reg_loss`` without
    ``beta``).

    >>> abs(float(vib_kl(torch.zeros(2, 3), torch.ones(2, 3))))  # N(0, 1) itself
    0.0
    >>> round(float(vib_kl(torch.ones(1, 2), torch.ones(1, 2))), 4)  # mu^2 / 2
    0.5
    """
    return -0.5 * (1 + 2 * sigma.log() - mu.pow(2) - sigma.pow(2)).mean()


def mime_an_loss(probs: torch.Tensor, targets: torch.Tensor, eps: float = LOG_EPSILON,
                 reduction: str = "mean") -> torch.Tensor:
    """The official ``loss_VIB`` data term (through ``compute_batch_loss``: the sum over the
    batch's entries divided by B * L): ``-log(p + eps)`` where ``targets == 1``, ``-log(1 - p +
    eps)`` elsewhere (0 and, a deviation, observed negatives -1).

    ``reduction="none"`` gives the B x L matrix.

    >>> p = torch.tensor([[0.5, 0.5]])
    >>> round(float(mime_an_loss(p, torch.tensor([[1, 0]]))), 5)
    0.69313
    """
    mat = torch.where(targets == POSITIVE, neg_log(probs, eps), neg_log(1 - probs, eps))
    return mat if reduction == "none" else mat.mean()


def pseudo_positives(probs: torch.Tensor, observed: torch.Tensor, theta: float) -> torch.Tensor:
    """The entries the official threshold rule makes positive: ``probs > theta`` on entries
    that are not observed (0); a bool matrix. (Observed positives are positive anyway; observed
    negatives are kept, a deviation from the official ``-1 + 1 = 0``.)"""
    return (probs > theta) & (observed == 0)


# ---- configuration -----------------------------------------------------------------------------
@dataclass
class MIMEConfig:
    """MIME's hyperparameters, validated; defaults are the official ones where the official
    code has them (module docstring).

    - head: ``dim`` (128 here, official 2048), ``heads`` (4), ``ffn`` (None: 4 dim),
      ``dropout`` (0.1), ``encoder_layers`` (1), ``decoder_layers`` (2); ``z_dim`` (256) the
      Gaussian's size per label; ``samples`` (10) draws averaged per training step;
    - objective: ``vib`` (True: sampled ``z`` and the KL term; False: ``z = mu``, no KL),
      ``beta`` (1e-4), ``temperature`` (1.0, ``T`` of the training probabilities);
    - pseudo-labels: ``pseudo_labels`` (True), ``theta`` (0.95), ``warmup_epoch`` (2: the first
      epoch after whose training the rule runs, 1-based);
    - optimiser: ``head_lr_mult`` (10: the head at 10 x lr, Adamax), ``train_backbone`` (False;
      ``views="images"`` only);
    - views: ``views`` (``"cached"``, ``"eval"``, ``"images"``; ignored for feature vectors),
      ``weak_views`` (2, cached weak draws), ``map_dtype`` (``"float16"``).

    Raises:
        ValueError: a value out of range, or an unknown key in `from_dict`.

    >>> MIMEConfig(**ABLATIONS["an"]).vib
    False
    """

    dim: int = 128
    heads: int = 4
    ffn: int | None = None
    dropout: float = 0.1
    encoder_layers: int = 1
    decoder_layers: int = 2
    z_dim: int = 256
    samples: int = 10
    vib: bool = True
    beta: float = 1e-4
    temperature: float = 1.0
    pseudo_labels: bool = True
    theta: float = 0.95
    warmup_epoch: int = 2
    head_lr_mult: float = 10.0
    train_backbone: bool = False
    views: str = "cached"
    weak_views: int = 2
    map_dtype: str = "float16"

    #: what each field accepts (`spmlkit.constraints`): the head's (`head_constraints`) and
    #: MIME's own
    parameter_constraints: ClassVar[dict] = {
        **head_constraints(VIEWS), "z_dim": Interval(int, 1), "samples": Interval(int, 1),
        "vib": Boolean(), "beta": Interval(float, 0),
        "temperature": Interval(float, 0, None, closed="right"), "pseudo_labels": Boolean(),
        "theta": Interval(float, 0, 1), "warmup_epoch": Interval(int, 1),
        "head_lr_mult": Interval(float, 0)}

    def __post_init__(self):
        check_head_config(self)

    def head_kwargs(self) -> dict:
        """The `spmlkit.models.LabelEmbeddingHead` arguments (its projector outputs
        ``2 * z_dim``)."""
        return {"dim": self.dim, "heads": self.heads, "ffn": self.ffn, "dropout": self.dropout,
                "encoder_layers": self.encoder_layers, "decoder_layers": self.decoder_layers,
                "proj_dim": 2 * self.z_dim}

    @classmethod
    def from_dict(cls, values: dict | None) -> "MIMEConfig":
        """A config from a dict (``--option KEY=VALUE`` pairs, a study's options);
        ``ablation=NAME`` applies `ABLATIONS` first; unknown keys raise
        (`spmlkit.methods.image_methods.config_from_dict`)."""
        return config_from_dict(cls, values, what="MIME", ablations=ABLATIONS)


# ---- the model ---------------------------------------------------------------------------------
class MIMEModel(nn.Module):
    """LAC's label-wise embedding model with MIME's Gaussian bottleneck per label
    (``LEModel_VIB``).

    ``net`` is a `spmlkit.models.LabelEmbeddingModel` whose projection head (``Linear d
    -> d, ReLU, Linear d -> 2 k``, used without LAC's L2 normalisation) gives ``(mu, sigma)``
    (`vib_statistics`); the classifier is ``weight`` (L x k) and ``bias`` (L),
    initialised ``U(+-1/sqrt(k))`` as ``GroupWiseLinear``. In training mode with ``vib`` the
    latent is the mean of ``samples`` draws ``mu + sigma * eps`` (``eps`` from torch's global
    RNG); in eval mode, or without ``vib``, it is ``mu``.

    Args:
        backbone: as `LabelEmbeddingModel` (None: inputs are feature
            maps, or feature vectors B x D taken as D x 1 x 1 maps).
        num_classes: L.
        z_dim, samples, vib: the bottleneck's size, draws and switch.
        seed: seeds the head's and the classifier's initialisation.
        **kwargs: `LabelEmbeddingModel` / head arguments.

    >>> m = MIMEModel(None, 3, in_channels=6, dim=8, heads=2, z_dim=4, proj_dim=8).eval()
    >>> logits, mu, sigma = m.forward_all(torch.zeros(2, 6))
    >>> tuple(logits.shape), tuple(mu.shape), bool((sigma > 0).all())
    ((2, 3), (2, 3, 4), True)
    """

    def __init__(self, backbone: nn.Module | None, num_classes: int, *, z_dim: int = 256,
                 samples: int = 10, vib: bool = True, seed: int = 0, **kwargs):
        super().__init__()
        kwargs["proj_dim"] = 2 * int(z_dim)
        self.net = LabelEmbeddingModel(backbone, num_classes, seed=seed, **kwargs)
        self.z_dim, self.samples, self.vib = int(z_dim), int(samples), bool(vib)
        head = self.net.head
        head.weight.requires_grad_(False)  # LAC's classifier on d: not part of MIME
        head.bias.requires_grad_(False)
        self.weight = nn.Parameter(torch.empty(num_classes, self.z_dim))
        self.bias = nn.Parameter(torch.empty(num_classes))
        g = torch.Generator().manual_seed(mix_seed(int(seed), 0x313E))
        bound = 1 / math.sqrt(self.z_dim)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound, generator=g)
            self.bias.uniform_(-bound, bound, generator=g)

    @property
    def backbone(self):
        return self.net.backbone

    @property
    def num_classes(self) -> int:
        return self.net.num_classes

    def _maps(self, x: torch.Tensor) -> torch.Tensor:
        if self.net.backbone is None and x.ndim == 2:
            return x[:, :, None, None]
        return self.net.features(x)

    def statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu, sigma)``, each B x L x k."""
        head = self.net.head
        return vib_statistics(head.projector(head.embed(self._maps(x))), self.z_dim)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """``logit[b, j] = <W_j, z[b, j]> + b_j``."""
        return (z * self.weight).sum(-1) + self.bias

    def forward_all(self, x: torch.Tensor):
        """``(logits B x L, mu, sigma)``."""
        mu, sigma = self.statistics(x)
        if self.training and self.vib:
            eps = torch.randn((self.samples, *mu.shape), dtype=mu.dtype, device=mu.device)
            z = (mu + sigma * eps).mean(dim=0)
        else:
            z = mu
        return self.classify(z), mu, sigma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_all(x)[0]

    def train(self, mode: bool = True) -> "MIMEModel":
        super().train(mode)
        self.net.train(mode)  # keeps a frozen backbone in eval mode
        return self


# ---- the objective the engine trains with ------------------------------------------------------
class MIMEObjective(SPMLLoss):
    """MIME's data term with its pseudo-label generator, for the engine's loop.

    ``entries`` is `mime_an_loss` on ``sigmoid(logits / T)`` against the targets
    (observed positives, plus the pseudo-positives so far); ``on_epoch_end`` runs the
    threshold rule (`pseudo_positives`) on the eval-mode train logits from the
    ``warmup_epoch``-th epoch on. The pseudo-positives are the buffer ``pseudo`` (N x L, 0/1),
    part of the state dict, so they are checkpointed and a resumed run continues with them.

    Args:
        observed: N x L observed train labels (1 / 0 / -1).
        theta, warmup_epoch, temperature, enabled: the rule's threshold, its first epoch
            (1-based), ``T`` and the switch (False: the targets stay the observed labels).
    """

    needs_index = True
    resizable_state = ("pseudo",)

    def __init__(self, observed: torch.Tensor, *, theta: float = 0.95, warmup_epoch: int = 2,
                 temperature: float = 1.0, enabled: bool = True):
        super().__init__()
        self.theta, self.warmup_epoch = float(theta), int(warmup_epoch)
        self.temperature, self.enabled = float(temperature), bool(enabled)
        self.needs_train_predictions = self.enabled
        self.observed = observed
        self.register_buffer("pseudo", torch.zeros(observed.shape, dtype=torch.uint8,
                                                   device=observed.device))
        self.added = 0

    def targets(self, observed: torch.Tensor, index) -> torch.Tensor:
        """The batch's targets: observed labels with the pseudo-positives set to 1."""
        pseudo = self.pseudo[index].bool()
        return torch.where(pseudo & (observed == 0), torch.ones_like(observed), observed)

    def entries(self, logits, observed, index):
        probs = torch.sigmoid(logits / self.temperature)
        return mime_an_loss(probs, self.targets(observed, index), reduction="none"), None

    def on_epoch_end(self, epoch: int, train_logits: torch.Tensor | None = None) -> None:
        """The E-step after epoch ``epoch`` (0-based) once ``epoch + 1 >= warmup_epoch``."""
        self.added = 0
        if not self.enabled or epoch + 1 < self.warmup_epoch or train_logits is None:
            return
        probs = torch.sigmoid(train_logits.to(self.pseudo.device).float())
        new = pseudo_positives(probs, self.observed, self.theta) & ~self.pseudo.bool()
        self.added = int(new.sum())
        self.pseudo |= new.to(torch.uint8)


class _Record(StepHook):
    """MIME's step additions and epoch record: ``beta * KL`` on the batch's ``(mu, sigma)``
    (with ``vib``), the epoch's mean data and KL terms, the pseudo-positives (``pl_count``, all
    so far; ``pl_added``, this epoch's) and the fraction of them that are true positives
    (``pl_precision``, NaN when none)."""

    def __init__(self, objective: MIMEObjective, mime: MIMEConfig, y_train: torch.Tensor, n: int):
        self.objective, self.mime, self.y_train, self.n = objective, mime, y_train, n

    def on_epoch_start(self, epoch: int) -> None:
        self.sums = {"data_loss": 0.0, "kl": 0.0}

    def terms(self, batch):
        b = len(batch.index)
        self.sums["data_loss"] += float(batch.value.detach()) * b
        if not self.mime.vib:
            return ()
        mu, sigma = batch.extras
        kl = vib_kl(mu.float(), sigma.float())
        self.sums["kl"] += float(kl.detach()) * b
        return [(self.mime.beta, kl)]

    def epoch_record(self) -> dict:
        record = {"data_loss": self.sums["data_loss"] / self.n}
        if self.mime.vib:
            record["kl"] = self.sums["kl"] / self.n
        if self.mime.pseudo_labels:
            pseudo = self.objective.pseudo.bool()
            count = int(pseudo.sum())
            record["pl_count"] = count
            record["pl_added"] = self.objective.added
            record["pl_precision"] = float((pseudo & self.y_train).sum()) / count if count \
                else float("nan")
        return record


# ---- views of feature vectors -------------------------------------------------------
class VectorViews:
    """Feature-vector splits as views: rows B x D (the model reads them as D x 1 x 1 maps)."""

    kind = "vectors"

    def __init__(self, splits, device: torch.device):
        self.x = {}
        for s in ("train", "val", "test"):
            x = getattr(splits, s).x
            if is_stored(x):  # a store (rows checked finite when loaded): read per batch
                self.x[s] = as_rows(x)
                continue
            x = self.x[s] = torch.as_tensor(np.asarray(x, dtype=np.float32))
            if x.ndim != 2 or not torch.isfinite(x).all():
                raise ValueError(f"MIME on feature vectors needs finite N x D {s} features, got "
                                 f"shape {tuple(x.shape)}")
        self.device, self.seconds = device, 0.0
        self.in_channels = int(self.x["train"].shape[1])

    def _rows(self, split: str, rows) -> torch.Tensor:
        x = self.x[split]
        if isinstance(x, torch.Tensor):
            return x[torch.as_tensor(rows)].to(self.device)
        rows = rows.numpy() if isinstance(rows, torch.Tensor) else rows
        return torch.from_numpy(x.take(rows)).to(self.device)

    def describe(self) -> dict:
        return {"kind": self.kind, "in_features": self.in_channels}

    def train_epoch(self, batches, epoch: int, strong: bool = False):
        for rows in batches:
            yield self._rows("train", rows), None, rows

    def predict(self, module: nn.Module, split: str, batch_size: int = 512) -> torch.Tensor:
        return predict_rows(module, len(self.x[split]), lambda rows: self._rows(split, rows),
                            batch_size)

    def close(self) -> None:
        pass


# ---- the method ----------------------------------------------------------------------------------
#: MIMEConfig's fields: each a method option (None: the ablation's, else the default value)
CONFIG_KEYS = config_fields(MIMEConfig)


def config_of(options: dict) -> MIMEConfig:
    """The run's `MIMEConfig` from the method options: ``ablation`` (a name of
    `ABLATIONS`, or None) and every option of `CONFIG_KEYS` that is not None."""
    return config_from_options(MIMEConfig, options, what="MIME", ablations=ABLATIONS)


def _config(ctx) -> MIMEConfig:
    return config_of(ctx.options)


def _views(ctx, mime: MIMEConfig, device):
    o, splits, config = ctx.options, ctx.splits, ctx.config
    if holds_vectors(splits.train.x):
        return VectorViews(splits, device), None
    net, _ = run_backbone(ctx)
    size, mean, std = run_geometry(ctx)
    store = {"cache_dir": o["cache_dir"], "progress": o["progress"], **(o["features"] or {})}
    if mime.views == "cached":
        return CachedMapViews(splits, net, size, weak_views=mime.weak_views, strong_views=0,
                              map_dtype=mime.map_dtype, seed=config.seed, device=device,
                              **store), net
    if mime.views == "eval":
        return EvalMapViews(splits, net, size, dtype=mime.map_dtype, seed=config.seed,
                            device=device, **store), net
    return ImageViews(splits, size, mean, std, config, seed=config.seed, device=device,
                      image_reader=o["image_reader"]), net


def _build_model(views, net, num_classes: int, mime: MIMEConfig, seed: int) -> MIMEModel:
    common = dict(z_dim=mime.z_dim, samples=mime.samples, vib=mime.vib, seed=seed,
                  **{k: v for k, v in mime.head_kwargs().items() if k != "proj_dim"})
    if views.kind == "images":
        return MIMEModel(net, num_classes, freeze_backbone=not mime.train_backbone,
                         freeze_batchnorm=mime.train_backbone, **common)
    return MIMEModel(None, num_classes, in_channels=views.in_channels, **common)


def run_config(ctx) -> dict:
    """MIME's entries of ``config.json``: the resolved `MIMEConfig` (and, on images, the
    backbone and input size)."""
    mime = _config(ctx)
    out = {"mime": asdict(mime)}
    if not holds_vectors(ctx.splits.train.x):
        record = backbone_record(ctx)
        out.update({k: record[k] for k in ("backbone", "image_size", "mean", "std")})
    return out


def fit(ctx: RunContext) -> Fitted:
    """MIME's fit for [`spmlkit.methods.train_run`][spmlkit.methods.train_run] (module
    docstring)."""
    start = time.perf_counter()
    splits, config = ctx.splits, ctx.config
    mime = _config(ctx)
    device = run_device(config)
    z = torch.as_tensor(validate_observed(splits.observed, "train observed labels")).to(device)
    check_val_labels(splits.val.y, config.map_convention)
    y_train = torch.as_tensor(np.asarray(splits.train.y) > 0).to(device)
    n, num_classes = z.shape
    views, net = _views(ctx, mime, device)
    try:
        model = _build_model(views, net, num_classes, mime, config.seed).to(device)
        objective = MIMEObjective(z, theta=mime.theta, warmup_epoch=mime.warmup_epoch,
                                  temperature=mime.temperature,
                                  enabled=mime.pseudo_labels).to(device)
        from ..engine import GlobalBatchSampler

        sampler = GlobalBatchSampler(n, config.batch_size, config.seed,
                                     drop_last=config.drop_last)
        record = _Record(objective, mime, y_train, sampler.rows_per_epoch)

        def batches(epoch):
            for x, _, rows in views.train_epoch(sampler.global_batches(epoch), epoch, False):
                idx = rows.to(device)
                yield x, z[idx], idx

        def forward(x, obs, idx):
            logits, mu, sigma = model.forward_all(x)
            return logits.float(), obs, idx, (mu, sigma)

        def setup():
            head = [p for name, p in model.named_parameters()
                    if p.requires_grad and not name.startswith("net.backbone.")]
            groups = [{"params": head, "lr": config.lr * mime.head_lr_mult}]
            body = [p for p in (model.backbone.parameters() if model.backbone is not None
                                else ()) if p.requires_grad]
            if body:
                groups.append({"params": body, "lr": config.lr})
            return StageParts(torch.optim.Adamax(groups, lr=config.lr), hooks=[record])

        def evaluate():
            return val_map(views.predict(model, "val"), splits.val.y, config.map_convention,
                           config.metric)

        result = train_loop(model, objective, [Stage(config.epochs, setup)],
                            num_examples=sampler.rows_per_epoch,
                            batches=batches, forward=forward, evaluators={"model": evaluate},
                            early_stop=config.early_stop,
                            train_logits=lambda: views.predict(model, "train").to(device),
                            on_epoch=ctx.on_epoch, checkpoint=ctx.checkpoint,
                            resume=ctx.resume,
                            epoch_seed=lambda epoch: mix_seed(config.seed, 0x313E, epoch),
                            start=start, metric=config.metric)
        probs = {s: torch.sigmoid(views.predict(model, s)).numpy()
                 for s in ("train", "val", "test")}
        views_info = views.describe()
    finally:
        views.close()
    pseudo = objective.pseudo.bool().cpu()
    count = int(pseudo.sum())
    extra = {"mime": asdict(mime), "views": views.kind, "pl_count": count,
             "pl_precision": float((pseudo & y_train.cpu()).sum()) / count if count
             else float("nan")}
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    best = {"model": state, "views": views_info, "mime": asdict(mime),
            "in_channels": int(model.net.head.in_channels), "seed": int(config.seed)}
    if views.kind == "vectors":
        best.update(inputs="features", preprocess=feature_preprocess(splits))
    else:
        best.update(inputs="images", **backbone_record(ctx))
        extra["backbone"] = best["backbone"]
    return Fitted(result, probs, best, extra,
                  files={"pseudo_labels.npy": pseudo.numpy().astype(np.uint8)}
                  if ctx.run_dir is not None else {})


def model_from_checkpoint(best: dict) -> MIMEModel:
    """The MIME model of a ``best.pt`` dict, in eval mode on the CPU: on feature vectors the
    head alone (inputs B x D), on images the backbone rebuilt by name (with the run's own
    weights when it was fine-tuned) and the head."""
    mime = MIMEConfig.from_dict(best["mime"])
    common = dict(z_dim=mime.z_dim, samples=mime.samples, vib=mime.vib, seed=best["seed"],
                  **{k: v for k, v in mime.head_kwargs().items() if k != "proj_dim"})
    state = best["model"]
    if best["inputs"] == "features":
        model = MIMEModel(None, best["num_classes"], in_channels=best["in_channels"], **common)
        model.load_state_dict(state)
        return model.eval()
    model = MIMEModel(rebuild_backbone(best), best["num_classes"], freeze_backbone=True, **common)
    if any(k.startswith("net.backbone.") for k in state):
        model.load_state_dict(state)
    else:
        own = model.state_dict()
        own.update(state)
        model.load_state_dict(own)
    return model.eval()


def load_model(best: dict, config: dict):
    model = model_from_checkpoint(best)
    if best["inputs"] == "features":
        return model, {"inputs": "features", "in_features": int(best["in_channels"])}
    return model, image_model_info(best)


def baseline_cause(config: TrainConfig, options: dict) -> str:
    """Why a MIME run may end near the trivial baseline: its head's learning rate
    (`spmlkit.methods.driver.baseline_warning`)."""
    lr, mult = float(config.lr), float(config_of(options).head_lr_mult)
    head = lr * mult
    if head >= 1e-3:
        return (f"MIME trains its head at lr x head_lr_mult = {lr:g} x {mult:g} = {head:g}, "
                f"large enough for the head to collapse: try --lr {lr / 10:g} (or --option "
                f"head_lr_mult=1)")
    return (f"the head's lr {head:g} (lr x head_lr_mult {mult:g}) is small for "
            f"{int(config.epochs)} epoch(s): train longer or raise --lr")


MIME = register_method(TrainingMethod(
    name="mime", description="MIME: LAC's label-wise embedding head with a Gaussian "
    "bottleneck per label (KL to N(0, 1)) and pseudo-positives above a threshold that "
    "accumulate epoch by epoch (images as cached feature maps, or feature vectors as 1x1 "
    "maps; --loss an)",
    paper="Liu et al. 2023", inputs="images", fit=fit, load_model=load_model,
    run_config=run_config,
    options={**{k: None for k in CONFIG_KEYS}, "ablation": None, **image_options()},
    default_batch_size=OFFICIAL_BATCH_SIZE, default_epochs=OFFICIAL_EPOCHS,
    default_lr=OFFICIAL_LR, losses=("an",), accepts_vectors=True,
    default_lr_source="the official Adamax rate of the backbone (palm-biaoliu/mime "
                      "train_mime.py); the head trains at 10 x",
    checkpoint_seconds=0.0, check_values=config_of, baseline_cause=baseline_cause,
    train_fields=IMAGE_TRAIN_FIELDS,
    smoke_options=smoke_image_options(dim=8, heads=2, ffn=16, z_dim=4, samples=2,
                                      warmup_epoch=1, theta=0.5)))
