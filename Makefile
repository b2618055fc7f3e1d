# Set-up is two commands on a fresh machine: `make parity` (the main job) and `make test`.
# Both create .venv if it is missing and install the project with its test extra, at the exact
# versions the suite was proven with (.ci/constraints.txt; `make lock` rewrites it, deliberately).
#
# TORCH: the CPU build by default (a local wheel on these machines). GPU users pass their own,
#   e.g. `make test TORCH=torch JAX='jax[cuda12]'` (see README, "GPU").
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
TORCH  ?= torch==2.13.0
JAX    ?= jax
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
LOCK   := .ci/constraints.txt

.PHONY: parity parity-base test lint margins bench lock clean

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -c $(LOCK) "$(JAX)" -e '.[test]'
	touch $(STAMP)

parity: $(STAMP)
	$(VENV)/bin/jaxformer parity

parity-base: $(STAMP)
	$(VENV)/bin/jaxformer parity --preset base

# The suite in WORKERS processes (pytest-xdist): 2 halves its time on a 2-core machine, where
# most of a test's time is one XLA compilation on one core (docs/testing.md). Whole files per
# worker (--dist loadfile): some tests read what an earlier test of their file wrote. The longest
# files first (parity_tests/conftest.py) and in that order (--no-loadscope-reorder), so that short
# files fill the end and neither worker idles while the other finishes a long one.
WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder

# Every tolerance-bearing test on emulated CPUs (XLA and torch capped to AVX2, 2 cores and all),
# listing each bound whose margin is under 2x (docs/testing.md). ISAS='default AVX' CPUS='1 all'
# to choose others.
ISAS ?= default AVX2
CPUS ?= 2 all
margins: $(STAMP)
	$(PY) -m parity_tests.tools.margins --isa $(ISAS) --cpus $(CPUS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) benchmarks/bench_forward.py

# The constraints file: every installed distribution but jaxformer itself and torch (installed
# first, from TORCH, so that GPU users can bring their own build).
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v -i -E '^(torch|nvidia-|triton)' > $(LOCK)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
