"""Fine-tuning and linear_init: determinism, learning, hooks, head learning rate, carry-over."""
import warnings

import numpy as np
import pytest
import torch
from _image_toy import make_images, tiny_model

from spmlkit.engine import (GlobalBatchSampler, LossScaler, TrainConfig, amp_dtype,
                            fit_finetune, fit_linear, fit_linear_init, predict_items)
from spmlkit.labels import make_observed
from spmlkit.losses import SPMLLoss, TrainInfo, create_loss
from spmlkit.losses import create_loss as create


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    train, y = make_images(root / "train", 40, seed=0)
    val, y_val = make_images(root / "val", 16, seed=1)
    return {"train": train, "y": y, "observed": make_observed(y, "1p"), "val": val,
            "y_val": y_val}


def cfg(**kw):
    return TrainConfig(**{"epochs": 3, "batch_size": 8, "lr": 1e-2, "seed": 0, **kw})


def run(images, loss="an", seed=0, model_seed=0, **kw):
    model, res = fit_finetune(tiny_model(model_seed), images["train"], images["observed"],
                              create_loss(loss), cfg(seed=seed, **kw), val_items=images["val"],
                              y_val=images["y_val"], k=1.5)
    return model, res


def test_deterministic_learns_and_worker_processes_change_nothing(images):
    m1, r1 = run(images)
    m2, r2 = run(images, num_workers=1)  # augmentation seeded per (seed, epoch, row)
    for k, v in m1.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k]), k
    assert [h["val_map"] for h in r1.history] == [h["val_map"] for h in r2.history]
    m3, _ = run(images, seed=1)  # another sampler seed: other batches, other flips
    assert not torch.equal(m1.head.weight, m3.head.weight)
    chance = 100 * images["y_val"].mean()
    assert chance < 55 and r1.val_map > 85  # far above chance (~45) after 3 short epochs
    assert r1.val_map == max(h["val_map"] for h in r1.history)


class Recorder(SPMLLoss):
    """AN that records the engine's calls."""

    needs_index = True
    needs_train_predictions = True

    def __init__(self):
        super().__init__()
        self.calls, self.rows, self.logits = [], [], None

    def on_train_start(self, observed, info):
        self.calls.append(("start", tuple(observed.shape), info.k, info.num_epochs))

    def on_epoch_start(self, epoch):
        self.calls.append(("epoch_start", epoch))
        self.rows.append([])

    def on_epoch_end(self, epoch, train_logits=None):
        self.calls.append(("epoch_end", epoch, tuple(train_logits.shape)))
        self.logits = train_logits.clone()

    def entries(self, logits, observed, index):
        assert logits.dtype == torch.float32
        self.calls.append(("batch", len(index)))
        self.rows[-1] += index.tolist()
        return create_loss("an").entries(logits, observed, index)


def test_hooks_global_batches_and_train_predictions(images):
    n = 20
    loss = Recorder()
    seen = []

    def on_epoch(record, model, lo):
        # the loss got the eval-transform logits of every train row, in row order
        expected = predict_items(model, images["train"][:n], cfg())
        seen.append(bool(torch.allclose(lo.logits, expected, atol=1e-6)))

    fit_finetune(tiny_model(), images["train"][:n], images["observed"][:n], loss,
                 cfg(epochs=2), k=1.7, on_epoch=on_epoch)
    kinds = [c[0] for c in loss.calls]
    assert loss.calls[0] == ("start", (n, 3), 1.7, 2)
    assert kinds == ["start", "epoch_start", "batch", "batch", "batch", "epoch_end",
                     "epoch_start", "batch", "batch", "batch", "epoch_end"]
    assert [c[1] for c in loss.calls if c[0] == "batch"][:3] == [8, 8, 4]
    assert loss.calls[5] == ("epoch_end", 0, (n, 3))
    assert seen == [True, True]
    # every epoch visits every row once, in the sampler's order
    sampler = GlobalBatchSampler(n, 8, seed=0)
    for epoch, rows in enumerate(loss.rows):
        assert rows == torch.cat(sampler.global_batches(epoch)).tolist()
        assert sorted(rows) == list(range(n))
    assert loss.rows[0] != loss.rows[1]


def test_sampler_shares_are_the_single_process_batches():
    n, batch = 29, 8
    one = GlobalBatchSampler(n, batch, seed=5)
    for world in (2, 3):
        ranks = [GlobalBatchSampler(n, batch, seed=5, rank=r, world_size=world)
                 for r in range(world)]
        for epoch in (0, 1):
            for s in ranks + [one]:
                s.set_epoch(epoch)
            per_rank = [list(s) for s in ranks]
            merged = [[row for r in range(world) for row, _ in per_rank[r][b]]
                      for b in range(len(one))]
            assert merged == [[row for row, _ in b] for b in one]
            assert all(e == epoch for s in per_rank for b in s for _, e in b)
    last = [list(GlobalBatchSampler(n, batch, seed=5, rank=r, world_size=3))[-1]
            for r in range(3)]
    assert [len(b) for b in last] == [2, 2, 1]  # 29 = 3 * 8 + 5: shares differ by one at most


def test_head_lr_multiplier_and_loss_multiplier_set_step_sizes(images):
    """One full-batch Adam step moves every parameter by about lr * sign(grad)."""
    lr, mult, n = 1e-3, 10.0, 24
    start = tiny_model(seed=2)
    loss = create_loss("role")
    model, _ = fit_finetune(tiny_model(seed=2), images["train"][:n], images["observed"][:n],
                            loss, cfg(epochs=1, batch_size=n, lr=lr, head_lr_mult=mult),
                            k=1.5)
    after, before = model.state_dict(), start.state_dict()
    step = {k: float((after[k] - before[k]).abs().max()) for k in after}
    backbone = max(v for k, v in step.items() if k.startswith("backbone."))
    head = max(v for k, v in step.items() if k.startswith("head."))
    assert backbone == pytest.approx(lr, rel=0.05)
    assert head == pytest.approx(mult * lr, rel=0.05)
    fresh = create_loss("role")
    fresh.on_train_start(torch.as_tensor(images["observed"][:n]), TrainInfo(n, 3, 1.5, seed=0))
    theta = float((loss.label_logits - fresh.label_logits).detach().abs().max())
    assert theta == pytest.approx(10 * lr, rel=0.05)  # ROLE: 10 x the base lr, not the head's


def test_linear_init_carries_head_and_role_estimator(images):
    model = tiny_model(seed=4)
    feats = {s: predict_items(model.backbone, images[s], cfg()).numpy() for s in ("train", "val")}
    lin_cfg = cfg(epochs=3, lr=1e-2)
    # reference: the linear phase on its own
    ref_loss = create_loss("role")
    ref_head, ref_res = fit_linear(feats["train"], images["observed"], ref_loss, lin_cfg,
                                   x_val=feats["val"], y_val=images["y_val"], k=1.5)
    loss = create_loss("role")
    phases = []
    model, res = fit_linear_init(
        model, images["train"], images["observed"], loss, cfg(epochs=1, lr=1e-9),
        linear_config=lin_cfg, val_items=images["val"], y_val=images["y_val"], k=1.5,
        on_epoch=lambda rec, *_: phases.append(rec["phase"]))
    assert phases == ["linear"] * 3 + ["finetune"]
    assert [h["val_map"] for h in res.linear.history] == pytest.approx(
        [h["val_map"] for h in ref_res.history])
    # a 1e-9 learning rate leaves what the linear phase handed over
    assert torch.allclose(model.head.weight, ref_head.weight, atol=1e-6)
    assert torch.allclose(model.head.bias, ref_head.bias, atol=1e-6)
    assert torch.allclose(loss.label_logits, ref_loss.label_logits, atol=1e-6)
    fresh = create_loss("role")
    fresh.on_train_start(torch.as_tensor(images["observed"]), TrainInfo(40, 3, 1.5, seed=0))
    moved = float((loss.label_logits - fresh.label_logits).detach().abs().max())
    assert moved > 1e-2  # carried over, not drawn afresh
    with pytest.raises(ValueError, match="do not fit model.head"):
        fit_linear_init(tiny_model(), images["train"], images["observed"], create_loss("an"),
                        cfg(), train_features=np.zeros((40, 5), np.float32),
                        val_features=np.zeros((16, 5), np.float32), val_items=images["val"],
                        y_val=images["y_val"])


def test_linear_init_writes_the_features_it_computes_to_a_file(images, tmp_path, monkeypatch):
    """Without features given, linear_init's linear phase reads the backbone's features from a
    memory map of a temporary file (in the feature cache's folder), written batch by batch:
    the features of a large set are never held in memory; the values are predict_items'."""
    import spmlkit.engine.finetune as finetune

    monkeypatch.setenv("SPMLKIT_CACHE", str(tmp_path / "cache"))
    seen = {}
    fit = finetune.fit_linear

    def recorded(x, *args, x_val=None, **kw):
        seen.update(train=x, val=x_val)
        return fit(x, *args, x_val=x_val, **kw)

    monkeypatch.setattr(finetune, "fit_linear", recorded)
    model = tiny_model(seed=4)
    want = {s: predict_items(model.backbone, images[s], cfg(eval_batch_size=7)).numpy()
            for s in ("train", "val")}
    fit_linear_init(model, images["train"], images["observed"], create_loss("an"),
                    cfg(epochs=1, eval_batch_size=7), linear_config=cfg(epochs=1),
                    val_items=images["val"], y_val=images["y_val"], k=1.5)
    for s in ("train", "val"):
        assert isinstance(seen[s], np.memmap) and seen[s].dtype == np.float32, s
        np.testing.assert_array_equal(np.asarray(seen[s]), want[s])
    assert list((tmp_path / "cache" / "features").iterdir()) == []   # nameless, gone
    with pytest.raises(ValueError, match=r"\(40, 8\) do not fit model.head \(5 inputs\)"):
        finetune._backbone_features(model.backbone, images["train"], 5, cfg(), None, None,
                                    "train")


def test_amp_on_cuda_only_and_loss_scaler():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert amp_dtype("bf16", cpu) is None and amp_dtype("auto", cpu) is None
    assert amp_dtype("bf16", cuda) == torch.bfloat16 and amp_dtype("fp16", cuda) == \
        torch.float16 and amp_dtype("none", cuda) is None
    with pytest.raises(ValueError, match="amp"):
        TrainConfig(amp="fp8")
    p = torch.nn.Parameter(torch.ones(3))

    class SGD:  # any object with zero_grad() and step() (torch.optim's first step is slow)
        def zero_grad(self, set_to_none=True):
            p.grad = None

        @torch.no_grad()
        def step(self):
            p.sub_(p.grad)

    opt = SGD()
    scaler = LossScaler([p], init_scale=8.0, growth_interval=2)
    scaler.step((p * torch.tensor([1.0, float("inf"), 1.0])).sum(), opt)
    assert torch.equal(p.detach(), torch.ones(3)) and scaler.scale == 4.0 and scaler.skipped == 1
    scaler.step((2 * p).sum(), opt)  # gradients unscaled before the step: exactly 2
    assert torch.allclose(p.detach(), -torch.ones(3)) and scaler.scale == 4.0
    scaler.step((2 * p).sum(), opt)
    assert scaler.scale == 8.0  # two good steps in a row


def test_loss_scaler_unscales_a_sparse_gradient_and_skips_it_when_not_finite():
    """ROLE "rows" under float16 autocast: the estimator's row-wise (sparse) gradient is
    unscaled before LeanAdam's lazy step (the step is the unscaled one, exactly), and a
    non-finite one skips the step."""
    from torch.nn import functional as F

    from spmlkit.engine import LeanAdam

    def rows_value(est, rows=(2, 0), weight=1.0):
        return (F.embedding(torch.tensor(rows), est, sparse=True) * weight).pow(2).sum()

    start = torch.arange(12.0).view(4, 3)
    plain = torch.nn.Parameter(start.clone())
    opt = LeanAdam([([plain], 0.1)])
    rows_value(plain).backward()
    opt.step()
    est = torch.nn.Parameter(start.clone())
    scaler = LossScaler([est], init_scale=1024.0)
    opt = LeanAdam([([est], 0.1)])
    scaler.step(rows_value(est), opt)
    assert torch.equal(est, plain) and not torch.equal(plain, start)
    before = est.detach().clone()
    scaler.step(rows_value(est, rows=(1,), weight=float("inf")), opt)
    assert torch.equal(est, before) and scaler.skipped == 1 and scaler.scale == 512.0


def test_amp_request_on_cpu_warns_and_runs_float32(images):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, res = fit_finetune(tiny_model(), images["train"][:16], images["observed"][:16],
                                  create_loss("an"), cfg(epochs=1, amp="bf16"))
    # the warning points at the line that called fit_finetune
    assert any("CUDA only" in str(w.message) and w.filename == __file__ for w in caught)
    assert model.head.weight.dtype == torch.float32 and np.isfinite(res.history[0]["train_loss"])


def test_errors_name_the_problem(images, tmp_path):
    z = images["observed"]
    with pytest.raises(ValueError, match="feature matrix"):
        fit_finetune(tiny_model(), np.zeros((40, 8), np.float32), z, create_loss("an"), cfg())
    with pytest.raises(ValueError, match="40 train items but 39 rows"):
        fit_finetune(tiny_model(), images["train"], z[:39], create_loss("an"), cfg())
    with pytest.raises(ValueError, match="needs a model with a `head`"):
        fit_finetune(tiny_model().backbone, images["train"], z, create_loss("an"),
                     cfg(head_lr_mult=10.0, image_size=16))
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"\x89PNG not really")
    items = images["train"][:7] + [str(bad)]
    with pytest.raises(ValueError, match="broken.png"):
        fit_finetune(tiny_model(), items, z[:8], create_loss("an"), cfg(epochs=1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_amp_channels_last_learns(images):
    for amp in ("bf16", "fp16"):
        model, res = run(images, device="cuda", amp=amp)
        assert next(model.parameters()).is_cuda
        assert model.backbone.convs[0].weight.is_contiguous(memory_format=torch.channels_last)
        assert res.val_map > 80, amp


def test_every_registered_loss_fine_tunes(images):
    """Every method trains end to end through the same hooks (one short epoch each)."""
    from spmlkit.losses import LOSSES
    from spmlkit.losses.scorer import simulated_scores

    n, hparams, losses = 16, {"em_apl": {"warmup": 0}}, {}  # em_apl: pseudo-labels at once
    scores = simulated_scores((np.asarray(images["observed"][:n]) == 1).astype(np.float32),
                              flip=0.1, seed=0)  # an external scorer for em_pl / gpr
    for entry in LOSSES.entries():
        if getattr(entry.factory, "needs_scores", False):
            hparams[entry.name] = {"scores": scores}
        loss = losses[entry.name] = create_loss(entry.name, **hparams.get(entry.name, {}))
        model, res = fit_finetune(tiny_model(), images["train"][:n], images["observed"][:n],
                                  loss, cfg(epochs=1, batch_size=8), val_items=images["val"][:8],
                                  y_val=images["y_val"][:8], k=1.5)
        (record,) = res.history
        assert np.isfinite(record["train_loss"]) and np.isfinite(record["val_map"]), entry.name
    assert len(losses) >= 20 and int(losses["em_apl"].pseudo_mask.sum()) > 0


# ---- checkpoint and resume ---------------------------------------------------------------------
class Stop(Exception):
    pass


def saved_state(tmp_path, state):
    """torch.save, then a weights_only load: what a run folder's checkpoint goes through."""
    torch.save(state, tmp_path / "state.pt")
    return torch.load(tmp_path / "state.pt", weights_only=True)


class DropoutModel(torch.nn.Module):
    """tiny_cnn + dropout + linear head: training draws from torch's global RNG."""

    def __init__(self, seed=0):
        super().__init__()
        self.backbone = tiny_model(seed).backbone
        self.drop = torch.nn.Dropout(0.5)
        self.head = tiny_model(seed).head

    def forward(self, x):
        return self.head(self.drop(self.backbone(x)))


@pytest.mark.parametrize("make, update", [(tiny_model, "dense"), (DropoutModel, "dense"),
                                          (tiny_model, "rows")])
def test_finetune_resume_is_bit_identical(images, tmp_path, make, update):
    """Stop after epoch 1 (on_epoch raises), resume from that epoch's checkpoint state with a
    fresh model and loss: the uninterrupted run's weights, ROLE estimator, history and best
    epoch exactly; with dropout too (drawn per epoch from a seeded fork of the global RNG,
    which is left as it was); with ROLE's estimator stepped row by row (its lazy moments and
    step count in the checkpoint)."""
    n = 24
    config = cfg(epochs=3, image_size=16)
    data = dict(val_items=images["val"], y_val=images["y_val"], k=1.5)
    rng = torch.get_rng_state()

    def create_loss(name):  # (the module's, with the estimator's update)
        return create(name, estimator_update=update)

    whole_loss = create_loss("role")
    whole, ref = fit_finetune(make(), images["train"][:n], images["observed"][:n], whole_loss,
                              config, **data)
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's global RNG untouched
    saved = {}

    def on_epoch(record, model, loss):
        if record["epoch"] == 1:
            raise Stop

    with pytest.raises(Stop):
        fit_finetune(make(), images["train"][:n], images["observed"][:n], create_loss("role"),
                     config, on_epoch=on_epoch,
                     checkpoint=lambda state: saved.update(state=state()), **data)
    torch.manual_seed(123)  # whatever the global RNG holds when the run is resumed
    loss = create_loss("role")
    model, res = fit_finetune(make(), images["train"][:n], images["observed"][:n], loss,
                              config, resume=saved_state(tmp_path, saved["state"]), **data)
    for key, value in whole.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert torch.equal(loss.label_logits, whole_loss.label_logits)
    assert res.history == ref.history and res.best_epoch == ref.best_epoch
    assert len(res.history) == 3


def test_linear_init_resumes_in_either_phase(images, tmp_path):
    model0 = tiny_model(seed=4)
    feats = {s: predict_items(model0.backbone, images[s], cfg()).numpy() for s in ("train", "val")}
    kw = dict(linear_config=cfg(epochs=3, lr=1e-2), train_features=feats["train"],
              val_features=feats["val"], val_items=images["val"], y_val=images["y_val"], k=1.5)
    config = cfg(epochs=2, lr=1e-3)
    whole_loss = create_loss("role")
    whole, ref = fit_linear_init(tiny_model(seed=4), images["train"], images["observed"],
                                 whole_loss, config, **kw)
    for phase, epoch in (("linear", 2), ("finetune", 1)):
        saved = {}

        def on_epoch(record, model, loss):
            if (record["phase"], record["epoch"]) == (phase, epoch):
                raise Stop

        with pytest.raises(Stop):
            fit_linear_init(tiny_model(seed=4), images["train"], images["observed"],
                            create_loss("role"), config, on_epoch=on_epoch,
                            checkpoint=lambda state: saved.update(state=state()), **kw)
        state = saved_state(tmp_path, saved["state"])
        assert state["phase"] == phase and len(state["state"]["history"]) == epoch
        loss = create_loss("role")
        resumed_kw = dict(kw)
        if phase == "finetune":  # no features needed: the linear phase is over
            resumed_kw.update(train_features=None, val_features=None)
        model, res = fit_linear_init(tiny_model(seed=4), images["train"], images["observed"],
                                     loss, config, resume=state, **resumed_kw)
        for key, value in whole.state_dict().items():
            assert torch.equal(model.state_dict()[key], value), (phase, key)
        assert torch.equal(loss.label_logits, whole_loss.label_logits)
        assert res.history == ref.history and res.linear.history == ref.linear.history
        assert res.linear.best_epoch == ref.linear.best_epoch
    with pytest.raises(ValueError, match="not a linear_init state"):
        fit_linear_init(tiny_model(seed=4), images["train"], images["observed"],
                        create_loss("role"), config, resume=state["state"], **kw)


def test_loss_scaler_state_round_trip():
    scaler = LossScaler([torch.nn.Parameter(torch.ones(1))], init_scale=8.0)
    scaler.scale, scaler.good, scaler.skipped = 4.0, 3, 1
    other = LossScaler([], init_scale=2.0)
    other.load_state_dict(scaler.state_dict())
    assert (other.scale, other.good, other.skipped) == (4.0, 3, 1)
    with pytest.raises(ValueError, match="lacks"):
        other.load_state_dict({})


def test_fit_finetune_refuses_the_heads_weight_decay(images):
    """``TrainConfig.weight_decay`` is the feature heads' coupled L2; fit_finetune does not read
    it (its decay is FinetuneOptions'), so a value there is refused, not ignored."""
    from spmlkit.engine import FinetuneOptions

    with pytest.raises(ValueError, match=r"TrainConfig.weight_decay \(0.5\) .*"
                                         r"FinetuneOptions\(weight_decay=...\)"):
        fit_finetune(tiny_model(), images["train"], images["observed"], create_loss("an"),
                     cfg(weight_decay=0.5))
    assert FinetuneOptions(weight_decay=0.5).weight_decay == 0.5
