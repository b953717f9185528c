# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create the virtual environment on first use and reinstall when pyproject.toml changes.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: demo test test-fast bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/bastion run examples/wordcount.py

test: $(VENV)/.installed
	$(PY) -m pytest -q

test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow"

bench: $(VENV)/.bench-installed
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/storage.py
	$(PY) benchmarks/protocols.py

clean:
	rm -rf $(VENV) .bastion
