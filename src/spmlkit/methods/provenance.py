"""What a run folder records about how it was made, and what a resume checks against it.

``config.json`` holds a run's settings as `fresh_config` writes them: the dataset and its
options (paths made absolute, `absolute_paths`), the data files it read with their sizes and
modification times (`data_files`), the regime, method, loss, hyperparameters and k, the train
config and the method's options (`plain_options`), the versions and source commit
(`versions`), the opt-in speed-ups that change bits. A resume continues the same run only:
`check_resume` refuses other settings, `check_data_files` changed data, `run_decoder` another
image decoder; each raises a `ResumeError`.
"""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from ..accel import current_acceleration
from ..data.protocol import describe_labels
from ..losses import loss_hparams
from .contract import RunContext, TrainingMethod, feature_record


#: the run folder's record of the images the source dropped (skip_missing / skip_corrupt)
SKIPPED_FILE = "skipped_images.json"


def versions() -> dict:
    """The versions a run was made with (``config.json``, study launches)."""
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    try:  # the installed version, without importing scikit-learn (seconds: scipy)
        sklearn_version = version("scikit-learn")
    except PackageNotFoundError:
        sklearn_version = None
    out = {"spmlkit": __version__, "torch": torch.__version__, "numpy": np.__version__,
           "scikit-learn": sklearn_version, "python": platform.python_version()}
    commit = source_commit()
    if commit is not None:
        out["spmlkit_commit"] = commit
    return out


@functools.lru_cache(maxsize=1)
def source_commit() -> str | None:
    """The git commit of the spmlkit source a checkout runs (``+dirty`` with uncommitted
    changes to tracked files): one version number covers many commits between releases.
    None for an installed wheel, or without git."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists() or not (root / "src" / "spmlkit").is_dir():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no", "--", "src"], capture_output=True,
                               text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip()
                                  else "")


def skipped_images(splits) -> dict | None:
    """The images a source dropped (``skip_missing`` / ``skip_corrupt``), per part, as the run
    folder's ``skipped_images.json`` records them; None when it dropped none."""
    skipped = (splits.meta or {}).get("skipped")
    if not isinstance(skipped, dict):
        return None
    parts = {part: {"missing": info.get("missing_files", []),
                    "corrupt": info.get("corrupt_files", [])}
             for part, info in skipped.items() if isinstance(info, dict) and
             (info.get("missing") or info.get("corrupt"))}
    if not parts:
        return None
    return {"skipped": sum(len(v["missing"]) + len(v["corrupt"]) for v in parts.values()),
            "parts": parts}


def plain_options(options: dict) -> dict:
    """The options as ``config.json`` records them: a module or a function given in Python
    (a backbone module, an image reader) by its name."""
    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if value is None or isinstance(value, (str, int, float, bool)):
            return value
        if hasattr(value, "__dataclass_fields__"):
            return plain(asdict(value))
        return f"<{getattr(value, 'name', None) or type(value).__name__}>"
    return plain(options)


#: keys of a dataset's nested option dicts that name files or folders (the feature cache's)
NESTED_PATHS = ("cache_dir", "weights")


def absolute_paths(dataset: str, options: dict) -> dict:
    """``options`` of the source ``dataset`` with each path option (a parameter of the source
    that takes a path; `NESTED_PATHS` in a nested dict) that names an existing file or folder
    relative to the current folder made absolute: a run folder's config.json then names its
    data wherever the resume is started."""
    from ..data.options import path_options

    paths = path_options(dataset) | {"class_names"}  # (class names: a list, or a file)

    def fix(value):
        if isinstance(value, (str, os.PathLike)) and str(value) and \
                not Path(value).is_absolute() and Path(value).exists():
            return str(Path(value).resolve())
        return value
    return {k: {kk: fix(vv) if kk in NESTED_PATHS else vv for kk, vv in v.items()}
            if isinstance(v, dict) else fix(v) if k in paths else v
            for k, v in dict(options or {}).items()}


def data_files(options: dict) -> dict:
    """``{option: {"path", "size", "mtime_ns"}}`` of the options (nested ones as ``a.b``) that
    name an existing file: what a resume checks is unchanged."""
    out = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{k}.", v)
        elif isinstance(value, str) and Path(value).is_absolute():
            try:
                st = Path(value).stat()
            except OSError:
                return
            if Path(value).is_file():
                out[prefix[:-1]] = {"path": value, "size": st.st_size,
                                    "mtime_ns": st.st_mtime_ns}
    walk("", options or {})
    return out


def fresh_config(method: TrainingMethod, ctx: RunContext, dataset_options) -> dict:
    splits, config = ctx.splits, ctx.config
    source = (splits.meta or {}).get("source_name", splits.name)  # the registered name
    dataset_options = absolute_paths(source, dataset_options)
    out = {"dataset": splits.name, "dataset_options": dataset_options,
           **({"source": source} if source != splits.name else {}),
           "data_files": data_files(dataset_options),
           "regime": splits.regime, "mode": method.name, "loss": ctx.loss_name,
           "hparams": ctx.hparams, "k": ctx.k, "train": asdict(config),
           "options": plain_options(ctx.options), "sizes": {s: len(getattr(splits, s))
                                              for s in ("train", "val", "test")},
           "class_names": list(splits.class_names), "labels": describe_labels(splits),
           "features": feature_record(splits), "versions": versions(),
           # what the loss trained with (its defaults too: "hparams" is what was given, and
           # a default may change between versions), and torch's CPU threads (a run's bits
           # depend on them in image modes)
           "loss_settings": plain_options({**loss_hparams(ctx.loss_name), **ctx.hparams}),
           "threads": torch.get_num_threads()}
    if method.run_config is not None:
        out.update(method.run_config(ctx))
    accel = current_acceleration()
    if accel.any:  # opt-in speed-ups that change bits: recorded, though a resume may drop them
        out["acceleration"] = accel.flags()
    return out


#: config.json entries a resume must find unchanged (besides the method's own: run_config)
RESUME_KEYS = ("dataset", "regime", "mode", "loss", "hparams", "k", "sizes")
#: TrainConfig fields a resume may change (where and how fast, not what)
RESUME_FREE = ("device", "num_workers", "eval_batch_size")


class ResumeError(ValueError):
    """A run folder cannot be continued (other settings, an unreadable checkpoint, written by an
    older spmlkit): the run has to be trained again from its first epoch."""


def check_resume(path, stored: dict, fresh: dict) -> None:
    """A resume continues the same run: the settings it is given must be the folder's."""
    import json

    fresh = json.loads(json.dumps(fresh, default=str))
    keys = [k for k in fresh if k in RESUME_KEYS or k not in (
        "dataset_options", "train", "options", "class_names", "versions", "processes",
        "labels", "acceleration", "data_files", "loss_settings", "threads", "source",
        "linear_train")]
    differ = [k for k in keys if stored.get(k) != fresh.get(k)]
    # a folder written before TrainConfig had ``metric`` / ``weight_decay`` selected on mAP,
    # without weight decay
    strip = (lambda t: {"metric": "map", "weight_decay": 0.0, **{k: v for k, v in (t or {}).items()
                                             if k not in RESUME_FREE}})
    for part in ("train", "linear_train"):  # (linear_init's linear phase: its own TrainConfig)
        if (stored.get(part) is None) != (fresh.get(part) is None) or \
                strip(stored.get(part)) != strip(fresh.get(part)):
            differ.append(part)
    if differ:
        detail = "; ".join(f"{k}: run folder {stored.get(k)!r} vs now {fresh.get(k)!r}"
                           for k in differ[:3])
        raise ResumeError(f"cannot resume {path}: the run was started with other settings "
                         f"({detail}); resume with the same arguments (spml train --resume "
                         f"RUN_DIR reads them from config.json)")


def check_data_files(path, recorded: dict) -> None:
    """A resume reads the data its run started with: a recorded data file that changed (size
    or modification time) or went missing is a `ResumeError`."""
    for option, was in (recorded or {}).items():
        try:
            st = Path(was["path"]).stat()
        except OSError:
            raise ResumeError(f"cannot resume {path}: its data file {was['path']} (option "
                              f"{option}) is gone; restore it, or train a new run") from None
        if (st.st_size, st.st_mtime_ns) != (was["size"], was["mtime_ns"]):
            raise ResumeError(f"cannot resume {path}: its data file {was['path']} (option "
                              f"{option}) changed since the run started (size {was['size']} -> "
                              f"{st.st_size} bytes, modified since); the resumed epochs would "
                              f"train on other data than the first ones: restore the file, or "
                              f"train a new run")


#: the speed-ups that decide an image's pixels (`spmlkit.accel.Acceleration` fields)
DECODE_FLAGS = {"--jpeg-draft": "jpeg_draft", "--gpu-decode": "gpu_decode"}


def run_decoder(path, cfg: dict, device=None):
    """The acceleration a resume runs under: the caller's, with the decoder the run started
    with (config.json's ``acceleration``): its remaining epochs see the pixels its first ones
    did, and `spmlkit.predict` (which decodes as config.json says) still reproduces its test
    probabilities. A decoder other than the run's is refused (a `ResumeError`). A
    ``--gpu-decode`` run resumed off CUDA decodes with PIL, with a warning (nvJPEG needs the
    GPU; its pixels are a few levels off PIL's)."""
    import dataclasses
    import warnings

    recorded = set(cfg.get("acceleration") or [])
    accel = current_acceleration()
    wanted = {field: flag in recorded for flag, field in DECODE_FLAGS.items()}
    given = [flag for flag, field in DECODE_FLAGS.items() if getattr(accel, field) and
             not wanted[field]]
    if given:
        raise ResumeError(f"cannot resume {path} with {given[0]}: the run decoded its images "
                          f"without it (config.json); resume without it (a resume keeps the "
                          f"run's decoder)")
    if wanted["gpu_decode"] and not str(device or "").startswith("cuda"):
        warnings.warn(f"{path} was trained with --gpu-decode (nvJPEG); resumed on {device}, "
                      f"its remaining epochs decode with PIL (pixels a few levels off)",
                      stacklevel=3)
        wanted["gpu_decode"] = False
    return dataclasses.replace(accel, **wanted)
