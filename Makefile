# `make run` and `make test` do all set-up on a fresh machine: they create .venv and install into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Reinstall whenever the package metadata changes.
INSTALLED := $(VENV)/.installed

.PHONY: run test lint bench clean

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

run: $(INSTALLED)
	$(BIN)/sluicegate-node -c deploy/example.toml --address 127.0.0.1 --port 8000

test: $(INSTALLED)
	$(BIN)/python -m pytest

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(INSTALLED)
	$(BIN)/python bench/http_semaphores.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache *.egg-info
