# fedshift: `make demo` runs the embedded default end to end, `make test` the test suite.
# Both create .venv/ when it is missing. Nothing is assumed beyond Python 3.11, pip, git, make.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
TICK_S ?= 30

.PHONY: help demo test install data workflow clean lint bench

help:  ## this list
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z]+):.*## /  make \1\t/' | expand -t 16

install: $(STAMP)  ## create .venv/ and install the pinned stack (about 3.5 min; each package, then a line every 30 s)
	@mkdir -p data  # data.dvc's folder (hand-supplied archives): git keeps no empty folder, and dvc repro needs it

# --isolated ignores PIP_FIND_LINKS and user pip config: torch must come from PyPI (see README).
$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); if [ "$${free:-99}" -lt 9 ]; then \
	  echo "warning: $${free} GB free on the disk of $(CURDIR); the pinned stack takes about 6 GB in $(VENV)/ and pip's" \
	       "downloads about 3 GB more (torch's CUDA libraries), and the test suite writes about 6 GB under /tmp:" \
	       "the install may stop with 'No space left on device'" >&2; fi
	@echo "installing the pinned stack into $(VENV)/ (requirements.lock; about 3.5 min on 2 cores, most of it torch)"
	@# pip prints nothing while it unpacks (torch's CUDA libraries: minutes): a line every $(TICK_S) s says it works
	set -o pipefail; start=$$(date +%s); \
	( while sleep $(TICK_S); do echo "  ... pip still installing: $$(( $$(date +%s) - start )) s so far"; done ) & tick=$$!; \
	env -u PIP_FIND_LINKS $(PY) -m pip install --isolated --no-input --disable-pip-version-check \
	  --progress-bar off -r requirements.lock \
	  | $(PY) -u -c 'import re, sys; [print(l[:100].rstrip(), flush=True) for l in iter(sys.stdin.readline, "") \
	                 if re.match("Collecting|Installing collected|Successfully installed", l)]'; \
	rc=$$?; kill $$tick 2>/dev/null; wait $$tick 2>/dev/null; \
	echo "pip: $$(( $$(date +%s) - start )) s"; exit $$rc
	env -u PIP_FIND_LINKS $(PY) -m pip install --isolated --no-input --disable-pip-version-check -q --no-deps -e .
	@touch $@

data: $(STAMP)  ## dvc repro: fetch, public sets, partitions (build/)
	@mkdir -p data
	dvc repro

workflow: $(STAMP)  ## snakemake --cores all on params/experiments.yaml
	snakemake --cores all

demo: $(STAMP)  ## install, dvc repro, snakemake: the default grid end to end (about 9 min after install)
	@mkdir -p data
	@start=$$(date +%s); \
	dvc repro && snakemake --cores all && \
	echo "demo finished in $$(( $$(date +%s) - start )) s: results/collect/runs.csv, results/report/, mlflow.db (mlflow ui)"

# Two workers (pytest-xdist), each running whole test files (--dist loadfile: a file's module fixtures, such as
# test_workflow's one pipeline, are built once and its order-dependent tests stay in order).
test: $(STAMP)  ## the test suite, as CI runs it (two workers; about 17 min on 2 cores)
	$(PY) -m pytest -q -n 2 --dist loadfile

lint: $(STAMP)  ## snakemake --lint
	snakemake --lint

bench: $(STAMP)  ## model and round benchmarks (benchmarks/)
	$(PY) benchmarks/bench_models.py
	$(PY) benchmarks/bench_round.py

# results/, mlflow.db and mlartifacts/ are every run and its tracking: asked for, never by default
# (YES=1 to skip the question; without a terminal the answer is no).
clean:  ## remove build/, logs/, .snakemake/; asks before results/, mlflow.db, mlartifacts/ (YES=1: no question)
	rm -rf build logs .snakemake
	@if [ -e results ] || [ -e mlflow.db ] || [ -e mlartifacts ]; then \
	  if [ "$(YES)" = 1 ]; then a=y; else \
	    read -r -p "also delete results/, mlflow.db and mlartifacts/ (every run and its MLflow record)? [y/N] " a || a=n; fi; \
	  if [ "$$a" = y ]; then rm -rf results mlflow.db mlartifacts; else echo "kept results/, mlflow.db, mlartifacts/"; fi; \
	fi
