# `make demo` and `make test` each set up .venv on first use, then run;
# `make test-oldest` sets up .venv-oldest, at the floor of every version
# range in setup.cfg's install_requires, and runs the tests there.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed

.PHONY: demo test test-oldest test-site docs clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,plot,demo,bench,docs]"
	touch $(STAMP)

# Each `name>=floor,...` line of install_requires becomes `name==floor`.
$(OLDEST_STAMP): setup.cfg pyproject.toml
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	sed -n '/^install_requires =/,/^[^ ]/s/^ *\([A-Za-z0-9_.-]*\)>=\([^,; ]*\).*/\1==\2/p' \
		setup.cfg > $(OLDEST)/constraints.txt
	$(OLDEST)/bin/python -m pip install --quiet -e ".[test]" -c $(OLDEST)/constraints.txt
	touch $(OLDEST_STAMP)

demo: $(STAMP)
	$(BIN)/keras-posenc demo

# Two workers (pytest-xdist), each file's tests on one of them: the suite's
# module-scoped fixtures (trained models, built sites) are made once.
PYTEST_WORKERS := -n 2 --dist loadfile

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_WORKERS) -m "not browser"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The tests (not the notebooks) less those marked `newest`, and less the
# site's, which need the docs extra that .venv-oldest does not install.
test-oldest: $(OLDEST_STAMP)
	$(OLDEST)/bin/python -m pytest $(PYTEST_WORKERS) tests -m "not newest" --ignore=tests/test_site.py

# Every page of the built site in headless Chromium, offline; needs
# Debian's chromium (apt-get install chromium).
test-site: $(STAMP)
	$(BIN)/python -m pytest tests/test_site.py -m browser

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) $(OLDEST) build dist *.egg-info demo-output site .pytest_cache .hypothesis
