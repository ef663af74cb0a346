# fedshift: `make demo` runs the embedded default end to end, `make test` the test suite.
# Both create .venv/ when it is missing. Nothing is assumed beyond Python 3.11, pip, git, make.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true

.PHONY: demo test install data workflow clean lint bench

install: $(STAMP)

# --isolated ignores PIP_FIND_LINKS and user pip config: torch must come from PyPI (see README).
$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	env -u PIP_FIND_LINKS $(PY) -m pip install --isolated --no-input --disable-pip-version-check -q -r requirements.lock
	env -u PIP_FIND_LINKS $(PY) -m pip install --isolated --no-input --disable-pip-version-check -q --no-deps -e .
	@touch $@

data: $(STAMP)
	@mkdir -p data
	dvc repro

workflow: $(STAMP)
	snakemake --cores all

demo: $(STAMP)
	@mkdir -p data
	@start=$$(date +%s); \
	dvc repro && snakemake --cores all && \
	echo "demo finished in $$(( $$(date +%s) - start )) s: results/collect/runs.csv, results/report/, mlflow.db (mlflow ui)"

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	snakemake --lint

bench: $(STAMP)
	$(PY) benchmarks/bench_models.py
	$(PY) benchmarks/bench_round.py

clean:
	rm -rf build results logs mlflow.db mlartifacts .snakemake
