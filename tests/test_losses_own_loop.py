"""Every registered loss in a plain PyTorch loop (docs/guide/own-loop.md), generated from the
registry: forward, loss, backward, optimiser step and nothing else either trains exactly the
head that the engine (:func:`spmlkit.engine.fit_linear`, what ``spml train`` runs in linear
mode) trains, bit for bit, or raises a ``RuntimeError`` within the first epoch that names each
hook the loss depends on and the call that adds it. With the hooks that error names, the loop
trains the engine's head for every loss.

Also: the loss's own parameters left out of the optimiser (ROLE), a missed ``on_epoch_end`` /
``on_epoch_start`` midway, and ``torch.compile(loss, fullgraph=True)`` of every loss without
hooks or state (no graph break: ``forward`` reads no tensor value on the host).
"""
from __future__ import annotations

import copy
import re
import time

import numpy as np
import pytest
import torch
from torch import nn

from spmlkit.engine import TrainConfig, fit_linear
from spmlkit.labels import make_observed
from spmlkit.losses import LOSSES, HOOKS, TrainInfo, create_loss

NAMES = LOSSES.names()
N, D, L, B, EPOCHS, LR, SEED, K = 24, 5, 6, 8, 3, 0.05, 0, 1.0
#: hyperparameters that make a loss's hooks matter within EPOCHS (EM-APL's default warm-up, 5
#: epochs, would leave it plain EM)
HPARAMS = {"em_apl": {"warmup": 1}}
pytestmark = pytest.mark.filterwarnings("ignore:.*warmup.*num_epochs:UserWarning")


def _data():
    rng = np.random.RandomState(3)
    y = (rng.random_sample((N, L)) < 0.35).astype(np.uint8)
    y[np.arange(N), rng.randint(0, L, N)] = 1
    x = torch.as_tensor(rng.standard_normal((N, D)), dtype=torch.float32)
    z = torch.as_tensor(make_observed(y, "1p", seed=5)).to(torch.int8)
    scores = 1.0 / (1.0 + np.exp(-(3.0 * (2.0 * y - 1.0) + rng.standard_normal((N, L)))))
    return x, z, scores


X, Z, SCORES = _data()


def _loss(name):
    given = {"scores": SCORES} if getattr(LOSSES.get(name).factory, "needs_scores", False) \
        else {}
    return create_loss(name, **given, **HPARAMS.get(name, {}))


def _head():
    torch.manual_seed(SEED)
    return nn.Linear(D, L)


def _batches(gen):
    return torch.randperm(N, generator=gen).split(B)


def engine(name):
    """The head that fit_linear trains (the last epoch's: no validation set)."""
    model, _ = fit_linear(X, Z, _loss(name), TrainConfig(epochs=EPOCHS, batch_size=B, lr=LR,
                                                           seed=SEED), k=K, model=_head())
    return model


def plain_loop(name):
    """Forward, loss, backward, step; the engine's batches (a generator seeded with the seed,
    one permutation an epoch) and its optimiser (Adam with torch's fused kernel)."""
    loss, head = _loss(name), _head()
    opt = torch.optim.Adam(head.parameters(), lr=LR, fused=True)
    gen = torch.Generator().manual_seed(SEED)
    calls = 0
    for _ in range(EPOCHS):
        for idx in _batches(gen):
            calls += 1
            value = loss(head(X[idx]), Z[idx], index=idx)
            opt.zero_grad()
            value.backward()
            opt.step()
    return head, calls


def hooked_loop(name):
    """The loop of docs/guide/own-loop.md: every hook, the loss's parameter group."""
    loss, head = _loss(name), _head()
    loss.on_train_start(Z, TrainInfo(N, L, k=K, seed=SEED, num_epochs=EPOCHS))
    opt = torch.optim.Adam([{"params": head.parameters()}, *loss.param_groups(LR)], lr=LR,
                           fused=True)
    gen = torch.Generator().manual_seed(SEED)
    for epoch in range(EPOCHS):
        loss.on_epoch_start(epoch)
        for idx in _batches(gen):
            value = loss(head(X[idx]), Z[idx], index=idx) + loss.penalty(head)
            opt.zero_grad()
            value.backward()
            opt.step()
        train_logits = None
        if loss.needs_train_predictions:
            head.eval()
            with torch.no_grad():
                train_logits = head(X)
            head.train()
        loss.on_epoch_end(epoch, train_logits)
    return head


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(),
                                                 b.state_dict().values()))


OUTCOMES: dict[str, str] = {}


@pytest.mark.parametrize("name", NAMES)
def test_plain_loop_is_the_engine_or_says_which_hook(name):
    """No hook: the engine's head bit for bit when the loss needs none, else a RuntimeError at
    the first call (the second for ``penalty``, which must come between two calls) naming every
    hook the loss needs and how to call it."""
    needed = _loss(name).required_hooks()
    assert set(needed) <= set(HOOKS)
    if not needed:
        head, _ = plain_loop(name)
        assert _same(head, engine(name)), f"{name}: the plain loop differs from the engine"
        OUTCOMES[name] = "same"
        return
    with pytest.raises(RuntimeError) as err:
        plain_loop(name)
    msg = str(err.value)
    for hook in needed:
        assert hook in msg and f"loss.{hook}(" in msg, (name, hook, msg)
    assert "docs/guide/own-loop.md" in msg
    # raised at the first call (penalty: the second); the traceback's frames tell which call
    calls = [f.locals.get("calls") for f in err.traceback if "calls" in f.locals]
    assert calls and calls[-1] == (2 if needed == ("penalty",) else 1), (name, calls)
    OUTCOMES[name] = "error: " + ", ".join(needed)


@pytest.mark.parametrize("name", NAMES)
def test_the_hooks_the_error_names_give_the_engine_result(name):
    assert _same(hooked_loop(name), engine(name)), f"{name}: the hooked loop differs"


def test_outcomes_counted():
    """Every registered loss has its outcome (run after the generated tests above)."""
    missing = [n for n in NAMES if n not in OUTCOMES]
    if missing:
        pytest.skip(f"run with the generated tests; missing {missing}")
    same = sorted(n for n, o in OUTCOMES.items() if o == "same")
    raised = sorted(n for n, o in OUTCOMES.items() if o != "same")
    print(f"plain loop over {len(NAMES)} losses: {len(same)} identical to the engine {same}; "
          f"{len(raised)} raise naming their hooks {raised}")
    assert len(same) + len(raised) == len(NAMES) and same and raised


# ------------------------------------------------------------------ partial hooks -------------
def test_role_without_its_parameter_group_raises_after_an_epoch():
    """ROLE's label estimates get gradients but no optimiser steps them: the second epoch's
    first call raises, naming the parameter and param_groups."""
    loss, head = create_loss("role"), _head()
    loss.on_train_start(Z, TrainInfo(N, L, k=K, seed=SEED, num_epochs=EPOCHS))
    opt = torch.optim.Adam(head.parameters(), lr=LR)  # the loss's group is missing
    gen = torch.Generator().manual_seed(SEED)
    done = 0
    with pytest.raises(RuntimeError, match=r"label_logits.*not in the optimiser.*param_groups"):
        for _ in range(2):
            for idx in _batches(gen):
                value = loss(head(X[idx]), Z[idx], index=idx)
                opt.zero_grad()
                value.backward()
                opt.step()
                done += len(idx)
    assert done == N  # one epoch went through


def _role_rows_loop(step_estimator: bool):
    """The loop of docs/guide/own-loop.md for ROLE with estimator_update="rows": the head in
    Adam (torch's fused kernel, as the engine's), the estimator in a second optimiser,
    SparseAdam (or in none)."""
    loss, head = create_loss("role", estimator_update="rows"), _head()
    loss.on_train_start(Z, TrainInfo(N, L, k=K, seed=SEED, num_epochs=EPOCHS))
    opts = [torch.optim.Adam(head.parameters(), lr=LR, fused=True)]
    if step_estimator:
        opts.append(torch.optim.SparseAdam(loss.param_groups(LR)))
    gen = torch.Generator().manual_seed(SEED)
    for epoch in range(EPOCHS):
        loss.on_epoch_start(epoch)
        for idx in _batches(gen):
            value = loss(head(X[idx]), Z[idx], index=idx)
            for opt in opts:
                opt.zero_grad()
            value.backward()
            assert loss.label_logits.grad.is_sparse
            for opt in opts:
                opt.step()
        loss.on_epoch_end(epoch)
    return head, loss


def test_role_rows_with_sparse_adam_is_the_engine_bit_for_bit():
    """The estimator's row-wise gradient stepped by torch.optim.SparseAdam in a loop of your own
    trains what the engine (LeanAdam's lazy rows) trains, head and estimator, bit for bit."""
    head, loss = _role_rows_loop(step_estimator=True)
    ours = create_loss("role", estimator_update="rows")
    model, _ = fit_linear(X, Z, ours, TrainConfig(epochs=EPOCHS, batch_size=B, lr=LR,
                                                    seed=SEED), k=K, model=_head())
    assert _same(head, model)
    assert torch.equal(loss.label_logits, ours.label_logits)
    dense = create_loss("role")
    fit_linear(X, Z, dense, TrainConfig(epochs=EPOCHS, batch_size=B, lr=LR, seed=SEED), k=K,
               model=_head())
    assert not torch.equal(dense.label_logits, ours.label_logits)  # (another algorithm)


def test_role_rows_without_its_optimiser_names_sparse_adam():
    """ROLE "rows" whose estimator no optimiser steps: the check sees its sparse gradients
    arrive, and the error names SparseAdam (torch.optim.Adam refuses sparse gradients)."""
    with pytest.raises(RuntimeError, match=r"label_logits.*not in the optimiser.*"
                                           r"torch\.optim\.SparseAdam\(loss\.param_groups"):
        _role_rows_loop(step_estimator=False)


def test_role_with_gradient_accumulation_is_not_flagged():
    """Steps every second batch (gradient accumulation): the estimates do move."""
    loss, head = create_loss("role"), _head()
    loss.on_train_start(Z, TrainInfo(N, L, k=K, seed=SEED, num_epochs=EPOCHS))
    opt = torch.optim.Adam([{"params": head.parameters()}, *loss.param_groups(LR)], lr=LR)
    gen = torch.Generator().manual_seed(SEED)
    step = 0
    for _ in range(EPOCHS):
        for idx in _batches(gen):
            loss(head(X[idx]), Z[idx], index=idx).backward()
            step += 1
            if step % 2 == 0:
                opt.step()
                opt.zero_grad()


def test_an_epoch_without_its_end_or_start_raises():
    loss = _loss("em_apl")
    loss.on_train_start(Z, TrainInfo(N, L, num_epochs=EPOCHS))
    logits = torch.zeros(B, L, requires_grad=True)
    loss.on_epoch_start(0)
    loss(logits, Z[:B], index=torch.arange(B))
    loss.on_epoch_start(1)  # epoch 0 got no on_epoch_end
    with pytest.raises(RuntimeError, match=r"without on_epoch_end\(0.*train_logits"):
        loss(logits, Z[:B], index=torch.arange(B))
    ll_r = create_loss("ll_r")
    ll_r.on_epoch_start(0)
    ll_r(logits, Z[:B])
    ll_r.on_epoch_end(0)
    with pytest.raises(RuntimeError, match=r"epoch 0 ended.*loss.on_epoch_start\(1\)"):
        ll_r(logits, Z[:B])


def test_no_check_outside_training_calls():
    """Evaluation (eval mode, or no gradients) needs no hook: e.g. the loss on a val split."""
    loss = create_loss("ll_r")
    logits = torch.zeros(B, L, requires_grad=True)
    with torch.no_grad():
        loss(logits, Z[:B])
    loss.eval()
    loss(logits, Z[:B])


# ------------------------------------------------------------------ torch.compile ---------------
STATELESS = [n for n in NAMES if not _loss(n).required_hooks() and
             not any(True for _ in _loss(n).parameters()) and
             not any(True for _ in _loss(n).buffers()) and not _loss(n).needs_index]


def test_stateless_losses_compile_without_graph_breaks():
    """``torch.compile(loss, fullgraph=True)`` (fullgraph: a graph break is an error) equals
    eager for every stateless loss: ``forward`` reads no tensor value on the host (``.item()``,
    ``float()``, a branch on a value). The ``aot_eager`` backend traces the whole graph, forward
    and backward, as inductor would, without compiling kernels (inductor on this CPU takes
    minutes for 17 losses)."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, L, generator=g)
    observed = Z[:B].clone()
    observed[0, 1] = -1  # an observed negative too
    start = time.perf_counter()
    for name in STATELESS:
        torch._dynamo.reset()  # forward's code is every class's: a fresh cache per loss
        loss = _loss(name)
        compiled = torch.compile(loss, fullgraph=True, backend="aot_eager", dynamic=False)
        a = logits.clone().requires_grad_(True)
        b = logits.clone().requires_grad_(True)
        eager, fast = loss(a, observed), compiled(b, observed)
        torch.testing.assert_close(fast, eager, rtol=1e-6, atol=1e-6, msg=name)
        eager.backward()
        fast.backward()
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-7, msg=name)
    print(f"{len(STATELESS)} stateless losses compiled with fullgraph=True in "
          f"{time.perf_counter() - start:.1f} s: {STATELESS}")
    assert len(STATELESS) >= 15


def _ready(name):
    """A loss in epoch 2 of 4 of a run (its hooks called as the engine calls them)."""
    loss = _loss(name) if name != "ll_cp" else create_loss("ll_cp", delta_rel=5.0)
    loss.on_train_start(Z, TrainInfo(N, L, k=K, seed=SEED, num_epochs=4))
    g = torch.Generator().manual_seed(1)
    for epoch in range(2):
        loss.on_epoch_start(epoch)
        loss.on_epoch_end(epoch, torch.randn(N, L, generator=g))
    loss.on_epoch_start(2)
    return loss


def test_stateful_losses_compile_without_graph_breaks_once_their_hooks_ran():
    """The losses with hooks or state too: ``forward`` (the hooks' bookkeeping left to eager
    calls) compiles whole and gives eager's value, gradient and state (LL-Cp's flips)."""
    stateful = [n for n in NAMES if n not in STATELESS]
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(B, L, generator=g)
    idx = torch.arange(B)
    for name in stateful:
        torch._dynamo.reset()
        eager_loss, compiled_loss = _ready(name), _ready(name)
        compiled = torch.compile(compiled_loss, fullgraph=True, backend="aot_eager",
                                 dynamic=False)
        a = logits.clone().requires_grad_(True)
        b = logits.clone().requires_grad_(True)
        eager, fast = eager_loss(a, Z[idx], index=idx), compiled(b, Z[idx], index=idx)
        torch.testing.assert_close(fast, eager, rtol=1e-6, atol=1e-6, msg=name)
        eager.backward()
        fast.backward()
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-7, msg=name)
        for (key, x), y in zip(eager_loss.state_dict().items(),
                               compiled_loss.state_dict().values()):
            assert torch.equal(x, y), (name, key)
    assert len(stateful) == len(NAMES) - len(STATELESS) >= 12


def test_compiled_loss_skips_the_label_check_eager_keeps_it():
    """Inside torch.compile the label check (a host read) is left out; eager calls on CPU check
    every batch."""
    loss = create_loss("an")
    bad = torch.tensor([[1, 0, 3]])
    with pytest.raises(ValueError, match=r"found \[3\]"):
        loss(torch.zeros(1, 3), bad)
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    assert torch.isfinite(compiled(torch.zeros(1, 3), bad))
    with pytest.raises(ValueError, match=r"found \[3\]"):  # still checked in eager calls
        loss(torch.zeros(1, 3), bad)


def test_half_precision_logits_give_a_float32_loss():
    loss = create_loss("em")
    logits = torch.randn(B, L).half().requires_grad_(True)
    value = loss(logits, Z[:B])
    assert value.dtype == torch.float32
    value.backward()
    assert logits.grad.dtype == torch.float16


def test_the_hook_log_is_no_state():
    """The hooks' bookkeeping stays out of state_dict() (checkpoints are unchanged) and a deep
    copy (what stacked runs and best-epoch snapshots make) keeps working."""
    loss = _loss("crisp")
    keys = set(loss.state_dict())
    loss.on_train_start(Z, TrainInfo(N, L, num_epochs=EPOCHS))
    loss.on_epoch_start(0)
    assert set(loss.state_dict()) == keys
    copy.deepcopy(loss)(torch.zeros(B, L, requires_grad=True), Z[:B])


def test_the_guide_table_says_which_hooks_each_loss_needs():
    """docs/guide/own-loop.md's table: every registered loss once, with the hooks its
    ``required_hooks()`` gives (default hyperparameters)."""
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "guide" / "own-loop.md"
    rows = [line.split("|")[1:3] for line in page.read_text().splitlines()
            if line.startswith("| ") and "losses |" not in line]
    seen = []
    for hooks, names in rows:
        named = tuple(h for h in HOOKS if h in hooks)
        for name in (re.sub(r"\(.*?\)", "", n).strip() for n in names.split(",")):
            seen.append(name)
            assert _loss(name).required_hooks() == named, (name, named)
    assert sorted(seen) == sorted(NAMES)
