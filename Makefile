# make demo : set up .venv and run the analysis on the bundled pretrained MiniLM-L6
# make test : set up .venv, lint (ruff), run the test suite (quick profile, ~10 min on 2 cores)
# make test-all : the same with the long profiles (slow matrix-free golden cases, ...)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint setup clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[tlens,demo,report,topology,logging,lightning,test]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/spectral-hooks analyze --jacobian --bottleneck --topology --out spectral_report

lint: $(STAMP)
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

test-all: lint
	SPECTRAL_HOOKS_FULL=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile

clean:
	rm -rf $(VENV) spectral_report
