# Set-up is two commands on a fresh machine: `make parity` (the main job) and `make test`.
# Both create .venv if it is missing and install the project with its test extra.
#
# TORCH: the CPU build by default (a local wheel on these machines). GPU users pass their own,
#   e.g. `make test TORCH=torch JAX='jax[cuda12]'` (see README, "GPU").
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
TORCH  ?= torch==2.13.0
JAX    ?= jax
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: parity parity-base test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet "$(JAX)" -e '.[test]'
	touch $(STAMP)

parity: $(STAMP)
	$(VENV)/bin/jaxformer parity

parity-base: $(STAMP)
	$(VENV)/bin/jaxformer parity --preset base

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_forward.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
