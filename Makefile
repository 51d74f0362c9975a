# Each target works on a fresh machine with Python 3.11 and pip: it creates
# .venv and installs the package into it if needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all test-min docs-check crosscheck lint bench install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# make demo needs the package alone, not the test stack. It runs from the
# checkout (python -m launch.main), so a regular install serves: an editable
# one makes setuptools print a 10-line note about its import hook (configs/
# and launch/ map into the package). After make install / test, their
# editable install serves and is kept.
DEMO_STAMP := $(VENV)/.installed-package
$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if [ ! -f $(STAMP) ] || [ pyproject.toml -nt $(STAMP) ]; then \
	  $(PY) -m pip install --quiet --upgrade pip && \
	  $(PY) -m pip install --quiet . ; \
	fi
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m launch.main --config=configs/fedavg.py --workdir=runs/demo

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The quick tier: every module and test function, a seeded sample of each
# parametrized function's cases (tests/conftest.py); test-all: every case.
test: $(STAMP)
	$(PY) -m pytest -q -n auto --dist worksteal --quick tests

test-all: $(STAMP)
	$(PY) -m pytest -q -n auto --dist worksteal tests

# The suite's core on the lowest supported versions (.ci/min_versions.txt,
# pyproject.toml's lower bounds), in its own environment.
MIN_VENV := .venv-min
MIN_TESTS ?= tests
test-min:
	test -x $(MIN_VENV)/bin/python || $(PYTHON) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(MIN_VENV)/bin/python -m pip install --quiet -c .ci/min_versions.txt -e '.[test]'
	$(MIN_VENV)/bin/python -m pytest -q -n auto --dist worksteal $(MIN_TESTS)

# The golden fixtures (the authors' code at named commits) and this
# library against them: no PyTorch, no checkout of theirs needed.
crosscheck: $(STAMP)
	$(PY) benchmarks/crosscheck/fixtures.py
	$(PY) -m pytest -q -n auto --dist worksteal tests/test_golden_*.py

docs-check: $(STAMP)
	$(PY) -m pytest -q -n auto --dist worksteal tests/docs

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m benchmarks.bench

clean:
	rm -rf runs .pytest_cache
