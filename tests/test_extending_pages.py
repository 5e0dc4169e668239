"""The docs/extending pages cannot drift from the code: each page's example, registered in a
scratch registry (a pytest subprocess that imports it as a plugin before collecting), passes the
tests generated from that kind's registry.

An example is the ``python`` block after ``<!-- docs-test: extending NAME FILE... -->``: NAME is
the entry it registers, FILE... the generated tests (selected with ``-k NAME``). Run as a
script the example also uses the entry (tests/test_docs.py runs it that way); imported, it only
registers.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "extending").glob("*.md"))
EXAMPLE = re.compile(r"<!-- docs-test: extending (?P<name>\S+) (?P<files>[^>]*?) -->\n"
                     r"```python\n(?P<code>.*?)^```", re.S | re.M)
#: pages without a registered example: the overview
WITHOUT = {"index.md"}


def examples() -> list:
    return [pytest.param(m["name"], m["files"].split(), m["code"], id=f"{page.stem}-{m['name']}")
            for page in PAGES for m in EXAMPLE.finditer(page.read_text())]


def test_every_extending_page_has_a_registered_example():
    pages = {page.name for page in PAGES for _ in EXAMPLE.finditer(page.read_text())}
    assert pages == {page.name for page in PAGES} - WITHOUT


@pytest.mark.parametrize(("name", "files", "code"), examples())
def test_the_pages_example_passes_its_kinds_generated_tests(name, files, code, tmp_path):
    assert all((ROOT / f).is_file() for f in files), files
    (tmp_path / "extending_example.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "extending_example", "-q",
           "-p", "no:cacheprovider", "-k", name, *files]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed[1]) >= 2, tail
    print(f"{name}: {passed[0]} in {' '.join(files)}")
