"""The run folder's checkpoint writer (`spmlkit.runs.Checkpointer`): the training loop pays only
for the state's copy; the write and its sync run in a thread while the next epoch trains."""
import threading
import time
from collections import OrderedDict

import pytest
import torch

from spmlkit.checkpointing import on_host
from spmlkit.runs import CHECKPOINT_FILE, RunDir, load_torch


@pytest.fixture
def run(tmp_path):
    return RunDir.create(tmp_path, "r")


def slow_writes(monkeypatch, seconds: float, fail: Exception | None = None):
    """RunDir.save_torch that takes ``seconds`` (or raises ``fail`` after them); the threads
    it ran in."""
    real, threads = RunDir.save_torch, []

    def save(self, name, obj, durable=True):
        threads.append(threading.current_thread())
        time.sleep(seconds)
        if fail is not None:
            raise fail
        real(self, name, obj, durable=durable)

    monkeypatch.setattr(RunDir, "save_torch", save)
    return threads


def test_the_loop_does_not_wait_for_the_write(run, monkeypatch):
    threads = slow_writes(monkeypatch, 0.6)
    save = run.checkpointer(0.0)
    t0 = time.perf_counter()
    save(lambda: {"w": torch.ones(3)})
    returned = time.perf_counter() - t0
    assert returned < 0.3  # the write takes 0.6 s
    assert not (run.path / CHECKPOINT_FILE).exists()
    save.wait()
    assert threads[0] is not threading.main_thread()
    assert torch.equal(load_torch(run.path / CHECKPOINT_FILE)["w"], torch.ones(3))


def test_the_state_is_the_epochs_even_when_training_goes_on(run, monkeypatch):
    """The state is built when the epoch ends (in the calling thread), so the weights the next
    epoch changes in place are not what is written."""
    slow_writes(monkeypatch, 0.3)
    weights = torch.zeros(4)
    built = []
    save = run.checkpointer(0.0)
    save(lambda: built.append(threading.current_thread()) or {"w": weights.clone()})
    weights.add_(1.0)  # the next epoch trains
    save.wait()
    assert built == [threading.main_thread()]
    assert torch.equal(load_torch(run.path / CHECKPOINT_FILE)["w"], torch.zeros(4))


def test_one_write_at_a_time_in_epoch_order(run, monkeypatch):
    slow_writes(monkeypatch, 0.3)
    save = run.checkpointer(0.0)
    t0 = time.perf_counter()
    for epoch in (1, 2, 3):
        save(lambda: {"epoch": epoch})
    assert time.perf_counter() - t0 >= 0.55  # the 3rd waited for the 1st and the 2nd
    save.wait()
    assert load_torch(run.path / CHECKPOINT_FILE)["epoch"] == 3


def test_a_failed_write_is_raised_in_the_training_thread(run, monkeypatch):
    slow_writes(monkeypatch, 0.05, fail=OSError(28, "No space left on device", "checkpoint.pt"))
    save = run.checkpointer(0.0)
    save(lambda: {"epoch": 1})
    with pytest.raises(OSError, match="No space left"):
        save(lambda: {"epoch": 2})  # the next epoch's checkpoint
    save(lambda: {"epoch": 3})
    save.wait(raise_error=False)  # the run already failed of its own error: this one dropped
    save.wait()  # nothing left


def test_throttled_and_synchronous_writes(run, monkeypatch):
    threads = slow_writes(monkeypatch, 0.0)
    save = run.checkpointer(3600.0)
    save(lambda: pytest.fail("built although the last write was less than an hour ago"))
    save = run.checkpointer(0.0, background=False)
    save(lambda: {"epoch": 1})
    assert threads == [threading.main_thread()]
    assert load_torch(run.path / CHECKPOINT_FILE)["epoch"] == 1


def test_on_host_keeps_the_states_structure():
    meta = OrderedDict(a=torch.ones(2))
    meta._metadata = {"": {"version": 1}}
    state = {"model": meta, "groups": [{"lr": 0.1, "m": (torch.zeros(1),)}], "n": None}
    out = on_host(state)
    assert type(out["model"]) is OrderedDict and out["model"]._metadata == meta._metadata
    assert out["model"]["a"] is meta["a"]  # CPU tensors: the state's copies, not copied again
    assert isinstance(out["groups"][0]["m"], tuple) and out["n"] is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_host_copies_device_tensors_to_the_cpu():
    out = on_host({"w": torch.ones(3, device="cuda")})
    assert out["w"].device.type == "cpu" and torch.equal(out["w"], torch.ones(3))


def test_the_stall_benchmark_measures_both_modes(tmp_path):
    import csv
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "checkpoint_stall.py"
    spec = importlib.util.spec_from_file_location("checkpoint_stall", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "stall.csv"
    assert bench.main(["--out", str(out), "--params", "5000", "--epochs", "2", "--pause", "0",
                       "--repeats", "1", "--folder", str(tmp_path)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["mode"] for r in rows] == ["training thread", "own thread"]
    assert all(float(r["mean_s"]) >= 0 and len(r["stalls_s"].split()) == 2 for r in rows)
    assert not list(tmp_path.glob("tmp*"))  # its run folders are gone


def test_a_fork_waits_for_the_write_in_flight(run, monkeypatch):
    """A DataLoader's workers forked while the last epoch's state is written: the fork waits
    for the write, so no child starts from a process whose writer holds a lock mid-save."""
    import multiprocessing

    slow_writes(monkeypatch, 0.5)
    save = run.checkpointer(0.0)
    save(lambda: {"w": torch.ones(2)})
    writer = save._thread
    assert writer.is_alive()
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,))
    child.start()  # the at-fork hook joins the writer first
    assert not writer.is_alive()
    assert (run.path / CHECKPOINT_FILE).exists()
    child.join()
    save.wait()
    assert child.exitcode == 0


@pytest.mark.parametrize("phase", ["linear", "finetune"])
def test_a_resumed_linear_init_run_keeps_each_logged_epoch_once(tmp_path, phase):
    """A linear_init checkpoint nests its train-loop state (``{"phase", "state": {history},
    "linear_result"}``): the resume trimmed nothing, and the epochs logged after the
    checkpoint appeared twice in metrics.jsonl. The lines are kept as logged, up to the
    checkpoint's epochs: the linear phase's, then the phase's own."""
    import json

    from spmlkit.runs import METRICS_FILE

    run = RunDir.create(tmp_path, "r")
    logged = [{"epoch": e, "val_map": 10.0 + e, "phase": "linear"} for e in (1, 2, 3)] + \
             [{"epoch": e, "val_map": 20.0 + e, "phase": "finetune"} for e in (1, 2)]
    for record in logged:
        run.log(record)
    lin = [{"epoch": e, "val_map": 10.0 + e} for e in (1, 2, 3)]
    if phase == "linear":  # checkpointed at linear epoch 2, killed after finetune epoch 2
        state = {"format": "linear_init", "phase": "linear", "state": {"history": lin[:2]}}
        keep = logged[:2]
    else:  # checkpointed at finetune epoch 1
        state = {"format": "linear_init", "phase": "finetune", "linear_result": {"history": lin},
                 "state": {"history": [{"epoch": 1, "val_map": 21.0}]}}
        keep = logged[:4]
    run.save_torch(CHECKPOINT_FILE, state)
    assert run.resume_state() == state
    lines = (run.path / METRICS_FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == keep
