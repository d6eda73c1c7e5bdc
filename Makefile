# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the test suite).
# Both install into ./.venv from this repository's own files first (once; re-run when they change).
# PYTEST_ARGS adds pytest options to `make test` (CI adds --durations=25).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test bench clean

$(STAMP): pyproject.toml scripts/install.sh scripts/install-examples.sh $(wildcard examples/requirements-*.txt)
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/rlproxy demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
