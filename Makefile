# Two commands for a newcomer: `make demo` and `make test`. Both create .venv when it is missing
# or stale: the stamp file is named after a hash of the lock file and setup.cfg, so editing
# either rebuilds the environment, and a second run with .venv present starts in seconds.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
HASH := $(shell cat requirements/lock.txt setup.cfg | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)

.PHONY: venv demo test test-all lint format gpu-test bench clean

venv: $(STAMP)

$(STAMP): requirements/lock.txt setup.cfg pyproject.toml
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/lock.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

demo: $(STAMP)
	$(VENV)/bin/dgl-rsc run yaml_configs/quickstart.yaml --out runs/quickstart --force

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check dgl_rsc tests tools
	$(VENV)/bin/ruff format --check dgl_rsc tests tools

format: $(STAMP)
	$(VENV)/bin/ruff format dgl_rsc tests tools
	$(VENV)/bin/ruff check --fix dgl_rsc tests tools

bench: $(STAMP)
	$(PY) tools/bench_spmm.py

clean:
	rm -rf $(VENV) build dist *.egg-info runs
