# plcql-bench: every task a user or maintainer runs.
#   make all    venv + install + smoke datasets + default matrix + site/index.html (the main job)
#   make test   venv + install + the test suite
PYTHON ?= python3
VENV   ?= .venv
PROFILE ?= smoke
BIN    := $(VENV)/bin
EXTRAS ?= mpe,dev

.PHONY: all setup test datasets run leaderboard version clean

all: setup
	$(BIN)/plcql-bench all --profile $(PROFILE)
	$(BIN)/plcql-bench leaderboard --out site
	@echo "open site/index.html"

# torch==2.13.0 first: on this project's machines that spec resolves to the local CPU wheel,
# so the resolver never pulls a multi-GB CUDA build. pyproject accepts any torch 2.x >= 2.4.
setup: $(BIN)/.installed
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $@

test: setup
	$(BIN)/python -m pytest tests

datasets: setup
	$(BIN)/plcql-bench datasets build --matrix --profile $(PROFILE)

leaderboard: setup
	$(BIN)/plcql-bench leaderboard --out site

version: setup
	$(BIN)/plcql-bench version --all

clean:
	rm -rf site build *.egg-info .pytest_cache
