"""Studies: a YAML spec of datasets x methods x seeds x vary x grid, run resumably in parallel.

A study reproduces one table or figure of a paper. Its spec (a YAML file, or a preset shipped in
``spmlkit/experiments/presets/``, looked up by name) names the datasets, the methods (benchmark
method specs ``loss[+reg...][@regime]``, see `spmlkit.experiments.benchmark.parse_methods`),
the training mode, the seeds, the hyperparameter grid that is *selected over* on val mAP, fixed
hyperparameters, and the ``vary`` axes that are *reported* (one table column or figure point per
value)::

    name: cole-table1                  # output folder: runs/studies/<name>
    title: "Cole et al. 2021, Table 1 (linear)"
    description: free text
    datasets: [yeast]                  # or {name: fmnist_mosaic, options: {backbone: ...}}
    methods: [an, role, bce@full]      # or {label: IUN, spec: bce@1p_alln, mode: ...}
    mode: linear                       # linear | finetune | linear_init | lac | smile
    seeds: 3                           # or a list [0, 1, 2]
    epochs: 25
    early_stop: none
    grid: {batch_size: [8, 16], lr: [1e-2, 1e-3, 1e-4, 1e-5]}
    metric: map                        # what epochs and grid points are selected on (val)
    hparams: {em: {alpha: 0.1}}        # per method label or loss name
    vary: {hparams.alpha: [0.01, 0.1]} # hparams.<name> | data.<option> | k | regime |
                                       # option.<name> | lac.<field>
    train: {}                          # more TrainConfig fields (device, head_lr_mult, ...)
    mode_options: {}                   # the trainer's own keywords (backbone, linear_epochs, ...)
    mlflow: false

A method is a spec string (``an``, ``an+reg``, ``bce@full``) or a mapping
``{spec, label, mode, mode_options, early_stop}`` (``spec`` required; ``label`` defaults to
it): its ``early_stop`` replaces the study's for that row (a table that sets rows of two
papers side by side, each with its paper's protocol: Zhou et al. stop early, Cole et al. do
not), its ``mode_options`` are merged over the study's for that row (the rows of LAC's Table 3 are
settings of one trainer, not losses). A method with a ``mode`` of its own trains in that mode
(SMILE beside the linear losses: ``{label: SMILE, spec: an, mode: smile}``); the study's
``mode_options`` are the study mode's, so such a row takes its own ``mode_options`` alone.
Its runs differ from the study mode's in their configuration (``mode``), hence in their run
ids; a method without one keeps the ids it always had. Tables show such a row with its mode
in brackets (``an [smile]``) unless the label names the mode already
(`StudySpec.row_labels`).

A vary axis applies to the methods it concerns: ``hparams.<name>`` to losses with that
hyperparameter, ``k`` to losses with a ``k`` (EPR, ROLE), ``regime`` to methods that do not fix
their regime with ``@``; ``data.<option>`` (passed to `spmlkit.loading.load_splits`) to all.
``option.<name>`` to the methods whose mode takes option ``name`` (``option.alpha`` for BoostLU,
``option.kl`` for SMILE, ``option.head`` for the linear mode), laid over their ``mode_options``
and checked by that mode's own option check (``TrainingMethod.check_options``);
``lac.<field>`` (a `spmlkit.methods.lac.LACConfig` field: ``lac.queue_size``,
``lac.temperature``, Xie et al. Figs. 4-5) is LAC's spelling of ``option.<field>``, for the
methods that train in mode ``lac`` (the same runs, the same run ids; LAC's options are flat:
``mode_options: {queue_size: 512}``).
``k`` is a number, ``true`` (the train split's mean, Cole et al.'s k*),
``estimate:M:lower|point|upper`` (the estimate, or an end of its normal 95%
interval, from M fully labelled train rows drawn with the run's seed) or
``interval:M:lower|upper|I/N`` (Cole et al. App. B's interval I_M: the 5th / 95th percentiles of
the estimate over 10^5 draws of M rows, the same for every seed; ``I/N`` a point between them,
`spmlkit.methods.resolve_k`).

Grid points and seeds differ in training only (initialisation, batch order): the observed labels
are drawn with the official seed 1200, as in the papers' code; ``vary: {data.seed: [...]}``
draws other ones.

`expand` turns a spec into `RunTask` s with stable ``run_id`` s (readable, plus a
short hash of the resolved configuration). [`run_study`][spmlkit.experiments.study.launch.run_study]
runs the missing ones in worker processes (`spmlkit.experiments.pool`), each in
``<out>/runs/<run_id>/`` through the mode's trainer, and writes each finished run's row to
``<out>/results.sqlite`` (`spmlkit.experiments.store.StudyStore`) as it comes back. A re-launch with
the same ``out`` skips finished runs (and failed ones, unless ``retry_failed``) and reruns the rest:
a killed run's folder is resumed from its checkpoint, or replaced when it has none
(`execute`). The runs go to the local pool, or to a Dask cluster (``dask``,
``scheduler_file``; `spmlkit.experiments.dask_executor`), through one executor seam.

The package, one concept a module (every public name is importable from the package itself):

- `grammar`: the method grammar (``loss[+reg...][@regime]``, the reference rows);
- `yaml_text`: YAML as a spec is read (``1e-3`` a number, repeated keys refused);
- `schema`: the spec's keys as data (type, default, help), read by validation and the docs;
- `spec`: `StudySpec` and its datasets and methods;
- `validate`: a raw spec (a dict) checked and resolved into a `StudySpec`;
- `loading`: [`load_study`][spmlkit.experiments.study.loading.load_study] (a file, a folder, a
preset, a dict; ``--set`` overrides);
- `expand`: the runs of a spec and their run ids;
- `worker`: one run (or one stack of runs) in a worker process, and its store row;
- `grouping`: which runs train together (`group_tasks`);
- `launch`: [`run_study`][spmlkit.experiments.study.launch.run_study];
- `folder`: reading a study folder ([`open_study`][spmlkit.experiments.study.folder.open_study]);
- `layout`: the file names of a study folder.
"""
from __future__ import annotations

from .expand import NOT_RESULTS, RunTask, expand, result_config, run_id_for
from .folder import StudyFolder, failure_groups, open_study, study_folder, study_rows, \
    study_spec, study_status
from .grammar import REFERENCES, Method, parse_methods
from .grouping import group_tasks
from .launch import run_study
from .layout import (LAUNCHES_FILE, PRESETS_DIR, RESULTS_FILE, RUNS_DIR, SPEC_FILE,
                     STUDIES_ROOT)
from .loading import apply_overrides, list_presets, load_study
from .schema import DEFAULT_GRID, K_BOUNDS, MAX_RUNS, METHOD_KEYS, REQUIRED_KEYS, SPEC_KEYS
from .spec import DatasetSpec, MethodSpec, StudySpec, merged
from .worker import execute, execute_group, lost_row, lost_rows, resumable, run_task
from .yaml_text import MAX_SPEC_VALUES, parse_yaml, read_spec_text

__all__ = ["DEFAULT_GRID", "K_BOUNDS", "LAUNCHES_FILE", "MAX_RUNS", "MAX_SPEC_VALUES",
           "METHOD_KEYS", "NOT_RESULTS", "PRESETS_DIR", "REFERENCES", "REQUIRED_KEYS",
           "RESULTS_FILE", "RUNS_DIR", "SPEC_FILE", "SPEC_KEYS", "STUDIES_ROOT", "DatasetSpec",
           "Method", "MethodSpec", "RunTask", "StudyFolder", "StudySpec", "apply_overrides",
           "execute", "execute_group", "expand", "failure_groups", "group_tasks", "list_presets",
           "load_study", "lost_row", "lost_rows", "merged", "open_study", "parse_methods",
           "parse_yaml", "read_spec_text", "result_config", "resumable", "run_id_for",
           "run_study", "run_task", "study_folder", "study_rows", "study_spec", "study_status"]
