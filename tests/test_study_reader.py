"""One reader of a study folder (`open_study`), and outputs that never overwrite silently.

A study folder re-run with a changed spec holds the earlier spec's rows too (their run ids
differ); `spml study table | export`, `spml report` and `spml figure sweep` must all show the
current spec's runs, and report / export / figure / analyze outputs must not replace an existing
file unless --force (an existing file is an error).
"""
from __future__ import annotations

import csv
import io
import json
import os
import re

import pytest

from spmlkit.cli import main
from spmlkit.experiments import figures as fg
from spmlkit.experiments.report import write_report
from spmlkit.experiments.store import StudyStore
from spmlkit.experiments.study import expand, load_study

pytest.importorskip("matplotlib")

TINY = {"name": "tiny", "datasets": ["yeast"], "methods": ["an"], "seeds": 1, "epochs": 1,
        "grid": {"batch_size": [16], "lr": [1e-3]}}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def rerun(tmp_path_factory):
    """The tiny study run with epochs=3, then, changed to its own epochs=1, run again into the
    same folder. Returns the folder, the current run's row and the stale one's."""
    root = tmp_path_factory.mktemp("rerun")
    spec = root / "tiny.yaml"
    spec.write_text(json.dumps(TINY))
    out = root / "study"
    common = ["study", "run", str(spec), "--out", str(out), "--jobs", "1", "--quiet"]
    assert main([*common, "--set", "epochs=3"]) == 0
    assert main(common) == 0
    (current_id,) = [t.run_id for t in expand(load_study(TINY))]
    rows = {r["run_id"]: r for r in StudyStore(out / "results.sqlite").rows()}
    assert len(rows) == 2 and current_id in rows
    new = rows.pop(current_id)
    (old,) = rows.values()
    return out, new, old


def _report_selected(html_text):
    """(val mAP, test mAP) of the row marked selected in the report's runs table."""
    runs = html_text[html_text.index('id="runs"'):html_text.index('id="commands"')]
    (row,) = [r for r in re.findall(r"<tr>(.*?)</tr>", runs, flags=re.S) if "✓" in r]
    cells = re.findall(r"<td>(.*?)</td>", row)
    return float(cells[9]), float(cells[10])        # RUN_COLUMNS: ... val_map, test_map ...


def test_every_reader_shows_the_current_spec_runs(rerun, tmp_path, capsys):
    """The earlier spec's run is the better one on val here, so any reader that selects over
    every stored row (the old `spml report`, `figure sweep`, `export --selected`) shows it."""
    out, new, old = rerun
    assert old["val_map"] > new["val_map"]  # the precondition that makes the bug visible
    want = (round(new["val_map"], 2), round(new["test_map"], 2))

    # spml report (the page's data: the selected row of its runs table, its test mAP table)
    page = write_report(out, tmp_path / "report.html").read_text()
    assert _report_selected(page) == want
    table = page[page.index('id="table-test_map"'):page.index('id="figures"')]
    assert f">{want[1]:.2f}<" in table and f">{old['test_map']:.2f}<" not in table
    # spml figure sweep (the numbers behind the figure)
    for metric, value in zip(("val_map", "test_map"), want):
        lines, _ = fg.sweep_from_study(out, "regime", metric)
        assert [(ln.x, round(float(ln.mean[0]), 2)) for ln in lines] == [(["1p"], value)]
    # spml study export --selected
    path = tmp_path / "selected.json"
    assert main(["study", "export", str(out), "--format", "json", "--selected",
                 "--output", str(path)]) == 0
    (row,) = json.loads(path.read_text())
    assert (round(row["val_map"], 2), round(row["test_map"], 2)) == want
    # spml study table
    capsys.readouterr()
    got = []
    for metric in ("val_map", "test_map"):
        assert main(["study", "table", str(out), "--format", "csv", "--metric", metric]) == 0
        (line,) = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
        got.append(round(float(line["yeast mean"]), 2))
    assert tuple(got) == want


def test_status_and_export_count_the_stale_rows(rerun, tmp_path, capsys):
    out, new, old = rerun
    capsys.readouterr()
    assert main(["study", "status", str(out)]) == 0
    assert "1 runs: 1 done, 0 failed, 0 missing; 1 stored run(s) not in the current spec" in \
        capsys.readouterr().out
    current, every = tmp_path / "current.csv", tmp_path / "all.csv"
    assert main(["study", "export", str(out), "--format", "csv", "--output", str(current)]) == 0
    assert "1 stored run(s) of an earlier version of the spec left out (--all includes them)" \
        in capsys.readouterr().out
    assert [r["run_id"] for r in csv.DictReader(current.open())] == [new["run_id"]]
    assert main(["study", "export", str(out), "--format", "csv", "--all",
                 "--output", str(every)]) == 0
    assert sorted(r["run_id"] for r in csv.DictReader(every.open())) == sorted(
        [new["run_id"], old["run_id"]])
    with pytest.raises(SystemExit):  # argparse: not allowed with
        main(["study", "export", str(out), "--format", "csv", "--all", "--selected",
              "--output", str(every)])
    page = write_report(out, tmp_path / "r.html").read_text()
    assert "1 stored run(s) of an earlier version of the spec are left out" in page
    assert old["run_id"] not in page


# --- outputs: an existing file is an error, --force replaces it (the one writer rule) ---------
REFUSED = "exists; pass --force to replace it, or choose another name"


def test_report_refuses_an_existing_page(rerun, capsys):
    out, _, _ = rerun
    capsys.readouterr()
    (out / "report.html").write_text("mine")
    assert main(["report", str(out)]) == 2
    assert f"{out / 'report.html'}: {REFUSED}" in capsys.readouterr().err
    assert (out / "report.html").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("report", ".report"))) \
        == ["report.html"]
    assert main(["report", str(out), "--force"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out / 'report.html'}"
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_export_refuses_an_existing_file(rerun, tmp_path, capsys):
    out, _, _ = rerun
    target = tmp_path / "rows.md"
    target.write_text("mine")
    capsys.readouterr()
    assert main(["study", "export", str(out), "--format", "md", "--output", str(target)]) == 2
    assert f"{target}: {REFUSED}" in capsys.readouterr().err
    assert target.read_text() == "mine" and sorted(os.listdir(tmp_path)) == ["rows.md"]
    assert main(["study", "export", str(out), "--format", "md", "--output", str(target),
                 "--force"]) == 0
    assert target.read_text().startswith("| run_id |")


@pytest.mark.slow
def test_figure_and_analyze_refuse_existing_files(rerun, tmp_path, capsys):
    out, new, _ = rerun
    run = out / new["run_dir"]
    default = run / "figures" / "curves.png"
    assert main(["figure", "curves", str(run)]) == 0
    assert f"wrote {default}" in capsys.readouterr().out
    first = default.read_bytes()
    assert first.startswith(PNG)
    assert main(["figure", "curves", str(run)]) == 2
    assert f"{default}: {REFUSED}" in capsys.readouterr().err
    assert os.listdir(run / "figures") == ["curves.png"]
    default.write_bytes(b"mine")
    assert main(["figure", "curves", str(run), "--force"]) == 0
    assert default.read_bytes().startswith(PNG)
    sweep = tmp_path / "sweep.svg"
    sweep.write_text("mine")
    assert main(["figure", "sweep", str(out), "--axis", "regime", "--out", str(sweep)]) == 2
    assert f"{sweep}: {REFUSED}" in capsys.readouterr().err
    assert sweep.read_text() == "mine" and not (tmp_path / "sweep-2.svg").exists()

    ap = tmp_path / "ap.png"
    ap.write_bytes(b"mine")
    assert main(["analyze", "ap-diff", str(run), str(run), "--out", str(ap)]) == 2
    assert f"{ap}: {REFUSED}" in capsys.readouterr().err
    assert ap.read_bytes() == b"mine" and not (tmp_path / "ap-2.png").exists()
    assert main(["analyze", "ap-diff", str(run), str(run), "--out", str(ap), "--force"]) == 0
    assert ap.read_bytes()[:8] == PNG


def test_write_output_never_takes_a_name_twice(tmp_path, monkeypatch):
    import errno
    import threading

    from spmlkit.safe_write import write_output

    target = tmp_path / "out" / "t.txt"
    # ten writers at once on a new name: one wins, nine are refused, no temporary file left
    won, refused, barrier = [], [], threading.Barrier(10)

    def write(i):
        barrier.wait()
        try:
            won.append((write_output(target, f"w{i}"), i))
        except FileExistsError:
            refused.append(i)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 9
    assert target.read_text() == f"w{won[0][1]}" and os.listdir(target.parent) == ["t.txt"]
    # a file system without hard links: the same rule, by a check and a rename
    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(FileExistsError, match="pass --force"):
        write_output(target, b"x")
    assert write_output(tmp_path / "out" / "u.txt", b"x").read_bytes() == b"x"
    assert write_output(target, lambda fh: fh.write(b"y"), force=True) == target
    assert target.read_bytes() == b"y" and sorted(os.listdir(target.parent)) == ["t.txt", "u.txt"]
    with pytest.raises(TypeError, match="bytes, str or a function"):
        write_output(target, 3)
