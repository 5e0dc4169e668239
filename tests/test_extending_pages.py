"""The docs/extending pages cannot drift from the code: each page's example, registered in a
scratch registry (a pytest subprocess that imports it as a plugin before collecting), passes the
tests generated from that kind's registry.

An example is the ``python`` block after ``<!-- docs-test: extending NAME FILE... -->``: NAME is
the entry it registers, FILE... the generated tests (selected with ``-k NAME``). Run as a
script the example also uses the entry (tests/test_docs.py runs it that way); imported, it only
registers. A ``yaml`` block there is a study preset NAME: written, beside the shipped ones, into a
scratch presets folder that the subprocess's spmlkit reads instead of its own.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "extending").glob("*.md"))
EXAMPLE = re.compile(r"<!-- docs-test: extending (?P<name>\S+) (?P<files>[^>]*?) -->\n"
                     r"```(?P<lang>python|yaml)\n(?P<code>.*?)^```", re.S | re.M)
#: the plugin of a preset example: spmlkit's presets folder is the scratch one
PRESETS_PLUGIN = """\
from pathlib import Path

import spmlkit.experiments.study as study
from spmlkit.experiments.study import layout, loading

for module in (study, layout, loading):
    module.PRESETS_DIR = Path({folder!r})
"""
#: pages without a registered example: the overview
WITHOUT = {"index.md"}


def examples() -> list:
    return [pytest.param(m["name"], m["files"].split(), m["lang"], m["code"],
                         id=f"{page.stem}-{m['name']}")
            for page in PAGES for m in EXAMPLE.finditer(page.read_text())]


def test_every_extending_page_has_a_registered_example():
    pages = {page.name for page in PAGES for _ in EXAMPLE.finditer(page.read_text())}
    assert pages == {page.name for page in PAGES} - WITHOUT


@pytest.mark.parametrize(("name", "files", "lang", "code"), examples())
def test_the_pages_example_passes_its_kinds_generated_tests(name, files, lang, code, tmp_path):
    assert all((ROOT / f).is_file() for f in files), files
    if lang == "yaml":
        from spmlkit.experiments.study import PRESETS_DIR

        folder = shutil.copytree(PRESETS_DIR, tmp_path / "presets")
        assert not (folder / f"{name}.yaml").exists(), f"{name}: a shipped preset's name"
        (folder / f"{name}.yaml").write_text(code)
        code = PRESETS_PLUGIN.format(folder=str(folder))
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
