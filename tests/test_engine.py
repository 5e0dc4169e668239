"""Engine, estimator, run folders: determinism, selection, early stopping, hooks, errors."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError

from spmlkit import SPMLClassifier
from spmlkit.engine import TrainConfig, fit_linear, parse_early_stop
from spmlkit.labels import make_observed
from spmlkit.losses import LOSSES, SPMLLoss, TrainInfo, create_loss
from spmlkit.runs import RunDir
from spmlkit.safe_write import write_json


def toy(n=120, d=6, classes=4, seed=0):
    """Linearly generated multi-label data: label j is on when x @ w_j > 0."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(d, classes))
    y = (x @ w > 0.3).astype(np.uint8)
    y[y.sum(1) == 0, 0] = 1
    return x, y


def test_fit_is_deterministic_and_seed_dependent():
    x, y = toy()
    z = make_observed(y, "1p")
    cfg = TrainConfig(epochs=3, batch_size=8, lr=1e-2, seed=3)
    m1, r1 = fit_linear(x, z, create_loss("an"), cfg, x_val=x, y_val=y)
    m2, r2 = fit_linear(x, z, create_loss("an"), cfg, x_val=x, y_val=y)
    assert torch.equal(m1.weight, m2.weight)
    assert [h["val_map"] for h in r1.history] == [h["val_map"] for h in r2.history]
    m3, _ = fit_linear(x, z, create_loss("an"), TrainConfig(epochs=3, batch_size=8, lr=1e-2,
                                                            seed=4), x_val=x, y_val=y)
    assert not torch.equal(m1.weight, m3.weight)


def test_learns_and_keeps_best_epoch():
    x, y = toy(n=300)
    z = make_observed(y, "1p")
    model, res = fit_linear(x, z, create_loss("an"), TrainConfig(epochs=6, lr=1e-2),
                            x_val=x, y_val=y)
    maps = [h["val_map"] for h in res.history]
    assert res.val_map == max(maps) and res.best_epoch == int(np.argmax(maps)) + 1
    assert res.val_map > 80  # separable data: far above chance (~40)
    # the returned model is the best epoch's
    from spmlkit.engine import predict_logits
    from spmlkit.metrics import map_score

    again = map_score(torch.sigmoid(predict_logits(model, torch.tensor(x))).numpy(), y)
    assert again == pytest.approx(res.val_map)


def test_early_stopping_rules():
    assert parse_early_stop("patience:3") == ("patience", 3.0)
    for bad in ("patience:0", "drop", "sometimes", "patience:x"):
        with pytest.raises(ValueError, match="early_stop"):
            parse_early_stop(bad)
    x, y = toy()
    z = make_observed(y, "1p")
    # lr so large that val mAP peaks early; patience 1 must stop right after the peak
    _, res = fit_linear(x, z, create_loss("an"), TrainConfig(epochs=25, lr=0.5,
                        early_stop="patience:1"), x_val=x, y_val=y)
    assert len(res.history) == res.best_epoch + 1 or len(res.history) == 25
    assert res.stopped_early == (len(res.history) < 25)


class Recorder(SPMLLoss):
    """Records the hooks the engine calls."""

    needs_index = True
    needs_train_predictions = True

    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_start(self, observed, info):
        self.calls.append(("start", tuple(observed.shape), info.k, info.num_epochs))

    def on_epoch_start(self, epoch):
        self.calls.append(("epoch_start", epoch))

    def on_epoch_end(self, epoch, train_logits=None):
        self.calls.append(("epoch_end", epoch, tuple(train_logits.shape)))

    def entries(self, logits, observed, index):
        self.calls.append(("batch", len(index)))
        return create_loss("an").entries(logits, observed, index)


def test_engine_calls_hooks_in_order():
    x, y = toy(n=20)
    loss = Recorder()
    fit_linear(x, make_observed(y, "1p"), loss, TrainConfig(epochs=2, batch_size=8), k=1.7)
    kinds = [c[0] for c in loss.calls]
    assert loss.calls[0] == ("start", (20, 4), 1.7, 2)
    assert kinds == ["start", "epoch_start", "batch", "batch", "batch", "epoch_end",
                     "epoch_start", "batch", "batch", "batch", "epoch_end"]
    assert [c[1] for c in loss.calls if c[0] == "batch"][:3] == [8, 8, 4]
    assert loss.calls[5] == ("epoch_end", 0, (20, 4))


def test_role_estimator_trains_at_ten_times_the_lr():
    """One full-batch Adam step moves every parameter by about lr * sign(grad)."""
    from spmlkit.engine import make_linear_head
    from spmlkit.losses import TrainInfo

    x, y = toy(n=40)
    z = make_observed(y, "1p")
    lr = 1e-3
    loss = create_loss("role")
    model, _ = fit_linear(x, z, loss, TrainConfig(epochs=1, batch_size=40, lr=lr, seed=5),
                          k=1.5)
    start = create_loss("role")
    start.on_train_start(torch.as_tensor(z), TrainInfo(40, 4, 1.5, seed=5))
    step_theta = (loss.label_logits - start.label_logits).abs().max().item()
    step_w = (model.weight - make_linear_head(6, 4, 5).weight).abs().max().item()
    assert step_theta == pytest.approx(10 * lr, rel=0.05)
    assert step_w == pytest.approx(lr, rel=0.05)


def test_bad_inputs_name_the_problem():
    x, y = toy(n=10)
    z = make_observed(y, "1p")
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match=r"NaN.*\[3\]"):
        fit_linear(bad, z, create_loss("an"), TrainConfig(epochs=1))
    with pytest.raises(ValueError, match="10 rows.*9"):
        fit_linear(x, z[:9], create_loss("an"), TrainConfig(epochs=1))
    z2 = z.copy()
    z2[2, 0] = 5
    with pytest.raises(ValueError, match=r"found \[5.0\].*row 2"):
        fit_linear(x, z2, create_loss("an"), TrainConfig(epochs=1))
    with pytest.raises(ValueError, match="epochs"):
        TrainConfig(epochs=0)
    with pytest.raises(FloatingPointError, match="diverged"):
        fit_linear(x * 1e30, z, create_loss("an"), TrainConfig(epochs=1, lr=1e30))
    # a weight decay of 1e308 passed every check, then "try a smaller learning rate"
    with pytest.raises(FloatingPointError, match=r"with a weight decay of 1e\+308 "
                                                 r"\(--weight-decay; usual values"):
        fit_linear(x, z, create_loss("an"), TrainConfig(epochs=1, weight_decay=1e308))


def test_estimator_sklearn_style():
    x, y = toy(n=200)
    z = make_observed(y, "1p")
    clf = SPMLClassifier(solver="adam", loss="an", epochs=4, lr=1e-2)
    assert clf.get_params()["loss"] == "an"
    with pytest.raises(NotFittedError, match="not fitted"):
        clf.predict_proba(x)
    clf.fit(x, z, X_val=x, Y_val=y)
    proba = clf.predict_proba(x)
    assert proba.shape == y.shape and ((proba >= 0) & (proba <= 1)).all()
    np.testing.assert_allclose(proba, 1 / (1 + np.exp(-clf.decision_function(x))), rtol=1e-5)
    assert clf.predict(x, threshold=0.5).tolist() == (proba >= 0.5).astype(int).tolist()
    per_class = np.array([0.1, 0.9, 0.5, 0.5])
    assert (clf.predict(x, per_class) == (proba >= per_class)).all()
    with pytest.raises(ValueError, match="X has 3 features, but SPMLClassifier is expecting 6"):
        clf.predict(x[:, :3])
    with pytest.raises(ValueError, match="Invalid parameter 'nope'"):
        clf.set_params(nope=1)
    # the k default is the mean number of observed positives per row
    clf2 = SPMLClassifier(solver="adam", loss="epr", epochs=1).fit(x, z)
    assert clf2.loss_.k == pytest.approx(1.0)


def test_run_dir_never_overwrites_and_writes_atomically(tmp_path):
    a = RunDir.create(tmp_path, "run")
    b = RunDir.create(tmp_path, "run")
    assert a.path.name == "run" and b.path.name == "run-2"
    a.write_json("x.json", {"v": np.float32(1.5), "a": np.arange(2)})
    assert json.loads((a.path / "x.json").read_text()) == {"v": 1.5, "a": [0, 1]}
    with pytest.raises(TypeError):
        write_json(a.path / "x.json", {"bad": object()})
    # the failed write left the previous file intact and no temporary behind
    assert json.loads((a.path / "x.json").read_text())["v"] == 1.5
    assert sorted(p.name for p in a.path.iterdir()) == ["x.json"]


def test_run_folder_syncs_only_its_checkpoint_failure_and_final_file(tmp_path, monkeypatch):
    """Every file of a run folder is published by a rename; only checkpoint.pt, failed.json and
    final.json (then the folder) are synced one by one, final.json last; predictions.npz reads
    back as np.savez_compressed's file does."""
    import os
    import zipfile

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("names the synced files through /proc/self/fd")
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    run = RunDir.create(tmp_path, "run")
    run.start({"a": 1}, np.array([[1, -1]], np.int8))
    saver = run.checkpointer(0.0)
    saver(lambda: {"epoch": 1})
    saver.wait()  # written in a thread of its own
    assert [Path(s).name.split(".")[1] for s in synced] == ["checkpoint"]  # its temporary
    arrays = {"probs_val": np.random.default_rng(0).random((30, 4), np.float32),
              "y_val": np.eye(4, dtype=np.uint8)[np.arange(30) % 4], "best_epoch": 3}
    synced.clear()
    run.finish({"test_map": 1.0}, {"model": {}}, arrays, {"global": 0.5})
    assert [Path(s).name for s in synced][-1] == run.path.name  # the folder, after final.json
    assert [Path(s).name.split(".")[1] for s in synced[:-1]] == ["final"]
    assert sorted(p.name for p in run.path.iterdir()) == [
        "best.pt", "config.json", "final.json", "observed.npy", "predictions.npz",
        "thresholds.json"]
    with np.load(run.path / "predictions.npz") as z:
        assert sorted(z.files) == sorted(arrays)
        for key, value in arrays.items():
            assert np.array_equal(z[key], value) and z[key].dtype == np.asarray(value).dtype
    with zipfile.ZipFile(run.path / "predictions.npz") as zf:  # floats stored, labels deflated
        assert {i.filename: i.compress_type for i in zf.infolist()} == {
            "probs_val.npy": zipfile.ZIP_STORED, "y_val.npy": zipfile.ZIP_DEFLATED,
            "best_epoch.npy": zipfile.ZIP_DEFLATED}
    synced.clear()
    run.fail(RuntimeError("boom"))
    assert [Path(s).name.split(".")[1] for s in synced] == ["failed"]


def test_lean_adam_equals_torch_fused_adam():
    from torch import nn

    from spmlkit.engine import LeanAdam

    gen = torch.Generator().manual_seed(0)
    a, b = nn.Linear(5, 3), nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    extra_a = nn.Parameter(torch.randn(4, 3, generator=gen))
    extra_b = nn.Parameter(extra_a.detach().clone())
    ref = torch.optim.Adam([{"params": a.parameters(), "lr": 1e-2},
                            {"params": [extra_a], "lr": 1e-1}], fused=True)
    lean = LeanAdam([(list(b.parameters()), 1e-2), ([extra_b], 1e-1)])
    for _ in range(15):
        x = torch.randn(4, 5, generator=gen)
        for model, extra, opt in ((a, extra_a, ref), (b, extra_b, lean)):
            opt.zero_grad()
            (model(x) * extra).pow(2).sum().backward()
            opt.step()
    assert torch.equal(a.weight, b.weight) and torch.equal(extra_a, extra_b)
    assert not torch.equal(a.weight, nn.Linear(5, 3).weight)


# ---- checkpoint and resume ---------------------------------------------------------------------
class Stop(Exception):
    pass


def weights_only_round_trip(state, tmp_path, name="state.pt"):
    """What a caller does with the state: torch.save, then a weights_only load."""
    torch.save(state, tmp_path / name)
    return torch.load(tmp_path / name, weights_only=True)


def stateful(name, y=None):
    """Loss ``name`` built to show its state early (EM+APL's pseudo-labels from epoch 1 on); a
    loss that needs an external scorer gets simulated scores of the full labels ``y``."""
    if name == "role_rows":  # ROLE's estimator stepped row by row (LeanAdam's lazy rows)
        return create_loss("role", estimator_update="rows")
    if getattr(LOSSES.get(name).factory, "needs_scores", False):
        from spmlkit.losses.scorer import simulated_scores

        return create_loss(name, scores=simulated_scores(y, flip=0.1, seed=0))
    return create_loss(name, **({"warmup": 1} if name == "em_apl" else {}))


@pytest.mark.parametrize("name", ["role", "role_rows", "em_apl", "ll_cp"])
def test_fit_linear_resume_is_bit_identical(name, tmp_path):
    """Stop after epoch e (on_epoch raises; the checkpoint of epoch e is kept), resume from
    that state in a fresh process-like setting (new loss object, state through torch.save and a
    weights_only load): the final weights, loss state, history and best epoch are the
    uninterrupted run's exactly, for losses whose state changes every epoch."""
    x, y = toy(n=90)
    z = make_observed(y, "1p")
    cfg = TrainConfig(epochs=6, batch_size=16, lr=2e-2, seed=7, early_stop="patience:3")
    fit = dict(x_val=x[:40], y_val=y[:40], k=1.5)
    whole_loss = stateful(name)
    whole, ref = fit_linear(x, z, whole_loss, cfg, **fit)
    for stop in (1, 3):
        saved = {}

        def on_epoch(record, model, loss):
            if record["epoch"] == stop:
                raise Stop

        with pytest.raises(Stop):
            fit_linear(x, z, stateful(name), cfg, on_epoch=on_epoch,
                       checkpoint=lambda state: saved.update(state=state()), **fit)
        state = weights_only_round_trip(saved["state"], tmp_path)
        assert len(state["history"]) == stop and state["run"]["batch_order"]["state"].dtype \
            == torch.uint8
        loss = stateful(name)
        model, res = fit_linear(x, z, loss, cfg, resume=state, **fit)
        assert torch.equal(model.weight, whole.weight) and torch.equal(model.bias, whole.bias)
        for key, value in whole_loss.state_dict().items():
            assert torch.equal(loss.state_dict()[key], value), (name, key)
        assert res.history == ref.history
        assert (res.best_epoch, res.val_map, res.stopped_early) == \
            (ref.best_epoch, ref.val_map, ref.stopped_early)


@pytest.mark.slow
def test_every_registered_loss_resumes_exactly(tmp_path):
    """The state of every registered loss lives in its state_dict: resuming after epoch 2
    gives the uninterrupted run, for each of them."""
    from spmlkit.losses import LOSSES

    x, y = toy(n=60)
    z = make_observed(y, "1p")
    cfg = TrainConfig(epochs=4, batch_size=16, lr=2e-2, seed=3)
    fit = dict(x_val=x[:30], y_val=y[:30], k=1.5)
    for name in LOSSES.names():
        states = []
        whole, ref = fit_linear(x, z, stateful(name, y), cfg,
                                checkpoint=lambda state: states.append(state()), **fit)
        state = weights_only_round_trip(states[1], tmp_path)
        model, res = fit_linear(x, z, stateful(name, y), cfg, resume=state, **fit)
        assert torch.equal(model.weight, whole.weight), name
        assert res.history == ref.history, name


def test_resume_from_every_epoch_and_from_a_finished_run():
    x, y = toy(n=60)
    z = make_observed(y, "1p")
    cfg = TrainConfig(epochs=4, batch_size=8, lr=1e-2, seed=1)
    states = []
    whole, ref = fit_linear(x, z, create_loss("an"), cfg, x_val=x, y_val=y,
                            checkpoint=lambda state: states.append(state()))
    assert len(states) == 4 and [len(s["history"]) for s in states] == [1, 2, 3, 4]
    for state in states:  # the last one: a finished run, nothing left to train
        model, res = fit_linear(x, z, create_loss("an"), cfg, x_val=x, y_val=y, resume=state)
        assert torch.equal(model.weight, whole.weight) and res.history == ref.history
        assert res.best_epoch == ref.best_epoch


def test_checkpoint_is_called_once_per_epoch_and_builds_nothing_unless_asked(monkeypatch):
    from spmlkit.engine import selection

    built = []
    real = selection.snapshot

    def counting(obj, where="state"):
        if where == "state":
            built.append(1)
        return real(obj, where)

    monkeypatch.setattr(selection, "snapshot", counting)
    x, y = toy(n=40)
    z = make_observed(y, "1p")
    cfg = TrainConfig(epochs=3, batch_size=8, lr=1e-2)
    calls = []
    _, plain = fit_linear(x, z, create_loss("an"), cfg, x_val=x, y_val=y)
    _, lazy = fit_linear(x, z, create_loss("an"), cfg, x_val=x, y_val=y,
                         checkpoint=lambda state_fn: calls.append(callable(state_fn)))
    assert calls == [True] * 3 and built == []  # called every epoch, the state never built
    assert lazy.history == plain.history
    fit_linear(x, z, create_loss("an"), cfg, x_val=x, y_val=y,
               checkpoint=lambda state_fn: state_fn() if len(built) < 1 else None)
    assert built == [1]  # a caller that writes once (e.g. throttled by time) builds it once


def test_resume_refuses_a_state_of_another_run():
    x, y = toy(n=40)
    z = make_observed(y, "1p")
    states = []
    fit_linear(x, z, create_loss("an"), TrainConfig(epochs=2, batch_size=8), x_val=x, y_val=y,
               checkpoint=lambda state: states.append(state()))
    with pytest.raises(ValueError, match="stages.*differ"):
        fit_linear(x, z, create_loss("an"), TrainConfig(epochs=3, batch_size=8), x_val=x,
                   y_val=y, resume=states[0])
    with pytest.raises(ValueError, match="does not fit this model"):
        fit_linear(x[:, :4], z, create_loss("an"), TrainConfig(epochs=2, batch_size=8),
                   resume=states[0])
    with pytest.raises(ValueError, match="format"):
        fit_linear(x, z, create_loss("an"), TrainConfig(epochs=2), resume={"model": {}})


def test_lean_adam_state_round_trip():
    from torch import nn

    from spmlkit.engine import LeanAdam

    gen = torch.Generator().manual_seed(0)
    a = nn.Linear(5, 3)
    b = nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    opt_a, opt_b = LeanAdam([(list(a.parameters()), 1e-2)]), LeanAdam([(list(b.parameters()),
                                                                         1e-2)])
    data = [torch.randn(4, 5, generator=gen) for _ in range(6)]

    def train(model, opt, xs):
        for x in xs:
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()

    train(a, opt_a, data)
    train(b, opt_b, data[:3])
    c = nn.Linear(5, 3)
    c.load_state_dict(b.state_dict())
    opt_c = LeanAdam([(list(c.parameters()), 1e-2)])
    opt_c.load_state_dict(opt_b.state_dict())  # moments and step counts, not just weights
    train(c, opt_c, data[3:])
    assert torch.equal(a.weight, c.weight) and torch.equal(a.bias, c.bias)
    with pytest.raises(ValueError, match="groups"):
        opt_c.load_state_dict({"groups": []})


def test_lean_adam_steps_a_sparse_gradient_as_sparse_adam_and_resumes():
    """A parameter with a row-wise (sparse) gradient: LeanAdam moves the batch's rows and their
    moments only, exactly as torch.optim.SparseAdam (beside fused Adam on the dense ones),
    also after a state round trip midway (its step counts come back with the state)."""
    from torch import nn
    from torch.nn import functional as F

    from spmlkit.engine import LeanAdam

    gen = torch.Generator().manual_seed(0)
    head = nn.Linear(5, 3)
    table = torch.randn(40, 3, generator=gen)
    batches = [(torch.randn(4, 5, generator=gen), torch.randint(0, 30, (4,), generator=gen))
               for _ in range(12)]  # rows 30..39 are never in a batch

    def run(make, resume_at=None):
        model = copy.deepcopy(head)
        est = nn.Parameter(table.clone())
        opt = make(model, est)
        for i, (x, rows) in enumerate(batches):
            if i == resume_at:  # a fresh optimiser from the saved state
                saved = copy.deepcopy(opt.state_dict())
                opt = make(model, est)
                opt.load_state_dict(saved)
            opt.zero_grad()
            (model(x) * F.embedding(rows, est, sparse=True)).pow(2).sum().backward()
            opt.step()
        return model, est, opt

    def torch_pair(model, est):
        return Both(torch.optim.Adam(model.parameters(), lr=1e-2, fused=True),
                    torch.optim.SparseAdam([est], lr=1e-1))

    def lean(model, est):
        return LeanAdam([(list(model.parameters()), 1e-2), ([est], 1e-1)])

    ref_model, ref_est, _ = run(torch_pair)
    for resume_at in (None, 5):
        model, est, opt = run(lean, resume_at)
        assert torch.equal(model.weight, ref_model.weight) and torch.equal(est, ref_est)
    assert torch.equal(est[30:], table[30:]) and not torch.equal(est[:30], table[:30])
    assert not opt.groups[1]["exp_avg"][0][30:].any()  # rows never seen: moments untouched
    assert int(opt.groups[1]["steps"][0]) == len(batches)
    decayed = LeanAdam([([est], 1e-1, 1e-2)])
    (F.embedding(torch.tensor([0]), est, sparse=True)).sum().backward()
    with pytest.raises(ValueError, match="sparse.*no weight decay"):
        decayed.step()


class Both:
    """Two torch optimisers stepped as one (the reference of the test above)."""

    def __init__(self, *opts):
        self.opts = opts

    def zero_grad(self):
        for o in self.opts:
            o.zero_grad()

    def step(self):
        for o in self.opts:
            o.step()


def test_without_the_fused_kernel_role_rows_trains_with_sparse_adam(monkeypatch, tmp_path):
    """Where torch lacks the fused Adam kernel, make_optimizer's fallback steps ROLE's "rows"
    estimator with torch.optim.SparseAdam (torch.optim.Adam refuses sparse gradients), and a
    run resumed from its checkpoint is the uninterrupted one."""
    from spmlkit.engine import make_linear_head, make_optimizer
    from spmlkit.engine.optim import AdamAndSparseAdam

    def missing(*args, **kwargs):
        raise RuntimeError("no fused kernel here")

    monkeypatch.setattr(torch, "_fused_adam_", missing)
    x, y = toy(n=60)
    z = make_observed(y, "1p")
    loss = create_loss("role", estimator_update="rows")
    loss.on_train_start(torch.as_tensor(z), TrainInfo(60, 4, 1.5, seed=0))
    opt = make_optimizer(make_linear_head(6, 4, 0), loss, 1e-2)
    assert isinstance(opt, AdamAndSparseAdam)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-2, 1e-1])
    cfg = TrainConfig(epochs=3, batch_size=16, lr=2e-2, seed=7)
    states = []
    whole_loss = create_loss("role", estimator_update="rows")
    whole, ref = fit_linear(x, z, whole_loss, cfg, x_val=x, y_val=y, k=1.5,
                            checkpoint=lambda state: states.append(state()))
    state = weights_only_round_trip(states[0], tmp_path)
    assert set(state["optimizer"]) == {"adam", "sparse_adam"}
    loss = create_loss("role", estimator_update="rows")
    model, res = fit_linear(x, z, loss, cfg, x_val=x, y_val=y, k=1.5, resume=state)
    assert torch.equal(model.weight, whole.weight)
    assert torch.equal(loss.label_logits, whole_loss.label_logits)
    assert res.history == ref.history


# ---- stages, hooks, several evaluators -----------------------------------------------------------
def test_stages_hooks_and_evaluators_on_the_one_loop():
    from spmlkit.engine import (Stage, StageParts, StepHook, make_linear_head, make_optimizer,
                                predict_logits, train_loop)
    from spmlkit.metrics import map_score

    x, y = toy(n=48)
    xt, z = torch.tensor(x), torch.as_tensor(make_observed(y, "1p"))
    model, loss = make_linear_head(6, 4, 0), create_loss("an")
    loss.on_train_start(z, None)

    class L2(StepHook):  # an extra term, a per-epoch record field, a step counter
        def __init__(self, weight):
            self.weight, self.steps = weight, 0

        def on_epoch_start(self, epoch):
            self.sum = 0.0

        def terms(self, batch):
            term = model.weight.pow(2).sum()
            self.sum += float(term.detach())
            return [(self.weight, term)]

        def after_step(self, batch):
            self.steps += 1

        def epoch_record(self):
            return {"l2": self.sum}

    hooks, starts = [], []

    def setup(weight):
        def build():
            starts.append({k: v.clone() for k, v in model.state_dict().items()})
            hooks.append(L2(weight))
            return StageParts(make_optimizer(model, loss, 1e-2), hooks=[hooks[-1]])
        return build

    def batches(epoch):
        for i in range(0, 48, 16):
            idx = torch.arange(i, i + 16)
            yield xt[idx], z[idx], idx

    score = lambda: map_score(torch.sigmoid(predict_logits(model, xt)).numpy(), y)  # noqa: E731
    other_scores = iter([70.0, 0.0, 0.0, 99.0])  # e.g. an EMA: wins epochs 1 and 4
    other_state = {"weight": torch.full((4, 6), 0.5), "bias": torch.zeros(4)}

    def weights(source):
        return {k: v.clone() for k, v in (other_state if source == "other" else
                                          model.state_dict()).items()}

    res = train_loop(model, loss, [Stage(2, setup(0.0), name=1, info={"delta": 0.6}),
                                   Stage(2, setup(1e-3), name=2, info={"delta": 0.9},
                                         from_best=True)],
                     num_examples=48, batches=batches, weights=weights,
                     evaluators={"model": score, "other": lambda: next(other_scores)})
    h = res.history
    assert list(h[0]) == ["epoch", "stage", "stage_epoch", "train_loss", "l2", "delta",
                          "val_map", "val_map_model", "val_map_other", "val_source", "best",
                          "stage_done"]
    assert [(r["epoch"], r["stage"], r["stage_epoch"], r["stage_done"]) for r in h] == \
        [(1, 1, 1, False), (2, 1, 2, True), (3, 2, 1, False), (4, 2, 2, True)]
    assert [r["val_source"] for r in h] == ["other", "model", "model", "other"]
    assert [r["delta"] for r in h] == [0.6, 0.6, 0.9, 0.9]
    for r in h:
        assert r["val_map"] == max(r["val_map_model"], r["val_map_other"])
    assert [r["best"] for r in h] == [True, h[1]["val_map"] > 70, h[2]["val_map"] > max(
        70, h[1]["val_map"]), True]
    assert [hk.steps for hk in hooks] == [3 * 2, 3 * 2] and h[0]["l2"] > 0
    # stage 2 started from stage 1's best: the weights of the evaluator that won it
    assert max(h[:2], key=lambda r: r["val_map"])["val_source"] == "other"
    assert torch.equal(starts[1]["weight"], other_state["weight"])
    assert not torch.equal(starts[0]["weight"], other_state["weight"])
    assert (res.best_epoch, res.best_stage, res.best_source, res.val_map) == (4, 2, "other", 99.0)
    assert torch.equal(model.weight, other_state["weight"])  # the best epoch's winner


# ---- no finite validation mAP ------------------------------------------------------------------
def test_val_labels_without_any_positive_are_a_clear_error():
    """No class of the val labels has a positive: val mAP is NaN at every epoch (the former
    loop then failed with a TypeError on the missing best state)."""
    x, y = toy(n=30)
    z = make_observed(y, "1p")
    with pytest.raises(ValueError, match="validation labels.*no positive in any class"):
        fit_linear(x, z, create_loss("an"), TrainConfig(epochs=2), x_val=x,
                   y_val=np.zeros_like(y))
    # the official convention scores such classes 0: finite, the first epoch is kept
    _, res = fit_linear(x, z, create_loss("an"), TrainConfig(epochs=2, map_convention="official"),
                        x_val=x, y_val=np.zeros_like(y))
    assert res.val_map == 0.0 and res.best_epoch == 1


def test_no_finite_val_map_is_a_clear_error():
    from spmlkit.engine import Stage, StageParts, make_linear_head, make_optimizer, train_loop

    x, y = toy(n=30)
    z = make_observed(y, "1p")
    model, loss = make_linear_head(6, 4, 0), create_loss("an")
    xt, zt = torch.tensor(x), torch.as_tensor(z)
    with pytest.raises(ValueError, match=r"no epoch got a finite validation mAP.*\[nan, nan\]"
                                         r".*not finite"):
        train_loop(model, loss, [Stage(2, lambda: StageParts(make_optimizer(model, loss, 1e-2)))],
                   num_examples=30, batches=lambda e: [(xt, zt, torch.arange(30))],
                   evaluators={"model": lambda: float("nan")})


# ---- selection metric ------------------------------------------------------------------------
def test_lower_is_better_metric_selects_the_minimum_and_stops_on_it():
    """With a lower-is-better metric the loop keeps the epoch of the smallest value, picks the
    evaluator with the smaller value and stops early against the smallest so far."""
    from spmlkit.engine import Stage, StageParts, make_linear_head, make_optimizer, train_loop

    x, y = toy(n=32)
    xt, z = torch.tensor(x), torch.as_tensor(make_observed(y, "1p"))
    model, loss = make_linear_head(6, 4, 0), create_loss("an")
    loss.on_train_start(z, None)

    def batches(epoch):
        yield xt, z, torch.arange(32)

    def run(values, other=None, early_stop="none", epochs=None):
        it, ot = iter(values), iter(other or [])
        evaluators = {"model": lambda: next(it)}
        if other is not None:
            evaluators["ema"] = lambda: next(ot)
        stage = Stage(epochs or len(values), lambda: StageParts(make_optimizer(model, loss,
                                                                               1e-3)))
        return train_loop(model, loss, [stage], num_examples=32, batches=batches,
                          evaluators=evaluators, early_stop=early_stop, metric="ranking_loss")

    res = run([0.4, 0.2, 0.3, 0.25])
    assert (res.best_epoch, res.val_score, res.metric) == (2, 0.2, "ranking_loss")
    assert np.isnan(res.val_map)
    assert [h["val_ranking_loss"] for h in res.history] == [0.4, 0.2, 0.3, 0.25]
    assert "val_map" not in res.history[0]
    assert [h["best"] for h in res.history] == [True, True, False, False]
    res = run([0.4, 0.3, 0.35], other=[0.5, 0.1, 0.6])
    assert [h["val_source"] for h in res.history] == ["model", "ema", "model"]
    assert res.history[1]["val_ranking_loss_ema"] == 0.1 and res.best_epoch == 2
    # drop:X in the metric's units: stop when it rises more than X above the best
    res = run([0.3, 0.2, 0.25, 0.5, 0.1, 0.1], early_stop="drop:0.1")
    assert len(res.history) == 4 and res.stopped_early and res.best_epoch == 2
    res = run([0.3, 0.31, 0.32, 0.1], early_stop="patience:2")
    assert len(res.history) == 3 and res.best_epoch == 1


def _scripted(stage_scores, early_stop, checkpoint=None, resume=None, done=0):
    """``train_loop`` on a linear head, one stage per list of ``stage_scores`` (stage 2 on from
    the best weights, as LAC's), each epoch's val score the next of the lists (a ``resume``
    after ``done`` epochs: from the next one)."""
    from spmlkit.engine import Stage, StageParts, make_linear_head, make_optimizer, train_loop

    x, y = toy(n=32)
    xt, z = torch.tensor(x), torch.as_tensor(make_observed(y, "1p"))
    model, loss = make_linear_head(6, 4, 0), create_loss("an")
    loss.on_train_start(z, None)
    it = iter([v for scores in stage_scores for v in scores][done:])
    stages = [Stage(len(scores), lambda: StageParts(make_optimizer(model, loss, 1e-3)),
                    name=i + 1, from_best=i > 0) for i, scores in enumerate(stage_scores)]
    return train_loop(model, loss, stages, num_examples=32,
                      batches=lambda epoch: [(xt, z, torch.arange(32))],
                      evaluators={"model": lambda: next(it)}, early_stop=early_stop,
                      checkpoint=checkpoint, resume=resume)


def test_a_resumed_run_keeps_its_early_stop():
    """Stage 1 stops early (70 is more than 15 below 90); a run resumed in stage 2 still
    reports it stopped early, as the uninterrupted run does."""
    states = []
    full = _scripted([[90.0, 80.0, 70.0, 60.0], [50.0, 52.0]], "drop:15",
                     checkpoint=lambda state: states.append(state()))
    assert [h["stage"] for h in full.history] == [1, 1, 1, 2, 2] and full.stopped_early
    again = _scripted([[90.0, 80.0, 70.0, 60.0], [50.0, 52.0]], "drop:15", resume=states[3],
                      done=4)
    assert again.stopped_early and again.history == full.history
    assert again.best_epoch == full.best_epoch == 1


def test_early_stopping_compares_within_the_current_stage():
    """Two stages (as LAC's), early stopping in each: ``drop:X`` and ``patience:N`` compare an
    epoch with the best of its own stage, not with the run's best (stage 2 of a two-stage run
    often scores below stage 1's best at first; compared with the run's best it would stop
    at once)."""
    res = _scripted([[90.0, 95.0], [50.0, 52.0, 51.0]], "drop:5")
    assert [h["stage"] for h in res.history] == [1, 1, 2, 2, 2] and not res.stopped_early
    assert res.best_epoch == 2 and res.val_map == 95.0
    res = _scripted([[90.0, 95.0], [50.0, 60.0, 40.0, 70.0]], "drop:5")  # 40 < 60 - 5: stop
    assert len(res.history) == 5 and res.stopped_early and res.history[-1]["stage_done"]
    res = _scripted([[90.0, 80.0], [50.0, 49.0, 48.0, 47.0]], "patience:2")
    assert [h["stage"] for h in res.history] == [1, 1, 2, 2, 2] and res.stopped_early
    # patience counts the stage's own epochs since the stage's best (its 1st): stop at its 4th
    res = _scripted([[90.0, 95.0], [50.0, 49.0, 48.0, 47.0, 60.0]], "patience:3")
    assert [h["stage_epoch"] for h in res.history] == [1, 2, 1, 2, 3, 4] and res.stopped_early


def test_early_stopping_ties_and_a_stop_on_the_last_epoch():
    """A tie is no improvement (patience runs on from the first of equal scores, the best epoch
    stays the first), and a stop that falls on a stage's last epoch is no early stop."""
    res = _scripted([[50.0, 50.0, 50.0, 50.0, 50.0]], "patience:2")
    assert len(res.history) == 3 and res.stopped_early and res.best_epoch == 1
    assert [h["best"] for h in res.history] == [True, False, False]
    res = _scripted([[50.0, 40.0, 30.0]], "patience:2")  # the stop is the stage's end
    assert len(res.history) == 3 and not res.stopped_early
    res = _scripted([[50.0, 40.0]], "drop:5")
    assert len(res.history) == 2 and not res.stopped_early
    res = _scripted([[50.0, 45.0, 44.0]], "drop:5")  # 45 = 50 - 5: not more than 5 below
    assert len(res.history) == 3 and not res.stopped_early


def test_fit_linear_selects_on_the_configured_metric():
    x, y = toy(n=200)
    z = make_observed(y, "1p")
    cfg = TrainConfig(epochs=6, lr=3e-2, metric="ranking_loss")
    _, res = fit_linear(x, z, create_loss("an"), cfg, x_val=x, y_val=y)
    values = [h["val_ranking_loss"] for h in res.history]
    assert res.best_epoch == int(np.argmin(values)) + 1 and res.val_score == min(values)
    # the map default is the old selection, bit for bit
    _, a = fit_linear(x, z, create_loss("an"), TrainConfig(epochs=4, lr=3e-2), x_val=x, y_val=y)
    _, b = fit_linear(x, z, create_loss("an"), TrainConfig(epochs=4, lr=3e-2, metric="map"),
                      x_val=x, y_val=y)
    assert a.history == b.history and a.val_map == a.val_score
    with pytest.raises(ValueError, match="unknown metric 'rank_loss'"):
        TrainConfig(metric="rank_loss")


def test_seeded_heads_are_the_same_when_threads_make_them_at_once():
    """Two threads of one process (a Dask worker's ``--nthreads 2``) each make seeded heads over
    and over: every head has its seed's weights (without the lock around the global RNG, about
    half of them drew the other thread's numbers)."""
    import threading

    from spmlkit.engine import make_linear_head
    from spmlkit.models.heads import MLPHead

    want = {s: (make_linear_head(300, 40, s).weight.detach().clone(),
                MLPHead(30, 4, hidden=8, seed=s).hidden.weight.detach().clone())
            for s in range(2)}
    wrong = []

    def work(seed):
        for _ in range(200):
            lin, mlp = make_linear_head(300, 40, seed), MLPHead(30, 4, hidden=8, seed=seed)
            if not (torch.equal(lin.weight, want[seed][0])
                    and torch.equal(mlp.hidden.weight, want[seed][1])):
                wrong.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


# ---- training states written before engine/selection.py (issue 22) still resume -----------------
def test_resume_of_states_written_before_the_selection_object():
    """``tests/fixtures/train-states-v1.pt``: checkpoints that the code before
    `spmlkit.engine.Selection` wrote (``fit_linear`` with ``patience:2`` after epoch 2
    and with ``drop:0.5`` after epoch 3, run 0 of a ``fit_linear_stacked`` pair with
    ``patience:1`` after epoch 3; each run stops early later); resumed now, each ends as the
    uninterrupted run of today's code."""
    from spmlkit.engine import fit_linear_stacked
    from spmlkit.runs import load_torch

    states = load_torch(Path(__file__).parent / "fixtures" / "train-states-v1.pt")
    rng = np.random.default_rng(0)  # the data the states were trained on
    x = rng.normal(size=(60, 6)).astype(np.float32)
    y = (x @ rng.normal(size=(6, 4)) > 0.3).astype(np.uint8)
    y[y.sum(1) == 0, 0] = 1
    z = make_observed(y, "1p", seed=0)
    val = dict(x_val=x[:30], y_val=y[:30])
    cases = [(TrainConfig(epochs=8, batch_size=8, lr=0.1, seed=seed, early_stop=rule),
              states[f"single {rule}"], None) for rule, seed in (("patience:2", 0),
                                                                  ("drop:0.5", 1))]
    cfgs = [TrainConfig(epochs=8, batch_size=8, lr=lr, seed=1, early_stop="patience:1")
            for lr in (0.1, 0.03)]
    stacked = fit_linear_stacked(x, z, [create_loss("an"), create_loss("an")], cfgs, **val)
    cases.append((cfgs[0], states["stacked run 0"], stacked[0]))
    for cfg, state, done in cases:
        whole, ref = done or fit_linear(x, z, create_loss("an"), cfg, **val)
        assert ref.stopped_early and len(ref.history) < cfg.epochs  # the rule stops the run
        model, res = fit_linear(x, z, create_loss("an"), cfg, **val, resume=state)
        assert res.best_epoch == ref.best_epoch and res.stopped_early
        assert [h["best"] for h in res.history] == [h["best"] for h in ref.history]
        np.testing.assert_allclose([h["val_map"] for h in res.history],
                                   [h["val_map"] for h in ref.history], rtol=1e-6)
        torch.testing.assert_close(model.weight, whole.weight, rtol=1e-4, atol=1e-5)
