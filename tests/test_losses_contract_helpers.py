"""Shared loss helpers (spmlkit.losses.contract): the compute dtype, ``soft_bce`` against its
explicit log form, and the resizing of train-split-sized state when a state dict is loaded.

The reference for ``soft_bce`` is written here from the formula
``-(t log sigmoid(s) + (1 - t) log sigmoid(-s)) * w``, not with the code under test.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from spmlkit.losses.contract import as_compute, resize_state_on_load, soft_bce


# --- as_compute ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, expected", [(torch.float64, torch.float64),
                                             (torch.float32, torch.float32),
                                             (torch.float16, torch.float32),
                                             (torch.bfloat16, torch.float32)])
def test_as_compute_dtype(dtype, expected):
    x = torch.tensor([-2.5, 0.0, 1.25], dtype=dtype)
    out = as_compute(x)
    assert out.dtype == expected
    assert torch.equal(out.double(), x.double())  # promotion never changes a value


def test_as_compute_keeps_float64_on_the_graph():
    x = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    assert as_compute(x) is x


# --- soft_bce against the explicit log form -----------------------------------------------------
def _explicit(s, t, w):
    out = -(t * F.logsigmoid(s) + (1 - t) * F.logsigmoid(-s))
    return out if w is None else out * w


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
@pytest.mark.parametrize("target_kind", ["bool", "float"])
@pytest.mark.parametrize("weighted", [False, True])
def test_soft_bce_equals_explicit_log_form(dtype, atol, target_kind, weighted):
    gen = torch.Generator().manual_seed(0)
    s = (6 * torch.randn(4, 5, generator=gen)).to(dtype)
    if target_kind == "bool":
        target = torch.rand(4, 5, generator=gen) > 0.5
    else:
        target = torch.rand(4, 5, generator=gen).to(dtype)
    w = torch.rand(4, 5, generator=gen).to(dtype) if weighted else None
    got = soft_bce(s, target, eps=0.0, weight=w)
    assert got.dtype == dtype
    expected = _explicit(s, target.to(dtype), w)
    torch.testing.assert_close(got, expected, rtol=0, atol=atol)


# --- resize_state_on_load -----------------------------------------------------------------------
class _Toy(nn.Module):
    """A parameter and two buffers sized N x L (empty until "trained"), one fixed-size buffer."""

    def __init__(self):
        super().__init__()
        self.estimate = nn.Parameter(torch.empty(0, 0))
        self.register_buffer("mask", torch.zeros(0, 0, dtype=torch.bool))
        self.register_buffer("labels", torch.zeros(0, 0, dtype=torch.int8))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def fill(self, n, num_classes):
        gen = torch.Generator().manual_seed(n)
        self.estimate = nn.Parameter(torch.randn(n, num_classes, generator=gen))
        self.mask = torch.rand(n, num_classes, generator=gen) > 0.5
        self.labels = torch.randint(-1, 2, (n, num_classes), generator=gen, dtype=torch.int8)
        self.step.fill_(7)
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        resize_state_on_load(self, state_dict, prefix, ("estimate", "mask", "labels"))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


@pytest.mark.parametrize("fresh_size", [None, (2, 3)])  # empty (fresh) or of another size
def test_resize_state_round_trip(fresh_size):
    trained = _Toy().fill(5, 4)
    fresh = _Toy() if fresh_size is None else _Toy().fill(*fresh_size)
    fresh.load_state_dict(trained.state_dict())  # strict: every key matched
    for key, value in trained.state_dict().items():
        got = fresh.state_dict()[key]
        assert got.dtype == value.dtype and torch.equal(got, value), key
    # the kinds are kept: a parameter stays a trainable parameter, buffers stay buffers
    assert isinstance(fresh.estimate, nn.Parameter) and fresh.estimate.requires_grad
    assert [n for n, _ in fresh.named_parameters()] == ["estimate"]
    assert [n for n, _ in fresh.named_buffers()] == ["mask", "labels", "step"]


def test_resize_state_under_a_prefix_keeps_the_module_dtypes():
    outer = nn.Sequential(_Toy())
    source = nn.Sequential(_Toy().fill(3, 2))
    state = source.state_dict()
    state["0.estimate"] = state["0.estimate"].double()  # the module's dtype wins, as in PyTorch
    outer.load_state_dict(state)
    toy = outer[0]
    assert toy.estimate.dtype == torch.float32 and toy.estimate.shape == (3, 2)
    torch.testing.assert_close(toy.estimate.detach(), source[0].estimate.detach())
    assert toy.mask.dtype == torch.bool and toy.labels.dtype == torch.int8


def test_resize_state_ignores_missing_keys_and_same_shapes():
    toy = _Toy().fill(2, 2)
    before = toy.estimate
    resize_state_on_load(toy, {"estimate": torch.zeros(2, 2)}, "", ("estimate", "mask"))
    assert toy.estimate is before  # same shape: left for PyTorch to copy into
    assert toy.mask.shape == (2, 2)  # absent from the state dict: untouched
    with pytest.raises(RuntimeError, match="Missing key"):
        _Toy().load_state_dict({"estimate": torch.zeros(2, 2)})  # strict still reports the rest


# --- observed-label checks ----------------------------------------------------------------------
def test_the_issue_example_raises_and_observed_validated_skips_only_inside():
    """``create_loss("an")(logits, observed_with_a_3)`` used to compute silently; now it names
    the value. Within ``observed_validated`` the per-call check is skipped (for the engine,
    which validates the whole matrix once), for the wrapped base of a regularised loss too, and
    after the block (also after an error in it) the check is back."""
    from spmlkit.losses import create_loss, observed_validated

    logits = torch.zeros(2, 3)
    bad = torch.tensor([[1, 0, 0], [0, 3, 1]])
    for loss in (create_loss("an"), create_loss("an", reg="highrank:1e-3")):
        with pytest.raises(ValueError, match=r"found \[3\] \(first at batch row 1\)"):
            loss(logits, bad)
        with observed_validated(loss):
            assert torch.isfinite(loss(logits, bad))
        with pytest.raises(RuntimeError, match="inside"), observed_validated(loss):
            raise RuntimeError("inside")
        with pytest.raises(ValueError, match="observed labels must be"):
            loss(logits, bad)


@pytest.mark.parametrize("k", [-1.0, float("nan"), float("inf"), 7.0, "2"])
def test_train_info_refuses_a_k_outside_0_to_the_class_count(k):
    from spmlkit.losses.contract import TrainInfo

    with pytest.raises(ValueError, match=r"k \(expected positives per example\) must be a "
                                         r"number in \[0, 6\]"):
        TrainInfo(num_examples=10, num_classes=6, k=k)
    assert TrainInfo(num_examples=10, num_classes=6, k=6).k == 6


def test_epr_refuses_a_negative_weight_and_a_zero_k_from_the_data():
    from spmlkit.losses import create_loss
    from spmlkit.losses.contract import TrainInfo

    with pytest.raises(ValueError, match="loss 'epr': lam must be a finite number >= 0, got -1"):
        create_loss("epr", lam=-1)
    with pytest.raises(ValueError, match=r"loss 'epr': lam must be a finite number >= 0, got "
                                         r"'abc'"):
        create_loss("epr", lam="abc")  # was float()'s "could not convert string to float"
    with pytest.raises(ValueError, match="needs k > 0 .* mean is 0"):
        create_loss("epr").on_train_start(torch.zeros(4, 3), TrainInfo(4, 3, k=0.0))
