"""``--jpeg-draft``: JPEGs decoded at the smallest of libjpeg's scales still at least the view's
size, then resized as before (`spmlkit.accel`, `spmlkit.data.image_views.image_reader`)."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from spmlkit.accel import Acceleration, acceleration
from spmlkit.cli import main
from spmlkit.data.image_files import open_image
from spmlkit.data.transforms import eval_transform, weak_view
from spmlkit.engine.image_batches import ImageItems


def _photo(path, width, height, seed=0):
    """A smooth photo-like JPEG (upsampled noise: what libjpeg's scaled decode is made for)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (height // 16, width // 16, 3), dtype=np.uint8)
    Image.fromarray(small).resize((width, height), Image.BICUBIC).save(path, quality=90)
    return str(path)


@pytest.fixture
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    for c, name in enumerate(("cat", "dog")):
        (root / name).mkdir()
        for i in range(3):
            _photo(root / name / f"{i}.jpg", 800, 600, seed=10 * c + i)
    return root


def test_open_image_decodes_a_jpeg_at_a_scale_no_smaller_than_asked(tmp_path):
    jpeg = _photo(tmp_path / "a.jpg", 800, 600)
    assert open_image(jpeg).size == (800, 600)
    assert open_image(jpeg, draft=200).size == (400, 300)   # 1/4 would be 200 x 150
    assert open_image(jpeg, draft=100).size == (200, 150)   # 1/4; 1/8 would be 100 x 75
    assert open_image(jpeg, draft=500).size == (800, 600)   # 1/2 would be too small
    png = tmp_path / "a.png"
    Image.open(jpeg).save(png)
    assert open_image(png, draft=100).size == (800, 600)    # not a JPEG: as it is


def test_a_drafted_view_is_close_to_the_full_decode_but_not_the_same(photos):
    paths = sorted(str(p) for p in photos.rglob("*.jpg"))
    full = ImageItems(paths, weak_view(96), seed=0)
    with acceleration(jpeg_draft=True):
        draft = ImageItems(paths, weak_view(96), seed=0)
    diffs = []
    for i in range(len(paths)):
        (a, flip_a), _ = full[(i, 1)]
        (b, flip_b), _ = draft[(i, 1)]
        assert a.shape == b.shape == (3, 96, 96) and a.dtype == b.dtype == torch.uint8
        assert flip_a == flip_b  # the same seeded draws
        diffs.append((a.int() - b.int()).abs().float().mean().item())
    assert 0 < max(diffs) < 2.0, diffs


def test_what_jpeg_draft_refuses(photos):
    paths = sorted(str(p) for p in photos.rglob("*.jpg"))
    with pytest.raises(ValueError, match="--gpu-decode and --jpeg-draft"):
        Acceleration(gpu_decode=True, jpeg_draft=True)
    with acceleration(jpeg_draft=True):
        with pytest.raises(ValueError, match="a reader of its own"):
            ImageItems(paths, eval_transform(64), read=open_image)
        with pytest.raises(ValueError, match="objects in memory"):
            ImageItems([Image.new("RGB", (8, 8))], eval_transform(64))
        with pytest.raises(ValueError, match="has no size"):
            ImageItems(paths, lambda img, g: torch.zeros(3, 8, 8))
        pngs = []
        for i, path in enumerate(paths[:2]):  # no JPEG among them: it would change nothing
            pngs.append(str(photos / f"{i}.png"))
            Image.open(path).save(pngs[-1])
        with pytest.raises(ValueError, match="none of these 2 files is a .jpg"):
            ImageItems(pngs, eval_transform(64))
        ImageItems([pngs[0], paths[0]], eval_transform(64))  # one JPEG among them: taken


def test_extract_with_jpeg_draft_is_a_store_of_its_own(photos, tmp_path, capsys):
    """``spml extract --jpeg-draft``: a store beside the full decode's (key field ``decode``),
    features close to its; the command refuses it with --gpu-decode."""
    from spmlkit.features import plan_store

    cache = tmp_path / "cache"
    common = ["extract", "--dataset", "folder", "--data", f"root={photos}", "--backbone",
              "tiny_cnn", "--size", "64", "--cache-dir", str(cache), "--workers", "1",
              "--quiet"]
    assert main(common) == 0
    assert main([*common, "--jpeg-draft"]) == 0
    stores = sorted(p for p in cache.iterdir() if p.is_dir())
    assert len(stores) == 4  # pool and test, each twice
    items = sorted(str(p) for p in photos.rglob("*.jpg"))
    plain = plan_store(items, "tiny_cnn", size=64, cache_dir=cache, pretrained=True)
    with acceleration(jpeg_draft=True):
        drafted = plan_store(items, "tiny_cnn", size=64, cache_dir=cache, pretrained=True)
    assert "decode" not in plain.fields and drafted.fields["decode"] == "pil-draft"
    assert plain.folder != drafted.folder
    meta = {s: json.loads((s / "meta.json").read_text()) for s in stores}
    assert sorted(m["key_fields"].get("decode", "-") for m in meta.values()) == \
        ["-", "-", "pil-draft", "pil-draft"]
    pools = {m["key_fields"].get("decode", "full"): np.load(s / "features.npy")
             for s, m in meta.items() if m["key_fields"]["n"] == 4}
    assert not np.array_equal(pools["full"], pools["pil-draft"])
    np.testing.assert_allclose(pools["pil-draft"], pools["full"], rtol=0.05, atol=0.05)
    capsys.readouterr()
    assert main([*common, "--jpeg-draft", "--gpu-decode"]) == 2
    assert "--gpu-decode and --jpeg-draft" in capsys.readouterr().err


def test_the_benchmark_measures_both_decoders(tmp_path):
    """benchmarks/jpeg_draft.py with two photos of each size: both decoders' rows, the
    drafted features close to the full decode's."""
    import csv
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "draft.csv"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "jpeg_draft.py"), "--out",
                           str(out), "--workdir", str(tmp_path / "work"), "--images", "2"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(out.open()))
    assert [(r["photo"], r["decode"]) for r in rows] == [
        (size, decode) for size in ("640x480", "1600x1200", "4000x3000")
        for decode in ("full", "jpeg-draft")]
    for row in rows[1::2]:
        assert float(row["mean_cosine_to_full"]) > 0.98, row


def test_predict_decodes_new_images_as_the_run_did(tmp_path):
    """A run fine-tuned with ``--jpeg-draft`` scored its val / test images drafted; ``spml
    predict`` decodes new images the same way, so it gives the run's own test probabilities
    (a full decode gives others)."""
    from spmlkit.loading import load_splits
    from spmlkit.predict import predict_run

    root = tmp_path / "photos"
    for c, name in enumerate(("cat", "dog", "owl")):
        (root / name).mkdir(parents=True)
        for i in range(5):
            _photo(root / name / f"{i}.jpg", 800, 600, seed=10 * c + i)
    assert main(["train", "--dataset", "folder", "--data", f"root={root}", "--mode", "finetune",
                 "--backbone", "tiny_cnn", "--random-init", "--image-size", "64", "--epochs",
                 "1", "--workers", "0", "--jpeg-draft", "--out", str(tmp_path / "runs"),
                 "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert json.loads((run / "config.json").read_text())["acceleration"] == ["--jpeg-draft"]
    test_paths = load_splits("folder", root=str(root)).test.x
    saved = np.load(run / "predictions.npz")["probs_test"]
    pred = predict_run(run, test_paths)
    np.testing.assert_allclose(pred.probs, saved, rtol=1e-4, atol=1e-6)
    config = json.loads((run / "config.json").read_text())
    del config["acceleration"]
    (run / "config.json").write_text(json.dumps(config))
    assert not np.allclose(predict_run(run, test_paths).probs, saved, rtol=1e-4, atol=1e-6)


def test_a_resume_keeps_the_runs_decoder(tmp_path, capsys):
    """A --jpeg-draft run interrupted after its first epoch and resumed without the flag
    decodes its remaining epochs drafted, as the uninterrupted run (they were decoded in full:
    other predictions, and spml predict no longer reproduced them); a run without it refuses
    a resume with it."""
    from _interrupt import ctrl_c_after_epoch

    root = tmp_path / "photos"
    for c, name in enumerate(("cat", "dog", "owl")):
        (root / name).mkdir(parents=True)
        for i in range(4):
            _photo(root / name / f"{i}.jpg", 800, 600, seed=10 * c + i)
    argv = ["train", "--dataset", "folder", "--data", f"root={root}", "--mode", "finetune",
            "--backbone", "tiny_cnn", "--random-init", "--image-size", "64", "--epochs", "2",
            "--lr", "1e-2", "--workers", "0", "--quiet"]
    assert main([*argv, "--jpeg-draft", "--out", str(tmp_path / "whole")]) == 0
    with ctrl_c_after_epoch():
        assert main([*argv, "--jpeg-draft", "--out", str(tmp_path / "cut")]) == 130
        assert main([*argv, "--out", str(tmp_path / "plain")]) == 130
    (whole,), (cut,), (plain,) = (list((tmp_path / d).iterdir())
                                  for d in ("whole", "cut", "plain"))
    assert main(["train", "--resume", str(cut), "--quiet"]) == 0
    for key in ("probs_test", "probs_val"):
        np.testing.assert_array_equal(np.load(cut / "predictions.npz")[key],
                                      np.load(whole / "predictions.npz")[key])
    capsys.readouterr()
    assert main(["train", "--resume", str(plain), "--jpeg-draft", "--quiet"]) == 2
    assert "--jpeg-draft: the run decoded its images without it" in capsys.readouterr().err
    # a --gpu-decode run resumed on a CPU decodes with PIL, saying so (it was refused)
    config = json.loads((plain / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps({**config, "acceleration": ["--gpu-decode"]}))
    with pytest.warns(UserWarning, match=r"was trained with --gpu-decode \(nvJPEG\); resumed "
                                         r"on cpu, its remaining epochs decode with PIL"):
        assert main(["train", "--resume", str(plain), "--device", "cpu", "--quiet"]) == 0
