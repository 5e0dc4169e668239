"""MIME (Liu et al., ICML 2023): the loss parts against the official functions, hand-computed
values, gradients, the pseudo-label rule, the model, and runs on feature vectors (train,
resume, predict)."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from spmlkit.cli import main
from spmlkit.loading import load_splits
from spmlkit.engine import TrainConfig
from spmlkit.methods import check_inputs, get_method, load_run_model, resume_run, train_run
from spmlkit.methods.mime import (ABLATIONS, MIMEConfig, MIMEModel, MIMEObjective, config_of,
                                  mime_an_loss, pseudo_positives, vib_kl, vib_statistics)
from spmlkit.runs import read_run

# ---- pinned against the official code ------------------------------------------------------------
# palm-biaoliu/mime @ 62a0f6616216648cf8973fdbfeb914458f1affcd, run unchanged on these inputs
# (float64) in a throw-away script: utils/losses.py (neg_log, loss_VIB, compute_batch_loss with
# P = {'loss': 'VIB', 'beta': 1e-4}), lib_lagc/models/LEModel.py (LEModel_VIB.forward's
# z_mu = s[..., :k], z_std = exp(clamp(s[..., k:] / 2, -6, 6))), losses.py
# (pseudo_labeling_vib with args.t = 0.95).
LOGITS = [[2.0, -1.0, 0.5, -3.0], [-0.5, 1.5, -2.0, 4.0], [0.0, -4.0, 3.0, 1.0]]
TARGETS = [[1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1]]  # (1, 2): a pseudo-positive
STATS = [[[0.3, -0.2, 0.4, -1.0], [1.0, 0.5, -0.3, 0.2], [0.0, 0.1, 14.0, 0.0],
          [-0.7, 0.9, 0.6, -0.4]],
         [[0.2, 0.2, -13.0, 1.0], [-1.5, 0.3, 0.8, 0.1], [0.4, -0.4, 0.0, 0.5],
          [1.1, -0.6, -0.9, 0.3]],
         [[0.0, 0.0, 0.0, 0.0], [0.5, 1.5, 1.0, -2.0], [-0.3, 0.7, 0.2, 0.2],
          [0.9, -1.1, -0.1, 0.7]]]  # 14 and -13: sigma's clamp at +-6 (zero gradient)
OFFICIAL_LOSS = 1.368735252898272       # compute_batch_loss(...)['loss_tensor']
OFFICIAL_KL = 3391.032811359975         # loss_VIB's reg_loss with beta = 1
OFFICIAL_GRAD_LOGITS = [
    [-0.009933464057054187, 0.022411478552158685, 0.051870237035486357, 0.003952114609342469],
    [0.031461216965748974, -0.015201941044337187, -0.07339359946792447, 0.08178900932704276],
    [0.04166583334999967, 0.0014988355672973137, 0.07936444281630885, -0.022411478552158682]]
OFFICIAL_GRAD_STATS = [
    [[1.25e-06, -8.333333333333334e-07, 1.0246347867526465e-06, -1.3169178308928286e-06],
     [4.166666666666667e-06, 2.0833333333333334e-06, -5.399620402464211e-07,
      4.6125574616702104e-07],
     [0.0, 4.166666666666667e-07, 0.0, 0.0],
     [-2.9166666666666666e-06, 3.75e-06, 1.712747500813561e-06, -6.868332374257518e-07]],
    [[8.333333333333334e-07, 8.333333333333334e-07, 0.0, 3.5797538092896777e-06],
     [-6.25e-06, 1.25e-06, 2.553210267692641e-06, 2.191060793242661e-07],
     [1.6666666666666669e-06, -1.6666666666666669e-06, 0.0, 1.3515026472919332e-06],
     [4.583333333333334e-06, -2.5e-06, -1.236313208873752e-06, 7.288725157833395e-07]],
    [[0.0, 0.0, 0.0, 0.0],
     [2.0833333333333334e-06, 6.25e-06, 3.5797538092896777e-06, -1.80138482659039e-06],
     [-1.25e-06, 2.9166666666666666e-06, 4.6125574616702104e-07, 4.6125574616702104e-07],
     [3.75e-06, -4.583333333333334e-06, -1.9825537909175066e-07, 2.111984807230159e-06]]]
PL_PROBS = [[0.99, 0.10, 0.96, 0.20], [0.50, 0.951, 0.95, 0.97], [0.97, 0.97, 0.10, 0.99],
            [0.01, 0.02, 0.03, 0.04], [0.96, 0.20, 0.30, 0.999], [0.40, 0.94, 0.96, 0.10]]
PL_OBSERVED = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 1, 0],
               [0, 1, 0, 1]]
OFFICIAL_AFTER_PL = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 1], [1, 0, 0, 0], [1, 0, 1, 1],
                     [0, 1, 1, 1]]  # label_matrix_obs after pseudo_labeling_vib


def _mime_step_loss(logits, targets, stats, beta=1e-4):
    mu, sigma = vib_statistics(stats, 2)
    return mime_an_loss(torch.sigmoid(logits), targets) + beta * vib_kl(mu, sigma)


def test_loss_and_gradients_equal_the_official_functions():
    logits = torch.tensor(LOGITS, dtype=torch.float64, requires_grad=True)
    stats = torch.tensor(STATS, dtype=torch.float64, requires_grad=True)
    loss = _mime_step_loss(logits, torch.tensor(TARGETS), stats)
    assert loss.item() == pytest.approx(OFFICIAL_LOSS, rel=1e-13)
    g_logits, g_stats = torch.autograd.grad(loss, (logits, stats))
    np.testing.assert_allclose(g_logits.numpy(), OFFICIAL_GRAD_LOGITS, rtol=1e-11, atol=1e-16)
    np.testing.assert_allclose(g_stats.numpy(), OFFICIAL_GRAD_STATS, rtol=1e-11, atol=1e-16)
    mu, sigma = vib_statistics(stats.detach(), 2)
    assert vib_kl(mu, sigma).item() == pytest.approx(OFFICIAL_KL, rel=1e-13)


def test_pseudo_labels_equal_the_official_rule():
    probs = torch.tensor(PL_PROBS, dtype=torch.float64)
    logits = torch.log(probs / (1 - probs))  # the official pass takes sigmoid(logits)
    observed = torch.tensor(PL_OBSERVED)
    objective = MIMEObjective(observed, theta=0.95, warmup_epoch=2)
    objective.on_epoch_end(0, logits)  # epoch 1 < warmup_epoch: nothing yet
    assert int(objective.pseudo.sum()) == 0 and objective.added == 0
    objective.on_epoch_end(1, logits)
    after = objective.targets(observed, torch.arange(6))
    assert after.tolist() == OFFICIAL_AFTER_PL
    assert objective.added == 7
    # they accumulate: a later epoch whose predictions all fall keeps them
    objective.on_epoch_end(2, torch.full_like(logits, -9.0))
    assert objective.targets(observed, torch.arange(6)).tolist() == OFFICIAL_AFTER_PL
    # strictly above theta (0.95 itself is not), and observed entries are never re-labelled
    assert not pseudo_positives(torch.tensor([[0.95, 0.99]]), torch.tensor([[0, -1]]),
                                0.95).any()


# ---- hand-computed values and gradcheck ----------------------------------------------------------
def test_hand_computed_values():
    eps = 1e-5
    logits = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)   # p = 0.5, 0.75
    value = mime_an_loss(torch.sigmoid(logits), torch.tensor([[1, 0]]))
    assert value.item() == pytest.approx((-math.log(0.5 + eps) - math.log(0.25 + eps)) / 2,
                                         rel=1e-12)
    # the pseudo-positive (target 1 on the second entry) flips its term
    value = mime_an_loss(torch.sigmoid(logits), torch.tensor([[1, 1]]))
    assert value.item() == pytest.approx((-math.log(0.5 + eps) - math.log(0.75 + eps)) / 2,
                                         rel=1e-12)
    # an observed negative (-1) is a negative target
    value = mime_an_loss(torch.sigmoid(logits), torch.tensor([[-1, 0]]))
    assert value.item() == pytest.approx((-math.log(0.5 + eps) - math.log(0.25 + eps)) / 2,
                                         rel=1e-12)
    # KL(N(mu, s^2) || N(0, 1)) = (mu^2 + s^2 - 1 - 2 log s) / 2, averaged over coordinates
    mu = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    sigma = torch.tensor([[1.0, math.e]], dtype=torch.float64)
    assert vib_kl(mu, sigma).item() == pytest.approx((0.5 + (math.e ** 2 - 3) / 2) / 2,
                                                     rel=1e-12)
    # sigma = exp(clamp(s / 2, -6, 6))
    mu, sigma = vib_statistics(torch.tensor([[0.7, 2.0]]), 1)
    assert mu.item() == pytest.approx(0.7) and sigma.item() == pytest.approx(math.e)
    assert vib_statistics(torch.tensor([[0.0, 40.0]]), 1)[1].item() == pytest.approx(
        math.exp(6))


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(-1, 2, (4, 5), generator=g)
    assert torch.autograd.gradcheck(
        lambda x: mime_an_loss(torch.sigmoid(x), targets), (logits,))
    stats = (torch.rand(4, 5, 6, dtype=torch.float64, generator=g) * 4 - 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda s: vib_kl(*vib_statistics(s, 3)), (stats,))
    assert torch.autograd.gradcheck(
        lambda x, s: _mime_step_loss(x, targets, s.reshape(4, 5, 4), beta=0.3),
        (logits, stats.detach()[..., :4].reshape(4, 20).clone().requires_grad_()))


# ---- the model -----------------------------------------------------------------------------------
def test_model_draws_in_training_and_uses_mu_in_eval():
    model = MIMEModel(None, 3, in_channels=6, dim=8, heads=2, ffn=16, z_dim=4, samples=5,
                      dropout=0.0, seed=1)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(0))
    model.eval()
    a, mu, sigma = model.forward_all(x)
    assert torch.equal(a, model(x))  # deterministic: z = mu
    assert torch.allclose(a, model.classify(mu))
    model.train()
    torch.manual_seed(0)
    b = model(x)
    torch.manual_seed(0)
    assert torch.equal(b, model(x)) and not torch.allclose(a, b)  # drawn from torch's RNG
    off = MIMEModel(None, 3, in_channels=6, dim=8, heads=2, ffn=16, z_dim=4, vib=False,
                    dropout=0.0, seed=1).train()
    assert torch.allclose(off(x), a)  # same seed, same weights; without vib z = mu
    # a feature vector is a 1 x 1 map
    assert torch.allclose(off(x), off(x[:, :, None, None]))
    # LAC's classifier on d is not MIME's and does not train
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "weight" in trainable and "net.head.weight" not in trainable


def test_config_validation_and_ablations():
    assert config_of({"ablation": "an"}) == MIMEConfig(vib=False, pseudo_labels=False)
    assert config_of({"ablation": "an", "theta": 0.9}).theta == 0.9
    assert set(ABLATIONS) == {"an", "vib", "an_pl", "mime"}
    with pytest.raises(ValueError, match="theta"):
        MIMEConfig(theta=1.5)
    with pytest.raises(ValueError, match="warmup_epoch"):
        MIMEConfig(warmup_epoch=0)
    with pytest.raises(ValueError, match="train_backbone"):
        MIMEConfig(train_backbone=True)
    with pytest.raises(ValueError, match="unknown MIME ablation"):
        config_of({"ablation": "lac"})
    with pytest.raises(ValueError, match="unknown MIME option"):
        MIMEConfig.from_dict({"thta": 0.9})


# ---- runs on feature vectors ---------------------------------------------------------------------
OPTIONS = {"dim": 8, "heads": 2, "ffn": 16, "z_dim": 4, "samples": 2, "theta": 0.6,
           "warmup_epoch": 1}
CONFIG = dict(epochs=3, batch_size=32, lr=1e-3, seed=0)


@pytest.fixture(scope="module")
def yeast_small():
    torch.set_num_threads(1)
    return load_splits("yeast", subsample=0.2)


def test_runs_on_feature_vectors_and_resumes_to_the_same_result(yeast_small, tmp_path):
    check_inputs(get_method("mime"), yeast_small)  # an image method that takes vectors
    with pytest.raises(ValueError, match="feature vectors"):
        check_inputs(get_method("lac"), yeast_small)
    kw = dict(checkpoint_seconds=0, dataset_options={"subsample": 0.2}, **OPTIONS)
    whole = train_run("mime", yeast_small, "an", {}, TrainConfig(**CONFIG),
                      out=tmp_path / "whole", **kw)
    history = read_run(whole["run_dir"]).metrics()
    assert [r["pl_count"] > 0 for r in history][-1]  # the rule ran
    assert all(r["pl_count"] >= p["pl_count"] for p, r in zip(history, history[1:]))
    assert 0 < whole["test_map"] <= 100 and whole["views"] == "vectors"

    class Stop(Exception):
        pass

    def stop_after_two(record, model, loss):
        if record["epoch"] == 2:
            raise Stop

    with pytest.raises(Stop):
        train_run("mime", yeast_small, "an", {}, TrainConfig(**CONFIG), out=tmp_path / "cut",
                  on_epoch=stop_after_two, **kw)
    (cut,) = (tmp_path / "cut").iterdir()
    resumed = resume_run(cut)
    for key in ("best_epoch", "val_map", "test_map", "pl_count", "pl_precision"):
        assert resumed[key] == whole[key], key
    np.testing.assert_array_equal(np.load(cut / "pseudo_labels.npy"),
                                  np.load(os.path.join(whole["run_dir"], "pseudo_labels.npy")))
    a = torch.load(os.path.join(whole["run_dir"], "best.pt"), weights_only=True)["model"]
    b = torch.load(cut / "best.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    model, info = load_run_model(cut)
    assert info["inputs"] == "features" and info["in_features"] == yeast_small.train.x.shape[1]


def test_ablation_an_never_pseudo_labels_and_differs_from_mime(yeast_small):
    config = TrainConfig(**CONFIG)
    an = train_run("mime", yeast_small, "an", {}, config, ablation="an", **OPTIONS)
    full = train_run("mime", yeast_small, "an", {}, config, **OPTIONS)
    assert an["pl_count"] == 0 and full["pl_count"] > 0
    assert an["test_map"] != full["test_map"]


def test_spml_train_mode_mime_on_yeast(tmp_path, capsys):
    assert main(["train", "--mode", "mime", "--dataset", "yeast", "--data", "subsample=0.2",
                 "--epochs", "1", "--out", str(tmp_path), "--quiet", "--option", "dim=8",
                 "--option", "heads=2", "--option", "z_dim=4", "--option",
                 "ablation=vib"]) == 0
    (run,) = tmp_path.iterdir()
    config = read_run(run).config
    assert config["mime"]["pseudo_labels"] is False and config["mime"]["vib"] is True
    assert main(["train", "--mode", "mime", "--dataset", "yeast", "--epochs", "1", "--out",
                 str(tmp_path), "--option", "theta=2"]) == 2
    assert "theta" in capsys.readouterr().err


@pytest.mark.parametrize("views", ["eval", "images"])
def test_image_views_train_and_predict(views, tmp_path):
    from _image_toy import toy_splits
    from spmlkit.predict import predict_run

    torch.set_num_threads(1)
    splits = toy_splits(tmp_path / "toy")
    extra = {"train_backbone": True} if views == "images" else {}
    res = train_run("mime", splits, "an", {}, TrainConfig(epochs=2, batch_size=8, lr=1e-2,
                                                          seed=0, num_workers=0),
                    out=tmp_path / "runs", backbone="tiny_cnn", pretrained=False,
                    progress=False, cache_dir=str(tmp_path / "cache"),
                    backbone_options={"width": 4, "num_features": 8, "input_size": 16},
                    features={"num_workers": 0}, views=views, **OPTIONS, **extra)
    assert res["views"] == views and 0 < res["test_map"] <= 100
    best = torch.load(os.path.join(res["run_dir"], "best.pt"), weights_only=True)["model"]
    # fine-tuned end to end: the backbone's weights are part of the model; else the head only
    assert any(k.startswith("net.backbone.") for k in best) == (views == "images")
    pred = predict_run(res["run_dir"], list(splits.test.x))
    saved = np.load(os.path.join(res["run_dir"], "predictions.npz"))
    np.testing.assert_allclose(pred.probs, saved["probs_test"], rtol=1e-4, atol=5e-4)
