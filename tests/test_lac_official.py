"""LAC's stage-2 step against the authors' own code, step by step.

The fixture ``tests/fixtures/lac_official_steps.npz`` was made by running the authors' code
unchanged: ``LACLoss`` of ``lib/utils/lacloss.py`` (lines 5-56) and the loss and queue lines of
``second_stage.train`` (``second_stage.py`` lines 381-414: AN, PLC, the positive entries, the
queue write, ``criterion(queue_feats, queue_labels)``, the total), with the queue initialised as
in ``main_worker`` (lines 235-238), from the repository xiemk/SPML-LAC at commit b4af68e (the
copy the search index holds; the project's notes cite the same code as milkxie/SPML-LAC at
a630052). The only change to run it on a CPU: ``torch.Tensor.cuda`` was made the identity. The
script that made it lived in /tmp (it is not part of this repository); its settings:

- B = 4 rows, L = 5 labels, projection size D = 6, queue size K = 16, threshold 0.9
  (stage 2's delta), temperature 0.5, lambda_plc = lambda_lac = 1, float32;
- 8 consecutive steps whose positive entries (one observed positive a row plus pseudo-positives
  with sigmoid >= 0.9) number 5, 7, 4, 9, 6, 8, 5, 10: the pointer restarts at slot 0 at steps
  3, 5 and 7 (1-based) while older items stay in the slots behind the write;
- per step: the inputs (``logits_w``, ``logits_s`` B x L, ``feats_w``, ``feats_s`` B x L x D unit
  vectors, ``targets``), the losses (``L_an``, ``L_plc``, ``L_lac``, ``loss``), the gradients of
  the total with respect to the four inputs, and the queue's pointer and labels after the step.

Here the same inputs go through spmlkit's own pieces, in the order ``_LACStep.terms`` uses them
(the registered ``an`` loss, `plc_targets` / `plc_loss`, `lac_term` with one
`LACQueue` carried across the steps), and every loss and gradient must agree to 1e-5.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from spmlkit.losses import create_loss
from spmlkit.losses.lac import LACQueue, lac_loss, lac_term, plc_loss, plc_targets

FIXTURE = Path(__file__).parent / "fixtures" / "lac_official_steps.npz"
TOL = 1e-5


def _fixture():
    return dict(np.load(FIXTURE))


def test_lac_step_by_step_equals_the_authors_code():
    f = _fixture()
    steps, k, d = int(f["steps"]), int(f["K"]), int(f["D"])
    delta, t = float(f["threshold"]), float(f["temperature"])
    assert steps >= 6
    queue = LACQueue(k, d)
    an = create_loss("an")
    wrapped = 0
    prev_ptr = 0
    for s in range(steps):
        p = f"s{s}_"
        leaves = {name: torch.tensor(f[p + name]).requires_grad_()
                  for name in ("logits_w", "logits_s", "feats_w", "feats_s")}
        obs = torch.tensor(f[p + "targets"]).long()
        lw, ls = leaves["logits_w"], leaves["logits_s"]
        l_an = an(lw, obs)
        l_plc = plc_loss(ls, lw, obs, delta)
        positive = plc_targets(lw, obs, delta)[0].bool()
        l_lac = lac_term(leaves["feats_w"], leaves["feats_s"], positive, queue, t)
        total = l_an + float(f["lambda_plc"]) * l_plc + float(f["lambda_lac"]) * l_lac
        total.backward()
        for name, ours in (("L_an", l_an), ("L_plc", l_plc), ("L_lac", l_lac),
                           ("loss", total)):
            assert ours.item() == pytest.approx(float(f[p + name]), abs=TOL), (s, name)
        for name, leaf in leaves.items():
            want = torch.tensor(f[p + "grad_" + name])
            assert torch.allclose(leaf.grad, want, rtol=0, atol=TOL), \
                (s, name, (leaf.grad - want).abs().max().item())
        # the queue: the official labels are 1..L with 0 = empty; ours 0..L-1 with -1 = empty
        assert int(queue.ptr) == int(f[p + "queue_ptr"]), s
        assert (queue.labels + 1).tolist() == f[p + "queue_labels"].tolist(), s
        n = int(positive.sum())
        wrapped += int(queue.ptr) == n and prev_ptr > 0
        prev_ptr = int(queue.ptr)
    assert wrapped >= 1  # the fixture restarts the pointer at least once


def test_the_earlier_reading_does_not_match_the_fixture():
    """The reading this replaced (the batch's entries as anchors, the queue as extra contrast
    entries of one view each, written after the loss) gives other values from the second step
    on: the fixture tells the two apart."""
    f = _fixture()
    s = 1
    p = f"s{s}_"
    delta, t = float(f["threshold"]), float(f["temperature"])
    # the earlier reading at step 2: step 1's entries (both views) as contrast entries
    mask0 = plc_targets(torch.tensor(f["s0_logits_w"]), torch.tensor(f["s0_targets"]).long(),
                        delta)[0].bool()
    mask1 = plc_targets(torch.tensor(f[p + "logits_w"]), torch.tensor(f[p + "targets"]).long(),
                        delta)[0].bool()
    fw0, fs0 = torch.tensor(f["s0_feats_w"]), torch.tensor(f["s0_feats_s"])
    fw1, fs1 = torch.tensor(f[p + "feats_w"]), torch.tensor(f[p + "feats_s"])
    lab0, lab1 = mask0.nonzero()[:, 1], mask1.nonzero()[:, 1]
    earlier = lac_loss(torch.cat([fw1[mask1], fs1[mask1]]), lab1.repeat(2),
                       torch.cat([fw0[mask0], fs0[mask0]]), lab0.repeat(2), t)
    assert abs(earlier.item() - float(f[p + "L_lac"])) > 1e-3


def test_queue_overflow_keeps_the_last_k_where_the_official_code_raises():
    q = LACQueue(4, 2)
    q.write(torch.ones(3, 2), torch.ones(3, 2), torch.tensor([7, 7, 7]))     # ptr 3
    w = torch.arange(12.0).view(6, 2).requires_grad_()
    weak, strong, labels = q.write(w, -w, torch.arange(6))
    assert labels.tolist() == [2, 3, 4, 5] and int(q.ptr) == 4 and len(q) == 4
    assert torch.equal(weak, w[2:]) and weak.requires_grad
    assert torch.equal(q.feats[:, 1], -w[2:].detach())
    # the next write starts over at slot 0 (ptr + n >= K), the other slots stay
    _, _, labels = q.write(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([9]))
    assert labels.tolist() == [9, 3, 4, 5] and int(q.ptr) == 1


def test_queue_write_gradients_flow_only_into_the_new_items():
    q = LACQueue(8, 2)
    a = torch.nn.functional.normalize(torch.randn(3, 2, generator=torch.Generator()
                                                  .manual_seed(0)), dim=1).requires_grad_()
    q.write(a, a, torch.tensor([0, 1, 0]))
    b = torch.nn.functional.normalize(torch.randn(2, 2, generator=torch.Generator()
                                                  .manual_seed(1)), dim=1).requires_grad_()
    weak, strong, labels = q.write(b, b * 1.0, torch.tensor([1, 0]))
    assert weak.shape == (5, 2) and labels.tolist() == [0, 1, 0, 1, 0]
    lac_loss(torch.cat([weak, strong]), labels.repeat(2)).backward()
    assert a.grad is None and b.grad is not None and b.grad.abs().sum() > 0
    assert not q.feats.requires_grad


def test_queue_state_round_trip_and_errors():
    q = LACQueue(5, 3)
    q.write(torch.ones(2, 3), torch.zeros(2, 3), torch.tensor([1, 2]))
    r = LACQueue(5, 3)
    r.load_state_dict(q.state_dict())
    assert len(r) == 2 and int(r.ptr) == 2 and torch.equal(r.feats, q.feats)
    assert r.labels.tolist() == [1, 2, -1, -1, -1]
    r.reset()
    assert len(r) == 0 and int(r.ptr) == 0
    with pytest.raises(ValueError, match=">= 0"):
        q.write(torch.ones(1, 3), torch.ones(1, 3), torch.tensor([-1]))
    with pytest.raises(ValueError, match="n x 3"):
        q.write(torch.ones(1, 2), torch.ones(1, 2), torch.tensor([0]))
    with pytest.raises(ValueError, match="integer >= 1"):
        LACQueue(0, 3)
    # no item at all: a zero on the graph, not the official NaN
    w = torch.zeros(1, 2, 3, requires_grad=True)
    out = lac_term(w, w, torch.zeros(1, 2, dtype=torch.bool), LACQueue(4, 3))
    out.backward()
    assert out.item() == 0.0


def test_lac_defaults_are_the_official_second_stage_defaults():
    """``LACConfig``'s defaults "are the paper's / the authors' code's": the argparse defaults of
    ``second_stage.py`` (xiemk/SPML-LAC b4af68e, lines 44-52, 59-69, 90, 99) and its OneCycle
    ``pct_start`` (line 222). (``dim`` is not: the official 2048 is ResNet-50's width, too big
    for a CPU; ``delta1`` = 0.6 is ``first_stage.py``'s threshold, not pinned here.)"""
    from spmlkit.methods.lac import (OFFICIAL_BATCH_SIZE, OFFICIAL_EPOCHS, OFFICIAL_LR,
                                     LACConfig)

    official = {"lambda_plc": 1.0, "lambda_lac": 1.0, "delta2": 0.9, "temperature": 0.5,
                "queue_size": 512, "weight_decay": 1e-2, "proj_dim": 128, "ema_decay": 0.9997,
                "pct_start": 0.2}
    ours = LACConfig()
    assert {k: getattr(ours, k) for k in official} == official
    assert (OFFICIAL_BATCH_SIZE, OFFICIAL_LR, OFFICIAL_EPOCHS) == (32, 1e-4, 40)
