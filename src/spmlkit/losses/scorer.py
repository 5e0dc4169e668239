"""Pseudo-labels from an external scorer: VLPL's EM_PL loss and AEVLP's GPR loss.

Both methods score every (image, class) pair of the train split with a vision-language model
(CLIP), turn the scores into positive / negative pseudo-labels for the unannotated entries and
train the classifier with a loss that treats observed labels, pseudo-labels and the remaining
unknowns differently. CLIP and its weights are not part of spmlkit: here the scores come from a
file (or an array) the user supplies, one row per train example, one column per class.

- ``em_pl``: Xing et al., "Vision-Language Pseudo-Labels for Single-Positive Multi-Label
  Learning" (VLPL, 2023). Official code ``mvrl/VLPL`` at commit
  ``c2effea416dcb878967eda273190374b6dcba23f``: ``losses.py`` (``loss_EM_PL``), ``models.py``
  (how CLIP similarities become pseudo-labels), ``main_clip.py`` (hyperparameters).
- ``gpr``: "More Reliable Pseudo-labels, Better Performance: A Generalized Approach to Single
  Positive Multi-label Learning" (AEVLP, ICCV 2025, arXiv 2508.20381). Official code
  ``Fsoft-AIC/AEVLP``: ``losses.py`` (``GPR_loss``), ``models.py`` (``KFunction``,
  ``VFunction``), ``train.py`` (the epoch schedules of K and V) and ``config.py`` at commit
  ``c24bb3c73e61b7a2abffe52e185d42f9d1722039``; ``utils.py`` (``get_pseudo_labels``) and
  ``configs/*.json`` at commit ``5aff282a1f1d89b421e066472d38ce20b5a9f8dd``.

The score file
--------------
An N x L matrix (``.npy``, ``.npz`` holding one array or an array named ``scores``, or a ``.csv``
of numbers without a header), row ``i`` scoring train example ``i`` in the order of
``spmlkit.loading.load_splits(dataset, ...).train`` (its ids are ``splits.train.ids``; the train
rows do not depend on the seed, only the observed labels do). ``score_type`` says what it holds:

- ``"labels"``: pseudo-labels in {1, 0, -1} (1 positive, -1 negative, 0 none), used as they are;
- ``"probs"``: scores in [0, 1];
- ``"logits"``: real numbers, made scores by a sigmoid;
- ``"cosine"``: CLIP image-text cosine similarities, made scores by the official rule of both
  papers, a softmax over the classes at temperature ``temp`` (default 0.01);
- ``"auto"`` (default): ``labels`` when every value is -1, 0 or 1, else ``probs`` when every value
  lies in [0, 1], else an error asking for ``logits`` or ``cosine``.

NaN or infinite values, a matrix that is not 2-D, values outside the kind's range and a shape other
than the train split's raise ``ValueError`` naming the file. Pseudo-labels apply to unobserved
entries only (the official ``where(observed == 0, pseudo, observed)``).

Scores become pseudo-labels with each paper's rule (`vlpl_pseudo_labels`,
`aevlp_pseudo_labels`). Differences from the official code, all deliberate:

- the scores are computed once, outside, and fixed for the whole run; the official code scores
  each batch again with CLIP (the same images, so the same scores up to augmentation);
- AEVLP mixes global and local-crop CLIP scores (``sim_final`` for positives, ``sim`` for
  negatives); a file holds one score per entry, used for both;
- **bug fixed**: AEVLP's ``get_pseudo_labels`` writes its "negative pseudo-labels" (the
  ``negative_ratio * L`` lowest scores) as 0, not -1, so ``GPR_loss``'s branch for negative
  pseudo-labels (``final_labels == -1``) never fires on them and the comment's "10% of
  low-confidence labels to be negative pseudo-labels" does not happen. Here they are -1 and get
  that branch's ``V * (-log(1-p))``; ``neg_ratio=0`` gives the official behaviour (but for an
  entry both among a row's ``top_k`` and among its lowest, which the official code resets to 0);
- ties between equal scores are broken by column order (stable sorts), ``torch.topk``'s order is
  unspecified;
- the logs are exact (``eps = 0``) by default; ``eps=1e-5`` (VLPL) or ``eps=1e-7`` (AEVLP) give
  the official ``log(x + eps)``;
- observed negatives (regimes that have them): VLPL's ``loss_EM_PL`` gives them no loss at all
  (``final_labels == -1`` is never assigned); here they get ``-log(1-p)`` as in
  `spmlkit.losses.zhou`. AEVLP's ``GPR_loss`` gives them ``V * (-log(1-p))``, kept.

The pseudo-labels are the losses' state (buffer ``pseudo``, int8 N x L, only on unobserved
entries) with the epoch counters, so ``state_dict()`` checkpoints them and a resumed run keeps the
labels it trained with. ``hard_pseudo_labels()`` reports them for ``pl_count`` / ``pl_precision``.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..labels import NEGATIVE, POSITIVE, UNOBSERVED
from ..safe_load import check_array_file
from ..constraints import Interval, Options, Rule
from .contract import SPMLLoss, check_hparams
from .inputs import K_RULE, TrainInfo
from .logspace import as_compute, expected_positive_penalty, log_1mp, log_p, masks
from .state import take_rows
from .registry import register
from .zhou import _OFFICIAL_ALPHA, binary_entropy

VLPL = "Xing et al. 2023 (VLPL)"
AEVLP = "AEVLP, ICCV 2025 (arXiv 2508.20381)"
SCORE_TYPES = ("auto", "labels", "probs", "logits", "cosine")

#: AEVLP's official training settings (``configs/*.json``; COCO's file is the repository's
#: top-level ``coco.json``): batch size, Adam learning rate (the linear head at ``lr_mult`` = 10
#: times it) and epochs, fine-tuning a ResNet-50; early stop after 2 epochs without improvement.
OFFICIAL_TRAINING_GPR = {
    "voc": {"batch_size": 8, "lr": 1e-5, "num_epochs": 8},
    "coco": {"batch_size": 16, "lr": 1e-5, "num_epochs": 8},
    "nuswide": {"batch_size": 16, "lr": 1e-5, "num_epochs": 10},
    "cub": {"batch_size": 8, "lr": 1e-5, "num_epochs": 10},
}
#: VLPL's official training settings (``main_clip.py``): 10 epochs, ResNet-50 fine-tuned.
OFFICIAL_TRAINING_EM_PL = {
    "voc": {"batch_size": 8, "lr": 1e-5, "num_epochs": 10},
    "coco": {"batch_size": 8, "lr": 1e-5, "num_epochs": 10},
    "nuswide": {"batch_size": 8, "lr": 1e-5, "num_epochs": 10},
    "cub": {"batch_size": 8, "lr": 1e-4, "num_epochs": 10},
}

_STRONG = {"w0": 0.0, "w_max": 10.0, "b0": -2.0, "b_max": -8.0}
_GPR_DATASETS = {  # configs/<set>.json (and coco.json), top_k from config.py's _LOOKUP
    "voc": {"lam_1": 0.7, "lam_2": 0.4, "epr": 0.05, "threshold": 0.5, "neg_ratio": 0.2},
    "coco": {**_STRONG, "lam_1": 0.7, "lam_2": 0.5, "epr": 0.001, "threshold": 0.5,
             "neg_ratio": 0.3},
    "nuswide": {**_STRONG, "lam_1": 0.7, "lam_2": 0.5, "epr": 0.001, "threshold": 0.6,
                "neg_ratio": 0.2},
    "cub": {**_STRONG, "q3": 1.5, "lam_1": 0.8, "lam_2": 0.2, "epr": 0.01, "temp": 0.1,
            "threshold": 0.005, "neg_ratio": 0.2, "top_k": 32},
}


# --- the score file ----------------------------------------------------------------------------
def _describe(source) -> str:
    return f"scores file {str(source)!r}" if isinstance(source, (str, os.PathLike)) \
        else "scores array"


def read_scores(source) -> np.ndarray:
    """The N x L matrix of a score file (``.npy``, ``.npz``, ``.csv``) or array, as float64.

    Args:
        source: a path (str or ``os.PathLike``), or an array / tensor.

    Returns:
        the matrix (float64), not yet checked against a train split.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown extension, an ``.npz`` with several arrays and none named
            ``scores``, a CSV that is not all numbers, not 2-D, empty, or NaN / infinite values;
            the message names the file.
    """
    what = _describe(source)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{what}: no such file (an N x L matrix of scores or "
                                    f"pseudo-labels, .npy / .npz / .csv)")
        suffix = path.suffix.lower()
        try:
            if suffix in (".npy", ".npz"):
                check_array_file(path)  # a header claiming a huge shape: refused first
            if suffix == ".npy":
                data = np.load(path, allow_pickle=False)
            elif suffix == ".npz":
                with np.load(path, allow_pickle=False) as z:
                    keys = list(z.keys())
                    if "scores" not in keys and len(keys) != 1:
                        raise ValueError(f"{what} holds the arrays {keys}: name the score "
                                         f"matrix 'scores' or store only it")
                    data = z["scores" if "scores" in keys else keys[0]]
            elif suffix == ".csv":
                data = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
            else:
                raise ValueError(f"{what}: unknown extension {suffix!r}; expected .npy, .npz "
                                 f"or .csv")
        except ValueError as err:
            if str(err).startswith(what):
                raise
            raise ValueError(f"{what} could not be read as a numeric matrix: {err}") from None
    else:
        data = source.detach().cpu().numpy() if torch.is_tensor(source) else np.asarray(source)
    if data.dtype.kind not in "biuf":
        raise ValueError(f"{what} holds {data.dtype} values; expected numbers")
    data = np.asarray(data, dtype=np.float64)
    if data.ndim != 2 or data.size == 0:
        raise ValueError(f"{what} has shape {data.shape}; expected an N x L matrix (one row per "
                         f"train example, one column per class)")
    bad = ~np.isfinite(data)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(f"{what} holds {int(bad.sum())} NaN or infinite value(s) (first at row "
                         f"{row}, column {col})")
    return data


def _is_labels(data: np.ndarray) -> bool:
    return bool(np.isin(data, (NEGATIVE, UNOBSERVED, POSITIVE)).all())


def scores_as_probabilities(data: np.ndarray, score_type: str, temp: float = 0.01,
                            where: str = "scores") -> tuple[str, np.ndarray]:
    """``(kind, matrix)``: the kind the matrix holds (``score_type``, or what ``"auto"``
    detects) and, for a score kind, the scores in [0, 1] (``labels`` are returned as they are).

    ``cosine``: ``softmax(x / temp)`` over each row's classes, the official rule of both papers
    (``temperature_scaled_softmax``). Raises ``ValueError`` (naming ``where``) for values outside
    the kind's range or an unknown ``score_type``.
    """
    if score_type not in SCORE_TYPES:
        raise ValueError(f"score_type must be one of {SCORE_TYPES}, got {score_type!r}")
    kind = score_type
    if kind == "auto":
        if _is_labels(data):
            kind = "labels"
        elif data.min() >= 0.0 and data.max() <= 1.0:
            kind = "probs"
        else:
            raise ValueError(f"{where} holds values in [{data.min():.4g}, {data.max():.4g}], "
                             f"neither pseudo-labels in {{1, 0, -1}} nor scores in [0, 1]: set "
                             f"score_type=logits (sigmoid) or score_type=cosine (CLIP "
                             f"similarities, softmax(x / temp) over the classes)")
    if kind == "labels":
        if not _is_labels(data):
            vals = sorted(set(np.unique(data[~np.isin(data, (-1, 0, 1))]).tolist()))[:5]
            raise ValueError(f"{where}: score_type=labels needs values in {{1, 0, -1}}, found "
                             f"{vals}")
        return kind, data
    if kind == "probs":
        if data.min() < 0.0 or data.max() > 1.0:
            raise ValueError(f"{where}: score_type=probs needs scores in [0, 1], found values in "
                             f"[{data.min():.4g}, {data.max():.4g}] (logits: score_type=logits)")
        return kind, data
    if kind == "logits":
        return kind, 1.0 / (1.0 + np.exp(-data))
    if not temp > 0:
        raise ValueError(f"temp (the softmax temperature of score_type=cosine) must be > 0, "
                         f"got {temp}")
    z = data / temp
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return kind, z / z.sum(axis=1, keepdims=True)


def _lowest(scores: np.ndarray, count: int) -> np.ndarray:
    """Bool mask of the ``count`` lowest scores of each row (ties: lower column first)."""
    out = np.zeros(scores.shape, dtype=bool)
    if count > 0:
        cols = np.argsort(scores, axis=1, kind="stable")[:, :count]
        np.put_along_axis(out, cols, True, axis=1)
    return out


def _score_source(source):
    """``source`` if it can be a matrix of scores (a path, an array, a tensor) or None."""
    if source is None or isinstance(source, (str, os.PathLike, np.ndarray, torch.Tensor, list,
                                             tuple)):
        return source
    raise ValueError(f"scores must be a path of an N x L score file or an array, got "
                     f"{type(source).__name__} {source!r}")


def _check_ratio(neg_ratio: float) -> None:
    if not 0.0 <= neg_ratio <= 1.0:
        raise ValueError(f"neg_ratio (the share of each row's classes made negative "
                         f"pseudo-labels) must be in [0, 1], got {neg_ratio}")


def vlpl_pseudo_labels(scores: np.ndarray, threshold: float = 0.3,
                       neg_ratio: float = 0.0) -> np.ndarray:
    """VLPL's rule (``models.py``, "options 3"): 1 where the score exceeds ``threshold``
    (strictly); then -1 on the ``int(neg_ratio * L)`` lowest scores of each row (the official
    ``partial``, default 0, written after the positives as the official ``scatter_``).

    >>> vlpl_pseudo_labels(np.array([[0.5, 0.3, 0.1, 0.1]]), 0.3, 0.25).tolist()
    [[1, 0, -1, 0]]
    """
    _check_ratio(neg_ratio)
    out = np.where(scores > threshold, POSITIVE, UNOBSERVED).astype(np.int8)
    out[_lowest(scores, int(neg_ratio * scores.shape[1]))] = NEGATIVE
    return out


def aevlp_pseudo_labels(scores: np.ndarray, threshold: float = 0.5, top_k: int = 3,
                        neg_ratio: float = 0.1) -> np.ndarray:
    """AEVLP's rule (``utils.get_pseudo_labels``): 1 on those of each row's ``top_k`` highest
    scores that are ``>= threshold``; then -1 on the ``int(neg_ratio * L)`` lowest (the
    official code writes 0 there, a bug: see the module docstring).

    >>> aevlp_pseudo_labels(np.array([[0.6, 0.5, 0.7, 0.1, 0.0]]), 0.5, 2, 0.2).tolist()
    [[1, 0, 1, 0, -1]]
    """
    _check_ratio(neg_ratio)
    if int(top_k) != top_k or top_k < 0:
        raise ValueError(f"top_k must be a whole number >= 0, got {top_k}")
    top_k = min(int(top_k), scores.shape[1])
    out = np.zeros(scores.shape, dtype=np.int8)
    if top_k:
        cols = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]
        high = np.take_along_axis(scores, cols, axis=1) >= threshold
        np.put_along_axis(out, cols, high.astype(np.int8), axis=1)
    out[_lowest(scores, int(neg_ratio * scores.shape[1]))] = NEGATIVE
    return out


def simulated_scores(y, flip: float = 0.1, margin: float = 2.0, noise: float = 1.0,
                     seed: int = 0) -> np.ndarray:
    """Scores of a simulated external scorer of known quality, for tests and benchmarks.

    Each entry of the full labels ``y`` (N x L, 0/1) is flipped with probability ``flip``; the
    scores are ``sigmoid(margin * (2 y' - 1) + noise * e)`` with ``e`` standard normal, all drawn
    from ``numpy.random.default_rng(seed)``. ``flip=0, noise=0`` gives a perfect scorer.

    Returns:
        N x L float64 scores in (0, 1).
    """
    y = np.asarray(y)
    if y.ndim != 2 or not np.isin(y, (0, 1)).all():
        raise ValueError(f"y must be an N x L matrix of 0/1 labels, got shape {y.shape}")
    if not 0.0 <= flip <= 1.0 or noise < 0:
        raise ValueError(f"flip must be in [0, 1] and noise >= 0, got {flip} and {noise}")
    rng = np.random.default_rng(seed)
    flipped = np.where(rng.random(y.shape) < flip, 1 - y, y)
    logits = margin * (2.0 * flipped - 1.0) + noise * rng.standard_normal(y.shape)
    return 1.0 / (1.0 + np.exp(-logits))


# --- the losses --------------------------------------------------------------------------------
class ScorerPseudoLabelLoss(SPMLLoss):
    """Base of the losses that read an external scorer's N x L matrix (module docstring).

    ``scores`` is read (and its values checked) when the loss is built; at
    `on_train_start` its shape is checked against the train split and it becomes the
    pseudo-label buffer ``pseudo`` (unobserved entries only). Built without ``scores``, the loss
    keeps the pseudo-labels it already holds (loaded from a checkpoint); with neither,
    `on_train_start` raises ``ValueError``.

    Stackable (the vectorised linear engine): the stacked ``pseudo`` is R x N x L and a batch's
    rows are taken per run (`take_rows`, ``index`` R x B); the
    epoch and the run's epochs are Python numbers the hooks keep (on the stacked module too:
    stacked runs share them), so a step reads no buffer.
    """

    needs_index = True
    #: the loss needs an N_train x L score matrix (``scores=``); the contract tests give one
    needs_scores = True
    resizable_state = ("pseudo",)
    name = "scorer"
    stackable = True
    negative_entries = True

    parameter_constraints = {
        "scores": Rule(_score_source, "a path of the N x L score file, an array, or None",
                       bad=(3, True)),
        "score_type": Options(SCORE_TYPES), "threshold": Interval(float, 0, 1),
        "neg_ratio": Interval(float, 0, 1), "temp": Interval(float, 0, None, closed="right")}

    def __init__(self, scores=None, score_type: str = "auto", threshold: float = 0.5,
                 neg_ratio: float = 0.0, temp: float = 0.01, **kw):
        super().__init__(**kw)
        check_hparams(type(self), locals())
        self.score_type, self.threshold = score_type, float(threshold)
        self.neg_ratio, self.temp = float(neg_ratio), float(temp)
        self.scores = str(scores) if isinstance(scores, (str, os.PathLike)) else \
            (None if scores is None else "<array>")
        self._where = f"{self.name}: {_describe(scores)}"
        self._labels = None
        if scores is not None:
            data = read_scores(scores)
            kind, probs = scores_as_probabilities(data, score_type, self.temp, self._where)
            self._labels = probs.astype(np.int8) if kind == "labels" else \
                self._pseudo_from_scores(probs)
        self.register_buffer("pseudo", torch.zeros(0, 0, dtype=torch.int8))
        self.register_buffer("epoch", torch.zeros((), dtype=torch.long))
        self.register_buffer("total_epochs", torch.zeros((), dtype=torch.long))
        self._epoch = self._total = 0  # the two buffers as Python ints (no read per step)

    def _pseudo_from_scores(self, probs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # --- engine hooks -----------------------------------------------------------------------
    def on_train_start(self, observed, info: TrainInfo) -> None:
        obs = torch.as_tensor(observed)
        shape = (int(info.num_examples), int(info.num_classes))
        if obs.ndim != 2 or tuple(obs.shape) != shape:
            raise ValueError(f"{self.name}: observed labels {tuple(obs.shape)} do not match "
                             f"TrainInfo ({shape[0]} examples x {shape[1]} classes)")
        self.total_epochs.fill_(int(info.num_epochs))
        self._total = int(info.num_epochs)
        if self._labels is None:
            if tuple(self.pseudo.shape) == shape:
                return  # carried over from a checkpoint
            raise ValueError(f"{self.name} needs an external scorer's N x L matrix: pass "
                             f"scores=PATH (.npy / .npz / .csv; spml train --hp scores=PATH), "
                             f"one row per train example in the train split's order")
        if self._labels.shape != shape:
            raise ValueError(f"{self._where} has {self._labels.shape[0]} rows x "
                             f"{self._labels.shape[1]} columns; the train split has {shape[0]} "
                             f"examples x {shape[1]} classes (rows must follow the train split's "
                             f"order: spmlkit.loading.load_splits(...).train)")
        pl = torch.as_tensor(self._labels, device=self.pseudo.device)
        self.pseudo = torch.where(obs.to(pl.device) == UNOBSERVED, pl, torch.zeros_like(pl))

    def on_epoch_start(self, epoch: int) -> None:
        self.epoch.fill_(int(epoch))
        self._epoch = int(epoch)

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._epoch, self._total = int(self.epoch), int(self.total_epochs)

    def hard_pseudo_labels(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mask, value)``: the pseudo-labelled train entries and their 0/1 labels."""
        return self.pseudo != 0, (self.pseudo == POSITIVE).to(torch.int8)

    def _batch_masks(self, observed, index, logits):
        """Float masks in the logits' dtype (a float32 mask times a weight would round the
        weight to float32 in a float64 computation): O+, O-, U, and the U entries that are
        positive / negative pseudo-labels."""
        if self.pseudo.numel() == 0:
            raise RuntimeError(f"{self.name}'s pseudo-labels are not initialised: the engine "
                               f"calls on_train_start(observed, info) before training")
        dtype, device = logits.dtype, logits.device
        pl = take_rows(self.pseudo, index).to(device)
        pos, unobs, neg = (m.to(device, dtype) for m in masks(observed))
        return pos, neg, unobs, unobs * (pl == POSITIVE), unobs * (pl == NEGATIVE)


@register("em_pl", "VLPL: EM with an external scorer's pseudo-labels: -log p on O+, beta_pos*"
          "BCE(p, rho) on pseudo-positives (score > threshold), beta_neg*BCE(p, 1-rho) on "
          "pseudo-negatives (0 officially), -alpha*H(p) on other U, -log(1-p) on O-; needs "
          "--hp scores=FILE (N_train x L)", paper=VLPL,
          dataset_defaults={d: {"alpha": a} for d, a in _OFFICIAL_ALPHA.items()})
class EMPseudoLabelLoss(ScorerPseudoLabelLoss):
    """VLPL's ``loss_EM_PL`` (``mvrl/VLPL@c2effea``, ``losses.py``).

    Per entry, with ``p = sigmoid(s)``: ``-log p`` on O+; ``-log(1-p)`` on O- (official: 0, see
    the module docstring); on an unobserved entry that is a positive pseudo-label
    ``beta_pos * (-rho log p - (1-rho) log(1-p))``; a negative pseudo-label
    ``beta_neg * (-(1-rho) log p - rho log(1-p))`` (the official code has this branch commented
    out and ``beta_neg = 0`` everywhere: the default 0 gives its zero loss); any other
    unobserved entry ``-alpha * H(p)`` (EM). Mean over B * L (the official
    ``loss_mtx / (B * L)`` sum). During the first ``warmup`` epochs the loss is plain EM
    (official ``P['epoch'] > P['warmup_epoch']`` on 1-based epochs; ``warmup`` is 0 in every
    official setting, so pseudo-labels are used from the first step).

    Pseudo-labels (``models.py``): 1 where the score ``> threshold``; -1 on the
    ``int(neg_ratio * L)`` lowest of each row (`vlpl_pseudo_labels`). Scores are the
    softmax over classes of CLIP cosine similarities at temperature ``temp`` (``score_type=
    cosine``), or a file's scores as they are.

    Official values (``main_clip.py``): alpha VOC 0.2, COCO 0.1, NUS-WIDE 0.1, CUB 0.01 (the
    registry's dataset defaults); beta_pos 0.7, beta_neg 0, rho 0.9 (the hard-coded 0.9 / 0.1),
    warmup 0, threshold 0.3 and temp 0.01 (the command-line defaults), neg_ratio 0 (``partial``;
    only the ``clip_vision`` backbone uses it). Training: `OFFICIAL_TRAINING_EM_PL`.
    ``eps=1e-5`` reproduces the official ``log(x + 1e-5)``.

    Args:
        scores: path of the N_train x L matrix (or an array); see the module docstring.
        score_type: ``auto``, ``labels``, ``probs``, ``logits`` or ``cosine``.
        threshold: a score above it is a positive pseudo-label.
        neg_ratio: share of each row's classes (lowest scores) made negative pseudo-labels.
        temp: softmax temperature for ``score_type=cosine``.
        alpha: EM weight on the unobserved entries without a pseudo-label.
        beta_pos, beta_neg: weights of the positive / negative pseudo-labels' terms.
        rho: the pseudo-labels' smoothed target (0.9: BCE towards 0.9 for positives).
        warmup: epochs of plain EM first.
    """

    name = "em_pl"

    parameter_constraints = {
        "alpha": Interval(float, 0), "beta_pos": Interval(float, 0),
        "beta_neg": Interval(float, 0), "rho": Interval(float, 0, 1), "warmup": Interval(int, 0)}

    def __init__(self, scores=None, score_type: str = "auto", threshold: float = 0.3,
                 neg_ratio: float = 0.0, temp: float = 0.01, alpha: float = 0.1,
                 beta_pos: float = 0.7, beta_neg: float = 0.0, rho: float = 0.9,
                 warmup: int = 0, **kw):
        check_hparams(type(self), locals())
        self.alpha, self.beta_pos, self.beta_neg = float(alpha), float(beta_pos), float(beta_neg)
        self.rho, self.warmup = float(rho), int(warmup)
        super().__init__(scores=scores, score_type=score_type, threshold=threshold,
                         neg_ratio=neg_ratio, temp=temp, **kw)

    def _pseudo_from_scores(self, probs):
        return vlpl_pseudo_labels(probs, self.threshold, self.neg_ratio)

    def entries(self, logits, observed, index):
        pos, neg, unobs, ppos, pneg = self._batch_masks(observed, index, logits)
        lp, l1p = log_p(logits, self.eps), log_1mp(logits, self.eps)
        mat = -(pos * lp + neg * l1p)
        if self._epoch < self.warmup:
            return mat - self.alpha * unobs * binary_entropy(logits, self.eps), None
        rest = unobs - ppos - pneg
        mat = mat - self.alpha * rest * binary_entropy(logits, self.eps)
        mat = mat - self.beta_pos * ppos * (self.rho * lp + (1 - self.rho) * l1p)
        if self.beta_neg:
            mat = mat - self.beta_neg * pneg * ((1 - self.rho) * lp + self.rho * l1p)
        return mat, None


def gpr_entries(logits, kk, vv, pos, neg, unobs, ppos, pneg, *, q2: float, q3: float,
                rho: float, lam_1: float, lam_2: float, eps: float = 0.0) -> torch.Tensor:
    """GPR's per-entry matrix (`GPRLoss`) for given weights ``K`` (``kk``) and ``V``
    (``vv``), which the loss computes from the detached predictions: the gradient flows through
    the logits only. The masks are float B x L: O+, O-, U, and the U entries that are positive /
    negative pseudo-labels."""
    logits = as_compute(logits)
    lp, l1p = log_p(logits, eps), log_1mp(logits, eps)
    # (1 - p^q) / q and (1 - (1-p)^q) / q in log space: p^q = exp(q log p)
    l_q2 = -torch.expm1(q2 * (log_p(logits) if eps else lp)) / q2
    l_q3 = -torch.expm1(q3 * (log_1mp(logits) if eps else l1p)) / q3
    rest = unobs - ppos - pneg
    v_pos = torch.clamp(torch.clamp(vv, min=1.0 - lam_1), max=1.0 - lam_2)
    return (-pos * lp + rest * vv * (kk * l_q2 + (1 - kk) * l_q3)
            - ppos * (1 - v_pos) * (rho * lp + (1 - rho) * l1p)
            - (pneg + neg) * vv * l1p)


@register("gpr", "AEVLP: generalized pseudo-label robust loss with an external scorer: -log p "
          "on O+, (1-clamp(V))*BCE(p, rho) on pseudo-positives (top_k scores >= threshold), "
          "V*(-log(1-p)) on pseudo-negatives and O-, V*(K*L_q2(p) + (1-K)*L_q3(p)) on other U "
          "(K, V: scheduled functions of p), plus epr*EPR; needs --hp scores=FILE", paper=AEVLP,
          dataset_defaults=_GPR_DATASETS)
class GPRLoss(ScorerPseudoLabelLoss):
    """AEVLP's ``GPR_loss`` (``Fsoft-AIC/AEVLP@c24bb3c``, ``losses.py``; schedules from
    ``train.py``, ``K`` and ``V`` from ``models.py``).

    With ``p = sigmoid(s)`` and ``p'`` the same value detached: ``K = sigmoid(w p' + b)``,
    ``V = exp(-(p' - mu)^2 / (2 sigma^2)``, ``L_q2(p) = (1 - p^q2) / q2`` (a generalized
    ``-log p``), ``L_q3(p) = (1 - (1-p)^q3) / q3`` (``q3 = 1``: MAE towards 0). Per entry:
    ``-log p`` on O+; ``V * (K L_q2(p) + (1-K) L_q3(p))`` on unobserved entries without a
    pseudo-label; ``(1 - V_c) * (-rho log p - (1-rho) log(1-p))`` on positive pseudo-labels with
    ``V_c = min(max(V, 1 - lam_1), 1 - lam_2)``; ``V * (-log(1-p))`` on negative pseudo-labels and
    on observed negatives. Mean over B * L, plus ``epr * ((mean_n sum_i p - k) / L)^2`` (the
    official ``expected_positive_regularizer``; ``k``: the dataset's expected positives per
    example unless given).

    Schedules over the run's ``T`` epochs (``TrainInfo.num_epochs``), at 0-based epoch ``e``
    (the official 1-based ``epoch = e + 1`` with ``linear_init = 0``, its value in every config):
    ``w = w0 + (w_max - w0) e / T`` and ``b`` alike; ``mu = mu0 + (mu_max - mu0) (e + 1) / T`` and
    ``sigma`` alike (the official offsets differ by one epoch: ``epoch - n - 1`` for ``w, b``,
    ``epoch - n`` for ``mu, sigma``).

    Pseudo-labels (`aevlp_pseudo_labels`): 1 on the row's ``top_k`` highest scores that are
    ``>= threshold``; -1 on its ``int(neg_ratio * L)`` lowest (the bug fix of the module
    docstring). Defaults: ``config.py``'s command-line defaults (``beta = [0, 2, -2, -2]``,
    ``alpha = [0.5, 2, 0.8, 0.5]``, ``q2q3 = [0.01, 1]``, ``lam = [0.8, 0.3]``, rho 0.9, reg 0.001,
    threshold 0.5, negative_ratio 0.1, temp 0.01, top_k 3); per dataset the values of
    ``configs/*.json`` (registry dataset defaults; VOC keeps beta ``[0, 2, -2, -2]``, lam
    ``[0.7, 0.4]``, reg 0.05, negative_ratio 0.2). Training: `OFFICIAL_TRAINING_GPR`.
    ``eps=1e-7`` reproduces the official ``log(x + 1e-7)``.

    Args:
        scores, score_type, threshold, neg_ratio, temp: as for ``em_pl``.
        top_k: at most this many positive pseudo-labels per row.
        rho: the positive pseudo-labels' smoothed target.
        lam_1, lam_2: ``V`` of a positive pseudo-label is clamped to ``[1 - lam_1, 1 - lam_2]``.
        q2, q3: exponents of ``L_q2`` and ``L_q3`` (> 0).
        w0, w_max, b0, b_max: K's schedule (the official ``beta`` list).
        mu0, sigma0, mu_max, sigma_max: V's schedule (the official ``alpha`` list).
        epr: weight of the expected-positive penalty (the official ``reg``; not named ``reg``,
            which [`create_loss`][spmlkit.losses.create_loss] keeps for regularisers); k: expected
            positives per example.
    """

    name = "gpr"

    parameter_constraints = {
        "top_k": Interval(int, 0), "rho": Interval(float, 0, 1),
        "lam_1": Interval(float, 0), "lam_2": Interval(float, 0),
        **{name: Interval(float) for name in ("w0", "w_max", "b0", "b_max", "mu0", "mu_max")},
        **{name: Interval(float, 0, None, closed="right")
           for name in ("q2", "q3", "sigma0", "sigma_max")},
        "epr": Interval(float, 0), "k": K_RULE}

    def __init__(self, scores=None, score_type: str = "auto", threshold: float = 0.5,
                 neg_ratio: float = 0.1, temp: float = 0.01, top_k: int = 3, rho: float = 0.9,
                 lam_1: float = 0.8, lam_2: float = 0.3, q2: float = 0.01, q3: float = 1.0,
                 w0: float = 0.0, w_max: float = 2.0, b0: float = -2.0, b_max: float = -2.0,
                 mu0: float = 0.5, sigma0: float = 2.0, mu_max: float = 0.8,
                 sigma_max: float = 0.5, epr: float = 0.001, k: float | None = None, **kw):
        check_hparams(type(self), locals())
        self.top_k, self.rho = int(top_k), float(rho)
        self.lam_1, self.lam_2, self.q2, self.q3 = float(lam_1), float(lam_2), float(q2), float(q3)
        self.w0, self.w_max, self.b0, self.b_max = float(w0), float(w_max), float(b0), float(b_max)
        self.mu0, self.sigma0 = float(mu0), float(sigma0)
        self.mu_max, self.sigma_max = float(mu_max), float(sigma_max)
        self.epr, self.k = float(epr), k
        self._k_given = k is not None
        super().__init__(scores=scores, score_type=score_type, threshold=threshold,
                         neg_ratio=neg_ratio, temp=temp, **kw)

    def _pseudo_from_scores(self, probs):
        return aevlp_pseudo_labels(probs, self.threshold, self.top_k, self.neg_ratio)

    def on_train_start(self, observed, info: TrainInfo) -> None:
        super().on_train_start(observed, info)
        if not self._k_given:  # each run's own
            self.k = info.k

    def schedule(self, epoch: int | None = None) -> dict:
        """``{"w", "b", "mu", "sigma"}`` at 0-based ``epoch`` (default: the current one)."""
        e = self._epoch if epoch is None else int(epoch)
        t = self._total
        if t <= 0:
            raise RuntimeError("gpr's schedule needs the run's epochs: the engine calls "
                               "on_train_start(observed, info) before training")
        fb, fa = max(e, 0) / t, max(e + 1, 0) / t
        return {"w": self.w0 + (self.w_max - self.w0) * fb,
                "b": self.b0 + (self.b_max - self.b0) * fb,
                "mu": self.mu0 + (self.mu_max - self.mu0) * fa,
                "sigma": self.sigma0 + (self.sigma_max - self.sigma0) * fa}

    def entries(self, logits, observed, index):
        pos, neg, unobs, ppos, pneg = self._batch_masks(observed, index, logits)
        sch = self.schedule()
        logits = as_compute(logits)
        p_det = torch.sigmoid(logits.detach())
        kk = torch.sigmoid(sch["w"] * p_det + sch["b"])
        vv = torch.exp(-0.5 * ((p_det - sch["mu"]) / sch["sigma"]) ** 2)
        mat = gpr_entries(logits, kk, vv, pos, neg, unobs, ppos, pneg, q2=self.q2, q3=self.q3,
                          rho=self.rho, lam_1=self.lam_1, lam_2=self.lam_2, eps=self.eps)
        if self.epr == 0:
            return mat, None
        if self.k is None:
            raise ValueError("gpr needs k, the expected number of positives per example, for "
                             "its penalty: pass k=..., epr=0, or train through the engine")
        return mat, self.epr * expected_positive_penalty(torch.sigmoid(logits), float(self.k))


__all__ = ["EMPseudoLabelLoss", "GPRLoss", "OFFICIAL_TRAINING_EM_PL", "OFFICIAL_TRAINING_GPR",
           "SCORE_TYPES", "ScorerPseudoLabelLoss", "aevlp_pseudo_labels", "gpr_entries",
           "read_scores",
           "scores_as_probabilities", "simulated_scores", "vlpl_pseudo_labels"]
