"""The built docs site (``make docs``: mkdocs --strict) as a reader meets it: the search index and
the API reference's rendering of the docstrings."""
from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _plain(fragment: str) -> str:
    return html.unescape(" ".join(re.sub(r"<[^>]+>", " ", fragment).split()))


def test_results_tables_are_out_of_the_search_index(site):
    """The results page's tables were indexed as run-on lines of numbers, and one of them was
    the top hit for "weight decay", above the pages that explain it."""
    docs = json.loads((site / "search" / "search_index.json").read_text())["docs"]
    pages = {d["location"].split("#")[0] for d in docs}
    assert "results.html" not in pages
    assert (site / "results.html").is_file()  # still on the site, linked from the pages
    # what a search for weight decay finds: the pages that explain it
    hits = {d["location"].split("#")[0] for d in docs if "weight decay" in d["text"].lower()}
    assert {"own-data.html", "choosing.html"} <= hits
    assert not [d["location"] for d in docs if len(re.findall("±", d["text"])) > 20]


def test_no_page_says_search_needs_the_site_served():
    """Search works from file:// (the offline plugin's index as a script, its worker through
    the local iframe-worker shim); the Makefile, mkdocs.yml and README said it needed
    ``make serve-docs``."""
    said = re.compile(r"search (needs|requires) the site served|for search too|does not start "
                      r"its search worker", re.I)
    for name in ("Makefile", "mkdocs.yml", "README.md", "docs/hooks.py", "docs/index.md",
                 "docs/getting-started.md"):
        text = " ".join((ROOT / name).read_text(encoding="utf-8").replace("#", " ").split())
        assert not said.search(text), name


def _parameter_rows(page: str, anchor: str) -> dict:
    start = page.index(f'id="{anchor}"')
    end = page.find('class="doc doc-heading"', start + 100)
    block = page[start:end if end > 0 else None]
    table = block[block.index("Parameters"):]
    table = table[:table.index("</table>")]
    rows = {}
    for row in re.findall(r'<tr class="doc-section-item">(.*?)</tr>', table, re.S):
        cells = [_plain(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        rows[cells[0]] = cells
    return rows


def test_api_reference_shows_signatures_and_each_parameters_default(site):
    """A docstring entry naming several parameters (``epochs, batch_size, lr, seed,
    early_stop:``) was rendered as one parameter marked *required*, though each has a default,
    and the class showed no constructor signature."""
    page = (site / "reference" / "api.html").read_text(encoding="utf-8")
    every = re.findall(r'<tr class="doc-section-item">\s*<td>\s*<code>(.*?)</code>', page, re.S)
    assert every and not [name for name in every if "," in name]
    start = page.index('id="spmlkit.estimator.SPMLClassifier"')
    heading = _plain(page[start:page.index("Bases:", start)])
    assert "SPMLClassifier ( loss : str = \"an\"" in heading
    assert "epochs : int = 25" in heading and "solver : str = \"lbfgs\"" in heading
    rows = _parameter_rows(page, "spmlkit.estimator.SPMLClassifier")
    defaults = {name: cells[-1] for name, cells in rows.items()}
    assert defaults["epochs"] == "25" and defaults["batch_size"] == "8"
    assert defaults["lr"] == "0.001" and defaults["seed"] == "0"
    assert defaults["early_stop"] == "'none'" and defaults["solver"] == "'lbfgs'"
    assert defaults["tol"] == "1e-05" and defaults["max_iter"] == "500"
    for name in ("epochs", "batch_size", "lr", "early_stop"):
        assert 'solver="adam" only' in rows[name][2], name
    assert "required" not in defaults.values()
