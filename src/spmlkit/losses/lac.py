"""The two regularisers of LAC (Xie, Xiao, Huang, "Label-Aware Global Consistency for
Multi-Label Learning with Single Positive Labels", NeurIPS 2022; docs/spec.md#lac).

These are not per-logit SPML losses (they need two views, label-wise embeddings and a memory
queue), so nothing here is in the ``LOSSES`` registry; the LAC trainer
(:mod:`spmlkit.methods.lac`) calls them. Total objective: ``AN(z_weak) + lambda_plc * PLC``
(stage 1) ``+ lambda_lac * LAC`` (stage 2).

**PLC** (pseudo-labelling consistency, paper eq. 4, the authors' code): with ``z_obs`` the
observed label (1 on an observed positive, 0 unobserved; -1 on an observed negative, in regimes
that have them)::

    u = sigmoid(z_weak).detach() + z_obs
    target = 1 where u >= delta,  0 where u < 1 - delta,  entry ignored otherwise
    PLC = mean over the selected entries of BCE(z_strong, target)

So an observed positive is always a pseudo-positive (u >= 1 >= delta), an observed negative
always a pseudo-negative (u < 0), and an unobserved entry is pseudo-labelled by its weak-view
probability when it is confident enough. In the single-positive regime (z_obs in {0, 1}) this is
exactly the formula of docs/spec.md#lac.

**LAC** (label-aware global consistency, paper eq. 5-7): every positive (image, label) entry
(observed or pseudo) contributes its two projected views (weak and strong, unit norm) as
anchors; the contrast set is the other anchors plus a memory queue of past entries; the
positives of an anchor are the contrast entries of the same label (its own other view
included). It is the supervised contrastive loss (Khosla et al., NeurIPS 2020, "L_out") as in
the authors' code::

    loss_i = - 1/|P(i)| sum_{p in P(i)} log( exp(a_i . c_p / t) / sum_{c != i} exp(a_i . c / t) )
    LAC = mean of loss_i over the anchors with |P(i)| >= 1

(The paper's eq. 7 writes the denominator over inter-class entries only; the code, followed
here, sums over every contrast entry except the anchor itself.) Two guards the official code
lacks: the queue is a true ring buffer (:class:`RingQueue`, a batch with more than K positive
entries keeps its last K), and anchors without a positive partner are left out, so the loss is
never NaN.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .base import as_compute, check_observed

__all__ = ["RingQueue", "lac_loss", "lac_entries", "plc_targets", "plc_loss"]


# ---- memory queue --------------------------------------------------------------------------
class RingQueue(nn.Module):
    """A ring buffer of the last ``size`` (feature vector, label id) pairs.

    State lives in buffers, so ``state_dict()`` checkpoints it: ``feats`` (K x D),
    ``labels`` (K, long, -1 = empty slot), ``ptr`` (the next slot to write, long scalar) and
    ``count`` (filled slots, <= K, long scalar).

    Pushing ``N`` entries is the same as pushing them one by one: entry ``n`` goes to slot
    ``(ptr + n) % K``; when ``N > K`` only the last ``K`` survive.

    Args:
        size: ``K`` (>= 1; LAC's default 512).
        dim: ``D``, the feature size (LAC: the projection size, 128).

    Raises:
        ValueError: ``size`` or ``dim`` < 1; at ``push``, shapes that do not match or negative
            labels.

    >>> q = RingQueue(3, 2)
    >>> q.push(torch.arange(8.0).view(4, 2), torch.tensor([0, 1, 2, 3]))
    >>> len(q), q.labels.tolist(), int(q.ptr)   # 4 entries into 3 slots: the last 3 kept
    (3, [3, 1, 2], 1)
    """

    def __init__(self, size: int, dim: int):
        super().__init__()
        for name, value in (("size", size), ("dim", dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"RingQueue: {name} must be an integer >= 1, got {value!r}")
        self.size, self.dim = size, dim
        self.register_buffer("feats", torch.zeros(size, dim))
        self.register_buffer("labels", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def __len__(self) -> int:
        return int(self.count)

    @torch.no_grad()
    def push(self, feats: torch.Tensor, labels: torch.Tensor) -> None:
        """Store ``feats`` (N x D, detached) with their ``labels`` (N class ids >= 0)."""
        if feats.ndim != 2 or feats.shape[1] != self.dim:
            raise ValueError(f"RingQueue.push: feats must be N x {self.dim}, got "
                             f"{tuple(feats.shape)}")
        labels = torch.as_tensor(labels)
        if labels.shape != (feats.shape[0],):
            raise ValueError(f"RingQueue.push: labels must be a vector of {feats.shape[0]} "
                             f"class ids (one per row of feats), got shape "
                             f"{tuple(labels.shape)}")
        if labels.numel() and int(labels.min()) < 0:
            raise ValueError(f"RingQueue.push: labels must be class ids >= 0, got "
                             f"{int(labels.min())} (-1 marks empty slots)")
        n, k = feats.shape[0], self.size
        if n == 0:
            return
        start = int(self.ptr)
        if n > k:  # the first n - k would be overwritten within this push anyway
            start = (start + n - k) % k
            feats, labels = feats[n - k:], labels[n - k:]
        slots = (start + torch.arange(feats.shape[0], device=self.feats.device)) % k
        self.feats[slots] = feats.detach().to(self.feats)
        self.labels[slots] = labels.to(device=self.labels.device, dtype=torch.long)
        self.ptr.fill_((start + feats.shape[0]) % k)
        self.count.fill_(min(int(self.count) + n, k))

    def contents(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(feats M x D, labels M)`` of the filled slots (M = ``len(self)``), in slot order.
        """
        filled = self.labels >= 0
        return self.feats[filled], self.labels[filled]

    def reset(self) -> None:
        """Empty the queue."""
        self.feats.zero_()
        self.labels.fill_(-1)
        self.ptr.zero_()
        self.count.zero_()

    def extra_repr(self) -> str:
        return f"size={self.size}, dim={self.dim}"


# ---- LAC ------------------------------------------------------------------------------------
def lac_entries(proj_weak: torch.Tensor, proj_strong: torch.Tensor,
                positive_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather the two projected views of every positive (image, label) entry.

    Args:
        proj_weak, proj_strong: projected label-wise embeddings ``B x L x D`` of the weak and the
            strong view.
        positive_mask: ``B x L`` bool, the entries that are positive (observed or pseudo).

    Returns:
        ``(anchors 2N x D, labels 2N)``: the N weak views (row-major order of the mask), then
        the N strong views in the same order; ``labels`` are the class ids (column index).

    Raises:
        ValueError: shapes that do not match.

    >>> w, s = torch.zeros(2, 3, 4), torch.ones(2, 3, 4)
    >>> a, lab = lac_entries(w, s, torch.tensor([[True, False, True], [False, True, False]]))
    >>> tuple(a.shape), lab.tolist(), a[:, 0].tolist()
    ((6, 4), [0, 2, 1, 0, 2, 1], [0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    """
    if proj_weak.ndim != 3 or proj_weak.shape != proj_strong.shape:
        raise ValueError(f"lac_entries: proj_weak and proj_strong must both be B x L x D, got "
                         f"{tuple(proj_weak.shape)} and {tuple(proj_strong.shape)}")
    mask = torch.as_tensor(positive_mask, device=proj_weak.device)
    if tuple(mask.shape) != tuple(proj_weak.shape[:2]):
        raise ValueError(f"lac_entries: positive_mask must be B x L = "
                         f"{tuple(proj_weak.shape[:2])}, got {tuple(mask.shape)}")
    mask = mask.bool()
    labels = mask.nonzero()[:, 1]
    return torch.cat([proj_weak[mask], proj_strong[mask]]), labels.repeat(2)


def lac_loss(anchors: torch.Tensor, anchor_labels: torch.Tensor,
             queue_feats: torch.Tensor | None = None, queue_labels: torch.Tensor | None = None,
             temperature: float = 0.5) -> torch.Tensor:
    """Supervised contrastive loss over label-wise projected embeddings (LAC, see the module
    docstring for the formula).

    Args:
        anchors: ``N x D`` unit-norm projected embeddings (both views of each positive entry,
            e.g. from :func:`lac_entries`).
        anchor_labels: ``N`` class ids.
        queue_feats, queue_labels: ``M x D`` / ``M`` past entries (:meth:`RingQueue.contents`);
            they join the contrast set (not the anchors) and get no gradient.
        temperature: ``t`` > 0 (LAC: 0.5).

    Returns:
        a scalar: the mean over anchors with at least one positive partner; a zero on the
        autograd graph when there is none (or ``N == 0``), never NaN. Computed with logsumexp.

    Raises:
        ValueError: shapes that do not match, ``temperature <= 0``, only one of the two queue
            arguments.

    >>> a = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> round(lac_loss(a, torch.tensor([0, 0, 1]), temperature=1.0).item(), 4)  # log(e + 1) - 1
    0.3133
    """
    if not temperature > 0:
        raise ValueError(f"lac_loss: temperature must be > 0, got {temperature}")
    if anchors.ndim != 2:
        raise ValueError(f"lac_loss: anchors must be N x D, got {tuple(anchors.shape)}")
    anchor_labels = torch.as_tensor(anchor_labels, device=anchors.device)
    if anchor_labels.shape != (anchors.shape[0],):
        raise ValueError(f"lac_loss: anchor_labels must hold one class id per anchor "
                         f"({anchors.shape[0]}), got shape {tuple(anchor_labels.shape)}")
    x = as_compute(anchors)
    contrast, contrast_labels = x, anchor_labels
    if (queue_feats is None) != (queue_labels is None):
        raise ValueError("lac_loss: pass both queue_feats and queue_labels, or neither")
    if queue_feats is not None:
        queue_labels = torch.as_tensor(queue_labels, device=anchors.device)
        if queue_feats.ndim != 2 or queue_feats.shape[1] != anchors.shape[1] \
                or queue_labels.shape != (queue_feats.shape[0],):
            raise ValueError(f"lac_loss: the queue must be M x {anchors.shape[1]} features with "
                             f"M labels, got {tuple(queue_feats.shape)} and "
                             f"{tuple(queue_labels.shape)}")
        contrast = torch.cat([x, queue_feats.detach().to(x)])
        contrast_labels = torch.cat([anchor_labels, queue_labels.to(anchor_labels.dtype)])
    n = x.shape[0]
    zero = x.sum() * 0.0  # on the graph, never NaN
    if n == 0:
        return zero
    not_self = torch.ones(n, contrast.shape[0], dtype=torch.bool, device=x.device)
    not_self[:, :n].fill_diagonal_(False)
    positive = (anchor_labels[:, None] == contrast_labels[None, :]) & not_self
    has_partner = positive.any(dim=1)
    if not bool(has_partner.any()):
        return zero
    # only anchors with a partner: each row then has at least one finite logit
    x, positive, not_self = x[has_partner], positive[has_partner], not_self[has_partner]
    logits = (x @ contrast.t()) / temperature
    logits = logits.masked_fill(~not_self, float("-inf"))
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    per_anchor = -torch.where(positive, log_prob, 0.0).sum(dim=1) / positive.sum(dim=1)
    return per_anchor.mean()


# ---- PLC ------------------------------------------------------------------------------------
def _check_pair(logits: torch.Tensor, observed: torch.Tensor, fn: str) -> torch.Tensor:
    observed = torch.as_tensor(observed, device=logits.device)
    if logits.ndim != 2 or observed.shape != logits.shape:
        raise ValueError(f"{fn}: logits and observed must both be B x L, got "
                         f"{tuple(logits.shape)} and {tuple(observed.shape)}")
    check_observed(observed, fn)
    return observed


def plc_targets(weak_logits: torch.Tensor, observed: torch.Tensor,
                delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Pseudo-labels of PLC from the weak view.

    ``u = sigmoid(weak_logits).detach() + z_obs`` (z_obs = the observed label: 1, 0 or -1);
    target 1 where ``u >= delta``, 0 where ``u < 1 - delta``; the selected entries are the
    mask. (For ``delta < 0.5`` the two rules overlap; positives win.)

    Args:
        weak_logits: ``B x L`` logits of the weak view.
        observed: ``B x L`` observed labels in {1, 0, -1}.
        delta: the threshold in [0, 1] (LAC: 0.6 in stage 1, 0.9 in stage 2).

    Returns:
        ``(targets B x L float, mask B x L bool)``; ``targets`` is 0 outside the mask.

    Raises:
        ValueError: shapes that differ, observed values outside {1, 0, -1}, ``delta`` outside
            [0, 1].

    >>> t, m = plc_targets(torch.tensor([[2.0, 0.0, -2.0]]), torch.tensor([[0, 1, 0]]), 0.8)
    >>> t.tolist(), m.tolist()   # sigmoid: 0.88 (>= 0.8), 0.5 + 1, 0.12 (< 0.2)
    ([[1.0, 1.0, 0.0]], [[True, True, True]])
    """
    if not 0.0 <= float(delta) <= 1.0:
        raise ValueError(f"plc_targets: delta must be in [0, 1], got {delta}")
    observed = _check_pair(weak_logits, observed, "plc_targets")
    u = torch.sigmoid(as_compute(weak_logits.detach())) + observed.to(
        as_compute(weak_logits).dtype)
    pos = u >= delta
    neg = (u < 1.0 - delta) & ~pos
    return pos.to(u.dtype), pos | neg


def plc_loss(strong_logits: torch.Tensor, weak_logits: torch.Tensor, observed: torch.Tensor,
             delta: float) -> torch.Tensor:
    """PLC: binary cross-entropy of the strong view's logits against :func:`plc_targets` of the
    weak view, averaged over the selected entries.

    Args:
        strong_logits: ``B x L`` logits of the strong view (the gradient flows here).
        weak_logits: ``B x L`` logits of the weak view (detached; only picks the targets).
        observed: ``B x L`` observed labels in {1, 0, -1}.
        delta: the threshold (see :func:`plc_targets`).

    Returns:
        a scalar; a zero on the autograd graph when no entry is selected.

    Raises:
        ValueError: as :func:`plc_targets`, or ``strong_logits`` of another shape.

    >>> z = torch.zeros(1, 2)
    >>> round(plc_loss(z, z, torch.tensor([[1, 0]]), 0.6).item(), 4)   # only O+: log 2
    0.6931
    """
    if strong_logits.shape != weak_logits.shape:
        raise ValueError(f"plc_loss: strong_logits {tuple(strong_logits.shape)} and "
                         f"weak_logits {tuple(weak_logits.shape)} must have the same shape")
    targets, mask = plc_targets(weak_logits, observed, delta)
    s = as_compute(strong_logits)
    bce = F.binary_cross_entropy_with_logits(s, targets.to(s.dtype), reduction="none")
    return torch.where(mask, bce, 0.0).sum() / mask.sum().clamp(min=1)
