"""The two regularisers of LAC (Xie, Xiao, Huang, "Label-Aware Global Consistency for
Multi-Label Learning with Single Positive Labels", NeurIPS 2022; docs/spec.md#lac).

These are not per-logit SPML losses (they need two views, label-wise embeddings and a memory
queue), so nothing here is in the ``LOSSES`` registry; the LAC trainer
(`spmlkit.methods.lac`) calls them. Total objective: ``AN(z_weak) + lambda_plc * PLC``
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

**LAC** (label-aware global consistency, paper eq. 5-7) as the authors' ``second_stage.train``
and ``lib/utils/lacloss.LACLoss`` compute it (xiemk/SPML-LAC, published as milkxie/SPML-LAC;
``tests/test_lac_official.py`` pins the values; `lac_term` does one step):

1. The batch's positive entries (observed or pseudo), in row-major order, each with its two
   projected views (weak, strong; unit norm) and its label, are ``n`` new items.
2. They are written into the memory queue (`LACQueue`, K items of **both** views)
   **before** the loss: with pointer ``p``, to slots ``[0, n)`` when ``p + n >= K`` (``p``
   becomes ``n``), else to ``[p, p + n)`` (``p`` becomes ``p + n``); the other slots keep
   their older items. Only the new items carry gradients.
3. Every valid queue item's two views are the anchors (``2V`` vectors): the supervised
   contrastive loss (Khosla et al., NeurIPS 2020, "L_out") of `lac_loss` over them, the
   contrast set all ``2V`` but the anchor itself, the positives the vectors of the same label
   (an item's other view always is one)::

    loss_i = - 1/|P(i)| sum_{p in P(i)} log( exp(a_i . a_p / t) / sum_{c != i} exp(a_i . a_c / t) )
    LAC = mean of loss_i over the 2V anchors

(The paper's eq. 7 writes the denominator over inter-class entries only; the code, followed
here, sums over every vector except the anchor itself.) Where this differs from the official
code, on inputs the official code cannot take:

- a batch with more than K positive entries (as on CUB) makes the official slice assignment
  raise; here the last K of them are kept (slots ``[0, K)``, pointer K);
- a batch with exactly one positive entry makes the official ``nonzero().squeeze()`` write that
  item twice; here it is written once;
- with no valid item at all (an empty queue and no positive) the official mean is NaN; here
  the loss is a zero on the graph. `lac_loss` also leaves out anchors without a positive
  partner (impossible in LAC, where each item has two views).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .inputs import check_observed
from .logspace import as_compute
__all__ = ["LACQueue", "lac_loss", "lac_entries", "lac_term", "plc_targets", "plc_loss"]


# ---- memory queue --------------------------------------------------------------------------
class LACQueue(nn.Module):
    """LAC's memory queue, as the authors' ``second_stage.train`` keeps it: ``K`` items, each
    the two projected views (weak, strong) of one positive (image, label) entry and its label.

    State lives in buffers, so ``state_dict()`` checkpoints it: ``feats`` (K x 2 x D: view 0
    weak, view 1 strong), ``labels`` (K, long, -1 = empty slot) and ``ptr`` (long scalar, the
    end of the last write).

    `write` puts a batch's ``n`` items into slots ``[0, n)`` when ``ptr + n >= K``, else
    into ``[ptr, ptr + n)``, and sets ``ptr`` to the end of what it wrote; every other slot keeps
    its item. So the filled slots are always a prefix ``[0, V)`` (``V = len(self)``), and the
    last slots may stay empty for good (a write that would end exactly at K starts over at 0,
    as the official ``>=`` does). When ``n > K`` (where the official assignment raises) the
    last ``K`` items are kept, in slots ``[0, K)``, and ``ptr`` becomes K.

    Args:
        size: ``K`` (>= 1; LAC's default 512).
        dim: ``D``, the projection size (LAC: 128).

    Raises:
        ValueError: ``size`` or ``dim`` < 1; at `write`, shapes that do not match or
            negative labels.

    >>> q = LACQueue(6, 1)
    >>> _ = q.write(torch.zeros(4, 1), torch.ones(4, 1), torch.tensor([0, 1, 2, 3]))
    >>> _ = q.write(torch.zeros(2, 1), torch.ones(2, 1), torch.tensor([4, 5]))  # 4 + 2 >= 6
    >>> q.labels.tolist(), int(q.ptr), len(q)
    ([4, 5, 2, 3, -1, -1], 2, 4)
    """

    def __init__(self, size: int, dim: int):
        super().__init__()
        for name, value in (("size", size), ("dim", dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"LACQueue: {name} must be an integer >= 1, got {value!r}")
        self.size, self.dim = size, dim
        self.register_buffer("feats", torch.zeros(size, 2, dim))
        self.register_buffer("labels", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    def __len__(self) -> int:
        return int((self.labels >= 0).sum())

    def write(self, weak: torch.Tensor, strong: torch.Tensor,
              labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write ``n`` new items, then return every valid item: the loss's anchors.

        Args:
            weak, strong: ``n x D`` projected views of the batch's positive entries (they may
                carry gradients; the queue stores detached copies).
            labels: ``n`` class ids >= 0.

        Returns:
            ``(weak V x D, strong V x D, labels V)`` of the slots ``[0, V)``, in slot order;
            the rows just written are ``weak`` / ``strong`` themselves (on the autograd graph),
            the older rows are detached.
        """
        if weak.ndim != 2 or weak.shape[1] != self.dim or strong.shape != weak.shape:
            raise ValueError(f"LACQueue.write: weak and strong must both be n x {self.dim}, "
                             f"got {tuple(weak.shape)} and {tuple(strong.shape)}")
        labels = torch.as_tensor(labels, device=self.labels.device)
        if labels.shape != (weak.shape[0],):
            raise ValueError(f"LACQueue.write: labels must be a vector of {weak.shape[0]} class "
                             f"ids (one per item), got shape {tuple(labels.shape)}")
        if labels.numel() and int(labels.min()) < 0:
            raise ValueError(f"LACQueue.write: labels must be class ids >= 0, got "
                             f"{int(labels.min())} (-1 marks empty slots)")
        n, k = weak.shape[0], self.size
        if n > k:  # the official code raises here; keep the last K
            weak, strong, labels, n = weak[n - k:], strong[n - k:], labels[n - k:], k
        start = 0 if int(self.ptr) + n >= k else int(self.ptr)
        end = start + n
        with torch.no_grad():
            self.feats[start:end, 0] = weak.detach().to(self.feats)
            self.feats[start:end, 1] = strong.detach().to(self.feats)
            self.labels[start:end] = labels.to(torch.long)
            self.ptr.fill_(end)
        valid = len(self)
        old = self.feats.detach().to(weak.dtype)

        def view(v, new):  # (with n = 0, start = end: the valid slots, on new's graph)
            return torch.cat([old[:start, v], new, old[end:valid, v]])
        return view(0, weak), view(1, strong), self.labels[:valid].clone()

    def reset(self) -> None:
        """Empty the queue."""
        self.feats.zero_()
        self.labels.fill_(-1)
        self.ptr.zero_()

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
    """Supervised contrastive loss over label-wise projected embeddings (see the module
    docstring for the formula). LAC calls it with every valid queue item's two views as
    ``anchors`` and no ``queue_*`` (`lac_term`).

    Args:
        anchors: ``N x D`` unit-norm projected embeddings (LAC: the weak views of the V valid
            queue items, then their strong views).
        anchor_labels: ``N`` class ids.
        queue_feats, queue_labels: optional ``M x D`` / ``M`` extra contrast entries (a memory
            of past entries in the MoCo style; LAC does not use them): they join the contrast
            set (not the anchors) and get no gradient.
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


def lac_term(proj_weak: torch.Tensor, proj_strong: torch.Tensor, positive_mask: torch.Tensor,
             queue: LACQueue | None, temperature: float = 0.5) -> torch.Tensor:
    """One step of LAC as the authors' code takes it (module docstring, steps 1-3): the
    batch's positive entries are written into ``queue``, then `lac_loss` over both views
    of every valid queue item.

    Args:
        proj_weak, proj_strong: ``B x L x D`` projected (unit-norm) label-wise embeddings of the
            weak and the strong view.
        positive_mask: ``B x L`` bool, the positive entries (observed or pseudo).
        queue: the `LACQueue` (its state advances), or None for no memory (the paper's
            "w/o queue" row: the anchors are this batch's items only).
        temperature: ``t`` > 0 (LAC: 0.5).

    Returns:
        the scalar loss (zero on the graph when there is no item at all).

    >>> q = LACQueue(8, 2)
    >>> w = torch.nn.functional.normalize(torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]), dim=-1)
    >>> first = lac_term(w, w, torch.tensor([[True, True]]), q)   # 2 items, 4 anchors
    >>> second = lac_term(w, w, torch.tensor([[True, False]]), q)  # 3 items, 6 anchors
    >>> len(q), q.labels.tolist()[:3]
    (3, [0, 1, 0])
    """
    anchors, labels = lac_entries(proj_weak, proj_strong, positive_mask)
    n = labels.shape[0] // 2
    weak, strong, labels = anchors[:n], anchors[n:], labels[:n]
    if queue is not None:
        weak, strong, labels = queue.write(weak, strong, labels)
    return lac_loss(torch.cat([weak, strong]), labels.repeat(2), temperature=temperature)


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
    """PLC: binary cross-entropy of the strong view's logits against `plc_targets` of the
    weak view, averaged over the selected entries.

    Args:
        strong_logits: ``B x L`` logits of the strong view (the gradient flows here).
        weak_logits: ``B x L`` logits of the weak view (detached; only picks the targets).
        observed: ``B x L`` observed labels in {1, 0, -1}.
        delta: the threshold (see `plc_targets`).

    Returns:
        a scalar; a zero on the autograd graph when no entry is selected.

    Raises:
        ValueError: as `plc_targets`, or ``strong_logits`` of another shape.

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
