"""spmlkit's fine-tuning epoch against bare PyTorch loops on the same GPU, files and model.

    PYTHONPATH=src python benchmarks/gpu_throughput.py --out results/gpu-throughput.csv
    PYTHONPATH=src python benchmarks/gpu_throughput.py --smoke --out /tmp/smoke.csv   (a CPU)

Writes a synthetic MS-COCO 2014 layout (``annotations/instances_{train,val}2014.json``,
``train2014/``, ``val2014/``) of photo-like 640 x 480 JPEGs with all the machine's cores
(3,000 pool images: spmlkit's Cole split gives 2,400 train + 600 val rows; 60 test images), or
takes a real one (``--coco DIR``). Then, each in a child process of its own (a fresh CUDA
context; the child ends with ``os._exit`` so persistent loader workers cannot hang the exit):

- ``ceiling``: the model on random tensors already on the GPU, fused Adam: what compute allows;
- ``bare``: a plain loop: DataLoader (``--workers`` processes, persistent), PIL decode + resize +
  flip -> uint8, pinned; normalisation on the GPU; torch's fused Adam;
- ``spmlkit``: ``spml train --mode finetune`` through its API (``train_run``: the Cole split,
  the AN loss, spmlkit's optimiser, val mAP each epoch);
- ``spmlkit+gpu-decode``: the same with ``--gpu-decode`` (nvJPEG; the batches decoded a few
  ahead in a thread of their own);
- ``spmlkit+gpu-decode-inline`` (``--paths``): ``--gpu-decode`` with each batch decoded in the
  training thread, as spmlkit did before its decode thread: what that thread gains;
- ``spmlkit+compile``: the same with ``--compile reduce-overhead --cudnn-benchmark``
  (``--with-compile``; its compilation takes minutes);
- ``spmlkit+gpu-decode+compile`` (``--paths``, the first batch only): ``--gpu-decode`` with
  ``--compile reduce-overhead --cudnn-benchmark``: CUDA graphs take the kernel launches off the
  host, which sets the pace of ``--gpu-decode`` (results/gpu-throughput.csv, calls 4 and 6);
- ``spmlkit+sync-checkpoint`` / ``spmlkit+no-folder`` (``--paths``): the run folder's
  checkpoint written in the training thread, as spmlkit did before it wrote in a thread of its
  own / no run folder at all (no checkpoint): what the checkpoint costs an epoch;
- ``spmlkit+glibc-malloc`` (``--paths``): the loader workers with glibc's malloc defaults, as
  before `spmlkit.machine.loader_worker_init` (``benchmarks/loader_malloc.py``);
- ``spmlkit+float-workers`` (``--paths``): the loader workers flip and normalise and deliver
  float32, as spmlkit did before the uint8 loader: its speed, and its val / test mAP against the
  default path's from the same seed (the issue's "within bfloat16 noise").

Every path: the same model (``--backbone``, random init, ``--image-size``), batch, precision
(``--amp``) and memory format (channels-last on CUDA). An epoch = the training pass over the
train rows + an eval pass over the val rows; ``--epochs`` epochs, the first one (start-up,
autotuning, compilation) left out of the figures. Per path and batch: the mean epoch seconds,
train images/s, and the GPU's busy share (NVML's utilisation, sampled every 50 ms over the
timed epochs); ``vs_bare`` (epoch / the bare loop's at that batch: the target is <= 1.1) and
``train_vs_ceiling`` (train images/s / the ceiling's: the target with GPU decode is >= 0.85);
``checkpoint_s``: the seconds per epoch the training thread spent in the run folder's
checkpoint, ``decode_s`` (``--gpu-decode``): the seconds per epoch spent queueing nvJPEG's
decodes and resizes and waiting for the decoder (in the decode thread, or in the training thread
with ``-inline``: there they add to the epoch when the host sets the pace), ``wait_s``
(bare and spmlkit paths): the seconds per epoch the training thread waited for its next
training batch (the loader, or the decode thread, behind the steps; small while the GPU is
still short of busy: the steps' own host work sets the pace),
``train_cpu_s`` / ``decode_cpu_s`` / ``pin_cpu_s`` / ``host_cpu_s``: the CPU seconds per
epoch of the thread that queues the steps, of --gpu-decode's decode thread, of the loaders'
pin-memory threads and of the whole training process (`ThreadCPU`, Linux): a training
thread near its wall time is busy queueing (launches, Python: CUDA graphs shorten that), one
well below it while the GPU idles waits (for the interpreter's lock, a batch, the GPU);
``val_map`` / ``test_map``: the run's (spmlkit's paths, seed 0).
Paths left out for lack of time (``--budget`` seconds in all) or that fail are rows with their
reason. The CSV has the machine (GPU, CPU cores, torch version).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

COCO_IDS = sorted(set(range(1, 91)) - {12, 26, 29, 30, 45, 66, 68, 69, 71, 83})
#: the roles of `ThreadCPU`, each a column ``<role>_cpu_s``
CPU_ROLES = ("train", "decode", "pin", "host")
FIELDS = ["path", "batch", "epoch_s", "train_img_s", "gpu_busy_pct", "vs_bare",
          "train_vs_ceiling", "checkpoint_s", "decode_s", "wait_s",
          *(f"{role}_cpu_s" for role in CPU_ROLES), "val_map", "test_map",
          "epochs_timed", "train_rows", "val_rows", "device", "note"]


# ---- the synthetic COCO layout ----------------------------------------------------------------
def _photo(args):
    """One photo-like JPEG: smooth colour fields (a few octaves of upsampled noise), edges of a
    few shapes, sensor noise; about the entropy (file size) of a real photo."""
    path, seed, width, height = args
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    img = np.zeros((height, width, 3), dtype=np.float32)
    for cells, weight in ((4, 90.0), (16, 45.0), (64, 20.0)):
        small = rng.normal(0, 1, (max(2, cells * height // width), cells, 3)).astype(np.float32)
        up = Image.fromarray(((small - small.min()) / (np.ptp(small) + 1e-6) * 255)
                             .astype(np.uint8)).resize((width, height), Image.BICUBIC)
        img += weight * (np.asarray(up, dtype=np.float32) / 255.0 - 0.5)
    img += 120 + rng.normal(0, 9, img.shape)
    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = int(rng.integers(0, width - 40)), int(rng.integers(0, height - 40))
        box = [x0, y0, x0 + int(rng.integers(20, width // 2)),
               y0 + int(rng.integers(20, height // 2))]
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pil.save(path, quality=92)
    return Path(path).stat().st_size


def make_coco(root: Path, n_train: int, n_test: int, width: int, height: int) -> dict:
    """The layout under ``root`` (kept when already complete); returns what was made."""
    import multiprocessing

    import numpy as np

    done = root / "DONE.json"
    want = {"n_train": n_train, "n_test": n_test, "width": width, "height": height}
    if done.is_file() and json.loads(done.read_text()).get("want") == want:
        return json.loads(done.read_text())
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    categories = [{"supercategory": "x", "id": cid, "name": f"class{cid}"} for cid in COCO_IDS]
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    jobs = []
    for split, n, first in (("train", n_train, 1), ("val", n_test, 10 ** 6)):
        images, anns = [], []
        for k in range(n):
            image_id = first + k
            name = f"COCO_{split}2014_{image_id:012d}.jpg"
            images.append({"id": image_id, "file_name": name, "width": width, "height": height})
            for j, cid in enumerate(rng.choice(COCO_IDS, size=int(rng.integers(1, 5)),
                                               replace=False)):
                anns.append({"id": image_id * 10 + j, "image_id": image_id,
                             "category_id": int(cid), "iscrowd": 0,
                             "bbox": [10.0, 10.0, width / 3, height / 3], "area": 1.0})
            jobs.append((str(root / f"{split}2014" / name), image_id, width, height))
        data = {"info": {}, "licenses": [], "images": images, "annotations": anns,
                "categories": categories}
        (root / "annotations" / f"instances_{split}2014.json").write_text(json.dumps(data))
    with multiprocessing.Pool(os.cpu_count() or 1) as pool:
        sizes = pool.map(_photo, jobs, chunksize=16)
    made = {"want": want, "images": len(jobs), "mean_kb": round(sum(sizes) / len(sizes) / 1024, 1),
            "seconds": round(time.perf_counter() - t0, 1)}
    done.write_text(json.dumps(made))
    return made


# ---- GPU busy share ----------------------------------------------------------------------------
class Busy:
    """NVML's GPU utilisation sampled every 50 ms in a thread; :meth:`mean` over a window."""

    def __init__(self, device):
        self.samples, self.stop, self.handle = [], threading.Event(), None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = device.index if device.index is not None else 0
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible:
                index = int(visible.split(",")[index])
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.read = lambda: pynvml.nvmlDeviceGetUtilizationRates(self.handle).gpu
        except Exception as err:  # no NVML: the column stays empty, with the reason
            print(f"NVML unavailable: {err}", file=sys.stderr)
            return
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self.stop.is_set():
            self.samples.append((time.perf_counter(), float(self.read())))
            time.sleep(0.05)

    def mean(self, t0: float, t1: float) -> float:
        inside = [v for t, v in list(self.samples) if t0 <= t <= t1]
        return sum(inside) / len(inside) if inside else float("nan")


class ThreadCPU:
    """CPU seconds of this process's threads by role, read from ``/proc`` (Linux) every 50 ms
    in a thread of its own: where the host's time goes while the GPU waits. Roles: ``train``
    (the main thread: it queues the steps), ``decode`` (--gpu-decode's decode thread), ``pin``
    (the loaders' pin-memory threads), ``host`` (every thread of the process: torch's, CUDA's
    and these together). A thread that queues steps as fast as the GPU runs them spends about
    its wall time on the CPU; one that waits for the interpreter's lock, the loader or the
    GPU spends less."""

    def __init__(self):
        self.samples, self.stop = [], threading.Event()
        self.seen: dict = {}      # thread id -> [role, its CPU seconds at the last reading]
        self.retired: dict = {}   # role -> CPU seconds of threads whose id was taken again
        if not os.path.isdir("/proc/self/task"):
            return
        from spmlkit.data.image_views import AHEAD_NAME

        self.tick, self.ahead = os.sysconf("SC_CLK_TCK"), AHEAD_NAME
        self.main = threading.main_thread().native_id
        threading.Thread(target=self._run, daemon=True).start()

    def _role(self, tid: int, names: dict) -> str:
        name = names.get(tid, "")
        if tid == self.main:
            return "train"
        if name == self.ahead:
            return "decode"
        return "pin" if "pin_memory" in name else "other"

    def _read(self) -> dict:
        names = {t.native_id: t.name for t in threading.enumerate()}
        for entry in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{entry}/stat") as f:
                    stat = f.read()
            except OSError:  # the thread ended
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # utime, stime: fields 14 and 15
            cpu = (int(fields[11]) + int(fields[12])) / self.tick
            tid = int(entry)
            known = self.seen.get(tid)
            if known is not None and cpu < known[1]:  # an ended thread's id, taken again
                self.retired[known[0]] = self.retired.get(known[0], 0.0) + known[1]
                known = None
            if known is None:
                self.seen[tid] = [self._role(tid, names), cpu]
            else:
                known[1] = cpu
        totals = dict(self.retired)
        for role, cpu in self.seen.values():
            totals[role] = totals.get(role, 0.0) + cpu
        totals["host"] = sum(totals.values())
        return totals

    def _run(self):
        while not self.stop.is_set():
            self.samples.append((time.perf_counter(), self._read()))
            time.sleep(0.05)

    def used(self, t0: float, t1: float) -> dict:
        """CPU seconds per role between the last readings at or before ``t0`` and ``t1``
        (empty without ``/proc``)."""
        samples = list(self.samples)
        before = [s for t, s in samples if t <= t0]
        upto = [s for t, s in samples if t <= t1]
        if not before or not upto:
            return {}
        a, b = before[-1], upto[-1]
        return {role: b[role] - a.get(role, 0.0) for role in b}


# ---- the child processes -----------------------------------------------------------------------
def _splits(args):
    from spmlkit.loading import load_splits

    return load_splits("coco", "1p", root=args.coco)


def _model(args, num_classes: int):
    from spmlkit.models.heads import build_image_classifier

    return build_image_classifier(args.backbone, num_classes, pretrained=False, seed=0)


def _amp(args, device):
    import torch

    if device.type != "cuda" or args.amp == "none":
        return None
    return torch.bfloat16 if args.amp == "bf16" else torch.float16


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _plain(args, num_classes: int, device):
    """The ceiling's and the bare loop's model (channels-last on CUDA), torch's Adam (fused on
    CUDA), memory format and autocast dtype."""
    import torch

    fmt = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    model = _model(args, num_classes).to(device).to(memory_format=fmt)
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, **fused)
    return model, opt, fmt, _amp(args, device)


def _step(model, opt, x, y, device, amp) -> None:
    """One plain training step (the ceiling's and the bare loop's): forward under autocast,
    BCE on the logits in float32, backward, optimiser step; nothing read back."""
    import torch

    with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
        out = model(x)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(out.float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def child_ceiling(args, device, busy):
    """Random tensors already on the device, fused Adam: the compute ceiling."""
    import torch

    splits = _splits(args)
    n_train, n_val, L = len(splits.train), len(splits.val), len(splits.class_names)
    model, opt, fmt, amp = _plain(args, L, device)
    size, b = args.image_size, args.batch
    x = torch.randn(b, 3, size, size, device=device).contiguous(memory_format=fmt)
    y = (torch.rand(b, L, device=device) < 0.05).float()
    times = []
    for _ in range(args.epochs):
        _sync(device)
        t0 = time.perf_counter()
        model.train()
        for _ in range(math.ceil(n_train / b)):
            _step(model, opt, x, y, device, amp)
        _sync(device)
        t1 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            for _ in range(math.ceil(n_val / max(64, b))):
                with torch.autocast(device.type, dtype=amp or torch.float32,
                                    enabled=amp is not None):
                    model(x[:1].expand(min(max(64, b), n_val), -1, -1, -1).contiguous(
                        memory_format=fmt))
        _sync(device)
        times.append((t0, t1, time.perf_counter()))
    return times, n_train, n_val


class _BareItems:
    """PIL decode + resize + flip -> uint8 3 x S x S (the bare loop's dataset)."""

    def __init__(self, paths, size, train):
        self.paths, self.size, self.train = paths, size, train

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import numpy as np
        import torch
        from PIL import Image

        with Image.open(self.paths[i]) as img:
            img = img.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        if self.train and np.random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy()), i


def child_bare(args, device, busy):
    """A plain PyTorch loop on the same files and model."""
    import torch

    splits = _splits(args)
    L = len(splits.class_names)
    model, opt, fmt, amp = _plain(args, L, device)
    observed = torch.as_tensor(splits.observed, dtype=torch.float32).clamp(min=0).to(device)
    pin = device.type == "cuda"
    common = dict(num_workers=args.workers, pin_memory=pin,
                  persistent_workers=args.workers > 0)
    if args.workers:
        common["prefetch_factor"] = max(2, 64 // args.batch)
    train = torch.utils.data.DataLoader(_BareItems(list(splits.train.x), args.image_size, True),
                                        batch_size=args.batch, shuffle=True, drop_last=False,
                                        **common)
    val = torch.utils.data.DataLoader(_BareItems(list(splits.val.x), args.image_size, False),
                                      batch_size=max(64, args.batch), shuffle=False, **common)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def prep(x):
        x = x.to(device, non_blocking=True).float().sub_(mean).div_(std)
        return x.contiguous(memory_format=fmt)

    times = []
    for _ in range(args.epochs):
        _sync(device)
        t0 = time.perf_counter()
        model.train()
        waited, it = 0.0, iter(train)
        while True:
            t_wait = time.perf_counter()
            batch = next(it, None)
            waited += time.perf_counter() - t_wait
            if batch is None:
                break
            x, idx = batch
            _step(model, opt, prep(x), observed[idx.to(device, non_blocking=True)], device, amp)
        _sync(device)
        t1 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            outs = []
            for x, _ in val:
                with torch.autocast(device.type, dtype=amp or torch.float32,
                                    enabled=amp is not None):
                    outs.append(model(prep(x)).float())
            torch.cat(outs).cpu()
        _sync(device)
        times.append((t0, t1, time.perf_counter(), None, None, waited))
    return times, len(splits.train), len(splits.val)


def child_spmlkit(args, device, busy, folder: str = "background", float_workers: bool = False,
                  ahead: bool = True, glibc_malloc: bool = False, **accel):
    """spmlkit's finetune through its API (what ``spml train`` runs). ``folder``: the run
    folder's checkpoint written in a thread (``"background"``, spmlkit's default), in the
    training thread (``"sync"``, spmlkit before it wrote in a thread) or no run folder
    (``"none"``: no checkpoint at all). ``float_workers``: the loader workers flip and
    normalise, delivering float32 images, as spmlkit did before issue 31 (the same bits on the
    CPU; the seeded comparison of its val / test mAP with the default path's). ``ahead=False``:
    ``--gpu-decode``'s batches decoded in the training thread, not in a thread of their own.
    ``glibc_malloc``: the loader workers keep glibc's malloc defaults (no
    `spmlkit.machine.loader_worker_init`), as before spmlkit set them."""
    import tempfile

    import torch

    from spmlkit import runs
    from spmlkit.checkpointing import Checkpointer
    from spmlkit.data import image_views
    from spmlkit.engine import TrainConfig, acceleration, finetune, image_batches
    from spmlkit.engine.loop import batch_progress
    from spmlkit.methods import get_method, train_run

    splits = _splits(args)
    marks = {"first": None, "train_end": float("nan"), "rows": 0, "saving": 0.0, "decode": 0.0,
             "wait": 0.0}
    times = []
    real_checkpointer, real_call = runs.RunDir.checkpointer, Checkpointer.__call__

    def checkpointer(self, every_seconds=0.0, background=True):
        return real_checkpointer(self, every_seconds, background=folder == "background")

    def timed_call(self, make_state):  # the training thread's time in the checkpoint
        t0 = time.perf_counter()
        real_call(self, make_state)
        marks["saving"] = time.perf_counter() - t0

    runs.RunDir.checkpointer, Checkpointer.__call__ = checkpointer, timed_call
    real_decode = image_views._decode_jpegs

    def timed_decode(*a):  # the host's time in --gpu-decode's decodes (train and val)
        t0 = time.perf_counter()
        out = real_decode(*a)
        marks["decode"] += time.perf_counter() - t0
        return out

    image_views._decode_jpegs = timed_decode
    if not ahead:
        real_batches = image_views.finished_batches

        def inline(batches, finish, device, ahead=False, depth=2):
            return real_batches(batches, finish, device)

        finetune.finished_batches = image_batches.finished_batches = inline
    if glibc_malloc:  # (read when the loaders are made)
        image_batches.loader_worker_init = None
    real_finished = finetune.finished_batches

    def timed_batches(*a, **kw):  # the training thread's waits for its next training batch
        batches = real_finished(*a, **kw)
        try:
            while True:
                t0 = time.perf_counter()
                batch = next(batches, None)
                marks["wait"] += time.perf_counter() - t0
                if batch is None:
                    return
                yield batch
        finally:
            batches.close()

    finetune.finished_batches = timed_batches
    if float_workers:  # (the workers are forked after this: they run it too)
        real_load = image_batches.load_view

        def float_view(transform, img, generator):
            x, flip = real_load(transform, img, generator)
            if x.dtype != torch.uint8:
                return x, flip
            return transform.finish(x[None], torch.tensor([flip]))[0], False

        image_batches.load_view = float_view

    def step(rows, per_epoch):
        if marks["first"] is None:  # the first step marks the first epoch's start
            marks["first"] = time.perf_counter()
        marks["rows"] += rows
        if marks["rows"] >= per_epoch:  # the epoch's last step: its training pass ends when
            _sync(device)               # the device is done (one wait per epoch)
            marks["train_end"], marks["rows"] = time.perf_counter(), 0

    def on_epoch(record, *_):  # (the epoch's checkpoint follows: it counts in the next one)
        now = time.perf_counter()
        start = times[-1][2] if times else marks["first"]
        times.append((start, marks["train_end"], now, marks["saving"], marks["decode"],
                      marks["wait"]))
        marks["saving"] = marks["decode"] = marks["wait"] = 0.0

    config = TrainConfig(epochs=args.epochs, batch_size=args.batch, lr=1e-4, seed=0,
                         device=str(device), amp=args.amp, num_workers=args.workers,
                         image_size=args.image_size)
    with tempfile.TemporaryDirectory() as out, batch_progress(step), \
            acceleration(**accel):
        result = train_run(get_method("finetune"), splits, "an", {}, config,
                           out=None if folder == "none" else out, on_epoch=on_epoch,
                           backbone=args.backbone, pretrained=False, progress=False)
    scores = {"val_map": result["val_map"], "test_map": result["test_map"]}
    return times, len(splits.train), len(splits.val), scores


def run_child(args) -> None:
    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # torch 2.11 refuses a device without an index here
    torch.set_num_threads(1 if device.type == "cpu" else 4)
    busy, cpu = Busy(device), ThreadCPU()
    kind = args.child
    accel = {"spmlkit+gpu-decode": {"gpu_decode": True},
             "spmlkit+gpu-decode-inline": {"gpu_decode": True, "ahead": False},
             "spmlkit+compile": {"compile": "reduce-overhead", "cudnn_benchmark": True},
             "spmlkit+gpu-decode+compile": {"gpu_decode": True, "compile": "reduce-overhead",
                                            "cudnn_benchmark": True},
             "spmlkit+sync-checkpoint": {"folder": "sync"},
             "spmlkit+no-folder": {"folder": "none"},
             "spmlkit+float-workers": {"float_workers": True},
             "spmlkit+glibc-malloc": {"glibc_malloc": True}}
    scores = {}
    if kind == "ceiling":
        times, n_train, n_val = child_ceiling(args, device, busy)
    elif kind == "bare":
        times, n_train, n_val = child_bare(args, device, busy)
    else:
        times, n_train, n_val, scores = child_spmlkit(args, device, busy,
                                                      **accel.get(kind, {}))
    timed = times[1:] if len(times) > 1 else times
    # spmlkit: the training thread's seconds in the checkpoint inside each timed window (an
    # epoch's checkpoint follows its on_epoch: it counts in the next epoch's window)
    saving = [t[3] for t in timed if len(t) > 3 and t[3] is not None]
    decode = [t[4] for t in timed if len(t) > 4 and t[4] is not None]
    wait = [t[5] for t in timed if len(t) > 5]
    epoch = sum(t[2] - t[0] for t in timed) / len(timed)
    train = [t[1] - t[0] for t in timed if not math.isnan(t[1])]
    result = {"epoch_s": epoch, "train_s": sum(train) / len(train) if train else float("nan"),
              "gpu_busy_pct": busy.mean(timed[0][0], timed[-1][2]),
              "epochs_timed": len(timed), "train_rows": n_train, "val_rows": n_val,
              "epochs": [round(t[2] - t[0], 3) for t in times],
              "checkpoint_s": sum(saving) / len(saving) if saving else None,
              "decode_s": sum(decode) / len(decode) if decode and "gpu-decode" in kind else None,
              "wait_s": sum(wait) / len(wait) if wait else None,
              **scores}
    used = cpu.used(timed[0][0], timed[-1][2])
    result.update({f"{role}_cpu_s": used[role] / len(timed) if role in used else None
                   for role in CPU_ROLES})
    busy.stop.set()
    cpu.stop.set()
    Path(args.result).write_text(json.dumps(result))


# ---- the parent -----------------------------------------------------------------------------
def _machine(device: str) -> str:
    import torch

    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    return f"{name}, {os.cpu_count()} CPU cores, torch {torch.__version__}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the CSV to write")
    p.add_argument("--coco", default=None, help="a real COCO 2014 folder (default: synthesise)")
    p.add_argument("--workdir", default="/tmp/spmlkit-gpu-throughput",
                   help="where the synthetic layout is written (reused when complete)")
    p.add_argument("--images", type=int, default=3000, help="synthetic pool images")
    p.add_argument("--backbone", default="timm:resnet50")
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--amp", default="bf16", choices=["bf16", "fp16", "none"])
    p.add_argument("--workers", type=int, default=15)
    p.add_argument("--batches", default="32,8")
    p.add_argument("--epochs", type=int, default=3, help="per path; the first is not timed")
    p.add_argument("--paths", default="ceiling,bare,spmlkit,spmlkit+gpu-decode",
                   help="comma-separated; spmlkit+gpu-decode runs at the first batch only")
    p.add_argument("--with-compile", action="store_true",
                   help="also spmlkit+compile (reduce-overhead + cudnn autotuner) at each batch")
    p.add_argument("--budget", type=float, default=450.0,
                   help="seconds for the whole call: paths that would start later are skipped")
    p.add_argument("--device", default=None, help="default: cuda if there, else cpu")
    p.add_argument("--smoke", action="store_true",
                   help="tiny CPU run: 50 images of 96 x 72, tiny_cnn at 16 px (or "
                        "--backbone), 1 worker, batches 8 and 4, 2 epochs")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.images, args.workers = 50, 1
        if args.batches == "32,8":  # the defaults: a smoke's own unless given
            args.batches = "8,4"
        if args.epochs == 3:
            args.epochs = 2
        if args.backbone == "timm:resnet50":
            args.backbone, args.image_size = "tiny_cnn", 16
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        try:
            run_child(args)
            code = 0
        except BaseException as err:  # the parent reads the reason
            import traceback

            traceback.print_exc()
            Path(args.result).write_text(json.dumps({"error": f"{type(err).__name__}: {err}"}))
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # persistent loader workers must not hang the exit
    return parent(args)


def parent(args) -> int:
    t_start = time.perf_counter()
    if args.coco is None:
        size = (96, 72) if args.smoke else (640, 480)
        made = make_coco(Path(args.workdir) / "coco", args.images,
                         max(10, args.images // 50), *size)
        print(f"synthetic COCO layout: {made}", flush=True)
        args.coco = str(Path(args.workdir) / "coco")
    batches = [int(b) for b in args.batches.split(",")]
    paths = [s for s in args.paths.split(",") if s]
    plan = []
    for b in batches:
        for path in paths:
            if path.startswith("spmlkit+gpu-decode") and b != batches[0]:
                continue
            plan.append((path, b))
        if args.with_compile:
            plan.append(("spmlkit+compile", b))
    rows, bare, ceiling = [], {}, {}
    machine = _machine(args.device)
    for path, b in plan:
        left = args.budget - (time.perf_counter() - t_start)
        row = {"path": path, "batch": b, "device": machine}
        if path.startswith("spmlkit+gpu-decode") and not args.device.startswith("cuda"):
            row["note"] = "skipped: --gpu-decode needs CUDA"
        elif left < 20:
            row["note"] = f"skipped: the --budget of {args.budget:.0f} s was spent"
        else:
            row.update(_child(args, path, b, left))
        if path == "bare" and "epoch_s" in row:
            bare[b] = row["epoch_s"]
        if path == "ceiling" and "epoch_s" in row:
            ceiling[b] = row["train_img_s"]
        rows.append(row)
        _print(row)
    for row in rows:
        if "epoch_s" in row and row["batch"] in bare:
            row["vs_bare"] = round(row["epoch_s"] / bare[row["batch"]], 3)
        if "epoch_s" in row and row["batch"] in ceiling:
            row["train_vs_ceiling"] = round(row["train_img_s"] / ceiling[row["batch"]], 3)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row.get(k)) for k in FIELDS})
    print(f"wrote {args.out} ({time.perf_counter() - t_start:.0f} s in all)")
    return 0


def _child(args, path: str, batch: int, left: float) -> dict:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = f.name
    cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--child", path,
           "--batch", str(batch), "--result", result, "--coco", args.coco,
           "--backbone", args.backbone, "--image-size", str(args.image_size), "--amp", args.amp,
           "--workers", str(args.workers), "--epochs", str(args.epochs),
           "--device", args.device]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, timeout=max(10.0, left - 5), capture_output=True, text=True)
        tail = (proc.stderr or "").strip().splitlines()[-3:]
    except subprocess.TimeoutExpired:
        return {"note": f"stopped after {left - 5:.0f} s (the --budget)"}
    try:
        out = json.loads(Path(result).read_text() or "{}")
    except (OSError, ValueError):
        out = {}
    finally:
        Path(result).unlink(missing_ok=True)
    if "error" in out or "epoch_s" not in out:
        reason = out.get("error") or " | ".join(tail) or f"exit status {proc.returncode}"
        return {"note": f"failed: {reason}"[:300]}
    n_train = out["train_rows"]
    train_s = out["train_s"]
    note = f"epochs {out['epochs']} s; child {time.perf_counter() - t0:.0f} s"
    if math.isnan(train_s):
        note += "; train img/s from the whole epoch (its val pass included)"
        train_s = out["epoch_s"]
    return {"epoch_s": round(out["epoch_s"], 3), "train_img_s": round(n_train / train_s, 1),
            "gpu_busy_pct": round(out["gpu_busy_pct"], 1)
            if not math.isnan(out["gpu_busy_pct"]) else None,
            **{key: None if out.get(key) is None else round(out[key], 3)
               for key in ("checkpoint_s", "decode_s", "wait_s",
                           *(f"{role}_cpu_s" for role in CPU_ROLES))},
            **{key: round(out[key], 2) for key in ("val_map", "test_map") if key in out},
            "epochs_timed": out["epochs_timed"], "train_rows": n_train,
            "val_rows": out["val_rows"], "note": note}


def _fmt(value):
    return "" if value is None else value


def _print(row: dict) -> None:
    bits = [f"{row['path']:>20} batch {row['batch']:>3}"]
    if "epoch_s" in row:
        bits.append(f"epoch {row['epoch_s']:.2f} s, train {row['train_img_s']:.0f} img/s, "
                    f"GPU busy {row.get('gpu_busy_pct')} %")
    bits.append(row.get("note", ""))
    print("  ".join(bits), flush=True)


if __name__ == "__main__":
    sys.exit(main())
