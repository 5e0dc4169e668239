# Entry points for a fresh machine: `make demo` (the yeast benchmark), `make test-fast` and
# `make test`. They create .venv and install spmlkit with its extras from this repository's files.
# `make test` changes nothing outside this folder unless asked: SYSTEM_DEPS=1 (or `make
# system-deps`) installs the two Debian packages some tests need; without it those tests skip.
VENV ?= .venv
PY := $(VENV)/bin/python
# constraints.txt pins torch==2.13.0 (the CPU build this project's machines carry);
# elsewhere run with CONSTRAINTS= to let pip choose a torch>=2.2 for your platform.
CONSTRAINTS ?= constraints.txt
PIP_C := $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
OUT ?= runs/yeast-benchmark
SYSTEM_DEPS ?=

.PHONY: install demo test test-fast lint docs serve-docs clean image-data browser system-deps mdi-icons \
	fmnist-data system-check

install: $(VENV)/.installed

# pip's own lines (Collecting / Downloading / Installing) show progress; the first install
# downloads torch and the docs tools: about 3.5 minutes on a 2-core machine.
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	@echo "install: creating $(VENV) and installing spmlkit[dev] (first time: about 3.5 minutes)"
	@start=$$(date +%s); python3 -m venv $(VENV) && \
	$(PY) -m pip install --disable-pip-version-check --progress-bar off $(PIP_C) -e ".[dev]" && \
	echo "install: done in $$(( $$(date +%s) - start )) s; the spml command is $(VENV)/bin/spml" \
	     "(run '. $(VENV)/bin/activate' to call it as spml)"
	touch $@

# The demo needs only the yeast set, which ships inside river (no image data, no browser).
demo: install
	$(VENV)/bin/spml benchmark --out $(OUT)
	@echo "demo: wrote $(OUT)/; the spml command is $(VENV)/bin/spml" \
	     "(run '. $(VENV)/bin/activate' to call it as spml)"

# The whole suite (about 3,350 tests; 7-8 minutes on 2 idle cores, README). Tests that need a system package
# that is missing are skipped with a line naming `make test SYSTEM_DEPS=1`.
test: install mdi-icons $(if $(SYSTEM_DEPS),system-deps,system-check) lint docs
	$(PY) -m pytest

# The fast tier: every test not marked slow (tests/conftest.py: the files that train real jobs).
test-fast: install lint
	$(PY) -m pytest -m "not slow"

# ruff with the project's configuration (pyproject.toml [tool.ruff]); `make test` runs it first.
lint: install
	$(VENV)/bin/ruff check src tests benchmarks

# The docs site (mkdocs.yml, docs/) into site/, with --strict: a broken link, a missing anchor,
# an unresolved cross-reference or a docstring mkdocstrings cannot read fails the build (about
# 20 s). Not -q: it silences mkdocs-autorefs' warnings, so an unresolved reference would pass.
# site/index.html opened from the file system navigates (page.html links); search needs the
# site served (browsers do not start its worker from file://): make serve-docs.
# `python docs/gen.py` regenerates the generated pages; tests/test_docs.py fails when they are
# out of date.
docs: install
	NO_MKDOCS_2_WARNING=1 PYTHONPATH=src $(PY) -m mkdocs build --strict

# The built site on http://127.0.0.1:8000/ (Python's own server, this machine only; no network
# needed): navigation and search. Ctrl-C stops it.
DOCS_PORT ?= 8000
serve-docs: docs
	@echo "serve-docs: http://127.0.0.1:$(DOCS_PORT)/ (Ctrl-C stops)"
	$(PY) -m http.server --directory site --bind 127.0.0.1 $(DOCS_PORT)

# --- system packages: only on request ----------------------------------------------------------
# Debian's dataset-fashion-mnist (the fmnist_mosaic image set) and chromium (tests/test_report.py
# renders `spml report` output in it). apt-get as root (sudo otherwise), without recommended
# packages, waiting up to 120 s for a busy dpkg lock, and never upgrading an installed package:
# when apt would upgrade one to satisfy a dependency the step names it and stops.
FMNIST_IDX := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT := $(SUDO) apt-get -o DPkg::Lock::Timeout=120
APT_INSTALL := install -y -q --no-install-recommends --no-upgrade
HAVE_CHROMIUM = [ -n "$$SPMLKIT_CHROMIUM" ] || command -v chromium >/dev/null || \
	command -v chromium-browser >/dev/null
define apt_install
	@command -v apt-get >/dev/null || { echo "$(1): no apt-get; install it by hand"; exit 1; }
	$(APT) update -qq
	@up=$$($(APT) -s $(APT_INSTALL) $(1) | sed -n 's/^Inst \([^ ]*\) \[.*/\1/p'); \
	if [ -n "$$up" ]; then echo "apt-get would upgrade installed packages:" $$up; \
	  echo "not done; upgrade them yourself or install $(1) by hand"; exit 1; fi
	$(APT) $(APT_INSTALL) $(1)
endef

system-deps: fmnist-data browser

fmnist-data:
	@[ -f $(FMNIST_IDX) ] || $(MAKE) --no-print-directory _apt PKG=dataset-fashion-mnist

browser:
	@$(HAVE_CHROMIUM) || $(MAKE) --no-print-directory _apt PKG=chromium

.PHONY: _apt
_apt:
	$(call apt_install,$(PKG))

# Without SYSTEM_DEPS: one line per missing package, nothing installed.
system-check:
	@[ -f $(FMNIST_IDX) ] || echo "test: no $(FMNIST_IDX): the fmnist_mosaic tests skip;" \
	  "make test SYSTEM_DEPS=1 installs Debian's dataset-fashion-mnist"
	@$(HAVE_CHROMIUM) || echo "test: no chromium: the report's browser tests skip;" \
	  "make test SYSTEM_DEPS=1 installs Debian's chromium"

# @mdi/svg (the mdi_icons image set) from npm into .cache/npm, inside this folder (about 11 s
# when missing, nothing when present). Without npm, or offline, the mdi_icons tests skip.
MDI_SVG_PKG := @mdi/svg@7.4.47
mdi-icons:
	@if [ -f .cache/npm/node_modules/@mdi/svg/meta.json ]; then :; \
	elif command -v npm >/dev/null; then \
	  npm install --prefix .cache/npm --no-audit --no-fund --loglevel=error $(MDI_SVG_PKG) || \
	  echo "mdi-icons: npm install failed (offline?): the mdi_icons tests skip"; \
	else echo "mdi-icons: no npm: the mdi_icons tests skip;" \
	  "npm install --prefix .cache/npm $(MDI_SVG_PKG) provides them"; fi

# Both offline image sets' raw data (the presets' fmnist_mosaic / mdi_icons).
image-data: mdi-icons fmnist-data

clean:
	rm -rf $(VENV) runs site .pytest_cache .cache
