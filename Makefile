# Two commands for a newcomer: `make demo` and `make test`. Both create .venv when it is missing
# or stale: the stamp file is named after a hash of the lock file and setup.cfg, so editing
# either rebuilds the environment, and a second run with .venv present starts in seconds.
# `make test-modern` does the same with .venv-modern: the newest torch and PyG, no DGL.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
HASH := $(shell cat requirements/lock.txt setup.cfg | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)
VENV_MODERN := .venv-modern
PY_MODERN := $(VENV_MODERN)/bin/python
HASH_MODERN := $(shell cat requirements/lock-modern.txt requirements/source-modern.txt setup.cfg \
	| sha1sum | cut -c1-12)
STAMP_MODERN := $(VENV_MODERN)/.installed-$(HASH_MODERN)
# the tests that need DGL carry the `dgl` marker, those that need torch_geometric the `pyg`
# marker: tests/conftest.py deselects them where the dependency does not import (never skips)
MODERN_MARKERS := not dgl and not gpu and not slow and not heavy

# `make docs`: the user guide and API reference (Sphinx, warnings as errors) into build/docs,
# with the pinned requirements/docs.txt added to .venv behind their own stamp
DOCS_HASH := $(shell cat requirements/docs.txt | sha1sum | cut -c1-12)
DOCS_STAMP := $(VENV)/.docs-installed-$(DOCS_HASH)

.PHONY: venv venv-modern demo test test-modern test-dist test-heavy lint format bench docs clean

venv: $(STAMP)

$(STAMP): requirements/lock.txt setup.cfg pyproject.toml
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/lock.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

venv-modern: $(STAMP_MODERN)

$(STAMP_MODERN): requirements/lock-modern.txt requirements/source-modern.txt setup.cfg pyproject.toml
	rm -rf $(VENV_MODERN)
	$(PYTHON) -m venv $(VENV_MODERN)
	$(PY_MODERN) -m pip install --quiet --disable-pip-version-check -r requirements/lock-modern.txt
	MAX_JOBS=2 $(PY_MODERN) -m pip install --quiet --disable-pip-version-check --no-deps \
		--no-build-isolation -r requirements/source-modern.txt
	$(PY_MODERN) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

demo: $(STAMP)
	$(VENV)/bin/dgl-rsc run yaml_configs/quickstart.yaml --out runs/quickstart --force

test: $(STAMP)
	$(PY) -m pytest

# every test that does not need DGL, on torch 2.15 and PyG 2.8.1 (requirements/lock-modern.txt)
test-modern: $(STAMP_MODERN)
	$(PY_MODERN) -m pytest -m "$(MODERN_MARKERS)"

# the distributed tests that start several processes (2 and 4 gloo workers, real graphs,
# faults, resume): longer than `make test`
test-dist: $(STAMP)
	$(PY) -m pytest -m slow tests/distributed

# the single-process cases that take a minute or more each (fresh interpreters, the Numba
# simulator, nvcc for every architecture, converged estimator checks): kept out of `make test`
# so that it stays under 15 minutes on 2 cores; CI runs them in their own step
test-heavy: $(STAMP)
	$(PY) -m pytest -m heavy

$(DOCS_STAMP): $(STAMP) requirements/docs.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/docs.txt
	rm -f $(VENV)/.docs-installed-*
	touch $@

docs: $(DOCS_STAMP)
	$(PY) -m sphinx -W --keep-going -q -b html docs build/docs

lint: $(STAMP)
	$(VENV)/bin/ruff check dgl_rsc tests tools
	$(VENV)/bin/ruff format --check dgl_rsc tests tools

format: $(STAMP)
	$(VENV)/bin/ruff format dgl_rsc tests tools
	$(VENV)/bin/ruff check --fix dgl_rsc tests tools

# CPU benchmarks (docs/benchmarks.md): single products and end-to-end epochs against stock
# DGL on the two graphs of the engine issue, 1 and 2 threads; about an hour on 2 cores. Run
# them with nothing else on the machine.
bench: $(STAMP)
	mkdir -p results
	for g in quickstart g200k; do for t in 2 1; do \
	  $(PY) tools/bench_spmm.py --preset $$g --threads $$t --budgets 0.05,0.1,0.2,0.3 \
	    --rules cost --reps 5 --out results/spmm_cpu_$${g}_t$$t.json || exit 1; \
	done; done
	$(PY) tools/bench_cpu_e2e.py --graphs quickstart g200k --models gcn sage --threads 2 1 \
	  --profile --out results/e2e_cpu.json

clean:
	rm -rf $(VENV) $(VENV_MODERN) build dist *.egg-info runs
