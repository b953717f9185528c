# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create the virtual environment on first use and reinstall when pyproject.toml
# changes. The demo installs only what Bastion needs to run; the test extras (pytest,
# moto's S3 server, ...) come with `make test`, on top of the same install.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: demo test test-fast bench results clean bytecode

# Bastion and its runtime dependencies: all the demo needs.
$(VENV)/.installed: pyproject.toml setup.py bastion/runtime/_columns.c bastion/storage/_logframe.c \
		bastion/runtime/_durable.c bastion/runtime/_compact_long.h bastion/runtime/_int_column.h
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

# Bastion's own modules compiled ahead: an editable install leaves them as sources, and
# where PYTHONDONTWRITEBYTECODE is set (as on CI) every process — each Ray worker,
# each benchmark script — compiled them again on import (a small job's script: 12.4 ->
# 11.3 s wall). Up-to-date files are skipped.
bytecode: $(VENV)/.installed
	$(PY) -m compileall -q bastion benchmarks > /dev/null

demo: $(VENV)/.installed bytecode
	$(VENV)/bin/bastion run examples/wordcount.py

test: $(VENV)/.test-installed bytecode
	$(PY) -m pytest -q

test-fast: $(VENV)/.test-installed bytecode
	$(PY) -m pytest -q -m "not slow"

bench: $(VENV)/.bench-installed bytecode
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
# paper's figure, and the peer engines (~30 min on 2 cores; RESULTS_ARGS=--quick: ~12).
results: $(VENV)/.bench-installed bytecode
	$(PY) benchmarks/reproduce.py $(RESULTS_ARGS)

clean:
	rm -rf $(VENV) .bastion drill-report.html
