"""Launching a study: :func:`run_study` runs the missing runs and records the launch."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

from ...runs import make_folder, write_text
from ..pool import InProcessExecutor, LocalExecutor, default_jobs, run_tasks
from ..store import StudyStore
from .expand import RunTask, expand
from .folder import failure_groups
from .grouping import group_tasks
from .layout import LAUNCHES_FILE, RESULTS_FILE, RUNS_DIR, SPEC_FILE, STUDIES_ROOT
from .loading import load_study
from .spec import StudySpec
from .worker import lost_rows, run_task


@contextlib.contextmanager
def _closing(executor):
    """A context that closes ``executor`` (a connected Dask executor, None: nothing) when it
    ends, whatever ends it."""
    try:
        yield executor
    finally:
        if executor is not None:
            executor.close()


@contextlib.contextmanager
def _study_lock(out: Path):
    """One launch per study folder at a time (an advisory ``flock`` on ``<out>/.lock``)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    fh = open(out / ".lock", "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            raise ValueError(f"{out} is being run by another launch (pid {holder}); wait for it "
                             f"or stop it first") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield
    finally:
        fh.close()


@contextlib.contextmanager
def _unless_refused(out: Path, created: bool):
    """A launch refused before it was recorded (``launches.jsonl``) leaves no study folder it
    made itself (a bad --jobs, a missing scheduler file, ...)."""
    try:
        yield
    except BaseException:
        if created and not (out / LAUNCHES_FILE).exists():
            shutil.rmtree(out, ignore_errors=True)
        raise


@contextlib.contextmanager
def _sigterm_as_exit():
    """SIGTERM (``timeout``, ``kill``) unwinds like Ctrl-C, so the workers are stopped too."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _update_launch(path: Path, launch: dict) -> None:
    lines = path.read_text().splitlines() if path.exists() else []
    out, found = [], False
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            out.append(line)
            continue
        if isinstance(rec, dict) and rec.get("launch_id") == launch["launch_id"]:
            line, found = json.dumps(launch), True
        out.append(line)
    if not found:
        out.append(json.dumps(launch))
    write_text(path, "\n".join(out) + "\n")


def _import_mlflow():
    try:
        import mlflow
    except ImportError:
        raise ModuleNotFoundError("mlflow logging was asked for (mlflow=True, --mlflow or "
                                  "`mlflow: true` in the spec) but mlflow is not installed: "
                                  "pip install mlflow") from None
    return mlflow


def _log_mlflow(mlflow, task: RunTask, row: dict) -> None:
    params = {"method": task.method, "loss": task.loss, "dataset": task.dataset,
              "regime": task.regime, "seed": task.seed, "batch_size": task.batch_size,
              "lr": task.lr, "mode": task.mode, "epochs": task.train.get("epochs"),
              "k": task.k, "variant": json.dumps(task.variant, sort_keys=True),
              **{f"hparams.{k}": v for k, v in task.hparams.items()},
              **{f"data.{k}": v for k, v in task.dataset_options.items()}}
    metrics = {k: float(row[k]) for k in ("val_map", "test_map", "train_recovery_map",
                                          "best_epoch", "seconds")
               if isinstance(row.get(k), (int, float)) and row[k] == row[k]}
    with mlflow.start_run(run_name=task.run_id):
        mlflow.log_params({k: str(v) for k, v in params.items()})
        if metrics:
            mlflow.log_metrics(metrics)
        mlflow.set_tag("status", row["status"])


def run_study(spec, out=None, jobs: int | None = None, progress: bool = True,
              mlflow: bool = False, *, argv=None, retry_failed: bool = False,
              threads: int | None = None, retries: int = 1,
              checkpoint_seconds: float | None = None, dask: str | None = None,
              scheduler_file=None, executor=None, vectorise: bool = True,
              connect_timeout: float | None = None) -> dict:
    """Run a study's missing runs in parallel; every finished run's row goes to the store at once.

    Args:
        spec: a :class:`StudySpec`, or anything :func:`load_study` reads.
        out: the study folder (default ``runs/studies/<name>``): ``study.yaml`` (the resolved
            spec), ``results.sqlite``, ``runs/<run_id>/``, ``launches.jsonl``.
        jobs: worker processes (default: the CPU count; 1: in this process), also those of a
            Dask ``LocalCluster`` (``dask="local"``); not with a running cluster (``dask`` an
            address, ``scheduler_file``), which has the workers it has.
        progress: a tqdm bar (runs done / total, failures, ETA).
        mlflow: also log each run's parameters and final metrics to MLflow (as does
            ``mlflow: true`` in the spec); needs ``pip install mlflow``.
        argv: the command line recorded in ``launches.jsonl`` (the CLI passes ``sys.argv``).
        retry_failed: run the runs recorded as failed again.
        threads: torch threads per worker (default 1 in linear mode, else cores / jobs).
        retries: how many more times a run whose worker process died (killed by the
            out-of-memory killer, say) is run (alone, in the local pool) before it is recorded
            as ``failed`` with the reason (:func:`spmlkit.experiments.pool.run_tasks`; on Dask
            see :mod:`spmlkit.experiments.dask_executor`). A retried run resumes from
            its ``checkpoint.pt`` (:func:`execute`), as does a run of an earlier launch that
            was stopped.
        checkpoint_seconds: how often a run writes its resumable checkpoint (seconds between
            writes, after an epoch; default
            :data:`spmlkit.methods.base.CHECKPOINT_SECONDS`; 0: every epoch).
        dask: run on Dask distributed (``pip install -e ".[dask]"`` in the clone): ``"local"`` for a
            ``LocalCluster`` of ``jobs`` worker processes on this machine, or a scheduler's
            address (``"tcp://host:8786"``); the study folder must be visible to the workers at
            the same path (:mod:`spmlkit.experiments.dask_executor`).
        scheduler_file: run on the Dask scheduler this JSON file names (``dask scheduler
            --scheduler-file``, dask-jobqueue). The scheduler is reached before anything is
            written; the stacks are cut for the worker threads it has then.
        executor: any :class:`spmlkit.experiments.pool.Executor` (overrides ``jobs``,
            ``dask`` and ``scheduler_file``).
        vectorise: train the runs that differ only in seed and learning rate together where
            the mode and loss can (:func:`group_tasks`; the linear mode's stacked runs, same
            results up to floating-point summation order); False: one task per run. A group
            whose worker dies is retried (or lost) as a whole and restarts from scratch.
        connect_timeout: seconds a Dask scheduler gets to answer (default
            :data:`spmlkit.experiments.dask_executor.CONNECT_TIMEOUT`).

    Returns:
        ``{"out", "runs_total", "runs_done_before", "runs_run", "failures", "seconds",
        "jobs", "executor", "failure_groups"}`` (``executor``: where the runs ran, in words);
        ``failure_groups``: this launch's failed runs grouped by their error
        (:func:`failure_groups`), also summarised in ``launches.jsonl``.

    Raises:
        ModuleNotFoundError: mlflow, or dask for ``dask`` / ``scheduler_file``, asked for but
            not installed.
        ValueError: the spec is invalid, another launch runs the same folder, both
            ``dask`` and ``scheduler_file`` are given, or the scheduler address is not one.
        FileNotFoundError: ``scheduler_file`` does not exist.
        ConnectionError: the Dask scheduler cannot be reached (nothing is written then).
        spmlkit.experiments.dask_executor.SchedulerLost: the Dask scheduler went away
            mid-study (a ConnectionError; the finished runs are in the store, the same call
            against a running scheduler runs the missing ones).
    """
    from tqdm import tqdm

    from ...methods import get_method

    spec = load_study(spec)
    mlflow_module = _import_mlflow() if (mlflow or spec.mlflow) else None
    if checkpoint_seconds is not None and not checkpoint_seconds >= 0:
        raise ValueError(f"checkpoint_seconds (seconds between checkpoints) must be >= 0, got "
                         f"{checkpoint_seconds}")
    if dask is not None and scheduler_file is not None:
        raise ValueError("give --dask (local or a scheduler address) or --scheduler-file, not "
                         "both")
    if connect_timeout is not None and scheduler_file is None and dask in (None, "local"):
        raise ValueError("connect_timeout is for a running Dask cluster (--scheduler, "
                         "--scheduler-file)")
    cluster = None  # a running Dask cluster's executor, connected before anything is written
    if dask is not None or scheduler_file is not None:
        from ..dask_executor import DaskExecutor, import_distributed

        import_distributed()  # before anything is written: says how to install it
        if executor is None and dask != "local":
            options = {} if connect_timeout is None else {"connect_timeout": connect_timeout}
            cluster = DaskExecutor(dask, scheduler_file=scheduler_file, **options)
            if jobs is not None:  # (after the address is checked: the more basic error first)
                raise ValueError(f"jobs ({jobs}) is the size of a local pool or a Dask "
                                 f"LocalCluster; a running Dask cluster has the workers it has")
            cluster.connect()
    out = Path(out) if out is not None else STUDIES_ROOT / spec.name
    created = not out.exists()
    out = make_folder(out)
    with _closing(cluster), _study_lock(out), _unless_refused(out, created):
        write_text(out / SPEC_FILE, spec.to_yaml())
        make_folder(out / RUNS_DIR)  # a file in its place: refused here, not by every run
        store = StudyStore(out / RESULTS_FILE)
        tasks = expand(spec)
        status = {r["run_id"]: r["status"] for r in store.rows()}
        skip = {"done"} if retry_failed else {"done", "failed"}
        todo = [t for t in tasks if status.get(t.run_id) not in skip]
        finished_before = len(tasks) - len(todo)
        # longest first (small batches, stateful losses), for a balanced pool
        todo.sort(key=lambda t: (t.batch_size, t.loss != "role"))
        jobs = default_jobs(jobs, len(todo)) if cluster is None else cluster.slots()
        threads_given = threads is not None
        # feature-vector runs only (every method's mode): one thread each
        on_features = all(get_method(t.mode).inputs == "features" for t in todo or tasks)
        if threads is None:
            threads = 1 if on_features else \
                max(1, (os.cpu_count() or 1) // jobs)
        from ...methods import versions

        if cluster is not None:
            if not threads_given:  # the worker machines' cores are theirs to count
                threads = 1 if on_features else None
            cluster.threads = threads
            executor = cluster  # jobs: its worker threads now, for the launch record
        elif executor is None and dask == "local":
            executor = DaskExecutor(n_workers=jobs, threads=threads)
        where = executor.describe() if executor is not None else \
            InProcessExecutor().describe() if jobs <= 1 else LocalExecutor(jobs).describe()
        launch = {"launch_id": uuid.uuid4().hex, "argv": list(argv) if argv else None,
                  "started": _now(), "finished": None, "runs_total": len(tasks),
                  "runs_done_before": finished_before, "runs_run": 0, "failures": 0,
                  "seconds": None, "jobs": jobs, "executor": where, "versions": versions()}
        launches = out / LAUNCHES_FILE
        with open(launches, "a") as fh:
            fh.write(json.dumps(launch) + "\n")
        runs_root = out / RUNS_DIR
        with contextlib.suppress(OSError):
            (runs_root / ".stale").rmdir()  # when empty
        on_vectors = [t for t in todo if get_method(t.mode).inputs == "features"]
        if on_vectors:
            _prepare_features(spec, on_vectors, progress)
        if mlflow_module is not None and todo:
            mlflow_module.set_experiment(spec.name)
        by_id = {t.run_id: t for t in todo}
        units = group_tasks(todo, jobs) if vectorise else list(todo)
        units.sort(key=lambda u: -len(u) if isinstance(u, list) else 0)  # groups first
        root = str(runs_root.resolve())
        payloads = []
        for u in units:
            if isinstance(u, list):
                members = [dataclasses.asdict(t) for t in u]
                payloads.append({"run_id": f"{u[0].run_id}+{len(u) - 1}", "group": members,
                                 "runs_root": root})
            else:
                payloads.append({**dataclasses.asdict(u), "runs_root": root,
                                 "checkpoint_seconds": checkpoint_seconds})
        bar = tqdm(total=len(tasks), initial=finished_before, desc=f"study {spec.name}",
                   unit="run", disable=not progress)
        if finished_before and progress:
            bar.write(f"resuming {out}: {finished_before} of {len(tasks)} run(s) already "
                      f"finished")
        start = time.perf_counter()
        failed_rows = []
        try:
            with _sigterm_as_exit():
                for rows in run_tasks(run_task, payloads, jobs, threads, retries=retries,
                                      on_lost=lost_rows, executor=executor):
                    store.put_many(rows)  # a group's rows in one transaction
                    for row in rows:
                        launch["runs_run"] += 1
                        launch["failures"] += row["status"] == "failed"
                        if row["status"] == "failed":
                            failed_rows.append(row)
                        if mlflow_module is not None:
                            _log_mlflow(mlflow_module, by_id[row["run_id"]], row)
                        val = row.get("val_map")
                        last = f"val {val:.1f}" if isinstance(val, float) else row["status"]
                        bar.set_postfix_str(f"failed {launch['failures']}, last "
                                            f"{row['method']} {last}")
                        bar.update()
                    _update_launch(launches, launch)  # a killed launch's record stays true
            launch["finished"] = _now()
        finally:
            bar.close()
            launch["seconds"] = time.perf_counter() - start
            groups = failure_groups(failed_rows)
            if groups:
                launch["failure_reasons"] = [{"reason": g["reason"], "count": g["count"],
                                              "first": g["run_ids"][0]} for g in groups]
            _update_launch(launches, launch)
    return {"out": str(out), **{k: launch[k] for k in ("runs_total", "runs_done_before",
                                                       "runs_run", "failures", "seconds",
                                                       "jobs", "executor")},
            "failure_groups": groups}


def _prepare_features(spec: StudySpec, todo, progress: bool = True) -> None:
    """Image sources on a backbone's features: extract them once here (a progress bar unless
    ``progress`` is False), before the workers all want them."""
    from ...data import load_dataset

    wanted = {t.dataset for t in todo}
    for ds in spec.datasets:  # the spec's own options (a data.* vary axis is the runs' business)
        if ds.options.get("backbone") and ds.name in wanted:
            options = dict(ds.options)
            options["features"] = {"progress": progress, **(options.get("features") or {})}
            load_dataset(ds.name, **options)

