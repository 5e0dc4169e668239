"""Two CPU processes (gloo, DistributedDataParallel) against one process with the same global
batch.

The data: 33 tiny images, global batch 8, so the last batch has 1 row and process 1's share of
it is empty. The losses: ``an``; ``role`` (a trainable N_train x L estimator of the loss);
``em_apl`` (buffers updated from the gathered train predictions at every epoch end).

The runs are the same computation up to the order of floating-point reductions: with two
processes each parameter gradient is summed over each process's half of the batch and then
all-reduced (and the gathered logits' gradient is all-reduced too), where one process sums over
the whole batch at once. float32 addition is not associative, so the parameters differ in the
last bits after a step, and Adam's division by sqrt(v) can enlarge a relative difference where
a gradient is tiny. Measured after 2 epochs of 5 steps: at most 6e-8 on the weights, 1.2e-7 on
the loss's state (ROLE's estimator, APL's frozen soft targets), relative 8e-8 on the train
losses, identical val mAPs. Tolerance: 1e-5 absolute on every weight and every tensor of the
loss's state, 1e-6 on the val mAPs, relative 1e-5 on the train losses. The two processes must
agree with each other exactly (the same all-reduced gradients and steps; the loss's state is
broadcast from process 0).
"""
import json
import socket

import pytest
import torch
import torch.multiprocessing as mp
from _dist_worker import LOSSES, cli_args, train_all, worker
from _image_toy import make_images, state_close

from spmlkit.cli import main
from spmlkit.labels import make_observed

WORLD = 2
TOL = 1e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one_process(tmp_path):
    names = ["blue", "green", "red"]
    train, y = make_images(tmp_path / "train", 33, seed=0)  # 33 = 4 * 8 + 1: an empty share
    val, y_val = make_images(tmp_path / "val", 12, seed=1)
    csv = tmp_path / "images.csv"
    csv.write_text("".join(f"{p},{';'.join(n for n, f in zip(names, r) if f)}\n"
                           for p, r in zip(train + val, list(y) + list(y_val))))
    data = {"train": train, "observed": make_observed(y, "1p"), "val": val, "y_val": y_val,
            "batch_size": 8, "csv": str(csv)}
    single = train_all(data)
    assert main(cli_args(data, str(tmp_path / "one"), str(tmp_path / "one-cache"))) == 0
    mp.spawn(worker, args=(WORLD, free_port(), data, str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    assert [r["context"] for r in ranks] == [(0, 2, "gloo"), (1, 2, "gloo")]
    for name in LOSSES:
        one, (r0, r1) = single[name], (r[name] for r in ranks)
        for a, b in ((r0["model"], r1["model"]), (r0["loss"], r1["loss"])):
            assert all(torch.equal(a[k], b[k]) for k in a), name  # the processes agree exactly
        assert r0["val_maps"] == r1["val_maps"]
        assert state_close(r0["model"], one["model"]) <= TOL, name
        assert state_close(r0["loss"], one["loss"]) <= TOL, name
        assert r0["val_maps"] == pytest.approx(one["val_maps"], abs=1e-6), name
        assert r0["train_losses"] == pytest.approx(one["train_losses"], rel=1e-5), name
    # the state the test is about exists and moved: ROLE's estimator, APL's pseudo-labels
    assert single["role"]["loss"]["label_logits"].shape == (33, 3)
    assert int(single["em_apl"]["loss"]["pseudo_mask"].sum()) > 0
    assert torch.equal(ranks[0]["em_apl"]["loss"]["pseudo_mask"],
                       single["em_apl"]["loss"]["pseudo_mask"])
    # spml train --mode linear_init in both processes (the feature store computed by one of
    # them, the other waiting for it): one run folder, written by process 0, and the same
    # epochs as the single-process command
    assert [(tmp_path / f"cli{r}.txt").read_text() for r in range(WORLD)] == ["0", "0"]
    (run,) = (tmp_path / "runs").iterdir()
    (run_one,) = (tmp_path / "one").iterdir()
    assert {"best.pt", "thresholds.json", "predictions.npz", "final.json"} <= \
        {p.name for p in run.iterdir()}
    assert '"processes": 2' in (run / "config.json").read_text()
    epochs, epochs_one = ([json.loads(line) for line in (r / "metrics.jsonl").read_text()
                           .splitlines()] for r in (run, run_one))
    assert [e["phase"] for e in epochs] == ["linear"] * 2 + ["finetune"] * 2
    assert [e["val_map"] for e in epochs] == pytest.approx([e["val_map"] for e in epochs_one],
                                                           abs=1e-6)
    assert [e["train_loss"] for e in epochs] == pytest.approx(
        [e["train_loss"] for e in epochs_one], rel=1e-5)


def test_a_resume_under_torchrun_runs_in_every_process(tmp_path):
    """``torchrun --nproc_per_node 2 -m spmlkit train --resume RUN``: the resume starts the
    process group as a new run does (it did not: every process took the folder's lock as if
    it were process 0, one failed on it, and the other trained alone)."""
    import os
    import subprocess
    import sys

    from _interrupt import ctrl_c_after_epoch

    names = ["blue", "green", "red"]
    paths, y = make_images(tmp_path / "imgs", 24, seed=0)
    csv = tmp_path / "images.csv"
    csv.write_text("".join(f"{p},{';'.join(n for n, f in zip(names, r) if f)}\n"
                           for p, r in zip(paths, y)))
    with ctrl_c_after_epoch():
        assert main(["train", "--dataset", "csv", "--data", f"path={csv}", "--mode", "finetune",
                     "--loss", "role", "--backbone", "tiny_cnn", "--random-init",
                     "--image-size", "16", "--epochs", "3", "--batch-size", "8", "--lr", "1e-2",
                     "--workers", "0", "--device", "cpu", "--out", str(tmp_path / "runs"),
                     "--quiet"]) == 130
    (run,) = (tmp_path / "runs").iterdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                           str(WORLD), "--master_port", str(free_port()), "-m", "spmlkit",
                           "train", "--resume", str(run), "--quiet"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "being trained by another process" not in proc.stderr
    final = json.loads((run / "final.json").read_text())
    assert final["epochs_run"] == 3
    assert proc.stdout.count("run folder:") == 1  # process 0 alone prints the result
