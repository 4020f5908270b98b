# `make demo` and `make test` each set up .venv on first use, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,plot]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/keras-posenc demo

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build dist *.egg-info demo-output .pytest_cache .hypothesis
