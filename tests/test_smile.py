"""SMILE (spmlkit.methods.smile): the kNN graph and its GCN normalisation, the loss parts by
hand and against the official code's values, gradcheck, the one-optimiser equivalence, resume
and the command line. The registry-generated tests (tests/test_methods.py) also train, resume,
predict and draw every registered method, smile included."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from spmlkit.cli import main
from spmlkit.loading import load_splits
from spmlkit.engine import TrainConfig, make_optimizer
from spmlkit.methods import resume_run, train_run
from spmlkit.methods.smile import (OFFICIAL_HPARAMS, GraphConvolution, SmileMLP,
                                   SmileObjective, an_prob_loss, batch_adjacency,
                                   beta_kl_official, beta_uniform_kl, enhanced_targets,
                                   enhancer_loss, gcn_propagation, knn_adjacency, knn_indices,
                                   resolve_hparams, weighted_bce)
from spmlkit.runs import read_run

torch.set_num_threads(1)


# ---- the graph ---------------------------------------------------------------------------------
def test_knn_matches_sklearn_nearest_neighbors():
    from sklearn.neighbors import NearestNeighbors

    x = np.random.RandomState(0).randn(60, 7)
    ours = knn_indices(x, 3).numpy()
    # kneighbors() without X: each row's neighbours among the others, nearest first
    theirs = NearestNeighbors(n_neighbors=3).fit(x).kneighbors(return_distance=False)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(knn_indices(x, 3, chunk=7).numpy(), ours)  # blocks of rows


def test_knn_by_hand_with_ties_to_the_lower_index():
    # points 0, 1, 3, 7 on a line (k=1); and a tie: -1 and 1 are both at distance 1 from 0
    assert knn_indices(np.array([[0.0], [1.0], [3.0], [7.0]]), 1).flatten().tolist() == \
        [1, 0, 1, 2]
    assert knn_indices(np.array([[0.0], [1.0], [3.0], [7.0]]), 2).tolist() == \
        [[1, 2], [0, 2], [1, 0], [2, 1]]
    assert knn_indices(np.array([[0.0], [-1.0], [1.0]]), 1)[0].item() == 1
    assert knn_indices(np.array([[0.0], [1.0], [-1.0]]), 1)[0].item() == 1


@pytest.mark.parametrize("k", [0, 4, 2.5])
def test_knn_rejects_a_bad_k(k):
    with pytest.raises(ValueError, match="k \\(neighbours per row\\)"):
        knn_indices(np.zeros((4, 2)), k)


def test_gcn_propagation_by_hand():
    """Edges 0->1, 1->0, 2->1, 3->2 (k=1 on 0, 1, 3, 7): out-degrees 1; in-degrees 1, 2, 1 and
    0 (clamped to 1). P[j, i] = 1 / sqrt(outdeg(i) indeg(j)); row 3 is empty (bias only)."""
    nb = knn_indices(np.array([[0.0], [1.0], [3.0], [7.0]]), 1)
    p = gcn_propagation(nb).to_dense()
    r = 1 / math.sqrt(2)
    expected = torch.tensor([[0, 1, 0, 0], [r, 0, r, 0], [0, 0, 0, 1], [0, 0, 0, 0]],
                            dtype=torch.float32)
    torch.testing.assert_close(p, expected)
    # = D_in^-1/2 A^T D_out^-1/2 from the dense adjacency
    a = knn_adjacency(nb)
    din = a.sum(0).clamp_min(1).rsqrt()
    dout = a.sum(1).clamp_min(1).rsqrt()
    torch.testing.assert_close(p, din[:, None] * a.T * dout[None, :])


def test_graph_convolution_is_dgl_graphconv_norm_both():
    """The layer against DGL's GraphConv(norm="both") written as per-edge message passing:
    h_j = b + sum over edges i->j of (x_i W) / sqrt(outdeg(i) indeg(j)), degrees clamped at
    1, for both orders of the product (in > out and in <= out)."""
    rng = np.random.RandomState(1)
    x = torch.tensor(rng.randn(12, 5))
    nb = knn_indices(x, 3)
    for out_features in (2, 8):
        torch.manual_seed(0)
        layer = GraphConvolution(5, out_features).double()
        assert torch.count_nonzero(layer.bias) == 0  # DGL's zero bias
        with torch.no_grad():
            layer.bias.copy_(torch.randn(out_features, dtype=torch.float64))
        got = layer(gcn_propagation(nb, dtype=torch.float64), x)
        out_deg = torch.full((12,), 3.0, dtype=torch.float64)
        in_deg = torch.bincount(nb.flatten(), minlength=12).double().clamp_min(1)
        want = layer.bias.detach().repeat(12, 1)
        xw = x @ layer.weight.detach()
        for i in range(12):
            for j in nb[i].tolist():
                want[j] += xw[i] / torch.sqrt(out_deg[i] * in_deg[j])
        torch.testing.assert_close(got.detach(), want)


def test_batch_adjacency_is_the_block_of_the_dense_adjacency():
    nb = knn_indices(np.random.RandomState(2).randn(30, 4), 3)
    idx = torch.tensor([5, 0, 17, 3, 29, 12, 6])
    torch.testing.assert_close(batch_adjacency(nb, idx), knn_adjacency(nb)[idx][:, idx])


# ---- the loss parts by hand --------------------------------------------------------------------
def nl(p):
    return -math.log(p + 1e-5)


def test_weighted_bce_by_hand():
    probs = torch.tensor([[0.9, 0.2, 0.6]])
    obs = torch.tensor([[1, 0, -1]])
    target = torch.tensor([[0.8, 0.3, 0.1]])
    e = [0.8 * nl(0.9) + 0.2 * nl(0.1), 0.3 * nl(0.2) + 0.7 * nl(0.8),
         0.1 * nl(0.6) + 0.9 * nl(0.4)]
    # bias: the unobserved entry over L - 1 = 2; the observed negative is not scaled
    assert weighted_bce(probs, obs, target, bias=True).item() == \
        pytest.approx((e[0] + e[1] / 2 + e[2]) / 3, rel=1e-6)
    assert weighted_bce(probs, obs, target, bias=False, rate=0.1).item() == \
        pytest.approx((e[0] + e[1] * 0.1 + e[2]) / 3, rel=1e-6)


def test_an_prob_loss_and_targets_by_hand():
    probs = torch.tensor([[0.9, 0.2], [0.3, 0.6]])
    obs = torch.tensor([[1, 0], [-1, 1]])
    assert an_prob_loss(probs, obs).item() == \
        pytest.approx((nl(0.9) + nl(0.8) + nl(0.7) + nl(0.6)) / 4, rel=1e-6)
    d = torch.tensor([[0.8, 0.2], [0.4, 0.1]], requires_grad=True)
    t = enhanced_targets(d, obs, p=0.05, mu=0.25)
    # positives D2 = 1, unobserved p, observed negatives 0; d detached
    torch.testing.assert_close(t, torch.tensor([[0.25 * 0.8 + 0.75, 0.25 * 0.2 + 0.75 * 0.05],
                                                [0.25 * 0.4, 0.25 * 0.1 + 0.75]]))
    assert not t.requires_grad


def test_beta_kl_official_by_hand():
    # d = 1/2, eps = 0: 2 lgamma(1/2) + 2 (1/2 - 1) digamma(1/2) = ln(pi) + gamma + 2 ln 2
    euler = 0.5772156649015329
    value = beta_kl_official(torch.tensor([0.5], dtype=torch.float64), eps=0.0).item()
    assert value == pytest.approx(math.log(math.pi) + euler + 2 * math.log(2), rel=1e-12)


def test_beta_uniform_kl_is_the_kl_divergence():
    d = torch.tensor([0.05, 0.3, 0.5, 0.9], dtype=torch.float64)
    a, b = d + 1e-6, 1 - d + 1e-6
    ref = torch.distributions.kl_divergence(torch.distributions.Beta(a, b),
                                            torch.distributions.Beta(torch.ones_like(a),
                                                                     torch.ones_like(b)))
    assert beta_uniform_kl(d).item() == pytest.approx(ref.mean().item(), rel=1e-10)
    # the official term differs from it (module docstring)
    assert abs(beta_kl_official(d).item() - ref.mean().item()) > 1.0


# ---- the official code's values ----------------------------------------------------------------
# Pinned from the loss functions of palm-ml/smile train_smile2.py at commit
# 49405dbc8b07479a26ebad0c8984f419b6102010 (weighted_bce_loss, loss_an, beta_kl_loss,
# vae_loss; run on these float64 inputs in a throw-away script, torch 2.13 CPU).
OBS = [[1, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0]]
S = [[0.9, 0.2, 0.6, 0.05], [0.3, 0.5, 0.7, 0.1], [0.15, 0.8, 0.4, 0.25]]
D1 = [[0.8, 0.1, 0.3, 0.2], [0.4, 0.35, 0.9, 0.05], [0.2, 0.6, 0.5, 0.45]]
X = [[0.5, -1.0], [2.0, 0.0], [-0.5, 1.5]]
X_REC = [[0.4, -0.8], [1.5, 0.2], [0.0, 1.0]]
Y_REC = [[0.7, 0.2, 0.1, 0.3], [0.2, 0.1, 0.95, 0.4], [0.3, 0.55, 0.2, 0.1]]
G_A = [[0, 1, 0], [1, 0, 1], [0, 0, 0]]


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def test_loss_parts_equal_the_official_values():
    obs, s, d1 = torch.tensor(OBS), t64(S), t64(D1)
    target = enhanced_targets(d1, obs, p=0.05, mu=0.5)
    assert weighted_bce(s, obs, target, bias=True).item() == \
        pytest.approx(0.2301310270188295, rel=1e-12)
    assert weighted_bce(s, obs, target, bias=False, rate=0.1).item() == \
        pytest.approx(0.14046672458478662, rel=1e-12)
    assert an_prob_loss(s, obs).item() == pytest.approx(0.3326618975862438, rel=1e-12)
    assert beta_kl_official(d1).item() == pytest.approx(7.097869969046852, rel=1e-12)
    y_rec = t64(Y_REC)
    args = (d1, obs, t64(X), t64(X_REC), y_rec, t64(G_A), y_rec @ y_rec.T)
    total, parts = enhancer_loss(*args)  # gamma 0.001, delta 1 (the official defaults)
    assert total.item() == pytest.approx(7.434606645685976, rel=1e-12)
    assert parts["align"].item() == pytest.approx(0.3359472363151701, rel=1e-12)
    assert (total - parts["align"]).item() == pytest.approx(7.098659409370806, rel=1e-12)
    assert enhancer_loss(*args, gamma=0.5, delta=0.25)[0].item() == \
        pytest.approx(2.505134890553962, rel=1e-12)


# ---- gradcheck ---------------------------------------------------------------------------------
def test_gradcheck_loss_parts_float64():
    from torch.autograd import gradcheck

    obs = torch.tensor(OBS)
    probs = t64(S).requires_grad_()
    target = t64(D1)
    assert gradcheck(lambda p: weighted_bce(p, obs, target, bias=True), (probs,))
    assert gradcheck(lambda p: weighted_bce(p, obs, target, bias=False, rate=0.3), (probs,))
    assert gradcheck(lambda p: an_prob_loss(p, obs), (probs,))
    d = t64(D1).requires_grad_()
    assert gradcheck(beta_kl_official, (d,))
    assert gradcheck(beta_uniform_kl, (d,))
    x, g_a = t64(X), t64(G_A)
    x_rec, y_rec = t64(X_REC).requires_grad_(), t64(Y_REC).requires_grad_()
    for kl in ("official", "exact"):
        assert gradcheck(lambda d_, xr, yr: enhancer_loss(d_, obs, x, xr, yr, g_a, yr @ yr.T,
                                                          gamma=0.3, delta=0.7, kl=kl)[0],
                         (d, x_rec, y_rec))


def test_gradcheck_graph_convolution_float64():
    from torch.autograd import gradcheck

    x = torch.randn(10, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    prop = gcn_propagation(knn_indices(x, 3), dtype=torch.float64)
    for out_features in (2, 6):
        layer = GraphConvolution(4, out_features).double()
        assert gradcheck(lambda h, w, b: torch.func.functional_call(
            layer, {"weight": w, "bias": b}, (prop, h)),
            (x.clone().requires_grad_(), layer.weight.detach().clone().requires_grad_(),
             layer.bias.detach().clone().requires_grad_()))


# ---- the objective: one optimiser = the official two ---------------------------------------
def tiny_problem(seed=0, n=24, dim=5, num_classes=4):
    rng = np.random.RandomState(seed)
    x = torch.tensor(rng.randn(n, dim), dtype=torch.float32)
    obs = torch.zeros(n, num_classes, dtype=torch.int8)
    obs[torch.arange(n), torch.tensor(rng.randint(0, num_classes, n))] = 1
    return x, obs


def make_pair(x, num_classes, seed=0):
    torch.manual_seed(seed)
    model = SmileMLP(x.shape[1], num_classes)
    objective = SmileObjective(x, knn_indices(x, 3), num_classes, num_classes, p=0.05, mu=0.5,
                               bias=False, rate=0.1)
    return model, objective


def test_the_classifier_and_enhancer_losses_do_not_reach_each_other():
    x, obs = tiny_problem()
    model, objective = make_pair(x, 4)
    idx = torch.tensor([3, 0, 7, 11, 20])
    torch.manual_seed(5)
    total = objective(model(x[idx]), obs[idx], index=idx)
    grads = torch.autograd.grad(total, list(model.parameters()) + list(objective.parameters()))
    n_model = len(list(model.parameters()))
    # the same step's parts alone
    torch.manual_seed(5)
    mat, le = objective.entries(model(x[idx]), obs[idx], idx)
    cls_grads = torch.autograd.grad(mat.mean(), list(model.parameters()) +
                                    list(objective.parameters()), allow_unused=True)
    assert all(g is None for g in cls_grads[n_model:])  # D is detached
    for g, c in zip(grads[:n_model], cls_grads[:n_model]):
        torch.testing.assert_close(g, c)
    torch.manual_seed(5)
    mat, le = objective.entries(model(x[idx]), obs[idx], idx)
    le_grads = torch.autograd.grad(le, list(objective.parameters()))
    for g, c in zip(grads[n_model:], le_grads):
        torch.testing.assert_close(g, c)
    assert total.item() == pytest.approx(mat.mean().item() + le.item(), rel=1e-6)


def test_one_adam_over_both_equals_the_official_two_adams():
    x, obs = tiny_problem(1)
    ours, ours_obj = make_pair(x, 4)
    theirs, theirs_obj = make_pair(x, 4)
    opt = make_optimizer(ours, ours_obj, 1e-2)
    mlp_opt = torch.optim.Adam(theirs.parameters(), lr=1e-2)
    gcn_opt = torch.optim.Adam(theirs_obj.parameters(), lr=1e-2)
    for step, idx in enumerate(torch.randperm(24, generator=torch.Generator().manual_seed(0))
                               .split(8)):
        torch.manual_seed(step)
        value = ours_obj(ours(x[idx]), obs[idx], index=idx)
        opt.zero_grad()
        value.backward()
        opt.step()
        torch.manual_seed(step)
        mat, le = theirs_obj.entries(theirs(x[idx]), obs[idx], idx)
        mlp_opt.zero_grad()
        mat.mean().backward(retain_graph=True)
        mlp_opt.step()
        gcn_opt.zero_grad()
        le.backward()
        gcn_opt.step()
    for a, b in zip(list(ours.parameters()) + list(ours_obj.parameters()),
                    list(theirs.parameters()) + list(theirs_obj.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ---- runs --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def yeast_small():
    return load_splits("yeast", subsample=0.2)


class Stop(Exception):
    pass


def test_resume_equals_the_uninterrupted_run_with_the_enhancer_state(yeast_small, tmp_path):
    config = TrainConfig(epochs=3, batch_size=16, lr=1e-2, seed=4)
    opts = {"subsample": 0.2}
    whole = train_run("smile", yeast_small, "an", {}, config, out=tmp_path / "whole",
                      checkpoint_seconds=0, dataset_options=opts)

    def stop(record, model, loss):
        if record["epoch"] == 2:
            raise Stop

    with pytest.raises(Stop):
        train_run("smile", yeast_small, "an", {}, config, out=tmp_path / "cut",
                  checkpoint_seconds=0, dataset_options=opts, on_epoch=stop)
    (cut,) = (tmp_path / "cut").iterdir()
    resumed = resume_run(cut)
    for key in ("best_epoch", "val_map", "test_map", "enhanced_recovery_map"):
        assert resumed[key] == whole[key], key
    a = torch.load(os.path.join(whole["run_dir"], "best.pt"), weights_only=True)
    b = torch.load(cut / "best.pt", weights_only=True)
    for part in ("model", "enhancer"):
        assert set(a[part]) == set(b[part])
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part
    ha, hb = read_run(whole["run_dir"]).metrics(), read_run(cut).metrics()
    assert [h["le_loss"] for h in ha] == [h["le_loss"] for h in hb]
    assert [h["train_loss"] for h in ha] == [h["train_loss"] for h in hb]
    np.testing.assert_array_equal(np.load(os.path.join(whole["run_dir"], "enhanced_labels.npy")),
                                  np.load(cut / "enhanced_labels.npy"))
    # the record's parts add up: train_loss = cls_loss + le_loss
    for h in ha:
        assert h["train_loss"] == pytest.approx(h["cls_loss"] + h["le_loss"], rel=1e-5)


def test_a_run_is_seeded(yeast_small):
    config = TrainConfig(epochs=2, batch_size=16, lr=1e-2, seed=1)
    a = train_run("smile", yeast_small, "an", {}, config)
    b = train_run("smile", yeast_small, "an", {}, config)
    c = train_run("smile", yeast_small, "an", {}, TrainConfig(epochs=2, batch_size=16, lr=1e-2,
                                                              seed=2))
    assert a["test_map"] == b["test_map"] != c["test_map"]


def test_official_hyperparameters_per_dataset():
    defaults = {"neighbours": 3, "gamma": 1e-3, "delta": 1.0, "temperature": 1.0,
                "kl": "official", "hidden": None}
    assert resolve_hparams(defaults, "yeast") == {**defaults, "p": 0.05, "mu": 0.5,
                                                   "bias": False, "rate": 0.1}
    assert resolve_hparams(defaults, "mydata") == {**defaults, "p": 0.5, "mu": 0.5,
                                                    "bias": True, "rate": 1.0}
    assert resolve_hparams({**defaults, "p": 0.2}, "yeast")["p"] == 0.2
    assert resolve_hparams({**defaults, "bias": 1}, "yeast")["bias"] is True
    assert len(OFFICIAL_HPARAMS) == 12


def test_spml_train_mode_smile_uses_the_official_settings(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["train", "--mode", "smile", "--dataset", "yeast", "--data", "subsample=0.2",
                 "--epochs", "1", "--option", "p=0.1", "--out", str(out), "--quiet"]) == 0
    assert "an smile" in capsys.readouterr().out
    (run,) = out.iterdir()
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["lr"] == 1e-3 and config["train"]["batch_size"] == 16
    assert config["smile"]["p"] == 0.1 and config["smile"]["rate"] == 0.1  # yeast's rate
    assert config["options"]["p"] == 0.1


@pytest.mark.parametrize("argv, expect", [
    (["--loss", "role"], "takes only the loss(es) ['an'], got 'role'"),
    (["--option", "nope=1"], "['nope']"),
    (["--option", "p=2"], "p must be in [0, 1], got 2"),
    (["--option", "kl=wrong"], "kl must be one of"),
    (["--option", "mu=abc"], "mu must be a number, got 'abc'"),
    (["--option", "bias=maybe"], "bias must be true or false, got 'maybe'"),
])
def test_spml_train_mode_smile_bad_input_is_one_error_line(argv, expect, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["train", "--mode", "smile", "--dataset", "yeast", "--epochs", "1", "--out",
                 str(out), "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and lines[0].startswith("spml train: error:") and expect in lines[0]
    assert not out.exists() or not any(out.iterdir())  # refused before a run folder


def test_a_run_on_backbone_features_predicts_from_images(tmp_path):
    """SMILE trained with --backbone (cached features of images) rebuilds the backbone under its
    MLP classifier and predicts from image files as it scored the stored features."""
    from _image_toy import make_images
    from spmlkit.predict import predict_run

    names = ["blue", "green", "red"]
    paths, y = make_images(tmp_path / "imgs", 40, seed=2)
    (tmp_path / "list.csv").write_text("".join(
        f"{p},{';'.join(n for n, f in zip(names, r) if f)}\n" for p, r in zip(paths, y)))
    assert main(["train", "--mode", "smile", "--dataset", "csv", "--data",
                 f"path={tmp_path / 'list.csv'}", "--backbone", "tiny_cnn", "--cache-dir",
                 str(tmp_path / "cache"), "--epochs", "2", "--out", str(tmp_path / "runs"),
                 "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    test_paths = load_splits("csv", path=str(tmp_path / "list.csv")).test.x
    pred = predict_run(run, test_paths)
    saved = np.load(run / "predictions.npz")
    np.testing.assert_allclose(pred.probs, saved["probs_test"], rtol=1e-4, atol=1e-6)
