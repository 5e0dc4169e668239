"""The shipped study presets (``spmlkit/experiments/presets/*.yaml``): each parses, names real
losses, hyperparameters, datasets and regimes, expands to the runs its comments promise, and two
of them run end to end on yeast when shrunk through overrides.

The rules a preset is held to here are the ones docs/extending/presets.md states; that page's
example preset passes the tests generated per preset (tests/test_extending_pages.py)."""
from __future__ import annotations

import json
import re

import pytest

from spmlkit.data import DATASETS
from spmlkit.experiments.study import PRESETS_DIR, expand, load_study, run_study
from spmlkit.experiments.store import StudyStore
from spmlkit.labels import parse_regime
from spmlkit.losses import LOSSES, loss_hparams

#: every preset the package ships (the folder, not a hand-kept list: a new preset is tested)
PRESETS = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
#: the papers' studies among them (each must be in the folder; each runs on stand-in data and
#: says how to point it at the paper's)
PAPER_PRESETS = ["cole-table1", "cole-table1-finetune", "cole-table2", "cole-fig1", "cole-appb",
                 "zhou-table1", "zhou-alpha", "zhou-mlml", "zhou-pl-precision", "opml-table4",
                 "opml-table5", "lac-ablation", "label-bias", "yeast-papers", "tabular-spml"]
#: the datasets a shipped preset runs on as shipped: the dataset registry's embedded sets (yeast
#: ships inside spmlkit; fmnist_mosaic and mdi_icons are built from system packages), no path
EMBEDDED = set(DATASETS.names("embedded"))
#: a run count stated in a preset's header comment
RUN_COUNT = re.compile(r"= ([\d,]+) (?:linear |short )?runs")


def _text(name: str) -> str:
    return (PRESETS_DIR / f"{name}.yaml").read_text()


@pytest.mark.parametrize("name", PRESETS)
def test_preset_parses_and_names_real_things(name):
    """docs/extending/presets.md's rules: the file's name is the spec's; a title other than
    the name and a description (the presets page shows both); embedded datasets only; real
    losses, regimes and hyperparameters; a header comment saying how to run it (the presets page
    shows it); a paper's preset says there how to point it at the paper's data."""
    spec = load_study(name)
    assert spec.name == name
    assert spec.title and spec.title != name and spec.description.strip()
    assert {d.name for d in spec.datasets} <= EMBEDDED, \
        f"{name}: datasets other than the embedded ones ({', '.join(sorted(EMBEDDED))})"
    for m in spec.methods:
        assert LOSSES.get(m.loss)                                     # raises if unknown
        parse_regime(m.regime)
    for key, hp in spec.hparams.items():                              # load_study checked these
        losses = {m.loss for m in spec.methods if key in (m.label, m.loss)}
        assert losses and all(set(hp) <= set(loss_hparams(lo)) for lo in losses)
    text = _text(name)
    assert text.startswith("#") and f"spml study run {name}" in text  # how to run it
    if name in PAPER_PRESETS:
        assert re.search(r"name: (voc|coco|nuswide|cub)\b", text), \
            f"{name}: no comment showing how to point it at the papers' data"
    tasks = expand(spec)
    assert tasks and len({t.run_id for t in tasks}) == len(tasks)


def test_presets_folder_holds_every_paper_preset():
    assert set(PAPER_PRESETS) <= set(PRESETS) and "smoke" in PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_a_run_count_in_the_header_is_the_expansions(name):
    """A run count written in the header comment (``= N runs``) is the runner's count."""
    m = RUN_COUNT.search(_text(name))
    if m is None:
        pytest.skip(f"{name} states no run count")
    assert len(expand(load_study(name))) == int(m.group(1).replace(",", ""))


def test_most_presets_state_their_run_count():
    assert sum(bool(RUN_COUNT.search(_text(name))) for name in PRESETS) >= 10


def test_expand_counts_cole_table1_and_zhou_alpha():
    tasks = expand(load_study("cole-table1"))
    assert len(tasks) == 11 * 3 * 3 * 8                 # methods x datasets x seeds x grid
    assert {t.regime for t in tasks if t.method == "IUN"} == {"1p_alln"}
    assert {(t.batch_size, t.lr) for t in tasks} == {(b, lr) for b in (8, 16)
                                                      for lr in (1e-2, 1e-3, 1e-4, 1e-5)}
    tasks = expand(load_study("zhou-alpha"))
    em = [t for t in tasks if t.method == "EM"]
    assert len(em) == 7 * 3 * 8 and len(tasks) == len(em) + 2 * 3 * 8   # AN, BCE: no alpha
    assert sorted({t.hparams["alpha"] for t in em}) == [0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0]
    assert all(t.variant == {} for t in tasks if t.method != "EM")


def test_expand_data_k_and_regime_axes():
    fig1 = expand(load_study("cole-fig1"))
    assert sorted({t.dataset_options["subsample"] for t in fig1}) == \
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    appb = expand(load_study("cole-appb"))
    assert {t.k for t in appb} == {"true", *(f"interval:5:{i}/9" for i in range(10)),
                                   *(f"interval:{m}:{b}" for m in (10, 25)
                                     for b in ("lower", "upper"))}
    bias = expand(load_study("label-bias"))
    assert {t.regime for t in bias} == {"1p", "1p_biased:size", "1p_biased:loc",
                                        "1p_biased:semantic"}
    mlml = expand(load_study("zhou-mlml"))
    assert {t.regime for t in mlml if t.method == "IU"} == {f"mlml:{r}" for r in
                                                            (0.1, 0.3, 0.5, 0.7, 0.9)}
    table5 = load_study("opml-table5")
    assert {m.regime for m in table5.methods} == {"full"}


def _shrunk(name, **extra):
    return load_study(name, {"seeds": 1, "epochs": 1, "grid.batch_size": [16],
                             "grid.lr": [1e-2], **extra})


@pytest.mark.slow
def test_yeast_papers_runs_shrunk(tmp_path):
    # (the preset's hparams name em, em_apl and opml_sp, so the shrunk list keeps them)
    methods = ["an", {"label": "EM", "spec": "em"}, {"label": "EM+APL", "spec": "em_apl"},
               {"label": "OPML-SP", "spec": "opml_sp"},
               {"label": "BCE (full labels)", "spec": "bce@full"}]
    spec = _shrunk("yeast-papers", methods=methods, **{"hparams.em_apl.warmup": 0})
    assert spec.hparams["em_apl"] == {"alpha": 0.1, "beta": 0.9, "theta": 0.9, "warmup": 0}
    res = run_study(spec, out=tmp_path / "s", jobs=1, progress=False)
    assert res["runs_total"] == 5 and res["failures"] == 0
    rows = StudyStore(tmp_path / "s" / "results.sqlite").selected()
    assert {r["method"] for r in rows} == {"an", "EM", "EM+APL", "OPML-SP", "BCE (full labels)"}
    for r in rows:
        assert 10.0 < r["test_map"] <= 100.0 and 10.0 < r["val_map"] <= 100.0, r
        assert r["best_epoch"] == 1 and r["dataset"] == "yeast"
    full = next(r for r in rows if r["method"] == "BCE (full labels)")
    assert full["regime"] == "full"


def test_cole_fig1_runs_shrunk_with_subsample(tmp_path):
    spec = _shrunk("cole-fig1", methods=["an"], **{"vary.data.subsample": [0.1, 1.0]})
    res = run_study(spec, out=tmp_path / "f", jobs=1, progress=False)
    assert res["runs_total"] == 2 and res["failures"] == 0
    rows = StudyStore(tmp_path / "f" / "results.sqlite").selected()
    sizes = {}
    for r in rows:
        config = json.loads((tmp_path / "f" / r["run_dir"] / "config.json").read_text())
        sizes[json.loads(r["variant"])["data.subsample"]] = config["sizes"]["train"]
    assert sizes == {0.1: 135, 1.0: 1354}


def test_lac_preset_matches_the_lac_trainer():
    """``mode: lac`` passes ``mode_options`` to the lac method (its options, flat: LACConfig's
    fields beside the backbone's), and each row of Table 3 (a method with its own ``mode_options``
    merged over the study's) must be the matching `ABLATIONS` configuration."""
    lac = pytest.importorskip("spmlkit.methods.lac")
    spec = load_study("lac-ablation")
    assert spec.mode == "lac"
    from spmlkit.methods import get_method

    assert set(spec.mode_options) <= set(get_method("lac").options)
    tasks = {t.method: t for t in expand(spec)}
    assert list(tasks) == ["AN", "AN + PLC", "AN + PLC + LAC"]
    for label, name in zip(tasks, ["an", "an_plc", "an_plc_lac"]):
        options = tasks[label].mode_options
        assert options["backbone"] == "efficientnet_lite0"  # the study's keys are kept
        cfg, expected = lac.config_of(options), lac.ablation_config(name)
        assert (cfg.plc, cfg.lac, cfg.num_stages) == (expected.plc, expected.lac,
                                                      expected.num_stages), label
        assert cfg.dim == 128 and cfg.queue_size == 512, label  # merged, not replaced
    assert len({t.run_id for t in tasks.values()}) == 3


@pytest.mark.slow
def test_lac_preset_runs_shrunk_in_pool_workers(tmp_path):
    """The three rows in two pool worker processes, end to end: the workers are daemonic, so
    the feature-map extraction must not start DataLoader workers of its own."""
    pytest.importorskip("spmlkit.methods.lac")
    from spmlkit.data.fmnist_mosaic import fmnist_dir

    try:
        fmnist_dir()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    spec = load_study("lac-ablation", ["datasets=[{name: fmnist_mosaic, options: "
                                       "{n_pool: 60, n_test: 30}}]", "epochs=2",
                                       "mode_options.dim=16", "train.image_size=32",
                                       "mode_options.stage1_epochs=1",
                                       "methods=[{label: AN, spec: an, mode_options: "
                                       "{plc: false, lac: false}}, {label: AN + PLC, spec: an,"
                                       " mode_options: {lac: false}}, {label: LAC, "
                                       "spec: an, mode_options: {stage2_epochs: 1}}]",
                                       "mode_options.cache_dir=" + str(tmp_path / "cache")])
    res = run_study(spec, out=tmp_path / "study", jobs=2, progress=False)
    assert (res["runs_run"], res["failures"]) == (3, 0)


def test_tabular_spml_holds_smile_as_a_method_in_its_own_mode():
    spec = load_study("tabular-spml")
    modes = {m.label: spec.method_mode(m) for m in spec.methods}
    assert modes.pop("SMILE") == "smile" and set(modes.values()) == {"linear"}
    smile = [t for t in expand(spec) if t.method == "SMILE"]
    assert smile and all(t.mode == "smile" and t.mode_options == {} for t in smile)
    assert "second study" not in _text("tabular-spml")


def test_lac_preset_varies_queue_size_and_temperature():
    """Xie et al. Figs. 4-5 as vary axes: ``lac.<field>`` lays the value over each lac-mode
    method's LACConfig (and into its run id); unknown fields and invalid values are refused
    where the spec is read."""
    pytest.importorskip("spmlkit.methods.lac")
    spec = load_study("lac-ablation", ["vary={lac.queue_size: [64, 1024], "
                                       "lac.temperature: [0.1, 0.5]}",
                                       "methods=[{label: LAC, spec: an}]"])
    tasks = expand(spec)
    got = sorted((t.mode_options["queue_size"], t.mode_options["temperature"]) for t in tasks)
    assert got == [(64, 0.1), (64, 0.5), (1024, 0.1), (1024, 0.5)]
    assert all(t.mode_options["dim"] == 128 for t in tasks)   # the rest kept
    assert len({t.run_id for t in tasks}) == 4
    for bad, why in (("lac.bogus: [1]", "unknown LAC option"),
                     ("lac.temperature: [0]", "temperature must be a finite number > 0")):
        with pytest.raises(ValueError, match=why):
            load_study("lac-ablation", ["vary={" + bad + "}"])


#: the run ids of lac-ablation as its spec expanded when LAC's options were nested (``mode_options:
#: {lac: {...}}``, before they went flat): the flat spec keeps them
LAC_ABLATION_IDS = ["fmnist_mosaic-AN-1p-s0-b32-lr0.001-938dd3cd",
                    "fmnist_mosaic-AN_PLC-1p-s0-b32-lr0.001-9357049b",
                    "fmnist_mosaic-AN_PLC_LAC-1p-s0-b32-lr0.001-9f886cfe"]
LAC_VARY_IDS = ["fmnist_mosaic-AN-1p-s0-b32-lr0.001-queue_size64-temperature0.1-ebcfcff7",
                "fmnist_mosaic-AN_PLC_LAC-1p-s0-b32-lr0.001-queue_size1024-temperature0.5-34dd5189"]


def test_lac_ablation_keeps_its_run_ids_with_flat_options():
    """The preset (flat ``mode_options``) and the same spec in the old nested spelling (a study
    folder's ``study.yaml`` written before) expand to the ids the nested spec always had."""
    pytest.importorskip("spmlkit.methods.lac")
    assert [t.run_id for t in expand(load_study("lac-ablation"))] == LAC_ABLATION_IDS
    vary = ["vary={lac.queue_size: [64, 1024], lac.temperature: [0.1, 0.5]}"]
    ids = [t.run_id for t in expand(load_study("lac-ablation", vary))]
    assert len(ids) == 12 and set(LAC_VARY_IDS) <= set(ids)
    nested = ["mode_options={backbone: efficientnet_lite0, lac: {dim: 128, stage1_epochs: 40, "
              "plc: true, lac: true, two_stage: true, delta1: 0.6, delta2: 0.9, lambda_plc: 1.0, "
              "lambda_lac: 1.0, queue_size: 512, temperature: 0.5, ema_decay: 0.99, "
              "views: cached}}",
              "methods=[{label: AN, spec: an, mode_options: {lac: {plc: false, lac: false}}}, "
              "{label: AN + PLC, spec: an, mode_options: {lac: {plc: true, lac: false}}}, "
              "{label: AN + PLC + LAC, spec: an, mode_options: {lac: {stage2_epochs: 20}}}]"]
    assert [t.run_id for t in expand(load_study("lac-ablation", nested))] == LAC_ABLATION_IDS
    assert set(LAC_VARY_IDS) <= {t.run_id for t in expand(load_study("lac-ablation",
                                                                      nested + vary))}
