"""One run (or one group of stacked runs) in a worker process, and its store row."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import traceback
import uuid
from pathlib import Path

from ..pool import cached_splits


def _row_header(task: dict) -> dict:
    """The store columns a task dict fixes before it runs (identity, grid point, config)."""
    row = {c: task[c] for c in ("run_id", "study", "method", "loss", "dataset", "regime", "seed",
                                "mode")}
    row.update(variant=json.dumps(task["variant"], sort_keys=True),
               batch_size=_number(int, task["train"].get("batch_size")),
               lr=_number(float, task["train"].get("lr")),
               config=json.dumps({k: task[k] for k in ("method", "loss", "dataset",
                                                       "dataset_options", "regime", "hparams",
                                                       "k", "mode", "train", "mode_options",
                                                       "variant")}, default=str))
    return row


def _number(kind, value):
    """``kind(value)``, None kept (a mode without batches: the solver's runs)."""
    return None if value is None else kind(value)


def lost_row(task: dict, reason: str) -> dict:
    """The ``failed`` store row of a task whose worker process died on every try (``reason``,
    from `spmlkit.experiments.pool.run_tasks`, says how and how often)."""
    return {**_row_header(task), "status": "failed", "error": reason, "seconds": None,
            "metrics": "{}"}


def resumable(folder: Path) -> bool:
    """Whether a run folder left by an earlier try can be continued rather than replaced: it has
    its ``config.json`` and a ``checkpoint.pt`` (or is finished: ``final.json``)."""
    from ...runs import CHECKPOINT_FILE, CONFIG_FILE, FINAL_FILE

    return (folder / CONFIG_FILE).is_file() and ((folder / CHECKPOINT_FILE).is_file()
                                                  or (folder / FINAL_FILE).is_file())


def _failed_row(task: dict, err: BaseException, text: str, seconds: float) -> dict:
    row = _row_header(task)
    if isinstance(err, FloatingPointError):
        text = f"diverged: {err}\n{text}"
    row.update(status="failed", error=text[-6000:], seconds=seconds, metrics="{}")
    return row


def _done_row(task: dict, res: dict, k) -> dict:
    row = _row_header(task)
    res = dict(res)
    run_dir = res.pop("run_dir", None)
    if run_dir is not None:
        try:  # relative to the study folder, so the folder can move
            run_dir = str(Path(run_dir).resolve().relative_to(
                Path(task["runs_root"]).resolve().parent))
        except ValueError:
            pass
    res["k_used"] = k
    row.update(status="done", val_map=res.get("val_map"), test_map=res.get("test_map"),
               train_recovery_map=res.get("train_recovery_map"),
               best_epoch=res.get("best_epoch"), seconds=res.get("seconds"),
               metrics=json.dumps(res, default=_plain), run_dir=run_dir)
    return row


def _task_setup(task: dict):
    """``(splits, k, method, options)`` of a task dict: the splits (cached per worker), the
    resolved k, the training method and its options (no per-run progress bars)."""
    from ...methods import get_method, resolve_k

    splits = cached_splits(task["dataset"], task["regime"], task["dataset_options"])
    k = resolve_k(task["k"], splits, task["seed"])
    method = get_method(task["mode"])
    options = dict(task["mode_options"])
    if "progress" in method.options:  # per-run bars would garble the study's bar
        options.setdefault("progress", False)
    return splits, k, method, options


def run_task(task: dict) -> list[dict]:
    """What the study's workers run: a task dict of one run (`execute`) or of a group of
    runs trained at once (``{"group": [task, ...], ...}``, `execute_group`); the store
    rows, one per run."""
    return execute_group(task) if "group" in task else [execute(task)]


def lost_rows(task: dict, reason: str) -> list[dict]:
    """`lost_row` of every run of a (group) task."""
    return [lost_row(t, reason) for t in task.get("group", [task])]


def execute_group(task: dict) -> list[dict]:
    """Run a group of task dicts at once (the linear mode's stacked runs,
    `spmlkit.methods.train_runs`; `group_tasks` says which runs group); one store
    row per run, each as `execute` would have made it: a run that fails (its data or k
    cannot be set up, its loss raises, it diverges) fails alone, the others train on."""
    from ...engine import TrainConfig
    from ...methods import train_runs

    t0 = time.perf_counter()
    members = [{**m, "runs_root": task["runs_root"]} for m in task["group"]]
    for m in members:
        folder = Path(m["runs_root"]) / m["run_id"]
        if folder.exists():  # left by a try whose worker died: the retry replaces it
            _safe_remove(folder, folder.parent / ".stale")
    rows: list = [None] * len(members)
    setups, ready = [], []
    for i, m in enumerate(members):  # a run whose data or k cannot be set up fails alone
        try:
            setups.append(_task_setup(m))  # splits cached: one load per regime
            ready.append(i)
        except Exception as err:  # noqa: BLE001 (recorded; the group's other runs go on)
            rows[i] = _failed_row(m, err, traceback.format_exc(), time.perf_counter() - t0)
    if not ready:
        return rows
    group = [members[i] for i in ready]
    first = group[0]
    try:
        method, options = setups[0][2], setups[0][3]
        ks = [setup[1] for setup in setups]
        results = train_runs(method, [setup[0] for setup in setups],
                             [m["loss"] for m in group], [dict(m["hparams"]) for m in group],
                             [TrainConfig(**m["train"]) for m in group], k=ks,
                             out=first["runs_root"], run_names=[m["run_id"] for m in group],
                             dataset_options=first["dataset_options"], **options)
    except Exception as err:  # every run of the group failed with it
        text = traceback.format_exc()
        for i, m in zip(ready, group):
            rows[i] = _failed_row(m, err, text, time.perf_counter() - t0)
        return rows
    for i, m, res, k in zip(ready, group, results, ks):
        if isinstance(res, BaseException):
            text = "".join(traceback.format_exception(type(res), res, res.__traceback__))
            rows[i] = _failed_row(m, res, text, None)
        else:
            rows[i] = _done_row(m, res, k)
    return rows



def execute(task: dict) -> dict:
    """Run one task dict (``RunTask`` fields plus ``runs_root``, the folder the run folder is
    made in, and optionally ``checkpoint_seconds``) and return its store row; an exception
    becomes a ``failed`` row with the traceback.

    A run folder left by an earlier try (a worker that died, a launch that was stopped) is
    *resumed* from its ``checkpoint.pt`` ([`spmlkit.methods.train_run`][spmlkit.methods.train_run]
    with ``resume``; the epochs after the checkpoint are trained again, none twice in
    ``metrics.jsonl``), or read back if it finished; one without a checkpoint, or one that cannot be
    resumed (`spmlkit.methods.ResumeError`), is replaced by a fresh run.
    """
    from ...engine import TrainConfig
    from ...methods import ResumeError, train_run

    from ...safe_write import own_folder

    t0 = time.perf_counter()
    folder = Path(task["runs_root"]) / task["run_id"]
    try:  # a link planted at the run's name: never resumed, replaced or written through
        own_folder(folder, create=False)
    except OSError as err:
        return _failed_row(task, err, f"{err.filename}: {err.strerror}", time.perf_counter() - t0)
    resume = None
    if folder.exists():
        if resumable(folder):
            resume = folder
        else:  # killed before its first checkpoint: nothing to continue from
            _safe_remove(folder, folder.parent / ".stale")
    try:
        splits, k, method, options = _task_setup(task)

        def train(resume):
            return train_run(method, splits, task["loss"], dict(task["hparams"]),
                             TrainConfig(**task["train"]), k=k, out=task["runs_root"],
                             run_name=task["run_id"], dataset_options=task["dataset_options"],
                             resume=resume, checkpoint_seconds=task.get("checkpoint_seconds"),
                             **options)

        try:
            res = train(resume)
        except ResumeError:
            if resume is None:
                raise
            _safe_remove(folder, folder.parent / ".stale")
            res = train(None)
    except Exception as err:  # recorded as a failed run; the study goes on
        return _failed_row(task, err, traceback.format_exc(), time.perf_counter() - t0)
    return _done_row(task, res, k)




def _plain(obj):
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)



def _safe_remove(folder: Path, trash: Path) -> None:
    """Move a stale run folder out of the way atomically (a rename), then delete it; the
    trash folder goes too once it is empty (another worker may be using it: then it stays,
    and a worker whose trash folder was just removed makes it again)."""
    target = trash / f"{folder.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    for attempt in range(5):
        trash.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(folder, target)
            break
        except FileNotFoundError:
            if not folder.exists() or attempt == 4:
                raise
    shutil.rmtree(target, ignore_errors=True)
    with contextlib.suppress(OSError):
        trash.rmdir()

