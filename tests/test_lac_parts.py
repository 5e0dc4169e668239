"""LAC building blocks: label-wise embedding head/model, EMA, LAC and PLC losses (the memory
queue and the official step: tests/test_lac_official.py)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from spmlkit.losses.lac import lac_entries, lac_loss, plc_loss, plc_targets
from spmlkit.models import (LabelEmbeddingHead, LabelEmbeddingModel, ModelEMA,
                            create_backbone, sine_position_encoding)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---- positional encoding -------------------------------------------------------------------
def test_sine_position_encoding_hand_checked():
    pe = sine_position_encoding(2, 3, 8)          # n = 4 channels per axis, T^(2m/4)
    assert pe.shape == (8, 2, 3) and pe.dtype == torch.float32
    y = 1 / 2 * 2 * math.pi                       # row 0 of 2
    x = 2 / 3 * 2 * math.pi                       # column 1 of 3
    want = {0: math.sin(y), 1: math.cos(y), 2: math.sin(y / 100), 3: math.cos(y / 100),
            4: math.sin(x), 5: math.cos(x), 6: math.sin(x / 100), 7: math.cos(x / 100)}
    for c, v in want.items():
        assert pe[c, 0, 1].item() == pytest.approx(v, abs=1e-6), c
    # rows only vary along H, columns only along W
    assert torch.equal(pe[:4, :, 0], pe[:4, :, 2]) and torch.equal(pe[4:, 0], pe[4:, 1])
    with pytest.raises(ValueError, match="multiple of 4"):
        sine_position_encoding(2, 2, 6)


# ---- head ----------------------------------------------------------------------------------
@pytest.mark.parametrize("h,w,L,d,heads", [(1, 1, 1, 16, 2), (3, 4, 5, 32, 4), (5, 2, 3, 64, 4)])
def test_head_shapes(h, w, L, d, heads):
    head = LabelEmbeddingHead(6, L, dim=d, heads=heads, proj_dim=8).eval()
    fmap = _randn(2, 6, h, w)
    logits, emb = head.forward_all(fmap)
    assert logits.shape == (2, L) and emb.shape == (2, L, d)
    assert torch.allclose(head(fmap), logits) and torch.allclose(head.embed(fmap), emb)
    proj = head.project(emb)
    assert proj.shape == (2, L, 8)
    assert torch.allclose(proj.norm(dim=-1), torch.ones(2, L), atol=1e-5)
    maps = head.attention_maps(fmap)
    assert maps.shape == (2, L, h, w)
    assert torch.allclose(maps.sum(dim=(2, 3)), torch.ones(2, L), atol=1e-5)
    assert bool((maps >= 0).all())


def test_head_seeded_init_and_global_rng_untouched():
    state = torch.get_rng_state()
    a = LabelEmbeddingHead(8, 3, dim=16, heads=2, seed=3).state_dict()
    b = LabelEmbeddingHead(8, 3, dim=16, heads=2, seed=3).state_dict()
    c = LabelEmbeddingHead(8, 3, dim=16, heads=2, seed=4).state_dict()
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(a[k], b[k]) for k in a)
    differ = [k for k in a if not torch.equal(a[k], c[k])]
    assert "label_embed" in differ and "weight" in differ and "input_proj.weight" in differ


def test_attention_maps_exact_and_sdpa_matches_explicit():
    torch.manual_seed(0)
    head = LabelEmbeddingHead(5, 4, dim=16, heads=4, seed=1).eval()
    fmap = _randn(3, 5, 2, 3, seed=1)
    seen = {}

    def grab(module, args):
        seen["q"], seen["k"], seen["v"] = args[:3]
    handle = head.decoder[-1].attn.register_forward_pre_hook(grab)
    maps = head.attention_maps(fmap)
    handle.remove()
    attn = head.decoder[-1].attn
    q = attn.q_proj(seen["q"]).view(3, 4, 4, 4).transpose(1, 2)   # B x heads x L x dh
    k = attn.k_proj(seen["k"]).view(3, 6, 4, 4).transpose(1, 2)   # B x heads x HW x dh
    want = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1).mean(1).view(3, 4, 2, 3)
    assert torch.allclose(maps, want, atol=1e-6)
    out_sdpa, _ = attn(seen["q"], seen["k"], seen["v"], need_weights=False)
    out_explicit, w = attn(seen["q"], seen["k"], seen["v"], need_weights=True)
    assert w.shape == (3, 4, 4, 6)
    assert torch.allclose(out_sdpa, out_explicit, atol=1e-5)


def test_classifier_is_per_label_linear():
    head = LabelEmbeddingHead(4, 3, dim=8, heads=2)
    emb = _randn(5, 3, 8)
    want = torch.einsum("bld,ld->bl", emb, head.weight) + head.bias
    assert torch.allclose(head.classify(emb), want, atol=1e-6)
    with pytest.raises(ValueError, match="B x 3 x 8"):
        head.classify(_randn(5, 4, 8))


def test_head_rejects_bad_input():
    head = LabelEmbeddingHead(4, 3, dim=8, heads=2)
    with pytest.raises(ValueError, match="4 input channels"):
        head(_randn(1, 5, 2, 2))
    with pytest.raises(ValueError, match="divisible by heads"):
        LabelEmbeddingHead(4, 3, dim=12, heads=5)


# ---- model ---------------------------------------------------------------------------------
def test_frozen_backbone_gets_no_grad_and_stays_eval():
    bb = create_backbone("tiny_cnn", num_features=8, width=4, input_size=16)
    model = LabelEmbeddingModel(bb, 3, freeze_backbone=True, dim=16, heads=2)
    model.train()
    assert not model.backbone.training and model.head.training
    x = _randn(2, 3, 16, 16)
    logits, emb = model.forward_all(x)
    assert logits.shape == (2, 3) and emb.shape == (2, 3, 16)
    model(x).sum().backward()
    assert all(p.grad is None for p in model.backbone.parameters())
    assert all(p.grad is not None for p in model.head.parameters()
               if not any(p is q for q in model.head.projector.parameters()))
    # unfrozen: gradients reach the backbone, which follows train()
    free = LabelEmbeddingModel(create_backbone("tiny_cnn", num_features=8, width=4,
                                               input_size=16), 3, dim=16, heads=2).train()
    assert free.backbone.training
    free(x).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0
               for p in free.backbone.parameters())


class _ConvBN(nn.Module):
    num_features = 4

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward_features(self, x):
        return self.bn(self.conv(x))


def test_freeze_batchnorm_only():
    model = LabelEmbeddingModel(_ConvBN(), 2, freeze_batchnorm=True, dim=8, heads=2).train()
    assert model.backbone.training and not model.backbone.bn.training
    model(_randn(2, 3, 4, 4)).sum().backward()
    assert model.backbone.conv.weight.grad is not None and model.backbone.bn.weight.grad is None
    assert model.backbone.bn.running_mean.abs().sum() == 0     # eval mode: stats untouched


def test_model_without_backbone_takes_feature_maps():
    model = LabelEmbeddingModel(None, 4, in_channels=6, dim=16, heads=2, seed=2).eval()
    head = LabelEmbeddingHead(6, 4, dim=16, heads=2, seed=2).eval()
    fmap = _randn(3, 6, 2, 2)
    assert torch.equal(model.features(fmap), fmap)
    assert torch.allclose(model(fmap), head(fmap))
    with pytest.raises(ValueError, match="in_channels"):
        LabelEmbeddingModel(None, 4)
    bb = create_backbone("tiny_cnn", num_features=8)
    with pytest.raises(ValueError, match="contradicts"):
        LabelEmbeddingModel(bb, 4, in_channels=6)


# ---- EMA -----------------------------------------------------------------------------------
class _Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(1.0))
        self.b = nn.Parameter(torch.tensor(2.0))
        self.register_buffer("running", torch.tensor(0.0))
        self.register_buffer("steps", torch.tensor(0))


def test_ema_two_updates_by_hand_and_state_round_trip():
    model = _Two()
    ema = ModelEMA(model, decay=0.5)
    assert not ema.module.training and not ema.module.a.requires_grad
    with torch.no_grad():
        model.a.fill_(3.0), model.b.fill_(4.0), model.running.fill_(4.0), model.steps.fill_(7)
    ema.update(model)            # a: .5*1 + .5*3 = 2 ; b: .5*2 + .5*4 = 3 ; running 2
    with torch.no_grad():
        model.a.fill_(5.0), model.b.fill_(0.0), model.steps.fill_(9)
    ema.update(model)            # a: .5*2 + .5*5 = 3.5 ; b: 1.5 ; running 3
    m = ema.module
    assert (m.a.item(), m.b.item(), m.running.item(), m.steps.item()) == (3.5, 1.5, 3.0, 9)
    assert model.a.item() == 5.0 and ema.updates == 2
    other = ModelEMA(_Two(), decay=0.1)
    other.load_state_dict(ema.state_dict())
    assert other.decay == 0.5 and other.updates == 2 and other.module.a.item() == 3.5


def test_ema_warmup_decay():
    model = _Two()
    ema = ModelEMA(model, decay=0.9, warmup=True)
    with torch.no_grad():
        model.a.fill_(11.0)
    ema.update(model)            # n = 0: d = min(.9, 1/10) = .1 -> .1*1 + .9*11 = 10
    assert ema.module.a.item() == pytest.approx(10.0)
    assert ema.current_decay() == pytest.approx(2 / 11)


# ---- LAC loss ------------------------------------------------------------------------------
def _unit(angle):
    return [math.cos(angle), math.sin(angle)]


def _supcon_by_hand(anchors, labels, contrast, contrast_labels, t):
    """Plain python SupCon: anchors are the first len(anchors) contrast entries."""
    losses = []
    for i, (a, la) in enumerate(zip(anchors, labels)):
        others = [j for j in range(len(contrast)) if j != i]
        pos = [j for j in others if contrast_labels[j] == la]
        if not pos:
            continue
        dots = {j: (a[0] * contrast[j][0] + a[1] * contrast[j][1]) / t for j in others}
        log_den = math.log(sum(math.exp(dots[j]) for j in others))
        losses.append(-sum(dots[j] - log_den for j in pos) / len(pos))
    return sum(losses) / len(losses)


def test_lac_loss_hand_computed_four_entries():
    raw = [_unit(0.0), _unit(0.3), _unit(2.0), _unit(2.5)]
    labels = [0, 0, 1, 1]
    t = 0.5
    # by hand for anchor 0: positives {1}, denominator over {1, 2, 3}
    d = [math.cos(0.3) / t, math.cos(2.0) / t, math.cos(2.5) / t]
    l0 = -(d[0] - math.log(sum(math.exp(v) for v in d)))
    want = _supcon_by_hand(raw, labels, raw, labels, t)
    a = torch.tensor(raw, dtype=torch.float64)
    got = lac_loss(a, torch.tensor(labels), temperature=t)
    assert got.item() == pytest.approx(want, rel=1e-12)
    d1 = [math.cos(0.3) / t, math.cos(1.7) / t, math.cos(2.2) / t]
    d2 = [math.cos(2.0) / t, math.cos(1.7) / t, math.cos(0.5) / t]
    d3 = [math.cos(2.5) / t, math.cos(2.2) / t, math.cos(0.5) / t]
    l1 = -(d1[0] - math.log(sum(math.exp(v) for v in d1)))
    l2 = -(d2[2] - math.log(sum(math.exp(v) for v in d2)))
    l3 = -(d3[2] - math.log(sum(math.exp(v) for v in d3)))
    assert got.item() == pytest.approx((l0 + l1 + l2 + l3) / 4, rel=1e-12)


def test_lac_loss_with_queue_matches_reference():
    raw = [_unit(v) for v in (0.1, 1.0, 2.0, 3.0, -1.0)]
    labels = [0, 1, 0, 2, 1]
    queue = [_unit(v) for v in (0.5, -2.0, 2.8)]
    qlab = [2, 1, 0]
    want = _supcon_by_hand(raw, labels, raw + queue, labels + qlab, 0.7)
    got = lac_loss(torch.tensor(raw, dtype=torch.float64), torch.tensor(labels),
                   torch.tensor(queue, dtype=torch.float64), torch.tensor(qlab),
                   temperature=0.7)
    assert got.item() == pytest.approx(want, rel=1e-12)


def test_lac_loss_excludes_anchors_without_partner():
    raw = [_unit(0.0), _unit(0.4), _unit(1.5)]
    t = 0.5
    d0 = [math.cos(0.4) / t, math.cos(1.5) / t]          # anchor 2 is still in denominators
    d1 = [math.cos(0.4) / t, math.cos(1.1) / t]
    want = (-(d0[0] - math.log(sum(map(math.exp, d0))))
            - (d1[0] - math.log(sum(map(math.exp, d1))))) / 2
    got = lac_loss(torch.tensor(raw, dtype=torch.float64), torch.tensor([0, 0, 5]),
                   temperature=t)
    assert got.item() == pytest.approx(want, rel=1e-12)


def test_lac_loss_no_partner_is_zero_on_graph():
    a = torch.tensor([_unit(0.0), _unit(1.0), _unit(2.0)], requires_grad=True)
    out = lac_loss(a, torch.tensor([0, 1, 2]))
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert torch.isfinite(a.grad).all() and a.grad.abs().sum() == 0
    empty = torch.zeros(0, 4, requires_grad=True)
    out = lac_loss(empty, torch.zeros(0, dtype=torch.long),
                   torch.zeros(3, 4), torch.tensor([0, 1, 2]))
    out.backward()
    assert out.item() == 0.0 and empty.grad.shape == (0, 4)


def test_lac_loss_queue_only_partners_finite():
    a = torch.tensor([_unit(0.0), _unit(2.0)], requires_grad=True)   # labels differ
    queue = torch.tensor([_unit(0.2), _unit(2.1), _unit(-1.0)])
    out = lac_loss(a, torch.tensor([0, 1]), queue, torch.tensor([0, 1, 3]), temperature=0.1)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(a.grad).all() and a.grad.abs().sum() > 0
    want = _supcon_by_hand([_unit(0.0), _unit(2.0)], [0, 1],
                           [_unit(0.0), _unit(2.0), _unit(0.2), _unit(2.1), _unit(-1.0)],
                           [0, 1, 0, 1, 3], 0.1)
    assert out.item() == pytest.approx(want, abs=1e-6)   # float32: ~1e-7 absolute
    # extreme temperature: still finite (logsumexp)
    far = lac_loss(a.detach(), torch.tensor([0, 1]), queue, torch.tensor([0, 1, 3]),
                   temperature=1e-4)
    assert torch.isfinite(far)


def test_lac_entries_order_and_labels():
    w = _randn(2, 3, 4)
    s = _randn(2, 3, 4, seed=1)
    mask = torch.tensor([[False, True, True], [True, False, False]])
    anchors, labels = lac_entries(w, s, mask)
    assert labels.tolist() == [1, 2, 0, 1, 2, 0]
    assert torch.equal(anchors, torch.stack([w[0, 1], w[0, 2], w[1, 0],
                                             s[0, 1], s[0, 2], s[1, 0]]))
    # each entry's two views are partners of each other
    loss = lac_loss(torch.nn.functional.normalize(anchors, dim=1), labels)
    assert torch.isfinite(loss) and loss.item() > 0


# ---- PLC -----------------------------------------------------------------------------------
P = [[0.95, 0.7, 0.3], [0.05, 0.5, 0.85]]
OBS = torch.tensor([[1, 0, 0], [0, 0, 1]])


def _logit(p):
    return math.log(p / (1 - p))


WEAK = torch.tensor([[_logit(p) for p in row] for row in P], dtype=torch.float64)


def test_plc_targets_by_hand():
    # u = [[1.95, .7, .3], [.05, .5, 1.85]]
    t, m = plc_targets(WEAK, OBS, 0.6)
    assert m.tolist() == [[True, True, True], [True, False, True]]
    assert t.tolist() == [[1, 1, 0], [0, 0, 1]]
    t, m = plc_targets(WEAK, OBS, 0.9)
    assert m.tolist() == [[True, False, False], [True, False, True]]
    assert t.tolist() == [[1, 0, 0], [0, 0, 1]]
    # an observed negative is always a pseudo-negative, however confident the model
    t, m = plc_targets(WEAK, torch.tensor([[-1, 0, 0], [0, 0, 1]]), 0.9)
    assert m[0, 0] and t[0, 0] == 0
    with pytest.raises(ValueError, match="found \\[2\\]"):
        plc_targets(WEAK, torch.tensor([[2, 0, 0], [0, 0, 1]]), 0.6)


def test_plc_loss_equals_manual_bce():
    strong = torch.tensor([[0.3, -1.2, 2.0], [0.5, 4.0, -0.7]], dtype=torch.float64,
                          requires_grad=True)
    weak = WEAK.clone().requires_grad_()
    out = plc_loss(strong, weak, OBS, 0.6)
    sel = [((0, 0), 1), ((0, 1), 1), ((0, 2), 0), ((1, 0), 0), ((1, 2), 1)]
    terms = []
    for (i, j), y in sel:
        p = 1 / (1 + math.exp(-strong[i, j].item()))
        terms.append(-(y * math.log(p) + (1 - y) * math.log(1 - p)))
    assert out.item() == pytest.approx(sum(terms) / len(terms), rel=1e-12)
    out.backward()
    assert weak.grad is None and strong.grad[1, 1] == 0 and strong.grad[0, 0] != 0


def test_plc_loss_nothing_selected_is_zero_on_graph():
    strong = torch.zeros(2, 3, requires_grad=True)
    out = plc_loss(strong, torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), 1.0)
    out.backward()                       # u = 0.5 everywhere: neither >= 1 nor < 0
    assert out.item() == 0.0 and torch.equal(strong.grad, torch.zeros(2, 3))
