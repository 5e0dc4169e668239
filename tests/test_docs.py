"""The documentation runs and stays in step with the code.

- The generated pages (CLI reference, methods catalogue, presets, study schema, results) equal
  what ``docs/gen.py`` makes from the code and data now (the drift test).
- The code blocks of README.md and every page under docs/ run: ``bash`` blocks line by line
  (``spml ...`` through `spmlkit.cli.main` in this process, anything else with bash),
  ``python`` blocks in a fresh interpreter, study ``yaml`` blocks through the spec validator;
  each page in its own temporary folder, its blocks in order. A block preceded by
  ``<!-- docs-test: skip (reason) -->`` is not run (installs, minutes-long studies, sketches).
- Every ``docs/<page>.md#<anchor>`` cited in the source, tests and presets names a page and an
  anchor that exist.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
FENCE = re.compile(r"(?P<mark><!-- docs-test: (?P<how>[a-z]+)[^>]*-->\n)?"
                   r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^```", re.S | re.M)
RUN = ("bash", "python", "yaml")


def blocks(page: Path) -> list[tuple[str, str, bool]]:
    """``(language, code, skipped)`` of each fenced block of ``page``, in order."""
    text = page.read_text(encoding="utf-8")
    return [(m["lang"], m["code"], m["how"] == "skip") for m in FENCE.finditer(text)]


def runnable(page: Path) -> list[tuple[str, str]]:
    return [(lang, code) for lang, code, skip in blocks(page) if lang in RUN and not skip]


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# ---- generated pages ---------------------------------------------------------------------------
def test_generated_pages_are_up_to_date():
    """``python docs/gen.py --check``: the committed pages equal a fresh generation."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(DOCS / "gen.py"), "--check"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md", "Makefile"])
def test_the_test_targets_figures_equal_results_test_times(page):
    """The number of tests and the duration each page gives for ``make test`` /
    ``make test-fast`` are those of results/test-times.csv (they were typed by hand, three
    different ways: 6-27 min, about 27 min, 7-8 min; 1,833 tests where 2,862 ran)."""
    import csv

    with (ROOT / "results" / "test-times.csv").open(newline="", encoding="utf-8") as f:
        rows = {r["target"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"make test", "make test-fast"}
    said = (ROOT / page).read_text(encoding="utf-8")
    for target, row in rows.items():
        name = re.escape(target) + r"`?: "
        if row["tests"] == "TODO-MEASURE":
            assert re.search(name + "not measured yet", said), (page, target)
            continue
        found = re.findall(name + r"([\d,]+) tests, the test run (?:(\d+) min )?(\d+) s", said)
        assert len(found) == 1, (page, target, found)
        tests, minutes, seconds = found[0]
        assert int(tests.replace(",", "")) == int(row["tests"])
        assert int(minutes or 0) * 60 + int(seconds) == round(float(row["wall_s"]))
    for stale in ("1,833", "2.5 min", "6-27 min", "27 min", "7-8 minutes", "3,350 tests"):
        assert stale not in said, (page, stale)


def test_cli_usage_blocks_wrap_between_options():
    """The CLI page's usage blocks break lines between options and groups, never inside a
    bracket (argparse's own wrapping does on Python 3.13, which made the page differ by the
    Python that generated it), and stay within 98 columns unless one part is longer."""
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    usages = re.findall(r"```text\n(spml .*?)```", page, re.S)
    assert len(usages) > 20
    for usage in usages:
        for line in usage.splitlines():
            for opening, closing in ("[]", "()", "{}"):
                assert line.count(opening) == line.count(closing), (line, usage)
            assert len(line) <= 98 or " " not in line.strip(), line


def test_every_default_the_cli_reference_shows_is_in_the_help(monkeypatch):
    """An option whose reference line (docs/gen.py, from the parser) shows a default shows the
    same default in ``spml ... --help``: --help left out ``--loss``'s, ``--out``'s, ``--amp``'s,
    ``--head-lr-mult``'s and predict's ``--workers``' that the page showed."""
    import importlib.util

    from spmlkit.cli import build_parser

    monkeypatch.setenv("COLUMNS", "100000")  # one line per option: no wrapping inside a value
    spec = importlib.util.spec_from_file_location("docs_gen", DOCS / "gen.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)

    def parsers(parser, title):
        yield title, parser
        for name, sub, _ in gen._subparsers(parser):
            yield from parsers(sub, f"{title} {name}")

    checked, missing = 0, []
    for title, parser in parsers(build_parser(), "spml"):
        helptext = parser.format_help()
        for action in parser._actions:
            line = gen._option(action)
            shown = re.search(r"; default: `(.*)`$", line or "")
            if not shown:
                continue
            checked += 1
            block = parser._get_formatter()._format_action(action)
            if f"default: {shown[1]})" not in " ".join(block.split()):
                missing.append(f"{title} {action.option_strings[0]}: {shown[1]}")
            assert action.option_strings[0] in helptext
    assert checked > 5
    assert not missing, "--help leaves out the reference's default of:\n" + "\n".join(missing)


def test_generated_pages_cover_the_registries():
    """Every loss, training method, preset and CLI command appears in its generated page."""
    from spmlkit.cli import build_parser
    from spmlkit.experiments.study import list_presets
    from spmlkit.losses import LOSSES
    from spmlkit.methods import list_methods

    catalogue = (DOCS / "methods" / "catalogue.md").read_text()
    assert all(f"{{ #{n} }}" in catalogue for n in LOSSES.names())
    assert all(f"{{ #mode-{m.name} }}" in catalogue for m in list_methods())
    presets = (DOCS / "reproduce" / "presets.md").read_text()
    assert all(f"{{ #{n} }}" in presets for n, _ in list_presets())
    cli = (DOCS / "reference" / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and
               isinstance(a.choices, dict))
    assert all(f"`spml {name}`" in cli for name in sub.choices)


# ---- references to docs pages from the code -----------------------------------------------------
REF = re.compile(r"docs/([\w/-]+\.md)(?:#([\w-]+))?")


def _anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    out = set(re.findall(r"\{ ?#([\w-]+)", text))
    for heading in re.findall(r"^#+ (.+?)\s*(?:\{.*\})?$", text, re.M):
        out.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower()))
    return out


def test_every_docs_reference_in_the_code_resolves():
    found = 0
    for path in [*ROOT.joinpath("src").rglob("*.py"), *ROOT.joinpath("src").rglob("*.yaml"),
                 *ROOT.joinpath("tests").glob("*.py"), *ROOT.joinpath("benchmarks").glob("*")]:
        if path.name == "test_docs.py" or not path.is_file():
            continue
        for page, anchor in REF.findall(path.read_text(encoding="utf-8")):
            target = DOCS / page
            assert target.is_file(), f"{path}: cites docs/{page}, which does not exist"
            if anchor:
                assert anchor in _anchors(target), f"{path}: docs/{page} has no #{anchor}"
            found += 1
    assert found >= 20
    hits = subprocess.run(["grep", "-rn", "METHODS.md\\|DESIGN.md", "src", "tests",
                           "benchmarks"], cwd=ROOT, capture_output=True, text=True).stdout
    assert not [h for h in hits.splitlines() if "test_docs.py" not in h], hits


# ---- the code blocks run -----------------------------------------------------------------------
def test_blocks_are_counted():
    """Enough of the docs runs: the count printed is the number of blocks executed below."""
    counts = {_id(p): len(runnable(p)) for p in PAGES}
    total = sum(counts.values())
    skipped = sum(skip for p in PAGES for lang, _, skip in blocks(p) if lang in RUN)
    print(f"docs code blocks executed: {total} (skipped on purpose: {skipped}); {counts}")
    assert total >= 20
    assert counts["README.md"] >= 4


@pytest.mark.parametrize("page", ["docs/own-data.md", "docs/guide/sklearn.md"])
def test_a_python_example_turns_a_csv_into_x_and_y(page):
    """A Python block that reads a CSV, names its label columns and its features, and fits
    ``SPMLClassifier`` on them, with the estimator's default solver (no such example existed);
    `test_page_blocks_run` runs it."""
    codes = [code for lang, code in runnable(ROOT / page) if lang == "python"]
    fits = [c for c in codes if "pd.read_csv(" in c and "features = [" in c and
            re.search(r"X, Y = \w+\[features\], \w+\[labels\]", c) and
            re.search(r"SPMLClassifier\((C=[^)]*)?\)\.fit\(X, Y", c)]
    assert fits, f"{page}: no runnable Python block reads a CSV into X and Y and fits on them"


def _bash(code: str, env: dict, capsys) -> None:
    """Each line of a bash block, in the current folder; ``A && B`` as its parts, and ``cd DIR``
    changes the folder of what follows (the next blocks too, as in the reader's shell)."""
    from spmlkit.cli import main

    lines = code.replace("\\\n", " ").splitlines()
    for line in (part for whole in lines for part in whole.split(" && ")):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assign = re.fullmatch(r"([A-Za-z_]\w*)=(.*)", line.strip())
        if assign and len(words) == 1:
            env[assign[1]] = words[0].split("=", 1)[1]
            continue
        expanded = shlex.split(re.sub(r"\$(\w+)|\$\{(\w+)\}",
                                      lambda m: env.get(m[1] or m[2], ""), line), comments=True)
        if expanded[0] == "cd":
            os.chdir(expanded[1])
        elif expanded[0] == "spml":
            try:
                status = main(expanded[1:])
            except SystemExit as stop:  # argparse's own exits: --version, --help, bad usage
                status = stop.code
            out = capsys.readouterr()
            assert status in (0, None), f"{line!r} exited {status}: {out.err[-2000:]}"
        else:
            done = subprocess.run(["bash", "-c", line], cwd=Path.cwd(), env=env,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{line!r}: {done.stderr[-2000:]}"


def _python(code: str, env: dict) -> None:
    done = subprocess.run([sys.executable, "-c", code], cwd=Path.cwd(), env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def _yaml(code: str) -> None:
    import yaml

    from spmlkit.experiments.study import load_study

    raw = yaml.safe_load(code)
    if isinstance(raw, dict) and "datasets" in raw and "methods" in raw:
        load_study(raw)  # a study spec shown in the docs is a valid one


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)], ids=_id)
def test_page_blocks_run(page, tmp_path, monkeypatch, capsys):
    import torch

    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for _ in range(2 if page.name == "README.md" else 1):
        os.chdir(tmp_path)
        for lang, code in runnable(page):
            if lang == "bash":
                _bash(code, env, capsys)
            elif lang == "python":
                _python(code, env)
            else:
                _yaml(code)
    if page.name == "README.md":  # the tour runs again as written, its files in one folder
        assert [p.name for p in tmp_path.iterdir()] == ["tour"]
