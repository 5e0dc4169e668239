"""No silently ignored option (issue 29): generated over every ``spml train`` option x every
training method, every ``spml benchmark`` option, and every ``TrainConfig`` field (a study's
``train:`` / ``grid:``) x every method. Each either changes what the run is given (its resolved
config, dataset options, method options: what config.json records) or is refused with an error
that names the mode (or the option).

The option lists come from the argparse parsers and the registries; only :data:`SAMPLES` (a
non-default value per option, so the test can set it) is written here, and an option without
a sample fails the test. :data:`MODE_INDEPENDENT` lists the options that change where results go,
what is shown or how fast, never a run's numbers (documented there)."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from spmlkit.cli import build_parser
from spmlkit.engine import TrainConfig
from spmlkit.methods import (check_train_fields, list_methods)
from spmlkit.methods.contract import COMMON_TRAIN_FIELDS

#: options that never change a run's numbers: where the run folder goes (--out), the progress
#: bar (--quiet), torch threads (--threads), the device (--device: the same run elsewhere),
#: resuming an existing folder (--resume: its own settings), worker processes and stacking
#: (spml benchmark --jobs / --no-vectorise: the same results, faster), and the mode itself
#: and what is printed (--verbose), or where the options come from (--config FILE: each option
#: it holds is one of the options tested here)
MODE_INDEPENDENT = {"out", "quiet", "threads", "device", "resume", "jobs", "no_vectorise",
                    "mode", "help", "verbose", "config"}

#: a value other than the default for each option (the flag alone for a switch)
SAMPLES = {
    "dataset": ["--dataset", "tabular"], "data": ["--data", "seed=3"],
    "epochs": ["--epochs", "3"], "early_stop": ["--early-stop", "patience:2"],
    "metric": ["--metric", "lrap"], "loss": ["--loss", "epr"], "regime": ["--regime", "1p_alln"],
    "hp": ["--hp", "eps=1e-6"], "reg": ["--reg", "highrank:1e-3"],
    "batch_size": ["--batch-size", "4"], "lr": ["--lr", "0.05"], "seed": ["--seed", "1"],
    "k": ["--k", "2"], "k_estimate": ["--k-estimate", "5"],
    "hidden": ["--hidden", "32"], "head": ["--head", "mlp"],
    "backbone": ["--backbone", "tiny_cnn"], "feature_dtype": ["--float16"],
    "cache_dir": ["--cache-dir", "/tmp/spml-no-cache"], "weights": ["--weights", "w.pt"],
    "option": ["--option", "p=0.1"], "lac": ["--lac", "dim=16"],
    "head_lr_mult": ["--head-lr-mult", "10"], "amp": ["--amp", "bf16"],
    "workers": ["--workers", "7"], "image_size": ["--image-size", "64"],
    "random_init": ["--random-init"], "augment": ["--augment", "strong"],
    "weight_decay": ["--weight-decay", "0.01"], "warmup_epochs": ["--warmup-epochs", "1"],
    "lr_schedule": ["--lr-schedule", "cosine"], "cpu_bf16": ["--cpu-bf16"],
    "linear_epochs": ["--linear-epochs", "3"], "linear_lr": ["--linear-lr", "0.01"],
    "save_train_probs": ["--save-train-probs"], "drop_last": ["--drop-last"],
    "cudnn_benchmark": ["--cudnn-benchmark"], "compile": ["--compile", "default"],
    "gpu_decode": ["--gpu-decode"], "jpeg_draft": ["--jpeg-draft"],
    # spml benchmark
    "losses": ["--losses", "an,epr"], "no_references": ["--no-references"],
    "seeds": ["--seeds", "2"], "batch_sizes": ["--batch-sizes", "16"], "lrs": ["--lrs", "1e-2"],
    "weight_decays": ["--weight-decays", "0,1e-3"],
    # the solver (spml train and spml benchmark)
    "solver": ["--solver", "lbfgs"], "cs": ["--cs", "0.1,1"], "pick": ["--pick", "best"],
    "train_predictions": ["--train-predictions"],
}


def _options(command: str) -> list[str]:
    """The dests of a subcommand's options, from its argparse parser (one per dest)."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[command]
    return sorted({a.dest for a in parser._actions if a.option_strings})


TRAIN_OPTIONS = _options("train")
BENCHMARK_OPTIONS = _options("benchmark")
MODES = [m.name for m in list_methods()]
TRAIN_CASES = [(mode, opt) for mode in MODES for opt in TRAIN_OPTIONS
               if opt not in MODE_INDEPENDENT]
BENCHMARK_CASES = [opt for opt in BENCHMARK_OPTIONS if opt not in MODE_INDEPENDENT]
FIELD_CASES = [(mode, f.name) for mode in MODES for f in dataclasses.fields(TrainConfig)]


def test_every_option_has_a_sample_and_the_case_counts():
    missing = [o for o in set(TRAIN_OPTIONS) | set(BENCHMARK_OPTIONS)
               if o not in MODE_INDEPENDENT and o not in SAMPLES]
    assert not missing, f"add a non-default sample value for {missing} to SAMPLES"
    print(f"generated cases: train {len(TRAIN_CASES)} ({len(MODES)} modes x "
          f"{len(TRAIN_CASES) // len(MODES)} options), benchmark {len(BENCHMARK_CASES)}, "
          f"TrainConfig fields {len(FIELD_CASES)}")
    assert len(TRAIN_CASES) >= 7 * 30 and len(BENCHMARK_CASES) >= 15


def _base(mode: str) -> list[str]:
    """The arguments of a run of ``mode`` on yeast that the method accepts as they are."""
    from spmlkit.methods import get_method

    m = get_method(mode)
    args = ["train", "--mode", mode, "--quiet", "--out", "unused"]
    if m.inputs == "images" and m.options.get("backbone", "") is None and \
            not m.accepts_vectors:
        args += ["--backbone", "tiny_cnn"]
    return args


@pytest.fixture(scope="module")
def yeast_splits():
    from spmlkit.loading import load_splits

    return load_splits("yeast", "1p")


def _given(argv, monkeypatch, splits) -> dict:
    """What ``spml train argv`` gives a run (its data arguments, resolved config, method
    options, loss, k), the run itself replaced by the checks it starts with; or the error."""
    import spmlkit.loading
    import spmlkit.methods
    from spmlkit.accel import current_acceleration
    from spmlkit.cli.train import cmd_train
    from spmlkit.methods.driver import _run_settings

    seen = {}

    def load(dataset, regime, **options):
        seen["data"] = [dataset, regime, options]
        return splits

    def run(method, sp, loss, hparams, config, *, k=None, out=None, on_epoch=None,
            dataset_options=None, **options):
        options = method.check_options(options)
        cfg, hp, _, k = _run_settings(method, sp, loss, hparams, config, k, options)
        seen["run"] = [loss, hp, dataclasses.asdict(cfg), k, options, dataset_options]
        seen["acceleration"] = repr(current_acceleration())  # the block the run trains in
        return {}

    monkeypatch.setattr(spmlkit.loading, "load_splits", load)  # what spml train calls
    monkeypatch.setattr(spmlkit.methods, "train_run", run)
    monkeypatch.setattr("spmlkit.cli.train._print_result", lambda args, res: 0)
    args = build_parser().parse_args(argv)
    cmd_train(args)
    return json.loads(json.dumps(seen, default=str))


@pytest.mark.parametrize("mode,option", TRAIN_CASES)
def test_a_train_option_changes_the_run_or_is_refused(mode, option, monkeypatch, yeast_splits,
                                                      tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.pt").write_bytes(b"")
    try:
        base = _given(_base(mode), monkeypatch, yeast_splits)
    except ValueError as err:  # pragma: no cover (every mode runs with its base arguments)
        pytest.fail(f"--mode {mode} refused its base arguments: {err}")
    flag = SAMPLES[option][0]
    try:
        given = _given(_base(mode) + SAMPLES[option], monkeypatch, yeast_splits)
    except (ValueError, FileNotFoundError) as err:
        assert mode in str(err) or flag in str(err), f"unclear refusal: {err}"
        return
    assert given != base, f"--mode {mode} {' '.join(SAMPLES[option])}: silently ignored"


@pytest.mark.parametrize("option", BENCHMARK_CASES)
def test_a_benchmark_option_changes_the_study_or_is_refused(option, monkeypatch, tmp_path):
    import spmlkit.experiments.benchmark as bench
    from spmlkit.cli.benchmark import cmd_benchmark

    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.pt").write_bytes(b"")

    def given(argv):
        seen = {}

        def run(*a, **kw):
            kw.pop("argv", None)
            kw.pop("progress", None)
            seen["spec"] = bench.benchmark_study(*a[:3], seeds=a[3], **{
                k: v for k, v in kw.items() if k in ("epochs", "grid", "early_stop",
                                                     "dataset_options", "metric", "regime",
                                                     "drop_last", "train_predictions")})
            seen["sklearn"] = kw.get("sklearn")
            return {"results": [], "table": "", "failure_groups": [], "missing": []}

        def solve(*a, **kw):  # the solver benchmark: what it is given
            kw.pop("argv", None)
            kw.pop("progress", None)
            seen["solver"] = [a, kw]
            return {"table": ""}

        monkeypatch.setattr(bench, "run_benchmark", run)
        monkeypatch.setattr("spmlkit.experiments.solver_benchmark.run_solver_benchmark", solve)
        cmd_benchmark(build_parser().parse_args(["benchmark", "--quiet", *argv]))
        return json.loads(json.dumps(seen, default=str))

    base = given([])
    try:
        changed = given(SAMPLES[option])
    except (ValueError, FileNotFoundError) as err:
        assert SAMPLES[option][0] in str(err), f"unclear refusal: {err}"
        return
    assert changed != base, f"spml benchmark {' '.join(SAMPLES[option])}: silently ignored"


#: a value other than the default of each TrainConfig field
FIELD_SAMPLES = {"epochs": 3, "batch_size": 4, "lr": 0.05, "seed": 1,
                 "early_stop": "patience:2", "map_convention": "official", "device": "meta",
                 "head_lr_mult": 10.0, "amp": "bf16", "channels_last": False, "num_workers": 2,
                 "image_size": 64, "eval_batch_size": 32, "metric": "lrap", "drop_last": True,
                 "weight_decay": 0.01, "train_predictions": False}


@pytest.mark.parametrize("mode,field", FIELD_CASES)
def test_a_train_config_field_a_mode_does_not_read_is_refused(mode, field):
    """A study's ``train:`` / ``grid:`` field: a method reads it (the common fields and its
    ``train_fields``) or refuses it, naming the mode and the modes that read it."""
    from spmlkit.methods import get_method

    m = get_method(mode)
    assert field in FIELD_SAMPLES, f"add a sample value of TrainConfig.{field}"
    config = TrainConfig(**{field: FIELD_SAMPLES[field]}) if field != "device" else \
        dataclasses.replace(TrainConfig(), device="meta")
    if (field in COMMON_TRAIN_FIELDS and field not in m.unused_train_fields) or \
            field in m.train_fields:
        check_train_fields(m, config)
        return
    with pytest.raises(ValueError, match=f"--mode {mode} does not use it"):
        check_train_fields(m, config)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from spmlkit.cli import main

    out = tmp_path_factory.mktemp("resume")
    assert main(["train", "--epochs", "1", "--out", str(out), "--quiet"]) == 0
    (run,) = out.iterdir()
    return run


@pytest.mark.parametrize("option", [o for o in TRAIN_OPTIONS if o not in
                                    {"resume", "device", "cache_dir", "quiet", "verbose",
                                     "threads", "config", "help", "cudnn_benchmark", "compile",
                                     "gpu_decode", "jpeg_draft"}])
def test_an_option_a_resume_would_ignore_is_refused(option, finished_run, capsys):
    """``spml train --resume RUN`` takes the run's settings from its config.json: any option
    that would change the run is refused, naming it (it was ignored silently)."""
    from spmlkit.cli import main

    sample = {"mode": ["--mode", "finetune"], "out": ["--out", "elsewhere"]}.get(option) or \
        SAMPLES[option]
    assert main(["train", "--resume", str(finished_run), *sample, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f": --resume continues {finished_run}" in err and err.count("\n") == 1, err
    assert sample[0] in err.split(": --resume")[0], err


def test_k_with_k_estimate_and_hidden_without_mlp_are_refused(capsys):
    from spmlkit.cli import main

    assert main(["train", "--k", "2", "--k-estimate", "10", "--epochs", "1", "--quiet"]) == 2
    assert "give --k 2 or --k-estimate 10, not both" in capsys.readouterr().err
    assert main(["train", "--hidden", "64", "--epochs", "1", "--quiet"]) == 2
    assert "--hidden 64: the width of the MLP head; this run's head is linear" in \
        capsys.readouterr().err
