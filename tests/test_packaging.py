"""Packaging: one version source, `spml --version`, `python -m spmlkit`, LICENSE, CHANGELOG."""
import re
import subprocess
import sys
from importlib.metadata import metadata, version
from pathlib import Path

import pytest

import spmlkit
from spmlkit.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_version_is_the_package_version():
    assert version("spmlkit") == spmlkit.__version__
    assert "version = " not in ROOT.joinpath("pyproject.toml").read_text().split("[project]")[1] \
        .split("\n[")[0], "pyproject.toml must read the version from spmlkit.__version__"


def test_spml_version_flag(capsys):
    try:
        main(["--version"])
    except SystemExit as stop:
        assert stop.code == 0
    assert capsys.readouterr().out.strip() == f"spml (spmlkit) {spmlkit.__version__}"


@pytest.mark.slow
def test_python_dash_m_runs_the_command_line():
    out = subprocess.run([sys.executable, "-m", "spmlkit", "--version"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"spml (spmlkit) {spmlkit.__version__}"
    bad = subprocess.run([sys.executable, "-m", "spmlkit", "train", "--dataset", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "spml train: error:" in bad.stderr


def test_the_program_freezes_its_objects_before_the_interpreter_exits():
    # the console script and python -m run `run`: the imports with the collector off, then
    # frozen out of it, main, then gc.freeze (the exit's last sweep of every object for cycles
    # cost ~0.5 s of CPU with torch loaded), the collector on; main alone does not
    scripts = ROOT.joinpath("pyproject.toml").read_text().split("[project.scripts]")[1]
    assert 'spml = "spmlkit.cli:run"' in scripts.split("\n[")[0]
    code = ("import gc, sys; from spmlkit.cli import main, run; sys.argv = ['spml', 'list', "
            "'metrics']; main(['list', 'metrics']); before = gc.get_freeze_count(); "
            "status = run(); print(status, before, gc.get_freeze_count() > 0, gc.isenabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0 0 True True"  # the collector still on


def test_license_is_the_one_pyproject_names():
    meta = metadata("spmlkit")
    assert "MIT" in (meta.get("License-Expression") or meta.get("License") or "")
    assert ROOT.joinpath("LICENSE").read_text().startswith("MIT License")


@pytest.mark.slow
def test_the_wheel_carries_license_classifiers_and_py_typed(tmp_path):
    """The wheel a user builds (setuptools, no deprecation warning about the license table):
    an SPDX license expression with its file, classifiers and the PEP 561 marker."""
    import zipfile

    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--disable-pip-version-check", "-v", "-w",
                           str(tmp_path), str(ROOT)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "project.license" not in done.stdout + done.stderr   # setuptools' deprecation
    wheel = zipfile.ZipFile(next(tmp_path.glob("spmlkit-*.whl")))
    names = wheel.namelist()
    assert "spmlkit/py.typed" in names
    assert any(n.endswith("experiments/presets/yeast-papers.yaml") for n in names)
    meta = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in meta and "License-File: LICENSE" in meta
    assert "Classifier: Typing :: Typed" in meta and meta.count("Classifier: ") >= 8


def test_changelog_has_a_section_for_this_version_or_unreleased():
    heads = re.findall(r"^## (\S+)", ROOT.joinpath("CHANGELOG.md").read_text(), flags=re.M)
    assert heads and (heads[0] == "Unreleased" or heads[0] == spmlkit.__version__)
    assert spmlkit.__version__ in heads


def test_docstrings_use_the_renderers_cross_reference_syntax():
    """The API pages are rendered by mkdocstrings (Markdown): a cross-reference is
    ``[`name`][spmlkit.module.name]`` (the strict docs build fails when its target is not on the
    site), inline code is `` `name` ``; a Sphinx role (``:func:`x```) would show as raw text."""
    role = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|obj|exc|const):`")
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "src").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if role.search(line)]
    assert not found, f"Sphinx roles in docstrings: {found[:10]}"


def test_every_command_line_option_has_help():
    """``spml ... --help`` says what every option does (``--seeds`` once had no text)."""
    import argparse

    from spmlkit.cli import build_parser

    missing = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])
            elif action.option_strings and not action.help:
                missing.append(f"{' '.join(path)} {action.option_strings[-1]}")

    walk(build_parser(), ["spml"])
    assert not missing, missing
