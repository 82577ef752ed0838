# Local virtualenv workflow: `make demo` and `make test` work on a fresh Debian + Python 3.11 machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test lint bench clean

$(BIN)/cache-router: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

venv: $(BIN)/cache-router

demo: venv
	$(BIN)/cache-router demo

test: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q

bench: venv
	$(BIN)/python bench/micro.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
