# Two commands for a newcomer: `make demo` and `make test`. Both create .venv when it is missing
# or stale: the stamp file is named after a hash of the lock file and setup.cfg, so editing
# either rebuilds the environment, and a second run with .venv present starts in seconds.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
HASH := $(shell cat requirements/lock.txt setup.cfg | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)

.PHONY: venv demo test test-dist lint format bench clean

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

# the distributed tests that start several processes (2 and 4 gloo workers, real graphs,
# faults, resume): longer than `make test`
test-dist: $(STAMP)
	$(PY) -m pytest -m slow tests/test_distributed.py tests/test_distributed_slow.py

lint: $(STAMP)
	$(VENV)/bin/ruff check dgl_rsc tests tools
	$(VENV)/bin/ruff format --check dgl_rsc tests tools

format: $(STAMP)
	$(VENV)/bin/ruff format dgl_rsc tests tools
	$(VENV)/bin/ruff check --fix dgl_rsc tests tools

# CPU benchmarks keep freed memory in the process (glibc: no mmap for large blocks, no trim):
# otherwise every (N, d) product output pays first-touch page faults (200k x 256: 63 ms to zero
# a fresh buffer vs 14 ms for a reused one), a floor that hides what RSC saves. PyTorch's CPU
# tuning guide recommends a caching allocator (jemalloc/tcmalloc) for the same reason.
CPU_ALLOC := MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=268435456

bench: $(STAMP)
	$(CPU_ALLOC) $(PY) tools/bench_spmm.py --out results/bench_spmm.json

clean:
	rm -rf $(VENV) build dist *.egg-info runs
