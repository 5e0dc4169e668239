# Two entry points for a fresh machine: `make demo` (the yeast benchmark) and `make test`.
# Both create .venv and install spmlkit with its extras from this repository's own files.
VENV ?= .venv
PY := $(VENV)/bin/python
# constraints.txt pins torch==2.13.0 (the CPU build this project's machines carry);
# elsewhere run with CONSTRAINTS= to let pip choose a torch>=2.2 for your platform.
CONSTRAINTS ?= constraints.txt
PIP_C := $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
OUT ?= runs/yeast-benchmark

.PHONY: install demo test lint docs clean image-data browser

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(PIP_C) -e ".[dev]"
	touch $@

# The demo needs only the yeast set, which ships inside river (no image data, no browser).
demo: install
	$(VENV)/bin/spml benchmark --out $(OUT)

test: install image-data browser lint docs
	$(PY) -m pytest

# ruff with the project's configuration (pyproject.toml [tool.ruff]); `make test` runs it first.
lint: install
	$(VENV)/bin/ruff check src tests benchmarks

# The docs site (mkdocs.yml, docs/) into site/, with --strict: a broken link, a missing anchor or
# a docstring mkdocstrings cannot read fails the build (about 15 s). `python docs/gen.py`
# regenerates the generated pages; tests/test_docs.py fails when they are out of date.
docs: install
	NO_MKDOCS_2_WARNING=1 PYTHONPATH=src $(PY) -m mkdocs build --strict -q

# The offline image sets' raw data, from the registries that carry it (about 11 s when missing,
# nothing when present): Fashion-MNIST from Debian (fmnist_mosaic), @mdi/svg from npm (mdi_icons).
# Without apt-get / npm the step says so and the tests of that set are skipped.
FMNIST_IDX := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
MDI_SVG_PKG := @mdi/svg@7.4.47
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
image-data:
	@if [ -f $(FMNIST_IDX) ]; then :; \
	elif command -v apt-get >/dev/null; then \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq dataset-fashion-mnist; \
	else echo "image-data: no apt-get; fmnist_mosaic needs Debian's dataset-fashion-mnist"; fi
	@if [ -f .cache/npm/node_modules/@mdi/svg/meta.json ]; then :; \
	elif command -v npm >/dev/null; then \
	  npm install --prefix .cache/npm --no-audit --no-fund --loglevel=error $(MDI_SVG_PKG); \
	else echo "image-data: no npm; mdi_icons needs: npm install --prefix .cache/npm $(MDI_SVG_PKG)"; fi

# Headless Chromium for the report test (tests/test_report.py renders `spml report` output):
# Debian's chromium package, nothing when a chromium is already on PATH or $SPMLKIT_CHROMIUM
# is set. Without apt-get the step says so and that test is skipped.
browser:
	@if [ -n "$$SPMLKIT_CHROMIUM" ] || command -v chromium >/dev/null || \
	    command -v chromium-browser >/dev/null; then :; \
	elif command -v apt-get >/dev/null; then \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; \
	else echo "browser: no apt-get; the report test needs chromium (or SPMLKIT_CHROMIUM=/path)"; fi

clean:
	rm -rf $(VENV) runs site .pytest_cache .cache
