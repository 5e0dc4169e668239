"""``train.drop_last``: training leaves out each epoch's last, shorter batch (Cole et al.'s and
Xie et al.'s loaders); validation and test still score every row; off by default, and off leaves
the benchmark's run ids as they were."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from spmlkit.engine import (GlobalBatchSampler, TrainConfig, batch_starts, epoch_rows,
                            fit_linear)
from spmlkit.engine.vectorised import fit_linear_stacked
from spmlkit.experiments.benchmark import benchmark_study
from spmlkit.experiments.study import expand, load_study
from spmlkit.losses import create_loss


def _data(n, d=5, classes=4, seed=0):
    g = np.random.RandomState(seed)
    y = (g.rand(n, classes) < 0.4).astype(np.uint8)
    y[np.arange(n), g.randint(0, classes, n)] = 1
    x = (y @ g.randn(classes, d) + 0.5 * g.randn(n, d)).astype(np.float32)
    z = np.zeros_like(y, dtype=np.int8)
    for i in range(n):
        z[i, g.choice(np.flatnonzero(y[i]))] = 1
    return x, y, z


X, Y, Z = _data(27)          # 27 rows, batch 8: 3 full batches and one of 3
XV, YV, _ = _data(13, seed=1)


def test_batch_starts_and_rows():
    assert list(batch_starts(27, 8)) == [0, 8, 16, 24] and epoch_rows(27, 8) == 27
    assert list(batch_starts(27, 8, True)) == [0, 8, 16] and epoch_rows(27, 8, True) == 24
    assert list(batch_starts(24, 8, True)) == [0, 8, 16] and epoch_rows(24, 8, True) == 24
    with pytest.raises(ValueError, match="drop_last.*5 rows, fewer than batch_size 8"):
        batch_starts(5, 8, True)
    with pytest.raises(ValueError, match="drop_last must be true or false"):
        TrainConfig(drop_last="yes")
    assert TrainConfig().drop_last is False


class _Spy(torch.nn.Module):
    """Records the batch sizes a loss sees (the AN loss underneath)."""

    def __init__(self):
        super().__init__()
        self.an, self.sizes = create_loss("an"), []

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.an, name)

    def forward(self, logits, observed, index=None):
        self.sizes.append(len(logits))
        return self.an(logits, observed, index)


@pytest.mark.parametrize("drop", [False, True])
def test_fit_linear_trains_on_full_batches_and_scores_every_row(drop, monkeypatch):
    config = TrainConfig(epochs=2, batch_size=8, lr=1e-2, drop_last=drop)
    spy = _Spy()
    scored = []
    import spmlkit.engine.linear as linear

    real = linear.val_map
    monkeypatch.setattr(linear, "val_map", lambda logits, y, *a: scored.append(len(logits))
                        or real(logits, y, *a))
    _, res = fit_linear(X, Z, spy, config, x_val=XV, y_val=YV)
    assert spy.sizes == ([8, 8, 8] if drop else [8, 8, 8, 3]) * 2
    assert scored == [13, 13]                      # validation: every row, each epoch
    # the epoch's train loss is the mean over the rows it trained on
    assert np.isfinite(res.history[0]["train_loss"])


def test_stacked_runs_equal_single_runs_with_drop_last():
    configs = [TrainConfig(epochs=3, batch_size=8, lr=lr, seed=s, drop_last=True)
               for lr, s in ((1e-2, 0), (1e-3, 1))]
    single = [fit_linear(X, Z, create_loss("an"), c, x_val=XV, y_val=YV) for c in configs]
    stacked = fit_linear_stacked(X, Z, [create_loss("an") for _ in configs], configs,
                                 x_val=XV, y_val=YV)
    for (m1, r1), (m2, r2) in zip(single, stacked):
        torch.testing.assert_close(m2.weight, m1.weight, atol=2e-6, rtol=0)
        for h1, h2 in zip(r1.history, r2.history):
            assert h2["train_loss"] == pytest.approx(h1["train_loss"], rel=1e-5)
    # and dropping changes the training (the 3 left-over rows differ each epoch)
    kept = fit_linear(X, Z, create_loss("an"), dataclasses.replace(configs[0], drop_last=False),
                      x_val=XV, y_val=YV)[0]
    assert not torch.allclose(kept.weight, single[0][0].weight)


def test_global_batch_sampler_drop_last():
    s = GlobalBatchSampler(10, 4, seed=0, drop_last=True)
    batches = s.global_batches(0)
    assert [len(b) for b in batches] == [4, 4] and len(s) == 2 and s.rows_per_epoch == 8
    full = GlobalBatchSampler(10, 4, seed=0).global_batches(0)
    assert torch.equal(torch.cat(batches), torch.cat(full)[:8])   # the same order, cut
    with pytest.raises(ValueError, match="fewer than batch_size"):
        GlobalBatchSampler(3, 4, drop_last=True)


def test_benchmark_spec_run_ids_unchanged_when_off():
    off = benchmark_study("yeast", "an", seeds=1)
    assert "drop_last" not in off["train"]  # (train_predictions: False, not in a run id)
    on = benchmark_study("yeast", "an", seeds=1, drop_last=True)
    assert on["train"] == {"drop_last": True, "train_predictions": False}
    kept = benchmark_study("yeast", "an", seeds=1, train_predictions=True)
    assert "train" not in kept or kept["train"] == {}
    assert {t.run_id for t in expand(load_study(kept))} == \
        {t.run_id for t in expand(load_study(off))}
    ids_off = {t.run_id for t in expand(load_study(off))}
    ids_on = {t.run_id for t in expand(load_study(on))}
    assert ids_off.isdisjoint(ids_on)
    assert all(t.train.get("drop_last") for t in expand(load_study(on)))
