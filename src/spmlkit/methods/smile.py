"""SMILE (Xu, Qiao, Lv, Geng, Zhang, NeurIPS 2022): single-positive multi-label learning with
label enhancement, on feature vectors.

"One Positive Label is Sufficient: Single-Positive Multi-Label Learning with Label
Enhancement". Reimplemented in plain PyTorch (a sparse matrix for the graph, no DGL) from the
authors' code, ``palm-ml/smile``: ``train_smile2.py`` at commit
``49405dbc8b07479a26ebad0c8984f419b6102010``; ``spl_models.py`` and ``gen_adj.py`` at commit
``502c4b3e49923b53cfdd98fedc38f8e7910f89a9``; hyperparameters from its ``README.md`` (commit
``14edd5637403fa8bf4be83578e8a8ab6cf8cf4b5``).

Two networks train side by side, each with its own Adam at the same learning rate:

- the **label enhancer** (the "encoder") gives every train row a label distribution
  ``d = sigmoid(GCN(X) / T)`` from a 2-layer GCN over the train rows' kNN graph, and is trained
  as a variational auto-encoder: a second MLP encodes ``z = encoder_z([x, d])``, a decoder
  reconstructs ``x`` from ``[d, z]``, labels ``y~ ~ Beta(d + 1e-5, 1 - d + 1e-5)`` (a
  reparameterised sample) and the graph ``A~ = y~ y~^T``::

      L_LE = AN(d, z_obs) + gamma * (MSE(x_rec, x) + AN(y~, z_obs) + MSE(A~, A_B))
             + delta * KL(d)

  with ``A_B`` the kNN adjacency among the batch's rows (0/1, not symmetrised, not normalised)
  and ``AN(p, z) = mean(-log(p + 1e-5) on positives, -log(1 - p + 1e-5) elsewhere)``;
- the **classifier** (the predictor kept for val / test / ``spml predict``), an MLP on the
  features, is trained on the enhanced labels ``D = mu * d + (1 - mu) * D2`` (``d`` detached;
  ``D2`` is 1 on observed positives and ``p`` on unobserved entries) with the weighted BCE::

      L_cls = mean_{i,j}( c_ij * (-D_ij log(s_ij + 1e-5) - (1 - D_ij) log(1 - s_ij + 1e-5)) )

  ``s = sigmoid(f(x) / T)``, ``c_ij = 1`` on observed entries and, on unobserved ones,
  ``1 / (L - 1)`` (``bias=True``) or ``rate`` (``bias=False``); the mean is over B * L.

The classifier's loss does not reach the enhancer (``D`` is detached) and the enhancer's loss
does not involve the classifier, so one Adam over both with the step loss ``L_cls + L_LE`` is
the official two optimisers exactly; both see the same forward pass, as in the official step
(the GCN runs once per step over the whole train graph, the batch's rows are taken from it).

The kNN graph (`knn_indices`): Euclidean distances between train rows, each row's ``k``
nearest other rows (``k = 3``; ties to the lower index, as ``np.argmin``), directed edges
``i -> j`` for ``j`` a neighbour of ``i``. A GCN layer (`GraphConvolution`) is DGL's
``GraphConv(norm="both")`` on that graph, without self-loops: messages flow from ``i`` to
``j``, ``h_j = b + sum_i x_i W / sqrt(outdeg(i) indeg(j))`` with degrees clamped at 1, i.e.
``H = P X W + b`` with ``P = D_in^{-1/2} A^T D_out^{-1/2}`` (`gcn_propagation`; a row
nobody chose as neighbour gets only the bias). DGL initialises the layer with Xavier-uniform
weights and zero bias, and so do we; the MLPs are ``nn.Linear`` with PyTorch's default init. The
hidden width of every network is the number of classes (the official ``look_up`` table).

The final predictor is the MLP classifier, which is **inductive**: val, test and new rows
(``spml predict``) are scored by it alone, as in the official ``evaluate``; the graph and the
enhancer are used only during training (the enhancer's state is kept in ``best.pt`` as
``enhancer``, its train-row distribution in the run folder as ``enhanced_labels.npy``, and its
train recovery mAP in the result as ``enhanced_recovery_map``).

Per-dataset hyperparameters (``p``, ``mu``, ``bias``, ``rate``): the README's commands
(`OFFICIAL_HPARAMS`; yeast: ``p=0.05, mu=0.5, bias=False, rate=0.1``); for a dataset it
does not list, the argument defaults of ``train_smile2.py`` (``p=0.5, mu=0.5, bias=True,
rate=1``). Always ``gamma=0.001, delta=1, T=1`` and ``k = 3`` neighbours (options ``gamma``,
``delta``, ``temperature``, ``neighbours``; ``hidden``: the networks' width, default L); Adam
(no weight decay; ``TrainConfig.weight_decay`` adds Adam's coupled L2 to the classifier's
weights) at lr 1e-3, batch 16, 10 epochs (every README command passes ``--ep 10``).

Deviations from the official code (documented, deliberate):

- **Data**: the official script reads the authors' ``.mat`` files (features, full labels, one
  observed positive per row, train / val / test indices; not in the repository, a Google Drive
  link in its README; ``gen_rad_spl_tr_va_te_split.py`` removes the val rows from train). Here a
  run takes the spmlkit dataset's splits and single positives (yeast: the Cole split, features
  standardised with the train rows' statistics), as every other method does.
- **Selection**: the official script reports, per run, the test measures at the epoch most of
  five example-based validation measures (Hamming loss, coverage, average precision, ranking
  loss, one-error) agree on; here, as for every spmlkit method, the epoch with the best
  validation mAP is kept and test mAP is reported.
- **Randomness**: the official ``set_seed`` call is commented out (runs are unseeded); here the
  initialisation, the batch order and each epoch's Beta samples come from ``config.seed``
  (the Beta draws from torch's RNG forked and re-seeded per epoch), so runs repeat exactly and a
  resumed run equals the uninterrupted one.
- **Warm-up** (``--warm_up``, default 0 in every README command) is left out: the official
  warm-up loop cannot run (it unpacks ``evaluate``'s one dict into two names).
- The classifier's learning-rate schedule (``--lr_decay_rate``, default 1: constant) is left
  out; the unused ``G_X = G_A @ X`` is not computed.
- **Observed negatives** (regimes other than single-positive): the official code accepts only
  1 / 0 labels (``loss_an`` asserts it). Here an observed negative (-1) is a negative in the
  AN terms, ``D2 = 0`` for it (as ``D2 = 1`` for a positive) and its classifier loss is not
  down-weighted (it is observed).
- The official ``beta_kl_loss(d, 1 - d, 1)`` is not the KL divergence from ``Beta(d, 1 - d)``
  to the uniform ``Beta(1, 1)`` it is named after: it computes ``lgamma(a) + lgamma(b) +
  (a - 1) digamma(a) + (b - 1) digamma(b)`` (``a = d + 1e-6``, ``b = 1 - d + 1e-6``), whose
  log-gamma terms have the wrong sign and which drops the ``a + b`` terms (constant here). We
  keep the official term (``kl="official"``, the default, faithful to the published numbers)
  and offer the exact divergence as ``kl="exact"`` (`beta_uniform_kl`).
- The paper's inference model outputs the parameters (alpha, beta) of a Beta posterior per
  entry (``spl_models.Encoder_SMILE``, which the released script does not use); the released
  ``train_smile2.py`` instead takes the GCN's ``d`` as ``Beta(d, 1 - d)`` (in the decoder's
  sample and in the KL term). We reproduce the released script.
- The official ``spl_losses.py`` holds other versions of the losses (an in-place
  ``weighted_bce_loss``, a ``vae_loss`` with a ``base`` term); ``train_smile2.py`` redefines
  both after importing them, and its own definitions are the ones that run, so those are the
  ones reproduced here.

The run's ``loss`` must be ``an`` (the default of ``spml train``): SMILE trains with its own
objective above, whose AN terms are the official ``loss_an``; another loss would be silently
ignored, so it is refused.
"""
from __future__ import annotations

import math
import numbers
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..metrics import is_partial
from ..engine import (GeneratorState, Stage, StageParts, StepHook, batch_starts,
                      check_val_labels, epoch_rows, make_optimizer, mix_seed, predict_logits,
                      train_loop, val_map)
from ..labels import NEGATIVE, POSITIVE, UNOBSERVED, validate_full_labels, validate_observed
from ..losses import SPMLLoss
from ..metrics import map_score
from ..models.rng import global_rng
from .contract import Fitted, RunContext, TrainingMethod, feature_preprocess, register_method

#: the official ``neg_log`` offset: ``-log(p + 1e-5)``
LOG_EPSILON = 1e-5
#: the offset of the official ``beta_kl_loss``
KL_EPSILON = 1e-6
#: the offset of the decoder's ``Beta(d + 1e-5, 1 - d + 1e-5)``
BETA_EPSILON = 1e-5

#: ``train_smile2.py``'s argument defaults (used for a dataset the README does not list)
DEFAULT_HPARAMS = {"p": 0.5, "mu": 0.5, "bias": True, "rate": 1.0}
#: the README's per-dataset commands (official dataset names; spmlkit has ``yeast``)
OFFICIAL_HPARAMS = {
    "CAL500": {"p": 0.01, "mu": 0.01, "bias": False, "rate": 0.1},
    "Image": {"p": 0.1, "mu": 0.9, "bias": False, "rate": 0.7},
    "scene": {"p": 0.075, "mu": 0.3, "bias": False, "rate": 0.5},
    "yeast": {"p": 0.05, "mu": 0.5, "bias": False, "rate": 0.1},
    "corel5k": {"p": 0.025, "mu": 0.1, "bias": False, "rate": 0.1},
    "rcv1subset1": {"p": 0.01, "mu": 0.01, "bias": False, "rate": 0.1},
    "Corel16k001": {"p": 0.001, "mu": 0.01, "bias": True, "rate": 1.0},
    "delicious": {"p": 0.01, "mu": 0.01, "bias": True, "rate": 1.0},
    "iaprtc12": {"p": 0.001, "mu": 0.01, "bias": True, "rate": 1.0},
    "espgame": {"p": 0.025, "mu": 0.01, "bias": True, "rate": 1.0},
    "mirflickr": {"p": 0.01, "mu": 0.01, "bias": False, "rate": 0.1},
    "tmc2007": {"p": 0.025, "mu": 0.1, "bias": False, "rate": 0.3},
}
OFFICIAL_LR = 1e-3
OFFICIAL_BATCH_SIZE = 16
OFFICIAL_EPOCHS = 10
ENHANCED_LABELS_FILE = "enhanced_labels.npy"
KL_KINDS = ("official", "exact")


# ---- the graph ---------------------------------------------------------------------------------
def knn_indices(x, k: int = 3, chunk: int | None = None) -> torch.Tensor:
    """Each row's ``k`` nearest other rows by Euclidean distance (the official ``gen_adj``).

    Distances in float64; a row is never its own neighbour; neighbours sorted by distance,
    ties to the lower row index (the official repeated ``np.argmin``).

    Args:
        x: N x D features (array or tensor).
        k: neighbours per row, 1 <= k < N.
        chunk: rows per distance block (memory: chunk x N float64; default about 64 MB).

    Returns:
        N x k int64 tensor, row ``i`` the neighbours of ``i``, nearest first.

    Raises:
        ValueError: ``k`` out of range, or ``x`` not a finite N x D matrix.
    """
    x = torch.as_tensor(np.asarray(x) if not torch.is_tensor(x) else x).double()
    if x.ndim != 2 or not torch.isfinite(x).all():
        raise ValueError(f"knn_indices needs a finite N x D matrix, got shape {tuple(x.shape)}")
    n = x.shape[0]
    if not (isinstance(k, int) and 1 <= k < n):
        raise ValueError(f"k (neighbours per row) must be an integer in [1, {n - 1}] for {n} "
                         f"rows, got {k!r}")
    chunk = chunk or max(1, 8_000_000 // n)
    sq = (x * x).sum(1)
    out = torch.empty(n, k, dtype=torch.long)
    for start in range(0, n, chunk):
        rows = torch.arange(start, min(start + chunk, n))
        d2 = sq[rows, None] + sq[None, :] - 2.0 * (x[rows] @ x.T)
        d2 = d2.clamp_min(0.0)
        d2[torch.arange(len(rows)), rows] = math.inf  # not its own neighbour
        out[rows] = torch.sort(d2, dim=1, stable=True).indices[:, :k]
    return out


def knn_adjacency(neighbours: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """The dense 0/1 N x N adjacency ``A[i, j] = 1`` iff ``j`` is a neighbour of ``i`` (the
    official ``G_A``: directed, not symmetrised, no self-loops). For tests and small N."""
    n = neighbours.shape[0] if n is None else n
    a = torch.zeros(n, n)
    a[torch.arange(neighbours.shape[0])[:, None], neighbours] = 1.0
    return a


def batch_adjacency(neighbours: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``A[index][:, index]`` of the kNN graph without forming A: B x B float, entry ``(a, b)``
    is 1 iff row ``index[b]`` is a neighbour of row ``index[a]``."""
    return (neighbours[index][:, :, None] == index[None, None, :]).any(1).float()


def gcn_propagation(neighbours: torch.Tensor, n: int | None = None,
                    dtype=torch.float32) -> torch.Tensor:
    """The sparse N x N matrix ``P = D_in^{-1/2} A^T D_out^{-1/2}`` of DGL's
    ``GraphConv(norm="both")`` on the directed kNN graph (edges ``i -> j``, ``j`` a neighbour
    of ``i``): ``P[j, i] = 1 / sqrt(max(outdeg(i), 1) * max(indeg(j), 1))``, so that the layer
    is ``P @ X @ W + b``. No self-loops are added (the official graph has none).

    Returns:
        a coalesced sparse COO tensor of ``dtype``.
    """
    n = neighbours.shape[0] if n is None else n
    src = torch.arange(neighbours.shape[0]).repeat_interleave(neighbours.shape[1])
    dst = neighbours.reshape(-1)
    out_deg = torch.bincount(src, minlength=n).clamp_min(1).double()
    in_deg = torch.bincount(dst, minlength=n).clamp_min(1).double()
    values = (out_deg[src] * in_deg[dst]).rsqrt()
    return torch.sparse_coo_tensor(torch.stack([dst, src]), values.to(dtype), (n, n),
                                   check_invariants=True).coalesce()


# ---- the networks ------------------------------------------------------------------------------
class GraphConvolution(nn.Module):
    """One GCN layer ``P @ h @ W + b`` (DGL's ``GraphConv(norm="both")`` with the graph's
    normalisation in ``P``, `gcn_propagation`): ``W`` (in x out) Xavier-uniform, ``b``
    zero, as DGL initialises them; the product is taken in DGL's order (``W`` first when it
    narrows the features)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, propagation: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        if self.weight.shape[0] > self.weight.shape[1]:
            out = torch.sparse.mm(propagation, h @ self.weight)
        else:
            out = torch.sparse.mm(propagation, h) @ self.weight
        return out + self.bias


class SmileGCN(nn.Module):
    """The label enhancer's GCN: conv (D -> H), ReLU, conv (H -> L), linear (L -> L); logits."""

    def __init__(self, in_features: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = GraphConvolution(in_features, hidden)
        self.conv2 = GraphConvolution(hidden, num_classes)
        self.fc = nn.Linear(num_classes, num_classes)

    def forward(self, propagation: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(propagation, x))
        return self.fc(self.conv2(propagation, h))


class SmileMLP(nn.Module):
    """The official ``MLPNet``: linear (in -> out), ReLU, linear (out -> out). SMILE's
    classifier (``in`` = features, ``out`` = classes) and the enhancer's two MLPs."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, out_features)
        self.fc2 = nn.Linear(out_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class SmileDecoder(nn.Module):
    """The VAE decoder: ``x_rec = MLP([d, z])`` (2H -> D -> D), labels
    ``y~ = Beta(d + 1e-5, 1 - d + 1e-5).rsample()`` and the graph ``A~ = y~ y~^T``."""

    def __init__(self, num_classes: int, hidden: int, in_features: int):
        super().__init__()
        self.mlp = SmileMLP(num_classes + hidden, in_features)

    def forward(self, d: torch.Tensor, z: torch.Tensor):
        y_rec = torch.distributions.Beta(d + BETA_EPSILON, 1 - d + BETA_EPSILON).rsample()
        x_rec = self.mlp(torch.cat((d, z), dim=1))
        return x_rec, y_rec, y_rec @ y_rec.T


# ---- the loss parts (pure functions) ---------------------------------------------------------
def neg_log(p: torch.Tensor, eps: float = LOG_EPSILON) -> torch.Tensor:
    """The official ``-log(p + eps)``."""
    return -torch.log(p + eps)


def an_prob_loss(probs: torch.Tensor, observed: torch.Tensor, eps: float = LOG_EPSILON
                 ) -> torch.Tensor:
    """The official ``loss_an`` on probabilities: ``-log(p + eps)`` on observed positives,
    ``-log(1 - p + eps)`` on every other entry (unobserved, and observed negatives), mean over
    B * L."""
    pos = observed == POSITIVE
    return torch.where(pos, neg_log(probs, eps), neg_log(1 - probs, eps)).mean()


def enhanced_targets(d: torch.Tensor, observed: torch.Tensor, p: float, mu: float
                     ) -> torch.Tensor:
    """The classifier's targets ``D = mu * d + (1 - mu) * D2``, ``D2`` = 1 on observed
    positives, 0 on observed negatives, ``p`` on unobserved entries; ``d`` is detached."""
    d2 = torch.where(observed == POSITIVE, torch.ones_like(d),
                     torch.where(observed == NEGATIVE, torch.zeros_like(d),
                                 torch.full_like(d, p)))
    return mu * d.detach() + (1 - mu) * d2


def weighted_bce(probs: torch.Tensor, observed: torch.Tensor, target: torch.Tensor,
                 bias: bool = True, rate: float = 1.0, eps: float = LOG_EPSILON,
                 reduction: str = "mean") -> torch.Tensor:
    """SMILE's classifier loss (the official ``weighted_bce_loss`` of ``train_smile2.py``):
    ``-target log(p + eps) - (1 - target) log(1 - p + eps)`` per entry, unobserved entries
    times ``1 / (L - 1)`` (``bias=True``) or ``rate`` (``bias=False``); ``reduction`` "mean"
    (over B * L, the official) or "none" (B x L)."""
    mat = target * neg_log(probs, eps) + (1 - target) * neg_log(1 - probs, eps)
    scale = 1.0 / (observed.shape[-1] - 1) if bias else rate
    mat = torch.where(observed == UNOBSERVED, mat * scale, mat)
    return mat if reduction == "none" else mat.mean()


def beta_kl_official(d: torch.Tensor, eps: float = KL_EPSILON) -> torch.Tensor:
    """The official ``beta_kl_loss(d, 1 - d, 1)``: the mean of ``lgamma(a) + lgamma(b) +
    (a - 1) digamma(a) + (b - 1) digamma(b)`` with ``a = d + eps``, ``b = 1 - d + eps``
    (not the KL divergence it is named after: see the module docstring)."""
    a, b = d + eps, 1 - d + eps
    return (torch.lgamma(a) + torch.lgamma(b) + (a - 1) * torch.digamma(a)
            + (b - 1) * torch.digamma(b)).mean()


def beta_uniform_kl(d: torch.Tensor, eps: float = KL_EPSILON) -> torch.Tensor:
    """The mean KL divergence ``KL(Beta(a, b) || Beta(1, 1))``, ``a = d + eps``,
    ``b = 1 - d + eps``: ``lgamma(a + b) - lgamma(a) - lgamma(b) + (a - 1) digamma(a) +
    (b - 1) digamma(b) - (a + b - 2) digamma(a + b)`` (``kl="exact"``)."""
    a, b = d + eps, 1 - d + eps
    return (torch.lgamma(a + b) - torch.lgamma(a) - torch.lgamma(b)
            + (a - 1) * torch.digamma(a) + (b - 1) * torch.digamma(b)
            - (a + b - 2) * torch.digamma(a + b)).mean()


def enhancer_loss(d, observed, x, x_rec, y_rec, a_batch, a_rec, gamma: float = 1e-3,
                  delta: float = 1.0, kl: str = "official") -> tuple[torch.Tensor, dict]:
    """The label enhancer's loss (the official ``vae_loss`` of ``train_smile2.py``)::

        AN(d, z) + gamma * (MSE(x_rec, x) + AN(y~, z) + MSE(A~, A_B)) + delta * KL(d)

    Args:
        d: B x L label distribution (probabilities) of the batch's rows.
        observed: B x L observed labels (1 / 0 / -1).
        x, x_rec: B x D features and their reconstruction (``x`` is not differentiated).
        y_rec: B x L labels sampled by the decoder; ``a_rec`` = ``y_rec @ y_rec.T``.
        a_batch: B x B kNN adjacency among the batch's rows (a target).
        gamma, delta: the weights; ``kl``: "official" (`beta_kl_official`) or "exact"
            (`beta_uniform_kl`).

    Returns:
        ``(total, parts)``: the scalar and a dict of its five terms (tensors).
    """
    if kl not in KL_KINDS:
        raise ValueError(f"kl must be one of {KL_KINDS}, got {kl!r}")
    parts = {"align": an_prob_loss(d, observed),
             "rec_x": F.mse_loss(x_rec, x.detach()),
             "rec_y": an_prob_loss(y_rec, observed),
             "rec_a": F.mse_loss(a_rec, a_batch.detach()),
             "kl": beta_kl_official(d) if kl == "official" else beta_uniform_kl(d)}
    total = parts["align"] + gamma * (parts["rec_x"] + parts["rec_y"] + parts["rec_a"]) + \
        delta * parts["kl"]
    return total, parts


# ---- the objective the engine trains with --------------------------------------------------------
class SmileObjective(SPMLLoss):
    """SMILE's step loss for the engine's loop: the classifier's `weighted_bce` on the
    enhanced targets (per entry) plus the enhancer's `enhancer_loss` (the scalar
    penalty), so its "mean" is ``L_cls + L_LE``. It holds the enhancer's networks (its state
    dict, checkpointed with the run) and, as plain attributes (rebuilt from the features, not
    saved), the train features, the kNN neighbours and the propagation matrix.

    Args:
        x_train: N x D train features (float tensor, on the training device).
        neighbours: N x k kNN indices (`knn_indices`).
        num_classes, hidden: L and the networks' hidden width.
        p, mu, bias, rate, gamma, delta, temperature, kl: the hyperparameters (module
            docstring).
    """

    needs_index = True

    def __init__(self, x_train: torch.Tensor, neighbours: torch.Tensor, num_classes: int,
                 hidden: int, *, p: float, mu: float, bias: bool, rate: float,
                 gamma: float = 1e-3, delta: float = 1.0, temperature: float = 1.0,
                 kl: str = "official"):
        super().__init__()
        if kl not in KL_KINDS:
            raise ValueError(f"kl must be one of {KL_KINDS}, got {kl!r}")
        in_features = x_train.shape[1]
        self.gcn = SmileGCN(in_features, hidden, num_classes)
        self.encoder_z = SmileMLP(in_features + num_classes, hidden)
        self.decoder = SmileDecoder(num_classes, hidden, in_features)
        self.p, self.mu, self.bias_unobserved, self.rate = float(p), float(mu), bool(bias), \
            float(rate)
        self.gamma, self.delta, self.temperature, self.kl = float(gamma), float(delta), \
            float(temperature), kl
        self.x_train = x_train
        self.neighbours = neighbours.to(x_train.device)
        self.propagation = gcn_propagation(neighbours, x_train.shape[0],
                                           x_train.dtype).to(x_train.device)
        self.sums: dict = {}

    def distribution(self) -> torch.Tensor:
        """``d = sigmoid(GCN(X) / T)`` of every train row (N x L)."""
        return torch.sigmoid(self.gcn(self.propagation, self.x_train) / self.temperature)

    def entries(self, logits, observed, index):
        d = self.distribution()[index]
        x = self.x_train[index]
        z = self.encoder_z(torch.cat((x, d), dim=1))
        x_rec, y_rec, a_rec = self.decoder(d, z)
        le, parts = enhancer_loss(d, observed, x, x_rec, y_rec,
                                  batch_adjacency(self.neighbours, index), a_rec, self.gamma,
                                  self.delta, self.kl)
        target = enhanced_targets(d, observed, self.p, self.mu)
        probs = torch.sigmoid(logits / self.temperature)
        mat = weighted_bce(probs, observed, target, self.bias_unobserved, self.rate,
                           reduction="none")
        n = len(index)
        for name, value in (("cls_loss", mat.detach().mean()), ("le_loss", le.detach()),
                            *((f"le_{k}", v.detach()) for k, v in parts.items())):
            self.sums[name] = self.sums.get(name, 0.0) + value * n
        return mat, le


class _Record(StepHook):
    """Adds the epoch's mean classifier and enhancer losses (and the enhancer's terms) to its
    record."""

    def __init__(self, objective: SmileObjective, n: int):
        self.objective, self.n = objective, n

    def on_epoch_start(self, epoch: int) -> None:
        self.objective.sums = {}

    def epoch_record(self) -> dict:
        return {k: float(v) / self.n for k, v in self.objective.sums.items()}


# ---- the method --------------------------------------------------------------------------------
def resolve_hparams(options: dict, dataset: str | None) -> dict:
    """SMILE's hyperparameters of a run: the options given, else the README's for ``dataset``
    (`OFFICIAL_HPARAMS`), else ``train_smile2.py``'s defaults.

    Raises:
        ValueError: a value out of range (naming it).
    """
    official = {**DEFAULT_HPARAMS, **OFFICIAL_HPARAMS.get(dataset or "", {})}
    out = {key: official[key] if options.get(key) is None else options[key]
           for key in ("p", "mu", "bias", "rate")}
    out.update({key: options[key] for key in ("neighbours", "gamma", "delta", "temperature", "kl",
                                                "hidden")})
    if out["bias"] not in (True, False):  # also 0 / 1
        raise ValueError(f"smile option bias must be true or false, got {out['bias']!r}")
    out["bias"] = bool(out["bias"])
    for key in ("p", "mu", "rate", "gamma", "delta", "temperature"):
        value = out[key]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise ValueError(f"smile option {key} must be a number, got {value!r}")
        out[key] = float(value)
    for key in ("p", "mu"):
        if not 0.0 <= out[key] <= 1.0:
            raise ValueError(f"smile option {key} must be in [0, 1], got {out[key]!r}")
    for key in ("rate", "gamma", "delta"):
        if not out[key] >= 0.0:
            raise ValueError(f"smile option {key} must be >= 0, got {out[key]!r}")
    if not out["temperature"] > 0.0:
        raise ValueError(f"smile option temperature must be > 0, got {out['temperature']!r}")
    if not (isinstance(out["neighbours"], int) and out["neighbours"] >= 1):
        raise ValueError(f"smile option neighbours (of the kNN graph) must be an integer >= 1, "
                         f"got {out['neighbours']!r}")
    if out["kl"] not in KL_KINDS:
        raise ValueError(f"smile option kl must be one of {KL_KINDS}, got {out['kl']!r}")
    if out["hidden"] is not None and not (isinstance(out["hidden"], int) and out["hidden"] >= 1):
        raise ValueError(f"smile option hidden must be None (the number of classes) or an "
                         f"integer >= 1, got {out['hidden']!r}")
    return out


def check_values(options: dict) -> None:
    """SMILE's option check (``TrainingMethod.check_values``): `resolve_hparams`'s
    refusals, before a run folder is created or a study runs."""
    resolve_hparams(options, None)


def run_config(ctx: RunContext) -> dict:
    """SMILE's entry of ``config.json``: the resolved hyperparameters."""
    return {"smile": resolve_hparams(ctx.options, ctx.splits.name)}


def _features(x, where: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x, dtype=np.float32))
    if t.ndim != 2 or not torch.isfinite(t).all():
        raise ValueError(f"{where}: SMILE needs finite N x D feature vectors, got shape "
                         f"{tuple(t.shape)}" + ("" if t.ndim != 2 else " with NaN or inf"))
    return t


def fit(ctx: RunContext) -> Fitted:
    """SMILE's fit for [`spmlkit.methods.train_run`][spmlkit.methods.train_run] (module
    docstring)."""
    start = time.perf_counter()
    splits, config = ctx.splits, ctx.config
    hp = resolve_hparams(ctx.options, splits.name)
    device = torch.device(config.device)
    x = _features(splits.train.x, "train features").to(device)
    z = torch.as_tensor(validate_observed(splits.observed, "train observed labels")).to(device)
    if z.shape[0] != x.shape[0]:
        raise ValueError(f"train features have {x.shape[0]} rows, observed labels {z.shape[0]}")
    n, num_classes = z.shape
    if num_classes < 2 and hp["bias"]:
        raise ValueError("smile with bias=True divides unobserved entries by L - 1: it needs "
                         "at least 2 classes")
    if hp["neighbours"] >= n:
        raise ValueError(f"smile option neighbours={hp['neighbours']}: the train split has only "
                         f"{n} rows")
    xv = _features(splits.val.x, "validation features").to(device)
    yv = splits.val.y if is_partial(splits.val.y) else \
        validate_full_labels(splits.val.y, "validation labels")
    check_val_labels(yv, config.map_convention)
    hidden = hp["hidden"] or num_classes
    neighbours = knn_indices(x.cpu(), hp["neighbours"])
    with global_rng(config.seed):
        model = SmileMLP(x.shape[1], num_classes)
        objective = SmileObjective(x, neighbours, num_classes, hidden, p=hp["p"], mu=hp["mu"],
                                   bias=hp["bias"], rate=hp["rate"], gamma=hp["gamma"],
                                   delta=hp["delta"], temperature=hp["temperature"],
                                   kl=hp["kl"])
    model, objective = model.to(device), objective.to(device)
    gen = torch.Generator().manual_seed(config.seed)
    bs = config.batch_size
    record = _Record(objective, epoch_rows(n, bs, config.drop_last))
    optimizer = []

    def batches(epoch):
        perm = torch.randperm(n, generator=gen).to(device)
        for i in batch_starts(n, bs, config.drop_last):
            idx = perm[i:i + bs]
            yield x[idx], z[idx], idx

    def setup():
        if not optimizer:  # one Adam over both networks (the official two, see the docstring)
            optimizer.append(make_optimizer(model, objective, config.lr,
                                            weight_decay=config.weight_decay))
        return StageParts(optimizer[0], hooks=[record])

    def evaluate():
        return val_map(predict_logits(model, xv), yv, config.map_convention, config.metric)

    result = train_loop(model, objective, [Stage(config.epochs, setup)],
                        num_examples=epoch_rows(n, bs, config.drop_last),
                        batches=batches, evaluators={"model": evaluate},
                        early_stop=config.early_stop, on_epoch=ctx.on_epoch,
                        checkpoint=ctx.checkpoint, resume=ctx.resume,
                        state={"batch_order": GeneratorState(gen)},
                        epoch_seed=lambda epoch: mix_seed(config.seed, epoch), start=start,
                        metric=config.metric)

    def probs(features) -> np.ndarray:
        return torch.sigmoid(predict_logits(model, features)).cpu().numpy()

    with torch.no_grad():
        enhanced = objective.distribution().cpu().numpy()
    out = {"train": probs(x), "val": probs(xv),
           "test": probs(_features(splits.test.x, "test features").to(device))}
    best = {"model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "in_features": int(x.shape[1]), "preprocess": feature_preprocess(splits),
            "enhancer": {k: v.detach().cpu() for k, v in objective.state_dict().items()},
            "smile": hp}
    extra = {"smile": hp,
             "enhanced_recovery_map": map_score(enhanced, splits.train.y,
                                                config.map_convention)}
    return Fitted(result, out, best, extra,
                  files={ENHANCED_LABELS_FILE: enhanced.astype(np.float32)}
                  if ctx.run_dir is not None else {})


def classifier_from_state(state: dict) -> SmileMLP:
    """SMILE's classifier (an MLP on feature vectors) from its state dict."""
    w1 = state["fc1.weight"]
    model = SmileMLP(w1.shape[1], w1.shape[0])
    model.load_state_dict(state)
    return model


def load_model(best: dict, config: dict):
    """The classifier (inputs: features), or for a run on a backbone's cached features of an
    image source, the backbone rebuilt by name with the classifier on top (inputs: images)."""
    mlp = classifier_from_state(best["model"])
    options = config.get("dataset_options") or {}
    name = options.get("backbone")
    if not name:
        return mlp, {"inputs": "features", "in_features": int(mlp.fc1.in_features)}
    from ..models.backbones import create_backbone

    feats = options.get("features") or {}
    backbone = create_backbone(name, pretrained=bool(feats.get("pretrained", True)))
    size = int(feats.get("size") or backbone.input_size)
    return nn.Sequential(backbone, mlp), {"inputs": "images", "image_size": size,
                                          "mean": tuple(backbone.mean),
                                          "std": tuple(backbone.std)}


SMILE = register_method(TrainingMethod(
    name="smile", description="SMILE: label enhancement by a GCN variational auto-encoder "
    "over the train rows' kNN graph, an MLP classifier trained on the enhanced labels "
    "(feature vectors; --loss an)",
    paper="Xu et al. 2022", inputs="features", fit=fit, load_model=load_model,
    run_config=run_config,
    options={"p": None, "mu": None, "bias": None, "rate": None, "neighbours": 3, "gamma": 1e-3,
             "delta": 1.0, "temperature": 1.0, "kl": "official", "hidden": None},
    default_batch_size=OFFICIAL_BATCH_SIZE, default_epochs=OFFICIAL_EPOCHS,
    default_lr=OFFICIAL_LR, losses=("an",),
    default_lr_source="the official script's Adam rate (palm-ml/smile train_smile2.py)",
    check_values=check_values, train_fields=("weight_decay",)))
