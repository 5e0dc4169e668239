"""Known negatives in training: ``neg_weight`` (the extra weight on the observed negatives'
loss terms) through the engine and the command line. The per-loss contract (which losses take
it, that it weighs the O- entries and nothing else) is generated from the registry in
``tests/test_losses_contract.py``."""
from __future__ import annotations

import json

import numpy as np
import torch

from spmlkit.cli import main
from spmlkit.engine import TrainConfig, fit_linear
from spmlkit.engine.vectorised import closed_form, fit_linear_stacked
from spmlkit.labels import make_observed
from spmlkit.losses import create_loss

N, D, L = 40, 6, 5


def _data():
    rng = np.random.RandomState(11)
    y = (rng.random_sample((N, L)) < 0.4).astype(np.uint8)
    y[np.arange(N), rng.randint(0, L, N)] = 1
    x = torch.as_tensor(rng.standard_normal((N, D)), dtype=torch.float32)
    z = torch.as_tensor(make_observed(y, "1p_1n", seed=3)).to(torch.int8)
    return x, z, torch.as_tensor(y)


X, Z, Y = _data()
CONFIGS = [TrainConfig(epochs=3, batch_size=8, lr=lr, seed=s) for lr, s in ((1e-2, 0),
                                                                            (3e-3, 1))]


def _head(loss, config):
    model, _ = fit_linear(X, Z, loss, config, x_val=X, y_val=Y)
    return model.weight.detach()


def test_the_default_weight_is_the_loss_unchanged():
    """``neg_weight=1`` trains the same head bit for bit, on the closed-form path."""
    plain, one = create_loss("an"), create_loss("an", neg_weight=1.0)
    assert closed_form(plain) and closed_form(one)
    assert torch.equal(_head(plain, CONFIGS[0]), _head(one, CONFIGS[0]))


def test_a_weight_changes_training_and_stacked_runs_equal_single_runs():
    """A weight takes the autograd path of the vectorised engine (not the closed form) and
    its stacked runs train each single run's head; the head differs from the unweighted one."""
    heavy = create_loss("an", neg_weight=3.0)
    assert not closed_form(heavy)
    single = [_head(create_loss("an", neg_weight=3.0), c) for c in CONFIGS]
    stacked = fit_linear_stacked(X, Z, [create_loss("an", neg_weight=3.0) for _ in CONFIGS],
                                 CONFIGS, x_val=X, y_val=Y)
    for w, (model, _) in zip(single, stacked):
        torch.testing.assert_close(model.weight.detach(), w, rtol=0, atol=2e-6)
    assert not torch.allclose(single[0], _head(create_loss("an"), CONFIGS[0]), atol=1e-4)


def test_spml_train_records_the_weight(tmp_path):
    """``--hp neg_weight=4`` on yeast's one-positive-one-negative regime: recorded in the run's
    config.json, and the run's scores differ from the unweighted run's; a loss without a term
    on each known negative (PR) refuses it by name."""
    common = ["train", "--dataset", "yeast", "--regime", "1p_1n", "--epochs", "2", "--quiet"]
    finals = {}
    for tag, extra in (("plain", []), ("heavy", ["--hp", "neg_weight=4"])):
        out = tmp_path / tag
        assert main([*common, "--loss", "an", "--out", str(out), *extra]) == 0
        run = out / "yeast-an-1p_1n-s0"
        config = json.loads((run / "config.json").read_text())
        finals[tag] = json.loads((run / "final.json").read_text())
        assert config["hparams"] == ({} if tag == "plain" else {"neg_weight": 4})
    assert finals["plain"]["test_map"] != finals["heavy"]["test_map"]
    assert main([*common, "--loss", "pr", "--out", str(tmp_path / "pr"),
                 "--hp", "neg_weight=2"]) != 0
