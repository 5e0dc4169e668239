"""Launching a study: [`run_study`][spmlkit.experiments.study.launch.run_study] runs the missing
runs and records the launch."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ...safe_write import append_own, make_folder, own_folder, write_text
from ..pool import InProcessExecutor, LocalExecutor, default_jobs, run_tasks
from ..store import StudyStore
from .expand import RunTask, expand
from .folder import failure_groups
from .grouping import group_tasks
from .layout import (LAUNCHES_FILE, RESULTS_FILE, RUNS_DIR, SPEC_FILE, STUDIES_ROOT,
                     check_study_folder)
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
    from ...safe_write import open_own

    fh = os.fdopen(open_own(out / ".lock", os.O_RDWR | os.O_CREAT), "r+")
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
        spec: a `StudySpec`, or anything
            [`load_study`][spmlkit.experiments.study.loading.load_study] reads.
        out: the study folder (default ``runs/studies/<name>``): ``study.yaml`` (the resolved
            spec), ``results.sqlite``, ``runs/<run_id>/``, ``launches.jsonl``.
        jobs: worker processes (default: the CPU count; 1: in this process), also those of a
            Dask ``LocalCluster`` (``dask="local"``); not with a running cluster (``dask`` an
            address, ``scheduler_file``), which has the workers it has.
        progress: a tqdm bar of the planned run-epochs (runs done / total, failures, an ETA
            from the launch's average rate).
        mlflow: also log each run's parameters and final metrics to MLflow (as does
            ``mlflow: true`` in the spec); needs ``pip install mlflow``.
        argv: the command line recorded in ``launches.jsonl`` (the CLI passes ``sys.argv``).
        retry_failed: run the runs recorded as failed again.
        threads: torch threads per worker (default 1 in linear mode, else cores / jobs).
        retries: how many more times a run whose worker process died (killed by the
            out-of-memory killer, say) is run (alone, in the local pool) before it is recorded
            as ``failed`` with the reason (`spmlkit.experiments.pool.run_tasks`; on Dask
            see `spmlkit.experiments.dask_executor`). A retried run resumes from
            its ``checkpoint.pt`` (`execute`), as does a run of an earlier launch that
            was stopped.
        checkpoint_seconds: how often a run writes its resumable checkpoint (seconds between
            writes, after an epoch; default
            `spmlkit.methods.driver.CHECKPOINT_SECONDS`; 0: every epoch).
        dask: run on Dask distributed (``pip install -e ".[dask]"`` in the clone): ``"local"`` for a
            ``LocalCluster`` of ``jobs`` worker processes on this machine, or a scheduler's
            address (``"tcp://host:8786"``); the study folder must be visible to the workers at
            the same path (`spmlkit.experiments.dask_executor`).
        scheduler_file: run on the Dask scheduler this JSON file names (``dask scheduler
            --scheduler-file``, dask-jobqueue). The scheduler is reached before anything is
            written; the stacks are cut for the worker threads it has then.
        executor: any `spmlkit.experiments.pool.Executor` (overrides ``jobs``,
            ``dask`` and ``scheduler_file``).
        vectorise: train the runs that differ only in seed, learning rate and weight decay
            together where the mode and loss can (`group_tasks`; the linear mode's
            stacked runs, same results up to floating-point summation order); False: one task
            per run. A group
            whose worker dies is retried (or lost) as a whole and restarts from scratch.
        connect_timeout: seconds a Dask scheduler gets to answer (default
            `spmlkit.experiments.dask_executor.CONNECT_TIMEOUT`).

    Returns:
        ``{"out", "runs_total", "runs_done_before", "runs_run", "failures", "seconds",
        "jobs", "executor", "failure_groups"}`` (``executor``: where the runs ran, in words);
        ``failure_groups``: this launch's failed runs grouped by their error
        (`failure_groups`), also summarised in ``launches.jsonl``.

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
    options = LaunchOptions(out=out, jobs=jobs, progress=progress, mlflow=mlflow, argv=argv,
                            retry_failed=retry_failed, threads=threads, retries=retries,
                            checkpoint_seconds=checkpoint_seconds, dask=dask,
                            scheduler_file=scheduler_file, executor=executor,
                            vectorise=vectorise, connect_timeout=connect_timeout)
    spec = load_study(spec)
    res = Launch(spec, options).run()
    from ..reference import SKLEARN_FILE

    if spec.sklearn_reference:
        from ...safe_write import write_json
        from ..reference import study_references

        write_json(Path(res["out"]) / SKLEARN_FILE, study_references(spec))
    else:  # an earlier launch's rows (other data, other seeds) are not this spec's: the tables
        # would show them beside its methods (`spml benchmark` writes its own after this)
        (Path(res["out"]) / SKLEARN_FILE).unlink(missing_ok=True)
    return res


def check_data_paths(spec: StudySpec) -> None:
    """Refuse a dataset entry whose file or folder option names nothing there, before anything
    is written: each of its runs would fail alone, stored as failed (a relaunch then needs
    --retry-failed). The message names the absolute path looked at: a relative path is taken
    from the folder spml runs in, not the spec's."""
    from ...data.options import path_options

    for d in spec.datasets:
        paths = path_options(d.name)
        for key, value in d.options.items():
            if key not in paths or not isinstance(value, str) or "cache" in key:
                continue  # (a cache folder is made where it is missing)
            path = Path(value).expanduser()
            if not path.exists():
                raise ValueError(f"dataset {d.name!r}: option {key}={value} names nothing at "
                                 f"{path.resolve()} (a relative path is taken from the folder "
                                 f"spml runs in, {Path.cwd()}, not the spec's folder)")


@dataclass(frozen=True)
class LaunchOptions:
    """How a study is launched: [`run_study`][spmlkit.experiments.study.launch.run_study]'s keywords
    (see there), checked by
    `check` before anything is written."""

    out: object = None
    jobs: int | None = None
    progress: bool = True
    mlflow: bool = False
    argv: object = None
    retry_failed: bool = False
    threads: int | None = None
    retries: int = 1
    checkpoint_seconds: float | None = None
    dask: str | None = None
    scheduler_file: object = None
    executor: object = None
    vectorise: bool = True
    connect_timeout: float | None = None

    def check(self) -> None:
        """Refuse options that contradict each other (a ``ValueError`` naming them)."""
        if self.checkpoint_seconds is not None and not self.checkpoint_seconds >= 0:
            raise ValueError(f"checkpoint_seconds (seconds between checkpoints) must be >= 0, "
                             f"got {self.checkpoint_seconds}")
        if self.dask is not None and self.scheduler_file is not None:
            raise ValueError("give --dask (local or a scheduler address) or --scheduler-file, "
                             "not both")
        if self.connect_timeout is not None and self.scheduler_file is None and \
                self.dask in (None, "local"):
            raise ValueError("connect_timeout is for a running Dask cluster (--scheduler, "
                             "--scheduler-file)")

    @property
    def on_dask(self) -> bool:
        return self.dask is not None or self.scheduler_file is not None

    def connect(self):
        """A running Dask cluster's executor, connected (before anything is written), or None
        (the local pool, a Dask LocalCluster made later, or the given ``executor``)."""
        if not self.on_dask:
            return None
        from ..dask_executor import DaskExecutor, import_distributed

        import_distributed()  # before anything is written: says how to install it
        if self.executor is not None or self.dask == "local":
            return None
        options = {} if self.connect_timeout is None else \
            {"connect_timeout": self.connect_timeout}
        cluster = DaskExecutor(self.dask, scheduler_file=self.scheduler_file, **options)
        if self.jobs is not None:  # (after the address is checked: the more basic error first)
            raise ValueError(f"jobs ({self.jobs}) is the size of a local pool or a Dask "
                             f"LocalCluster; a running Dask cluster has the workers it has")
        cluster.connect()
        return cluster


class Launch:
    """One launch of a study (what [`run_study`][spmlkit.experiments.study.launch.run_study] does),
    step by step: `run` checks the options and reaches a Dask cluster before anything is written,
        then, holding the study
    folder's lock, writes the spec, finds the runs still to do (`plan`), picks the
    workers (`place`), records the launch in ``launches.jsonl`` (`record`),
    prepares the runs' data (`prepare`), cuts them into worker tasks
    (`payloads`) and stores every row that comes back (`execute`)."""

    def __init__(self, spec: StudySpec, options: LaunchOptions):
        self.spec, self.options = spec, options
        self.mlflow = _import_mlflow() if (options.mlflow or spec.mlflow) else None
        options.check()
        self.out = Path(options.out) if options.out is not None else STUDIES_ROOT / spec.name
        self.cluster = None    # a running Dask cluster's executor
        self.executor = options.executor
        self.store = None
        self.tasks: list = []  # every run of the spec
        self.todo: list = []   # the runs this launch runs
        self.jobs = self.threads = None
        self.launch_record: dict = {}

    def run(self) -> dict:
        check_study_folder(self.out)  # (before a cluster is reached: nothing to close)
        check_data_paths(self.spec)
        self.cluster = self.options.connect()
        created = not self.out.exists()
        self.out = make_folder(self.out)
        with _closing(self.cluster), _study_lock(self.out), \
                _unless_refused(self.out, created):
            self.plan()
            self.place()
            self.check_checkpoints()
            self.record()
            self.prepare()
            groups = self.execute(self.payloads())
        return {"out": str(self.out),
                **{k: self.launch_record[k] for k in ("runs_total", "runs_done_before", "runs_run",
                                                "failures", "seconds", "jobs", "executor")},
                "failure_groups": groups}

    @property
    def launches(self) -> Path:
        return self.out / LAUNCHES_FILE

    @property
    def runs_root(self) -> Path:
        return self.out / RUNS_DIR

    def plan(self) -> None:
        """Write the spec, open the store, and find the runs to do (not done; not failed
        either, unless ``retry_failed``), the longest first."""
        # the store first: it marks the folder as a study's (layout.STUDY_MARKERS), so a
        # launch stopped in between leaves a folder the next launch takes up
        self.store = StudyStore(self.out / RESULTS_FILE)
        write_text(self.out / SPEC_FILE, self.spec.to_yaml())
        own_folder(self.runs_root)  # a file or a link there: refused here, not by every run
        self.tasks = expand(self.spec)
        for where in _cache_dirs_outside(self.tasks, self.out):
            print(f"note: the spec's cache_dir: feature stores are read and written in {where} "
                  f"(outside the study folder)", file=sys.stderr)
        status = {r["run_id"]: r["status"] for r in self.store.rows()}
        skip = {"done"} if self.options.retry_failed else {"done", "failed"}
        self.todo = [t for t in self.tasks if status.get(t.run_id) not in skip]
        # longest first (small batches, stateful losses), for a balanced pool
        self.todo.sort(key=lambda t: (t.batch_size or 0, t.loss != "role"))

    def place(self) -> None:
        """How many workers (``jobs``), torch threads each, and the executor."""
        from ...methods import get_method

        opts, cluster = self.options, self.cluster
        self.jobs = default_jobs(opts.jobs, len(self.todo)) if cluster is None else \
            cluster.slots()
        # feature-vector runs only (every method's mode): one thread each
        on_features = all(get_method(t.mode).inputs == "features"
                          for t in self.todo or self.tasks)
        threads = opts.threads
        if threads is None:
            threads = 1 if on_features else max(1, (os.cpu_count() or 1) // self.jobs)
        if cluster is not None:
            if opts.threads is None:  # the worker machines' cores are theirs to count
                threads = 1 if on_features else None
            cluster.threads = threads
            self.executor = cluster  # jobs: its worker threads now, for the launch record
        elif self.executor is None and opts.dask == "local":
            from ..dask_executor import DaskExecutor

            self.executor = DaskExecutor(n_workers=self.jobs, threads=threads)
        self.threads = threads

    def record(self) -> None:
        """Append this launch's record to ``launches.jsonl`` (updated as runs come back)."""
        from ...methods import versions

        if self.executor is not None:
            where = self.executor.describe()
        elif self.jobs <= 1:
            where = InProcessExecutor().describe()
        else:
            where = LocalExecutor(self.jobs).describe()
        argv = self.options.argv
        self.launch_record = {"launch_id": uuid.uuid4().hex, "argv": list(argv) if argv else None,
                        "cwd": os.getcwd(), "started": _now(), "finished": None,
                        "runs_total": len(self.tasks),
                        "runs_done_before": len(self.tasks) - len(self.todo), "runs_run": 0,
                        "failures": 0, "seconds": None, "jobs": self.jobs, "executor": where,
                        "versions": versions()}
        append_own(self.launches, json.dumps(self.launch_record) + "\n")

    def prepare(self) -> None:
        """Before the workers start: the trash of stale run folders goes (when empty), image
        sources' backbone features are extracted once, MLflow gets the study's experiment."""
        from ...methods import get_method

        with contextlib.suppress(OSError):
            (self.runs_root / ".stale").rmdir()  # when empty
        on_vectors = [t for t in self.todo if get_method(t.mode).inputs == "features"]
        if on_vectors:
            _prepare_features(self.spec, on_vectors, self.options.progress)
        if self.mlflow is not None and self.todo:
            self.mlflow.set_experiment(self.spec.name)

    def check_checkpoints(self) -> None:
        """``checkpoint_seconds`` applies to the runs trained alone: stacked runs (the linear
        mode's vectorised groups) keep no checkpoint. Refused when every run of the launch is
        stacked (it would do nothing); a warning names the stacked ones otherwise."""
        import warnings

        if self.options.checkpoint_seconds is None or not self.options.vectorise or \
                not self.todo:
            return
        stacked = sum(len(u) for u in group_tasks(self.todo, self.jobs) if isinstance(u, list))
        how = ("stacked runs (the linear mode trains runs that differ only in seed, lr and "
               "weight decay as one model) keep no checkpoint: a stopped stack trains again; "
               "--no-vectorise trains them one by one, with checkpoints")
        if stacked == len(self.todo):
            raise ValueError(f"--checkpoint-seconds: every run this launch trains is stacked, "
                             f"and {how}; give --no-vectorise, or leave the option out")
        if stacked:
            warnings.warn(f"--checkpoint-seconds applies to the {len(self.todo) - stacked} "
                          f"run(s) trained alone; {stacked} {how}", stacklevel=2)

    def payloads(self) -> list:
        """The worker tasks: stacked groups (`group_tasks`, unless ``vectorise`` is
        False) first, then single runs, as dicts."""
        units = group_tasks(self.todo, self.jobs) if self.options.vectorise else \
            list(self.todo)
        units.sort(key=lambda u: -len(u) if isinstance(u, list) else 0)  # groups first
        root = str(self.runs_root.resolve())
        payloads = []
        for u in units:
            if isinstance(u, list):
                members = [dataclasses.asdict(t) for t in u]
                payloads.append({"run_id": f"{u[0].run_id}+{len(u) - 1}", "group": members,
                                 "runs_root": root})
            else:
                payloads.append({**dataclasses.asdict(u), "runs_root": root,
                                 "checkpoint_seconds": self.options.checkpoint_seconds})
        return payloads

    def execute(self, payloads: list) -> list:
        """Run the tasks; store each row as it comes back (and log it to MLflow); keep the
        launch record true after every task, and at the end, however it ends. Returns this
        launch's failed runs grouped by their error (`failure_groups`)."""
        from tqdm import tqdm

        launch, spec, progress = self.launch_record, self.spec, self.options.progress
        finished_before = launch["runs_done_before"]
        by_id = {t.run_id: t for t in self.todo}
        # the bar counts work, not runs: each run weighs its planned epochs, and its ETA is the
        # launch's average rate (smoothing 0); runs come back in groups (a stack of runs ends
        # at once), so a per-run rate would swing by the size of a stack
        work = {t.run_id: planned_epochs(t) for t in self.todo}
        bar = tqdm(total=sum(work.values()), desc=f"study {spec.name}", unit="run-epoch",
                   smoothing=0, disable=not progress)
        done = finished_before
        if finished_before and progress:
            bar.write(f"resuming {self.out}: {finished_before} of {len(self.tasks)} run(s) "
                      f"already finished")
        start = time.perf_counter()
        failed_rows = []
        try:
            with _sigterm_as_exit():
                for rows in run_tasks(run_task, payloads, self.jobs, self.threads,
                                      retries=self.options.retries, on_lost=lost_rows,
                                      executor=self.executor):
                    self.store.put_many(rows)  # a group's rows in one transaction
                    for row in rows:
                        launch["runs_run"] += 1
                        launch["failures"] += row["status"] == "failed"
                        if row["status"] == "failed":
                            failed_rows.append(row)
                        if self.mlflow is not None:
                            _log_mlflow(self.mlflow, by_id[row["run_id"]], row)
                        val = row.get("val_map")
                        last = f"val {val:.1f}" if isinstance(val, float) else row["status"]
                        done += 1
                        bar.set_postfix_str(f"{done}/{len(self.tasks)} runs, failed "
                                            f"{launch['failures']}, last {row['method']} {last}",
                                            refresh=False)
                    bar.update(sum(work.get(row["run_id"], 0) for row in rows))
                    _update_launch(self.launches, launch)  # a killed launch's record stays true
            launch["finished"] = _now()
        finally:
            bar.close()
            launch["seconds"] = time.perf_counter() - start
            groups = failure_groups(failed_rows)
            if groups:
                launch["failure_reasons"] = [{"reason": g["reason"], "count": g["count"],
                                              "first": g["run_ids"][0]} for g in groups]
            _update_launch(self.launches, launch)
        return groups


def planned_epochs(task) -> int:
    """A run's share of a launch's work for its progress bar: the epochs it may train
    (``train["epochs"]``, at least 1; early stopping ends some sooner)."""
    return max(1, int(task.train.get("epochs") or 1))


def _cache_dirs_outside(tasks, out: Path) -> list[Path]:
    """The feature-store folders a spec names (``cache_dir`` in a dataset's options, its
    ``features`` or the mode's options) outside the study folder: a spec received from someone
    else writes there, so a launch says where."""
    from ...loading import named_cache_dirs

    found = set()
    for t in tasks:
        found |= named_cache_dirs(t.dataset_options, t.mode_options)
    inside = Path(out).resolve()
    return sorted(p for p in found if p != inside and inside not in p.parents)


def _prepare_features(spec: StudySpec, todo, progress: bool = True) -> None:
    """Image sources on a backbone's features: extract them once here (a progress bar unless
    ``progress`` is False), before the workers all want them."""
    from ...loading import load_dataset

    wanted = {t.dataset for t in todo}
    for ds in spec.datasets:  # the spec's own options (a data.* vary axis is the runs' business)
        if ds.options.get("backbone") and ds.name in wanted:
            options = dict(ds.options)
            options["features"] = {"progress": progress, **(options.get("features") or {})}
            load_dataset(ds.name, **options)

