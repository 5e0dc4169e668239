"""BoostLU (Kim et al., CVPR 2023): the operation, the CAM head, the ``boostlu`` training
method on feature vectors (1 x 1 maps) and its parity with the official code. The method's
image path (cached feature maps of a backbone) also runs in the generated tests of
tests/test_methods.py (train, resume, predict)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from spmlkit.cli import main
from spmlkit.loading import load_splits
from spmlkit.engine import TrainConfig
from spmlkit.losses import create_loss
from spmlkit.methods import list_methods, resume_run, train_run
from spmlkit.models.heads import BoostLUHead, boosted_logits, boostlu
from spmlkit.runs import read_run

# ---- hand-computed values ----------------------------------------------------------------------


def test_boostlu_scales_only_the_positive_part():
    x = torch.tensor([-3.0, -0.5, 0.0, 0.25, 2.0])
    assert boostlu(x, 5.0).tolist() == [-3.0, -0.5, 0.0, 1.25, 10.0]
    assert boostlu(x, 1.0).tolist() == x.tolist()


def test_boosted_logits_average_the_boosted_map():
    # B = 1, L = 2, a 2 x 2 map per class
    cam = torch.tensor([[[[1.0, -1.0], [2.0, -4.0]], [[-1.0, -2.0], [-3.0, -2.0]]]])
    # class 0: (5 - 1 + 10 - 4) / 4 = 2.5; class 1 all negative: its plain mean -2
    assert boosted_logits(cam, 5.0).tolist() == [[2.5, -2.0]]
    assert boosted_logits(cam, 1.0).tolist() == [[-0.5, -2.0]]


def test_boost_before_pooling_is_not_the_boosted_pooled_map():
    # the mean of the class-0 map above is -0.5 (negative): boosting after pooling would leave
    # it at -0.5, BoostLU on the map gives 2.5
    cam = torch.tensor([[[[1.0, -1.0], [2.0, -4.0]]]])
    assert boostlu(cam.mean(dim=(2, 3)), 5.0).item() == -0.5
    assert boosted_logits(cam, 5.0).item() == 2.5


def test_head_on_a_map_by_hand():
    head = BoostLUHead(2, 1, alpha=3.0)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, -1.0]]))
        head.bias.fill_(0.5)
    # 1 x 2 map with channels (c0, c1) per cell: (2, 0) and (0, 3)
    x = torch.tensor([[[[2.0, 0.0]], [[0.0, 3.0]]]])
    # CAM cells: 2 - 0 + 0.5 = 2.5 -> 7.5; 0 - 3 + 0.5 = -2.5; mean 2.5
    assert head.cam(x).tolist() == [[[[2.5, -2.5]]]]
    assert head(x).tolist() == [[2.5]]
    # vectors are 1 x 1 maps: W x + b = 0.5 + 1 - 2 = -0.5 (kept), 3 - 0 + 0.5 = 3.5 -> 10.5
    v = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    assert head(v).tolist() == [[-0.5], [10.5]]
    assert torch.equal(head(v), head(v[:, :, None, None]))


def test_head_init_is_the_linear_heads_and_alpha_one_is_linear():
    from spmlkit.engine import make_linear_head

    head = BoostLUHead(6, 4, alpha=1.0, seed=3)
    lin = make_linear_head(6, 4, 3)
    assert torch.equal(head.weight, lin.weight) and torch.equal(head.bias, lin.bias)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(head(x), lin(x))
    # on a map with alpha = 1 the head is the linear head on the average-pooled features
    m = torch.randn(5, 6, 3, 3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(head(m), lin(m.mean(dim=(2, 3))), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("alpha", [0, -1.0, float("nan"), float("inf"), True, "5"])
def test_bad_alpha_is_refused(alpha):
    with pytest.raises(ValueError, match="alpha"):
        BoostLUHead(3, 2, alpha=alpha)


def test_cam_of_a_wrong_map_is_named():
    with pytest.raises(ValueError, match="B x 3 x h x w"):
        BoostLUHead(3, 2).cam(torch.zeros(1, 4, 2, 2))


# ---- gradcheck (float64) -----------------------------------------------------------------------


def _away_from_zero(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=torch.float64) + 0.1   # |x| >= 0.1: no kink
    sign = torch.where(torch.rand(shape, generator=g, dtype=torch.float64) < 0.5, -1.0, 1.0)
    return x * sign


def test_gradcheck_boost_and_pooling():
    cam = _away_from_zero((2, 3, 4, 4), 0).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda c: boosted_logits(c, 5.0), (cam,))
    assert torch.autograd.gradgradcheck(lambda c: boosted_logits(c, 2.5), (cam,))


def test_gradcheck_head_weights_and_inputs():
    head = BoostLUHead(3, 2, alpha=5.0).double()
    x = torch.randn(2, 3, 3, 3, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(4)).requires_grad_(True)
    w = head.weight.detach().clone().requires_grad_(True)
    b = head.bias.detach().clone().requires_grad_(True)

    def f(x, w, b):
        cam = torch.nn.functional.conv2d(x, w[:, :, None, None], b)
        return boosted_logits(cam, 5.0)

    assert torch.autograd.gradcheck(f, (x, w, b))
    torch.testing.assert_close(f(x, w, b), head(x))


# ---- parity with the official code --------------------------------------------------------------
# Computed by running the official functions unchanged (a throw-away script outside the repo):
# youngwk/BridgeGapExplanationPAMC @ 3f3fbaa2e129a5b5d3a3c28cbdaaeeffffb6f701,
# models.py (GlobalAvgPool2d; ImageClassifier.forward's three lines: onebyone_conv, the BoostLU
# torch.where, F.adaptive_avg_pool2d) and losses.py (loss_an, compute_batch_loss with
# largelossmod_scheme 'LL-R', clean_rate decreased by delta_rel after every epoch as train.py
# does), in float64 on the fixed inputs of _official_inputs() (the backbone replaced by the
# identity). Keys: (alpha, official 1-based epoch, delta_rel in percent).
OFFICIAL = {
    (5.0, 1, 0.5): {
        'logits': [  # 4 x 5, row-major
          1.299534866585, 6.592867961542, 1.931120861261, -0.336338201649, 5.873681333785,
          3.904272418799, -0.587543203581, 3.551457655568, -0.698545269148, -0.261849245011,
          1.615305936996, 1.990618774729, 3.582099454216, 1.783404944983, -0.244256730645,
          4.12292581208, 2.565403668263, 2.900557396274, 4.042632739752, -0.665576490012
        ],
        'loss': 2.1805313653464413,
        'grad_weight': [
          0.201142186748, -0.080794054614, -0.147724867149, -0.143715961186, -0.072144375096,
          0.219032386025, -0.211386730615, -0.242689176141, -0.164854145283, -0.163891709752,
          0.160485140811, -0.005720271841, -0.055557935362, -0.198338442408, 0.236585173099
        ],
        'grad_bias': [
          0.405648031296, 0.409147399187, 0.413409778038, 0.340438651858, 0.220802561196
        ],
        'grad_feats': [
          -0.02101908808, -0.058100084828, -0.051976572952, -0.075733091288, -0.003386752949,
          0.045687952957, 0.013145321815, 0.045991509013, -0.018700146841, 0.21889015151,
          0.166295964379, 0.218352667928, 0.094430873702, -0.002152004486, 0.094430873702,
          0.094430873702, 0.007303552432, 0.022077069246, 0.007303552432, 0.007303552432,
          0.02337489586, 0.093230756033, 0.02337489586, 0.02337489586, 0.088354445424,
          -0.011077159934, 0.019701123117, 0.019701123117, -0.037372034664, 0.037745532498,
          -0.036190152732, -0.036190152732, -0.065302396947, 0.012470691933, -0.067395065245,
          -0.067395065245, -0.044267458974, -0.036740018961, 0.097817214435, 0.036724362822,
          0.10776039017, 0.111285984828, -0.021798254893, 0.106366098275, 0.103654142247,
          0.053642543514, -0.054805667211, 0.106122908683
        ],
        'selected': [[], []],
    },
    (5.0, 2, 10.0): {
        'logits': [  # 4 x 5, row-major
          1.299534866585, 6.592867961542, 1.931120861261, -0.336338201649, 5.873681333785,
          3.904272418799, -0.587543203581, 3.551457655568, -0.698545269148, -0.261849245011,
          1.615305936996, 1.990618774729, 3.582099454216, 1.783404944983, -0.244256730645,
          4.12292581208, 2.565403668263, 2.900557396274, 4.042632739752, -0.665576490012
        ],
        'loss': 1.5569950145801759,
        'grad_weight': [
          0.201142186748, -0.080794054614, -0.147724867149, -0.087752602791, 0.111480172066,
          -0.006027557803, -0.211386730615, -0.242689176141, -0.164854145283, -0.163891709752,
          0.160485140811, -0.005720271841, 0.000324928123, -0.014978011654, 0.011848944291
        ],
        'grad_bias': [
          0.405648031296, 0.209421045246, 0.413409778038, 0.340438651858, 0.021363483701
        ],
        'grad_feats': [
          -0.01052540768, -0.005631682828, 0.000491829048, -0.023264689288, -0.013033543019,
          -0.002545997393, -0.035088628534, -0.002242441336, -0.065103829673, -0.013128262651,
          -0.065722449782, -0.013665746233, 0.094430873702, -0.002152004486, 0.094430873702,
          0.094430873702, 0.007303552432, 0.022077069246, 0.007303552432, 0.007303552432,
          0.02337489586, 0.093230756033, 0.02337489586, 0.02337489586, 0.088354445424,
          -0.011077159934, 0.019701123117, 0.019701123117, -0.037372034664, 0.037745532498,
          -0.036190152732, -0.036190152732, -0.065302396947, 0.012470691933, -0.067395065245,
          -0.067395065245, -0.044267458974, -0.036740018961, 0.097817214435, 0.036724362822,
          0.10776039017, 0.111285984828, -0.021798254893, 0.106366098275, 0.103654142247,
          0.053642543514, -0.054805667211, 0.106122908683
        ],
        'selected': [[0, 0], [1, 4]],
    },
}


def _official_inputs():
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(4, 3, 2, 2, generator=g, dtype=torch.float64)
    weight = torch.randn(5, 3, 1, 1, generator=g, dtype=torch.float64) * 0.8
    bias = torch.tensor([0.3, -0.2, 0.1, 0.0, -0.4], dtype=torch.float64)
    labels = torch.tensor([[1, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 1, 0, 0, 0],
                           [0, 0, 0, 0, 1]])
    return feats, weight, bias, labels


@pytest.mark.parametrize("key", list(OFFICIAL))
def test_parity_with_the_official_boostlu_and_ll_r(key):
    alpha, official_epoch, delta_rel = key
    want = OFFICIAL[key]
    feats, weight, bias, labels = _official_inputs()
    head = BoostLUHead(3, 5, alpha=alpha).double()
    with torch.no_grad():
        head.weight.copy_(weight.view(5, 3))
        head.bias.copy_(bias)
    feats.requires_grad_(True)
    loss = create_loss("ll_r", delta_rel=delta_rel, k_rounding="official")
    loss.on_epoch_start(official_epoch - 1)          # the engine counts epochs from 0
    logits = head(feats)
    value = loss(logits, labels)
    value.backward()
    close = dict(rtol=0, atol=1e-6)
    np.testing.assert_allclose(logits.detach().flatten().numpy(), want["logits"], **close)
    np.testing.assert_allclose(value.item(), want["loss"], **close)
    np.testing.assert_allclose(head.weight.grad.flatten().numpy(), want["grad_weight"], **close)
    np.testing.assert_allclose(head.bias.grad.numpy(), want["grad_bias"], **close)
    np.testing.assert_allclose(feats.grad.flatten().numpy(), want["grad_feats"], **close)
    rows, cols = want["selected"]
    selected = torch.zeros(4, 5, dtype=torch.bool)
    selected[rows, cols] = True
    assert torch.equal(loss.last_selected, selected)


# ---- the training method -----------------------------------------------------------------------
CONFIG = dict(epochs=3, batch_size=16, lr=1e-2, seed=0)


@pytest.fixture(scope="module")
def yeast():
    torch.set_num_threads(1)
    return load_splits("yeast", subsample=0.2)


def test_registered_and_listed(capsys):
    assert "boostlu" in [m.name for m in list_methods()]
    main(["list", "methods"])
    line = next(l for l in capsys.readouterr().out.splitlines() if "boostlu" in l)
    assert "BoostLU" in line and "alpha" in line and "images or feature vectors" in line


def test_alpha_one_on_vectors_is_the_linear_mode(yeast):
    config = TrainConfig(**CONFIG)
    lin = train_run("linear", yeast, "ll_r", {"delta_rel": 0.5}, config)
    one = train_run("boostlu", yeast, "ll_r", {"delta_rel": 0.5}, config, alpha=1.0)
    assert one["test_map"] == lin["test_map"] and one["best_epoch"] == lin["best_epoch"]
    five = train_run("boostlu", yeast, "ll_r", {"delta_rel": 0.5}, config)
    assert five["alpha"] == 5.0 and five["inputs"] == "vectors" and five["map_shape"] == [103, 1, 1]
    assert five["test_map"] != lin["test_map"]      # the boost changes training


def test_vector_run_resumes_to_the_uninterrupted_result(yeast, tmp_path):
    class Stop(Exception):
        pass

    config = TrainConfig(**{**CONFIG, "epochs": 4})
    opts = dict(dataset_options={"subsample": 0.2}, checkpoint_seconds=0)
    whole = train_run("boostlu", yeast, "ll_r", {"delta_rel": 0.5}, config,
                      out=tmp_path / "whole", **opts)

    def stop(record, model, loss):
        if record["epoch"] == 2:
            raise Stop

    with pytest.raises(Stop):
        train_run("boostlu", yeast, "ll_r", {"delta_rel": 0.5}, config, out=tmp_path / "cut",
                  on_epoch=stop, **opts)
    (cut,) = (tmp_path / "cut").iterdir()
    assert read_run(cut).config["alpha"] == 5.0
    res = resume_run(cut)
    assert res["test_map"] == whole["test_map"] and res["best_epoch"] == whole["best_epoch"]
    a = np.load(cut / "predictions.npz")["probs_test"]
    b = np.load(whole["run_dir"] + "/predictions.npz")["probs_test"]
    assert np.array_equal(a, b)


def test_backbone_on_vectors_and_images_without_one_are_refused(yeast):
    with pytest.raises(ValueError, match="1 x 1 maps"):
        train_run("boostlu", yeast, "an", {}, TrainConfig(**CONFIG),
                  backbone="efficientnet_lite0")
    from _image_toy import toy_splits
    import tempfile
    from pathlib import Path

    images = toy_splits(Path(tempfile.mkdtemp()))
    with pytest.raises(ValueError, match="--backbone NAME"):
        train_run("boostlu", images, "an", {}, TrainConfig(**CONFIG))
    with pytest.raises(ValueError, match="alpha"):
        train_run("boostlu", yeast, "an", {}, TrainConfig(**CONFIG), alpha=-2)


def test_spml_train_boostlu_on_yeast(tmp_path, capsys):
    assert main(["train", "--mode", "boostlu", "--dataset", "yeast", "--loss", "ll_r",
                 "--hp", "delta_rel=0.5", "--epochs", "2", "--option", "alpha=3",
                 "--out", str(tmp_path), "--quiet"]) == 0
    (run,) = tmp_path.iterdir()
    cfg = read_run(run).config
    assert cfg["mode"] == "boostlu" and cfg["alpha"] == 3.0
    assert cfg["inputs"] == "vectors as 1 x 1 maps"


def test_vector_run_predicts_raw_features_as_it_scored_them(yeast, tmp_path):
    from spmlkit.loading import load_dataset
    from spmlkit.methods import load_run_model
    from spmlkit.predict import predict_run

    res = train_run("boostlu", yeast, "ll_r", {}, TrainConfig(**CONFIG), out=tmp_path,
                    dataset_options={"subsample": 0.2})
    new = tmp_path / "new.npy"
    np.save(new, load_dataset("yeast").test.x)         # raw: the run standardises them
    pred = predict_run(res["run_dir"], [str(new)])
    saved = np.load(f"{res['run_dir']}/predictions.npz")["probs_test"]
    np.testing.assert_allclose(pred.probs, saved, rtol=1e-4, atol=1e-5)
    model, info = load_run_model(res["run_dir"])
    assert isinstance(model, BoostLUHead) and model.alpha == 5.0
    assert info["inputs"] == "features" and info["in_features"] == 103


def test_eval_alpha_boosts_only_in_eval_mode():
    head = BoostLUHead(2, 1, alpha=1.0, eval_alpha=4.0)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0]]))
        head.bias.zero_()
    x = torch.tensor([[[[2.0, -1.0]], [[0.0, 0.0]]]])    # CAM cells 2 and -1
    assert head.train()(x).item() == 0.5                 # (2 - 1) / 2: no boost in training
    assert head.eval()(x).item() == 3.5                  # (8 - 1) / 2
    assert BoostLUHead(2, 1, alpha=3.0).eval().current_alpha == 3.0   # default: alpha


def test_eval_alpha_option_is_kept_by_the_run_and_its_model(yeast, tmp_path):
    from spmlkit.methods import load_run_model

    res = train_run("boostlu", yeast, "an", {}, TrainConfig(**CONFIG), out=tmp_path,
                    alpha=1.0, eval_alpha=5.0, dataset_options={"subsample": 0.2})
    assert res["eval_alpha"] == 5.0 and read_run(res["run_dir"]).config["eval_alpha"] == 5.0
    model, _ = load_run_model(res["run_dir"])
    assert model.alpha == 1.0 and model.eval_alpha == 5.0
    plain = train_run("linear", yeast, "an", {}, TrainConfig(**CONFIG))
    # 1 x 1 maps: the boost at inference is increasing, so no ranking (and no AP) changes
    assert res["test_map"] == pytest.approx(plain["test_map"], abs=1e-9)
