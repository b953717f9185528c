# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create the virtual environment on first use and reinstall when pyproject.toml
# changes. The demo installs only what Bastion needs to run; the test extras (pytest,
# moto's S3 server, ...) come with `make test`, on top of the same install.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: demo test test-fast bench results clean

# Bastion and its runtime dependencies: all the demo needs.
$(VENV)/.installed: pyproject.toml setup.py bastion/runtime/_columns.c bastion/storage/_logframe.c \
		bastion/runtime/_durable.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

# Reinstalled whenever the base install is (it depends on it, so it is then older).
$(VENV)/.test-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(VENV)/.bench-installed: $(VENV)/.test-installed
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/bastion run examples/wordcount.py

test: $(VENV)/.test-installed
	$(PY) -m pytest -q

test-fast: $(VENV)/.test-installed
	$(PY) -m pytest -q -m "not slow"

bench: $(VENV)/.bench-installed
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/storage.py
	$(PY) benchmarks/protocols.py
	$(PY) benchmarks/acks.py
	$(PY) benchmarks/redundancy.py
	$(PY) benchmarks/lossy_links.py
	$(PY) benchmarks/recovery.py
	$(PY) benchmarks/local_recovery.py
	$(PY) benchmarks/metrics_export.py
	$(PY) benchmarks/scaling.py
	$(PY) benchmarks/tuning.py

# docs/results.md and docs/results/: every paper's headline experiment beside the
# paper's figure, and the peer engines (~30 min on 2 cores; RESULTS_ARGS=--quick: ~5).
results: $(VENV)/.bench-installed
	$(PY) benchmarks/reproduce.py $(RESULTS_ARGS)

clean:
	rm -rf $(VENV) .bastion drill-report.html
