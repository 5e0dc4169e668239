"""`spml report`: the self-contained HTML page of a study folder, checked as text and rendered
in headless Chromium (skipped only when no chromium binary is found: `make test SYSTEM_DEPS=1`)."""
from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from PIL import Image  # noqa: E402

from _study_toy import real_run_id, write_results  # noqa: E402

from spmlkit.cli import main  # noqa: E402
from spmlkit.experiments.report import render_html, write_report  # noqa: E402
from spmlkit.experiments.study import open_study  # noqa: E402

EVIL = "<script>alert('x')</script>"


def _row(study, run_id, method, seed, lr, val, test, rec, variant=None, status="done",
         error=None, loss=None):
    return {"run_id": run_id, "study": study, "method": method, "loss": loss or method,
            "dataset": "yeast", "regime": "1p", "seed": seed,
            "variant": json.dumps(variant or {}), "batch_size": 8, "lr": lr, "mode": "linear",
            "status": status, "val_map": val, "test_map": test, "train_recovery_map": rec,
            "best_epoch": 3 if status == "done" else None, "seconds": 1.5,
            "metrics": "{}", "config": "{}", "run_dir": f"runs/{run_id}", "error": error,
            "finished_at": "2026-01-01T00:00:00"}


def _spec(evil: bool = True) -> dict:
    """3 methods (one labelled like a script tag), 2 seeds, 3 learning rates, a vary axis that
    applies to `wan` only."""
    return {"name": "tiny", "title": "Tiny study <b>&</b> co", "description": "Hand-made "
            "folder for the report test.", "datasets": ["yeast"], "mode": "linear",
            "methods": ["an", "wan", {"label": EVIL, "spec": "epr"} if evil else "epr"],
            "seeds": 2, "epochs": 3, "grid": {"batch_size": [8], "lr": [0.01, 0.001, 1e-5]},
            "vary": {"hparams.gamma": [0.5, 2.0]}}


def _rows(evil: bool = True) -> list:
    """Rows named by hand (``an-s0-a``): some of the spec's runs, one failed, the rest not run."""
    evil_name = EVIL if evil else "epr"
    rows = []
    for seed in (0, 1):
        # an: lr 1e-3 wins on val; selected test 45 / 47 -> 46.00 +- 1.41
        rows.append(_row("tiny", f"an-s{seed}-a", "an", seed, 0.01, 50.0, 40.0 + seed, 30.0))
        rows.append(_row("tiny", f"an-s{seed}-b", "an", seed, 0.001, 60.0, 45.0 + 2 * seed,
                         33.0 + seed))
        for g, base in ((0.5, 50.0), (2.0, 55.0)):
            rows.append(_row("tiny", f"wan-g{g}-s{seed}", "wan", seed, 0.001, 58.0, base + seed,
                             31.0, variant={"hparams.gamma": g}))
        rows.append(_row("tiny", f"evil-s{seed}", evil_name, seed, 0.001, 40.0, 38.5, 20.0,
                         loss="epr"))
    rows.append(_row("tiny", "an-s0-c", "an", 0, 1e-5, None, None, None, status="failed",
                     error="RuntimeError: loss is <nan> & training stopped"))
    return rows


def run_ids(evil: bool = True) -> dict:
    """Hand name (``an-s0-c``) -> the run id the spec gives that run."""
    return {r["run_id"]: real_run_id(_spec(evil), r) for r in _rows(evil)}


def make_study(root, evil: bool = True):
    """A hand-made study folder (see `_spec`, `_rows`) with two launches."""
    study = root / "tiny"
    (study / "runs").mkdir(parents=True)
    (study / "study.yaml").write_text(json.dumps(_spec(evil), indent=2))  # JSON is YAML
    ids = run_ids(evil)
    rows = [{**r, "run_id": ids[r["run_id"]], "run_dir": f"runs/{ids[r['run_id']]}"}
            for r in _rows(evil)]
    write_results(study, rows)
    for r in rows:
        run = study / r["run_dir"]
        run.mkdir()
        if r["status"] != "done":
            continue
        with open(run / "metrics.jsonl", "w") as fh:
            for e in range(1, 4):
                fh.write(json.dumps({"epoch": e, "train_loss": 1.0 / e,
                                     "val_map": r["val_map"] - 3 + e}) + "\n")
    launches = [
        {"argv": ["/x/.venv/bin/spml", "study", "presets/tiny.yaml", "--jobs", "2"],
         "started": "2026-01-01T00:00:00", "finished": "2026-01-01T00:01:00", "runs_total": 11,
         "runs_run": 7, "failures": 1, "seconds": 60.0, "jobs": 2,
         "versions": {"spmlkit": "0.1.0", "torch": "2.13.0"}},
        {"argv": ["/x/.venv/bin/spml", "study", "presets/tiny.yaml", "--note", "a b'c"],
         "started": "2026-01-02T00:00:00", "finished": "2026-01-02T00:00:30", "runs_total": 11,
         "runs_run": 6, "failures": 0, "seconds": 30.0, "jobs": 2,
         "versions": {"spmlkit": "0.1.1", "torch": "2.13.0"}},
    ]
    (study / "launches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in launches))
    return study


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    study = make_study(tmp_path_factory.mktemp("report"))
    path = write_report(study)
    return study, path, path.read_text()


def _img_sources(text):
    return re.findall(r'<img[^>]*\ssrc="([^"]*)"', text)


def test_report_file_and_main_tables(report):
    study, path, text = report
    assert path == study / "report.html"
    assert text.startswith("<!DOCTYPE html>")
    # a table per metric; an's selected runs are lr 1e-3: test 45 and 47, recovery 33 and 34
    assert 'id="table-test_map"' in text and 'id="table-train_recovery_map"' in text
    main = text[text.index('id="table-test_map"'):text.index('id="table-train_recovery_map"')]
    assert "46.0" in main and "1.4" in main            # mean ± std over the 2 seeds
    assert "40.5" not in main                       # the lr 1e-2 runs are not selected
    assert "50.5" in main and "55.5" in main        # wan per gamma
    rec = text[text.index('id="table-train_recovery_map"'):text.index('id="figures"')]
    assert "33.5" in rec


def test_escaping(report):
    _, _, text = report
    assert EVIL not in text
    assert html_escaped(EVIL) in text
    assert len(re.findall(r"<script\b", text)) == 1           # only the page's own check
    assert "<b>&</b>" not in text and "Tiny study &lt;b&gt;&amp;&lt;/b&gt; co" in text
    assert "loss is &lt;nan&gt; &amp; training stopped" in text   # the failure, escaped


def html_escaped(s):
    return html.escape(s, quote=True)


def test_no_external_urls(report):
    _, _, text = report
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?\s*([a-z]+:|//)""", text, flags=re.I)
    assert set(refs) <= {"data:"}, refs
    assert not re.search(r"(?:src|href)\s*=\s*[\"']?\s*(?:https?:)?//", text, flags=re.I)
    assert not re.search(r"url\(|@import|<link\b|<iframe\b", text, flags=re.I)


def test_every_figure_embedded(report):
    _, _, text = report
    # the training curves of the one dataset and the sweep over hparams.gamma, all embedded
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", text)
    assert [c.split(",")[0].split(":")[0] for c in captions] == [
        "Training curves of the selected runs", "Sensitivity to hparams.gamma"]
    srcs = _img_sources(text)
    assert len(srcs) == len(captions) == text.count("<figure>")
    for src in srcs:
        head, data = src.split(",", 1)
        assert head == "data:image/png;base64"
        img = Image.open(io.BytesIO(base64.b64decode(data)))
        assert img.format == "PNG" and min(img.size) > 100
        assert np.asarray(img.convert("L")).std() > 0


def test_commands_versions_failures(report):
    _, _, text = report
    assert "spml study presets/tiny.yaml --jobs 2" in text
    rerun = re.search(r'<pre id="rerun">(.*?)</pre>', text).group(1)
    assert rerun == html_escaped("spml study presets/tiny.yaml --note 'a b'\"'\"'c'")
    assert "0.1.0 → 0.1.1" in text                         # the version change across launches
    assert "1.5 min" in text                               # 60 s + 30 s of launches
    failures = text[text.index('id="failures"'):text.index('id="runs"')]
    assert run_ids()["an-s0-c"] in failures and "RuntimeError" in failures
    runs = text[text.index('id="runs"'):text.index('id="commands"')]
    assert "<details>" in runs and runs.count("<tr") == 1 + 11 and runs.count("✓") == 1 + 8


def test_cli_report(tmp_path, capsys):
    study = make_study(tmp_path, evil=False)
    out = tmp_path / "elsewhere" / "r.html"
    assert main(["report", str(study), "--out", str(out)]) == 0
    assert out.is_file() and not (study / "report.html").exists()
    assert f"wrote {out}" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    # a run folder: said as one, with what reads a run (it said "study.yaml is missing")
    run = tmp_path / "a-run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "final.json").write_text("{}")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run} is a run folder (config.json), not a study folder" in err
    assert "spml figure curves | calibration | histograms RUN" in err and "final.json" in err


# --- headless Chromium ------------------------------------------------------------------------
def _chromium():
    for cand in (os.environ.get("SPMLKIT_CHROMIUM"), "chromium", "chromium-browser"):
        if cand and (shutil.which(cand) or os.path.isfile(cand)):
            return shutil.which(cand) or cand
    return None


CHROMIUM = _chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (chromium, chromium-browser or "
    "$SPMLKIT_CHROMIUM): `make test SYSTEM_DEPS=1` or `make browser` installs Debian's chromium")


def _browse(path, *extra, tmp):
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp / 'profile'}",
           "--virtual-time-budget=5000", *extra, path.resolve().as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


@needs_chromium
def test_renders_in_chromium(report, tmp_path):
    _, path, text = report
    dom = _browse(path, "--dump-dom", tmp=tmp_path)
    assert 'data-rendered="ok"' in dom, re.findall(r'data-rendered="[^"]*"', dom)
    assert len(_img_sources(dom)) == 2
    cells = re.findall(r"<t[hd](?:\s[^>]*)?>(.*?)</t[hd]>", dom)
    assert html.escape(EVIL, quote=False) in cells          # escaped, shown as text
    # an's selected test mAP (in every column of the gamma pivot, marked best where it leads)
    assert any(re.sub(r"<[^>]+>", "", c).startswith("46.0") for c in cells)
    ids = run_ids()
    assert ids["an-s0-c"] in cells and ids["wan-g2.0-s1"] in cells    # per-run details
    shot = tmp_path / "shot.png"
    _browse(path, f"--screenshot={shot}", "--window-size=1280,2400", tmp=tmp_path)
    img = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert img.shape == (2400, 1280)
    assert img.std() > 5 and (img < 128).mean() > 0.005       # text and figures, not blank


@needs_chromium
def test_chromium_check_reports_a_broken_figure(tmp_path):
    study = make_study(tmp_path, evil=False)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    page = tmp_path / "broken.html"
    page.write_text(render_html(open_study(study), [("a broken figure", broken)]))
    dom = _browse(page, "--dump-dom", tmp=tmp_path)
    assert 'data-rendered="error: image not rendered: a broken figure"' in dom


def test_report_shows_the_classic_metrics_of_a_real_study(tmp_path, capsys):
    """A study selected on val LRAP (AN beside SMILE, in its own mode): the page has the
    study's metric, mAP and the classic metrics, each cell the selected run's test value (one
    seed), as `spml study table --metric ...` shows it; a hand-made folder whose runs recorded
    no classic metric has no such table."""
    from spmlkit.experiments.study import run_study
    from spmlkit.metrics import METRICS

    out = tmp_path / "classic"
    run_study({"name": "classic", "datasets": ["yeast"], "seeds": 1, "epochs": 1,
               "methods": ["an", {"label": "SMILE", "spec": "an", "mode": "smile"}],
               "grid": {"batch_size": [16], "lr": [1e-2, 1e-3]}, "metric": "lrap"},
              out=out, jobs=1, progress=False)
    text = write_report(out).read_text()
    study = open_study(out)
    assert len(study.selected) == 2
    for anchor in ("table-test_lrap", "table-test_map", "table-classic"):
        assert f'id="{anchor}"' in text
    assert "best validation lrap is selected" in text and "selected on val lrap" in text
    classic = text[text.index('id="table-classic"'):text.index('id="figures"')]
    heads = re.findall(r"<th>([a-z_0-9@]+)</th>", classic)
    assert heads[:5] == ["lrap", "ranking_loss", "coverage_norm", "hamming_loss", "one_error"]
    assert set(heads) == set(METRICS) - {"map"}
    for r in study.selected:
        values = json.loads(r["metrics"])["test_metrics"]
        row = re.search(rf'<th scope="row">{r["method"]}</th>(.*?)</tr>', classic).group(1)
        cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        assert cells == [f"{values[h]:.{METRICS[h].decimals}f}" for h in heads]
    # the training curves draw the metric the study selects on (val_lrap): the page said
    # that no run folder had per-epoch records
    figures = text[text.index('id="figures"'):]
    assert "No figure: no run folder" not in figures
    assert "Training curves of the selected runs, yeast" in figures
    # the CLI's table of the same metrics shows the same numbers
    assert main(["study", "table", str(out), "--metric", ",".join(heads), "--format",
                 "html"]) == 0
    cli = capsys.readouterr().out
    assert re.findall(r"<td[^>]*>(.*?)</td>", cli) == re.findall(r"<td[^>]*>(.*?)</td>",
                                                                 classic)


def test_report_without_classic_metrics_has_no_such_table(report):
    _, _, text = report
    assert 'id="table-classic"' not in text and "best validation mAP is selected" in text


def test_the_rerun_command_is_one_a_user_can_type():
    """A launch by ``python -m spmlkit`` recorded argv[0] as the package's __main__.py (not
    runnable as a file: "attempted relative import"); it reads ``spml``, and a launch that
    recorded its folder is rerun from there (its paths are relative to it)."""
    from spmlkit.experiments.report import _command

    argv = ["/x/src/spmlkit/__main__.py", "study", "run", "s 1.yaml", "--out", "s1a"]
    assert _command(argv) == "spml study run 's 1.yaml' --out s1a"
    assert _command(argv, "/home/me/my study") == \
        "cd '/home/me/my study' && spml study run 's 1.yaml' --out s1a"
    assert _command(["/venv/bin/spml", "study", "x"]) == "spml study x"
