"""The image path at the device's pace (issue 31): uint8 batches finished where the model runs,
no host read of the loss inside the training step, evaluation loaders started once per run,
the opt-in speed-ups' errors."""
import contextlib
import math

import numpy as np
import pytest
import torch
from _image_toy import make_images, tiny_model

from spmlkit.data import transforms as T
from spmlkit.engine import (Acceleration, ItemPredictor, TrainConfig, acceleration,
                            fit_finetune)
from spmlkit.data.image_views import AHEAD_NAME, RawFiles, finish_view, finished_batches
from spmlkit.engine.image_batches import ImageItems, _Collate
from spmlkit.labels import make_observed
from spmlkit.losses import SPMLLoss, create_loss


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy31")
    train, y = make_images(root / "train", 40, seed=0)
    val, y_val = make_images(root / "val", 16, seed=1)
    return {"train": train, "y": y, "observed": make_observed(y, "1p"), "val": val,
            "y_val": y_val}


def _fit(images, n=40, batch_size=8, epochs=2, loss="an", **kw):
    config = TrainConfig(epochs=epochs, batch_size=batch_size, lr=1e-2, seed=0, **kw)
    return fit_finetune(tiny_model(0), images["train"][:n], images["observed"][:n],
                        create_loss(loss) if isinstance(loss, str) else loss, config,
                        val_items=images["val"], y_val=images["y_val"], k=1.5)


# -- uint8 batches, finished in the training process --------------------------------------------
@pytest.mark.parametrize("factory", [T.eval_transform, T.weak_view, T.strong_view])
def test_worker_uint8_then_finish_is_the_whole_transform(factory, images):
    from spmlkit.data.image_files import open_image

    t = factory(16)
    items = ImageItems(images["train"][:6], t, seed=5)
    batch = _Collate((3, 16, 16))([items[(row, 2)] for row in range(6)])
    x, flips, rows = batch
    assert x.dtype == torch.uint8 and x.shape == (6, 3, 16, 16) and rows.tolist() == list(range(6))
    assert flips.dtype == torch.bool
    if factory is T.weak_view:  # the trailing flip is drawn in the worker, applied after
        assert 0 < int(flips.sum()) < 6
    else:
        assert not flips.any()
    finished = finish_view(t, x, flips, torch.device("cpu"))
    from spmlkit.engine.image_batches import mix_seed

    whole = torch.stack([t(open_image(images["train"][r]),
                           torch.Generator().manual_seed(mix_seed(5, 2, r))) for r in range(6)])
    assert finished.dtype == torch.float32 and torch.equal(finished, whole)


def test_finish_normalises_as_numpy_did():
    t = T.eval_transform(4, mean=(0.1, 0.2, 0.3), std=(0.5, 0.25, 0.125))
    x = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    arr = x.permute(0, 2, 3, 1).numpy().astype(np.float32)
    arr *= (1.0 / (255.0 * np.asarray(t.std, dtype=np.float64))).astype(np.float32)
    arr += (-np.asarray(t.mean) / np.asarray(t.std)).astype(np.float32)
    assert torch.equal(t.finish(x), torch.from_numpy(arr).permute(0, 3, 1, 2))
    with pytest.raises(ValueError, match="uint8 batch"):
        t.finish(x.float())


# -- no host synchronisation inside the training step -------------------------------------------
@contextlib.contextmanager
def host_reads():
    """Counts the reads of floating-point tensors back to Python in this process (``item``,
    ``float``, ``bool``, ``tolist``, ``numpy``): on a GPU each is a synchronisation with the
    device. Loader workers are other processes (not counted); integer row indices are the
    sampler's, on the host."""
    counts = {"n": 0}
    names = ("item", "__float__", "__bool__", "tolist", "numpy")
    saved = {name: getattr(torch.Tensor, name) for name in names}

    def counting(name):
        original = saved[name]

        def call(self, *args, **kwargs):
            if self.is_floating_point():
                counts["n"] += 1
            return original(self, *args, **kwargs)
        return call

    for name in names:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield counts
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)


@pytest.mark.parametrize("loss", ["an", "role"])
def test_host_reads_per_epoch_do_not_grow_with_the_batches(images, loss):
    per_epoch = {}
    for n, batch_size in ((16, 8), (40, 4)):  # 2 and 10 training steps per epoch
        with host_reads() as counts:
            _, result = _fit(images, n=n, batch_size=batch_size, loss=loss, num_workers=1)
        per_epoch[n] = counts["n"] / len(result.history)
    assert per_epoch[16] == per_epoch[40] <= 4, per_epoch


class NaNAfter(SPMLLoss):
    """AN whose loss turns NaN at the third step."""

    def __init__(self):
        super().__init__()
        self.steps = 0

    def entries(self, logits, observed, index):
        self.steps += 1
        entries, penalty = create_loss("an").entries(logits, observed, index)
        return (entries * float("nan") if self.steps >= 3 else entries), penalty


def test_divergence_is_still_caught_at_the_end_of_its_epoch(images):
    with pytest.raises(FloatingPointError, match=r"diverged at epoch 1 \(loss nan\)"):
        _fit(images, loss=NaNAfter())


def test_accumulated_loss_is_the_sum_of_the_host_reads():
    from spmlkit.engine.loop import _accumulate

    values = [torch.tensor(v, dtype=torch.float32) for v in (0.1, 0.7, 1e-8, 3.3)]
    total = None
    for v in values:
        total = _accumulate(total, v, 7)
    expected = 0.0
    for v in values:
        expected += float(v) * 7
    assert float(total) == expected


# -- evaluation loaders: workers started once per run --------------------------------------------
@contextlib.contextmanager
def worker_starts():
    """Counts the DataLoader iterators that start worker processes."""
    from torch.utils.data import dataloader

    cls = dataloader._MultiProcessingDataLoaderIter
    original = cls.__init__
    counts = {"n": 0}

    def init(self, loader):
        counts["n"] += 1
        original(self, loader)

    cls.__init__ = init
    try:
        yield counts
    finally:
        cls.__init__ = original


def test_workers_start_once_per_run_not_once_per_pass(images):
    from test_finetune import Recorder  # needs train predictions every epoch

    with worker_starts() as counts:
        _fit(images, epochs=3, loss=Recorder(), num_workers=1)
    # training, val and train predictions: one start each over 3 epochs (was 1 + 3 + 3)
    assert counts["n"] == 3


def test_predictor_loader_is_persistent_pinned_on_cuda_and_prefetches_for_the_batch(images):
    config = TrainConfig(num_workers=2, eval_batch_size=8)
    p = ItemPredictor(images["val"], T.eval_transform(16), config, (3, 16, 16),
                      torch.device("cpu"))
    assert p.loader.persistent_workers and p.loader.prefetch_factor == 8
    assert not p.loader.pin_memory  # on a CPU; pinned on CUDA (make_loader)
    first = p(tiny_model(0))
    assert torch.equal(first, p(tiny_model(0)))


# -- the opt-in speed-ups: clear errors where they cannot apply ---------------------------------
@pytest.mark.parametrize("options, match", [
    ({"cudnn_benchmark": True}, "cudnn's autotuner is CUDA's"),
    ({"gpu_decode": True}, "nvJPEG on a CUDA device"),
])
def test_cuda_only_options_refused_on_a_cpu_run(images, options, match):
    with acceleration(**options), pytest.raises(ValueError, match=match):
        _fit(images, epochs=1)


def test_compile_mode_checked_and_cudnn_setting_restored():
    with pytest.raises(ValueError, match="compile mode must be one of"):
        Acceleration(compile="fastest")
    before = torch.backends.cudnn.benchmark
    with acceleration(cudnn_benchmark=True) as accel:
        assert accel.flags() == ["--cudnn-benchmark"]
    assert torch.backends.cudnn.benchmark == before


def test_gpu_decode_refuses_views_with_pil_steps(images):
    from spmlkit.data.image_views import gpu_decodable

    gpu_decodable(T.weak_view(16))
    gpu_decodable(T.eval_transform(16))
    with pytest.raises(ValueError, match="strong_view has PIL steps"):
        gpu_decodable(T.strong_view(16))


def test_cli_refuses_speed_flags_for_a_feature_mode(tmp_path, capsys):
    from spmlkit.cli import main

    code = main(["train", "--dataset", "yeast", "--epochs", "1", "--compile", "--out",
                 str(tmp_path)])
    assert code != 0
    assert "--compile default: --mode linear trains on feature vectors" in capsys.readouterr().err


def test_compile_runs_a_cpu_finetune(images):
    pytest.importorskip("torch._inductor")
    try:
        with acceleration(compile="default"):
            _, result = _fit(images, n=16, epochs=1)
    except Exception as err:  # no C++ compiler: say so rather than fail
        if "compiler" in str(err).lower() or "InvalidCxxCompiler" in type(err).__name__:
            pytest.skip(f"torch.compile cannot build here: {err}")
        raise
    assert math.isfinite(result.history[0]["train_loss"])


def test_gpu_decode_refused_for_a_cpu_prediction_pass(images):
    with acceleration(gpu_decode=True), pytest.raises(ValueError, match="nvJPEG on a CUDA"):
        ItemPredictor(images["val"], T.eval_transform(16), TrainConfig(), (3, 16, 16),
                      torch.device("cpu"))


# -- --gpu-decode's batches finished ahead, in a thread of their own ----------------------------
def _ahead_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == AHEAD_NAME]


def test_finished_batches_ahead_are_the_inline_ones_in_order_from_their_own_thread():
    import threading

    where = set()

    def finish(batch):
        where.add(threading.current_thread().name)
        return batch * 10

    device = torch.device("cpu")
    inline = list(finished_batches(range(7), finish, device))
    assert where == {threading.current_thread().name}
    where.clear()
    assert list(finished_batches(range(7), finish, device, ahead=True)) == inline == \
        [10 * i for i in range(7)]
    assert where == {AHEAD_NAME} and not _ahead_threads()
    assert list(finished_batches((), finish, device, ahead=True)) == []


@pytest.mark.parametrize("where", ["finish", "loader"])
def test_an_error_ahead_is_raised_at_its_batch_and_ends_the_thread(where):
    def source():
        for i in range(6):
            if where == "loader" and i == 3:
                raise OSError("row 3 unreadable")
            yield i

    def finish(batch):
        if where == "finish" and batch == 3:
            raise ValueError("--gpu-decode: nvJPEG could not decode a file of the batch")
        return batch

    got = []
    with pytest.raises((ValueError, OSError), match="nvJPEG|unreadable"):
        for batch in finished_batches(source(), finish, torch.device("cpu"), ahead=True):
            got.append(batch)
    assert got == [0, 1, 2] and not _ahead_threads()


def test_leaving_the_loop_early_stops_the_thread_and_frees_the_loader():
    pulled = []

    def source():
        for i in range(100):
            pulled.append(i)
            yield i

    batches = finished_batches(source(), lambda b: b, torch.device("cpu"), ahead=True, depth=2)
    for batch in batches:
        if batch == 1:
            break
    batches.close()
    assert not _ahead_threads()
    assert len(pulled) <= 2 + 2 + 1  # used, queued (depth) and the one in hand


# -- on a GPU (skipped without one) ---------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("factory", [T.eval_transform, T.weak_view])
def test_cuda_finish_is_the_cpu_finish_bit_for_bit(factory, images):
    t = factory(16)
    x, flips, _ = _Collate((3, 16, 16))([ImageItems(images["train"][:8], t, seed=1)[(r, 0)]
                                         for r in range(8)])
    on_cpu = finish_view(t, x, flips, torch.device("cpu"))
    on_gpu = finish_view(t, x.pin_memory(), flips, torch.device("cuda"), channels_last=True)
    assert torch.equal(on_gpu.cpu(), on_cpu)


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(12):
        small = rng.integers(0, 256, (6, 8, 3)).astype(np.uint8)
        img = Image.fromarray(small).resize((80, 60), Image.Resampling.BICUBIC)
        paths.append(str(root / f"{i}.jpg"))
        img.save(paths[-1], quality=95)
    return paths


def test_raw_files_cross_the_loader_as_one_block_and_split_back_into_each_file(jpegs):
    from pathlib import Path

    items = ImageItems(jpegs, T.eval_transform(32), raw=True)
    loader = torch.utils.data.DataLoader(items, batch_size=5, num_workers=1,
                                         collate_fn=_Collate((3, 32, 32)))
    seen = []
    for raw, _, rows in loader:
        assert isinstance(raw, RawFiles) and raw.data.ndim == 1 and len(raw.sizes) == len(rows)
        seen += [(int(r), bytes(f.numpy())) for r, f in zip(rows, raw.files())]
    assert seen == [(i, Path(p).read_bytes()) for i, p in enumerate(jpegs)]


@cuda
def test_cuda_gpu_decode_is_close_to_the_pil_path(jpegs):
    pytest.importorskip("torchvision")
    t = T.eval_transform(32)
    cpu = _Collate((3, 32, 32))([ImageItems(jpegs, t)[r] for r in range(12)])
    raw = _Collate((3, 32, 32))([ImageItems(jpegs, t, raw=True)[r] for r in range(12)])
    assert isinstance(raw[0], RawFiles) and raw[0].data.dtype == torch.uint8
    from spmlkit.data.image_views import _decode_jpegs

    decoded = _decode_jpegs(raw[0], 32, torch.device("cuda")).cpu().int()
    as_list = _decode_jpegs(raw[0].files(), 32, torch.device("cuda")).cpu().int()
    assert torch.equal(decoded, as_list)
    diff = (decoded - cpu[0].int()).abs().float()
    assert diff.mean() < 3 and diff.max() < 64, (diff.mean(), diff.max())


def test_resize_all_resizes_each_shape_as_one_batch_as_if_alone():
    """--gpu-decode's resize: images of one shape go through one batched interpolation, each
    image's pixels those of resizing it alone; images at the size are copied as they are."""
    from spmlkit.data.image_views import resize_all

    g = torch.Generator().manual_seed(0)
    shapes = [(48, 64), (32, 32), (48, 64), (40, 30), (32, 32), (48, 64)]
    images = [torch.randint(0, 256, (3, *s), generator=g, dtype=torch.uint8) for s in shapes]
    out = resize_all(images, 32)
    assert out.shape == (6, 3, 32, 32) and out.dtype == torch.uint8
    for img, got in zip(images, out):
        alone = img if img.shape[1:] == (32, 32) else torch.nn.functional.interpolate(
            img[None].float(), size=(32, 32), mode="bilinear", align_corners=False,
            antialias=True)[0].round_().clamp_(0, 255).to(torch.uint8)
        assert torch.equal(got, alone)
    assert torch.equal(resize_all(images[:1], 32)[0], out[0])  # one shape: one batch


@cuda
def test_cuda_gpu_decode_never_writes_into_memory_queued_kernels_still_read(jpegs):
    """pytorch/vision#9606: nvJPEG wrote its outputs into blocks that the caller's stream had
    freed while kernels queued on it still read them (runs went NaN). Blocks of the decoder's
    output size are filled, read by reductions queued behind a long kernel and freed, then a
    batch is decoded: every reduction must still see its own values."""
    pytest.importorskip("torchvision")
    from spmlkit.data.image_views import _decode_jpegs

    t = T.eval_transform(32)
    raw = _Collate((3, 32, 32))([ImageItems(jpegs, t, raw=True)[r] for r in range(12)])[0]
    device = torch.device("cuda")
    bad = 0
    for _ in range(20):
        blocks = [torch.full((3 * 60 * 80,), k, dtype=torch.uint8, device=device)
                  for k in range(1, 25)]
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)  # the step still running on the GPU
        sums = [b.sum(dtype=torch.int64) for b in blocks]
        del blocks  # freed while their reductions are queued
        _decode_jpegs(raw, 32, device)
        torch.cuda.synchronize()
        bad += sum(int(s) != k * 3 * 60 * 80 for k, s in zip(range(1, 25), sums))
    assert bad == 0


@cuda
def test_cuda_batches_decoded_ahead_are_the_inline_ones_while_the_gpu_is_busy(jpegs):
    """Batches decoded and finished ahead on the decode stream, while this stream is still
    busy with a long kernel (a training step) and frees memory: each equals the batch decoded
    in this thread, and nothing it holds is reused before this stream has read it."""
    pytest.importorskip("torchvision")
    t = T.weak_view(32)
    device = torch.device("cuda")
    items = ImageItems(jpegs, t, seed=3, raw=True)
    raw = [_Collate((3, 32, 32))([items[(r, e)] for r in range(12)]) for e in range(6)]

    def finish(batch):
        return finish_view(t, batch[0], batch[1], device)

    inline = [finish(b).cpu() for b in raw]
    for _ in range(3):
        got = []
        for x in finished_batches(raw, finish, device, ahead=True):
            torch.cuda._sleep(5_000_000)  # the step that uses it is still running
            scratch = torch.full_like(x, 7.0)
            got.append((x * 1).cpu())
            del scratch, x
        assert all(torch.equal(a, b) for a, b in zip(got, inline)) and len(got) == 6
    assert not _ahead_threads()


@cuda
def test_cuda_gpu_decode_fine_tunes(jpegs):
    pytest.importorskip("torchvision")
    y = (np.arange(36).reshape(12, 3) % 4 == 0).astype(np.uint8)
    y[y.sum(1) == 0, 0] = 1
    config = TrainConfig(epochs=2, batch_size=4, lr=1e-2, device="cuda", image_size=16)
    with acceleration(gpu_decode=True, cudnn_benchmark=True):
        _, result = fit_finetune(tiny_model(0), jpegs, make_observed(y, "1p"),
                                 create_loss("an"), config, val_items=jpegs, y_val=y, k=1.0)
    assert all(math.isfinite(h["train_loss"]) for h in result.history)


@cuda
def test_cuda_syncs_per_epoch_do_not_grow_with_the_batches(images):
    import warnings

    per_epoch = {}
    for n, batch_size in ((16, 8), (40, 4)):
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _, result = _fit(images, n=n, batch_size=batch_size, device="cuda", amp="bf16")
        finally:
            torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        per_epoch[n] = len(syncs) / len(result.history)
    assert per_epoch[16] == per_epoch[40], per_epoch
